"""Measuring a config on real llama.cpp (the llama.cpp backend's runners).

Two runners, in this order:
1. the user's own ``llama-server`` (on PATH or --llama-server): the build
   they will serve with, often a CUDA one. Started on a free loopback port,
   its log parsed for every buffer, /health polled, a benchmark run through
   /completion (its ``timings``), then stopped.
2. llama-cpp-python (kvadvise[verify]) in a child process
   (kvadvise.backends.llamacpp.probe), measured through llama.cpp's log and timers.
Either way the child runs in its own process group and is killed on every
exit path (kvadvise.backends.llamacpp.childproc).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvadvise.backends.llamacpp import childproc
from kvadvise.backends.llamacpp.probe import _gpu_used
from kvadvise.deadline import Deadline, within
from kvadvise.errors import ConfigError, DoesNotFit, InputError
from kvadvise.files import load_json
from kvadvise.planner.memory import RunConfig
from kvadvise.runtime.llamalog import parse
from kvadvise.runtime.llamaserver import ModelSource, no_repack, server_args
from kvadvise.runtime.verification import Measurement, build_from_log, measurement_from_log

BENCH_PROMPT_TOKENS = 256
BENCH_GEN_TOKENS = 64
Progress = Callable[[str], None]


def probe_request(model_path: str, cfg: RunConfig, *, bench: bool = True, extra_bufts: bool = True) -> dict[str, Any]:
    """The kvadvise.backends.llamacpp.probe request for ``cfg``: a benchmark and NVML readings unless ``bench`` is off."""
    req: dict[str, Any] = {
        "model": model_path,
        "n_ctx": cfg.n_ctx,
        "n_batch": cfg.n_batch,
        "n_ubatch": cfg.n_ubatch,
        "n_seq_max": cfg.n_parallel,
        "kv_unified": cfg.kv_unified,
        "flash_attn": cfg.flash_attn,
        "type_k": int(cfg.type_k),
        "type_v": int(cfg.type_v),
        "swa_full": cfg.swa_full,
        "n_outputs_max": cfg.llama_n_outputs_max,
        "n_gpu_layers": 999 if cfg.device not in ("cpu", "auto") else 0,
        "extra_bufts": extra_bufts,
    }
    if bench:
        req |= {"bench": {"n_prompt": BENCH_PROMPT_TOKENS, "n_gen": BENCH_GEN_TOKENS}, "nvml": True}
    else:
        req["n_eval"] = 4  # decode a few tokens: the config must really run, not only allocate
    return req


def _probe(model_path: str, cfg: RunConfig, *, extra_bufts: bool, timeout_s: float) -> tuple[int, str, str]:
    # -P (3.11+): the current directory is not put on sys.path, so no folder of the user's shadows kvadvise
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    request = json.dumps(probe_request(model_path, cfg, extra_bufts=extra_bufts))
    cmd = [sys.executable, *safe_path, "-m", "kvadvise.backends.llamacpp.probe", request]
    return childproc.run(cmd, timeout_s=timeout_s, what="llama.cpp (llama-cpp-python)")


def measure_with_python(model_path: str, cfg: RunConfig, *, timeout_s: float, progress: Progress) -> Measurement:
    progress("loading the model with llama-cpp-python in a child process ...")
    extra_bufts = cfg.cpu_repack != "off"
    deadline = Deadline(timeout_s)  # --timeout: one total for the run and its rerun
    rc, out, err = _probe(model_path, cfg, extra_bufts=extra_bufts, timeout_s=timeout_s)
    if extra_bufts and rc < 0 and not any(ln.startswith("{") for ln in out.splitlines()):
        # killed by a signal with the CPU's extra buffer types: on a CPU with AMX the first of them is AMX's
        # (ggml-cpu.cpp ggml_backend_cpu_get_extra_buffer_types), and ggml_backend_amx_mul_mat faults on some
        # Sapphire Rapids machines (ggml-org/llama.cpp#20824, open; seen on this project's CI machine)
        progress(
            f"llama.cpp crashed (signal {-rc}) with the CPU's extra buffer types (AMX, CPU_REPACK: an AMX CPU meets "
            "ggml-org/llama.cpp#20824); measuring again without them, as llama-server --no-repack runs ..."
        )
        extra_bufts = False
        if deadline.remaining() <= 0:
            raise DoesNotFit(f"llama.cpp did not load the model within {timeout_s:g} s")
        rc, out, err = _probe(model_path, cfg, extra_bufts=False, timeout_s=deadline.remaining())
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise DoesNotFit(f"llama.cpp crashed (exit code {rc}) before reporting: {tail or 'no output'}")
    res = load_json(lines[-1])
    if not res.get("ok"):
        why = _failure_reason(err) or res.get("error", "unknown failure")
        raise DoesNotFit(
            f"llama.cpp failed at {res.get('stage', '?')}: {why}", hint="try a smaller context or a quantized cache"
        )
    if res.get("bench_error"):
        raise DoesNotFit(f"llama.cpp loaded the model but the benchmark failed: {res['bench_error']}")
    progress("measured; comparing with the prediction")
    used = None
    if res.get("gpu_used_before") is not None and res.get("gpu_used_after_load") is not None:
        used = int(res["gpu_used_after_load"]) - int(res["gpu_used_before"])
    measured = measurement_from_log(
        parse(err.splitlines()),
        runner="llama-cpp-python",
        build=f"llama-cpp-python {res.get('llama_cpp_python', '?')}",
        n_ctx=res.get("n_ctx"),
        device_used_bytes=used,
        prompt_tokens_per_s=res.get("prompt_tokens_per_s"),
        decode_tokens_per_s=res.get("decode_tokens_per_s"),
        prompt_tokens=res.get("prompt_tokens"),
    )
    return measured if extra_bufts else replace(measured, extra_bufts=False)


def _failure_reason(log: str) -> str | None:
    for line in reversed(log.splitlines()):
        low = line.lower()
        if "failed to" in low or "error" in low or "insufficient memory" in low or "out of memory" in low:
            return line.strip()
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


MAX_ANSWER_BYTES = 16 << 20  # /health and /completion answers are a few KB


def _http(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """One request to the llama-server kvadvise started, within ``timeout_s`` in all (a total
    deadline, not per read); DoesNotFit past it."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})

    def call() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw = r.read(MAX_ANSWER_BYTES + 1)
                if len(raw) > MAX_ANSWER_BYTES:
                    raise ValueError(f"an answer over {MAX_ANSWER_BYTES >> 20} MiB")
                doc = load_json(raw or b"{}")
                return r.status, doc if isinstance(doc, dict) else {}
        except urllib.error.HTTPError as e:
            return e.code, {}

    def too_slow() -> DoesNotFit:
        return DoesNotFit(f"llama-server did not answer {urllib.parse.urlsplit(url).path} within {timeout_s:g} s")

    return within(timeout_s, call, too_slow)


# For a measurement: --fit off measures the config as given (fit only touches what -c / -ngl leave
# unset, but its dry run prints a second set of buffer lines); -lv 4 because recent builds print the
# buffer sizes only at info verbosity (common/arg.cpp, llama.cpp 0c1e570). An older build that does
# not know them refuses to start ("error: invalid argument: --fit"): then it runs without them.
MEASURE_FLAGS = ("--fit", "off", "-lv", "4")


class _UnknownFlags(Exception):
    pass


class _KilledWithAmx(Exception):
    """llama-server died of a signal after loading weights into ggml-cpu's AMX buffer type."""


def measure_with_server(
    binary: str, model_path: str, cfg: RunConfig, *, timeout_s: float, progress: Progress
) -> Measurement:
    flags: tuple[str, ...] = MEASURE_FLAGS
    deadline = Deadline(timeout_s)  # --timeout: one total for the run and its retries (docs: "a total deadline")
    for _ in range(3):  # at most once without --fit / -lv and once with --no-repack
        left = deadline.remaining()
        if left <= 0:
            raise DoesNotFit(f"llama-server did not become ready within {timeout_s:g} s; it was stopped")
        try:
            measured = _measure_with_server(
                binary, model_path, cfg, flags, timeout_s=left, progress=progress, total_s=timeout_s
            )
            return replace(measured, extra_bufts=not no_repack(cfg))
        except _UnknownFlags:
            progress("this llama-server does not know --fit / -lv: running it without them")
            flags = ()
        except _KilledWithAmx:
            # ggml_backend_amx_mul_mat faults on some Sapphire Rapids machines (ggml-org/llama.cpp#20824, open):
            # --no-repack leaves the CPU's extra buffer types, AMX's first, out (common/arg.cpp, no_extra_bufts)
            progress(
                "llama-server crashed with its CPU weights in the AMX buffer (ggml-org/llama.cpp#20824); measuring "
                "again with --no-repack ..."
            )
            cfg = replace(cfg, cpu_repack="off")
    raise DoesNotFit("llama-server could not be run")


def _measure_with_server(
    binary: str,
    model_path: str,
    cfg: RunConfig,
    flags: tuple[str, ...],
    *,
    timeout_s: float,
    progress: Progress,
    total_s: float | None = None,
) -> Measurement:
    """One run within ``timeout_s`` (what is left of --timeout ``total_s``, which the messages name)."""
    port = _free_port()
    args: list[str] = [binary]
    for flag, _, value in server_args(model_path, cfg):
        args += [flag] + ([value] if value is not None else [])
    args += ["--host", "127.0.0.1", "--port", str(port), *flags]
    progress(f"starting {binary} on 127.0.0.1:{port} ...")
    used_before = _gpu_used()
    used_after: int | None = None
    log = childproc.BoundedLog(childproc.LLAMA_LOG_NEEDED)  # never the whole output: a chatty child is endless
    deadline = time.monotonic() + timeout_s
    with childproc.child(args, stderr=subprocess.STDOUT) as p:
        assert p.stdout is not None
        reader = threading.Thread(target=log.read_from, args=(p.stdout,), daemon=True)
        reader.start()
        base = f"http://127.0.0.1:{port}"
        while True:
            if p.poll() is not None:
                reader.join(timeout=5)
                if flags and re.search(r"invalid argument: (--fit|-lv)\b", log.text()):
                    raise _UnknownFlags
                # a CPU plan's weights (a GPU's CPU layers go to its pinned host buffer, never to AMX's)
                if p.returncode < 0 and cfg.device == "cpu" and not no_repack(cfg) and "AMX model buffer" in log.text():
                    raise _KilledWithAmx
                why = _failure_reason(log.text()) or f"exit code {p.returncode}"
                raise DoesNotFit(
                    f"llama-server stopped while loading: {why}", hint="try a smaller context or a quantized cache"
                )
            if time.monotonic() > deadline:
                raise DoesNotFit(f"llama-server did not become ready within {total_s or timeout_s:g} s; it was stopped")
            try:
                status, _ = _http(f"{base}/health", None, min(2.0, max(0.1, deadline - time.monotonic())))
                if status == 200:
                    break
            except (OSError, ValueError, DoesNotFit):
                pass
            time.sleep(0.2)
        used_after = _gpu_used()
        progress("model loaded; running the benchmark ...")
        prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * (BENCH_PROMPT_TOKENS // 10))
        try:
            status, res = _http(
                f"{base}/completion",
                {"prompt": prompt, "n_predict": BENCH_GEN_TOKENS, "cache_prompt": False, "temperature": 0},
                max(0.1, deadline - time.monotonic()),  # --timeout covers the whole run
            )
        except (OSError, ValueError) as e:
            raise DoesNotFit(f"llama-server did not answer the benchmark: {e}") from None
        if status != 200:
            raise DoesNotFit(f"llama-server answered the benchmark with HTTP {status}")
        timings = res.get("timings") or {}
        childproc.kill_group(p)
        reader.join(timeout=5)
    text = log.text()
    return measurement_from_log(
        parse(text.splitlines()),
        runner="llama-server",
        build=build_from_log(text, "llama-server (build unknown)"),
        n_ctx=_n_ctx(text),
        device_used_bytes=used_after - used_before if used_after is not None and used_before is not None else None,
        prompt_tokens_per_s=timings.get("prompt_per_second"),
        decode_tokens_per_s=timings.get("predicted_per_second"),
        prompt_tokens=timings.get("prompt_n"),
    )


def _n_ctx(text: str) -> int | None:
    m = re.search(r"llama_context:\s+n_ctx\s+=\s+(\d+)", text)
    return int(m[1]) if m else None


def model_source(ref: str) -> ModelSource:
    """How llama-server is pointed at ``ref``: a local file, or a URL / Hub name it downloads itself."""
    if ref.startswith(("http://", "https://")):
        return ModelSource.url(ref)
    if not Path(ref).exists():
        from kvadvise.backends.remote.hub import DEFAULT_REVISION, file_url, parse_ref

        hub = parse_ref(ref)
        if hub is not None:
            if hub.revision == DEFAULT_REVISION:
                return ModelSource.hub(hub.repo_id, quant=hub.quant, filename=hub.filename)
            if hub.filename is None:  # -hf has no revision: name the file, and its URL pins the revision
                raise InputError(
                    f"{ref}: llama-server's -hf cannot take a revision ({hub.revision})",
                    hint=f"name the file: hf://{hub.repo_id}@{hub.revision}/FILE.gguf",
                )
            return ModelSource.url(file_url(hub.repo_id, hub.filename, hub.revision))
    return ModelSource.path(ref)


def measure(
    model_path: str,
    cfg: RunConfig,
    *,
    server: str | None = None,
    timeout_s: float = 600,
    progress: Progress = lambda _: None,
) -> Measurement:
    if not Path(model_path).is_file():
        raise InputError(
            f"{model_path}: verify runs llama.cpp on a local GGUF file",
            hint="download it first (llama-server -hf USER/REPO:QUANT or -mu URL does), then verify the file",
        )
    binary = server or shutil.which("llama-server")
    if server and not Path(server).exists():
        raise InputError(f"{server}: no such llama-server binary")
    if binary:
        if cfg.runtime == "library" and cfg.n_outputs_max is None:
            # verify predicts the program it launches (one logits row per slot here)
            raise ConfigError(
                f"verify launches llama-server ({binary}), not {cfg.runtime}",
                hint="use --runtime llama-server; to measure the library, run without a llama-server on PATH "
                "(llama-cpp-python then runs it)",
            )
        return measure_with_server(binary, model_path, cfg, timeout_s=timeout_s, progress=progress)
    if importlib.util.find_spec("llama_cpp") is None:
        raise InputError(
            "nothing to run llama.cpp with: no llama-server on PATH and llama-cpp-python is not installed",
            hint="python3 -m pip install llama-cpp-python==0.3.36 (or, in the kvadvise checkout: pip install '.[verify]'), or pass --llama-server PATH",
        )
    return measure_with_python(model_path, cfg, timeout_s=timeout_s, progress=progress)
