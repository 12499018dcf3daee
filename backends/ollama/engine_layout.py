"""Ollama's layer placement for its Go engine (the ollamarunner), v0.11.11 to v0.24: ``llm/server.go``
``(s *ollamaServer) Load``, which runs ``createLayout`` (kvadvise.backends.ollama.layout, reused) over the
memory the runner *reports* for a trial layout (``LoadOperationFit`` / ``LoadOperationAlloc``), and tries
again until the layout repeats or grows.

What the runner reports, ``ml.BackendMemory`` per layer and device, is computed here from the GGUF header,
read at the tags of the bare mirror ollama/ollama (identical from v0.11.11 to v0.24.0 unless said):

- **weights** (``ml/backend/ggml/ggml.go`` ``New``): each tensor ``pad(ggml_backend_buft_get_alloc_size,
  alignment)`` on its layer's buffer type (CUDA/ROCm: quantized rows padded to 512 values, 128-byte
  alignment; the CPU and Metal: 32; Vulkan's device alignment is not known here: 32 too); ``token_embd``
  & co. are ``InputWeights`` on the CPU, outside every layer; ``output``/``output_norm``/``cls``/``per_layer_*`` and every vision tensor (``v.``/``mm.``/``s.``) are the
  output layer (index ``block_count``), and without an ``output`` tensor ``token_embd`` is loaded a second
  time as ``output.weight`` there; ``rope_freqs``/``rope_factors_*`` are repeated in every block; Ollama's
  MXFP4 (type 4) is ggml's MXFP4 (39) and a bf16 ``*_exps.bias`` becomes f32.
- **cache** (``kvcache/causal.go`` ``Causal.Init`` and ``Put``, ``runner/ollamarunner/cache.go``): K and V of
  ``kHeadDim x numKVHeads x cells`` per layer, cells = num_ctx x slots (or, on a sliding-window layer,
  slots x memory + batch, memory = max(window, window + 1 for several slots) unless it reaches num_ctx),
  rounded up to the cache padding (256 with flash attention, 32 without before v0.14.0, 256 from v0.14.0:
  ``Backend.CacheConfig``); gemma3's layers are sliding-window but every 6th (``gemmaGlobalCacheCount``),
  gpt-oss's even layers are (``NewSWAMemCache(sliding_window, 4096)``); dtype q8_0 / q4_0 / else f16
  (``kvCacheTypeFromStr``).
- **graph** per GPU (``runner/ollamarunner`` ``reserveWorstCaseGraph``: ``ggml_backend_sched_reserve`` of the
  engine's own forward graph over a batch of ``BatchSize`` tokens with ``parallel`` output rows
  (``batch.Outputs = ctx.Input().Empty(ml.DTypeI32, s.parallel)``), an image of 2048x2048 included for a
  vision model): **not modelled**. The caller passes a stand-in (:func:`graph_stand_in`: kvadvise's estimate
  of llama.cpp's compute buffer for the same batch, cache and flash attention with one output row per slot,
  the same ops without the whole batch's logits); the same figure on every GPU holding a layer, partial or
  full, and on the CPU when there is no GPU (``ml/backend/ggml/ggml.go`` ``Context.Reserve`` books the
  scheduler's buffer per backend: with the CPU alone the whole graph is the CPU's; its share beside a GPU is not
  modelled). Ollama's ``fs/ggml`` ``GraphSize`` is *not* used: it reserves the logits of the whole batch
  (vocab x batch x 4 bytes: 512 MiB for gemma3's 262,144 tokens at batch 512), which the Go engine does not,
  and for an architecture it has no branch for (qwen3, qwen3moe) falls back to GQA x KV / 6, gigabytes at
  long contexts. A vision graph is not added. :attr:`EngineLayout.approximation` says so in every result.

verifyLayout's RAM check counts the InputWeights and the CPU's graph (``cpuSize := memory.InputWeights +
memory.CPU.Graph``, v0.11.11 to v0.24.0) with the layers left on the CPU; the CPU's graph is the stand-in with
no GPU, 0 beside one (not modelled). Every Fit/Alloc is taken to succeed (the layout already keeps each GPU
within its free memory less ``MinimumMemory``): the backoff of a failed allocation (exponential to v0.12.6,
incremental from v0.12.7) is not modelled. The architectures whose cache is not a plain or sliding-window causal
cache (llama4's chunked attention, mllama's cross attention, gemma3n's shared KV, deepseek2's MLA) are refused.

Before v0.12.7 (read at v0.11.11, v0.12.0 .. v0.12.6; the gates below, each at its tag): ``createLayout`` takes
``discover.GpuInfo`` (``MinimumMemory`` set per device by GPU discovery: CUDA and ROCm 457 MiB, Metal 512 MiB to
v0.12.3, 0 at v0.12.4 - v0.12.6, Vulkan 0 from its v0.12.6; ``ByFreeMemory`` by free memory alone) and returns an
empty layout without verifyLayout's checks for num_gpu 0 or no GPU; assignLayers forces a requested count under a
required full load to v0.12.5; Causal.Init keeps a window of exactly num_ctx and no extra cell per slot to
v0.12.3; NewLlamaServer leaves flash attention on for a model that wants it to v0.12.3
(kvadvise.backends.ollama.versions.FA_OVERRIDE_FROM). A GPU whose discovery before v0.12.7 is not ported (oneAPI,
Vulkan before v0.12.6) is refused. The runner's graph differs too (the CUDA pool reserved from v0.12.4, 3d0b1734c):
the stand-in is the same at every version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvadvise.backends.ollama import estimate_legacy, layout
from kvadvise.backends.ollama.estimate_legacy import LegacyModel, LegacyTensor
from kvadvise.backends.ollama.layout import (
    DEVICE_INFO_FROM,
    DeviceMemory,
    GpuLayers,
    LayoutGpu,
    LayoutNotModelled,
    RunnerMemory,
)
from kvadvise.errors import InputError
from kvadvise.model.ggml import ALIGNMENT, BLOCK, GGMLType, cuda_alloc_bytes, pad
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import RunConfig, estimate

# ollamaServer.Load's trial loop, ggml.go New's weights and the models' caches read the same from v0.11.11 (llm/server.go
# NewLlamaServer returns an ollamaServer for every Go-engine model: eb10390de "Enable new memory estimates by
# default") to v0.24; createLayout's gates, each at the tag that changed it (layout.build_layout takes the version):
# v0.12.11 ml.ByPerformance groups in findBestFit and the equal treatment of GPUs under num_gpu
# (layout.PERFORMANCE_GROUPS_FROM); v0.12.7 ml.DeviceInfo (layout.DEVICE_INFO_FROM: MinimumMemory() 457/512 MiB,
# integrated GPUs sorted apart) for discover.GpuInfo, whose MinimumMemory GPU discovery set per device
# (estimate_legacy.minimum_memory: Metal 0 at v0.12.4 - v0.12.6), and verifyLayout split out of createLayout (below);
# v0.12.6 assignLayers' forced request unless required full (layout.FORCE_UNLESS_FULL_FROM). ggml.go New's scheduler
# gained op offload at v0.12.11 and the CUDA pool in the reserved graph at v0.12.4 (3d0b1734c), the graph's concern
# (a stand-in here)
FIRST_VERSION = (0, 11, 11)
PERFORMANCE_GROUPS_FROM = layout.PERFORMANCE_GROUPS_FROM
LAST_VERSION = (0, 24, 99)  # v0.30.0 serves GGUF models by llama-server --fit
CACHE_PAD_ALWAYS_FROM = (0, 14, 0)  # Backend.CacheConfig: CachePadding 256 without flash attention too
# kvcache/causal.go Causal.Init (1fc35f126 "Clean up sliding window state with independent batches"): an extra
# cell per slot past the window with several slots, and a window of num_ctx or more is the whole context; before,
# "if int(c.swaMemorySize) > capacity" alone
SWA_STOP_TOKEN_FROM = (0, 12, 4)
# llm/server.go createLayout to v0.12.6: "if s.totalLayers == 0 || s.options.NumGPU == 0 || len(systemGPUs) == 0 ||
# (len(systemGPUs) == 1 && systemGPUs[0].Library == "cpu") { return ml.GPULayersList{}, nil }": no layout and no
# RAM check; from v0.12.7 buildLayout then verifyLayout for every call
VERIFY_ALWAYS_FROM = (0, 12, 7)
VULKAN_FROM = (0, 12, 6)  # 2aba569a2 "Vulkan based on #9650": discover/runner.go finds Vulkan devices
# the GPU libraries the replay knows the discovery of before v0.12.7 (their MinimumMemory: minimum_memory)
_OLD_DISCOVERY = frozenset({"CUDA", "ROCm", "Metal"})
APPROXIMATION = (
    "the Go runner's compute graph (reserveWorstCaseGraph) is not modelled: llama.cpp's compute buffer for the "
    "same batch with one output row per slot (kvadvise's estimate) stands in"
)
_CAUSAL = frozenset(
    {"qwen3", "qwen3moe", "qwen25vl", "qwen3vl", "qwen3vlmoe", "mistral3", "llama", "qwen2", "gemma3", "gptoss",
     "gpt-oss"}
)  # fmt: skip
_REFUSED = {
    "llama4": "chunked attention cache",
    "mllama": "cross-attention (encoder) cache",
    "gemma3n": "layers sharing their KV",
    "deepseek2": "MLA cache",
    "deepseekocr": "MLA cache",
}
# ggml.go New: the tensors of the input layer (on the CPU) and of the output layer, by a dotted part of the name
_INPUT_PARTS = frozenset({"position_embd", "token_embd", "token_norm_embd", "token_types"})
_OUTPUT_PARTS = frozenset(
    {"cls", "output", "output_norm", "altup_proj", "altup_unembd_proj", "per_layer_token_embd",
     "per_layer_model_proj", "per_layer_proj_norm"}
)  # fmt: skip
_REPEATED_PARTS = frozenset({"rope_freqs", "rope_factors_long", "rope_factors_short"})
_GEMMA_GLOBAL_CACHE_COUNT = 6  # model/models/gemma3/model_text.go gemmaGlobalCacheCount
_GPTOSS_SWA_MEMORY = 4096  # model/models/gptoss/model.go NewSWAMemCache(sliding_window, 4096, ...)
_MAX_LOADS = 64  # ollamaServer.Load converges in a few; a bound against a cycle this port did not foresee
_CACHE_DTYPES = {"q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}  # kvCacheTypeFromStr; anything else f16


class EngineLayoutNotModelled(LayoutNotModelled):
    """The Go engine's placement of this model or version is not what this port computes."""


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """``ollamaServer.Load``'s layout of one Go-engine model and the memory its runner reports for it."""

    version: str
    total_layers: int  # s.totalLayers = block_count + 1
    requested: int  # num_gpu (-1: as many as fit)
    gpu_layers: tuple[GpuLayers, ...]  # the load request's GPULayers
    gpus: tuple[DeviceMemory, ...]  # per GPU, in the scheduler's order
    cpu: DeviceMemory  # the CPU's weights include InputWeights (token_embd); its graph: the stand-in with no GPU
    available_bytes: tuple[int, ...]  # sched.go "gpu memory" available: free - minimum - overhead
    num_ctx: int
    num_parallel: int
    batch_size: int
    kv_cache_type: str  # the cache dtype's name: f16, q8_0 or q4_0
    flash_attention: bool
    cache_cells: tuple[int, ...]  # cells of each layer's K/V (Causal.Init)
    graph_bytes: int  # the stand-in for the runner's graph, on every GPU that holds a layer (the CPU: no GPU)
    loads: int  # how many trial loads (Fit, Alloc) the replay made
    approximation: str = APPROXIMATION
    notes: tuple[str, ...] = field(default=())

    @property
    def layers_offload(self) -> int:
        return sum(len(g.layers) for g in self.gpu_layers)

    @property
    def total_bytes(self) -> int:
        """BackendMemory.Log "total memory" (the CPU's graph beside a GPU left out: not modelled)."""
        return sum(d.weights_bytes + d.cache_bytes + d.graph_bytes for d in (*self.gpus, self.cpu))

    def memory_lines(self) -> tuple[str, ...]:
        """ml/device.go BackendMemory.Log at INFO, in its order (the CPU's compute graph only with no GPU)."""
        return tuple(layout.memory_log_lines((*self.gpus, self.cpu)))

    def log_line(self) -> str:
        """The server log's lines that carry the decision (layout.load_log_line)."""
        return layout.load_log_line(self.total_layers, self.requested, self.memory_lines(), self.gpu_layers)


# ------------------------------------------------------------------------- what the runner reports


def _library_key(library: str) -> str:
    """The buffer rules of a device: CUDA and ROCm (HIP builds the CUDA backend) pad, others as the CPU."""
    return "cuda" if library in ("CUDA", "ROCm") else "cpu"


def tensor_alloc_bytes(type_id: int, shape: Sequence[int], name: str, library: str | None) -> int:
    """ggml.go New's size of one tensor on a buffer type: pad(get_alloc_size, alignment); ``library`` None is
    the CPU. Raises EngineLayoutNotModelled for a type ggml does not have."""
    if type_id == 4:  # "transform raw mxfp4 stream to ggml mxfp4 format"
        type_id = int(GGMLType.MXFP4)
    elif type_id == int(GGMLType.BF16) and name.endswith("_exps.bias"):  # add_ids only supports fp32
        type_id = int(GGMLType.F32)
    try:
        t = GGMLType(type_id)
        blck, size = BLOCK[t]
    except (ValueError, KeyError):
        raise EngineLayoutNotModelled(f"{name}: GGML type {type_id} is not one kvadvise sizes") from None
    n = 1
    for d in shape:
        n *= d
    n_bytes = n // blck * size  # ggml_nbytes for whole blocks
    if library is not None and _library_key(library) == "cuda":
        return cuda_alloc_bytes(t, shape[0], n_bytes)
    return pad(n_bytes, ALIGNMENT["cpu"])


def _parts(name: str) -> set[str]:
    return set(name.split("."))


def _layer_of(name: str) -> int:
    """The first number in a tensor's name (strings.FieldsFunc over non-digits), -1 for none."""
    digits = ""
    for ch in name:
        if ch.isdigit():
            digits += ch
        elif digits:
            break
    return int(digits) if digits else -1


@dataclass(frozen=True, slots=True)
class _Placed:
    """One tensor's place in the report: its layer (-1: InputWeights on the CPU)."""

    tensor: LegacyTensor
    layer: int


def place_tensors(model: LegacyModel) -> tuple[_Placed, ...]:
    """ggml.go New's routing of the GGUF tensors to layers (blocks, the output layer, the input)."""
    blocks = model.block_count
    has_output = any(t.name.split(".")[0] == "output" for t in model.tensors)  # GroupLayers()["output"]
    out: list[_Placed] = []
    for t in model.tensors:
        parts = _parts(t.name)
        if parts & _INPUT_PARTS:
            out.append(_Placed(t, -1))
            if not has_output and t.name == "token_embd.weight":  # tied embeddings: loaded again as output
                out.append(_Placed(t, blocks))
        elif parts & _OUTPUT_PARTS or t.name.startswith(("v.", "mm.", "s.")):
            out.append(_Placed(t, blocks))
        elif parts & _REPEATED_PARTS:
            out.extend(_Placed(t, i) for i in range(blocks))
        else:
            out.append(_Placed(t, _layer_of(t.name)))
    return tuple(out)


def cache_cells(
    model: LegacyModel, num_ctx: int, num_parallel: int, batch: int, flash_attention: bool, v: tuple[int, int, int]
) -> tuple[int, ...]:
    """Causal.Init's cells per layer (each layer's own cache of the model's WrapperCache) at release ``v``."""
    padding = 256 if flash_attention or v >= CACHE_PAD_ALWAYS_FROM else 32
    arch = model.architecture

    def cells(window: int, memory: int) -> int:
        inf = 1 << 31
        window = window or inf
        memory = memory or window
        if v >= SWA_STOP_TOKEN_FROM:
            if memory != inf and num_parallel > 1:  # "allocate an extra token of storage" for the stop token
                memory = max(memory, window + 1)
            if memory >= num_ctx:
                memory = inf
        elif memory > num_ctx:  # to v0.12.3: a window of exactly num_ctx keeps window + batch cells
            memory = inf
        size = num_parallel * num_ctx if memory == inf else num_parallel * memory + batch
        return -(-size // padding) * padding

    out = []
    for i in range(model.block_count):
        if arch == "gemma3" and (i + 1) % _GEMMA_GLOBAL_CACHE_COUNT != 0:
            out.append(cells(model.sliding_window, 0))
        elif arch in ("gptoss", "gpt-oss") and i % 2 == 0:
            out.append(cells(model.sliding_window, _GPTOSS_SWA_MEMORY))
        else:
            out.append(cells(0, 0))
    return tuple(out)


def _head_dims(model: LegacyModel) -> tuple[int, int]:
    """The K and V head sizes Put sees: attention.key_length / value_length (gemma3's default 256)."""
    if model.architecture == "gemma3":
        return model.key_length or 256, model.value_length or 256
    heads = min(model.head_count) if model.head_count else 1
    head = model.embedding_length // heads if heads else 0
    return model.key_length or head, model.value_length or head


@dataclass(frozen=True, slots=True)
class RunnerReport:
    """What the Go runner reports for one trial layout (ml.BackendMemory), and the layout's device per layer."""

    memory: RunnerMemory
    input_bytes: int  # InputWeights (the CPU)


def runner_report(
    model: LegacyModel,
    gpus: Sequence[LayoutGpu],
    gpu_layers: Sequence[GpuLayers],
    *,
    cells: Sequence[int],
    cache_dtype: GGMLType,
    graph_bytes: int,
) -> RunnerReport:
    """The ml.BackendMemory the runner returns for ``gpu_layers``: weights and cache of each layer on its
    device, ``graph_bytes`` on every GPU that holds a layer."""
    n = model.block_count + 1
    device_of = [-1] * n  # -1: the CPU, else the index in gpus
    ids = [g.device_id for g in gpus]
    for gl in gpu_layers:
        for layer in gl.layers:
            device_of[layer] = ids.index(gl.device_id) if gl.device_id in ids else -1
    mem = RunnerMemory([0] * n, [0] * n, ids, [[0] * n for _ in gpus], [[0] * n for _ in gpus], [0] * len(gpus))
    input_bytes = 0
    for p in place_tensors(model):
        if p.layer < 0:
            input_bytes += tensor_alloc_bytes(p.tensor.type_id, p.tensor.shape, p.tensor.name, None)
            continue
        if p.layer >= n:
            raise EngineLayoutNotModelled(f"{p.tensor.name}: a layer beyond block_count {model.block_count}")
        d = device_of[p.layer]
        size = tensor_alloc_bytes(p.tensor.type_id, p.tensor.shape, p.tensor.name, gpus[d].library if d >= 0 else None)
        (mem.cpu_weights if d < 0 else mem.gpu_weights[d])[p.layer] += size
    k_head, v_head = _head_dims(model)
    for i, c in enumerate(cells):
        heads_kv = model.head_count_kv[i] if len(model.head_count_kv) > i else model.head_count_kv[0]
        d = device_of[i]
        lib = gpus[d].library if d >= 0 else None
        k = tensor_alloc_bytes(int(cache_dtype), (k_head, heads_kv, c), "cache_k", lib)
        # PermutedV (no flash attention) puts the cells first: the same bytes for f16, the only type it has
        v = tensor_alloc_bytes(int(cache_dtype), (v_head, heads_kv, c), "cache_v", lib)
        (mem.cpu_cache if d < 0 else mem.gpu_cache[d])[i] += k + v
    for gl in gpu_layers:
        if gl.layers and gl.device_id in ids:
            mem.gpu_graph[ids.index(gl.device_id)] = graph_bytes
    return RunnerReport(mem, input_bytes)


def graph_stand_in(
    spec: ModelSpec, *, num_ctx: int, num_parallel: int, batch: int, flash_attention: bool, kv_cache_type: str
) -> int:
    """What stands in for the Go runner's graph on a GPU: kvadvise's estimate of llama.cpp's GPU compute buffer
    (kvadvise.planner.memory) for the load Ollama asks of its runner (KvSize = num_ctx x slots, a ubatch of
    ``batch``, the cache type, flash attention on or off) with one output row per slot, as
    reserveWorstCaseGraph reserves ``parallel`` outputs. An approximation: the Go engine builds its own graph."""
    dtype = _CACHE_DTYPES.get(kv_cache_type.lower(), GGMLType.F16)
    cfg = RunConfig(
        n_ctx=num_ctx * num_parallel,
        n_parallel=num_parallel,
        n_batch=batch,
        n_ubatch=batch,
        type_k=dtype,
        type_v=dtype,
        flash_attn="on" if flash_attention else "off",
        device="cuda",
        n_outputs_max=num_parallel,
        runtime="llama-server",
    )
    return max((d.compute_bytes for d in estimate(spec, cfg).devices), default=0)


# ------------------------------------------------------------------------------ ollamaServer.Load


def clamped(model: LegacyModel, num_ctx: int, num_batch: int) -> tuple[int, int]:
    """NewLlamaServer's num_ctx (at most the model's training context) and batch (at most num_ctx), the load it asks
    of its runner (llm/server.go, v0.12.11 - v0.24.0)."""
    if model.context_length > 0:
        num_ctx = min(num_ctx, model.context_length)
    return num_ctx, min(num_batch, num_ctx)


def check_modelled(model: LegacyModel, version: str, gpus: Sequence[LayoutGpu] = ()) -> tuple[int, int, int]:
    """The parsed version where this port is the Go engine's layout of ``model`` on ``gpus``, else raise
    EngineLayoutNotModelled."""
    v = estimate_legacy.parse_version(version)
    if not FIRST_VERSION <= v <= LAST_VERSION:
        raise EngineLayoutNotModelled(
            f"Ollama {version}: the Go engine's layout is replayed for Ollama 0.11.11 to 0.24",
            hint="0.11.5 - 0.11.10 lay it out by llm/memory.go unless OLLAMA_NEW_ESTIMATES=1, whose trial layout is "
            "not ported (kvadvise takes the variable as unset); 0.30 and later: llama-server --fit",
        )
    if v < DEVICE_INFO_FROM:
        for g in gpus:
            if g.library == "Vulkan" and v < VULKAN_FROM:
                raise EngineLayoutNotModelled(f"Ollama {version} has no Vulkan backend (from 0.12.6): {g.name}")
            if g.library not in _OLD_DISCOVERY and g.library != "Vulkan":
                raise EngineLayoutNotModelled(
                    f"Ollama {version}: GPU discovery of a {g.library} device before 0.12.7 is not ported ({g.name})",
                    hint="its MinimumMemory and reported free memory (oneAPI: 95% of it) are discover/'s, not read here",
                )
    arch = model.architecture
    if arch in _REFUSED:
        raise EngineLayoutNotModelled(f"{arch}: its {_REFUSED[arch]} is not modelled for Ollama's Go engine")
    if arch not in _CAUSAL:
        raise EngineLayoutNotModelled(f"{arch}: the Go engine's cache for it is not modelled")
    return v


def ollama_server_load(
    model: LegacyModel,
    gpus: Sequence[LayoutGpu],
    *,
    version: str,
    num_ctx: int,
    graph_bytes: int,
    num_parallel: int = 1,
    num_batch: int = 512,
    num_gpu: int = -1,
    flash_attention: bool = True,
    kv_cache_type: str = "",
    gpu_overhead_bytes: int = 0,
    require_full: bool = False,
    sched_spread: bool = False,
    system_free_bytes: int | None = None,
    system_swap_bytes: int = 0,
    system_total_bytes: int | None = None,
) -> EngineLayout:
    """Ollama ``version``'s layout of a Go-engine model on ``gpus``: ``ollamaServer.Load``'s trial loads.

    ``graph_bytes``: the runner's graph on a GPU that holds layers (not modelled: :func:`graph_stand_in`);
    ``flash_attention``: what NewLlamaServer settled (OLLAMA_FLASH_ATTENTION or the model's wish, refused
    where unsupported); ``kv_cache_type``: OLLAMA_KV_CACHE_TYPE, used only with flash attention (a quantized
    type needs it). Raises LayoutLoadRefused where verifyLayout refuses, EngineLayoutNotModelled where the
    port does not apply."""
    v = check_modelled(model, version, gpus)
    if num_parallel < 1:
        raise InputError("num_parallel must be at least 1", hint="sched.go passes max(OLLAMA_NUM_PARALLEL, 1)")
    notes: list[str] = []
    asked = num_ctx
    num_ctx, batch = clamped(model, num_ctx, num_batch)
    if num_ctx != asked:
        notes.append(f"requested context size too large for model: num_ctx {asked} -> {num_ctx}")
    kvct = kv_cache_type.lower() if flash_attention else ""
    if kvct and not estimate_legacy.supports_kv_cache_type(model, kvct, v):
        kvct = ""  # "unsupported OLLAMA_KV_CACHE_TYPE"
    dtype = _CACHE_DTYPES.get(kvct, GGMLType.F16)
    cells = cache_cells(model, num_ctx, num_parallel, batch, flash_attention, v)
    library = gpus[0].library if gpus else "CPU"
    free = [g.free_bytes for g in gpus]
    loads = 0

    def report(gl: Sequence[GpuLayers]) -> RunnerReport:
        nonlocal loads
        loads += 1
        if loads > _MAX_LOADS:
            raise EngineLayoutNotModelled("ollamaServer.Load did not settle within the trial loads replayed")
        return runner_report(
            model, gpus, gl, cells=cells, cache_dtype=dtype,
            graph_bytes=graph_bytes,
        )  # fmt: skip

    input_bytes = runner_report(
        model, gpus, (), cells=cells, cache_dtype=dtype, graph_bytes=0
    ).input_bytes  # InputWeights: always on the CPU, whatever the layout
    # ggml.go Context.Reserve (v0.12.11 - v0.24.0) books ggml_backend_sched's buffer per backend: with no GPU the
    # whole graph is the CPU's (96.0 MiB logged for qwen3moe at 16k by Ollama 0.16.1,
    # tests/data/published/ollama-engine-layout); beside a GPU the CPU's share is not modelled (0)
    cpu_graph = 0 if gpus else graph_bytes

    def create_layout(mem: RunnerMemory, requested: int) -> tuple[GpuLayers, ...]:
        if v < VERIFY_ALWAYS_FROM and (requested == 0 or not gpus):
            return ()  # createLayout's early return: no layout, no verifyLayout (to v0.12.6)
        placed, layers = layout.build_layout(
            gpus, free, mem, require_full, requested, gpu_overhead_bytes, sched_spread, v
        )  # fmt: skip
        return tuple(
            layout.verify_layout(
                placed, layers, mem, require_full=require_full, requested=requested, n_gpus=len(gpus), v=v,
                library=library, system_free_bytes=system_free_bytes, system_swap_bytes=system_swap_bytes,
                system_total_bytes=system_total_bytes, cpu_fixed_bytes=input_bytes + cpu_graph,
            )
        )  # fmt: skip

    def total(gl: Sequence[GpuLayers]) -> int:
        return sum(len(g.layers) for g in gl)

    n = model.block_count + 1
    # createLayout's "memory == nil": every layer weighs nothing, so all of them go to the first GPU
    empty = RunnerMemory([0] * n, [0] * n, [g.device_id for g in gpus], [[0] * n for _ in gpus],
                         [[0] * n for _ in gpus], [0] * len(gpus))  # fmt: skip
    gpu_layers = create_layout(empty, num_gpu)
    past: set[tuple[GpuLayers, ...]] = set()
    for _operation in ("fit", "alloc"):  # LoadOperationFit, LoadOperationAlloc (Commit: the layout as is)
        settled = False
        while not settled:  # nextLoad
            mem = report(gpu_layers).memory
            past.add(gpu_layers)
            new = create_layout(mem, num_gpu)
            if new not in past and total(new) <= total(gpu_layers):
                gpu_layers = new
                continue
            # "exploring intermediate layers": between a layout and a larger new one, force each count down
            if num_gpu < 0 and total(new) - total(gpu_layers) > 1:
                for i in range(total(new) - 1, total(gpu_layers) - 1, -1):
                    forced = create_layout(mem, i)
                    verify = create_layout(report(forced).memory, num_gpu)
                    if total(forced) <= total(verify):
                        gpu_layers = forced
                        past.clear()
                        break
            settled = True  # the load succeeded (assumed): on to the next operation with this layout

    final = report(gpu_layers)
    mem = final.memory
    return EngineLayout(
        version=version,
        total_layers=n,
        requested=num_gpu,
        gpu_layers=gpu_layers,
        gpus=tuple(
            DeviceMemory(g.name, sum(mem.gpu_weights[j]), sum(mem.gpu_cache[j]), mem.gpu_graph[j])
            for j, g in enumerate(gpus)
        ),
        cpu=DeviceMemory("CPU", final.input_bytes + sum(mem.cpu_weights), sum(mem.cpu_cache), cpu_graph),
        available_bytes=layout.available_bytes(gpus, gpu_overhead_bytes, v),
        num_ctx=num_ctx,
        num_parallel=num_parallel,
        batch_size=batch,
        kv_cache_type=dtype.type_name,
        flash_attention=flash_attention,
        cache_cells=tuple(cells),
        graph_bytes=graph_bytes,
        loads=loads,
        notes=tuple(notes),
    )
