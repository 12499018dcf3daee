"""kvadvise.planner.hardware: NVML probing (faked at the pynvml boundary), GPU profiles,
the Apple unified-memory share, manual budgets and size parsing.

No test touches the real NVML: an autouse fixture puts a tripwire module named
``pynvml`` in sys.modules, and the probe tests replace it with a fake that has
the same function names and NVMLError classes. psutil is faked the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pytest

from kvadvise.errors import EXIT_INPUT, InputError
from kvadvise.planner import hardware
from kvadvise.planner.gpus import apple_gpu_share_bytes, find_profile, list_profiles, load_profiles, match_nvml_name
from kvadvise.planner.hardware import Gpu, Hardware, from_profile, manual, probe
from kvadvise.ui.flags import parse_rpc_host, parse_size

GiB = 1 << 30
MiB = 1 << 20
RAM_TOTAL = 64 * GiB
RAM_AVAILABLE = 48 * GiB


# ------------------------------------------------------------------ fakes


class FakeNVMLError(Exception):
    """Stands for pynvml.NVMLError (whose __str__ asks the library for the text)."""

    def __init__(self, text: str = "Unknown Error") -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class FakeLibraryNotFound(FakeNVMLError):
    def __init__(self) -> None:
        super().__init__("NVML Shared Library Not Found")


class FakeDriverNotLoaded(FakeNVMLError):
    def __init__(self) -> None:
        super().__init__("Driver Not Loaded")


@dataclass
class FakeProc:
    pid: int
    usedGpuMemory: int | None  # NVML's field name


@dataclass
class FakeDevice:
    name: bytes | str
    total: int
    used: int = 0
    compute: list[FakeProc] = field(default_factory=list)
    graphics: list[FakeProc] = field(default_factory=list)
    processes_fail: bool = False
    memory_fails: bool = False


@dataclass
class FakeNVML:
    devices: list[FakeDevice]
    init_error: Callable[[], Exception] | None = None
    count_error: bool = False
    calls: list[str] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
        mod.NVMLError_LibraryNotFound = FakeLibraryNotFound  # type: ignore[attr-defined]
        mod.NVMLError_DriverNotLoaded = FakeDriverNotLoaded  # type: ignore[attr-defined]

        def nvmlInit() -> None:
            self.calls.append("init")
            if self.init_error is not None:
                raise self.init_error()

        def nvmlShutdown() -> None:
            self.calls.append("shutdown")

        def nvmlDeviceGetCount() -> int:
            if self.count_error:
                raise FakeNVMLError("Unknown Error")
            return len(self.devices)

        def nvmlDeviceGetHandleByIndex(i: int) -> FakeDevice:
            return self.devices[i]

        def nvmlDeviceGetName(h: FakeDevice) -> bytes | str:
            return h.name

        def nvmlDeviceGetMemoryInfo(h: FakeDevice) -> types.SimpleNamespace:
            if h.memory_fails:
                raise FakeNVMLError("GPU is lost")
            return types.SimpleNamespace(total=h.total, free=h.total - h.used, used=h.used)

        def nvmlDeviceGetComputeRunningProcesses(h: FakeDevice) -> list[FakeProc]:
            if h.processes_fail:
                raise FakeNVMLError("Not Supported")
            return h.compute

        def nvmlDeviceGetGraphicsRunningProcesses(h: FakeDevice) -> list[FakeProc]:
            if h.processes_fail:
                raise FakeNVMLError("Not Supported")
            return h.graphics

        for fn in (
            nvmlInit,
            nvmlShutdown,
            nvmlDeviceGetCount,
            nvmlDeviceGetHandleByIndex,
            nvmlDeviceGetName,
            nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetComputeRunningProcesses,
            nvmlDeviceGetGraphicsRunningProcesses,
        ):
            setattr(mod, fn.__name__, fn)
        return mod


def _tripwire_pynvml() -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def __getattr__(name: str) -> Any:
        raise AssertionError(f"a test reached the real NVML (pynvml.{name})")

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


@pytest.fixture(autouse=True)
def _fake_system(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    psutil = types.ModuleType("psutil")
    psutil.virtual_memory = lambda: types.SimpleNamespace(total=RAM_TOTAL, available=RAM_AVAILABLE)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "psutil", psutil)
    monkeypatch.setitem(sys.modules, "pynvml", _tripwire_pynvml())
    yield


def install(monkeypatch: pytest.MonkeyPatch, nvml: FakeNVML) -> FakeNVML:
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module())
    return nvml


def _assert_no_gpu(hw: Hardware, *reason_parts: str) -> None:
    assert hw.gpus == ()
    assert not hw.has_gpu
    assert hw.source == "none"
    assert (hw.ram_total_bytes, hw.ram_free_bytes) == (RAM_TOTAL, RAM_AVAILABLE)
    assert len(hw.notes) == 1
    note = hw.notes[0]
    assert note.startswith("no NVIDIA GPU found: ")
    assert note.endswith("; planning for the CPU, or pass --gpu NAME / --vram SIZE")
    for part in reason_parts:
        assert part in note


# ------------------------------------------------------------------ probe


@pytest.mark.parametrize("name", [b"NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"])
def test_probe_one_gpu(monkeypatch: pytest.MonkeyPatch, name: bytes | str) -> None:
    nvml = install(monkeypatch, FakeNVML([FakeDevice(name, total=24564 * MiB, used=300 * MiB)]))
    hw = probe()
    assert hw.source == "nvml"
    assert (hw.ram_total_bytes, hw.ram_free_bytes) == (RAM_TOTAL, RAM_AVAILABLE)
    assert hw.gpus == (
        Gpu(
            index=0,
            name="NVIDIA GeForce RTX 4090",
            total_bytes=24564 * MiB,
            free_bytes=(24564 - 300) * MiB,
            used_by_others_bytes=0,
            bandwidth_bytes_per_s=1_008_000_000_000,
            bandwidth_source=hw.gpus[0].bandwidth_source,
            unified_memory=False,
            flops_per_s=330.3e12,  # the card's FP16 tensor peak (profiles/gpus.json fp16_tflops): prompt speed
            flops_source="profiles/gpus.json rtx-4090 fp16_tflops",
            speed_class="default",  # a catalogue card of its backend's default decode class
            clock_hz=2_520_000_000,  # its boost clock (profiles/gpus.json boost_clock_mhz): decode's fixed time
        ),
    )
    assert hw.gpus[0].bandwidth_source is not None
    assert hw.gpus[0].bandwidth_source.startswith("profile:rtx-4090 (https://www.nvidia.com/")
    assert hw.notes == ()
    assert nvml.calls == ["init", "shutdown"]


def test_probe_two_gpus_one_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        monkeypatch,
        FakeNVML(
            [
                FakeDevice(b"NVIDIA GeForce RTX 3090", total=24576 * MiB, used=1 * GiB),
                FakeDevice(b"NVIDIA Mystery Card 9000", total=48 * GiB),
            ]
        ),
    )
    hw = probe()
    assert hw.source == "nvml"
    assert [g.index for g in hw.gpus] == [0, 1]
    first, second = hw.gpus
    assert first.name == "NVIDIA GeForce RTX 3090"
    assert first.free_bytes == 24576 * MiB - GiB
    assert first.bandwidth_bytes_per_s == 936_000_000_000
    assert first.clock_hz == 1_695_000_000 and second.clock_hz == 0  # the profile's boost clock; unknown: 0
    assert second.name == "NVIDIA Mystery Card 9000"
    assert (second.total_bytes, second.free_bytes) == (48 * GiB, 48 * GiB)
    assert second.bandwidth_bytes_per_s is None and second.bandwidth_source is None
    assert any("GPU 1 (NVIDIA Mystery Card 9000): memory bandwidth unknown" in n for n in hw.notes)


def test_probe_counts_memory_held_by_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    dev = FakeDevice(
        b"NVIDIA GeForce RTX 4090",
        total=24564 * MiB,
        used=6 * GiB,
        compute=[FakeProc(111, 4 * GiB), FakeProc(222, None), FakeProc(os.getpid(), 3 * GiB)],
        # 111 is also a graphics client (C+G): counted once; 333 is graphics only
        graphics=[FakeProc(111, 4 * GiB), FakeProc(333, 512 * MiB)],
    )
    install(monkeypatch, FakeNVML([dev]))
    (gpu,) = probe().gpus
    # None (not available) counts 0; our own process is not "another" process
    assert gpu.used_by_others_bytes == 4 * GiB + 512 * MiB
    assert gpu.free_bytes == 24564 * MiB - 6 * GiB


def test_probe_process_list_unavailable_counts_all_used(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = FakeDevice(b"NVIDIA L4", total=23034 * MiB, used=700 * MiB, processes_fail=True)
    install(monkeypatch, FakeNVML([dev]))
    hw = probe()
    (gpu,) = hw.gpus
    assert gpu.used_by_others_bytes == 700 * MiB
    assert gpu.bandwidth_bytes_per_s == 300_000_000_000
    assert any("cannot list its processes" in n for n in hw.notes)


def test_probe_without_nvml_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    _assert_no_gpu(probe(), "nvidia-ml-py", "not installed")


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (FakeDriverNotLoaded, "Driver Not Loaded"),
        (FakeLibraryNotFound, "NVML Shared Library Not Found"),
        (lambda: FakeNVMLError("Insufficient Permissions"), "Insufficient Permissions"),
    ],
)
def test_probe_nvml_cannot_start(monkeypatch: pytest.MonkeyPatch, error: Callable[[], Exception], text: str) -> None:
    nvml = install(monkeypatch, FakeNVML([FakeDevice(b"NVIDIA GeForce RTX 4090", total=24 * GiB)], init_error=error))
    _assert_no_gpu(probe(), "NVML could not start", text)
    assert nvml.calls == ["init"]


def test_probe_zero_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = install(monkeypatch, FakeNVML([]))
    _assert_no_gpu(probe(), "NVML reports no GPU")
    assert nvml.calls == ["init", "shutdown"]


def test_probe_count_error_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = install(monkeypatch, FakeNVML([], count_error=True))
    _assert_no_gpu(probe(), "could not count")
    assert nvml.calls == ["init", "shutdown"]


def test_probe_skips_a_broken_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [
        FakeDevice(b"NVIDIA A10", total=23028 * MiB, memory_fails=True),
        FakeDevice(b"Tesla T4", total=15360 * MiB),
    ]
    install(monkeypatch, FakeNVML(devices))
    hw = probe()
    assert [(g.index, g.name) for g in hw.gpus] == [(1, "Tesla T4")]
    assert hw.gpus[0].bandwidth_bytes_per_s == 320_000_000_000
    assert any(n.startswith("GPU 0: NVML error (GPU is lost)") for n in hw.notes)


def test_probe_only_broken_gpus_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNVML([FakeDevice(b"NVIDIA A10", total=23028 * MiB, memory_fails=True)]))
    _assert_no_gpu(probe(), "GPU is lost")


@pytest.mark.parametrize(
    ("nvml_name", "total", "expected"),
    [
        ("NVIDIA GeForce RTX 4090", 24564 * MiB, "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", None, "rtx-4090"),
        ("NVIDIA GeForce RTX 4090 D", 24564 * MiB, None),  # another card
        ("NVIDIA GeForce RTX 4090 Laptop GPU", 16376 * MiB, None),
        ("NVIDIA GeForce RTX 3060", 12288 * MiB, "rtx-3060-12gb"),
        ("NVIDIA GeForce RTX 3060", 8192 * MiB, None),  # the 8 GB 3060 has less bandwidth
        ("NVIDIA GeForce RTX 4060 Ti", 16380 * MiB, "rtx-4060-ti-16gb"),
        ("NVIDIA GeForce RTX 4060", 8188 * MiB, "rtx-4060"),  # in the list since issue 14
        ("Tesla T4", 15360 * MiB, "t4"),
        ("NVIDIA A10", 23028 * MiB, "a10"),
        ("NVIDIA A10G", 23028 * MiB, None),
        ("NVIDIA A100-SXM4-80GB", 81920 * MiB, "a100-80gb-sxm"),
        ("NVIDIA A100 80GB PCIe", 81920 * MiB, "a100-80gb-pcie"),
        ("NVIDIA A100-PCIE-40GB", 40536 * MiB, "a100-40gb"),
        ("NVIDIA H100 80GB HBM3", 81559 * MiB, "h100-sxm"),
        ("NVIDIA H100 PCIe", 81559 * MiB, "h100-pcie"),
        ("NVIDIA H100 NVL", 95830 * MiB, None),
        ("NVIDIA H200", 143771 * MiB, "h200"),
        ("NVIDIA GeForce RTX 5090", 32607 * MiB, "rtx-5090"),
        ("", None, None),
    ],
)
def test_match_nvml_name(nvml_name: str, total: int | None, expected: str | None) -> None:
    found = match_nvml_name(nvml_name, total)
    assert (found.id if found else None) == expected


# ------------------------------------------------------------------ profiles


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("4090", "rtx-4090"),
        ("rtx4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("rtx-4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("3060", "rtx-3060-12gb"),
        ("RTX 3060 12GB", "rtx-3060-12gb"),
        ("3090", "rtx-3090"),
        ("4060 Ti", "rtx-4060-ti-16gb"),
        ("rtx4060ti", "rtx-4060-ti-16gb"),
        ("4070", "rtx-4070"),
        ("4080", "rtx-4080"),
        ("5090", "rtx-5090"),
        ("a10", "a10"),
        ("L4", "l4"),
        ("Tesla T4", "t4"),
        ("a100-40", "a100-40gb"),
        ("a100-80", "a100-80gb-sxm"),
        ("A100 80GB", "a100-80gb-sxm"),
        ("a100 80gb pcie", "a100-80gb-pcie"),
        ("h100", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("h200", "h200"),
        ("m3-max-36", "m3-max-36gb"),
        ("M3 Max 36GB", "m3-max-36gb"),
        ("m3 max 36 GiB", "m3-max-36gb"),
        ("m2-ultra-192", "m2-ultra-192gb"),
        ("m4 24gb", "m4-24gb"),  # not the M4 Pro 24 GB: "pro" was not asked for
        ("M4 Pro 24GB", "m4-pro-24gb"),
    ],
)
def test_find_profile(query: str, expected: str) -> None:
    assert find_profile(query).id == expected


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        ("a100", {"a100-40gb", "a100-80gb-sxm", "a100-80gb-pcie"}),
        ("m3 max", {"m3-max-36gb", "m3-max-48gb", "m3-max-64gb", "m3-max-128gb"}),
        ("m4-max", {"m4-max-36gb", "m4-max-48gb", "m4-max-64gb", "m4-max-128gb"}),
    ],
)
def test_find_profile_ambiguous(query: str, ids: set[str]) -> None:
    with pytest.raises(InputError) as info:
        from_profile(query)
    err = info.value
    assert err.exit_code == EXIT_INPUT
    assert "ambiguous" in err.message and "\n" not in err.message
    for pid in ids:
        assert pid in err.message
    assert err.hint and "--gpu" in err.hint


@pytest.mark.parametrize(
    ("query", "suggested"),
    [
        ("4060 ti 12gb", "rtx-4060-ti-16gb"),  # a variant word matches, the size does not: suggested, not taken
        ("m3-36", "m3-pro-36gb"),
        ("rtx 9999", None),
        ("rtx-4909", "rtx-4090"),
        ("", None),
        ("---", None),
    ],
)
def test_find_profile_unknown(query: str, suggested: str | None) -> None:
    with pytest.raises(InputError) as info:
        from_profile(query)
    err = info.value
    assert err.message.startswith("unknown GPU profile") and "\n" not in err.message
    if suggested:
        assert suggested in err.message
    assert err.hint and "kvadvise gpus" in err.hint


def test_from_profile_nvidia_uses_nvml_total() -> None:
    hw = from_profile("RTX 4090")
    assert hw.source == "profile:rtx-4090"
    assert (hw.ram_total_bytes, hw.ram_free_bytes) == (RAM_TOTAL, RAM_AVAILABLE)  # this machine's RAM
    (gpu,) = hw.gpus
    assert gpu == Gpu(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        total_bytes=24564 * MiB,
        free_bytes=24564 * MiB,
        used_by_others_bytes=0,
        bandwidth_bytes_per_s=1_008_000_000_000,
        bandwidth_source="https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/",
        unified_memory=False,
        flops_per_s=330.3e12,
        flops_source="profiles/gpus.json rtx-4090 fp16_tflops",
        speed_class="default",
        clock_hz=2_520_000_000,
    )
    assert "24,564 MiB as NVML reports it" in hw.sources[0]


def test_from_profile_without_nvml_total_uses_published_size() -> None:
    p = find_profile("a100 80gb pcie")
    assert p.nvml_total_bytes is None
    (gpu,) = from_profile(p.id).gpus
    assert gpu.total_bytes == gpu.free_bytes == 80 * GiB


def test_every_nvidia_profile_plans_with_nvml_total_when_known() -> None:
    for p in load_profiles():
        if p.unified_memory:
            continue
        (gpu,) = from_profile(p.id).gpus
        expected = p.nvml_total_bytes if p.nvml_total_bytes is not None else p.memory_bytes
        assert gpu.total_bytes == gpu.free_bytes == expected, p.id
        assert gpu.used_by_others_bytes == 0


@pytest.mark.parametrize(
    ("ram_gib", "share_bytes"),
    [
        (8, 8 * GiB * 2 // 3),
        (16, 16 * GiB * 2 // 3),  # llama.cpp logs 10922.67 MB
        (18, 12 * GiB),
        (32, 32 * GiB * 2 // 3),  # llama.cpp logs 21845.34 MB
        (36, 24 * GiB),  # the boundary is still 2/3
        (48, 36 * GiB),
        (64, 48 * GiB),
        (96, 72 * GiB),  # llama.cpp logs 73728.00 MB
        (128, 96 * GiB),
        (192, 144 * GiB),
        (512, 384 * GiB),
    ],
)
def test_apple_gpu_share(ram_gib: int, share_bytes: int) -> None:
    assert apple_gpu_share_bytes(ram_gib * GiB) == share_bytes


def test_apple_gpu_share_just_above_threshold_is_three_quarters() -> None:
    ram = 36 * GiB + 16 * MiB
    assert apple_gpu_share_bytes(ram) == ram * 3 // 4


@pytest.mark.parametrize(
    ("query", "ram_gib", "gpu_bytes", "fraction"),
    [
        ("m3-max-36", 36, 24 * GiB, "2/3"),
        ("m4-pro-24gb", 24, 16 * GiB, "2/3"),
        ("m2-ultra-192", 192, 144 * GiB, "3/4"),
        ("m4-max-128gb", 128, 96 * GiB, "3/4"),
    ],
)
def test_from_profile_apple(query: str, ram_gib: int, gpu_bytes: int, fraction: str) -> None:
    hw = from_profile(query)
    (gpu,) = hw.gpus
    assert gpu.unified_memory is True
    assert gpu.total_bytes == gpu.free_bytes == gpu_bytes
    assert gpu.used_by_others_bytes == 0
    assert gpu.bandwidth_bytes_per_s is not None and gpu.bandwidth_bytes_per_s > 0
    # the whole Mac: RAM is the unified memory, not this machine's
    assert hw.ram_total_bytes == hw.ram_free_bytes == ram_gib * GiB
    assert hw.source.startswith("profile:m")
    assert fraction in hw.notes[0] and "iogpu.wired_limit_mb" in hw.notes[0]


def test_list_profiles() -> None:
    profiles = list_profiles()
    ids = [pid for pid, _ in profiles]
    assert len(ids) == len(set(ids))
    assert all(isinstance(pid, str) and isinstance(name, str) and name for pid, name in profiles)
    assert ("rtx-4090", "NVIDIA GeForce RTX 4090") in profiles


def test_every_profile_is_found_by_its_id_and_name() -> None:
    for p in load_profiles():
        assert find_profile(p.id) is p
        assert find_profile(p.name) is p
        for alias in p.aliases:
            assert find_profile(alias) is p, alias


# ------------------------------------------------------------------ gpus.json


def _raw_profiles() -> dict[str, Any]:
    text = resources.files("kvadvise.profiles").joinpath("gpus.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


REQUIRED = [
    "rtx-3060-12gb",
    "rtx-3090",
    "rtx-4060-ti-16gb",
    "rtx-4070",
    "rtx-4080",
    "rtx-4090",
    "rtx-5090",
    "a10",
    "l4",
    "t4",
    "a100-40gb",
    "a100-80gb-sxm",
    "h100-sxm",
    "h200",
]


def test_gpus_json_has_the_required_cards() -> None:
    ids = {e["id"] for e in _raw_profiles()["gpus"]}
    assert set(REQUIRED) <= ids
    for chip in ("m1", "m2", "m3", "m4"):
        for tier in ("pro", "max"):
            assert any(i.startswith(f"{chip}-{tier}-") for i in ids), (chip, tier)
    for chip in ("m1", "m2", "m3"):
        assert any(i.startswith(f"{chip}-ultra-") for i in ids), chip


def test_gpus_json_entries_have_sources_and_positive_numbers() -> None:
    data = _raw_profiles()
    assert data["apple_gpu_share"]["source"].startswith("https://github.com/ollama/ollama/blob/")
    for e in data["gpus"]:
        pid = e["id"]
        assert e["source"].startswith("https://"), pid
        assert e["name"], pid
        assert isinstance(e["memory_bytes"], int) and e["memory_bytes"] > 0, pid
        assert isinstance(e["bandwidth_bytes_per_s"], int) and e["bandwidth_bytes_per_s"] > 0, pid
        assert e["bandwidth_published"], pid
        assert e["unified_memory"] is (e["vendor"] == "apple"), pid
        if "nvml_total_bytes" in e:
            assert isinstance(e["nvml_total_bytes"], int) and e["nvml_total_bytes"] > 0, pid
            # NVML's total is a little below the published size, never above it
            # (GDDR cards with ECC on, A10/L4/T4/L40S, lose 1/16 of it)
            assert e["memory_bytes"] * 0.9 < e["nvml_total_bytes"] <= e["memory_bytes"], pid
            assert e["nvml_total_source"], pid
        if e["vendor"] == "nvidia":
            assert e["nvml_names"], pid


def test_gpus_json_published_figures() -> None:
    by_id = {e["id"]: e for e in _raw_profiles()["gpus"]}
    assert by_id["rtx-4090"]["nvml_total_bytes"] == 24564 * MiB
    assert by_id["rtx-4090"]["memory_bytes"] == 24 * GiB
    assert by_id["rtx-4090"]["bandwidth_bytes_per_s"] == 1008 * 10**9
    assert by_id["h100-sxm"]["bandwidth_bytes_per_s"] == 3350 * 10**9
    assert by_id["h200"]["bandwidth_bytes_per_s"] == 4800 * 10**9
    assert by_id["m4-max-128gb"]["bandwidth_bytes_per_s"] == 546 * 10**9
    assert by_id["m4-max-36gb"]["bandwidth_bytes_per_s"] == 410 * 10**9


# ------------------------------------------------------------------ manual


def test_manual() -> None:
    hw = manual(24 * GiB)
    assert hw.source == "manual"
    assert (hw.ram_total_bytes, hw.ram_free_bytes) == (RAM_TOTAL, RAM_AVAILABLE)
    assert hw.gpus == (
        Gpu(
            index=0,
            name="manual budget",
            total_bytes=24 * GiB,
            free_bytes=24 * GiB,
            used_by_others_bytes=0,
            bandwidth_bytes_per_s=None,
            bandwidth_source=None,
        ),
    )


@pytest.mark.parametrize("size", [0, -1])
def test_manual_refuses_non_positive(size: int) -> None:
    with pytest.raises(InputError):
        manual(size)


# ------------------------------------------------------------------ parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GiB),
        ("24gib", 24 * GiB),
        ("24GB", 24 * 10**9),
        ("24 GB", 24 * 10**9),
        (" 8 GiB ", 8 * GiB),
        ("24000MiB", 24000 * MiB),
        ("24000MB", 24 * 10**9),
        ("23.5GiB", 23 * GiB + GiB // 2),
        ("0.5GiB", GiB // 2),
        (".5GiB", GiB // 2),
        ("512M", 512 * MiB),
        ("512m", 512 * MiB),
        ("24G", 24 * GiB),
        ("1.5KiB", 1536),
        ("1.5KB", 1500),
        ("4K", 4096),
        ("2TB", 2 * 10**12),
        ("1TiB", 1 << 40),
        ("1T", 1 << 40),
        ("25769803776B", 24 * GiB),
        ("100b", 100),
        ("0.1GB", 100_000_000),
        ("1.0000000001GB", 1_000_000_000),  # rounded to the nearest byte
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("24", "no unit"),
        ("25769803776", "no unit"),
        ("", "not a size"),
        ("   ", "not a size"),
        ("GB", "not a size"),
        ("-1GB", "not a size"),
        ("+1GB", "not a size"),
        ("1,5GB", "not a size"),
        ("1e9B", "not a size"),
        ("24 XB", "unknown size unit"),
        ("24 gigs", "unknown size unit"),
        ("24Gb/s", "not a size"),
        ("24 G B", "not a size"),
        ("24GB extra", "not a size"),
        ("nanGB", "not a size"),
        ("infGiB", "not a size"),
        ("0GB", "more than 0"),
        ("0.0000000001B", "more than 0"),
        ("１２GB", "not a size"),  # full-width digits
        # past int64 bytes (8 EiB): no memory is, and the JSON's readers hold sizes in int64; 5,000 digits
        # reached int()'s digit limit (ValueError: exit 1, "internal error")
        ("99999999999999999999999GiB", "more than 8 EiB"),
        ("9" * 5000 + "GiB", "(5,003 characters)"),
        ("1." + "9" * 5000 + "GiB", "(5,005 characters)"),
        ("8589934592GiB", "more than 8 EiB"),
    ],
)
def test_parse_size_refuses(text: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_size(text)
    err = info.value
    assert fragment in err.message
    assert "\n" not in err.message
    assert err.hint is not None and "24GiB" in err.hint


@pytest.mark.parametrize(
    ("text", "endpoint", "free"),
    [
        ("192.168.1.20:50052=24GiB", "192.168.1.20:50052", 24 * GiB),
        # llama.cpp reads the port with std::stoi (ggml-rpc.cpp parse_endpoint): leading zeros are decimal, a +
        # is a sign; it names the device by the endpoint's text (llama-server --list-devices: 127.0.0.1:050052)
        ("host:0050=512M", "host:0050", 512 * MiB),
        ("127.0.0.1:050052=8GiB", "127.0.0.1:050052", 8 * GiB),
        ("127.0.0.1:+50052=8GiB", "127.0.0.1:+50052", 8 * GiB),
        ("h:000000000000000000000000065535=1GiB", "h:000000000000000000000000065535", GiB),
    ],
)
def test_parse_rpc_host(text: str, endpoint: str, free: int) -> None:
    """--rpc HOST:PORT=SIZE is parsed on the command line; the planner gets RpcHost values."""
    assert parse_rpc_host(text) == hardware.RpcHost(endpoint, free)
    hw = hardware.rpc_hosts([parse_rpc_host(text)])
    assert [(g.name, g.free_bytes, g.rpc_endpoint) for g in hw.gpus] == [(f"RPC0[{endpoint}]", free, endpoint)]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("host:50052", "not HOST:PORT=SIZE"), ("host=8GiB", "not HOST:PORT=SIZE"), ("host:99999=8GiB", "not 1-65535"),
     (":50052=8GiB", "not HOST:PORT"), ("host:50052=8", "no unit"),
     # what llama.cpp would silently read as another port (std::stoi stops at text; htons keeps 16 bits)
     ("host:50052abc=8GiB", "'abc' after its digits"), ("host:65536=8GiB", "not 1-65535"),
     ("host:-15359=8GiB", "not 1-65535"), ("host:0=8GiB", "not 1-65535"), ("host:00000=8GiB", "not 1-65535"),
     ("host:" + "9" * 5000 + "=8GiB", "not 1-65535"), ("host:=8GiB", "not a number"), ("host:+=8GiB", "not a number"),
     ("host:５００５２=8GiB", "not a number"), ("host: 50052=8GiB", "not a number")],
)  # fmt: skip
def test_rpc_refused_with_exit_2(text: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvadvise.cli import main

    assert main(["hf", "Qwen/Qwen3-8B", "--rpc", text]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and err.startswith("kvadvise: error: Invalid value for '--rpc'")


# ------------------------------------------------------------------ start-up


def test_import_does_not_load_nvml_or_psutil() -> None:
    code = "import sys, kvadvise.planner.hardware; print('pynvml' in sys.modules, 'psutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/meminfo and /proc/driver/nvidia are Linux's")
def test_probe_without_a_driver_imports_neither_binding() -> None:
    """No NVIDIA driver: the plan starts without pynvml or psutil (~30 ms), and RAM is what psutil says."""
    code = (
        "import sys, json, kvadvise.planner.hardware as h; hw = h.probe(); "
        "loaded = ['pynvml' in sys.modules, 'psutil' in sys.modules]; import psutil; "
        "print(json.dumps([hw.ram_total_bytes, psutil.virtual_memory().total, list(hw.notes), *loaded]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    total, psutil_total, notes, nvml_loaded, psutil_loaded = json.loads(out)
    assert total == psutil_total
    assert not psutil_loaded
    if not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/dxg"):
        assert not nvml_loaded and any("no NVIDIA driver" in n for n in notes)


def test_meminfo_parse() -> None:
    text = (
        "MemTotal:       24683568 kB\nMemFree:         1000 kB\nMemAvailable:   23241800 kB\nHugePages_Total:       0\n"
    )
    assert hardware._meminfo(text) == (24683568 * 1024, 23241800 * 1024)


def test_hardware_types_are_frozen() -> None:
    hw = hardware.manual(GiB)
    with pytest.raises(AttributeError):
        hw.source = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        hw.gpus[0].total_bytes = 1  # type: ignore[misc]


def test_plain_4060_is_the_8gb_card() -> None:
    """Issue 14: `--gpu 4060` plans for the RTX 4060 8 GB (272 GB/s), not the 4060 Ti 16 GB."""
    hw = from_profile("4060")
    assert hw.gpus[0].total_bytes == 8 << 30 and hw.gpus[0].bandwidth_bytes_per_s == 272_000_000_000


# --- AMD cards through the amdgpu driver's sysfs ---------------------------------------------------


def _amd_card(
    root: Any, n: int, pci_id: str, vram: int, used: int, gtt: int | None = None, vendor: str = "0x1002"
) -> None:
    """A /sys/class/drm/cardN/device as the amdgpu driver writes it (values and newlines as in sysfs)."""
    dev = root / f"card{n}" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "device").write_text(pci_id + "\n")
    (dev / "mem_info_vram_total").write_text(f"{vram}\n")
    (dev / "mem_info_vram_used").write_text(f"{used}\n")
    if gtt is not None:
        (dev / "mem_info_gtt_total").write_text(f"{gtt}\n")
    (root / f"card{n}-DP-1").mkdir()  # a connector beside the card: not a card


def test_amd_gpus_are_read_from_sysfs(tmp_path: Any) -> None:
    """No NVML for AMD: the driver's VRAM figures, a profile by PCI id and VRAM (the 7900 XTX, XT and GRE
    share 0x744c), its bandwidth and backend; an unknown id keeps its VRAM and says the bandwidth is unknown;
    an NVIDIA card's sysfs entry (vendor 0x10de) and connectors are skipped."""
    _amd_card(tmp_path, 0, "0x744c", 24 * GiB, 2 * GiB)
    _amd_card(tmp_path, 1, "0x744c", 20 * GiB, 0)  # a 7900 XT: same id, no profile of its size
    _amd_card(tmp_path, 2, "0x2684", 24 * GiB, 0, vendor="0x10de")
    _amd_card(tmp_path, 3, "0x1586", 512 << 20, 0, gtt=62 * GiB)  # Strix Halo, 512 MiB carve-out
    hw = hardware.amd_hardware((64 * GiB, 32 * GiB), root=tmp_path)
    assert hw is not None and hw.source == "amdgpu" and len(hw.gpus) == 3
    xtx, xt, apu = hw.gpus
    assert (xtx.name, xtx.total_bytes, xtx.free_bytes, xtx.used_by_others_bytes) == (
        "Radeon RX 7900 XTX 24GB",
        24 * GiB,
        22 * GiB,
        2 * GiB,
    )
    assert xtx.bandwidth_bytes_per_s == 960_000_000_000 and xtx.backend == "rocm"
    assert xt.name == "AMD GPU (PCI 0x744c)" and xt.bandwidth_bytes_per_s is None and xt.backend == "rocm"
    assert apu.backend == "vulkan" and apu.total_bytes == 512 << 20 and apu.bandwidth_bytes_per_s == 256_000_000_000
    assert any("bandwidth unknown (PCI id 0x744c" in n for n in hw.notes)
    assert any("GTT" in n and "--vram" in n for n in hw.notes)
    assert hardware.amd_hardware((1, 1), root=tmp_path / "missing") is None


def test_probe_falls_back_to_amd_without_an_nvidia_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from kvadvise.planner import amdgpu

    _amd_card(tmp_path, 0, "0x7550", 16 * GiB, GiB)
    monkeypatch.setattr(hardware, "_no_nvidia_driver", lambda: True)
    monkeypatch.setattr(amdgpu, "SYSFS_DRM", tmp_path)
    monkeypatch.setattr(amdgpu.cards, "__defaults__", (tmp_path,))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    hw = hardware.probe()
    assert hw.source == "amdgpu" and hw.gpus[0].name == "Radeon RX 9070 XT 16GB" and hw.gpus[0].backend == "rocm"


# --- --device cuda|rocm|vulkan|metal where the probe found no GPU ---------------------------------------------


@pytest.mark.parametrize("device", ["cuda", "rocm", "vulkan"])
def test_a_gpu_device_asked_where_no_gpu_was_found_is_an_estimate_not_a_ram_budget(
    device: str, gemma_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--device rocm` on a machine whose probe found no GPU planned a "CUDA0" against the system RAM as its budget
    ("612.95 MiB of a 21.82 GiB budget (ram) -> FITS", -ngl 999) beside the note "planning for the CPU": a GPU
    budget nobody has. It is an estimate without a budget (as --no-hardware), its buffers named after the backend
    asked for, and the note says why; the API answers the same."""
    import kvadvise
    from kvadvise.cli import main

    monkeypatch.setattr(hardware, "probe", lambda: Hardware((), 16 << 30, 8 << 30, "none", ("no NVIDIA GPU found: x",)))
    args = ["llamacpp", str(gemma_path), "-c", "4096", "--device", device]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    name = {"cuda": "CUDA0", "rocm": "ROCm0", "vulkan": "Vulkan0"}[device]
    assert doc["fits"] is None and doc["budget"] is None, doc["budget"]
    assert [d["name"] for d in doc["memory"]["devices"]] == [name]
    assert any(f"--device {device}" in n and "no GPU found" in n for n in doc["notes"]), doc["notes"]
    assert not any("planning for the CPU" in n for n in doc["notes"])
    api = kvadvise.to_json(kvadvise.plan(str(gemma_path), kvadvise.PlanRequest(n_ctx=4096, device=device)))
    assert api["memory"] == doc["memory"] and api["notes"] == doc["notes"] and api["fits"] is None
    assert main([*args[:-2], "--device", "cpu", "--json"]) == 0  # the CPU is still planned against the RAM
    cpu = json.loads(capsys.readouterr().out)
    assert cpu["fits"] is True and cpu["budget"]["source"] == "ram"


@pytest.mark.parametrize("device", ["rocm", "vulkan"])
def test_no_hardware_names_the_buffers_after_the_backend_asked_for(
    device: str, gemma_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--no-hardware --device vulkan` printed CUDA0 (the names came only from a card's backend)."""
    from kvadvise.cli import main

    assert main(["llamacpp", str(gemma_path), "-c", "4096", "--device", device, "--no-hardware", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc["memory"]["devices"]] == [{"rocm": "ROCm0", "vulkan": "Vulkan0"}[device]]


@pytest.mark.parametrize("cards", ["rtx-4090,mi50", "mi50,rtx-4090"])
def test_nvidia_and_amd_cards_in_one_llama_cpp_process_are_refused_but_through_vulkan(
    cards: str, gemma_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gpu rtx-4090,mi50` was split over "CUDA0" and "CUDA1", or placed with `-dev ROCm1`: one llama.cpp build
    cannot hold CUDA and HIP (both compile ggml-cuda; built together, HIP's symbols win and CUDA's device is gone:
    ggml-org/llama.cpp#29048), and a process with both would name them CUDA0 and ROCm0. Refused (exit 2) unless
    --device vulkan runs both; the API refuses it the same."""
    import kvadvise
    from kvadvise.cli import main
    from kvadvise.errors import KvadviseError

    rc = main(["llamacpp", str(gemma_path), "--gpu", cards])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "CUDA" in err and "ROCm" in err and "--device vulkan" in err, err
    assert main(["llamacpp", str(gemma_path), "--gpu", cards, "--device", "vulkan", "--ram", "64GiB"]) == 0
    capsys.readouterr()
    with pytest.raises(KvadviseError) as e:
        kvadvise.plan(str(gemma_path), kvadvise.PlanRequest(gpu=cards, ram_bytes=64 << 30))
    assert e.value.exit_code == 2 and e.value.message in err


def test_one_rpc_server_written_two_ways_is_refused() -> None:
    """h:050052 and h:50052 are one rpc-server to the network (std::stoi reads both as 50052) but two endpoints to
    llama.cpp (ggml-rpc.cpp keys its connections by the text), so llama-server makes two devices of it, each
    planning its whole memory; kvadvise kept the text (the device names llama.cpp prints) and would have
    planned both: refused. The same text twice is one device (llama.cpp registers it once), as before."""
    with pytest.raises(InputError, match="are one rpc-server"):
        hardware.rpc_hosts([parse_rpc_host("h:050052=8GiB"), parse_rpc_host("h:+50052=8GiB")])
    assert len(hardware.rpc_hosts([parse_rpc_host("h:050052=8GiB"), parse_rpc_host("h:050052=8GiB")]).gpus) == 1
    assert len(hardware.rpc_hosts([parse_rpc_host("h:50052=8GiB"), parse_rpc_host("g:50052=8GiB")]).gpus) == 2
    # an RpcHost made by hand through the API, its port no number: planned by its text, as before
    assert len(hardware.rpc_hosts([hardware.RpcHost("h:x" + "9" * 5000, GiB), hardware.RpcHost("h:1", GiB)]).gpus) == 2
