"""After launch: is the model really 100% on the GPU, with the context asked for?

Reads ``/api/ps`` (optionally after loading the model with ``POST
/api/generate``, an empty prompt, ``keep_alive`` and ``options.num_ctx``,
which makes Ollama load it and answer ``done_reason: "load"``). Ollama's
``size`` is the sum of llama-server's buffers and ``size_vram`` the GPU part;
on a full offload Ollama reports size == size_vram (memory-spec.md §6.a
MemorySize), so ``fits`` is exactly "PROCESSOR says 100% GPU" plus the
context check.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama.name import OllamaName, parse_name
from kvadvise.errors import InputError

DEFAULT_LOAD_TIMEOUT = 600.0  # loading a large model from a slow disk takes minutes


@dataclass(frozen=True, slots=True)
class OllamaVerification:
    name: str  # as /api/ps names it (or as asked, when not loaded)
    size: int  # bytes, /api/ps size (0 when not loaded)
    size_vram: int
    context_length: int | None  # per slot, as the server runs it
    processor: str  # as `ollama ps` prints it; "" when not loaded
    fits: bool  # size_vram == size (100% GPU) and the context is the one asked for
    predicted_total_bytes: int | None
    difference_bytes: int | None  # size - predicted_total_bytes
    loaded: bool
    reasons: tuple[str, ...]


def verify(
    host: str | None,
    name: str,
    *,
    load: bool,
    num_ctx: int | None,
    predicted_total_bytes: int | None,
    keep_alive: str | int = "5m",
    timeout: float = ollama_api.DEFAULT_TIMEOUT,
    load_timeout: float = DEFAULT_LOAD_TIMEOUT,
) -> OllamaVerification:
    """Check a model on a live server. BackendUnreachable when the server does not answer."""
    wanted = parse_name(name)
    url = ollama_api.server_url(host)
    reasons: list[str] = []
    if load:
        body: dict[str, object] = {"model": name, "prompt": "", "stream": False, "keep_alive": keep_alive}
        if num_ctx is not None:
            body["options"] = {"num_ctx": num_ctx}
        try:
            ollama_api.call(url, "POST", "/api/generate", body=body, timeout=load_timeout)
        except ollama_api.ClientError as e:
            if e.status_code == 404:
                raise InputError(
                    f"Ollama at {url} does not have {wanted.display}", hint=f"ollama pull {wanted.display}"
                ) from None
            reasons.append(f"the server refused to load it: HTTP {e.status_code} {ollama_api.one_line(e.error)}")
        except ollama_api.ServerError as e:  # it answered: a failed load (out of memory, ...), not a missing server
            reasons.append(f"the server failed to load it: HTTP {e.status} {ollama_api.one_line(e.error)}")

    running = ollama_api.running_models(url, timeout=timeout)
    match = next((m for m in running if _same(m.name, wanted) or _same(m.model, wanted)), None)
    if match is None:
        others = ", ".join(m.name for m in running) or "none"
        reasons.append(f"{wanted.display} is not loaded (loaded now: {others})")
        if not load:
            reasons.append("load it with --load, or run it once with `ollama run`")
        return OllamaVerification(
            name=wanted.display,
            size=0,
            size_vram=0,
            context_length=None,
            processor="",
            fits=False,
            predicted_total_bytes=predicted_total_bytes,
            difference_bytes=None,
            loaded=False,
            reasons=tuple(reasons),
        )

    on_gpu = match.size > 0 and match.size_vram == match.size
    if not on_gpu:
        if match.size_vram < match.size:
            reasons.append(f"spilled: {match.size_cpu:,} of {match.size:,} B are on the CPU ({match.processor})")
        else:
            reasons.append(
                f"the server reports size {match.size:,} B and size_vram {match.size_vram:,} B ({match.processor})"
            )
    ctx_ok = num_ctx is None or match.context_length == num_ctx
    if not ctx_ok:
        shown = "not reported" if match.context_length is None else f"{match.context_length:,}"
        reasons.append(
            f"context {shown}, asked {num_ctx:,} (Ollama clamps num_ctx to the model's training context; "
            "a model already loaded with another num_ctx keeps it until it is reloaded)"
        )
    diff = match.size - predicted_total_bytes if predicted_total_bytes is not None else None
    return OllamaVerification(
        name=match.name,
        size=match.size,
        size_vram=match.size_vram,
        context_length=match.context_length,
        processor=match.processor,
        fits=on_gpu and ctx_ok,
        predicted_total_bytes=predicted_total_bytes,
        difference_bytes=diff,
        loaded=True,
        reasons=tuple(reasons),
    )


def _same(ps_name: str, wanted: OllamaName) -> bool:
    if not ps_name:
        return False
    try:
        return parse_name(ps_name).same_model(wanted)
    except InputError:
        return False
