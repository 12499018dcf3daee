"""Decode speed: how many tokens per second one sequence generates (how long a prompt takes:
kvadvise.planner.prefill).

**Decode** of one sequence is bound by memory reads: each token reads every weight it uses once, and the
K/V of the tokens before it. Per token:

- weights: everything but the token embedding (one row is looked up), and of the routed experts only
  ``n_expert_used`` of ``n_expert`` (shared experts, attention, router and output always);
- K/V: every KV layer's cells up to the depth (a sliding-window layer at most its window), at the cache
  type's bytes;
- recurrent state: a recurrent layer (Gated DeltaNet, Mamba, short conv) reads its whole state and writes it
  back for every token (the scan kernel, e.g. ggml-cuda/gated_delta_net.cu, loads the S_v x S_v state of each
  head and stores the updated one; ssm_conv shifts the conv window), at the K/V's efficiency.

Each device reads its share (its layers' weights and K/V, llama.cpp's layer split) at a measured fraction
of its published bandwidth (:data:`EFFICIENCY`, by backend, dense weights and a MoE's routed experts apart: a MoE's
attention, shared experts and output read as a dense model's, its experts' GGML_OP_MUL_MAT_ID at "moe"; the backend is the card's,
or the one ``--device rocm|vulkan`` names; a card whose architecture reads a different share names its class in
profiles/gpus.json, :func:`decode_key`: a GCN 5 card under ROCm), a 2-3-bit K-quant or an i-quant adds its dequantization work per
weight at the card's FP16 peak (:data:`DEQUANT_FLOPS_PER_WEIGHT`), and each token costs
a fixed time per layer on top (:data:`LAYER_OVERHEAD_S`: kernel launches and synchronisation, what bounds
tiny models and fast cards; small latency-bound kernels, so it scales with the card's SM clock: :func:`clock_factor`), and per MoE layer a little more (:data:`MOE_LAYER_OVERHEAD_S`: the router,
top-k and the expert gathers: the cost that makes small experts slow per byte read). A recurrent layer costs
that fixed time in proportion to the kernels it launches beside an attention layer of the same model
(:data:`DECODE_KERNELS`, counted in llama.cpp's own decode graph): a Gated DeltaNet mixer launches
half again as many as attention (conv, the q/k L2 norms, the gates, the scan, the gated norm), a Mamba-2 mixer
(granitehybrid) 1.4-1.7x, LFM2's short conv slightly fewer; where a model gives each mixer and each FFN a layer of its
own (nemotron_h: Mamba-2, attention or MoE per layer), a layer costs its kernels' share of one attention layer and
one FFN layer together, the transformer block LAYER_OVERHEAD_S is the time of. A
hybrid's time per token is mostly these launches on a fast card, and more of them on a llama.cpp build before b8720
(:data:`EARLY_BUILD_RECURRENT_S`: the same Qwen3.5-35B-A3B files decode 1.4-1.6x slower at b8148-b8207 than at b8820
on one card; a plan for such a build, --llama-build or the llama-server on PATH, counts it). The devices run one
after another: their times add up. The CPU's share (``--n-cpu-moe``, whole layers kept in RAM) reads at
the system memory's bandwidth, measured or given (kvadvise.planner.cpuspeed).

The factors are fitted on published measurements (tests/data/speed/measurements.json, with sources, on
the rows marked for the fit; ``benchmarks/bench_speed.py`` prints the estimate ÷ measured of every row,
the held-out rows apart). :data:`RANGE` is the spread of measured ÷ estimate that covers 80 % of those rows:
the range a plan prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.model.ggml import GGMLType, row_bytes
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.split import layer_devices

if TYPE_CHECKING:
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.memory import RunConfig

# Fraction of the published bandwidth decode reaches, by backend and kind of model (fitted, see module doc).
# CPU: relative to the measured copy bandwidth (kvadvise.planner.cpuspeed).
EFFICIENCY: dict[str, dict[str, float]] = {
    "cuda": {"dense": 0.90, "moe": 0.90},
    "metal": {"dense": 0.80, "moe": 0.54},
    # "moe": the routed experts alone (the rest of a MoE reads at "dense"; issue 37 round 19: gpt-oss's BF16
    # attention and output beside its small MXFP4 experts came out 25-35 % slow on Vulkan and ROCm when the whole
    # model took the experts' rate). Vulkan's 0.56 is the fit rows' search with that split (benchmarks/bench_speed.py
    # --fit); ROCm's 0.55 is HIP at about 0.9-1.0 of Vulkan on MoE decode (llama.cpp#24438: 46 vs 52 t/s, Qwen3
    # 35B-A3B Q8_0, Strix Halo, b9592), where the 0.42 fitted on one card had been 0.68 of it; fit rows within 25 %
    # 101 of 106 before and after, held-out 63 -> 65 of 72, the 26 rows of round 19 (Radeon 8060S, RX 9070 XT) 18 -> 23
    "vulkan": {"dense": 0.80, "moe": 0.56},
    "rocm": {"dense": 0.70, "moe": 0.55},
    # a decode class (decode_key): GCN 5 cards (gfx906: Instinct MI50/MI60, Radeon VII) under ROCm read a far smaller
    # share of their HBM2 than RDNA does: llama.cpp's batch-1 kernels for quantized types (ggml-cuda/mmvq.cu, run by
    # HIP) are bound by the card's integer/FP16 issue rate there, not by its 1,024 GB/s. Fitted on the gfx906
    # rows of measurements.json (stock llama.cpp 982e3472, ROCm 6.4.1: Q4_0, Q4_K_S, Q8_0 at 36-38 % of the
    # bandwidth); MoE: no row, ROCm's MoE/dense ratio. CDNA 1 (MI100, gfx908) keeps ROCm's default: its held-out
    # rows come out within 15 % of it (llama.cpp#23227).
    "rocm-gcn": {"dense": 0.33, "moe": 0.20},
    # a decode class: Apple's first-generation GPU in the M1 Max and M1 Ultra reads a smaller share of its
    # unified memory than M2-M5 do (issue 37 round 20: Llama 3.1 70B Q4_K_M 9.84 t/s on an M1 Ultra, 0.52 of 800
    # GB/s; M2/M3 Ultra rows at 0.92-1.04 with Metal's 0.80). Dense fitted on the M1 fit rows (16, 17, 75: 1.08,
    # 0.97, 0.89 of the measured, 1.41, 1.15, 1.09 with Metal's); MoE: Metal's MoE/dense ratio. Held-out M1 rows
    # within 25 %: 4 of 8 -> 8 of 8 (133, 134, 1919, 2001-2003, 2015)
    "metal-m1": {"dense": 0.56, "moe": 0.38},
    # a decode class: Apple's GPUs from the M4 on read at Metal's rate but take less fixed time per layer
    # (LAYER_OVERHEAD_S["metal-m4"])
    "metal-m4": {"dense": 0.80, "moe": 0.54},
    "cpu": {"dense": 0.60, "moe": 0.62},
}
# The decode classes a card's profile may name (profiles/gpus.json speed_class), by backend.
DECODE_CLASSES: dict[str, tuple[str, ...]] = {"rocm": ("gcn",), "metal": ("m1", "m4")}
# Fraction of the bandwidth reading the K/V reaches (attention kernels are less efficient than matmuls; fitted).
# Vulkan and ROCm: no fit row at depth, so CUDA's prior; CPU: a guess.
KV_EFFICIENCY: dict[str, float] = {"cuda": 0.66, "metal": 0.10, "vulkan": 0.68, "rocm": 0.68, "cpu": 0.3}
# Fixed time per layer and token (s): launches, syncs, small ops (fitted; CPU: a guess).
LAYER_OVERHEAD_S: dict[str, float] = {"cuda": 65e-6, "metal": 145e-6, "vulkan": 20e-6, "rocm": 30e-6, "cpu": 20e-6,
                                      # a decode class's own (decode_key): Apple's M4 and later GPUs. Fitted on
                                      # the two M4 fit rows (78 M4 Pro, 79 M4 Max, Llama 2 7B Q4_0: 0.86, 0.87 of
                                      # the measured at Metal's 145 us; 0.96, 1.05 at 70). Issue 37 round 22: every
                                      # M4/M5 row had come out 17-36 % slow, small models most (Llama 3.2 1B on an
                                      # M4 Pro 0.72, Qwen3-1.7B 0.67); held-out M4/M5 rows within 25 %: 16 of 25 ->
                                      # 25 of 25
                                      "metal-m4": 70e-6}  # fmt: skip
# The card LAYER_OVERHEAD_S is fitted at: the fixed time per layer is the run time of small, latency-bound kernels
# (norms, rope, the recurrent layers' scans, the router's top-k: a few microseconds each, launched back to back from
# a CUDA graph), which scales with the SM clock, not with the bandwidth: a card at another boost clock takes
# CLOCK_REFERENCE_HZ / its clock times as long (:func:`clock_factor`; profiles/gpus.json boost_clock_mhz). The
# RTX 4090's 2,520 MHz: most rows where the fixed time is most of a token are on it (the "moe-sweep" rows). With it
# the fit (benchmarks/bench_speed.py --fit) keeps 65 us and raises CUDA's dense efficiency from 0.82 to 0.90: the
# slower-clocked cards (Turing, Ampere, A100/H100) had pulled both down. Estimate / measured of the rows it moves
# most: Llama 2 7B on an A100 1.62 -> 1.23 and on an H100 PCIe 1.68 -> 1.45 (fit rows 25, 27); the held-out
# Qwen3.5-35B-A3B on an RTX 3090 1.56 -> 1.25 (row 161) and Qwen3-Coder-Next (80B-A3B hybrid) on an A100 at b10107
# 1.57 -> 0.98 (rows 501-502); fit rows within 25 %: 97 -> 100 of 106; held-out 54 -> 57 of 67.
CLOCK_REFERENCE_HZ = 2_520_000_000
# Extra fixed time per MoE layer and token (s): the router, top-k and the used experts' gathers, a cost that
# would make small experts slower per byte read. Fitted: 0 on every backend with MoE rows (on CUDA MoE
# layers read at a higher fraction of the bandwidth than dense ones; Metal, Vulkan and ROCm read them at
# a lower one: EFFICIENCY's "moe"), kept so that a refit can find it.
MOE_LAYER_OVERHEAD_S: dict[str, float] = {"cuda": 0.0, "metal": 0.0, "vulkan": 0.0, "rocm": 0.0, "cpu": 0.0}


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """Kernels (non-view graph nodes) llama.cpp launches per layer of each kind to decode one token."""

    attention: int  # an attention layer, with its FFN unless the model gives the FFN a layer of its own
    recurrent: int  # a recurrent layer (Gated DeltaNet, Mamba-2, short conv), likewise
    ffn: int = 0  # an FFN-only layer (nemotron_h: one mixer or FFN per layer); 0: the model has none

    @property
    def block(self) -> int:
        """One transformer block's kernels (an attention layer and its FFN): what LAYER_OVERHEAD_S is the time of."""
        return self.attention + self.ffn


# Kernels llama.cpp b11312 (0c1e570) runs per layer kind to decode one token, by architecture and dense / MoE: the
# n_tokens = 1 graph of tests/tinymodels' recipes under llama-fit-params -ub 1 with GGML_SCHED_DEBUG=2 (ggml-backend.cpp
# ggml_backend_sched_print_assignments); tests/test_speed.py recounts every entry on the real binary. A layer's
# fixed time is LAYER_OVERHEAD_S x its kernels / LayerKernels.block, so a plain transformer layer costs
# LAYER_OVERHEAD_S as fitted, and the qwen entries (recurrent / attention, as fitted) are unchanged. qwen35moe builds
# qwen3next's layers (models/qwen35moe.cpp: the same Gated DeltaNet mixer, gated attention and MoE with a shared
# expert). Mamba-2 (granitehybrid, models/granite-hybrid.cpp; nemotron_h): the rs state's zero and copy (SCALE,
# GET_ROWS x2, CPY per state), in_proj, conv, SSM_SCAN, the gated group norm: 27 nodes; LFM2's short conv (lfm2.cpp):
# in_proj, gate, SSM_CONV, out_proj, 2 fewer nodes than its attention with q/k norms. nemotron_h_moe (nemotron-h.cpp):
# a Mamba-2 layer 27, an attention layer 10 (no RoPE), a MoE layer 23 (sigmoid router, top-k, relu^2 experts and the
# shared expert): Nemotron-3-Nano's 23 + 6 + 23 layers cost 36.7 blocks, not 52. lfm2moe's leading dense layers
# (LFM2-8B-A1B: 2 of 24) are counted as MoE ones (10 kernels more). Pure mamba2 has no attention layer to compare
# with and falcon-h1 / jamba were not counted: not listed, every layer costs LAYER_OVERHEAD_S.
DECODE_KERNELS: dict[tuple[str, bool], LayerKernels] = {
    ("qwen35", False): LayerKernels(26, 41),
    ("qwen3next", True): LayerKernels(43, 61),
    ("qwen35moe", True): LayerKernels(43, 61),
    ("granitehybrid", False): LayerKernels(21, 36),
    ("granitehybrid", True): LayerKernels(35, 50),
    ("lfm2", False): LayerKernels(23, 21),
    ("lfm2moe", True): LayerKernels(33, 31),
    ("nemotron_h_moe", True): LayerKernels(10, 27, 23),
}
# Extra work per weight that the batch-1 matrix-vector kernels do to dequantize a 2-3-bit K-quant or an i-quant,
# beyond what its bytes cost: ggml-cuda/mmvq.cu's vec_dot_q2_K_q8_1 / vec_dot_q3_K_q8_1 unpack 2-3-bit values with
# 4-6-bit sub-block scales (and Q3_K's separate high-bit mask), and the i-quants' vec_dot_iq*_q8_1 look each group of
# weights up in a codebook grid (iq2xxs_grid, iq3xxs_grid, ...) and apply its sign mask; more integer work per byte
# than Q4_0/Q4_K/Q8_0, on which EFFICIENCY was fitted (those types: 0). In FLOP-equivalents per weight at the card's
# FP16 peak (Device.flops_per_s, profiles/gpus.json fp16_tflops): a card with more compute per byte of bandwidth pays
# less of it (a 4090 runs IQ3_XXS near its bytes, a 3090 at two thirds of them: llama.cpp#8215). Keyed by the
# file's default tensor type (kvadvise.model.quants.default_type). Fitted so that one model at several quants on
# one card comes out equally far from the measured (benchmarks/bench_speed.py --fit, the "sweep" rows); the
# i-quants without a row take IQ3_XXS's (the same grid lookup), IQ4_NL takes IQ4_XS's (the same non-linear table).
# A MoE's routed experts pay the same per weight (n_weights counts them): at batch 1, GGML_OP_MUL_MAT_ID runs the dense
# kernel with the expert ids (b11312: ggml-cuda.cu ggml_cuda_mul_mat_id -> ggml_cuda_mul_mat_vec_q while ne2 <=
# get_mmvq_mmid_max_batch; mmvq.cu mul_mat_vec_q reads expert ids[channel_dst] as its channel), the same vec_dot per
# weight; one RTX 4090 decoding Qwen3.5-35B-A3B at Q3_K and Q4_K at six builds (the "moe-sweep" rows) puts both files
# within 2 % of each other in estimate / measured with these factors alone. Not modelled: an expert's down projection
# has K = n_ff_exp (512 for qwen35moe: 2 super-blocks), where the K-quants take mmvq's small-K launch
# (should_use_small_k) but IQ3_XXS/IQ3_S on Turing and later do not (iq_slow_turing), leaving most of the block idle
# (llama.cpp#25578: 34.08 us against 12.50 us for the same bytes at K = 2048, RTX 4060 Ti): no decode row to fit it.
DEQUANT_FLOPS_PER_WEIGHT: dict[str, float] = {"Q2_K": 34.0, "Q3_K": 38.0, "IQ3_XXS": 44.0, "IQ4_XS": 38.0}
_DEQUANT_PRIOR = {"IQ1_S": "IQ3_XXS", "IQ1_M": "IQ3_XXS", "IQ2_XXS": "IQ3_XXS", "IQ2_XS": "IQ3_XXS", "IQ2_S": "IQ3_XXS"}
_DEQUANT_PRIOR |= {"IQ3_S": "IQ3_XXS", "IQ4_NL": "IQ4_XS"}
# Extra fixed time per Gated DeltaNet layer and token (s) that older llama.cpp builds take on CUDA, by the first build
# measured without it: one RTX 4090 decoding the same Qwen3.5-35B-A3B files at build after build (jiegec/kb, the
# "moe-sweep" rows of measurements.json: UD-Q3_K_XL 108.8 t/s at b8207, 125.1 at b8286, 164.4 at b8720, 173.7 at
# b8820). The Q3_K and Q4_K files gain the same time per token at each step (b8207 -> b8286: 1.2 and 1.1 ms, b8396 ->
# b8720: 1.75 and 1.7 ms): fewer or cheaper kernels per layer, not the weights' reads. The steps lie between the
# builds measured (b8207 .. b8286, b8396 .. b8720); a build before the first step takes both. Fitted on those rows
# only (benchmarks/bench_speed.py --fit); measured on qwen35moe alone (EARLY_BUILD_ARCHS): the dense qwen35 (27B, 9B)
# on the same card gained less per recurrent layer (b8286 -> b8820: 2.3 ms over 48 layers, 1.1 ms over 24).
EARLY_BUILD_RECURRENT_S: dict[int, float] = {8286: 30e-6, 8720: 65e-6}
# The CPU time per token and vocabulary entry of a repeat, presence or frequency penalty (s): llama-server samples each
# token on the CPU (common/sampling.cpp common_sampler_sample: n_vocab candidates), and llama-sampling.cpp
# llama_sampler_penalties_apply, which returns at once without a penalty, looks every candidate up in its token counts
# with one. Measured side by side on llama-server b11312 (benchmarks/bench_sampling.py: Gemma 3 270M, 262,144 entries,
# +3.3 ms a token with presence_penalty 1.5, +3.7 with repeat_penalty 1.1: 12.7 and 14.3 ns); published: Qwen3.6-27B
# on a GPU at b9746, 33.1 t/s without, 27.5 and 27.3 with either penalty (llama.cpp#24871: 6 ms over 248,320
# entries, 25 ns). llama-bench never samples, so the fit rows cannot see it. Serial with the GPU's work: added as is.
SAMPLER_PENALTY_S_PER_ENTRY = 13e-9
# The CPU time per token and vocabulary entry of sampling itself, with no penalty (s): llama-server's figure
# (timings.predicted_per_token_ms, t_token_generation / n_decoded) runs from the first token to the last, so it holds
# common_sampler_sample (set_logits fills n_vocab candidates, then the default chain) serially with the decode;
# Ollama's eval rate times its runner's loop the same way; llama-bench never samples. Measured side by side
# (benchmarks/bench_server_loop.py, b11312, one CPU thread: llama-server vs llama_decode on two tiny llamas that
# differ only in the vocabulary): 3.72 ns an entry. The same run gives the slot's loop 0.41 ms a token beside it on
# this 2-core server VM; not counted: row 83 (a 1B at 466 t/s through llama-server) bounds it far lower on a desktop.
SAMPLING_S_PER_ENTRY = 3.7e-9


def sampler_penalty_seconds(spec: ModelSpec) -> float:
    """What a sampler penalty adds to each token (:data:`SAMPLER_PENALTY_S_PER_ENTRY` over the vocabulary)."""
    return spec.n_vocab * SAMPLER_PENALTY_S_PER_ENTRY


# A PCIe 4.0 x16 link's sustained rate, either way: the K/V copied to the host for attention on the CPU, and the
# weights kept in RAM copied to the GPU for every ubatch (kvadvise.planner.prefill; fitted on the partial-offload
# prefill rows)
PCIE_BYTES_PER_S = 20_000_000_000


def cpu_attention_seconds(
    spec: ModelSpec, depth: int, type_k: GGMLType, type_v: GGMLType, cpu_bandwidth_bytes_per_s: int
) -> float:
    """What flash attention on the CPU adds to a GPU plan's token at ``depth``: ggml_backend_sched copies each
    attention layer's K and V views (the cells used so far) into host memory for the CPU's op, over PCIe, and the
    CPU reads them (at its K/V efficiency). The splits' synchronisation (two per layer) is not counted."""
    kv = kv_read_bytes(spec, depth, type_k, type_v)
    return kv / PCIE_BYTES_PER_S + kv / (KV_EFFICIENCY["cpu"] * cpu_bandwidth_bytes_per_s)


def sampling_seconds(spec: ModelSpec, *, penalties: bool = False) -> float:
    """The CPU's time a token to sample it (:data:`SAMPLING_S_PER_ENTRY` over the vocabulary), and a penalty's
    pass beside it where one is set."""
    return spec.n_vocab * SAMPLING_S_PER_ENTRY + (sampler_penalty_seconds(spec) if penalties else 0.0)


EARLY_BUILD_ARCHS = frozenset({"qwen35moe"})


def dequant_flops(weight_type: str) -> float:
    """:data:`DEQUANT_FLOPS_PER_WEIGHT` of a tensor type (its prior's for an i-quant without a row; else 0)."""
    t = _DEQUANT_PRIOR.get(weight_type, weight_type)
    return DEQUANT_FLOPS_PER_WEIGHT.get(weight_type, DEQUANT_FLOPS_PER_WEIGHT.get(t, 0.0))


def early_build_seconds(reads: Reads, llama_build: int | None) -> float:
    """The fixed time per token an older llama.cpp build adds to a Gated DeltaNet hybrid on CUDA
    (:data:`EARLY_BUILD_RECURRENT_S`); 0 for an unknown build (planned as the newest), a newer one, or another model."""
    if llama_build is None or reads.architecture not in EARLY_BUILD_ARCHS:
        return 0.0
    return reads.recurrent_layers * sum(
        s for first_without, s in EARLY_BUILD_RECURRENT_S.items() if llama_build < first_without
    )


# measured ÷ estimate: the band around the estimate that held 80 % of the collected rows
RANGE = (0.84, 1.16)  # issue 37 round 22: the M4 class narrowed it from (0.83, 1.20)
# The deepest context of the decode measurements the factors are fitted and checked on, by backend
# (tests/data/speed/measurements.json: context_tokens + n_gen of the rows, fitted and held out; tests/test_speed.py
# recomputes it from the file): a figure at a deeper context is an extrapolation and is labelled so. Up to 4k the
# weights' reads dominate a token's time, so that first figure stands on any backend. A plan with part of the
# model on the CPU: the rows with a partial offload (depth 0 only); a CPU plan: none.
DECODE_MEASURED_DEPTH: dict[str, int] = {"cuda": 32800, "metal": 8192, "vulkan": 128, "rocm": 4160}
PARTIAL_MEASURED_DEPTH = 0
EXTRAPOLATION_FLOOR = 4096
_BACKEND_NAMES = {"cuda": "CUDA", "metal": "Metal", "vulkan": "Vulkan", "rocm": "ROCm", "cpu": "CPU"}
# The CPU's bandwidth when nothing measured or gave one (the API without a budget): dual-channel DDR5.
CPU_BANDWIDTH_BYTES_PER_S = 60_000_000_000
# HIP is ROCm; SYCL has too few published rows of its own: it takes Vulkan's factors (another non-CUDA GPU API).
_BACKEND_ALIASES = {"hip": "rocm", "sycl": "vulkan"}


def backend_key(backend: str) -> str:
    b = backend.lower()
    b = _BACKEND_ALIASES.get(b, b)
    return b if b in EFFICIENCY else "cuda"


def decode_key(backend: str, speed_class: str = "") -> str:
    """The decode efficiency class (:data:`EFFICIENCY`): the backend's, or its architecture class
    ("rocm-gcn") where the card's profile names one."""
    b = backend_key(backend)
    return f"{b}-{speed_class}" if speed_class in DECODE_CLASSES.get(b, ()) else b


def class_label(d: Device) -> str:
    """The decode class a plan's note names: the backend, its class, or the default assumed for a card of unknown
    architecture (given by --vram/--bandwidth) on a backend with classes."""
    b, k = backend_key(d.backend), decode_key(d.backend, d.speed_class)
    if k != b:
        return f"{b}, {d.speed_class.upper()} class"
    if not d.speed_class and b in _DEFAULT_CLASS_NOTE:
        return f"{b}, its default class assumed: {_DEFAULT_CLASS_NOTE[b]}"
    return b


# what a card of unknown architecture (given by --vram/--bandwidth) may decode like, by backend with classes
_DEFAULT_CLASS_NOTE = {
    "rocm": "a GCN card (MI50, MI60, Radeon VII) decodes about half as fast",
    "metal": "an M1 Max/Ultra decodes about 30 % slower, an M4 or later up to 30 % faster (small models most)",
}


@dataclass(frozen=True, slots=True)
class Reads:
    """Bytes one decoded token reads, by part."""

    dense: int  # attention, dense FFN, shared experts, router, output: read for every token
    experts: int  # the routed experts it uses (n_expert_used of n_expert), all layers
    expert_layers: int  # layers with routed experts (to split them per layer for --n-cpu-moe)
    n_layer: int
    moe: bool
    state: int = 0  # recurrent state read and written back (2 x its bytes), all recurrent layers
    recurrent_layers: int = 0
    kernels: LayerKernels | None = None  # the model's kernels per layer kind (DECODE_KERNELS); None: not counted
    weight_type: str = ""  # the file's default tensor type ("Q3_K"), for DEQUANT_FLOPS_PER_WEIGHT; "": unknown
    n_weights: int = 0  # the weights (values) those bytes hold, at the default type's bits per weight
    architecture: str = ""  # llama.cpp's name (qwen35moe), for EARLY_BUILD_RECURRENT_S
    ffn_layers: int = 0  # FFN-only layers (neither recurrent nor attention: nemotron_h's MLP / MoE layers)
    output: int = 0  # of ``dense``: the output matmul's weights (output.weight, or a tied model's token_embd)

    @property
    def layer_units(self) -> float:
        """The layers' fixed time per token in transformer blocks: each layer counts its kernels' share of one."""
        k = self.kernels
        if k is None:
            return float(self.n_layer)
        attention = self.n_layer - self.recurrent_layers - self.ffn_layers
        return (attention * k.attention + self.recurrent_layers * k.recurrent + self.ffn_layers * k.ffn) / k.block


def weight_reads(spec: ModelSpec) -> Reads:
    """The weights one token reads. Without per-part sizes (a bare config), all weights are counted."""
    moe = bool(spec.n_expert and spec.n_expert_used)
    used = 0
    if moe and spec.expert_bytes:
        used = spec.expert_bytes * spec.n_expert_used // spec.n_expert
    tied_output = spec.tok_embd_bytes if spec.output_bytes == 0 else 0  # the output matmul reads the embedding
    # the input layer's tables are looked up a row per token (get_rows), not read whole
    # (a vision/audio tower in the file is loaded, never read to decode a text token: ModelSpec.tower_bytes)
    dense = (
        spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes + tied_output - spec.expert_bytes
        - spec.tower_bytes
    )  # fmt: skip
    layers = _expert_layers(spec) if moe else 0
    n_rec = sum(spec.recurrent_layers[: spec.n_layer])
    state = 2 * 4 * n_rec * (spec.n_embd_r + spec.n_embd_s)  # f32, read then written (memory.recurrent_bytes)
    kernels = DECODE_KERNELS.get((spec.architecture, moe))
    n_ffn = 0
    if kernels is not None and kernels.ffn:  # a layer with neither a recurrent mixer nor K/V heads is its FFN alone
        n_ffn = sum(1 for il in range(spec.n_layer) if not spec.recurrent_layers[il] and not spec.n_head_kv[il])
    wtype, n_weights = _weights_of_type(spec.file_type, max(0, dense) + used)
    return Reads(
        max(0, dense),
        used,
        layers,
        spec.n_layer,
        moe,
        state,
        n_rec,
        kernels,
        wtype,
        n_weights,
        spec.architecture,
        n_ffn,
        spec.output_bytes or tied_output,
    )


def _weights_of_type(file_type: str, n_bytes: int) -> tuple[str, int]:
    """The file's default tensor type and how many weights ``n_bytes`` of it hold (0: a type not known)."""
    from kvadvise.model.quants import default_type

    t = default_type(file_type or "")
    if t is None or t not in GGMLType.__members__:
        return "", 0
    bits = row_bytes(GGMLType[t], 256) * 8 / 256
    return t, int(n_bytes * 8 / bits)


def _expert_layers(spec: ModelSpec) -> int:
    return len(expert_layer_ids(spec))


def expert_layer_ids(spec: ModelSpec) -> tuple[int, ...]:
    """The trunk layers that hold routed experts: those with blk.N.ffn_*_exps tensors where the spec lists them
    (ModelSpec.layer_expert_bytes); else every layer whose weights reach the experts' share per layer (a dense
    first layer, as DeepSeek's and GLM's, is far smaller), else every trunk layer."""
    if spec.layer_expert_bytes and any(spec.layer_expert_bytes):
        return tuple(il for il in range(spec.n_layer) if spec.layer_expert_bytes[il])
    if not spec.n_expert or not spec.expert_bytes or not any(spec.layer_bytes):
        return tuple(range(spec.n_layer)) if spec.n_expert else ()
    trunk = spec.layer_bytes[: spec.n_layer]
    filled = [il for il, b in enumerate(trunk) if b]
    if not filled:
        return tuple(range(spec.n_layer))
    ids = [il for il in filled if trunk[il] >= 0.9 * spec.expert_bytes / len(filled)]
    # a first pass over all layers understates the share where some are dense: settle on the layers found
    ids = [il for il in filled if trunk[il] >= 0.9 * spec.expert_bytes / max(1, len(ids))] or ids
    return tuple(ids) or tuple(filled)


def layer_expert_bytes(spec: ModelSpec) -> tuple[int, ...]:
    """The routed experts' bytes of each block (n_layer_all values): the spec's own where it lists them, else
    expert_bytes spread evenly over :func:`expert_layer_ids` (a model known by its total alone)."""
    if spec.layer_expert_bytes and any(spec.layer_expert_bytes):
        return spec.layer_expert_bytes
    ids = expert_layer_ids(spec) if spec.n_expert and spec.expert_bytes else ()
    per = spec.expert_bytes // len(ids) if ids else 0
    return tuple(per if il in ids else 0 for il in range(spec.n_layer_all))


def _elem_bytes(t: GGMLType) -> float:
    return row_bytes(t, 256) / 256


def kv_read_bytes(spec: ModelSpec, depth: int, type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16) -> int:
    """K/V bytes one token reads at ``depth`` tokens of context (a sliding-window layer: at most its window)."""
    kb, vb = _elem_bytes(type_k), _elem_bytes(type_v)
    total = 0.0
    for il in range(spec.n_layer_all - spec.n_layer_nextn):
        if not spec.kv_layers[il]:
            continue
        cells = min(depth, spec.n_swa) if spec.has_swa and spec.swa_layers[il] and spec.n_swa else depth
        k = spec.n_embd_k_gqa(il) * kb
        v = 0 if spec.is_mla else spec.n_embd_v_gqa(il) * vb
        total += cells * (k + v)
    return int(total)


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as the speed model sees it."""

    backend: str  # cuda | metal | vulkan | rocm | cpu
    bandwidth_bytes_per_s: int
    share: float = 1.0  # of the GPU-resident weights and KV (its layers, llama.cpp's layer split)
    flops_per_s: float = 0.0  # FP16 tensor peak (profiles/gpus.json fp16_tflops); 0: unknown (no prefill)
    name: str = ""  # the card's name or profile id, for the prefill class (kvadvise.planner.prefill.prefill_key)
    speed_class: str = ""  # its profile's decode class (decode_key); "": the backend's default
    clock_hz: float = 0.0  # its boost clock (profiles/gpus.json boost_clock_mhz): the fixed time scales; 0: unknown


def layer_shares(spec: ModelSpec, tensor_split: Sequence[float]) -> tuple[float, ...]:
    """Each device's share of the GPU-resident weights under llama.cpp's layer split (-ts; the output layer
    with the last device), by the layers' bytes when known, else by their count."""
    n_dev = max(1, len(tensor_split))
    if n_dev == 1:
        return (1.0,)
    owner = layer_devices(spec.n_layer_all, tuple(tensor_split))
    per = [0.0] * n_dev
    sizes = list(spec.layer_bytes) if any(spec.layer_bytes) else [1.0] * spec.n_layer_all
    for il in range(spec.n_layer_all):
        per[owner[il]] += sizes[il]
    out_w = (spec.output_bytes or spec.tok_embd_bytes) if any(spec.layer_bytes) else 0
    per[owner[spec.n_layer_all]] += out_w
    total = sum(per) or 1.0
    return tuple(p / total for p in per)


def devices(
    spec: ModelSpec,
    backend: str,
    bandwidths: Sequence[int],
    tensor_split: Sequence[float] = (),
    flops: Sequence[float] = (),
    names: Sequence[str] = (),
    classes: Sequence[str] = (),
    clocks_hz: Sequence[float] = (),
) -> list[Device]:
    """The GPUs of a plan, each with its own bandwidth, compute and clock, its share of the layers and its decode
    class."""
    n = len(bandwidths)
    shares = layer_shares(spec, tensor_split) if n > 1 and len(tensor_split) == n else (1 / max(1, n),) * n
    fl = list(flops) if len(flops) == n else [0.0] * n
    ids = list(names) if len(names) == n else [""] * n
    cls = list(classes) if len(classes) == n else [""] * n
    clk = list(clocks_hz) if len(clocks_hz) == n else [0.0] * n
    return [
        Device(backend, bw, s, f, i, c, hz)
        for bw, s, f, i, c, hz in zip(bandwidths, shares, fl, ids, cls, clk, strict=True)
    ]


def seconds_per_token(
    reads: Reads,
    kv_bytes: int,
    devices: Sequence[Device],
    *,
    cpu_expert_layers: float = 0,
    cpu_dense_fraction: float = 0.0,
    cpu_bandwidth_bytes_per_s: int = CPU_BANDWIDTH_BYTES_PER_S,
    llama_build: int | None = None,
    cpu_output: bool = False,
) -> float:
    """Time per token: each device's reads at its efficiency, plus the per-layer overhead, added up.

    ``cpu_expert_layers``: layers whose experts stay on the CPU (--n-cpu-moe; a fraction of one where the plan keeps
    part of its experts on the GPU, Offload.expert_overflow);
    ``cpu_dense_fraction``: the share of the other weights and KV on the CPU (whole layers kept there);
    ``cpu_output``: the output layer's weights on the CPU too (a build before builds.OUTPUT_FIRST at a partial -ngl);
    ``llama_build``: the build that runs it (None: the newest; an older one may take longer, :func:`early_build_seconds`).
    """
    kind = "moe" if reads.moe else "dense"
    cpu_exp = (
        reads.experts * min(cpu_expert_layers, reads.expert_layers) // reads.expert_layers if reads.expert_layers else 0
    )
    cpu_w = (reads.dense + reads.experts - cpu_exp) * cpu_dense_fraction + cpu_exp
    if cpu_output:
        cpu_w += reads.output * (1 - cpu_dense_fraction)
    kv_bytes += reads.state  # the recurrent state streams like the K/V (small reads per head, at its efficiency)
    cpu_kv = kv_bytes * cpu_dense_fraction
    if not devices:
        cpu_w, cpu_kv = reads.dense + reads.experts, kv_bytes
    gpu_w = reads.dense + reads.experts - cpu_w
    gpu_kv = kv_bytes - cpu_kv
    t = 0.0
    lead = backend_key(devices[0].backend) if devices else "cpu"
    # the GPUs' share of the dequantization work (a card of unknown compute: none counted)
    dequant = reads.n_weights * dequant_flops(reads.weight_type) * gpu_w / max(1, reads.dense + reads.experts)
    # the GPUs' routed experts at the MoE efficiency (GGML_OP_MUL_MAT_ID), the rest (attention, shared experts,
    # output) at the dense one: gpt-oss's BF16 attention and 1.2 GB output beside its small MXFP4 experts
    gpu_exp = min(gpu_w, (reads.experts - cpu_exp) * (1 - cpu_dense_fraction)) if devices else 0.0
    if reads.moe and not reads.experts:  # a MoE without per-part sizes: the whole model at the MoE efficiency
        gpu_exp = gpu_w
    for d in devices:
        b = backend_key(d.backend)
        eff = EFFICIENCY[decode_key(d.backend, d.speed_class)]
        t += gpu_exp * d.share / (eff["moe"] * d.bandwidth_bytes_per_s)
        t += (gpu_w - gpu_exp) * d.share / (eff["dense"] * d.bandwidth_bytes_per_s)
        t += gpu_kv * d.share / (KV_EFFICIENCY[b] * d.bandwidth_bytes_per_s)
        if d.flops_per_s:
            t += dequant * d.share / d.flops_per_s
    if cpu_w or cpu_kv:
        w_rate = EFFICIENCY["cpu"][kind] * cpu_bandwidth_bytes_per_s
        kv_rate = KV_EFFICIENCY["cpu"] * cpu_bandwidth_bytes_per_s
        for d in devices:
            if backend_key(d.backend) == "metal":  # one memory: the CPU cores never read it faster than the GPU does
                w_rate = min(w_rate, EFFICIENCY[decode_key(d.backend, d.speed_class)][kind] * d.bandwidth_bytes_per_s)
                kv_rate = min(kv_rate, KV_EFFICIENCY["metal"] * d.bandwidth_bytes_per_s)
        t += cpu_w / w_rate + cpu_kv / kv_rate
    # the lead device's decode class may have its own fixed time (a newer Apple GPU's), else its backend's
    layer_s = LAYER_OVERHEAD_S[lead]
    if devices:
        layer_s = LAYER_OVERHEAD_S.get(decode_key(devices[0].backend, devices[0].speed_class), layer_s)
    fixed = reads.layer_units * layer_s + reads.expert_layers * MOE_LAYER_OVERHEAD_S[lead]
    if lead == "cuda":  # measured on CUDA only
        fixed += early_build_seconds(reads, llama_build)
    return t + fixed * clock_factor(devices)


def clock_factor(devices: Sequence[Device]) -> float:
    """How much longer than on the reference card (:data:`CLOCK_REFERENCE_HZ`) the fixed time per layer takes on
    ``devices``: each runs its share of the layers at its own clock (one after another); a device of unknown clock,
    or not run by CUDA, takes the reference's."""
    if not devices:
        return 1.0
    # a share of 0 or NaN (a hand-made Device) weighs nothing; none left: each device alike (a factor of 0 took the
    # fixed time away)
    shares = [d.share if isinstance(d.share, (int, float)) and math.isfinite(d.share) and d.share > 0 else 0.0
              for d in devices]  # fmt: skip
    if not sum(shares):
        shares = [1.0] * len(devices)
    factors = [
        CLOCK_REFERENCE_HZ / d.clock_hz if _known_clock(d) and backend_key(d.backend) == "cuda" else 1.0
        for d in devices
    ]
    return sum(s * f for s, f in zip(shares, factors, strict=True)) / sum(shares)


def _known_clock(d: Device) -> bool:
    """A clock to scale by: a positive, finite figure (0: unknown; a hand-made Device's NaN, inf or negative
    took the fixed time to NaN, to nothing or below zero)."""
    return isinstance(d.clock_hz, (int, float)) and math.isfinite(d.clock_hz) and d.clock_hz > 0


@dataclass(frozen=True, slots=True)
class SpeedEstimate:
    """Decode speed for one sequence, with its calibrated range and how it was worked out."""

    tokens_per_s: float
    low: float
    high: float
    points: tuple[tuple[int, float], ...]  # (context, tokens/s): the figure at a few depths
    note: str
    # the deepest context the measurements it is calibrated on reach (at least 4k): a point past it is an
    # extrapolation, and says so (:data:`DECODE_MEASURED_DEPTH`)
    measured_depth: int = 1 << 62
    measured_what: str = ""  # which measurements: "CUDA", "Metal", "part on the CPU"...
    ram_bandwidth_bytes_per_s: int | None = None  # the system memory's, where the CPU reads a share
    ram_bandwidth_source: str | None = None
    # a card given by its size (--vram): the figures over the catalogue's cards of that size, (context, lowest,
    # highest) per depth, and which cards; points then hold the middle card's
    spread: tuple[tuple[int, float, float], ...] = ()
    spread_over: str = ""

    def text(self) -> str:
        if self.spread:
            return self.at_depths()
        return f"{self.at_depths()} (range {tps_label(self.low)} to {tps_label(self.high)} t/s at {ctx_label(self.points[0][0])})"

    def extrapolated(self, depth: int) -> bool:
        return depth > self.measured_depth

    def at_depths(self) -> str:
        """``≈ 25 t/s at 4k, ≈ 17 t/s at 64k (extrapolated: CUDA measured to 32k)``"""
        if self.spread:
            s = ", ".join(
                f"≈ {tps_label(lo)} to {tps_label(hi)} t/s at {ctx_label(c)}"
                if tps_label(lo) != tps_label(hi)
                else f"≈ {tps_label(lo)} t/s at {ctx_label(c)}"
                for c, lo, hi in self.spread
            )
            return s + self.extrapolation_note() + f"; {self.spread_over}"  # where the range comes from, last
        s = ", ".join(f"≈ {tps_label(tps)} t/s at {ctx_label(c)}" for c, tps in self.points)
        return s + self.extrapolation_note()

    def extrapolation_note(self) -> str:
        if not any(self.extrapolated(c) for c, _ in self.points):
            return ""
        return f" (past {_k(self.measured_depth)}: extrapolated)"


def _k(n: int) -> str:
    """32800 -> "32k": a depth in whole k, rounded down."""
    return f"{n // 1024}k" if n >= 1024 else f"{n:,}"


def tps_label(tps: float) -> str:
    """25.3 -> "25"; 0.62 -> "0.6"; 0.04 -> "0.04": tokens a second, never "0" for a plan that runs (a 70B model
    mostly in slow RAM decodes below one token a second)."""
    if tps >= 0.95:
        return f"{tps:,.0f}"
    return f"{tps:.1f}" if tps >= 0.095 else f"{tps:.2g}"


def ctx_label(n: int) -> str:
    """4096 -> "4k"; 1000 -> "1,000"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def estimate(
    spec: ModelSpec,
    n_ctx: int,
    devices: Sequence[Device],
    *,
    type_k: GGMLType = GGMLType.F16,
    type_v: GGMLType = GGMLType.F16,
    cpu_expert_layers: float = 0,
    cpu_dense_fraction: float = 0.0,
    cpu_bandwidth_bytes_per_s: int = CPU_BANDWIDTH_BYTES_PER_S,
    source: str | None = None,
    cpu_bandwidth_source: str | None = None,
    llama_build: int | None = None,
    cpu_output: bool = False,
    sampling_penalties: bool = False,
    cpu_attention: bool = False,
) -> SpeedEstimate | None:
    """Decode speed of one sequence at 4k and at ``n_ctx`` tokens of context (None: nothing to go on).
    ``cpu_attention``: flash attention runs on the CPU (no CUDA kernel for the cache: :func:`cpu_attention_seconds`).
    No ``devices``: a CPU plan, everything read at ``cpu_bandwidth_bytes_per_s``; ``llama_build``: the build
    that runs it (None: the newest). Every runtime samples each token on the CPU (:data:`SAMPLING_S_PER_ENTRY` over
    the vocabulary); ``sampling_penalties``: its sampler applies a penalty too (:data:`SAMPLER_PENALTY_S_PER_ENTRY`)."""
    if not spec.weights_bytes or (devices and not all(d.bandwidth_bytes_per_s for d in devices)):
        return None
    reads = weight_reads(spec)
    depths = sorted({min(4096, n_ctx), n_ctx}) if n_ctx > 0 else [4096]
    sampler = sampling_seconds(spec, penalties=sampling_penalties)
    pts = []
    for depth in depths:
        t = seconds_per_token(
            reads,
            kv_read_bytes(spec, depth, type_k, type_v),
            devices,
            cpu_expert_layers=cpu_expert_layers,
            cpu_dense_fraction=cpu_dense_fraction,
            cpu_bandwidth_bytes_per_s=cpu_bandwidth_bytes_per_s,
            llama_build=llama_build,
            cpu_output=cpu_output,
        )
        if cpu_attention:
            t += cpu_attention_seconds(spec, depth, type_k, type_v, cpu_bandwidth_bytes_per_s)
        pts.append((depth, 1 / (t + sampler)))
    first = pts[0][1]
    kind = "MoE" if reads.moe else "dense"
    bw = " + ".join(
        f"{d.bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({class_label(d)}"
        + (f", {d.share:.0%} of the layers" if len(devices) > 1 else "")
        + ")"
        for d in devices
    )
    on_cpu = not devices or cpu_expert_layers or cpu_dense_fraction or cpu_output
    if on_cpu:
        cpu = f"{cpu_bandwidth_bytes_per_s / 1e9:,.0f} GB/s system memory" + (
            f" ({cpu_bandwidth_source})" if cpu_bandwidth_source else ""
        )
        bw = f"{bw} and {cpu}" if bw else cpu
    note = (
        f"estimate for one sequence: {(reads.dense + reads.experts) / 1e9:.2f} GB of weights read per token "
        f"({kind}{', only the experts in use' if reads.moe and reads.experts else ''}) plus the K/V up to the depth, "
        f"at {bw}"
        + (f" (bandwidth: {source})" if source and devices else "")
        + f"; the runtime samples each token on the CPU over all {spec.n_vocab:,} candidates"
        + (", and the sampler's penalty visits them all again" if sampling_penalties else "")
        + f": +{sampler * 1e3:.1f} ms counted (llama-bench does not sample)"
        + f"; calibrated on published measurements (80 % within {RANGE[0]:.0%} to {RANGE[1]:.0%}); "
        "`kvadvise verify` measures the real figure"
    )
    if reads.moe and not spec.expert_bytes:
        note += "; MoE expert sizes are unknown, so every expert is counted (a low estimate)"
    lead = backend_key(devices[0].backend) if devices else "cpu"
    factor = clock_factor(devices)
    early = early_build_seconds(reads, llama_build) * factor if lead == "cuda" else 0.0
    if early:
        note += (
            f"; llama.cpp b{llama_build} decodes this hybrid slower than b{max(EARLY_BUILD_RECURRENT_S)} and later: "
            f"+{early * 1e3:.1f} ms a token counted (measured on an RTX 4090)"
        )
    elif lead == "cuda" and llama_build is None and reads.architecture in EARLY_BUILD_ARCHS:
        slowest = early_build_seconds(reads, min(EARLY_BUILD_RECURRENT_S) - 1) * factor
        note += (
            f"; planned for llama.cpp b{max(EARLY_BUILD_RECURRENT_S)} or later: a build before it decodes this hybrid "
            f"up to {slowest * 1e3:.1f} ms a token slower (--llama-build bNNNN names yours)"
        )
    if cpu_attention:
        at = pts[-1][0]
        note += (
            f"; flash attention runs on the CPU (no CUDA kernel for this cache): each token copies the K/V read so "
            f"far to the host over PCIe ({PCIE_BYTES_PER_S / 1e9:.0f} GB/s) and reads it there, "
            f"+{cpu_attention_seconds(spec, at, type_k, type_v, cpu_bandwidth_bytes_per_s) * 1e3:,.1f} ms a token "
            f"at {at:,} tokens counted (the graph splits' own time is not)"
        )
    if factor != 1.0:
        note += (
            f"; the fixed time per layer at the card's boost clock: {factor:.2f}x the "
            f"{CLOCK_REFERENCE_HZ / 1e6:,.0f} MHz it was measured at"
        )
    if not devices:
        measured, what = 0, "CPU-only"
    elif on_cpu:
        measured, what = PARTIAL_MEASURED_DEPTH, f"{_BACKEND_NAMES[lead]} partial-offload"
    else:
        measured, what = DECODE_MEASURED_DEPTH.get(lead, 0), _BACKEND_NAMES[lead]
    return SpeedEstimate(
        first,
        first * RANGE[0],
        first * RANGE[1],
        tuple(pts),
        note,
        measured_depth=max(measured, EXTRAPOLATION_FLOOR),
        measured_what=what,
        ram_bandwidth_bytes_per_s=cpu_bandwidth_bytes_per_s if on_cpu else None,
        ram_bandwidth_source=cpu_bandwidth_source if on_cpu else None,
    )


# -- a plan's devices -----------------------------------------------------------------------------


def plan_devices(spec: ModelSpec, budget: Budget, tensor_split: Sequence[float] = ()) -> list[Device] | None:
    """The GPUs of ``budget`` as the speed model sees them: each with its own bandwidth, compute and share
    of the layers (``tensor_split``: llama.cpp's -ts, by default each GPU's free memory). [] for a CPU
    budget; None when a GPU's bandwidth is unknown."""
    if budget.device == "cpu" or not budget.n_gpu:
        return []
    n = budget.n_gpu
    bws = budget.device_bandwidths
    if len(bws) != n:
        if not budget.bandwidth_bytes_per_s:
            return None
        bws = (budget.bandwidth_bytes_per_s,) * n
    split = tuple(tensor_split) or tuple(float(f) for f in budget.device_free)
    return devices(
        spec, budget.backend, bws, split, budget.device_flops, budget.device_names, budget.device_classes,
        budget.device_clocks_hz,
    )  # fmt: skip


def ram_bandwidth(budget: Budget) -> tuple[int, str]:
    """The system memory's bandwidth: --ram-bandwidth (or a Mac of the card list's unified memory), else this
    machine's, measured once and cached."""
    if budget.ram_bandwidth_bytes_per_s:
        return budget.ram_bandwidth_bytes_per_s, budget.ram_bandwidth_source
    from kvadvise.planner.cpuspeed import measured_bandwidth

    r = measured_bandwidth()
    return r.bytes_per_s, r.source


def cpu_expert_layers(spec: ModelSpec, n_cpu_moe: int, gpu_overflow_bytes: int = 0) -> float:
    """How many of the first ``n_cpu_moe`` layers hold routed experts (--n-cpu-moe moves only those), less the share
    of block ``n_cpu_moe - 1``'s experts that ``gpu_overflow_bytes`` keeps on the GPU (Offload.expert_overflow: its
    ffn_up_exps, or up and gate, read there; a token reads the same share of each used expert's up, gate and down)."""
    if not n_cpu_moe or not spec.n_expert:
        return 0
    n = sum(1 for il in expert_layer_ids(spec) if il < n_cpu_moe)
    block = spec.layer_expert_bytes[n_cpu_moe - 1] if n_cpu_moe <= len(spec.layer_expert_bytes) else 0
    if gpu_overflow_bytes and block:
        return n - min(gpu_overflow_bytes, block) / block
    return n


def plan_decode(
    spec: ModelSpec,
    cfg: RunConfig,
    budget: Budget,
    *,
    n_cpu_moe: int = 0,
    n_cpu_layers: int = 0,
    cpu_output: bool = False,
    gpu_overflow_bytes: int = 0,
) -> SpeedEstimate | None:
    """Decode of one sequence at 4k and at the planned context for the plan's hardware: its GPUs, each
    at its bandwidth and share, and what stays on the CPU (the experts of the first ``n_cpu_moe`` layers but the
    ``gpu_overflow_bytes`` of block ``n_cpu_moe - 1``'s kept on the GPU, the first ``n_cpu_layers`` whole, the output
    layer with ``cpu_output``) at the system memory's bandwidth; a CPU plan at that bandwidth."""
    from kvadvise.planner.memory import mla_as_built  # memory loads the graph port: only for a plan

    spec = mla_as_built(spec, cfg.llama_build)  # an older build reads the per-head K/V of its cache
    devs = plan_devices(spec, budget, cfg.tensor_split)
    if devs is None:
        return _over_cards_of_the_size(
            spec, cfg, budget, n_cpu_moe=n_cpu_moe, n_cpu_layers=n_cpu_layers, cpu_output=cpu_output,
            gpu_overflow_bytes=gpu_overflow_bytes,
        )  # fmt: skip
    from kvadvise.planner.memory import attention_on_cpu  # memory loads the graph port: only for a plan

    cpu_attention = bool(devs) and attention_on_cpu(spec, cfg)
    on_cpu = not devs or n_cpu_moe or n_cpu_layers or cpu_output or cpu_attention
    cpu_bw, cpu_src = ram_bandwidth(budget) if on_cpu else (CPU_BANDWIDTH_BYTES_PER_S, None)
    n_seq = cfg.n_ctx // max(1, cfg.n_parallel) if cfg.n_ctx else spec.n_ctx_train
    return estimate(
        spec,
        n_seq,
        devs,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        cpu_expert_layers=cpu_expert_layers(spec, n_cpu_moe, gpu_overflow_bytes),
        cpu_dense_fraction=n_cpu_layers / max(1, spec.n_layer),
        cpu_bandwidth_bytes_per_s=cpu_bw,
        source=budget.bandwidth_source,
        cpu_bandwidth_source=cpu_src,
        llama_build=cfg.llama_build,
        cpu_output=cpu_output,
        sampling_penalties=cfg.sampling_penalties,
        cpu_attention=cpu_attention,
    )


SIZE_MATCH = 0.03  # a catalogue card "of that size": its published memory within 3 % of the --vram given


def _over_cards_of_the_size(
    spec: ModelSpec, cfg: RunConfig, budget: Budget, *, n_cpu_moe: int, n_cpu_layers: int, cpu_output: bool = False,
    gpu_overflow_bytes: int = 0,
) -> SpeedEstimate | None:  # fmt: skip
    """A card given by its size (``--vram 8GiB``, no ``--bandwidth``): its speed is that of the catalogue's
    cards of that size (profiles/gpus.json), from the slowest to the fastest memory, with the CPU's share
    (the part kept in RAM, most of the time per token of a partial plan) at this machine's bandwidth."""
    if budget.source != "manual" or budget.n_gpu != 1:
        return None
    from dataclasses import replace
    from statistics import median

    from kvadvise.planner.gpus import load_profiles

    size = budget.total_bytes
    cards = sorted(
        (p for p in load_profiles() if not p.unified_memory and abs(p.memory_bytes - size) <= SIZE_MATCH * size),
        key=lambda p: p.bandwidth_bytes_per_s,
    )
    if not cards:
        return None
    ests = []
    for p in cards:
        at = replace(
            budget,
            bandwidth_bytes_per_s=p.bandwidth_bytes_per_s,
            device_bandwidths=(p.bandwidth_bytes_per_s,),
            # --device rocm|vulkan said which backend runs the card: every card of the size is timed on it;
            # else (a --vram budget's default, CUDA) each card on its own (profiles/gpus.json "backend")
            backend=budget.backend if budget.backend != "cuda" else p.backend,
            bandwidth_source=p.source,
            # and at its own clock (the budget's card, given by its size, has none: factor 1 for every card)
            device_clocks_hz=(p.clock_hz,),
        )
        e = plan_decode(
            spec, cfg, at, n_cpu_moe=n_cpu_moe, n_cpu_layers=n_cpu_layers, cpu_output=cpu_output,
            gpu_overflow_bytes=gpu_overflow_bytes,
        )  # fmt: skip
        if e is not None:
            ests.append(e)
    if not ests:
        return None
    mid = ests[len(ests) // 2]
    spread = tuple(
        (c, min(e.points[i][1] for e in ests), max(e.points[i][1] for e in ests)) for i, (c, _) in enumerate(mid.points)
    )
    names = ", ".join(f"{p.id} {p.bandwidth_bytes_per_s / 1e9:,.0f} GB/s" for p in cards)
    lo_bw, hi_bw = cards[0].bandwidth_bytes_per_s / 1e9, cards[-1].bandwidth_bytes_per_s / 1e9
    over = f"{len(cards)} catalogue card(s) of {size / (1 << 30):g} GiB: {lo_bw:,.0f}-{hi_bw:,.0f} GB/s"
    return replace(
        mid,
        tokens_per_s=median(e.tokens_per_s for e in ests),
        low=spread[0][1],
        high=spread[0][2],
        spread=spread,
        spread_over=over,
        note=f"a card given by its size: {over} ({names}); the middle one's figures: {mid.note}",
    )
