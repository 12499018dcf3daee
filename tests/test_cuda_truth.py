"""kvadvise's prediction against every CUDA run committed under tests/data/measured/cuda/ (issue 24 part 3).

The rows are what benchmarks/gpu_truth.sh measured on a GPU machine; tests/cuda_truth.py holds the bars.
The same check runs on the CPU dry run's rows in tests/test_gpu_truth.py, so it works before any row exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cuda_truth import check_run

DATA = Path(__file__).resolve().parent / "data" / "measured" / "cuda"


def _runs() -> list[Any]:
    rows = []
    for f in sorted(DATA.rglob("*.jsonl")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            row = json.loads(line)
            if row.get("kind") == "run":
                rows.append(pytest.param(row, id=f"{f.parent.name}:{n}:{row['id']}"))
    if not rows:
        rows.append(pytest.param(None, marks=pytest.mark.skip(reason="no CUDA rows committed yet (issue 24 part 3)")))
    return rows


@pytest.mark.parametrize("row", _runs())
def test_cuda_run_is_predicted(row: dict[str, Any]) -> None:
    assert check_run(row) == []
