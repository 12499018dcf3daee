"""Builds before ggml-org/llama.cpp#15850 (kvadvise.planner.builds.GRAPH_OPTIMIZE): no backend reordered a split's
graph before ggml-alloc saw it, so kvadvise.planner.galloc over the graph as that era built it
(kvadvise.planner.llama_graph, LlamaShape.legacy / cpu_only) is the printed compute buffer of the device that runs
the layers, a GPU or the CPU. Every published log of such a build whose model llama_graph builds
(tests/data/published: CUDA, ROCm and CPU, b4300 to b6100) is planned to the 0.01 MiB it prints; the analytic plan
was 4 to 33 MiB off on them."""

from __future__ import annotations

import published_logs
import pytest

from kvadvise.model.hfconfig import from_config
from kvadvise.planner import builds
from kvadvise.planner.memory import _EXACT_ARCHS_LEGACY

OLD = tuple(
    log
    for log in published_logs.LOGS
    if log.run.llama_build is not None
    and log.run.llama_build < builds.GRAPH_OPTIMIZE
    and not log.xfail
    and from_config(log.hf_config, source=log.id).architecture in _EXACT_ARCHS_LEGACY
)


def test_the_old_logs_are_the_ones_expected() -> None:
    # 023, 024: RPC hosts without events (builds.RPC_EVENTS), so no pipeline parallelism: each device's buffer is
    # one device's graph (memory.unpipelined_split_compute); 038: ROCm b5898 with every block on the CPU, the
    # device's buffer the output layer's op-offload copy; 057-062 (found in issue 37's fifth round): Qwen3-0.6B on
    # a gfx1151 iGPU at b5398, Qwen2.5-Coder-32B at b4407 (q8_0 cache), Qwen2.5-32B over five MI50s at about b4870
    # (no pipeline parallelism: the log prints no "pipeline parallelism enabled" and one copy of the inputs on the
    # host), Qwen2.5-1.5B on an M4 at b4406; 058 (phi3 on an RTX 3070 at b5600, the analytic plan's 138.00 as
    # printed), 102, 106, 107 (round 19: GLM-Z1-32B on a CPU at b5192, Phi-3-mini and Llama-3-8B on a CPU at b6200
    # and about b6150)
    assert [log.id[:3] for log in OLD] == [
        "006", "007", "010", "011", "017", "019", "023", "024", "026", "034", "038", "057", "058", "059", "060",
        "062", "102", "106", "107",
    ]  # fmt: skip


@pytest.mark.parametrize("log", OLD, ids=[log.id for log in OLD])
def test_the_compute_buffers_as_printed(log: published_logs.PublishedLog) -> None:
    rows = [r for r in published_logs.compare(log) if r.kind == "compute"]
    assert rows
    for r in rows:
        assert round(r.predicted_mib, 2) == pytest.approx(r.published_mib, abs=0.01), (r.buffer, r.predicted_mib)
