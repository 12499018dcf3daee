"""When llama.cpp splits a full offload with pipeline parallelism (llama_context::llama_context, b11312): several
devices, no tensor override, every device but the CPU with async compute and events (ggml_backend_dev_props),
which RPC devices have from d0132a680 (builds.RPC_EVENTS) and Vulkan ones from December 2025
(builds.VULKAN_EVENTS). Without it a split keeps one copy of its inputs (ggml_backend_sched_split_graph), freed
as on one device: the published two-host RPC run of b6209 (tests/data/published 023) to the 0.01 MiB."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.planner import builds
from kvadvise.planner.memory import MIB, RunConfig, estimate, pipeline_parallel

DATA = Path(__file__).parent / "data" / "published"


@pytest.mark.parametrize(
    ("names", "build", "expected"),
    [
        (("CUDA0", "CUDA1"), 6000, True),
        (("ROCm0", "ROCm1"), builds.REFERENCE, True),
        (("RPC0", "RPC1"), builds.REFERENCE, True),
        (("RPC0", "RPC1"), builds.RPC_EVENTS - 1, False),  # b10454: ggml-rpc reports no events
        (("RPC0", "RPC1"), builds.RPC_EVENTS, True),
        (("CUDA0", "RPC[10.0.0.2:50052]"), 6209, False),  # one device without events turns it off for all
        (("Vulkan0", "Vulkan1"), builds.VULKAN_EVENTS - 1, False),  # ec98e2002 (Ollama 0.13.5-0.24)
        (("Vulkan0", "Vulkan1"), builds.REFERENCE, True),
        (("CANN0", "CANN1"), builds.REFERENCE, False),  # ggml-cann: async false
        (("SYCL0", "SYCL1"), builds.REFERENCE, True),
        (("RPC0", "RPC1"), None, True),  # an unknown build follows the newest rules
    ],
)
def test_devices_without_events_turn_pipeline_parallelism_off(
    names: tuple[str, ...], build: int | None, expected: bool
) -> None:
    assert pipeline_parallel(RunConfig(llama_build=build), names) is expected


def test_a_tensor_override_turns_pipeline_parallelism_off() -> None:
    """--n-cpu-moe is a tensor override (common/arg.cpp adds it to tensor_buft_overrides)."""
    assert not pipeline_parallel(RunConfig(host_experts=True), ("CUDA0", "CUDA1"))
    assert not pipeline_parallel(RunConfig(op_offload_copy_bytes=1 << 20), ("CUDA0", "CUDA1"))


def test_the_published_two_host_run_of_b6209_is_planned_to_the_mib(tmp_path: Path) -> None:
    """tests/data/published 023: Llama 3.1 70B over two RPC hosts at b6209, 588.01 MiB of compute each and 28.01
    on the CPU; with pipeline parallelism's four copies the same split plans 100-164 MiB more a device."""
    row = json.loads((DATA / "023-rpc2-cpu-llama31-70b-llamacli-fa-off.json").read_text())
    path = write_tiny_gguf(
        tmp_path / "l70.gguf", "llama", n_vocab=128256, n_ctx_train=131072, sparse=True,
        dims=dict(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, head=128, n_ff=28672),
    )  # fmt: skip
    spec = kvadvise.load_model(str(path))
    run = row["run"]
    cfg = RunConfig(
        n_ctx=run["n_ctx"], flash_attn="off", device="rpc", runtime="library",
        tensor_split=tuple(run["tensor_split"]), device_names=tuple(run["device_names"]), llama_build=6209,
    )  # fmt: skip
    est = estimate(spec, cfg)
    assert [round(d.compute_bytes / MIB, 2) for d in est.devices] == [588.01, 588.01]
    assert round(est.host.compute_bytes / MIB, 2) == 28.01
    newer = estimate(spec, replace(cfg, llama_build=builds.REFERENCE))
    assert all(d.compute_bytes - 90 * MIB > 588.01 * MIB for d in newer.devices)
