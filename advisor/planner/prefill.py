"""Prompt processing (prefill): how long one sequence's prompt takes, and at how many tokens per second.

**Prompt processing** is bound by arithmetic: each prompt token costs 2 FLOPs per active parameter (the
weights one token multiplies by, :attr:`kvadvise.model.spec.ModelSpec.active_params`) and the attention
over the tokens before it (QK and AV: 2 x (head_k + head_v) x n_head FLOPs per layer and cell). Each GPU
computes its share at a fitted fraction of its FP16 tensor peak (:data:`PREFILL_EFFICIENCY`; the
``fp16_tflops`` of profiles/gpus.json, with sources). A hybrid's recurrent layers have no attention but scan their
state over the prompt (:func:`recurrent_flops`, counted from llama.cpp's kernels): a cost per token that grows with
the state, not the depth; Gated DeltaNet's token-by-token scan runs at its own, much smaller fraction of the peak
(:data:`RECURRENT_PREFILL_EFFICIENCY`), Mamba-2's chunked SSD matmuls at the dense one. Weights kept on the CPU are
copied to the GPU for every prompt batch of 32 tokens or more (llama.cpp's op offload: ggml-backend.cpp
ggml_backend_sched_backend_id_from_cur, ggml-cuda.cu / ggml-vulkan.cpp offload_op with
GGML_OP_OFFLOAD_MIN_BATCH 32), which costs their bytes over PCIe once per ubatch
(:data:`PCIE_BYTES_PER_S`); a CPU plan computes at the CPU's vector peak.

The factors are fitted on published measurements (tests/data/speed/measurements.json, with sources, on
the rows marked for the fit; ``benchmarks/bench_speed.py`` prints the estimate ÷ measured of every row,
the held-out rows apart). :data:`PREFILL_RANGE` is the spread of measured ÷ estimate that covers 80 % of those
rows: the range a plan prints. The devices, their shares of the layers and the backend's name are the decode
model's (kvadvise.planner.speed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.model.ggml import row_bytes
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import OP_OFFLOAD_MIN_BATCH, mla_as_built  # ggml-cuda.cu / ggml-vulkan.cpp
from kvadvise.planner.speed import (
    _BACKEND_NAMES,
    EXTRAPOLATION_FLOOR,
    PCIE_BYTES_PER_S,
    Device,
    _k,
    backend_key,
    ctx_label,
    layer_expert_bytes,
    plan_devices,
    weight_reads,
)
from kvadvise.planner.split import output_weights_bytes

if TYPE_CHECKING:
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.memory import RunConfig

# Fraction of the FP16 tensor peak prompt processing reaches, by backend and kind of model (fitted). CUDA
# data-centre cards (A100, H100, H200: "cuda-dc") reach a far smaller share of their much larger tensor
# peak: llama.cpp's quantized matmul kernels (MMQ) do not use what their tensor cores add per SM.
PREFILL_EFFICIENCY: dict[str, dict[str, float]] = {
    "cuda": {"dense": 0.40, "moe": 0.16},
    "cuda-dc": {"dense": 0.16, "moe": 0.10},
    "metal": {"dense": 0.66, "moe": 0.30},
    # Vulkan and ROCm MoE, and the CPU: no fit row; CUDA's MoE/dense ratio (0.4; a guess for the CPU's dense)
    "vulkan": {"dense": 0.24, "moe": 0.10},
    "rocm": {"dense": 0.42, "moe": 0.17},
    "cpu": {"dense": 0.30, "moe": 0.12},
}
# The recurrent layers' own prompt work (recurrent_flops below): a Gated DeltaNet layer's scan is not
# a matmul. At b11312 ggml-cuda/gated_delta_net.cu gated_delta_net_cuda runs the prompt token by token too (its launcher:
# "TODO: Add chunked kernel for even faster pre-fill"; llama-context picks the fused op, delta-net-base.cpp
# build_delta_net: cparams.fused_gdn_ch): per token and value head a warp per state column reads k and q, reduces
# S^T k and S^T q across the warp and rank-1 updates the S_k x S_v state in FP32 registers, a latency-bound chain that
# reaches a small fraction of the card's FP16 tensor peak. Fitted (benchmarks/bench_speed.py --fit) on the fit rows
# with recurrent layers: CUDA's, Qwen3.5 9B/27B/35B-A3B on an RTX 4090 (rows 401-413); llama.cpp#22587's kernel
# microbenchmark of the same kernel (its master column: S_v 128, 32 value heads, 1,024 tokens in 525 µs on an RTX 5090)
# gives 1.8 % of that card's peak. The other classes: no fit row; CUDA's share times their dense/CUDA-dense ratio.
RECURRENT_PREFILL_EFFICIENCY: dict[str, float] = {
    "cuda": 0.018,
    "cuda-dc": 0.0072,
    "metal": 0.030,
    "vulkan": 0.011,
    "rocm": 0.019,
    "cpu": 0.0135,
}
# Mamba-2's prompt scan is chunked matmuls (ggml-cuda/ssm-scan.cu ssm_scan_ssd_f32_cuda, n_tok > SSM_SSD_MIN_TOKENS 128:
# cuBLAS GEMMs over chunks of SSM_SSD_CHUNK_SIZE 256 tokens): its FLOPs run at the dense matmul efficiency.
SSD_CHUNK_TOKENS = 256
SSD_MIN_TOKENS = 128
# Weights kept in RAM reach the GPU over PCIe for every ubatch (op offload), at speed.PCIE_BYTES_PER_S
PREFILL_RANGE = (0.69, 1.28)
DEFAULT_PROMPT_TOKENS = 4096  # the prompt a plan times when --prompt-tokens is not given
# CUDA cards whose tensor peak llama.cpp's kernels reach far less of (see PREFILL_EFFICIENCY), by name
# or profile id; compiled by re on first use
_DATACENTER_TENSOR = r"\b(a100|a800|h100|h800|h200|h20|gh200|b100|b200|gb200)\b"
# The longest prompt of the prefill measurements the factors are fitted and checked on, by backend
# (tests/data/speed/measurements.json): a prompt past it is an extrapolation and is labelled so (at least
# speed.EXTRAPOLATION_FLOOR); a plan with part of the model on the CPU, or a CPU plan: none.
PREFILL_MEASURED_TOKENS: dict[str, int] = {"cuda": 36864, "metal": 1024, "vulkan": 4096, "rocm": 6144}


def prefill_key(backend: str, gpu_name: str = "") -> str:
    """The prefill efficiency class: the backend's, or "cuda-dc" for a data-centre tensor card."""
    import re

    b = backend_key(backend)
    if b == "cuda" and re.search(_DATACENTER_TENSOR, gpu_name.lower()):
        return "cuda-dc"
    return b


def active_params(spec: ModelSpec) -> int:
    """The parameters one token multiplies by: the spec's count, else its active bytes at the file's
    average bits per weight (a spec without tensor shapes)."""
    if spec.active_params:
        return spec.active_params
    reads = weight_reads(spec)
    from kvadvise.errors import InputError
    from kvadvise.model.quants import quant_bpw

    try:
        bpw = quant_bpw(spec.file_type)[1]
    except InputError:  # a type name quant_bpw does not know: a 4.5-bit average, the common quants' middle
        bpw = 4.5
    return int((reads.dense + reads.experts) * 8 / bpw)


def attention_flops(spec: ModelSpec, depth: int) -> float:
    """FLOPs of one token's attention over ``depth`` cells: QK and AV in every KV layer (a sliding-window
    layer over at most its window; MLA over its compressed rank)."""
    total = 0.0
    for il in range(spec.n_layer):
        if not spec.kv_layers[il]:
            continue
        cells = min(depth, spec.n_swa) if spec.has_swa and spec.swa_layers[il] and spec.n_swa else depth
        swa = spec.swa_layers[il]
        hk = spec.n_embd_head_k_swa if swa else spec.n_embd_head_k
        hv = spec.n_embd_head_v_swa if swa else spec.n_embd_head_v
        total += 2.0 * cells * spec.n_head[il] * (hk + hv)
    return total


@dataclass(frozen=True, slots=True)
class RecurrentFlops:
    """FLOPs per prompt token of every recurrent layer's mixer beyond its weights' matmuls, by how they run."""

    scan: float  # a token-by-token recurrence (Gated DeltaNet, Mamba-1, short conv): RECURRENT_PREFILL_EFFICIENCY
    matmul: float  # chunked matmuls (Mamba-2's SSD path): the dense matmul efficiency


def recurrent_flops(spec: ModelSpec, n_ubatch: int = 512) -> RecurrentFlops:
    """The recurrent layers' scan work per prompt token, from llama.cpp b11312's CUDA kernels (per layer):

    - Gated DeltaNet (ggml-cuda/gated_delta_net.cu gated_delta_net_cuda, non-KDA): per state element of the
      d_state x d_inner state (S_k x H_v S_v) 2 FLOPs for S^T k, 3 for the decay and rank-1 update, 2 for S^T q: 7;
    - Mamba-2 with a ubatch over SSD_MIN_TOKENS (ggml-cuda/ssm-scan.cu ssm_scan_ssd_f32_cuda, chunks of C =
      min(ubatch, 256) tokens): C^T B per group (2 C d_state n_group), the state's contribution S^T C and the state
      update B X^T (2 x 2 d_state d_inner) and the intra-chunk X M^T (2 C d_inner), per token; a smaller ubatch runs
      ssm_scan_f32 token by token: 5 FLOPs per state element (decay, B x dt update, C read-out);
    - Mamba-1: ssm_scan_f32, 5 per state element; short conv (LFM2, ssm_conv_f32): 2 per channel and kernel tap.

    The work does not grow with the depth (the state is fixed), unlike the attention's. Other kinds: 0 (not modelled).
    """
    d = spec.ssm
    n_rec = sum(spec.recurrent_layers[: spec.n_layer])
    if d is None or not n_rec:
        return RecurrentFlops(0.0, 0.0)
    states = float(d.d_state * d.d_inner)
    if d.kind == "gdn":
        return RecurrentFlops(n_rec * 7.0 * states, 0.0)
    if d.kind == "mamba2" and n_ubatch > SSD_MIN_TOKENS:
        c = min(n_ubatch, SSD_CHUNK_TOKENS)
        per = 2.0 * c * d.d_state * max(1, d.n_group) + 4.0 * states + 2.0 * c * d.d_inner
        return RecurrentFlops(0.0, n_rec * per)
    if d.kind in ("mamba2", "mamba"):
        return RecurrentFlops(n_rec * 5.0 * states, 0.0)
    if d.kind == "shortconv":
        return RecurrentFlops(n_rec * 2.0 * d.d_conv * d.d_inner, 0.0)
    return RecurrentFlops(0.0, 0.0)


@dataclass(frozen=True, slots=True)
class PrefillEstimate:
    """Prompt processing of one sequence: tokens per second and seconds for a prompt, at a few sizes."""

    tokens_per_s: float  # for the first prompt of ``points``
    seconds: float
    low: float
    high: float
    points: tuple[tuple[int, float, float], ...]  # (prompt tokens, tokens/s, seconds), from an empty context
    note: str
    measured_tokens: int = 1 << 62  # the longest prompt the measurements reach (at least 4k): past it, extrapolated
    measured_what: str = ""

    def text(self) -> str:
        return f"{self.at_sizes()} (range {self.low:,.0f} to {self.high:,.0f} t/s for {ctx_label(self.points[0][0])})"

    def extrapolated(self, n_prompt: int) -> bool:
        return n_prompt > self.measured_tokens

    def at_sizes(self) -> str:
        """``≈ 5,200 t/s: 4k tokens in 0.8 s, 64k in 21 s``"""
        first, *rest = self.points
        s = f"≈ {first[1]:,.0f} t/s: {ctx_label(first[0])} tokens in {_secs(first[2])}"
        s += "".join(f", {ctx_label(n)} in {_secs(sec)} (≈ {tps:,.0f} t/s)" for n, tps, sec in rest)
        if any(self.extrapolated(n) for n, _, _ in self.points):
            s += f" (past {_k(self.measured_tokens)}: extrapolated)"
        return s


def _secs(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 600:
        return f"{s:,.0f} s"
    return f"{s / 60:,.0f} min"


def prefill_seconds(
    spec: ModelSpec,
    n_prompt: int,
    devices: Sequence[Device],
    *,
    depth: int = 0,
    n_ubatch: int = 512,
    cpu_bytes: int = 0,
    cpu_flops_per_s: float = 0.0,
    n_active: int | None = None,
    cpu_kv: CpuLayersKV | None = None,
) -> float | None:
    """Seconds to process ``n_prompt`` tokens after ``depth`` cached ones.

    ``devices``: the GPUs (none: the CPU computes everything at ``cpu_flops_per_s``); ``cpu_bytes``: the
    weights kept in RAM, copied to the GPU once per ubatch of 32 tokens or more (op offload), computed by
    the CPU for a smaller one; ``cpu_kv``: the cache of the layers kept on the CPU, whose attention then runs
    on the GPU too, each ubatch copying the K and V read so far (:func:`cpu_kv_copy_bytes`). None when a
    device's compute is unknown.
    """
    if n_prompt <= 0:
        return 0.0
    kind = "moe" if spec.n_expert and spec.n_expert_used else "dense"
    params = n_active if n_active is not None else active_params(spec)
    # the prompt's tokens see depth .. depth + n_prompt cells: the mean is in the middle. The attention
    # (flash attention's dense kernels) runs at the dense efficiency, the weights' matmuls at the model's
    w_flops = n_prompt * 2.0 * params
    a_flops = n_prompt * attention_flops(spec, depth + n_prompt // 2)
    ub = max(1, min(n_ubatch, n_prompt))
    n_ub = -(-n_prompt // ub)
    # the recurrent layers' scans: the SSD matmuls (Mamba-2) at the dense matmul efficiency like the attention,
    # a token-by-token scan at its own (RECURRENT_PREFILL_EFFICIENCY)
    rec = recurrent_flops(spec, ub)
    a_flops += n_prompt * rec.matmul
    r_flops = n_prompt * rec.scan

    def at(c: str, peak: float, share: float = 1.0) -> float:
        eff = PREFILL_EFFICIENCY[c]
        scan = r_flops / (RECURRENT_PREFILL_EFFICIENCY[c] * peak) if r_flops else 0.0
        return share * (w_flops / (eff[kind] * peak) + a_flops / (eff["dense"] * peak) + scan)

    if not devices:
        return at("cpu", cpu_flops_per_s) if cpu_flops_per_s > 0 else None
    if not all(d.flops_per_s for d in devices):
        return None
    t = 0.0
    if cpu_bytes and ub < OP_OFFLOAD_MIN_BATCH:  # too small a batch to offload: the CPU computes its part
        if cpu_flops_per_s <= 0:
            return None
        cpu_share = min(1.0, cpu_bytes / max(1, spec.weights_bytes))  # of the weights (an upper bound of the FLOPs)
        t += cpu_share * w_flops / (PREFILL_EFFICIENCY["cpu"][kind] * cpu_flops_per_s)
        w_flops *= 1 - cpu_share
    elif cpu_bytes:
        t += n_ub * cpu_bytes / PCIE_BYTES_PER_S
    if cpu_kv is not None and ub >= OP_OFFLOAD_MIN_BATCH:
        t += cpu_kv_copy_bytes(cpu_kv, n_prompt, ub, depth) / PCIE_BYTES_PER_S
    for d in devices:
        t += at(prefill_key(d.backend, d.name), d.flops_per_s, d.share)
    return t


@dataclass(frozen=True, slots=True)
class CpuLayersKV:
    """The cache of a partial offload's CPU layers, per cell: what each prompt batch copies to the GPU."""

    bytes_per_cell: int  # K + V of every full-attention layer kept on the CPU
    swa_bytes_per_cell: int = 0  # of its sliding-window layers, whose views hold at most ``n_swa`` + a batch
    n_swa: int = 0


def cpu_kv_copy_bytes(kv: CpuLayersKV, n_prompt: int, n_ubatch: int, depth: int = 0) -> int:
    """The K and V a prompt of ``n_prompt`` tokens after ``depth`` copies to the GPU: for each ubatch, every CPU
    layer's attention reads the views of the cells used so far (n_kv: the depth and the batches up to this one,
    padded to 256 as llama_kv_cache::get_n_kv pads them), copied in at the start of its split
    (memory.cpu_layers_attention_bytes: the same copies in the compute buffer)."""
    total = 0
    done = 0
    while done < n_prompt:
        done = min(n_prompt, done + n_ubatch)
        n_kv = -(-(depth + done) // 256) * 256
        total += kv.bytes_per_cell * n_kv + kv.swa_bytes_per_cell * min(n_kv, kv.n_swa + n_ubatch)
    return total


def prefill(
    spec: ModelSpec,
    n_ctx: int,
    devices: Sequence[Device],
    *,
    prompt_tokens: int | None = None,
    n_ubatch: int = 512,
    cpu_bytes: int = 0,
    cpu_flops_per_s: float = 0.0,
    cpu_flops_source: str | None = None,
    source: str | None = None,
    cpu_kv: CpuLayersKV | None = None,
) -> PrefillEstimate | None:
    """Prompt processing of one sequence: ``prompt_tokens`` (default :data:`DEFAULT_PROMPT_TOKENS`, at most
    the context) from an empty cache, and the whole context ``n_ctx``. None: a compute figure is unknown."""
    if not spec.weights_bytes:
        return None
    limit = n_ctx if n_ctx > 0 else None
    first = prompt_tokens if prompt_tokens else DEFAULT_PROMPT_TOKENS
    if limit is not None:
        first = min(first, limit)
    sizes = [first] + ([limit] if limit is not None and limit > first and not prompt_tokens else [])
    pts = []
    for n in sizes:
        s = prefill_seconds(
            spec, n, devices, n_ubatch=n_ubatch, cpu_bytes=cpu_bytes, cpu_flops_per_s=cpu_flops_per_s, cpu_kv=cpu_kv
        )
        if s is None or s <= 0:
            return None
        pts.append((n, n / s, s))
    tps = pts[0][1]
    kind = "MoE" if spec.n_expert and spec.n_expert_used else "dense"
    where = " + ".join(
        f"{d.flops_per_s / 1e12:,.0f} TFLOPS ({prefill_key(d.backend, d.name)})" for d in devices
    ) or f"{cpu_flops_per_s / 1e12:,.1f} TFLOPS CPU" + (f" ({cpu_flops_source})" if cpu_flops_source else "")
    rec = recurrent_flops(spec, n_ubatch)
    scan = f" and {(rec.scan + rec.matmul) / 1e9:.2f} GFLOP of recurrent scan" if rec.scan or rec.matmul else ""
    note = (
        f"estimate for one sequence from an empty context: {2 * active_params(spec) / 1e9:.1f} GFLOP per token "
        f"({kind}){scan} plus the attention over the tokens before it, at {where} FP16 peak"
        + (f" ({source})" if source and devices else "")
    )
    if cpu_bytes and devices:
        note += (
            f"; the {cpu_bytes / 1e9:.1f} GB kept in RAM cross PCIe once per ubatch of {n_ubatch} "
            f"(op offload, at {PCIE_BYTES_PER_S / 1e9:.0f} GB/s): a larger -ub amortises it"
        )
    if cpu_kv is not None and devices and n_ubatch >= OP_OFFLOAD_MIN_BATCH:
        note += (
            "; the CPU layers' attention runs on the GPU too, each ubatch copying their K and V read so far "
            f"({cpu_kv_copy_bytes(cpu_kv, pts[-1][0], n_ubatch) / 1e9:,.1f} GB for {pts[-1][0]:,} tokens)"
        )
    note += (
        f"; calibrated on published measurements (80 % within {PREFILL_RANGE[0]:.0%} to {PREFILL_RANGE[1]:.0%}); "
        "`kvadvise verify` measures the real figure"
    )
    lead = backend_key(devices[0].backend) if devices else "cpu"
    measured = PREFILL_MEASURED_TOKENS.get(lead, 0) if devices and not cpu_bytes else 0
    what = _BACKEND_NAMES[lead] + (" partial-offload" if cpu_bytes and devices else "" if devices else "-only")
    return PrefillEstimate(
        tps,
        pts[0][2],
        tps * PREFILL_RANGE[0],
        tps * PREFILL_RANGE[1],
        tuple(pts),
        note,
        measured_tokens=max(measured, EXTRAPOLATION_FLOOR),
        measured_what=what,
    )


def cpu_resident_bytes(spec: ModelSpec, n_cpu_moe: int = 0, n_cpu_layers: int = 0, *, output: bool = False) -> int:
    """The weights a partial offload keeps in RAM: the routed experts of the first ``n_cpu_moe`` layers
    and the first ``n_cpu_layers`` layers whole, and with ``output`` the output layer (a build before
    builds.OUTPUT_FIRST; token_embd is always there and never multiplied)."""
    whole = (
        sum(spec.layer_bytes[:n_cpu_layers])
        if any(spec.layer_bytes)
        else spec.weights_bytes * n_cpu_layers // max(1, spec.n_layer)
    )
    # --n-cpu-moe N moves blk.i's experts for i < N (each layer's own), past the layers already whole in RAM
    experts = sum(layer_expert_bytes(spec)[n_cpu_layers:n_cpu_moe]) if n_cpu_moe and spec.n_expert else 0
    return int(whole + experts) + (output_weights_bytes(spec) if output else 0)


def plan_prefill(
    spec: ModelSpec,
    cfg: RunConfig,
    budget: Budget,
    *,
    prompt_tokens: int | None = None,
    n_cpu_moe: int = 0,
    n_cpu_layers: int = 0,
    cpu_output: bool = False,
) -> PrefillEstimate | None:
    """Prompt processing for the plan's hardware: a prompt of ``prompt_tokens`` (default 4k) and the whole
    planned context, each from an empty cache; the weights kept in RAM (``cpu_output``: the output layer's too)
    cross PCIe once per ubatch."""
    spec = mla_as_built(spec, cfg.llama_build)  # an older build attends per-head K/V (builds.MLA_CACHE)
    devs = plan_devices(spec, budget, cfg.tensor_split)
    if devs is None:
        return None
    cpu = None
    if not devs:
        from kvadvise.planner.cpuspeed import cpu_flops

        cpu = cpu_flops()
    n_seq = cfg.n_ctx // max(1, cfg.n_parallel) if cfg.n_ctx else spec.n_ctx_train
    cpu_kv = cpu_layers_kv(spec, cfg, n_cpu_layers) if devs and n_cpu_layers else None
    return prefill(
        spec,
        n_seq,
        devs,
        prompt_tokens=prompt_tokens,
        n_ubatch=cfg.n_ubatch,
        cpu_bytes=cpu_resident_bytes(spec, n_cpu_moe, n_cpu_layers, output=cpu_output) if devs else 0,
        cpu_flops_per_s=cpu.flops_per_s if cpu else 0.0,
        cpu_flops_source=cpu.source if cpu else None,
        source=budget.flops_source,
        cpu_kv=cpu_kv,
    )


def cpu_layers_kv(spec: ModelSpec, cfg: RunConfig, n_cpu_layers: int) -> CpuLayersKV | None:
    """The first ``n_cpu_layers`` layers' cache per cell, in the plan's cache types (None: no attention there)."""
    full = swa = 0
    for il in range(min(n_cpu_layers, spec.n_layer)):
        if not spec.kv_layers[il]:
            continue
        cell = row_bytes(cfg.type_k, spec.n_embd_k_gqa(il)) + row_bytes(cfg.type_v, spec.n_embd_v_gqa(il))
        if spec.swa_layers[il] and spec.n_swa and not cfg.swa_full:
            swa += cell
        else:
            full += cell
    return CpuLayersKV(full, swa, spec.n_swa) if full or swa else None
