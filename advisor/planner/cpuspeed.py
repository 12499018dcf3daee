"""This machine's CPU as the speed model sees it: its memory bandwidth (what the CPU's share of a
partial offload, or a CPU plan, reads the weights at) and its arithmetic peak (what a CPU plan's
prompt processing is bound by).

The bandwidth is measured once per machine, cheaply (about 0.1 s on a desktop), and kept in
$XDG_CACHE_HOME/kvadvise/ram-bandwidth.json, keyed by the CPU model, its logical CPUs and the RAM size;
``--ram-bandwidth GB/S`` gives it instead. It is a property of the machine, not of this minute's load:
on a busy machine the copies are timed by their own CPU time (:func:`measure_under_load`), and that figure
is replaced by a wall-clock one the first time the machine is quiet. Only plans that need the CPU's speed ask for it
(kvadvise.planner.speed, kvadvise.planner.prefill): never at start-up.

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
_LOADED_PASSES = 12  # on a busy machine: the lowest of these sums (see measure_under_load)
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
    return max(_copy_passes(copy_bytes, _REPEATS, own_time=False), default=0.0)


def measure_under_load(copy_bytes: int = _COPY_BYTES, passes: int = _LOADED_PASSES) -> float:
    """The bandwidth a copy gets while it runs, on a machine other work keeps busy: each thread's copy timed by
    its own CPU time (``time.thread_time``: not the time the scheduler gave other processes), the threads'
    rates added up, and the lowest sum of several passes kept (the pass whose threads ran most at once: a
    thread that ran alone would count the whole bus as its own). Measured on a 2-core VM: 17.2 to 17.5 GB/s
    with four CPU-bound and two copying processes beside it, where the wall-clock copy read 4 to 7 GB/s and
    the quiet machine 14 to 16."""
    return min(_copy_passes(copy_bytes, passes, own_time=True), default=0.0)


def _copy_passes(copy_bytes: int, passes: int, *, own_time: bool) -> list[float]:
    """Bytes per second of each of ``passes`` copies of ``copy_bytes`` split over the threads, after one that
    faults the pages in: the whole copy by the wall clock, or (``own_time``) each thread's by its own CPU
    time, the threads released together, their rates added up. A pass that measured nothing is left out."""
    n = max(1, min(os.cpu_count() or 1, _MAX_THREADS))
    per = max(1 << 20, copy_bytes // n)
    bufs = [(ctypes.create_string_buffer(per), ctypes.create_string_buffer(per)) for _ in range(n)]
    took = [0.0] * n
    start = threading.Barrier(n) if own_time else None

    def copy(i: int) -> None:
        src, dst = bufs[i]
        if start is not None:
            start.wait()
        t0 = time.thread_time()
        ctypes.memmove(dst, src, per)
        took[i] = time.thread_time() - t0

    def one_pass() -> float:
        threads = [threading.Thread(target=copy, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if own_time:
            return sum(2 * per / t for t in took if t > 0)
        return 2 * per * n / wall if wall > 0 else 0.0

    one_pass()  # the first pass faults the pages in
    return [r for r in (one_pass() for _ in range(passes)) if r > 0]


@cache
def measured_bandwidth() -> RamBandwidth:
    """This machine's figure, the same whatever this minute's load: from the cache when it was measured here
    before; else measured now, the wall-clock copy on a quiet machine, the copies' own time on a busy one
    (:func:`measure_under_load`), and kept. A figure measured under load is measured again, the wall-clock
    way, the first time the machine is quiet; a quiet figure is never replaced by a busy one."""
    key = _machine_key()
    path = cache_path()
    cached: dict[str, object] | None = None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") == FORMAT and doc.get("machine") == key and int(doc["bytes_per_s"]) > 0:
            cached = doc
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: measure again
    load = _busy()  # read before measuring: the copies themselves raise the load
    if cached is not None and (load is not None or not cached.get("under_load")):
        return RamBandwidth(int(str(cached["bytes_per_s"])), _said(cached, key, str(path)))
    when = time.strftime("%Y-%m-%d", time.gmtime())
    if load is not None:
        doc = {
            "format": FORMAT,
            "machine": key,
            "bytes_per_s": int(measure_under_load()),
            "measured_at": when,
            "method": "thread-time copy",
            "under_load": round(load, 2),
        }
    else:
        doc = {"format": FORMAT, "machine": key, "bytes_per_s": int(measure()), "measured_at": when}
        doc["method"] = "memmove copy"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_file(path, json.dumps(doc, indent=1) + "\n", force=True)
        where = str(path)
    except (OSError, KvadviseError):
        where = "not cached: the cache folder is not writable"
    return RamBandwidth(int(str(doc["bytes_per_s"])), _said(doc, key, where))


def _said(doc: dict[str, object], key: str, where: str) -> str:
    """Where the figure comes from, for the plan's notes and its JSON."""
    load = doc.get("under_load")
    how = f", the copies' own time: the machine was busy (load {load})" if load else ""
    return f"measured {doc.get('measured_at')} on {key}{how} ({where})"


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
