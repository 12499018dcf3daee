"""``kvadvise gpus``: the cards ``--gpu`` knows (profiles/gpus.json) and this machine's GPUs as NVML sees them,
so a ``--gpu`` name is found from the command line rather than from a JSON file inside site-packages; and
``kvadvise gpus MODEL``: which card to buy for a model (the smallest that runs it 100% on the GPU at the
target context, then every one that does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from kvadvise.planner.gpus import GpuProfile
from kvadvise.text import wrapped
from kvadvise.ui import output
from kvadvise.ui.flags import USE_OPTION, TokensType

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.planning import Plan

GIB = 1 << 30


def profile_dict(p: GpuProfile) -> dict[str, Any]:
    from kvadvise.planner.speed import decode_key  # only --json reads it: the plain list starts without it

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
        # what the speed estimate reads of the card: its decode class (planner.speed.decode_key: the backend's
        # own, or its architecture's, "rocm-gcn", "metal-m4"), the boost clock that scales the fixed time per
        # layer, and the FP16 peak prompt processing is bounded by
        "speed_class": decode_key(p.backend, p.speed_class or ""),
        "boost_clock_mhz": p.boost_clock_mhz,
        "fp16_tflops": p.fp16_tflops,
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
    """The catalogue as a table: by vendor, then memory, then name; each column as wide as its longest entry."""
    rows = sorted(profiles, key=lambda p: (p.vendor.lower(), p.memory_bytes, p.name.lower()))
    iw = max([8, *(len(p.id) for p in rows)]) + 2
    nw = min(40, max([4, *(len(p.name) for p in rows)])) + 2
    lines = [f"{'--gpu ID':<{iw}}{'name':<{nw}}{'memory':>11}{'usable':>11}{'bandwidth':>12}  source"]
    for p in rows:
        lines.append(
            f"{p.id:<{iw}}{_short(p.name, nw - 2):<{nw}}{_gib(p.memory_bytes):>11}{_gib(p.usable_bytes):>11}"
            f"{p.bandwidth_bytes_per_s / 1e9:>8,.0f} GB/s  {_short(p.source)}"
        )
    return lines


def machine_text(hw: Hardware) -> list[str]:
    doc = machine_dict(hw)
    lines = [f"This machine ({hw.source}): RAM {_gib(hw.ram_total_bytes)}, {_gib(hw.ram_free_bytes)} available"]
    if not doc["gpus"]:  # one line: the notes below would say the same
        lines.append("  no GPU seen: plans use system RAM, or pass --gpu ID / --vram SIZE")
        return lines
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
@click.argument("model", required=False, metavar="[MODEL]")
@click.option(
    "--target-ctx",
    "--ctx",
    "target_ctx",
    type=TokensType("target_ctx"),
    default=None,
    help="With MODEL: the context per sequence the card must reach, 100% on the GPU (64k = 65,536) [default: 32k].",
)
@USE_OPTION
@click.option("--all", "show_all", is_flag=True, help="With MODEL: also list the cards that fall short.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: profiles, machine.")
@click.option("--no-hardware", is_flag=True, help="Only the built-in list: do not look at this machine's GPUs.")
def gpus(
    model: str | None, target_ctx: int | None, use: str | None, show_all: bool, as_json: bool, no_hardware: bool
) -> None:
    """The cards --gpu knows (memory, bandwidth, where the figures come from) and this machine's GPUs (NVML).

    With MODEL: which card to buy for it. Every card of the list is planned for MODEL (as `kvadvise gguf` or
    `kvadvise ollama` resolves it); the answer names the smallest card that runs it 100% on the GPU at the
    target context, then every card that does, smallest first.
    """
    if model is not None:
        return _buying(model, target_ctx, use, show_all=show_all, as_json=as_json)
    if target_ctx is not None or use or show_all:
        raise click.UsageError("--target-ctx, --use and --all go with MODEL: kvadvise gpus MODEL --target-ctx 32k")
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
        return None
    for line in profiles_text(profiles):
        output.line(line)
    if hw is not None:
        output.result("")
        for line in machine_text(hw):
            output.line(line)
    return None


BUYING_TARGET = 32768  # the default context a card must reach for `gpus MODEL`


@dataclass(frozen=True, slots=True)
class CardFit:
    """One card of the catalogue for one model: whether it runs it 100% on the GPU at the target."""

    profile: GpuProfile
    plan: Plan
    reaches: bool  # 100 % on the GPU at (at least) the target context
    n_ctx: int  # the context per sequence it fits, 100 % on the GPU (0: none)


def card_fits(spec: ModelSpec, target: int, use: str | None) -> list[CardFit]:
    """Every catalogue card planned for ``spec`` (kvadvise.cli.compare.plan_pair, llama-server): those that
    reach the target first, the smallest memory first, then the fastest memory; the rest after."""
    from kvadvise.cli.compare import card, plan_pair, resolved_build
    from kvadvise.planner.gpus import load_profiles

    build = resolved_build()
    out = []
    for p in load_profiles():
        plan = plan_pair(
            spec,
            card(p.id).hardware,
            target=target,
            use=use,
            n_parallel=1,
            margin=1 << 30,
            repeatable=False,
            llama_build=build,
        )
        rec = plan.recommendation
        n_ctx = plan.config.n_ctx // max(1, plan.config.n_parallel) if plan.fits else 0
        goal = rec.target_ctx if rec is not None else target
        out.append(CardFit(p, plan, bool(plan.fits) and n_ctx >= goal, n_ctx))
    return sorted(
        out, key=lambda c: (not c.reaches, c.profile.memory_bytes, -c.profile.bandwidth_bytes_per_s, c.profile.id)
    )


def _buying(ref: str, target_ctx: int | None, use: str | None, *, show_all: bool, as_json: bool) -> None:
    from kvadvise.cli.compare import decode_at_4k, resolve_models
    from kvadvise.errors import EXIT_NO_FIT

    if target_ctx is not None and use:
        raise click.UsageError("give --use or --target-ctx, not both")
    target = target_ctx if target_ctx is not None else 0 if use else BUYING_TARGET
    name, spec = resolve_models((ref,))[0]
    fits = card_fits(spec, target, use)
    reaching = [c for c in fits if c.reaches]
    goal = fits[0].plan.recommendation.target_ctx if fits and fits[0].plan.recommendation else target

    def row(c: CardFit) -> dict[str, object]:
        p, plan = c.profile, c.plan
        speed = plan.speed if plan.fits else None
        return {
            "card": p.id,
            "name": p.name,
            "memory_bytes": p.memory_bytes,
            "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s,
            "reaches_target": c.reaches,
            "n_ctx": c.n_ctx,
            "type_k": plan.config.type_k.type_name if plan.fits else None,
            "type_v": plan.config.type_v.type_name if plan.fits else None,
            "decode_4k_tokens_per_s": decode_at_4k(plan),
            "decode_tokens_per_s": speed.points[-1][1] if speed is not None else None,
            "decode_extrapolated": speed.extrapolated(speed.points[-1][0]) if speed is not None else None,
        }

    if as_json:
        output.result_json(
            {
                "model": name,
                "target_ctx": goal,
                "use": use,
                "smallest": reaching[0].profile.id if reaching else None,
                "cards": [row(c) for c in (fits if show_all else reaching)],
                "short": [c.profile.id for c in fits if not c.reaches],
            }
        )
    else:
        if reaching:
            first = row(reaching[0])
            head = (
                f"{name} at {goal:,} token{'s' * (goal != 1)}, 100% on the GPU: the smallest card that does is "
                f"{first['card']} "
                f"({_gib(reaching[0].profile.memory_bytes)}, {_kv(first)}, {_tps(first)})"
            )
            output.result("\n".join(wrapped(head)))
        else:
            output.result(f"{name} at {goal:,} token{'s' * (goal != 1)}: no card of the list runs it 100% on the GPU")
        output.line(
            f"{'CARD':<22}{'MEMORY':>10}{'BANDWIDTH':>11}  {'TARGET':<7}{'CONTEXT':>9}  {'CACHE':<6}{'T/S@4K':>8}{'T/S@CTX':>9}"
        )
        for c in fits if show_all else reaching:
            d = row(c)
            output.line(
                f"{c.profile.id:<22}{_gib(c.profile.memory_bytes):>10}{c.profile.bandwidth_bytes_per_s / 1e9:>6,.0f} GB/s  "
                f"{'yes' if c.reaches else 'SHORT':<7}{_ctx(c.n_ctx):>9}  {_kv(d) if c.n_ctx else '-':<6}"
                f"{_t(d['decode_4k_tokens_per_s']):>8}{_t(d['decode_tokens_per_s']):>9}"
                + ("*" if d["decode_extrapolated"] else "")
            )
        short = len(fits) - len(reaching)
        if short and not show_all:
            output.line(f"({short} card(s) of the list fall short: --all lists them)")
        legend = (
            "T/S: estimated decode tokens/s of one sequence at 4k and at CONTEXT (*: past the measurements the "
            "speed model is calibrated on: extrapolated); llama.cpp cache types, 1 GiB margin"
        )
        output.result("\n".join(wrapped(legend)))
    if not reaching:
        raise click.exceptions.Exit(EXIT_NO_FIT)
    return None


def _kv(d: dict[str, object]) -> str:
    return str(d["type_k"]) if d["type_k"] == d["type_v"] else f"{d['type_k']}/{d['type_v']}"


def _tps(d: dict[str, object]) -> str:
    from kvadvise.planner.speed import tps_label

    t = d["decode_tokens_per_s"]
    return f"≈ {tps_label(t)} t/s at its context" if isinstance(t, float) else "speed unknown"


def _t(t: object) -> str:
    from kvadvise.planner.speed import tps_label

    return f"~{tps_label(t)}" if isinstance(t, float) and t else "-"


def _ctx(n: int) -> str:
    return "-" if not n else (f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}")
