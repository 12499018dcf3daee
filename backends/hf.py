"""Backend: a Hugging Face config.json, local or from the Hub, and the size of its weights.

A config.json does not say how big the weights are. They come from, in order:

1. ``quant`` (``kvadvise hf REPO --quant Q4_K_M``): the GGUF you would
   download: bits per weight of that quant (QUANT_BPW) × the parameter count;
2. ``model.safetensors.index.json`` ``metadata.total_size`` (the tensor bytes
   of a sharded checkpoint), or a single ``model.safetensors``'s tensor bytes
   (from its header, read locally or over two HTTP range requests);
3. nothing: weights count as 0 and a note says so.

A note always says which was used. The parameter count is the Hub's own
(``safetensors.total`` of the model info), else the safetensors headers, else
the weight bytes divided by the bytes of ``torch_dtype``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from advisor.errors import BackendUnreachable, InputError
from advisor.hfconfig import from_config
from advisor.spec import ModelSpec

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# Bits per weight of a GGUF by llama.cpp quant type, for the weights of a model not yet downloaded.
# Source: llama.cpp 0c1e570 tools/quantize/quantize.cpp QUANT_OPTIONS. Where it gives a file size
# for Llama-3-8B ("4.58G, +0.1754 ppl @ Llama-3-8B"; G = GiB, 8,030,261,248 parameters) the bits per
# weight are that size × 2^33 / parameters: the whole-file average, with the embedding and output
# tensors at the types llama.cpp's mixes give them. Where it gives bits per weight
# ("2.06 bpw quantization") those are used as they are. F16/BF16/F32: the type's width.
_LLAMA3_8B_PARAMS = 8_030_261_248
_GIB_AT_LLAMA3_8B = {
    "Q2_K": 2.96,
    "Q2_K_S": 2.96,
    "Q3_K_S": 3.41,
    "Q3_K_M": 3.74,
    "Q3_K_L": 4.03,
    "Q4_0": 4.34,
    "Q4_1": 4.78,
    "Q4_K_S": 4.37,
    "Q4_K_M": 4.58,
    "Q5_0": 5.21,
    "Q5_1": 5.65,
    "Q5_K_S": 5.21,
    "Q5_K_M": 5.33,
    "Q6_K": 6.14,
    "Q8_0": 7.96,
}
_NOMINAL_BPW = {
    "Q1_0": 1.125,
    "Q2_0": 2.25,
    "IQ1_S": 1.56,
    "IQ1_M": 1.75,
    "TQ1_0": 1.69,
    "TQ2_0": 2.06,
    "IQ2_XXS": 2.06,
    "IQ2_XS": 2.31,
    "IQ2_S": 2.5,
    "IQ2_M": 2.7,
    "IQ3_XXS": 3.06,
    "IQ3_XS": 3.3,
    "IQ3_S": 3.44,
    "IQ3_M": 3.66,
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "F16": 16.0,
    "BF16": 16.0,
    "F32": 32.0,
}
QUANT_BPW: dict[str, float] = {
    **{q: gib * (1 << 33) / _LLAMA3_8B_PARAMS for q, gib in _GIB_AT_LLAMA3_8B.items()},
    **_NOMINAL_BPW,
}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def quant_bpw(quant: str) -> tuple[str, float]:
    """The canonical name and bits per weight of ``quant`` (case-insensitive)."""
    q = quant.strip().upper()
    if q not in QUANT_BPW:
        raise InputError(
            f"unknown quant {quant!r}",
            hint="one of: " + ", ".join(sorted(QUANT_BPW)),
        )
    return q, QUANT_BPW[q]


@dataclass(frozen=True, slots=True)
class Weights:
    """What is known of a checkpoint's weights."""

    n_bytes: int | None  # tensor bytes as published
    n_params: int | None  # parameter count
    source: str  # where n_bytes came from, for the note
    params_source: str = ""  # where n_params came from


class HFBackend:
    name = "hf"
    summary = "a Hugging Face config.json: a local file or folder, or a repo id fetched from the Hub (weights from its safetensors index, or --quant)"

    def load_spec(self, ref: str, *, quant: str | None = None, find_weights: bool = True) -> ModelSpec:
        """The spec of ``ref``; with ``find_weights``, its weights too (``quant``: as that GGUF quant)."""
        canon = quant_bpw(quant) if quant else None
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            config = _load_json(path)
            source = str(path)
            find: Callable[[bool], Weights | None] = lambda need_params: _local_weights(path.parent)  # noqa: E731
        elif ref.endswith(".json") or ref.startswith((".", "/", "~")):
            raise InputError(f"{ref}: no such file")
        elif not _REPO_ID.match(ref):
            raise InputError(f"{ref!r} is neither a config.json file nor a Hub repo id like 'Qwen/Qwen3-8B'")
        else:
            config = _load_json(_download(ref))
            source = f"hf:{ref}"
            find = lambda need_params: _hub_weights(ref, need_params)  # noqa: E731
        if not find_weights:
            return from_config(config, source=source)
        weights = find(canon is not None)
        if canon is None:
            if weights is None or weights.n_bytes is None:
                spec = from_config(config, source=source)
                note = "weights unknown (no safetensors index found): counted as 0; pass --weights-bytes or --quant"
                return replace(spec, notes=(*spec.notes, note))
            spec = from_config(config, source=source, weights_bytes=weights.n_bytes)
            return replace(spec, notes=(*spec.notes, f"weights: {weights.n_bytes:,} B from {weights.source}"))
        q, bpw = canon
        params, params_source = _params(weights, config)
        if params is None:
            raise InputError(
                f"{source}: the parameter count is unknown, so --quant {q} cannot size the weights",
                hint="pass --weights-bytes N (the size of the GGUF you would download)",
            )
        n_bytes = math.ceil(params * bpw / 8)
        spec = from_config(config, source=source)
        note = (
            f"weights: {q} at {bpw:.2f} bits per weight × {params:,} parameters ({params_source}) = {n_bytes:,} B, "
            "an estimate (bits per weight from llama.cpp's quantize table, tools/quantize/quantize.cpp)"
        )
        return replace(spec, weights_bytes=n_bytes, file_type=q, notes=(*spec.notes, note))


def _params(weights: Weights | None, config: dict[str, Any]) -> tuple[int | None, str]:
    if weights is not None and weights.n_params:
        return weights.n_params, weights.params_source
    if weights is None or weights.n_bytes is None:
        return None, ""
    text = config.get("text_config")
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype is None and isinstance(text, dict):
        dtype = text.get("torch_dtype") or text.get("dtype")
    width = _DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
    if width is None or "quantization_config" in config:
        return None, ""
    return weights.n_bytes // width, f"{weights.n_bytes:,} B of {dtype} weights / {width}"


# -- weights: local -------------------------------------------------------------


def _local_weights(folder: Path) -> Weights | None:
    index = folder / INDEX
    if index.is_file():
        return Weights(_total_size(_load_json(index), index), None, str(index))
    single = folder / SINGLE
    if single.is_file():
        try:
            with open(single, "rb") as f:
                n_bytes, n_params = _safetensors_header(lambda off, n: _read_at(f, off, n), str(single))
        except OSError as e:
            raise InputError(f"{single}: cannot read ({e.strerror})") from None
        return Weights(n_bytes, n_params, f"the header of {single}", f"the header of {single}")
    return None


def _read_at(f: Any, offset: int, n: int) -> bytes:
    f.seek(offset)
    data: bytes = f.read(n)
    return data


def _total_size(index: dict[str, Any], where: object) -> int:
    meta = index.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if isinstance(total, float) and total.is_integer():
        total = int(total)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise InputError(f"{where}: metadata.total_size is missing or not a byte count")
    return total


def _safetensors_header(read: Callable[[int, int], bytes], where: str) -> tuple[int, int]:
    """Tensor bytes and parameter count from a safetensors header (u64 length, then JSON)."""
    head = read(0, 8)
    if len(head) < 8:
        raise InputError(f"{where}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", head)
    if n > 100 << 20:
        raise InputError(f"{where}: not a safetensors file (header length {n:,})")
    try:
        doc = json.loads(read(8, n))
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{where}: not a safetensors file (its header is not JSON)") from None
    n_bytes = n_params = 0
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a safetensors file (its header is not a JSON object)")
    for name, t in doc.items():
        if name == "__metadata__":
            continue
        try:
            n_bytes = max(n_bytes, int(t["data_offsets"][1]))
            n_params += math.prod(int(d) for d in t["shape"])
        except (KeyError, TypeError, ValueError, IndexError):
            raise InputError(f"{where}: tensor {name!r} has no usable shape or data_offsets") from None
    return n_bytes, n_params


# -- weights: the Hub ---------------------------------------------------------------


def _hub_weights(repo_id: str, need_params: bool) -> Weights | None:
    params, params_source = _hub_params(repo_id) if need_params else (None, "")
    index = _download_optional(repo_id, INDEX)
    if index is not None:
        return Weights(
            _total_size(_load_json(index), f"{repo_id}/{INDEX}"), params, f"{repo_id}/{INDEX}", params_source
        )
    single = _remote_safetensors(repo_id)
    if single is not None:
        n_bytes, n_params = single
        where = f"the header of {repo_id}/{SINGLE}"
        return Weights(n_bytes, params or n_params, where, params_source if params else where)
    return Weights(None, params, "", params_source) if params else None


def _hub_params(repo_id: str) -> tuple[int | None, str]:
    """The parameter count the Hub computed from the safetensors files (one request); None offline."""
    from backends import hub

    if hub.offline():
        return None, ""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    errors: tuple[type[BaseException], ...] = (HfHubHTTPError, ValueError, *hub.transport_errors())
    try:
        info = HfApi(endpoint=hub.endpoint()).model_info(repo_id, expand=["safetensors"])
    except errors:
        return None, ""
    st = info.safetensors
    total = getattr(st, "total", None) if st is not None else None
    return (total, "the Hub's safetensors metadata") if isinstance(total, int) and total > 0 else (None, "")


def _remote_safetensors(repo_id: str) -> tuple[int, int] | None:
    """Tensor bytes and parameters of a single-file checkpoint, from its header (HTTP range requests)."""
    from backends import hub

    if hub.offline():
        return None
    from backends.http_source import HTTPSource

    url = hub.file_url(repo_id, SINGLE)
    name = f"hf://{repo_id}/{SINGLE}"
    try:
        with HTTPSource(url, headers=hub.auth_headers(), name=name, first_read=64 << 10) as src:
            return _safetensors_header(src.read, name)
    except InputError:  # 404: no single-file checkpoint either
        return None
    except BackendUnreachable:
        return None


def _download_optional(repo_id: str, filename: str) -> Path | None:
    """A small file of the repo through the HF cache, or None when the repo has none (or offline without it)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    from backends import hub

    try:
        return Path(hf_hub_download(repo_id, filename, endpoint=hub.endpoint()))
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None
    except (OSError, HfHubHTTPError):
        return None


# -- config.json ----------------------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config.json must hold a JSON object")
    return data


def _download(repo_id: str) -> Path:
    """hf_hub_download honours HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE and the HF cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from backends import hub

    try:
        return Path(hf_hub_download(repo_id, "config.json", endpoint=hub.endpoint()))
    except GatedRepoError:
        raise InputError(
            f"{repo_id} is gated: accept its licence on the Hub, then give a token",
            hint="export HF_TOKEN=<your token> (or run `hf auth login`)",
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"{repo_id}: no such repository on the Hub (or it is private)",
            hint="check the name; for a private repo export HF_TOKEN",
        ) from None
    except EntryNotFoundError:
        raise InputError(f"{repo_id} has no config.json (a GGUF-only repo? use `kvadvise gguf`)") from None
    except LocalEntryNotFoundError:
        raise BackendUnreachable(
            f"{repo_id}: the Hub cannot be reached and config.json is not in the local cache",
            hint="connect to the network once, or pass a local config.json",
        ) from None
    except (OSError, HfHubHTTPError) as e:
        raise BackendUnreachable(f"{repo_id}: download failed ({type(e).__name__})") from None
