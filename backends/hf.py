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

import contextlib
import importlib
import json
import logging
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvadvise.deadline import within
from kvadvise.errors import BackendUnreachable, InputError, KvadviseError
from kvadvise.files import load_json, open_regular
from kvadvise.model.breakdown import MXFP4_BPW, fallback_surplus_bytes, with_parts
from kvadvise.model.breakdown import params as count_params
from kvadvise.model.hfconfig import from_config
from kvadvise.model.quants import quant_bpw
from kvadvise.model.spec import ModelSpec, with_weights
from kvadvise.units import MAX_SIZE_BYTES

if TYPE_CHECKING:
    import click

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"
MAX_JSON_BYTES = 16 << 20  # a config.json is a few KB, a safetensors index a few hundred

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


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

    def register_commands(self, cli: click.Group, verify: click.Group) -> None:
        """``kvadvise hf CONFIG`` (kvadvise.plugins.CommandProvider)."""
        cli.add_command(_hf_command(self))

    def load_spec(
        self, ref: str, *, quant: str | None = None, find_weights: bool = True, weights_bytes: int | None = None
    ) -> ModelSpec:
        """The spec of ``ref``; with ``find_weights``, its weights too (``quant``: as that GGUF quant;
        ``weights_bytes``: given by hand, nothing looked up). The parts of the weights (embeddings, each
        block, the routed experts) are counted from the config and scaled to them
        (kvadvise.model.breakdown.with_parts): a MoE model reads only the experts in use per token, and
        several GPUs take their layers' share, as for a GGUF."""
        config, spec = self._load(ref, quant=quant, find_weights=find_weights and weights_bytes is None)
        if weights_bytes is not None:
            spec = with_weights(spec, weights_bytes, source="--weights-bytes")
        expert_bpw = MXFP4_BPW if _keeps_mxfp4_experts(config, quant) else None
        return with_parts(spec, config, _parts_quant(config, quant, spec.file_type), expert_bpw=expert_bpw)

    def _load(self, ref: str, *, quant: str | None, find_weights: bool) -> tuple[dict[str, Any], ModelSpec]:
        canon = quant_bpw(quant) if quant else None
        path = Path(os.path.expanduser(ref))  # ~user of no such user stays as typed: "no such file"
        if os.path.isdir(path):  # os.path: a folder that cannot be searched is not an internal error
            path = path / "config.json"
        if os.path.isfile(path):
            config = _load_json(path)
            source = str(path)
            find: Callable[[bool], Weights | None] = lambda need_params: _local_weights(path.parent)  # noqa: E731
        elif os.path.isdir(os.path.expanduser(ref)):
            raise InputError(f"{ref}: no config.json in this folder", hint="give the folder of a Hub download")
        elif os.path.lexists(path):  # a device, a FIFO, a socket: said as a GGUF path says it (never read)
            os.close(open_regular(path))
            raise InputError(f"{ref}: not a regular file")  # pragma: no cover - open_regular refused it
        elif ref.endswith(".json") or ref.startswith((".", "/", "~")):
            raise InputError(f"{ref}: no such file")
        elif not _REPO_ID.match(ref):
            raise InputError(f"{ref!r} is neither a config.json file nor a Hub repo id like 'Qwen/Qwen3-8B'")
        else:
            config = _load_json(_download(ref))
            source = f"hf:{ref}"
            find = lambda need_params: _hub_weights(ref, need_params)  # noqa: E731
        if not find_weights:
            return config, from_config(config, source=source)
        weights = find(canon is not None)
        counted = ""  # no index and no --quant: the checkpoint's own dtype, counted from the config
        if canon is None:
            if weights is not None and weights.n_bytes is not None:
                spec = from_config(config, source=source, weights_bytes=weights.n_bytes)
                note = f"weights: {weights.n_bytes:,} B from {weights.source}"
                return config, replace(spec, notes=(*spec.notes, note))
            spec = from_config(config, source=source)
            checkpoint = _checkpoint_quant(config)
            if checkpoint is None or count_params(spec, config) is None:  # never a "fit" at 0 bytes of weights
                raise InputError(
                    f"{source}: the weights cannot be counted (no safetensors index beside it, "
                    + ("a quantization_config of its own" if checkpoint is None else "parts not countable")
                    + ")",
                    hint="--quant Q4_K_M (the GGUF you will run) or --weights-bytes N (its size; 0: the K/V alone)",
                )
            canon, counted = checkpoint, checkpoint[0]
        q, bpw = canon
        spec = from_config(config, source=source)
        parts = count_params(spec, config)  # the config's parts (kvadvise.model.breakdown); None: not countable
        params, params_source = _params(weights, config)
        if params is None and parts is not None:  # no checkpoint to read: the parts' count
            params, params_source = parts.total, "counted from config.json, norms and biases left out"
        if params is None:
            raise InputError(
                f"{source}: the parameter count is unknown, so --quant {q} cannot size the weights",
                hint="pass --weights-bytes N (the size of the GGUF you would download)",
            )
        n_bytes = math.ceil(params * bpw / 8)
        note = (
            f"weights: {q} at {bpw:.2f} bits per weight × {params:,} parameters ({params_source}) = {n_bytes:,} B, "
            "an estimate (bits per weight from llama.cpp's quantize table, tools/quantize/quantize.cpp)"
        )
        if counted:  # never 0 for weights that exist: a 70B config "fit" a 24 GB card
            note = (
                f"weights: no safetensors index found: the checkpoint's {counted} (config.json's dtype or "
                f"quantization_config), {params:,} parameters ({params_source}) = {n_bytes:,} B; "
                "the GGUF you run: --quant Q4_K_M, or its size: --weights-bytes N"
            )
        if parts is not None and _keeps_mxfp4_experts(config, q):
            # the experts at MXFP4's 4.25 bits, only the other tensors take the quantizer's types
            experts = sum(parts.experts)
            n_bytes = math.ceil((params - experts) * bpw / 8 + experts * MXFP4_BPW / 8)
            note += f"; its {experts:,} routed-expert parameters stay MXFP4 ({MXFP4_BPW} bits): {n_bytes:,} B"
            zero = (0,) * len(parts.experts_odd)
            parts = replace(parts, experts_odd=zero, experts_down_odd=zero)
        surplus = fallback_surplus_bytes(parts, q) if parts is not None else 0
        if surplus:  # rows not a multiple of 256: the quantizer's 32-block fallback types, larger than the rate
            n_bytes += surplus
            note += (
                f", plus {surplus:,} B for the tensors whose rows are not a multiple of 256 (llama-quant.cpp "
                f"tensor_type_fallback: Q4_K -> Q5_0, Q6_K -> Q8_0; output.weight Q8_0): {n_bytes:,} B"
            )
        return config, replace(spec, weights_bytes=n_bytes, file_type=q, notes=(*spec.notes, note))


def _checkpoint_quant(config: dict[str, Any]) -> tuple[str, float] | None:
    """What a checkpoint's safetensors hold, as (name, bits per weight), from config.json: its quantization_config
    (MXFP4: gpt-oss, the experts MXFP4 (_keeps_mxfp4_experts) and the rest BF16; FP8 at 8 bits, the block scales
    left out; a bits-wide AWQ/GPTQ at its bits, the group scales left out), else its dtype (torch_dtype or
    text_config's: BF16, F16, F32; none named: BF16, what transformers' checkpoints of this era are saved in).
    None for a quantization_config whose width is not said, or a dtype not known here."""
    text = config.get("text_config")
    qc = config.get("quantization_config")
    if qc is None and isinstance(text, dict):
        qc = text.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method", "")).lower()
        if method == "mxfp4":
            return "BF16", 16.0
        if "fp8" in method or str(qc.get("fmt", "")).lower().startswith("e4m3"):
            return "FP8", 8.0
        bits = qc.get("bits", qc.get("w_bit"))
        if isinstance(bits, int) and not isinstance(bits, bool) and 2 <= bits <= 8:
            return f"{method.upper() or 'quantized'} {bits}-bit", float(bits)
        return None
    if qc is not None:
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype is None and isinstance(text, dict):
        dtype = text.get("torch_dtype") or text.get("dtype")
    if dtype is None:
        return "BF16", 16.0
    widths = {"bfloat16": ("BF16", 16.0), "float16": ("F16", 16.0), "float32": ("F32", 32.0)}
    return widths.get(dtype) if isinstance(dtype, str) else None


def _keeps_mxfp4_experts(config: dict[str, Any], quant: str | None) -> bool:
    """An MXFP4 checkpoint (gpt-oss) planned at a --quant: its GGUFs keep the routed experts MXFP4 at any quant name
    (unsloth's gpt-oss Q4_K_M is 11.6 GB for the 20B, 62.8 GB for the 120B; bartowski's "all FFN kept at MXFP4")."""
    return quant is not None and _parts_quant(config, None, "") == "MXFP4"


def _parts_quant(config: dict[str, Any], quant: str | None, file_type: str) -> str:
    """The quant the parts are sized at: --quant, an MXFP4 checkpoint's (gpt-oss: experts MXFP4, the rest
    BF16), else the dtype's (one width for every part: only their shares matter once scaled)."""
    if quant:
        return quant
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "mxfp4":
        return "MXFP4"
    return file_type.upper() if file_type.upper() in ("F16", "BF16", "F32") else "F16"


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
        doc = load_json(read(8, n))
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
    from kvadvise.backends.remote import hub

    if hub.offline():
        return None, ""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    errors: tuple[type[BaseException], ...] = (
        HfHubHTTPError,
        ValueError,
        BackendUnreachable,
        *hub.transport_errors(),
    )
    try:  # optional: a Hub that does not answer in time leaves the count unknown
        info = within(
            hub.HUB_DEADLINE_S,
            lambda: HfApi(endpoint=hub.endpoint()).model_info(repo_id, expand=["safetensors"]),
            lambda: BackendUnreachable(f"{repo_id}: no answer in time"),
        )
    except errors:
        return None, ""
    st = info.safetensors
    total = getattr(st, "total", None) if st is not None else None
    return (total, "the Hub's safetensors metadata") if isinstance(total, int) and total > 0 else (None, "")


def _remote_safetensors(repo_id: str) -> tuple[int, int] | None:
    """Tensor bytes and parameters of a single-file checkpoint, from its header (HTTP range requests)."""
    from kvadvise.backends.remote import hub

    if hub.offline():
        return None
    from kvadvise.backends.remote.http_source import HTTPSource

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
    """A small file of the repo through the HF cache, or None when the repo has none (or it cannot be had)."""
    try:
        return _hub_file(repo_id, filename)
    except KvadviseError:
        return None


# -- config.json ----------------------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_JSON_BYTES:
                raise _too_large(path, size)
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if len(raw) > MAX_JSON_BYTES:  # grew since the stat
        raise _too_large(path, len(raw))
    try:
        data = load_json(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config.json must hold a JSON object")
    return data


def _too_large(where: object, size: int) -> InputError:
    return InputError(
        f"{where}: {size / (1 << 20):,.1f} MiB is too large for a config.json "
        f"(they are a few KB; the limit is {MAX_JSON_BYTES >> 20} MiB)",
        hint="is it the right file? a config.json holds the model's hyperparameters, not its weights",
    )


def _download(repo_id: str) -> Path:
    """The repo's config.json, through the HF cache (HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE honoured)."""
    return _hub_file(repo_id, CONFIG)


# -- the Hub: one file, in bounded time, in one line -----------------------------------


def _hub_file(repo_id: str, filename: str) -> Path:
    """``filename`` of the repo through the HF cache (``hf_hub_download``: HF_TOKEN, HF_ENDPOINT,
    HF_HUB_OFFLINE and the cache honoured), or a domain error.

    huggingface_hub retries a failed request for up to ~25 s, logging each retry on stderr, and
    turns most failures of its HEAD request into a LocalEntryNotFoundError that no longer says
    what happened. So: one HEAD first (``get_hf_file_metadata``, which does not retry) tells a
    rejected token, a denied repo, a missing file, a Hub that is down or unreachable, and a file
    too large to be a config; when it fails, a copy in the cache is used as huggingface_hub would.
    The download itself is given a deadline (the HEAD and download timeouts: one attempt each),
    and huggingface_hub's logger is kept to errors.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url

    from kvadvise.backends.remote import hub

    _quiet_hub()
    if hub.offline():
        cached = _cached(repo_id, filename)
        if cached is None:
            raise BackendUnreachable(
                f"{repo_id}: offline (HF_HUB_OFFLINE is set) and {filename} is not in the local HF cache",
                hint="run it once with a network, or pass a local config.json",
            )
        return cached
    base = hub.endpoint()
    etag_s = float(getattr(constants, "HF_HUB_ETAG_TIMEOUT", 10))
    download_s = float(getattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 10))
    try:
        meta = within(
            etag_s,
            lambda: get_hf_file_metadata(hf_hub_url(repo_id, filename, endpoint=base), timeout=etag_s),
            lambda: BackendUnreachable(f"{repo_id}: no complete answer from {base} within {etag_s:g} s"),
        )
    except BackendUnreachable:
        cached = _cached(repo_id, filename)
        if cached is not None:
            return cached
        raise
    except Exception as e:
        cached = _cached(repo_id, filename)
        if cached is not None:  # what hf_hub_download does when its HEAD fails
            return cached
        err = _hub_error(repo_id, filename, e, f"cannot reach {base}")
        if err is None:
            raise
        raise err from None
    size = getattr(meta, "size", None)
    if isinstance(size, int) and size > MAX_JSON_BYTES:
        raise _too_large(f"{repo_id}/{filename}", size)
    deadline = etag_s + download_s  # one HEAD and one GET, no retries
    try:
        return Path(
            within(
                deadline,
                lambda: hf_hub_download(repo_id, filename, endpoint=base),
                lambda: BackendUnreachable(
                    f"{repo_id}: downloading {filename} from {base} failed: no complete answer within {deadline:g} s",
                    hint="check the network; HF_HUB_DOWNLOAD_TIMEOUT (seconds) allows more",
                ),
            )
        )
    except BackendUnreachable:
        raise
    except Exception as e:
        err = _hub_error(repo_id, filename, e, f"downloading {filename} from {base} failed")
        if err is None:
            raise
        raise err from None


def _cached(repo_id: str, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def _quiet_hub() -> None:
    """Keep huggingface_hub's retry warnings off stderr (unless HF_HUB_VERBOSITY asks for them)."""
    if os.environ.get("HF_HUB_VERBOSITY"):
        return
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its library root logger


def _http_errors() -> tuple[type[BaseException], ...]:
    """The base errors of huggingface_hub's HTTP client, whichever it is: OSError (requests),
    httpx.HTTPError (huggingface_hub 1.x), httpx2.HTTPError (2.x); they include the timeouts,
    connection resets and bodies shorter than their length."""
    errs: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError, AttributeError):
            errs.append(importlib.import_module(module).HTTPError)
    return tuple(errs)


def _hub_error(repo_id: str, filename: str, e: BaseException, failed: str) -> KvadviseError | None:
    """The domain error for what huggingface_hub raised (``failed``: what to say of a network error);
    None when it is none of the Hub's or the network's (a bug: re-raise it)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    from kvadvise.backends.remote import hub

    if isinstance(e, LocalEntryNotFoundError):  # before EntryNotFoundError: a subclass of it (huggingface_hub 2.x)
        cause = e.__cause__
        if isinstance(cause, Exception) and not isinstance(cause, LocalEntryNotFoundError):
            return _hub_error(repo_id, filename, cause, failed)
        return BackendUnreachable(
            f"{repo_id}: the Hub cannot be reached and {filename} is not in the local HF cache",
            hint="connect to the network once, or pass a local config.json",
        )
    if isinstance(e, OfflineModeIsEnabled):
        return BackendUnreachable(
            f"{repo_id}: huggingface_hub is in offline mode and {filename} is not in the local HF cache",
            hint="unset HF_HUB_OFFLINE, or pass a local config.json",
        )
    if isinstance(e, GatedRepoError):  # before RepositoryNotFoundError: a subclass of it
        return InputError(
            f"{repo_id} is gated: accept its licence on the Hub, then give a token", hint=hub.denied_hint(repo_id)
        )
    if isinstance(e, RepositoryNotFoundError):
        return InputError(
            f"{repo_id}: no such repository on the Hub (or it is private)",
            hint="check the name; for a private repo export HF_TOKEN=<your token>",
        )
    if isinstance(e, EntryNotFoundError):
        if filename == CONFIG:
            return InputError(f"{repo_id} has no config.json (a GGUF-only repo? use `kvadvise gguf`)")
        return InputError(f"{repo_id} has no {filename}")
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            if hub.auth_headers():
                return InputError(
                    f"{repo_id}: the Hub rejected the access token (HTTP 401: invalid credentials)",
                    hint="export HF_TOKEN=<a valid token with read access> (or run `hf auth login`); "
                    "a public repo needs none: unset HF_TOKEN",
                )
            return InputError(
                f"{repo_id}: the Hub asks for an access token (HTTP 401)",
                hint="export HF_TOKEN=<your token> (or run `hf auth login`)",
            )
        if status == 403:
            return InputError(f"{repo_id}: the Hub denied access (HTTP 403)", hint=hub.denied_hint(repo_id))
        if status == 404:
            return InputError(f"{repo_id}: {filename} not found on the Hub (HTTP 404)")
        return BackendUnreachable(
            f"{repo_id}: the Hub ({hub.endpoint()}) answered HTTP {status} for {filename}", hint="try again later"
        )
    if isinstance(e, OSError) and e.filename:  # the HF cache, not the network
        return InputError(
            f"{e.filename}: {e.strerror or type(e).__name__}",
            hint="the HF cache must be writable: check HF_HOME / HF_HUB_CACHE",
        )
    if isinstance(e, _http_errors()):
        return BackendUnreachable(
            f"{repo_id}: {failed} ({type(e).__name__})",
            hint="check the network; a config.json downloaded once is used from the HF cache",
        )
    return None


def _hf_command(backend: HFBackend) -> click.Command:
    import click

    from kvadvise.ui.flags import TEXT, run_options, take
    from kvadvise.ui.show import answer

    @click.command("hf")
    @click.argument("config")
    @click.option(
        "--weights-bytes",
        type=click.IntRange(min=0, max=MAX_SIZE_BYTES),
        default=None,
        help="Size of the weights you will load [default: from the safetensors index, or --quant].",
    )
    @click.option(
        "--quant",
        metavar="QUANT",
        type=TEXT,
        default=None,
        help="Weights as a GGUF of this llama.cpp quant (e.g. Q4_K_M): bits per weight × parameters.",
    )
    @run_options
    def hf(config: str, weights_bytes: int | None, quant: str | None, **kwargs: object) -> None:
        """Memory for a Hugging Face model: a config.json file or folder, or a repo id."""
        if quant is not None and weights_bytes is not None:
            raise click.UsageError("give --quant or --weights-bytes, not both")
        from kvadvise.entry import plan_for
        from kvadvise.plugins import runtime as named

        f = take(dict(kwargs))
        runtime = named(f.runtime)
        plan = plan_for(backend.load_spec(config, quant=quant, weights_bytes=weights_bytes), f.request, runtime)
        answer(plan, f.view, runtime, requested_ctx=f.request.n_ctx)

    return hf
