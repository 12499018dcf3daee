"""Benchmark: what llama-server adds to each generated token over llama_decode alone, side by side in one run.

llama-bench times ``llama_decode`` and nothing else: it never samples. llama-server's own figure
(``timings.predicted_per_token_ms``: ``t_token_generation / n_decoded``, tools/server/server-context.cpp) runs
from the first generated token to the last, so it holds, serially with the decode, what the server does between
two tokens on the CPU: ``common_sampler_sample`` (common/sampling.cpp: ``set_logits`` fills ``n_vocab``
candidates, then the chain: a cost per vocabulary entry) and the slot's loop (``process_token``, the task queue,
building the next batch: a cost per token). Ollama's eval rate times its runner's loop the same way.

This writes two tiny random-weight llama GGUFs that differ only in the vocabulary (tests/tinymodels.py: 32,000 and
262,144 entries), and for each times, alternating, (a) the tests' llama-server (b11312, CPU, one thread, ``-np 1``,
256 tokens, ``ignore_eos``, its defaults) and (b) the same llama.cpp as a library (llama-cpp-python 0.3.36, the same
commit, one thread): ``llama_decode`` of one token at a time over the same 256 positions. The difference is
the server's time per token; its growth with the vocabulary is the per-entry cost, the rest the loop's.
Run: ``python benchmarks/bench_server_loop.py`` (the first run builds llama-server, minutes).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

ROUNDS = 5
N_PREDICT = 256
VOCABS = (32_000, 262_144)


def _server_ms(server: Path, gguf: Path) -> float:
    from bench_sampling import _port, _post, _wait

    port = _port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(server), "-m", str(gguf), "-c", "1024", "-np", "1", "-t", "1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(base, proc)
        body = {"prompt": [5, 6, 7, 8], "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": False, "seed": 1}
        _post(base + "/completion", body)  # warm-up
        timings = _post(base + "/completion", body)["timings"]
        assert isinstance(timings, dict)
        return float(timings["predicted_per_token_ms"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _library_ms(gguf: Path) -> float:
    import llama_cpp as lc

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(gguf).encode(), lc.llama_model_default_params())
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 1024, 1, 1
    ctx = lc.llama_init_from_model(model, cp)
    try:
        prompt = (lc.llama_token * 4)(5, 6, 7, 8)
        lc.llama_decode(ctx, lc.llama_batch_get_one(prompt, 4))
        tok = (lc.llama_token * 1)(9)
        t0 = time.perf_counter()
        for i in range(N_PREDICT):
            tok[0] = 9 + i % 200
            lc.llama_decode(ctx, lc.llama_batch_get_one(tok, 1))
            lc.llama_synchronize(ctx)
        return (time.perf_counter() - t0) / N_PREDICT * 1e3
    finally:
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def main() -> None:
    from llama_server_build import llama_server
    from tinymodels import write_tiny_gguf

    server = llama_server()
    with tempfile.TemporaryDirectory() as tmp:
        ggufs = {n: write_tiny_gguf(Path(tmp) / f"llama-{n}.gguf", "llama", n_vocab=n) for n in VOCABS}
        srv: dict[int, list[float]] = {n: [] for n in VOCABS}
        lib: dict[int, list[float]] = {n: [] for n in VOCABS}
        for _ in range(ROUNDS):
            for n, gguf in ggufs.items():
                srv[n].append(_server_ms(server, gguf))
                lib[n].append(_library_ms(gguf))
    print(f"llama-server {server.parent.name} vs llama_decode (llama-cpp-python), CPU, one thread, tiny llama, "
          f"{N_PREDICT} tokens, {ROUNDS} rounds alternating (medians)")
    print(f"{'vocabulary':>10} {'server ms/tok':>14} {'decode ms/tok':>14} {'server adds':>12}")
    added = {}
    for n in VOCABS:
        s, d = statistics.median(srv[n]), statistics.median(lib[n])
        added[n] = s - d
        print(f"{n:>10,} {s:14.3f} {d:14.3f} {added[n]:+12.3f}")
    lo, hi = VOCABS
    per_entry = (added[hi] - added[lo]) / (hi - lo)
    fixed = added[lo] - per_entry * lo
    print(f"per vocabulary entry: {per_entry * 1e6:.2f} ns; per token beside it: {fixed:.3f} ms")


if __name__ == "__main__":
    main()
