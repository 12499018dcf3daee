"""Partial offload: how much of the model stays in RAM for a context the GPUs alone cannot hold, and
what that costs. A plan that does not fit the GPU gets one by default (``--gpu-only``: none), and
``--allow-cpu`` asks for one at the target when the GPU alone reaches less. One entry point,
:func:`plan_offload`, for a recommended plan and for a ``--ctx`` given by hand: of the cache types the
policy allows (kvadvise.planner.policy.allowed_kvs) it takes the one whose offload decodes fastest at
the target, and checks every device against its own budget and the host against the RAM
(kvadvise.planner.hostram).

Where llama.cpp puts what (src/llama-model.cpp ``llama_model::load_tensors``, 0c1e570): ``-ngl N``
offloads the output layer and the last ``N - 1`` blocks, the first blocks stay on the CPU (a build before
builds.OUTPUT_FIRST, ggml-org/llama.cpp#18148: the last ``N`` blocks, and the output layer only with every
block, so a partial offload keeps it on the CPU and op-offloads its matmul with a copy of output.weight:
memory.output_op_offload_bytes); the
offloaded ones are split over the devices by the cumulative shares of ``-ts`` applied to the
offloaded layers only (``(il - i_gpu_start) / act_gpu_layers``). ``--n-cpu-moe N`` keeps the experts
of the first ``N`` blocks in CPU buffers (common/arg.cpp: a tensor override to the CPU buffer type),
whatever device the block is on.

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

import functools
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner import speed as speed_model
from kvadvise.planner.budget import Budget
from kvadvise.planner.compute import (
    compute_bytes,
    device_compute_bytes,
    host_experts_device_compute,
    op_offload_growth,
    replay_surplus_bytes,
    unpipelined_split_compute,
)
from kvadvise.planner.fitsplit import fill_back_to_front
from kvadvise.planner.host_experts import (
    biased_experts_grow,
    cpu_experts_boundary_bytes,
    host_experts_device_growth,
    host_experts_split_compute,
    without_routed_ffn,
)
from kvadvise.planner.hostram import HostRam, plan_host_ram
from kvadvise.planner.memory import (
    OP_OFFLOAD_DEVICES,
    OP_OFFLOAD_MIN_BATCH,
    MemoryEstimate,
    RunConfig,
    cpu_layers_attention_bytes,
    estimate,
    layer_kv_bytes,
    output_layer_alone_bytes,
    output_op_offload_bytes,
    resolve,
)
from kvadvise.planner.policy import KV, Policy, allowed_kvs, config_at, kv_name
from kvadvise.planner.sizes import reserve_outputs
from kvadvise.planner.speed import ctx_label, tps_label
from kvadvise.planner.split import (
    device_layers,
    gathers_in_last_block,
    layer_devices,
    output_host_bytes,
    output_layer_bytes,
    output_weights_bytes,
    trunk_only,
    unpipelined_last_block_compute,
)

GIB = 1 << 30
MIB = 1 << 20

# A more quantized cache is taken for a partial offload only when it decodes at least this much faster at
# the target than the one before it in the policy's order (f16 first): its cost in quality is small
# ("usually no noticeable impact", Ollama FAQ) but not nothing, so a tie keeps the exact cache.
FASTER_BY = 1.05


def op_offload_bytes(spec: ModelSpec, cpu_blocks: Iterable[int], device: str, n_ubatch: int) -> int | None:
    """The copies of CPU-resident weights the GPU's compute buffer holds at once: the largest one's, or two where a
    hybrid's first attention layer falls among ``cpu_blocks`` (below); 0 where nothing is op-offloaded, None where
    the per-tensor sizes are unknown (a model planned from a profile)."""
    if device not in OP_OFFLOAD_DEVICES or n_ubatch < OP_OFFLOAD_MIN_BATCH:
        return 0
    blocks = list(cpu_blocks)
    if not blocks:
        return 0
    if not spec.layer_largest_tensor_bytes:
        return None
    largest = max(spec.layer_largest_tensor_bytes[il] for il in blocks)
    # A hybrid whose first layers have no attention (Qwen3.5/3.6's three gated-delta-net layers) copies the KQ mask
    # into the GPU's compute buffer only at its first attention layer (the first split that reads it), into the
    # hole the earlier layers' weight copies left: the next layer's copies no longer fit there and land above it.
    # Measured with the op-offloading loopback device (benchmarks/bench_op_offload.py): Qwen3.6-35B-A3B's experts
    # of layers 0-2 or 3-19 in host memory grow the buffer by 157-160 MiB (its 176 MiB down projection), of 0-3 and
    # 0-19 by 301 MiB, at 8k to 256k cells.
    first_kv = next((il for il, owns in enumerate(spec.kv_layers) if owns), 0)
    if first_kv > 0 and min(blocks) < first_kv <= max(blocks):
        return 2 * largest
    return largest


@dataclass(frozen=True, slots=True)
class Offload:
    """A plan that leaves part of the model in RAM: layers or experts on the CPU."""

    n_ctx: int  # per sequence: the target
    type_k: GGMLType
    type_v: GGMLType
    n_gpu_layers: int  # -ngl: llama.cpp offloads the output layer first, then the last repeating layers
    n_cpu_layers: int  # repeating layers kept on the CPU (the first ones)
    n_cpu_moe: int  # --n-cpu-moe N: the experts of the first N layers stay on the CPU (MoE models)
    device_bytes: int  # on the GPUs, summed
    host_bytes: int
    decode_tokens_per_s: float | None
    note: str
    # of device_bytes: the GPU compute buffer's copy of the largest CPU-resident weight (op offload,
    # op_offload_bytes); None when the model's tensor sizes are unknown
    op_offload_bytes: int | None = 0
    speed: speed_model.SpeedEstimate | None = None  # decode at 4k and at n_ctx (decode_tokens_per_s: the first)
    devices_bytes: tuple[int, ...] = ()  # each GPU's total, in the order of the budget's devices
    device_budgets: tuple[int, ...] = ()  # each GPU's own budget, as checked
    ram: HostRam | None = None  # what it keeps in system RAM, against the RAM
    output_on_host: bool = False  # the output layer on the CPU too (a build before builds.OUTPUT_FIRST)
    # -ts as this plan deals the offloaded layers over several devices: layers per device, filled as --fit fills
    # them; () the plan's own split
    tensor_split: tuple[float, ...] = ()
    # of block n_cpu_moe - 1, the last whose experts are on the CPU, what stays on the GPU beside its attention:
    # "up" its ffn_up_exps, "gate" its ffn_up_exps and ffn_gate_exps (llama.cpp's --fit: common/fit.cpp's
    # LAYER_FRACTION_UP and LAYER_FRACTION_GATE); "" none. The command says it as --n-cpu-moe N - 1 and an -ot
    # of that block's other experts (:func:`cpu_moe_flags`)
    expert_overflow: str = ""

    @property
    def runnable(self) -> bool:
        """Every device within its budget (by construction) and the host within its RAM."""
        return self.ram is None or self.ram.fits


def plan_offload(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_ctx_seq: int,
    kv: KV,
    policy: Policy,
    *,
    shrink: bool = False,
) -> tuple[Offload | None, tuple[str, ...]]:
    """What must stay on the CPU for ``n_ctx_seq`` tokens per sequence, and the notes that say so (None: it
    all fits on the GPU, or nothing does). Of the cache types the policy allows (``policy.fixed_kv``: the
    user's only; ``kv`` first when the policy does not list it), the one whose offload fits the RAM and
    decodes fastest at ``n_ctx_seq``; a later (more quantized) type only when it is at least 5 % faster.
    ``shrink`` (a recommended context, not one the user gave): when no offload at ``n_ctx_seq`` fits the RAM,
    the largest context, a multiple of 1,024, at which one does, as the GPU's context is searched."""
    best, notes = _plan_offload(spec, base, budget, n_ctx_seq, kv, policy)
    # none at all is searched down too: the compute buffer grows with the context (without flash attention the
    # scores of every cell), and with every layer on the CPU it may still not fit the GPU at the target
    if not shrink or (best is not None and best.runnable) or n_ctx_seq <= CTX_STEP:
        return best, notes
    # units of 1,024: lo runs (or is the last below the runtime's floor: none found), hi does not
    lo, hi = max(0, -(-policy.ctx_floor // CTX_STEP) - 1), n_ctx_seq // CTX_STEP
    found: tuple[Offload | None, tuple[str, ...]] = (None, ())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = _plan_offload(spec, base, budget, mid * CTX_STEP, kv, policy)
        if got[0] is not None and got[0].runnable:
            lo, found = mid, got
        else:
            hi = mid
    if found[0] is None:
        return best, notes
    where = "the RAM beside the weights the CPU reads" if best is not None else "the GPU with any layers on the CPU"
    said = f"partial offload: {n_ctx_seq:,} tokens per sequence do not fit {where}; {lo * CTX_STEP:,} do"
    return found[0], (said, *found[1])


CTX_STEP = 1024  # a context searched for the RAM: a multiple of this


def _plan_offload(
    spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_seq: int, kv: KV, policy: Policy
) -> tuple[Offload | None, tuple[str, ...]]:
    kvs = allowed_kvs(spec, base, policy)
    cands = [
        (
            k,
            partial_offload(
                spec,
                base,
                budget,
                n_ctx_seq,
                k,
                experts=policy.expert_offload,
                output_first=policy.output_first,
                fill_split=policy.fit_split,
                overflow_experts=policy.expert_overflow,
            ),
        )
        for k in dict.fromkeys(kvs if kv in kvs else [kv, *kvs])
    ]
    viable = [(k, o) for k, o in cands if o is not None]
    if not viable:
        return None, ()
    in_ram = [(k, o) for k, o in viable if o.runnable] or viable
    first_kv, first = in_ram[0]
    best_kv, best = first_kv, first
    for k, o in in_ram[1:]:
        if _faster(o, best):
            best_kv, best = k, o
    notes: list[str] = []
    if best_kv != first_kv:
        notes.append(f"partial offload: {_versus(best, first, spec.n_layer)}")
    notes.append("partial offload: " + best.note)
    if best.ram is not None and not best.ram.fits:
        notes.append(
            f"partial offload does not fit the RAM: the weights the CPU reads and the buffers alone need "
            f"{best.ram.essential_bytes / GIB:.2f} GiB; the RAM has {best.ram.ram_bytes / GIB:.2f} GiB "
            f"({best.ram.ram_source})"
        )
    return best, tuple(notes)


def _faster(a: Offload, b: Offload) -> bool:
    """``a`` decodes at least 5 % faster than ``b`` at the target (without a bandwidth to go on: keeps at
    least 5 % fewer bytes on the CPU)."""
    if a.speed is not None and b.speed is not None:
        return a.speed.points[-1][1] >= b.speed.points[-1][1] * FASTER_BY
    moved_a, moved_b = a.host_bytes, b.host_bytes
    return moved_a * FASTER_BY <= moved_b


def _kept(o: Offload, n_layer: int) -> str:
    if o.n_cpu_moe and o.n_cpu_layers:
        return f"the experts of all {n_layer} layers and {o.n_cpu_layers} whole"
    if o.expert_overflow:
        return f"the experts of {o.n_cpu_moe - 1} layers and part of one more"
    return f"the experts of {o.n_cpu_moe} layers" if o.n_cpu_moe else f"{o.n_cpu_layers} of {n_layer} layers"


def _versus(best: Offload, first: Offload, n_layer: int) -> str:
    """Why a more quantized cache was taken: what it keeps on the CPU and decodes, against the first (the
    fastest at the target: a more quantized cache only when at least 5 % faster)."""
    s = (
        f"{kv_name((best.type_k, best.type_v))} keeps {_kept(best, n_layer)} on the CPU, "
        f"{kv_name((first.type_k, first.type_v)).removesuffix(' K/V')} would keep {_kept(first, n_layer)}"
    )
    if best.speed is not None and first.speed is not None:
        (depth, fast), (_, slow) = best.speed.points[-1], first.speed.points[-1]
        if round(fast) != round(slow):
            s += f" (≈ {tps_label(fast)} against ≈ {tps_label(slow)} t/s at {ctx_label(depth)})"
    return s


@dataclass(frozen=True, slots=True)
class _Layers:
    """The full offload's numbers per block and per device, to move blocks and experts off it."""

    fixed: tuple[int, ...]  # per device: what does not belong to a repeating block (overhead, compute, output)
    block: tuple[int, ...]  # per block: its weights (with the device's row padding), KV and recurrent state
    experts: tuple[int, ...]  # per block: the routed experts' bytes
    kv: tuple[int, ...]  # per block: its KV and recurrent state (stays with the block)
    weights: tuple[int, ...]  # per block: its weights as stored (what the CPU maps)
    output_device: int = 0  # the device that holds the output layer at full offload
    output_bytes: int = 0  # the output layer's weights there (with the device's row padding)
    expert_up: tuple[int, ...] = ()  # per block: of its routed experts, ffn_up_exps (0 unknown or fused)
    expert_gate: tuple[int, ...] = ()  # per block: of its routed experts, ffn_gate_exps (0: none, or fused)


def _partial_base(spec: ModelSpec, full: MemoryEstimate) -> MemoryEstimate:
    """The full offload that a partial plan's steps start from: one device's compute at the phases' figure where its
    own is a replayed graph's (compute.replay_surplus_bytes: a qwen3moe on an RPC device). The steps for whole blocks
    on the CPU (the output layer alone, the last block's rows, the experts' output taken in) were measured from that
    figure; only the experts alone in host memory are replayed (compute.host_experts_device_compute, split_compute)."""
    if len(full.devices) != 1 or not (surplus := replay_surplus_bytes(spec, full.layout)):
        return full
    d = full.devices[0]
    dev = replace(d, compute_bytes=d.compute_bytes + surplus, total_bytes=d.total_bytes + surplus)
    return replace(
        full,
        devices=(dev,),
        compute_bytes=full.compute_bytes + surplus,
        total_bytes=full.total_bytes + surplus,
        device_bytes=full.device_bytes + surplus,
    )


def _layers(spec: ModelSpec, full: MemoryEstimate, cfg: RunConfig) -> _Layers:
    lay = full.layout
    n_all = spec.n_layer_all
    kv_l = layer_kv_bytes(spec, lay)
    n_rs = sum(spec.recurrent_layers)
    rs = [full.recurrent_bytes // n_rs if spec.recurrent_layers[il] and n_rs else 0 for il in range(n_all)]
    pads = list(spec.layer_cuda_pad_bytes) if lay.device == "cuda" and spec.layer_cuda_pad_bytes else [0] * n_all
    weights = list(spec.layer_bytes) or [0] * n_all
    experts = list(speed_model.layer_expert_bytes(spec))
    kv = [kv_l[il][0] + kv_l[il][1] + rs[il] for il in range(n_all)]
    block = [weights[il] + pads[il] + kv[il] for il in range(n_all)]
    n_dev = max(1, len(full.devices))
    owner = layer_devices(n_all, cfg.tensor_split) if n_dev > 1 else (0,) * (n_all + 1)
    fixed = [d.total_bytes for d in full.devices] or [full.device_bytes]
    for il in range(n_all):
        fixed[owner[il]] -= block[il]
    out_dev = owner[n_all] if n_dev > 1 else 0
    out_w = output_layer_bytes(spec, lay.device == "cuda")
    up = spec.layer_expert_up_bytes or (0,) * n_all
    gate = spec.layer_expert_gate_bytes or (0,) * n_all
    return _Layers(tuple(fixed), tuple(block), tuple(experts), tuple(kv), tuple(weights), out_dev, out_w, up, gate)


def _on_devices(
    layers: _Layers, ts: tuple[float, ...], n_cpu: int, n_cpu_moe: int, copy: int, *, output_on_host: bool = False
) -> list[int]:
    """Each device's total with the first ``n_cpu`` blocks on the CPU and the experts of the first
    ``n_cpu_moe`` there too: the blocks left are split over the devices as llama.cpp splits -ngl's layers
    (``(il - i_gpu_start) / act_gpu_layers``; ``output_on_host``: a build before builds.OUTPUT_FIRST, the output
    layer on the CPU and not among the layers split)."""
    n_all = len(layers.block)
    n_dev = len(layers.fixed)
    act = n_all - n_cpu if output_on_host else n_all + 1 - n_cpu  # the offloaded blocks (and the output layer)
    owner = layer_devices(act - 1, ts) if n_dev > 1 else (0,) * act
    out = list(layers.fixed)
    if output_on_host:
        out[min(layers.output_device, n_dev - 1)] -= layers.output_bytes
    elif n_dev > 1 and owner[act - 1] != layers.output_device:
        # the output layer goes where the split of the offloaded layers puts it (llama_model::load_tensors: the last of
        # the act_gpu_layers points), not where the full offload had it: -ts 3,1 at -ngl 2 gives it to the first device
        out[layers.output_device] -= layers.output_bytes
        out[owner[act - 1]] += layers.output_bytes
    for il in range(n_cpu, n_all):
        out[owner[il - n_cpu]] += layers.block[il] - (layers.experts[il] if il < n_cpu_moe else 0)
    out[0] += copy  # op offload runs on the first GPU (the scheduler's highest-priority backend)
    return out


def _partial_owner(n_all: int, n_dev: int, ts: tuple[float, ...], n_cpu: int, output_on_host: bool) -> tuple[int, ...]:
    """The device of each block and of the output layer (the last entry) with the first ``n_cpu`` blocks on the CPU
    (-1), as :func:`_on_devices` splits them (``output_on_host``: the output layer on the CPU too)."""
    act = n_all - n_cpu if output_on_host else n_all + 1 - n_cpu
    owner = layer_devices(act - 1, ts) if n_dev > 1 else (0,) * act
    return (-1,) * n_cpu + tuple(owner[: n_all - n_cpu]) + ((-1,) if output_on_host else (owner[-1],))


def partial_offload(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_ctx_seq: int,
    kv: KV,
    *,
    experts: bool = True,
    output_first: bool | None = None,
    fill_split: bool = False,
    overflow_experts: bool = False,
) -> Offload | None:
    """How much of the model must stay on the CPU for ``n_ctx_seq`` tokens (None: it all fits, or nothing does).

    MoE models move experts first (what llama.cpp's --fit does: attention stays on the GPU); when the
    experts of every layer are not enough, they all stay on the CPU (--n-cpu-moe N_LAYER: common/fit.cpp
    goes "dense-only" first) and whole layers then go from the front; dense models move whole layers,
    with their KV, from the front. Every device is checked against its own budget (the layers left are
    split over the GPUs as -ts splits them). The GPU's compute buffer also holds a copy of the largest
    weight left on the CPU, for prompt batches (op offload, :func:`op_offload_bytes`): enough is moved to
    pay for it too. ``experts`` False: the runtime moves whole layers only, a MoE model's as a dense one's (the
    runners inside Ollama 0.11 to 0.24: llm/server.go assignLayers places layers, with no expert override).
    ``output_first``: the output layer goes to the GPU before the blocks; None: as the build does (a build before
    builds.OUTPUT_FIRST keeps it on the CPU at a partial -ngl, and op-offloads its matmul with a copy of it).
    ``fill_split``: several devices whose split was not asked for (``Policy.fit_split``): where the plan's split
    leaves a device short, the layers per device are filled from the last device as llama.cpp's --fit fills them
    (Offload.tensor_split, written as -ts). ``overflow_experts``: the runtime takes a tensor override (-ot), so the
    last block whose experts are on the CPU may keep part of them on the GPU, as --fit does (Offload.expert_overflow).
    """
    if budget.device == "cpu" or not any(spec.layer_bytes):
        return None
    fa = base.flash_attn != "off"
    cfg = config_at(base, n_ctx_seq, kv, fa, budget.device)
    full = estimate(spec, cfg)
    # one budget per device where the budget has them (kvadvise.planner.budget: several GPUs), else one
    per_device = len(budget.device_budgets) > 1 and len(budget.device_budgets) == len(full.devices)
    budgets = budget.device_budgets if per_device else (budget.budget_bytes,)
    if budget.fits(full):
        return None
    # llama.cpp pipelines a full offload only (llama_context: n_gpu_layers above every layer, no tensor override):
    # a partial plan's fixed costs, compute buffers and host buffers are those of the unpipelined split
    if len(full.devices) > 1:
        full = estimate(spec, replace(cfg, pipeline=False))
    full = _partial_base(spec, full)
    layers = _layers(spec, full, cfg)
    if not per_device and len(layers.fixed) > 1:
        layers = replace(layers, fixed=(sum(layers.fixed),), output_device=0)
    n_layer = spec.n_layer
    lay = resolve(spec, cfg)
    ub = lay.n_ubatch

    def copy_bytes(n_blocks: int) -> int:  # what the op-offload copy for the first n_blocks on the CPU adds
        # the copy lives in a layer's live set, not beside the logits (compute.op_offload_growth)
        return op_offload_growth(spec, lay, op_offload_bytes(spec, range(n_blocks), budget.device, ub) or 0)

    # a device that does not op-offload (ggml-rpc; any device for batches under 32 tokens) runs what stays on
    # the CPU in CPU splits instead of copying the weights in: its compute buffer follows the layers it runs
    offloads = budget.device in OP_OFFLOAD_DEVICES and ub >= OP_OFFLOAD_MIN_BATCH
    one_device = len(layers.fixed) == 1 and len(full.devices) == 1
    output_only = (
        output_layer_alone_bytes(spec, lay) - full.devices[0].compute_bytes if one_device and not offloads else 0
    )
    experts_growth = 0 if offloads else host_experts_device_growth(spec, lay)
    experts_growth_all = 0 if offloads else host_experts_device_growth(spec, lay, device_experts=False)
    biased = biased_experts_grow(spec)

    @functools.cache
    def host_replay(n_cpu: int, n_cpu_moe: int) -> int | None:
        # one RPC device, the experts of the first blocks in host memory, no whole block on the CPU: ggml-alloc's own
        # figure of that graph (compute.host_experts_device_compute: a qwen3moe), in place of the steps below
        if n_cpu or not n_cpu_moe or not one_device or offloads:
            return None
        return host_experts_device_compute(spec, lay, n_cpu_moe)

    def split_compute(n_cpu: int, n_cpu_moe: int) -> int:  # the first device's compute beyond the full offload's
        if (exact := host_replay(n_cpu, n_cpu_moe)) is not None:
            return exact - full.devices[0].compute_bytes
        if n_cpu >= n_layer:  # -ngl 1: the output layer alone (memory.output_layer_alone_bytes), whose figure holds
            # what it takes in from the CPU's last block: less the one and a half ``last_out`` tail_cut adds for it
            return output_only - (last_out * 3 // 2 if one_device and not offloads and expert_out else 0)
        # experts of layers the device runs, in host memory (host_experts.host_experts_device_growth)
        # a gpt-oss grows where a block before the last runs its experts after host experts (not its last block's,
        # run after the masks are freed)
        some = n_cpu_moe < n_layer - (1 if biased else 0)
        return (experts_growth if some else experts_growth_all) if n_cpu_moe > n_cpu else 0

    # a build before llama.cpp#18148 offloads the output layer last: whole blocks on the CPU leave it there too, and
    # the first device op-offloads its matmul for prompt batches, with a copy of output.weight beside the logits
    output_last = builds.older_than(cfg.llama_build, builds.OUTPUT_FIRST) if output_first is None else not output_first
    base_compute = full.devices[0].compute_bytes

    def copy_growth(n_cpu: int, n_cpu_moe: int) -> int:  # what op offload's copies add to the first device's compute
        grown = copy_bytes(max(n_cpu, n_cpu_moe))
        if offloads and n_cpu:  # the CPU layers' attention runs on the GPU with copies of their K and V
            grown = max(base_compute + grown, cpu_layers_attention_bytes(spec, lay, range(n_cpu))) - base_compute
        if output_last and n_cpu:  # or output.weight's beside the logits, whichever peak is higher
            grown = max(base_compute + grown, output_op_offload_bytes(spec, lay)) - base_compute
        return grown

    # each device's own compute at full offload, where the budget checks each device (else one summed figure)
    full_compute = [d.compute_bytes for d in full.devices] if len(layers.fixed) == len(full.devices) else []

    # one used-expert output of the routed experts' down projection, [n_embd, n_expert_used, n_ubatch] f32: what a
    # device that does not op-offload takes in from a CPU layer's experts (llama-server b11312 over rpc-servers: a tiny
    # qwen3moe at -ngl 8 of 9, -ub 2048, 168.07 MiB of compute where the full offload holds 136.04; gpt-oss's output
    # layer alone after every expert on the CPU, 12 / 24 / 48 MiB at -ub 512 / 1024 / 2048: one and a half of it)
    expert_out = 4 * spec.n_embd * max(spec.n_expert_used, 1) * ub if spec.n_expert else 0
    # the last block's, where it gathers the output rows before its FFN (split.gathers_in_last_block): those rows
    # only (a tiny qwen3moe's output layer alone after every expert on the CPU: 0.04 MiB printed at -ub 2048)
    last_out = expert_out * reserve_outputs(lay) // ub if gathers_in_last_block(spec) else expert_out
    # the device's buffer at its first block after the CPU's blocks ran their experts (host_experts.cpu_experts_boundary_bytes)
    boundary_own = cpu_experts_boundary_bytes(spec, lay, own_experts=True)
    boundary_host = cpu_experts_boundary_bytes(spec, lay, own_experts=False)
    last_rows = 1 if gathers_in_last_block(spec) else 0  # a last block whose FFN runs at the output rows only
    # measured where the last block alone has no shared expert (qwen3moe: host_experts.cpu_experts_boundary_bytes)
    last_alone = bool(last_rows) and not spec.n_ff_shexp
    boundary_last = cpu_experts_boundary_bytes(spec, lay, own_experts=True, last_block=True)
    no_ffn_compute = device_compute_bytes(without_routed_ffn(spec), lay) if spec.n_expert else 0

    def tail_cut(n_cpu: int, n_cpu_moe: int, output_on_host: bool, ts: tuple[float, ...]) -> list[int]:
        """What each device's compute buffer gains or loses against the full offload's with the blocks this partial
        -ngl deals it (a device that does not op-offload: the CPU's blocks run in CPU splits, ggml-backend.cpp
        ggml_backend_sched_backend_id_from_cur). A device left with the last block runs its FFN at the output rows
        alone (src/models/llama.cpp ``il == n_layer - 1 && inp_out_ids``; llama-server b11312 over an rpc-server, 8
        llama blocks of n_ff 4096 at -ub 2048, -ngl 2: 48.30 MiB printed, 136 planned before); over several devices
        each device's compute is that of its own blocks, both ways (a sliding-window model's global layer moved to the
        first device brings the whole context's mask: gemma3 at -ngl 8 -ts 5,4, 357 MiB printed there, 301 planned
        from the full split; a device that held only the output layer at full offload and is dealt the last block
        runs it: 157 MiB printed, 61 planned); the first device of a plan that op-offloads keeps the full offload's
        where that is more (it runs the CPU's layers too). The device after a CPU layer's experts takes in their
        output (``expert_out``)."""
        n_dev = len(layers.fixed)
        cut = [0] * n_dev
        if not full_compute or (offloads and n_dev == 1) or host_replay(n_cpu, n_cpu_moe) is not None:
            return cut
        owner = _partial_owner(spec.n_layer_all, n_dev, ts, n_cpu, output_on_host)
        ruled: set[int] = set()  # devices sized by host_experts.host_experts_split_compute, their boundary included
        parts = device_layers(spec, owner, n_dev, lay.device == "cuda")
        # -ngl 1 on one device: the output layer alone is output_only's (split_compute)
        for d, full_part in enumerate(() if one_device and n_cpu >= n_layer else parts):
            part = trunk_only(full_part)
            own = unpipelined_last_block_compute(spec, lay, part) if part.layers == (n_layer - 1,) else None
            if own is None and n_dev > 1 and expert_out and not offloads and n_cpu_moe > n_cpu:
                # blocks whose experts run in CPU splits beside blocks that run theirs (host_experts.host_experts_split_compute)
                own = host_experts_split_compute(spec, lay, part, lambda il: il < n_cpu_moe)
                if own is not None:
                    ruled.add(d)
            if own is None and (n_dev > 1 or not part.layers):
                own = unpipelined_split_compute(spec, lay, part)
            if own is None:  # one device holding more than the last block: the full offload's
                continue
            if n_dev == 1:  # one device: only the measured cuts (the last block, the output layer alone)
                cut[d] = min(0, own - full_compute[d])
            else:
                cut[d] = max(0, own - full_compute[d]) if d == 0 and offloads else own - full_compute[d]
        if expert_out and not offloads and n_cpu and n_cpu_moe <= n_cpu:
            # whole MoE layers on the CPU (plain -ngl): the first offloaded block's device takes in their experts' output
            nxt = owner[n_cpu] if n_cpu < spec.n_layer_all else owner[-1]
            if nxt >= 0:
                if n_cpu >= n_layer and not one_device:
                    # the output layer alone on one of several devices: its own figure, what comes in included
                    cut[nxt] += output_layer_alone_bytes(spec, lay) - unpipelined_split_compute(spec, lay, parts[nxt])
                else:
                    cut[nxt] += last_out * 3 // 2 if n_cpu >= n_layer else expert_out
                if last_rows and n_cpu < n_layer - 1:  # its first block is placed around that output's holes
                    cut[nxt] = max(cut[nxt], boundary_own - full_compute[nxt])
                elif n_cpu < n_layer and last_alone:  # the last block alone, its FFN at the output rows
                    cut[nxt] = boundary_last - full_compute[nxt]
        elif expert_out and not offloads and 0 < n_cpu < n_layer and n_cpu_moe > n_cpu:
            # whole blocks on the CPU, then blocks whose experts are in host memory: the first of them takes in the
            # CPU block's experts' output beside its own (the first device's growth, split_compute, counted once)
            nxt = owner[n_cpu]
            grown = split_compute(n_cpu, n_cpu_moe) if nxt == 0 else 0
            # (a device host_experts.host_experts_split_compute sized has this boundary in its figure already)
            takes_in = nxt >= 0 and nxt not in ruled
            if takes_in and last_rows and n_cpu < n_layer - 1:  # measured where the last block gathers (qwen3moe)
                cut[nxt] = max(cut[nxt], boundary_host - full_compute[nxt] - grown)
            elif takes_in and last_alone:
                cut[nxt] = boundary_last - full_compute[nxt] - grown
        elif (
            expert_out and not offloads and n_dev == 1 and n_cpu == 0
            and ((last_alone and n_cpu_moe >= n_layer - last_rows) or (biased and n_cpu_moe >= n_layer - 1))
        ):  # fmt: skip
            # every expert that runs on the whole batch in host memory, one device: it never runs their gate, up and
            # GLU (memory._offloaded's figure for --n-cpu-moe past the layers; llama-server b11312 over an rpc-server,
            # a qwen3moe with 8 used experts at --n-cpu-moe 7 of 8: 144 MiB, where the full offload's 184 was planned)
            cut[0] = min(cut[0], no_ffn_compute - full_compute[0])
        if expert_out and not offloads and n_cpu_moe >= n_layer and not spec.n_ff_shexp and n_cpu_moe > n_cpu:
            # every expert on the CPU: the output layer's device takes in the last one's, where it holds no block
            out_dev = owner[-1]
            if out_dev >= 0 and not parts[out_dev].layers:
                cut[out_dev] += last_out * 3 // 2
        return cut

    def totals(n_cpu: int, n_cpu_moe: int, ts: tuple[float, ...]) -> list[int]:
        grown = copy_growth(n_cpu, n_cpu_moe) + split_compute(n_cpu, n_cpu_moe)
        out_host = output_last and n_cpu > 0
        each = _on_devices(layers, ts, n_cpu, n_cpu_moe, grown, output_on_host=out_host)
        return [t + c for t, c in zip(each, tail_cut(n_cpu, n_cpu_moe, out_host, ts), strict=True)]

    def within(each: list[int]) -> bool:
        return all(d <= b for d, b in zip(each, budgets, strict=True))

    def filled(n_cpu: int, n_cpu_moe: int) -> tuple[float, ...]:
        """The offloaded layers per device as --fit fills them (fitsplit.fill_back_to_front), so that no device is
        left half empty."""
        act = spec.n_layer_all - n_cpu if output_last and n_cpu > 0 else spec.n_layer_all + 1 - n_cpu
        return fill_back_to_front(act, budgets, lambda ts, d: totals(n_cpu, n_cpu_moe, ts)[d])

    def fits(n_cpu: int, n_cpu_moe: int) -> tuple[list[int], tuple[float, ...]] | None:
        """Each device's total at the plan's split, else at the layers per device --fit's fill gives them."""
        if within(each := totals(n_cpu, n_cpu_moe, cfg.tensor_split)):
            return each, ()
        if fill_split and per_device and len(budgets) > 1:
            ts = filled(n_cpu, n_cpu_moe)
            if sum(ts) and within(each := totals(n_cpu, n_cpu_moe, ts)):
                return each, ts
        return None

    found: tuple[int, int, list[int], tuple[float, ...]] | None = None
    moe = experts and any(layers.experts)
    for n_moe in range(1, n_layer + 1) if moe else ():
        if (got := fits(0, n_moe)) is not None:
            found = (0, n_moe, *got)
            break
    if found is None:
        # every layer's experts on the CPU is not enough (or a dense model): whole layers from the front
        n_moe = n_layer if moe else 0
        # an older build cannot offload the output layer alone: -ngl n_layer - n_cpu offloads blocks only
        for n_cpu in range(1, n_layer if output_last else n_layer + 1):
            if (got := fits(n_cpu, n_moe)) is not None:
                found = (n_cpu, n_moe, *got)
                break
    if moe and found is not None:
        # whole layers alone, experts and all, where that keeps more weights on the GPU and decodes no slower (the
        # speed unknown: more weights): llama.cpp's --fit keeps the plain -ngl its first pass finds when it fits
        # (common/fit.cpp common_params_fit_impl); tiny MoEs over an rpc-server at 16k cells: DeepSeek-V2 -ngl 6,
        # 139.62 MiB of weights, where every expert on the CPU and -ngl 8 held 122.02; gpt-oss 168+ where the
        # experts of 6 layers on the CPU held 152.52
        def on_cpu(n_cpu: int, n_cpu_moe: int) -> int:
            return sum(layers.weights[:n_cpu]) + sum(layers.experts[n_cpu:n_cpu_moe])

        def decode(n_cpu: int, n_cpu_moe: int) -> float | None:
            est = speed_model.plan_decode(
                spec, cfg, budget, n_cpu_moe=n_cpu_moe, n_cpu_layers=n_cpu, cpu_output=output_last and n_cpu > 0
            )
            return est.tokens_per_s if est is not None else None

        for n_cpu in range(1, n_layer if output_last else n_layer + 1):
            if on_cpu(n_cpu, 0) >= on_cpu(found[0], found[1]):
                break  # no fewer weights on the CPU from here on
            if (got := fits(n_cpu, 0)) is not None:
                plain, now = decode(n_cpu, 0), decode(found[0], found[1])
                if plain is None or now is None or plain >= now:
                    found = (n_cpu, 0, *got)
                break
    if found is None:
        return None  # even with every layer on the CPU the rest does not fit
    n_cpu, n_cpu_moe, each, split = found
    overflow, kept = "", 0
    if moe and overflow_experts and n_cpu == 0 and n_cpu_moe:
        # "try to fit at least part of one more layer" (common/fit.cpp common_params_fit_impl, b11312): the last block
        # whose experts are on the CPU keeps its ffn_up_exps on the GPU, then its ffn_gate_exps too, where every device
        # stays within its budget. That block then runs part of its experts on the device, and the device's compute
        # is that of --n-cpu-moe N - 1 (llama-server b11312 over an rpc-server, a qwen3moe with 8 used experts of 512
        # at -ub 2048: 176.32 MiB with block 6's up, or up and gate, on the device, as at --n-cpu-moe 6; 144.14 at 7),
        # less the block's expert tensors left on the CPU; op offload still copies the largest of those (CUDA, Metal).
        # It is at least --n-cpu-moe N's too: the block still makes a host-expert split (a qwen3next over two
        # rpc-servers with block 0's up on the first: 311.08 MiB allocated where the full offload's 291.12 was planned)
        il = n_cpu_moe - 1
        ts = split or cfg.tensor_split
        dev = _partial_owner(spec.n_layer_all, len(each), ts, 0, False)[il]
        fewer = totals(0, il, ts)
        fewer[0] += max(0, copy_growth(0, n_cpu_moe) - copy_growth(0, il))
        # and at least --n-cpu-moe N's, whose host-expert split it still makes (the first block's: N - 1 = 0)
        fewer = [
            max(f - (layers.experts[il] if d == dev else 0), e)
            for d, (f, e) in enumerate(zip(fewer, each, strict=True))
        ]
        for name, extra in (("up", layers.expert_up[il]), ("gate", layers.expert_up[il] + layers.expert_gate[il])):
            grown = list(fewer)
            grown[dev] += extra
            if not layers.expert_up[il] or not within(grown):
                break
            overflow, kept, each = name, extra, grown
    out_host = output_last and n_cpu > 0
    # llama_model::load_tensors's i_gpu_start: n_layer_all + 1 - ngl (n_layer_all - ngl before OUTPUT_FIRST)
    n_gpu_layers = spec.n_layer_all - n_cpu if out_host else spec.n_layer_all + 1 - n_cpu
    known = out_host or op_offload_bytes(spec, range(max(n_cpu, n_cpu_moe)), budget.device, ub) is not None
    op_copy = copy_growth(n_cpu, n_cpu_moe) if known else None
    cpu_weights = (
        sum(layers.weights[il] for il in range(n_cpu))
        + sum(layers.experts[il] for il in range(n_cpu, n_cpu_moe))
        - kept
    )
    if out_host:
        cpu_weights += output_host_bytes(spec)
    cpu_kv = sum(layers.kv[il] for il in range(n_cpu))
    moved = cpu_weights + cpu_kv
    # the CPU's compute buffer for what it runs: at most what it needs to run every layer (an upper bound)
    cpu_compute = compute_bytes(spec, full.layout) if (n_cpu or n_cpu_moe) else 0
    ram = plan_host_ram(
        spec,
        cfg,
        full,
        budget,
        cpu_weights_bytes=cpu_weights,
        cpu_buffers_bytes=cpu_kv + cpu_compute,
        gpu_bytes=sum(each),
    )
    # at 4k and at the full context, as for a plan that fits: deep in the context the K/V read dominates;
    # each GPU at its bandwidth and share, what stays on the CPU at the system memory's
    # the overflow block's up (and gate) projections are read on the GPU
    speed = speed_model.plan_decode(
        spec, cfg, budget, n_cpu_moe=n_cpu_moe, n_cpu_layers=n_cpu, cpu_output=out_host, gpu_overflow_bytes=kept
    )
    tps = speed.tokens_per_s if speed is not None else None
    what = f"the experts of {n_cpu_moe} layers" if n_cpu_moe else f"{n_cpu} of {n_layer} layers"
    if overflow:
        kept_on_gpu = "ffn_up_exps" if overflow == "up" else "ffn_up_exps and ffn_gate_exps"
        what += (
            f" (all but block {n_cpu_moe - 1}'s {kept_on_gpu}, {kept / MIB:,.1f} MiB, which stay on the GPU as llama.cpp's "
            "--fit keeps them)"
        )
    if n_cpu_moe and n_cpu:
        first = "the first layer" if n_cpu == 1 else f"the first {n_cpu} layers"
        what = f"the experts of all {n_layer} layers and {first} whole"
    note = (
        f"to run {n_ctx_seq:,} tokens with {kv[0].type_name}/{kv[1].type_name}: keep {what} ({moved / GIB:.2f} GiB) "
        "on the CPU"
    )
    if len(each) > 1:
        note += "; each GPU within its own budget: " + ", ".join(
            f"{d / GIB:.2f} of {b / GIB:.2f} GiB" for d, b in zip(each, budgets, strict=True)
        )
    if out_host:
        # a tied model's output matmul reads token_embd, which is on the CPU anyway (split.output_host_bytes)
        tensor = "output.weight" if spec.output_bytes else "the tied token_embd"
        note += (
            f"; llama.cpp b{cfg.llama_build} offloads the output layer last (before llama.cpp#18148): -ngl "
            f"{n_gpu_layers} leaves it on the CPU too: its matmul reads {tensor} "
            f"({output_weights_bytes(spec) / MIB:,.0f} MiB) there"
        )
    if op_copy and out_host and offloads:
        note += (
            f", and the GPU compute buffer grows by {op_copy / MIB:,.1f} MiB: prompt batches copy {tensor} to the "
            "GPU beside the logits (op offload; --no-op-offload avoids it, prompts slower)"
        )
    elif op_copy and n_cpu and op_copy > copy_bytes(n_cpu):
        note += (
            f"; the GPU compute buffer grows by {op_copy / MIB:,.1f} MiB: prompt batches run the CPU layers' "
            "attention on the GPU, with copies of each one's K and V (op offload; --no-op-offload avoids it, "
            "prompts slower)"
        )
    elif op_copy:
        note += (
            f"; the GPU compute buffer grows by {op_copy / MIB:,.1f} MiB (estimate): prompt batches copy the "
            "largest CPU-resident weight to the GPU (op offload; --no-op-offload avoids it, prompts slower)"
        )
    elif op_copy is None:
        note += "; op offload's copy of a CPU weight in the GPU compute buffer is not counted (tensor sizes unknown)"
    return Offload(
        n_ctx_seq,
        kv[0],
        kv[1],
        n_gpu_layers,
        n_cpu,
        n_cpu_moe,
        sum(each),
        full.host_bytes + moved,
        tps,
        note,
        op_copy,
        speed,
        tuple(each),
        tuple(budgets),
        ram,
        out_host,
        split,
        overflow,
    )


# of block n_cpu_moe - 1, the routed-expert tensors an Offload.expert_overflow leaves on the CPU
OVERFLOW_ON_CPU = {"up": ("gate", "down"), "gate": ("down",)}


def offload_flags(n_gpu_layers: int, n_cpu_moe: int, expert_overflow: str = "") -> str:
    """``-ngl 49 --n-cpu-moe 21`` as the command says it; with an expert overflow ``--n-cpu-moe 20 -ot '...'``."""
    n, override = cpu_moe_flags(n_cpu_moe, expert_overflow)
    return (
        f"-ngl {n_gpu_layers}"
        + (f" --n-cpu-moe {n}" if n else "")
        + (f" -ot {shlex.quote(override)}" if override else "")
    )


def cpu_moe_flags(n_cpu_moe: int, expert_overflow: str) -> tuple[int, str]:
    """--n-cpu-moe's value and the -ot that place :attr:`Offload.n_cpu_moe` and :attr:`Offload.expert_overflow`:
    ``n_cpu_moe`` and "" without an overflow; else ``n_cpu_moe - 1`` and an -ot that keeps on the CPU what the
    overflow leaves there of block ``n_cpu_moe - 1`` (llama.cpp's LLM_FFN_EXPS_REGEX, common/common.h, for that
    block and those tensors: its gate and down, or its down alone)."""
    if not expert_overflow or n_cpu_moe < 1:
        return n_cpu_moe, ""
    left = OVERFLOW_ON_CPU[expert_overflow]
    parts = left[0] if len(left) == 1 else "(" + "|".join(left) + ")"
    return n_cpu_moe - 1, f"blk\\.{n_cpu_moe - 1}\\.ffn_{parts}_(ch|)exps=CPU"


@dataclass(frozen=True, slots=True)
class CpuMoe:
    """``--n-cpu-moe N`` as llama.cpp places it: the routed-expert tensors of layers 0..N-1 in a CPU buffer
    (common/arg.cpp: ``llm_add_n_cpu_ffn_overrides(N, LLM_FFN_EXPS_REGEX, ...)``; common/common.h:
    ``blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` -> ``ggml_backend_cpu_buffer_type()``, llama.cpp
    0c1e570); shared experts, the router, attention and norms stay where -ngl puts them."""

    n_cpu_moe: int
    expert_layers: tuple[int, ...]  # of those N layers, the ones that hold routed experts
    host_bytes: int  # the experts kept in RAM
    # the first GPU's copy of the largest of them (op offload; RunConfig.op_offload_copy_bytes); None: unknown
    op_offload_bytes: int | None
    gpu_spec: ModelSpec  # the model as the GPUs hold it (those experts out of their layers)


def cpu_moe_placement(spec: ModelSpec, n_cpu_moe: int, device: str, n_ubatch: int, *, mtp: bool = False) -> CpuMoe:
    """Where ``--n-cpu-moe N`` puts the weights (see :class:`CpuMoe`). ``gpu_spec`` plans the GPUs' memory
    with the memory model as it is: the moved experts leave their layers' bytes (on whichever device the
    layer split gives them); the op-offload copy is planned with the config (RunConfig.op_offload_copy_bytes),
    as the first GPU's compute buffer grows by it at each context the recommender tries. ``mtp``: the NextN blocks
    load (a draft-mtp context), and an N past the trunk moves their experts too (the overrides go by block index)."""
    # by block index, each layer's own *_exps bytes: a dense first layer (leading_dense_block_count) moves nothing,
    # and llama-quantize's use_more_bits gives some layers' ffn_down_exps more bits than others
    ids = tuple(il for il in speed_model.expert_layer_ids(spec) if il < n_cpu_moe)
    if not ids or not spec.expert_bytes:
        return CpuMoe(n_cpu_moe, ids, 0, 0, spec)
    per_layer = speed_model.layer_expert_bytes(spec)
    moved = min(sum(per_layer[il] for il in ids), spec.expert_bytes)
    copy = op_offload_bytes(spec, ids, device, n_ubatch)
    # blocks of unknown size (a spec without layer_bytes) share what is left evenly (split.device_layers)
    layers = list(spec.layer_bytes)
    experts = list(per_layer)
    for il in ids:
        if layers:
            layers[il] = max(0, layers[il] - per_layer[il])
        experts[il] = 0
    # the NextN blocks' experts (loaded with draft-mtp: mtp.with_nextn_weights adds what is left of those blocks)
    nextn = list(spec.nextn_layer_bytes)
    moved_nextn = 0
    for k, e in enumerate(spec.nextn_layer_expert_bytes if mtp else ()):
        if spec.n_layer + k < n_cpu_moe and k < len(nextn):
            nextn[k] = max(0, nextn[k] - e)
            moved_nextn += e
    gpu = replace(
        spec,
        weights_bytes=spec.weights_bytes - moved,
        expert_bytes=spec.expert_bytes - moved,
        layer_bytes=tuple(layers),
        layer_expert_bytes=tuple(experts) if spec.layer_expert_bytes else (),
        nextn_layer_bytes=tuple(nextn),
        nextn_span_bytes=max(0, spec.nextn_span_bytes - moved_nextn),
    )
    return CpuMoe(n_cpu_moe, ids, moved + moved_nextn, copy, gpu)


def with_cpu_moe(est: MemoryEstimate, placement: CpuMoe) -> MemoryEstimate:
    """The estimate of ``placement.gpu_spec`` as llama.cpp prints it for the whole model: the moved experts
    in host RAM (the CPU's model buffer); the op-offload copy is already in the first GPU's compute buffer."""
    if not placement.host_bytes or not est.devices:
        return est
    host = replace(
        est.host,
        weights_bytes=est.host.weights_bytes + placement.host_bytes,
        total_bytes=est.host.total_bytes + placement.host_bytes,
    )
    return replace(
        est,
        host=host,
        weights_bytes=est.weights_bytes + placement.host_bytes,
        host_bytes=est.host_bytes + placement.host_bytes,
        total_bytes=est.total_bytes + placement.host_bytes,
    )
