"""Decode speed: how many tokens per second one sequence generates, from memory bandwidth.

Decode of one sequence is bound by memory reads: each token reads every
weight it uses once, and the K/V of the tokens before it. Per token:

- weights: everything but the token embedding (one row is looked up), and of
  the routed experts only ``n_expert_used`` of ``n_expert`` (shared experts,
  attention, router and output always);
- K/V: every KV layer's cells up to the depth (a sliding-window layer at most
  its window), at the cache type's bytes.

Each device reads its share at a measured fraction of its published bandwidth
(:data:`EFFICIENCY`, by backend and by dense or MoE model), and each token
costs a fixed time per layer on top (:data:`LAYER_OVERHEAD_S`: kernel launches
and synchronisation, what bounds tiny models and fast cards). With several
devices, or part of the model on the CPU, the devices run one after another:
their times add up.

The factors are fitted on published measurements (tests/data/speed/
measurements.json, with sources; ``benchmarks/bench_speed.py`` prints the
estimate ÷ measured of every row). :data:`RANGE` is the spread of measured ÷
estimate that covers 80 % of those rows: the range a plan prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvadvise.model.ggml import GGMLType, row_bytes
from kvadvise.model.spec import ModelSpec

# Fraction of the published bandwidth decode reaches, by backend and kind of model (fitted, see module doc).
# CPU: not fitted (no clean rows); the usual 0.6 of a dual-channel DDR5 system for dense reads.
EFFICIENCY: dict[str, dict[str, float]] = {
    "cuda": {"dense": 0.80, "moe": 0.88},
    "metal": {"dense": 0.72, "moe": 0.42},
    "vulkan": {"dense": 0.82, "moe": 0.52},
    "cpu": {"dense": 0.60, "moe": 0.50},
}
# Fraction of the bandwidth reading the K/V reaches (attention kernels are less efficient than matmuls; fitted).
# Vulkan: no row at depth, so CUDA's figure; CPU: a guess.
KV_EFFICIENCY: dict[str, float] = {"cuda": 0.68, "metal": 0.10, "vulkan": 0.68, "cpu": 0.3}
# Fixed time per layer and token (s): launches, syncs, small ops (fitted).
LAYER_OVERHEAD_S: dict[str, float] = {"cuda": 65e-6, "metal": 110e-6, "vulkan": 15e-6, "cpu": 20e-6}
# measured ÷ estimate: the band around the estimate that held 80 % of the collected rows
RANGE = (0.85, 1.25)
# Typical dual-channel DDR5 throughput, for the CPU share of a partial offload (no probe reads it).
CPU_BANDWIDTH_BYTES_PER_S = 60_000_000_000
# ROCm/HIP has too few published rows of its own: it takes Vulkan's factors (another non-CUDA GPU API).
_BACKEND_ALIASES = {"rocm": "vulkan", "hip": "vulkan", "sycl": "vulkan"}


def backend_key(backend: str) -> str:
    b = backend.lower()
    b = _BACKEND_ALIASES.get(b, b)
    return b if b in EFFICIENCY else "cuda"


@dataclass(frozen=True, slots=True)
class Reads:
    """Bytes one decoded token reads, by part."""

    dense: int  # attention, dense FFN, shared experts, router, output: read for every token
    experts: int  # the routed experts it uses (n_expert_used of n_expert), all layers
    expert_layers: int  # layers with routed experts (to split them per layer for --n-cpu-moe)
    n_layer: int
    moe: bool


def weight_reads(spec: ModelSpec) -> Reads:
    """The weights one token reads. Without per-part sizes (a bare config), all weights are counted."""
    moe = bool(spec.n_expert and spec.n_expert_used)
    used = 0
    if moe and spec.expert_bytes:
        used = spec.expert_bytes * spec.n_expert_used // spec.n_expert
    tied_output = spec.tok_embd_bytes if spec.output_bytes == 0 else 0  # the output matmul reads the embedding
    dense = spec.weights_bytes - spec.tok_embd_bytes + tied_output - spec.expert_bytes
    layers = sum(1 for b in spec.layer_bytes if b) if spec.layer_bytes else spec.n_layer
    return Reads(max(0, dense), used, layers if moe else 0, spec.n_layer, moe)


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
    backend: str  # cuda | metal | vulkan | rocm | cpu
    bandwidth_bytes_per_s: int
    share: float = 1.0  # of the GPU-resident weights and KV (layer split across several GPUs)


def seconds_per_token(
    reads: Reads,
    kv_bytes: int,
    devices: Sequence[Device],
    *,
    cpu_expert_layers: int = 0,
    cpu_dense_fraction: float = 0.0,
    cpu_bandwidth_bytes_per_s: int = CPU_BANDWIDTH_BYTES_PER_S,
) -> float:
    """Time per token: each device's reads at its efficiency, plus the per-layer overhead, added up.

    ``cpu_expert_layers``: layers whose experts stay on the CPU (--n-cpu-moe);
    ``cpu_dense_fraction``: the share of the other weights and KV on the CPU (whole layers kept there).
    """
    kind = "moe" if reads.moe else "dense"
    cpu_exp = reads.experts * cpu_expert_layers // reads.expert_layers if reads.expert_layers else 0
    cpu_w = (reads.dense + reads.experts - cpu_exp) * cpu_dense_fraction + cpu_exp
    cpu_kv = kv_bytes * cpu_dense_fraction
    if not devices:
        cpu_w, cpu_kv = reads.dense + reads.experts, kv_bytes
    gpu_w = reads.dense + reads.experts - cpu_w
    gpu_kv = kv_bytes - cpu_kv
    t = 0.0
    lead = backend_key(devices[0].backend) if devices else "cpu"
    for d in devices:
        b = backend_key(d.backend)
        t += gpu_w * d.share / (EFFICIENCY[b][kind] * d.bandwidth_bytes_per_s)
        t += gpu_kv * d.share / (KV_EFFICIENCY[b] * d.bandwidth_bytes_per_s)
    if cpu_w or cpu_kv:
        t += cpu_w / (EFFICIENCY["cpu"][kind] * cpu_bandwidth_bytes_per_s)
        t += cpu_kv / (KV_EFFICIENCY["cpu"] * cpu_bandwidth_bytes_per_s)
    t += reads.n_layer * LAYER_OVERHEAD_S[lead]
    return t


@dataclass(frozen=True, slots=True)
class SpeedEstimate:
    tokens_per_s: float
    low: float
    high: float
    points: tuple[tuple[int, float], ...]  # (context, tokens/s): the figure at a few depths
    note: str

    def text(self) -> str:
        return f"{self.at_depths()} (range {self.low:,.0f} to {self.high:,.0f} t/s at {ctx_label(self.points[0][0])})"

    def at_depths(self) -> str:
        """``≈ 25 t/s at 4k, ≈ 17 t/s at 64k``"""
        return ", ".join(f"≈ {tps:,.0f} t/s at {ctx_label(c)}" for c, tps in self.points)


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
    cpu_expert_layers: int = 0,
    cpu_dense_fraction: float = 0.0,
    cpu_bandwidth_bytes_per_s: int = CPU_BANDWIDTH_BYTES_PER_S,
    source: str | None = None,
) -> SpeedEstimate | None:
    """Decode speed of one sequence at 4k and at ``n_ctx`` tokens of context (None: nothing to go on)."""
    if not spec.weights_bytes or (devices and not all(d.bandwidth_bytes_per_s for d in devices)):
        return None
    reads = weight_reads(spec)
    depths = sorted({min(4096, n_ctx), n_ctx}) if n_ctx > 0 else [4096]
    pts = []
    for depth in depths:
        t = seconds_per_token(
            reads,
            kv_read_bytes(spec, depth, type_k, type_v),
            devices,
            cpu_expert_layers=cpu_expert_layers,
            cpu_dense_fraction=cpu_dense_fraction,
            cpu_bandwidth_bytes_per_s=cpu_bandwidth_bytes_per_s,
        )
        pts.append((depth, 1 / t))
    first = pts[0][1]
    kind = "MoE" if reads.moe else "dense"
    bw = " + ".join(f"{d.bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({backend_key(d.backend)})" for d in devices)
    note = (
        f"estimate for one sequence: {(reads.dense + reads.experts) / 1e9:.2f} GB of weights read per token "
        f"({kind}{', only the experts in use' if reads.moe and reads.experts else ''}) plus the K/V up to the depth, "
        f"at {bw}"
        + (f" (bandwidth: {source})" if source else "")
        + f"; calibrated on published measurements (80 % within {RANGE[0]:.0%} to {RANGE[1]:.0%}); "
        "`kvadvise verify` measures the real figure"
    )
    if reads.moe and not spec.expert_bytes:
        note += "; MoE expert sizes are unknown, so every expert is counted (a low estimate)"
    return SpeedEstimate(first, first * RANGE[0], first * RANGE[1], tuple(pts), note)
