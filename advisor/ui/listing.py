"""A table of many models on one budget, one line each: what a backend's listing command
(``kvadvise ollama --installed``, ``kvadvise gguf DIR``) prints. The backend finds the models;
this module sizes them (kvadvise.planner.inventory), sorts them and renders text or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvadvise.text import one_line
from kvadvise.ui import output

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.inventory import ModelFit, RunSettings

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the runtime holds of the model now (Ollama: /api/ps)."""

    processor: str  # as `ollama ps` prints it: "100% GPU", "48%/52% CPU/GPU"
    size_bytes: int
    size_vram_bytes: int
    context_length: int | None


@dataclass(frozen=True, slots=True)
class Listed:
    """One model of the collection, as the backend found it."""

    name: str
    source: str  # where it was read: store:<manifest>, api:<url>, a file path
    size_bytes: int  # on disk (the GGUF blob or file, projector included when known)
    spec: ModelSpec | None  # None when it could not be read (see error)
    error: str | None = None
    digest: str | None = None  # sha256 of the manifest (Ollama's ID)
    model_ctx: int | None = None  # the model's own context per slot (Ollama: its num_ctx parameter)
    extra_margin_bytes: int = 0  # what the runtime keeps free besides for this model (a vision projector)
    loaded: Loaded | None = None
    on_server: bool | None = None  # listed by the server (/api/tags); None when no server was asked
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a listing: the model, how it fits, the budget it was checked against."""

    item: Listed
    fit: ModelFit | None
    budget: Budget | None


def survey(
    items: Sequence[Listed], settings: RunSettings, hw: Hardware | None, margin_bytes: int, *, headless: bool = False
) -> tuple[Budget | None, list[Row]]:
    """Size every model on the budget of ``hw``, by the rule of every plan (kvadvise.planner.budget):
    each model with its own headroom and a projector's extra margin."""
    from kvadvise.planner.budget import plan_budget
    from kvadvise.planner.inventory import fit_of

    base = plan_budget(hw, margin_bytes, headless=headless) if hw is not None else None
    rows = []
    for it in items:
        budget = base
        if it.spec is not None and hw is not None:
            budget = plan_budget(hw, margin_bytes + it.extra_margin_bytes, spec=it.spec, headless=headless)
        fit = fit_of(it.spec, settings, budget, model_ctx=it.model_ctx) if it.spec is not None else None
        rows.append(Row(it, fit, budget))
    return base, rows


def sort_rows(rows: list[Row], key: str) -> list[Row]:
    """name: A to Z; size: largest first; context: the longest f16 context first (models that cannot be
    read last, in name order)."""
    from kvadvise.planner.policy import LISTED_CACHE_TYPES

    by_name = sorted(rows, key=lambda r: r.item.name.lower())
    if key == "size":
        return sorted(by_name, key=lambda r: -r.item.size_bytes)
    if key == "context":
        return sorted(by_name, key=lambda r: (r.fit is None, *(-_reach(r, t.type_name) for t in LISTED_CACHE_TYPES)))
    return by_name


def _reach(r: Row, t: str) -> int:
    return (r.fit.max_ctx.get(t) or 0) if r.fit is not None else 0


def row_dict(r: Row) -> dict[str, Any]:
    it, f = r.item, r.fit
    spec = it.spec
    return {
        "name": it.name,
        "source": it.source,
        "digest": it.digest,
        "size_bytes": it.size_bytes,
        "architecture": spec.architecture if spec is not None else None,
        "file_type": spec.file_type if spec is not None else None,
        "n_ctx_train": spec.n_ctx_train if spec is not None else None,
        "max_ctx": dict(f.max_ctx) if f is not None else None,
        "run_ctx": f.run_ctx if f is not None else None,
        "run_cache_type": f.run_cache_type if f is not None else None,
        "needs_bytes": f.needs_bytes if f is not None else None,
        "budget_bytes": r.budget.budget_bytes if r.budget is not None else None,
        "fits": f.fits if f is not None else None,
        "loaded": None
        if it.loaded is None
        else {
            "processor": it.loaded.processor,
            "size": it.loaded.size_bytes,
            "size_vram": it.loaded.size_vram_bytes,
            "context_length": it.loaded.context_length,
        },
        "on_server": it.on_server,
        "error": it.error,
        "notes": list(it.notes),
    }


def listing_dict(budget: Budget | None, settings: RunSettings, rows: list[Row], sort: str) -> dict[str, Any]:
    from kvadvise.render import budget_dict

    return {
        "budget": budget_dict(budget) if budget is not None else None,
        "settings": {
            "n_parallel": settings.n_parallel,
            "flash_attn": settings.flash_attn,
            "cache_type": settings.cache_type.type_name,
            "default_ctx": settings.default_ctx,
        },
        "sort": sort,
        "models": [row_dict(r) for r in rows],
    }


def _size(n: int) -> str:
    if n >= 10**8:
        return f"{n / 1e9:.1f} GB"
    if n >= 10**5:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} KB" if n >= 10**3 else f"{n} B"


def _ctx(v: int | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "no fit"
    return f"{v // 1024}k" if v % 1024 == 0 else f"{v:,}"


def _needs(r: Row) -> str:
    f = r.fit
    if f is None:
        return ""
    what = f"{f.needs_bytes / GIB:.1f} GiB at {_ctx(f.run_ctx)} {f.run_cache_type}"
    if f.fits is None or r.budget is None:
        return what
    if f.fits:
        return what + ": fits"
    return what + f": {(f.needs_bytes - r.budget.budget_bytes) / GIB:.1f} GiB short"


def listing_text(budget: Budget | None, settings: RunSettings, rows: list[Row], *, show_loaded: bool) -> list[str]:
    from kvadvise.planner.policy import LISTED_CACHE_TYPES
    from kvadvise.render import fmt_bytes

    if budget is None:
        head = "no budget (--no-hardware): contexts not computed"
    else:
        where = "GPU" if budget.device != "cpu" else "system RAM"
        head = (
            f"budget {fmt_bytes(budget.budget_bytes)} on the {where} ({budget.source}, after a "
            f"{budget.margin_bytes / (1 << 20):,.0f} MiB margin"
            + "".join(f" and {n}" for n in budget.headroom_notes)
            + ")"
        )
    head += f"; {settings.n_parallel} slot{'s' if settings.n_parallel > 1 else ''}"
    head += f", flash attention {'on' if settings.flash_attn else 'off'}, cache {settings.cache_type.type_name} now"
    width = max([len("MODEL"), *(len(one_line(r.item.name)) for r in rows)])
    cols = f"{'MODEL':<{width}}  {'SIZE':>8}  {'ARCH':<12} " + " ".join(
        f"{t.type_name.upper() + ' CTX':>8}" for t in LISTED_CACHE_TYPES
    )
    if show_loaded:
        cols += f"  {'LOADED':<16}"
    lines = [head, cols + "  NEEDS (context it runs at, cache now)"]
    for r in rows:
        it, f = r.item, r.fit
        arch = it.spec.architecture if it.spec is not None else "?"
        line = f"{one_line(it.name):<{width}}  {_size(it.size_bytes):>8}  {one_line(arch)[:12]:<12} "
        reach = [None if f is None else f.max_ctx.get(t.type_name) for t in LISTED_CACHE_TYPES]
        line += " ".join(f"{'-':>8}" if f is None else f"{_ctx(n):>8}" for n in reach)
        if show_loaded:
            loaded = (
                it.loaded.processor
                if it.loaded is not None
                else ("-" if it.on_server is not False else "not on server")
            )
            line += f"  {loaded:<16}"
        line += "  " + (_needs(r) if it.error is None else f"error: {it.error}")
        lines.append(line.rstrip())
    return lines


def show_listing(
    rows: list[Row],
    budget: Budget | None,
    settings: RunSettings,
    *,
    sort: str,
    as_json: bool,
    show_loaded: bool,
    extra_json: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> None:
    rows = sort_rows(rows, sort)
    if as_json:
        output.result_json(listing_dict(budget, settings, rows, sort) | (extra_json or {}) | {"notes": list(notes)})
        return
    for line in listing_text(budget, settings, rows, show_loaded=show_loaded):
        output.line(line)  # a model name with a newline in it must not forge a row
    for n in notes:
        output.note(n)
