"""Routed experts kept in host memory (--n-cpu-moe, -ot exps=CPU; or the MoE blocks a partial -ngl leaves on the
CPU) beside devices that do not op-offload their matmuls (ggml-rpc has no offload_op): what the devices' and the host's
compute buffers hold then, above the buffers without them (kvadvise.planner.compute's).

Follows llama.cpp b11312 (0c1e570): ggml/src/ggml-backend.cpp ggml_backend_sched_split_graph (the experts' matmuls
in CPU splits; a device's next split starts with copies of their output, "expand gpu up"; an input is copied into
the first split that reads it) and ggml_backend_sched_backend_id_from_cur; src/llama-graph.cpp build_moe_ffn (the
experts' tensors); ggml/src/ggml-alloc.c (where ggml-alloc's best fit puts the copies). A device's growth
(:func:`host_experts_device_growth`), a device's first block after blocks left on the CPU
(:func:`cpu_experts_boundary_bytes`), a device of a split (:func:`host_experts_split_compute`), the full mask copied
in late after a sliding-window block 0 (:func:`late_full_mask_bytes`, :func:`late_full_mask_scores_bytes`), and the
host's buffer, the CPU's side of the graph replayed through ggml-alloc (:func:`host_experts_host_compute_bytes`,
kvadvise.planner.galloc). Measured with llama-fit-params and llama-server b11312 over one, two and three loopback
rpc-servers on qwen3moe, Mixtral, gpt-oss, qwen2moe, qwen3next, qwen35moe, glm4moe, deepseek2 and other shapes
(tests/test_host_experts.py, tests/test_host_experts_split.py, tests/test_host_experts_host_compute.py,
tests/test_shared_host_experts_no_fa.py). kvadvise.planner.memory adds these rules to a plan's devices and host,
kvadvise.planner.offload to a partial offload's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import replace

from kvadvise.model.ggml import ALIGNMENT, pad
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner.compute import device_compute_bytes, host_compute_bytes, unpipelined_split_compute
from kvadvise.planner.galloc import Graph, GraphBuilder, flat, reserve_sizes
from kvadvise.planner.layout import ContextLayout, layer_shapes
from kvadvise.planner.sizes import (
    device_masks,
    expert_activation_bytes,
    f32_fa_mask,
    graph_sizes,
    k_idxs_bytes,
    mask_copy_bytes,
    mla_host_experts_growth,
    mla_split_bytes,
    reserve_outputs,
    reserve_tokens,
    v_idxs_bytes,
)
from kvadvise.planner.split import DeviceLayers, gathers_in_last_block

# shared experts without a gate whose device buffer does not grow at all with --n-cpu-moe over an RPC device (llama-server
# b11312, -ub 2048: a small deepseek2 MLA 90.30 MiB and glm4moe 168.79 with and without --n-cpu-moe 2, where the rule
# below planned +46 and +56); the gated shared experts (qwen2moe +18, qwen3next +16 measured) keep it
_NO_HOST_EXPERTS_GROWTH = frozenset({"deepseek2", "glm4moe"})


def biased_experts_grow(spec: ModelSpec) -> bool:
    """A gpt-oss whose experts are at least n_embd wide (its own shapes): the rules measured on its blocks."""
    return spec.architecture in EXPERT_BIAS_GROWTH and not spec.n_ff_shexp and spec.n_ff_exp >= spec.n_embd


# routed experts with biases (src/models/openai-moe.cpp: ggml_add_id after each expert matmul, the biases matched by
# --n-cpu-moe's pattern too): the device's blocks that run their experts after blocks whose experts are in host memory
# hold one more [n_embd, n_expert_used, n_ubatch] f32 than at full offload (llama-fit-params b11312 over an
# rpc-server, gpt-oss-20b's dimensions in 8 blocks at 16k cells: 510.04 MiB at -ub 2048 with --n-cpu-moe 3 where the
# full offload reserves 420.08, 126.01 and 103.52 at -ub 512; tiny shapes with n_ff_exp = n_embd likewise; a qwen3moe
# of Qwen3-30B-A3B's dimensions does not move; n_ff_exp / n_embd / n_expert_used varied on tiny shapes: the rule below)
EXPERT_BIAS_GROWTH = frozenset({"gpt-oss"})


# the hybrids with a gated shared expert measured without flash attention with routed experts in host memory (round 25a:
# Qwen3-Next's widths): :func:`shared_experts_scores_bytes`; deepseek2's MLA blocks are replayed
# (sizes.mla_host_experts_growth)
_SHARED_SCORES_HOLE = frozenset({"qwen3next"})


def shared_experts_scores_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """Without flash attention, the compute buffer of a device whose blocks run a shared expert after routed experts in
    host memory (an RPC device: their matmuls in CPU splits): 0 where flash attention is on, or the model has no shared
    expert or is not one of those measured.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp b11312) starts the device's split after such a block
    with the copy of the down projection's output ([n_embd, n_expert_used, n_ubatch] f32, build_moe_ffn in
    src/llama-graph.cpp), which the weighting takes in place and ggml-alloc frees once the views' adds have read it
    (ggml_gallocr_free_node): the next attention's [n_kv, n_ubatch, n_head] scores (build_attn_mha without flash
    attention) do not fit that hole, so they are placed above it, beside Q and two rows of n_embd: the masks, one
    experts' output, the scores, Q and two rows. llama-fit-params b11312 over one and two loopback rpc-servers,
    -fa off, 4k cells, Qwen3-Next's widths: --n-cpu-moe 8 760.10 (one device) and 760 / 768 (two) MiB printed, 768
    planned (688 the full offload's, 700 / 728.07 planned before); -ub 1024 --n-cpu-moe 3: 380 printed, 384 planned.
    The same sum holds for the MLA replay's figures (DeepSeek-V2-Lite's shape at n_embd 4096: 872 where 848 / 864
    print) but not for every shape (DeepSeek-V2-Lite's own: 744 where 761 prints), hence the replay there."""
    if lay.flash_attn or not spec.n_expert or not spec.n_ff_shexp or spec.architecture not in _SHARED_SCORES_HOLE:
        return 0
    s = graph_sizes(spec, lay)
    eu = expert_activation_bytes(spec, lay.n_ubatch)[1]
    return pad(device_masks(s, lay) + eu + s.scores_bytes + s.q_bytes + 2 * s.embd_bytes, ALIGNMENT["cuda"])


def _shared_scores_growth(spec: ModelSpec, lay: ContextLayout, base: int | None) -> int:
    """Without flash attention, what a shared-expert model's device grows by with routed experts in host memory: the
    MLA replay's (sizes.mla_host_experts_growth) for deepseek2, :func:`shared_experts_scores_bytes` above ``base``
    (the device's figure without the growth; None: the full offload's) for the others measured, else 0."""
    if lay.flash_attn or not spec.n_ff_shexp:
        return 0
    if spec.architecture == "deepseek2" and lay.device == "rpc":
        return mla_host_experts_growth(spec, lay) or 0
    return max(0, shared_experts_scores_bytes(spec, lay) - (device_compute_bytes(spec, lay) if base is None else base))


def host_experts_device_growth(
    spec: ModelSpec, lay: ContextLayout, *, device_experts: bool = True, base: int | None = None
) -> int:
    """How much a device's compute buffer grows when some of its layers' routed experts sit in a host buffer
    and the device does not op-offload their matmuls (an RPC device; ggml-rpc has no offload_op).

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, 0c1e570; GGML_SCHED_DEBUG=2 shows it): the
    gate, up, SwiGLU and down projection of those experts form a CPU split ("1.wgt"); the device's next split
    starts with the copy of the down projection's output ([n_embd, n_expert_used, n_ubatch] f32) and of the
    graph inputs it is the first to use (a hybrid's KQ masks when its first layers are recurrent), then
    weights it, sums it and runs the shared expert. The copies are allocated where ggml-alloc's best fit
    finds room at that point, not at the bottom of the buffer as at full offload, and the peak moves,
    not monotonically in the number of such layers; the layers whose experts stay on the device still run their
    routed experts there, above that. Measured with llama.cpp's allocation pass
    (llama-fit-params b11312, an RPC device, --n-cpu-moe 1 to 4 and -ot of single layers) on qwen3next
    shapes: the device's peak is at most the masks, two rows of n_embd, three of the routed experts'
    [n_ff_exp, n_expert_used, n_ubatch] (gate, up, product), one and a half of the down projection's output,
    two of the shared expert's [n_ff_shexp, n_ubatch] and the router's [n_expert, n_ubatch] f32
    probabilities: within 0.12 MiB above on seven small shapes (n_embd 512-1024, 16-64 experts, 2-4 used,
    n_ff_exp and n_ff_shexp 256-1024, ubatch 512 and 2048, 4k and 16k), 2.5 MiB above on Qwen3.5-35B-A3B's
    shape at ubatch 512, 26 MiB (4.6 %) at 2048; never below. A qwen3moe of the same size (no shared expert)
    moves by at most 0.5 MiB (up to 16 MiB on other shapes), inside the phases' full-offload figure: no growth is
    planned from that figure (a partial plan's base, offload._partial_base); one RPC device's figure is replayed
    (compute.host_experts_device_compute). Without flash attention a shared-expert model's device holds at least
    :func:`_shared_scores_growth` above ``base`` (the device's own figure in a split; None: the full offload's)."""
    if spec.n_expert and not spec.n_ff_shexp and spec.architecture in EXPERT_BIAS_GROWTH:
        # ``device_experts``: some later blocks still run their experts on the device. Where ggml-alloc finds the room
        # depends on the tensors' sizes: experts narrower than n_embd (not gpt-oss's own shapes) grew by nothing with
        # 4 used experts and by one and a half outputs with 6 or 8 (tiny shapes, -ub 2048)
        eu = expert_activation_bytes(spec, lay.n_ubatch)[1]
        if spec.n_ff_exp >= spec.n_embd:
            return eu if device_experts else 0
        # narrow experts, 6 or more used: one and a half outputs, half of one with every expert on the host (round
        # 23a, 8 of 16 experts of 512 beside n_embd 1024 at -ub 2048: 289.04 MiB, 225.04 at --n-cpu-moe 8; 193.08 full)
        if spec.n_expert_used < 6:
            return 0
        return eu * 3 // 2 if device_experts else eu // 2
    if spec.n_expert and not spec.n_ff_shexp and spec.architecture == "llama":
        # Mixtral (a llama-architecture MoE): one row of n_embd on the blocks after a host-experts block (round 23a,
        # llama-fit-params b11312: Mixtral-8x7B's widths 864.04 MiB at --n-cpu-moe 1, -ub 2048, 832.05 full)
        return pad(graph_sizes(spec, lay).embd_bytes, ALIGNMENT["cuda"]) if device_experts else 0
    # without flash attention: the scores above the hole of the experts' output (shared_experts_scores_bytes)
    scores = _shared_scores_growth(spec, lay, base) if spec.n_expert else 0
    if not spec.n_expert or not spec.n_ff_shexp or spec.architecture in _NO_HOST_EXPERTS_GROWTH:
        return scores
    s = graph_sizes(spec, lay)
    ub, f32 = lay.n_ubatch, 4
    ff, eu = expert_activation_bytes(spec, ub)
    masks = device_masks(s, lay)
    peak = masks + 2 * s.embd_bytes + 3 * ff + eu + eu // 2 + 2 * f32 * ub * spec.n_ff_shexp + f32 * ub * spec.n_expert
    return max(scores, pad(peak, ALIGNMENT["cuda"]) - device_compute_bytes(spec, lay))


def cpu_experts_boundary_bytes(
    spec: ModelSpec, lay: ContextLayout, *, own_experts: bool, last_block: bool = False
) -> int:
    """The compute buffer of a device that does not op-offload (ggml-rpc) at its first block after whole blocks left
    on the CPU (a partial -ngl) ran their routed experts there: 0 for a dense model.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, b11312) gives the ops between the CPU's down
    projection and the device's first weight (the weighting by the router's probabilities, the sum over the used
    experts, the residual add, the next norm) to the device ("expand gpu up"): its split starts with copies of the
    experts' output and the residual, and ggml-alloc's best fit places the next block's tensors around the holes
    they leave. Measured with llama-server b11312 over a loopback rpc-server (qwen3moe shapes: n_embd 1024-2048,
    16-64 experts, 2-8 used, n_ff_exp 512-1536, -ub 512 and 2048, 16k cells, flash attention):
    - ``own_experts`` (plain -ngl, the device runs its blocks' experts): the masks, a row of n_embd, the three
      [n_ff_exp, n_expert_used, n_ubatch] tensors of its experts and one and a half of the experts' output [n_embd,
      n_expert_used, n_ubatch]; exact at n_embd 1024 and 2-8 used experts of 512 (264.10 MiB at 8 used, -ub 2048,
      where the full offload's 184.04 and one output more planned 248), at most 32 MiB over elsewhere;
    - else (--n-cpu-moe past the CPU's blocks: the device's experts in host memory too): the masks, a row of n_embd
      and two of the experts' output, exact on the same shapes (200.10 MiB at 8 used, nothing planned above the full
      offload's 184.04 before);
    - ``last_block``: the device's only block is the last one, which runs its feed-forward at the output rows alone
      (split.gathers_in_last_block): the masks, two rows of n_embd and the experts' output, either way (144.13 MiB at
      8 used experts and 112.10 at 4, as --fit's -ngl 2 prints; the full offload's 184.04 and one output more had
      been planned)."""
    if not spec.n_expert:
        return 0
    s = graph_sizes(spec, lay)
    ub = lay.n_ubatch
    ff, eu = expert_activation_bytes(spec, ub)
    masks = device_masks(s, lay)
    if last_block:
        # its attention still runs on the whole batch: without flash attention the [n_kv, n_ubatch, n_head] scores
        # are the peak (round 23a: 653.5 MiB printed where the FFN's rows alone planned 139.5); experts wider than
        # n_embd keep two more rows (qwen3moe with 2 used experts of 4096: 32 MiB at -ub 2048)
        rows = 4 if ff > eu else 2
        peak = max(masks + rows * s.embd_bytes + eu, masks + s.attn_bytes, s.logits_bytes + 2 * s.embd_bytes)
    else:
        peak = masks + s.embd_bytes + (3 * ff + eu + eu // 2 if own_experts else 2 * eu)
    return pad(peak, ALIGNMENT["cuda"])


# MoE architectures with no dense feed-forward block (their graphs never read n_ff as a dense width: Mixtral's is the
# experts', qwen3moe's an unused key): a device that runs none of their routed experts runs no feed-forward of n_ff
_ROUTED_ONLY_ARCHS = frozenset({"llama", "qwen3moe", "gpt-oss"})


def without_routed_ffn(spec: ModelSpec) -> ModelSpec:
    """The model as the graph of a device sees it where none of its blocks runs routed experts on the whole batch
    (their gate, up and down projections in CPU splits): experts one value wide, and no dense feed-forward where the
    architecture has none (others keep n_ff: an upper bound for their dense blocks)."""
    return replace(spec, n_ff_exp=1, n_ff=0 if spec.architecture in _ROUTED_ONLY_ARCHS else spec.n_ff)


def _full_mask_copied_late(spec: ModelSpec, layers: Iterable[int]) -> bool:
    """Whether the first attention block of ``layers`` is a sliding-window one and a later one attends to the whole
    context, so that a device running them copies the full mask in at a later split than the first
    (ggml_backend_sched_split_graph, ggml-backend.cpp b11312: an input goes to the first split that reads it), where a
    CPU split cuts the graph between them."""
    kv = [il for il in layers if spec.kv_layers[il]]
    return bool(kv) and spec.swa_layers[kv[0]] and not all(spec.swa_layers[il] for il in kv)


def late_full_mask_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """What the device that runs block 0 holds above its bare graph's phases where block 0 is a sliding-window block
    whose routed experts run on the CPU (--n-cpu-moe): 0 elsewhere.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, b11312) copies a graph input into the first split that
    reads it. Block 0's split reads the token embeddings' [n_embd, n_ubatch] f32 (token_embd's get_rows runs on the
    CPU) and the sliding-window mask only; the full mask's copy comes in with the CPU split's experts' output, at the
    split that runs block 1's attention (GGML_SCHED_DEBUG=2: "SPLIT #3: RPC0 ... [ffn_moe_down_biased-0]
    [attn_inp_kq_mask]"), by when the embeddings' copy is freed: ggml-alloc's best fit puts the full mask in that
    hole where it fits, and where it is smaller the hole's rest stays empty below the layer's tensors. So the foot of
    the buffer holds the sliding-window mask and max(full mask, one row of n_embd). llama-fit-params b11312, gpt-oss-
    120b's widths in 6 blocks, --n-cpu-moe 6, flash attention, one rpc-server: -ub 2048 -np 8 at 8k cells (1024 a
    stream) 193.54 MiB printed, 175.66 planned before; over two, the first device 193 / 197 / 198 at 1024 / 2048 /
    4096 cells a stream where 175.66 / 183.66 / 192.66 had been planned, 208 at 8192 (the full mask wider than the
    row: nothing more). Without flash attention the peak is a full block's scores, which this hole does not reach
    (-ub 2048 -np 8 at 8k cells: 685 printed, 691.5 planned without it, 706 with it)."""
    if not lay.flash_attn or not spec.n_expert or not _full_mask_copied_late(spec, range(spec.n_layer)):
        return 0
    return max(0, graph_sizes(spec, lay).embd_bytes - mask_copy_bytes(lay.n_ctx_seq, lay))


def late_full_mask_scores_bytes(spec: ModelSpec, lay: ContextLayout, layers: tuple[int, ...]) -> int:
    """Without flash attention, the peak of a device whose blocks ``layers`` run their routed experts on the CPU, the
    first a sliding-window block (a later one attends to the whole context), where the first block is block 0 or
    follows a block whose experts ran on the CPU: 0 elsewhere.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, b11312) copies a graph input into the first split that
    reads it, so the full mask's copy comes in after the first block's CPU split, after that split's output copy
    ([n_embd, n_expert_used, n_ubatch] f32, Eu): both land on top of what the first split left (ggml-alloc's best fit:
    no hole takes Eu), the mask in a hole only where it fits one; the full block's [n_ctx, n_ubatch, n_head] f32
    scores stack on them. What the first split leaves: on block 0's device the token embeddings' hole (a row of
    n_embd, the cache's row ids in it), the positions, the sliding-window mask, ffn_inp and the weighted sum's row
    (3 rows); after a CPU block, that block's Eu and ffn_inp copied in, the positions (read to the device's last
    block) pinning them (Eu less a row free for the mask). A traced ggml-alloc (round 26d, llama-fit-params b11312
    with allocation prints, gpt-oss-120b's widths in 6 blocks, --n-cpu-moe 6, two rpc-servers): the first device
    4343.55 MiB at -ub 2048 and 8k cells (4343 printed, 4341.5 planned before), 8503 / 2263 / 1221 / 685 at 16k /
    -np 2 / 4 / 8 (this rule 8503.5 / 2263.5 / 1221.5 / 685.5); the second 4261.27 at -ub 1024 and 16k (4246.75
    planned before), 2130 at -ub 512 (2122.38 before)."""
    if lay.flash_attn or not spec.n_expert or not _full_mask_copied_late(spec, layers):
        return 0
    ub, embd = lay.n_ubatch, graph_sizes(spec, lay).embd_bytes
    eu = expert_activation_bytes(spec, ub)[1]
    full_mask = mask_copy_bytes(lay.n_ctx_seq, lay)  # f32: no flash attention
    if layers[0] == 0:
        shapes = layer_shapes(spec)
        # the positions (i32) and the cache's row ids (i64 K, and V's of the sliding-window cache)
        ids = 4 * ub + 8 * ub + v_idxs_bytes(spec, lay) // max(1, bool(shapes.kv_group) + bool(shapes.swa_group))
        below, hole = 3 * embd + ids + lay.n_ctx_swa * ub * 4, embd - ids
    else:
        below, hole = eu + embd, eu - embd
    stacked = full_mask if full_mask > hole else 0
    if not stacked and layers[0] > 0:
        return 0  # the mask in the copies' hole: another placement (measured under this one), not this rule's
    scores = 4 * ub * lay.n_ctx_seq * max(spec.n_head)
    return pad(below + eu + stacked + scores, ALIGNMENT["cuda"])


def experts_moved(spec: ModelSpec) -> tuple[bool, ...] | None:
    """Per block of the trunk, whether its routed experts are in host memory in ``spec`` as offload.cpu_moe_placement
    leaves it (a moved block holds none of their bytes); None where the blocks' expert bytes are unknown. A block
    that never had experts (a dense lead block) is not told apart: it reads as moved (the safe side)."""
    if len(spec.layer_expert_bytes) < spec.n_layer:
        return None
    return tuple(not spec.layer_expert_bytes[il] for il in range(spec.n_layer))


def host_experts_split_compute(
    spec: ModelSpec, lay: ContextLayout, part: DeviceLayers, on_host: Callable[[int], bool]
) -> int | None:
    """One device's compute buffer in a split over several devices that do not op-offload (ggml-rpc), where the
    blocks for which ``on_host`` is true run their routed experts on the CPU (--n-cpu-moe, or whole blocks left on the
    CPU); None where this rule is not the one (no routed experts, a shared expert but without flash attention on a
    device after host experts that runs none of its own, the last block alone, no block).

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, b11312) runs those experts' matmuls in CPU splits; the
    ops after the down projection up to the next weight go to the device that holds it ("expand gpu up"), so a device
    whose first block follows such a block starts its split with copies of the experts' output and the residual.
    llama-fit-params b11312 over two loopback rpc-servers, qwen3moe shapes (n_embd 1024-4096, 2-8 used experts of
    512-4096, -ub 2048, 16k cells), -ts and --n-cpu-moe moving the boundary:
    - a device none of whose blocks runs its experts on the whole batch (the last block runs its FFN at the output
      rows only) holds the bare graph (:func:`without_routed_ffn`): 152/160/256/448 MiB printed, 152.75/176/256.75/
      448.5 planned, where the full offload's 184.56/320.31/400.56/736.31 had been planned; after such a block on
      another device, at least the masks, a row of n_embd and two of the experts' output
      (cpu_experts_boundary_bytes' host case: 200/336/608 MiB printed, exact);
    - a device that runs some experts, after such a block: the masks, two rows of n_embd, the three [n_ff_exp,
      n_expert_used, n_ubatch] tensors and one and a half outputs (800.0 printed on 8 used experts of 1536 at n_embd
      4096, 432.0 at 2048, where the full offload's 736.31 and 400.56 were planned: under), else the full
      offload's."""
    layers = tuple(il for il in part.layers if il < spec.n_layer)
    last = spec.n_layer - 1
    if not spec.n_expert or not layers:
        return None
    first = layers[0]
    inflow = first > 0 and on_host(first - 1)  # its first block follows a block whose experts ran on the CPU
    if spec.n_ff_shexp:
        # a shared expert: only a device after host experts that runs none of its own, without flash attention (round
        # 25a: DeepSeek-V2-Lite's shape at n_embd 4096 and Qwen3-Next's, the second of two rpc-servers at --n-cpu-moe
        # 6 / 8: 864 / 768 printed, 776.04 / 728.07 planned before; one that runs its own grew by nothing: 388 / 340)
        if lay.flash_attn or not inflow or not all(on_host(il) for il in layers):
            return None
        if spec.architecture == "deepseek2":  # the MLA replay with the copies (sizes.mla_host_experts_growth)
            return mla_split_bytes(spec, lay, layers, output=layers[-1] == last, copies=1, host_experts=True)
        hole = shared_experts_scores_bytes(spec, lay)
        return max(unpipelined_split_compute(spec, lay, part), hole) if hole else None
    gathers = gathers_in_last_block(spec) and reserve_outputs(lay) < lay.n_ubatch
    s = graph_sizes(part.spec, lay)  # the masks of the attention it holds (a sliding-window block: that mask only)
    ff, eu = expert_activation_bytes(spec, lay.n_ubatch)
    masks = device_masks(s, lay)
    # without flash attention the scores' phase, where the boundary's copies leave half an experts' output beside it
    # (and 2.5 rows of n_embd fewer than one device keeps there): round 25a, Qwen3-30B-A3B's widths over two and
    # three rpc-servers, llama-fit-params b11312: 1224 / 4392 / 1140 MiB printed at 4k / 16k / -ub 1024 -np 2, where
    # 1200 / 4368 / 1128 had been planned (under); the device without the boundary 1160 / 4328 / 1108
    scores = pad(masks + s.attn_bytes - 5 * s.embd_bytes // 2 + eu // 2, ALIGNMENT["cuda"])
    scores = scores if inflow and not lay.flash_attn else 0
    if layers == (last,):  # the last block alone: its own rule, and at least the boundary's after host experts
        own = cpu_experts_boundary_bytes(part.spec, lay, own_experts=True, last_block=True) if inflow else 0
        return max(unpipelined_split_compute(spec, lay, part), own, scores) if inflow else None
    # the blocks that run their experts on the device at the whole batch (not a last block that gathers its rows)
    full_rows = [il for il in layers if not (il == last and gathers)]
    if any(not on_host(il) for il in full_rows):
        own = unpipelined_split_compute(spec, lay, part)
        if inflow:
            own = max(
                own,
                pad(masks + 2 * s.embd_bytes + 3 * ff + eu + eu // 2, ALIGNMENT["cuda"]),
                scores,
            )
        return own
    own = unpipelined_split_compute(without_routed_ffn(spec), lay, replace(part, spec=without_routed_ffn(part.spec)))
    if first == 0:  # the full mask's copy made after block 0's experts ran on the CPU
        own = max(own + late_full_mask_bytes(spec, lay), late_full_mask_scores_bytes(spec, lay, layers))
    if inflow:  # one block's output copied in beside two rows; from the second block on, two outputs
        held = masks
        if lay.flash_attn and len(layers) > 1 and _full_mask_copied_late(spec, layers):
            # a first sliding-window block: its mask is freed before the next block's output comes in, and the full
            # mask, copied in at that split, takes the hole the first copies leave (Eu less the first block's Q)
            # where it fits. Traced (round 26d, llama-fit-params b11312, gpt-oss-120b's widths, --n-cpu-moe 6, the
            # second of two rpc-servers, -ub 2048): 202.54 MiB at -np 4 (both masks in holes; 227.5 planned before),
            # 266 at 16k cells and -np 1 (the 64 MiB mask above; 275.5 before)
            full_mask = mask_copy_bytes(lay.n_ctx_seq, lay)
            held = full_mask if full_mask > eu - s.q_bytes else 0
        peak = held + (2 * s.embd_bytes + eu if len(layers) == 1 else s.embd_bytes + 2 * eu)
        own = max(own, pad(peak, ALIGNMENT["cuda"]), scores, late_full_mask_scores_bytes(spec, lay, layers))
    return own


def host_experts_host_compute_bytes(spec: ModelSpec, lay: ContextLayout, owner: tuple[int, ...] | None = None) -> int:
    """The host's compute buffer when some blocks' routed experts sit in a host buffer and the device does not
    op-offload their matmuls (an RPC device; ggml-rpc has no offload_op): their MUL_MAT_IDs run in a CPU split
    (ggml_backend_sched_backend_id_from_cur, ggml/src/ggml-backend.cpp b11312: "operations with weights are
    preferably run on the same backend as the weights"), so their activations are allocated in the CPU's buffer
    beside the graph inputs. ``owner``: the device of each block (split.layer_devices; None: one device).

    Which inputs are still alive there, and where the freed ones left holes, decides the peak, so the CPU's side of
    the graph is replayed through ggml-alloc (:func:`_host_experts_cpu_graph`). Measured with llama-fit-params
    b11312 over one and two loopback rpc-servers (qwen3moe, Mixtral, gpt-oss, qwen2moe, qwen3next, qwen35moe, glm4moe,
    lfm2moe, deepseek2, gemma4, granitehybrid, nemotron_h_moe; --n-cpu-moe 1 to all, -ub 512 and 2048, flash
    attention on and off): 182 of 183 runs to 0.01 MiB, one 0.08 over (tests/test_host_experts_host_compute.py). A
    qwen3moe of Qwen3-30B-A3B's widths at 16k cells, -ub 2048: 352.05 MiB printed with one device, 368.30 with two
    (240.08 planned before: the gate's 48 MiB does not fit the 64 MiB mask's hole beside the norm's copy and the ids,
    and with two devices the mask lives on until the second device's first block)."""
    base = host_compute_bytes(spec, lay)
    if not spec.n_expert:
        return base
    lay = replace(lay, n_ubatch=reserve_tokens(lay), n_outputs_max=reserve_outputs(lay))
    graph = _host_experts_cpu_graph(spec, lay, owner or (0,) * (spec.n_layer_all + 1))
    return max(base, pad(_cpu_reserved(graph), ALIGNMENT["cuda"]))


@functools.lru_cache(maxsize=256)
def _cpu_reserved(graph: Graph) -> int:
    """The CPU's buffer of ``graph`` (a few ms for a hundred blocks: a search plans the same context more than once)."""
    return reserve_sizes(graph, (ALIGNMENT["cpu"],))[0]


# multi-section RoPE (LLAMA_ROPE_TYPE_MROPE / IMROPE, llama_model_rope_type, src/llama-model.cpp b11312): the positions
# input holds n_pos_per_embd() = 4 i32 a token (a qwen35moe at -ub 2048: a 32 KiB inp_pos)
_MROPE_ARCHS = frozenset({"qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe"})
# routed experts without a gate: up, relu and its square in place, down (build_moe_ffn's LLM_FFN_RELU_SQR without
# gate_exps, src/llama-graph.cpp b11312; nemotron-h.cpp): no GLU beside up to take the norm's copy's hole (a tiny
# nemotron_h_moe at -ub 2048: 37.08 MiB printed, 36.09 planned as gated)
_UNGATED_EXPERTS = frozenset({"nemotron_h_moe"})


def _reads_kind(attends: list[bool], swa_layers: tuple[bool, ...], swa: bool, il: int) -> bool:
    """Whether block ``il`` reads the inputs of the cache kind ``swa`` (its K/V row indices and KQ mask)."""
    return attends[il] and swa_layers[il] == swa


def _host_experts_cpu_graph(spec: ModelSpec, lay: ContextLayout, owner: tuple[int, ...]) -> Graph:
    """The tensors of the CPU's buffer in the order ggml_backend_sched hands them to ggml-alloc (b11312):

    - the graph inputs, leafs allocated first in the order the graph meets them (ggml_gallocr_alloc_graph_impl): the
      token ids, build_inp_embd's f32 inp_embd (read by no node: never freed), the positions, per cache kind its K and
      V row indices and its KQ mask, the output ids;
    - token_embd's get_rows (split #0), copied to the first device at its first split;
    - ggml_backend_sched_split_graph adds, at the start of the split that copies an input in, a view of it
      (input_dep) as the input's last child, so the host frees each input once the last device that reads it has
      taken its copy: at that device's first block that reads it (the masks of a kind its blocks read later live on);
    - a block whose experts are on the host: its split's copies of the normed input and of ffn_moe_topk (a view of
      the argsort's [n_expert, n_tokens] i32 rows: the copy keeps its strides, so it is as large as the argsort),
      gate and up ([n_ff_exp, n_expert_used, n_tokens] f32; gpt-oss's biases added in place by ADD_ID), their GLU,
      the down projection ([n_embd, n_expert_used, n_tokens]), freed when the next device split copies it out
      (build_moe_ffn, src/llama-graph.cpp; the weighting runs on the device). A last block that gathers the output
      rows first runs them at those rows."""
    ub, n_layer = lay.n_ubatch, spec.n_layer
    # the moved blocks (:func:`experts_moved`; unknown: every block), but for Nemotron-H's blocks whose one mixer is
    # Mamba-2 or attention, not the MoE (src/models/nemotron-h.cpp)
    moved = experts_moved(spec) or (True,) * n_layer
    on_host = [
        moved[il] and not (spec.architecture in _UNGATED_EXPERTS and (spec.recurrent_layers[il] or spec.kv_layers[il]))
        for il in range(n_layer)
    ]
    mask_elt = 4 if not lay.flash_attn or f32_fa_mask(lay) else 2
    shapes = layer_shapes(spec)
    kinds = bool(shapes.kv_group) + bool(shapes.swa_group)
    b = GraphBuilder()  # one buffer, the CPU's; the activations known by their bytes (galloc.flat)
    frees: dict[int, list[int]] = {}

    def freed_at(reads: Callable[[int], bool]) -> int:
        """The block at whose split the last device that reads an input copies it in."""
        layers = [il for il in range(n_layer) if reads(il)]
        if not layers:
            return n_layer
        last = max(owner[il] for il in layers)
        return min(il for il in layers if owner[il] == last)

    def leaf(name: str, nbytes: int, reads: Callable[[int], bool] | None = None) -> int:
        i = b.input(name, nbytes)
        if reads is not None and nbytes:
            frees.setdefault(freed_at(reads), []).append(i)
        return i

    def matmul(name: str, nbytes: int, src: int, ids: int) -> int:
        """A MUL_MAT_ID of host experts; gpt-oss adds its experts' biases in place (ggml_add_id, ggml_op_can_inplace)."""
        i = b.op(name, "MUL_MAT_ID", flat(nbytes), (src, ids))
        if spec.architecture in EXPERT_BIAS_GROWTH:
            i = b.op(f"{name}_biased", "ADD_ID", flat(nbytes), (i, ids))
        return i

    tokens = leaf("inp_tokens", 4 * ub)
    if not builds.older_than(lay.llama_build, builds.EMBD_SELECT):
        leaf("inp_embd", 4 * ub * spec.n_embd)
    attends = [bool(spec.kv_layers[il]) for il in range(n_layer)]
    leaf("inp_pos", 4 * ub * (4 if spec.architecture in _MROPE_ARCHS else 1), lambda il: attends[il])
    k_idxs = k_idxs_bytes(spec, lay) // max(1, kinds)
    # V's row indices: one i64 a token, or a row of n_embd_v_gqa a token where V is transposed
    v_idxs = v_idxs_bytes(spec, lay) // max(1, kinds) or k_idxs
    for swa in sorted({spec.swa_layers[il] for il in range(n_layer) if attends[il]}, key=spec.swa_layers.index):
        cells = lay.n_ctx_swa if swa else lay.n_ctx_seq
        reads = functools.partial(_reads_kind, attends, spec.swa_layers, swa)
        leaf("k_idxs", k_idxs, reads)
        leaf("v_idxs", v_idxs, reads)
        leaf("kq_mask", cells * ub * mask_elt, reads)
    leaf("out_ids", 4 * min(ub, lay.n_outputs_max), lambda il: il == n_layer - 1)  # gathered in or after the last block
    embd = b.op("embd", "GET_ROWS", (spec.n_embd, ub), (tokens,))
    frees.setdefault(0, []).insert(0, embd)
    for il in range(n_layer):
        for i in frees.get(il, ()):
            b.dep(i)
        if not on_host[il]:
            continue
        n = lay.n_outputs_max if il == n_layer - 1 and gathers_in_last_block(spec) else ub
        ff, eu = expert_activation_bytes(spec, n)
        x = b.op("ffn_norm (copy)", "NONE", (spec.n_embd, n), ())
        ids = b.op("ffn_moe_topk (copy)", "NONE", (spec.n_expert * (n - 1) + spec.n_expert_used,), (), dtype="i32")
        if spec.architecture in _UNGATED_EXPERTS:  # relu, then its square, in place on up's output
            act = matmul("up", ff, x, ids)
            for op in ("UNARY", "SQR"):
                act = b.op(op, op, flat(ff), (act,))
        else:
            act = b.op("glu", "GLU", flat(ff), (matmul("gate", ff, x, ids), matmul("up", ff, x, ids)))
        b.dep(matmul("down", eu, act, ids))
    for i in frees.get(n_layer, ()):
        b.dep(i)
    return b.graph()
