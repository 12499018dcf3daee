"""Child process: load a GGUF with real llama.cpp (llama-cpp-python) and report.

Run as ``python -m backends.llamacpp_probe '<json request>'``. It loads the
model and creates a context with exactly the requested parameters through
llama.cpp's C API (``llama_model_load_from_file`` / ``llama_init_from_model``),
optionally decodes a few tokens, then prints one JSON object on stdout.
llama.cpp's own log goes to stderr, where the parent parses the buffer sizes
(advisor.llamalog). It runs in a child so that a crash or an out-of-memory in
llama.cpp cannot take the parent down.

Request keys: model (path), n_ctx, n_batch, n_ubatch, n_seq_max, kv_unified,
flash_attn ("on"|"off"|"auto"), type_k, type_v (ggml type ids), swa_full,
n_gpu_layers, extra_bufts (CPU repacking), n_eval (tokens to decode; 0 = load only).
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


def probe(req: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp as L

    _log_to_stderr()
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
