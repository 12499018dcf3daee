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
    context_checked: bool = True  # False: the server (older than v0.9.7) does not report context_length
    prompt_tokens_per_s: float | None = None  # Ollama's counters, from one short generate (--load)
    decode_tokens_per_s: float | None = None
    kv_cache_type: str | None = None  # the cache type the prediction used
    kv_cache_type_source: str | None = None  # the flag, the env file or drop-in kvadvise wrote, or the default
    matched_by: str | None = None  # "name" | "digest"
    decode_estimate_tokens_per_s: float | None = None  # kvadvise's estimate on this machine's GPU, beside the measure


def verify(
    host: str | None,
    name: str,
    *,
    load: bool,
    num_ctx: int | None,
    predicted_total_bytes: int | None,
    keep_alive: str | int = "5m",
    digest: str | None = None,
    measure_speed: bool = False,
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

    speed: tuple[float | None, float | None] = (None, None)
    if load and measure_speed and not reasons:
        speed = _measure_speed(url, name, num_ctx, keep_alive, load_timeout)
    running = ollama_api.running_models(url, timeout=timeout)
    match = next((m for m in running if _same(m.name, wanted) or _same(m.model, wanted)), None)
    matched_by = "name" if match is not None else None
    if match is None and digest:
        # `ollama ps` lists a model under the name it was loaded by: qwen3-coder:latest and
        # qwen3-coder:30b are one digest
        match = next((m for m in running if m.digest and _digest_eq(m.digest, digest)), None)
        if match is not None:
            matched_by = "digest"
            reasons.append(f"{wanted.display} is loaded as {match.name} (the same digest)")
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
    runner = _runner_gpu_bytes()
    if on_gpu and runner is not None and runner < match.size_vram // 2:
        # users see "100% GPU" while the model runs on the CPU (ollama/ollama#7323, #9704)
        on_gpu = False
        reasons.append(
            f"the server reports {match.size_vram:,} B on the GPU, but NVML sees the Ollama runner holding only "
            f"{runner:,} B there: the model may be running on the CPU"
        )
    context_checked = match.context_length is not None
    if not context_checked and num_ctx is not None:
        reasons.append(
            "the context cannot be checked: this server does not report context_length in /api/ps "
            "(Ollama older than v0.9.7)"
        )
    ctx_ok = num_ctx is None or not context_checked or match.context_length == num_ctx
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
        context_checked=context_checked,
        prompt_tokens_per_s=speed[0],
        decode_tokens_per_s=speed[1],
        matched_by=matched_by,
    )


SPEED_PROMPT = "Explain in two sentences why a GPU's memory bandwidth limits the decode speed of a language model."
SPEED_TOKENS = 64


def _measure_speed(
    url: str, name: str, num_ctx: int | None, keep_alive: str | int, timeout: float
) -> tuple[float | None, float | None]:
    """One short generate (num_predict 64): prompt and decode tokens/s from Ollama's own counters
    (prompt_eval_count / prompt_eval_duration, eval_count / eval_duration; durations in ns)."""
    opts: dict[str, object] = {"num_predict": SPEED_TOKENS}
    if num_ctx is not None:
        opts["num_ctx"] = num_ctx
    body = {"model": name, "prompt": SPEED_PROMPT, "stream": False, "keep_alive": keep_alive, "options": opts}
    try:
        doc = ollama_api.call(url, "POST", "/api/generate", body=body, timeout=timeout)
    except (ollama_api.ClientError, ollama_api.ServerError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    return _rate(doc, "prompt_eval_count", "prompt_eval_duration"), _rate(doc, "eval_count", "eval_duration")


def _rate(doc: dict[str, object], count: str, duration_ns: str) -> float | None:
    n, d = doc.get(count), doc.get(duration_ns)
    if not isinstance(n, int) or not isinstance(d, int) or isinstance(n, bool) or n <= 0 or d <= 0:
        return None
    return n / (d / 1e9)


def _digest_eq(a: str, b: str) -> bool:
    a, b = a.removeprefix("sha256:").lower(), b.removeprefix("sha256:").lower()
    return len(a) >= 12 and len(b) >= 12 and (a.startswith(b) or b.startswith(a))


def _same(ps_name: str, wanted: OllamaName) -> bool:
    if not ps_name:
        return False
    try:
        return parse_name(ps_name).same_model(wanted)
    except InputError:
        return False


RUNNER_NAMES = ("ollama", "llama-server")  # Ollama's runner is `ollama runner` or (>= 0.30) llama-server


def _runner_gpu_bytes() -> int | None:
    """GPU memory the Ollama runner processes hold, as NVML sees it; None without NVML (or no runner seen)."""
    from kvadvise.planner.hardware import gpu_memory_by_process

    by_pid = gpu_memory_by_process()
    if by_pid is None:
        return None
    import psutil

    total, seen = 0, False
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if any(any(n in part for n in RUNNER_NAMES) for part in cmd[:2]):
            seen = True
            total += by_pid.get(int(p.info["pid"]), 0)
    return total if seen else None
