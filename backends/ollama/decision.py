"""Ollama's own layer decision, for the releases whose decision kvadvise replays, beside what llama.cpp would
allocate: Ollama 0.7.1 to 0.12.10 (``llm/memory.go``, kvadvise.backends.ollama.estimate_legacy) and, for the
llamarunner, Ollama 0.12.11 to 0.24 (``llm/server.go`` ``llamaServer.Load`` / ``createLayout`` over
``fs/ggml`` GraphSize, kvadvise.backends.ollama.layout).

Those releases put on the GPU the layers their estimate says fit (``msg=offload ... layers.offload``; from
0.12.11 the load request's ``GPULayers``), not what the allocation needs: gpt-oss:20b got 23 of 25 layers on
a 16 GB card under 0.11.0 though all 25 fit. Where the plan (llama.cpp's allocation) puts another number of
layers on the GPU than Ollama's estimate, the model's ``num_gpu`` (a Modelfile ``PARAMETER``; ``llm/memory.go``
and ``assignLayers`` take ``opts.NumGPU`` as the layers asked for) loads that many: the advice sets it, but not
for the Go engine, whose allocation is not modelled. The Go engine's layout (``ollamaServer.Load``: createLayout
over the memory its runner reports for trial layouts) is replayed for 0.11.11 to 0.24 by
kvadvise.backends.ollama.engine_layout, with llama.cpp's compute buffer (kvadvise's estimate, one output row per
slot) standing in for the runner's compute graph (said in the decision's text and JSON); 0.11.5 - 0.11.10's trial
layout (only with OLLAMA_NEW_ESTIMATES=1) and llama.cpp's ``--fit`` from 0.30 are not claimed here
(kvadvise.backends.ollama.versions says who decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import engine_layout, envconfig, estimate_legacy, layout, rules
from kvadvise.backends.ollama.versions import (
    NUM_BATCH_DEFAULT,
    Placement,
    blob_architecture,
    supports_flash_attention,
)

if TYPE_CHECKING:
    from kvadvise.backends.ollama.model import OllamaModel
    from kvadvise.backends.ollama.rules import OllamaSettings
    from kvadvise.backends.ollama.versions import OllamaRelease
    from kvadvise.planner.planning import Plan

MEMORY_GO = "llm/memory.go"  # OllamaRelease.layers_by of the releases estimate_legacy replays
CREATE_LAYOUT = "llm/server.go createLayout over fs/ggml GraphSize"  # the llamarunner's, 0.12.11 - 0.24 (layout)
# the Go engine's, 0.11.11 - 0.24 (engine_layout); versions.release names it so
ENGINE_LAYOUT = "llm/server.go createLayout over the Go runner's trial allocations"
# Ollama's names of a GPU library from 0.12.11 (ml.DeviceInfo.Library), by the ggml backend
_LAYOUT_LIBRARIES = {"cuda": "CUDA", "rocm": "ROCm", "metal": "Metal", "vulkan": "Vulkan", "sycl": "SYCL"}
_LIBRARIES = {"sycl": "oneapi"}  # Ollama's name for a GPU library where it is not the ggml backend's


@dataclass(frozen=True, slots=True)
class OllamaDecision:
    """How many layers an Ollama release puts on the GPU(s), and how many llama.cpp's allocation fits."""

    version: str
    layers_offload: int  # Ollama's layers.offload (the output layer counts as one)
    layers_model: int  # block_count + 1
    required_full_bytes: int  # memory.required.full: Ollama's estimate of the whole model on the GPU(s)
    available_bytes: int  # memory.available, summed over the GPUs it picked
    planned_layers: int  # the plan's layers on the GPU(s), counted as Ollama counts them
    log_line: str  # Ollama's msg=offload line, as it would print it
    # the plan is the runner's own allocation (the llamarunner: the library); False for the Go engine, whose
    # allocation kvadvise does not model (the library's figures stand in): no num_gpu is set on them
    allocation_modelled: bool = True
    layers_by: str = MEMORY_GO  # whose estimate: llm/memory.go, or llm/server.go createLayout (layout.py)
    approximation: str | None = None  # what the replay approximates (the Go engine's graph), None: nothing

    @property
    def differs(self) -> bool:
        """Ollama's estimate loads another number of layers than llama.cpp's allocation fits."""
        return self.planned_layers != self.layers_offload

    @property
    def num_gpu(self) -> int | None:
        """The num_gpu that loads the plan's layers, where Ollama's estimate would load another count: fewer
        (the GPU left idle) or more (more than llama.cpp can allocate there: an out-of-memory load)."""
        if not self.allocation_modelled:
            return None
        return self.planned_layers if self.differs else None

    def text(self) -> str:
        basis = (
            f"{MEMORY_GO}: {self.required_full_bytes / 2**30:.1f} GiB for all of them"
            if self.layers_by == MEMORY_GO
            else f"{self.layers_by}: {self.required_full_bytes / 2**30:.1f} GiB in all for that layout"
        )
        said = (
            f"Ollama {self.version} puts {self.layers_offload} of {self.layers_model} layers on the GPU by its "
            f"own estimate ({basis}, {self.available_bytes / 2**30:.1f} GiB free)"
        )
        if self.approximation is not None:
            said = f"{said} [{self.approximation}]"
        if not self.allocation_modelled and self.differs:
            return (
                f"{said}; llama.cpp's library would fit {self.planned_layers}, but the Go engine that runs it "
                "allocates otherwise (not modelled): num_gpu is left unset"
            )
        if self.num_gpu is None:
            return said
        if self.planned_layers > self.layers_offload:
            return f"{said}; {self.planned_layers} fit as llama.cpp allocates them: PARAMETER num_gpu {self.num_gpu}"
        return (
            f"{said}; only {self.planned_layers} fit as llama.cpp allocates them: PARAMETER num_gpu "
            f"{self.num_gpu} keeps the load within the GPU"
        )

    def json_doc(self) -> dict[str, object]:
        return {
            "version": self.version,
            "layers_offload": self.layers_offload,
            "layers_model": self.layers_model,
            "required_full_bytes": self.required_full_bytes,
            "available_bytes": self.available_bytes,
            "planned_layers": self.planned_layers,
            "num_gpu": self.num_gpu,
            "log_line": self.log_line,
            "allocation_modelled": self.allocation_modelled,
            "layers_by": self.layers_by,
            "approximation": self.approximation,
        }


def decide(model: OllamaModel, plan: Plan, release: OllamaRelease, settings: OllamaSettings) -> OllamaDecision | None:
    """Ollama ``release``'s layer decision for ``plan``'s GPUs and ``settings``; None where it is not replayed
    (another estimator, a model without its GGUF header at hand, a refused architecture, no GPU)."""
    by_memory_go = release.placement is Placement.MEMORY_GO
    by_layout = release.placement is Placement.CREATE_LAYOUT
    by_engine = (
        release.placement is Placement.ENGINE_LAYOUT
        and release.v is not None
        and release.v >= engine_layout.FIRST_VERSION
    )
    if release.version is None or not (by_memory_go or by_layout or by_engine):
        return None
    hw = plan.hardware
    if hw is None or not hw.gpus or plan.config.device == "cpu":
        return None
    from kvadvise.errors import KvadviseError

    try:
        legacy = _legacy_model(model)
        if legacy is None:
            return None
        if by_layout:
            return _decide_layout(model, plan, release, settings, legacy)
        if by_engine:
            return _decide_engine(model, plan, release, settings, legacy)
        gpus = [
            estimate_legacy.LegacyGpu(
                free_bytes=g.free_bytes,
                total_bytes=g.total_bytes,
                library=_LIBRARIES.get(g.backend, g.backend),
                name=g.name,
            )
            for g in hw.gpus
        ]
        est = estimate_legacy.estimate_gpu_layers(
            legacy,
            gpus,
            num_ctx=settings.num_ctx,
            # OLLAMA_NUM_PARALLEL is written only for more than one slot (or a repeatable plan): else unset,
            # and the release picks its own (estimate_legacy: 0)
            num_parallel=settings.num_parallel if settings.num_parallel > 1 or settings.repeatable else 0,
            kv_cache_type="" if settings.kv_cache_type == "f16" else settings.kv_cache_type,
            flash_attention=settings.flash_attention,
            version=release.version,
            gpu_overhead_bytes=envconfig.gpu_overhead_bytes(),
            sched_spread=rules.sched_spread(),  # assignLayers reads it too (v0.20.0:llm/server.go)
            projector_bytes=_projector_bytes(model, release.version),
        )
    except KvadviseError:  # LegacyVersionNotModelled (a vision model, ...) or an unreadable header: not claimed
        return None
    return OllamaDecision(
        version=release.version,
        layers_offload=est.layers_offload,
        layers_model=est.layers_model,
        required_full_bytes=est.required_full_bytes,
        available_bytes=sum(est.available_bytes),
        planned_layers=_planned_layers(plan, est.layers_offload, est.layers_model),
        log_line=est.log_line(),
        allocation_modelled=release.claims_allocation,
    )


def _projector_bytes(model: OllamaModel, version: str) -> int:
    """The llama engine's mmproj blob as estimateGPULayers sizes it (projectorMemoryRequirements), 0 without one."""
    if model.projector_path is None:
        return 0
    from pathlib import Path

    from kvadvise.backends.gguf_cache import read as read_header

    return estimate_legacy.projector_memory_bytes(read_header(Path(model.projector_path)), version)


def _planned_layers(plan: Plan, ollama_layers: int, layers_model: int) -> int:
    """The plan's layers on the GPU(s), counted as Ollama counts them (the output layer as one)."""
    off = plan.offload_to_run
    if off is None:
        planned = layers_model  # every layer and the output layer
    elif off.n_cpu_moe:  # experts on the CPU: not a layer count Ollama's num_gpu can say
        planned = ollama_layers
    else:
        planned = off.n_gpu_layers
    return min(planned, layers_model)


def _decide_layout(
    model: OllamaModel,
    plan: Plan,
    release: OllamaRelease,
    settings: OllamaSettings,
    legacy: estimate_legacy.LegacyModel,
) -> OllamaDecision:
    """llamaServer.Load's layout (Ollama 0.12.11 - 0.24, the llamarunner) for the plan's GPUs: the advice
    writes OLLAMA_FLASH_ATTENTION (0 or 1) and OLLAMA_NUM_PARALLEL, so flash attention is set by the user
    (never auto) and refused where the model does not support it (NewLlamaServer)."""
    assert release.version is not None and plan.hardware is not None
    v = release.v or (0, 0, 0)
    fa = settings.flash_attention and supports_flash_attention(model.spec, v)
    lay = layout.llama_server_load(
        legacy,
        _layout_gpus(plan),
        version=release.version,
        num_ctx=settings.num_ctx,
        # sched.go load: max(OLLAMA_NUM_PARALLEL, 1), one slot for a model without completion
        num_parallel=settings.num_parallel if legacy.is_completion else 1,
        num_batch=settings.num_batch or NUM_BATCH_DEFAULT,
        flash_attention="on" if fa else "off",
        kv_cache_type="" if settings.kv_cache_type == "f16" else settings.kv_cache_type,
        gpu_overhead_bytes=envconfig.gpu_overhead_bytes(),
        sched_spread=rules.sched_spread(),
    )
    return _layout_decision(release.version, plan, lay, allocation_modelled=release.claims_allocation)


def _layout_gpus(plan: Plan) -> list[layout.LayoutGpu]:
    """The plan's GPUs as the scheduler hands them to Load (ml.DeviceInfo)."""
    assert plan.hardware is not None
    return [
        layout.LayoutGpu(
            device_id=str(g.index),  # the CUDA UUID Ollama prints is not known here: the index stands for it
            name="Metal" if g.backend == "metal" else f"{_LAYOUT_LIBRARIES.get(g.backend, g.backend)}{g.index}",
            library=_LAYOUT_LIBRARIES.get(g.backend, g.backend),
            free_bytes=g.free_bytes,
        )
        for g in plan.hardware.gpus
    ]


def _decide_engine(
    model: OllamaModel,
    plan: Plan,
    release: OllamaRelease,
    settings: OllamaSettings,
    legacy: estimate_legacy.LegacyModel,
) -> OllamaDecision:
    """ollamaServer.Load's layout (Ollama 0.11.11 - 0.24, the Go engine) for the plan's GPUs, over the memory
    its runner would report (engine_layout; the graph is a stand-in, said in ``approximation``). The advice
    writes OLLAMA_FLASH_ATTENTION, so flash attention is the user's (before 0.12.4 on anyway for a model that wants
    it: OllamaRelease.flash_attn), refused where the model lacks it."""
    assert release.version is not None
    num_parallel = settings.num_parallel if legacy.is_completion else 1  # sched.go: max(OLLAMA_NUM_PARALLEL, 1)
    # the stand-in graph is for the load NewLlamaServer asks (num_ctx and batch clamped as ollama_server_load clamps
    # them); a quantized cache needs flash attention
    num_ctx, batch = engine_layout.clamped(legacy, settings.num_ctx, settings.num_batch or NUM_BATCH_DEFAULT)
    fa = release.flash_attn(model.spec, "on" if settings.flash_attention else "off") == "on"
    kv_cache_type = "" if settings.kv_cache_type == "f16" or not fa else settings.kv_cache_type
    graph = engine_layout.graph_stand_in(
        model.spec, num_ctx=num_ctx, num_parallel=num_parallel, batch=batch, flash_attention=fa,
        kv_cache_type=kv_cache_type,
    )  # fmt: skip
    lay = engine_layout.ollama_server_load(
        legacy,
        _layout_gpus(plan),
        version=release.version,
        num_ctx=settings.num_ctx,
        graph_bytes=graph,
        num_parallel=num_parallel,
        num_batch=settings.num_batch or NUM_BATCH_DEFAULT,
        flash_attention=fa,
        kv_cache_type=kv_cache_type,
        gpu_overhead_bytes=envconfig.gpu_overhead_bytes(),
        sched_spread=rules.sched_spread(),
    )
    # the plan's figures are llama.cpp's library, not the Go engine's
    return _layout_decision(release.version, plan, lay, allocation_modelled=False)


def _layout_decision(
    version: str, plan: Plan, lay: layout.LayoutDecision | engine_layout.EngineLayout, *, allocation_modelled: bool
) -> OllamaDecision:
    """The decision of a createLayout replay: the llamarunner's (layout.py) or the Go engine's (engine_layout.py,
    whose graph is a stand-in it names)."""
    return OllamaDecision(
        version=version,
        layers_offload=lay.layers_offload,
        layers_model=lay.total_layers,
        required_full_bytes=lay.total_bytes,
        available_bytes=sum(lay.available_bytes),
        planned_layers=_planned_layers(plan, lay.layers_offload, lay.total_layers),
        log_line=lay.log_line(),
        allocation_modelled=allocation_modelled,
        layers_by=ENGINE_LAYOUT if isinstance(lay, engine_layout.EngineLayout) else CREATE_LAYOUT,
        approximation=lay.approximation if isinstance(lay, engine_layout.EngineLayout) else None,
    )


_I8 = 24  # GGML_TYPE_I8: one byte per element, so a synthesized tensor of n elements weighs n bytes


def _legacy_model(model: OllamaModel) -> estimate_legacy.LegacyModel | None:
    """What the estimate reads: the blob's header for a model in the store; for a built-in profile of the
    library, its figures (each block's bytes, the output and the embeddings as one tensor each, the
    KV values); None where the estimate reads a tensor's shape a profile does not have (a llama-architecture
    MoE's experts, chatglm's QKV bias) or for anything else."""
    if model.source.startswith("store:"):
        from pathlib import Path

        from kvadvise.backends.gguf_cache import read as read_header

        return estimate_legacy.legacy_model(read_header(Path(model.spec.source)))
    spec = model.spec
    if not model.source.startswith("profile:") or len(spec.layer_bytes) != spec.n_layer_all:
        return None
    if (spec.architecture == "llama" and spec.n_expert) or spec.architecture == "chatglm":
        return None
    tensors = [estimate_legacy.LegacyTensor(f"blk.{il}.weight", (b,), _I8) for il, b in enumerate(spec.layer_bytes)]
    tensors.append(estimate_legacy.LegacyTensor("token_embd.weight", (spec.tok_embd_bytes,), _I8))
    if spec.output_bytes:
        tensors.append(estimate_legacy.LegacyTensor("output.weight", (spec.output_bytes,), _I8))
    rest = (spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes - sum(spec.layer_bytes)
            - spec.output_bytes - spec.tower_bytes)  # fmt: skip
    if rest >= 4 * spec.n_embd:  # a profile sized tensor by tensor (its K mix): output_norm, f32, in the output group
        tensors.append(estimate_legacy.LegacyTensor("output_norm.weight", (4 * spec.n_embd,), _I8))
    vision = rules.is_vision(model)
    tower = _PROFILE_TOWERS.get(spec.architecture) if vision else None
    if tower is not None:
        tensors.append(estimate_legacy.LegacyTensor("v.weight", (tower[1],), _I8))
    return estimate_legacy.LegacyModel(
        architecture=blob_architecture(spec.architecture, model.source),
        block_count=spec.n_layer_all,
        embedding_length=spec.n_embd,
        head_count=tuple(spec.n_head),
        head_count_kv=tuple(spec.n_head_kv),
        key_length=spec.n_embd_head_k,
        value_length=spec.n_embd_head_v,
        n_vocab=spec.n_vocab,
        context_length=spec.n_ctx_train,
        tensors=tuple(tensors),
        sliding_window=spec.n_swa,
        feed_forward_length=spec.n_ff,
        # a built-in profile's tower in the blob too: estimateGPULayers adds VisionGraphSize (where it is known)
        has_vision=vision,
        vision=tower[0] if tower is not None else None,
    )


# The vision tower in the blob of the library's profiles, as VisionGraphSize reads it: its {arch}.vision.* values and
# the bytes of its "v.*" tensors. Gemma 3 (4b, 12b, 27b: one SigLIP-So400m, 896 px, patch 14): 27 blocks of 1152
# (16 heads, FFN 4304) with F16 matrices and F32 norms and biases, an F16 patch embedding and position embedding
# (4096 x 1152), 834,531,264 bytes: the "795.9 MiB" of projector.weights in Ollama 0.11's logs of gemma3:12b
# (ollama#12000, #11819); the graph 4 x (896^2 x 3 + 1152 x 14 + 4096^2 x 16) is their "1.0 GiB"
_PROFILE_TOWERS: dict[str, tuple[estimate_legacy.VisionKV, int]] = {
    "gemma3": (estimate_legacy.VisionKV(27, 896, 14, 3, 16, 1152), 834_531_264),
}
