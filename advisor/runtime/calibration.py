"""Calibration: what `verify --save-calibration` measured on this machine.

Stored per device and llama.cpp build in the user's data dir
($XDG_DATA_HOME/kvadvise/calibration.json, default ~/.local/share), with
provenance (model, config, date). Later plans for the same device use the
measured overhead (device memory in use beyond llama.cpp's own buffers: the
CUDA context, cuBLAS workspace, pools) instead of the default, and say so.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.files import write_text_file
from kvadvise.runtime.verification import Verification

if TYPE_CHECKING:
    from kvadvise.planner.planning import MeasuredOverhead

FORMAT = 1
# A CUDA context with cuBLAS is a few hundred MiB; more than this is a measurement gone wrong
# (another process loading at the same time), not an overhead to plan with.
MAX_OVERHEAD_BYTES = 16 << 30


@dataclass(frozen=True, slots=True)
class Calibration:
    """A measured correction for one device, build and runner, saved by `verify --save-calibration`."""

    device: str  # the GPU's name as NVML reports it, or "CPU"
    llama_cpp_build: str
    runner: str
    overhead_bytes: int | None  # device memory used beyond the buffers llama.cpp printed; None on CPU
    compute_ratio: float  # measured / predicted compute buffer
    model: str
    config: str
    measured_at: str  # UTC, ISO 8601


def path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "kvadvise" / "calibration.json"


@dataclass(frozen=True, slots=True)
class Loaded:
    """The usable entries of the calibration file, and why any were skipped."""

    entries: tuple[Calibration, ...]
    notes: tuple[str, ...] = ()


def load() -> Loaded:
    """Every valid entry; a bad file or entry is skipped with a note, never an error that stops a plan."""
    from kvadvise.files import load_json, read_regular_text

    p = path()
    if not p.exists():
        return Loaded(())
    try:
        doc = load_json(read_regular_text(p, max_bytes=4 << 20))
    except (OSError, ValueError, InputError) as e:
        return Loaded((), (f"{p}: unreadable calibration file, ignored ({_reason(e)}); `kvadvise calibration clear`",))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        return Loaded(
            (),
            (
                f"{p}: calibration format {doc.get('format') if isinstance(doc, dict) else '?'!r} "
                f"is not {FORMAT}, ignored; `kvadvise calibration clear`",
            ),
        )
    good: list[Calibration] = []
    bad = 0
    for item in doc["entries"]:
        c = _entry(item)
        if c is None:
            bad += 1
        else:
            good.append(c)
    notes = (f"{p}: {bad} calibration entr{'y' if bad == 1 else 'ies'} malformed, ignored",) if bad else ()
    return Loaded(tuple(good), notes)


def _reason(e: BaseException) -> str:
    return e.message if isinstance(e, InputError) else str(e)


def _entry(e: object) -> Calibration | None:
    """One entry, checked field by field; None when any field is missing, of the wrong kind or absurd."""
    if not isinstance(e, dict):
        return None
    strings = ("device", "llama_cpp_build", "runner", "model", "config", "measured_at")
    if any(not isinstance(e.get(k), str) for k in strings):
        return None
    overhead, ratio = e.get("overhead_bytes"), e.get("compute_ratio")
    if overhead is not None and (
        not isinstance(overhead, int) or isinstance(overhead, bool) or not 0 <= overhead <= MAX_OVERHEAD_BYTES
    ):
        return None
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio < 100:
        return None
    return Calibration(
        device=e["device"],
        llama_cpp_build=e["llama_cpp_build"],
        runner=e["runner"],
        overhead_bytes=overhead,
        compute_ratio=float(ratio),
        model=e["model"],
        config=e["config"],
        measured_at=e["measured_at"],
    )


def lookup(device: str) -> Calibration | None:
    """The latest calibration for ``device`` (a GPU name), if any."""
    found = [c for c in load().entries if c.device == device]
    return found[-1] if found else None


def measured_overhead(device: str) -> tuple[MeasuredOverhead | None, tuple[str, ...]]:
    """What a plan for ``device`` (this machine's GPU, by its NVML name) takes from the store:
    the latest measured overhead, if any, and the notes on entries that were skipped."""
    from kvadvise.planner.planning import MeasuredOverhead

    loaded = load()
    found = [c for c in loaded.entries if c.device == device and c.overhead_bytes is not None]
    if not found:
        return None, loaded.notes
    c = found[-1]
    assert c.overhead_bytes is not None
    source = f"the calibration measured on {c.device} ({c.llama_cpp_build}, {c.measured_at})"
    return MeasuredOverhead(c.overhead_bytes, source), loaded.notes


def from_verification(v: Verification, device: str) -> Calibration:
    m, est = v.measured, v.plan.estimate
    overhead = None
    if m.device_used_bytes is not None:
        # the GPU's own buffers: the host's (CPU_Mapped token_embd, CUDA_Host compute) are not in NVML's figure
        on_device = (
            m.gpu_buffer_bytes
            if m.gpu_buffer_bytes is not None
            else m.kv_bytes + m.recurrent_bytes + m.weights_bytes + m.compute_bytes
        )
        overhead = min(max(0, m.device_used_bytes - on_device), MAX_OVERHEAD_BYTES)
    cfg = v.plan.config
    return Calibration(
        device=device,
        llama_cpp_build=m.llama_cpp_build,
        runner=m.runner,
        overhead_bytes=overhead,
        compute_ratio=m.compute_bytes / est.compute_bytes if est.compute_bytes else 1.0,
        model=v.plan.spec.name,
        config=f"-c {cfg.n_ctx} -np {cfg.n_parallel} -ctk {cfg.type_k.type_name} -ctv {cfg.type_v.type_name} -fa {cfg.flash_attn}",
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def save(c: Calibration) -> Path:
    """Add ``c``, replacing an older entry for the same device and build; a run with no device figure (a log)
    keeps the overhead that entry measured."""
    old = load().entries
    same = [e for e in old if (e.device, e.llama_cpp_build) == (c.device, c.llama_cpp_build)]
    if c.overhead_bytes is None and same and same[-1].overhead_bytes is not None:
        c = replace(c, overhead_bytes=same[-1].overhead_bytes)
    entries = [e for e in old if (e.device, e.llama_cpp_build) != (c.device, c.llama_cpp_build)] + [c]
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "entries": [asdict(e) for e in entries]}
    return write_text_file(p, json.dumps(doc, indent=2) + "\n", force=True)


def clear() -> int:
    """Remove the file, whatever is in it (a bad one too); the number of valid entries it held."""
    n = len(load().entries)
    p = path()
    if p.exists() or p.is_symlink():
        p.unlink()
    return n
