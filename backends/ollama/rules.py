"""How Ollama (>= 0.30) runs a model, in one place: the settings it takes and what it
passes to llama-server (memory-spec.md §6).

``num_ctx`` is the context of one slot: llama-server gets ``-c num_ctx×num_parallel
-np num_parallel`` (llm/llama_server.go); ``OLLAMA_KV_CACHE_TYPE`` is one type for
K and V, server-wide; flash attention is on unless ``OLLAMA_FLASH_ATTENTION=0``;
``--fit`` keeps ``LLAMA_ARG_FIT_TARGET`` MiB free (1024, more with a projector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.errors import ConfigError
from kvadvise.model.ggml import KV_CACHE_TYPES as GGML_KV_CACHE_TYPES
from kvadvise.model.ggml import cache_type, is_quantized

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from kvadvise.backends.ollama.model import OllamaModel
    from kvadvise.backends.ollama.towers import Tower
    from kvadvise.planner.hardware import Gpu
    from kvadvise.planner.memory import RunConfig

KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")  # what Ollama documents (docs/faq), all a runner before 0.30 takes; K = V
# From 0.30 Ollama passes OLLAMA_KV_CACHE_TYPE, lower-cased and unchecked, to llama-server as --cache-type-k and
# --cache-type-v (llm/llama_server.go, llm/server.go NewLlamaServer): any type llama-server takes (common/arg.cpp
# kv_cache_types; another stops it, and the load fails)
SERVER_KV_CACHE_TYPES = tuple(t.type_name for t in GGML_KV_CACHE_TYPES)
GIB = 1 << 30
MIB = 1 << 20
DEFAULT_FIT_TARGET_MIB = 1024  # llama.cpp common/arg.cpp: -fitt default
# server/sched.go load: numParallel forced to 1 for these architectures (memory-spec §6.a), by release: each tag's
# list (v0.11.0: ``slices.Contains(req.model.Config.ModelFamilies, "mllama")``; the []string list from v0.12.7)
_VL = ("mllama", "qwen3vl", "qwen3vlmoe")
_HYBRID = ("qwen3next", "lfm2", "lfm2moe")
_HYBRID2 = (*_HYBRID, "qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe")
SINGLE_SLOT_BY_RELEASE: tuple[tuple[tuple[int, int, int], frozenset[str]], ...] = (
    ((0, 11, 0), frozenset({"mllama"})),
    ((0, 12, 7), frozenset(_VL)),
    ((0, 15, 5), frozenset((*_VL, *_HYBRID))),
    ((0, 17, 1), frozenset((*_VL, *_HYBRID2))),
    ((0, 22, 0), frozenset((*_VL, *_HYBRID2, "nemotron_h_omni"))),
)
SINGLE_SLOT_ARCHS = SINGLE_SLOT_BY_RELEASE[-1][1]  # the newest release's


def single_slot_archs(v: tuple[int, int, int] | None) -> frozenset[str]:
    """The architectures Ollama ``v`` (None: the newest) runs with one slot."""
    if v is None:
        return SINGLE_SLOT_ARCHS
    out: frozenset[str] = frozenset()
    for since, names in SINGLE_SLOT_BY_RELEASE:
        if v >= since:
            out = names
    return out


# server/sched.go selectLlamaServerPlacement (Ollama >= 0.30, memory-spec §6): with several GPUs and no
# OLLAMA_SCHED_SPREAD, the best single GPU (discrete first, then the most free memory) takes the model when
# its prediction is at most 80 % of that GPU's free memory (--split-mode none); else all of them.
SINGLE_GPU_SHARE = 0.8


def single_gpu(gpus: Sequence[Gpu]) -> Gpu:
    """The GPU Ollama would try alone: discrete before integrated/unified, then the most free memory."""
    return max(gpus, key=lambda g: (not g.unified_memory, g.free_bytes))


def sched_spread() -> bool:
    """OLLAMA_SCHED_SPREAD as this shell has it (the server's own setting cannot be read over its API)."""

    from kvadvise.backends.ollama import envconfig

    return envconfig.boolean("OLLAMA_SCHED_SPREAD", False)


def llama_n_ctx(num_ctx: int, num_parallel: int) -> int:
    """The ``-c`` llama-server is started with: num_ctx is per slot (llm/llama_server.go)."""
    return num_ctx * num_parallel


def num_ctx_per_slot(n_ctx: int, n_parallel: int) -> int:
    """The inverse: the num_ctx that gives llama-server ``-c n_ctx`` with ``n_parallel`` slots."""
    return max(1, n_ctx // max(1, n_parallel))


def one_cache_type(type_k: str | None, type_v: str | None) -> str | None:
    """Ollama's one OLLAMA_KV_CACHE_TYPE for K and V, from -ctk/-ctv (either, or both the same)."""
    if type_k and type_v and type_k != type_v:
        raise ConfigError(
            "Ollama takes one OLLAMA_KV_CACHE_TYPE for K and V",
            hint="give one type (-ctk or -ctv), or the same for both",
        )
    return type_k or type_v


def run_config(num_ctx: int, num_parallel: int, kv_cache_type: str, *, flash_attention: bool = True) -> RunConfig:
    """The llama.cpp config Ollama runs for these settings, on the GPU."""
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.memory import RunConfig

    kv = cache_type(kv_cache_type)
    return RunConfig(
        n_ctx=llama_n_ctx(num_ctx, num_parallel),
        n_parallel=num_parallel,
        type_k=kv,
        type_v=kv,
        flash_attn="on" if flash_attention else "off",
        device="cuda",
    )


def mtp_draft_n_max(model: OllamaModel) -> int:
    """The tokens a model's MTP draft proposes when Ollama launches one, else 0. llm/llama_server.go (ollama
    fb30760, since v0.30.0): a GGUF with nextn_predict_layers and no draft model gets EnableMTP, whether it is
    loaded alone or beside others; appendDraftArgs adds --spec-type draft-mtp --spec-draft-n-max
    draft_num_predict, which server/routes.go modelOptions zeroes unless the model's or the request's parameters
    set it (the llama-server runners only: the built-in runner has no drafts)."""
    value = model.params.get("draft_num_predict")
    if not model.spec.n_layer_nextn or isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return 0
    return min(int(value), 1024)


def with_mtp_draft(cfg: RunConfig, model: OllamaModel) -> RunConfig:
    """``cfg`` with the MTP draft Ollama launches for ``model`` (:func:`mtp_draft_n_max`), if any."""
    from dataclasses import replace

    n_max = mtp_draft_n_max(model)
    return replace(cfg, mtp=True, spec_draft_n_max=n_max) if n_max else cfg


# server/sched.go getRunner: "if opts.NumCtx < 4 { opts.NumCtx = 4 }", and "multimodal models require at least
# 2048 context" for a model with CapabilityVision (read at v0.11.5, v0.14.0, v0.24.0 and v0.33.0-rc2; v0.11.4 has
# only the first: its 2048 was llm/memory.go's, for the estimate of every model, kvadvise.backends.ollama.estimate_legacy)
MIN_NUM_CTX = 4
VISION_MIN_NUM_CTX = 2048
VISION_MIN_FROM = (0, 11, 5)


def run_num_ctx(num_ctx: int, *, vision: bool) -> int:
    """The num_ctx getRunner hands on for a request of ``num_ctx`` (before the training-context clamp)."""
    return max(VISION_MIN_NUM_CTX if vision else MIN_NUM_CTX, num_ctx)


def is_vision(model: OllamaModel) -> bool:
    """CheckCapabilities(CapabilityVision) (server/images.go: a projector, or vision.block_count in the blob) as far
    as kvadvise sees it: a projector, a GGUF with its own vision tower (OllamaModel.vision_tower), or a built-in
    profile with a vision tower in its blob."""
    if model.projector_bytes or model.projector_path or model.projector is not None or model.vision_tower:
        return True
    if not model.source.startswith("profile:"):
        return False
    from kvadvise.backends.ollama.name import parse_name
    from kvadvise.backends.ollama.profiles import find_profile

    p = find_profile(parse_name(model.ref))
    return p is not None and p.projector_bytes > 0


def projector_margin_bytes(model: OllamaModel, *, planned: bool = False) -> int:
    """What --fit keeps free with a projector, beyond the plan's margin: Ollama sets LLAMA_ARG_FIT_TARGET to
    mmprojFitTargetMiB = ceil((mmproj + 1 GiB) / MiB) (llm/llama_server.go) in place of llama.cpp's 1024 MiB,
    and llama-server adds the projector's own memory to that target and loads the projector into it
    (tools/server/server-context.cpp, mtmd_get_memory_usage). ``planned``: the projector's weights and
    compute are in the plan (its header was read: kvadvise.planner.projector), so only Ollama's raise of
    the target is left, ceil(mmproj / MiB) beyond the 1 GiB margin; else the whole target stands in for
    the projector's own memory too."""
    return fit_target_raise_bytes(model.projector_bytes, planned=planned)


def own_tower(model: OllamaModel) -> Tower | None:
    """The blob's own tower that Ollama >= 0.30 passes as --mmproj: only for a model without a projector layer
    (NewLlamaServer: ``len(projectors) == 0``)."""
    if model.projector_bytes or model.projector_path is not None or model.projector is not None:
        return None
    return model.tower


def mmproj_bytes(model: OllamaModel) -> int:
    """Ollama's mmprojMemoryRequirement for ``model`` as Ollama >= 0.30 runs it: its projector layer's size, or its
    own tower's."""
    tower = own_tower(model)
    return model.projector_bytes or (tower.file_bytes if tower is not None else 0)


def fit_target_raise_bytes(projector_bytes: int, *, planned: bool) -> int:
    """:func:`projector_margin_bytes` for a projector of ``projector_bytes`` as Ollama sizes it (:func:`mmproj_bytes`:
    a projector layer's tensors, or a blob's own tower's: kvadvise.backends.ollama.towers)."""
    if not projector_bytes:
        return 0
    if planned:
        return math.ceil(projector_bytes / MIB) * MIB
    return math.ceil((projector_bytes + GIB) / MIB) * MIB


def tier_vram_bytes(gpu_totals_bytes: Iterable[int], gpu_overhead_bytes: int) -> int:
    """The VRAM server/routes.go Serve sizes the default context by: each GPU's total less OLLAMA_GPU_OVERHEAD
    (``totalVRAM += gpu.TotalMemory - envconfig.GpuOverhead()``, ollama fb30760; none below 0 here)."""
    return sum(max(0, t - gpu_overhead_bytes) for t in gpu_totals_bytes)


def default_num_ctx(total_vram_bytes: int, n_ctx_train: int = 0) -> int:
    """Ollama's context when nothing sets it: a tier by the GPUs' total VRAM (server/routes.go Serve: 262144
    from 47 GiB, 32768 from 23 GiB, else 4096), capped like any num_ctx at the model's training context
    (llm/server.go NewLlamaServer, server/sched.go effectiveContext; ``n_ctx_train`` 0: unknown, no cap)."""
    if total_vram_bytes >= 47 * GIB:
        tier = 262144
    elif total_vram_bytes >= 23 * GIB:
        tier = 32768
    else:
        tier = 4096
    return capped_num_ctx(tier, n_ctx_train)


def capped_num_ctx(num_ctx: int, n_ctx_train: int) -> int:
    """The num_ctx Ollama runs: at most the model's training context. llm/server.go NewLlamaServer (ollama
    fb30760, 2026-08-21): ``if opts.NumCtx > int(trainCtx) && trainCtx > 0`` it logs "requested context
    size too large for model" and sets ``opts.NumCtx = int(trainCtx)``."""
    return min(num_ctx, n_ctx_train) if n_ctx_train > 0 else num_ctx


def too_large_warning(num_ctx: int, n_ctx_train: int) -> str | None:
    """Ollama's warning for a num_ctx past the training context, and what it runs instead."""
    if n_ctx_train <= 0 or num_ctx <= n_ctx_train:
        return None
    return (
        f"num_ctx {num_ctx:,} is past the model's training context: Ollama logs \"requested context size too large "
        f'for model" and runs {n_ctx_train:,} (llm/server.go); planned at {n_ctx_train:,}'
    )


@dataclass(frozen=True, slots=True)
class OllamaSettings:
    """What kvadvise advises an Ollama user to set."""

    num_ctx: int  # context per slot (Ollama's num_ctx)
    num_parallel: int  # OLLAMA_NUM_PARALLEL
    kv_cache_type: str  # OLLAMA_KV_CACHE_TYPE: f16 | q8_0 | q4_0, for K and V, server-wide
    flash_attention: bool  # OLLAMA_FLASH_ATTENTION
    num_batch: int | None = None  # PARAMETER num_batch, only when the advice changes it
    # PARAMETER num_gpu: only where the release's own estimate (Ollama <= 0.12.10 llm/memory.go, the llamarunner's
    # llm/server.go createLayout to 0.24) would put another number of layers on the GPU than llama.cpp's
    # allocation fits (kvadvise.backends.ollama.decision)
    num_gpu: int | None = None
    fit_target_mib: int | None = None  # LLAMA_ARG_FIT_TARGET
    server_default: bool = False  # also set OLLAMA_CONTEXT_LENGTH (every model without num_ctx gets it)
    repeatable: bool = False  # seed + temperature 0 in the Modelfile, OLLAMA_NUM_PARALLEL=1
    full_offload: bool = False  # the plan puts every layer on the GPU (no model num_gpu may override it)
    partial: bool = False  # the plan that runs keeps part of the model on the CPU (Ollama's --fit places it)
    # llama-server's prompt cache and context checkpoints (kvadvise.planner.hostram), where the RAM needs
    # less than llama.cpp's defaults: LLAMA_ARG_CACHE_RAM / LLAMA_ARG_CTX_CHECKPOINTS in the server's
    # environment, which Ollama's runner inherits (llm/llama_server.go: cmd.Env = os.Environ())
    cache_ram_mib: int | None = None
    ctx_checkpoints: int | None = None
    # False: the model keeps no K/V cache (an encoder: bert, nomic-bert; llama.cpp makes no memory module for
    # it), so OLLAMA_KV_CACHE_TYPE changes nothing for it and is not set (the server's other models keep theirs)
    kv_cache: bool = True

    def __post_init__(self) -> None:
        for field, v in (("num_ctx", self.num_ctx), ("num_parallel", self.num_parallel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{field} must be a positive whole number, got {v!r}")
        if self.num_ctx * self.num_parallel > 2**31 - 1:  # Ollama runs llama-server -c num_ctx×num_parallel, an int32
            raise ConfigError(
                f"num_ctx {self.num_ctx:,} × num_parallel {self.num_parallel} is more than llama.cpp's int32 -c takes"
            )
        if self.num_batch is not None and (
            isinstance(self.num_batch, bool) or not isinstance(self.num_batch, int) or self.num_batch < 1
        ):
            raise ConfigError(f"num_batch must be a positive whole number, got {self.num_batch!r}")
        if self.fit_target_mib is not None and (
            isinstance(self.fit_target_mib, bool) or not isinstance(self.fit_target_mib, int) or self.fit_target_mib < 0
        ):
            raise ConfigError(f"fit_target_mib must be a whole number >= 0, got {self.fit_target_mib!r}")
        if self.kv_cache_type not in SERVER_KV_CACHE_TYPES:
            raise ConfigError(
                f"OLLAMA_KV_CACHE_TYPE {self.kv_cache_type!r} is not a type llama-server takes",
                hint="one of " + ", ".join(SERVER_KV_CACHE_TYPES) + " (before Ollama 0.30: f16, q8_0 or q4_0)",
            )
        for field, n in (("cache_ram_mib", self.cache_ram_mib), ("ctx_checkpoints", self.ctx_checkpoints)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
                raise ConfigError(f"{field} must be a whole number >= 0, got {n!r}")
        if is_quantized(cache_type(self.kv_cache_type)) and not self.flash_attention:
            # Ollama passes the type as both -ctk and -ctv; llama.cpp refuses a quantized V without FA
            raise ConfigError(
                f"OLLAMA_KV_CACHE_TYPE={self.kv_cache_type} needs flash attention (a quantized V cache does)",
                hint="set OLLAMA_FLASH_ATTENTION=1 or use f16",
            )

    @property
    def kv_is_server_wide(self) -> bool:
        """A non-default KV cache type changes the cache of every model the server runs."""
        return self.kv_cache_type != "f16"
