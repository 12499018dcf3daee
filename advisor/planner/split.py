"""The layers split over several devices (-sm layer, every layer offloaded): which device holds each layer
(:func:`layer_devices`), each device's blocks and weights (:func:`device_layers`), and the compute buffers a
split makes with pipeline parallelism: each device's (:func:`split_compute`) and the host's
(:func:`split_host_compute`). One device is kvadvise.planner.compute's (a device of a split without pipeline
parallelism too, by the one-device rules); kvadvise.planner.memory puts these parts together.

Follows llama.cpp 0c1e570 (b11312): llama_model::load_tensors (the split points, the output layer's device),
ggml/src/ggml-backend.cpp ggml_backend_sched_split_graph (the split inputs and their copies); measured with
llama-fit-params b11312 on loopback RPC devices (benchmarks/bench_split.py, tests/test_devices.py).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, replace

from kvadvise.errors import ConfigError
from kvadvise.model.architecture import ENCODER_ARCHS
from kvadvise.model.ggml import ALIGNMENT, pad
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.layout import ContextLayout
from kvadvise.planner.sizes import (
    f32_fa_mask,
    graph_sizes,
    ids_bytes,
    k_idxs_bytes,
    mask_bytes,
    mask_inputs,
    mla_split_bytes,
    reserve_outputs,
    v_idxs_bytes,
)

# ggml_backend_sched: with pipeline parallelism the split inputs are kept in this many copies
# (GGML_SCHED_MAX_COPIES, ggml/src/ggml-backend.cpp; llama.cpp logs "pipeline parallelism enabled").
N_COPIES = 4


def layer_devices(n_layer_all: int, tensor_split: tuple[float, ...]) -> tuple[int, ...]:
    """The device of each layer 0..n_layer_all (the last entry: the output layer), full offload,
    -sm layer: llama_model::load_tensors's split points, cumulative shares normalised to 1 (in
    float, as llama.cpp), a layer to the first device whose point is above il / (n_layer_all + 1)."""
    n_dev = max(1, len(tensor_split))
    if n_dev == 1:
        return (0,) * (n_layer_all + 1)
    if any(x < 0 for x in tensor_split) or sum(tensor_split) <= 0:
        raise ConfigError("a tensor split needs shares >= 0 that are not all 0", hint="e.g. -ts 3,1")

    def f32(x: float) -> float:
        return float(struct.unpack("f", struct.pack("f", x))[0])

    points, acc = [], 0.0
    for x in tensor_split:
        acc = f32(acc + f32(x))
        points.append(acc)
    points = [f32(p / acc) for p in points]
    act = n_layer_all + 1
    return tuple(min(bisect.bisect_right(points, f32(il / act)), n_dev - 1) for il in range(act))


@dataclass(frozen=True, slots=True)
class DeviceLayers:
    """One device's share of a split (-sm layer): its blocks, whether it has the output layer, the weights."""

    layers: tuple[int, ...]
    last: bool  # it holds the output layer
    weights_bytes: int
    n_layers: int  # as "offloaded N/M layers to GPU" counts them (the output layer is one)
    # the model as this device's compute graph sees it: the attention and recurrent layers it holds, no others
    spec: ModelSpec


def trunk_only(part: DeviceLayers) -> DeviceLayers:
    """``part`` as the main context's graph runs it: without the MTP/NextN blocks, which that graph never builds (their
    tensors skipped unless a draft-mtp context loads them, llama_model_deepseek2 / glm4-moe load_arch_tensors
    TENSOR_SKIP, b11312; -ngl still counts them). A device given only the MTP block holds no graph: GLM-4.5-Air's
    widths at -ngl 3 -ts 1,2, llama-server b11312 over two rpc-servers put only the output layer's 62.52 MiB on the
    second device, where its compute and a block's had been planned (742.83 MiB; round 25a)."""
    n_layer = part.spec.n_layer
    if all(il < n_layer for il in part.layers):
        return part
    return replace(part, layers=tuple(il for il in part.layers if il < n_layer))


_SPLITS_MAX = 256  # the splits remembered (compare plans dozens of cards per model)
_SPLITS: dict[tuple[int, tuple[int, ...], int, bool], tuple[ModelSpec, tuple[DeviceLayers, ...]]] = {}


def device_layers(spec: ModelSpec, owner: tuple[int, ...], n_dev: int, cuda: bool) -> tuple[DeviceLayers, ...]:
    """Each device's blocks and weights for a split: the same at every context, so worked out once per model
    and split (kept for the last few hundred)."""
    # the devices' count too: one owner tuple is a split of two devices or of one (Ollama's replan on a single GPU
    # after the spread plan; an IndexError before)
    key = (id(spec), owner, n_dev, cuda)
    hit = _SPLITS.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    # a spec without per-block sizes (a config the breakdown cannot count): the blocks share the weights
    # evenly, so that a split over several devices gives each its layers' share, not all to the last one
    layer_w = list(spec.layer_bytes) if any(spec.layer_bytes) else _even_layers(spec)
    layer_pad = list(spec.layer_cuda_pad_bytes) or [0] * spec.n_layer_all
    # llama_model::load_tensors: token_embd always stays on the CPU ("very little benefit"); what is not
    # in a block (output, output_norm, ...) goes with the output layer; tied embeddings make that device
    # hold a copy of token_embd as the output layer (an encoder has no output layer: no copy); the input layer's
    # other tensors (per_layer_token_embd, position_embd, token_types) stay on the CPU with token_embd
    rest = output_layer_bytes(spec, cuda, sum(layer_w))
    parts = []
    for d in range(n_dev):
        layers = tuple(il for il in range(spec.n_layer_all) if owner[il] == d)
        last = owner[spec.n_layer_all] == d
        weights = sum(layer_w[il] + (layer_pad[il] if cuda else 0) for il in layers) + (rest if last else 0)
        n_layers = sum(1 for il in layers if il < spec.n_layer) + (1 if last else 0)
        parts.append(DeviceLayers(layers, last, weights, n_layers, _device_spec(spec, layers)))
    if len(_SPLITS) >= _SPLITS_MAX:
        _SPLITS.clear()
    out = _SPLITS[key] = (spec, tuple(parts))
    return out[1]


def output_weights_bytes(spec: ModelSpec, blocks_bytes: int | None = None) -> int:
    """The output layer's weights: what is in no block nor in the input layer (output.weight, output_norm, ...),
    and for tied embeddings the copy of token_embd llama.cpp loads as output.weight (an encoder has no output
    layer: no copy). ``blocks_bytes``: the blocks' weights (default: the spec's, or an even share without them)."""
    if blocks_bytes is None:
        blocks_bytes = sum(spec.layer_bytes) if any(spec.layer_bytes) else sum(_even_layers(spec))
    return spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes - blocks_bytes + _tied_copy(spec)


def output_pad_bytes(spec: ModelSpec) -> int:
    """CUDA's row padding of the output layer's tensors: what no block pads."""
    return spec.cuda_pad_bytes - sum(spec.layer_cuda_pad_bytes)


def output_layer_bytes(spec: ModelSpec, cuda: bool, blocks_bytes: int | None = None) -> int:
    """The output layer's weights as a device's buffer holds them (``cuda``: with CUDA's row padding)."""
    return output_weights_bytes(spec, blocks_bytes) + (output_pad_bytes(spec) if cuda else 0)


def output_host_bytes(spec: ModelSpec) -> int:
    """What the output layer adds to host memory when it stays on the CPU: its weights, less a tied model's copy of
    token_embd (llama-model.cpp load_tensors: a TENSOR_DUPLICATED tensor on the buffer type that already holds
    token_embd is that tensor, not a second one)."""
    return output_weights_bytes(spec) - _tied_copy(spec)


def _tied_copy(spec: ModelSpec) -> int:
    """The token_embd llama.cpp loads again as output.weight for tied embeddings (none for an encoder)."""
    return spec.tok_embd_bytes if spec.output_bytes == 0 and spec.architecture not in ENCODER_ARCHS else 0


def _device_spec(spec: ModelSpec, layers: tuple[int, ...]) -> ModelSpec:
    """The model with only ``layers``' attention and recurrent mixers (KV cells, recurrent state): what sizes the
    compute graph of a device that holds those blocks (:func:`split_compute`)."""
    held = [False] * spec.n_layer_all
    for il in layers:
        held[il] = True
    rec = tuple(r and h for r, h in zip(spec.recurrent_layers, held, strict=True))
    kv = tuple(k and h for k, h in zip(spec.kv_layers, held, strict=True))
    return replace(spec, kv_layers=kv, recurrent_layers=rec, ssm=spec.ssm if any(rec) else None)


def _even_layers(spec: ModelSpec) -> list[int]:
    """Equal block sizes for a spec whose per-block sizes are unknown: the weights less the token embedding
    and the output layer, over the trunk's layers."""
    body = max(0, spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes - spec.output_bytes)
    n = max(1, spec.n_layer)
    return [body // n if il < spec.n_layer else 0 for il in range(spec.n_layer_all)]


def split_compute(spec: ModelSpec, lay: ContextLayout, part: DeviceLayers, *, copies: int) -> int:
    """One device's compute buffer in a split over several devices (-sm layer, pipeline parallelism): the
    single-device rules (kvadvise.planner.sizes.graph_sizes; kvadvise.planner.compute's layer peak) applied to the
    layers it holds (``part.spec``), the output phase on the device with the output layer, and below them
    ``copies`` copies of its split inputs.

    ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp, 0c1e570): a tensor a split reads from another
    backend is copied in, and with pipeline parallelism (llama_context: several devices, every layer offloaded)
    in GGML_SCHED_MAX_COPIES copies flagged input and output, added as leafs "so that they are allocated first"
    and never freed. A device's split inputs (GGML_SCHED_DEBUG=2, llama-fit-params b11312 on loopback RPC
    devices): the KQ masks of the cache kinds its layers read (f16 with flash attention, else f32), the K/V row
    indices (without flash attention V's are [n_embd_v_gqa * n_ubatch] i64, V being transposed), the positions,
    and the hidden state: the token embeddings' get_rows (on the CPU with token_embd) on the first device; on a
    later one the previous layer's output and the next layer's rms norm, which has no weight, so the scheduler
    leaves it on the previous device ("## SPLIT #2: ... [norm-15 (2M)] ... [l_out-14 (2M)]" in the
    worst-case batch llama_context::graph_reserve reserves first). Measured on benchmarks/bench_split.py's grid."""
    part = trunk_only(part)
    ub = lay.n_ubatch
    rows_out = reserve_outputs(lay)
    gathers = gathers_in_last_block(spec)
    if part.last and not part.layers:
        # the output layer alone: where the last block gathered the output rows (ggml_get_rows(cur, inp_out_ids) in
        # its last layer, src/models/llama.cpp) its one input, the norm and the logits are n_outputs rows (llama-server
        # b11312 over two rpc-servers: 0.05 MiB printed for a Mamba-2 model's output layer at -ub 1024); a model that
        # gathers after its layer loop (_GATHER_AFTER_LOOP) gets the whole hidden state and keeps the gather's copy
        # of it beside (qwen35, gemma4 at -ub 1024: 20.03 MiB printed, 4 + 1 rows of n_embd)
        row = 4 * rows_out * spec.n_embd
        # a parallel block (command-r, cohere2) gathers its rows into weightless adds, which the scheduler puts on the
        # output layer's device: the whole batch's hidden state comes in (llama-server b11312 over an rpc-server at
        # -ngl 1: 66.51 / 70.51 MiB printed at -ub 1024 / 2048, 62.64 planned with one row)
        hidden = row if gathers and not spec.parallel_block else 4 * ub * spec.n_embd
        gather = 0 if gathers else hidden
        return pad(copies * hidden + gather + 4 * rows_out * spec.n_vocab + 2 * row, ALIGNMENT["cuda"])
    if (replayed := mla_split_bytes(spec, lay, part.layers, output=part.last, copies=copies)) is not None:
        return pad(replayed, ALIGNMENT["cuda"])
    s = graph_sizes(part.spec, lay)
    f32_mask = f32_fa_mask(lay)
    masks = mask_inputs(s, lay)
    # the K row indices of its layers' cache kinds and as many again for V's (i64 [n_ubatch] with flash
    # attention; without, the measured rule keeps them beside v_idxs_bytes's): none before set_rows (#14285)
    ids = 2 * k_idxs_bytes(part.spec, lay) + 16 * ub + (4 * min(ub, lay.n_outputs_max) if part.last else 0)
    # the V row indices of its layers' cache kinds: the host's definition, build gate included (none before set_rows)
    inputs = masks + (1 if 0 in part.layers else 2) * s.embd_bytes + v_idxs_bytes(part.spec, lay) + ids
    inputs += _mamba2_boundary_inputs(spec, part.layers, ub)
    # its layers' largest live set, the masks being inputs (before #23764 their f16 cast is not); without flash
    # attention the scores sit beside two rows of n_embd and two Q-sized tensors, one of each fewer than on a
    # single device, where the freed input copy's hole is below them (measured: the shapes of Llama 3.1 8B, Qwen3
    # 0.6B and 30B-A3B, gpt-oss-20b, Gemma 3 12B and 270M, LFM2: up to 16 MiB over before); not where Q comes
    # with its gate (Qwen3-Next, Qwen3.5: 12 MiB under so) or MLA's absorbed Q (15 MiB under so)
    narrow = not lay.flash_attn and s.attn_bytes and not spec.is_mla and spec.architecture not in _GATED_Q_ARCHS
    attn = s.attn_bytes - (s.embd_bytes + s.q_bytes if narrow else 0)
    mix = s.mix_bytes
    last = spec.n_layer - 1
    if (
        part.layers == (last,) and rows_out < ub and gathers
        and spec.kv_layers[last] and not spec.recurrent_layers[last]
    ):  # fmt: skip
        # the last block alone: its attention runs the whole ubatch, its feed-forward only the output rows it
        # gathers first (src/models/llama.cpp: il == n_layer - 1 && inp_out_ids; llama-server reserves one row a
        # slot): 30.04 MiB printed for a llama block of n_ff 4096 at -ub 512, where the FFN at the whole batch is 30
        mix = graph_sizes(part.spec, replace(lay, n_ubatch=rows_out)).mix_bytes
    layer = max(attn, mix) + s.layer_inputs_bytes + (s.mask_cells * ub * 2 if f32_mask else 0) if part.layers else 0
    logits = s.logits_bytes
    if spec.is_mla:
        # graph_sizes's MLA logits are a single device's output phase (replayed on an RPC device); here the logits of
        # the reserved rows, and without flash attention two Q-sized holes under them (the rule measured before)
        logits = 4 * rows_out * spec.n_vocab + (0 if lay.flash_attn else 2 * s.q_bytes)
    if spec.is_mla and lay.flash_attn:
        # measured on DeepSeek-V2-Lite's shape (bench_split.py, 4k and 32k cells, n_ubatch 512): with flash
        # attention the logits land two rows of n_embd above the inputs, not above the two Q-sized holes a single
        # device's last MLA layer leaves (36 MiB over before), and a layer's live set is half a Q above
        # the single device's (its freed input copy's hole is pinned here; 8.8 MiB under before)
        layer += s.q_bytes // 2 if part.layers else 0
    out = logits + 2 * s.embd_bytes + s.ple_bytes if part.last else 0
    return pad(copies * inputs + max(layer, out), ALIGNMENT["cuda"])


def unpipelined_last_block_compute(spec: ModelSpec, lay: ContextLayout, part: DeviceLayers) -> int | None:
    """The compute buffer of a device that holds only the last block (and maybe the output layer) without pipeline
    parallelism, where that block gathers the output rows before its feed-forward (None: another case).

    With one copy the split's inputs are ordinary nodes (ggml_backend_sched_split_graph flags them input only
    ``if (sched->n_copies > 1)``): the hidden state copied in is the block's input, freed in the attention's live
    set as a single device frees its own, so the peak is the masks and the attention less one row of n_embd, or the
    feed-forward of the output rows. llama-server b11312 over an rpc-server (8 llama blocks, n_embd 1024, n_ff
    4096, -ngl 2 and the same block alone beside the output layer on a second device): 48.30, 24.29, 12.28 MiB at
    -ub 2048, 1024, 512 and 4k cells, 24.28 at 16k, 50.01 without flash attention (split_compute with one copy:
    72.06, 36.03, 18.02, 30.02, 54.02)."""
    part = trunk_only(part)
    last = spec.n_layer - 1
    rows_out = reserve_outputs(lay)
    if (
        part.layers != (last,) or rows_out >= lay.n_ubatch or spec.architecture not in _LAST_BLOCK_MEASURED
        or spec.n_expert or any(spec.recurrent_layers) or not spec.kv_layers[last]
    ):  # fmt: skip
        return None
    s = graph_sizes(part.spec, lay)
    mix = graph_sizes(part.spec, replace(lay, n_ubatch=rows_out)).mix_bytes
    ub = lay.n_ubatch
    ids = 2 * k_idxs_bytes(part.spec, lay) + 16 * ub + (4 * rows_out if part.last else 0)
    layer = max(s.attn_bytes - s.embd_bytes, mix) + (s.mask_cells * ub * 2 if f32_fa_mask(lay) else 0)
    out = s.logits_bytes + 2 * 4 * rows_out * spec.n_embd if part.last else 0
    return pad(mask_inputs(s, lay) + ids + max(layer, out), ALIGNMENT["cuda"])


# the architectures whose last block alone on a device was measured so (llama-server b11312 over rpc-servers, -ngl 2,
# -ub 512-2048, flash attention on and off): a lower figure than the full offload's, so only where measured. Not a MoE
# (the device also weighs the CPU layer's expert outputs, copied in: [n_embd, n_expert_used, n_ubatch] f32, 1.5 times
# that, test_attack_round15c), nor a fused QKV (phi3's [3 n_embd, n_ubatch] output, alive beside Q and K: 24 MiB under)
_LAST_BLOCK_MEASURED = frozenset({"llama", "qwen3", "granite", "command-r", "gemma2", "gemma3"})

# the models whose graph gathers the output rows after the layer loop, not inside the last block (their last block runs
# its FFN on the whole ubatch, and the output layer's device receives the whole hidden state): src/models/*.cpp at
# b11312 gather inside the last block only with cparams.embeddings_nextn_masked (qwen35.cpp, qwen35moe.cpp, qwen3next.cpp,
# gemma4.cpp, openai-moe.cpp, nemotron-h.cpp, bailingmoe3.cpp, cohere2moe.cpp, hy-v3.cpp, step35.cpp: false unless an
# MTP draft asks) or after the loop (gemma3n.cpp, deepseek4.cpp, kimi-k3.cpp, hy-v4.cpp, hrm-text.cpp, glm5-next.cpp).
# Not deepseek2.cpp, deepseek32.cpp, glm-dsa.cpp, glm4-moe.cpp or mimo2.cpp: they gather inside the last block unless
# an unmasked embeddings_nextn asks for every row (``!cparams.embeddings_nextn || cparams.embeddings_nextn_masked``): a
# tiny deepseek2's output layer alone on an rpc-server prints 0.03 MiB of compute at -ub 2048, where the whole batch's
# logits had been planned (79.67). Measured with llama-server over rpc-servers: a qwen35 device holding only its last
# block 106.13 MiB (not the 78 the rule gives)
_GATHER_AFTER_LOOP = frozenset(
    {
        "bailingmoe3", "cohere2moe", "deepseek4", "gemma3n", "gemma4", "glm5-next", "gpt-oss", "hrm_text", "hy_v3",
        "hy_v4", "kimi-k3", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
    }
)  # fmt: skip


def gathers_in_last_block(spec: ModelSpec) -> bool:
    """The model's last block selects the output rows before its feed-forward (not one of _GATHER_AFTER_LOOP)."""
    return spec.architecture not in _GATHER_AFTER_LOOP


# attention whose wq makes Q and its output gate together (src/models/qwen3next.cpp, qwen35.cpp, qwen35moe.cpp)
_GATED_Q_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})


def _mamba2_boundary_inputs(spec: ModelSpec, layers: tuple[int, ...], ub: int) -> int:
    """The extra split inputs of a device whose layers meet another device's at two Mamba-2 layers: the later
    layer's recurrent-state ops (get_rows of its conv state, src/models/graph-context-mamba.cpp build_rs) come in
    graph order before the earlier layer's z gate is made contiguous, so ggml_backend_sched_split_graph puts
    that weightless ggml_cont on the later device: it copies in the earlier layer's in-projection
    [2 d_inner + 2 n_group d_state + n_head, n_ubatch] and the earlier device copies the z back [d_inner,
    n_ubatch] (GGML_SCHED_DEBUG=2, llama-fit-params b11312, Granite-4.0-H-Tiny's shape: 47 and 19 MiB under
    before at such a boundary, none at a boundary beside an attention layer)."""
    ssm = spec.ssm
    if ssm is None or ssm.kind != "mamba2" or not layers:
        return 0
    rec = spec.recurrent_layers
    lo, hi = min(layers), max(layers)
    out = 0
    if lo > 0 and rec[lo - 1] and rec[lo]:
        out += 4 * ub * (2 * ssm.d_inner + 2 * ssm.n_group * ssm.d_state + ssm.n_head)
    if hi + 1 < spec.n_layer and rec[hi] and rec[hi + 1]:
        out += 4 * ub * ssm.d_inner
    return out


def split_host_compute(spec: ModelSpec, lay: ContextLayout, *, copies: int) -> int:
    """The host's compute buffer (CUDA_Host, or the CPU's beside RPC devices) of a split over several devices.

    ggml_backend_sched_split_graph (pass 6): with pipeline parallelism every graph input on the host is kept in
    GGML_SCHED_MAX_COPIES copies: the masks, the V row indices, the ids, and inp_embd ([n_embd, n_ubatch] f32,
    "inputs not consumed by any node (e.g. the embeddings input of a text-only batch)"); beside them the token
    embeddings' get_rows. Without flash attention the row indices, not a Q-sized tensor (Gemma 3 12B's shape 32
    MiB under, DeepSeek-V2-Lite's 72 over before: benchmarks/bench_split.py)."""
    embd = 4 * lay.n_ubatch * spec.n_embd
    inputs = mask_bytes(spec, lay) + embd + v_idxs_bytes(spec, lay)
    return pad(copies * inputs + embd + ids_bytes(lay), ALIGNMENT["cuda"])
