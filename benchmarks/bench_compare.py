"""Benchmark: ``kvadvise compare`` over every built-in profile on every card of the catalogue,
today's code against a baseline commit's, side by side in one run (issue 30.3).

The baseline is checked out of git (``git archive BASELINE advisor backends profiles``) into a
temporary folder laid out as the installed package (advisor/ is ``kvadvise``, backends/ is
``kvadvise.backends``, profiles/ is ``kvadvise.profiles``) and imported from there through
PYTHONPATH, ahead of this checkout's install. Each run is a fresh process that plans every
(model, card) pair as ``compare`` does (``kvadvise.cli.compare.plan_pair``, the recommendation of
every other command); the two trees run in turn (A B A B ...) and the ratio is the median of the
pairwise ratios, so drift of a shared machine hits both alike. Both trees' results are compared
too: any difference is printed and the benchmark exits 1 (the optimisation may change no result).

``--record FILE`` writes the baseline's results for :data:`SAMPLE` (a record to compare by hand) instead of
timing.

    python benchmarks/bench_compare.py [--runs 3] [--baseline COMMIT] [--cards N]
    python benchmarks/bench_compare.py --record build/compare_baseline.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The last commit before compare was made faster (issue 30.3): planner split, merged as 21f7cd3.
BASELINE = "21f7cd3"
# The sample the suite checks (tests/test_compare.py): every profile, on these cards with these settings.
_DEFAULT: dict[str, Any] = {"target": 0, "use": None, "n_parallel": 1, "repeatable": False}
SAMPLE: tuple[tuple[dict[str, Any], tuple[str, ...]], ...] = (
    (_DEFAULT, ("t4", "rtx-3060", "rtx-4090", "rtx-5090", "rtx-3090x2", "a100-80gb", "m4-max-64gb", "rx-7900-xtx")),
    ({**_DEFAULT, "use": "long"}, ("rtx-4090", "m4-max-64gb")),
    ({**_DEFAULT, "target": 8192, "n_parallel": 4}, ("rtx-3060", "rtx-3090x2")),
    ({**_DEFAULT, "repeatable": True}, ("t4", "a100-80gb")),
)
GIB = 1 << 30

# Run in the child: plan every pair with the kvadvise it imports; print seconds and (optionally) results.
WORKER = r"""
import hashlib, json, os, sys, time
from kvadvise.cli.compare import card, plan_pair, resolve_models
from kvadvise.planner.gpus import load_profiles
args = json.loads(sys.argv[1])
specs = resolve_models(())
all_cards = [p.id for p in load_profiles()][: args["n_cards"] or None]
jobs = [(i, s, [card(n) for n in (names or all_cards)]) for i, (s, names) in enumerate(args["sample"])]
out = []
t = time.perf_counter()
for i, s, cards in jobs:
    for c in cards:
        for name, spec in specs:
            p = plan_pair(spec, c.hardware, target=s["target"], use=s["use"], n_parallel=s["n_parallel"],
                         margin=1 << 30, repeatable=s["repeatable"])
            out.append((name, c.label, i, p))
seconds = time.perf_counter() - t
def doc(name, label, s, p):
    r = p.recommendation
    return {
        "model": name, "card": label, "settings": s, "fits": p.fits, "n_ctx": p.config.n_ctx,
        "type_k": p.config.type_k.type_name, "type_v": p.config.type_v.type_name, "flash_attn": p.config.flash_attn,
        "device_bytes": p.estimate.device_bytes, "total_bytes": p.estimate.total_bytes,
        "host_bytes": p.estimate.host_bytes, "kv_bytes": p.estimate.kv_bytes,
        "kv_bytes_per_token": p.estimate.kv_bytes_per_token, "budget_bytes": p.budget.budget_bytes,
        "target_ctx": r.target_ctx,
        "reasons_sha256": hashlib.sha256("\n".join(r.reasons).encode()).hexdigest()[:16],
        "options": [[o.type_k.type_name, o.type_v.type_name, o.flash_attn, o.n_ctx_max, o.device_bytes_at_max,
                     o.reaches_target, o.allowed] for o in r.options],
        "decode": [list(x) for x in r.speed.points] if r.speed is not None else None,
    }
results = [doc(*x) for x in out] if args["results"] else []
print(json.dumps({"seconds": seconds, "plans": len(out), "results": results}))
"""


def baseline_tree(commit: str, dest: Path) -> Path:
    """The baseline's advisor/, backends/ and profiles/ as an importable ``kvadvise`` package under ``dest``."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "advisor", "backends", "profiles"],
        check=True,
        capture_output=True,
    ).stdout
    src = dest / "src"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(src, filter="data")
    pkg = dest / "kvadvise"
    (src / "advisor").rename(pkg)
    (src / "backends").rename(pkg / "backends")
    (src / "profiles").rename(pkg / "profiles")
    return dest


def run(pythonpath: str | None, job: dict[str, Any]) -> dict[str, Any]:
    env = {
        **os.environ,
        "OLLAMA_HOST": "127.0.0.1:9",
        "OLLAMA_MODELS": "/nonexistent-kvadvise-store",
        "KVADVISE_OLLAMA_REGISTRY": "off",
    }
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(job)], env=env, capture_output=True, text=True, check=False
    )
    if p.returncode:
        raise SystemExit(f"worker failed ({'baseline' if pythonpath else 'this tree'}):\n{p.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    ap.add_argument("--cards", type=int, default=0, help="only the first N cards (0: all)")
    ap.add_argument("--record", metavar="FILE", help="write the baseline's results on the suite's sample")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = str(baseline_tree(args.baseline, Path(tmp)))
        if args.record:
            job = {"sample": [list(x) for x in SAMPLE], "n_cards": 0, "results": True}
            doc = run(base, job)
            out = {
                "_source": f"benchmarks/bench_compare.py --record, the code of commit {args.baseline}",
                "sample": [list(x) for x in SAMPLE],
                "results": doc["results"],
            }
            lines = ",\n".join(json.dumps(r, sort_keys=True) for r in out.pop("results"))
            head = json.dumps(out, sort_keys=True)[:-1]
            Path(args.record).write_text(f'{head}, "results": [\n{lines}\n]}}\n', encoding="utf-8")
            print(f"{len(doc['results'])} plans of {args.baseline} written to {args.record}")
            return 0
        job = {"sample": [[_DEFAULT, []]], "n_cards": args.cards, "results": False}
        check = {**job, "results": True}
        same = run(base, check)["results"] == run(None, check)["results"]
        times: list[tuple[float, float]] = []
        plans = 0
        for _ in range(args.runs):
            a = run(base, job)
            b = run(None, job)
            plans = b["plans"]
            times.append((a["seconds"], b["seconds"]))
    ratio = statistics.median(a / b for a, b in times)
    ta = statistics.median(a for a, _ in times)
    tb = statistics.median(b for _, b in times)
    print(f"compare, every profile on every card: {plans:,} plans")
    print(f"  baseline {args.baseline}: {ta:.2f} s ({ta / plans * 1e3:.2f} ms a plan)")
    print(f"  this tree:        {tb:.2f} s ({tb / plans * 1e3:.2f} ms a plan)")
    print(f"  baseline / this tree = {ratio:.2f}x (median of {len(times)} pairs; goal >= 2)")
    print(f"  results identical: {'yes' if same else 'NO'}")
    return 0 if same and ratio >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
