"""benchmarks/bench_fit.py (issue 37.5), one case end to end: the real Gemma 3 270M on a loopback rpc-server with a
declared budget of 240 MiB at 4,096 tokens; kvadvise's partial offload really allocated by the real llama-server
stays within the budget, and llama.cpp's --fit run of the same case had that same budget."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fit import MIB, run_case  # noqa: E402
from rpc_devices import devices  # noqa: E402


def test_kvadvise_partial_offload_really_stays_within_the_declared_budget(
    gemma_path: Path, real_llama_server: Path, rpc_binary: Path, tmp_path: Path
) -> None:
    budget = 240 * MIB  # under the 270 MiB the whole model needs at 4,096 tokens: a partial offload
    with devices(rpc_binary, 1) as endpoints:
        row = run_case(real_llama_server, gemma_path, endpoints[0], budget, 4096, "gemma3", tmp_path)
    ours, fit = row.ours, row.fit
    assert ours is not None and fit is not None
    assert 0 < ours.gpu_layers < ours.total_layers  # a partial offload, really placed
    assert 0 < ours.device_bytes <= budget  # the structural guarantee: never over the declared budget
    assert ours.device_bytes <= row.plan.planned_bytes  # the plan is not below what llama.cpp allocates
    assert fit.budget_bytes == budget  # --fit was given the same budget (its margin below the free memory)
    assert fit.device_bytes <= budget and fit.gpu_layers > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma3-4096-240-fit.log", "gemma3-4096-240-kvadvise.log"]
