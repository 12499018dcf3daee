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

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama.name import OllamaName, parse_name
from kvadvise.errors import BackendUnreachable, InputError

if TYPE_CHECKING:  # the listing module loads only when a name does not match
    from kvadvise.backends.ollama.installed import Tagged

DEFAULT_LOAD_TIMEOUT = 600.0  # loading a large model from a slow disk takes minutes


@dataclass(frozen=True, slots=True)
class OllamaVerification:
    """What `verify ollama` found: the model as the server runs it, against the plan for it."""

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
    matched_by: str | None = None  # "name" | "digest" | "alias"
    decode_estimate_tokens_per_s: float | None = None  # kvadvise's estimate on this machine's GPU, beside the measure
    runner_pid: int | None = None  # the runner process measured through NVML (a local server)
    runner_gpu_bytes: int | None = None  # what NVML lists for it; None when it cannot be measured
    predicted_ctx: int | None = None  # the context per slot the prediction is for: the server's, when it reports one
    prompt_tokens: int | None = None  # the prompt Ollama's prompt counters timed (prompt_eval_count)
    prompt_estimate_tokens_per_s: float | None = None  # kvadvise's prefill estimate for that prompt, beside the measure


def verify(
    host: str | None,
    name: str,
    *,
    load: bool,
    num_ctx: int | None,
    predicted_total_bytes: int | None,
    keep_alive: str | int = "5m",
    digest: str | None = None,
    model_path: str | None = None,
    aliases: Sequence[str] = (),
    predict_at: Callable[[int], int] | None = None,
    measure_speed: bool = False,
    timeout: float = ollama_api.DEFAULT_TIMEOUT,
    load_timeout: float = DEFAULT_LOAD_TIMEOUT,
) -> OllamaVerification:
    """Check a model on a live server. BackendUnreachable when the server does not answer.

    ``digest``: the manifest's, when a store here has the model; the server's ``/api/tags`` gives it
    otherwise. ``aliases``: other names of the same model in Ollama's library (the built-in profile's id
    and aliases: qwen3-coder:latest is qwen3-coder:30b). ``predict_at``: the predicted total at a context
    per slot, asked at the context the server reports it runs (else ``predicted_total_bytes`` stands).
    ``model_path``: the model's GGUF blob in the store, to tell its runner process from the others
    (:func:`runner_memory`).
    """
    wanted = parse_name(name)
    url = ollama_api.server_url(host)
    reasons: list[str] = []
    tagged: tuple[Tagged, ...] | None = None  # /api/tags, asked once and only when a name does not match
    loaded_ok = load
    if load:
        body: dict[str, object] = {"model": name, "prompt": "", "stream": False, "keep_alive": keep_alive}
        if num_ctx is not None:
            body["options"] = {"num_ctx": num_ctx}
        try:
            ollama_api.call(url, "POST", "/api/generate", body=body, timeout=load_timeout)
        except ollama_api.ClientError as e:
            if e.status_code != 404:
                loaded_ok = False
                reasons.append(f"the server refused to load it: HTTP {e.status_code} {ollama_api.one_line(e.error)}")
            else:
                # the server may have it under another name: the same digest, or a library alias it was pulled by
                tagged = _server_tags(url)
                other = _same_on_server(tagged, wanted, digest, aliases)
                if other is None:
                    raise InputError(
                        f"Ollama at {url} does not have {wanted.display}", hint=f"ollama pull {wanted.display}"
                    ) from None
                name = other[0].name
                body["model"] = name
                reasons.append(f"the server does not list {wanted.display}; loaded {name} ({other[1]})")
                try:
                    ollama_api.call(url, "POST", "/api/generate", body=body, timeout=load_timeout)
                except ollama_api.ClientError as e2:
                    loaded_ok = False
                    reasons.append(
                        f"the server refused to load it: HTTP {e2.status_code} {ollama_api.one_line(e2.error)}"
                    )
                except ollama_api.ServerError as e2:
                    loaded_ok = False
                    reasons.append(f"the server failed to load it: HTTP {e2.status} {ollama_api.one_line(e2.error)}")
        except ollama_api.ServerError as e:  # it answered: a failed load (out of memory, ...), not a missing server
            loaded_ok = False
            reasons.append(f"the server failed to load it: HTTP {e.status} {ollama_api.one_line(e.error)}")

    speed: tuple[float | None, float | None, int | None] = (None, None, None)
    if loaded_ok and measure_speed:
        speed = _measure_speed(url, name, num_ctx, keep_alive, load_timeout)
    running = ollama_api.running_models(url, timeout=timeout)
    match, matched_by, how = _find_running(running, wanted, url, digest, aliases, tagged)
    if how:
        reasons.append(how)
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
    runner = runner_memory(url, model_path) if match.size_vram > 0 else None
    if runner is not None and runner.note is not None:
        reasons.append(runner.note)
    elif on_gpu and runner is not None and runner.gpu_bytes is not None and runner.gpu_bytes < match.size_vram // 2:
        # users see "100% GPU" while the model runs on the CPU (ollama/ollama#7323, #9704)
        on_gpu = False
        reasons.append(
            f"the server reports {match.size_vram:,} B on the GPU, but NVML sees the Ollama runner (pid "
            f"{runner.pid}) holding only {runner.gpu_bytes:,} B there: the model may be running on the CPU"
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
    predicted_ctx = num_ctx
    if predict_at is not None and match.context_length:
        # the size /api/ps reports is that of the context the runner holds (num_ctx clamped to the training
        # context, or a load by another client): predict that one
        predicted_ctx = match.context_length
        predicted_total_bytes = predict_at(match.context_length)
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
        prompt_tokens=speed[2],
        matched_by=matched_by,
        runner_pid=runner.pid if runner is not None else None,
        runner_gpu_bytes=runner.gpu_bytes if runner is not None else None,
        predicted_ctx=predicted_ctx if predicted_total_bytes is not None else None,
    )


def _server_tags(url: str) -> tuple[Tagged, ...]:
    """``/api/tags``; () from a server that refuses or fails it (a 4xx or 5xx: it still answers /api/ps; a
    server that is down says so at /api/ps, asked next)."""
    from kvadvise.backends.ollama.installed import tags

    try:
        return tags(url)
    except (ollama_api.ClientError, ollama_api.ServerError, BackendUnreachable):
        return ()


def _same_on_server(
    tagged: Sequence[Tagged], wanted: OllamaName, digest: str | None, aliases: Sequence[str]
) -> tuple[Tagged, str] | None:
    """The model the server lists under another name than ``wanted``: by digest, else by a library alias."""
    if digest:
        for t in tagged:
            if t.digest and _digest_eq(t.digest, digest):
                return t, "the same digest"
    for alias in aliases:
        for t in tagged:
            if _same(t.name, _parsed(alias)):
                return t, f"{alias} is {wanted.display} in Ollama's library"
    return None


def _find_running(
    running: Sequence[ollama_api.RunningModel],
    wanted: OllamaName,
    url: str,
    digest: str | None,
    aliases: Sequence[str],
    tagged: tuple[Tagged, ...] | None,
) -> tuple[ollama_api.RunningModel | None, str | None, str | None]:
    """The /api/ps entry of ``wanted``, how it matched and, unless by name, a line that says so.

    `ollama ps` lists a model under the name it was loaded by, and qwen3-coder:latest and qwen3-coder:30b
    are one manifest. Tried in turn: the name; the manifest digest, the store's or else the one /api/tags
    lists for the name (both endpoints report mf.Digest(): Ollama server/model_list_cache.go and
    server/images.go GetModel); the library's aliases (the built-in profiles), which hold when the server
    lists only one of the names.
    """
    match = next((m for m in running if _same(m.name, wanted) or _same(m.model, wanted)), None)
    if match is not None or not running:
        return match, "name" if match is not None else None, None
    digests = [digest] if digest else []
    if tagged is None:
        tagged = _server_tags(url)
    digests += [t.digest for t in tagged if t.digest and _same(t.name, wanted)]
    for d in digests:
        match = next((m for m in running if m.digest and _digest_eq(m.digest, d)), None)
        if match is not None:
            return match, "digest", f"{wanted.display} is loaded as {match.name} (the same digest)"
    for alias in aliases:
        a = _parsed(alias)
        match = next((m for m in running if _same(m.name, a) or _same(m.model, a)), None)
        if match is not None:
            listed = any(_same(t.name, wanted) for t in tagged)
            why = "" if listed else f"; the server does not list {wanted.display}, so its digest is not known"
            return match, "alias", f"{wanted.display} is loaded as {match.name} ({alias} in Ollama's library{why})"
    return None, None, None


def _parsed(name: str) -> OllamaName:
    try:
        return parse_name(name)
    except InputError:
        return OllamaName("", "", "", "")


SPEED_PROMPT = "Explain in two sentences why a GPU's memory bandwidth limits the decode speed of a language model."
SPEED_TOKENS = 64


def _measure_speed(
    url: str, name: str, num_ctx: int | None, keep_alive: str | int, timeout: float
) -> tuple[float | None, float | None, int | None]:
    """One short generate (num_predict 64): prompt and decode tokens/s from Ollama's own counters
    (prompt_eval_count / prompt_eval_duration, eval_count / eval_duration; durations in ns)."""
    opts: dict[str, object] = {"num_predict": SPEED_TOKENS}
    if num_ctx is not None:
        opts["num_ctx"] = num_ctx
    body = {"model": name, "prompt": SPEED_PROMPT, "stream": False, "keep_alive": keep_alive, "options": opts}
    try:
        doc = ollama_api.call(url, "POST", "/api/generate", body=body, timeout=timeout)
    except (ollama_api.ClientError, ollama_api.ServerError):
        return None, None, None
    if not isinstance(doc, dict):
        return None, None, None
    count = doc.get("prompt_eval_count")
    n_prompt = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
    return _rate(doc, "prompt_eval_count", "prompt_eval_duration"), _rate(doc, "eval_count", "eval_duration"), n_prompt


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


@dataclass(frozen=True, slots=True)
class RunnerMemory:
    """The device memory of the runner process serving a model, as NVML sees it."""

    pid: int | None  # the runner found (None: none could be told apart)
    gpu_bytes: int | None  # what NVML lists for it; None when it cannot be measured
    note: str | None  # why it cannot be measured ("cannot measure ..."), for the reasons


@dataclass(frozen=True, slots=True)
class _Runner:
    """One llama-server runner process of the Ollama server on this machine."""

    pid: int
    model: str  # its --model argument
    port: str


def _is_ollama(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]).removesuffix(".exe") == "ollama"


def _flag(argv: list[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in a command line (llama.cpp's and Ollama's flag forms)."""
    for i, arg in enumerate(argv):
        for n in names:
            if arg == n and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(n + "="):
                return arg[len(n) + 1 :]
    return None


def _runners() -> list[_Runner]:
    """The Ollama runners of this machine: ``llama-server --model M --port N`` started by an ``ollama serve``
    (llm/llama_server.go startLlamaServer, Ollama >= 0.30) and ``ollama runner --model M --port N`` (the
    runners before it). A client (``ollama run``, ``ollama ps``), the server itself and a llama-server that
    no Ollama started are not runners."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        if not argv:
            continue
        model, port = _flag(argv, "--model", "-m"), _flag(argv, "--port")
        if model is None or port is None:
            continue
        old_runner = _is_ollama(argv) and argv[1:2] == ["runner"]
        if old_runner or (
            os.path.basename(argv[0]).removesuffix(".exe") == "llama-server" and _started_by_ollama(proc)
        ):
            out.append(_Runner(int(proc.info["pid"]), model, port))
    return out


def _started_by_ollama(proc: object) -> bool:
    import psutil

    try:
        parents = proc.parents()  # type: ignore[attr-defined]
        return any(_is_ollama(p.cmdline()) and "serve" in p.cmdline()[1:2] for p in parents)
    except (psutil.Error, OSError):
        return False


def is_this_machine(url: str) -> bool:
    """Whether the server at ``url`` runs here: a loopback or unspecified address, this machine's name, or
    an address of one of its interfaces."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", socket.gethostname().lower()):
        return True
    try:
        addrs = {ipaddress.ip_address(host)}
    except ValueError:
        try:  # the name the client just reached: resolved already
            addrs = {ipaddress.ip_address(str(a[4][0]).split("%")[0]) for a in socket.getaddrinfo(host, None)}
        except (OSError, ValueError):
            return False
    if all(a.is_loopback or a.is_unspecified for a in addrs):
        return True
    import psutil

    mine = set()
    for nics in psutil.net_if_addrs().values():
        for nic in nics:
            try:
                mine.add(ipaddress.ip_address(nic.address.split("%")[0]))
            except ValueError:
                continue  # a MAC address
    return bool(addrs) and addrs <= mine


def runner_memory(url: str, model_path: str | None) -> RunnerMemory | None:
    """What the runner serving the model holds on the GPUs, through NVML; None without NVML (nothing to say).

    The runner is the one whose ``--model`` is the model's blob (``model_path``, from the store), else the
    only runner here. A remote server, several runners none of which is the model's, or an NVML that lists
    processes of another PID namespace (a container) cannot be measured: the note says so, and the verdict
    rests on what the server reports.
    """
    from kvadvise.planner.hardware import gpu_memory_by_process

    if not is_this_machine(url):
        return RunnerMemory(None, None, f"cannot measure device memory of a remote server ({url})")
    by_pid = gpu_memory_by_process()
    if by_pid is None:
        return None
    runners = _runners()
    blob = os.path.basename(model_path) if model_path else None
    mine = [r for r in runners if blob and os.path.basename(r.model) == blob]
    if not mine and not blob and len(runners) == 1:
        mine = runners
    if len(mine) != 1:
        why = "no Ollama runner process is running here" if not runners else "no runner process is this model's"
        if len(mine) > 1:
            why = f"{len(mine)} runner processes serve this model"
        return RunnerMemory(None, None, f"cannot measure the runner's device memory: {why}")
    runner = mine[0]
    if runner.pid not in by_pid:
        import psutil

        if not all(psutil.pid_exists(pid) for pid in by_pid):  # NVML's PIDs are another namespace's
            return RunnerMemory(
                runner.pid,
                None,
                "cannot measure the runner's device memory: NVML lists the processes of another "
                "PID namespace (a container)",
            )
    return RunnerMemory(runner.pid, by_pid.get(runner.pid, 0), None)
