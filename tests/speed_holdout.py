"""The held-out speed files' harness (tests/test_attack_round19c.py, 20c, 22c, tests/test_speed_holdout_round26.py):
bench_speed loaded under a name of its own, and measurements.json with held-out files' configs, cards and rows
merged in (the rows keep their ids)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEED = ROOT / "tests" / "data" / "speed"


def holdout(n: int) -> Path:
    """tests/data/speed/holdout_roundN.json."""
    return SPEED / f"holdout_round{n}.json"


def load_bench(name: str) -> Any:
    """benchmarks/bench_speed.py as a module of its own name: it caches cards and specs at module level, so each
    held-out file (and tests/test_speed.py, as "bench_speed") keeps its own copy, which sees its merged doc."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "bench_speed.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def read(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def merged(bench: Any, paths: list[Path]) -> dict[str, Any]:
    """measurements.json with each of ``paths``' configs, cards and rows merged in, in order (ids kept)."""
    d: dict[str, Any] = bench.load()
    for path in paths:
        extra = read(path)
        d["configs"].update(extra.get("configs", {}))
        d["cards"].update(extra.get("cards", {}))
        d["rows"] = d["rows"] + extra["rows"]
    return d
