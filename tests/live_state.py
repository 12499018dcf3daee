"""What a plan document reads from this machine at the moment it is made.

Free RAM (psutil's `available`) moves between two runs made moments apart, so a test that
compares two documents of one question drops it from both; everything else must agree."""

from __future__ import annotations

from typing import Any


def without_live_ram(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without this machine's free RAM, wherever a plan document carries it."""
    hw = doc.get("hardware")
    if isinstance(hw, dict):
        hw.pop("ram_free_bytes", None)
    for holder in (doc, doc.get("offload")):
        ram = holder.get("ram") if isinstance(holder, dict) else None
        if isinstance(ram, dict) and ram.get("ram_source") != "given with --ram":
            ram.pop("ram_bytes", None)
            ram.pop("fits", None)
    return doc
