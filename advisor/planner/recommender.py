"""The recommender: the search for the context length, K/V cache types and flash attention that
keep the model inside the memory budget (100% on the GPU). What it may pick is the policy's
(kvadvise.planner.policy), the budget is kvadvise.planner.budget's, the words that explain the
pick are kvadvise.planner.reasons'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.errors import ConfigError, DoesNotFit, InputError
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import reasons as words
from kvadvise.planner.budget import Budget
from kvadvise.planner.fitsplit import refit as refitted
from kvadvise.planner.memory import CTX_PAD, INT32_MAX, MemoryEstimate, RunConfig, estimate
from kvadvise.planner.policy import (
    CTX_ROUND,
    F16,
    KV,
    Option,
    Policy,
    allowed_kvs,
    choices,
    config_at,
    default_target_ctx,
    no_fa_kernel,
    no_quantized_fa_kernel,
)

if TYPE_CHECKING:  # the speed model loads only for a plan with a GPU budget, the offload with --allow-cpu
    from kvadvise.planner.offload import Offload
    from kvadvise.planner.speed import SpeedEstimate


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The configuration picked, its estimate and budget, and why."""

    config: RunConfig
    estimate: MemoryEstimate
    budget: Budget
    fits: bool
    target_ctx: int  # per sequence
    reasons: tuple[str, ...]
    options: tuple[Option, ...]
    decode_tokens_per_s: float | None
    speed_note: str | None
    offload: Offload | None = None  # with --allow-cpu, when the target needs part of the model on the CPU
    speed: SpeedEstimate | None = None  # the decode estimate at 4k and at the context (None: it does not fit)


def c_cap(base: RunConfig) -> int:
    """The most tokens per sequence llama.cpp's -c holds over ``base``'s slots (int32, common/arg.cpp std::stoi),
    a multiple of 256: a context searched or aimed for beyond it is no command line (1,024,000 tokens trained
    x 3,000 slots is 3,072,000,000)."""
    return max(CTX_PAD, INT32_MAX // max(1, base.n_parallel) // CTX_PAD * CTX_PAD)


def max_context(
    spec: ModelSpec, base: RunConfig, kv: KV, fa: bool, budget: Budget, *, refit: bool = False, as_run: bool = True
) -> int:
    """The largest context per sequence (a multiple of 256, at most n_ctx_train) that fits the budget.

    Memory grows monotonically with the context, so a search over multiples of 256 that keeps
    one that fits below one that does not inverts the memory model exactly. Memory is close to
    linear in the context (the KV cache), so the next probe is where the line through the two
    ends crosses the budget, and the one after it just above: two or three estimates where a
    bisection takes ten; bisection takes over if that does not close in.
    """
    cap = min(max(CTX_PAD, spec.n_ctx_train // CTX_PAD * CTX_PAD) if spec.n_ctx_train else 1 << 20, c_cap(base))

    def slack(units: int) -> int:
        cfg = config_at(base, units * CTX_PAD, kv, fa, budget.device)
        s = budget.slack_bytes(estimate(spec, cfg))
        if s < 0 and refit:  # ``refit``: the layers moved between the devices as llama.cpp's --fit moves them
            moved = refitted(spec, cfg, budget, as_run=as_run)
            if moved is not None:
                return budget.slack_bytes(moved.estimate)
        return s

    hi = cap // CTX_PAD  # in units of 256
    s_hi = slack(hi)
    if s_hi >= 0:  # the common case on a roomy budget: one estimate
        return cap
    lo, s_lo = 1, slack(1)
    if s_lo < 0:
        return 0
    for step in range(64):  # invariant: lo fits, hi does not
        if hi - lo <= 1:
            break
        if step < 4:
            mid = lo + (hi - lo) * s_lo // (s_lo - s_hi)
            mid = min(max(mid, lo + 1), hi - 1)
        else:
            mid = (lo + hi) // 2
        s_mid = slack(mid)
        if s_mid >= 0:
            lo, s_lo = mid, s_mid
            if step < 4 and hi - lo > 1:  # the line's crossing is at or just below the answer: look above
                s_up = slack(lo + 1)
                if s_up < 0:
                    hi, s_hi = lo + 1, s_up
                else:
                    lo, s_lo = lo + 1, s_up
        else:
            hi, s_hi = mid, s_mid
    return lo * CTX_PAD


# llama.cpp's --fit shrinks a context it picks no further than --fit-ctx (common/arg.cpp fit_params_min_ctx = 4096) and
# moves layers to the CPU instead: a recommended context below it, 100 % on the GPU, is not one an expert runs (a
# system prompt and a source file do not fit); Ollama's own default on a card under 24 GiB is the same 4,096
FIT_MIN_CTX = 4096


def recommend(
    spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy, *, fit_floor_on: bool = True
) -> Recommendation:
    """Pick the config; ``base`` carries the user's n_parallel, batch sizes, kv_unified and swa_full.
    ``fit_floor_on`` False: no FIT_MIN_CTX floor (where the partial offload at it does not run: the GPU's plan)."""
    base = replace(base, device=budget.device)
    n_ctx_train = min(spec.n_ctx_train or (1 << 20), c_cap(base))
    reasons: list[str] = []
    if policy.target_ctx:
        want, why = policy.target_ctx, ""
    elif policy.use == "long":
        want, why = n_ctx_train, "the model's training context"
    else:
        want, why = default_target_ctx(budget)
    # a runtime that runs at least ctx_floor tokens (Ollama: a vision model's 2,048) runs that when asked for fewer
    runtime_floor = min(policy.ctx_floor, n_ctx_train)
    target = max(min(want, n_ctx_train), runtime_floor)
    if policy.min_ctx > target and not policy.target_ctx:
        # --min-ctx above the default target: the target is at least what is asked for (the partial offload aims at it)
        target = min(policy.min_ctx, n_ctx_train)
    # below FIT_MIN_CTX, or below a --min-ctx (which says what is enough), the plan that runs keeps part of the model
    # on the CPU (docs/commands.md: --min-ctx "is reached by the plan that runs, on the GPU or partly on the CPU");
    # with --gpu-only the GPU's context stands (and --min-ctx fails, exit 3)
    # (not on the CPU: there is no part to move; not where the partial offload at it does not run: fit_floor_on)
    least = min(policy.min_ctx, n_ctx_train) if policy.min_ctx else min(FIT_MIN_CTX, target) if fit_floor_on else 0
    fit_floor = 0 if policy.gpu_only or budget.device == "cpu" else least
    floor = max(runtime_floor, fit_floor)
    if want > n_ctx_train:
        past = (
            "the model's training context"
            if n_ctx_train < c_cap(base)
            else f"what -c holds over {base.n_parallel:,} slots"
        )
        reasons.append(f"target {want:,} is past {past}; capped at {n_ctx_train:,}")
    options: list[Option] = []
    for kv, fa, allowed in choices(spec, base, policy):
        n_max = max_context(spec, base, kv, fa, budget, refit=policy.fit_split, as_run=policy.fit_as_run)
        at_max = (
            estimate(spec, _refit(spec, config_at(base, n_max, kv, fa, budget.device), budget, policy)).device_bytes
            if n_max
            else 0
        )
        options.append(Option(kv[0], kv[1], fa, n_max, at_max, n_max >= target, allowed))
    usable = [o for o in options if o.allowed]
    if not usable:
        raise InputError("no cache type is usable for this model with these settings")

    chosen = next((o for o in usable if o.reaches_target), None)
    if chosen is None:
        chosen = max(usable, key=lambda o: o.n_ctx_max)  # first (least quantized) among equals
    n_ctx_seq = min(target, chosen.n_ctx_max) if chosen.n_ctx_max else CTX_PAD
    if chosen.n_ctx_max and target <= chosen.n_ctx_max:  # the target is reached: never rounded below it
        up = -(-target // CTX_ROUND) * CTX_ROUND
        n_ctx_seq = up if up <= chosen.n_ctx_max else min(-(-target // CTX_PAD) * CTX_PAD, chosen.n_ctx_max)
    elif n_ctx_seq >= CTX_ROUND:  # short of it: the largest round figure that fits
        n_ctx_seq = n_ctx_seq // CTX_ROUND * CTX_ROUND
    raised = n_ctx_seq < floor
    n_ctx_seq = max(n_ctx_seq, floor)  # below the floor is not what runs: planned at it (it may not fit)
    cfg = _refit(
        spec,
        config_at(base, n_ctx_seq, (chosen.type_k, chosen.type_v), chosen.flash_attn, budget.device),
        budget,
        policy,
    )
    est = estimate(spec, cfg)
    fits = budget.fits(est)
    would_fit = "" if fits else _what_would_fit(spec, base, budget, policy)
    reasons += words.reasons(spec, base, budget, policy, options, chosen, target, why, n_ctx_seq, est, fits, would_fit)
    if raised:
        alone = f" (the GPU alone reaches {chosen.n_ctx_max:,})" if chosen.n_ctx_max else ""
        if runtime_floor and chosen.n_ctx_max < runtime_floor:
            reasons.append(f"{runtime_floor:,} tokens per slot: the fewest the runtime runs this model with{alone}")
        if floor > runtime_floor and policy.min_ctx:
            reasons.append(
                f"--min-ctx {policy.min_ctx:,}{alone}: the plan that runs keeps part of the model on the CPU"
            )
        elif floor > runtime_floor:
            reasons.append(
                f"{floor:,} tokens per slot{alone}: fewer is not a context to work in; llama.cpp's --fit shrinks a "
                f"context no further (--fit-ctx {FIT_MIN_CTX:,}) and keeps part of the model on the CPU instead"
            )
    if (missing := no_fa_kernel(spec, base)) is not None:
        reasons.append(words.no_fa_kernel(missing))
    elif (missing := no_quantized_fa_kernel(spec, base, policy)) is not None and chosen.type_k == F16:
        reasons.append(words.quantized_cache_refused(missing))
    if cfg.tensor_split != base.tensor_split:
        reasons.append(refit_reason(base.tensor_split, cfg.tensor_split))

    tps, note, speed = decode_speed(spec, cfg, budget) if fits else (None, None, None)
    offload = None
    if wants_offload(policy, fits, n_ctx_seq < target):
        if budget.device == "cpu":  # the model already runs on the CPU
            reasons += words.no_offload(spec, budget) if policy.allow_cpu else ()
        else:
            from kvadvise.planner.offload import plan_offload

            offload, notes = plan_offload(
                spec, base, budget, target, (chosen.type_k, chosen.type_v), policy, shrink=True
            )
            by_fit_floor = raised and floor > runtime_floor and not policy.min_ctx
            if by_fit_floor and chosen.n_ctx_max and (offload is None or not offload.runnable):
                # the partial offload the floor asked for does not run (the RAM): the GPU's own plan, below it
                return recommend(spec, base, budget, policy, fit_floor_on=False)
            reasons += notes if offload is not None else (*notes, *words.no_offload(spec, budget))
    # --min-ctx: the plan that runs reaches it, on the GPU or with part of the model on the CPU (the partial plan
    # the policy asks for: --allow-cpu, or a model the GPU cannot hold)
    reached = (fits and n_ctx_seq >= policy.min_ctx) or (offload is not None and offload.n_ctx >= policy.min_ctx)
    if policy.min_ctx and not reached:
        trained = spec.n_ctx_train and policy.min_ctx > spec.n_ctx_train and chosen.n_ctx_max >= spec.n_ctx_train
        raise DoesNotFit(
            f"nothing reaches --min-ctx {policy.min_ctx:,}: the best is {chosen.type_k.type_name}/"
            f"{chosen.type_v.type_name} at {chosen.n_ctx_max:,} tokens",
            # the search stops at the training context (docs/policy.md), not at the memory
            hint=(
                f"{spec.name} was trained on {spec.n_ctx_train:,} tokens, where the recommendation stops and "
                "llama-server caps each slot (server-context.cpp load_model); past it needs RoPE scaling "
                f"(--rope-scaling yarn --yarn-orig-ctx {spec.n_ctx_train}) and --override-kv "
                f"{spec.architecture}.context_length=int:N"
            )
            if trained
            else _what_would_fit(spec, base, budget, policy),
        )
    return Recommendation(cfg, est, budget, fits, target, tuple(reasons), tuple(options), tps, note, offload, speed)


def _refit(spec: ModelSpec, cfg: RunConfig, budget: Budget, policy: Policy) -> RunConfig:
    """``cfg``, or with llama.cpp's --fit split when the split by free memory does not fit and that one does
    (``policy.fit_split``: several devices, no -ts; kvadvise.planner.fitsplit)."""
    if not policy.fit_split or budget.fits(estimate(spec, cfg)):
        return cfg
    moved = refitted(spec, cfg, budget, as_run=policy.fit_as_run)
    return cfg if moved is None else moved.cfg


def refit_reason(by_free: tuple[float, ...], split: tuple[float, ...]) -> str:
    """What the refitted split is and why (a reason of the plan)."""
    free = ",".join(f"{x:g}" for x in by_free)
    layers = ",".join(f"{x:g}" for x in split)
    return (
        f"layers per device {layers} (-ts {layers}): the split by free memory ({free}) leaves a device short of its "
        "budget, so the layers are filled back to front as llama.cpp's --fit fills them (common/fit.cpp)"
    )


def wants_offload(policy: Policy, fits: bool, short_of_target: bool) -> bool:
    """A partial offload is planned for a plan that does not fit the GPU (the best plan that runs), unless
    --gpu-only; and with --allow-cpu for one that fits short of the target."""
    if policy.gpu_only:
        return False
    return not fits or (policy.allow_cpu and short_of_target)


def _what_would_fit(spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy) -> str:
    kv = (allowed_kvs(spec, base, policy) or [(F16, F16)])[-1]  # the most quantized allowed
    fa = base.flash_attn != "off"
    one = max_context(spec, replace(base, n_parallel=1), kv, fa, budget) if base.n_parallel > 1 else None
    return words.what_would_fit(spec, base, budget, policy, kv, one)


def fixed_ctx_alternatives(spec: ModelSpec, cfg: RunConfig, budget: Budget, policy: Policy) -> str | None:
    """For a ``--ctx`` that does not fit: which cache type would fit it, or how far it fits.

    "does not fit with f16; fits with q8_0 K/V (20.40 GiB)", or "fits up to N tokens per sequence with q8_0".
    """
    n_seq = max(CTX_PAD, (cfg.n_ctx or spec.n_ctx_train) // max(1, cfg.n_parallel))  # -c 0: the training context
    base = replace(cfg, n_ctx=0)
    now = (cfg.type_k, cfg.type_v)
    fa = cfg.flash_attn != "off"
    try:
        kvs = allowed_kvs(spec, base, replace(policy, fixed_kv=None))
    except ConfigError:
        return None
    for kv in kvs:
        if kv == now:
            continue
        e = estimate(spec, config_at(base, n_seq, kv, fa, budget.device))
        if budget.fits(e):
            return words.fits_with_another(now, kv, e.device_bytes, budget)
    best = max(((kv, max_context(spec, base, kv, fa, budget)) for kv in kvs or [now]), key=lambda t: t[1])
    return words.fits_up_to(now, *best)


def cache_for_ctx(spec: ModelSpec, cfg: RunConfig, budget: Budget, policy: Policy) -> tuple[RunConfig, tuple[str, ...]]:
    """``--ctx N`` without ``-ctk/-ctv``: the context is the user's, the cache types and flash attention are
    still the policy's (f16, then q8_0, q4_0 only when allowed): the first that fits 100 % on the GPU at that
    context; when none does, the most quantized allowed, for the plan with part on the CPU (the most of the
    model stays on the GPU). The notes say what was chosen over f16, and why, and a split refitted as llama.cpp's
    --fit refits it."""
    n_seq = max(CTX_PAD, (cfg.n_ctx or spec.n_ctx_train or CTX_PAD) // max(1, cfg.n_parallel))
    base = replace(cfg, n_ctx=0)
    try:
        candidates = [(kv, fa) for kv, fa, allowed in choices(spec, base, policy) if allowed]
    except ConfigError:
        return cfg, ()
    if not candidates:
        return cfg, ()
    first = candidates[0][0]

    def at_ctx(kv: KV, fa: bool) -> RunConfig:
        at = config_at(base, n_seq, kv, fa, cfg.device)
        # -kvu: -c is the one cache all the slots share (llama_context: n_ctx_seq = n_ctx), not a slot's share
        return replace(at, n_ctx=cfg.n_ctx) if cfg.kv_unified and cfg.n_ctx else at

    for kv, fa in candidates:
        at = _refit(spec, at_ctx(kv, fa), budget, policy)
        if budget.fits(e := estimate(spec, at)):
            notes = (
                []
                if kv == first
                else [f"{n_seq:,} tokens per sequence: " + words.fits_with_another(first, kv, e.device_bytes, budget)]
            )
            if at.tensor_split != cfg.tensor_split:
                notes.append(refit_reason(cfg.tensor_split, at.tensor_split))
            at = at if cfg.n_ctx else replace(at, n_ctx=0)  # -c 0 stays the training context, as asked
            return at, tuple(notes)
    kv, fa = candidates[-1]
    at = at_ctx(kv, fa)
    return (at if cfg.n_ctx else replace(at, n_ctx=0)), ()


def decode_speed(
    spec: ModelSpec, cfg: RunConfig, budget: Budget
) -> tuple[float | None, str | None, SpeedEstimate | None]:
    """The decode estimate of kvadvise.planner.speed at 4k and at the planned context per sequence (each
    GPU at its own bandwidth and share of the layers; a CPU plan at the system memory's bandwidth)."""
    from kvadvise.planner.speed import plan_decode

    est = plan_decode(spec, cfg, budget)
    if est is None:
        return None, None, None
    return est.points[-1][1], f"{est.text()}; {est.note}", est
