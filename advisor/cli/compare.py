"""``kvadvise compare``: many models on one card ("which model should I run?"), one model on many cards
("which card should I buy?"), or both: each pair's recommended plan side by side.

Models are resolved through the installed backends (kvadvise.plugins), as ``kvadvise gguf`` and
``kvadvise ollama`` resolve them; without any, the Ollama backend's built-in profiles are compared.
The plan is llama.cpp's (any K and V cache types), the recommendation policy of every other command.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import click

from kvadvise.errors import EXIT_NO_FIT, InputError
from kvadvise.planner.offload import offload_flags
from kvadvise.request import MAX_GBS
from kvadvise.ui import output
from kvadvise.ui.flags import (
    MARGIN_OPTION,
    PARALLEL_OPTION,
    TEXT,
    USE_OPTION,
    VRAM_SIZE,
    FiniteFloatRange,
    TokensType,
    gpu_list,
)

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.planning import Plan
    from kvadvise.plugins import Registry

SORTS = ("speed", "context", "size")
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Card:
    """One card of a comparison, as the user named it."""

    label: str  # as the user named it (or "this machine")
    hardware: Hardware


@dataclass(frozen=True, slots=True)
class Entry:
    """One model on one card: its plan."""

    model: str
    card: Card
    plan: Plan


def _one_vram(ctx: click.Context, param: click.Parameter, value: tuple[int, ...]) -> int | None:
    """compare's ``--vram`` is one card's size: given twice it is refused, never the last one kept in silence."""
    if len(value) > 1:
        raise click.BadParameter("one size: compare plans one card given by hand (cards of the list: --gpu A,B)")
    return value[0] if value else None


def card(name: str) -> Card:
    """A card of the built-in list, ``NAMExN`` for N of them (layers split across the cards)."""
    from kvadvise.planner.hardware import from_profiles

    name = name.strip()
    return Card(name, from_profiles(name))


def cards(gpu: str | None, vram_bytes: int | None, bandwidth_gbs: float | None = None) -> list[Card]:
    from kvadvise.planner.hardware import manual, probe

    if gpu and vram_bytes is not None:
        raise click.UsageError("give --gpu or --vram, not both")
    if bandwidth_gbs is not None and vram_bytes is None:
        raise click.UsageError("--bandwidth goes with --vram (a --gpu card has its own)")
    if vram_bytes is not None:
        hw = manual(vram_bytes, None if bandwidth_gbs is None else int(bandwidth_gbs * 1e9))
        if bandwidth_gbs is None:  # the decode figures are one catalogue card's of that size (speed.spread)
            hw = replace(
                hw,
                notes=(
                    *hw.notes,
                    "--vram without --bandwidth: the decode figures are the middle of the catalogue's cards of "
                    "this size (the plan gives their range); --bandwidth GB/S gives this card's",
                ),
            )
        return [Card(f"{vram_bytes / GIB:g} GiB", hw)]
    if gpu:
        names = [n for n in gpu.split(",") if n.strip()]
        if not names:
            raise click.UsageError("--gpu needs at least one card name (`kvadvise gpus` lists them)")
        return [card(n) for n in names]
    return [Card("this machine", probe())]


def resolve_models(refs: tuple[str, ...]) -> list[tuple[str, ModelSpec]]:
    """``backend:REF`` picks the backend; else a file, URL, hf:// name or USER/REPO:QUANT is a GGUF
    (``gguf``), anything else an Ollama name (``ollama``: store, server, built-in profile)."""
    from kvadvise.plugins import discover

    registry = discover()
    if not refs:
        backend = registry.get("ollama")
        builtin = getattr(backend, "builtin_models", None)
        if not callable(builtin):
            raise InputError("no model given and no backend with built-in models", hint="name models to compare")
        models: list[tuple[str, ModelSpec]] = list(builtin())
        return models
    out = []
    for ref in refs:
        name, spec = _resolve(registry, ref)
        out.append((name, spec))
    return out


def _resolve(registry: Registry, ref: str) -> tuple[str, ModelSpec]:
    from pathlib import Path

    head, sep, rest = ref.partition(":")
    if sep and head in registry.targets and not rest.startswith("//"):
        return ref, registry.get(head).load_spec(rest)
    looks_gguf = (
        ref.startswith(("http://", "https://", "hf://", "/", "./", "~"))
        or ref.endswith(".gguf")
        or Path(ref).expanduser().exists()
        or ("/" in ref and not ref.startswith("hf.co/"))
    )
    backend = "gguf" if looks_gguf else "ollama"
    return ref, registry.get(backend).load_spec(ref)


def plan_pair(
    spec: ModelSpec,
    hw: Hardware,
    *,
    target: int,
    use: str | None,
    n_parallel: int,
    margin: int,
    repeatable: bool,
    llama_build: str = "auto",
) -> Plan:
    """One model on one card: the plan `kvadvise gguf MODEL --gpu CARD` makes (kvadvise.entry.plan_for), for
    llama-server; ``llama_build``: resolved once by the command (a probe of the llama-server on PATH per pair
    would cost a process each)."""
    from kvadvise.entry import plan_for
    from kvadvise.request import PlanRequest

    request = PlanRequest(
        target_ctx=0 if use else target,
        use=use,
        n_parallel=n_parallel,
        margin_bytes=margin,
        repeatable=repeatable,
        llama_build=llama_build,
    )
    return plan_for(spec, request, hardware=hw)


def resolved_build() -> str:
    """--llama-build auto, resolved once for a whole comparison: bNNNN, or unknown."""
    import os

    from kvadvise.runtime import llamabuild

    choice = llamabuild.choose(os.environ.get("KVADVISE_LLAMA_BUILD", "").strip() or "auto")
    return "unknown" if choice.build is None else f"b{choice.build}"


def entry_dict(e: Entry) -> dict[str, Any]:
    p = e.plan
    rec = p.recommendation
    assert rec is not None and p.budget is not None
    c = p.config
    return {
        "model": e.model,
        "architecture": p.spec.architecture,
        "card": e.card.label,
        "hardware_source": e.card.hardware.source,
        "fits": p.fits,
        # the context per sequence as llama.cpp runs it (padded to 256: the plan's layout), not the request's
        "n_ctx": p.estimate.layout.n_ctx_seq if p.fits else 0,
        "target_ctx": rec.target_ctx,
        "reaches_target": bool(p.fits) and p.estimate.layout.n_ctx_seq >= rec.target_ctx,
        "type_k": c.type_k.type_name,
        "type_v": c.type_v.type_name,
        "flash_attn": c.flash_attn,
        "weights_bytes": p.spec.weights_bytes,
        "device_bytes": p.estimate.device_bytes,
        "budget_bytes": p.budget.budget_bytes,
        # the tightest card's (budget.slack_bytes): a total over several cards hides the one that is short
        "headroom_bytes": p.budget.slack_bytes(p.estimate),
        "decode_tokens_per_s": rec.decode_tokens_per_s if p.fits else None,
        # decode at 4k beside decode at the context, so that models compare at one depth
        "decode_4k_tokens_per_s": decode_at_4k(p),
        "bandwidth_source": p.budget.bandwidth_source,
        "partial": partial_dict(p),
    }


def partial_dict(p: Plan) -> dict[str, Any] | None:
    """The plan that runs with part of the model on the CPU, for a pair that does not fit the GPU alone
    (the same answer a plan gives); None when it fits, or when no partial plan fits."""
    off = p.offload
    if p.fits or off is None:
        return None
    sp = off.speed
    return {
        "n_ctx": off.n_ctx,
        "type_k": off.type_k.type_name,
        "type_v": off.type_v.type_name,
        "n_gpu_layers": off.n_gpu_layers,
        "n_cpu_moe": off.n_cpu_moe,
        "expert_overflow": off.expert_overflow,
        "n_cpu_layers": off.n_cpu_layers,
        "device_bytes": off.device_bytes,
        "decode_tokens_per_s": off.decode_tokens_per_s,
        "decode_at_target_tokens_per_s": sp.points[-1][1] if sp is not None else None,
        "runnable": off.runnable,
    }


DEPTH_4K = 4096


def decode_at_4k(p: Plan) -> float | None:
    """The decode estimate of one sequence with 4k tokens of context (the first depth the speed model gives;
    None when the plan does not fit or holds fewer than 4k tokens)."""
    speed = p.speed if p.fits else None
    if speed is None or speed.points[0][0] != DEPTH_4K:
        return None
    return speed.points[0][1]


def sort_entries(entries: list[Entry], key: str | None) -> list[Entry]:
    if key is None:
        return entries
    docs = {id(e): entry_dict(e) for e in entries}

    def short(e: Entry) -> bool:  # a pair short of the target never ranks above one that reaches it
        return not docs[id(e)]["reaches_target"]

    if key == "speed":  # at 4k, one depth for every model (at its own context a model with less looks faster)
        return sorted(entries, key=lambda e: (short(e), -(docs[id(e)]["decode_4k_tokens_per_s"] or 0.0)))
    if key == "context":
        return sorted(
            entries, key=lambda e: (short(e), -docs[id(e)]["n_ctx"], -(docs[id(e)]["decode_4k_tokens_per_s"] or 0.0))
        )
    return sorted(entries, key=lambda e: (short(e), -docs[id(e)]["weights_bytes"]))


def _ctx(n: int) -> str:
    return "-" if not n else (f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}")


def table_text(entries: list[Entry]) -> list[str]:
    docs = [entry_dict(e) for e in entries]
    mw = max([5, *(len(d["model"]) for d in docs)])
    cw = max([4, *(len(d["card"]) for d in docs)])
    lines = [
        f"{'MODEL':<{mw}}  {'CARD':<{cw}}  {'FITS':<4} {'CONTEXT':>8} {'TARGET':>7} {'REACHED':<7}  {'CACHE':<10} "
        f"{'WEIGHTS':>9} {'HEADROOM':>10} {'T/S@4K':>7} {'T/S@CTX':>8}  PART ON CPU"
    ]
    for d in docs:
        kv = d["type_k"] if d["type_k"] == d["type_v"] else f"{d['type_k']}/{d['type_v']}"
        if d["flash_attn"] == "off":
            kv += " noFA"
        head = d["headroom_bytes"] / GIB
        lines.append(
            f"{d['model']:<{mw}}  {d['card']:<{cw}}  {'yes' if d['fits'] else 'NO':<4} {_ctx(d['n_ctx']):>8} "
            f"{_ctx(d['target_ctx']):>7} {'yes' if d['reaches_target'] else 'SHORT':<7}  {kv if d['fits'] else '-':<10} "
            f"{d['weights_bytes'] / 1e9:>6.1f} GB "
            f"{head:>+6.1f} GiB {_tps(d['decode_4k_tokens_per_s']):>7} {_tps(d['decode_tokens_per_s']):>8}"
            f"  {_partial(d['partial'])}"
        )
    return lines


def _tps(tps: float | None) -> str:
    from kvadvise.planner.speed import tps_label  # "<1" for a plan that runs slowly, never "0"

    return f"~{tps_label(tps)}" if tps else "-"


def goal_text(entries: list[Entry], use: str | None, target: int) -> str:
    """What the TARGET column holds, as the plans set it: --use, --target-ctx or the policy's default for the
    card (kvadvise.planner.policy.default_target_ctx: 64k on cards of 16 GB or more, 32k below); capped at
    each model's training context."""
    from kvadvise.planner.policy import default_target_ctx

    capped = "capped at each model's training context"
    if use == "long":
        return "target (--use long): each model's training context"
    if use:
        return f"target {_ctx(target)} per slot (--use {use}), {capped}"
    if target:
        return f"target {_ctx(target)} per slot (--target-ctx), {capped}"
    defaults = sorted({default_target_ctx(e.plan.budget)[0] for e in entries if e.plan.budget is not None})
    if len(defaults) == 1:
        cards = "this card" if len({e.card.label for e in entries}) == 1 else "these cards"
        return f"target {_ctx(defaults[0])} per slot (the default on {cards}), {capped}"
    return f"target 64k per slot on cards of 16 GB or more, 32k below (the default), {capped}"


def _partial(d: dict[str, Any] | None) -> str:
    """``64k q8_0 -ngl 49 --n-cpu-moe 21 ~38 tok/s`` (the plan that runs when 100 % GPU does not fit), else -."""
    if d is None:
        return "-"
    kv = d["type_k"] if d["type_k"] == d["type_v"] else f"{d['type_k']}/{d['type_v']}"
    flags = offload_flags(d["n_gpu_layers"], d["n_cpu_moe"], d["expert_overflow"])
    from kvadvise.planner.speed import tps_label

    tps = d["decode_tokens_per_s"]
    s = f"{_ctx(d['n_ctx'])} {kv} {flags}" + (f" ~{tps_label(tps)} tok/s" if tps else "")
    return s if d["runnable"] else s + " (not in RAM)"


@click.command("compare")
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option(
    "--gpu",
    metavar="NAME[,NAME...]",
    type=TEXT,
    multiple=True,
    callback=gpu_list,  # repeated, a list, as the plan commands take it
    help="Cards of `kvadvise gpus`, comma-separated or repeated; NAMExN for N of them (rtx-3090x2).",
)
@click.option(
    "--vram",
    "vram_bytes",
    type=VRAM_SIZE,
    metavar="SIZE",
    multiple=True,
    callback=_one_vram,
    help="One budget given by hand: 24GiB.",
)
@click.option(
    "--bandwidth",
    "bandwidth_gbs",
    type=FiniteFloatRange(min=1, max=MAX_GBS),
    metavar="GB/S",
    default=None,
    help="With --vram: the card's memory bandwidth in GB/s, for the decode estimate (e.g. 448).",
)
@MARGIN_OPTION
@USE_OPTION
@click.option(
    "--target-ctx",
    "--ctx",
    "target_ctx",
    type=TokensType("target_ctx"),
    default=0,
    help="Context per sequence to aim for (64k = 65,536); a pair short of it says so and never ranks above one "
    "that reaches it.",
)
@PARALLEL_OPTION
@click.option("--repeatable", is_flag=True, help="f16 cache only.")
@click.option(
    "--sort",
    type=click.Choice(SORTS),
    default=None,
    help="speed (fastest decode at 4k tokens of context first), context (longest first) or size (largest "
    "weights first); default: as given.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (keys: docs/json.md, schema: docs/schema/)."
)
def compare(
    models: tuple[str, ...],
    gpu: str | None,
    vram_bytes: int | None,
    bandwidth_gbs: float | None,
    margin_bytes: int,
    use: str | None,
    target_ctx: int,
    n_parallel: int,
    repeatable: bool,
    sort: str | None,
    as_json: bool,
) -> None:
    """Each model's plan on each card, side by side: fits, context, cache type, headroom, decode estimate.

    MODEL is what `kvadvise gguf` or `kvadvise ollama` takes (BACKEND:REF to choose: ollama:qwen3:8b,
    gguf:./m.gguf); without MODEL, the built-in profiles of popular Ollama models are compared.
    """
    from kvadvise.planner.policy import load_use_cases

    if use and target_ctx:
        raise click.UsageError("give --use or --target-ctx, not both")
    target = target_ctx or (load_use_cases()[use] if use else 0)
    card_list = cards(gpu, vram_bytes, bandwidth_gbs)
    from kvadvise.entry import check_margin

    check_margin(margin_bytes, [g for c in card_list for g in c.hardware.gpus])  # the largest card decides
    specs = resolve_models(models)
    build = resolved_build()
    entries = [
        Entry(
            name,
            c,
            plan_pair(
                spec,
                c.hardware,
                target=target,
                use=use,
                n_parallel=n_parallel,
                margin=margin_bytes,
                repeatable=repeatable,
                llama_build=build,
            ),
        )
        for c in card_list
        for name, spec in specs
    ]
    entries = sort_entries(entries, sort)
    if as_json:
        output.result_json(
            {
                "target_ctx": target,
                "use": use,
                "n_parallel": n_parallel,
                "sort": sort,
                "cards": [
                    {
                        "card": c.label,
                        "source": c.hardware.source,
                        "n_gpu": len(c.hardware.gpus),
                        "notes": list(c.hardware.notes),
                    }
                    for c in card_list
                ],
                "entries": [entry_dict(e) for e in entries],
            }
        )
    else:
        output.result(
            f"{len(specs)} model(s) on {len(card_list)} card(s); {goal_text(entries, use, target)}; "
            f"{n_parallel} slot(s); llama.cpp cache types"
        )
        output.result(
            "T/S: estimated decode tokens/s of one sequence with 4k tokens of context, and at its CONTEXT"
            + ("; sorted by the 4k figure" if sort == "speed" else "")
        )
        for line in table_text(entries):
            output.result(line)
        for c in card_list:
            for n in c.hardware.notes:
                output.note(f"{c.label}: {n}")
    if not any(e.plan.runnable for e in entries):  # no pair runs, on the GPU or partly on the CPU
        raise click.exceptions.Exit(EXIT_NO_FIT)
