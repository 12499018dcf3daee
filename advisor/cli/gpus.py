"""``kvadvise gpus``: the cards ``--gpu`` knows (profiles/gpus.json) and this machine's GPUs as NVML sees them,
so a ``--gpu`` name is found from the command line rather than from a JSON file inside site-packages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from kvadvise.ui import output

if TYPE_CHECKING:
    from kvadvise.planner.gpus import GpuProfile
    from kvadvise.planner.hardware import Hardware

GIB = 1 << 30


def profile_dict(p: GpuProfile) -> dict[str, Any]:
    return {
        "id": p.id,
        "name": p.name,
        "vendor": p.vendor,
        "aliases": list(p.aliases),
        "memory_bytes": p.memory_bytes,
        "usable_bytes": p.usable_bytes,
        "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s,
        "unified_memory": p.unified_memory,
        "backend": p.backend,
        "source": p.source,
    }


def machine_dict(hw: Hardware) -> dict[str, Any]:
    from kvadvise.planner.gpus import match_nvml_name

    gpus = []
    for g in hw.gpus:
        prof = match_nvml_name(g.name, g.total_bytes)
        gpus.append(
            {
                "index": g.index,
                "name": g.name,
                "total_bytes": g.total_bytes,
                "free_bytes": g.free_bytes,
                "used_by_others_bytes": g.used_by_others_bytes,
                "profile": prof.id if prof is not None else None,
                "bandwidth_bytes_per_s": g.bandwidth_bytes_per_s,
            }
        )
    return {
        "source": hw.source,
        "gpus": gpus,
        "ram_total_bytes": hw.ram_total_bytes,
        "ram_free_bytes": hw.ram_free_bytes,
        "notes": list(hw.notes),
    }


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def profiles_text(profiles: tuple[GpuProfile, ...]) -> list[str]:
    lines = [f"{'--gpu ID':<18}{'name':<34}{'memory':>11}{'usable':>11}{'bandwidth':>12}  source"]
    for p in profiles:
        lines.append(
            f"{p.id:<18}{p.name:<34}{_gib(p.memory_bytes):>11}{_gib(p.usable_bytes):>11}"
            f"{p.bandwidth_bytes_per_s / 1e9:>8,.0f} GB/s  {_short(p.source)}"
        )
    return lines


def machine_text(hw: Hardware) -> list[str]:
    doc = machine_dict(hw)
    lines = [f"This machine ({hw.source}): RAM {_gib(hw.ram_total_bytes)}, {_gib(hw.ram_free_bytes)} available"]
    if not doc["gpus"]:
        lines.append("  no GPU seen by NVML: plans use system RAM, or pass --gpu ID / --vram SIZE")
    for g in doc["gpus"]:
        prof = f"  (--gpu {g['profile']})" if g["profile"] else "  (not in the built-in list: bandwidth unknown)"
        lines.append(
            f"  GPU {g['index']}: {g['name']}  {_gib(g['total_bytes'])} total, {_gib(g['free_bytes'])} free, "
            f"{_gib(g['used_by_others_bytes'])} used by other processes{prof}"
        )
    lines += [f"  note: {n}" for n in hw.notes]
    return lines


def _short(source: str, width: int = 60) -> str:
    return source if len(source) <= width else source[: width - 3] + "..."


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: profiles, machine.")
@click.option("--no-hardware", is_flag=True, help="Only the built-in list: do not look at this machine's GPUs.")
def gpus(as_json: bool, no_hardware: bool) -> None:
    """The cards --gpu knows (memory, bandwidth, where the figures come from) and this machine's GPUs (NVML)."""
    from kvadvise.planner.gpus import load_profiles
    from kvadvise.planner.hardware import probe

    profiles = load_profiles()
    hw = None if no_hardware else probe()
    if as_json:
        output.result_json(
            {
                "profiles": [profile_dict(p) for p in profiles],
                "machine": machine_dict(hw) if hw is not None else None,
            }
        )
        return
    for line in profiles_text(profiles):
        output.line(line)
    if hw is not None:
        output.result("")
        for line in machine_text(hw):
            output.line(line)
