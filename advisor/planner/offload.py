"""Partial offload (``--allow-cpu``): how much of the model stays in RAM for a context the GPU alone
cannot hold, and what that costs. One entry point, :func:`plan_offload`, for a recommended plan and
for a ``--ctx`` given by hand; the cache types it may turn to are the policy's
(kvadvise.planner.policy.allowed_kvs).

The GPU's extra compute under partial offload is llama.cpp's op offload.

llama.cpp 0c1e570, ggml/src/ggml-backend.cpp:
- ggml_backend_sched_backend_id_from_cur: an op whose weight sits in a host buffer (a layer kept on the
  CPU) is given to a higher-priority backend that wants it (cause "1.off"): sched->op_offload (on by
  default; llama-server --no-op-offload) and the device's offload_op, which for CUDA is a batch of at
  least 32 rows (ggml-cuda.cu get_op_batch_size / op_offload_min_batch_size, GGML_OP_OFFLOAD_MIN_BATCH)
  and for Metal a MUL_MAT / MUL_MAT_ID of such a batch; ggml-rpc has none.
- ggml-org/llama.cpp#6083 moved this into the scheduler: the weights are copied into the compute buffer,
  which grows markedly under partial offload.
- ggml_backend_sched_split_graph: such a weight is an input of the GPU split and is copied into the
  GPU's compute buffer; a weight the GPU cannot read in place starts a new split ("by starting a new
  split, the memory of the previously offloaded weights can be reused"), so one copy is alive at a time.

The graph llama.cpp reserves is a prompt batch of n_ubatch tokens (sched_reserve), so with
n_ubatch >= 32 the GPU's compute buffer grows by the largest weight kept on the CPU, however few
layers that is: kvadvise adds the largest tensor of the CPU-resident blocks (as a CUDA buffer sizes
it) to the full-offload device compute. An estimate, not measured here: an upper bound where that copy
and the activation peak are not alive together (no CUDA or Metal device in the test suite; ggml-rpc
does not op-offload, so the loopback RPC runs cannot show it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import speed as speed_model
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate, layer_kv_bytes, resolve
from kvadvise.planner.policy import KV, Policy, allowed_kvs, config_at, kv_name

GIB = 1 << 30
MIB = 1 << 20

OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu: GGML_OP_OFFLOAD_MIN_BATCH's default
OP_OFFLOAD_DEVICES = ("cuda", "metal")  # backends with an offload_op (not ggml-rpc)


def op_offload_bytes(spec: ModelSpec, cpu_blocks: Iterable[int], device: str, n_ubatch: int) -> int | None:
    """The copy of the largest CPU-resident weight the GPU's compute buffer holds; 0 where nothing is
    op-offloaded, None where the per-tensor sizes are unknown (a model planned from a profile)."""
    if device not in OP_OFFLOAD_DEVICES or n_ubatch < OP_OFFLOAD_MIN_BATCH:
        return 0
    blocks = list(cpu_blocks)
    if not blocks:
        return 0
    if not spec.layer_largest_tensor_bytes:
        return None
    return max(spec.layer_largest_tensor_bytes[il] for il in blocks)


@dataclass(frozen=True, slots=True)
class Offload:
    """A plan that leaves part of the model in RAM (--allow-cpu): layers or experts on the CPU."""

    n_ctx: int  # per sequence: the target
    type_k: GGMLType
    type_v: GGMLType
    n_gpu_layers: int  # -ngl: llama.cpp offloads the output layer first, then the last repeating layers
    n_cpu_layers: int  # repeating layers kept on the CPU (the first ones)
    n_cpu_moe: int  # --n-cpu-moe N: the experts of the first N layers stay on the CPU (MoE models)
    device_bytes: int
    host_bytes: int
    decode_tokens_per_s: float | None
    note: str
    # of device_bytes: the GPU compute buffer's copy of the largest CPU-resident weight (op offload,
    # op_offload_bytes); None when the model's tensor sizes are unknown
    op_offload_bytes: int | None = 0
    speed: speed_model.SpeedEstimate | None = None  # decode at 4k and at n_ctx (decode_tokens_per_s: the first)


def plan_offload(
    spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_seq: int, kv: KV, policy: Policy
) -> tuple[Offload | None, tuple[str, ...]]:
    """What must stay on the CPU for ``n_ctx_seq`` tokens per sequence with cache types ``kv``, and the
    notes that say so (None: it all fits on the GPU, or nothing does). For a MoE model that would also
    leave whole layers on the CPU, the first cache type the policy allows that keeps every layer's
    attention on the GPU is taken instead (``policy.fixed_kv``: the user's type only)."""
    offload = partial_offload(spec, base, budget, n_ctx_seq, kv)
    kvs = allowed_kvs(spec, base, policy)
    offload, why = _attention_on_gpu(spec, base, budget, n_ctx_seq, offload, kvs if kv in kvs else [kv, *kvs])
    notes = (why,) if why else ()
    if offload is not None:
        notes = (*notes, "--allow-cpu: " + offload.note)
    return offload, notes


def partial_offload(spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_seq: int, kv: KV) -> Offload | None:
    """How much of the model must stay on the CPU for ``n_ctx_seq`` tokens (None: it all fits, or nothing does).

    MoE models move experts first (what llama.cpp's --fit does: attention stays
    on the GPU); dense models move whole layers, with their KV, from the front.
    The GPU's compute buffer also holds a copy of the largest weight left on the CPU, for prompt
    batches (op offload, :func:`op_offload_bytes`): enough is moved to pay for it too.
    """
    if budget.device == "cpu" or not any(spec.layer_bytes):
        return None
    cfg = config_at(base, n_ctx_seq, kv, True, budget.device)
    full = estimate(spec, cfg)
    excess = full.device_bytes - budget.budget_bytes
    if excess <= 0:
        return None
    n_layer = spec.n_layer
    ub = resolve(spec, cfg).n_ubatch

    def copy_bytes(n_blocks: int) -> int:  # the op-offload copy for the first n_blocks on the CPU
        return op_offload_bytes(spec, range(n_blocks), budget.device, ub) or 0

    moved = 0
    n_cpu_moe = n_cpu = 0
    per_layer = spec.expert_bytes // max(1, n_layer) if spec.n_expert and spec.expert_bytes else 0
    if per_layer:
        n_cpu_moe = -(-excess // per_layer)
        while n_cpu_moe <= n_layer and n_cpu_moe * per_layer < excess + copy_bytes(n_cpu_moe):
            n_cpu_moe += 1
        # every layer's experts on the CPU is not enough: they all stay there (--n-cpu-moe N_LAYER, as
        # llama.cpp's --fit first goes "dense-only", common/fit.cpp), then whole layers go from the front
        n_cpu_moe = min(n_cpu_moe, n_layer)
        moved = n_cpu_moe * per_layer
    if moved < excess + copy_bytes(n_cpu_moe):
        kv_l = layer_kv_bytes(spec, resolve(spec, cfg))
        for il in range(n_layer):
            if n_cpu and moved >= excess + copy_bytes(max(n_cpu, n_cpu_moe)):
                break
            moved += max(0, spec.layer_bytes[il] - (per_layer if n_cpu_moe else 0)) + kv_l[il][0] + kv_l[il][1]
            n_cpu += 1
        if moved < excess + copy_bytes(max(n_cpu, n_cpu_moe)):
            return None  # even with every layer on the CPU the rest does not fit
    op_copy = op_offload_bytes(spec, range(max(n_cpu, n_cpu_moe)), budget.device, ub)
    device = full.device_bytes - moved + (op_copy or 0)
    host = full.host_bytes + moved
    # at 4k and at the full context, as for a plan that fits: deep in the context the K/V read dominates
    speed = speed_model.plan_decode(spec, cfg, budget, n_cpu_moe=n_cpu_moe, n_cpu_layers=n_cpu)
    tps = speed.tokens_per_s if speed is not None else None
    what = f"the experts of {n_cpu_moe} layers" if n_cpu_moe else f"{n_cpu} of {n_layer} layers"
    if n_cpu_moe and n_cpu:
        first = "the first layer" if n_cpu == 1 else f"the first {n_cpu} layers"
        what = f"the experts of all {n_layer} layers and {first} whole"
    note = (
        f"to run {n_ctx_seq:,} tokens with {kv[0].type_name}/{kv[1].type_name}: keep {what} ({moved / GIB:.2f} GiB) "
        "on the CPU"
    )
    if op_copy:
        note += (
            f"; the GPU compute buffer grows by {op_copy / MIB:,.1f} MiB (estimate): prompt batches copy the "
            "largest CPU-resident weight to the GPU (op offload; --no-op-offload avoids it, prompts slower)"
        )
    elif op_copy is None:
        note += "; op offload's copy of a CPU weight in the GPU compute buffer is not counted (tensor sizes unknown)"
    return Offload(
        n_ctx_seq, kv[0], kv[1], n_layer + 1 - n_cpu, n_cpu, n_cpu_moe, device, host, tps, note, op_copy, speed
    )


def _attention_on_gpu(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_ctx_seq: int,
    offload: Offload | None,
    kvs: Sequence[KV],
) -> tuple[Offload | None, str | None]:
    """For a MoE offload that also needs whole layers on the CPU: the first cache type of ``kvs``
    (in preference order) that keeps every layer's attention on the GPU, and why it was taken.
    Whole layers on the CPU cost far more speed than a q8_0 cache costs quality."""
    if offload is None or not (offload.n_cpu_moe and offload.n_cpu_layers):
        return offload, None
    for kv in dict.fromkeys(kvs):
        alt = partial_offload(spec, base, budget, n_ctx_seq, kv)
        if alt is not None and not alt.n_cpu_layers:
            why = (
                f"--allow-cpu: a {kv_name(kv)} cache keeps every layer's attention on the GPU (with "
                f"{kv_name((offload.type_k, offload.type_v))}, {offload.n_cpu_layers} whole layers would also "
                "stay on the CPU)"
            )
            return alt, why
    return offload, None


@dataclass(frozen=True, slots=True)
class CpuMoe:
    """``--n-cpu-moe N`` as llama.cpp places it: the routed-expert tensors of layers 0..N-1 in a CPU buffer
    (common/arg.cpp: ``llm_add_n_cpu_ffn_overrides(N, LLM_FFN_EXPS_REGEX, ...)``; common/common.h:
    ``blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` -> ``ggml_backend_cpu_buffer_type()``, llama.cpp
    0c1e570); shared experts, the router, attention and norms stay where -ngl puts them."""

    n_cpu_moe: int
    expert_layers: tuple[int, ...]  # of those N layers, the ones that hold routed experts
    host_bytes: int  # the experts kept in RAM
    op_offload_bytes: int | None  # the first GPU's copy of the largest of them (op offload); None: unknown
    gpu_spec: ModelSpec  # the model as the GPUs hold it (those experts out of their layers, the copy in)


def cpu_moe_placement(spec: ModelSpec, n_cpu_moe: int, device: str, n_ubatch: int) -> CpuMoe:
    """Where ``--n-cpu-moe N`` puts the weights (see :class:`CpuMoe`). ``gpu_spec`` plans the GPUs' memory
    with the memory model as it is: the moved experts leave their layers' bytes (on whichever device the
    layer split gives them), and the op-offload copy, which the first GPU's compute buffer holds, is kept
    with the first moved layer (on the first device: layer 0 is always there), so that every context the
    recommender tries counts it; :func:`with_cpu_moe` then moves it to the compute buffer."""
    ids = tuple(il for il in speed_model.expert_layer_ids(spec) if il < n_cpu_moe)
    if not ids or not spec.expert_bytes or not any(spec.layer_bytes):
        return CpuMoe(n_cpu_moe, ids, 0, 0, spec)
    per = spec.expert_bytes // len(speed_model.expert_layer_ids(spec))
    moved = per * len(ids)
    copy = op_offload_bytes(spec, ids, device, n_ubatch)
    layers = list(spec.layer_bytes)
    for il in ids:
        layers[il] = max(0, layers[il] - per)
    layers[ids[0]] += copy or 0
    gpu = replace(
        spec,
        weights_bytes=spec.weights_bytes - moved + (copy or 0),
        expert_bytes=spec.expert_bytes - moved,
        layer_bytes=tuple(layers),
    )
    return CpuMoe(n_cpu_moe, ids, moved, copy, gpu)


def with_cpu_moe(est: MemoryEstimate, placement: CpuMoe) -> MemoryEstimate:
    """The estimate of ``placement.gpu_spec`` as llama.cpp prints it for the whole model: the moved experts
    in host RAM (the CPU's model buffer), the op-offload copy in the first GPU's compute buffer."""
    if not placement.host_bytes or not est.devices:
        return est
    copy = placement.op_offload_bytes or 0
    first = est.devices[0]
    devices = (
        replace(first, weights_bytes=first.weights_bytes - copy, compute_bytes=first.compute_bytes + copy),
        *est.devices[1:],
    )
    host = replace(
        est.host,
        weights_bytes=est.host.weights_bytes + placement.host_bytes,
        total_bytes=est.host.total_bytes + placement.host_bytes,
    )
    return replace(
        est,
        devices=devices,
        host=host,
        weights_bytes=est.weights_bytes + placement.host_bytes - copy,
        compute_bytes=est.compute_bytes + copy,
        host_bytes=est.host_bytes + placement.host_bytes,
        total_bytes=est.total_bytes + placement.host_bytes,
    )
