"""Calibration: a measured overhead is stored with provenance and used by later plans."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvadvise.backends.gguf_cache import read
from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.planner.hardware import Gpu, Hardware
from kvadvise.planner.memory import MIB, OVERHEAD_BYTES, RunConfig
from kvadvise.planner.planning import make_plan
from kvadvise.planner.policy import Policy
from kvadvise.runtime import calibration
from kvadvise.runtime.verification import Measurement, compare

GPU = "NVIDIA GeForce RTX 4090"


def test_measured_overhead_is_stored_and_used(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = from_gguf(read(gemma_path))
    hw = Hardware((Gpu(0, GPU, 24564 * MIB, 24000 * MIB, 0, None, None),), 1 << 36, 1 << 35, "nvml")
    plan = make_plan(
        spec, RunConfig(n_ctx=4096, flash_attn="on", device="cuda"), recommend_ctx=False, hw=hw, policy=Policy()
    )
    assert plan.estimate.overhead_bytes == OVERHEAD_BYTES["cuda"] and plan.notes == ()
    est = plan.estimate
    buffers = est.kv_bytes + est.weights_bytes + est.compute_bytes
    # a run on that GPU that used 400 MiB more than its buffers (CUDA context, cuBLAS workspace, pools)
    m = Measurement(
        "llama-server",
        "CUDA",
        "b7000 (0c1e570)",
        est.k_bytes,
        est.v_bytes,
        est.kv_bytes,
        0,
        est.weights_bytes,
        est.compute_bytes,
        est.output_bytes,
        buffers + 400 * MIB,
        1000.0,
        100.0,
        4096,
        19,
        19,
    )
    v = compare(plan, m)
    assert v.fits and v.verdict == "fits: 100% GPU, 0 layers on CPU"
    cal = calibration.from_verification(v, GPU)
    assert cal.overhead_bytes == 400 * MIB and cal.compute_ratio == 1.0
    calibration.save(cal)
    measured, notes = calibration.measured_overhead(GPU)
    assert notes == ()
    again = make_plan(
        spec,
        RunConfig(n_ctx=4096, flash_attn="on", device="cuda"),
        recommend_ctx=False,
        hw=hw,
        policy=Policy(),
        measured_overhead=measured,
    )
    assert again.estimate.overhead_bytes == 400 * MIB
    assert again.estimate.total_bytes == plan.estimate.total_bytes - OVERHEAD_BYTES["cuda"] + 400 * MIB
    assert "calibration measured on NVIDIA GeForce RTX 4090" in again.notes[0]
    assert main(["calibration", "show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["device"] for e in doc["entries"]] == [GPU] and doc["entries"][0]["model"] == "Gemma 3 270m"
    assert main(["calibration", "clear"]) == 0
    assert calibration.load().entries == ()


def test_partial_offload_is_reported_as_not_fitting(gemma_path: Path) -> None:
    spec = from_gguf(read(gemma_path))
    hw = Hardware((Gpu(0, GPU, 24564 * MIB, 24000 * MIB, 0, None, None),), 1 << 36, 1 << 35, "nvml")
    plan = make_plan(spec, RunConfig(n_ctx=4096, device="cuda"), recommend_ctx=False, hw=hw, policy=Policy())
    e = plan.estimate
    m = Measurement(
        "llama-server",
        "CUDA",
        "b",
        e.k_bytes,
        e.v_bytes,
        e.kv_bytes,
        0,
        e.weights_bytes,
        e.compute_bytes,
        e.output_bytes,
        None,
        None,
        None,
        4096,
        12,
        19,
    )
    v = compare(plan, m)
    assert not v.fits and v.verdict == "does not fit: 7 layers on the CPU"
    assert replace(m, gpu_layers=19).gpu_layers == 19
