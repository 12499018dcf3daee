"""The explanation of a plan, in words: the budget, the target, why this cache type, what it costs,
and what would make a plan fit that does not. Numbers come from the recommender's search; this
module only says them."""

from __future__ import annotations

from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import CTX_PAD, MemoryEstimate, RunConfig, estimate
from kvadvise.planner.policy import (
    F16,
    F16_K_ARCHS,
    HIGH_GQA_RATIO,
    KV,
    Q8_0,
    Option,
    Policy,
    config_at,
    gqa_ratio,
    kv_name,
    needs_opt_in,
    no_quantized_fa_kernel,
)
from kvadvise.planner.quality import THRESHOLD_SOURCE, CacheQuality

GIB = 1 << 30
MIB = 1 << 20


def _gb(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _short(kv: KV) -> str:
    return kv[0].type_name if kv[0] == kv[1] else f"{kv[0].type_name} K / {kv[1].type_name} V"


def _name(o: Option) -> str:
    return _short((o.type_k, o.type_v))


def budget_line(budget: Budget) -> str:
    """``budget: X free on the GPU minus ... = Y``, with what is kept free and why."""
    where = "the GPU" if budget.device != "cpu" else "system RAM"
    s = (
        f"budget: {_gb(budget.free_bytes)} free on {where} minus a {budget.margin_bytes / MIB:,.0f} MiB margin"
        " (what llama.cpp's --fit keeps free)"
    )
    for n in budget.headroom_notes:
        s += f", minus {n}"
    return s + f" = {_gb(budget.budget_bytes)}"


def _measured(policy: Policy, o: Option) -> CacheQuality | None:
    return None if policy.quality is None else policy.quality.of((o.type_k, o.type_v))


def _measured_bad(policy: Policy, o: Option) -> bool:
    return policy.quality is not None and policy.quality.rejects((o.type_k, o.type_v))


def rejected_as_measured(policy: Policy, options: list[Option]) -> list[str]:
    """One line per cache type the measurement on this model keeps out (kvadvise.planner.quality)."""
    if policy.quality is None or policy.fixed_kv is not None:
        return []
    out = []
    for o in options:
        q = _measured(policy, o)
        if q is not None and q.too_lossy():
            out.append(
                f"{kv_name((o.type_k, o.type_v))} not chosen: measured on this model (kvadvise verify quality): "
                f"{q.text()}; worse than "
                f"the threshold, {THRESHOLD_SOURCE}"
            )
    return out


def reasons(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    policy: Policy,
    options: list[Option],
    chosen: Option,
    target: int,
    why: str,
    n_ctx_seq: int,
    est: MemoryEstimate,
    fits: bool,
    would_fit: str,
) -> list[str]:
    """Why this configuration: the budget, the target, the cache type and what it costs; ``would_fit``:
    what would make it fit (said when it does not)."""
    where = "the GPU" if budget.device != "cpu" else "system RAM"
    out = [budget_line(budget)]
    goal = f"target: {target:,} tokens per sequence"
    if policy.use:
        goal += f" (--use {policy.use})"
    elif why:
        goal += f" ({why})"
    out.append(goal)
    if not fits:
        several = len(budget.device_budgets) == len(est.devices) > 1
        over = (
            [(d, x) for d, x in zip(est.devices, budget.device_budgets, strict=True) if d.total_bytes > x]
            if several
            else []
        )
        if over:  # several devices: each holds its share of the layers within its own budget
            out.append(
                f"does not fit at {n_ctx_seq:,} tokens: "
                + "; ".join(f"{d.name} needs {_gb(d.total_bytes)} of its {_gb(x)}" for d, x in over)
                + " (each device holds its share of the layers: -ts, else by free memory)"
            )
        else:
            room = _gb(budget.budget_bytes)
            if budget.budget_bytes <= 0:  # "0.00 GiB" alone reads as a fault: the margin took all of it
                reserved = "margin and headroom" if budget.headroom_bytes else "margin"
                room += (
                    f" ({_gb(budget.free_bytes)} free, all of it the {budget.margin_bytes / MIB:,.0f} MiB {reserved} "
                    "kept free; --margin sets the margin)"
                )
            out.append(f"does not fit: {_gb(est.device_bytes)} at {n_ctx_seq:,} tokens, {where} has {room}")
        out.append(would_fit)
        return out
    f16 = next((o for o in options if o.type_k == F16 and o.type_v == F16), None)
    q8 = next((o for o in options if o.type_k == Q8_0 and o.allowed), None)
    # the opt-in cache the levers quote: the one that reaches furthest (q4_0 K/V where offered, not K q8_0 / V q4_0,
    # the first in CACHE_CHOICES), named as the options table names it
    q4 = max(
        (o for o in options if needs_opt_in((o.type_k, o.type_v)) and not _measured_bad(policy, o)),
        key=lambda o: o.n_ctx_max,
        default=None,
    )
    if chosen.type_k == F16 and chosen.type_v == F16:
        if chosen.reaches_target:
            out.append("f16 K/V: it reproduces tokens exactly, and it reaches the target")
        elif not policy.repeatable and no_quantized_fa_kernel(spec, base, policy) is not None:
            out.append("f16 K/V: this build has no flash-attention kernel for a quantized cache here (below)")
        else:
            out.append(
                "f16 K/V"
                + (" (--repeatable)" if policy.repeatable else "")
                + ": quantized caches do not reproduce tokens exactly"
            )
    elif f16 is not None:
        need = estimate(spec, config_at(base, target, (F16, F16), f16.flash_attn, budget.device)).device_bytes
        out.append(
            f"f16 K/V at {target:,} tokens needs {_gb(need)}; {where} has {_gb(budget.budget_bytes)} "
            f"(f16 reaches {f16.n_ctx_max:,} tokens)"
        )
        if needs_opt_in((chosen.type_k, chosen.type_v)) and (measured := _measured(policy, chosen)) is not None:
            out.append(
                f"{_name(chosen)}: q4_0 because you allowed it (--allow-q4 or -ctk/-ctv q4_0); measured on this "
                f"model (kvadvise verify quality): {measured.text()}"
            )
        elif needs_opt_in((chosen.type_k, chosen.type_v)):
            out.append(
                f"{_name(chosen)}: q4_0 because you allowed it (--allow-q4 or -ctk/-ctv q4_0); warning: "
                "q4_0 has a small-medium loss in precision that may be more noticeable at higher context sizes "
                "(Ollama FAQ); q8_0 usually has no noticeable impact"
            )
        elif (measured := _measured(policy, chosen)) is not None:
            out.append(
                f"{_name(chosen)}: "
                + ("it reaches the target; " if chosen.reaches_target else "it gets furthest; ")
                + f"measured on this model (kvadvise verify quality): {measured.text()}, within the threshold "
                "(Q6_K weights on LLaMA 3 8B); a quantized cache does not reproduce tokens exactly "
                "(--repeatable keeps f16)"
            )
        else:
            out.append(
                f"{_name(chosen)}: "
                + ("it reaches the target; " if chosen.reaches_target else "it gets furthest; ")
                + "q8_0 usually has no noticeable impact on quality (Ollama FAQ; KL divergence about 0.001 on an "
                "8B model, llama.cpp PR #7412), but a quantized cache does not reproduce tokens exactly "
                "(--repeatable keeps f16)"
            )
    elif policy.fixed_kv is not None and needs_opt_in(policy.fixed_kv):
        out.append("warning: you chose a q4_0 cache: a small-medium loss in precision at long context (Ollama FAQ)")
    out += rejected_as_measured(policy, options)
    if spec.architecture in F16_K_ARCHS:
        out.append(
            "gpt-oss keeps an f16 K cache: with attention sinks a quantized K badly distorts its output "
            "(TheTom/llama-cpp-turboquant#305; Ollama disabled quantized KV for gpt-oss in 2025)"
        )
    ratio = gqa_ratio(spec)
    if chosen.type_k != F16 and ratio >= HIGH_GQA_RATIO:
        out.append(
            f"note: high GQA ({ratio} query heads per KV head): a quantized cache may lose more precision (Ollama FAQ)"
        )
    if not chosen.reaches_target:
        best = _name(chosen)
        levers = [
            f"this smaller context ({n_ctx_seq:,} tokens, chosen)",
            "fewer parallel slots" if base.n_parallel > 1 else "",
            "a smaller quantization of the weights or a smaller model",
            "a GPU with more free memory",
            "--allow-cpu (part of the model on the CPU: slower)",
        ]
        if q4 is not None and not q4.allowed and q4.n_ctx_max > chosen.n_ctx_max:
            levers.append(f"--allow-q4 ({_name(q4)} reaches {q4.n_ctx_max:,} tokens, with a loss in precision)")
        out.append(
            f"the target is not reached: {best} gets {chosen.n_ctx_max:,} tokens at most; levers: "
            + "; ".join(x for x in levers if x)
        )
    elif q8 is not None and q4 is not None and not q4.allowed and chosen.type_k != F16:
        out.append(f"{_name(q4)} would reach {q4.n_ctx_max:,} tokens; it is used only with --allow-q4 (less precise)")
    if chosen.flash_attn:
        why = "needed for a quantized V cache, and it" if chosen.type_v != F16 else "it"
        out.append(f"flash attention on: {why} removes the n_ctx × n_head attention-score buffer")
    elif base.flash_attn == "off":
        out.append("flash attention off (as asked): the V cache stays f16 (a quantized V needs flash attention)")
    kept = budget.free_bytes - est.device_bytes
    out.append(
        f"uses {_gb(est.device_bytes)} of {_gb(budget.budget_bytes)}: 100% on {where}; "
        f"{_gb(kept)} of {where} stays free"
    )
    if base.n_parallel > 1:
        out.append(f"{base.n_parallel} parallel sequences of {n_ctx_seq:,} tokens each")
    return out


def what_would_fit(
    spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy, kv: KV, one_slot_ctx: int | None
) -> str:
    """The shortest honest list of what would make the target fit, with cache types ``kv`` (the most
    quantized allowed); ``one_slot_ctx``: how far one slot reaches (with several)."""
    ctx = max(policy.min_ctx, CTX_PAD) if policy.min_ctx else CTX_PAD
    fa = base.flash_attn != "off"
    need = estimate(spec, config_at(base, ctx, kv, fa, budget.device)).device_bytes
    short = need - budget.budget_bytes
    tips = []
    if budget.budget_bytes <= 0:
        tips.append(f"a margin smaller than {_gb(budget.margin_bytes)} (--margin): it leaves no budget at all")
    if short > 0:
        tips.append(f"{_gb(short)} more memory (a bigger card, or unload other models)")
        # a lower-bit quant of the same model saves at most about half its weights
        if spec.weights_bytes and short < spec.weights_bytes // 2:
            tips.append(
                f"a smaller quantization of the weights (at least {_gb(short)} smaller than "
                f"the {_gb(spec.weights_bytes)} they take now)"
            )
        if budget.device != "cpu" and policy.gpu_only:
            tips.append("without --gpu-only (the plan with part on the CPU)")
    if one_slot_ctx is not None:
        tips.append(f"fewer parallel slots (with 1 slot: {one_slot_ctx:,} tokens)")
    return "would fit with " + "; or ".join(tips) if tips else "would fit with a larger memory budget"


def fits_with_another(now: KV, kv: KV, device_bytes: int, budget: Budget) -> str:
    """A ``--ctx`` that does not fit with ``now`` fits with ``kv``."""
    return (
        f"does not fit with {_short(now)}; fits with {kv_name(kv)} ({_gb(device_bytes)} of {_gb(budget.budget_bytes)})"
    )


def no_fa_kernel(missing: str) -> str:
    """Why the plan is without flash attention on a CUDA card."""
    return (
        f"flash attention off: CUDA has no kernel for this model ({missing}; ggml-cuda fattn.cu), so llama.cpp "
        "runs without it and the plan is sized for that (a quantized V cache, which needs it, is not chosen)"
    )


def quantized_cache_refused(missing: str) -> str:
    """Why a quantized cache is not chosen on an older build."""
    return (
        f"a quantized cache is not chosen: {missing}; with flash attention on, every attention would run on the "
        "CPU (ggml-cuda fattn.cu), and without it a quantized V cache is refused"
    )


def fits_up_to(now: KV, best: KV, n_ctx_seq: int) -> str:
    """A ``--ctx`` that no cache type fits: how far the best one reaches."""
    if n_ctx_seq <= 0:
        return f"does not fit with {_short(now)}, and no cache type fits even {CTX_PAD} tokens"
    return f"does not fit with {_short(now)}; fits up to {n_ctx_seq:,} tokens per sequence (with {kv_name(best)})"


def no_offload(spec: ModelSpec, budget: Budget) -> tuple[str, ...]:
    """Why there is no partial-offload plan, where the reason is not that nothing fits."""
    if budget.device == "cpu":
        return ("partial offload: nothing to move: the model already runs on the CPU",)
    if not any(spec.layer_bytes):
        return (
            "partial offload: no figure: the per-layer sizes are unknown for this model "
            "(a profile or config.json); plan the GGUF file itself for one",
        )
    return ()
