"""Built-in profiles of popular Ollama library models (``profiles/ollama_models.json``).

They let a user plan a model before ``ollama pull``: each entry holds the
model's published ``config.json``, read by :func:`kvadvise.model.hfconfig.from_config`
(the converter's GGUF keys, then llama.cpp's rules: the same ModelSpec
``kvadvise hf`` gives), plus the default tag's quantization and download size
with where each came from. A download size is the whole blob as the library
page prints it (2 significant digits, decimal units, projector included) or
the exact blob bytes where a published source gives them, so the weights of a
profile are good to about 1 to 3 %; a model in the store or on a server is exact.
The per-part sizes llama.cpp places one by one (token embeddings, output,
each block, the routed experts) are counted from the config at the
quantization and scaled to the download size (:mod:`kvadvise.model.breakdown`),
so partial offload (``--allow-cpu``, ``--n-cpu-moe``) and the decode-speed
estimate work for a profile as for a GGUF.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvadvise.backends.ollama.name import OllamaName
from kvadvise.errors import InputError
from kvadvise.model.breakdown import params, sized, with_parts
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec

RESOURCE = "ollama_models.json"

# the default tag's quantization (Ollama's file type name) -> the dominant tensor type, as llama.cpp names it
_FILE_TYPE = {"Q4_K_M": "q4_K", "Q4_K_S": "q4_K", "Q8_0": "q8_0", "Q4_0": "q4_0", "F16": "f16", "BF16": "bf16"}


@dataclass(frozen=True, slots=True)
class Profile:
    id: str  # "model:tag" as in Ollama's library
    aliases: tuple[str, ...]  # other tags of the same blob ("qwen3-coder:latest")
    hf_repo: str
    source: str  # where the config.json was copied from
    confidence: str
    config: Mapping[str, Any]
    quantization: str | None
    download_bytes: int | None
    download_size: str | None
    download_source: str | None
    download_date: str | None = None  # when the source gave that size
    download_kind: str | None = None  # "exact bytes" or the library's rounded size
    projector_bytes: int = 0  # a vision tower inside the blob (not counted by the text config)
    projector_source: str | None = None

    def spec(self) -> ModelSpec:
        """The ModelSpec llama.cpp would build from this model's GGUF: weights from the download size,
        else estimated from the parameter count at the default quantization's bits per weight."""
        spec = from_config(self.config, source=f"profile:{self.id}", weights_bytes=self.download_bytes)
        notes = list(spec.notes)
        quant = self.quantization or DEFAULT_QUANT
        weights = spec.weights_bytes
        if self.download_bytes:
            notes.insert(0, f"planned from a built-in profile; weights size from {self.download_source}")
        elif (bd := params(spec, self.config)) is not None:
            from kvadvise.model.quants import quant_bpw

            n_params = bd.total
            canon, bpw = quant_bpw(quant) if quant.upper() != "MXFP4" else ("MXFP4", 4.25)
            weights = sized(bd, quant).total + self.projector_bytes
            assumed = "" if self.quantization else ", assumed: the library's default"
            notes.insert(
                0,
                f"planned from a built-in profile; download size unknown: weights estimated as {n_params:,} "
                f"parameters x {bpw:.2f} bits per weight ({canon}{assumed}) = {weights / 1e9:.2f} GB",
            )
        else:
            notes.insert(0, "planned from a built-in profile; download size unknown: weights counted as 0")
        notes.append(f"config.json of {self.hf_repo} from {self.source} (confidence: {self.confidence})")
        file_type = _FILE_TYPE.get(quant, quant.lower())
        spec = dataclasses.replace(spec, name=self.id, weights_bytes=weights, file_type=file_type, notes=tuple(notes))
        return with_parts(spec, self.config, quant, self.projector_bytes)


DEFAULT_QUANT = "Q4_K_M"  # the quantization of Ollama library tags like qwen3:8b


def dense_params(spec: ModelSpec, config: Mapping[str, Any]) -> int | None:
    """Parameters of a dense transformer from its hparams (embeddings, attention, gated FFN; norms
    and biases are < 0.1%); None for MoE, recurrent or MLA models, which this does not cover."""
    if spec.n_expert or spec.is_mla or any(spec.recurrent_layers) or not spec.n_ff:
        return None
    tied = bool(config.get("tie_word_embeddings", False))
    n = spec.n_vocab * spec.n_embd * (1 if tied else 2)
    for il in range(spec.n_layer_all - spec.n_layer_nextn):
        q = spec.n_head[il] * spec.n_embd_head_k
        kv = spec.n_head_kv[il] * (spec.n_embd_head_k + spec.n_embd_head_v)
        o = spec.n_head[il] * spec.n_embd_head_v
        n += spec.n_embd * (q + kv + o) + 3 * spec.n_embd * spec.n_ff
    return n


def _load_text() -> str:
    from kvadvise.profiles import read_text

    return read_text(RESOURCE)


@cache
def profiles() -> dict[str, Profile]:
    """Every profile by id and by alias, keys in lower case."""
    try:
        doc = json.loads(_load_text())
    except (OSError, ValueError) as e:  # a broken install, not the user's input
        raise InputError(f"built-in profiles ({RESOURCE}) cannot be read: {e}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise InputError(f"built-in profiles ({RESOURCE}): no 'models' object")
    out: dict[str, Profile] = {}
    for pid, entry in models.items():
        p = Profile(
            id=pid,
            aliases=tuple(entry.get("aliases", ())),
            hf_repo=entry["hf_repo"],
            source=entry["source"],
            confidence=entry.get("confidence", "unknown"),
            config=entry["config"],
            quantization=entry.get("quantization"),
            download_bytes=entry.get("download_bytes"),
            download_size=entry.get("download_size"),
            download_source=entry.get("download_source"),
            download_date=entry.get("download_date"),
            download_kind=entry.get("download_kind"),
            projector_bytes=int(entry.get("projector_bytes", 0)),
            projector_source=entry.get("projector_source"),
        )
        for key in (pid, *p.aliases):
            out[key.lower()] = p
    return out


def find_profile(name: OllamaName) -> Profile | None:
    """The profile of a library model name (``qwen3``, ``qwen3:8b``); None for others."""
    if not name.is_library:
        return None
    return profiles().get(f"{name.model}:{name.tag}".lower())


def profile_ids() -> tuple[str, ...]:
    """The ids (not aliases), sorted, for messages."""
    return tuple(sorted({p.id for p in profiles().values()}))
