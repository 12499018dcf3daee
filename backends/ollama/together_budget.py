"""Which combinations of several planned models fit in memory at once: the budget behind llama-server's
router (``--models-max``) and llama-swap's groups.

Both start each model as its own llama-server process with the plan's flags (its context, slots, cache
type, batch, GPU) and neither looks at memory: the router unloads the least recently used model past
``--models-max`` models (tools/server/server-models.cpp server_lru_sched::pick_victim, b11312), llama-swap
unloads by its groups. So every combination is checked here the way the plan checks the whole set: the
models' requests replayed through Ollama's scheduler at the plan's settings and each model's context
(kvadvise.backends.ollama.together.stays). Memory only grows with a model added, so a combination is only
checked when every combination one model smaller fits.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.together import Combinations
from kvadvise.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kvadvise.backends.ollama.scheduler import Gpu, Residency
    from kvadvise.backends.ollama.together import Together
    from kvadvise.planner.hardware import Hardware

MAX_MODELS = (
    10  # 1,023 combinations at most: more models that do not all fit are not planned combination by combination
)


def everything(refs: Sequence[str]) -> Combinations:
    """All the models fit together, so every part of them does (memory only grows with a model added)."""
    refs = tuple(refs)
    return Combinations(refs, (refs,), len(refs), (), (refs,), ())


def combinations_of(refs: Sequence[str], fits: Callable[[tuple[str, ...]], bool]) -> Combinations:
    """Every combination that ``fits``, the largest safe ``--models-max``, and groups (each model in the
    first group it fits beside, a new group else)."""
    if len(refs) > MAX_MODELS:
        raise InputError(
            f"{len(refs)} models: the router's limit is planned for at most {MAX_MODELS} (every combination is checked)",
            hint="plan fewer models at once",
        )
    refs = tuple(refs)
    ok: set[tuple[str, ...]] = set()
    failed_at: dict[int, list[tuple[str, ...]]] = {}
    for k in range(1, len(refs) + 1):
        for combo in itertools.combinations(refs, k):
            smaller = [c for c in itertools.combinations(combo, k - 1)] if k > 1 else []
            if all(c in ok for c in smaller) and fits(combo):
                ok.add(combo)
            else:
                failed_at.setdefault(k, []).append(combo)
    alone_short = tuple(c[0] for c in failed_at.get(1, ()))
    models_max = 0
    if not alone_short:
        models_max = next((k - 1 for k in range(1, len(refs) + 1) if failed_at.get(k)), len(refs))
    over = tuple(failed_at.get(models_max + 1, ())) if models_max else ()
    groups: list[tuple[str, ...]] = []
    for r in refs:
        if r in alone_short:
            continue
        for i, g in enumerate(groups):
            joined = tuple(x for x in refs if x in (*g, r))
            if joined in ok:
                groups[i] = joined
                break
        else:
            groups.append((r,))
    largest = tuple(
        c
        for c in sorted(ok, key=lambda c: (-len(c), [refs.index(r) for r in c]))
        if not any(set(c) < set(o) for o in ok)
    )
    return Combinations(refs, largest, models_max, over, tuple(groups), alone_short)


def plan_combinations(t: Together, hw: Hardware, *, headless: bool) -> Combinations:
    """The combinations of ``t``'s models that stay loaded together: each replayed alone on the machine at
    the plan's settings and the context each model is written with (kvadvise.backends.ollama.together
    routed). When the plan keeps them all loaded, every part of them fits: nothing to replay."""
    from kvadvise.backends.ollama.scheduler import scheduler_gpus
    from kvadvise.backends.ollama.together import _replayer, routed, stays

    if t.fits:
        return everything([m.ref for m in t.models])
    by_ref = {m.ref: m for m in t.models}
    s = t.final_settings
    written = routed(t)
    ctxs = {r.name: r.config.n_ctx // max(1, r.config.n_parallel) for r in written}
    pinned = {r.name: r.device for r in written if r.device}  # -dev CUDAn: the GPU the files pin it to
    gpus = scheduler_gpus(hw, headless=headless)

    def replay(refs: Sequence[str], on: Sequence[Gpu]) -> Residency:
        models = [by_ref[r] for r in refs]
        return _replayer(models, hw, on, ())(replace(s, max_loaded=len(refs)), ctxs)

    def fits(combo: tuple[str, ...]) -> bool:
        if combo and all(r in pinned for r in combo):
            # each model pinned to one GPU (-dev CUDAn, several GPUs): each GPU holds what is pinned to it
            for dev in sorted({pinned[r] for r in combo}):
                refs = [r for r in combo if pinned[r] == dev]
                on = [g for g in gpus if g.device_name == dev]
                if not stays(replay(refs, on), [by_ref[r] for r in refs]):
                    return False
            return True
        res = replay(combo, gpus)
        if not stays(res, [by_ref[r] for r in combo]):
            return False
        # pinned models beside one spread over the GPUs: counted as fitting only where the scheduler puts
        # each pinned model on its own GPU (else not: never more than fits)
        for ref in (r for r in combo if r in pinned):
            step = next(st for st in reversed(res.steps) if st.model == ref and st.action in ("load", "reuse"))
            if len(step.gpus) != 1 or pinned[ref] != sched.device_name(gpus, step.gpus[0]):
                return False
        return True

    return combinations_of([m.ref for m in t.models], fits)


def names(combo: Sequence[str]) -> str:
    return " + ".join(combo)
