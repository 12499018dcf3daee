"""This machine's CPU as the speed model sees it: its memory bandwidth (what the CPU's share of a
partial offload, or a CPU plan, reads the weights at) and its arithmetic peak (what a CPU plan's
prompt processing is bound by).

The bandwidth is measured once per machine, cheaply (about 0.1 s on a desktop), and kept in
$XDG_CACHE_HOME/kvadvise/ram-bandwidth.json, keyed by the CPU model, its logical CPUs and the RAM size;
``--ram-bandwidth GB/S`` gives it instead. Only plans that need the CPU's speed ask for it
(kvadvise.planner.speed): never at start-up.

The measurement copies buffers larger than a desktop's last-level cache with ``memmove`` on several
threads at once (ctypes releases the GIL for a foreign call, so the copies run in parallel, as
llama.cpp's threads read the weights) and counts the bytes read and written per second: a copy's
sustained bandwidth, what STREAM calls "Copy". The speed model's CPU efficiencies are relative to that
figure; a module's rated peak (MT/s x 8 bytes x channels) is higher, typically by a third.

The arithmetic peak is read, not measured: physical cores x clock x the FP32 operations per cycle
of the widest vector unit /proc/cpuinfo lists (two FMA pipes: AVX-512 64, AVX2 32, NEON/ASIMD 16).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvadvise.errors import KvadviseError
from kvadvise.files import write_text_file

FORMAT = 1
# per copy, split over the threads: source and destination together (64 MiB) are above a desktop's L3,
# and small enough that faulting the pages in stays short
_COPY_BYTES = 32 << 20
_MAX_THREADS = 8  # two channels saturate with a few cores; more threads only cost start-up time
_REPEATS = 3  # the best of these (another process may compete for memory at the time)
# FP32 operations per cycle and core: two FMA pipes of the vector width (x2 for the multiply-add)
_FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("asimd", 16), ("neon", 16))
_DEFAULT_FLOPS_PER_CYCLE = 16
_DEFAULT_GHZ = 3.0  # when /proc/cpuinfo gives no clock (a VM may not)


@dataclass(frozen=True, slots=True)
class RamBandwidth:
    """The system memory's sustained bandwidth and where the figure comes from."""

    bytes_per_s: int
    source: str  # "--ram-bandwidth", "measured 2026-12-05 (...)", ...


@dataclass(frozen=True, slots=True)
class CpuFlops:
    """The CPU's FP32 vector peak and how it was derived."""

    flops_per_s: float
    source: str


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvadvise" / "ram-bandwidth.json"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (lower-case keys); {} where there is none."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                key, _, value = line.partition(":")
                out.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return out


def _model(info: dict[str, str]) -> str:
    for k in ("model name", "hardware", "cpu model"):
        if info.get(k):
            return info[k]
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def _machine_key() -> str:
    """What the figure belongs to: the CPU model, its logical CPUs and the RAM size."""
    ram = 0
    with contextlib.suppress(ValueError, OSError, AttributeError):
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{_model(_cpuinfo())} / {os.cpu_count() or 1} CPUs / {ram >> 30} GiB"


def measure(copy_bytes: int = _COPY_BYTES) -> float:
    """Bytes per second a multi-threaded ``memmove`` reaches (read + write), best of a few copies."""
    n = max(1, min(os.cpu_count() or 1, _MAX_THREADS))
    per = max(1 << 20, copy_bytes // n)
    bufs = [(ctypes.create_string_buffer(per), ctypes.create_string_buffer(per)) for _ in range(n)]

    def copy(i: int) -> None:
        src, dst = bufs[i]
        ctypes.memmove(dst, src, per)

    def timed() -> float:
        threads = [threading.Thread(target=copy, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    timed()  # the first pass faults the pages in
    best = min(timed() for _ in range(_REPEATS))
    return 2 * per * n / best if best > 0 else 0.0


@cache
def measured_bandwidth() -> RamBandwidth:
    """This machine's figure: from the cache when it was measured here before, else measured now and kept."""
    key = _machine_key()
    path = cache_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") == FORMAT and doc.get("machine") == key and int(doc["bytes_per_s"]) > 0:
            return RamBandwidth(int(doc["bytes_per_s"]), f"measured {doc['measured_at']} on {key} ({path})")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: measure again
    load = _busy()  # read before measuring: the copies themselves raise the load
    bps = int(measure())
    when = time.strftime("%Y-%m-%d", time.gmtime())
    if load is not None:  # other work shared the memory bus: a figure for now, not for every later plan
        return RamBandwidth(
            bps,
            f"measured {when} on {key} while the machine was busy (load {load:.1f}): not kept, measured again "
            "next time; --ram-bandwidth GB/S gives it",
        )
    doc = {"format": FORMAT, "machine": key, "bytes_per_s": bps, "measured_at": when, "method": "memmove copy"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_file(path, json.dumps(doc, indent=1) + "\n", force=True)
        where = str(path)
    except (OSError, KvadviseError):
        where = "not cached: the cache folder is not writable"
    return RamBandwidth(bps, f"measured {when} on {key} ({where})")


def _busy() -> float | None:
    """The 1-minute load average when it is above the logical CPUs (the machine is busy: a copy then measures
    a share of the bandwidth, not what the model will get), else None; None where there is no load average."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    return load if load > (os.cpu_count() or 1) else None


def _physical_cores(info: dict[str, str]) -> int:
    logical = os.cpu_count() or 1
    try:
        cores, siblings = int(info["cpu cores"]), int(info["siblings"])
        return max(1, logical * cores // siblings) if siblings else logical
    except (KeyError, ValueError):
        return logical


def _ghz(info: dict[str, str]) -> tuple[float, str]:
    try:
        khz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text().strip())
        return khz / 1e6, "cpufreq maximum"
    except (OSError, ValueError):
        pass
    try:
        return float(info["cpu mhz"]) / 1000, "cpu MHz now"
    except (KeyError, ValueError):
        return _DEFAULT_GHZ, f"clock unknown, {_DEFAULT_GHZ} GHz assumed"


@cache
def cpu_flops() -> CpuFlops:
    """This machine's FP32 vector peak: physical cores x clock x operations per cycle (see module doc)."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("features") or "").split())
    per_cycle = next((n for f, n in _FLOPS_PER_CYCLE if f in flags), _DEFAULT_FLOPS_PER_CYCLE)
    isa = next((f for f, _ in _FLOPS_PER_CYCLE if f in flags), "no vector flag found")
    cores = _physical_cores(info)
    ghz, basis = _ghz(info)
    flops = cores * ghz * 1e9 * per_cycle
    return CpuFlops(flops, f"{cores} cores x {ghz:.2f} GHz ({basis}) x {per_cycle} FLOP/cycle ({isa})")
