"""`kvadvise gpus`: the built-in cards and this machine's GPUs (NVML faked at kvadvise.planner.hardware.probe)."""

from __future__ import annotations

import json

import pytest

from kvadvise.cli import main
from kvadvise.planner import gpus, hardware
from kvadvise.planner.gpus import load_profiles
from kvadvise.planner.hardware import Gpu, Hardware

GiB = 1 << 30


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _machine() -> Hardware:
    rtx = next(p for p in load_profiles() if p.id == "rtx-4090")
    return Hardware(
        gpus=(
            Gpu(0, "NVIDIA GeForce RTX 4090", rtx.usable_bytes, 20 * GiB, 3 * GiB, rtx.bandwidth_bytes_per_s, "x"),
            Gpu(1, "Some Card 7", 8 * GiB, 8 * GiB, 0, None, None),
        ),
        ram_total_bytes=64 * GiB,
        ram_free_bytes=40 * GiB,
        source="nvml",
        notes=("GPU 1 (Some Card 7): memory bandwidth unknown (not in profiles/gpus.json)",),
    )


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Hardware:
    hw = _machine()
    monkeypatch.setattr(hardware, "probe", lambda: hw)
    return hw


def test_json_lists_every_profile_and_the_machine(machine: Hardware, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "gpus", "--json")
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert [p["id"] for p in doc["profiles"]] == [p.id for p in load_profiles()]
    p4090 = next(p for p in doc["profiles"] if p["id"] == "rtx-4090")
    assert set(p4090) == {
        "id",
        "name",
        "vendor",
        "aliases",
        "memory_bytes",
        "usable_bytes",
        "bandwidth_bytes_per_s",
        "unified_memory",
        "backend",
        "speed_class",
        "boost_clock_mhz",
        "fp16_tflops",
        "source",
    }
    assert (
        p4090["backend"] == "cuda" and next(p for p in doc["profiles"] if p["vendor"] == "apple")["backend"] == "metal"
    )
    assert p4090["bandwidth_bytes_per_s"] == 1_008_000_000_000 and p4090["source"].startswith("https://")
    m4 = next(p for p in doc["profiles"] if p["id"] == "m4-max-64gb")
    assert m4["unified_memory"] and m4["usable_bytes"] == 48 * GiB  # 3/4 of 64 GiB
    m = doc["machine"]
    assert m["source"] == "nvml" and m["ram_total_bytes"] == 64 * GiB
    g0, g1 = m["gpus"]
    assert (g0["profile"], g0["free_bytes"], g0["used_by_others_bytes"]) == ("rtx-4090", 20 * GiB, 3 * GiB)
    assert (g1["profile"], g1["bandwidth_bytes_per_s"]) == (None, None)
    assert m["notes"] == list(machine.notes)


def test_text(machine: Hardware, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gpus")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("--gpu ID")
    assert any(line.startswith("rtx-4090 ") and "1,008 GB/s" in line and "24.0 GiB" in line for line in lines)
    assert "GPU 0: NVIDIA GeForce RTX 4090  24.0 GiB total, 20.0 GiB free, 3.0 GiB used by other processes" in out
    assert "(--gpu rtx-4090)" in out and "not in the built-in list" in out


def test_every_listed_id_is_a_gpu_name_plan_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gpus", "--json", "--no-hardware")
    assert rc == 0
    doc = json.loads(out)
    assert doc["machine"] is None
    for p in doc["profiles"]:
        assert gpus.find_profile(p["id"]).id == p["id"]


def test_no_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(
        hardware, "probe", lambda: Hardware((), 16 * GiB, 8 * GiB, "none", ("no NVIDIA GPU found: no driver",))
    )
    rc, out, _ = run(capsys, "gpus")
    assert rc == 0 and "no GPU seen: plans use system RAM" in out and "no NVIDIA GPU found" not in out


def test_unknown_gpu_points_to_the_command(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    rc, _, err = run(capsys, "gguf", "/nonexistent.gguf", "--gpu", "rtx 9999")
    assert rc == 2
    assert "kvadvise gpus" in err or "No such file" in err or "nonexistent" in err


@pytest.mark.parametrize(
    ("card", "backend", "device", "speed_key"),
    [("7900xtx", "rocm", "ROCm0", "rocm"), ("b580", "sycl", "SYCL0", "vulkan"), ("strix-halo", "vulkan", "Vulkan0", "vulkan")],
)  # fmt: skip
def test_amd_and_intel_cards_plan_under_their_backend(
    card: str, backend: str, device: str, speed_key: str, capsys: pytest.CaptureFixture[str], gemma_path: object
) -> None:
    """Issue 14: an AMD or Intel card is not planned as CUDA silently: its buffers carry its backend's name
    (ROCm0: ggml-cuda built with HIP; Vulkan0, SYCL0: CUDA's rules as an approximation, said in a note) and
    the speed uses the factors fitted for a non-CUDA GPU API."""
    from kvadvise.planner.speed import EFFICIENCY

    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--gpu", card, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["budget"]["backend"] == backend
    assert [d["name"] for d in doc["memory"]["devices"]] == [device]
    assert any(n.startswith(device[:-1] + ":") for n in doc["notes"])
    # the same bandwidth read with the CUDA factor would give a different figure
    assert doc["decode_estimate"]["note"].endswith("measures the real figure")
    assert f"({speed_key})" in doc["decode_estimate"]["note"] and EFFICIENCY[speed_key] != EFFICIENCY["cuda"]
    rc, out, _ = run(capsys, "gpus", "--json")
    assert next(p for p in json.loads(out)["profiles"] if card in p["aliases"] or p["id"] == card)["backend"] == backend


def test_json_names_each_cards_decode_class(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpus --json` says which decode class the speed estimate reads each card with (planner.speed.EFFICIENCY's
    key), so a user who sees a speed can tell whether their card was taken as its architecture (an MI50 is GCN:
    issue 37's 1.56x-too-fast MI50 came from CUDA's efficiency) or as its backend's default."""
    from kvadvise.planner.speed import EFFICIENCY

    rc, out, _ = run(capsys, "gpus", "--json", "--no-hardware")
    assert rc == 0
    cards = {p["id"]: p for p in json.loads(out)["profiles"]}
    assert {p["speed_class"] for p in cards.values()} <= set(EFFICIENCY)
    assert cards["mi50-16gb"]["speed_class"] == "rocm-gcn"
    assert cards["rtx-4090"]["speed_class"] == "cuda"
    assert cards["rtx-4090"]["boost_clock_mhz"] == 2520  # NVIDIA's published boost clock
    apple = {i: p["speed_class"] for i, p in cards.items() if p["backend"] == "metal"}
    assert {"metal-m1", "metal-m4"} <= set(apple.values())
