"""The memory model: what llama.cpp allocates for a model and a run config.

Follows llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36):
- context sizes: src/llama-context.cpp, llama_context::llama_context()
- KV cache:      src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache()
- SWA cache:     src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa()
- recurrent:     src/llama-memory-recurrent.cpp, llama_memory_recurrent::llama_memory_recurrent()
- output buffer: src/llama-context.cpp, llama_context::output_reserve()
- buffers:       ggml/src/ggml-alloc.c, ggml_backend_alloc_ctx_tensors_from_buft() (per-tensor padding)
The compute buffer has no closed form (ggml-alloc's greedy reuse): it is the largest of the graph's live
sets, each a closed form (kvadvise.planner.sizes), checked against llama.cpp's own allocation pass
(llama-fit-params, real-size layers of 20 families, tests/test_oracle.py) and published logs within 16 MiB or
3 %; one device's buffer (the CPU alone, a device, the host beside it) is kvadvise.planner.compute's, what routed
experts kept in host memory (--n-cpu-moe) add to the devices' and the host's kvadvise.planner.host_experts'. The
rules that moved between llama.cpp builds are kvadvise.planner.builds'. The context and the layers' shapes every
size reads are kvadvise.planner.layout's; the split over several devices is kvadvise.planner.split's (this module
puts them together with the rest in :func:`estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.errors import ConfigError
from kvadvise.model.architecture import ENCODER_ARCHS
from kvadvise.model.ggml import (
    ALIGNMENT,
    BLOCK,
    CUDA_FA_CACHE_TYPES,
    CUDA_FA_OLD_DEFAULT_TYPES,
    GGMLType,
    cuda_alloc_bytes,
    is_quantized,
    pad,
    row_bytes,
)
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner.compute import (
    compute_bytes,
    device_compute_bytes,
    host_compute_bytes,
    host_experts_device_compute,
    op_offload_growth,
    unpipelined_split_compute,
)
from kvadvise.planner.host_experts import (
    EXPERT_BIAS_GROWTH,
    biased_experts_grow,
    experts_moved,
    host_experts_device_growth,
    host_experts_host_compute_bytes,
    host_experts_split_compute,
    late_full_mask_bytes,
    late_full_mask_scores_bytes,
    without_routed_ffn,
)
from kvadvise.planner.layout import ContextLayout, layer_shapes
from kvadvise.planner.repack import AMX_BUFFER, REPACK_BUFFER, plan_repack
from kvadvise.planner.repack import RULES as REPACK_RULES
from kvadvise.planner.sizes import (
    GraphSizes,
    device_masks,
    expert_activation_bytes,
    f32_fa_mask,
    graph_sizes,
    reserve_outputs,
)
from kvadvise.planner.split import (
    N_COPIES,
    DeviceLayers,
    device_layers,
    gathers_in_last_block,
    layer_devices,
    output_host_bytes,
    output_layer_bytes,
    output_pad_bytes,
    split_compute,
    split_host_compute,
)

if TYPE_CHECKING:  # the projector's modules load only with --mmproj
    from kvadvise.model.projector import ProjectorSpec
    from kvadvise.planner.projector import ProjectorMemory

MIB = 1 << 20
CTX_PAD = 256  # GGML_PAD(n_ctx, 256), "ref: PR 17046"
OLD_CTX_PAD = 32  # before #17046 without flash attention: llama_kv_cache::get_padding (b6840)
FLASH_ATTN_MODES = ("on", "off", "auto")
DEVICES = ("auto", "cpu", "cuda", "metal", "rpc")
GPU_DEVICES = ("cuda", "metal", "rpc")  # devices that hold offloaded layers (not the CPU)
# the programs whose rules size the compute graph (RunConfig.runtime): llama-server; llama-cli; the library and
# its bindings (llama-completion, llama-bench, llama-cpp-python, LM Studio, Ollama's cgo runner)
RUNTIMES = ("llama-server", "llama-cli", "library")
# Buffer alignment: CPU TENSOR_ALIGNMENT = 32, CUDA CUDA_ALIGNMENT = 128 (ggml-cuda.cu).
# Per-device fixed cost outside llama.cpp's buffers. CPU: none. CUDA: the CUDA
# context and cuBLAS workspace, about 330 MiB measured by unsloth (issue #6718,
# see shared/peers.md); replaced by a measured value once `verify` has run.
# Metal: Ollama's MinimumMemory on Metal, the reserve it kept per device (ml/device.go; memory-spec §6), for
# the Metal context and its command buffers, which llama.cpp does not print as buffers.
OVERHEAD_BYTES = {"cpu": 0, "cuda": 330 * MIB, "metal": 512 * MIB, "rpc": 0}
# ggml_backend_sched_backend_id_from_cur (ggml-backend.cpp): an op whose weight sits in a host buffer runs on the first
# device whose offload_op wants it: CUDA/HIP (ggml-cuda.cu get_op_batch_size), Vulkan (ggml-vulkan.cpp, ne[1]) and Metal
# (MUL_MAT / MUL_MAT_ID only) at a batch of GGML_OP_OFFLOAD_MIN_BATCH rows or more; ggml-rpc has no offload_op
OP_OFFLOAD_MIN_BATCH = 32
OP_OFFLOAD_DEVICES = ("cuda", "metal")  # device kinds (Vulkan and ROCm plan as "cuda": their buffers by name)
DEVICE_PREFIX = {"cuda": "CUDA", "metal": "Metal", "rpc": "RPC"}
INT32_MAX = 2**31 - 1  # the largest -c, -np, -b, -ub llama.cpp takes


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What the user asks llama.cpp for, in llama.cpp's flag vocabulary."""

    n_ctx: int = 0  # -c; 0 = n_ctx_train
    n_parallel: int = 1  # -np, n_seq_max
    kv_unified: bool = False  # -kvu
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    type_k: GGMLType = GGMLType.F16  # -ctk
    type_v: GGMLType = GGMLType.F16  # -ctv
    flash_attn: str = "auto"  # -fa on|off|auto
    swa_full: bool = False  # --swa-full (llama-server's default is off)
    # where the layers go: cpu | cuda (full offload) | auto = the GPU when the plan has one (a budget),
    # else the CPU; the same default as the CLI's --device, so the API and the CLI plan alike
    device: str = "auto"
    overhead_bytes: int | None = None  # per-device fixed cost; None = OVERHEAD_BYTES[device] (or a calibration)
    # llama_context_params.n_outputs_max, the logits rows the compute graph is reserved for;
    # None = what ``runtime`` gives it.
    n_outputs_max: int | None = None
    # The program that runs the model (RUNTIMES): "llama-server" (and so Ollama >= 0.30) passes one
    # output row per slot (tools/server/server-context.cpp server_output_limits, ggml-org/llama.cpp#23861,
    # no speculative decoding), a llama-server built before that change the whole batch; "llama-cli" is
    # llama-server's context since ggml-org/llama.cpp#17824 (December 2025: tools/cli links llama-server-impl),
    # and before it the library's loop, which reserved the whole batch as the servers of its time did, so it
    # takes llama-server's rules at every build; "library" is llama-completion (the old llama-cli), llama-bench,
    # the library and its bindings (llama-cpp-python, node-llama-cpp, LM Studio, Ollama's cgo runner): the
    # library's default 0 = the whole batch.
    runtime: str = "llama-server"
    # llama.cpp -ts: the share of the layers each device gets (-sm layer). () = one device; with
    # several GPUs the planner passes their free memory, which is what llama.cpp splits by when
    # -ts is not given (llama_model::load_tensors).
    tensor_split: tuple[float, ...] = ()
    device_names: tuple[str, ...] = ()  # as llama.cpp prints them (CUDA0, RPC0[host:port]); () = numbered
    # llama.cpp -dev: the devices the model may use (common/arg.cpp --device); () = every one it finds
    devices: tuple[str, ...] = ()
    rpc_servers: tuple[str, ...] = ()  # llama-server --rpc HOST:PORT,...: the RPC hosts the devices are
    # the CPU's repack rule (kvadvise.planner.repack.RULES) for the weights a CPU plan keeps on the CPU;
    # "auto" = this machine's CPU, resolved by kvadvise.plan and the CLI (estimate() alone looks at no
    # hardware: no CPU_REPACK buffer); "off" = llama-server --no-repack; "none" = no repacked layout
    cpu_repack: str = "auto"
    # llama-server --mmproj FILE: a multimodal projector loaded beside the model, on the first device
    # (kvadvise.planner.projector)
    mmproj: ProjectorSpec | None = None
    # llama-server -md FILE: a draft model for speculative decoding, a second context on the same devices
    # (see draft_config); -ctkd / -ctvd: its cache types (common/arg.cpp, default f16)
    draft: ModelSpec | None = None
    type_k_draft: GGMLType = GGMLType.F16
    type_v_draft: GGMLType = GGMLType.F16
    # llama-server --spec-type draft-mtp: the model's own MTP/NextN blocks draft (kvadvise.planner.mtp), a
    # second context on the same weights; --spec-draft-n-max: the tokens drafted per step (default 3)
    mtp: bool = False
    spec_draft_n_max: int = 3
    # the llama.cpp build (bNNNN) the plan is for: its memory rules (kvadvise.planner.builds); None = not
    # known, planned by the newest rules (kvadvise.planner.builds). The API's default is the build whose
    # rules kvadvise follows (b11312); the CLI finds the installed one or says it does not know it.
    llama_build: int | None = builds.REFERENCE
    # op offload's copy of the largest weight kept on the CPU (--n-cpu-moe; kvadvise.planner.offload): the first
    # device's compute buffer holds it during that layer's matmul for prompt batches (compute.op_offload_growth)
    op_offload_copy_bytes: int = 0
    # --n-cpu-moe on a device that does not op-offload (ggml-rpc; a batch under 32): the experts run in CPU splits
    # and the first device's compute buffer grows at the boundaries (host_experts.host_experts_device_growth)
    host_experts: bool = False
    # whether llama_context may split the layers with pipeline parallelism (:func:`pipeline_parallel`): False for
    # a tensor override (-ot, --n-cpu-moe: llama_model::has_tensor_overrides) and for the fixed costs of a partial
    # offload (n_gpu_layers not above every layer), which llama.cpp never pipelines
    pipeline: bool = True
    # the output layer's weights stay in host memory: a build before builds.OUTPUT_FIRST given -ngl N <= n_layer (a
    # partial offload; Ollama 0.11-0.24's runners on a partial load). The first device op-offloads its matmul for a
    # prompt batch with a copy of output.weight beside the logits (memory.output_op_offload_bytes)
    output_on_host: bool = False
    # the sampler applies a repeat, presence or frequency penalty (llama-server --repeat-penalty, --presence-penalty,
    # --frequency-penalty; Ollama's repeat_penalty): each token costs the CPU a pass over the vocabulary
    # (speed.SAMPLER_PENALTY_S_PER_ENTRY); no memory
    sampling_penalties: bool = False
    # the context keeps each output's embedding beside its logits (llama_context_params.embeddings: Ollama's
    # llamarunner sets it, v0.18.2:llama/llama.go NewContextParams): the output buffer holds n_embd more floats a row
    embeddings: bool = False
    # -b = -ub chosen by the runtime from the whole context, not given (Ollama >= 0.30's automatic num_batch,
    # server/sched.go automaticGenerationBatch): steps of (the largest n_ctx, the batch), ascending, the last for every
    # larger context too (:func:`auto_batched`); () = n_batch and n_ubatch as given
    auto_batch: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        # llama.cpp reads -c, -np, -b, -ub as int32 (common/arg.cpp std::stoi); a larger number would be
        # refused there, or (through a binding) wrap, and the plan would describe another run
        for name in ("n_ctx", "n_parallel", "n_batch", "n_ubatch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT32_MAX:
                raise ConfigError(
                    f"{name} must be a whole number from 0 to {INT32_MAX:,} (llama.cpp's int32), got {v!r}"
                )
        self._check_types()
        if isinstance(self.spec_draft_n_max, bool) or not 0 <= self.spec_draft_n_max <= INT32_MAX:
            raise ConfigError(f"spec_draft_n_max must be from 0 to {INT32_MAX:,}, got {self.spec_draft_n_max!r}")
        if self.n_outputs_max is not None and not 0 <= self.n_outputs_max <= INT32_MAX:
            raise ConfigError(f"n_outputs_max must be from 0 to {INT32_MAX:,}, got {self.n_outputs_max!r}")
        if self.llama_build is not None and not 0 < self.llama_build <= INT32_MAX:
            raise ConfigError(f"llama_build must be a build number (bNNNN), got {self.llama_build!r}")
        if self.overhead_bytes is not None and (
            isinstance(self.overhead_bytes, bool) or not isinstance(self.overhead_bytes, int) or self.overhead_bytes < 0
        ):
            raise ConfigError(f"overhead_bytes must be a whole number of bytes >= 0, got {self.overhead_bytes!r}")
        if any(not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in self.tensor_split):
            # llama.cpp's -ts takes finite shares >= 0 (common/arg.cpp); nan split the layers 0/5
            raise ConfigError(f"tensor_split must be finite shares >= 0, got {self.tensor_split!r}")

    def _check_types(self) -> None:
        """Every other field of the type it is declared with (the Python API builds RunConfig by hand): a wrong one
        is a ConfigError naming it, not a TypeError from deep inside estimate()."""

        def whole(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def projector(v: object) -> bool:
            if v is None:
                return True
            from kvadvise.model.projector import ProjectorSpec  # loaded only where there is a projector

            return isinstance(v, ProjectorSpec)

        kinds: dict[str, tuple[str, Callable[[object], bool]]] = {
            "spec_draft_n_max": ("a whole number", whole),
            "n_outputs_max": ("a whole number or None", lambda v: v is None or whole(v)),
            "llama_build": ("a build number or None", lambda v: v is None or whole(v)),
            "op_offload_copy_bytes": ("a whole number of bytes", whole),
            # a cache type by its name ("q8_0") too: kvadvise.plan reads it as the CLI's -ctk does
            "type_k": ("a GGMLType or a cache type's name", lambda v: isinstance(v, (GGMLType, str))),
            "type_v": ("a GGMLType or a cache type's name", lambda v: isinstance(v, (GGMLType, str))),
            "type_k_draft": ("a GGMLType or a cache type's name", lambda v: isinstance(v, (GGMLType, str))),
            "type_v_draft": ("a GGMLType or a cache type's name", lambda v: isinstance(v, (GGMLType, str))),
            "mmproj": ("a ProjectorSpec (kvadvise.model.projector.projector_from_gguf) or None", projector),
            "draft": ("a ModelSpec (kvadvise.load_model) or None", lambda v: v is None or isinstance(v, ModelSpec)),
            "tensor_split": ("a tuple of numbers", lambda v: isinstance(v, tuple)),
            "auto_batch": (
                "a tuple of (n_ctx, batch) pairs of whole numbers",
                lambda v: (
                    isinstance(v, tuple)
                    and all(isinstance(x, tuple) and len(x) == 2 and all(whole(y) and y > 0 for y in x) for x in v)
                ),
            ),
        }
        for name in ("flash_attn", "device", "runtime", "cpu_repack"):
            kinds[name] = ("a string", lambda v: isinstance(v, str))
        for name in ("device_names", "devices", "rpc_servers"):
            kinds[name] = ("a tuple of strings", lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v))
        for name in (
            "kv_unified",
            "swa_full",
            "mtp",
            "host_experts",
            "pipeline",
            "output_on_host",
            "sampling_penalties",
        ):
            kinds[name] = ("True or False", lambda v: isinstance(v, bool))
        for name, (what, ok) in kinds.items():
            v = getattr(self, name)
            if not ok(v):
                raise ConfigError(f"{name} must be {what}, got {v!r}")

    @property
    def llama_n_outputs_max(self) -> int:
        """The llama_context_params.n_outputs_max llama.cpp is given for this config (0 = n_batch)."""
        if self.n_outputs_max is not None:
            return self.n_outputs_max
        if self.runtime == "library":
            return 0
        # a llama-server (or llama-cli) built before ggml-org/llama.cpp#23861 reserves the whole batch, as the
        # library does; an unknown build is planned as the newest (the plan's note says what an older one takes)
        old = builds.older_than(self.llama_build, builds.SERVER_OUTPUT_LIMITS)
        if old:
            return 0
        if self.mtp or self.draft is not None:  # server_output_limits: a row per slot and drafted token
            # (common_speculative_get_output_limits; a draft model's drafter, --spec-type draft-simple, as MTP's)
            return min(self.n_batch, self.n_parallel * (1 + self.spec_draft_n_max))
        return self.n_parallel


@dataclass(frozen=True, slots=True)
class CacheEstimate:
    """One KV cache as llama.cpp prints it (`llama_kv_cache: size = ...`)."""

    kind: str  # "kv" | "swa"
    cells: int  # per stream
    n_layers: int
    k_bytes: int
    v_bytes: int


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What one device that holds layers allocates (a GPU, or the CPU when it runs them)."""

    name: str  # as llama.cpp names its buffers: CUDA0, CPU
    n_layers: int  # as "offloaded N/M layers to GPU" counts them (the output layer is one)
    weights_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    compute_bytes: int
    overhead_bytes: int
    total_bytes: int
    projector_bytes: int = 0  # --mmproj: the projector's weights and compute buffer (in total_bytes)
    draft_bytes: int = 0  # -md: the draft context's buffers on this device (in total_bytes)


@dataclass(frozen=True, slots=True)
class HostMemory:
    """What a GPU run keeps in system RAM: token_embd, the graph inputs' compute buffer
    (CUDA_Host), the logits of the output buffer. All zero when the CPU runs the layers."""

    weights_bytes: int
    compute_bytes: int
    output_bytes: int
    total_bytes: int
    projector_bytes: int = 0  # --mmproj: the CPU compute buffer of its graph input (in total_bytes)
    draft_bytes: int = 0  # -md: the draft context's host buffers (in total_bytes)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What llama.cpp allocates for one run: caches, buffers, per device and on the host."""

    layout: ContextLayout
    caches: tuple[CacheEstimate, ...]
    k_bytes: int
    v_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    kv_bytes_per_token: int
    weights_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    total_bytes: int
    device_bytes: int  # what the device must hold: VRAM on cuda (full offload), RAM on cpu
    host_bytes: int  # what stays in system RAM besides (cuda: token_embd, inputs, logits); 0 on cpu
    devices: tuple[DeviceMemory, ...] = ()  # per device that holds layers (their sums are device_bytes)
    host: HostMemory = HostMemory(0, 0, 0, 0)
    repack_bytes: int = 0  # of weights_bytes: the extra buffers, CPU_REPACK and AMX (kvadvise.planner.repack)
    amx_bytes: int = 0  # of repack_bytes: the AMX buffer (an AVX-512 CPU with AMX)
    repacked_tensor_bytes: int = 0  # the repacked tensors' own bytes, out of the CPU buffer type (repack.moved_bytes)

    @property
    def extra_buffers(self) -> tuple[tuple[str, int], ...]:
        """The CPU's extra buffer types a CPU plan allocates, as llama.cpp names them, and their bytes: AMX's,
        then CPU_REPACK's (the rest of repack_bytes); 0 for a type the plan does not use."""
        return ((AMX_BUFFER, self.amx_bytes), (REPACK_BUFFER, self.repack_bytes - self.amx_bytes))

    projector: ProjectorMemory | None = None  # --mmproj (in the totals of the first device and the host)
    draft: MemoryEstimate | None = None  # -md: the draft model's own context (in the devices' and host totals)


def auto_batched(cfg: RunConfig, n_ctx_train: int = 0) -> RunConfig:
    """``cfg`` with the -b and -ub its runtime picks for its whole context (:attr:`RunConfig.auto_batch`; -c 0 is the
    training context, ``n_ctx_train``): the first step whose n_ctx holds it, else the last."""
    if not cfg.auto_batch:
        return cfg
    n_ctx = cfg.n_ctx or n_ctx_train
    batch = next((b for upto, b in cfg.auto_batch if n_ctx <= upto), cfg.auto_batch[-1][1])
    return cfg if cfg.n_batch == cfg.n_ubatch == batch else replace(cfg, n_batch=batch, n_ubatch=batch)


def resolve(spec: ModelSpec, cfg: RunConfig) -> ContextLayout:
    """llama_context::llama_context(): n_ctx, n_batch and n_ubatch as llama.cpp sets them (the runtime's own batch for
    the context where it picks one: :func:`auto_batched`)."""
    cfg = auto_batched(cfg, spec.n_ctx_train)
    if cfg.n_ctx < 0 or cfg.n_parallel < 1 or cfg.n_batch < 1 or cfg.n_ubatch < 1:
        raise ConfigError("n_ctx must be >= 0 and n_parallel, n_batch, n_ubatch >= 1")
    if cfg.n_outputs_max is not None and cfg.n_outputs_max < 0:
        raise ConfigError("n_outputs_max must be >= 0 (0 = n_batch)")
    if cfg.flash_attn not in FLASH_ATTN_MODES:
        raise ConfigError(f"flash_attn must be one of {', '.join(FLASH_ATTN_MODES)}, got {cfg.flash_attn!r}")
    if cfg.runtime not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, got {cfg.runtime!r}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {cfg.device!r}")
    if cfg.cpu_repack not in REPACK_RULES:
        raise ConfigError(f"cpu_repack must be one of {', '.join(REPACK_RULES)}, got {cfg.cpu_repack!r}")
    n_seq_max = cfg.n_parallel
    n_ctx = cfg.n_ctx or spec.n_ctx_train
    if n_ctx <= 0:
        raise ConfigError("the model does not say its training context; pass --ctx")
    # n_batch and n_ubatch are set before n_ctx is padded; "with causal attention, the batch size is limited by
    # the context size" (llama-context.cpp): an encoder's (causal_attn false) is not
    n_batch = cfg.n_batch if spec.architecture in ENCODER_ARCHS else min(n_ctx, cfg.n_batch)
    n_ubatch = min(n_batch, cfg.n_ubatch)
    n_outputs_max = cfg.llama_n_outputs_max or n_batch  # llama_context: "0 = n_batch"
    # builds before ggml-org/llama.cpp#17046 (kvadvise.planner.builds.SWA_PAD_256) pad both caches to
    # llama_kv_cache::get_padding(cparams) = flash_attn ? 256 : 32, cparams.flash_attn being "not disabled" when
    # the cache is made (auto counts as on; llama_model::create_memory, b6840); from #17046 on, always to 256
    old_pad = builds.older_than(cfg.llama_build, builds.SWA_PAD_256)
    fa_asked = "off" if spec.architecture == "grok" else cfg.flash_attn  # llama_init_from_model forces Grok's off
    n_pad = CTX_PAD if not old_pad or fa_asked != "off" else OLD_CTX_PAD
    if cfg.kv_unified:
        n_ctx = n_ctx_seq = pad(n_ctx, n_pad)
        n_stream = 1
    else:
        # old: ceil(n_ctx / n_seq_max) padded; #17046: GGML_PAD(n_ctx, 256) / n_seq_max padded ("rounding down")
        n_ctx_seq = pad(-(-n_ctx // n_seq_max), n_pad) if old_pad else pad(pad(n_ctx, n_pad) // n_seq_max, n_pad)
        n_ctx = n_ctx_seq * n_seq_max
        n_stream = n_seq_max
    flash_attn = _flash_attn(spec, cfg)
    n_ctx_swa = 0
    # a build before the sliding-window cache (builds.SWA_CACHE) holds those layers for the whole context: --swa-full
    swa_full = cfg.swa_full or builds.older_than(cfg.llama_build, builds.SWA_CACHE)
    if spec.has_swa:
        n_ctx_swa = n_ctx_seq
        if not swa_full:
            # llama_kv_cache_iswa: size_swa = GGML_PAD(min(size_base, n_swa*(unified ? n_seq_max : 1) + n_ubatch), 256);
            # before #17046: min(size_base, GGML_PAD(n_swa*(...) + n_ubatch, n_pad)) (b6840; a b6182 log without
            # flash attention prints 640 cells for gpt-oss at n_ubatch 512, b6699's with it 768)
            mult = n_seq_max if cfg.kv_unified else 1
            if old_pad:
                n_ctx_swa = min(n_ctx_seq, pad(spec.n_swa * mult + n_ubatch, n_pad))
            else:
                n_ctx_swa = pad(min(n_ctx_seq, spec.n_swa * mult + n_ubatch), n_pad)
    return ContextLayout(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_stream=n_stream,
        n_seq_max=n_seq_max,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_outputs_max=n_outputs_max,
        n_ctx_swa=n_ctx_swa,
        flash_attn=flash_attn,
        kv_unified=cfg.kv_unified,
        swa_full=swa_full,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        device="cpu" if cfg.device == "auto" else cfg.device,  # an estimate without hardware is the CPU's
        llama_build=cfg.llama_build,
        v_trans=fa_asked == "off",
    )


def _flash_attn(spec: ModelSpec, cfg: RunConfig) -> bool:
    """llama_init_from_model (src/llama-context.cpp): the checks it makes before the context exists."""
    fa = "off" if spec.architecture == "grok" else cfg.flash_attn  # "flash_attn is not compatible with Grok"
    if spec.is_mla and cfg.type_k != cfg.type_v:
        raise ConfigError(
            f"this model does not support different K ({cfg.type_k.type_name}) and V ({cfg.type_v.type_name}) cache types",
            hint="MLA models keep one compressed cache: give -ctk and -ctv the same type",
        )
    if is_quantized(cfg.type_v) and fa == "off":
        raise ConfigError(
            "quantized V cache requires flash attention",
            hint="use --flash-attn on (or auto), or an f16 V cache",
        )
    if is_quantized(cfg.type_v) and fa == "auto":
        fa = "on"  # llama_init_from_model: "enabling flash_attn since it is required for quantized V cache"
    if fa == "auto" and builds.older_than(cfg.llama_build, builds.FA_VALUE):
        fa = "off"  # before ggml-org/llama.cpp#15434 there is no auto: off unless -fa is given
    if fa == "auto" and auto_fa_missing(spec, cfg, cfg.type_k, cfg.type_v):
        fa = "off"  # llama_context::resolve_fused_ops: the FA probe lands on the CPU, auto -> disabled
    # enabled without a CUDA kernel (asked for, or forced by a quantized V), llama.cpp does not probe:
    # ggml_backend_sched runs every attention on the CPU; planned as flash attention, and the plan says so
    # (flash_attn_note)
    if fa != "off":  # auto resolves to on: the CPU and CUDA backends support FA for these head sizes
        heads = layer_shapes(spec).heads
        for name, t, idx in (("K", cfg.type_k, 0), ("V", cfg.type_v, 1)):
            blck = BLOCK[t][0]
            bad = sorted({h[idx] for h in heads if h[idx] % blck})
            if is_quantized(t) and bad:
                raise ConfigError(
                    f"{name} cache type {t.type_name} with block size {blck} does not divide the head size {bad[0]}",
                    hint="use f16, or a cache type whose block size divides the head size",
                )
    return fa != "off"


# ggml/src/ggml-cuda/fattn.cu (0c1e570): the K/V types with a kernel (model.ggml.CUDA_FA_CACHE_TYPES) and
# the head sizes ggml_cuda_get_best_fattn_kernel takes: K == V from this set, or the pairs below with a GQA ratio
# (n_head / n_head_kv) that is a multiple of the number given (the "gqa_opt" kernels; 2 = any ratio >= 2)
_CUDA_FA_HEADS = frozenset({40, 64, 72, 80, 96, 112, 128, 256})
_CUDA_FA_GQA_PAIRS = {(192, 128): 8, (320, 256): 32, (512, 512): 2, (576, 512): 2}


_CUDA_FA_OLD_QUANT_HEAD = 128  # before builds.FA_QUANT_ANY_HEAD: a quantized K or V at this head size only
_NOT_CUDA_KERNELS = ("Vulkan", "SYCL")  # cards planned as "cuda" whose backend has kernels of its own


def cuda_fattn_decides(cfg: RunConfig) -> bool:
    """Whether CUDA's flash-attention kernels (ggml-cuda fattn.cu; HIP compiles the same file for ROCm) decide
    where the attention runs: a GPU plan whose devices are not named after Vulkan or SYCL (an Intel or AMD card
    through those backends plans as "cuda" with its own buffer names, kvadvise.planner.planning; ggml-vulkan's
    supports_op takes other types and pairs, not modelled here)."""
    return cfg.device == "cuda" and not any(n.startswith(_NOT_CUDA_KERNELS) for n in cfg.device_names)


def auto_fa_missing(spec: ModelSpec, cfg: RunConfig, type_k: GGMLType, type_v: GGMLType) -> str | None:
    """Why ``-fa auto`` finds no CUDA flash-attention kernel for this cache at the plan's build (None: it is not
    auto, CUDA's kernels do not decide, or there is one): llama.cpp then resolves it off unless a quantized V cache
    forced it on (llama_init_from_model) first."""
    if cfg.flash_attn != "auto" or not cuda_fattn_decides(cfg):
        return None
    return cuda_flash_attn_missing(spec, type_k, type_v, cfg.llama_build)


def cuda_flash_attn_missing(
    spec: ModelSpec, type_k: GGMLType, type_v: GGMLType, llama_build: int | None = None
) -> str | None:
    """Why CUDA has no flash-attention kernel for this model and cache at ``llama_build`` (None: the newest;
    returns None where it has one). Without one, FA "auto" resolves to off (llama_context::resolve_fused_ops: the
    op lands on the CPU) and "on" runs every attention on the CPU: DeepSeek-V2-Lite's pre-MLA GGUFs (K head 192,
    V 128, no GQA), an iq4_nl cache; before b11312 a K type other than V's, or q4_1/q5_0/q5_1; before b6646 a
    quantized cache at any head size but 128 (builds.FA_KV_ANY_PAIR, builds.FA_QUANT_ANY_HEAD)."""
    for name, t in (("K", type_k), ("V", type_v)):
        if t not in CUDA_FA_CACHE_TYPES:
            return f"no kernel reads a {t.type_name} {name} cache"
    # said by the rule's build, not the plan's: an Ollama release's llama.cpp is planned by a bound (b6301 for
    # e54d41bef), which would read as its build
    for name, t in (("K", type_k), ("V", type_v)):
        since = {GGMLType.F32: builds.FA_F32, GGMLType.BF16: builds.FA_BF16}.get(t, 0)
        if builds.older_than(llama_build, since):
            return f"llama.cpp before b{since} has no kernel for a {t.type_name} {name} cache"
    if builds.older_than(llama_build, builds.FA_KV_ANY_PAIR):
        for name, t in (("K", type_k), ("V", type_v)):
            if t not in CUDA_FA_OLD_DEFAULT_TYPES:
                return (
                    f"a default CUDA build of llama.cpp before b{builds.FA_KV_ANY_PAIR} has no kernel for a "
                    f"{t.type_name} {name} cache"
                )
        if type_k != type_v:
            return (
                f"a default CUDA build of llama.cpp before b{builds.FA_KV_ANY_PAIR} has kernels for one type in K "
                f"and V only, not {type_k.type_name}/{type_v.type_name}"
            )
    old_heads = builds.older_than(llama_build, builds.FA_QUANT_ANY_HEAD)
    for il in range(spec.n_layer):
        if not spec.kv_layers[il]:
            continue
        dk = spec.n_embd_head_k_swa if spec.swa_layers[il] else spec.n_embd_head_k
        dv = spec.n_embd_head_v_swa if spec.swa_layers[il] else spec.n_embd_head_v
        gqa = spec.n_head[il] // max(1, spec.n_head_kv[il])
        if old_heads and (is_quantized(type_k) or is_quantized(type_v)) and not dk == dv == _CUDA_FA_OLD_QUANT_HEAD:
            return (
                f"llama.cpp before b{builds.FA_QUANT_ANY_HEAD} has kernels for a quantized cache at head size 128 "
                f"only, not {dk}"
            )
        if dk == dv and dk in _CUDA_FA_HEADS:
            continue
        step = _CUDA_FA_GQA_PAIRS.get((dk, dv))
        if step is not None and gqa >= 2 and gqa % step == 0:
            continue
        return f"K head {dk} / V head {dv} at a GQA ratio of {gqa}"
    return None


def _no_fa_kernel(spec: ModelSpec, cfg: RunConfig) -> tuple[str, bool] | None:
    """Where CUDA has no flash-attention kernel for the plan's model and cache at its build: why, and whether the
    attention then runs on the CPU (on, or forced on by a quantized V cache: ggml_backend_sched gives the op to the
    CPU) or not (auto with an f16 V cache resolves off, llama_context::resolve_fused_ops); None where it has one,
    or flash attention is off, or CUDA's kernels do not decide (:func:`cuda_fattn_decides`)."""
    if not cuda_fattn_decides(cfg) or cfg.flash_attn == "off":
        return None
    missing = cuda_flash_attn_missing(spec, cfg.type_k, cfg.type_v, cfg.llama_build)
    if missing is None:
        return None
    return missing, not (cfg.flash_attn == "auto" and not is_quantized(cfg.type_v))


def attention_on_cpu(spec: ModelSpec, cfg: RunConfig) -> bool:
    """Flash attention runs on the CPU: no CUDA kernel for the model and cache, and on (:func:`_no_fa_kernel`)."""
    found = _no_fa_kernel(spec, cfg)
    return found is not None and found[1]


def flash_attn_note(spec: ModelSpec, cfg: RunConfig) -> str | None:
    """What a plan says when CUDA has no flash-attention kernel for the model and its cache."""
    found = _no_fa_kernel(spec, cfg)
    if found is None:
        return None
    missing, on_cpu = found
    if not on_cpu:
        return (
            f"flash attention off: CUDA has no kernel for this model ({missing}; ggml-cuda fattn.cu), so "
            "llama.cpp's auto resolves it off (llama_context::resolve_fused_ops): the attention scores take "
            "n_kv x n_ubatch x n_head floats, and as the cache was made for flash attention each layer copies its "
            "V transposed beside them (build_attn_mha): --flash-attn off saves that copy"
        )
    return (
        f"flash attention is on but CUDA has no kernel for it ({missing}; ggml-cuda fattn.cu): llama.cpp runs "
        "every attention on the CPU, and copies each layer's K and V to host memory for it each token (the "
        "decode estimate counts the copy over PCIe and the CPU's read; the host memory it takes is not in these "
        "figures); use a cache it has a kernel for, or --flash-attn off with an f16 V cache (auto turns it off "
        "too, but after making the cache for it, so each layer copies its V transposed)"
    )


def _tensor_alloc(device: str, t: GGMLType, ne0: int, n_bytes: int) -> int:
    """ggml_backend_buft_get_alloc_size, padded to the buffer alignment."""
    if device == "cuda":
        return cuda_alloc_bytes(t, ne0, n_bytes)
    return pad(n_bytes, ALIGNMENT[device])


def kv_shape_bytes(spec: ModelSpec, lay: ContextLayout) -> dict[tuple[bool, int, int] | None, tuple[int, int]]:
    """(K, V) bytes of a layer of each distinct shape (:attr:`LayerShapes.keys`; None: no KV): tensors
    [n_embd_k_gqa, cells, n_stream] (llama_kv_cache ctor). Layers mostly share a shape: each is sized once."""
    shapes = layer_shapes(spec)
    has_swa = spec.has_swa
    mla_v = _mla_keeps_v(lay)
    sizes: dict[tuple[bool, int, int] | None, tuple[int, int]] = {None: (0, 0)}
    for key, _n in shapes.counts:
        swa, nk, nv_fa = key
        cells = lay.n_ctx_swa if has_swa and swa else lay.n_ctx_seq
        # MLA: has_v = !is_mla, V is a view into K (builds before #19067 kept a V, kvadvise.planner.builds);
        # v_trans (FA off) pads V to the widest layer
        nv = -1 if spec.is_mla and not mla_v else shapes.v_max if lay.v_trans else nv_fa
        k = _tensor_alloc(lay.device, lay.type_k, nk, row_bytes(lay.type_k, nk) * cells * lay.n_stream)
        v = 0 if nv < 0 else _tensor_alloc(lay.device, lay.type_v, nv, row_bytes(lay.type_v, nv) * cells * lay.n_stream)
        sizes[key] = (k, v)
    return sizes


def layer_kv_bytes(spec: ModelSpec, lay: ContextLayout) -> tuple[tuple[int, int], ...]:
    """(K, V) bytes of each layer."""
    sizes = kv_shape_bytes(spec, lay)
    return tuple(sizes[key] for key in layer_shapes(spec).keys)


def _mla_keeps_v(lay: ContextLayout) -> bool:
    """Builds before ggml-org/llama.cpp#19067 allocated an MLA model's V (kv_lora_rank wide) beside K."""
    return builds.older_than(lay.llama_build, builds.MLA_V_LESS)


def kv_caches(
    spec: ModelSpec,
    lay: ContextLayout,
    sizes: dict[tuple[bool, int, int] | None, tuple[int, int]] | None = None,
) -> tuple[CacheEstimate, ...]:
    """The caches llama.cpp creates: one, or two with sliding-window layers (iSWA: non-SWA first).
    ``sizes``: :func:`kv_shape_bytes`, when the caller has it."""
    if sizes is None:
        sizes = kv_shape_bytes(spec, lay)
    shapes = layer_shapes(spec)
    groups = [("kv", lay.n_ctx_seq, shapes.kv_group, shapes.kv_counts)]
    if spec.has_swa:
        groups.append(("swa", lay.n_ctx_swa, shapes.swa_group, shapes.swa_counts))
    out = []
    for kind, cells, layers, counts in groups:
        if layers:
            k = sum(n * sizes[key][0] for key, n in counts)
            v = sum(n * sizes[key][1] for key, n in counts)
            out.append(CacheEstimate(kind, cells, len(layers), k, v))
    return tuple(out)


def kv_bytes_per_token(spec: ModelSpec, lay: ContextLayout) -> int:
    """Growth of the KV cache per extra token of context (SWA layers only grow with --swa-full)."""
    shapes = layer_shapes(spec)
    has_swa = spec.has_swa
    total = 0
    for (swa, nk, nv_fa), n in shapes.counts:
        if has_swa and swa and not lay.swa_full:
            continue
        row = row_bytes(lay.type_k, nk)
        if not spec.is_mla or _mla_keeps_v(lay):
            row += row_bytes(lay.type_v, shapes.v_max if lay.v_trans else nv_fa)
        total += n * row
    return total


def recurrent_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """R and S tensors, f32, n_embd_r/s * max(1, n_seq_max) cells per recurrent layer."""
    cells = max(1, lay.n_seq_max)
    n = sum(spec.recurrent_layers)
    r = pad(spec.n_embd_r * 4 * cells, ALIGNMENT[lay.device]) if spec.n_embd_r else 0
    s = pad(spec.n_embd_s * 4 * cells, ALIGNMENT[lay.device]) if spec.n_embd_s else 0
    return n * (r + s)


def output_bytes(spec: ModelSpec, lay: ContextLayout, *, embeddings: bool = False) -> int:
    """llama_context::output_reserve: logits for n_seq_max outputs (one per sequence), f32, and with ``embeddings``
    (cparams.embeddings) each output's [n_embd] f32 beside them: gemma2:2b under Ollama 0.18.2's llamarunner, 2 slots,
    printed 1.97 MiB ((256,000 + 2,304) x 2 x 4 B)."""
    return (spec.n_vocab + (spec.n_embd if embeddings else 0)) * 4 * lay.n_seq_max


def cpu_layers_attention_bytes(spec: ModelSpec, lay: ContextLayout, cpu_layers: range) -> int:
    """The first GPU's compute buffer while it runs the attention of a layer left on the CPU (a partial -ngl plan,
    prompt batches), masks and all; 0 where nothing is op-offloaded.

    ggml_backend_sched_split_graph (ggml-backend.cpp, 0c1e570): the layer's matmuls go to the GPU (op offload, cause
    "1.off"), and the ops between them follow (pass 2, "expand gpu down"); ggml_backend_sched_backend_id_from_cur
    skips FLASH_ATTN_EXT and ROPE when it looks for weights, and the cache is no weight, so the attention runs on
    the GPU too, while the K and V rows are written (SET_ROWS) on the CPU, into the host cache. The attention's split
    then starts with a copy of the views it reads: the layer's whole K and V (n_kv cells, in the cache's type), in
    the GPU's compute buffer. Where ggml-alloc's best fit has placed the layer's own tensors in the space those copies
    would take, one of them lands above: the same with one CPU layer or fourteen (Qwen3 0.6B at 65,536 cells: 461.12
    MiB, the masks, the attention and the two copies being 334), which the node order decides: Qwen2/3, Phi-3,
    Command-R and Granite land up to one copy above, Llama, Gemma 2/3 and Cohere2 none. Planned as one copy more. The
    same run on a loopback device that op-offloads as CUDA does (benchmarks/bench_op_offload.py): nine architectures
    with 1 to 24 layers on the CPU, 8k-64k cells, f16 and q8_0 caches, never under (Qwen3 0.6B: 462.00 planned;
    92.5 before), at most 44 % over where no copy lands above. A device that can read host memory (Metal) copies
    nothing. A hybrid (recurrent layers first) is :func:`_hybrid_cpu_attention_bytes`'s."""
    if lay.device != "cuda" or lay.n_ubatch < OP_OFFLOAD_MIN_BATCH:
        return 0
    kv = layer_kv_bytes(spec, lay)
    attn_layers = [il for il in cpu_layers if il < len(kv) and spec.kv_layers[il] and kv[il][0] + kv[il][1] > 0]
    if not attn_layers:
        return 0
    s = graph_sizes(spec, lay)
    masks = device_masks(s, lay)
    if any(spec.recurrent_layers):
        return _hybrid_cpu_attention_bytes(spec, lay, s, masks, list(cpu_layers), attn_layers, kv)
    views = [kv[il] for il in attn_layers]
    copies = max(k + v for k, v in views) + max(max(k, v) for k, v in views)
    return pad(masks + s.attn_bytes + copies + s.layer_inputs_bytes, ALIGNMENT["cuda"])


def _hybrid_cpu_attention_bytes(
    spec: ModelSpec,
    lay: ContextLayout,
    s: GraphSizes,
    masks: int,
    cpu_layers: list[int],
    attn_layers: list[int],
    kv: tuple[tuple[int, int], ...],
) -> int:
    """:func:`cpu_layers_attention_bytes` for a hybrid (recurrent layers before its first attention layer), whose
    first CPU attention layer is where the GPU first reads the KQ mask.

    ggml_backend_sched_split_graph (ggml-backend.cpp b11312) starts that layer's attention split with copies of its
    inputs, allocated by ggml-alloc in the order the split reads them, above the live set the layers before left:
    the layer's K and V views, then the mask (tensor_id_copy: the same copy serves every later split of the GPU, so
    it stays there until the last attention layer). A later CPU attention layer's K/V copies, or a later CPU
    layer's weight copy, that does not fit in the holes below it lands above it. Before #23764 (builds.F16_MASK_FA)
    the split reads the f32 mask input first (its ggml_cast to f16 is the split's first node): the f32 copy, K, V,
    then the f16 cast above them, and the hole the f32 copy leaves takes what comes later.

    The live set below is the attention's (sizes.graph_sizes attn_bytes) with the holes the earlier CPU layers'
    weight copies left: planned as the largest of those copies (measured 28 to 56 MiB over attn_bytes where that
    copy is 47.81 or 176 MiB; the 56, at -ub 2048, leaves the plan 8 MiB under, 0.3 %). Measured with llama-fit-params b11312 over a loopback device that op-offloads as CUDA does
    (benchmarks/bench_op_offload.py; tests/test_op_offload_hybrid.py), -ngl 26, 131,072 f16 cells: Qwen3.5-27B's
    shape 997.81 MiB at -ub 512 (planned 997.81) and, with the f32 mask of builds before #23764, 1415.81 at -ub 1024
    (planned 1435.81; the RTX 4070 log of b8586 printed 1401.75, tests/test_attack_round20d.py)."""
    first = attn_layers[0]
    k, v = kv[first]
    largest = spec.layer_largest_tensor_bytes
    before = max((largest[il] for il in cpu_layers if il < first and il < len(largest)), default=0)
    below = s.attn_bytes + before
    if f32_fa_mask(lay):
        above = s.mask_cells * lay.n_ubatch * 4  # the f32 input's copy, read by the cast
    else:
        later_kv = [max(kv[il]) for il in attn_layers[1:]]
        later_weights = [largest[il] for il in cpu_layers if il > first and il < len(largest)]
        above = max([*later_kv, *later_weights], default=0)
    return pad(below + k + v + masks + above + s.layer_inputs_bytes, ALIGNMENT["cuda"])


def output_op_offload_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The first device's compute buffer at the output layer when its weights stay in host memory
    (RunConfig.output_on_host) and the device op-offloads its matmul: a copy of output.weight (as the device's
    buffer sizes it), the logits of the reserved rows and the normed hidden state (ggml-backend.cpp
    ggml_backend_sched_split_graph: the weight is an input of the device's split, copied into its compute buffer).
    Printed to the 0.01 MiB by an Ollama 0.13.5-0.24 load of qwen2.5:7b Q4_K_M on a P40 with 27 of 28 blocks on the
    GPU (730.36 MiB = 426.36 of Q6_K output.weight + 297.00 of logits for 512 rows + 7.00) and by llama-cli b6182 on
    Vulkan, gpt-oss-20b at -ngl 24 of 24 blocks (985.20 = 586.82 of Q8_0 + 392.75 + 5.625; tests/data/published 020,
    021, 032). 0 where nothing is op-offloaded (ggml-rpc, a CPU plan, fewer than 32 rows): the CPU runs the output
    layer."""
    rows = reserve_outputs(lay)
    if lay.device not in OP_OFFLOAD_DEVICES or rows < OP_OFFLOAD_MIN_BATCH or not spec.n_vocab:
        return 0
    copy = (spec.output_bytes or spec.tok_embd_bytes) + (output_pad_bytes(spec) if lay.device == "cuda" else 0)
    # the logits as allocated here, not above the holes a last MoE or MLA layer leaves (sizes.graph_sizes): the
    # copy comes first, and gpt-oss-20b's 985.20 MiB has no such row
    logits, normed = 4 * rows * spec.n_vocab, 4 * rows * spec.n_embd
    return pad(copy + logits + normed, ALIGNMENT[lay.device])


def output_layer_compute_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The compute buffer of a device that holds the output layer and no repeating layer (-ngl 1), when it
    does not op-offload the layers kept on the CPU (ggml-rpc has no offload_op): the output phase alone, the
    logits of the reserved rows and up to two rows of n_embd (the hidden state copied in and its norm).
    Measured with llama-fit-params b11312 on an RPC device: Gemma 3 270M 513.25 MiB (512 of logits, one row),
    a small qwen3next 3.0 MiB (1 of logits, two rows). Where the last block (on the CPU) gathers fewer output rows than
    the batch, only those rows come in (split.split_compute's output layer alone: llama-server b11312, a qwen3moe at
    -ngl 1 -ub 2048: 0.04 MiB printed, 24 planned before)."""
    if gathers_in_last_block(spec) and reserve_outputs(lay) < lay.n_ubatch:
        return split_compute(spec, lay, DeviceLayers((), True, 0, 1, spec), copies=1)
    s = graph_sizes(spec, lay)
    return pad(s.logits_bytes + 2 * s.embd_bytes, ALIGNMENT["cuda"])


# the hybrids whose last block ends in a gated shared expert and gathers the output rows after the layer loop
# (src/models/qwen3next.cpp, qwen35moe.cpp b11312): the ops after its last weight add three rows
_SHARED_TAIL = frozenset({"qwen3next", "qwen35moe"})


def output_layer_alone_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The compute buffer of a device that holds the output layer and no repeating layer (-ngl 1, one device), when it
    does not op-offload (ggml-rpc): the output phase (:func:`output_layer_compute_bytes`) and what it takes in from the
    last block, which ran on the CPU.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp b11312, "expand gpu up") gives the weightless ops between
    the last block's last weight and output_norm to the output layer's device, which copies their inputs in
    (GGML_SCHED_DEBUG=2); ggml-alloc runs their adds in place (ggml_op_can_inplace) and frees the copies after them:
    - qwen3next / qwen35moe (a gated shared expert, the rows gathered after the loop): the routed experts' sum
      (ffn_moe_out), the shared expert's output (ffn_shexp), its gate ([1, n_ubatch]) and the residual (attn_residual):
      three [n_embd, n_ubatch] f32, the output phase's three rows, the logits above them. No experts' output comes in:
      the routed sum runs on the CPU before the shared expert's weights (llama-server b11312 over an rpc-server,
      Qwen3.5-35B-A3B's widths at 16k: 48.01 / 12.00 MiB printed at -ub 2048 / 512, 240.09 / 60.05 planned before
      with one and a half [n_embd, n_expert_used, n_ubatch] beside; llama-fit-params, n_ubatch logits rows: 110.51 =
      48 + 62.5 of logits);
    - gpt-oss (biased routed experts, no shared expert, the rows gathered after the loop): the down projection's
      output after its bias (the ADD_ID on the CPU with the bias), [n_embd, n_expert_used, n_ubatch] f32, with the
      router's weights [n_expert_used, n_ubatch] and the residual; the weighted sum makes one more row (a view's sum
      is not in place): one output and two rows, the output phase in the output's hole once it is freed (gpt-oss-20b's
      widths: 135.03 / 33.76 MiB printed at -ub 2048 / 512; 8 of 16 experts of 512 beside n_embd 1024: 80.06 /
      20.02; one and a half outputs and the output phase planned before: 202.59 / 50.67 and 120.09 / 30.05);
    - any other MoE: the output phase and one and a half of the last block's experts' output at the rows its
      feed-forward runs (offload.partial_offload's ``last_out``: a qwen3moe's last block gathers first, 0.04 MiB).
    """
    phase = output_layer_compute_bytes(spec, lay)
    if not spec.n_expert:
        return phase
    ub, rows = lay.n_ubatch, reserve_outputs(lay)
    eu = expert_activation_bytes(spec, ub)[1]
    if gathers_in_last_block(spec):
        return phase + eu * rows // ub * 3 // 2
    if spec.architecture in _SHARED_TAIL and spec.n_ff_shexp:
        return phase
    if spec.architecture in EXPERT_BIAS_GROWTH and not spec.n_ff_shexp:
        s = graph_sizes(spec, lay)
        logits = 4 * rows * spec.n_vocab
        weights, ids = 4 * spec.n_expert_used * ub, 4 * rows
        # the logits go into the freed output's hole where they fit (llama-fit-params' n_ubatch rows: 62.5 MiB in 90)
        return pad(eu + 2 * s.embd_bytes + weights + ids + (logits if logits > eu else 0), ALIGNMENT["cuda"])
    return phase + eu * 3 // 2


def validate(spec: ModelSpec, cfg: RunConfig) -> None:
    """Raise the ConfigError :func:`estimate` would raise for ``cfg``, without sizing anything: llama.cpp's
    checks of the context and its cache types (:func:`resolve`), the tensor split, the draft's own."""
    lay = resolve(spec, cfg)
    # a cache row the type's blocks do not divide (3 heads of 85: K rows of 255 in q8_0's blocks of 32, flash
    # attention off): ggml_row_size asserts in llama_kv_cache's ctor; the recommendation passes such a type
    # over (policy.choices) instead of proposing it and failing (one row size per distinct layer shape)
    kv_shape_bytes(spec, lay)
    layer_devices(spec.n_layer_all, cfg.tensor_split)
    if cfg.draft is not None:
        validate(cfg.draft, draft_config(cfg, lay))
    if cfg.mtp:
        from kvadvise.planner import mtp

        mtp.check(spec, cfg.llama_build)
        validate(mtp.context_spec(spec), mtp_context_config(cfg, lay))


def mla_as_built(spec: ModelSpec, llama_build: int | None) -> ModelSpec:
    """An MLA model as a build before the compressed MLA cache (builds.MLA_CACHE) runs it: the older conversion,
    K and V cached per head (n_head KV heads of qk_nope + qk_rope and of v_head_dim), the attention of a deepseek2
    GGUF without the MLA keys (src/models/deepseek2.cpp, !is_mla); the model itself where the build has it."""
    if not spec.is_mla or not builds.older_than(llama_build, builds.MLA_CACHE) or not spec.n_embd_head_k_mla:
        return spec
    n_head_kv = tuple(h if kv else 0 for h, kv in zip(spec.n_head, spec.kv_layers, strict=True))
    return replace(
        spec,
        is_mla=False,
        n_head_kv=n_head_kv,
        n_embd_head_k=spec.n_embd_head_k_mla,
        n_embd_head_v=spec.n_embd_head_v_mla,
        n_embd_head_k_swa=spec.n_embd_head_k_mla,
        n_embd_head_v_swa=spec.n_embd_head_v_mla,
    )


def estimate(spec: ModelSpec, cfg: RunConfig) -> MemoryEstimate:
    spec = mla_as_built(spec, cfg.llama_build)
    target = spec
    if cfg.mtp:  # the NextN blocks load with the model (load_mtp): kvadvise.planner.mtp
        from kvadvise.planner import mtp

        mtp.check(spec, cfg.llama_build)
        spec = mtp.with_nextn_weights(spec)
    lay = resolve(spec, cfg)
    sizes = kv_shape_bytes(spec, lay)
    caches = kv_caches(spec, lay, sizes)
    k = sum(c.k_bytes for c in caches)
    v = sum(c.v_bytes for c in caches)
    rs = recurrent_bytes(spec, lay)
    out = output_bytes(spec, lay, embeddings=cfg.embeddings)
    overhead = cfg.overhead_bytes if cfg.overhead_bytes is not None else OVERHEAD_BYTES[lay.device]
    repack = amx = moved = 0
    if lay.device == "cpu":
        compute = compute_bytes(spec, lay)
        cpu_weights = spec.weights_bytes
        if REPACK_RULES[cfg.cpu_repack]:  # the mapped span left beside the CPU_REPACK copies, and those copies
            r = plan_repack(spec, cfg.cpu_repack)
            cpu_weights, repack, amx, moved = (
                r.mapped_bytes + r.repack_bytes,
                r.repack_bytes,
                r.amx_bytes,
                r.moved_bytes,
            )
        total = cpu_weights + k + v + rs + compute + out + overhead
        devices: tuple[DeviceMemory, ...] = (
            DeviceMemory("CPU", spec.n_layer + 1, cpu_weights, k + v, rs, compute, overhead, total),
        )
        host = HostMemory(0, 0, 0, 0)
    else:
        devices, host = _offloaded(spec, cfg, lay, caches, sizes, rs, out, overhead)
    proj = None
    if cfg.mmproj is not None:
        from kvadvise.planner.projector import projector_memory

        proj = projector_memory(cfg.mmproj, lay.device, flash_attn=lay.flash_attn)
        devices, host = _with_projector(devices, host, proj)
    draft = None
    if cfg.draft is not None:
        draft = estimate(cfg.draft, draft_config(cfg, lay))
        devices, host = _with_draft(devices, host, draft)
    elif cfg.mtp:  # the MTP context: common_speculative_init_result, on the target's weights
        draft = estimate(mtp.context_spec(target), mtp_context_config(cfg, lay))
        devices, host = _with_draft(devices, host, draft)
    device_total = sum(d.total_bytes for d in devices)
    return MemoryEstimate(
        layout=lay,
        caches=caches,
        k_bytes=k,
        v_bytes=v,
        kv_bytes=k + v,
        recurrent_bytes=rs,
        kv_bytes_per_token=kv_bytes_per_token(spec, lay),
        weights_bytes=sum(d.weights_bytes for d in devices) + host.weights_bytes,
        compute_bytes=sum(d.compute_bytes for d in devices) + host.compute_bytes,
        output_bytes=out,
        overhead_bytes=sum(d.overhead_bytes for d in devices),
        total_bytes=device_total + host.total_bytes,
        device_bytes=device_total,
        host_bytes=host.total_bytes,
        devices=devices,
        host=host,
        repack_bytes=repack,
        amx_bytes=amx,
        repacked_tensor_bytes=moved,
        projector=proj,
        draft=draft,
    )


def draft_config(cfg: RunConfig, lay: ContextLayout) -> RunConfig:
    """The draft model's context as llama-server creates it (common/speculative.cpp,
    common_base_params_to_speculative and common_speculative_init_result, llama.cpp 0c1e570): the main
    parameters (batch, ubatch, slots, unified cache, flash attention, --swa-full, devices and -ts) with
    the draft's cache types (-ctkd/-ctvd), n_outputs_max = the slots, and n_ctx = the main context's
    resolved size (llama_n_ctx(ctx_tgt)); no projector, no second draft; the same process, so no
    second per-device overhead. The draft model has tensor overrides of its own (-otd, --n-cpu-moe-draft: none
    by default), not the main model's: no op-offload copy, no host experts, pipelined as any full offload."""
    return replace(
        cfg,
        n_ctx=lay.n_ctx,
        type_k=cfg.type_k_draft,
        type_v=cfg.type_v_draft,
        n_outputs_max=cfg.n_parallel,
        mmproj=None,
        draft=None,
        mtp=False,
        overhead_bytes=0,
        op_offload_copy_bytes=0,
        host_experts=False,
        pipeline=True,
    )


def _with_draft(
    devices: tuple[DeviceMemory, ...], host: HostMemory, d: MemoryEstimate
) -> tuple[tuple[DeviceMemory, ...], HostMemory]:
    """The draft context's buffers added to each device it shares (split as the main model) and to RAM."""
    if len(d.devices) != len(devices):
        raise ConfigError(f"the draft model is split over {len(d.devices)} devices, the model over {len(devices)}")
    out = tuple(
        replace(m, draft_bytes=x.total_bytes, total_bytes=m.total_bytes + x.total_bytes)
        for m, x in zip(devices, d.devices, strict=True)
    )
    return out, replace(host, draft_bytes=d.host.total_bytes, total_bytes=host.total_bytes + d.host.total_bytes)


def _with_projector(
    devices: tuple[DeviceMemory, ...], host: HostMemory, p: ProjectorMemory
) -> tuple[tuple[DeviceMemory, ...], HostMemory]:
    """The projector on the first device (its weights and compute buffer), its input buffer in RAM."""
    on_device = p.weights_bytes + p.compute_bytes
    first = replace(devices[0], projector_bytes=on_device, total_bytes=devices[0].total_bytes + on_device)
    host = replace(host, projector_bytes=p.host_compute_bytes, total_bytes=host.total_bytes + p.host_compute_bytes)
    return (first, *devices[1:]), host


def pipeline_parallel(cfg: RunConfig, names: tuple[str, ...]) -> bool:
    """Whether llama.cpp splits a full offload over several devices with pipeline parallelism, keeping
    GGML_SCHED_MAX_COPIES copies of each split's inputs (llama_context::llama_context, b11312): not with tensor
    overrides (``-ot``, ``--n-cpu-moe``: llama_model::has_tensor_overrides), and only where every device but the
    CPU reports async compute and events (ggml_backend_dev_props caps): CANN and OpenCL never, RPC and Vulkan from
    the builds in kvadvise.planner.builds (RPC_EVENTS, VULKAN_EVENTS), CUDA, ROCm, SYCL and Metal unless built
    with GGML_CUDA_NO_PEER_COPY / GGML_SYCL_NO_PEER_COPY (not known here: planned with it, the larger figure); a
    BLAS backend beside them (an ACCEL device without async) turns it off too: not modelled (the larger figure)."""
    if not cfg.pipeline or cfg.host_experts or cfg.op_offload_copy_bytes:
        return False
    for name in names:
        if name.startswith(("CANN", "OpenCL", "GPUOpenCL")):
            return False
        if name.startswith("RPC") and builds.older_than(cfg.llama_build, builds.RPC_EVENTS):
            return False
        if name.startswith("Vulkan") and builds.older_than(cfg.llama_build, builds.VULKAN_EVENTS):
            return False
    return True


def _offloaded(
    spec: ModelSpec,
    cfg: RunConfig,
    lay: ContextLayout,
    caches: tuple[CacheEstimate, ...],
    sizes: dict[tuple[bool, int, int] | None, tuple[int, int]],
    rs: int,
    out: int,
    overhead: int,
) -> tuple[tuple[DeviceMemory, ...], HostMemory]:
    """Every layer on one or several devices (-ngl all, -sm layer): per device its layers' weights and
    KV, its compute buffer and fixed overhead; token_embd, the graph inputs and the logits in host RAM."""
    n_dev = max(1, len(cfg.tensor_split))
    owner = layer_devices(spec.n_layer_all, cfg.tensor_split)
    prefix = DEVICE_PREFIX[lay.device]
    # as llama.cpp names the buffers: CUDA0, CUDA1, ...; Apple's one GPU is "Metal"
    names = cfg.device_names or tuple(
        prefix if lay.device == "metal" and n_dev == 1 else f"{prefix}{i}" for i in range(n_dev)
    )
    if len(names) != n_dev:
        raise ConfigError(f"{len(names)} device names for a split over {n_dev} devices")
    cuda = lay.device == "cuda"
    rs_layers = sum(spec.recurrent_layers)
    pipeline = n_dev > 1 and pipeline_parallel(cfg, names)
    keys = layer_shapes(spec).keys
    parts = device_layers(spec, owner, n_dev, cuda)
    # every routed expert in host memory beside devices that do not op-offload them (cfg.host_experts, none left in
    # the spec): the devices run the router and weigh the experts' outputs copied back ([n_embd, n_expert_used,
    # n_ubatch]), never their gate, up and GLU (llama-server b11312 over an rpc-server, a qwen3moe at -ub 2048 with
    # --n-cpu-moe past its layers: 58.04 MiB printed, 172.56 planned before as at full offload)
    # (one device: over two, the last one held 84.10 where this rule plans 60.75, so a split keeps the full offload's)
    # gpt-oss with the experts of every block but the last in host memory likewise: its last block's FFN runs after
    # the last attention, the masks freed (--n-cpu-moe 7 of 8 blocks: 129.04 MiB reserved, as with 8)
    last_only = bool(spec.layer_expert_bytes) and not any(spec.layer_expert_bytes[: spec.n_layer - 1])
    no_ffn = (
        cfg.host_experts and spec.n_expert and n_dev == 1
        and (
            (not spec.expert_bytes and (spec.architecture not in EXPERT_BIAS_GROWTH or biased_experts_grow(spec)))
            or (last_only and biased_experts_grow(spec))
            # or only the last block's, which runs its FFN at the output rows alone (round 23a, llama-server b11312:
            # Qwen3-30B-A3B's widths at --n-cpu-moe 5 of 6, 256.04 MiB; Mixtral-8x7B's at 2 of 3, 224.04)
            or (
                last_only and gathers_in_last_block(spec) and not spec.n_ff_shexp
                and spec.architecture not in EXPERT_BIAS_GROWTH
            )
        )
    )  # fmt: skip
    cspec = without_routed_ffn(spec) if no_ffn else spec
    moved = experts_moved(spec)  # the blocks whose experts --n-cpu-moe moved (their matmuls in CPU splits)
    # a replayed graph of the first blocks' experts in host memory (compute.host_experts_device_compute: qwen3moe on an
    # RPC device), where the blocks moved are the first ones, as --n-cpu-moe moves them
    host_replay = None
    if cfg.host_experts and n_dev == 1 and moved:
        n_moved = sum(moved)
        if moved == tuple(il < n_moved for il in range(spec.n_layer)):
            host_replay = host_experts_device_compute(spec, lay, n_moved)
    output_layer_weights = output_layer_bytes(spec, cuda)
    devices = []
    for d, part in enumerate(parts):
        if n_dev == 1:  # every KV layer is in one of the caches
            kv_d = sum(c.k_bytes + c.v_bytes for c in caches)
            rs_d = rs // rs_layers * rs_layers if rs_layers else 0
            compute = device_compute_bytes(cspec, lay) if host_replay is None else host_replay
            if no_ffn and host_replay is None:  # block 0's experts on the CPU: the full mask's copy made after them
                blocks = tuple(range(spec.n_layer))
                compute = max(compute + late_full_mask_bytes(spec, lay), late_full_mask_scores_bytes(spec, lay, blocks))
        else:
            kv_d = sum(sum(sizes[keys[il]]) for il in part.layers)
            rs_d = rs // rs_layers * sum(1 for il in part.layers if spec.recurrent_layers[il]) if rs_layers else 0
            if not (part.layers or part.last):  # a device given no layer holds no graph
                compute = 0
            elif pipeline:
                compute = split_compute(spec, lay, part, copies=N_COPIES)
            elif (
                cfg.host_experts
                and moved is not None
                and (got := host_experts_split_compute(spec, lay, part, moved.__getitem__)) is not None
            ):
                compute = got
            else:
                compute = unpipelined_split_compute(spec, lay, part)
        if d == 0 and cfg.op_offload_copy_bytes:  # the copy lives in a layer's live set (op_offload_growth)
            compute += op_offload_growth(spec, lay, cfg.op_offload_copy_bytes)
        if d == 0 and cfg.host_experts and host_replay is None:
            # over several devices the scores' phase is measured against this device's own figure (round 25a:
            # Qwen3-Next's widths over two rpc-servers, --n-cpu-moe 8: 760 MiB printed, 768 planned, 792 above the
            # one device's full offload)
            compute += host_experts_device_growth(
                cspec, lay, device_experts=bool(spec.expert_bytes) and not no_ffn, base=compute if n_dev > 1 else None
            )
        weights, n_layers = part.weights_bytes, part.n_layers
        if cfg.output_on_host:
            if part.last:  # output.weight, output_norm (a tied model's copy of token_embd) stay in host memory
                weights, n_layers = weights - output_layer_weights, n_layers - 1
            if d == 0:
                compute = max(compute, output_op_offload_bytes(spec, lay))
        total = weights + kv_d + rs_d + compute + overhead
        devices.append(DeviceMemory(names[d], n_layers, weights, kv_d, rs_d, compute, overhead, total))
    host_compute = split_host_compute(spec, lay, copies=N_COPIES) if pipeline else host_compute_bytes(spec, lay)
    if cfg.host_experts:
        host_compute = max(host_compute, host_experts_host_compute_bytes(spec, lay, owner))
    host_w = spec.tok_embd_bytes + spec.input_extra_bytes  # the input layer (dev_input: the CPU)
    if cfg.output_on_host:
        host_w += output_host_bytes(spec)
    host = HostMemory(host_w, host_compute, out, host_w + host_compute + out)
    return tuple(devices), host


def mtp_context_config(cfg: RunConfig, lay: ContextLayout) -> RunConfig:
    """The MTP context's parameters (common_base_params_to_speculative, common_speculative_init_result): a
    draft context's (:func:`draft_config`), with no weights of its own to repack (it runs on the target's), on the
    target model: its tensor overrides, op-offload copies and pipelining are the target's."""
    return replace(
        draft_config(cfg, lay),
        cpu_repack="none",
        op_offload_copy_bytes=cfg.op_offload_copy_bytes,
        host_experts=cfg.host_experts,
        pipeline=cfg.pipeline,
    )
