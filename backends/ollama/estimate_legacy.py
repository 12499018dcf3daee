"""Ollama's own offload decision before its new memory layout: ``llm/memory.go`` (v0.7.1 to v0.12.10).

Ollama 0.7.1 to 0.11.10 decided how many layers of every model go to the GPU(s) with
``EstimateGPULayers`` (``estimateGPULayers`` from v0.11.5), a formula over the GGUF header, and printed
the result as ``msg=offload ... layers.model=25 layers.offload=23 ... memory.required.full=...``.
From v0.11.11 the models of Ollama's own engine (``KV.OllamaEngineRequired``: gptoss, gemma3, qwen3...)
are placed by the new allocation-fitting layout instead; the llama.cpp-engine models kept this estimator
until v0.12.10; v0.12.11 deleted ``llm/memory.go``. This module ports it function by function from the
tags in the bare mirror ollama/ollama (``git show vX:llm/memory.go``), with every version difference
that changes a figure:

- ``llm/memory.go`` ``EstimateGPULayers``: one blob (b5300004) from v0.9.3 to v0.11.4 (v0.7.1..v0.9.2,
  05b3b2fd, differ only where a GGUF gives head counts per layer, and do not clamp num_ctx to the
  training context); v0.11.5 renames it
  ``estimateGPULayers`` and drops the ``opts.NumCtx = max(opts.NumCtx, 2048)`` it applied to every model
  (ee4be741); v0.11.8 asks the model whether it wants flash attention (``f.FlashAttention()``, ce128eb5);
  v0.11.11 drops ``requested != ""`` (7a87b28f); v0.12.4..v0.12.10 only rename types (4a54b331, aa4927f1,
  15558109).
- ``fs/ggml/ggml.go`` ``GraphSize``, ``GroupLayers``, ``Layer.Size``, ``TensorType.BlockSize/TypeSize``,
  ``SupportsFlashAttention``, ``SupportsKVCacheType``, ``kvCacheBytesPerElement``: gptoss first appears in
  v0.11.0 (full graph 4 x heads / kv heads x kv / 6, partial twice that), v0.11.3 makes partial = full,
  v0.11.2..v0.11.4 refuse it flash attention, v0.11.5 multiplies the context by num_parallel inside
  GraphSize (the scheduler stopped doing it), halves the gptoss graph and reads MXFP4 as type 39 too,
  v0.11.8 adds the flash-attention graph of gptoss.
- ``server/sched.go`` / ``server/routes.go`` / ``llm/server.go``: num_ctx at least 4; v0.9.3..v0.11.4
  hand the estimator num_ctx x num_parallel, later versions num_ctx; num_ctx clamped to the training
  context; gpt-oss gets at least 8192 (from v0.11.4 only outside low-VRAM mode: total VRAM under 20 GiB);
  ``pickBestFullFitByLibrary`` loads on the single GPU with the most free memory that fully fits, else on
  all GPUs that fully fit, else (``pickBestPartialFitByLibrary``) on all GPUs, partially.
- ``discover/gpu.go``: ``MinimumMemory`` 457 MiB for CUDA and ROCm, 512 MiB for Metal;
  ``envconfig.GpuOverhead`` (OLLAMA_GPU_OVERHEAD, default 0) per GPU.

Not modelled (refused with :class:`LegacyVersionNotModelled`): versions outside v0.7.1..v0.12.10, vision
models (``VisionGraphSize``), mllama's cross-attention cache, and the models v0.11.11+ place with the new
layout. Pure: the caller reads the header and the GPUs' free memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvadvise.backends.ollama.rules import KV_CACHE_TYPES  # the types Ollama's GGML.SupportsKVCacheType names
from kvadvise.errors import InputError
from kvadvise.model.gguf import GGUFArray, GGUFHeader

MIB = 1024**2
GIB = 1024**3

FIRST_VERSION = (0, 7, 1)  # llm/memory.go 05b3b2fd: b5300004 (v0.9.3) but for per-layer head counts
LAST_VERSION = (0, 12, 10)  # v0.12.11 deleted llm/memory.go

# discover/gpu.go cudaMinimumMemory / rocmMinimumMemory, discover/gpu_darwin.go metalMinimumMemory
MINIMUM_MEMORY_BYTES: Mapping[str, int] = {"cuda": 457 * MIB, "rocm": 457 * MIB, "metal": 512 * MIB}
RUNNER_DISCOVERY_FROM = (0, 12, 4)  # bc8909fb3 "Use runners for GPU discovery": discover/gpu.go devInfoToInfoList
DEVICE_MINIMUM_FROM = (0, 12, 7)  # ml/device.go DeviceInfo.MinimumMemory(), the field of discover.GpuInfo gone
LOW_VRAM_THRESHOLD_BYTES = 20 * GIB  # server/routes.go lowVRAMThreshold (v0.11.4+)


class LegacyVersionNotModelled(InputError):
    """Ollama's decision at this version is not what this port computes: do not claim it."""


@dataclass(frozen=True, slots=True)
class LegacyTensor:
    """One tensor of the GGUF header as Ollama's ``fs/ggml`` reads it."""

    name: str
    shape: tuple[int, ...]  # ne0 first
    type_id: int  # the GGUF type number (Ollama's MXFP4 is 4; llama.cpp's 39)


@dataclass(frozen=True, slots=True)
class VisionKV:
    """The ``{arch}.vision.*`` values ``GGML.VisionGraphSize`` reads (fs/ggml/ggml.go, the same v0.9.3 - v0.12.10)."""

    block_count: int
    image_size: int
    patch_size: int
    num_channels: int
    head_count: int
    embedding_length: int
    max_pixels: int = 28 * 28 * 1280  # vision.max_pixels (qwen25vl), its default
    max_num_tiles: int = 0  # vision.max_num_tiles (mllama)


@dataclass(frozen=True, slots=True)
class LegacyModel:
    """What ``estimateGPULayers`` reads of a GGUF: its ``KV()`` values and its tensor list."""

    architecture: str  # general.architecture ("gptoss" in Ollama's own blobs, "gpt-oss" in llama.cpp's)
    block_count: int  # {arch}.block_count
    embedding_length: int  # {arch}.embedding_length
    head_count: tuple[int, ...]  # {arch}.attention.head_count: one value, or one per layer
    head_count_kv: tuple[int, ...]  # {arch}.attention.head_count_kv: one value, or one per layer
    key_length: int | None  # {arch}.attention.key_length (None: embedding_length / min(head_count))
    value_length: int | None  # {arch}.attention.value_length
    n_vocab: int  # len(tokenizer.ggml.tokens)
    context_length: int  # {arch}.context_length (n_ctx_train)
    tensors: tuple[LegacyTensor, ...]
    sliding_window: int = 0  # {arch}.attention.sliding_window (gemma3's local layers)
    feed_forward_length: int = 0  # {arch}.feed_forward_length (llama MoE graph)
    is_embedding: bool = False  # {arch}.pooling_type present: no flash attention
    has_vision: bool = False  # vision.block_count > 0 (Ollama's own engine vision models)
    vision: VisionKV | None = None  # the tower's values, where they are known (its weights: the "v.*" tensors)
    is_completion: bool = True  # Ollama loads an embedding-only model with one slot


@dataclass(frozen=True, slots=True)
class LegacyGpu:
    """One GPU as ``discover`` reports it to the scheduler."""

    free_bytes: int  # FreeMemory: what the driver reports free when the model is scheduled
    total_bytes: int = 0  # TotalMemory (for gpt-oss's low-VRAM mode); 0: unknown, taken as free_bytes
    library: str = "cuda"  # cuda | rocm | metal | oneapi | vulkan (lower case, as v0.11 names them)
    minimum_bytes: int | None = None  # MinimumMemory; None: discover's default for the library
    flash_attention_supported: bool = True  # cuda needs compute capability >= 7 (discover/types.go)
    name: str = ""


@dataclass(frozen=True, slots=True)
class LegacyEstimate:
    """``MemoryEstimate`` and its ``msg=offload`` log line, for the GPUs the scheduler picked."""

    version: str
    gpu_indices: tuple[int, ...]  # which of the given GPUs the model was placed on
    layers_requested: int  # layers.requested (num_gpu; -1: as many as fit)
    layers_model: int  # layers.model = block_count + 1 (the output layer)
    layers_offload: int  # layers.offload
    layers_split: tuple[int, ...]  # layers.split: layers per picked GPU
    num_ctx: int  # the context the estimator was given (x num_parallel before v0.11.5)
    num_parallel: int
    kv_cache_type: str  # "" (f16) unless flash attention is on and the type is supported
    flash_attention: bool
    available_bytes: tuple[int, ...]  # memory.available
    gpu_overhead_bytes: int  # memory.gpu_overhead
    required_full_bytes: int  # memory.required.full (TotalSize)
    required_partial_bytes: int  # memory.required.partial (VRAMSize; 0 when no layer fits)
    required_kv_bytes: int  # memory.required.kv
    allocations_bytes: tuple[int, ...]  # memory.required.allocations
    weights_total_bytes: int  # memory.weights.total
    weights_repeating_bytes: int  # memory.weights.repeating
    weights_nonrepeating_bytes: int  # memory.weights.nonrepeating
    graph_full_bytes: int  # memory.graph.full
    graph_partial_bytes: int  # memory.graph.partial
    notes: tuple[str, ...] = field(default=())
    projector_weights_bytes: int = 0  # projector.weights: the mmproj file's or the tower's (VisionGraphSize)
    projector_graph_bytes: int = 0  # projector.graph: the tower's graph

    @property
    def fully_offloaded(self) -> bool:
        return self.layers_offload >= self.layers_model

    def log_line(self) -> str:
        """The ``msg=offload`` fields as Ollama prints them (format.HumanBytes2)."""
        if parse_version(self.version) >= (0, 11, 5):
            # MemoryEstimate.TensorSplit became an []int, which slog prints as a Go slice, one GPU too (v0.11.5
            # llm/memory.go: ollama#11982's layers.split="[4 4 9]", a Strix Halo's "[37]"); unset when no layer fits
            split = "[" + " ".join(str(n) for n in self.layers_split) + "]" if self.layers_offload else "[]"
        else:  # a string of the per-GPU counts joined with commas, for several GPUs only (v0.11.4)
            split = ",".join(str(n) for n in self.layers_split) if len(self.layers_split) > 1 else ""
        return (
            f"layers.requested={self.layers_requested} layers.model={self.layers_model} "
            f"layers.offload={self.layers_offload} layers.split={_slog_text(split)} "
            f'memory.available="[{" ".join(human_bytes2(b) for b in self.available_bytes)}]" '
            f'memory.gpu_overhead="{human_bytes2(self.gpu_overhead_bytes)}" '
            f'memory.required.full="{human_bytes2(self.required_full_bytes)}" '
            f'memory.required.partial="{human_bytes2(self.required_partial_bytes)}" '
            f'memory.required.kv="{human_bytes2(self.required_kv_bytes)}" '
            f'memory.required.allocations="[{" ".join(human_bytes2(b) for b in self.allocations_bytes)}]" '
            f'memory.weights.total="{human_bytes2(self.weights_total_bytes)}" '
            f'memory.weights.repeating="{human_bytes2(self.weights_repeating_bytes)}" '
            f'memory.weights.nonrepeating="{human_bytes2(self.weights_nonrepeating_bytes)}" '
            f'memory.graph.full="{human_bytes2(self.graph_full_bytes)}" '
            f'memory.graph.partial="{human_bytes2(self.graph_partial_bytes)}"'
        ) + (  # MemoryEstimate.LogValue: the projector group only with its weights
            f' projector.weights="{human_bytes2(self.projector_weights_bytes)}" '
            f'projector.graph="{human_bytes2(self.projector_graph_bytes)}"'
            if self.projector_weights_bytes
            else ""
        )


def _slog_text(value: str) -> str:
    """A string attribute as log/slog's TextHandler writes it: bare unless it is empty or holds a space, '=' or
    '"' (text_handler.go needsQuoting): layers.split=11,11,11,11 (ollama#9181), =[] and =[37], but ="" and
    ="[4 4 9]" (ollama#11982)."""
    return f'"{value}"' if not value or any(c in value for c in ' ="') else value


def human_bytes2(b: int) -> str:
    """format.HumanBytes2: one decimal in GiB, MiB or KiB."""
    if b >= GIB:
        return f"{b / GIB:.1f} GiB"
    if b >= MIB:
        return f"{b / MIB:.1f} MiB"
    if b >= 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b} B"


# ---------------------------------------------------------------------------------------------- versions


def parse_version(version: str) -> tuple[int, int, int]:
    """ "0.11.4", "v0.11.5-rc2" -> (0, 11, 4), by api.parse_version's grammar."""
    from kvadvise.backends.ollama.api import parse_version as parse

    v = parse(version)
    if v is None:
        raise InputError(f"not an Ollama version: {version!r}", hint="give it as 0.11.4")
    return v


def _engine_required_archs(v: tuple[int, int, int]) -> frozenset[str]:
    """fs/ggml/ggml.go KV.OllamaEngineRequired at v0.11.11..v0.12.10."""
    archs = {"gemma3", "gemma3n", "mistral3", "llama4", "mllama", "qwen25vl", "gptoss", "gpt-oss"}
    if v >= (0, 12, 0):
        archs.add("qwen3")
    if v >= (0, 12, 4):
        archs.add("qwen3moe")
    if v >= (0, 12, 7):
        archs |= {"qwen3vl", "qwen3vlmoe"}
    return frozenset(archs)


def _is_gptoss(arch: str, v: tuple[int, int, int]) -> bool:
    # v0.11.0 knows Ollama's "gptoss"; v0.11.5 adds llama.cpp's "gpt-oss"
    return v >= (0, 11, 0) and (arch == "gptoss" or (arch == "gpt-oss" and v >= (0, 11, 5)))


def check_modelled(
    model: LegacyModel, version: str, *, new_estimates: bool = False, new_engine: bool = False
) -> tuple[int, int, int]:
    """The parsed version when this port computes Ollama's decision for the model there, else raise."""
    v = parse_version(version)
    if v < FIRST_VERSION or v > LAST_VERSION:
        first, last = (".".join(map(str, t)) for t in (FIRST_VERSION, LAST_VERSION))
        raise LegacyVersionNotModelled(
            f"Ollama {version}: its offload decision is not modelled by the llm/memory.go port (v{first} to v{last})",
            hint="v0.12.11 and later place layers by allocation fitting; older versions used other formulas",
        )
    if v >= (0, 11, 11) and model.architecture in _engine_required_archs(v):
        raise LegacyVersionNotModelled(
            f"Ollama {version} places {model.architecture} (its own engine) with the new memory layout, "
            "not llm/memory.go",
        )
    if new_engine and v >= (0, 11, 11):
        raise LegacyVersionNotModelled(
            f"OLLAMA_NEW_ENGINE=1: Ollama {version} lays out every model its own engine supports anew; "
            "which ones is not modelled here"
        )
    engine = new_engine or model.architecture in _engine_required_archs(v)
    if (0, 11, 5) <= v < (0, 11, 11) and new_estimates and engine:
        raise LegacyVersionNotModelled(f"OLLAMA_NEW_ESTIMATES=1: Ollama {version} lays {model.architecture} out anew")
    per_layer_heads = len(set(model.head_count)) > 1 or len(set(model.head_count_kv)) > 1
    if v < (0, 9, 3) and per_layer_heads:
        raise LegacyVersionNotModelled(
            f"Ollama {version} read per-layer head counts as scalars (KV.HeadCount, before v0.9.3): not ported"
        )
    if model.architecture == "mllama" or (model.has_vision and model.vision is None):
        raise LegacyVersionNotModelled(
            f"{model.architecture}: the vision graph (VisionGraphSize) and cross-attention cache are not ported"
        )
    return v


def minimum_memory(library: str, v: tuple[int, int, int]) -> int:
    """A GPU's MinimumMemory at release ``v`` (``library`` in either spelling, "cuda" or "CUDA"): before v0.12.4
    what GPU discovery set (CUDA and ROCm 457 MiB, Metal 512 MiB, others 0); v0.12.4 - v0.12.6 discover/gpu.go
    devInfoToInfoList over the runners' devices, 457 MiB for CUDA and ROCm only (metalMinimumMemory is declared,
    never read: Metal 0); from v0.12.7 ml/device.go DeviceInfo.MinimumMemory(), Metal 512 MiB, every other 457."""
    lib = library.lower()
    if lib == "cpu":
        return 0
    if v >= DEVICE_MINIMUM_FROM:
        return 512 * MIB if lib == "metal" else 457 * MIB
    if v >= RUNNER_DISCOVERY_FROM:
        return 457 * MIB if lib in ("cuda", "rocm") else 0
    return MINIMUM_MEMORY_BYTES.get(lib, 0)


# ---------------------------------------------------------------------------------- fs/ggml/ggml.go


def _block_size(type_id: int, v: tuple[int, int, int]) -> int:
    """TensorType.BlockSize: 1, 32, else 256. llama.cpp's MXFP4 (39) is a 32 block only from v0.11.8; at
    v0.11.5..v0.11.7 TypeSize knows 39 but BlockSize does not (256 per block of 129 bytes)."""
    if type_id in (0, 1, 24, 25, 26, 27, 28, 30):
        return 1
    if type_id in (2, 3, 4, 6, 7, 8, 9, 20) or (type_id == 39 and v >= (0, 11, 8)):
        return 32
    return 256


def _type_size(type_id: int, v: tuple[int, int, int]) -> int:
    """TensorType.TypeSize; 0 for a type the version does not know (its tensors then weigh nothing)."""
    bs = _block_size(type_id, v)
    sizes = {
        0: 4, 1: 2, 2: 2 + bs // 2, 3: 2 + 2 + bs // 2, 6: 2 + 4 + bs // 2, 7: 2 + 2 + 4 + bs // 2,
        8: 2 + bs, 9: 2 + 2 + bs, 10: bs // 16 + bs // 4 + 2 + 2, 11: bs // 8 + bs // 4 + 12 + 2,
        12: 2 + 2 + 12 + bs // 2, 13: 2 + 2 + 12 + bs // 8 + bs // 2, 14: bs // 2 + bs // 4 + bs // 16 + 2,
        15: 4 + bs + 2 * bs // 16, 16: 2 + 2 * bs // 8, 17: 2 + 2 * bs // 8 + bs // 32,
        18: 2 + bs // 4 + bs // 8, 19: 2 + bs // 8 + bs // 16, 20: 2 + bs // 2,
        21: 2 + bs // 4 + bs // 8 + bs // 32 + 4, 22: 2 + bs // 4 + bs // 16, 23: 2 + 2 + bs // 2 + bs // 64,
        24: 1, 25: 2, 26: 4, 27: 8, 28: 8, 29: bs // 8 + bs // 16 + bs // 32, 30: 2,
    }  # fmt: skip
    if type_id == 4 and v >= (0, 11, 0):  # Ollama's MXFP4 (v0.11.0)
        return 1 + bs // 2
    if type_id == 39 and v >= (0, 11, 5):  # llama.cpp's MXFP4 (v0.11.5)
        return 1 + bs // 2
    return sizes.get(type_id, 0)


def _tensor_bytes(t: LegacyTensor, v: tuple[int, int, int]) -> int:
    """Tensor.Size: elements x typeSize / blockSize."""
    n = 1
    for d in t.shape:
        n *= d
    return n * _type_size(t.type_id, v) // _block_size(t.type_id, v)


def group_layers(model: LegacyModel) -> dict[str, dict[str, LegacyTensor]]:
    """Tensors.GroupLayers: "blk.N" / "mm.N" joined with their number, else the first dotted part."""
    return _grouped(model.tensors)


def _grouped(tensors: Sequence[LegacyTensor]) -> dict[str, dict[str, LegacyTensor]]:
    layers: dict[str, dict[str, LegacyTensor]] = {}
    for t in tensors:
        parts = t.name.split(".")
        idx = next((i for i, p in enumerate(parts) if p in ("blk", "mm")), -1)
        if idx != -1 and len(parts) > idx + 2:
            parts = [".".join(parts[: idx + 2]), *parts[idx + 2 :]]
        layers.setdefault(parts[0], {})[".".join(parts[1:])] = t
    return layers


def layer_bytes(layer: Mapping[str, LegacyTensor], v: tuple[int, int, int]) -> int:
    """Layer.Size: the bytes of a group's tensors as this release sizes them."""
    return sum(_tensor_bytes(t, v) for t in layer.values())


def vision_graph_size(
    model: LegacyModel, layers: Mapping[str, Mapping[str, LegacyTensor]], v: tuple[int, int, int]
) -> tuple[int, int]:
    """GGML.VisionGraphSize (fs/ggml/ggml.go): the tower's weights (every "v" / "v.*" group of ``layers``, the model's
    :func:`group_layers`) and its graph, by architecture; (0, 0) without vision.block_count, no graph without a
    patch size or for another architecture."""
    vk = model.vision
    if vk is None or vk.block_count == 0:
        return 0, 0
    weights = sum(layer_bytes(g, v) for name, g in layers.items() if name == "v" or name.startswith("v."))
    if vk.patch_size == 0:  # "unknown patch size for vision model"
        return weights, 0
    patches = (vk.image_size // vk.patch_size) ** 2 + any(t.name == "v.class_embd" for t in model.tensors)
    if model.architecture in ("gemma3", "mistral3"):
        graph = 4 * (
            vk.image_size * vk.image_size * vk.num_channels + vk.embedding_length * vk.patch_size
            + patches * patches * vk.head_count
        )  # fmt: skip
    elif model.architecture == "qwen25vl":
        n = vk.max_pixels // (vk.patch_size * vk.patch_size)
        graph = 4 * (
            2 * vk.max_pixels * vk.num_channels + n * vk.num_channels * vk.patch_size * vk.patch_size
            + n * n * vk.head_count + vk.embedding_length * n
        )  # fmt: skip
    else:  # llama4: "negligible compared to the worst case text graph"; mllama is refused (check_modelled)
        graph = 0
    return weights, graph


def _head_dims(model: LegacyModel) -> tuple[int, int, int]:
    """KV.EmbeddingHeadCountMax (embedding / min heads), EmbeddingHeadCountK, EmbeddingHeadCountV."""
    heads_min = min(model.head_count) if model.head_count else 1
    head = model.embedding_length // heads_min if heads_min > 0 else 0
    k = model.key_length if model.key_length is not None else head
    vv = model.value_length if model.value_length is not None else head
    return head, k, vv


def _bytes_per_element(cache_type: str) -> float:
    """kvCacheBytesPerElement: q8_0 1, q4_0 0.5, else 2 (Ollama's estimate, not ggml's blocks)."""
    return {"q8_0": 1.0, "q4_0": 0.5}.get(cache_type, 2.0)


def supports_flash_attention(model: LegacyModel, v: tuple[int, int, int]) -> bool:
    """GGML.SupportsFlashAttention: not for embedding models, nor gptoss at v0.11.2..v0.11.4, nor gemma2
    from v0.11.11; else when key and value heads are equal and non-zero."""
    if model.is_embedding:
        return False
    if model.architecture == "gptoss" and (0, 11, 2) <= v < (0, 11, 5):
        return False
    if model.architecture == "gemma2" and v >= (0, 11, 11):
        return False
    _, k, vv = _head_dims(model)
    return k != 0 and vv != 0 and k == vv


def wants_flash_attention(model: LegacyModel, v: tuple[int, int, int]) -> bool:
    """GGML.FlashAttention (v0.11.8+): the model turns flash attention on by itself."""
    return v >= (0, 11, 8) and model.architecture in ("gptoss", "gpt-oss")


def supports_kv_cache_type(model: LegacyModel, cache_type: str, v: tuple[int, int, int]) -> bool:
    """GGML.SupportsKVCacheType: f16, q8_0, q4_0; gpt-oss only f16 (v0.11.5..v0.11.10); from v0.11.11 ""
    and f16 always, q8_0/q4_0 but not for gpt-oss (until v0.12.4, which drops that exception)."""
    if v >= (0, 11, 11):
        if cache_type in ("", "f16"):
            return True
        if _is_gptoss(model.architecture, v) and v < (0, 12, 4):
            return False
        return cache_type in KV_CACHE_TYPES
    if _is_gptoss(model.architecture, v) and v >= (0, 11, 5):
        return cache_type == "f16"
    return cache_type in KV_CACHE_TYPES


def graph_size(
    model: LegacyModel,
    context: int,
    batch: int,
    num_parallel: int,
    kv_cache_type: str,
    use_flash_attention: bool,
    v: tuple[int, int, int],
) -> tuple[list[int], int, int]:
    """GGML.GraphSize -> (kv bytes per layer, partialOffload, fullOffload); 0 for an unknown arch."""
    if v >= (0, 11, 5):  # v0.11.5: "context *= uint64(numParallel)" (the scheduler no longer does)
        context *= num_parallel
    embedding = model.embedding_length
    heads = max(model.head_count) if model.head_count else 1
    heads_kv = max(model.head_count_kv) if model.head_count_kv else 1
    vocab = model.n_vocab
    head, head_k, head_v = _head_dims(model)
    layers = group_layers(model)
    bpe = _bytes_per_element(kv_cache_type)

    kv = [int(float(context * (head_k + head_v) * heads_kv) * bpe) for _ in range(model.block_count)]
    kv_total = sum(kv)
    full = partial = 0
    arch = model.architecture
    blk0 = layers.get("blk.0", {})

    if arch in ("llama", "llama4"):
        full = max(4 * batch * (1 + 4 * embedding + context * (1 + heads)), 4 * batch * (embedding + vocab))
        partial = 4 * batch * embedding
        partial += max(
            4 * batch * (1 + embedding + max(context, embedding))
            + embedding * embedding * 9 // 16
            + 4 * context * (batch * heads + head * heads_kv),
            4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128,
        )
        if "ffn_gate_exps.weight" in blk0:  # mixtral 8x22b
            ff = model.feed_forward_length
            partial = max(
                3 * _tensor_bytes(blk0["ffn_gate_exps.weight"], v)
                + 4 * batch * (2 * ff + heads_kv + embedding + context + head * heads_kv),
                4 * (context * batch * heads + context * head * heads_kv + batch * 1024 + head * heads_kv * batch),
            )
        elif "ffn_gate.0.weight" in blk0:  # mixtral 8x7b
            ff1 = blk0["ffn_gate.0.weight"].shape[1]
            full = 4 * batch * (2 + 3 * embedding + context * (1 + heads) + 2 * heads_kv + ff1)
            partial = max(
                4 * batch * (3 + head * heads_kv + embedding + context * (1 + heads) + ff1)
                + (embedding * embedding + 3 * embedding * heads_kv * ff1) * 9 // 16,
                4 * batch * (1 + 2 * embedding + context * (1 + heads))
                + embedding * (6 * context * heads_kv // heads + embedding * 9 // 16),
            )
    elif arch in ("gemma", "gemma2", "gemma3", "gemma3n"):
        full = max(
            4 * batch * (embedding + vocab),
            4 * batch * (2 + context + context * heads + 2 * embedding + 2 * head_k * heads),
        )
        partial = max(
            4 * embedding * batch + embedding * vocab * 105 // 128 + 4 * vocab * batch,
            4 * batch * (2 * embedding + 1 + 2 * head_k * heads + context + context * heads)
            + 4 * head_k * context * 8
            + embedding * head_k * heads * 9 // 16,
        )
        if arch == "gemma3n" and v >= (0, 9, 3):  # v0.9.3 adds gemma3n
            full *= 4
            partial *= 4
        if arch == "gemma3":  # every 6th layer global, the others num_parallel x sliding_window + batch
            window = num_parallel * model.sliding_window + batch
            for i in range(len(kv)):
                if (i + 1) % 6 != 0:
                    kv[i] = int(float(window * (head_k + head_v) * heads_kv) * bpe)
    elif arch == "command-r":
        full = max(4 * batch * (embedding + vocab), 4 * batch * (2 + 4 * embedding + context * (1 + heads)))
        partial = max(
            4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128,
            4 * batch * (1 + 2 * embedding + context * (1 + heads))
            + 4 * embedding * context
            + embedding * embedding * 9 // 16,
        )
    elif arch == "qwen2":
        full = max(4 * batch * (embedding + vocab), 4 * batch * (1 + 2 * embedding + context + context * heads))
        partial = max(
            4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128,
            4 * (batch * (1 + 2 * embedding + context * (1 + heads)) + embedding * (1 + context)),
        )
    elif arch == "phi2":
        full = max(4 * batch * (embedding + vocab), 4 * batch * (1 + 4 * embedding + context + context * heads))
        partial = max(
            4 * batch * (2 * embedding + vocab) + embedding * vocab * 105 // 128,
            4 * batch * (2 + 3 * embedding + context + context * heads),
        )
    elif arch == "stablelm":
        full = 4 * batch * (context * (1 + heads) + 3 * embedding + 2)
        partial = max(4 * batch * (vocab + 2 * embedding), full)
    elif arch == "deepseek2":
        full = max(
            4 * batch * (3 * embedding + vocab),
            4 * batch * (3 * embedding + 2 + context * (1 + heads_kv) + 2 * head_k * heads_kv),
        )
        partial = max(
            4 * batch * (3 * embedding + vocab) + embedding * vocab * 105 // 128,
            4 * batch * (2 * embedding + 1 + 2 * head_k * heads_kv + context + context * heads_kv)
            + 4 * head_k * context * heads_kv
            + embedding * head_k * heads_kv * 9 // 16,
        )
    elif arch == "chatglm":
        full = 4 * batch * (embedding + vocab)
        partial = 4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128
        if "attn_qkv.bias" in blk0:
            qkv = blk0["attn_qkv.bias"].shape[0]
            full = max(full, 4 * batch * (2 + 2 * embedding + context + context * heads + head_k * heads + qkv))
            partial = max(
                partial,
                4 * batch * (1 + 2 * embedding + head_k * heads + context + context * heads)
                + 4 * head_k * context
                + 4 * context * head_k
                + 4 * qkv,
            )
    elif _is_gptoss(arch, v):
        # even layers slide: num_parallel x 4096 + batch cells; odd layers hold the whole context
        per_cell = float((head_k + head_v) * heads_kv) * bpe
        kv = [int(per_cell) * ((num_parallel * 4096 + batch) if i % 2 == 0 else context) for i in range(len(kv))]
        hkv = min(model.head_count_kv) or 1 if model.head_count_kv else 1
        # Go evaluates "4 * HeadCountMax() / cmp.Or(HeadCountKVMin(), 1) * kvTotal / 6" left to right;
        # kvTotal is every layer at the whole context, before the sliding layers were shrunk
        if v < (0, 11, 5):
            full = 4 * heads // hkv * kv_total // 6
            partial = 2 * full if v < (0, 11, 3) else full
        else:
            partial = 2 * heads // hkv * kv_total // 6
            if use_flash_attention and v >= (0, 11, 8):  # "rough estimate of graph size with flash attention on"
                partial = (4 * num_parallel + (context >> 10) + 110) * MIB
    return kv, partial, full


# ----------------------------------------------------------------------------------- llm/memory.go


def estimate_on_gpus(
    model: LegacyModel,
    gpus: Sequence[LegacyGpu],
    *,
    num_ctx: int,
    num_parallel: int,
    kv_cache_type: str,
    flash_attention: bool,
    version: str,
    num_batch: int = 512,
    num_gpu: int = -1,
    gpu_overhead_bytes: int = 0,
    projector_bytes: int = 0,
    gpu_indices: Sequence[int] | None = None,
) -> LegacyEstimate:
    """``estimateGPULayers`` for exactly these GPUs (one library), as the runner's server calls it.

    ``num_ctx`` is what the estimator receives: before v0.11.5 num_ctx x num_parallel, later num_ctx.
    ``flash_attention`` is OLLAMA_FLASH_ATTENTION; ``kv_cache_type`` OLLAMA_KV_CACHE_TYPE ("" unset).
    ``projector_bytes``: the llama engine's mmproj file (GroupLayers sizes), kept on the first GPU.
    """
    v = check_modelled(model, version)
    if not gpus:
        raise InputError("no GPU given", hint="pass the GPUs' free memory")
    layers = group_layers(model)
    overhead = gpu_overhead_bytes

    # llm/memory.go: without a llama-engine projector, the Ollama engine's own tower (VisionGraphSize), placed with
    # the output layer as the last layer
    vision_weights, vision_graph = (0, 0) if projector_bytes else vision_graph_size(model, layers, v)
    if v < (0, 11, 5):  # "multimodal models require at least 2048 context": every model, v0.9.3..v0.11.4
        num_ctx = max(num_ctx, 2048)

    layer_size = layer_bytes(layers["blk.0"], v) if "blk.0" in layers else 0

    use_fa = (
        (flash_attention or wants_flash_attention(model, v))
        and all(g.flash_attention_supported for g in gpus)
        and supports_flash_attention(model, v)
    )
    kvct = ""
    if use_fa:
        requested = kv_cache_type.lower()
        if (requested != "" or v >= (0, 11, 11)) and supports_kv_cache_type(model, requested, v):
            kvct = requested

    kv, graph_partial, graph_full = graph_size(model, num_ctx, min(num_ctx, num_batch), num_parallel, kvct, use_fa, v)
    if kv:
        layer_size += kv[0]
    kv_total = sum(kv)

    if graph_partial == 0:  # unknown architecture: gqa x kv / 6
        heads_kv = min(model.head_count_kv) if model.head_count_kv else 1
        gqa = (max(model.head_count) if model.head_count else 1) // (heads_kv or 1)
        graph_partial = gqa * kv_total // 6
    if graph_full == 0:
        graph_full = graph_partial
    library = gpus[0].library.lower()
    if library == "metal":  # no partial offload overhead on Metal
        graph_partial = graph_full
    elif len(gpus) > 1:  # multi-GPU always uses the partial graph size
        graph_full = graph_partial
    graph_max = max(graph_partial, graph_full)

    memory_layer_output = 0
    if "output_norm" in layers:
        memory_layer_output += layer_bytes(layers["output_norm"], v)
    if "output" in layers:
        memory_layer_output += layer_bytes(layers["output"], v)
    elif "token_embd" in layers:
        memory_layer_output += layer_bytes(layers["token_embd"], v)

    gpu_zero_overhead = projector_bytes
    minimum = [g.minimum_bytes if g.minimum_bytes is not None else minimum_memory(g.library, v) for g in gpus]

    # GPUs that fit the overhead, the graph, the minimum and two layers
    layer_count = 0
    split = [0] * len(gpus)
    alloc = [0] * len(gpus)
    with_space: list[int] = []
    for i, g in enumerate(gpus):
        gzo = gpu_zero_overhead if not with_space else 0
        if g.free_bytes < overhead + gzo + graph_max + minimum[i] + 2 * layer_size:
            continue
        with_space.append(i)
        alloc[i] += minimum[i] + layer_size  # the graph waits until full vs partial is known
    overflow = 0
    if with_space:
        alloc[with_space[0]] += gpu_zero_overhead
    else:
        overflow += gpu_zero_overhead

    memory_weights = 0
    for i in range(model.block_count - 1, -1, -1):
        blk = layers.get(f"blk.{i}")
        if blk is not None:  # some models have inconsistent layer sizes
            layer_size = layer_bytes(blk, v) + kv[i]
            memory_weights += layer_bytes(blk, v)
        if num_gpu >= 0 and layer_count >= num_gpu:
            overflow += layer_size
            continue
        j = len(with_space)
        while j > 0:  # round-robin over the GPUs with space; one that is full drops out
            gi = with_space[i % j]
            if gpus[gi].free_bytes > overhead + alloc[gi] + graph_max + layer_size:
                alloc[gi] += layer_size
                split[gi] += 1
                layer_count += 1
                break
            del with_space[i % j]
            j -= 1
        if not with_space:
            overflow += layer_size
    fully_loaded = layer_count >= model.block_count

    memory_last_layer = memory_layer_output + vision_weights + vision_graph
    if memory_last_layer > 0:
        if num_gpu < 0 or layer_count < num_gpu:
            for j in range(len(with_space), 0, -1):
                gi = with_space[layer_count % j]
                if gpus[gi].free_bytes > overhead + alloc[gi] + graph_max + memory_last_layer:
                    alloc[gi] += memory_last_layer
                    split[gi] += 1
                    layer_count += 1
                    break
        if layer_count < model.block_count + 1:
            fully_loaded = False
            overflow += memory_last_layer

    for i in range(len(gpus)):
        if split[i] > 0:
            alloc[i] += graph_full if fully_loaded else graph_partial

    required_partial = sum(alloc)
    required_full = required_partial + overflow
    placed = library != "cpu" and layer_count > 0
    return LegacyEstimate(
        version=version,
        gpu_indices=tuple(gpu_indices) if gpu_indices is not None else tuple(range(len(gpus))),
        layers_requested=num_gpu,
        layers_model=model.block_count + 1,
        layers_offload=layer_count if placed else 0,
        layers_split=tuple(split),
        num_ctx=num_ctx,
        num_parallel=num_parallel,
        kv_cache_type=kvct,
        flash_attention=use_fa,
        available_bytes=tuple(g.free_bytes for g in gpus),
        gpu_overhead_bytes=overhead,
        required_full_bytes=required_full,
        required_partial_bytes=required_partial if placed else 0,
        required_kv_bytes=kv_total,
        allocations_bytes=tuple(alloc),
        weights_total_bytes=memory_weights + memory_layer_output,
        weights_repeating_bytes=memory_weights,
        weights_nonrepeating_bytes=memory_layer_output,
        graph_full_bytes=graph_full,
        graph_partial_bytes=graph_partial,
        projector_weights_bytes=projector_bytes + vision_weights,
        projector_graph_bytes=vision_graph,
    )


# ------------------------------------------------------------ server/sched.go, routes.go, server.go


def estimate_gpu_layers(
    model: LegacyModel,
    gpus: Sequence[LegacyGpu],
    *,
    num_ctx: int,
    num_parallel: int,
    kv_cache_type: str,
    flash_attention: bool,
    version: str,
    num_batch: int = 512,
    num_gpu: int = -1,
    gpu_overhead_bytes: int = 0,
    sched_spread: bool = False,
    new_estimates: bool = False,
    new_engine: bool = False,
    projector_bytes: int = 0,
) -> LegacyEstimate:
    """Ollama ``version``'s offload decision for the first model loaded: its ``msg=offload`` line.

    ``num_ctx``: the request's context per slot (OLLAMA_CONTEXT_LENGTH or the Modelfile's num_ctx);
    ``num_parallel``: OLLAMA_NUM_PARALLEL, 0 when unset (before v0.11.5 the scheduler then picks 2 or 1:
    ``LegacyEstimate.num_parallel`` says which); ``kv_cache_type``: OLLAMA_KV_CACHE_TYPE ("" unset);
    ``flash_attention``: OLLAMA_FLASH_ATTENTION; ``projector_bytes``: the llama engine's mmproj file, if any
    (its tensors' sizes; kept on the first GPU); ``gpus``: every GPU of one library, with the free memory
    the driver reports when the model is scheduled. Applies what the server does before the estimate
    (routes.go gpt-oss minimum context, sched.go minimum 4, the training-context clamp, one slot for an
    embedding model) and ``pickBestFullFitByLibrary``'s choice of GPUs. Raises
    :class:`LegacyVersionNotModelled` where this estimator was not Ollama's decision (``new_estimates``:
    OLLAMA_NEW_ESTIMATES=1, v0.11.5..v0.11.10; ``new_engine``: OLLAMA_NEW_ENGINE=1).
    """
    v = check_modelled(model, version, new_estimates=new_estimates, new_engine=new_engine)
    if num_parallel < 0:
        raise InputError("num_parallel cannot be negative", hint="0 means OLLAMA_NUM_PARALLEL unset")
    notes: list[str] = []
    total_vram = sum((g.total_bytes or g.free_bytes) - gpu_overhead_bytes for g in gpus)
    low_vram = v >= (0, 11, 4) and total_vram < LOW_VRAM_THRESHOLD_BYTES
    if _is_gptoss(model.architecture, v) and not low_vram and num_ctx < 8192:  # routes.go model family
        notes.append(f"routes.go: gpt-oss gets at least 8192 context (num_ctx {num_ctx} -> 8192)")
        num_ctx = 8192
    num_ctx = max(num_ctx, 4)
    if model.context_length > 0 and num_ctx > model.context_length and v >= (0, 9, 3):
        num_ctx = model.context_length  # llm/server.go (v0.9.3): "requested context size too large for model"
    # OLLAMA_NUM_PARALLEL unset (0): before v0.11.5 sched.go tries defaultParallel (2 before v0.10.0, then 1)
    # and 1 for a full fit, and loads a partial fit with 1; from v0.11.5 it is simply 1
    if not model.is_completion:
        tries = [1]  # "Embedding models should always be loaded with parallel=1"
    elif num_parallel == 0 and v < (0, 11, 5):
        tries = [2 if v < (0, 10, 0) else 1, 1]
    else:
        tries = [max(num_parallel, 1)]

    def run(idx: Sequence[int], p: int) -> LegacyEstimate:
        return estimate_on_gpus(
            model,
            [gpus[i] for i in idx],
            num_ctx=num_ctx * p if v < (0, 11, 5) else num_ctx,  # sched.go: origNumCtx * p before v0.11.5
            num_parallel=p,
            kv_cache_type=kv_cache_type,
            flash_attention=flash_attention,
            version=version,
            num_batch=num_batch,
            num_gpu=num_gpu,
            gpu_overhead_bytes=gpu_overhead_bytes,
            projector_bytes=projector_bytes,
            gpu_indices=idx,
        )

    def fits(e: LegacyEstimate) -> bool:  # PredictServerFit
        want = model.block_count + 1 if num_gpu < 0 else num_gpu
        return e.layers_offload > 0 and e.layers_offload >= want

    # pickBestFullFitByLibrary: most free memory first (a stable sort, as sort.Sort on few GPUs)
    order = sorted(range(len(gpus)), key=lambda i: -gpus[i].free_bytes)
    candidates: list[tuple[list[int], int]] = []
    if v < (0, 11, 5):  # each parallel setting on one GPU at a time, then each on all of them
        if not sched_spread:
            candidates += [([i], p) for p in tries for i in order]
        candidates += [(order, p) for p in tries]
    elif sched_spread:
        candidates.append((order, tries[0]))
    else:  # v0.11.5: as few GPUs as possible, 1, 2, ... of the sorted list
        candidates += [(order[:n], tries[0]) for n in range(1, len(order) + 1)]
    chosen: LegacyEstimate | None = None
    if v < (0, 11, 5) and len(gpus) == 1 and gpus[0].library == "cpu":
        # sched.go processPending (v0.7.1..v0.11.4): "simplifying assumption of defaultParallel when in CPU
        # mode": the one "cpu" device loads at once, an unset parallel as defaultParallel (2 before v0.10.0),
        # NumCtx = origNumCtx x parallel, without pickBestFullFitByLibrary's fit check
        candidates = []
        chosen = run([0], tries[0])
    for idx, p in candidates:
        e = run(idx, p)
        if fits(e):
            chosen = e
            break
    if chosen is None:  # pickBestPartialFitByLibrary: all GPUs in discovered order, an unset parallel is 1
        chosen = run(list(range(len(gpus))), 1 if num_parallel == 0 else tries[0])
    return replace(chosen, notes=tuple(notes)) if notes else chosen


# ------------------------------------------------------------------------------------- GGUF header


def _uints(value: object) -> tuple[int, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, GGUFArray) and value.values is not None:
        return tuple(int(x) for x in value.values if isinstance(x, int))
    return ()


def projector_memory_bytes(header: GGUFHeader, version: str) -> int:
    """llm/memory.go projectorMemoryRequirements: every tensor of the llama engine's mmproj file, by GroupLayers,
    as ``version`` sizes them."""
    v = parse_version(version)
    tensors = tuple(LegacyTensor(t.name, t.shape, int(t.ggml_type)) for t in header.tensors)
    return sum(layer_bytes(g, v) for g in _grouped(tensors).values())


def legacy_model(header: GGUFHeader) -> LegacyModel:
    """The values ``estimateGPULayers`` reads, from a GGUF header (tokens counted, not decoded)."""
    md = header.metadata
    arch = header.architecture

    def u(key: str, default: int = 0) -> int:
        vals = _uints(md.get(f"{arch}.{key}"))
        return vals[0] if vals else default

    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = tokens.count if isinstance(tokens, GGUFArray) else 0
    n_vision = u("vision.block_count")  # {arch}.vision.block_count: the tower in the blob
    key_length = _uints(md.get(f"{arch}.attention.key_length"))
    value_length = _uints(md.get(f"{arch}.attention.value_length"))
    return LegacyModel(
        architecture=arch,
        block_count=u("block_count"),
        embedding_length=u("embedding_length"),
        head_count=_uints(md.get(f"{arch}.attention.head_count")) or (1,),
        head_count_kv=_uints(md.get(f"{arch}.attention.head_count_kv")) or (1,),
        key_length=key_length[0] if key_length else None,
        value_length=value_length[0] if value_length else None,
        n_vocab=n_vocab,
        context_length=u("context_length"),
        tensors=tuple(LegacyTensor(t.name, t.shape, int(t.ggml_type)) for t in header.tensors),
        sliding_window=u("attention.sliding_window"),
        feed_forward_length=u("feed_forward_length"),
        is_embedding=f"{arch}.pooling_type" in md,
        has_vision=n_vision > 0,  # {arch}.vision.*: KV.Uint prefixes the architecture (keyValue)
        vision=VisionKV(
            block_count=n_vision,
            image_size=u("vision.image_size"),
            patch_size=u("vision.patch_size"),
            num_channels=u("vision.num_channels"),
            head_count=u("vision.attention.head_count"),
            embedding_length=u("vision.embedding_length"),
            max_pixels=u("vision.max_pixels", 28 * 28 * 1280),
            max_num_tiles=u("vision.max_num_tiles"),
        )
        if n_vision > 0
        else None,
        is_completion=f"{arch}.pooling_type" not in md,
    )
