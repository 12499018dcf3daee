"""The decode-speed model (kvadvise.planner.speed) against the published measurements it was fitted on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvadvise.backends.ollama.profiles import profiles
from kvadvise.planner import speed

ROOT = Path(__file__).resolve().parent.parent


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_speed", ROOT / "benchmarks" / "bench_speed.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_row_has_a_source_and_the_set_is_large_enough() -> None:
    b = _bench()
    doc = b.load()
    rows = b.rows(doc)
    assert len(rows) >= 20
    for r in doc["rows"]:
        assert r["source"] and r["source_date"] and r["decode_tps"] > 0 and r["bandwidth_gbs"] > 0


def test_accuracy_bar() -> None:
    """Goal of issue 14: within ±25 % of the measured figure on at least 85 % of the rows (before: 13 %)."""
    b = _bench()
    t = b.table(b.load())
    after = b.share_within([a for _, _, a in t])
    before = b.share_within([x for _, x, _ in t])
    assert after >= 0.85, after
    assert after > before


def test_gpt_oss_ranks_above_llama_on_a_4090() -> None:
    """Published: gpt-oss-20b decodes more than half again as fast as llama3.1:8b on a 4090 (llama.cpp GGUFs with
    Q8_0 attention). Ollama's gpt-oss:20b keeps attention and the output in BF16 (14 GB), so it reads more per token:
    the estimate for the profile is still well ahead (the old one put it at 0.4x)."""
    gpu = [speed.Device("cuda", 1_008_000_000_000)]
    oss = speed.estimate(profiles()["gpt-oss:20b"].spec(), 4096, gpu)
    llama = speed.estimate(profiles()["llama3.1:8b"].spec(), 4096, gpu)
    assert oss is not None and llama is not None
    assert oss.tokens_per_s > 1.3 * llama.tokens_per_s


def test_speed_falls_with_context_and_moe_reads_only_used_experts() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    reads = speed.weight_reads(spec)
    assert reads.moe and reads.experts == pytest.approx(spec.expert_bytes * 8 / 128, rel=1e-6)
    est = speed.estimate(spec, 65536, [speed.Device("cuda", 1_008_000_000_000)])
    assert est is not None and [c for c, _ in est.points] == [4096, 65536]
    assert est.points[0][1] > est.points[1][1]
    assert est.low < est.tokens_per_s < est.high
    assert "at 4k" in est.text() and "at 64k" in est.text()


def test_partial_offload_adds_the_cpu_time() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    gpu = [speed.Device("cuda", 448_000_000_000)]
    full = speed.estimate(spec, 4096, gpu)
    part = speed.estimate(spec, 4096, gpu, cpu_expert_layers=24)
    assert full is not None and part is not None
    assert part.tokens_per_s < full.tokens_per_s
