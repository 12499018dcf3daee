"""AMD GPUs of this machine, read from the amdgpu kernel driver's sysfs files (Linux).

NVML sees NVIDIA cards only. The amdgpu driver publishes, per card, under
``/sys/class/drm/cardN/device/`` (Linux Documentation/gpu/amdgpu/driver-misc.rst):
``vendor`` (0x1002), ``device`` (the PCI id), ``mem_info_vram_total`` and
``mem_info_vram_used`` in bytes, ``mem_info_gtt_total`` (system RAM it can map)
and ``product_name`` on some boards. What
llama.cpp's ROCm build sees as free (hipMemGetInfo) is the VRAM less what is
in use. Matching a card to profiles/gpus.json is kvadvise.planner.hardware's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

AMD_VENDOR = "0x1002"
SYSFS_DRM = "/sys/class/drm"


@dataclass(frozen=True, slots=True)
class AmdCard:
    """One card as the driver reports it."""

    card: str  # cardN
    pci_id: str  # "0x744c"
    product_name: str | None  # only some boards publish one
    vram_total_bytes: int
    vram_used_bytes: int
    gtt_total_bytes: int | None = None  # system RAM the GPU can map besides (an APU's larger pool)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _int(path: str) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def cards(root: str | os.PathLike[str] = SYSFS_DRM) -> tuple[AmdCard, ...]:
    """Every AMD card under ``root`` that reports its VRAM, in card order; () when there is none."""
    try:
        names = sorted((e for e in os.listdir(root) if re.fullmatch(r"card[0-9]+", e)), key=lambda e: int(e[4:]))
    except OSError:
        return ()
    found = []
    for card in names:
        dev = os.path.join(root, card, "device")
        if _read(os.path.join(dev, "vendor")) != AMD_VENDOR:
            continue
        total, used = _int(os.path.join(dev, "mem_info_vram_total")), _int(os.path.join(dev, "mem_info_vram_used"))
        if not total or used is None:
            continue
        pci_id = (_read(os.path.join(dev, "device")) or "unknown").lower()
        gtt = _int(os.path.join(dev, "mem_info_gtt_total"))
        found.append(AmdCard(card, pci_id, _read(os.path.join(dev, "product_name")) or None, total, used, gtt))
    return tuple(found)
