"""The tensors a compute graph is made of, in bytes, for one model and context: what every compute buffer of
the memory model is built from (:class:`GraphSizes`: the residual stream, Q, the logits, the masks, each
layer's live set), and the graph inputs the host holds (the KQ masks, the ids, the V cache's row indices).

The buffers themselves (one device, the host, the CPU alone) are kvadvise.planner.compute's; a device of a split
over several is kvadvise.planner.split's. Both read these sizes, so they live below both.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvadvise.model.ggml import ALIGNMENT, GGMLType, is_quantized, pad, row_bytes
from kvadvise.model.spec import ModelSpec, SSMDims
from kvadvise.planner import builds
from kvadvise.planner.galloc import Graph, GraphBuilder, dense_layout, flat, reserve_sizes
from kvadvise.planner.layout import ContextLayout, layer_shapes

MIB = 1 << 20
# build_ffn(LLM_FFN_SWIGLU) with no gate tensor: ffn_up holds gate and up (llm_build_phi3, _chatglm, _glm4)
FUSED_UP_ARCHS = frozenset({"phi3", "chatglm", "glm4"})


@dataclass(frozen=True, slots=True)
class GraphSizes:
    """The tensors the compute-buffer phases are made of, in bytes (f32 activations of n_ubatch tokens)."""

    embd_bytes: int  # [n_embd, n_ubatch]: the residual stream and each normed copy of it
    q_bytes: int  # [n_head * n_embd_head_k, n_ubatch]: Q, and the attention's output before wo
    logits_bytes: int  # [n_vocab, rows]: the reserved logits
    mask_cells: int  # KQ mask columns of every cache kind (full and SWA), one per token of the batch
    scores_bytes: int  # without flash attention: [n_kv, n_ubatch, n_head] f32 (softmax works in place)
    attn_bytes: int  # the attention's live set (0 without attention layers), no masks
    mix_bytes: int  # the feed-forward's or recurrent mixer's live set, no masks
    layer_bytes: int  # the largest live set of a layer's own tensors (attention, feed-forward or mixer), no masks
    ple_bytes: int  # Gemma 3n/4's per-layer inputs of the batch: [n_embd_per_layer, n_layer, n_ubatch] f32 (0: none)
    # What Gemma 3n/4 add to a layer's peak, on a device and on the CPU (0 for other models), measured with
    # llama.cpp's allocation pass (b11312) on real-size shapes of tests/tinymodels.py's recipes:
    # - the per-layer inputs (models/gemma4.cpp build_inp_per_layer, project_per_layer_inputs: the rows of
    #   per_layer_token_embd and the projection of the hidden state, added, then permuted into a copy every
    #   layer reads a slice of): 0.65 to 1.8 times ``ple`` on a device, 0.74 to 2.66 on the CPU over 24 Gemma 4
    #   shapes (n_embd_per_layer 128-512, 23 and 35 layers; the permuted copy alive through every layer, and
    #   the hole its source leaves in ggml-alloc's best fit); planned at 1.5 times;
    # - Gemma 3n's residual streams (models/gemma3n.cpp: the layer's input and its altup predictions are
    #   [n_embd, n_ubatch, n_altup] each): 2 to 4 rows of n_embd over three shapes; planned at n_altup / 2.
    # Both hold Gemma 4 E2B/E4B's and Gemma 3n E2B/E4B's shapes within 16 MiB or 3 %.
    layer_inputs_bytes: int
    # builds before #23764 with flash attention: the masks alive through the sliding-window layers that come
    # before the first full-attention layer (gpt-oss's layer 0, Gemma 3's 0-4): the SWA mask, cast, and the
    # full-attention mask's f32 input, cast to f16 only at the first layer that reads it (0: no such layers)
    lead_swa_masks_bytes: int = 0
    # a MoE model's last block, where the masks are dead after its attention: its routed experts' live set with the
    # masks' hole below it, masks included (_last_moe_block; 0: none, or the hole cannot hold an expert tensor)
    last_block_bytes: int = 0


def reserve_tokens(lay: ContextLayout) -> int:
    """The worst-case batch llama_context::graph_reserve builds: n_ubatch tokens rounded up to a multiple of the
    sequences ("making n_tokens a multiple of n_seqs", 0c1e570 and a5bb8ba4); the e1e8e09-era reserve (builds
    before builds.GRAPH_OPTIMIZE here) held one sequence. LLamaSharp's SeqMax 40 makes 512 tokens 520."""
    n_seqs = 1 if builds.older_than(lay.llama_build, builds.GRAPH_OPTIMIZE) else lay.n_seq_max
    return -(-lay.n_ubatch // n_seqs) * n_seqs


def reserve_outputs(lay: ContextLayout) -> int:
    """The logits rows the reserve graph holds: min(n_ubatch, n_outputs_max) (sched_reserve's n_outputs_pp,
    0c1e570); builds from b7847 up to b11312 raise them to the rounded batch when it was rounded (graph_reserve:
    "n_outputs = std::max(n_outputs, n_tokens)", a5bb8ba4; kvadvise.planner.builds.RESERVE_ROUNDS_OUTPUTS)."""
    n_outputs = min(lay.n_ubatch, lay.n_outputs_max)
    b = lay.llama_build
    if b is not None and builds.RESERVE_ROUNDS_OUTPUTS <= b < builds.REFERENCE:
        n_tokens = reserve_tokens(lay)
        if n_tokens != lay.n_ubatch:
            n_outputs = max(n_outputs, n_tokens)
    return n_outputs


def graph_sizes(spec: ModelSpec, lay: ContextLayout) -> GraphSizes:
    """The :class:`GraphSizes` of ``spec``'s graph at ``lay``: each a closed form of llama.cpp's tensors (src/llama-graph.cpp,
    src/models/*.cpp, 0c1e570), the live sets measured with its allocation pass where ggml-alloc's reuse decides."""
    ub, f32 = lay.n_ubatch, 4
    embd = f32 * ub * spec.n_embd
    n_head = max(spec.n_head, default=0)
    q = f32 * ub * n_head * spec.n_embd_head_k
    shapes = layer_shapes(spec)  # remembered per model (compare plans many cards)
    full, swa = shapes.has_full, shapes.has_swa_layer
    cells = (lay.n_ctx_seq if full else 0) + (lay.n_ctx_swa if swa else 0)
    n_kv = max(lay.n_ctx_seq if full else 0, lay.n_ctx_swa if swa else 0)
    scores = 0 if lay.flash_attn else f32 * ub * n_kv * n_head
    attn = legacy_mla = 0
    if full or swa:
        # the attention: the residual, its norm and Q/K/V (3 rows of n_embd), Q and the output before wo;
        # without flash attention the scores and a third Q-sized tensor (KQV before its permute)
        attn = 3 * embd + (2 * q if lay.flash_attn else 3 * q + scores)
        if not lay.flash_attn and not lay.v_trans and not spec.is_mla:
            # -fa auto resolved off after the cache was made with V not transposed: build_attn_mha makes
            # "v = ggml_cont(ggml_transpose(v))" ("note: avoid this branch", src/llama-graph.cpp, 0c1e570) beside
            # the scores, [n_kv, n_embd_head_v, n_head_kv] of the V cache's type
            attn += row_bytes(lay.type_v, n_kv) * spec.n_embd_v_gqa_max()
        if not lay.flash_attn and spec.is_mla:
            # build_attn_mha (src/llama-graph.cpp, 0c1e570): V is a view of the K cache, not transposed, so
            # without flash attention it is copied transposed (ggml_cont, "v_cont"): [n_kv, kv_lora_rank] per
            # stream in the cache's type. Measured on DeepSeek-V2-Lite's shape (llama-fit-params b11312): the copy
            # lands in a hole of about half a Q (the rule's 3 Q are 11.7 MiB over at n_ubatch 512, 47 at 2048),
            # and grows the peak by the rest (20 MiB under at 32k cells and n_ubatch 512 before, 2.7 over now)
            v_copy = lay.n_ctx_seq * lay.n_stream * (4 if lay.type_k == GGMLType.F32 else 2) * spec.n_embd_head_v
            attn += max(0, v_copy - q // 2)
        elif not lay.flash_attn and spec.architecture == "deepseek2":
            # a deepseek2 GGUF without the MLA keys (src/models/deepseek2.cpp, !is_mla): wkv_b's output
            # [n_head * (qk_nope + v_head), n_ubatch], the V it is copied into and the roped Q leave their places
            # below the scores (measured on DeepSeek-V2-Lite's shape: 14.3 MiB at n_ubatch 512, 8 % under before;
            # planned at a Q and n_head * (n_embd_head_k + n_embd_head_v) rows, 1.7 MiB over)
            legacy_mla = q + f32 * ub * n_head * (spec.n_embd_head_k + spec.n_embd_head_v)
            attn += legacy_mla
        if not lay.flash_attn and spec.n_ff_shexp >= (spec.n_ff_exp or spec.n_ff) * spec.n_expert_used > 0:
            # a shared expert at least as wide as the routed experts' total (qwen2moe, llama4): the scores land
            # above the hole of one of its rows the previous layer leaves (measured, llama-fit-params b11312:
            # Qwen2-57B-A14B's shape 37.3 MiB under at n_ubatch 512 before, Qwen1.5-MoE-A2.7B's 12.3)
            attn += f32 * ub * spec.n_ff_shexp + embd // 2
        if spec.n_ff_shexp and not spec.is_mla and spec.architecture != "deepseek2":
            # the scores (or with flash attention Q's normed copy) land on top of the previous block's output: the
            # routed experts' output, where the shared expert's sum and the residual's add run in place
            # (_moe_out_top), above the inputs the device copies. Measured (llama-fit-params b11312, one RPC device,
            # 4k cells, -ub 2048): glm4moe of n_embd 2048, 32 heads, 8 of 16 experts of 1408 printed 1248.00 MiB
            # without flash attention (1200 planned before, 1248.47 now); qwen2moe of n_embd 2048 with 8 used
            # experts 752.34 (640 before, 752.47 now); glm4moe of n_embd 4096, 96 heads, 4 of 16 experts of 256
            # with flash attention 360.42 (320.31 before, 360.45 now). Without a shared expert the normed
            # input is freed after the gate's and up's matmuls and the output takes its place: the rule does not
            # apply (Qwen3-30B-A3B's, gpt-oss-20b's and Mixtral-8x7B's shapes: 1-3 % over as they are)
            top, hole = _moe_out_top(spec, ub, embd)
            # the next block's Q goes in the hole the down projection's output leaves below it, and Q's normed
            # copy (Q/K norms: alive beside Q) too where both fit; what does not fit stacks on the output
            stacked = 0 if 2 * q <= hole else q if q <= hole else 2 * q
            attn = max(attn, top + stacked + _small_inputs(spec, lay) + scores)
    mla_out = 0
    if spec.is_mla and lay.flash_attn and (full or swa):
        # src/models/deepseek2.cpp (b11312), the absorbed MLA attention: Q before its split ([qk_nope + qk_rope]
        # per head), the roped q_pe, Q_nope absorbed through wk_b ([kv_lora_rank] per head) and their concat
        # ([kv_lora_rank + qk_rope]) are alive together, then the flash attention's [kv_lora_rank] output beside it;
        # ggml-alloc's best fit leaves them at a peak of qk_nope + 3 qk_rope + 2 kv_lora_rank + 128 f32 a head and
        # token (llama-fit-params b11312 over an rpc-server, 16-128 heads, qk_nope 128-192, qk_rope 32-64, kv_lora
        # 256-512, q_lora 0-1536, n_embd 1024-7168: within 33 a head above on those; GLM-4.7-Flash's shape was
        # 6.4 % under with 2 Q). The attention's output before wo, [v_head, n_head] a token, leaves a hole the next
        # feed-forward's rows do not fit in where it is wider than n_embd (GLM-4.7-Flash: 24 MiB at -ub 2048).
        # These sums are what a device other than an RPC one reads beside the replay below (a GPU's graph_optimize
        # may reorder the nodes); on an RPC device the blocks are replayed, alone or as a device of a split
        # (mla_split_bytes: the sums were 11-21 % over on Kimi-K2's and DeepSeek-V3's shapes, and against the
        # replay up to 7 % under on 17 of 500 random shapes, where the previous block's residual lands higher)
        kv_lora = spec.n_embd_head_v
        rope = max(0, spec.n_embd_head_k - kv_lora)
        nope = max(0, spec.n_embd_head_k_mla - rope)
        attn = max(attn, 3 * embd + f32 * ub * n_head * (nope + 3 * rope + 2 * kv_lora + 128))
        mla_out = max(0, f32 * ub * n_head * spec.n_embd_head_v_mla - embd)
    phases = [0]
    if spec.n_ff:  # a dense feed-forward: gate, up and their product (ggml_swiglu_split is not in place)
        ff = 3
        if spec.architecture in FUSED_UP_ARCHS and builds.older_than(lay.llama_build, builds.FUSED_GLU):
            # up = [2 n_ff] holding gate and up, and the ggml_cont of each half before ggml_swiglu
            # (kvadvise.planner.builds.FUSED_GLU); measured with the allocation pass of e1e8e09 (Ollama 0.6.8's
            # llama.cpp) on GLM-4-32B's and GLM-4-9B's shapes: within 8 MiB over
            ff = 4
        rows = f32 * ub * spec.n_ff
        if spec.n_expert and not spec.is_mla and spec.architecture != "deepseek2" and ff == 3:
            # a MoE model's dense lead block (glm4moe): its gate, up and product stack above the hole the
            # attention's Q leaves, as the routed experts' do (_moe_phase), the gate in that hole where it fits.
            # GLM-4.5-Air's widths with 64 heads, n_ff 9216 and 4 of 16 experts of 1024: llama-fit-params b11312
            # prints the masks and 2E + Q + 3 rows (118.01 MiB at -ub 512 and 32k; 120.08 planned before, the routed
            # phase's over-count hiding 3E + 3 rows' 8 MiB under)
            stacked = q + 2 * rows if rows <= q else max(embd, q) + 3 * rows
            phases.append(2 * embd + stacked + _small_inputs(spec, lay))
        else:
            phases.append(3 * embd + ff * rows + mla_out)
    if spec.n_expert:
        # without flash attention the device's copy of the V cache's row indices ([n_embd_v_gqa, n_ubatch] i64)
        # lies below the experts' tensors (measured: qwen2moe of n_embd 1024, 8 of 16 experts of 2048, 4k cells,
        # -ub 2048: 448.34 MiB printed, 440.31 planned before, 456.34 now: _moe_phase's row of max(E, Q) is free)
        phases.append(_moe_phase(spec, ub, embd, q) + (0 if lay.flash_attn else _small_inputs(spec, lay)))
    if spec.ssm is not None:
        phases.append(_mixer_phase(spec, spec.ssm, ub, embd, lay.n_seq_max))
    # parallel blocks (command-r, cohere2) keep the attention's output alive through the feed-forward
    mix = max(phases) + (embd if spec.parallel_block else 0)
    layer = max(attn, mix)
    mla = _mla_graph(spec, lay) if spec.is_mla and (full or swa) else None
    # a device of a split (kvadvise.planner.split's DeviceLayers.spec: the attention layers it holds, no others),
    # where pipeline parallelism is off (its copies are split.split_compute's): its own blocks replayed
    held = tuple(il for il in range(spec.n_layer) if spec.kv_layers[il])
    part = None
    if mla is not None and 0 < len(held) < spec.n_layer:
        part = _mla_device_graph(spec, lay, held, output=held[-1] == spec.n_layer - 1, copies=1)
    if part is not None:
        mask = _mla_mask_bytes(part)
        ways = _mla_boundaries(spec, part, held[0])
        layer = max(_mla_buffer_bytes(replace(v, n_vocab=0)) for v in ways) - mask + _PRINT_HALF_STEP
    elif mla is not None:
        # the absorbed MLA blocks' peak is where ggml-alloc's best fit lands the previous block's residual
        # (_mla_layers_bytes): replayed, exact on an RPC device; elsewhere never below the phases above (a GPU's
        # graph_optimize may reorder the nodes, as compute._exact_device_compute keeps for llama's replay)
        replayed = _mla_layers_bytes(mla) + _PRINT_HALF_STEP
        layer = replayed if lay.device == "rpc" else max(layer, replayed)
    logits = f32 * reserve_outputs(lay) * spec.n_vocab
    if part is not None and part.n_vocab:
        out = max(_mla_output_bytes(v) for v in _mla_boundaries(spec, part, held[0])) + _PRINT_HALF_STEP
        logits = max(logits, out - 2 * embd)
    elif part is None and mla is not None and lay.device == "rpc":
        # the output phase replayed after the blocks (_mla_output_bytes): the logits and what lies under them, less
        # the two rows of n_embd the device's figure adds (kvadvise.planner.compute: logits + 2 rows against masks +
        # layer). Not below the logits and those rows, as before, where ggml-alloc put them in the mask's hole
        out = _mla_output_bytes(replace(mla, n_vocab=spec.n_vocab, n_kv=lay.n_ctx_seq)) + _PRINT_HALF_STEP
        logits = max(logits, out - 2 * embd)
    elif spec.is_mla:
        # off an RPC device (or where the blocks are not replayed): measured (llama-fit-params, b11312,
        # DeepSeek-V2-Lite's shape) the logits land above two Q-sized tensors the last MLA layer leaves at the top of
        # the buffer, 36 MiB at n_ubatch 512; an upper bound on the other shapes (Kimi-K2's with its 163,840-token
        # vocabulary: 362.00 MiB printed at 16k cells and -ub 512, 492 so), kept where a GPU may reorder the graph
        logits += 2 * q
    elif legacy_mla:
        # measured (the same shape, the published vocabulary, 4k cells): the last layer leaves two such holes
        # under the logits (236.26 MiB reserved at n_ubatch 512, 208 planned before)
        logits += 2 * legacy_mla
    elif spec.n_expert:
        # measured (llama-fit-params b11312, an RPC device, FA, 4k cells, the published vocabularies): a MoE
        # model's logits land one more row of n_embd up (the last layer's routed and shared outputs' holes):
        # qwen3next (Qwen3-Next-80B, Qwen3.5-35B-A3B), GLM-4.5-Air and gpt-oss-20b were 4-32 MiB under, Qwen3-30B
        # one row over (benchmarks/bench_moe_shared.py); and 0.01-0.05 MiB of per-token tensors beside them
        logits += embd + f32 * ub * 8
        if spec.n_ff_shexp >= (spec.n_ff_exp or spec.n_ff) * spec.n_expert_used:
            # a shared expert as wide as the routed ones' total: the logits land above two of its rows (Qwen2-57B-A14B's
            # shape with its vocabulary: 60 MiB under with flash attention, 225 without at n_ubatch 2048; an upper
            # bound: Qwen1.5-MoE-A2.7B's needs none with flash attention, 22 MiB over)
            logits += 2 * f32 * ub * spec.n_ff_shexp
    # measured on b11312's graph only: before #23764 (builds.F16_MASK_FA) the f32 mask's copies leave other holes
    # (Qwen3.5-27B's shape at -ngl 26, -ub 2048, 131k: 2319.81 MiB allocated, under the 2468 this would plan)
    new_mask = not builds.older_than(lay.llama_build, builds.F16_MASK_FA)
    if new_mask and spec.has_recurrent and spec.n_ff and not spec.n_expert and (full or swa):
        logits += _hybrid_output_rows(spec, lay, embd, cells)
    elif new_mask and spec.has_recurrent and spec.n_expert and not spec.is_mla and (full or swa):
        logits += _hybrid_moe_output_rows(spec, lay, embd, cells)
    ple = f32 * ub * spec.n_embd_per_layer * spec.n_layer
    layer_inputs = ple * 3 // 2 + embd * spec.n_altup // 2 if layer else 0
    lead = 0
    attn_layers = [il for il, kv in enumerate(spec.kv_layers) if kv]
    if full and swa and lay.flash_attn and attn_layers and spec.swa_layers[attn_layers[0]]:
        lead = ub * (2 * lay.n_ctx_swa + 4 * lay.n_ctx_seq)
    last = _last_moe_block(spec, lay, embd, cells) if spec.n_expert and not spec.is_mla else 0
    return GraphSizes(embd, q, logits, cells, scores, attn, mix, layer, ple, layer_inputs, lead, last)


def _hybrid_output_rows(spec: ModelSpec, lay: ContextLayout, embd: int, cells: int) -> int:
    """What a hybrid's (recurrent and attention layers, a dense feed-forward) output phase holds under the logits
    beyond the two rows of n_embd the device's figure adds. ggml-alloc (ggml/src/ggml-alloc.c, b11312) frees the KQ
    masks' copy after the last attention and gives each later tensor the smallest free block it fits (the end of the
    buffer only where none does); the logits, wider than any hole, go above the highest tensor alive. With the last
    block attention (src/models/qwen35.cpp), in the masks' hole of M bytes, for rows of n_ff of F bytes:
    - M under a row of n_embd: the rows land above the hole (M + 2 rows);
    - F <= M < 2F: the gate fills the hole, up and the product go above it, and down's output lands in up's freed
      block (smaller than the hole): M + 3 rows under the logits;
    - 3F <= M < 5F: gate, up and product fill the hole, and the rows after them (down's output, the residual's add,
      the final norm) take the rest of it (smaller than the freed gate and up), as many as fit, up to those three;
      the next goes above: 3F and one row more than fit (Qwen3.5-9B's shape at 98k: 3F + 4 rows, 589.00 MiB; the
      27B's at 131k: 3F + 3 rows, 617.00);
    - else the rows land low in a hole (two rows, as planned).
    With a Mamba-2 block last (src/models/granite-hybrid.cpp) its feed-forward and the rows stack above the mixer's
    hole whatever the cells: 3F + 3 rows. Each is returned less the two rows the device's figure adds. Measured
    (llama-fit-params b11312, one RPC device, the whole batch's logits, tests/test_output_phase_long_context.py):
    Qwen3.5-27B's shape at 131,072 cells, -ub 512 / 1024 / 2048: 617 / 1234 / 2468 MiB (505 / 1010 / 2020 planned
    before, exact now), 513.02 at 8,192 cells (505 before); its n_ff varied (8,192 at 65k: 553.00; 30,720 at 65k:
    579.02, at 262k: 695.00, 705 planned; the 9B's 12,288 at 98k: 589.00); Granite-4.0-H-Tiny's 229.00 / 458.00 /
    916.00 (202 / 404 / 808 before). LFM2's short-conv last block stays over (184.03 allocated at 131k, 188 planned).
    The CPU running every layer (compute.compute_bytes; its inputs in the same buffer, no copies) places them otherwise:
    with the last block attention the rows land above the masks' hole wherever it holds a row of n_ff, three rows
    where not (llama-fit-params -ngl 0: Qwen3.5-27B's shape 633.02 MiB at 131k, 523.02 at 8k, 515.00 at 32k; n_ff
    8,192 at 262k 761.02): planned as the bound M + 3 rows, over where the rows land low (the 9B's shape: 509.00 at
    65k-262k, 64-256 MiB over; LFM2's short-conv last block as on the device: 136.00 at 32k, as planned).
    """
    ub = lay.n_ubatch
    ff = 4 * ub * spec.n_ff
    masks = mask_copy_bytes(cells, lay)
    mamba_last = spec.recurrent_layers[spec.n_layer - 1] and spec.ssm is not None and spec.ssm.kind == "mamba2"
    if mamba_last:
        return 3 * ff + embd
    if lay.device == "cpu" and spec.kv_layers[spec.n_layer - 1]:
        return masks + embd
    if 3 * ff <= masks < 5 * ff:
        return 3 * ff + embd * min(3, (masks - 3 * ff) // embd) - embd
    if masks < embd:
        return masks
    return masks + embd if ff <= masks < 2 * ff else 0


def _hybrid_moe_output_rows(spec: ModelSpec, lay: ContextLayout, embd: int, cells: int) -> int:
    """A MoE hybrid's output phase beyond what graph_sizes plans for a MoE model's (the logits, three rows of n_embd and
    the per-token tensors): ggml-alloc's best fit (ggml/src/ggml-alloc.c, b11312) as in :func:`_hybrid_output_rows`.
    Measured (llama-fit-params b11312, one RPC device, flash attention, the whole batch's logits):
    - the last block a Mamba-2 mixer and routed experts (src/models/granite-hybrid.cpp; granite-4.0-h-tiny's widths,
      64 experts, 6 used, of 512): the experts' gate, up and product and their output stack above the mixer's hole,
      the rows above them, whatever the cells: 3F + Eu + 3 rows (241.00 MiB at -ub 512, 964.00 at 2048, 8k-131k;
      205.02 and 820.06 planned before);
    - the last block routed experts alone after the last attention (src/models/nemotron-h.cpp's 'E' blocks;
      Nemotron-3-Nano's widths, 14 blocks): the residual lands above the masks' hole and the logits above it: M + a
      row (389.26 MiB at 131k, -ub 512, 1557.04 at -ub 2048; 271.77 and 1087.06 planned before);
    - the last block attention or short conv (qwen35moe, lfm2moe): as planned (at most 8 MiB under at -np 4)."""
    last = spec.n_layer - 1
    if spec.recurrent_layers[last] and spec.ssm is not None and spec.ssm.kind == "mamba2":
        ff, eu = expert_activation_bytes(spec, lay.n_ubatch)
        return 3 * ff + eu
    if not spec.recurrent_layers[last] and not spec.kv_layers[last]:
        masks = mask_copy_bytes(cells, lay)
        return max(0, masks - 2 * embd)
    return 0


def _last_moe_block(spec: ModelSpec, lay: ContextLayout, embd: int, cells: int) -> int:
    """The last block's routed experts once the KQ masks are freed (ggml-alloc frees a tensor after its last
    consumer, the last attention; ggml/src/ggml-alloc.c b11312): the masks leave a hole at the foot of the buffer,
    below the residual. Where one expert tensor (F = [n_ff_exp, n_expert_used, n_ubatch] f32) fits it and two do
    not, best fit (ggml_dyn_tallocr_alloc) puts the gate there and the up and SwiGLU product stack above the
    residual, so the down projection's output (Eu), wider than the hole, does not find the gate's and up's place
    together (build_moe_ffn, src/llama-graph.cpp) and stacks too: the masks' hole, the normed input and the
    residual, 2F and Eu. An upper bound: the normed input may take the hole first, and the gate then stacks. Measured
    with llama-fit-params b11312 (one RPC device, flash attention, q8_0 cache, 64k cells, -ub 2048): glm4moe of
    n_embd 4096, 96 heads, 8 of 16 experts of 2048 printed 832.12 MiB, 800.31 planned before (the masks and
    the other blocks' routed phase)."""
    ub = lay.n_ubatch
    masks = mask_copy_bytes(cells, lay)
    ff, eu = expert_activation_bytes(spec, ub)
    router = 4 * ub * (2 * spec.n_expert + 8)
    hole = masks - router  # the router's tensors, placed first, take the foot of it
    if not ff or not ff <= hole < 2 * ff or eu <= hole:
        return 0  # no gate there; or the up too, and the down projection in their place; or in the gate's
    return masks + _small_inputs(spec, lay) + 2 * embd + router + 2 * ff + eu


@dataclass(frozen=True, slots=True)
class _MLAGraph:
    """What the tensors of an absorbed-MLA model's blocks (src/models/deepseek2.cpp, is_mla, b11312) depend on."""

    dense: tuple[bool, ...]  # the blocks replayed, True where the feed-forward is dense (the leading dense blocks)
    n_embd: int
    n_head: int
    qk_nope: int
    qk_rope: int
    kv_lora: int
    v_head: int  # n_embd_head_v_mla: the width wv_b decompresses each head's output to
    q_lora: int  # 0: one wq (the lite models)
    n_ff: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    # cells of a stream; with flash attention one padding's worth (256): only the KQ mask is that wide, and it sits
    # below every block's tensors from the first to the last (the rest lands alike: 200 random shapes, 4k-128k cells)
    n_kv: int
    n_stream: int
    n_tokens: int
    n_outputs: int
    flash_attn: bool
    # without flash attention, a row of V copied transposed (v_cont: n_kv cells of the K cache's type; a quantized
    # cache needs flash attention, llama_init_from_model)
    v_row_bytes: int
    # the output layer (result_norm, then the logits of the n_outputs rows) after the blocks, 0: the blocks alone.
    # The KQ mask's hole, freed after the last attention, is where the logits may land, so with it the mask is as
    # wide as the cache (n_kv), not the padding above
    n_vocab: int = 0
    # a device of a split (kvadvise.planner.split): the replay's last block is not the model's last (no output rows
    # gathered); the hidden state comes from the previous device (its last l_out and the next block's weightless
    # rms_norm, which ggml_backend_sched leaves there); it ends with that rms_norm for the next device; ``copies``:
    # pipeline parallelism's copies of each split input (flagged input and output: allocated first, never freed;
    # ggml_backend_sched_split_graph, ggml-backend.cpp), 0 where the inputs are freed after their last use
    last_block: bool = True
    from_device: bool = False
    # the previous block on the CPU (-ngl N): ggml_backend_sched's "expand gpu up" gives the device every weightless
    # op back to the CPU block's last matmul, so its feed-forward's outputs and ffn_inp come in: 3 rows of n_embd
    # after a MoE block (ffn_moe_out, ffn_shexp, ffn_inp: GGML_SCHED_DEBUG=2, b11312), 2 after a dense one; the
    # device adds them into l_out and makes the rms_norm (0: the previous block on a device, which made it)
    host_rows: int = 0
    to_device: bool = False
    copies: int = 0
    # per block (as ``dense``), the MoE blocks whose routed experts are in host memory (--n-cpu-moe) on a device that
    # does not op-offload (ggml-rpc): their gate, up, SwiGLU and down projection run in a CPU split, whose output the
    # device copies in at its next split (:func:`mla_host_experts_growth`)
    host_experts: tuple[bool, ...] = ()


# half the last digit llama.cpp prints a buffer with ("%8.2f MiB", rounded to nearest), added to an exact replay so
# the plan is never below the figure printed (DeepSeek-V2-Lite's 27 blocks without flash attention at 32k cells:
# 1,231,310,848 B replayed, 1174.27 MiB printed; tests/test_moe_shared.py takes the print as a floor)
_PRINT_HALF_STEP = -(-MIB // 200)
# blocks replayed past the leading dense ones: ggml-alloc's layout repeats from the third MoE block on (the
# simulation below against 8 to 30 blocks: 1,200 random shapes, 1 and 3 dense blocks, flash attention on/off)
_MLA_STEADY_BLOCKS = 6
# the replay's two buffers' alignments: the device's (an rpc-server's CPU buffer type) and the host's
_MLA_BUFFERS = (ALIGNMENT["rpc"], ALIGNMENT["cpu"])


def _mla_graph(spec: ModelSpec, lay: ContextLayout) -> _MLAGraph | None:
    """``spec``'s absorbed MLA blocks at ``lay``, or None where the file does not say q_lora_rank (no wq/wq_b among
    its matmul weights) or which blocks are dense, or for builds with the f32 flash-attention mask (before #23764)."""
    if builds.older_than(lay.llama_build, builds.F16_MASK_FA) or not spec.n_embd_head_k_mla:
        return None
    n_head, n_embd = max(spec.n_head), spec.n_embd
    # q_lora_rank: wq_a [n_embd, q_lora] and wq_b [q_lora, n_head * (qk_nope + qk_rope)] (a low rank, below
    # n_embd), else the lite models' wq [n_embd, n_head * (qk_nope + qk_rope)] (deepseek2.cpp load_arch_tensors)
    shapes = {(w.ne0, w.ne1) for w in spec.matmul_weights if w.block == 0 and not w.experts}
    q_width = n_head * spec.n_embd_head_k_mla
    q_lora = [r for r, n in shapes if n == q_width and r < n_embd and (n_embd, r) in shapes]
    if len(q_lora) > 1 or not (q_lora or (n_embd, q_width) in shapes):
        return None
    if spec.n_expert and len(spec.layer_expert_bytes) < spec.n_layer:
        return None
    dense, host = _mla_blocks(spec, lay.flash_attn, range(spec.n_layer))
    first_moe = dense.index(False) if False in dense else 0
    rope = spec.n_embd_head_k - spec.n_embd_head_v
    return _MLAGraph(
        dense=dense[: first_moe + _MLA_STEADY_BLOCKS], host_experts=host[: first_moe + _MLA_STEADY_BLOCKS],
        n_embd=n_embd, n_head=n_head,
        qk_nope=spec.n_embd_head_k_mla - rope, qk_rope=rope, kv_lora=spec.n_embd_head_v,
        v_head=spec.n_embd_head_v_mla, q_lora=q_lora[0] if q_lora else 0, n_ff=spec.n_ff,
        n_expert=spec.n_expert, n_expert_used=spec.n_expert_used, n_ff_exp=spec.n_ff_exp or spec.n_ff,
        n_ff_shexp=spec.n_ff_shexp, n_kv=256 if lay.flash_attn else lay.n_ctx_seq, n_stream=lay.n_stream,
        n_tokens=reserve_tokens(lay), n_outputs=reserve_outputs(lay), flash_attn=lay.flash_attn,
        v_row_bytes=0 if lay.flash_attn else (4 if lay.type_k == GGMLType.F32 else 2) * lay.n_ctx_seq,
    )  # fmt: skip


def _mla_blocks(spec: ModelSpec, flash_attn: bool, layers: Iterable[int]) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Which of ``layers`` are dense, and which run their routed experts from host memory (experts among the block's
    matmul weights, none of their bytes left on the device: offload.cpu_moe_placement), with flash attention too:
    round 26d, llama-fit-params b11312 over one and two rpc-servers, DeepSeek-V2-Lite's shape at n_embd 2048 and
    4096, -ub 512/2048, --n-cpu-moe 1-6: every device of a split as printed (the first to 0.6 MiB), one device to
    0.01 MiB but where only the last block runs its experts there (+63 MiB at -ub 2048 and n_embd 4096: the layers'
    replay without the cache-wide mask), where the blocks had been replayed as dense ones (their n_ff 10944: up to
    111 MiB over on one device, 31 on the first of two).
    ``flash_attn`` is kept for the callers' signature."""
    have = {w.block for w in spec.matmul_weights if w.experts}
    dense, host = [], []
    for il in layers:
        on_device = bool(spec.n_expert) and spec.layer_expert_bytes[il] > 0
        moved = bool(spec.n_expert) and not on_device and il in have
        dense.append(not on_device and not moved)
        host.append(moved)
    return tuple(dense), tuple(host)


@functools.lru_cache(maxsize=256)
def _mla_layers_bytes(g: _MLAGraph) -> int:
    """The absorbed MLA blocks' largest live set (the device's compute buffer through the last block, less its
    copy of the KQ mask), as ggml-alloc's best fit (kvadvise.planner.galloc) places the reserve graph's tensors.

    Which tensors are alive at the peak depends on where the previous block's residual (l_out) landed, so no one
    sum holds for every shape. Measured (llama-fit-params b11312, one RPC device, GGML_SCHED_DEBUG=2), in f32 a
    token, E = n_embd, H heads:
    - the attention, at Qcur: the residual, attn_norm, Q's hole (its H (qk_nope + qk_rope)), Q_nope absorbed
      (H kv_lora), the roped q_pe (H qk_rope, or in a hole of E) and Qcur (H (kv_lora + qk_rope)), stacked above
      what the previous block left under its residual: two rows of E where the routed experts' down projection
      ([E, n_expert_used]) did not fit in gate's and up's hole, so the next residual took it (Kimi-K2, DeepSeek-V2
      and V3: V3's 128 heads 394.01 MiB at -ub 512 with 16k cells, 3 E + H (qk_nope + 3 qk_rope + 2 kv_lora)),
      else that projection's rows and one E more (GLM-4.7-Flash's 40-head variant: 149.27);
    - the first MoE block after the dense ones, at the down projection: ffn_norm, the hole of the attention's
      output ([v_head, H], the ggml_cont of build_attn_mha's wv_b product), ffn_inp, gate, up and their SwiGLU,
      the down projection ([E, n_expert_used]) on top: Kimi-K2's 268.01 MiB at -ub 512 (2 E + H v_head + 3
      n_ff_exp n_expert_used + E n_expert_used: 129024 f32 a token), planned 324.08 (21 %) with a Qcur-sized hole;
    - without flash attention the KQ scores [n_kv, n_tokens, H] beside V's transposed copy and Qcur.
    The replay follows src/models/deepseek2.cpp (is_mla), build_attn / build_attn_mha with wv_b, build_ffn and
    build_moe_ffn (src/llama-graph.cpp) node by node, views included (they keep their sources alive), as
    ggml_backend_sched hands them to ggml-alloc (the inputs copied in first); the router's few per-token tensors
    (probs bias, weight norm) are left out. It gives llama-fit-params' figure to the 0.01 MiB on the 25 printed
    buffers of tests/test_mla_compute.py (16-128 heads, q_lora 0-1536, kv_lora 256/512, n_embd 2048-7168, -ub
    512-2048, flash attention on and off, f16/q8_0 caches; the closed sums were up to 21 % over, 1 % under)."""
    return _mla_buffer_bytes(g) - _mla_mask_bytes(g)


def _mla_mask_bytes(g: _MLAGraph) -> int:
    """The device's copy of the KQ mask in ``g``'s buffer (f16 with flash attention, else f32), as it is allocated."""
    return pad((2 if g.flash_attn else 4) * g.n_kv * g.n_tokens, _MLA_BUFFERS[0])


@functools.lru_cache(maxsize=256)
def _mla_output_bytes(g: _MLAGraph) -> int:
    """The top of the output phase of ``g``'s graph (``g.n_vocab`` set, ``g.n_kv`` the cache's cells): result_norm and
    the logits of the reserved rows, and what the last block left under them, as ggml-alloc's best fit places them.

    Measured (llama-fit-params b11312 over one rpc-server): where the logits land is decided by the holes the last
    block leaves, not by a fixed count of Q-sized tensors under them: Kimi-K2's widths with their 163,840-token
    vocabulary at 16k cells and -ub 512 print 362.00 MiB, 320 of logits above three rows of n_embd (492 planned with
    two Q); DeepSeek-V3's shapes 394.01 (568.50 planned); a small vocabulary's logits fit in the KQ mask's hole.
    The top is read with a probe: a tensor larger than any hole, allocated last, lands at the top of what is alive
    then (ggml_dyn_tallocr_alloc: the last block), result_norm and the logits being graph outputs, never freed."""
    probe = 1 << 50
    return reserve_sizes(_mla_build(g, probe_bytes=probe), _MLA_BUFFERS)[0] - probe


def mla_split_bytes(
    spec: ModelSpec,
    lay: ContextLayout,
    layers: tuple[int, ...],
    *,
    output: bool,
    copies: int,
    host_experts: bool = False,
) -> int | None:
    """The compute buffer of one RPC device of a split that holds the absorbed-MLA blocks ``layers`` (and the output
    layer with ``output``), replayed as for one device (_mla_layers_bytes, _mla_output_bytes) with the split's inputs:
    the token embeddings on the first device, else the previous device's last l_out and the next block's rms_norm
    (ggml_backend_sched leaves that weightless norm on the previous device, which ends with it); ``copies`` > 1:
    pipeline parallelism's copies of each input, allocated first and never freed; 1: ordinary copies, freed after
    their last use (ggml_backend_sched_split_graph, ggml-backend.cpp b11312). None where the replay does not
    apply (not an RPC device, no absorbed-MLA graph, blocks that are not one run, the last block without the
    output layer). Measured (llama-fit-params b11312 over two rpc-servers, -ts 1,1 / 1,2 / 2,1, the five shapes of
    tests/test_mla_compute.py with their vocabularies and n_vocab 8000, 4k-16k cells, -ub 512/2048, flash attention
    on and off): every device as printed, to the 0.01 MiB, with and without pipeline parallelism. ``host_experts``:
    the blocks' routed experts in host memory (:func:`mla_host_experts_growth`)."""
    g = _mla_device_graph(spec, lay, layers, output=output, copies=copies)
    if g is None:
        return None
    if host_experts:
        g = replace(g, host_experts=tuple(not d for d in g.dense))
    return max(_mla_buffer_bytes(v) for v in _mla_boundaries(spec, g, layers[0])) + _PRINT_HALF_STEP


def mla_host_experts_growth(spec: ModelSpec, lay: ContextLayout) -> int | None:
    """How much one RPC device's absorbed-MLA blocks grow when their routed experts sit in host memory (--n-cpu-moe
    past every MoE block: the replay's ``host_experts``; not replayed block by block, so a device that also runs some
    of its own is planned as one that runs none, or as the full offload, whichever is larger), or None where the
    blocks are not replayed (:func:`_mla_graph`).

    ggml_backend_sched_split_graph (ggml-backend.cpp b11312) runs the experts' matmuls in a CPU split and allocates the
    copy of their down projection's output ([n_embd, n_expert_used, n_ubatch] f32) at the start of the device's next
    split; the weighting takes it in place and, once the views' adds have read it, it leaves a hole that the next
    attention's scores (without flash attention) do not fit. llama-fit-params b11312 over one and two loopback
    rpc-servers, -fa off, 4k cells, --n-cpu-moe 6 (3: -ub 1024): DeepSeek-V2-Lite's shape at n_embd 4096 848.02 MiB
    printed at -ub 2048 (the replay 848.03; 792.04 the full offload's), 424 at -ub 1024 (424.02), the second of two
    devices 864 (864.03); DeepSeek-V2-Lite's own 761 / 761 (761.08, no growth)."""
    g = _mla_graph(spec, lay) if spec.is_mla else None
    if g is None:
        return None
    return max(0, _mla_buffer_bytes(replace(g, host_experts=tuple(not d for d in g.dense))) - _mla_buffer_bytes(g))


def _mla_boundaries(spec: ModelSpec, g: _MLAGraph, first: int) -> tuple[_MLAGraph, ...]:
    """``g`` and, where its blocks could follow the CPU's (no pipeline parallelism: a partial -ngl), ``g`` after
    them: which one holds is not known from the device's blocks, so the larger is planned (llama-fit-params b11312
    over two rpc-servers, -ngl 4-6: the CPU's boundary 266.01 MiB printed for Kimi-K2's widths, a device's 252.08)."""
    if not g.from_device or g.copies:
        return (g,)
    # a block whose experts are in host memory is a MoE block too (_mla_blocks: without flash attention; round 25a,
    # DeepSeek-V2-Lite's shape at n_embd 4096, --n-cpu-moe 6 over two rpc-servers: 864 MiB printed on the second,
    # the replay after three rows 864.03, after two 776.03)
    moe = bool(spec.n_expert) and (
        spec.layer_expert_bytes[first - 1] > 0 or _mla_blocks(spec, g.flash_attn, (first - 1,))[1][0]
    )
    return g, replace(g, host_rows=2 + (moe and spec.n_ff_shexp > 0))


def _mla_device_graph(
    spec: ModelSpec, lay: ContextLayout, layers: tuple[int, ...], *, output: bool, copies: int
) -> _MLAGraph | None:
    """:func:`mla_split_bytes`'s graph (None where it does not apply)."""
    g = _mla_graph(spec, lay) if spec.is_mla and lay.device == "rpc" else None
    last_block = bool(layers) and layers[-1] == spec.n_layer - 1
    if g is None or not layers or layers != tuple(range(layers[0], layers[-1] + 1)) or output != last_block:
        return None
    dense, host = _mla_blocks(spec, lay.flash_attn, layers)
    lead = dense.index(False) if False in dense else len(dense)
    return replace(
        g, dense=dense[: lead + _MLA_STEADY_BLOCKS], host_experts=host[: lead + _MLA_STEADY_BLOCKS], n_kv=lay.n_ctx_seq, n_vocab=spec.n_vocab if output else 0,
        last_block=last_block, from_device=layers[0] > 0, to_device=not last_block, copies=copies if copies > 1 else 0,
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def _mla_buffer_bytes(g: _MLAGraph) -> int:
    """The whole buffer ggml-alloc's best fit makes of ``g``'s graph (the mask as wide as the cache)."""
    return reserve_sizes(_mla_build(g), _MLA_BUFFERS)[0]


def _mla_build(g: _MLAGraph, *, probe_bytes: int = 0) -> Graph:
    """The reserve graph of ``g``'s blocks on one device (buffer 0; the CPU's is 1), and the output layer where
    ``g.n_vocab`` is set: the inputs copied in first (ggml_backend_sched_split_graph), then each block. ``probe_bytes``:
    a last node of that size on the logits (:func:`_mla_output_bytes`)."""
    b = GraphBuilder()
    n_tok, n_embd, n_head = g.n_tokens, g.n_embd, g.n_head
    view, weight = b.view, b.weight

    def op(name: str, kind: str, nbytes: int, *srcs: int) -> int:  # f32 rows: bytes, not shapes, decide the layout
        return b.op(name, kind, flat(nbytes), srcs)

    def norm(name: str, t: int, nbytes: int) -> int:  # build_norm: rms_norm, then the weight's mul in place
        return op(name, "MUL", nbytes, op(f"{name} (norm)", "RMS_NORM", nbytes, t), weight(f"{name}.weight"))

    def ffn(name: str, cur: int, ff: int, out: int) -> int:  # build_ffn (LLM_FFN_SILU, LLM_FFN_PAR)
        gate = op(f"gate-{name}", "MUL_MAT", ff, weight("gate"), cur)
        up = op(f"up-{name}", "MUL_MAT", ff, weight("up"), cur)
        return op(f"down-{name}", "MUL_MAT", out, weight("down"), op(f"swiglu-{name}", "GLU", ff, gate, up))

    f32 = 4 * n_tok
    # the split's inputs in the order its nodes first read them (ggml_backend_sched_split_graph, pass 5)
    copied_norm = g.from_device and not g.host_rows
    host = [f"host_out{i}" for i in range(g.host_rows)] if g.from_device else []
    hidden = ["norm"] if copied_norm else host or ["embd"]
    inputs = {name: f32 * n_embd for name in hidden}
    inputs |= {"pos": 4 * n_tok, "k_idxs": 8 * n_tok, "mask": (2 if g.flash_attn else 4) * g.n_kv * n_tok}
    # the output ids are copied into the split that first reads them (ggml_backend_sched_split_graph, b11312): the
    # last block's; where a block before it runs its routed experts in a CPU split, that is the device's split after
    # the last such one, whose experts' output is copied in first (round 26d, a traced ggml-alloc: DeepSeek-V2-Lite's
    # shape at n_embd 4096, --n-cpu-moe 5, the second of two rpc-servers: the 8 KiB of ids take the foot of the
    # 32 MiB hole the next add fitted, which then stacks: 470.01 MiB printed, 455.05 replayed with them up front)
    host_before = [il for il, h in enumerate(g.host_experts[: len(g.dense) - 1]) if h] if g.last_block else []
    late_ids = host_before[-1] if host_before and not g.copies else None
    # a first block that is the last reads the output ids (its attention's rows) before the residual
    if g.last_block and len(g.dense) == 1:
        inputs["out_ids"] = 4 * g.n_outputs
    if copied_norm:
        inputs["l_in"] = f32 * n_embd
    if g.last_block and late_ids is None:
        inputs["out_ids"] = 4 * g.n_outputs
    copy = {}
    for name, nbytes in inputs.items():
        if g.copies:  # pipeline parallelism: the copies are leafs, allocated first and kept (graph outputs)
            copies = [b.input(f"{name}#{c}", nbytes, output=True) for c in range(g.copies)]
            copy[name] = copies[0]
            continue
        # each host input, then its copy on the device (an input there); an f32 row of the hidden state is laid out as
        # the ops' are (an op may take its copy in place: ggml_are_same_layout)
        layout = dense_layout(flat(nbytes)) if name in ("norm", "l_in", "embd", *host) else None
        src = b.input(name, nbytes, buffer=1, layout=layout)
        b.dep(src)
        copy[name] = b.input_copy(src, buffer=0, name=f"{name}#dev")
    x = copy["l_in"] if copied_norm else copy[host[0]] if host else copy["embd"]
    for name in host[1:]:  # the CPU block's ffn_out (a MoE block's) and l_out, added here
        x = op(f"{name} (add)", "ADD", f32 * n_embd, x, copy[name])
    q_row, absorbed, q_cat = n_head * (g.qk_nope + g.qk_rope), n_head * g.kv_lora, n_head * (g.kv_lora + g.qk_rope)
    for il, dense in enumerate(g.dense):
        last = g.last_block and il == len(g.dense) - 1
        inp_sa = x
        if il == 0 and copied_norm:  # attn_norm's weight over the rms_norm the previous device made
            cur = op(f"attn_norm-{il}", "MUL", f32 * n_embd, copy["norm"], weight(f"attn_norm-{il}.weight"))
        else:
            cur = norm(f"attn_norm-{il}", x, f32 * n_embd)
        if g.q_lora:
            q = norm(f"q_a_norm-{il}", op(f"q_a-{il}", "MUL_MAT", f32 * g.q_lora, weight("wq_a"), cur), f32 * g.q_lora)
            q = op(f"q-{il}", "MUL_MAT", f32 * q_row, weight("wq_b"), q)
        else:
            q = op(f"q-{il}", "MUL_MAT", f32 * q_row, weight("wq"), cur)
        q = view(q, "RESHAPE")
        # Q_nope through wk_b, then the roped q_pe (each a view of Q: Q is freed after both), and their concat
        qna = op(f"q_nope_absorbed-{il}", "MUL_MAT", f32 * absorbed, weight("wk_b"), view(view(q), "PERMUTE"))
        qna = view(qna, "PERMUTE")
        q_pe = op(f"q_pe-{il}", "ROPE", f32 * n_head * g.qk_rope, view(q), copy["pos"])
        qcur = op(f"Qcur-{il}", "CONCAT", f32 * q_cat, qna, q_pe)
        # build_attn expands V (kv_cmpr, normed) then K (its concat with the roped k_pe), then stores K
        kv = op(f"kv_cmpr_pe-{il}", "MUL_MAT", f32 * (g.kv_lora + g.qk_rope), weight("wkv_a_mqa"), cur)
        v = view(norm(f"kv_cmpr-{il}", view(kv), f32 * g.kv_lora), "RESHAPE")
        k_pe = op(f"k_pe-{il}", "ROPE", f32 * g.qk_rope, view(kv), copy["pos"])
        k = op(f"Kcur-{il}", "CONCAT", f32 * (g.kv_lora + g.qk_rope), v, k_pe)
        cache = weight(f"cache_k_l{il}")
        view(cache, "SET_ROWS", name=f"set_rows-{il}", srcs=(view(k), copy["k_idxs"], cache))
        qp = view(view(qcur), "PERMUTE")
        k_4d = view(cache)
        kc, vc = view(k_4d, "PERMUTE"), view(view(k_4d), "PERMUTE")  # V: a view of K's first kv_lora columns
        if g.flash_attn:  # [kv_lora, H, T], then wv_b per head ([v_head, T, H]) and its ggml_cont
            fa = op(f"fattn-{il}", "FLASH_ATTN_EXT", f32 * absorbed, qp, kc, vc, copy["mask"])
            out = op(f"fattn_mla-{il}", "MUL_MAT", f32 * n_head * g.v_head, weight("wv_b"), view(fa, "PERMUTE"))
        else:  # V transposed (ggml_cont, visited first), the scores (softmax in place), kqv, then wv_b
            v_cont = op(f"v_cont-{il}", "CONT", g.v_row_bytes * g.kv_lora * g.n_stream, view(vc, "TRANSPOSE"))
            kq = op(f"kq-{il}", "MUL_MAT", f32 * g.n_kv * n_head, kc, qp)
            kq = op(f"kq_soft_max-{il}", "SOFT_MAX", b.tensors[kq].nbytes, kq, copy["mask"])
            out = op(f"kqv-{il}", "MUL_MAT", f32 * absorbed, v_cont, kq)
            out = op(f"kqv_mla-{il}", "MUL_MAT", f32 * n_head * g.v_head, weight("wv_b"), out)
        out = view(op(f"kqv_out-{il}", "CONT", f32 * n_head * g.v_head, view(out, "PERMUTE")), "RESHAPE")
        cur = op(f"attn_out-{il}", "MUL_MAT", f32 * n_embd, weight("wo"), out)
        rows = g.n_outputs if last else n_tok
        if last:  # the output rows of the attention's output and of the residual (inp_out_ids)
            cur = op(f"attn_rows-{il}", "GET_ROWS", 4 * rows * n_embd, cur, copy["out_ids"])
            inp_sa = op(f"sa_rows-{il}", "GET_ROWS", 4 * rows * n_embd, inp_sa, copy["out_ids"])
        ffn_inp = op(f"ffn_inp-{il}", "ADD", 4 * rows * n_embd, cur, inp_sa)
        cur = norm(f"ffn_norm-{il}", ffn_inp, 4 * rows * n_embd)
        if dense:
            cur = ffn(f"{il}", cur, 4 * rows * g.n_ff, 4 * rows * n_embd)
        else:  # build_moe_ffn: the router (softmax, top-k ids, their weights), gate/up/SwiGLU, down, weighted
            n_exp, used = 4 * rows * g.n_expert, g.n_expert_used
            probs = op(f"probs-{il}", "SOFT_MAX", n_exp, op(f"logits-{il}", "MUL_MAT", n_exp, weight("gate_inp"), cur))
            probs_3d = view(probs, "RESHAPE")
            top_k = view(b.op(f"argsort-{il}", "ARGSORT", flat(n_exp, "i32"), (probs,), dtype="i32"))
            weights = op(f"weights-{il}", "GET_ROWS", 4 * rows * used, probs_3d, top_k)
            cur_3d = view(cur, "RESHAPE")
            ff = 4 * rows * g.n_ff_exp * used
            if il < len(g.host_experts) and g.host_experts[il]:
                # the CPU split copies the normed input and the ids out (input_dep views keep them to its start), then
                # the device's next split starts with the copy of the down projection's output
                # (ggml_backend_sched_split_graph, ggml-backend.cpp b11312: "allocated at the start of the split")
                b.dep(cur_3d)
                b.dep(top_k)
                down = op(f"moe_down-{il}#dev", "NONE", 4 * rows * n_embd * used)
                if il == late_ids:
                    copy["out_ids"] = op("out_ids#dev", "NONE", 4 * g.n_outputs)
            else:
                gate = op(f"moe_gate-{il}", "MUL_MAT_ID", ff, weight("gate_exps"), cur_3d, top_k)
                up = op(f"moe_up-{il}", "MUL_MAT_ID", ff, weight("up_exps"), cur_3d, top_k)
                down = op(f"moe_down-{il}", "MUL_MAT_ID", 4 * rows * n_embd * used, weight("down_exps"),
                          op(f"moe_swiglu-{il}", "GLU", ff, gate, up), top_k)  # fmt: skip
            down = op(f"moe_weighted-{il}", "MUL", b.tensors[down].nbytes, down, weights)
            experts = [view(down) for _ in range(used)]  # "order the views before the adds"
            moe = experts[0]
            for i, e in enumerate(experts[1:], 1):
                moe = op(f"moe_add{i}-{il}", "ADD", 4 * rows * n_embd, moe, e)
            if g.n_ff_shexp:
                shexp = ffn(f"shexp-{il}", cur, 4 * rows * g.n_ff_shexp, 4 * rows * n_embd)
                moe = op(f"ffn_out-{il}", "ADD", 4 * rows * n_embd, moe, shexp)
            cur = moe
        x = op(f"l_out-{il}", "ADD", 4 * rows * n_embd, cur, ffn_inp)
    if g.to_device:  # the next block's rms_norm stays here; the next device copies it and l_out (views keep them)
        nxt = op("attn_norm-next (norm)", "RMS_NORM", f32 * n_embd, x)
        view(x)
        view(nxt)
    if g.n_vocab:
        # deepseek2.cpp after its layer loop: build_norm (rms_norm in place over the last l_out, the weight's mul in
        # place over it) is result_norm, then the lm_head's logits; llm_graph_result::set_outputs (src/llama-graph.cpp)
        # marks both graph outputs, so ggml-alloc never frees them (nor lets an op take them in place)
        norm_out = norm("result_norm", x, 4 * g.n_outputs * n_embd)
        b.set_output(norm_out)
        logits = op("result_output", "MUL_MAT", 4 * g.n_outputs * g.n_vocab, weight("output"), norm_out)
        b.set_output(logits)
        if probe_bytes:
            op("probe", "MUL_MAT", probe_bytes, logits)
    return b.graph()


def expert_activation_bytes(spec: ModelSpec, ub: int) -> tuple[int, int]:
    """build_moe_ffn's per-ubatch tensors (src/llama-graph.cpp): gate, up or their GLU, [n_ff_exp, n_expert_used,
    n_ubatch] f32 (F), and the down projection's output, [n_embd, n_expert_used, n_ubatch] f32 (Eu)."""
    return 4 * ub * (spec.n_ff_exp or spec.n_ff) * spec.n_expert_used, 4 * ub * spec.n_embd * spec.n_expert_used


def _moe_phase(spec: ModelSpec, ub: int, embd: int, q: int) -> int:
    """llm_graph_context::build_moe_ffn (src/llama-graph.cpp): gate and up per selected expert and their
    product (F = [n_ff_exp, n_expert_used, n_ubatch] each), then the down projection's [n_embd,
    n_expert_used, n_ubatch] (Eu), which takes the place of the freed gate and up where it fits (2F), else
    stacks on top. Measured with llama.cpp's own allocation pass (llama-fit-params, b11312) over 18 shapes of
    Qwen3-MoE, Mixtral, gpt-oss and GLM-4.5 layers: exact on 10, within 12 MiB on the rest but one (GLM-4.5-Air's
    shape, 22 MiB over: its gate fits the hole the attention's Q leaves, so one F less stacks; since round 24b
    within 0.2 MiB, tests/test_shared_expert_compute.py). Both phases hold the router's logits and
    probabilities ([n_expert, n_ubatch] f32 each) and a few per-token ids (measured: 0.07 MiB above the rows at
    n_ubatch 512 with 16 experts, 0.30 at 2048).

    A shared expert (qwen3next, qwen35moe, qwen2moe, deepseek2, glm4moe, llama4: src/models/<arch>.cpp, e.g.
    qwen3next.cpp build_layer_ffn, 0c1e570) runs after the routed experts, as build_ffn(cur, up_shexp,
    gate_shexp, down_shexp) added to their output: the residual, the normed input and the routed output (3 rows of
    n_embd) stay alive beside its up, gate and SwiGLU product (S = [n_ff_shexp, n_ubatch] each), placed above
    what ggml-alloc's best fit leaves of the routed experts' freed tensors: a hole of at most half a row of S and
    of n_embd, and at most three rows of n_embd and one F. Measured with llama-fit-params b11312 on an RPC device
    over 48 qwen3next layers (n_embd 1024-4096, n_ff_shexp 1024-16384, 2 or 8 of 16 experts of 256 or 1024,
    n_ubatch 512 and 2048; benchmarks/bench_moe_shared.py): never below, at most 17 % (72 MiB) over; before, a
    shared expert 4-8 times as wide as the routed ones was planned up to 52 % under."""
    f32 = 4
    ff, eu = expert_activation_bytes(spec, ub)
    router = f32 * ub * (2 * spec.n_expert + 8)
    # (not a device that runs none of the experts, host_experts.without_routed_ffn's one value wide: their output is copied
    # in from the CPU's split, placed as the bare graph's measured rule says: Mixtral's widths at --n-cpu-moe 6 of 6
    # over two rpc-servers, 224.00 MiB printed each, 256.22 with this placement; round 25a)
    if ff + router <= q and spec.architecture != "deepseek2" and spec.n_ff_exp > 1:
        # the gate fits the hole the attention's Q (its output before wo) leaves, beside the router's few tensors:
        # ggml-alloc's best fit (ggml_dyn_tallocr_alloc, ggml-alloc.c b11312) puts it there, and only the up and
        # the SwiGLU product stack; the down projection's output lands in that hole or in the up's once they are
        # freed, if it fits one. GLM-4.5-Air's shape (F 22 MiB, Q 24 at n_ubatch 512): llama-fit-params b11312
        # prints 164.01 / 328.02 MiB at -ub 512 / 1024, the masks and 2E + Q + 2F + Eu (3F had been planned).
        # Not deepseek2's: its attention (MLA or not) leaves other holes than a Q (DeepSeek-V2-Lite's shape, 6 of
        # 16 experts: 92.13 MiB printed at -ub 512 and 16k, the 3F rule's 92.12, 99.08 with this one).
        # The routed output (the first add of the experts' views, E) is allocated while the down projection's is
        # alive: in the Q hole, or in the up's and SwiGLU's (2F, freed by then), else on top
        q_free = q - router
        if eu <= ff:  # the down projection in the up's hole: the Q hole and the SwiGLU's are left
            moe_out_fits = embd <= max(q_free, ff)
        elif eu <= q_free:  # in the Q hole: the up's and the SwiGLU's are left
            moe_out_fits = embd <= 2 * ff
        else:  # on top
            moe_out_fits = embd <= max(q_free, 2 * ff)
        down_on_top = eu > ff and eu > q_free
        routed = 2 * embd + q + 2 * ff + (eu if down_on_top else 0) + (0 if moe_out_fits else embd)
    else:
        routed = 2 * embd + 3 * ff + max(embd, q) + (eu if eu > 2 * ff else 0)
    sh = f32 * ub * spec.n_ff_shexp
    shared = 3 * embd + 3 * sh + min((embd + sh) // 2, 3 * embd + ff) if sh else 0
    return max(routed, shared) + router


def _moe_out_top(spec: ModelSpec, ub: int, embd: int) -> tuple[int, int]:
    """How high above the masks a MoE block's output ends: the tensor the next block's KQ scores are placed above
    without flash attention (llama-graph.cpp build_attn_mha b11312: [n_kv, n_tokens, n_head] f32, larger than
    any hole, so ggml-alloc's best fit (ggml_dyn_tallocr_alloc, ggml-alloc.c) puts it after the highest tensor
    alive; Q, K and V sit in holes below it), and with flash attention Q's normed copy where no hole holds it. That tensor is build_moe_ffn's output (src/llama-graph.cpp b11312:
    the first ggml_add of the experts' views, allocated while the down projection's output is alive; the later
    adds, the shared expert's sum (glm4-moe.cpp, qwen2moe.cpp: ggml_add(routed_out, shared_out)) and the
    residual's add (l_out) run in place of it). Below the experts' tensors: the residual, the normed input and
    the router's tensors. The down projection's output (Eu) takes the freed gate's and up's place (2F) where it
    fits and the output lands on top of it; else it stacks on the three F and the output takes the 2F hole
    where it fits, else it stacks too. Returns that height and the hole just below the output."""
    ff, eu = expert_activation_bytes(spec, ub)
    # the router's logits (the probabilities in place), the selection's biased copy and argsort's ids, [n_expert,
    # n_tokens] each, alive when the first expert matmul is placed above them, and the weights of the used ones
    router = 4 * ub * (3 * spec.n_expert + spec.n_expert_used)
    if eu <= 2 * ff:
        return 2 * embd + router + eu + embd, eu
    if embd <= 2 * ff:  # at the foot of the freed experts' tensors: nothing free below it
        return 2 * embd + router + embd, 0
    return 2 * embd + router + 3 * ff + eu + embd, eu


def _small_inputs(spec: ModelSpec, lay: ContextLayout) -> int:
    """The device's copies of the graph inputs besides the masks, alive below a dense lead block's feed-forward: the
    positions and output ids (i32 a token), the K and V row indices (i64 a token with flash attention, else V's
    n_embd_v_gqa a token), and with a quantized cache the Hadamard rotations llama_kv_cache::build_input_k_rot /
    _v_rot make (src/llama-kv-cache.cpp b11312: f32 [nrot, nrot], nrot the largest power of two from 128 dividing
    n_embd_head_k for K, 64 for V; "attn_inp_k_rot" in GLM-4.5-Air's q8_0 graph: 0.07 MiB under without them)."""
    ub = lay.n_ubatch
    v_idxs = v_idxs_bytes(spec, lay) or 8 * ub
    return 4 * ub * 2 + 8 * ub + v_idxs + attn_rot_bytes(spec, lay)


def mask_copy_bytes(cells: int, lay: ContextLayout) -> int:
    """A device's copy of a KQ mask of ``cells`` columns for the reserve's n_ubatch rows: f16 with flash attention,
    else f32 (mask_inputs is the host's input, f32 with flash attention too before #23764)."""
    return cells * lay.n_ubatch * (2 if lay.flash_attn else 4)


def device_masks(s: GraphSizes, lay: ContextLayout) -> int:
    """The device's copy of the KQ masks, alive from the first layer to the last attention: f16 with flash attention,
    else f32 (mask_inputs is the host's input, f32 with flash attention too before #23764)."""
    return mask_copy_bytes(s.mask_cells, lay)


def attn_rot_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The Hadamard matrices of :func:`attn_rot`, f32 graph inputs."""
    return sum(4 * n * n for n in attn_rot(spec, lay))


def attn_rot(spec: ModelSpec, lay: ContextLayout) -> tuple[int, int]:
    """The sizes (nrot) of the Hadamard matrices that rotate K (with Q) and V (kvadvise.planner.builds.ATTN_ROT), 0
    where there is none: llama_kv_cache's attn_rot_k / attn_rot_v (src/llama-kv-cache.cpp b11312: a quantized type
    and a head a multiple of 64), build_input_k_rot (the largest power of two from 64 that divides the head) and
    build_input_v_rot (64)."""
    if builds.older_than(lay.llama_build, builds.ATTN_ROT):
        return 0, 0
    k_rot = 0
    # n_embd_head_k_all > 0: a model without attention (Mamba) has no rotation
    if is_quantized(lay.type_k) and spec.n_embd_head_k > 0 and spec.n_embd_head_k % 64 == 0:
        k_rot = 64
        while spec.n_embd_head_k % (2 * k_rot) == 0:
            k_rot *= 2
    v_rot = 64 if is_quantized(lay.type_v) and spec.n_embd_head_v > 0 and spec.n_embd_head_v % 64 == 0 else 0
    return k_rot, v_rot


def _mixer_phase(spec: ModelSpec, ssm: SSMDims, ub: int, embd: int, n_seqs: int) -> int:
    """A recurrent layer's live set (src/models/graph-context-mamba.cpp, delta-net-base.cpp, lfm2.cpp), measured
    with llama.cpp's allocation pass (b11312) on real-size layers: Mamba-2 (the in-projection, the conv input
    and output, y and its gate, two rows of n_embd, the states of every sequence: exact on Mamba2-2.7B's
    shape, 13 % over on Granite-4.0-H's); gated delta net (three rows of the conv width q|k|v and two of n_embd,
    within 1 % on three Qwen3.5 shapes); LFM2's short conv (six rows of n_embd, exact)."""
    f32 = 4
    if ssm.kind == "gdn":
        conv = 2 * ssm.n_group * ssm.d_state + ssm.d_inner
        return f32 * ub * 3 * conv + 2 * embd + MIB
    if ssm.kind == "shortconv":
        return 6 * embd
    if ssm.kind in ("mamba2", "mamba"):
        conv = ssm.d_inner + 2 * ssm.n_group * ssm.d_state
        in_proj = 2 * ssm.d_inner + 2 * ssm.n_group * ssm.d_state + ssm.n_head
        states = ssm.d_state * ssm.d_inner + max(0, ssm.d_conv - 1) * conv
        return f32 * ub * (in_proj + 2 * conv + 2 * ssm.d_inner) + 2 * embd + f32 * states * max(1, n_seqs)
    return 8 * embd  # RWKV: time mix and channel mix (not measured: an estimate)


def f32_fa_mask(lay: ContextLayout) -> bool:
    """Whether the plan follows builds before ggml-org/llama.cpp#23764 (an f32 mask with flash attention)."""
    return lay.flash_attn and builds.older_than(lay.llama_build, builds.F16_MASK_FA)


def mask_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The KQ masks, one per cache kind (full and SWA): [n_kv, n_tokens/n_stream, 1, n_stream], f16 with
    flash attention, else f32 (src/llama-graph.cpp build_attn_inp_kq_mask, 0c1e570); f32 with flash attention
    too in builds before #23764 (kvadvise.planner.builds; an unknown build: the newest rules)."""
    return mask_inputs(graph_sizes(spec, lay), lay)


def mask_inputs(s: GraphSizes, lay: ContextLayout) -> int:
    """:func:`mask_bytes` of sizes already worked out."""
    f32 = not lay.flash_attn or f32_fa_mask(lay)
    return s.mask_cells * lay.n_ubatch * (4 if f32 else 2)


def ids_bytes(lay: ContextLayout) -> int:
    """The host's token and position ids (i32 [n_ubatch] each) and the output ids (i32 per reserved row)."""
    return 4 * lay.n_ubatch * 2 + 4 * min(lay.n_ubatch, lay.n_outputs_max)


def k_idxs_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The K cache's row indices, graph inputs: i64 [n_ubatch] per cache kind ``spec``'s attention layers read
    (llama_kv_cache::build_input_k_idxs, src/llama-kv-cache.cpp 0c1e570; self_k_idxs and self_k_idxs_swa). They
    came with the cache written by ggml_set_rows, as the V cache's did (:func:`v_idxs_bytes`): none before
    ggml-org/llama.cpp#14285 (builds.SET_ROWS), where K was copied into a view of the cache (ggml_cpy)."""
    if builds.older_than(lay.llama_build, builds.SET_ROWS):
        return 0
    shapes = layer_shapes(spec)
    return 8 * lay.n_ubatch * (bool(shapes.kv_group) + bool(shapes.swa_group))


def v_idxs_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """Without flash attention, the V cache's row indices, graph inputs: i64 [n_embd_v_gqa_max * n_ubatch] per
    cache kind ``spec``'s attention layers read (llama_kv_cache::build_input_v_idxs, V being transposed;
    llm_graph_input_attn_kv_iswa: self_v_idxs and self_v_idxs_swa, even where the SWA cache has as many cells as
    the full one, n_swa + n_ubatch >= n_ctx). The host holds them for the whole model (``spec``); a device of a
    split copies in those of its own layers' kinds (its ``DeviceLayers.spec``, kvadvise.planner.split).

    The tensor came with the cache written by ggml_set_rows (ggml-org/llama.cpp#14285 "kv-cache : use
    ggml_set_rows", 2025-06, behind LLAMA_SET_ROWS; the default from #14959, the ggml_cpy path removed by
    #15505, 2025-08-22): before, the graph copied K and V into views of the cache (llm_graph_context::build_attn,
    ggml_cpy into k_cache_view / v_cache_view, e1e8e09 as Ollama 0.6.8 vendors it) and had no row indices, on the
    host or on any device (kvadvise.planner.builds.SET_ROWS)."""
    if not lay.v_trans or spec.is_mla or builds.older_than(lay.llama_build, builds.SET_ROWS):
        return 0
    shapes = layer_shapes(spec)
    kinds = bool(shapes.kv_group) + bool(shapes.swa_group)
    return 8 * lay.n_ubatch * spec.n_embd_v_gqa_max() * kinds
