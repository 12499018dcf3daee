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
from dataclasses import asdict, dataclass
from pathlib import Path

from advisor.errors import InputError
from advisor.files import write_text_file
from advisor.verification import Verification

FORMAT = 1


@dataclass(frozen=True, slots=True)
class Calibration:
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


def load() -> tuple[Calibration, ...]:
    p = path()
    if not p.exists():
        return ()
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        return tuple(Calibration(**e) for e in doc["entries"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{p}: unreadable calibration file ({e})", hint="kvadvise calibration clear") from None


def lookup(device: str) -> Calibration | None:
    """The latest calibration for ``device`` (a GPU name), if any."""
    found = [c for c in load() if c.device == device]
    return found[-1] if found else None


def from_verification(v: Verification, device: str) -> Calibration:
    m, est = v.measured, v.plan.estimate
    overhead = None
    if m.device_used_bytes is not None:
        on_device = m.kv_bytes + m.recurrent_bytes + m.weights_bytes + m.compute_bytes  # GPU-side buffers
        overhead = max(0, m.device_used_bytes - on_device)
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
    """Add ``c``, replacing an older entry for the same device and build."""
    entries = [e for e in load() if (e.device, e.llama_cpp_build) != (c.device, c.llama_cpp_build)] + [c]
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "entries": [asdict(e) for e in entries]}
    return write_text_file(p, json.dumps(doc, indent=2) + "\n", force=True)


def clear() -> int:
    n = len(load())
    p = path()
    if p.exists():
        p.unlink()
    return n
