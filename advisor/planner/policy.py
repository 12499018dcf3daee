"""The recommendation policy: which K/V cache types are candidates and in what order, the context
to aim for, and the per-architecture rules. A new cache type touches kvadvise.model.ggml's table and
this module only.

1. The target is a context a user needs, not the model's maximum: 64k tokens
   per slot on cards of 16 GB and more, 32k below and on the CPU (Ollama's
   docs: agents and coding tools need "at least 64000 tokens"), capped at
   n_ctx_train; ``--use``/``--target-ctx`` choose another; ``--use long`` = max.
2. f16 K/V when it reaches the target (it reproduces tokens exactly).
3. Else q8_0 K and V ("usually no noticeable impact", Ollama FAQ; KLD about
   0.001 on an 8B model, llama.cpp PR #7412), or q8_0 K with f16 V where flash
   attention is off (a quantized V needs it).
   A measurement on the model itself (``kvadvise verify quality``) takes precedence: a cache
   type measured worse than Q6_K weights (kvadvise.planner.quality) is not chosen by default.
4. q4_0 only when the user opts in (``--allow-q4`` or ``-ctk/-ctv q4_0``),
   with a warning; the options always show what q4_0 would reach. When q8_0
   cannot reach the target, the plan says so and names the real levers.
5. gpt-oss keeps an f16 K cache (attention sinks); high-GQA models get a note
   when their cache is quantized (Ollama FAQ).
6. Headroom (kvadvise.planner.budget): the fit margin, 3 % of the weights when they come from a
   built-in profile, a display allowance on a single desktop GPU. The context is rounded down
   to a multiple of 1,024.
7. Never a config that does not fit; if even the smallest context does not
   fit the GPU, say so (fits = false) and, beside it, the fastest partial
   offload that runs (kvadvise.planner.offload), unless ``gpu_only``.
Flash attention is on whenever the model allows it: it is required for a
quantized V cache and removes the attention-score buffer that grows with
n_ctx × n_head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.errors import ConfigError
from kvadvise.model.ggml import GGMLType, is_quantized
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import (
    CTX_PAD,
    RunConfig,
    auto_batched,
    auto_fa_missing,
    cuda_fattn_decides,
    cuda_flash_attn_missing,
    validate,
)

if TYPE_CHECKING:
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.quality import MeasuredQuality

F16, Q8_0, Q4_0 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
KV = tuple[GGMLType, GGMLType]  # (type_k, type_v)
GIB = 1 << 30

# Cache types in order of preference: least quantized first. q4_0 (K or V) only when the user opts in.
CACHE_CHOICES: tuple[KV, ...] = ((F16, F16), (Q8_0, Q8_0), (Q8_0, Q4_0), (Q4_0, Q4_0))
SAME_TYPE_CHOICES = tuple(c for c in CACHE_CHOICES if c[0] == c[1])  # Ollama: one type for K and V
# Without flash attention V stays f16 (llama.cpp refuses a quantized V cache without it).
FA_OFF_CHOICES: tuple[KV, ...] = ((F16, F16), (Q8_0, F16), (Q4_0, F16))
# Types chosen only on the user's opt-in (--allow-q4, or -ctk/-ctv naming one): a small-medium loss
# in precision that may be more noticeable at higher context sizes (Ollama FAQ).
OPT_IN_TYPES = frozenset({Q4_0})
# The columns of a listing of many models (kvadvise ollama --installed, kvadvise gguf DIR).
LISTED_CACHE_TYPES: tuple[GGMLType, ...] = (F16, Q8_0)

# Default targets per slot (Ollama docs/context-length.mdx: agents and coding assistants need
# "at least 64000 tokens"); below 16 GB, or on the CPU, 32k keeps room for the weights.
DEFAULT_TARGET_CTX = 65536
SMALL_TARGET_CTX = 32768
BIG_CARD_BYTES = 15 * GIB  # a "16 GB" card reports about 15.99 GiB through NVML
CTX_ROUND = 1024  # recommended contexts are rounded down to a multiple of this
# Ollama's FAQ: models with a high GQA count (its example: Qwen2, 7 query heads per KV head)
# may lose more precision from a quantized cache.
HIGH_GQA_RATIO = 6
# gpt-oss uses attention sinks: a quantized K cache badly distorts its output (a KLD study in
# TheTom/llama-cpp-turboquant#305; Ollama disabled quantized KV for gpt-oss in 2025,
# ollama/ollama df335aac0 and 19e6796ea).
F16_K_ARCHS = frozenset({"gpt-oss"})
F16_K_CHOICES: tuple[KV, ...] = ((F16, F16), (F16, Q8_0), (F16, Q4_0))


@dataclass(frozen=True, slots=True)
class Policy:
    """What the user asked the recommender for: context, cache types, slots, margins."""

    target_ctx: int = (
        0  # per sequence; 0 = the default (64k on >= 16 GB cards, 32k below), or the maximum with use="long"
    )
    min_ctx: int = 0  # per sequence; fail (exit 3) below it
    ctx_floor: int = 0  # per sequence: the runtime runs at least this many (runtime.seam.Shaped.ctx_floor)
    expert_offload: bool = True  # a partial plan may keep a MoE model's experts on the CPU (runtime.seam.Shaped)
    # the last block whose experts are on the CPU may keep its up (and gate) projections on the GPU: the runtime takes
    # a tensor override or runs llama.cpp's --fit (runtime.seam.Shaped)
    expert_overflow: bool = False
    output_first: bool | None = None  # a partial plan's output layer on the GPU first (runtime.seam.Shaped)
    repeatable: bool = False  # f16 only: quantized caches do not reproduce tokens exactly
    same_type_kv: bool = False  # the runtime has one cache type for K and V (Ollama)
    use: str | None = None  # the --use profile the target came from
    fixed_kv: KV | None = None  # the user chose -ctk/-ctv: only the context is picked
    # also plan a partial offload at the target when the GPU alone reaches less (a plan that does not fit
    # the GPU at all gets one anyway, unless gpu_only)
    allow_cpu: bool = False
    gpu_only: bool = False  # --gpu-only: 100 % on the GPU or nothing: no partial offload
    allow_q4: bool = False  # q4_0 caches may be chosen (else they are only shown as options)
    # the weights size is a published figure: keep 3 % free (kvadvise.planner.budget; a spec from a
    # built-in profile is taken as one without it)
    weights_uncertain: bool = False
    headless: bool = False  # no display on the GPU: no display allowance
    # several devices and no -ts: when the split by free memory leaves a device short of its budget, llama.cpp's
    # --fit moves layers between them (kvadvise.planner.fitsplit), and so does the plan
    fit_split: bool = False
    # the command states the split planned (-ts): where llama.cpp's fill leaves a device over its budget once the full
    # offload runs pipelined, the fill is redone as it runs (kvadvise.planner.fitsplit); False: the runtime runs
    # llama.cpp's --fit itself (Ollama >= 0.30), whose fill stands
    fit_as_run: bool = True
    # what `kvadvise verify quality` measured on this model: a cache type measured worse than
    # kvadvise.planner.quality's threshold is not chosen by default (a -ctk/-ctv naming it still is)
    quality: MeasuredQuality | None = None


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


def needs_opt_in(kv: KV) -> bool:
    """A cache type the recommendation takes only when the user opts in (q4_0)."""
    return bool(OPT_IN_TYPES.intersection(kv))


def kv_name(kv: KV) -> str:
    """``q8_0 K/V``, or ``q8_0 K / f16 V``."""
    return f"{kv[0].type_name} K/V" if kv[0] == kv[1] else f"{kv[0].type_name} K / {kv[1].type_name} V"


def load_use_cases() -> dict[str, int]:
    """``--use NAME`` -> its target context per sequence (profiles/usecases.json)."""
    from kvadvise.profiles import read_text

    doc = json.loads(read_text("usecases.json"))
    return {k: int(v["target_ctx"]) for k, v in doc.items() if not k.startswith("_")}


def default_target_ctx(budget: Budget) -> tuple[int, str]:
    """The context per slot to aim for when the user names none, and why."""
    if budget.device != "cpu" and budget.total_bytes >= BIG_CARD_BYTES:
        return DEFAULT_TARGET_CTX, (
            "64k on a card of 16 GB or more (Ollama's docs: agents and coding tools need at least 64000 tokens)"
        )
    where = "a card below 16 GB" if budget.device != "cpu" else "the CPU"
    return SMALL_TARGET_CTX, f"32k on {where} (--use agent aims for 64k, --use long for the maximum)"


def gqa_ratio(spec: ModelSpec) -> int:
    """Query heads per KV head, the largest over the layers."""
    pairs = [(h, kv) for h, kv in zip(spec.n_head, spec.n_head_kv, strict=False) if kv]
    return max((h // kv for h, kv in pairs), default=1)


def config_at(base: RunConfig, n_ctx_seq: int, kv: KV, fa: bool, device: str) -> RunConfig:
    """``base`` run with ``n_ctx_seq`` tokens per sequence, cache types ``kv`` and flash attention ``fa`` (and the batch
    its runtime picks for that context: memory.auto_batched)."""
    return auto_batched(
        replace(
            base,
            n_ctx=n_ctx_seq * base.n_parallel,
            type_k=kv[0],
            type_v=kv[1],
            flash_attn="on" if fa else "off",
            device=device,
        )
    )


def kv_choices(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[KV]:
    """The cache types the runtime and the model allow, least quantized first (q4_0 included)."""
    if policy.repeatable:
        return [(F16, F16)]
    one_type = policy.same_type_kv or spec.is_mla  # MLA: one compressed cache, same type for K and V
    if base.flash_attn == "off":
        # without FA, V must stay f16; a runtime with one type for K and V then has only f16
        kvs: tuple[KV, ...] = ((F16, F16),) if one_type else FA_OFF_CHOICES
    else:
        kvs = SAME_TYPE_CHOICES if one_type else CACHE_CHOICES
    if spec.architecture in F16_K_ARCHS:
        kvs = tuple(c for c in kvs if c[0] == F16)
        if not one_type and base.flash_attn != "off":
            kvs = F16_K_CHOICES
    return list(kvs)


def choices(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[tuple[KV, bool, bool]]:
    """(cache types, flash attention, allowed) per candidate; a q4_0 candidate is allowed only on opt-in."""
    # validate() raises what estimate() would for these types, without sizing anything (a full
    # estimate here was 29 % of `compare`)
    if policy.fixed_kv is not None:
        # auto without a CUDA kernel resolves off, unless a quantized V forces it on (llama_init_from_model)
        missing = auto_fa_missing(spec, base, *policy.fixed_kv)
        fa = base.flash_attn != "off" and not (missing and not is_quantized(policy.fixed_kv[1]))
        validate(spec, config_at(base, CTX_PAD, policy.fixed_kv, fa, base.device))  # raises
        return [(policy.fixed_kv, fa, True)]
    fa = base.flash_attn != "off"
    if fa and no_fa_kernel(spec, base):
        # llama.cpp resolves auto off where CUDA has no kernel (llama_context::resolve_fused_ops), so the
        # candidates are those without flash attention: V stays f16
        base, fa = replace(base, flash_attn="off"), False
    out = []
    refused: ConfigError | None = None
    for kv in kv_choices(spec, base, policy):
        try:
            validate(spec, config_at(base, CTX_PAD, kv, fa, base.device))
        except ConfigError as err:
            refused = refused or err
            continue  # e.g. the block size does not divide the head size
        if fa and cuda_fattn_decides(base) and cuda_flash_attn_missing(spec, *kv, base.llama_build):
            # the build's CUDA flash attention has no kernel for this cache: every attention would run on the
            # CPU (builds.FA_QUANT_ANY_HEAD, builds.FA_KV_ANY_PAIR), never a choice kvadvise makes
            continue
        measured_bad = policy.quality is not None and policy.quality.rejects(kv)
        out.append((kv, fa, (policy.allow_q4 or not needs_opt_in(kv)) and not measured_bad))
    if not out and refused is not None:
        raise refused  # every cache type refused alike: the settings' reason (--spec-type draft-mtp, no MTP layers)
    return out


def no_fa_kernel(spec: ModelSpec, base: RunConfig) -> str | None:
    """Why kvadvise, choosing, plans without flash attention: CUDA has no kernel for this model's heads
    (ggml-cuda fattn.cu ggml_cuda_get_best_fattn_kernel: DeepSeek-V2-Lite's pre-MLA K head 192 / V head 128 at
    GQA 1), so llama.cpp's auto resolves it off; None where it has one (or the user set -fa on/off)."""
    return auto_fa_missing(spec, base, F16, F16)


def no_quantized_fa_kernel(spec: ModelSpec, base: RunConfig, policy: Policy) -> str | None:
    """Why no quantized cache is among the choices on this build: its CUDA flash attention has no kernel for
    q8_0 at this model's heads (builds.FA_QUANT_ANY_HEAD), where it has one for f16; None otherwise (or when the
    user fixed the cache types)."""
    if policy.fixed_kv is not None or policy.repeatable or base.flash_attn == "off" or not cuda_fattn_decides(base):
        return None
    if cuda_flash_attn_missing(spec, F16, F16, base.llama_build) is not None:
        return None
    return cuda_flash_attn_missing(spec, Q8_0, Q8_0, base.llama_build)


def allowed_kvs(spec: ModelSpec, base: RunConfig, policy: Policy) -> list[KV]:
    """The cache types the recommendation may pick, in preference order."""
    return [kv for kv, _fa, allowed in choices(spec, base, policy) if allowed]
