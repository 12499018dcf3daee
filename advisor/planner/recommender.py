"""The recommender: context length, K/V cache types and flash attention that
keep the model inside the memory budget (100% on the GPU), and why.

Policy (also in README.md and in every recommendation's reasons; the public
advice it follows is cited there):
1. The target is a context a user needs, not the model's maximum: 64k tokens
   per slot on cards of 16 GB and more, 32k below and on the CPU (Ollama's
   docs: agents and coding tools need "at least 64000 tokens"), capped at
   n_ctx_train; ``--use``/``--target-ctx`` choose another; ``--use long`` = max.
2. f16 K/V when it reaches the target (it reproduces tokens exactly).
3. Else q8_0 K and V ("usually no noticeable impact", Ollama FAQ; KLD about
   0.001 on an 8B model, llama.cpp PR #7412), or q8_0 K with f16 V where flash
   attention is off (a quantized V needs it).
4. q4_0 only when the user opts in (``--allow-q4`` or ``-ctk/-ctv q4_0``),
   with a warning; the options always show what q4_0 would reach. When q8_0
   cannot reach the target, the plan says so and names the real levers.
5. gpt-oss keeps an f16 K cache (attention sinks); high-GQA models get a note
   when their cache is quantized (Ollama FAQ).
6. Headroom: the fit margin (1 GiB, + the projector), 3 % of the weights when
   they come from a built-in profile, a display allowance on a single desktop
   GPU unless ``--headless``. The context is rounded down to a multiple of 1,024.
7. Never a config that does not fit; if even the smallest context does not
   fit, say so (fits = false) and what would.
Flash attention is on whenever the model allows it: it is required for a
quantized V cache and removes the attention-score buffer that grows with
n_ctx × n_head.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.errors import ConfigError, DoesNotFit, InputError
from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.hardware import Hardware
from kvadvise.planner.memory import CTX_PAD, MemoryEstimate, RunConfig, estimate

if TYPE_CHECKING:  # the speed model loads only for a plan with a GPU budget
    from kvadvise.planner.speed import SpeedEstimate

F16, Q8_0, Q4_0 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
GIB = 1 << 30
MIB = 1 << 20
# llama.cpp's own fit keeps this much free per device (common/arg.cpp: -fitt, default 1024 MiB)
DEFAULT_MARGIN_BYTES = 1024 * MIB

# Cache types in order of preference: least quantized first. q4_0 (K or V) only when the user opts in.
CACHE_CHOICES: tuple[tuple[GGMLType, GGMLType], ...] = ((F16, F16), (Q8_0, Q8_0), (Q8_0, Q4_0), (Q4_0, Q4_0))
SAME_TYPE_CHOICES = tuple(c for c in CACHE_CHOICES if c[0] == c[1])  # Ollama: one type for K and V
# Without flash attention V stays f16 (llama.cpp refuses a quantized V cache without it).
FA_OFF_CHOICES: tuple[tuple[GGMLType, GGMLType], ...] = ((F16, F16), (Q8_0, F16), (Q4_0, F16))

# Default targets per slot (Ollama docs/context-length.mdx: agents and coding assistants need
# "at least 64000 tokens"); below 16 GB, or on the CPU, 32k keeps room for the weights.
DEFAULT_TARGET_CTX = 65536
SMALL_TARGET_CTX = 32768
BIG_CARD_BYTES = 15 * GIB  # a "16 GB" card reports about 15.99 GiB through NVML
CTX_ROUND = 1024  # recommended contexts are rounded down to a multiple of this
# Plans from a built-in profile: the weights figure is a published download size (Ollama's
# library shows 19 GB for qwen3-coder:30b where older figures say 18 GB): keep 3 % of it free.
PROFILE_WEIGHTS_HEADROOM = 0.03
# A single desktop GPU also drives the display: 0.3 to 1 GB in use (shared/user-evidence.md).
DISPLAY_ALLOWANCE_BYTES = 512 * MIB
# a pattern, compiled (and cached by re) on first use: start-up pays nothing for it
_DATACENTER_GPU = r"\b(tesla|a2|a10g?|a16|a30|a40|a100|a800|h100|h200|h800|h20|l4|l20|l40s?|t4|v100|p100|p40|k80|b100|b200|gb200|gh200)\b"
# Ollama's FAQ: models with a high GQA count (its example: Qwen2, 7 query heads per KV head)
# may lose more precision from a quantized cache.
HIGH_GQA_RATIO = 6
# gpt-oss uses attention sinks: a quantized K cache badly distorts its output (a KLD study in
# TheTom/llama-cpp-turboquant#305; Ollama disabled quantized KV for gpt-oss in 2025,
# ollama/ollama df335aac0 and 19e6796ea).
F16_K_ARCHS = frozenset({"gpt-oss"})


@dataclass(frozen=True, slots=True)
class Budget:
    """The memory a plan may use, per device, after margins and reservations."""

    device: str  # "cuda" | "metal" (Apple: unified memory) | "cpu"
    total_bytes: int
    free_bytes: int
    margin_bytes: int
    budget_bytes: int  # free - margin: what the model may take
    source: str  # nvml | profile:<id> | manual | ram
    n_gpu: int
    bandwidth_bytes_per_s: int | None
    bandwidth_source: str | None
    backend: str = "cuda"  # the GPUs' ggml backend (speed factors, buffer names): cuda | rocm | vulkan | sycl | metal
    headroom_bytes: int = 0  # kept free besides the margin (already taken out of budget_bytes)
    headroom_notes: tuple[str, ...] = ()  # why, one line each
    # with several GPUs, each one's own budget (its free memory minus its margin and its share of the
    # headroom): a plan fits only when every device fits its own; budget_bytes is their sum
    device_budgets: tuple[int, ...] = ()
    device_free: tuple[int, ...] = ()  # each GPU's free memory: llama.cpp's default split (-ts) follows it

    def fits(self, est: MemoryEstimate) -> bool:
        """Every device within its own budget (one budget for one device, or the CPU)."""
        return self.slack_bytes(est) >= 0

    def slack_bytes(self, est: MemoryEstimate) -> int:
        """What is left of the tightest device's budget (negative: over it)."""
        if len(self.device_budgets) > 1 and len(est.devices) == len(self.device_budgets):
            return min(b - d.total_bytes for d, b in zip(est.devices, self.device_budgets, strict=True))
        return self.budget_bytes - est.device_bytes


@dataclass(frozen=True, slots=True)
class Policy:
    """What the user asked the recommender for: context, cache types, slots, margins."""

    target_ctx: int = (
        0  # per sequence; 0 = the default (64k on >= 16 GB cards, 32k below), or the maximum with use="long"
    )
    min_ctx: int = 0  # per sequence; fail (exit 3) below it
    repeatable: bool = False  # f16 only: quantized caches do not reproduce tokens exactly
    same_type_kv: bool = False  # the runtime has one cache type for K and V (Ollama)
    use: str | None = None  # the --use profile the target came from
    fixed_kv: tuple[GGMLType, GGMLType] | None = None  # the user chose -ctk/-ctv: only the context is picked
    allow_cpu: bool = False  # also say what partial offload would reach the target
    allow_q4: bool = False  # q4_0 caches may be chosen (else they are only shown as options)
    weights_uncertain: bool = False  # the weights size is a published figure (a built-in profile): keep 3 % free
    headless: bool = False  # no display on the GPU: no display allowance


@dataclass(frozen=True, slots=True)
class Option:
    """One cache configuration and the longest context it fits."""

    type_k: GGMLType
    type_v: GGMLType
    flash_attn: bool
    n_ctx_max: int  # per sequence, a multiple of 256; 0 when not even 256 tokens fit
    device_bytes_at_max: int  # 0 when nothing fits
    reaches_target: bool
    allowed: bool = True  # False: shown for information (q4_0 without --allow-q4), never chosen


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


# Typical dual-channel DDR5 throughput; the CPU side of a partial offload is bound by it.
CPU_BANDWIDTH_BYTES_PER_S = 60_000_000_000


@dataclass(frozen=True, slots=True)
class Offload:
    """A plan that leaves part of the model in RAM (--allow-cpu): layers or experts on the CPU."""

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
    # of device_bytes: the GPU compute buffer's copy of the largest CPU-resident weight (op offload,
    # kvadvise.planner.opoffload); None when the model's tensor sizes are unknown
    op_offload_bytes: int | None = 0
    speed: SpeedEstimate | None = None  # decode at 4k and at n_ctx (decode_tokens_per_s: the first)


def partial_offload(
    spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_seq: int, kv: tuple[GGMLType, GGMLType]
) -> Offload | None:
    """How much of the model must stay on the CPU for ``n_ctx_seq`` tokens (None: it all fits, or nothing does).

    MoE models move experts first (what llama.cpp's --fit does: attention stays
    on the GPU); dense models move whole layers, with their KV, from the front.
    The GPU's compute buffer also holds a copy of the largest weight left on the CPU, for prompt
    batches (op offload, kvadvise.planner.opoffload): enough is moved to pay for it too.
    """
    from kvadvise.planner.memory import layer_kv_bytes, op_offload_growth, resolve
    from kvadvise.planner.opoffload import op_offload_bytes

    if budget.device == "cpu" or not any(spec.layer_bytes):
        return None
    cfg = _cfg(base, n_ctx_seq, kv, True, budget.device)
    full = estimate(spec, cfg)
    excess = full.device_bytes - budget.budget_bytes
    if excess <= 0:
        return None
    n_layer = spec.n_layer
    lay = resolve(spec, cfg)
    ub = lay.n_ubatch

    def copy_bytes(n_blocks: int) -> int:  # what the op-offload copy for the first n_blocks on the CPU adds
        # the copy lives in a layer's live set, not beside the logits (issue 25: memory.op_offload_growth)
        return op_offload_growth(spec, lay, op_offload_bytes(spec, range(n_blocks), budget.device, ub) or 0)

    moved = 0
    n_cpu_moe = n_cpu = 0
    per_layer = spec.expert_bytes // max(1, n_layer) if spec.n_expert and spec.expert_bytes else 0
    if per_layer:
        n_cpu_moe = -(-excess // per_layer)
        while n_cpu_moe <= n_layer and n_cpu_moe * per_layer < excess + copy_bytes(n_cpu_moe):
            n_cpu_moe += 1
        # every layer's experts on the CPU is not enough: they all stay there (--n-cpu-moe N_LAYER, as
        # llama.cpp's --fit first goes "dense-only", common/fit.cpp), then whole layers go from the front
        n_cpu_moe = min(n_cpu_moe, n_layer)
        moved = n_cpu_moe * per_layer
    if moved < excess + copy_bytes(n_cpu_moe):
        kv_l = layer_kv_bytes(spec, resolve(spec, cfg))
        for il in range(n_layer):
            if n_cpu and moved >= excess + copy_bytes(max(n_cpu, n_cpu_moe)):
                break
            moved += max(0, spec.layer_bytes[il] - (per_layer if n_cpu_moe else 0)) + kv_l[il][0] + kv_l[il][1]
            n_cpu += 1
        if moved < excess + copy_bytes(max(n_cpu, n_cpu_moe)):
            return None  # even with every layer on the CPU the rest does not fit
    copied = op_offload_bytes(spec, range(max(n_cpu, n_cpu_moe)), budget.device, ub)
    op_copy = None if copied is None else op_offload_growth(spec, lay, copied)
    device = full.device_bytes - moved + (op_copy or 0)
    host = full.host_bytes + moved
    speed = None
    if budget.bandwidth_bytes_per_s:
        from kvadvise.planner import speed as speed_model

        # at 4k and at the full context, as for a plan that fits: deep in the context the K/V read dominates
        speed = speed_model.estimate(
            spec,
            n_ctx_seq,
            [speed_model.Device(budget.backend, budget.bandwidth_bytes_per_s)],
            type_k=kv[0],
            type_v=kv[1],
            cpu_expert_layers=n_cpu_moe,
            cpu_dense_fraction=n_cpu / max(1, n_layer),
            source=budget.bandwidth_source,
        )
    tps = speed.tokens_per_s if speed is not None else None
    what = f"the experts of {n_cpu_moe} layers" if n_cpu_moe else f"{n_cpu} of {n_layer} layers"
    if n_cpu_moe and n_cpu:
        first = "the first layer" if n_cpu == 1 else f"the first {n_cpu} layers"
        what = f"the experts of all {n_layer} layers and {first} whole"
    note = (
        f"to run {n_ctx_seq:,} tokens with {kv[0].type_name}/{kv[1].type_name}: keep {what} ({moved / GIB:.2f} GiB) "
        f"on the CPU; speed assumes {CPU_BANDWIDTH_BYTES_PER_S / 1e9:.0f} GB/s system memory"
    )
    if op_copy:
        note += (
            f"; the GPU compute buffer grows by {op_copy / MIB:,.1f} MiB (estimate): prompt batches copy the "
            "largest CPU-resident weight to the GPU (op offload; --no-op-offload avoids it, prompts slower)"
        )
    elif op_copy is None:
        note += "; op offload's copy of a CPU weight in the GPU compute buffer is not counted (tensor sizes unknown)"
    return Offload(
        n_ctx_seq, kv[0], kv[1], n_layer + 1 - n_cpu, n_cpu, n_cpu_moe, device, host, tps, note, op_copy, speed
    )


def attention_on_gpu(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_ctx_seq: int,
    offload: Offload | None,
    kvs: list[tuple[GGMLType, GGMLType]],
) -> tuple[Offload | None, str | None]:
    """For a MoE offload that also needs whole layers on the CPU: the first cache type of ``kvs``
    (in preference order) that keeps every layer's attention on the GPU, and why it was taken.
    Whole layers on the CPU cost far more speed than a q8_0 cache costs quality."""
    if offload is None or not (offload.n_cpu_moe and offload.n_cpu_layers):
        return offload, None
    for kv in dict.fromkeys(kvs):
        alt = partial_offload(spec, base, budget, n_ctx_seq, kv)
        if alt is not None and not alt.n_cpu_layers:
            why = (
                f"--allow-cpu: a {_kv_name(kv)} cache keeps every layer's attention on the GPU (with "
                f"{_kv_name((offload.type_k, offload.type_v))}, {offload.n_cpu_layers} whole layers would also "
                "stay on the CPU)"
            )
            return alt, why
    return offload, None


def load_use_cases() -> dict[str, int]:
    from kvadvise.profiles import read_text

    doc = json.loads(read_text("usecases.json"))
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
        backend = "metal" if any(g.unified_memory for g in hw.gpus) else hw.gpus[0].backend
        # the memory rules: ROCm builds are ggml-cuda compiled with HIP (the same buffers, as published
        # ROCm logs print them); Vulkan and SYCL are planned with them too (see GPU_BACKEND_NOTE)
        device = "rpc" if all(g.rpc_endpoint for g in hw.gpus) else ("metal" if backend == "metal" else "cuda")
        budget = Budget(
            device, total, free, margin, max(0, free - margin), hw.source, len(hw.gpus), bandwidth, src, backend
        )
        if len(hw.gpus) > 1:
            per = tuple(max(0, g.free_bytes - margin_bytes) for g in hw.gpus)
            budget = replace(budget, device_budgets=per, device_free=tuple(g.free_bytes for g in hw.gpus))
        return budget
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

    Memory grows monotonically with the context, so a search over multiples of 256 that keeps
    one that fits below one that does not inverts the memory model exactly. Memory is close to
    linear in the context (the KV cache), so the next probe is where the line through the two
    ends crosses the budget, and the one after it just above: two or three estimates where a
    bisection takes ten; bisection takes over if that does not close in.
    """
    cap = max(CTX_PAD, spec.n_ctx_train // CTX_PAD * CTX_PAD) if spec.n_ctx_train else 1 << 20

    def slack(units: int) -> int:
        return budget.slack_bytes(estimate(spec, _cfg(base, units * CTX_PAD, kv, fa, budget.device)))

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


def _kv_choices(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[tuple[GGMLType, GGMLType]]:
    """The cache types the runtime and the model allow, least quantized first (q4_0 included)."""
    if policy.repeatable:
        return [(F16, F16)]
    one_type = policy.same_type_kv or spec.is_mla  # MLA: one compressed cache, same type for K and V
    if base.flash_attn == "off":
        # without FA, V must stay f16; a runtime with one type for K and V then has only f16
        kvs: tuple[tuple[GGMLType, GGMLType], ...] = ((F16, F16),) if one_type else FA_OFF_CHOICES
    else:
        kvs = SAME_TYPE_CHOICES if one_type else CACHE_CHOICES
    if spec.architecture in F16_K_ARCHS:
        kvs = tuple(c for c in kvs if c[0] == F16)
        if not one_type and base.flash_attn != "off":
            kvs = ((F16, F16), (F16, Q8_0), (F16, Q4_0))
    return list(kvs)


def _choices(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[tuple[tuple[GGMLType, GGMLType], bool, bool]]:
    """(cache types, flash attention, allowed) per candidate; a q4_0 candidate is allowed only on opt-in."""
    if policy.fixed_kv is not None:
        estimate(spec, _cfg(base, CTX_PAD, policy.fixed_kv, base.flash_attn != "off", base.device))  # raises if refused
        return [(policy.fixed_kv, base.flash_attn != "off", True)]
    fa = base.flash_attn != "off"
    out = []
    for kv in _kv_choices(spec, base, policy):
        try:
            estimate(spec, _cfg(base, CTX_PAD, kv, fa, base.device))
        except ConfigError:
            continue  # e.g. the block size does not divide the head size
        out.append((kv, fa, policy.allow_q4 or Q4_0 not in kv))
    return out


def default_target_ctx(budget: Budget) -> tuple[int, str]:
    """The context per slot to aim for when the user names none, and why."""
    if budget.device != "cpu" and budget.total_bytes >= BIG_CARD_BYTES:
        return DEFAULT_TARGET_CTX, (
            "64k on a card of 16 GB or more (Ollama's docs: agents and coding tools need at least 64000 tokens)"
        )
    where = "a card below 16 GB" if budget.device != "cpu" else "the CPU"
    return SMALL_TARGET_CTX, f"32k on {where} (--use agent aims for 64k, --use long for the maximum)"


def with_headroom(budget: Budget, hw: Hardware, spec: ModelSpec, policy: Policy) -> Budget:
    """The budget with the headroom the uncertainty calls for taken out, and why (in ``headroom_notes``).

    - a plan from a built-in profile: its weights size is a published figure, keep 3 % of it free;
    - a single desktop GPU (not a data-centre card, not Apple's unified memory, not a --vram budget)
      also drives the display: 512 MiB unless --headless.
    """
    extra, notes = 0, []
    if policy.weights_uncertain and spec.weights_bytes:
        n = -(-spec.weights_bytes * 3 // 100)
        extra += n
        notes.append(f"{n / MIB:,.0f} MiB: 3% of the weights, whose size comes from a built-in profile")
    if budget.device != "cpu" and not policy.headless and len(hw.gpus) == 1 and hw.source != "manual":
        g = hw.gpus[0]
        if not g.unified_memory and not re.search(_DATACENTER_GPU, g.name.lower()):
            extra += DISPLAY_ALLOWANCE_BYTES
            notes.append(
                f"{DISPLAY_ALLOWANCE_BYTES / MIB:,.0f} MiB for the display a desktop GPU also drives (--headless: none)"
            )
    if not extra:
        return budget
    n = max(1, len(budget.device_budgets))
    return replace(
        budget,
        headroom_bytes=budget.headroom_bytes + extra,
        headroom_notes=budget.headroom_notes + tuple(notes),
        budget_bytes=max(0, budget.budget_bytes - extra),
        device_budgets=tuple(max(0, b - -(-extra // n)) for b in budget.device_budgets),
    )


def _gb(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _gqa_ratio(spec: ModelSpec) -> int:
    pairs = [(h, kv) for h, kv in zip(spec.n_head, spec.n_head_kv, strict=False) if kv]
    return max((h // kv for h, kv in pairs), default=1)


def recommend(spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy) -> Recommendation:
    """Pick the config; ``base`` carries the user's n_parallel, batch sizes, kv_unified and swa_full."""
    base = replace(base, device=budget.device)
    n_ctx_train = spec.n_ctx_train or (1 << 20)
    reasons: list[str] = []
    if policy.target_ctx:
        want, why = policy.target_ctx, ""
    elif policy.use == "long":
        want, why = n_ctx_train, "the model's training context"
    else:
        want, why = default_target_ctx(budget)
    target = min(want, n_ctx_train)
    if want > n_ctx_train:
        reasons.append(f"target {want:,} is past the model's training context; capped at {n_ctx_train:,}")
    options: list[Option] = []
    for kv, fa, allowed in _choices(spec, base, policy):
        n_max = max_context(spec, base, kv, fa, budget)
        at_max = estimate(spec, _cfg(base, n_max, kv, fa, budget.device)).device_bytes if n_max else 0
        options.append(Option(kv[0], kv[1], fa, n_max, at_max, n_max >= target, allowed))
    usable = [o for o in options if o.allowed]
    if not usable:
        raise InputError("no cache type is usable for this model with these settings")

    chosen = next((o for o in usable if o.reaches_target), None)
    if chosen is None:
        chosen = max(usable, key=lambda o: o.n_ctx_max)  # first (least quantized) among equals
    n_ctx_seq = min(target, chosen.n_ctx_max) if chosen.n_ctx_max else CTX_PAD
    if n_ctx_seq >= CTX_ROUND:
        n_ctx_seq = n_ctx_seq // CTX_ROUND * CTX_ROUND
    cfg = _cfg(base, n_ctx_seq, (chosen.type_k, chosen.type_v), chosen.flash_attn, budget.device)
    est = estimate(spec, cfg)
    fits = budget.fits(est)
    reasons += _reasons(spec, base, budget, policy, options, chosen, target, why, n_ctx_seq, est, fits)

    if policy.min_ctx and (not fits or n_ctx_seq < policy.min_ctx):
        raise DoesNotFit(
            f"nothing reaches --min-ctx {policy.min_ctx:,}: the best is {chosen.type_k.type_name}/"
            f"{chosen.type_v.type_name} at {chosen.n_ctx_max:,} tokens",
            hint=_what_would_fit(spec, base, budget, policy),
        )
    tps, note, speed = decode_speed(spec, cfg, budget) if fits else (None, None, None)
    offload = None
    if policy.allow_cpu and (not fits or n_ctx_seq < target):
        offload = partial_offload(spec, base, budget, target, (chosen.type_k, chosen.type_v))
        offload, why_kv = attention_on_gpu(spec, base, budget, target, offload, [(o.type_k, o.type_v) for o in usable])
        if why_kv:
            reasons.append(why_kv)
        if offload is not None:
            reasons.append("--allow-cpu: " + offload.note)
        elif budget.device == "cpu":
            reasons.append("--allow-cpu: nothing to move: the model already runs on the CPU")
        elif not any(spec.layer_bytes):
            reasons.append(
                "--allow-cpu: no partial-offload figure: the per-layer sizes are unknown for this model "
                "(a profile or config.json); plan the GGUF file itself for one"
            )
    return Recommendation(cfg, est, budget, fits, target, tuple(reasons), tuple(options), tps, note, offload, speed)


def _name(o: Option) -> str:
    return o.type_k.type_name if o.type_k == o.type_v else f"{o.type_k.type_name} K / {o.type_v.type_name} V"


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


def _reasons(
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
) -> list[str]:
    where = "the GPU" if budget.device != "cpu" else "system RAM"
    out = [budget_line(budget)]
    goal = f"target: {target:,} tokens per sequence"
    if policy.use:
        goal += f" (--use {policy.use})"
    elif why:
        goal += f" ({why})"
    out.append(goal)
    if not fits:
        out.append(
            f"does not fit: the weights and buffers alone need {_gb(est.device_bytes)} at {n_ctx_seq:,} tokens; "
            f"{where} has {_gb(budget.budget_bytes)}"
        )
        out.append(_what_would_fit(spec, base, budget, policy))
        return out
    f16 = next((o for o in options if o.type_k == F16 and o.type_v == F16), None)
    q8 = next((o for o in options if o.type_k == Q8_0 and o.allowed), None)
    q4 = next((o for o in options if Q4_0 in (o.type_k, o.type_v)), None)
    if chosen.type_k == F16 and chosen.type_v == F16:
        out.append(
            "f16 K/V: it reproduces tokens exactly, and it reaches the target"
            if chosen.reaches_target
            else "f16 K/V"
            + (" (--repeatable)" if policy.repeatable else "")
            + ": quantized caches do not reproduce tokens exactly"
        )
    elif f16 is not None:
        need = estimate(spec, _cfg(base, target, (F16, F16), f16.flash_attn, budget.device)).device_bytes
        out.append(
            f"f16 K/V at {target:,} tokens needs {_gb(need)}; {where} has {_gb(budget.budget_bytes)} "
            f"(f16 reaches {f16.n_ctx_max:,} tokens)"
        )
        if Q4_0 in (chosen.type_k, chosen.type_v):
            out.append(
                f"{_name(chosen)}: q4_0 because you allowed it (--allow-q4 or -ctk/-ctv q4_0); warning: "
                "q4_0 has a small-medium loss in precision that may be more noticeable at higher context sizes "
                "(Ollama FAQ); q8_0 usually has no noticeable impact"
            )
        else:
            out.append(
                f"{_name(chosen)}: "
                + ("it reaches the target; " if chosen.reaches_target else "it gets furthest; ")
                + "q8_0 usually has no noticeable impact on quality (Ollama FAQ; KL divergence about 0.001 on an "
                "8B model, llama.cpp PR #7412), but a quantized cache does not reproduce tokens exactly "
                "(--repeatable keeps f16)"
            )
    elif policy.fixed_kv is not None and Q4_0 in policy.fixed_kv:
        out.append("warning: you chose a q4_0 cache: a small-medium loss in precision at long context (Ollama FAQ)")
    if spec.architecture in F16_K_ARCHS:
        out.append(
            "gpt-oss keeps an f16 K cache: with attention sinks a quantized K badly distorts its output "
            "(TheTom/llama-cpp-turboquant#305; Ollama disabled quantized KV for gpt-oss in 2025)"
        )
    ratio = _gqa_ratio(spec)
    if chosen.type_k != F16 and ratio >= HIGH_GQA_RATIO:
        out.append(
            f"note: {ratio} query heads share each KV head (high GQA); Ollama's FAQ warns such models may lose "
            "more precision from a quantized cache: f16 is safer if the budget allows a smaller context"
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
            levers.append(f"--allow-q4 (q4_0 reaches {q4.n_ctx_max:,} tokens, with a loss in precision)")
        out.append(
            f"the target is not reached: {best} gets {chosen.n_ctx_max:,} tokens at most; levers: "
            + "; ".join(x for x in levers if x)
        )
    elif q8 is not None and q4 is not None and not q4.allowed and chosen.type_k != F16:
        out.append(f"q4_0 would reach {q4.n_ctx_max:,} tokens; it is used only with --allow-q4 (less precise)")
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


def _what_would_fit(spec: ModelSpec, base: RunConfig, budget: Budget, policy: Policy) -> str:
    """The shortest honest list of what would make the target fit."""
    ctx = max(policy.min_ctx, CTX_PAD) if policy.min_ctx else CTX_PAD
    kvs = [kv for kv, _fa, allowed in _choices(spec, base, policy) if allowed] or [(F16, F16)]
    kv = kvs[-1]  # the most quantized allowed
    fa = base.flash_attn != "off"
    need = estimate(spec, _cfg(base, ctx, kv, fa, budget.device)).device_bytes
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
        if budget.device != "cpu" and not policy.allow_cpu:
            tips.append("--allow-cpu (part of the model on the CPU)")
    if base.n_parallel > 1:
        one = max_context(spec, replace(base, n_parallel=1), kv, fa, budget)
        tips.append(f"fewer parallel slots (with 1 slot: {one:,} tokens)")
    return "would fit with: " + "; or ".join(tips) if tips else "would fit with a larger memory budget"


def fixed_ctx_alternatives(spec: ModelSpec, cfg: RunConfig, budget: Budget, policy: Policy) -> str | None:
    """For a ``--ctx`` that does not fit: which cache type would fit it, or how far it fits.

    "does not fit with f16; fits with q8_0 K/V (20.40 GiB)", or "fits up to N tokens per sequence with q8_0".
    """
    n_seq = max(CTX_PAD, cfg.n_ctx // max(1, cfg.n_parallel))
    base = replace(cfg, n_ctx=0)
    now = _name(Option(cfg.type_k, cfg.type_v, cfg.flash_attn != "off", 0, 0, False))
    fa = cfg.flash_attn != "off"
    try:
        kvs = [kv for kv, _fa, allowed in _choices(spec, base, replace(policy, fixed_kv=None)) if allowed]
    except ConfigError:
        return None
    for kv in kvs:
        if kv == (cfg.type_k, cfg.type_v):
            continue
        e = estimate(spec, _cfg(base, n_seq, kv, fa, budget.device))
        d = e.device_bytes
        if budget.fits(e):
            return f"does not fit with {now}; fits with {_kv_name(kv)} ({_gb(d)} of {_gb(budget.budget_bytes)})"
    best = max(
        ((kv, max_context(spec, base, kv, fa, budget)) for kv in kvs or [(cfg.type_k, cfg.type_v)]),
        key=lambda t: t[1],
    )
    if best[1] <= 0:
        return f"does not fit with {now}, and no cache type fits even {CTX_PAD} tokens"
    return f"does not fit with {now}; fits up to {best[1]:,} tokens per sequence (with {_kv_name(best[0])})"


def _kv_name(kv: tuple[GGMLType, GGMLType]) -> str:
    return f"{kv[0].type_name} K/V" if kv[0] == kv[1] else f"{kv[0].type_name} K / {kv[1].type_name} V"


def decode_speed(
    spec: ModelSpec, cfg: RunConfig, budget: Budget
) -> tuple[float | None, str | None, SpeedEstimate | None]:
    """The decode estimate of kvadvise.planner.speed at 4k and at the planned context per sequence."""
    if not budget.bandwidth_bytes_per_s or not budget.n_gpu:
        return None, None, None
    from kvadvise.planner import speed
    from kvadvise.planner.speed import Device

    n = budget.n_gpu
    devices = [Device(budget.backend, budget.bandwidth_bytes_per_s, 1 / n) for _ in range(n)]
    n_seq = cfg.n_ctx // max(1, cfg.n_parallel)
    est = speed.estimate(spec, n_seq, devices, type_k=cfg.type_k, type_v=cfg.type_v, source=budget.bandwidth_source)
    if est is None:
        return None, None, None
    return est.points[-1][1], f"{est.text()}; {est.note}", est


@dataclass(frozen=True, slots=True)
class Curve:
    """Device memory against context for one cache configuration (the chart's line)."""

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
