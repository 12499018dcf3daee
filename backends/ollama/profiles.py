"""Built-in profiles of popular Ollama library models (``profiles/ollama_models.json``).

They let a user plan a model before ``ollama pull``: each entry holds the
model's published ``config.json``, read by :func:`kvadvise.model.hfconfig.from_config`
(the converter's GGUF keys, then llama.cpp's rules: the same ModelSpec
``kvadvise hf`` gives), plus the default tag's quantization and download size
with where each came from (a :class:`Source`: kind, ref, url, date; a plan prints
one line per source, ``--json`` all of them). A download size is the whole blob as the library
page prints it (2 significant digits, decimal units, projector included) or
the exact blob bytes where a published source gives them, so the weights of a
profile are good to about 1 to 3 %; a model in the store or on a server is exact.
The per-part sizes llama.cpp places one by one (token embeddings, output,
each block, the routed experts) are counted from the config at the
quantization and scaled to the download size (:mod:`kvadvise.model.breakdown`),
so partial offload (``--allow-cpu``, ``--n-cpu-moe``) and the decode-speed
estimate work for a profile as for a GGUF. A name that is not here gets at most
three close ones (:func:`suggestions`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvadvise.backends.ollama.name import DEFAULT_TAG, OllamaName
from kvadvise.errors import InputError
from kvadvise.model.breakdown import Breakdown, k_mix_sizes, params, sized, vision_params, with_parts
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec

RESOURCE = "ollama_models.json"

# the default tag's quantization (Ollama's file type name) -> the dominant tensor type, as llama.cpp names it
_FILE_TYPE = {"Q4_K_M": "q4_K", "Q4_K_S": "q4_K", "Q8_0": "q8_0", "Q4_0": "q4_0", "F16": "f16", "BF16": "bf16"}

# What each kind of source is, in the one line a plan prints per source
KINDS: Mapping[str, str] = {
    "exact": "exact bytes",
    "library": "Ollama library",
    "log": "llama.cpp log",
    "estimate": "estimate",
    "count": "counted from the config",
    "copy": "copy of the published file",
    "transcription": "transcription",
}

# Ollama's quantizer, not llama.cpp's mix, picks these tensors' types in its library blobs (server/quantization.go
# newType and qwen3LinearAttnQuantType at ollama/ollama@87288ced, the Go quantizer that made them):
# per_layer_token_embd, v.* and a.* tensors are not quantized (16-bit, as converted), and for qwen3next /
# qwen35 / qwen35moe at Q4_K_M the routed experts' gate and up are Q4_K (4.5 bits), their down Q6_K (6.5625)
_PLE_BPW = 16.0
_PROJECTOR_BYTES_PER_PARAM = 2
_OLLAMA_EXPERT_BPW = {("qwen3next", "Q4_K_M"): (2 * 4.5 + 6.5625) / 3, ("qwen35moe", "Q4_K_M"): (2 * 4.5 + 6.5625) / 3}


@dataclass(frozen=True, slots=True)
class Source:
    """Where a figure of a profile comes from, in a form a user can check."""

    kind: str  # one of KINDS
    ref: str | None = None  # owner/repo@commit path, an issue or a document; None: not recorded
    url: str | None = None  # where to check the figure
    date: str | None = None  # when the source gave it (YYYY-MM-DD)

    @property
    def line(self) -> str:
        """ "Ollama library, 2025-09-13": what it is and when, for a one-line note."""
        return ", ".join(x for x in (KINDS.get(self.kind, self.kind), self.date) if x)

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("kind", self.kind), ("ref", self.ref), ("url", self.url), ("date", self.date)) if v}


@dataclass(frozen=True, slots=True)
class Profile:
    """One built-in model of profiles/ollama_models.json: its config.json, sizes and their sources."""

    id: str  # "model:tag" as in Ollama's library
    aliases: tuple[str, ...]  # other tags of the same blob ("qwen3-coder:latest")
    hf_repo: str
    config: Mapping[str, Any]
    config_source: Source
    confidence: str  # full | partial
    quantization: str | None
    download_bytes: int | None
    download_size: str | None  # as the source shows it ("19 GB")
    download_source: Source | None = None
    aliases_source: Source | None = None
    projector_bytes: int = 0  # a vision/audio tower inside the blob (not counted by the text config)
    projector_source: Source | None = None
    inferred: tuple[str, ...] = ()  # config keys not in the published file

    @property
    def weights_line(self) -> str | None:
        """ "weights: 19 GB, Ollama library, 2025-09-13"; None without a download size."""
        if not self.download_size or self.download_source is None:
            return None
        return f"weights: {self.download_size}, {self.download_source.line}"

    def provenance(self) -> dict[str, Any]:
        """Every source of this profile, for --json and --verbose."""
        out: dict[str, Any] = {"config": {"hf_repo": self.hf_repo, "confidence": self.confidence,
                                          **self.config_source.as_dict()}}  # fmt: skip
        if self.download_source is not None:
            out["weights"] = {
                "bytes": self.download_bytes,
                "shown": self.download_size,
                **self.download_source.as_dict(),
            }
        if self.projector_source is not None:
            out["projector"] = {"bytes": self.projector_bytes, **self.projector_source.as_dict()}
        if self.aliases_source is not None:
            out["aliases"] = {"names": list(self.aliases), **self.aliases_source.as_dict()}
        return out

    @property
    def sized_by_types(self) -> bool:
        """An MXFP4 blob's every tensor type is known (convert/convert_gptoss.go: the experts MXFP4, the modules its
        quantization_config leaves unconverted BF16): its parts are exact at those types, where a rounded library
        size ("14 GB") scaled them 7 % off (ollama#11711's memory.weights lines); an exact size still scales."""
        rounded = self.download_source is None or self.download_source.kind != "exact"
        return (self.quantization or "").upper() == "MXFP4" and rounded

    def exact_parts(self, spec: ModelSpec) -> tuple[Breakdown, int] | None:
        """A K-mix blob of a plain dense transformer (kvadvise.model.breakdown.k_mix_sizes): every tensor at the type
        llama.cpp's quantizer gives it, and the output layer's f32 vectors; the library's size holds the GGUF header
        besides (llama3.1:8b: 7,840,640 B of tokenizer), or is rounded ("2.0 GB")."""
        exact = k_mix_sizes(spec, self.config, self.quantization or DEFAULT_QUANT)
        if exact is None or not self.download_bytes:
            return exact
        # only where the library's figure agrees: a blob made by other rules (Ollama's own quantizer,
        # server/quantization.go, or another token_embd type: qwen3:8b's "5.2 GB" where the recipe gives 5.03) keeps the
        # figure; agreeing is within the figure's rounding ("2.0 GB": 0.05 GB) and 1 % of header (tokenizer)
        total = exact[0].loaded + exact[1] + self.projector_bytes
        shown = (self.download_size or "").split()[0]
        decimals = len(shown.partition(".")[2]) if shown.replace(".", "", 1).isdigit() else 0
        rounded = self.download_source is not None and self.download_source.kind != "exact"
        slack = (0.5 * 10**-decimals * 1e9 if rounded else 0) + 0.01 * self.download_bytes
        return exact if abs(total - self.download_bytes) <= slack else None

    def sizes(self, spec: ModelSpec, bd: Breakdown, total_bytes: int | None = None) -> Breakdown:
        """The parts of the blob in bytes (kvadvise.model.breakdown.sized) with Ollama's own quant choices,
        scaled to ``total_bytes`` (the blob less its projector) when that is known; a K-mix blob's exact parts
        where :meth:`exact_parts` knows them."""
        if (exact := self.exact_parts(spec)) is not None:
            return exact[0]
        return self._scaled(spec, bd, total_bytes)

    def _scaled(self, spec: ModelSpec, bd: Breakdown, total_bytes: int | None) -> Breakdown:
        """:meth:`sizes` by the quant's mix, scaled to ``total_bytes``."""
        quant = self.quantization or DEFAULT_QUANT
        if self.sized_by_types:
            total_bytes = None
        return sized(
            bd,
            quant,
            total_bytes,
            per_layer_embd_bpw=_PLE_BPW,
            expert_bpw=_OLLAMA_EXPERT_BPW.get((spec.architecture, quant.upper())),
            # Ollama's library blobs: token_embd and output at llama.cpp's quantizer types (Q4_K and Q6_K in a
            # Q4_K_M), which a load places apart (token_embd on the CPU, output with the last block)
            quantizer_embeddings=True,
            # Ollama's own gpt-oss conversion keeps the experts' 2-D biases at their BF16 source type
            bias_bytes=2,
        )

    def spec(self) -> ModelSpec:
        """The ModelSpec llama.cpp would build from this model's GGUF: weights from the download size (less
        the MTP blocks llama.cpp does not load), else estimated from the parameter count at the default
        quantization's bits per weight."""
        spec = from_config(self.config, source=f"profile:{self.id}", weights_bytes=self.download_bytes)
        notes = list(spec.notes)
        sources: list[str] = []
        quant = self.quantization or DEFAULT_QUANT
        text_bytes = self.download_bytes - self.projector_bytes if self.download_bytes else None
        bd = params(spec, self.config)
        exact = self.exact_parts(spec) if bd is not None else None
        sizes = exact[0] if exact is not None else self._scaled(spec, bd, text_bytes) if bd is not None else None
        weights = spec.weights_bytes
        if self.download_bytes:
            sources.append(self.weights_line or "weights: download size")
            if sizes is not None and self.sized_by_types:
                weights = sizes.loaded + sizes.nextn + self.projector_bytes  # the parts, less the MTP block below
            elif sizes is not None and exact is not None:
                weights = sizes.loaded + exact[1] + self.projector_bytes  # the tensors, not the blob's header
            if sizes is not None and sizes.nextn:
                weights -= sizes.nextn
                notes.append(f"its MTP block ({sizes.nextn / 1e9:.2f} GB of the download) is not loaded by llama.cpp")
        elif bd is not None and sizes is not None:
            from kvadvise.model.quants import quant_bpw

            n_params = bd.loaded
            canon, bpw = quant_bpw(quant) if quant.upper() != "MXFP4" else ("MXFP4", 4.25)
            weights = sizes.loaded + self.projector_bytes
            assumed = "" if self.quantization else ", assumed: the library's default"
            notes.insert(
                0,
                f"planned from a built-in profile; download size unknown: weights estimated as {n_params:,} "
                f"parameters x {bpw:.2f} bits per weight ({canon}{assumed}) = {weights / 1e9:.2f} GB",
            )
        else:
            notes.insert(0, "planned from a built-in profile; download size unknown: weights counted as 0")
        if self.projector_bytes and self.projector_source is not None:
            sources.append(
                f"vision/audio tower in the blob: {self.projector_bytes / 1e9:.2f} GB, {self.projector_source.line}"
            )
        sources.append(f"config: {self.hf_repo} config.json, {self.config_source.line} ({self.confidence})")
        file_type = _FILE_TYPE.get(quant, quant.lower())
        spec = dataclasses.replace(
            spec,
            name=self.id,
            weights_bytes=weights,
            file_type=file_type,
            notes=tuple(notes),
            sources=(f"built-in profile {self.id}", *sources),
        )
        spec = with_parts(spec, self.config, quant, self.projector_bytes, sizes=sizes)
        return dataclasses.replace(spec, tower_bytes=self.projector_bytes)


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


def _source(raw: object, where: str, default_kind: str) -> Source:
    if not isinstance(raw, Mapping):
        raise InputError(f"built-in profiles ({RESOURCE}): {where} should be an object")
    fields = {k: raw.get(k) for k in ("ref", "url", "date")}
    kind = raw.get("kind", default_kind)
    if not isinstance(kind, str) or not all(v is None or isinstance(v, str) for v in fields.values()):
        raise InputError(f"built-in profiles ({RESOURCE}): {where} holds a value that is not text")
    return Source(kind=kind, ref=fields["ref"], url=fields["url"], date=fields["date"])


def _profile(pid: str, entry: Mapping[str, Any]) -> Profile:
    config = entry["config"]
    cs = entry["config_source"]
    download = entry.get("download")
    projector = entry.get("projector")
    projector_bytes = int(projector["bytes"]) if projector else 0
    projector_source = _source(projector, f"{pid} projector", "estimate") if projector else None
    if projector is None and (n := vision_params(config)):
        # a vision_config in the config: its tower, which Ollama keeps in the blob at 16 bits
        projector_bytes = n * _PROJECTOR_BYTES_PER_PARAM
        projector_source = Source(kind="count", ref="vision_config of the config.json, 2 bytes per parameter")
    aliases_source = entry.get("aliases_source")
    return Profile(
        id=pid,
        aliases=tuple(entry.get("aliases", ())),
        hf_repo=entry["hf_repo"],
        config=config,
        config_source=_source(cs, f"{pid} config_source", "copy"),
        confidence=str(cs.get("confidence", "unknown")),
        quantization=entry.get("quantization"),
        download_bytes=int(download["bytes"]) if download else None,
        download_size=str(download["shown"]) if download else None,
        download_source=_source(download, f"{pid} download", "library") if download else None,
        aliases_source=_source(aliases_source, f"{pid} aliases_source", "library") if aliases_source else None,
        projector_bytes=projector_bytes,
        projector_source=projector_source,
        inferred=tuple(entry.get("inferred", ())),
    )


@cache
def _entries() -> tuple[Mapping[str, Any], dict[str, str]]:
    """The profiles' JSON entries by id, and every id and alias (lower case) -> its id."""
    try:
        doc = json.loads(_load_text())
    except (OSError, ValueError) as e:  # a broken install, not the user's input
        raise InputError(f"built-in profiles ({RESOURCE}) cannot be read: {e}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise InputError(f"built-in profiles ({RESOURCE}): no 'models' object")
    keys: dict[str, str] = {}
    for pid, entry in models.items():
        aliases = entry.get("aliases", ()) if isinstance(entry, dict) else ()
        for key in (pid, *(a for a in aliases if isinstance(a, str))):
            keys[key.lower()] = pid
    return models, keys


@cache
def _profile_by_id(pid: str) -> Profile:
    # Built on demand: a plan needs one of the profiles, not all of them with their sources.
    try:
        return _profile(pid, _entries()[0][pid])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"built-in profiles ({RESOURCE}): {pid}: {e!r}") from None


def profiles() -> dict[str, Profile]:
    """Every profile by id and by alias, keys in lower case."""
    return {key: _profile_by_id(pid) for key, pid in _entries()[1].items()}


def find_profile(name: OllamaName) -> Profile | None:
    """The profile of a library model name (``qwen3``, ``qwen3:8b``); None for others."""
    if not name.is_library:
        return None
    pid = _entries()[1].get(f"{name.model}:{name.tag}".lower())
    return None if pid is None else _profile_by_id(pid)


def profile_ids() -> tuple[str, ...]:
    """The ids (not aliases), sorted, for messages."""
    return tuple(sorted(_entries()[0]))


def suggestions(name: OllamaName, extra: Iterable[str] = (), limit: int = 3) -> tuple[str, ...]:
    """Up to ``limit`` built-in names close to ``name``, best first (difflib's ratio): what "did you mean"
    offers for ``qwen3-codr`` (qwen3-coder) or ``gemma4:e4`` (gemma4:e4b, gemma4:e2b...). A known model with an
    unknown tag gets its own tags; a bare name gets model names (bare where their ``:latest`` is known).
    ``extra``: more ``model:tag`` names to offer (the built-in snapshots of the registry)."""
    import difflib  # only for a name that is not there

    if not name.is_library:
        return ()
    names = {**{e.lower(): e.lower() for e in extra}, **_entries()[1]}  # id or alias -> id (``extra``: more ids)
    model, tag = name.model.lower(), name.tag.lower()
    own_tags = sorted(k for k in names if k.split(":")[0] == model)
    if own_tags:
        return tuple(difflib.get_close_matches(f"{model}:{tag}", own_tags, n=limit, cutoff=0.0))
    if tag == DEFAULT_TAG:
        shown: dict[str, str] = {}
        for k in sorted(names):
            m = k.split(":")[0]
            shown.setdefault(m, m if f"{m}:{DEFAULT_TAG}" in names else names[k])
        return tuple(shown[m] for m in difflib.get_close_matches(model, sorted(shown), n=limit, cutoff=0.6))
    return tuple(difflib.get_close_matches(f"{model}:{tag}", sorted(names), n=limit, cutoff=0.6))
