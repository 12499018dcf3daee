"""The hardware a plan is for: its GPUs and its RAM, this machine's or planned.

- :func:`probe`: this machine, through NVML (``pynvml``) and psutil (AMD: the amdgpu driver's sysfs);
- :func:`from_profile`, :func:`from_profiles`: cards of the catalogue (kvadvise.planner.gpus, ``--gpu NAME``);
- :func:`manual`, :func:`manual_many`: budgets given by hand (``--vram SIZE``);
- :func:`rpc_hosts`: hosts of llama.cpp's RPC backend (``--rpc HOST:PORT=SIZE``).

Sizes arrive as bytes: the command line parses what a person typed (kvadvise.ui.flags).

pynvml and psutil are imported inside the functions that need them, so that
importing this module (and starting kvadvise) stays fast.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvadvise.errors import InputError
from kvadvise.units import MAX_SIZE_BYTES, port_number

if TYPE_CHECKING:
    from kvadvise.planner.gpus import GpuProfile


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU: its memory (total and free now) and bandwidth."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int  # free now (NVML: already excludes what other processes hold)
    used_by_others_bytes: int  # held by other processes (0 when unknown or planned)
    bandwidth_bytes_per_s: int | None  # memory bandwidth, for the decode-speed estimate
    bandwidth_source: str | None  # where that figure comes from
    unified_memory: bool = False  # Apple silicon: GPU memory is a share of system RAM
    rpc_endpoint: str | None = None  # a host of llama.cpp's RPC backend (rpc-server at HOST:PORT)
    backend: str = "cuda"  # the ggml backend that runs it: cuda | rocm | vulkan | sycl | metal
    flops_per_s: float | None = None  # FP16 tensor peak, dense (profiles/gpus.json fp16_tflops): prompt speed
    flops_source: str | None = None
    # the profile's decode class (kvadvise.planner.speed.decode_key): "gcn", or "default" (a known card of its backend's
    # default class); "": a card not in profiles/gpus.json (--vram), its backend's default assumed
    speed_class: str = ""
    clock_hz: float = 0.0  # the profile's boost clock (decode's fixed time per layer scales with it); 0: unknown


@dataclass(frozen=True, slots=True)
class Hardware:
    """The machine a plan is for: its GPUs and its RAM, and where that came from."""

    gpus: tuple[Gpu, ...]
    ram_total_bytes: int
    ram_free_bytes: int
    source: str  # "nvml" | "amdgpu" | "profile:<name>" | "manual" | "none"
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # where a planned card's figures come from, one line each
    # system memory bandwidth given by hand (--ram-bandwidth); None: measured when a plan needs it
    # (kvadvise.planner.cpuspeed)
    ram_bandwidth_bytes_per_s: int | None = None
    ram_bandwidth_source: str = "--ram-bandwidth"  # where ram_bandwidth_bytes_per_s comes from, when given
    ram_source: str = "free now"  # where ram_free_bytes comes from: free now (MemAvailable), --ram, a Mac's memory
    # of ram_free_bytes, what the OS holds: a Mac of the card list, whose RAM is its whole memory
    # (kvadvise.planner.gpus.MACOS_BYTES; hostram leaves the runtime's process its share too); 0 where RAM is
    # what is free now or given
    ram_kept_bytes: int = 0

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


# the sources a probe of this machine gives (probe(): NVML, amdgpu's sysfs, or no GPU found): a Hardware of one
# of them is this machine, wherever it was made (the command's probe or the API's probe_hardware())
PROBED_SOURCES = frozenset({"nvml", "amdgpu", "none"})

GIB = 1 << 30
MIB = 1 << 20

_NO_GPU_HINT = "planning for the CPU, or pass --gpu NAME / --vram SIZE"


def _ram_now() -> tuple[int, int]:
    """(total, available) bytes of system RAM, within this process's memory cgroup: in a container of 2 GiB
    on a 64 GiB host, llama-server is killed past 2 GiB, whatever the host has free."""
    total, avail = _ram_host()
    limit = cgroup_memory()
    if limit is not None:
        cap, used = limit
        total, avail = min(total, cap), max(0, min(avail, cap - used))
    return total, avail


def _ram_host() -> tuple[int, int]:
    if "psutil" not in sys.modules and sys.platform == "linux":
        # what psutil reads too (MemTotal, MemAvailable), without its ~15 ms import on every plan
        with (
            contextlib.suppress(OSError, ValueError, KeyError),
            open("/proc/meminfo", encoding="ascii", errors="replace") as f,
        ):
            return _meminfo(f.read())
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


NO_LIMIT = 1 << 60  # cgroup v1 writes a page-rounded 2^63 for "no limit"


def cgroup_memory(root: str = "/") -> tuple[int, int] | None:
    """(limit, usage) bytes of this process's memory cgroup, the tightest limit up its hierarchy: cgroup v2
    (``memory.max``, ``memory.current``) or v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``), as
    /proc/self/cgroup names it (what docker --memory and systemd MemoryMax= set). None: no limit, or not Linux."""
    if sys.platform != "linux" and root == "/":
        return None
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2: 0::/path
            found = _tightest(os.path.join(root, "sys/fs/cgroup"), path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            found = _tightest(
                os.path.join(root, "sys/fs/cgroup/memory"), path, "memory.limit_in_bytes", "memory.usage_in_bytes"
            )
        else:
            continue
        if found is not None:
            return found
    return None


def _tightest(base: str, path: str, limit_file: str, usage_file: str) -> tuple[int, int] | None:
    best: tuple[int, int] | None = None
    parts = [p for p in path.split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):  # this cgroup and every parent: the smallest limit holds
        d = os.path.join(base, *parts[:depth])
        limit, usage = _read_int(os.path.join(d, limit_file)), _read_int(os.path.join(d, usage_file))
        if limit is not None and limit < NO_LIMIT and (best is None or limit < best[0]):
            best = (limit, usage or 0)
    return best


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None  # "max": none


def _meminfo(text: str) -> tuple[int, int]:
    kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    return kib["MemTotal"] * 1024, kib["MemAvailable"] * 1024


def _no_nvidia_driver() -> bool:
    """Linux without the NVIDIA kernel driver (nor WSL's GPU device): NVML cannot start there."""
    return sys.platform == "linux" and not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/dxg")


def compute_of(gpu: Gpu, p: GpuProfile | None) -> Gpu:
    """``gpu`` with its profile's compute figure (prompt processing) and decode class; as it is for an unknown card."""
    if p is None:
        return gpu
    gpu = replace(gpu, speed_class=p.speed_class or "default", clock_hz=p.clock_hz)
    if not p.fp16_tflops:
        return gpu
    return replace(gpu, flops_per_s=p.fp16_tflops * 1e12, flops_source=f"profiles/gpus.json {p.id} fp16_tflops")


def _fmt_gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def from_profile(name: str) -> Hardware:
    """Plan for a card you don't own: one GPU from profiles/gpus.json, nothing else running.

    NVIDIA cards use the total NVML reports when the profile knows it (a bit
    below the published size), and this machine's RAM. Apple silicon entries
    plan for the whole Mac: RAM is the unified memory, the GPU gets the share
    macOS lets it wire by default (kvadvise.planner.gpus.apple_gpu_share_bytes).
    """
    from kvadvise.planner.gpus import (
        APPLE_SHARE_LARGE,
        APPLE_SHARE_SMALL,
        APPLE_SHARE_THRESHOLD_BYTES,
        MACOS_BYTES,
        find_profile,
    )

    p = find_profile(name)
    usable = p.usable_bytes
    gpu = Gpu(
        index=0,
        name=p.name,
        total_bytes=usable,
        free_bytes=usable,
        used_by_others_bytes=0,
        bandwidth_bytes_per_s=p.bandwidth_bytes_per_s,
        bandwidth_source=p.source,
        unified_memory=p.unified_memory,
        backend=p.backend,
    )
    gpu = compute_of(gpu, p)
    sources: tuple[str, ...] = (f"card: {p.id} ({p.source})",)
    if p.unified_memory:
        ram_total = ram_free = p.memory_bytes
        num, den = APPLE_SHARE_SMALL if p.memory_bytes <= APPLE_SHARE_THRESHOLD_BYTES else APPLE_SHARE_LARGE
        notes: tuple[str, ...] = (
            # macOS's default GPU share (MTLDevice.recommendedMaxWorkingSetSize), one line of the answer
            f"the GPU gets {num}/{den} of {_fmt_gib(p.memory_bytes)} ({_fmt_gib(usable)}); "
            "`sudo sysctl iogpu.wired_limit_mb=N` raises it",
        )
    else:
        ram_total, ram_free = _ram_now()
        basis = (
            f"{usable // MIB:,} MiB as NVML reports it"
            if p.nvml_total_bytes is not None
            else f"{_fmt_gib(usable)} as published"
        )
        notes = ()
        sources = (f"card: {p.id}, {basis} ({p.source}), nothing else running",)
    return Hardware(
        gpus=(gpu,),
        ram_total_bytes=ram_total,
        ram_free_bytes=ram_free,
        source=f"profile:{p.id}",
        notes=notes,
        sources=sources,
        ram_source="unified memory" if p.unified_memory else "this machine's, free now",
        ram_kept_bytes=MACOS_BYTES if p.unified_memory else 0,  # a Mac's whole memory: macOS holds its share
        # a Mac's CPU cores read the same unified memory as its GPU: the chip's published bandwidth (an upper
        # bound for the CPU's share), not a measurement of the machine kvadvise runs on
        ram_bandwidth_bytes_per_s=p.bandwidth_bytes_per_s if p.unified_memory else None,
        ram_bandwidth_source=f"{p.name}'s unified memory, {p.bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({p.source})"
        if p.unified_memory
        else "--ram-bandwidth",
    )


_MULTI = r"(?i)^(.+?)\s*[x×]\s*([0-9]{1,9})$"  # compiled by re on first use
# A plan over several devices states its split (-ts), and common/arg.cpp's -ts refuses as many shares as
# llama_max_devices() (16, src/llama.cpp): "got %zu input configs, but system only has %zu devices"
MAX_DEVICES = 15


def from_profiles(names: str) -> Hardware:
    """Several cards you don't own: ``4090,3090`` (comma-separated), ``NAMExN`` for N of one card
    (``rtx-3090x2``). One name is :func:`from_profile`. llama.cpp splits the layers over them."""
    from kvadvise.planner.gpus import find_profile

    cards: list[Gpu] = []
    first: Hardware | None = None
    sources: dict[str, None] = {}  # each card's source once, in the order given
    for raw in (n.strip() for n in names.split(",")):
        if not raw:
            raise InputError(f"--gpu {names!r}: an empty card name", hint="e.g. --gpu rtx-4090,rtx-3090")
        count, base = 1, raw
        m = re.match(_MULTI, raw)
        if m is not None and not _known(raw):  # a profile whose own name ends in xN wins
            base, count = m[1], int(m[2])
        if not 1 <= count <= 16:
            swapped = re.match(r"(?i)^([0-9]{1,2})\s*[x×]\s*(.+)$", raw)  # 2x3090: the count first
            if not (_known(base) or (swapped and _known(swapped[2]))):
                find_profile(raw)  # "GTX 1080", "RX 6800", "RTX 4900": one card not in the list, not 1,080 of "GT"
            hint = f"the count goes last: --gpu {swapped[2]}x{swapped[1]}" if swapped else "1 to 15, e.g. rtx-3090x2"
            raise InputError(
                f"--gpu {raw!r}: read as {count:,} cards of {base!r}; NAMExN takes 1 to 15 cards, the count last",
                hint=hint,
            )
        hw = from_profile(base)
        first = first or hw
        sources.update(dict.fromkeys(hw.sources))
        cards.extend(hw.gpus[0] for _ in range(count))
    assert first is not None
    if len(cards) == 1:
        return first
    if len(cards) > MAX_DEVICES:
        raise InputError(
            f"--gpu {names!r}: {len(cards)} cards; llama-server's -ts takes at most {MAX_DEVICES} shares",
            hint=f"plan at most {MAX_DEVICES} cards",
        )
    if sum(c.unified_memory for c in cards) > 1:
        # one Apple chip is one machine: two are two Macs (llama.cpp's RPC between them, not one Metal process), and
        # their unified memory is each Mac's RAM as well
        raise InputError(
            f"--gpu {names!r}: several Apple chips are not one machine (each is its own Mac, its memory its RAM)",
            hint="plan one Mac at a time (kvadvise compare --gpu takes them as separate cards, comma-separated)",
        )
    if len({c.unified_memory for c in cards}) > 1:
        # one process runs one kind of machine: Apple's Metal GPUs are not in a PC with NVIDIA or AMD cards
        apple = next(c.name for c in cards if c.unified_memory)
        other = next(c.name for c in cards if not c.unified_memory)
        raise InputError(
            f"--gpu {names!r}: {apple} (Apple silicon, Metal) and {other} cannot run one llama.cpp process together",
            hint="plan the Mac and the PC apart (kvadvise compare --gpu takes both as separate cards)",
        )
    gpus = tuple(replace(g, index=i) for i, g in enumerate(cards))
    note = f"{len(gpus)} GPUs: " + ", ".join(g.name for g in gpus) + SPLIT_NOTE
    return replace(first, gpus=gpus, source=f"profiles:{names}", notes=(*first.notes, note), sources=tuple(sources))


def _known(name: str) -> bool:
    """Whether ``name`` is a card of the catalogue."""
    from kvadvise.planner.gpus import find_profile

    try:
        find_profile(name)
    except InputError:
        return False
    return True


SPLIT_NOTE = "; llama.cpp splits the layers across them"


def one_gpu(hw: Hardware, gpu: Gpu) -> Hardware:
    """The machine with only ``gpu`` for the model (llama.cpp -dev, Ollama's single-GPU placement): the note
    that the layers are split over several is no longer true."""
    return replace(hw, gpus=(gpu,), notes=tuple(n for n in hw.notes if not n.endswith(SPLIT_NOTE)))


@dataclass(frozen=True, slots=True)
class RpcHost:
    """A host of llama.cpp's RPC backend (``rpc-server`` at HOST:PORT) and the memory free on it."""

    endpoint: str  # HOST:PORT, as llama-server --rpc takes it
    free_bytes: int


def rpc_hosts(hosts: Sequence[RpcHost]) -> Hardware:
    """``--rpc HOST:PORT=SIZE``: hosts of llama.cpp's RPC backend (``rpc-server`` on each, ``llama-server
    --rpc HOST:PORT,...``), each a device with SIZE free; llama.cpp names each ``RPC0[HOST:PORT]``."""
    # llama.cpp registers an endpoint once (ggml/src/ggml-rpc/ggml-rpc.cpp ggml_backend_rpc_add_server keeps
    # a map by endpoint string; ggml-backend-reg.cpp register_backend skips a backend it has): one endpoint
    # given twice is one device, holding its share once
    unique: dict[str, RpcHost] = {}
    for h in hosts:
        seen = unique.setdefault(h.endpoint, h)
        if seen.free_bytes != h.free_bytes:
            raise InputError(
                f"--rpc {h.endpoint} is given twice with different sizes ({seen.free_bytes:,} and {h.free_bytes:,} bytes)",
                hint="llama-server makes one device of an endpoint given twice: give each host once",
            )
    # one rpc-server written two ways (h:050052 and h:50052: std::stoi reads both as 50052) is two endpoints to
    # llama.cpp, which keys them by their text: two devices on one server, each holding layers against the
    # whole of its memory
    servers: dict[tuple[str, int], str] = {}
    for endpoint in unique:
        host, _, port = endpoint.partition(":")
        number = port_number(port.lstrip("+") or "0")
        if number is None:  # an RpcHost the API made by hand
            continue
        other = servers.setdefault((host, number), endpoint)
        if other != endpoint:
            raise InputError(
                f"--rpc {other} and {endpoint} are one rpc-server (port {number}); llama-server would "
                "make two devices of it, each planning its whole memory",
                hint="give each rpc-server once",
            )
    if len(unique) > MAX_DEVICES:
        raise InputError(f"{len(unique)} RPC hosts; llama-server's -ts takes at most {MAX_DEVICES} shares")
    notes = [
        "RPC hosts: the layers run one host after another and every token's hidden state crosses the "
        "network between them (llama.cpp's RPC backend); the speed depends on that link",
    ]
    if len(unique) < len(hosts):
        twice = ", ".join(e for e in unique if sum(h.endpoint == e for h in hosts) > 1)
        notes.append(f"{twice}: given more than once; llama.cpp makes one device of it (planned once)")
    ram_total, ram_free = _ram_now()
    gpus = tuple(
        Gpu(i, f"RPC0[{h.endpoint}]", h.free_bytes, h.free_bytes, 0, None, None, rpc_endpoint=h.endpoint)
        for i, h in enumerate(unique.values())
    )
    return Hardware(gpus=gpus, ram_total_bytes=ram_total, ram_free_bytes=ram_free, source="rpc", notes=tuple(notes))


def with_ram(hw: Hardware, ram_bytes: int) -> Hardware:
    """``--ram SIZE``: the system RAM a plan may use, given by hand (the machine the plan is for, or what a
    container may hold), in place of what is free here now."""
    if ram_bytes <= 0:
        raise InputError(f"--ram must be positive, got {ram_bytes} bytes", hint="e.g. --ram 32GiB")
    if hw.ram_kept_bytes:  # a Mac of the card list: one memory for GPU and CPU
        if ram_bytes > hw.ram_total_bytes:
            raise InputError(
                f"--ram {ram_bytes / (1 << 30):.2f} GiB is more than the {hw.ram_total_bytes / (1 << 30):.0f} GiB of "
                "unified memory this Mac has in all (its GPU's share is of the same memory)",
                hint="leave --ram out (the chip's memory is planned), or give at most its size",
            )
        # --ram is what is free of its one memory, which its GPU's share is of too (the GPU holds no more than that,
        # less the runtime's process); the Mac's own size stays (macOS's wired limit follows it: the MLX runner)
        from kvadvise.planner.gpus import PROCESS_BYTES

        cap = max(0, ram_bytes - PROCESS_BYTES)
        gpus = tuple(replace(g, free_bytes=min(g.free_bytes, cap)) if g.unified_memory else g for g in hw.gpus)
        return replace(hw, gpus=gpus, ram_free_bytes=ram_bytes, ram_source="given with --ram", ram_kept_bytes=0)
    return replace(
        hw, ram_total_bytes=ram_bytes, ram_free_bytes=ram_bytes, ram_source="given with --ram", ram_kept_bytes=0
    )


def manual_many(sizes: Sequence[int], bandwidth_bytes_per_s: int | None = None) -> Hardware:
    """``--vram 24GiB,16GiB``: one GPU of each size, nothing else running; this machine's RAM."""
    if len(sizes) == 1:
        return manual(sizes[0], bandwidth_bytes_per_s)
    if len(sizes) > MAX_DEVICES:
        raise InputError(f"--vram: {len(sizes)} budgets; llama-server's -ts takes at most {MAX_DEVICES} shares")
    hws = [manual(s, bandwidth_bytes_per_s) for s in sizes]
    gpus = tuple(replace(h.gpus[0], index=i, name=f"manual budget {i}") for i, h in enumerate(hws))
    return replace(hws[0], gpus=gpus)


def manual(vram_bytes: int, bandwidth_bytes_per_s: int | None = None) -> Hardware:
    """One GPU of ``vram_bytes`` (``--vram SIZE``, ``--bandwidth GB/s``), nothing else running; this machine's RAM."""
    if vram_bytes <= 0:
        raise InputError(f"--vram must be positive, got {vram_bytes} bytes", hint="e.g. --vram 24GiB")
    ram_total, ram_free = _ram_now()
    gpu = Gpu(
        index=0,
        name="manual budget",
        total_bytes=vram_bytes,
        free_bytes=vram_bytes,
        used_by_others_bytes=0,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        bandwidth_source=None if bandwidth_bytes_per_s is None else "--bandwidth",
    )
    return Hardware(gpus=(gpu,), ram_total_bytes=ram_total, ram_free_bytes=ram_free, source="manual")


# ------------------------------------------------------------ this machine


def amd_hardware(ram: tuple[int, int], root: str | os.PathLike[str] | None = None) -> Hardware | None:
    """AMD GPUs through the amdgpu driver's sysfs (kvadvise.planner.amdgpu); None when there is none."""
    if sys.platform != "linux" and root is None:
        return None
    from kvadvise.planner import amdgpu

    found = amdgpu.cards(root) if root is not None else amdgpu.cards()
    if not found:
        return None
    from kvadvise.planner.gpus import match_amd

    gpus: list[Gpu] = []
    notes: list[str] = []
    for i, c in enumerate(found):
        p = match_amd(c.pci_id, c.vram_total_bytes)
        name = c.product_name or (p.name if p is not None else f"AMD GPU (PCI {c.pci_id})")
        if p is None:
            notes.append(f"GPU {i} ({name}): memory bandwidth unknown (PCI id {c.pci_id} not in profiles/gpus.json)")
        elif p.integrated and c.gtt_total_bytes:
            notes.append(
                f"GPU {i} ({name}): an APU, planned with its {_fmt_gib(c.vram_total_bytes)} VRAM carve-out; it can also "
                f"map {_fmt_gib(c.gtt_total_bytes)} of system RAM (GTT), which llama.cpp's Vulkan and ROCm builds "
                "may use: --vram SIZE plans for that"
            )
        gpus.append(
            compute_of(
                Gpu(
                    index=i,
                    name=name,
                    total_bytes=c.vram_total_bytes,
                    free_bytes=max(0, c.vram_total_bytes - c.vram_used_bytes),
                    used_by_others_bytes=c.vram_used_bytes,
                    bandwidth_bytes_per_s=None if p is None else p.bandwidth_bytes_per_s,
                    bandwidth_source=None if p is None else f"profile:{p.id} ({p.source})",
                    backend="rocm" if p is None else p.backend,
                ),
                p,
            )
        )
    if not gpus:
        return None
    notes.append("AMD GPUs read from the amdgpu driver (sysfs mem_info_vram_total / mem_info_vram_used)")
    return Hardware(
        gpus=tuple(gpus), ram_total_bytes=ram[0], ram_free_bytes=ram[1], source="amdgpu", notes=tuple(notes)
    )


def _none(reason: str, ram: tuple[int, int] | None = None) -> Hardware:
    ram_total, ram_free = ram if ram is not None else _ram_now()
    return Hardware(
        gpus=(),
        ram_total_bytes=ram_total,
        ram_free_bytes=ram_free,
        source="none",
        notes=(f"no NVIDIA GPU found: {reason}; {_NO_GPU_HINT}",),
    )


def _err_text(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # pynvml formats some errors through the library itself
        text = ""
    return text or type(err).__name__


def _decode(name: object) -> str:
    if isinstance(name, bytes):
        return name.decode("utf-8", errors="replace")
    return str(name)


def _processes(pynvml: Any, handle: object) -> tuple[dict[int, int], int] | None:
    """Device memory per process on one GPU (NVML's compute and graphics lists; a process in both is
    counted once) and what processes without a pid hold; None when NVML cannot list them."""
    per_pid: dict[int, int] = {}
    anonymous = 0
    listed = False
    for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(pynvml, fn_name, None)
        if fn is None:
            continue
        try:
            procs = fn(handle)
        except pynvml.NVMLError:
            continue
        listed = True
        for proc in procs or ():
            used = getattr(proc, "usedGpuMemory", None)
            used = int(used) if used is not None else 0  # None: not available (e.g. Windows WDDM)
            pid = getattr(proc, "pid", None)
            if isinstance(pid, int):
                per_pid[pid] = max(per_pid.get(pid, 0), used)
            else:
                anonymous += used
    return (per_pid, anonymous) if listed else None


def _used_by_others(pynvml: Any, handle: object) -> int | None:
    """Bytes held by other processes on this GPU; None when NVML cannot list them."""
    found = _processes(pynvml, handle)
    if found is None:
        return None
    per_pid, anonymous = found
    me = os.getpid()
    return anonymous + sum(used for pid, used in per_pid.items() if pid != me)


def gpu_memory_by_process() -> dict[int, int] | None:
    """Device memory each process holds, summed over this machine's NVIDIA GPUs (NVML's compute
    and graphics process lists); None without NVML, a driver or a GPU, or when it cannot list them."""
    if "pynvml" not in sys.modules and _no_nvidia_driver():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, OSError, pynvml.NVMLError: no binding, no driver or no GPU
        return None
    out: dict[int, int] = {}
    listed = False
    try:
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            found = _processes(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i))
            if found is None:
                continue
            listed = True
            for pid, used in found[0].items():
                out[pid] = out.get(pid, 0) + used
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out if listed else None


def probe() -> Hardware:
    """Every NVIDIA GPU of this machine through NVML (else every AMD one through the amdgpu driver's
    sysfs, :func:`amd_hardware`), and the system RAM through psutil.

    Never raises for a missing NVML: no Python binding, no driver or no GPU
    gives ``Hardware(gpus=(), source="none")`` with a note saying why. The
    memory bandwidth comes from profiles/gpus.json when the card is known
    (kvadvise.planner.gpus.match_nvml_name), else it is None.
    """
    ram = _ram_now()
    if "pynvml" not in sys.modules and _no_nvidia_driver():  # skip the binding's ~15 ms import
        return amd_hardware(ram) or _none("no NVIDIA driver (no /proc/driver/nvidia)", ram)
    try:
        import pynvml
    except ImportError:
        return _none("the NVML binding (nvidia-ml-py) is not installed", ram)

    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as err:
        return _none(f"NVML could not start ({_err_text(err)})", ram)

    from kvadvise.planner.gpus import match_nvml_name

    gpus: list[Gpu] = []
    notes: list[str] = []
    try:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            return _none(f"NVML could not count the GPUs ({_err_text(err)})", ram)
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = _decode(pynvml.nvmlDeviceGetName(handle))
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as err:
                notes.append(f"GPU {i}: NVML error ({_err_text(err)}); skipped")
                continue
            total, free, used = int(mem.total), int(mem.free), int(mem.used)
            others = _used_by_others(pynvml, handle)
            if others is None:
                others = used
                notes.append(f"GPU {i}: NVML cannot list its processes; counting all {used // MIB:,} MiB in use")
            profile = match_nvml_name(name, total)
            if profile is None:
                notes.append(f"GPU {i} ({name}): memory bandwidth unknown (not in profiles/gpus.json)")
            gpus.append(
                compute_of(
                    Gpu(
                        index=i,
                        name=name,
                        total_bytes=total,
                        free_bytes=free,
                        used_by_others_bytes=others,
                        bandwidth_bytes_per_s=None if profile is None else profile.bandwidth_bytes_per_s,
                        bandwidth_source=None if profile is None else f"profile:{profile.id} ({profile.source})",
                    ),
                    profile,
                )
            )
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    if not gpus:
        reason = "NVML reports no GPU" if not notes else "; ".join(notes)
        return _none(reason, ram)
    return Hardware(
        gpus=tuple(gpus),
        ram_total_bytes=ram[0],
        ram_free_bytes=ram[1],
        source="nvml",
        notes=tuple(notes),
    )


def check_hardware(hw: Hardware) -> str | None:
    """What is wrong with a Hardware made or changed by hand (the API takes one): gpus=None or a GPU named None
    ended in TypeError/AttributeError (exit 1); a negative free memory, or more free than there is, was planned.
    None when it holds; probe(), gpu_profile() and the flags' hardware hold by construction."""

    def size(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE_BYTES

    if not isinstance(hw.gpus, (tuple, list)):
        return f"gpus is {hw.gpus!r:.40}, not a tuple of Gpu"
    if len(hw.gpus) > MAX_DEVICES + 1:  # the GPUs and RPC hosts llama.cpp's -ts can share layers over
        return f"{len(hw.gpus)} GPUs; llama.cpp splits over at most {MAX_DEVICES + 1}"
    for i, g in enumerate(hw.gpus):
        if not isinstance(g, Gpu):
            return f"gpus[{i}] is {g!r:.40}, not a Gpu"
        if not isinstance(g.name, str) or not isinstance(g.backend, str):
            return f"gpus[{i}].name/backend is not text"
        if not isinstance(g.index, int) or isinstance(g.index, bool) or g.index < 0:
            return f"gpus[{i}].index is {g.index!r:.40}, not a whole number from 0"
        for name in ("total_bytes", "free_bytes", "used_by_others_bytes"):
            if not size(getattr(g, name)):
                return f"gpus[{i}].{name} is {getattr(g, name)!r:.40}, not a size in bytes from 0"
        if g.free_bytes > g.total_bytes:
            return f"gpus[{i}] has {g.free_bytes:,} bytes free of {g.total_bytes:,}"
        # the speed estimates divide by these (kvadvise.planner.speed): NaN, infinite or negative made NaN or
        # negative t/s, or no fixed time per layer at all
        rates = {"bandwidth_bytes_per_s": g.bandwidth_bytes_per_s or 0, "flops_per_s": g.flops_per_s or 0}
        for name, v in (*rates.items(), ("clock_hz", g.clock_hz)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                return f"gpus[{i}].{name} is {v!r:.40}, not a finite number from 0"
    for name in ("ram_total_bytes", "ram_free_bytes"):
        if not size(getattr(hw, name)):
            return f"{name} is {getattr(hw, name)!r:.40}, not a size in bytes from 0"
    return None
