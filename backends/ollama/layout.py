"""Ollama's own layer placement from v0.12.11 to v0.24 for the llamarunner: ``llm/server.go``
``(s *llamaServer) Load`` and its ``createLayout`` / ``buildLayout`` / ``assignLayers`` / ``findBestFit`` /
``greedyFit`` / ``verifyLayout``, ported function by function from the tags of the bare mirror ollama/ollama
(``git show vX:llm/server.go``; v0.12.11 deleted ``llm/memory.go``, f560bd077fcf).

What the llamarunner's layout consumes is **not** a no-alloc pass of llama.cpp: ``llamaServer.Load``
"synthesize[s] memory allocation information based on our estimates", i.e. ``fs/ggml`` ``GraphSize`` (the
KV bytes per layer and the partial / full offload graph) and ``Tensors().GroupLayers()`` (each block's bytes,
``output_norm`` + ``output`` or ``token_embd`` as the last layer). Those functions are the ones
:mod:`kvadvise.backends.ollama.estimate_legacy` ports; their bodies (``GraphSize``, ``GroupLayers``,
``TensorType.BlockSize/TypeSize``) are the same blob from v0.12.7 to v0.24.0 but for GraphSize's flash
attention argument becoming ``ml.FlashAttentionType`` at v0.13.4 (the gptoss graph compares it with
``FlashAttentionEnabled``). So the replay needs no substitution of kvadvise's plan: it is Ollama's own
estimate. The Go engine (ollamarunner) measures its sizes with trial allocations of its own backend, which
kvadvise does not model: not replayed here.

Version differences that change a result (checked tag by tag, v0.12.11 .. v0.24.0):

- v0.13.1: ``verifyLayout`` takes the GPUs; with no GPU a required-full load no longer fails, and the
  "insufficient VRAM" branch needs a GPU (no change to a layout on a GPU).
- v0.13.3: an embedding model (``{arch}.pooling_type``) gets ``BatchSize = NumCtx`` before GraphSize.
- v0.13.4: the llamarunner's flash attention is ``auto`` unless OLLAMA_FLASH_ATTENTION is set; a quantized
  OLLAMA_KV_CACHE_TYPE then needs flash attention *enabled* (else the cache stays f16), and an unquantized
  one is passed without flash attention (``NewLlamaServer``).
- v0.14.0: the one-layer buffer (``blk.0`` + its KV) and the projector no longer underflow a GPU's free
  memory (uint64 wrap before: a GPU with less free than one layer then looked nearly infinite).
- ``createLayout``/``buildLayout``/``assignLayers``/``findBestFit``/``greedyFit``: one blob from v0.13.1 to
  v0.24.0; ``ml.DeviceInfo.MinimumMemory`` 512 MiB on Metal, 457 MiB elsewhere, throughout.

The ollamarunner's backoff is 0 here (the llamarunner's); ``OLLAMA_SCHED_SPREAD`` is ported. The vision
projector is sized from ``loadRequest.LoraPath`` (sic, every tag to v0.24.0): the adapters, which kvadvise
never sets, so a vision model is laid out as its text model, as Ollama does.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvadvise.backends.ollama import estimate_legacy
from kvadvise.backends.ollama.estimate_legacy import LegacyModel, human_bytes2
from kvadvise.errors import InputError
from kvadvise.model.ggml import GGMLType, is_quantized

MIB = 1024**2
FIRST_VERSION = (0, 12, 11)  # llm/memory.go deleted; llamaServer.Load lays the llamarunner out
LAST_VERSION = (0, 24, 99)  # v0.30.0 serves GGUF models by llama-server --fit (llm/llama_server.go)
VERIFY_GPUS_FROM = (0, 13, 1)  # verifyLayout(systemInfo, systemGPUs, ...)
EMBEDDING_BATCH_FROM = (0, 13, 3)  # "embedding model detected, setting batch size to context length"


def runner_batch(v: tuple[int, int, int], is_embedding: bool, batch: int, num_ctx: int) -> int:
    """The llamarunner's BatchSize: llm/server.go (0.13.3-0.24) llamaServer.Load gives an embedding model
    (``{arch}.pooling_type``) its context as its batch before GraphSize, and the runner's context takes it
    (runner.go NewContextParams)."""
    return max(batch, num_ctx) if v >= EMBEDDING_BATCH_FROM and is_embedding else batch


FA_TYPE_FROM = (0, 13, 4)  # ml.FlashAttentionType: auto unless OLLAMA_FLASH_ATTENTION is set
NO_UNDERFLOW_FROM = (0, 14, 0)  # "if gpus[i].FreeMemory > buffer" guards
# the Go engine's createLayout (ollamaServer, kvadvise.backends.ollama.engine_layout) is older, from v0.11.11:
PERFORMANCE_GROUPS_FROM = (0, 12, 11)  # findBestFit over ml.ByPerformance groups; assignLayers' equal GPUs
# v0.12.7 llm/server.go takes []ml.DeviceInfo for discover.GpuInfoList: ml.ByFreeMemory sorts integrated GPUs
# apart (discover/types.go ByFreeMemory, to v0.12.6: by FreeMemory alone), MinimumMemory() a method
DEVICE_INFO_FROM = (0, 12, 7)
# v0.12.6 (3dcfd5f69 "Perform eviction when num_gpu is set with new estimates"): assignLayers forces a requested
# count only unless the model must load fully ("forceRequest := i == len(gpus)-1 && !requireFull"); before, always
FORCE_UNLESS_FULL_FROM = (0, 12, 6)
_U64 = 1 << 64


class LayoutNotModelled(InputError):
    """Ollama's placement at this version, for this model, is not what this port computes."""


class LayoutLoadRefused(InputError):
    """``verifyLayout`` refuses the load (Ollama's own error): no layout to claim. ``loaded_layers``: the
    layers the refused layout placed (what "evicting a model to make space" logs as "loaded layers")."""

    def __init__(self, message: str, *, loaded_layers: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.loaded_layers = loaded_layers


@dataclass(frozen=True, slots=True)
class LayoutGpu:
    """One GPU as the scheduler hands it to ``Load`` (``ml.DeviceInfo``)."""

    device_id: str  # DeviceID.ID as printed in GPULayers ("GPU-<uuid>" on CUDA, "0" on ROCm and Metal)
    name: str  # the backend's device name ("CUDA0", "ROCm0", "Metal"): memory log lines
    library: str  # "CUDA" | "ROCm" | "Metal" | "Vulkan" (Ollama's spelling)
    free_bytes: int  # FreeMemory after sched.go updateFreeSpace (the first model: what the device reports)
    integrated: bool = False

    @property
    def minimum_bytes(self) -> int:
        """ml/device.go DeviceInfo.MinimumMemory (v0.12.7 .. v0.24.0; before, :func:`minimum_bytes_at`)."""
        return self.minimum_bytes_at(LAST_VERSION)

    def minimum_bytes_at(self, v: tuple[int, int, int]) -> int:
        """MinimumMemory at release ``v``: GPU discovery's per device before v0.12.7 (estimate_legacy.minimum_memory)."""
        return estimate_legacy.minimum_memory(self.library, v)


@dataclass(frozen=True, slots=True)
class GpuLayers:
    """ml.GPULayers: the layer indices one device holds."""

    device_id: str
    layers: tuple[int, ...]

    def text(self) -> str:
        """GPULayers.String: "" when empty, "ID:x Layers:n(a..b)" when contiguous, else the list."""
        if not self.layers:
            return ""
        ls = sorted(self.layers)
        if ls == list(range(ls[0], ls[0] + len(ls))):
            return f"ID:{self.device_id} Layers:{len(ls)}({ls[0]}..{ls[-1]})"
        return f"ID:{self.device_id} Layers:{len(ls)}[{' '.join(map(str, ls))}]"


def layers_text(gpu_layers: Sequence[GpuLayers]) -> str:
    """GPULayersList.String, as ``msg=load request=...GPULayers:...`` prints it."""
    inner = "[" + " ".join(g.text() for g in gpu_layers) + "]"
    total = _sum(gpu_layers)
    return f"{total}{inner}" if total > 0 else inner


def _sum(gpu_layers: Sequence[GpuLayers]) -> int:
    return sum(len(g.layers) for g in gpu_layers)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """ml.DeviceMemory after Load moved the assigned layers: what ``BackendMemory.Log`` prints."""

    name: str
    weights_bytes: int
    cache_bytes: int
    graph_bytes: int


def memory_log_lines(devices: Sequence[DeviceMemory]) -> list[str]:
    """ml/device.go BackendMemory.Log at INFO without its "total memory" line: each kind of memory, each device
    that holds some, in that order (the llamarunner's layout and the Go engine's, engine_layout.py)."""
    out: list[str] = []
    for kind, sizes in (
        ("model weights", [d.weights_bytes for d in devices]),
        ("kv cache", [d.cache_bytes for d in devices]),
        ("compute graph", [d.graph_bytes for d in devices]),
    ):
        for d, size in zip(devices, sizes, strict=True):
            if size > 0:
                out.append(f'msg="{kind}" device={d.name} size="{human_bytes2(size)}"')
    return out


def load_log_line(
    total_layers: int, requested: int, memory_lines: Sequence[str], gpu_layers: Sequence[GpuLayers]
) -> str:
    """The lines of the server log that carry a layout's decision, joined: "loading model", the memory summary,
    and the load request's GPULayers (the llamarunner's layout and the Go engine's)."""
    return "; ".join(
        (
            f'msg="loading model" "model layers"={total_layers} requested={requested}',
            *memory_lines,
            f"GPULayers:{layers_text(gpu_layers)}",
        )
    )


def available_bytes(
    gpus: Sequence[LayoutGpu], gpu_overhead_bytes: int, v: tuple[int, int, int] = LAST_VERSION
) -> tuple[int, ...]:
    """Load's "gpu memory" line per GPU: its free memory less its minimum (at release ``v``) and
    OLLAMA_GPU_OVERHEAD, 0 where that leaves nothing."""
    reserves = [gpu_overhead_bytes + g.minimum_bytes_at(v) for g in gpus]
    return tuple(g.free_bytes - r if g.free_bytes >= r else 0 for g, r in zip(gpus, reserves, strict=True))


@dataclass(frozen=True, slots=True)
class LayoutDecision:
    """``llamaServer.Load``'s layout of one model, and the memory it logs."""

    version: str
    total_layers: int  # s.totalLayers = block_count + 1 ("model layers")
    requested: int  # num_gpu (-1: as many as fit)
    gpu_layers: tuple[GpuLayers, ...]  # the GPULayers of the load request
    gpus: tuple[DeviceMemory, ...]  # per GPU, in the scheduler's order
    cpu: DeviceMemory
    available_bytes: tuple[int, ...]  # what sched.go logs as "gpu memory" available: free - minimum - overhead
    num_ctx: int  # after the training-context clamp
    num_parallel: int
    batch_size: int
    kv_cache_type: str  # loadRequest.KvCacheType
    flash_attention: str  # "on" | "off" | "auto"
    graph_partial_bytes: int
    graph_full_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def layers_offload(self) -> int:
        return _sum(self.gpu_layers)

    @property
    def total_bytes(self) -> int:
        """BackendMemory.Log "total memory": weights, KV and graphs on every device."""
        return sum(d.weights_bytes + d.cache_bytes + d.graph_bytes for d in (*self.gpus, self.cpu))

    @property
    def vram_by_gpu_bytes(self) -> tuple[int, ...]:
        """llmServer.VRAMByGPU per GPU (DeviceMemory.Size: weights, cache, graph): what the scheduler takes
        off a GPU's free memory for the next model (sched.go updateFreeSpace)."""
        return tuple(d.weights_bytes + d.cache_bytes + d.graph_bytes for d in self.gpus)

    def memory_lines(self) -> tuple[str, ...]:
        """ml/device.go BackendMemory.Log at INFO, in its order."""
        out = memory_log_lines((*self.gpus, self.cpu))
        if self.total_bytes > 0:
            out.append(f'msg="total memory" size="{human_bytes2(self.total_bytes)}"')
        return tuple(out)

    def log_line(self) -> str:
        """The server log's lines that carry the decision (:func:`load_log_line`)."""
        return load_log_line(self.total_layers, self.requested, self.memory_lines(), self.gpu_layers)


# -------------------------------------------------------------------------------- float32 arithmetic


def _f32(x: float) -> float:
    """Round to float32 as Go's float32 arithmetic does (each operation rounds once: a product or sum of
    two float32 is exact in a double, so rounding the double once is Go's result)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


_EPS = _f32(1e-6)  # "high-low > 1e-6": the constant converted to float32


def _capacity_bytes(free_bytes: int, capacity: float) -> int:
    """uint64(float32(FreeMemory) * capacity): truncation toward zero."""
    return int(_f32(_f32(float(free_bytes)) * capacity))


# ------------------------------------------------------------------------------- llm/server.go layout


@dataclass(slots=True)
class _Dev:
    """The mutable ml.DeviceInfo copy buildLayout works on."""

    device_id: str
    library: str
    free_bytes: int
    integrated: bool


def greedy_fit(layers: Sequence[int], gpus: Sequence[_Dev], capacity: float, requested: int) -> list[GpuLayers]:
    """greedyFit: from the last layer down, onto the last GPU first, spilling to the previous GPU when a layer
    does not fit; stops at ``requested`` layers (>= 0) or when no GPU is left."""
    device = len(gpus) - 1
    out: list[tuple[str, list[int]]] = [(gpus[device].device_id, [])]
    free = _capacity_bytes(gpus[device].free_bytes, capacity)
    for i in range(len(layers) - 1, -1, -1):
        if requested >= 0 and len(layers) - 1 - i >= requested:
            break
        while True:
            if layers[i] <= free:
                out[0][1].insert(0, i)
                free -= layers[i]
                break
            device -= 1
            if device < 0:
                return [GpuLayers(d, tuple(ls)) for d, ls in out]
            out.insert(0, (gpus[device].device_id, []))
            free = _capacity_bytes(gpus[device].free_bytes, capacity)
    return [GpuLayers(d, tuple(ls)) for d, ls in out]


def _by_performance(gpus: Sequence[_Dev]) -> list[list[_Dev]]:
    """ml.ByPerformance: groups by Integrated, in the order each kind first appears."""
    groups: list[tuple[bool, list[_Dev]]] = []
    for g in gpus:
        for kind, members in groups:
            if kind == g.integrated:
                members.append(g)
                break
        else:
            groups.append((g.integrated, [g]))
    return [members for _, members in groups]


def find_best_fit(
    layers: Sequence[int],
    gpus: Sequence[_Dev],
    requested: int,
    force_request: bool,
    performance_groups: bool = True,
) -> list[GpuLayers]:
    """findBestFit: per performance group, the most layers greedyFit places at capacity 1 (1000 when a
    requested count must be forced), then the smallest float32 capacity factor placing as many (bisection to
    1e-6), which balances the layers over the group's GPUs. ``performance_groups`` False: all the GPUs as one
    group (before v0.12.11, which added ml.ByPerformance)."""
    layers = list(layers)
    out: list[GpuLayers] = []
    for group in _by_performance(gpus) if performance_groups else [list(gpus)]:
        high = _f32(1000.0) if requested >= 0 and force_request else _f32(1.0)
        low = _f32(0.0)
        best = greedy_fit(layers, group, high, requested)
        most = _sum(best)
        while _f32(high - low) > _EPS:
            mid = _f32(_f32(low + high) / 2)
            trial = greedy_fit(layers, group, mid, requested)
            if _sum(trial) == most:
                high = mid
                best = trial
            else:
                low = mid
        placed = _sum(best)
        layers = layers[: len(layers) - placed]
        requested -= placed
        out = best + out
    return out


def assign_layers(
    layers: Sequence[int],
    gpus: Sequence[_Dev],
    require_full: bool,
    requested: int,
    last_used_gpu: int,
    sched_spread: bool = False,
    performance_groups: bool = True,
    force_unless_full: bool = True,
) -> list[GpuLayers]:
    """assignLayers: as few GPUs (of the sorted list) as hold every layer or the requested count, the last
    one tried forcing the request unless the model must load fully (``force_unless_full``, v0.12.6 and later;
    before, forcing it always); then once more without the output layer (the last) when not every layer fit.
    ``performance_groups``: v0.12.11 and later (find_best_fit), which also treat every GPU as discrete under a
    requested count or OLLAMA_SCHED_SPREAD."""
    if performance_groups and (requested >= 0 or sched_spread):  # "treat all GPUs equally so they split ..."
        gpus = [_Dev(g.device_id, g.library, g.free_bytes, False) for g in gpus]
    layers = list(layers)
    out: list[GpuLayers] = []
    for _ in range(2):
        requested = min(len(layers), requested)
        if not sched_spread:
            for i in range(last_used_gpu, len(gpus)):
                force = i == len(gpus) - 1 and not (require_full and force_unless_full)
                out = find_best_fit(layers, gpus[: i + 1], requested, force, performance_groups)
                if _sum(out) == len(layers) or _sum(out) == requested:
                    break
        else:
            force = not (require_full and force_unless_full)
            out = find_best_fit(layers, gpus, requested, force, performance_groups)
        if _sum(out) == len(layers):
            return out
        layers = layers[:-1]
    return out


@dataclass(slots=True)
class RunnerMemory:
    """The BackendMemory llamaServer.Load synthesizes (weights and cache per layer, graph per device)."""

    cpu_weights: list[int]
    cpu_cache: list[int]
    gpu_ids: list[str]
    gpu_weights: list[list[int]]
    gpu_cache: list[list[int]]
    gpu_graph: list[int]


def build_layout(
    gpus: Sequence[LayoutGpu],
    free_bytes: Sequence[int],
    memory: RunnerMemory,
    require_full: bool,
    requested: int,
    gpu_overhead_bytes: int,
    sched_spread: bool = False,
    v: tuple[int, int, int] = LAST_VERSION,
) -> tuple[list[GpuLayers], list[int]]:
    """buildLayout (createLayout's first half before v0.12.7) at release ``v``: GPUs sorted by free memory
    (discrete first from v0.12.7, most free first), each one's free memory less MinimumMemory (per device,
    :meth:`LayoutGpu.minimum_bytes_at`), OLLAMA_GPU_OVERHEAD and the graph already placed on it; per library,
    assignLayers from the last GPU that already holds a graph; the library placing the most layers wins
    (:func:`assign_layers`: performance groups from v0.12.11, a forced request unless required full from
    v0.12.6)."""
    devs = [_Dev(g.device_id, g.library, free_bytes[i], g.integrated) for i, g in enumerate(gpus)]
    minimum = {g.device_id: g.minimum_bytes_at(v) for g in gpus}
    # sort.Sort(sort.Reverse(ml.ByFreeMemory)): insertion sort below 12 elements, so stable; discover's
    # ByFreeMemory (to v0.12.6) compares FreeMemory alone
    if v >= DEVICE_INFO_FROM:
        devs.sort(key=lambda d: (d.integrated, -d.free_bytes))
    else:
        devs.sort(key=lambda d: -d.free_bytes)
    n = len(memory.cpu_weights)
    layers = [
        sum(memory.gpu_weights[j][i] + memory.gpu_cache[j][i] for j in range(len(memory.gpu_ids)))
        + memory.cpu_weights[i]
        + memory.cpu_cache[i]
        for i in range(n)
    ]
    best: list[GpuLayers] = []
    libraries: list[str] = []
    for d in devs:
        if d.library not in libraries:
            libraries.append(d.library)
    for lib in libraries:  # ml.ByLibrary
        group = [d for d in devs if d.library == lib]
        last_used = 0
        for i, d in enumerate(group):
            if d.device_id not in memory.gpu_ids:
                d.free_bytes = 0  # "The runner doesn't report seeing this GPU"
                continue
            j = memory.gpu_ids.index(d.device_id)
            if memory.gpu_graph[j] != 0:
                last_used = i
            reserved = minimum[d.device_id] + gpu_overhead_bytes + memory.gpu_graph[j]  # backoff: 0 (not modelled)
            d.free_bytes = d.free_bytes - reserved if d.free_bytes > reserved else 0
        placed = assign_layers(
            layers, group, require_full, requested, last_used, sched_spread,
            performance_groups=v >= PERFORMANCE_GROUPS_FROM, force_unless_full=v >= FORCE_UNLESS_FULL_FROM,
        )  # fmt: skip
        if _sum(placed) > _sum(best):
            best = placed
    return best, layers


def verify_layout(
    gpu_layers: Sequence[GpuLayers],
    layers: Sequence[int],
    memory: RunnerMemory,
    *,
    require_full: bool,
    requested: int,
    n_gpus: int,
    v: tuple[int, int, int],
    library: str,
    system_free_bytes: int | None,
    system_swap_bytes: int,
    system_total_bytes: int | None,
    cpu_fixed_bytes: int = 0,
) -> list[GpuLayers]:
    """verifyLayout: the load fails where a required full load does not fit, or where the layers left on the
    CPU exceed free RAM and swap (not on macOS); on macOS layers beyond the system's total memory put
    nothing on the GPU. ``cpu_fixed_bytes``: memory.InputWeights + memory.CPU.Graph, which cpuSize starts from
    (the Go runner reports its InputWeights; the llamarunner's synthesized memory has none)."""
    on_gpu = {i for g in gpu_layers for i in g.layers}
    cpu_size = cpu_fixed_bytes + sum(s for i, s in enumerate(layers) if i not in on_gpu)
    vram_size = sum(s for i, s in enumerate(layers) if i in on_gpu)
    vram_size += sum(memory.gpu_graph[memory.gpu_ids.index(g.device_id)] for g in gpu_layers)
    if require_full:
        gpus_known = n_gpus > 0 or v < VERIFY_GPUS_FROM
        if gpus_known and _sum(gpu_layers) < len(layers) and (requested < 0 or _sum(gpu_layers) < requested):
            raise LayoutLoadRefused(
                "model requires more gpu memory than is currently available, evicting a model to make space",
                loaded_layers=_sum(gpu_layers),
            )
        if system_free_bytes is not None and cpu_size > system_free_bytes:
            raise LayoutLoadRefused(
                "model requires more system memory than is currently available", loaded_layers=_sum(gpu_layers)
            )
    if library != "Metal":  # runtime.GOOS != "darwin": Metal is the darwin build
        if system_free_bytes is not None and cpu_size > system_free_bytes + system_swap_bytes:
            raise LayoutLoadRefused(
                f"model requires more system memory ({human_bytes2(cpu_size)}) than is available "
                f"({human_bytes2(system_free_bytes + system_swap_bytes)})",
                loaded_layers=_sum(gpu_layers),
                hint="Ollama refuses the load (llm/server.go verifyLayout)",
            )
    elif system_total_bytes is not None and vram_size > system_total_bytes:
        return []  # "disable partial offloading when model is greater than total system memory"
    return list(gpu_layers)


def create_layout(
    gpus: Sequence[LayoutGpu],
    layer_bytes: Sequence[int],
    *,
    version: str,
    requested: int = -1,
    require_full: bool = False,
    graph_bytes: Sequence[int] | None = None,
    gpu_overhead_bytes: int = 0,
    sched_spread: bool = False,
    system_free_bytes: int | None = None,
    system_swap_bytes: int = 0,
    system_total_bytes: int | None = None,
) -> tuple[GpuLayers, ...]:
    """createLayout over memory whose every layer (weights and cache, ``layer_bytes``) sits on the CPU and
    whose GPUs hold ``graph_bytes`` (0 each by default), as llm/server_test.go TestLLMServerFitGPU calls it.
    Raises LayoutLoadRefused where verifyLayout fails."""
    v = estimate_legacy.parse_version(version)
    n = len(layer_bytes)
    mem = RunnerMemory(
        list(layer_bytes),
        [0] * n,
        [g.device_id for g in gpus],
        [[0] * n for _ in gpus],
        [[0] * n for _ in gpus],
        list(graph_bytes) if graph_bytes is not None else [0] * len(gpus),
    )
    placed, layers = build_layout(
        gpus, [g.free_bytes for g in gpus], mem, require_full, requested, gpu_overhead_bytes, sched_spread, v
    )
    return tuple(
        verify_layout(
            placed,
            layers,
            mem,
            require_full=require_full,
            requested=requested,
            n_gpus=len(gpus),
            v=v,
            library=gpus[0].library if gpus else "CPU",
            system_free_bytes=system_free_bytes,
            system_swap_bytes=system_swap_bytes,
            system_total_bytes=system_total_bytes,
        )
    )


def free_after_loaded(total_bytes: int, reported_free_bytes: int, loaded_vram_bytes: int) -> int:
    """server/sched.go updateFreeSpace: a GPU's free memory for the next model, the smaller of what the
    device reports and its total less what the loaded runners' layouts predict (VRAMByGPU)."""
    if loaded_vram_bytes > total_bytes:
        return 0
    return min(reported_free_bytes, total_bytes - loaded_vram_bytes)


# ------------------------------------------------------------------------ llm/server.go llamaServer.Load


def kv_cache_type_is_quantized(cache_type: str) -> bool:
    """fs/ggml GGML.KVCacheTypeIsQuantized (v0.13.4): every type but "" and ggml's float types (f16, f32, bf16);
    a name ggml does not know counts as quantized there too (ggml's integer types, which no cache takes, do not)."""
    t = next((t for t in GGMLType if t.type_name == cache_type), None)
    return cache_type != "" and (t is None or is_quantized(t))


def check_modelled(model: LegacyModel, version: str) -> tuple[int, int, int]:
    """The parsed version where this port is the llamarunner's layout, else raise LayoutNotModelled."""
    v = estimate_legacy.parse_version(version)
    if not FIRST_VERSION <= v <= LAST_VERSION:
        raise LayoutNotModelled(
            f"Ollama {version}: llamaServer.Load's layout is Ollama 0.12.11 to 0.24's",
            hint="older releases: llm/memory.go (estimate_legacy); 0.30 and later: llama-server --fit",
        )
    if model.architecture == "mllama":  # the Go engine's only (OllamaEngineRequired at every tag)
        raise LayoutNotModelled("mllama runs on Ollama's own engine, whose layout is not replayed")
    # a vision model's projector is not refused: llamaServer.Load sizes it from loadRequest.LoraPath (the
    # adapters) at every tag to v0.24.0, so the layout never counts the mmproj file, and adds no vision graph
    return v


def llama_server_load(
    model: LegacyModel,
    gpus: Sequence[LayoutGpu],
    *,
    version: str,
    num_ctx: int,
    num_parallel: int = 1,
    num_batch: int = 512,
    num_gpu: int = -1,
    flash_attention: str = "off",
    kv_cache_type: str = "",
    gpu_overhead_bytes: int = 0,
    require_full: bool = False,
    sched_spread: bool = False,
    system_free_bytes: int | None = None,
    system_swap_bytes: int = 0,
    system_total_bytes: int | None = None,
) -> LayoutDecision:
    """Ollama ``version``'s layout of a llamarunner model on ``gpus`` (one scheduler call of ``Load``).

    ``num_ctx``: the request's context per slot (before NewLlamaServer's training-context clamp);
    ``num_parallel``: what sched.go passes (max(OLLAMA_NUM_PARALLEL, 1); 1 for an embedding model);
    ``flash_attention``: "on" / "off" as NewLlamaServer settled it (the model's wish or
    OLLAMA_FLASH_ATTENTION, refused where unsupported), "auto" for the llamarunner from v0.13.4 when
    OLLAMA_FLASH_ATTENTION is unset; ``kv_cache_type``: OLLAMA_KV_CACHE_TYPE ("" unset);
    ``require_full``: the scheduler's flag (False for the first model); ``system_*``: the RAM verifyLayout
    checks (None: not checked). Raises LayoutLoadRefused where Ollama refuses the load."""
    v = check_modelled(model, version)
    notes: list[str] = []
    if num_parallel < 1:
        raise InputError("num_parallel must be at least 1", hint="sched.go passes max(OLLAMA_NUM_PARALLEL, 1)")
    # NewLlamaServer: the training-context clamp, then NumBatch = min(NumBatch, NumCtx)
    if model.context_length > 0 and num_ctx > model.context_length:
        notes.append(f"requested context size too large for model: num_ctx {num_ctx} -> {model.context_length}")
        num_ctx = model.context_length
    batch = min(num_batch, num_ctx)
    kvct = kv_cache_type.lower()
    fa_on = flash_attention == "on"
    supported = estimate_legacy.supports_kv_cache_type(model, kvct, v)  # GGML.SupportsKVCacheType
    if v >= FA_TYPE_FROM:  # the llamarunner's FlashAttentionType: a quantized cache needs it Enabled
        if kv_cache_type_is_quantized(kvct) and not fa_on:
            kvct = ""
        elif not supported:
            kvct = ""  # "unsupported OLLAMA_KV_CACHE_TYPE"
    elif not fa_on or not supported:
        kvct = ""  # only with flash attention, and only a type SupportsKVCacheType knows
    batch = runner_batch(v, model.is_embedding, batch, num_ctx)
    # GraphSize reads useFlashAttention only in the gptoss branch (an ollamarunner model): "auto" is not on
    kv, graph_partial, graph_full = estimate_legacy.graph_size(model, num_ctx, batch, num_parallel, kvct, fa_on, v)
    groups = estimate_legacy.group_layers(model)
    total_layers = model.block_count + 1

    free = [g.free_bytes for g in gpus]
    blk0 = groups.get("blk.0")
    if blk0 is not None:  # "Use the size of one layer as a buffer"
        buffer = estimate_legacy.layer_bytes(blk0, v) + kv[0]
        for i in range(len(free)):
            if v >= NO_UNDERFLOW_FROM:
                free[i] = free[i] - buffer if free[i] > buffer else 0
            else:
                free[i] = (free[i] - buffer) % _U64  # uint64 wraps
    else:
        notes.append("model missing blk.0 layer size")

    cpu_weights = [0] * total_layers
    cpu_cache = [0] * total_layers
    for i in range(model.block_count):
        blk = groups.get(f"blk.{i}")
        if blk is not None:
            cpu_weights[i] = estimate_legacy.layer_bytes(blk, v)
            cpu_cache[i] += kv[i]
    output = 0  # "We historically haven't included InputWeights in the model size"
    if "output_norm" in groups:
        output += estimate_legacy.layer_bytes(groups["output_norm"], v)
    if "output" in groups:
        output += estimate_legacy.layer_bytes(groups["output"], v)
    elif "token_embd" in groups:
        output += estimate_legacy.layer_bytes(groups["token_embd"], v)
    cpu_weights[total_layers - 1] = output

    kv_total = sum(kv)
    if graph_partial == 0:
        heads_kv = min(model.head_count_kv) if model.head_count_kv else 0
        gqa = (max(model.head_count) if model.head_count else 0) // (heads_kv or 1)
        graph_partial = gqa * kv_total // 6
    if graph_full == 0:
        graph_full = graph_partial
    if gpus and gpus[0].library == "Metal":  # "On Metal there's no partial offload overhead"
        graph_partial = graph_full

    mem = RunnerMemory(
        cpu_weights,
        cpu_cache,
        [g.device_id for g in gpus],
        [[0] * total_layers for _ in gpus],
        [[0] * total_layers for _ in gpus],
        [0] * len(gpus),
    )
    library = gpus[0].library if gpus else "CPU"

    def create_layout() -> list[GpuLayers]:
        placed, layers = build_layout(gpus, free, mem, require_full, num_gpu, gpu_overhead_bytes, sched_spread, v)
        return verify_layout(
            placed,
            layers,
            mem,
            require_full=require_full,
            requested=num_gpu,
            n_gpus=len(gpus),
            v=v,
            library=library,
            system_free_bytes=system_free_bytes,
            system_swap_bytes=system_swap_bytes,
            system_total_bytes=system_total_bytes,
        )

    # "The compute graph for GPUs is iteratively assigned based on the number of GPUs that are required"
    gpu_layers: list[GpuLayers] = []
    while True:
        prev = gpu_layers
        gpu_layers = create_layout()
        if len(gpu_layers) <= len(prev):
            break
        for gl in gpu_layers:
            mem.gpu_graph[mem.gpu_ids.index(gl.device_id)] = max(graph_partial, graph_full)

    graph = graph_full if _sum(gpu_layers) >= total_layers else graph_partial  # "historical assignment"
    for gl in gpu_layers:
        j = mem.gpu_ids.index(gl.device_id)
        for layer in gl.layers:
            mem.gpu_weights[j][layer] = mem.cpu_weights[layer]
            mem.gpu_cache[j][layer] = mem.cpu_cache[layer]
            mem.cpu_weights[layer] = 0
            mem.cpu_cache[layer] = 0
        mem.gpu_graph[j] = graph

    return LayoutDecision(
        version=version,
        total_layers=total_layers,
        requested=num_gpu,
        gpu_layers=tuple(gpu_layers),
        gpus=tuple(
            DeviceMemory(g.name, sum(mem.gpu_weights[j]), sum(mem.gpu_cache[j]), mem.gpu_graph[j])
            for j, g in enumerate(gpus)
        ),
        cpu=DeviceMemory("CPU", sum(mem.cpu_weights), sum(mem.cpu_cache), 0),
        available_bytes=available_bytes(gpus, gpu_overhead_bytes, v),
        num_ctx=num_ctx,
        num_parallel=num_parallel,
        batch_size=batch,
        kv_cache_type=kvct,
        flash_attention=flash_attention,
        graph_partial_bytes=graph_partial,
        graph_full_bytes=graph_full,
        notes=tuple(notes),
    )
