"""kvadvise against published llama.cpp logs (tests/data/published, built by tests/published_logs.py).

Every printed KV buffer must equal kvadvise's figure to the 0.01 MiB llama.cpp prints; every printed
compute buffer, device and host apart, within 16 MiB or 3 %. A log kvadvise does not model says why
in its ``xfail`` and is a strict xfail, so a fix that makes it pass shows up. The table of every
buffer is printed at the end by tests/conftest.py (and written to build/published-report.md); so does
``python benchmarks/bench_published.py`` without pytest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from published_logs import LOGS, MIB, REPORT_ROWS, PublishedLog, compare, table

ROOT = Path(__file__).resolve().parent.parent


def test_the_published_set_is_what_issue_12_asks() -> None:
    """At least 25 logs, each with its source and raw excerpt; CUDA, Metal, Vulkan, CPU and RPC; one
    and several devices; flash attention on and off; llama-server and the library's runtime."""
    assert len(LOGS) >= 25
    assert len({log.id for log in LOGS}) == len(LOGS)
    for log in LOGS:
        assert log.source and log.raw and log.build and log.launcher, log.id
        assert log.compute_mib, log.id
        for name in log.compute_mib:
            assert f"{name} compute buffer size" in log.raw, (log.id, name)
    backends = " ".join(log.backend for log in LOGS)
    for b in ("CUDA", "Metal", "Vulkan", "CPU", "RPC"):
        assert b in backends, b
    assert any(len(log.run.tensor_split) > 1 for log in LOGS)
    assert {log.run.flash_attn for log in LOGS} >= {"on", "off"}
    assert {log.run.runtime for log in LOGS} == {"llama-server", "llama-cli", "library"}


@pytest.mark.parametrize("log", LOGS, ids=[log.id for log in LOGS])
def test_published_log(log: PublishedLog, request: pytest.FixtureRequest) -> None:
    rows = compare(log)
    REPORT_ROWS.extend(rows)
    if log.xfail:
        request.applymarker(pytest.mark.xfail(reason=log.xfail, strict=True))
    bad = [r for r in rows if not r.ok]
    assert not bad, "\n" + table(bad)


def test_op_offload_copy_sits_in_a_layer_not_beside_the_logits() -> None:
    """Issue 25's 'op-offload copy with experts on the CPU: 703 MiB predicted vs 524 printed'. Published
    measurement (a public report 'MESURES-MOE — Lot L7', 2026-08-15; RTX 3060 12 GB, llama-cpp-python 0.3.34:
    the library's whole-batch logits, flash attention, f16 cache at 262,144 cells): Qwen3.6-35B-A3B
    (qwen35moe, the Qwen3.5-35B-A3B config) with the experts of blocks 6-39 in host memory printed
    ``CUDA0 compute buffer size = 524.06 MiB`` and ``CUDA_Host compute buffer size = 276.11 MiB``; its largest
    CPU-resident weight is ``blk.6.ffn_down_exps.weight (176 MiB q5_K)``. The copy op offload makes of it
    lives during that layer's matmul, beside the masks and the layer's activations (256 + 72 + 176 MiB), not
    beside the logits (485 MiB): the plan's growth is 11 MiB, not the whole copy. 20 MiB (3.8 %) under the
    printed figure, a known miss (README, remaining known misses)."""
    import json

    from kvadvise.model.hfconfig import from_config
    from kvadvise.planner.compute import device_compute_bytes, host_compute_bytes, op_offload_growth
    from kvadvise.planner.memory import RunConfig, resolve

    sizes = json.loads((ROOT / "tests" / "data" / "hf" / "qwen3.5-35b-a3b.json").read_text())
    spec = from_config(sizes, source="Qwen3.5-35B-A3B")
    lay = resolve(spec, RunConfig(n_ctx=262144, flash_attn="on", device="cuda", runtime="library", llama_build=9900))
    copy = 512 * 2048 * 256 // 256 * 176  # q5_K: 176 bytes per 256 values; [512, 2048, 256]
    assert copy == 176 * MIB
    full = device_compute_bytes(spec, lay)
    with_copy = device_compute_bytes(spec, lay, weight_copy=copy)
    # the logits of 512 rows and three rows of n_embd (a MoE's: llama-fit-params b11312 reserves 497.01 MiB for
    # this shape at 4k cells, tests/test_moe_shared.py)
    assert full / MIB == pytest.approx(485 + 12, abs=0.02)
    assert with_copy / MIB == pytest.approx(524.06, abs=24) and with_copy - full == op_offload_growth(spec, lay, copy)
    assert op_offload_growth(spec, lay, copy) < copy / 10  # before issue 25: the whole copy, 703 MiB in all
    assert host_compute_bytes(spec, lay) / MIB == pytest.approx(276.11, abs=16)
