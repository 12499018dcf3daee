"""The recommender: context length, K/V cache types and flash attention that
keep the model inside the memory budget (100% on the GPU), and why.

Policy (also in README.md and in every recommendation's reasons):
1. f16 K/V when it reaches the target context: an f16 cache reproduces the
   tokens of a run exactly; a quantized cache (q8_0, q4_0) does not.
2. Otherwise the least quantized cache that reaches the target
   (q8_0 > q8_0 K with q4_0 V > q4_0).
3. If nothing reaches the target: the cache type that gets furthest.
4. Never a config that does not fit; if even the smallest context does not
   fit, say so (fits = false) and what would.
Flash attention is on whenever the model allows it: it is required for a
quantized V cache and removes the attention-score buffer that grows with
n_ctx × n_head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from kvadvise.errors import ConfigError, DoesNotFit, InputError
from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.hardware import Hardware
from kvadvise.planner.memory import CTX_PAD, MemoryEstimate, RunConfig, estimate
from kvadvise.planner.speed import Device, SpeedEstimate, seconds_per_token, weight_reads

F16, Q8_0, Q4_0 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
GIB = 1 << 30
MIB = 1 << 20
# llama.cpp's own fit keeps this much free per device (common/arg.cpp: -fitt, default 1024 MiB)
DEFAULT_MARGIN_BYTES = 1024 * MIB

# Cache types in order of preference: least quantized first.
CACHE_CHOICES: tuple[tuple[GGMLType, GGMLType], ...] = ((F16, F16), (Q8_0, Q8_0), (Q8_0, Q4_0), (Q4_0, Q4_0))
SAME_TYPE_CHOICES = tuple(c for c in CACHE_CHOICES if c[0] == c[1])  # Ollama: one type for K and V


@dataclass(frozen=True, slots=True)
class Budget:
    device: str  # "cuda" | "cpu"
    total_bytes: int
    free_bytes: int
    margin_bytes: int
    budget_bytes: int  # free - margin: what the model may take
    source: str  # nvml | profile:<id> | manual | ram
    n_gpu: int
    bandwidth_bytes_per_s: int | None
    bandwidth_source: str | None
    backend: str = "cuda"  # for the decode-speed estimate: cuda | metal | vulkan | cpu


@dataclass(frozen=True, slots=True)
class Policy:
    target_ctx: int = 0  # per sequence; 0 = the model's n_ctx_train
    min_ctx: int = 0  # per sequence; fail (exit 3) below it
    repeatable: bool = False  # f16 only: quantized caches do not reproduce tokens exactly
    same_type_kv: bool = False  # the runtime has one cache type for K and V (Ollama)
    use: str | None = None  # the --use profile the target came from
    fixed_kv: tuple[GGMLType, GGMLType] | None = None  # the user chose -ctk/-ctv: only the context is picked
    allow_cpu: bool = False  # also say what partial offload would reach the target


@dataclass(frozen=True, slots=True)
class Option:
    type_k: GGMLType
    type_v: GGMLType
    flash_attn: bool
    n_ctx_max: int  # per sequence, a multiple of 256; 0 when not even 256 tokens fit
    device_bytes_at_max: int  # 0 when nothing fits
    reaches_target: bool


@dataclass(frozen=True, slots=True)
class Recommendation:
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


# Typical dual-channel DDR5 throughput; the CPU side of a partial offload is bound by it.
CPU_BANDWIDTH_BYTES_PER_S = 60_000_000_000


@dataclass(frozen=True, slots=True)
class Offload:
    n_ctx: int  # per sequence: the target
    type_k: GGMLType
    type_v: GGMLType
    n_gpu_layers: int  # -ngl: llama.cpp offloads the output layer first, then the last repeating layers
    n_cpu_layers: int  # repeating layers kept on the CPU (the first ones)
    n_cpu_moe: int  # --n-cpu-moe N: the experts of the first N layers stay on the CPU (MoE models)
    device_bytes: int
    host_bytes: int
    decode_tokens_per_s: float | None
    note: str


def partial_offload(
    spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_seq: int, kv: tuple[GGMLType, GGMLType]
) -> Offload | None:
    """How much of the model must stay on the CPU for ``n_ctx_seq`` tokens (None: it all fits, or nothing does).

    MoE models move experts first (what llama.cpp's --fit does: attention stays
    on the GPU); dense models move whole layers, with their KV, from the front.
    Approximate: llama.cpp also copies CPU weights through the GPU compute
    buffer for large batches (op_offload).
    """
    from kvadvise.planner.memory import layer_kv_bytes, resolve

    if budget.device != "cuda" or not any(spec.layer_bytes):
        return None
    cfg = _cfg(base, n_ctx_seq, kv, True, budget.device)
    full = estimate(spec, cfg)
    excess = full.device_bytes - budget.budget_bytes
    if excess <= 0:
        return None
    n_layer = spec.n_layer
    moved = 0
    n_cpu_moe = n_cpu = 0
    if spec.n_expert and spec.expert_bytes:
        per_layer = spec.expert_bytes // max(1, n_layer)
        n_cpu_moe = -(-excess // per_layer) if per_layer else n_layer + 1
        moved = n_cpu_moe * per_layer
        if n_cpu_moe > n_layer:
            n_cpu_moe, moved = 0, 0
    if not n_cpu_moe:
        kv_l = layer_kv_bytes(spec, resolve(spec, cfg))
        for il in range(n_layer):
            if moved >= excess:
                break
            moved += spec.layer_bytes[il] + kv_l[il][0] + kv_l[il][1]
            n_cpu += 1
        if moved < excess:
            return None  # even with every layer on the CPU the rest does not fit
    device = full.device_bytes - moved
    host = full.host_bytes + moved
    tps = None
    if budget.bandwidth_bytes_per_s:
        from kvadvise.planner.speed import kv_read_bytes

        dev = [Device(budget.backend, budget.bandwidth_bytes_per_s)]
        frac = n_cpu / max(1, n_layer)
        kv_read = kv_read_bytes(spec, n_ctx_seq, kv[0], kv[1])
        t = seconds_per_token(weight_reads(spec), kv_read, dev, cpu_expert_layers=n_cpu_moe, cpu_dense_fraction=frac)
        tps = 1 / t
    what = f"the experts of {n_cpu_moe} layers" if n_cpu_moe else f"{n_cpu} of {n_layer} layers"
    note = (
        f"to run {n_ctx_seq:,} tokens with {kv[0].type_name}/{kv[1].type_name}: keep {what} ({moved / GIB:.2f} GiB) "
        f"on the CPU; speed assumes {CPU_BANDWIDTH_BYTES_PER_S / 1e9:.0f} GB/s system memory"
    )
    return Offload(n_ctx_seq, kv[0], kv[1], n_layer + 1 - n_cpu, n_cpu, n_cpu_moe, device, host, tps, note)


def load_use_cases() -> dict[str, int]:
    from importlib.resources import files

    doc = json.loads(files("kvadvise.profiles").joinpath("usecases.json").read_text(encoding="utf-8"))
    return {k: int(v["target_ctx"]) for k, v in doc.items() if not k.startswith("_")}


def budget_for(hw: Hardware, margin_bytes: int = DEFAULT_MARGIN_BYTES) -> Budget:
    """Free memory minus the margin, summed over the GPUs (llama.cpp splits layers across them)."""
    if margin_bytes < 0:
        raise InputError("the margin cannot be negative")
    if hw.gpus:
        free = sum(g.free_bytes for g in hw.gpus)
        total = sum(g.total_bytes for g in hw.gpus)
        margin = margin_bytes * len(hw.gpus)
        bw = [g.bandwidth_bytes_per_s for g in hw.gpus]
        bandwidth = min(b for b in bw if b) if any(bw) else None  # layers run one GPU after another
        src = next((g.bandwidth_source for g in hw.gpus if g.bandwidth_source), None)
        backend = "metal" if any(g.unified_memory for g in hw.gpus) else "cuda"
        return Budget(
            "cuda", total, free, margin, max(0, free - margin), hw.source, len(hw.gpus), bandwidth, src, backend
        )
    free = hw.ram_free_bytes
    return Budget("cpu", hw.ram_total_bytes, free, margin_bytes, max(0, free - margin_bytes), "ram", 0, None, None)


def _cfg(base: RunConfig, n_ctx_seq: int, kv: tuple[GGMLType, GGMLType], fa: bool, device: str) -> RunConfig:
    return replace(
        base,
        n_ctx=n_ctx_seq * base.n_parallel,
        type_k=kv[0],
        type_v=kv[1],
        flash_attn="on" if fa else "off",
        device=device,
    )


def max_context(spec: ModelSpec, base: RunConfig, kv: tuple[GGMLType, GGMLType], fa: bool, budget: Budget) -> int:
    """The largest context per sequence (a multiple of 256, at most n_ctx_train) that fits the budget.

    Memory grows monotonically with the context, so a binary search over
    multiples of 256 inverts the memory model exactly.
    """
    cap = max(CTX_PAD, spec.n_ctx_train // CTX_PAD * CTX_PAD) if spec.n_ctx_train else 1 << 20

    def fits(n_seq: int) -> bool:
        return estimate(spec, _cfg(base, n_seq, kv, fa, budget.device)).device_bytes <= budget.budget_bytes

    lo, hi = 0, cap // CTX_PAD  # in units of 256
    if not fits(CTX_PAD):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CTX_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


def _choices(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[tuple[tuple[GGMLType, GGMLType], bool]]:
    if policy.fixed_kv is not None:
        estimate(spec, _cfg(base, CTX_PAD, policy.fixed_kv, base.flash_attn != "off", base.device))  # raises if refused
        return [(policy.fixed_kv, base.flash_attn != "off")]
    kvs = SAME_TYPE_CHOICES if policy.same_type_kv else CACHE_CHOICES
    if policy.repeatable:
        kvs = ((F16, F16),)
    if spec.is_mla:
        kvs = tuple(c for c in kvs if c[0] == c[1])  # MLA: one compressed cache, same type for K and V
    if base.flash_attn == "off":
        # without FA, V must stay unquantized; K may still be quantized
        return [((k, F16), False) for k in dict.fromkeys(c[0] for c in kvs)]
    out = []
    for kv in kvs:
        try:
            estimate(spec, _cfg(base, CTX_PAD, kv, True, base.device))
        except ConfigError:
            continue  # e.g. the block size does not divide the head size
        out.append((kv, True))
    return out


def _gb(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def recommend(spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy) -> Recommendation:
    """Pick the config; ``base`` carries the user's n_parallel, batch sizes, kv_unified and swa_full."""
    base = replace(base, device=budget.device)
    n_ctx_train = spec.n_ctx_train or (1 << 20)
    target = min(policy.target_ctx or n_ctx_train, n_ctx_train)
    reasons: list[str] = []
    if policy.target_ctx > n_ctx_train:
        reasons.append(f"target {policy.target_ctx:,} is past the model's training context; capped at {n_ctx_train:,}")
    options: list[Option] = []
    for kv, fa in _choices(spec, base, policy):
        n_max = max_context(spec, base, kv, fa, budget)
        at_max = estimate(spec, _cfg(base, n_max, kv, fa, budget.device)).device_bytes if n_max else 0
        options.append(Option(kv[0], kv[1], fa, n_max, at_max, n_max >= target))
    if not options:
        raise InputError("no cache type is usable for this model with these settings")

    chosen = next((o for o in options if o.reaches_target), None)
    if chosen is None:
        chosen = max(options, key=lambda o: o.n_ctx_max)  # first (least quantized) among equals
    n_ctx_seq = min(target, chosen.n_ctx_max) if chosen.n_ctx_max else CTX_PAD
    cfg = _cfg(base, n_ctx_seq, (chosen.type_k, chosen.type_v), chosen.flash_attn, budget.device)
    est = estimate(spec, cfg)
    fits = est.device_bytes <= budget.budget_bytes
    reasons += _reasons(spec, base, budget, policy, options, chosen, target, n_ctx_seq, est, fits)

    if policy.min_ctx and (not fits or n_ctx_seq < policy.min_ctx):
        raise DoesNotFit(
            f"nothing reaches --min-ctx {policy.min_ctx:,}: the best is {chosen.type_k.type_name}/"
            f"{chosen.type_v.type_name} at {chosen.n_ctx_max:,} tokens",
            hint=_what_would_fit(spec, base, budget, policy),
        )
    tps, note, speed = _decode_speed(spec, cfg, budget) if fits else (None, None, None)
    offload = None
    if policy.allow_cpu and (not fits or n_ctx_seq < target):
        offload = partial_offload(spec, base, budget, target, (chosen.type_k, chosen.type_v))
        if offload is not None:
            reasons.append("--allow-cpu: " + offload.note)
        elif budget.device != "cuda":
            reasons.append("--allow-cpu: nothing to move: the model already runs on the CPU")
        elif not any(spec.layer_bytes):
            reasons.append(
                "--allow-cpu: no partial-offload figure: the per-layer sizes are unknown for this model "
                "(a profile or config.json); plan the GGUF file itself for one"
            )
    return Recommendation(cfg, est, budget, fits, target, tuple(reasons), tuple(options), tps, note, offload, speed)


def _name(o: Option) -> str:
    return o.type_k.type_name if o.type_k == o.type_v else f"{o.type_k.type_name} K / {o.type_v.type_name} V"


def _reasons(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    policy: Policy,
    options: list[Option],
    chosen: Option,
    target: int,
    n_ctx_seq: int,
    est: MemoryEstimate,
    fits: bool,
) -> list[str]:
    where = "the GPU" if budget.device == "cuda" else "system RAM"
    out = [
        f"budget: {_gb(budget.free_bytes)} free on {where} minus a {budget.margin_bytes / MIB:,.0f} MiB margin"
        f" = {_gb(budget.budget_bytes)}"
    ]
    goal = f"target: {target:,} tokens per sequence"
    if policy.use:
        goal += f" (--use {policy.use})"
    elif not policy.target_ctx:
        goal += " (the model's training context)"
    out.append(goal)
    if not fits:
        out.append(
            f"does not fit: the weights and buffers alone need {_gb(est.device_bytes)} at {n_ctx_seq:,} tokens; "
            f"{where} has {_gb(budget.budget_bytes)}"
        )
        out.append(_what_would_fit(spec, base, budget, policy))
        return out
    f16 = next((o for o in options if o.type_k == F16 and o.type_v == F16), None)
    if chosen.type_k == F16 and chosen.type_v == F16:
        out.append(
            "f16 K/V: it reproduces tokens exactly, and it reaches the target"
            if chosen.reaches_target
            else "f16 K/V (--repeatable): quantized caches do not reproduce tokens exactly"
        )
    elif f16 is not None:
        need = estimate(spec, _cfg(base, target, (F16, F16), f16.flash_attn, budget.device)).device_bytes
        out.append(
            f"f16 K/V at {target:,} tokens needs {_gb(need)}; {where} has {_gb(budget.budget_bytes)} "
            f"(f16 reaches {f16.n_ctx_max:,} tokens)"
        )
        out.append(
            f"{_name(chosen)} K/V: the least quantized cache that "
            + ("reaches the target" if chosen.reaches_target else "gets furthest")
            + "; a quantized cache does not reproduce tokens exactly (--repeatable forbids it)"
        )
    if not chosen.reaches_target:
        out.append(f"the target is not reached: {n_ctx_seq:,} tokens is the most that fits")
    if chosen.flash_attn:
        why = "needed for a quantized V cache, and it" if chosen.type_v != F16 else "it"
        out.append(f"flash attention on: {why} removes the n_ctx × n_head attention-score buffer")
    out.append(f"uses {_gb(est.device_bytes)} of {_gb(budget.budget_bytes)}: 100% on {where}")
    if base.n_parallel > 1:
        out.append(f"{base.n_parallel} parallel sequences of {n_ctx_seq:,} tokens each")
    return out


def _what_would_fit(spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy) -> str:
    """The shortest honest list of what would make the target fit."""
    ctx = max(policy.min_ctx, CTX_PAD) if policy.min_ctx else CTX_PAD
    kv = (F16, F16) if policy.repeatable else (Q4_0, Q4_0) if not spec.is_mla else (Q8_0, Q8_0)
    need = estimate(spec, _cfg(base, ctx, kv, True, budget.device)).device_bytes
    short = need - budget.budget_bytes
    tips = []
    if budget.budget_bytes <= 0:
        tips.append(f"a margin smaller than {_gb(budget.margin_bytes)} (--margin): it leaves no budget at all")
    if short > 0:
        tips.append(f"{_gb(short)} more free memory (a bigger card, or unload other models)")
        # a lower-bit quant of the same model saves at most about half its weights
        if spec.weights_bytes and short < spec.weights_bytes // 2:
            tips.append(
                f"a smaller quantization of the weights (at least {_gb(short)} smaller than "
                f"the {_gb(spec.weights_bytes)} they take now)"
            )
    if base.n_parallel > 1:
        one = max_context(spec, replace(base, n_parallel=1), kv, True, budget)
        tips.append(f"fewer parallel slots (with 1 slot: {one:,} tokens)")
    return "would fit with: " + "; or ".join(tips) if tips else "would fit with a larger memory budget"


def _decode_speed(
    spec: ModelSpec, cfg: RunConfig, budget: Budget
) -> tuple[float | None, str | None, SpeedEstimate | None]:
    """The decode estimate of kvadvise.planner.speed at 4k and at the planned context per sequence."""
    from kvadvise.planner import speed

    if not budget.bandwidth_bytes_per_s or not budget.n_gpu:
        return None, None, None
    n = budget.n_gpu
    devices = [Device(budget.backend, budget.bandwidth_bytes_per_s, 1 / n) for _ in range(n)]
    n_seq = cfg.n_ctx // max(1, cfg.n_parallel)
    est = speed.estimate(spec, n_seq, devices, type_k=cfg.type_k, type_v=cfg.type_v, source=budget.bandwidth_source)
    if est is None:
        return None, None, None
    return est.points[-1][1], f"{est.text()}; {est.note}", est


@dataclass(frozen=True, slots=True)
class Curve:
    type_k: GGMLType
    type_v: GGMLType
    flash_attn: bool
    points: tuple[tuple[int, int], ...]  # (context per sequence, device bytes)


def curves(
    spec: ModelSpec, base: RunConfig, budget: Budget, options: tuple[Option, ...], n: int = 48
) -> tuple[Curve, ...]:
    """Memory against context for each option, from 256 tokens to the model's maximum."""
    top = spec.n_ctx_train or max((o.n_ctx_max for o in options), default=CTX_PAD) * 2
    xs = sorted({max(CTX_PAD, top * i // n // CTX_PAD * CTX_PAD) for i in range(1, n + 1)})
    out = []
    for o in options:
        kv = (o.type_k, o.type_v)
        pts = tuple((x, estimate(spec, _cfg(base, x, kv, o.flash_attn, budget.device)).device_bytes) for x in xs)
        out.append(Curve(o.type_k, o.type_v, o.flash_attn, pts))
    return tuple(out)
