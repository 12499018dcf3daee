"""ModelSpec: what the memory model needs to know about a model.

Field names follow llama.cpp's ``llama_hparams`` (src/llama-hparams.h,
llama.cpp 0c1e570). Per-layer values are tuples of length ``n_layer_all``
(every block in the file, MTP/NextN blocks included).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.units import MAX_SIZE_BYTES

SWA_NONE = "none"
SWA_STANDARD = "standard"
SWA_CHUNKED = "chunked"
SWA_SYMMETRIC = "symmetric"


@dataclass(frozen=True, slots=True)
class MatmulWeight:
    """A weight matrix a matmul reads (``MUL_MAT``, 2-D, or ``MUL_MAT_ID``, 3-D experts) of a type the CPU backend
    may move into an extra buffer: its CPU_REPACK buffer (ggml/src/ggml-cpu/repack.cpp) or its AMX buffer
    (ggml/src/ggml-cpu/amx/amx.cpp)."""

    type_name: str  # ggml_type_name, e.g. q4_k
    ne1: int  # rows (ne[1]): the repack layouts need a multiple of 4 or 8
    n_bytes: int  # ggml_nbytes
    offset: int  # in the file's data section
    block: int  # blk.N; -1 for the output layer
    ne0: int = 0  # the row's width (ne[0]): AMX's kernels need a multiple of their block (kvadvise.planner.repack)
    experts: bool = False  # 3-D experts, read by MUL_MAT_ID (AMX takes MUL_MAT's 2-D weights only)
    # the output layer's copy of a tied token_embd (llama-model.cpp create_tensor, TENSOR_DUPLICATED): a tensor of
    # its own where an extra buffer type takes it; token_embd itself stays mapped (its GET_ROWS stays on the CPU)
    tied: bool = False


@dataclass(frozen=True, slots=True)
class SSMDims:
    """The recurrent mixer's sizes, for its activations in the compute buffer (llama_hparams ssm_* fields;
    ``kind``: mamba2 (Mamba-2, Granite-hybrid, Falcon-H1, Nemotron-H, Jamba's mamba layers), gdn (Qwen3-Next /
    Qwen3.5 gated delta net), shortconv (LFM2), rwkv, mamba (Mamba-1))."""

    kind: str
    d_conv: int  # {arch}.ssm.conv_kernel (shortconv: {arch}.shortconv.l_cache)
    d_inner: int  # {arch}.ssm.inner_size (GDN: v heads x head dim)
    d_state: int  # {arch}.ssm.state_size (GDN: head dim)
    n_group: int  # {arch}.ssm.group_count (GDN: k heads)
    n_head: int  # {arch}.ssm.time_step_rank (Mamba-2 heads; GDN: v heads)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the memory model needs to know of a model, from any source (GGUF, config.json, profile)."""

    name: str
    architecture: str  # general.architecture
    source: str  # where the spec came from: a path, a repo id, a profile
    n_layer_all: int  # {arch}.block_count
    n_layer_nextn: int  # {arch}.nextn_predict_layers: MTP blocks, no KV in the main context
    n_embd: int  # {arch}.embedding_length
    n_vocab: int  # tokenizer.ggml.tokens length (or {arch}.vocab_size)
    n_ctx_train: int  # {arch}.context_length
    n_head: tuple[int, ...]  # {arch}.attention.head_count, per layer
    n_head_kv: tuple[int, ...]  # {arch}.attention.head_count_kv, per layer (GQA; never n_head)
    n_embd_head_k: int  # {arch}.attention.key_length (default n_embd / n_head)
    n_embd_head_v: int  # {arch}.attention.value_length (default n_embd / n_head)
    n_embd_head_k_swa: int  # {arch}.attention.key_length_swa (default n_embd_head_k)
    n_embd_head_v_swa: int  # {arch}.attention.value_length_swa (default n_embd_head_v)
    n_swa: int  # {arch}.attention.sliding_window (0: no SWA)
    swa_type: str  # none | standard | chunked | symmetric
    swa_layers: tuple[bool, ...]  # is_swa(il)
    recurrent_layers: tuple[bool, ...]  # is_recr(il): layers with recurrent state instead of KV
    kv_layers: tuple[bool, ...]  # layers that own K/V cells in the main context
    n_embd_r: int  # recurrent conv/token-shift state per layer and sequence, f32 values
    n_embd_s: int  # recurrent ssm/wkv state per layer and sequence, f32 values
    is_mla: bool  # key_length_mla and value_length_mla present: K only, V is a view of K
    n_ff: int  # {arch}.feed_forward_length (largest layer)
    n_expert: int  # {arch}.expert_count
    n_expert_used: int  # {arch}.expert_used_count
    weights_bytes: int  # every tensor in the file, as stored
    tok_embd_bytes: int  # token_embd.weight: always kept on the CPU by llama.cpp
    output_bytes: int  # output.weight; 0 when tied to token_embd (llama.cpp then duplicates it)
    file_type: str  # dominant tensor type of the weights, e.g. q4_K
    verified: bool  # architecture checked against real llama.cpp in kvadvise's tests
    notes: tuple[str, ...] = ()  # caveats of the figures: printed with every plan
    sources: tuple[str, ...] = ()  # where the figures come from, one line each ("weights: 19 GB, Ollama library, ...")
    # the other input-layer tensors (Gemma 3n/4's per_layer_token_embd, position_embd, token_types): on the CPU
    # beside token_embd (llama-arch.cpp: LLM_TENSOR_LAYER_INPUT; llama_model::load_tensors keeps dev_input on the
    # CPU, "very little benefit" to offload it), never a tied output's copy
    input_extra_bytes: int = 0
    expert_bytes: int = 0  # routed-expert tensors (ffn_*_exps): only n_expert_used of n_expert are read per token
    layer_bytes: tuple[int, ...] = ()  # weights of each block (blk.N.*), for partial offload
    # the routed experts' bytes of each block (blk.N.ffn_*_exps, what --n-cpu-moe moves by block index); ()
    # when unknown (then expert_bytes spread over the layers that hold experts)
    layer_expert_bytes: tuple[int, ...] = ()
    # of those, each block's ffn_up_exps and ffn_gate_exps (a fused gate_up counts as neither): what a partial
    # offload can keep on the GPU of the last block whose experts are on the CPU (llama.cpp common/fit.cpp's
    # LAYER_FRACTION_UP and _GATE); () when unknown
    layer_expert_up_bytes: tuple[int, ...] = ()
    layer_expert_gate_bytes: tuple[int, ...] = ()
    cuda_pad_bytes: int = 0  # extra bytes CUDA buffers add (128-byte alignment, quantized rows padded to 512)
    layer_cuda_pad_bytes: tuple[int, ...] = ()  # that padding per block, for a split over several devices
    # the quantized matmul weights of the types some CPU repacks (kvadvise.planner.repack), and the file
    # span [first, last) of every other loaded tensor: what stays mapped whatever is repacked
    matmul_weights: tuple[MatmulWeight, ...] = ()
    # the largest tensor of each block as a CUDA buffer sizes it: what op offload copies to the GPU for a
    # block kept on the CPU (kvadvise.planner.offload); () when unknown
    layer_largest_tensor_bytes: tuple[int, ...] = ()
    fixed_span: tuple[int, int] = (0, 0)
    # parameters one token multiplies by: every matmul weight but token_embd (one row is looked up; a tied
    # output layer counts it), of the routed experts n_expert_used of n_expert. Prompt processing costs
    # 2 FLOPs per such parameter and token (kvadvise.planner.prefill); 0: unknown (then from the bytes)
    active_params: int = 0
    # What sizes the compute buffer beyond the fields above (kvadvise.planner.memory.compute phases):
    n_ff_exp: int = 0  # {arch}.expert_feed_forward_length (0: n_ff, as llama.cpp's MoE llama models)
    n_ff_shexp: int = 0  # the shared experts' width: expert_shared_feed_forward_length or shared_count x n_ff_exp
    parallel_block: bool = False  # attention and FFN read the same input (command-r, cohere2): both outputs live
    # {arch}.attention.head_count_kv is in the header: where it is not (BERT-family files), llama.cpp takes
    # head_count and Ollama's estimate (fs/ggml/ggml.go HeadCountKVMin) takes 1
    head_count_kv_in_file: bool = True
    # of weights_bytes, a vision/audio tower inside the model's own file (an Ollama library blob's, from a built-in
    # profile): loaded with the model, never read to decode a text token
    tower_bytes: int = 0
    # an MLA model's per-head widths ({arch}.attention.key_length_mla, value_length_mla: qk_nope + qk_rope and
    # v_head_dim): what a build before the compressed MLA cache stored per head (kvadvise.planner.builds MLA_CACHE)
    n_embd_head_k_mla: int = 0
    n_embd_head_v_mla: int = 0
    # Gemma 3n/4's per-layer embeddings: {arch}.embedding_length_per_layer_input when per_layer_token_embd is
    # there (0: none); each token's per-layer inputs are [n_embd_per_layer, n_layer] f32 in the compute buffers
    n_embd_per_layer: int = 0
    # Gemma 3n's residual streams (altup): llama_hparams::n_altup, fixed at 4 for gemma3n, 0 for other models
    n_altup: int = 0
    ssm: SSMDims | None = None  # the recurrent mixer, for hybrid and recurrent models
    # The MTP/NextN blocks (blk.n_layer .. blk.n_layer_all-1), which llama.cpp loads only for a draft-mtp
    # context (llama_model_params.load_mtp, common/common.cpp common_model_params_to_llama, b11312): each
    # block's weights as stored and their CUDA padding, and how much the mapped span of the loaded tensors
    # grows when they load (the CPU_Mapped buffer covers [first offset, last end) of what is loaded)
    nextn_layer_bytes: tuple[int, ...] = ()
    nextn_layer_cuda_pad_bytes: tuple[int, ...] = ()
    nextn_span_bytes: int = 0
    nextn_layer_expert_bytes: tuple[int, ...] = ()  # each NextN block's routed experts (what --n-cpu-moe can move)
    # general.sampling.penalty_repeat: the repeat penalty llama.cpp's programs sample with unless a flag sets one
    # (common/common.cpp common_init_from_params reads the model's sampling keys); 1.0: none (also with a
    # penalty_last_n of 0: llama_sampler_penalties_apply then returns at once)
    sampling_penalty_repeat: float = 1.0
    # {arch}.pooling_type is in the GGUF: an embedding model, an encoder's or a decoder's (Qwen3-Embedding): Ollama
    # gives it no completion capability (server/images.go Capabilities) and, before 0.30, no flash attention
    pooling: bool = False

    @property
    def n_layer(self) -> int:
        """llama_hparams::n_layer(): the trunk, without MTP/NextN blocks."""
        return self.n_layer_all - self.n_layer_nextn

    def n_embd_k_gqa(self, il: int) -> int:
        head = self.n_embd_head_k_swa if self.swa_layers[il] else self.n_embd_head_k
        return head * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        head = self.n_embd_head_v_swa if self.swa_layers[il] else self.n_embd_head_v
        return head * self.n_head_kv[il]

    def n_embd_v_gqa_max(self) -> int:
        return max((self.n_embd_v_gqa(il) for il in range(self.n_layer_all)), default=0)

    @property
    def has_swa(self) -> bool:
        return self.swa_type != SWA_NONE and any(self.swa_layers)

    @property
    def has_recurrent(self) -> bool:
        return any(self.recurrent_layers)


def with_weights(spec: ModelSpec, weights_bytes: int, source: str | None = None) -> ModelSpec:
    """The same model with a known weights size (a config.json alone does not say); ``source`` is noted."""
    from dataclasses import replace

    notes = (*spec.notes, f"weights: {weights_bytes:,} B from {source}") if source else spec.notes
    return replace(spec, weights_bytes=weights_bytes, notes=notes)


_PER_LAYER = ("n_head", "n_head_kv", "swa_layers", "recurrent_layers", "kv_layers")  # one value per layer, always
_PER_LAYER_OR_NONE = (
    "layer_bytes",
    "layer_expert_bytes",
    "layer_expert_up_bytes",
    "layer_expert_gate_bytes",
    "layer_cuda_pad_bytes",
    "layer_largest_tensor_bytes",
)  # () when unknown
_MAX_COUNT = 2**31 - 1  # llama.cpp's hparams are uint32/int32: a count past this is no model's


def check_spec(spec: ModelSpec) -> str | None:
    """What is wrong with a ModelSpec made or changed by hand (the API takes one): a per-layer tuple of another
    length than the layers (an IndexError or a zip() ValueError in the planner: exit 1), a count that is not a
    whole number from 0 (a negative width planned as if it were a model), no layers; None when it holds.
    load_model's specs hold by construction (kvadvise.model.architecture refuses the file first)."""
    import dataclasses

    n = spec.n_layer_all
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 100_000:
        return f"n_layer_all is {n!r}, not a number of layers from 1"
    for f in dataclasses.fields(spec):
        v = getattr(spec, f.name)
        if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"{f.name} is {v!r:.40}, not a whole number from 0"
        if f.type == "int" and v > _MAX_COUNT and not f.name.endswith("_bytes") and f.name != "active_params":
            return f"{f.name} is {v:,}, past any model's (llama.cpp holds it in 32 bits)"
        if f.type == "str" and not isinstance(v, str):
            return f"{f.name} is {v!r:.40}, not a str"
    for name in (*_PER_LAYER, *_PER_LAYER_OR_NONE):
        v = getattr(spec, name)
        if not isinstance(v, tuple) or (len(v) != n and not (name in _PER_LAYER_OR_NONE and not v)):
            shown = f"{len(v)} values" if isinstance(v, tuple) else repr(v)[:40]
            return f"{name} has {shown} for {n} layers"
        flags = name in ("swa_layers", "recurrent_layers", "kv_layers")
        for x in v:
            if flags and not isinstance(x, bool):
                return f"{name} holds {x!r:.40}, not a bool"
            if not flags and (not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= MAX_SIZE_BYTES):
                return f"{name} holds {x!r:.40}, not a whole number from 0"
            if name in ("n_head", "n_head_kv") and x > _MAX_COUNT:
                return f"{name} holds {x:,}, past any model's (llama.cpp holds it in 32 bits)"
    if spec.n_layer_nextn > n:
        return f"n_layer_nextn {spec.n_layer_nextn} is more than n_layer_all {n}"
    # a block's routed experts (blk.N.ffn_*_exps) are among its own tensors, and all of them among the model's
    for il, e in enumerate(spec.layer_expert_bytes):
        if spec.layer_bytes and e > spec.layer_bytes[il]:
            return f"layer_expert_bytes[{il}] is {e:,}, more than the block's own weights ({spec.layer_bytes[il]:,})"
    if sum(spec.layer_expert_bytes) > spec.weights_bytes:
        return f"layer_expert_bytes add up to {sum(spec.layer_expert_bytes):,}, more than weights_bytes"
    return None
