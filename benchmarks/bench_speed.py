"""Benchmark: the decode-speed estimate against published measurements.

For every row of tests/data/speed/measurements.json (model, quant, card,
context, program, tokens/s, source) prints estimate ÷ measured for the formula
before issue 14 (bandwidth ÷ weights and the KV at the context, every expert of
a profile counted, no efficiency) and for kvadvise.planner.speed. Goal: within
±25 % on at least 85 % of the rows. Exits 1 when the goal is missed.

    python benchmarks/bench_speed.py [--fit]

--fit searches the efficiency and per-layer overhead factors again and prints them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kvadvise.backends.ollama.profiles import profiles, with_parts
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import speed

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "speed" / "measurements.json"
GIB = 1 << 30
GOAL_BAND = 0.25
GOAL_SHARE = 0.85


def load() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def row_spec(doc: dict[str, Any], row: dict[str, Any]) -> ModelSpec:
    """The measured GGUF as kvadvise would plan it: the config, its quant, the file size when known."""
    key = row["config"]
    config = doc["configs"][key]["config"] if key in doc["configs"] else profiles()[key].config
    spec = from_config(config, source=key)
    from kvadvise.model.breakdown import params, sized

    bd = params(spec, config)
    assert bd is not None
    quant = row["quant_key"]
    total = int(row["weights_gib"] * GIB) if row.get("weights_gib") else sized(bd, quant).total
    return with_parts(dataclasses.replace(spec, weights_bytes=total), config, quant)


def depth(row: dict[str, Any]) -> int:
    """The mean KV depth over the generated tokens."""
    return int((row.get("context_tokens") or 0) + (row.get("n_gen") or 128) / 2)


def estimate_after(doc: dict[str, Any], row: dict[str, Any]) -> float:
    spec = row_spec(doc, row)
    reads = speed.weight_reads(spec)
    n = row.get("n_gpus") or 1
    bw = int(row["bandwidth_gbs"] * 1e9)
    devices = [speed.Device(row["backend"], bw, 1 / n) for _ in range(n)]
    cpu_layers = 0
    if row.get("partial_offload") and row.get("n_cpu_moe"):
        cpu_layers = int(row["n_cpu_moe"])
    t = speed.seconds_per_token(reads, speed.kv_read_bytes(spec, depth(row)), devices, cpu_expert_layers=cpu_layers)
    return 1 / t


def estimate_before(doc: dict[str, Any], row: dict[str, Any]) -> float:
    """The formula kvadvise had: bandwidth ÷ (weights - token embedding - unused experts + KV); a profile has no
    expert sizes, so every expert counts; the CPU share of an offload at 60 GB/s."""
    spec = row_spec(doc, row)
    per_token = spec.weights_bytes + speed.kv_read_bytes(spec, depth(row))
    bw = row["bandwidth_gbs"] * 1e9
    if row.get("partial_offload") and row.get("n_cpu_moe") and spec.n_expert:
        moved = spec.expert_bytes * int(row["n_cpu_moe"]) // spec.n_layer
        cpu = moved * spec.n_expert_used // spec.n_expert
        return 1 / ((per_token - moved) / bw + cpu / 60e9)
    return bw / per_token


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if not r.get("excluded")]


def table(doc: dict[str, Any]) -> list[tuple[dict[str, Any], float, float]]:
    return [(r, estimate_before(doc, r) / r["decode_tps"], estimate_after(doc, r) / r["decode_tps"]) for r in rows(doc)]


def share_within(ratios: list[float], band: float = GOAL_BAND) -> float:
    return sum(1 for x in ratios if 1 - band <= x <= 1 + band) / len(ratios)


def fit(doc: dict[str, Any]) -> None:
    """Coordinate search of the factors on log(estimate ÷ measured)."""
    import math

    def loss() -> float:
        return sum(math.log(a) ** 2 for _, _, a in table(doc))

    grid_eff = [x / 100 for x in range(6, 101, 2)]
    grid_over = [x * 1e-6 for x in range(0, 121, 5)]
    for _ in range(3):
        for b in ("cuda", "metal", "vulkan"):
            for k in ("dense", "moe"):
                best = min(grid_eff, key=lambda e: (speed.EFFICIENCY[b].__setitem__(k, e), loss())[1])
                speed.EFFICIENCY[b][k] = best
            best_k = min(grid_eff, key=lambda e: (speed.KV_EFFICIENCY.__setitem__(b, e), loss())[1])
            speed.KV_EFFICIENCY[b] = best_k
            best_o = min(grid_over, key=lambda o: (speed.LAYER_OVERHEAD_S.__setitem__(b, o), loss())[1])
            speed.LAYER_OVERHEAD_S[b] = best_o
    print("EFFICIENCY =", speed.EFFICIENCY)
    print("KV_EFFICIENCY =", speed.KV_EFFICIENCY)
    print("LAYER_OVERHEAD_S =", {k: round(v * 1e6, 1) for k, v in speed.LAYER_OVERHEAD_S.items()}, "µs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    doc = load()
    if args.fit:
        fit(doc)
    t = table(doc)
    print(f"{'#':>3} {'model':34} {'quant':7} {'card':22} {'be':6} {'ctx':>6} {'meas':>7} {'before':>7} {'after':>7}")
    for r, b, a in t:
        print(
            f"{r['id']:>3} {r['model'][:34]:34} {r['quant_key']:7} {r['gpu'][:22]:22} {r['backend'][:6]:6} "
            f"{depth(r):>6} {r['decode_tps']:>7.1f} {b:>7.2f} {a:>7.2f}"
        )
    before = share_within([b for _, b, _ in t])
    after = share_within([a for _, _, a in t])
    ordered = sorted(m / 1 for _, _, m in t)
    lo, hi = 1 / ordered[int(0.9 * len(ordered))], 1 / ordered[int(0.1 * len(ordered))]
    print(f"\nrows: {len(t)} (excluded: {len(doc['rows']) - len(t)})")
    print(f"within ±{GOAL_BAND:.0%}: before {before:.0%}, after {after:.0%} (goal {GOAL_SHARE:.0%})")
    print(f"measured ÷ estimate, 10th to 90th percentile: {lo:.2f} to {hi:.2f}")
    return 0 if after >= GOAL_SHARE else 1


if __name__ == "__main__":
    sys.exit(main())
