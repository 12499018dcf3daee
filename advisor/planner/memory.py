"""The memory model: what llama.cpp allocates for a model and a run config.

Follows llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36):
- context sizes: src/llama-context.cpp, llama_context::llama_context()
- KV cache:      src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache()
- SWA cache:     src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa()
- recurrent:     src/llama-memory-recurrent.cpp, llama_memory_recurrent::llama_memory_recurrent()
- output buffer: src/llama-context.cpp, llama_context::output_reserve()
- buffers:       ggml/src/ggml-alloc.c, ggml_backend_alloc_ctx_tensors_from_buft() (per-tensor padding)
The compute buffer has no closed form (ggml-alloc's greedy reuse); it is a
documented estimate, checked against real llama.cpp within 5% or 16 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.errors import ConfigError
from kvadvise.model.ggml import ALIGNMENT, BLOCK, GGMLType, cuda_alloc_bytes, is_quantized, pad, row_bytes
from kvadvise.model.spec import ModelSpec

MIB = 1 << 20
CTX_PAD = 256  # GGML_PAD(n_ctx, 256), "ref: PR 17046"
FLASH_ATTN_MODES = ("on", "off", "auto")
DEVICES = ("cpu", "cuda")
# Buffer alignment: CPU TENSOR_ALIGNMENT = 32, CUDA CUDA_ALIGNMENT = 128 (ggml-cuda.cu).
# Per-device fixed cost outside llama.cpp's buffers. CPU: none. CUDA: the CUDA
# context and cuBLAS workspace, about 330 MiB measured by unsloth (issue #6718,
# see shared/peers.md); replaced by a measured value once `verify` has run.
OVERHEAD_BYTES = {"cpu": 0, "cuda": 330 * MIB}
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
    device: str = "cpu"  # where the layers go: cpu | cuda (full offload)
    overhead_bytes: int | None = None  # per-device fixed cost; None = OVERHEAD_BYTES[device] (or a calibration)
    # llama_context_params.n_outputs_max, the logits rows the compute graph is reserved for.
    # None = as llama-server (and so Ollama) sets it: one per sequence (tools/server/server-context.cpp
    # server_output_limits, no speculative decoding); 0 = n_batch, the library's and llama-cli's default.
    n_outputs_max: int | None = None

    def __post_init__(self) -> None:
        # llama.cpp reads -c, -np, -b, -ub as int32 (common/arg.cpp std::stoi); a larger number would be
        # refused there, or (through a binding) wrap, and the plan would describe another run
        for name in ("n_ctx", "n_parallel", "n_batch", "n_ubatch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT32_MAX:
                raise ConfigError(
                    f"{name} must be a whole number from 0 to {INT32_MAX:,} (llama.cpp's int32), got {v!r}"
                )
        if self.n_outputs_max is not None and not 0 <= self.n_outputs_max <= INT32_MAX:
            raise ConfigError(f"n_outputs_max must be from 0 to {INT32_MAX:,}, got {self.n_outputs_max!r}")

    @property
    def llama_n_outputs_max(self) -> int:
        """The llama_context_params.n_outputs_max llama.cpp is given for this config (0 = n_batch)."""
        return self.n_parallel if self.n_outputs_max is None else self.n_outputs_max


@dataclass(frozen=True, slots=True)
class ContextLayout:
    """The context as llama.cpp resolves it (printed by llama_context:)."""

    n_ctx: int  # cells, padded to 256 (and to n_seq_max streams)
    n_ctx_seq: int  # cells per stream
    n_stream: int  # 1 when unified, else n_seq_max
    n_seq_max: int
    n_batch: int
    n_ubatch: int
    n_outputs_max: int  # cparams.n_outputs_max: logits rows per ubatch the graph is reserved for
    n_ctx_swa: int  # cells per stream of the SWA cache (0 without SWA)
    flash_attn: bool
    kv_unified: bool
    swa_full: bool
    type_k: GGMLType
    type_v: GGMLType
    device: str


@dataclass(frozen=True, slots=True)
class CacheEstimate:
    """One KV cache as llama.cpp prints it (`llama_kv_cache: size = ...`)."""

    kind: str  # "kv" | "swa"
    cells: int  # per stream
    n_layers: int
    k_bytes: int
    v_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
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
    host_bytes: int  # what stays in system RAM besides (cuda: token_embd, logits); 0 on cpu


def resolve(spec: ModelSpec, cfg: RunConfig) -> ContextLayout:
    """llama_context::llama_context(): n_ctx, n_batch and n_ubatch as llama.cpp sets them."""
    if cfg.n_ctx < 0 or cfg.n_parallel < 1 or cfg.n_batch < 1 or cfg.n_ubatch < 1:
        raise ConfigError("n_ctx must be >= 0 and n_parallel, n_batch, n_ubatch >= 1")
    if cfg.n_outputs_max is not None and cfg.n_outputs_max < 0:
        raise ConfigError("n_outputs_max must be >= 0 (0 = n_batch)")
    if cfg.flash_attn not in FLASH_ATTN_MODES:
        raise ConfigError(f"flash_attn must be one of {', '.join(FLASH_ATTN_MODES)}, got {cfg.flash_attn!r}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {cfg.device!r}")
    n_seq_max = cfg.n_parallel
    n_ctx = cfg.n_ctx or spec.n_ctx_train
    if n_ctx <= 0:
        raise ConfigError("the model does not say its training context; pass --ctx")
    # n_batch and n_ubatch are set before n_ctx is padded
    n_batch = min(n_ctx, cfg.n_batch)
    n_ubatch = min(n_batch, cfg.n_ubatch)
    n_outputs_max = cfg.llama_n_outputs_max or n_batch  # llama_context: "0 = n_batch"
    n_ctx = pad(n_ctx, CTX_PAD)
    if cfg.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // n_seq_max, CTX_PAD)
        n_ctx = n_ctx_seq * n_seq_max  # "n_ctx is not divisible by n_seq_max - rounding down"
        n_stream = n_seq_max
    flash_attn = _flash_attn(spec, cfg)
    n_ctx_swa = 0
    if spec.has_swa:
        n_ctx_swa = n_ctx_seq
        if not cfg.swa_full:
            # llama_kv_cache_iswa: size_swa = GGML_PAD(min(size_base, n_swa*(unified ? n_seq_max : 1) + n_ubatch), 256)
            mult = n_seq_max if cfg.kv_unified else 1
            n_ctx_swa = pad(min(n_ctx_seq, spec.n_swa * mult + n_ubatch), CTX_PAD)
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
        swa_full=cfg.swa_full,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        device=cfg.device,
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
    if fa != "off":  # auto resolves to on: the CPU and CUDA backends support FA for these head sizes
        heads = [
            (spec.n_embd_head_k_swa, spec.n_embd_head_v_swa)
            if spec.swa_layers[il]
            else (spec.n_embd_head_k, spec.n_embd_head_v)
            for il in range(spec.n_layer)
        ]
        for name, t, idx in (("K", cfg.type_k, 0), ("V", cfg.type_v, 1)):
            blck = BLOCK[t][0]
            bad = sorted({h[idx] for h in heads if h[idx] % blck})
            if is_quantized(t) and bad:
                raise ConfigError(
                    f"{name} cache type {t.type_name} with block size {blck} does not divide the head size {bad[0]}",
                    hint="use f16, or a cache type whose block size divides the head size",
                )
    return fa != "off"


def _tensor_alloc(device: str, t: GGMLType, ne0: int, n_bytes: int) -> int:
    """ggml_backend_buft_get_alloc_size, padded to the buffer alignment."""
    if device == "cuda":
        return cuda_alloc_bytes(t, ne0, n_bytes)
    return pad(n_bytes, ALIGNMENT[device])


def layer_kv_bytes(spec: ModelSpec, lay: ContextLayout) -> tuple[tuple[int, int], ...]:
    """(K, V) bytes of each layer: tensors [n_embd_k_gqa, cells, n_stream] (llama_kv_cache ctor)."""
    v_max = spec.n_embd_v_gqa_max()
    out = []
    for il in range(spec.n_layer_all):
        if not spec.kv_layers[il]:
            out.append((0, 0))
            continue
        cells = lay.n_ctx_swa if spec.has_swa and spec.swa_layers[il] else lay.n_ctx_seq
        nk = spec.n_embd_k_gqa(il)
        k = _tensor_alloc(lay.device, lay.type_k, nk, row_bytes(lay.type_k, nk) * cells * lay.n_stream)
        v = 0
        if not spec.is_mla:  # MLA: has_v = !is_mla, V is a view into K
            nv = v_max if not lay.flash_attn else spec.n_embd_v_gqa(il)  # v_trans pads V to the widest layer
            v = _tensor_alloc(lay.device, lay.type_v, nv, row_bytes(lay.type_v, nv) * cells * lay.n_stream)
        out.append((k, v))
    return tuple(out)


def kv_caches(spec: ModelSpec, lay: ContextLayout) -> tuple[CacheEstimate, ...]:
    """The caches llama.cpp creates: one, or two with sliding-window layers (iSWA: non-SWA first)."""
    per_layer = layer_kv_bytes(spec, lay)
    groups = [("kv", lay.n_ctx_seq, False)]
    if spec.has_swa:
        groups.append(("swa", lay.n_ctx_swa, True))
    out = []
    for kind, cells, want_swa in groups:
        layers = [
            il
            for il in range(spec.n_layer_all)
            if spec.kv_layers[il] and (not spec.has_swa or spec.swa_layers[il] == want_swa)
        ]
        if layers:
            k = sum(per_layer[il][0] for il in layers)
            v = sum(per_layer[il][1] for il in layers)
            out.append(CacheEstimate(kind, cells, len(layers), k, v))
    return tuple(out)


def kv_bytes_per_token(spec: ModelSpec, lay: ContextLayout) -> int:
    """Growth of the KV cache per extra token of context (SWA layers only grow with --swa-full)."""
    v_max = spec.n_embd_v_gqa_max()
    total = 0
    for il in range(spec.n_layer_all):
        if not spec.kv_layers[il] or (spec.has_swa and spec.swa_layers[il] and not lay.swa_full):
            continue
        total += row_bytes(lay.type_k, spec.n_embd_k_gqa(il))
        if not spec.is_mla:
            nv = v_max if not lay.flash_attn else spec.n_embd_v_gqa(il)
            total += row_bytes(lay.type_v, nv)
    return total


def recurrent_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """R and S tensors, f32, n_embd_r/s * max(1, n_seq_max) cells per recurrent layer."""
    cells = max(1, lay.n_seq_max)
    n = sum(spec.recurrent_layers)
    r = pad(spec.n_embd_r * 4 * cells, ALIGNMENT[lay.device]) if spec.n_embd_r else 0
    s = pad(spec.n_embd_s * 4 * cells, ALIGNMENT[lay.device]) if spec.n_embd_s else 0
    return n * (r + s)


def output_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """llama_context::output_reserve: logits for n_seq_max outputs (one per sequence), f32."""
    return spec.n_vocab * 4 * lay.n_seq_max


def compute_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """Estimate of the compute buffers (ggml-alloc has no closed form).

    The worst-case graph is reserved for n_ubatch tokens against the full
    cache, with min(n_ubatch, n_outputs_max) output rows (llama_context::
    sched_reserve). It holds the KQ masks and the hidden state throughout,
    plus the largest of: the logits of those rows (f32 n_vocab x rows), the
    attention (with the scores, f32 n_kv x n_ubatch x n_head, when flash
    attention is off), and the feed-forward activations.
    """
    ub = lay.n_ubatch
    f32 = 4
    n_head = max(spec.n_head, default=0)
    hidden = 4 * f32 * ub * spec.n_embd  # the residual stream, its norm, the layer input and output
    # KQ masks are graph inputs, alive through the whole graph: [n_kv, ub] per cache kind, f16 for
    # flash attention, else f32 (src/llama-graph.cpp build_attn_inp_kq_mask).
    full = any(kv and not swa for kv, swa in zip(spec.kv_layers, spec.swa_layers, strict=True))
    swa = any(kv and s for kv, s in zip(spec.kv_layers, spec.swa_layers, strict=True))
    n_kv = lay.n_ctx_seq if full else 0
    n_kv_swa = lay.n_ctx_swa if swa else 0
    masks = (n_kv + n_kv_swa) * ub * (2 if lay.flash_attn else f32)
    logits = f32 * min(ub, lay.n_outputs_max) * spec.n_vocab
    q = f32 * ub * n_head * spec.n_embd_head_k
    # without flash attention the scores are materialised: f32 [n_kv, ub, n_head] (the softmax reuses them)
    attn = 2 * q + (0 if lay.flash_attn else f32 * ub * max(n_kv, n_kv_swa) * n_head)
    ffn = 3 * f32 * ub * spec.n_ff  # gate, up and their product
    return pad(masks + hidden + max(logits, attn, ffn), MIB // 2)


def estimate(spec: ModelSpec, cfg: RunConfig) -> MemoryEstimate:
    lay = resolve(spec, cfg)
    caches = kv_caches(spec, lay)
    k = sum(c.k_bytes for c in caches)
    v = sum(c.v_bytes for c in caches)
    rs = recurrent_bytes(spec, lay)
    weights = spec.weights_bytes
    compute = compute_bytes(spec, lay)
    out = output_bytes(spec, lay)
    overhead = cfg.overhead_bytes if cfg.overhead_bytes is not None else OVERHEAD_BYTES[lay.device]
    if lay.device == "cuda":
        # llama_model::load_tensors: token_embd always stays on the CPU ("very little benefit");
        # tied embeddings make the GPU hold a copy as the output layer.
        weights += spec.cuda_pad_bytes + (spec.tok_embd_bytes if spec.output_bytes == 0 else 0)
        host = spec.tok_embd_bytes + out
    else:
        host = 0
    total = weights + k + v + rs + compute + out + overhead
    return MemoryEstimate(
        layout=lay,
        caches=caches,
        k_bytes=k,
        v_bytes=v,
        kv_bytes=k + v,
        recurrent_bytes=rs,
        kv_bytes_per_token=kv_bytes_per_token(spec, lay),
        weights_bytes=weights,
        compute_bytes=compute,
        output_bytes=out,
        overhead_bytes=overhead,
        total_bytes=total,
        device_bytes=total - host,
        host_bytes=host,
    )
