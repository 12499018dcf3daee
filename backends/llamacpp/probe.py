"""Child process: load a GGUF with real llama.cpp (llama-cpp-python) and report.

Run as ``python -m kvadvise.backends.llamacpp.probe '<json request>'``. It loads the
model and creates a context with exactly the requested parameters through
llama.cpp's C API (``llama_model_load_from_file`` / ``llama_init_from_model``),
optionally decodes a few tokens, then prints one JSON object on stdout.
llama.cpp's own log goes to stderr, where the parent parses the buffer sizes
(kvadvise.runtime.llamalog). It runs in a child so that a crash or an out-of-memory in
llama.cpp cannot take the parent down.

Request keys: model (path), n_ctx, n_batch, n_ubatch, n_seq_max, kv_unified,
flash_attn ("on"|"off"|"auto"), type_k, type_v (ggml type ids), swa_full, n_outputs_max (logits rows the graph is reserved for; 0 = n_batch),
n_gpu_layers, extra_bufts (CPU repacking), n_eval (tokens to decode; 0 = load only),
bench ({"n_prompt": N, "n_gen": M}: time a prompt of N tokens, then M single-token
decode steps), nvml (read GPU memory used before load, after load, after bench).
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

FA = {"auto": -1, "off": 0, "on": 1}


_LOG_CB: Any = None  # the C side keeps a pointer to it: it must live as long as the process


def _log_to_stderr() -> None:
    global _LOG_CB
    if _LOG_CB is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        sys.stderr.write(text.decode("utf-8", errors="replace"))
        sys.stderr.flush()

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    _LOG_CB = cb


def _gpu_used() -> int | None:
    """Memory used on GPU 0 (NVML), or None without an NVIDIA GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver, no GPU: the measurement is simply absent
        return None


def _bench(L: Any, ctx: Any, n_vocab: int, n_prompt: int, n_gen: int, n_batch: int) -> dict[str, Any]:
    """Prompt processing in batches of n_batch, then n_gen single-token steps (greedy-free: fixed ids)."""
    ids = [(i * 7919) % max(1, n_vocab - 10) + 5 for i in range(n_prompt + n_gen)]
    t0 = time.perf_counter()
    done = 0
    while done < n_prompt:
        n = min(n_batch, n_prompt - done)
        arr = (L.llama_token * n)(*ids[done : done + n])
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, n)) != 0:
            return {"bench_error": f"llama_decode failed on the prompt at token {done}"}
        done += n
    t1 = time.perf_counter()
    for i in range(n_gen):
        arr = (L.llama_token * 1)(ids[n_prompt + i])
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, 1)) != 0:
            return {"bench_error": f"llama_decode failed at generated token {i}"}
    t2 = time.perf_counter()
    return {
        "prompt_tokens": n_prompt,
        "gen_tokens": n_gen,
        "prompt_tokens_per_s": n_prompt / (t1 - t0) if t1 > t0 else None,
        "decode_tokens_per_s": n_gen / (t2 - t1) if t2 > t1 and n_gen else None,
    }


def probe(req: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp as L

    _log_to_stderr()
    nvml = bool(req.get("nvml", False))
    used_before = _gpu_used() if nvml else None
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = int(req.get("n_gpu_layers", -1))
    mp.use_extra_bufts = bool(req.get("extra_bufts", True))  # CPU_REPACK copies of some quantized matrices
    model = L.llama_model_load_from_file(str(req["model"]).encode(), mp)
    if not model:
        return {"ok": False, "stage": "load_model", "error": "llama.cpp could not load the model"}
    cp = L.llama_context_default_params()
    cp.n_ctx = int(req.get("n_ctx", 0))
    cp.n_batch = int(req.get("n_batch", 2048))
    cp.n_ubatch = int(req.get("n_ubatch", 512))
    cp.n_seq_max = int(req.get("n_seq_max", 1))
    cp.kv_unified = bool(req.get("kv_unified", False))
    cp.flash_attn_type = FA[req.get("flash_attn", "auto")]
    cp.type_k = int(req.get("type_k", 1))
    cp.type_v = int(req.get("type_v", 1))
    cp.swa_full = bool(req.get("swa_full", False))
    cp.n_outputs_max = int(req.get("n_outputs_max", 0))  # llama-server sets n_parallel; 0 = n_batch
    cp.n_threads = cp.n_threads_batch = int(req.get("n_threads", 2))
    t0 = time.perf_counter()
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        L.llama_model_free(model)
        return {"ok": False, "stage": "init_context", "error": "llama.cpp could not create the context"}
    out: dict[str, Any] = {
        "ok": True,
        "n_ctx": L.llama_n_ctx(ctx),
        "n_batch": L.llama_n_batch(ctx),
        "n_ubatch": L.llama_n_ubatch(ctx),
        "n_seq_max": L.llama_n_seq_max(ctx),
        "n_vocab": L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)),
        "init_s": time.perf_counter() - t0,
        "llama_cpp_python": getattr(L, "__version__", "unknown"),
        "system_info": L.llama_print_system_info().decode(errors="replace").strip(),
        "gpu_used_before": used_before,
        "gpu_used_after_load": _gpu_used() if nvml else None,
    }
    n_eval = int(req.get("n_eval", 0))
    if n_eval:
        tokens = (L.llama_token * n_eval)(*[(i % 50) + 5 for i in range(n_eval)])
        t1 = time.perf_counter()
        rc = L.llama_decode(ctx, L.llama_batch_get_one(tokens, n_eval))
        out["decode_rc"] = rc
        out["decode_s"] = time.perf_counter() - t1
        logits = L.llama_get_logits_ith(ctx, -1)
        out["logit0"] = float(logits[0]) if logits else None
    bench = req.get("bench")
    if bench:
        n_prompt = min(int(bench.get("n_prompt", 256)), max(1, out["n_ctx"] - int(bench.get("n_gen", 64)) - 1))
        out.update(_bench(L, ctx, out["n_vocab"], n_prompt, int(bench.get("n_gen", 64)), out["n_batch"]))
        out["gpu_used_after_bench"] = _gpu_used() if nvml else None
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


MARK = "=== kvadvise-probe request {} ==="


def main() -> int:
    """One request (a JSON object) or several (a JSON list, one model load each).

    With a list, each result is one line on stdout and each request's log is
    preceded on stderr by a MARK line, so the parent can split the logs.
    """
    req = json.loads(sys.argv[1])
    reqs = req if isinstance(req, list) else [req]
    rc = 0
    for i, r in enumerate(reqs):
        sys.stderr.write(MARK.format(i) + "\n")
        sys.stderr.flush()
        try:
            out = probe(r)
        except Exception as e:  # llama-cpp-python raises on some failures; report, don't crash
            out = {"ok": False, "stage": "exception", "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
        rc = rc or (0 if out.get("ok") else 3)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
