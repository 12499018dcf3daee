"""What the machine has: GPUs (NVML), system RAM (psutil), or a card planned for.

- :func:`probe`: this machine, through NVML (``pynvml``) and psutil;
- :func:`from_profile`: a card from profiles/gpus.json (``--gpu NAME``);
- :func:`manual`: a bare memory budget (``--vram SIZE``, see :func:`parse_size`).

pynvml and psutil are imported inside the functions that need them, so that
importing this module (and starting kvadvise) stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from kvadvise.errors import InputError


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


@dataclass(frozen=True, slots=True)
class Hardware:
    """The machine a plan is for: its GPUs and its RAM, and where that came from."""

    gpus: tuple[Gpu, ...]
    ram_total_bytes: int
    ram_free_bytes: int
    source: str  # "nvml" | "amdgpu" | "profile:<name>" | "manual" | "none"
    notes: tuple[str, ...] = ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


GIB = 1 << 30
MIB = 1 << 20

_NO_GPU_HINT = "planning for the CPU, or pass --gpu NAME / --vram SIZE"

# Apple silicon: how much of the unified memory the GPU may wire by default
# (Metal's MTLDevice.recommendedMaxWorkingSetSize, with ``sysctl
# iogpu.wired_limit_mb`` left at 0). The rule is the one Ollama used before it
# read the value from Metal: <= 36 GiB of RAM -> 2/3, above -> 3/4
# (https://github.com/ollama/ollama/blob/08f1e18965c15648504fc5ec367134898e92ec6d/gpu/gpu_darwin.go).
# llama.cpp logs agree: 16 GB -> 10922.67 MB, 32 GB -> 21845.34 MB (2/3),
# 96 GB -> 73728 MB (3/4). It is conservative: a 36 GB M3 Pro was seen at
# 28991 MB (ollama#2370), and newer macOS allows more on 128 GB machines.
# profiles/gpus.json ("apple_gpu_share") keeps the sources and caveats.
APPLE_SHARE_THRESHOLD_BYTES = 36 * GIB
APPLE_SHARE_SMALL = (2, 3)
APPLE_SHARE_LARGE = (3, 4)


def apple_gpu_share_bytes(ram_bytes: int) -> int:
    """Bytes of unified memory the GPU of an Apple silicon Mac may use by default."""
    num, den = APPLE_SHARE_SMALL if ram_bytes <= APPLE_SHARE_THRESHOLD_BYTES else APPLE_SHARE_LARGE
    return ram_bytes * num // den


# ----------------------------------------------------------------- profiles


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One entry of profiles/gpus.json."""

    id: str
    name: str
    vendor: str
    aliases: tuple[str, ...]
    nvml_names: tuple[str, ...]
    memory_bytes: int  # the published size (Apple: the whole unified RAM)
    nvml_total_bytes: int | None  # what NVML reports as total, when known
    bandwidth_bytes_per_s: int
    unified_memory: bool
    source: str
    backend: str = "cuda"  # cuda (NVIDIA), metal (Apple), rocm (AMD), vulkan, sycl (Intel)
    pci_ids: tuple[str, ...] = ()  # AMD cards: the PCI device ids the driver reports (amdgpu sysfs)
    integrated: bool = False  # an APU: its VRAM is a carve-out of system RAM, of any size

    @property
    def usable_bytes(self) -> int:
        """What a plan may use: NVML's total when known, Apple's GPU share, else the published size."""
        if self.unified_memory:
            return apple_gpu_share_bytes(self.memory_bytes)
        return self.nvml_total_bytes if self.nvml_total_bytes is not None else self.memory_bytes


def _profile_from_json(entry: dict[str, Any]) -> GpuProfile:
    nvml_total = entry.get("nvml_total_bytes")
    return GpuProfile(
        id=str(entry["id"]),
        name=str(entry["name"]),
        vendor=str(entry["vendor"]),
        aliases=tuple(str(a) for a in entry.get("aliases", ())),
        nvml_names=tuple(str(n) for n in entry.get("nvml_names", ())),
        memory_bytes=int(entry["memory_bytes"]),
        nvml_total_bytes=None if nvml_total is None else int(nvml_total),
        bandwidth_bytes_per_s=int(entry["bandwidth_bytes_per_s"]),
        unified_memory=bool(entry.get("unified_memory", False)),
        source=str(entry["source"]),
        backend=str(entry.get("backend") or ("metal" if entry["vendor"] == "apple" else "cuda")),
        pci_ids=tuple(str(i).lower() for i in entry.get("pci_ids", ())),
        integrated=bool(entry.get("integrated", False)),
    )


@lru_cache(maxsize=1)
def load_profiles() -> tuple[GpuProfile, ...]:
    """Every GPU of profiles/gpus.json, in file order (read once)."""
    from kvadvise.profiles import read_text

    text = read_text("gpus.json")
    data = json.loads(text)
    return tuple(_profile_from_json(e) for e in data["gpus"])


def list_profiles() -> list[tuple[str, str]]:
    """(id, display name) of every GPU profile, in file order."""
    return [(p.id, p.name) for p in load_profiles()]


# Name matching works on tokens: lower case, split on anything not a letter or
# digit and between letters and digits ("RTX4090" -> rtx 4090, "a100-80gb" ->
# a 100 80 gb). Vendor words carry no information.
_STOPWORDS = frozenset({"nvidia", "geforce", "tesla", "apple", "gpu"})
_TOKEN_ALIASES = {"gib": "gb"}
# A profile with one of these tokens is a different card from the one without
# it (RTX 4060 vs 4060 Ti, M3 vs M3 Pro): it only matches a query that says so.
_VARIANT_TOKENS = frozenset({"ti", "super", "pro", "max", "ultra"})


def _tokens(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for run in re.findall(r"[a-z0-9]+", text.lower()):
        for tok in re.findall(r"[a-z]+|[0-9]+", run):
            tok = _TOKEN_ALIASES.get(tok, tok)
            if tok not in _STOPWORDS:
                out.append(tok)
    return tuple(out)


def _spellings(p: GpuProfile) -> Iterable[tuple[str, ...]]:
    yield _tokens(p.id)
    yield _tokens(p.name)
    for a in p.aliases:
        yield _tokens(a)


def _match_profiles(query: str) -> tuple[list[GpuProfile], list[GpuProfile]]:
    """(matches, loose candidates): exact spelling first, then token subsets."""
    q = _tokens(query)
    profiles = load_profiles()
    if not q:
        return [], []
    exact = [p for p in profiles if any(s == q for s in _spellings(p))]
    if exact:
        return exact, exact
    qs = set(q)
    loose = [p for p in profiles if any(qs <= set(s) for s in _spellings(p))]
    strict = [p for p in loose if not ((set(_tokens(p.id)) & _VARIANT_TOKENS) - qs)]
    return strict, loose


def _close_names(query: str, loose: Sequence[GpuProfile]) -> list[str]:
    if loose:  # every query token is there, a variant word is missing (4060 -> 4060 Ti)
        return [p.id for p in loose][:8]
    from difflib import get_close_matches

    ids = [p.id for p in load_profiles()]
    return get_close_matches(query.lower().strip(), ids, n=5, cutoff=0.6)


def find_profile(name: str) -> GpuProfile:
    """The one profile ``name`` designates (forgiving), or InputError."""
    matches, loose = _match_profiles(name)
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        ids = ", ".join(p.id for p in matches)
        raise InputError(
            f"GPU profile {name!r} is ambiguous: it matches {ids}",
            hint="pass one of those ids, e.g. --gpu " + matches[0].id,
        )
    close = _close_names(name, loose)
    msg = f"unknown GPU profile {name!r}"
    if close:
        msg += f"; did you mean {', '.join(close)}?"
    raise InputError(
        msg,
        hint="`kvadvise gpus` lists the known cards; or pass --vram SIZE",
    )


def _ram_now() -> tuple[int, int]:
    """(total, available) bytes of system RAM."""
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


def _meminfo(text: str) -> tuple[int, int]:
    kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    return kib["MemTotal"] * 1024, kib["MemAvailable"] * 1024


def _no_nvidia_driver() -> bool:
    """Linux without the NVIDIA kernel driver (nor WSL's GPU device): NVML cannot start there."""
    return sys.platform == "linux" and not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/dxg")


def _fmt_gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def from_profile(name: str) -> Hardware:
    """Plan for a card you don't own: one GPU from profiles/gpus.json, nothing else running.

    NVIDIA cards use the total NVML reports when the profile knows it (a bit
    below the published size), and this machine's RAM. Apple silicon entries
    plan for the whole Mac: RAM is the unified memory, the GPU gets the share
    macOS lets it wire by default (:func:`apple_gpu_share_bytes`).
    """
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
    if p.unified_memory:
        ram_total = ram_free = p.memory_bytes
        num, den = APPLE_SHARE_SMALL if p.memory_bytes <= APPLE_SHARE_THRESHOLD_BYTES else APPLE_SHARE_LARGE
        notes: tuple[str, ...] = (
            f"{p.name}: unified memory; the GPU may use {num}/{den} of {_fmt_gib(p.memory_bytes)} = {_fmt_gib(usable)} "
            "by default (macOS recommendedMaxWorkingSetSize); `sudo sysctl iogpu.wired_limit_mb=N` raises it",
        )
    else:
        ram_total, ram_free = _ram_now()
        basis = (
            f"{usable // MIB:,} MiB as NVML reports it"
            if p.nvml_total_bytes is not None
            else f"{_fmt_gib(usable)} as published"
        )
        notes = (f"planned for {p.name}: {basis}, nothing else running; system RAM is this machine's",)
    return Hardware(
        gpus=(gpu,),
        ram_total_bytes=ram_total,
        ram_free_bytes=ram_free,
        source=f"profile:{p.id}",
        notes=notes,
    )


_MULTI = r"(?i)^(.+?)\s*[x×]\s*(\d+)$"  # compiled by re on first use


def from_profiles(names: str) -> Hardware:
    """Several cards you don't own: ``4090,3090`` (comma-separated), ``NAMExN`` for N of one card
    (``rtx-3090x2``). One name is :func:`from_profile`. llama.cpp splits the layers over them."""
    cards: list[Gpu] = []
    first: Hardware | None = None
    for raw in (n.strip() for n in names.split(",")):
        if not raw:
            raise InputError(f"--gpu {names!r}: an empty card name", hint="e.g. --gpu rtx-4090,rtx-3090")
        count, base = 1, raw
        m = re.match(_MULTI, raw)
        if m is not None:
            try:
                find_profile(raw)  # a profile whose own name ends in xN wins
            except InputError:
                base, count = m[1], int(m[2])
        if not 1 <= count <= 16:
            raise InputError(f"--gpu {raw!r}: {count} cards", hint="1 to 16 cards, e.g. rtx-3090x2")
        hw = from_profile(base)
        first = first or hw
        cards.extend(hw.gpus[0] for _ in range(count))
    assert first is not None
    if len(cards) == 1:
        return first
    gpus = tuple(replace(g, index=i) for i, g in enumerate(cards))
    note = f"{len(gpus)} GPUs: " + ", ".join(g.name for g in gpus) + "; llama.cpp splits the layers across them"
    return replace(first, gpus=gpus, source=f"profiles:{names}", notes=(*first.notes, note))


def rpc_hosts(specs: Sequence[str]) -> Hardware:
    """``--rpc HOST:PORT=SIZE``: hosts of llama.cpp's RPC backend (``rpc-server`` on each, ``llama-server
    --rpc HOST:PORT,...``), each a device with SIZE free; llama.cpp names each ``RPC0[HOST:PORT]``."""
    ram_total, ram_free = _ram_now()
    gpus = []
    for i, raw in enumerate(specs):
        endpoint, sep, size = raw.partition("=")
        host, colon, port = endpoint.strip().rpartition(":")
        if not sep or not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise InputError(f"--rpc {raw!r}: not HOST:PORT=SIZE", hint="e.g. --rpc 192.168.1.20:50052=24GiB")
        n = parse_size(size)
        ep = f"{host}:{int(port)}"
        gpus.append(Gpu(i, f"RPC0[{ep}]", n, n, 0, None, None, rpc_endpoint=ep))
    return Hardware(
        gpus=tuple(gpus),
        ram_total_bytes=ram_total,
        ram_free_bytes=ram_free,
        source="rpc",
        notes=(
            "RPC hosts: the layers run one host after another and every token's hidden state crosses the "
            "network between them (llama.cpp's RPC backend); the speed depends on that link",
        ),
    )


def manual_many(sizes: Sequence[int], bandwidth_bytes_per_s: int | None = None) -> Hardware:
    """``--vram 24GiB,16GiB``: one GPU of each size, nothing else running; this machine's RAM."""
    if len(sizes) == 1:
        return manual(sizes[0], bandwidth_bytes_per_s)
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


# --------------------------------------------------------------------- NVML


def match_nvml_name(nvml_name: str, total_bytes: int | None = None) -> GpuProfile | None:
    """The profile of a GPU as NVML names it, or None when unsure.

    Safe rather than clever: the name's tokens must equal those of the
    profile's name or one of its NVML names ("NVIDIA GeForce RTX 4090" ->
    rtx-4090, but "RTX 4090 D" or "RTX 4090 Laptop GPU" match nothing), and
    when both totals are known they must agree within 5% (the 8 GB RTX 3060
    has NVML's name of the 12 GB one and another bandwidth).
    """
    q = _tokens(nvml_name)
    if not q:
        return None
    found: list[GpuProfile] = []
    for p in load_profiles():
        if p.unified_memory:
            continue
        spellings = [_tokens(p.name), *(_tokens(n) for n in p.nvml_names)]
        if not any(set(s) == set(q) for s in spellings):
            continue
        if total_bytes is not None:
            ref = p.nvml_total_bytes if p.nvml_total_bytes is not None else p.memory_bytes
            if abs(total_bytes - ref) > ref * 0.05:
                continue
        found.append(p)
    if not found:
        return None
    if len({p.bandwidth_bytes_per_s for p in found}) == 1:
        return found[0]
    return None


def match_amd(pci_id: str, vram_bytes: int) -> GpuProfile | None:
    """The profile of an AMD card by its PCI id and, for a discrete card, its VRAM within 5 % (one id can
    stand for cards of several sizes: the RX 7900 XTX, XT and GRE are all 0x744c); None when unsure."""
    found = {
        p.id: p
        for p in load_profiles()
        if p.vendor == "amd"
        and pci_id.lower() in p.pci_ids
        and (p.integrated or abs(vram_bytes - p.memory_bytes) <= 0.05 * p.memory_bytes)
    }
    return next(iter(found.values())) if len(found) == 1 else None


def amd_hardware(ram: tuple[int, int], root: str | os.PathLike[str] | None = None) -> Hardware | None:
    """AMD GPUs through the amdgpu driver's sysfs (kvadvise.planner.amdgpu); None when there is none."""
    if sys.platform != "linux" and root is None:
        return None
    from kvadvise.planner import amdgpu

    found = amdgpu.cards(root) if root is not None else amdgpu.cards()
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
            Gpu(
                index=i,
                name=name,
                total_bytes=c.vram_total_bytes,
                free_bytes=max(0, c.vram_total_bytes - c.vram_used_bytes),
                used_by_others_bytes=c.vram_used_bytes,
                bandwidth_bytes_per_s=None if p is None else p.bandwidth_bytes_per_s,
                bandwidth_source=None if p is None else f"profile:{p.id} ({p.source})",
                backend="rocm" if p is None else p.backend,
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
    (:func:`match_nvml_name`), else it is None.
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
                Gpu(
                    index=i,
                    name=name,
                    total_bytes=total,
                    free_bytes=free,
                    used_by_others_bytes=others,
                    bandwidth_bytes_per_s=None if profile is None else profile.bandwidth_bytes_per_s,
                    bandwidth_source=None if profile is None else f"profile:{profile.id} ({profile.source})",
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


# -------------------------------------------------------------------- sizes

_SIZE_RE = r"(?ia)^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$"  # compiled by re on first use
_UNITS: dict[str, int] = {
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    # a bare letter is binary, as in docker --memory 512m or llama.cpp's 24G cards
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
}
_SIZE_HINT = "write a number and a unit, e.g. 24GiB, 24000MiB, 23.5GiB or 24GB (GiB/MiB/KiB binary, GB/MB/KB decimal)"


def parse_size(text: str, *, allow_zero: bool = False) -> int:
    """A memory size given by a person -> bytes.

    - ``KiB MiB GiB TiB`` are binary (1024-based), ``KB MB GB TB`` decimal
      (1000-based), as the IEC/SI prefixes say; ``24GB`` is therefore 24e9
      bytes, a little under a 24 GiB card: the safe side.
    - a bare letter ``K M G T`` is binary (``512M`` = 512 MiB), like docker and
      most command-line tools; ``B`` is bytes.
    - units are case-insensitive; a space before the unit is allowed;
      decimals are allowed (``23.5GiB``) and rounded to the nearest byte.
    - a bare number is refused: ``--vram 24`` would be 24 bytes or 24 GB
      depending on who reads it. Write ``24GiB`` (or ``25769803776B``).
    - the size must be positive (``allow_zero``: or 0, e.g. a margin, as llama.cpp's ``-fitt 0``).

    Bad input raises InputError with a one-line message and a hint.
    """
    m = re.match(_SIZE_RE, text)
    if m is None:
        raise InputError(f"not a size: {text!r}", hint=_SIZE_HINT)
    number, unit = m.group(1), m.group(2).lower()
    if not unit and allow_zero and float(number) == 0:
        return 0  # zero needs no unit
    if not unit:
        raise InputError(f"size {text.strip()!r} has no unit", hint=_SIZE_HINT)
    if unit not in _UNITS:
        raise InputError(f"unknown size unit {m.group(2)!r} in {text.strip()!r}", hint=_SIZE_HINT)
    if number.isdigit():  # the common case; decimal is imported only for a fraction
        n = int(number) * _UNITS[unit]
    else:
        from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

        try:
            value = Decimal(number) * _UNITS[unit]
        except InvalidOperation as err:  # pragma: no cover - the regex only lets digits through
            raise InputError(f"not a size: {text!r}", hint=_SIZE_HINT) from err
        n = int(value.to_integral_value(rounding=ROUND_HALF_UP))
    if n < 0 or (n == 0 and not allow_zero):
        raise InputError(f"size {text.strip()!r} must be more than 0 bytes", hint=_SIZE_HINT)
    return n
