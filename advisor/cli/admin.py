"""Commands about kvadvise itself: the stored calibrations and the installed backends."""

from __future__ import annotations

import click

from kvadvise.ui import output


@click.group("calibration")
def calibration_group() -> None:
    """What `verify --save-calibration` stored for this machine."""


@calibration_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibration_show(as_json: bool) -> None:
    """List the stored calibrations (entries that cannot be used are skipped, with a note)."""
    from dataclasses import asdict

    from kvadvise.runtime import calibration

    loaded = calibration.load()
    for n in loaded.notes:
        output.note(n)
    if as_json:
        output.result_json(
            {
                "path": str(calibration.path()),
                "entries": [asdict(e) for e in loaded.entries],
                "notes": list(loaded.notes),
            }
        )
        return
    if not loaded.entries:
        output.result(f"no calibration stored ({calibration.path()})")
    for e in loaded.entries:
        overhead = f"{e.overhead_bytes / (1 << 20):,.0f} MiB" if e.overhead_bytes is not None else "n/a (CPU)"
        output.result(
            f"{e.device}: overhead {overhead}, compute x{e.compute_ratio:.3f} ({e.llama_cpp_build}, {e.model}, "
            f"{e.config}, {e.measured_at})"
        )


@calibration_group.command("clear")
def calibration_clear() -> None:
    """Forget every stored calibration (a damaged file too)."""
    from kvadvise.runtime import calibration

    output.result(f"removed {calibration.clear()} calibration entries")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins(as_json: bool) -> None:
    """List the installed backends, and any that failed to load."""
    from kvadvise.plugins import capabilities, discover

    loaded, broken = discover().load_all()
    if as_json:
        output.result_json(
            {
                "backends": [
                    {"name": n, "summary": b.summary, "capabilities": list(capabilities(b))}
                    for n, b in sorted(loaded.items())
                ],
                "broken": [{"name": b.name, "target": b.target, "error": b.error} for b in broken],
            }
        )
        return
    for name, b in sorted(loaded.items()):
        output.line(f"{name:<10} {b.summary}  [{', '.join(capabilities(b))}]")
    for br in broken:
        output.line(f"{br.name:<10} BROKEN ({br.target}): {br.error}")
