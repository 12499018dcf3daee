"""Every field of kvadvise.planner.memory.estimate() over a grid, one JSON line per configuration, so that a
refactor of the memory model can be shown to leave the figures identical (run it before and after, diff).

Grid: the real-size shapes of tests/oracle.py REAL_SIZES (every recipe of tests/tinymodels.py, header only)
x flash attention on/off/auto x llama.cpp builds on both sides of each rule of kvadvise.planner.builds (and an
unknown build) x CPU, CUDA and RPC on 1, 2 and 3 devices (-ts), Metal on one x 4k and 32k cells x one and two
slots; on a GPU also a quantized cache; for MoE models op offload's copy, --n-cpu-moe (offload.cpu_moe_placement)
and, on RPC, the experts in host splits; a draft model and MTP where the model has NextN blocks.

    python benchmarks/dump_estimates.py OUT.jsonl [--only RECIPE,...]
    diff <(python benchmarks/dump_estimates.py /dev/stdout) before.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from oracle import REAL_SIZES, REAL_VOCAB  # noqa: E402
from tinymodels import RECIPES, write_tiny_gguf  # noqa: E402

from kvadvise.errors import ConfigError  # noqa: E402
from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.ggml import GGMLType  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.model.spec import ModelSpec  # noqa: E402
from kvadvise.planner import builds  # noqa: E402
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate  # noqa: E402
from kvadvise.planner.offload import cpu_moe_placement, with_cpu_moe  # noqa: E402

# each rule's build and the one before it (builds.py), the reference, and an unknown build (None)
BUILDS: tuple[int | None, ...] = (
    5000,
    builds.FUSED_GLU,
    builds.SET_ROWS - 1,
    builds.SET_ROWS,
    builds.GRAPH_OPTIMIZE,
    builds.MLA_V_LESS - 1,
    builds.F16_MASK_FA - 1,
    builds.SERVER_OUTPUT_LIMITS,
    builds.REFERENCE,
    None,
)
PLACES: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("cpu", ()),
    ("cuda", ()),
    ("cuda", (1.0, 1.0)),
    ("cuda", (3.0, 1.0, 2.0)),
    ("rpc", ()),
    ("rpc", (1.0, 1.0)),
    ("rpc", (1.0, 2.0, 1.0)),
    ("metal", ()),
)


def _plain(x: Any) -> Any:
    """A JSON-able copy of an estimate (dataclasses as dicts, enums by name)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    return x


def _configs(spec: ModelSpec) -> Iterator[tuple[str, RunConfig, bool]]:
    """(label, config, n_cpu_moe) of the grid for one model."""
    moe = bool(spec.n_expert)
    for fa in ("on", "off", "auto"):
        for build in BUILDS:
            for device, ts in PLACES:
                for n_ctx, n_par in ((4096, 1), (32768, 2)):
                    cfg = RunConfig(
                        n_ctx=n_ctx, n_parallel=n_par, flash_attn=fa, device=device, tensor_split=ts,
                        llama_build=build, cpu_repack="none",
                    )  # fmt: skip
                    label = f"fa={fa} b={build} {device} ts={ts} c={n_ctx} np={n_par}"
                    yield label, cfg, False
                    if device == "cpu" or n_par != 1:
                        continue
                    if fa != "off":
                        q8 = replace(cfg, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0)
                        yield label + " q8_0", q8, False
                    if moe:
                        yield label + " op-offload", replace(cfg, op_offload_copy_bytes=300 << 20), False
                        yield label + " n-cpu-moe", cfg, True
                        if device == "rpc":
                            yield label + " host-experts", replace(cfg, host_experts=True), False


def _estimate(spec: ModelSpec, cfg: RunConfig, cpu_moe: bool) -> MemoryEstimate:
    if not cpu_moe:
        return estimate(spec, cfg)
    place = cpu_moe_placement(spec, 4, cfg.device, cfg.n_ubatch)
    copy = place.op_offload_bytes or 0
    cfg = replace(cfg, op_offload_copy_bytes=copy, host_experts=cfg.device == "rpc")
    return with_cpu_moe(estimate(place.gpu_spec, cfg), place)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="", help="comma-separated recipes (default: every one)")
    args = ap.parse_args()
    recipes = [r for r in RECIPES if not args.only or r in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp, args.out.open("w") as out:
        specs: dict[str, ModelSpec] = {}
        for recipe in recipes:
            path = Path(tmp) / f"{recipe}.gguf"
            vocab = REAL_VOCAB.get(recipe, 32000)
            write_tiny_gguf(path, recipe, n_vocab=vocab, n_ctx_train=131072, dims=REAL_SIZES[recipe], sparse=True)
            specs[recipe] = from_gguf(read_file(path))
        draft = specs.get("qwen3")
        for recipe, spec in specs.items():
            rows = list(_configs(spec))
            if draft is not None and recipe == "llama":  # a draft model split as the main one
                rows += [(lbl + " draft", replace(c, draft=draft), m) for lbl, c, m in rows[:48]]
            if spec.n_layer_nextn:  # MTP: the model's NextN blocks draft
                rows += [(lbl + " mtp", replace(c, mtp=True), m) for lbl, c, m in rows[:48]]
            for label, cfg, cpu_moe in rows:
                try:
                    got: Any = _plain(_estimate(spec, cfg, cpu_moe))
                except ConfigError as e:
                    got = f"ConfigError: {e}"
                out.write(json.dumps({"model": recipe, "config": label, "estimate": got}, sort_keys=True) + "\n")
            print(f"{recipe}: {len(rows)} configurations", file=sys.stderr)


if __name__ == "__main__":
    main()
