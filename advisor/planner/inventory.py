"""How far each model of a collection (an Ollama store, a folder of GGUF files) reaches on one budget:
the largest context per slot that stays 100% on the device at f16 and at q8_0, and what the model needs
at the context it would run at. Pure: the caller brings the specs and the budget."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvadvise.errors import ConfigError
from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import policy
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import CTX_PAD, RunConfig, estimate
from kvadvise.planner.recommender import max_context


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How the runtime runs every model of the collection (Ollama: server-wide settings)."""

    n_parallel: int = 1  # slots (OLLAMA_NUM_PARALLEL, -np)
    flash_attn: bool = True  # OLLAMA_FLASH_ATTENTION (on unless set to 0 since Ollama 0.30)
    cache_type: GGMLType = GGMLType.F16  # OLLAMA_KV_CACHE_TYPE: the type it runs with now
    default_ctx: int = 0  # per slot, when the model sets none (OLLAMA_CONTEXT_LENGTH, the VRAM tier); 0 = n_ctx_train


@dataclass(frozen=True, slots=True)
class ModelFit:
    """How one listed model fits the device: the largest context per cache type, and what it would run at."""

    max_ctx: dict[str, int | None]  # cache type -> the largest context per slot on the device (0: not even 256
    # tokens; None: this cache type cannot run here, e.g. a quantized V without flash attention)
    run_ctx: int  # per slot: the context the runtime would give it (its own num_ctx, else the settings' default)
    run_cache_type: str
    needs_bytes: int  # device bytes at run_ctx with the runtime's cache type, 100% on the device
    fits: bool | None  # needs_bytes <= the budget; None without a budget


def fit_of(spec: ModelSpec, settings: RunSettings, budget: Budget | None, *, model_ctx: int | None = None) -> ModelFit:
    """``model_ctx``: the model's own context per slot (Ollama's num_ctx parameter), which wins over the default."""
    device = budget.device if budget is not None else "cuda"
    fa = "on" if settings.flash_attn else "off"
    base = RunConfig(n_ctx=0, n_parallel=settings.n_parallel, flash_attn=fa, device=device)
    reach: dict[str, int | None] = {}
    for t in policy.LISTED_CACHE_TYPES:  # the listing's columns
        if budget is None:
            reach[t.type_name] = None
            continue
        try:
            reach[t.type_name] = max_context(spec, base, (t, t), settings.flash_attn, budget)
        except ConfigError:
            reach[t.type_name] = None
    run_ctx = model_ctx or settings.default_ctx or spec.n_ctx_train or CTX_PAD
    if spec.n_ctx_train:
        run_ctx = min(run_ctx, spec.n_ctx_train)  # Ollama clamps num_ctx to the training context
    t = settings.cache_type
    cfg = replace(base, n_ctx=run_ctx * settings.n_parallel, type_k=t, type_v=t)
    try:
        need = estimate(spec, cfg).device_bytes
    except ConfigError:
        # a quantized V cache without flash attention: llama.cpp refuses to load it, and Ollama >= 0.30 passes both
        # to llama-server as set (llm/llama_server.go), where older Ollamas fell back to f16: it does not run
        return ModelFit(reach, run_ctx, t.type_name, 0, None if budget is None else False)
    fits = None if budget is None else need <= budget.budget_bytes
    return ModelFit(reach, run_ctx, t.type_name, need, fits)
