"""One device's compute buffer: what ggml-alloc reserves for the graph when the CPU runs every layer
(:func:`compute_bytes`), when one device does (:func:`device_compute_bytes`; op offload's copy of a CPU-resident
weight: :func:`op_offload_growth`), on the host beside it (:func:`host_compute_bytes`), and on a device of a split
without pipeline parallelism (:func:`unpipelined_split_compute`).

Follows llama.cpp 0c1e570 (b11312): ggml/src/ggml-alloc.c (a tensor freed after its last consumer, the graph inputs
allocated first), src/llama-context.cpp llama_context::sched_reserve and graph_reserve (the reserve graph),
ggml/src/ggml-backend.cpp ggml_backend_sched_split_graph (the inputs on the host, a split's copies of them). The buffer
has no closed form: it is the largest of the graph's live sets, each a closed form (kvadvise.planner.sizes), or, for
the dense llama-family graphs and Qwen3-MoE's, ggml-alloc's own figure over the reserve graph (kvadvise.planner.galloc
over kvadvise.planner.llama_graph). Checked against llama.cpp's own allocation pass (llama-fit-params b11312 on RPC
devices, real-size layers of 20 families, tests/test_oracle.py; the 220 buffers of benchmarks/bench_galloc.py's grid,
tests/test_galloc.py; a split without pipeline parallelism, benchmarks/bench_split.py --no-pipeline) and published
CUDA, Metal and Vulkan logs (tests/data/published). The rules for routed experts kept in host memory are
kvadvise.planner.host_experts'; kvadvise.planner.memory puts these buffers together with the rest.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from kvadvise.model.ggml import ALIGNMENT, GGMLType, pad
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner.galloc import reserve_sizes
from kvadvise.planner.layout import ContextLayout
from kvadvise.planner.llama_graph import LlamaShape, build
from kvadvise.planner.sizes import (
    GraphSizes,
    attn_rot,
    attn_rot_bytes,
    device_masks,
    f32_fa_mask,
    graph_sizes,
    ids_bytes,
    mask_copy_bytes,
    mask_inputs,
    reserve_outputs,
    reserve_tokens,
    v_idxs_bytes,
)
from kvadvise.planner.split import DeviceLayers, split_compute, trunk_only, unpipelined_last_block_compute


def compute_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The compute buffer when the CPU runs every layer (one buffer; llama_context::sched_reserve).

    ggml-alloc (ggml/src/ggml-alloc.c) allocates the graph inputs first and frees every tensor after its last
    consumer: the KQ masks live from the first layer to the last attention, so a layer's peak is the masks
    plus its largest live set (kvadvise.planner.sizes.graph_sizes) plus the token embeddings' get_rows; the
    output layer's is the logits of the reserved rows and two rows of n_embd. Measured with llama.cpp's
    allocation pass (llama-fit-params, b11312) on real-size models of 20 families (tests/test_oracle.py).
    Builds before #15850: ggml-alloc's own figure where llama_graph builds the graph (_exact_device_compute)."""
    exact = _exact_device_compute(spec, lay)
    if exact is not None and lay.llama_build is not None:
        return exact
    s = graph_sizes(spec, lay)
    layer = _layer_peak(s, lay) + s.layer_inputs_bytes
    analytic = pad(max(s.logits_bytes + 2 * s.embd_bytes + s.ple_bytes, layer + s.embd_bytes), ALIGNMENT["cuda"])
    # an unknown build is planned for the newest rules, the replay of b11312's graph a floor under the phases
    return analytic if exact is None else max(exact, analytic)


def _layer_peak(s: GraphSizes, lay: ContextLayout) -> int:
    """A layer's peak: the masks (f16 with flash attention, else f32) and the layer's live set; before
    ggml-org/llama.cpp#23764, with flash attention, also the f32 mask input until its f16 cast, which the
    first attention reads (build_attn_inp_kq_mask: ggml_cast of the f32 input; the PR: "the f32 mask still
    uses the compute buffer even though it is not used")."""
    if not s.layer_bytes:
        return 0
    ub = lay.n_ubatch
    f32_mask = f32_fa_mask(lay)
    masks = device_masks(s, lay)
    peak = max(masks + s.layer_bytes, s.last_block_bytes)
    if f32_mask and s.attn_bytes:
        peak = max(peak, masks + s.mask_cells * ub * 4 + s.attn_bytes)
    if f32_mask and s.lead_swa_masks_bytes:
        # the leading sliding-window layers run with the full mask's f32 input alive (its ggml_cast is placed
        # at the first full-attention layer): measured with the allocation pass of 364a7a6 (Ollama 0.12.5's
        # llama.cpp) on Gemma 3 12B's layers at 32k, 181.5 MiB for 178 planned (146 without this)
        peak = max(peak, s.lead_swa_masks_bytes + s.layer_bytes)
    return peak


def host_compute_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """The CPU-side compute buffer of a run whose layers are on a device (CUDA_Host, or CPU beside RPC
    devices), sized by its own allocation pass (ggml_backend_sched: one buffer per backend).

    ggml_backend_sched_backend_id_from_cur (ggml/src/ggml-backend.cpp) puts every graph input on the
    last backend, the CPU, whose buffer type is the GPU's pinned host type when there is a GPU
    (src/llama-context.cpp, backend_buft): the KQ masks, the token ids, positions and output ids, and
    without flash attention the V cache's row indices (i64 [n_embd_v_gqa * n_ubatch] per cache,
    llm_graph_input_attn_kv::set_input, the V cache being transposed); token_embd stays on the CPU
    (llama_model::load_tensors), so its get_rows is there too, and from #18898 (builds.EMBD_SELECT) beside it the
    f32 inp_embd input build_inp_embd selects between: two [n_embd, n_ubatch] rows, one before; builds before
    #23764 kept the mask f32 with flash attention. Every input is as wide as the reserve's batch, n_ubatch
    rounded up to the sequences (reserve_tokens: LLamaSharp's SeqMax 40 reserves 520 tokens). Measured with
    llama.cpp's allocation pass on RPC devices (b11312, 20 families, tests/test_oracle.py) and published logs
    (b8816's CUDA_Host 16.26 MiB: a 2048 x 520 f32 mask, two rows of 520, the ids).
    """
    lay = replace(lay, n_ubatch=reserve_tokens(lay), n_outputs_max=reserve_outputs(lay))
    s = graph_sizes(spec, lay)
    rows = 1 if builds.older_than(lay.llama_build, builds.EMBD_SELECT) else 2
    # Gemma 3n/4: per_layer_token_embd is an input tensor on the CPU, so its get_rows for the batch is here
    # (one [n_embd_per_layer * n_layer, n_ubatch] f32; exact on 24 shapes of llama.cpp's allocation pass)
    # the Hadamard rotations of a quantized cache are host inputs too (sizes.attn_rot)
    rot = attn_rot_bytes(spec, lay)
    return pad(
        mask_inputs(s, lay) + rows * s.embd_bytes + v_idxs_bytes(spec, lay) + ids_bytes(lay) + s.ple_bytes + rot,
        ALIGNMENT["cuda"],
    )


def device_compute_bytes(spec: ModelSpec, lay: ContextLayout, *, weight_copy: int = 0) -> int:
    """The compute buffer of the one device that runs every layer (a GPU, or an RPC device).

    ggml-alloc's peak is the largest of its live sets (ggml/src/ggml-alloc.c frees a tensor after its last
    consumer; the graph inputs are allocated first and live in the host buffer, the device holds their
    copies, also allocated first):
    - the output layer: the logits of the reserved rows and up to two [n_embd, n_ubatch] rows (the normed
      hidden state that makes them; the masks and the layers' activations are dead by then);
    - a layer: the device's copy of the KQ masks, alive from the first layer to the last attention, and the
      layer's largest live set (kvadvise.planner.sizes.graph_sizes); before ggml-org/llama.cpp#23764 (b9410)
      the device also held the f32 mask input until its f16 cast at the first attention ("the f32 mask still
      uses the compute buffer even though it is not used").
    ``weight_copy``: op offload's copy of a CPU-resident weight (kvadvise.planner.offload), alive during a
    layer's matmul, not beside the logits.
    Measured with llama.cpp's allocation pass (llama-fit-params, b11312) on RPC devices, on real-size models
    of 20 families (tests/test_oracle.py); published CUDA, Metal and Vulkan logs (tests/data/published).
    """
    if not weight_copy:
        exact = _exact_device_compute(spec, lay)
        if exact is not None:
            if (lay.device == "cuda" and not builds.older_than(lay.llama_build, builds.GRAPH_OPTIMIZE)) or (
                lay.llama_build is None
            ):
                # a GPU from b6302 on: kvadvise's "cuda" also plans Vulkan, whose graph_optimize reorders the graph
                # ggml-alloc sees (CUDA's does not, unless GGML_CUDA_GRAPH_OPT is set): the larger of the replay and
                # the phases; an unknown build (the newest rules) alike
                return max(exact, analytic_device_compute(spec, lay))
            return exact
    return analytic_device_compute(spec, lay, weight_copy)


def analytic_device_compute(spec: ModelSpec, lay: ContextLayout, weight_copy: int = 0) -> int:
    s = graph_sizes(spec, lay)
    layer = _layer_peak(s, lay)
    if weight_copy and s.layer_bytes:  # op offload: the copy beside a matmul's inputs and output, masks alive
        layer = max(layer, device_masks(s, lay) + s.layer_bytes + weight_copy)
        if f32_fa_mask(lay) and s.lead_swa_masks_bytes:  # and in a leading sliding-window layer, the f32 mask (above)
            layer = max(layer, s.lead_swa_masks_bytes + s.layer_bytes + weight_copy)
    layer += s.layer_inputs_bytes
    # the logits land above the per-layer inputs' hole (measured: + the inputs' size + 0 to 5 MiB)
    return pad(max(s.logits_bytes + 2 * s.embd_bytes + s.ple_bytes, layer), ALIGNMENT["cuda"])


# kvadvise.planner.llama_graph's graphs; granite's is llama's with in-place scales (src/models/granite.cpp)
# mistral3 (Ministral 3, Mistral Small 3.x) is llama's graph and, with attention.temperature_scale, an in-place
# scale of Q by a [1, 1, n_tokens] input (src/models/mistral3.cpp): llama-server b11312 prints llama's figures for
# it (Ministral 3 3B's shape on a CPU: 168.02 MiB at -c 8192 -np 2 -ub 1024 both ways)
_EXACT_ARCHS = ("llama", "granite", "phi3", "qwen2", "qwen3", "mistral3")
# the MoE graphs replayed (llama_graph's build_moe_ffn), b11312's rules only: qwen3's layer with routed experts in every
# block and no shared expert (Qwen3-30B-A3B, Qwen3-Coder-30B, Qwen3-235B-A22B)
_EXACT_MOE_ARCHS = ("qwen3moe",)
# the legacy graphs checked against published logs and e1e8e09's allocation pass (tests/test_old_build_graphs.py,
# tests/test_glm4_old_builds.py); not granite's: no old log
_EXACT_ARCHS_LEGACY = ("llama", "qwen2", "qwen3", "glm4", "phi3")
# phi3's once the cache was written with set_rows (builds.SET_ROWS): a CPU at b6200 as printed (tests/data/published
# 106: 288.01 MiB; the analytic plan, which keeps the fused QKV output alive through the attention, 306.00); before
# it Q, K and V were copied out of the fused QKV and an RTX 3070 at b5600 printed 138.00 where the replay says 150
_LEGACY_SET_ROWS_ONLY = ("phi3",)


# b11312's graph of uniform layers allocates the same from the third layer on: replaying 3, 4 or 6 of 80 layers gives
# the 80 layers' buffer to the byte on 1,440 shapes (llama, phi3, qwen3; flash attention on and off; rotated caches;
# one device and the CPU alone), so the newest rules replay 8, twenty times faster on a 70B model's plan search. The
# older graphs are replayed whole: truncated, phi3's differs there by up to 13 MiB
_NEWEST_REPLAYED_LAYERS = 8


def _exact_device_compute(spec: ModelSpec, lay: ContextLayout) -> int | None:
    """ggml-alloc's own figure (kvadvise.planner.galloc over kvadvise.planner.llama_graph's node sequence) where
    that has been checked to the 0.01 MiB llama.cpp prints: a dense llama-architecture model (Llama 3.x,
    Mistral), Granite 3.x (its residual and logit scales run in place: the same allocation), Phi-3 (fused QKV and gate+up, as its GGUFs are converted), Qwen2 / Qwen2.5 (Q/K/V biases, no
    output bias) or Qwen3 (Q/K norms), and on b11312's rules Qwen3-MoE (llama_graph's build_moe_ffn: 59 of the 60
    qwen3moe buffers of bench_galloc's grid to the 0.01 MiB, one 0.50 MiB over; the CPU alone as printed on 9 of 9;
    the phases were 0.5 to 28 MiB over); a stream per sequence (one sequence, or -np N without a unified cache:
    n_kv the cells of a stream); all layers on one RPC device (alignment 32: an rpc-server's CPU buffer type);
    an f16 or quantized cache; b11312 or later. 220 of 220 buffers of benchmarks/bench_galloc.py's grid (11
    shapes x flash attention on/off x 2k-32k cells x the whole batch's logits or one row). Elsewhere None: the
    analytic plan, whose peaks (masks + a layer, logits + two rows) miss where ggml-alloc's best fit leaves
    the final norm and the logits above holes (Llama 3.2 3B at 4,096 cells: 262.50 planned, 278.51 reserved;
    Phi-3-mini: 74.62 planned, 84.64 reserved).

    On builds before builds.GRAPH_OPTIMIZE no backend reordered the graph, so on any GPU device (its buffer
    alignment) the graph as that era built it (LlamaShape.legacy, and GLM-4's llm_build_glm4): one cache of
    n_ctx cells attended whole and n_ubatch tokens in one sequence (llama_context's reserve of e1e8e09:
    n_seqs = 1). As printed on six published CUDA/ROCm logs of b4300-b5274 (tests/data/published 006, 007, 011,
    019, 026, 034: the analytic plan was 4 to 33 MiB off); the allocation pass of e1e8e09 on a no-op device:
    220.00 MiB for GLM-4-32B's layers with a 1,024-token vocabulary (tests/test_glm4_old_builds.py). The CPU
    running every layer (compute_bytes) likewise, its graph one split in one buffer (LlamaShape.cpu_only):
    TinyLlama at b4700 and Qwen3 1.7B at b6100 as printed (tests/data/published 010, 017; the analytic plan
    was +12 and +4).

    From b6302 to b9409 (builds.GRAPH_OPTIMIZE to builds.F16_MASK_FA) on CUDA, the CPU or an RPC device: the graph of
    a5bb8ba4 (LlamaShape.f32_fa_mask: the f32 mask's device copy and its f16 cast beside the first attention), the
    outputs as the build reserves them (raised to the rounded batch from b7847, sizes.reserve_outputs), a unified
    cache of several sequences being one stream of all their tokens; CUDA's graph_optimize reordered nothing then
    (none before #16991, and behind GGML_CUDA_GRAPH_OPT after it). LLamaSharp 0.27.0 (b8816) with SeqMax 40 as
    printed (tests/data/published 035: 284.90 MiB; the analytic plan was 262.50), and its spike's 267 and 261 MiB at
    8,192 and 16,384 cells (tests/test_llamasharp_b8816.py); Ollama 0.20.2's runner on ec98e2002 (planned as b7699),
    Qwen2.5-Coder-7B at 32,768 cells: 382.01 MiB as printed, where the analytic plan's 311.00 (the logits and two
    rows) missed the logits landing above the hole the f32 mask's copies leave (tests/data/published 045)."""
    shape = _replay_shape(spec, lay)
    return None if shape is None else _reserved(shape, ALIGNMENT[lay.device])


def _replay_shape(spec: ModelSpec, lay: ContextLayout, *, experts_anywhere: bool = False) -> LlamaShape | None:
    """The reserve graph :func:`_exact_device_compute` replays for ``spec`` at ``lay`` (None: not replayed).
    ``experts_anywhere``: a MoE's routed experts may be in host memory (:func:`host_experts_device_compute` builds their
    CPU splits); else a MoE is replayed only with every block's experts on the device (:func:`moe_replayed`)."""
    legacy = builds.older_than(lay.llama_build, builds.GRAPH_OPTIMIZE)
    # b6302 to b9409: a5bb8ba4's graph (the f32 flash-attention mask) on CUDA, an RPC device or the CPU (no
    # graph_optimize: allocated as built; Ollama 0.13's CPU runner at b6840 as printed, tests/data/published 103:
    # 300.01 MiB, the analytic plan 320.00), one stream or
    # a unified cache of several sequences (LLamaSharp's default kv_unified with SeqMax 40: 284.90 MiB as b8816
    # printed it, tests/data/published 035); CUDA's graph_optimize reordered nothing (kvadvise.planner.builds)
    mid = lay.llama_build is not None and builds.GRAPH_OPTIMIZE <= lay.llama_build < builds.F16_MASK_FA
    # b11312's graph: an unknown build follows the newest rules (builds.older_than)
    newest = lay.llama_build is None or lay.llama_build >= builds.REFERENCE
    uniform = len(set(spec.n_head)) == 1 and len(set(spec.n_head_kv)) == 1
    # qwen3moe's build_moe_ffn, b11312's graph only
    moe = newest and (_moe_graph(spec) if experts_anywhere else moe_replayed(spec))
    if not (
        (lay.device in ("rpc", "cpu", "cuda") if newest else legacy or (mid and lay.device in ("cuda", "cpu")))
        and (spec.architecture in (_EXACT_ARCHS_LEGACY if legacy else _EXACT_ARCHS) or moe)
        and not (legacy and spec.architecture in _LEGACY_SET_ROWS_ONLY and builds.older_than(lay.llama_build, builds.SET_ROWS))
        and uniform and ((spec.n_ff and not spec.n_expert) or moe)
        and spec.n_swa == 0 and not spec.is_mla and not any(spec.recurrent_layers) and all(spec.kv_layers)
        and spec.n_layer_nextn == 0 and spec.n_embd_head_k == spec.n_embd_head_v and not spec.n_embd_per_layer
        and (legacy or mid or lay.n_stream == lay.n_seq_max) and GGMLType.F32 not in (lay.type_k, lay.type_v)
        and (legacy or mid or newest)
    ):  # fmt: skip
        return None
    # llama_context::graph_reserve: the batch's tokens rounded up to a multiple of the sequences (one stream each,
    # or one unified stream of them all: the same tensors); the outputs as reserve_outputs says
    build_ = lay.llama_build
    k_rot, v_rot = attn_rot(spec, lay)
    return LlamaShape(
        n_layer=spec.n_layer if legacy or mid else min(spec.n_layer, _NEWEST_REPLAYED_LAYERS),
        n_embd=spec.n_embd, n_head=spec.n_head[0], n_head_kv=spec.n_head_kv[0],
        n_embd_head=spec.n_embd_head_k, n_ff=spec.n_ff, n_vocab=spec.n_vocab,
        n_kv=lay.n_ctx if legacy else lay.n_ctx_seq,
        n_ubatch=reserve_tokens(lay), n_outputs=reserve_outputs(lay), flash_attn=lay.flash_attn,
        phi3=spec.architecture == "phi3", qkv_bias=spec.architecture == "qwen2",
        qk_norm=spec.architecture in ("qwen3", "qwen3moe"),
        glm4=spec.architecture == "glm4", legacy=legacy, swiglu=not builds.older_than(build_, builds.FUSED_GLU),
        set_rows=not builds.older_than(build_, builds.SET_ROWS), cpu_only=lay.device == "cpu", f32_fa_mask=mid,
        embd_select=not builds.older_than(build_, builds.EMBD_SELECT),
        k_rot=k_rot, v_rot=v_rot,
        n_expert=spec.n_expert if spec.n_expert else 0, n_expert_used=spec.n_expert_used if spec.n_expert else 0,
        n_ff_exp=(spec.n_ff_exp or spec.n_ff) if spec.n_expert else 0,
    )  # fmt: skip


def host_experts_device_compute(spec: ModelSpec, lay: ContextLayout, n_cpu_moe: int) -> int | None:
    """One RPC device's compute buffer running every block of a qwen3moe whose first ``n_cpu_moe`` blocks keep their
    routed experts in host memory (--n-cpu-moe): ggml-alloc's own figure over the graph ggml_backend_sched hands it, the
    experts' gate, up and down in CPU splits and the copy of their output at the start of the device's next split
    (llama_graph's ``host_experts``). llama-fit-params b11312 over an rpc-server, --n-cpu-moe 0 to n_layer on five
    qwen3moe shapes (Qwen3-30B-A3B's widths, tiny ones of 1, 4 and 8 used experts) at 4k / 16k, -ub 512 / 2048, flash
    attention on and off: 105 of 105 as printed (benchmarks/bench_galloc.py --host-experts); the figure moves with the
    blocks moved, not monotonically (a tiny qwen3moe of one used expert at 4k: 64.50 MiB full, 66.50 at 1, 2, 4 and 5
    blocks, 64.50 at 3, 68.50 at 6 of 6).
    None where not replayed: another architecture or build, or a device that op-offloads (a GPU copies the weights in)."""
    if lay.device != "rpc" or n_cpu_moe <= 0:
        return None
    shape = _replay_shape(spec, lay, experts_anywhere=True)
    if shape is None or not shape.n_expert:
        return None
    n = min(n_cpu_moe, spec.n_layer)
    host, device = _fold(n), _fold(spec.n_layer - n)
    return _reserved(replace(shape, n_layer=host + device, host_experts=host), ALIGNMENT[lay.device])


def _fold(n_blocks: int) -> int:
    """As many blocks of one kind (experts in host memory or not) as the replay needs for ``n_blocks`` of them: the
    buffer repeats with a period of three blocks from the fourth on (480 of 480 folded replays of 20-48 blocks, every
    --n-cpu-moe, equal to the whole graph's)."""
    return n_blocks if n_blocks < 7 else 4 + (n_blocks - 4) % 3


def replay_surplus_bytes(spec: ModelSpec, lay: ContextLayout) -> int:
    """How far the phases' figure (:func:`analytic_device_compute`) lies above the one :func:`device_compute_bytes`
    plans for a MoE whose graph is replayed (:func:`moe_replayed`; 0 elsewhere, and on a GPU, which plans the larger
    of the two). The rules for routed experts in host memory (kvadvise.planner.host_experts) and for partial plans
    (kvadvise.planner.offload) were measured as steps from the phases' figure: they start from it."""
    if not moe_replayed(spec):
        return 0
    return max(0, analytic_device_compute(spec, lay) - device_compute_bytes(spec, lay))


def moe_replayed(spec: ModelSpec) -> bool:
    """A MoE whose full offload llama_graph replays: :func:`_moe_graph`'s, every block's routed experts on the device (a
    block --n-cpu-moe moved holds none of their bytes: its CPU split is :func:`host_experts_device_compute`'s)."""
    return _moe_graph(spec) and all(spec.layer_expert_bytes)


def _moe_graph(spec: ModelSpec) -> bool:
    """A MoE whose graph llama_graph builds: qwen3moe with routed experts in every block, no shared expert."""
    return (
        spec.architecture in _EXACT_MOE_ARCHS and spec.n_expert > 0 and spec.n_expert_used > 0 and not spec.n_ff_shexp
        and len(spec.layer_expert_bytes) == spec.n_layer
        # not host_experts.without_routed_ffn's experts one value wide: they stand for CPU splits not replayed here
        and (spec.n_ff_exp or spec.n_ff) > 1
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def _reserved(shape: LlamaShape, device_alignment: int) -> int:
    """The device's buffer of ``shape``'s reserve graph (tens of ms for a large model: a context search asks
    for the same shape more than once)."""
    return reserve_sizes(build(shape), (device_alignment, ALIGNMENT["cpu"]))[0]


def op_offload_growth(spec: ModelSpec, lay: ContextLayout, weight_copy: int) -> int:
    """How much op offload's copy of a CPU-resident weight grows the device's compute buffer: the copy is
    alive during the matmul that reads it, inside a layer's live set, not beside the output layer's logits
    (ggml_backend_sched_split_graph: the weight is an input of its split). Checked on a published CUDA log
    (Qwen3.6-35B-A3B, experts of 34 layers in host memory, tests/test_published_logs.py)."""
    if weight_copy <= 0:
        return 0
    return analytic_device_compute(spec, lay, weight_copy) - analytic_device_compute(spec, lay)


def unpipelined_split_compute(spec: ModelSpec, lay: ContextLayout, part: DeviceLayers) -> int:
    """One device's compute buffer in a split without pipeline parallelism (memory.pipeline_parallel): the
    one-device rules applied to the layers it holds, and the output phase on the device with the output layer.

    ggml_backend_sched_split_graph flags a split's input copies input and output, so that ggml-alloc keeps them
    for the whole graph, only when it keeps several copies (``if (sched->n_copies > 1)``, ggml-backend.cpp); with
    one copy they are ordinary nodes, freed after their last consumer as on a single device, whose inputs are
    copies from the host too. Measured with llama-fit-params b11312 on loopback RPC devices, pipeline parallelism
    turned off by a tensor override (benchmarks/bench_split.py --no-pipeline): Llama 3.1 8B, Qwen3 0.6B and
    30B-A3B, Qwen1.5-MoE, DeepSeek-V2-Lite, gpt-oss-20b and Gemma 3 12B at -2.0 to +18.4 MiB, where the rule with
    its copies was -16.2 to +56 (477 of the grid's 616 buffers within 5 % or 8 MiB, 332 before); tests/data/
    published 023 (two RPC hosts at b6209): 588.01 MiB each as printed, 604.02 and 620.02 before. A hybrid's split
    (recurrent layers) keeps the rule with its copies (+3 to +48): the one-device rules are up to 24 MiB under
    there (Granite-4.0-H's last device at 32k; Qwen3.5-9B's middle device holds 18 MiB above one device's)."""
    part = trunk_only(part)
    if not (part.layers or part.last):  # a device given no layer holds no graph
        return 0
    if (tail := unpipelined_last_block_compute(spec, lay, part)) is not None:
        return tail
    if any(spec.recurrent_layers) or not part.layers or part.layers == (spec.n_layer - 1,):
        # (the output layer alone, or the last block alone: split_compute sizes them at the output rows they run)
        return split_compute(spec, lay, part, copies=1)
    if part.layers and not spec.n_expert:
        # a model whose layers are all alike (a dense Llama, Qwen2/3, Phi-3): one device's graph, replayed; a device
        # without the output layer reserves no logits (one row stands for none: its live set is far below a layer's)
        exact = _exact_device_compute(spec, lay if part.last else replace(lay, n_outputs_max=1))
        if exact is not None:
            return exact
    s = graph_sizes(part.spec, lay)
    layer = _split_layer_peak(spec, part.layers, s, lay) + s.layer_inputs_bytes if part.layers else 0
    out = s.logits_bytes + 2 * s.embd_bytes + s.ple_bytes if part.last else 0
    return pad(max(layer, out), ALIGNMENT["cuda"])


def _split_layer_peak(spec: ModelSpec, layers: tuple[int, ...], s: GraphSizes, lay: ContextLayout) -> int:
    """:func:`_layer_peak` for a device of a split without pipeline parallelism whose blocks read two cache kinds
    (full and sliding-window attention): with one copy a mask is an ordinary node, copied in at the split's start
    and freed after its last consumer (ggml_backend_sched_split_graph, ggml-alloc), so a block runs beside the masks
    the blocks from it on still read, and its feed-forward beside those after it. llama-server b11312 over two
    rpc-servers, Gemma 3 shapes at 16k cells, -ub 2048: a device whose global block comes first holds 122.07 MiB (its
    sliding-window blocks run without the 64 MiB full mask), one whose global block follows a sliding-window one
    186.07. Other builds (the f32 flash-attention mask) and one cache kind: :func:`_layer_peak`.

    A freed mask narrower than a row of n_embd stays a hole no tensor of the phases fits, under the mask and the row
    ids copied in with it (round 26d, a traced ggml-alloc of llama-server b11312 over two rpc-servers: gpt-oss-120b's
    widths, the device of blocks 4-5, -ub 2048, --n-cpu-moe 1: block 4's experts run above the 10 MiB hole of the
    sliding-window mask, 421.07 MiB printed, 411.12 planned before)."""
    if f32_fa_mask(lay) or not spec.n_swa or not s.layer_bytes:
        return _layer_peak(s, lay)
    kinds = [spec.swa_layers[il] for il in sorted(layers) if spec.kv_layers[il]]
    if len(set(kinds)) < 2:
        return _layer_peak(s, lay)
    width = {False: mask_copy_bytes(lay.n_ctx_seq, lay), True: mask_copy_bytes(lay.n_ctx_swa, lay)}

    def masks(rest: list[bool]) -> int:  # the masks the blocks of ``rest`` still read, and the holes of narrow ones
        return sum(b for k, b in width.items() if k in rest or (rest and b < s.embd_bytes))

    return max(max(masks(kinds[i:]) + s.attn_bytes, masks(kinds[i + 1 :]) + s.mix_bytes) for i in range(len(kinds)))
