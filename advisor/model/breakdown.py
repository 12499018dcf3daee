"""Where a model's weights are: parameters per part, from its config.json, and their size at a quant.

A GGUF lists its tensors; a model planned from a config.json (a built-in
profile, ``kvadvise hf`` without a file) does not. This counts the parameters
of each part with the shapes llama.cpp's loader gives the tensors
(``load_arch_tensors`` in ``src/models/<arch>.cpp``, llama.cpp 0c1e570), from the
GGUF keys convert_hf_to_gguf.py writes for the config
(:func:`kvadvise.model.hfconfig.gguf_metadata`):

- ``token_embd`` (n_vocab × n_embd), ``output`` (the same, or none when tied)
  and Gemma 3n/4's ``per_layer_token_embd`` (n_vocab × n_embd_per_layer × n_layer);
- per block: the token mixer (attention: q, k, v, o, with MLA's low-rank
  projections for DeepSeek-2/3 and the gated q of Qwen3-Next/3.5; or the
  recurrent mixer of the hybrid blocks: Mamba-2's ssm_in/conv1d/ssm_out,
  Gated DeltaNet's qkv/gate/conv1d/beta/alpha/ssm_out), the dense FFN (gate,
  up, down; up and down for ungated MLPs), shared experts and the router, and
  the routed experts (n_expert × the expert FFN);
- an encoder's (BERT, Nomic BERT: embedding models) token_types and position_embd, input-layer tables
  like token_embd, and no output tensor;
- the MTP/NextN blocks, which the file holds and llama.cpp does not load
  unless asked to (``mtp_flags = TENSOR_SKIP``).

Norms, biases, conv and SSM scalars are counted where they are per-channel
vectors of the mixer; the rest (< 0.1 %) is left out. Sizes at a quant use
llama.cpp's whole-file bits per weight (:mod:`kvadvise.model.quants`); MXFP4
builds keep only the experts at MXFP4 (4.25 bits) and the rest at BF16 (Ollama's
gpt-oss) unless told otherwise. When the real file size is known, the parts are
scaled to it, so their shares stay those of the config and the sum is exact.
Recurrent architectures other than Mamba-2 and Gated DeltaNet hybrids (RWKV,
LFM2's short convolutions) are not covered: None.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvadvise.errors import InputError
from kvadvise.model.gguf import GGUFArray, Value
from kvadvise.model.keys import LLM, SSM, ShortConv, Tokenizer, key
from kvadvise.model.spec import ModelSpec

# MXFP4: 32 4-bit values + one 8-bit scale per block (ggml-common.h block_mxfp4)
MXFP4_BPW = 4.25
_UNGATED = frozenset({"starcoder2", "starcoder", "gpt2", "falcon", "phi2", "nemotron_h", "nemotron_h_moe", "bert"})
# the encoders of embedding models (bert.cpp, nomic-bert.cpp load_arch_tensors): no output tensor; token_types
# {n_embd, n_token_types} and, for bert only (nomic-bert has RoPE), position_embd {n_embd, n_ctx_train} beside
# token_embd; per block qkv + attn_output (bert: with biases), attn_output_norm, ffn_up (+ ffn_gate for
# nomic-bert), ffn_down, layer_output_norm (weight and bias each)
_ENCODERS = frozenset({"bert", "nomic-bert"})
_BIASED = frozenset({"bert"})
# tie_word_embeddings when a config.json leaves it out: the transformers config class's default
_TIED_BY_DEFAULT = frozenset(
    {"gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "starcoder2", "command-r", "cohere2", "lfm2", "lfm2moe"}
)


def _tied(hp: Mapping[str, object], arch: str) -> bool:
    """Whether the output layer is token_embd: tie_word_embeddings, LFM2's own tie_embedding (transformers
    Lfm2Config reads it as such, True by default), else the config class's default."""
    for k in ("tie_word_embeddings", "tie_embedding"):
        if k in hp:
            return bool(hp[k])
    return arch in _TIED_BY_DEFAULT


# Gated DeltaNet hybrids (qwen3next.cpp, qwen35.cpp, qwen35moe.cpp) and Mamba-2 ones (mamba2.cpp,
# granite-hybrid.cpp, nemotron-h.cpp): the recurrent mixers whose tensors are counted
_DELTA_NET = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_MAMBA2 = frozenset({"mamba2", "granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1"})
_SHORT_CONV = frozenset({"lfm2", "lfm2moe"})  # lfm2.cpp: a short-convolution mixer where a block has no attention
# routed experts with biases (src/models/openai-moe.cpp load_arch_tensors: ffn_{gate,up,down}_exps.bias)
_EXPERT_BIASES = frozenset({"gpt-oss"})
# falcon-h1.cpp load_arch_tensors: every block holds a Mamba-2 mixer and an attention beside it
_MIXER_AND_ATTENTION = frozenset({"falcon-h1"})


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Parameters (or bytes, after :func:`sized`) of each part of a model."""

    tok_embd: int
    output: int  # 0: tied to tok_embd
    attn: tuple[int, ...]  # per block: the token mixer (attention, or a recurrent block's SSM / delta net)
    dense: tuple[int, ...]  # per block: dense FFN, shared experts, router (read for every token)
    experts: tuple[int, ...]  # per block: every routed expert
    n_expert: int
    n_expert_used: int
    tok_embd_per_layer: int = 0  # per_layer_token_embd (Gemma 3n/4): looked up per token, like tok_embd
    input_extra: int = 0  # an encoder's position_embd and token_types: input-layer tables, like tok_embd
    nextn: int = 0  # the MTP/NextN blocks: in the file, not loaded by llama.cpp unless asked for
    # of the above, the parameters in tensors whose rows are not a multiple of QK_K (a K-quant cannot hold
    # them: :func:`sized` gives them the 32-block type llama.cpp falls back to); token_embd and output alike
    tok_embd_odd: int = 0
    attn_odd: tuple[int, ...] = ()
    dense_odd: tuple[int, ...] = ()
    experts_odd: tuple[int, ...] = ()
    nextn_odd: int = 0
    # of those, the ffn_down ones (rows n_ff wide: llama_tensor_get_type gives ffn_down its own types, Q6_K in half
    # the layers of a Q4_K_M), per block; and the parameters in tensors whose rows are not even a multiple of 32,
    # which no 32-block type holds either (llama-quant.cpp tensor_type_fallback: F16)
    dense_down_odd: tuple[int, ...] = ()
    experts_down_odd: tuple[int, ...] = ()
    odd_32: int = 0
    # per block, the routed experts' biases (gpt-oss: {n_ff_exp or n_embd, n_expert} each), never quantized
    # (llama-quant.cpp quantizes *.weight tensors only): f32 in llama.cpp's conversion, BF16 in Ollama's
    experts_bias: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        """Everything the file holds (the MTP blocks included)."""
        return self.loaded + self.nextn

    @property
    def loaded(self) -> int:
        """What llama.cpp loads by default: the file less its MTP/NextN blocks."""
        parts = (self.tok_embd, self.output, self.tok_embd_per_layer, self.input_extra, sum(self.attn), sum(self.dense))
        return sum(parts) + sum(self.experts)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(a + d + e for a, d, e in zip(self.attn, self.dense, self.experts, strict=True))

    @property
    def active_experts(self) -> int:
        """The routed experts one token reads: n_expert_used of n_expert."""
        if not self.n_expert:
            return 0
        return sum(self.experts) * self.n_expert_used // self.n_expert

    @property
    def active(self) -> int:
        """What one token of decode reads, without the token embeddings (one row of each is looked up)."""
        return self.output + sum(self.attn) + sum(self.dense) + self.active_experts


def _hp(config: Mapping[str, object]) -> dict[str, object]:
    text = config.get("text_config")
    return {**config, **(text if isinstance(text, Mapping) else {})}


def _int(hp: Mapping[str, object], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = hp.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


class _Md:
    """The converted GGUF metadata, read as llama.cpp's loader reads it (get_key_or_arr)."""

    def __init__(self, md: Mapping[str, Value], arch: str, n: int) -> None:
        self.md, self.arch, self.n = md, arch, n

    def num(self, template: str, default: int = 0) -> int:
        v = self.md.get(key(template, self.arch))
        if isinstance(v, GGUFArray):
            return max((int(x) for x in v.values or () if isinstance(x, int)), default=default)
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    def per_layer(self, template: str, default: int = 0) -> tuple[int, ...]:
        v = self.md.get(key(template, self.arch))
        if isinstance(v, GGUFArray) and v.values is not None and len(v.values) == self.n:
            return tuple(int(x) if isinstance(x, int) else default for x in v.values)
        return (self.num(template, default),) * self.n


# convert_hf_to_gguf.py (ModelBase.prepare_tensors, "Some tensor types are always in float32") keeps
# position_embd and token_types in f32 whatever the output type; llama-quant.cpp leaves them too
F32_BYTES = 4

# llama.cpp's K-quants pack 256 values per block (QK_K); a tensor whose rows (ne[0]) are not a multiple
# of that falls back to a 32-block type (llama-quant.cpp tensor_type_fallback; Ollama's quantizer ports it)
QK_K = 256
QK_LEGACY = 32  # the 32-block types it falls back to (Q4_0 ... Q8_0, IQ4_NL): a row not a multiple of this is F16


class _Count:
    """Parameters of one part, and how many of them sit in tensors with rows not a multiple of QK_K."""

    __slots__ = ("down_odd", "n", "odd", "odd_32")

    def __init__(self) -> None:
        self.n = 0
        self.odd = 0
        self.down_odd = 0  # of ``odd``, in ffn_down tensors
        self.odd_32 = 0  # of ``odd``, in tensors whose rows are not a multiple of 32 either

    def mat(self, ne0: int, ne1: int, count: int = 1) -> _Count:
        """A weight of shape {ne0, ne1} (llama.cpp's create_tensor order: ne0 is the row length), ``count`` times."""
        n = ne0 * ne1 * count
        self.n += n
        if ne0 % QK_K:
            self.odd += n
        if ne0 % QK_LEGACY:
            self.odd_32 += n
        return self

    def down(self, ne0: int, ne1: int, count: int = 1) -> _Count:
        """An ffn_down weight {n_ff, n_embd}: counted as :meth:`mat`, and apart when its rows are odd."""
        self.mat(ne0, ne1, count)
        if ne0 % QK_K:
            self.down_odd += ne0 * ne1 * count
        return self

    def vec(self, n: int) -> _Count:
        """Vectors (norms, biases, SSM scalars): stored unquantized, counted at the quant's rate."""
        self.n += n
        return self


def _delta_net(c: _Count, m: _Md, e: int) -> None:
    """A Gated DeltaNet block (qwen35.cpp load_block_trunk, recurrent branch): head_k_dim = head_v_dim =
    ssm_d_state, n_k_heads = ssm_n_group, n_v_heads = ssm_dt_rank."""
    d_state, n_k, n_v, d_conv = (m.num(SSM.STATE_SIZE), m.num(SSM.GROUP_COUNT), m.num(SSM.TIME_STEP_RANK),
                                 m.num(SSM.CONV_KERNEL))  # fmt: skip
    key_dim, value_dim = d_state * n_k, d_state * n_v
    conv_dim = 2 * key_dim + value_dim
    c.mat(e, conv_dim)  # attn_qkv (qwen3next's legacy ssm_in holds it and the gate)
    c.mat(e, value_dim)  # attn_gate
    c.mat(e, n_v, 2)  # ssm_beta + ssm_alpha (qwen3next: ssm_beta_alpha {n_embd, 2 n_v})
    c.mat(value_dim, e)  # ssm_out
    c.vec(d_conv * conv_dim + 2 * n_v + d_state)  # ssm_conv1d, ssm_dt, ssm_a, ssm_norm


def _mamba2(c: _Count, m: _Md, e: int) -> None:
    """A Mamba-2 block (nemotron-h.cpp / mamba2.cpp): ssm_in {n_embd, 2·d_inner + 2·n_group·d_state + n_head},
    ssm_conv1d {d_conv, d_inner + 2·n_group·d_state}, ssm_dt/a/d {n_head}, ssm_norm {d_inner}, ssm_out."""
    d_inner, d_state, n_group, n_head, d_conv = (m.num(SSM.INNER_SIZE), m.num(SSM.STATE_SIZE),
        m.num(SSM.GROUP_COUNT), m.num(SSM.TIME_STEP_RANK), m.num(SSM.CONV_KERNEL))  # fmt: skip
    xbc = d_inner + 2 * n_group * d_state
    c.mat(e, 2 * d_inner + 2 * n_group * d_state + n_head)  # ssm_in
    c.mat(d_inner, e)  # ssm_out
    c.vec(d_conv * xbc + 3 * n_head + d_inner)


def _short_conv(c: _Count, m: _Md, e: int) -> None:
    """LFM2's short-convolution block (lfm2.cpp load_arch_tensors): shortconv.in_proj {n_embd, 3·n_embd},
    shortconv.out_proj {n_embd, n_embd}, shortconv.conv {L_cache, n_embd}."""
    c.mat(e, 3 * e).mat(e, e)
    c.vec(m.num(ShortConv.L_CACHE) * e)


def params(spec: ModelSpec, config: Mapping[str, object]) -> Breakdown | None:
    """Parameters of each part of ``spec`` (made from ``config``); None for recurrent blocks not covered."""
    from kvadvise.model.hfconfig import gguf_metadata

    try:
        md = gguf_metadata(config, source=spec.source)
    except InputError:
        return None
    return params_from_metadata(spec, md, config)


def params_from_metadata(
    spec: ModelSpec, metadata: Mapping[str, Value], config: Mapping[str, object] | None = None
) -> Breakdown | None:
    """The same count from GGUF metadata (what :func:`params` converts a config.json to, or a file's header);
    ``config`` adds what the keys do not say (tie_word_embeddings, MoE layer placement, Gemma 4's K = V)."""
    arch = spec.architecture
    if not spec.n_embd or (any(spec.recurrent_layers) and arch not in _DELTA_NET | _MAMBA2 | _SHORT_CONV):
        return None
    m = _Md(metadata, arch, spec.n_layer_all)
    hp = _hp(config or {})
    e = spec.n_embd
    tied = _tied(hp, arch)
    n_layer = spec.n_layer
    gated = arch not in _UNGATED
    n_expert, n_used = spec.n_expert, spec.n_expert_used
    n_ff = m.per_layer(LLM.FEED_FORWARD_LENGTH)
    expert_ff = m.num(LLM.EXPERT_FEED_FORWARD_LENGTH) or _int(hp, "moe_intermediate_size", "expert_intermediate_size")
    expert_ff = expert_ff or spec.n_ff_exp or spec.n_ff  # the spec's: llama.cpp's fallback by architecture
    dense_ff = _int(hp, "intermediate_size") or spec.n_ff
    shared_ff = m.num(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH) or _int(hp, "shared_expert_intermediate_size")
    if not shared_ff and _int(hp, "n_shared_experts") and arch != "nemotron_h_moe":
        shared_ff = _int(hp, "n_shared_experts") * expert_ff
    if arch == "llama4":  # llama4.cpp load_arch_tensors: n_ff_shexp = n_ff_exp
        shared_ff = expert_ff
    # ernie4-5.cpp load_arch_tensors: experts in every block from leading_dense_block_count on (moe_layer_start_index)
    first_dense = m.num(LLM.LEADING_DENSE_BLOCK_COUNT) or _int(hp, "first_k_dense_replace")
    # llama4.cpp: is_moe_layer = n_moe_layer_step > 0 && (il + 1) % n_moe_layer_step == 0 (interleave_moe_layer_step,
    # 2 in Maverick: the even blocks hold a dense FFN of feed_forward_length); Qwen-MoE configs' decoder_sparse_step
    step = m.num(LLM.INTERLEAVE_MOE_LAYER_STEP) if arch == "llama4" else _int(hp, "decoder_sparse_step", default=1) or 1
    mlp_only = hp.get("mlp_only_layers")
    dense_only = set(mlp_only) if isinstance(mlp_only, list) else set()
    per_layer_embd = m.num(LLM.EMBEDDING_LENGTH_PER_LAYER)
    k_eq_v = bool(hp.get("attention_k_eq_v"))  # Gemma 4 26B/31B: full-attention layers have no attn_v

    def ffn(c: _Count, f: int, n: int = 1) -> None:
        """gate, up {n_embd, f} and down {f, n_embd} (no gate for the ungated MLPs), ``n`` times (experts)."""
        c.mat(e, f, n * (2 if gated else 1))
        c.down(f, e, n)

    def attention(c: _Count, il: int) -> None:
        if spec.is_mla:
            n_head = spec.n_head[il]
            q_lora = _int(hp, "q_lora_rank")
            kv_lora = _int(hp, "kv_lora_rank")
            rope = _int(hp, "qk_rope_head_dim")
            nope = _int(hp, "qk_nope_head_dim")
            v_head = _int(hp, "v_head_dim")
            qk = nope + rope
            if q_lora:
                c.mat(e, q_lora).mat(q_lora, n_head * qk)
            else:
                c.mat(e, n_head * qk)
            c.mat(e, kv_lora + rope).mat(kv_lora, n_head * (nope + v_head)).mat(n_head * v_head, e)
            return
        swa = spec.swa_layers[il]
        hk = spec.n_embd_head_k_swa if swa else spec.n_embd_head_k
        hv = spec.n_embd_head_v_swa if swa else spec.n_embd_head_v
        nh, nkv = spec.n_head[il], spec.n_head_kv[il]
        c.mat(e, nh * hk * (2 if arch in _DELTA_NET else 1))  # qwen35.cpp: wq {n_embd, n_embd_head_k·n_head·2}
        c.mat(e, nkv * hk)
        if not (k_eq_v and not swa):
            c.mat(e, nkv * hv)
        c.mat(nh * hv, e)
        if arch in _ENCODERS:  # attn_output_norm (weight, bias); bert: q, k, v and attn_output biases
            c.vec(2 * e + ((nh * hk + nkv * (hk + hv) + e) if arch in _BIASED else 0))

    def block_ffn(il: int, dense: _Count, experts: _Count) -> None:
        """The FFN of block ``il``: dense FFN, shared experts and router into ``dense``; routed ``experts``."""
        if arch in ("nemotron_h", "nemotron_h_moe"):  # nemotron-h.cpp: an MLP/MoE block when n_ff(il) > 0
            if n_ff[il] and n_expert:
                dense.mat(e, n_expert)
                ffn(dense, shared_ff)
                ffn(experts, expert_ff, n_expert)
            elif n_ff[il]:
                ffn(dense, n_ff[il])
            return
        if arch == "gemma4":  # gemma4.cpp: a dense FFN in every block, experts beside it in the MoE model
            ffn(dense, n_ff[il])
            if n_expert:
                dense.mat(e, n_expert)
                ffn(experts, expert_ff, n_expert)
            return
        if bool(n_expert) and il >= first_dense and il not in dense_only and step > 0 and (il + 1) % step == 0:
            dense.mat(e, n_expert)  # the router
            if shared_ff:
                ffn(dense, shared_ff)
                if arch in ("qwen3next", "qwen35moe", "qwen2moe"):
                    dense.vec(e)  # ffn_gate_inp_shexp
            ffn(experts, expert_ff, n_expert)
            return
        # llama4: intermediate_size_mlp; lfm2: the adjusted block_ff_dim
        ffn(dense, n_ff[il] if arch in ("qwen35", "llama4", "lfm2", "lfm2moe") else dense_ff)
        if arch in _ENCODERS:  # layer_output_norm (weight, bias); bert: ffn_up and ffn_down biases
            dense.vec(2 * e + ((dense_ff + e) if arch in _BIASED else 0))

    attn: list[_Count] = []
    dense: list[_Count] = []
    experts: list[_Count] = []
    experts_bias: list[int] = []
    for il in range(n_layer):
        a, d, x = _Count(), _Count(), _Count()
        if spec.recurrent_layers[il]:
            (_delta_net if arch in _DELTA_NET else _short_conv if arch in _SHORT_CONV else _mamba2)(a, m, e)
            if arch in _MIXER_AND_ATTENTION:
                attention(a, il)
        elif not (arch in _MAMBA2 and not spec.n_head_kv[il]):  # Nemotron-H's MLP/MoE blocks have no attention
            attention(a, il)
        block_ffn(il, d, x)
        if arch in _EXPERT_BIASES and x.n:  # openai-moe: ffn_gate_exps, ffn_up_exps and ffn_down_exps biases
            experts_bias.append(n_expert * (2 * expert_ff + e))
        else:
            experts_bias.append(0)
        if per_layer_embd:  # gemma4.cpp: per_layer_inp_gate {n_embd, n_pl}, per_layer_proj {n_pl, n_embd}
            d.mat(e, per_layer_embd).mat(per_layer_embd, e)
        attn.append(a)
        dense.append(d)
        experts.append(x)
    if per_layer_embd and dense:  # per_layer_model_proj {n_embd, n_pl·n_layer}: once per token, like a block's
        dense[0].mat(e, per_layer_embd * n_layer)
    nextn = _Count()
    for il in range(
        n_layer, spec.n_layer_all
    ):  # glm4-moe.cpp, qwen35.cpp...: a full block + eh_proj {2·n_embd, n_embd}
        attention(nextn, il)
        block_ffn(il, nextn, nextn)
        nextn.mat(2 * e, e)
    embd_odd = spec.n_vocab * e if e % QK_K else 0
    input_extra = 0
    if arch in _ENCODERS:
        tied = True  # no output tensor at all (and no copy of token_embd for one: kvadvise.planner.memory)
        n_types = metadata.get(Tokenizer.TOKEN_TYPE_COUNT)
        input_extra = e * (n_types if isinstance(n_types, int) and not isinstance(n_types, bool) else 0)
        if arch == "bert":
            input_extra += e * spec.n_ctx_train  # position_embd {n_embd, n_ctx_train}
    return Breakdown(
        tok_embd=spec.n_vocab * e,
        output=0 if tied else spec.n_vocab * e,
        input_extra=input_extra,
        attn=tuple(c.n for c in attn),
        dense=tuple(c.n for c in dense),
        experts=tuple(c.n for c in experts),
        n_expert=n_expert,
        n_expert_used=n_used,
        tok_embd_per_layer=spec.n_vocab * per_layer_embd * n_layer,
        nextn=nextn.n,
        tok_embd_odd=embd_odd,
        attn_odd=tuple(c.odd for c in attn),
        dense_odd=tuple(c.odd for c in dense),
        experts_odd=tuple(c.odd for c in experts),
        nextn_odd=nextn.odd,
        dense_down_odd=tuple(c.down_odd for c in dense),
        experts_down_odd=tuple(c.down_odd for c in experts),
        odd_32=sum(c.odd_32 for c in (*attn, *dense, *experts, nextn))
        + (embd_odd * (1 if tied else 2) if e % QK_LEGACY else 0),
        experts_bias=tuple(experts_bias) if any(experts_bias) else (),
    )


def vision_params(config: Mapping[str, object]) -> int | None:
    """Parameters of the vision tower a config.json's ``vision_config`` describes, for the towers Ollama's
    library blobs embed whole (Qwen3.5/3.6, Gemma 4); None for others. Counted per block: attention (q, k,
    v, o: 4·h²), the MLP (Qwen's fc1/fc2: 2·h·i; Gemma 4's gated: 3·h·i), plus the patch and position
    embeddings and the projector into the text model (Qwen's 2×2 merger, Gemma 4's embed_vision)."""
    vc = config.get("vision_config")
    text = _hp(config)
    if not isinstance(vc, Mapping):
        return None
    kind = str(vc.get("model_type", ""))
    h, i = _int(vc, "hidden_size"), _int(vc, "intermediate_size")
    depth = _int(vc, "depth", "num_hidden_layers")
    patch = _int(vc, "patch_size", default=16)
    if not (h and i and depth):
        return None
    if kind.startswith("qwen3_5"):
        merge = _int(vc, "spatial_merge_size", default=2) ** 2 * h
        embed = _int(vc, "in_channels", default=3) * _int(vc, "temporal_patch_size", default=2) * patch * patch * h
        merger = merge * merge + merge * _int(vc, "out_hidden_size")
        return depth * (4 * h * h + 2 * h * i) + embed + _int(vc, "num_position_embeddings") * h + merger
    if kind.startswith("gemma4"):
        embed = 3 * patch * patch * h + 2 * _int(vc, "position_embedding_size") * h
        return depth * (4 * h * h + 3 * h * i) + embed + h * _int(text, "hidden_size")
    return None


def bits_per_weight(quant: str) -> tuple[float, float]:
    """(bits per weight of the routed experts, of everything else) at a GGUF quant (Ollama's names)."""
    from kvadvise.model.quants import quant_bpw

    q = quant.strip().upper()
    if q in ("MXFP4", "MXFP4_MOE"):
        return MXFP4_BPW, 16.0  # Ollama's gpt-oss: experts MXFP4, attention/embeddings/router BF16
    _, bpw = quant_bpw(q)
    return bpw, bpw


# ggml's block sizes in bits per weight (ggml-common.h): the K types and the 32-block types a tensor with
# rows not a multiple of QK_K falls back to (llama-quant.cpp tensor_type_fallback)
_K_BPW = {"Q2_K": 2.625, "Q3_K": 3.4375, "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625}
_FALLBACK_BPW = {"Q2_K": 4.5, "Q3_K": 4.5, "Q4_K": 5.5, "Q5_K": 6.0, "Q6_K": 8.5}  # Q4_0, Q4_0, Q5_0, Q5_1, Q8_0
# the two K types each mix is made of (llama-quant.cpp llama_tensor_get_type: most tensors at the first,
# some attn_v/ffn_down/output at the second)
_K_MIX = {
    "Q2_K": ("Q2_K", "Q4_K"), "Q2_K_S": ("Q2_K", "Q4_K"), "Q3_K_S": ("Q3_K", "Q3_K"),
    "Q3_K_M": ("Q3_K", "Q5_K"), "Q3_K_L": ("Q3_K", "Q5_K"), "Q4_K_S": ("Q4_K", "Q5_K"),
    "Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_S": ("Q5_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K"), "Q6_K": ("Q6_K", "Q6_K"),
}  # fmt: skip


# K mixes whose token_embd and output types llama_tensor_get_type fixes (llama-quant.cpp, 0c1e570): the token
# embeddings keep the ftype's default type (TOKEN_EMBD has no rule for these ftypes), output.weight becomes Q6_K
_EMBD_BASE = {"Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K"}


def _embedding_types(quant: str) -> tuple[float, float] | None:
    """(bits per weight of token_embd, of output.weight) in a file of this K mix (untied); None for others."""
    base = _EMBD_BASE.get(quant.strip().upper())
    return None if base is None else (_K_BPW[base], _K_BPW["Q6_K"])


# the i-quants' 256-block types fall back to IQ4_NL (32 values per block, 4.5 bits per weight; llama-quant.cpp
# tensor_type_fallback), so a file of those types holds its odd-rowed tensors at no less than that
_IQ_FALLBACK_BPW = 4.5
_IQ_FILE_TYPES = frozenset(
    {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_XS"}
)


def fallback_bits_per_weight(quant: str) -> float:
    """Bits per weight of ``quant``'s mix in tensors whose rows are not a multiple of QK_K: each K type of the
    mix replaced by its 32-block fallback, in the same shares; an i-quant's at least IQ4_NL's (the whole-file rate
    for other quants: the 32-block types need no fallback)."""
    _, bpw = bits_per_weight(quant)
    q = quant.strip().upper()
    if q in _IQ_FILE_TYPES:
        return max(bpw, _IQ_FALLBACK_BPW)
    mix = _K_MIX.get(q)
    if mix is None:
        return bpw
    lo, hi = _K_BPW[mix[0]], _K_BPW[mix[1]]
    f_hi = min(1.0, max(0.0, (bpw - lo) / (hi - lo))) if hi > lo else 0.0
    return bpw + (1 - f_hi) * (_FALLBACK_BPW[mix[0]] - lo) + f_hi * (_FALLBACK_BPW[mix[1]] - hi)


# the 32-block types: no fallback for a row a multiple of 32 (tensor_type_fallback's default branch)
_LEGACY_FILE_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"})
_Q8_0_BPW = 8.5
_F16_BPW = 16.0


def _use_more_bits(il: int, n: int) -> bool:
    """llama-quant.cpp use_more_bits: the first and last eighth of the layers and every third between."""
    return il < n // 8 or il >= 7 * n // 8 or (il - n // 8) % 3 == 2


def _down_type(q: str, il: int, n: int) -> str | None:
    """The K type llama_tensor_get_type_impl's FFN_DOWN rules give ffn_down of layer ``il`` of ``n`` in a ``q`` file
    (non-Falcon, no imatrix); None: the mix's base type."""
    return {
        "Q2_K": "Q3_K",
        "Q2_K_S": "Q4_K" if il < n // 8 else None,
        "Q3_K_M": "Q5_K" if il < n // 16 else "Q4_K",
        "Q3_K_L": "Q5_K",
        "Q4_K_M": "Q6_K" if _use_more_bits(il, n) else None,
        "Q5_K_M": "Q6_K" if _use_more_bits(il, n) else None,
        "Q4_K_S": "Q5_K" if il < n // 8 else None,
    }.get(q)


def _surplus_bpw(k: str) -> float:
    """What a K type's fallback adds per weight (Q4_K -> Q5_0: 1.0; Q6_K -> Q8_0: 1.9375)."""
    return _FALLBACK_BPW[k] - _K_BPW[k]


def fallback_surplus_bytes(bd: Breakdown, quant: str) -> int:
    """What the tensors whose rows are not a multiple of QK_K add to a ``quant`` file beyond its rate: llama.cpp's
    quantizer gives each a 32-block type in place of the one llama_tensor_get_type_impl chose (llama-quant.cpp
    0c1e570 tensor_type_fallback: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, the i-quants ->
    IQ4_NL), and the file is larger by the two types' difference (the rate already holds the chosen types): the
    mix's base type for most tensors, ffn_down's own (Q6_K in the use_more_bits layers of a Q4_K_M or Q5_K_M, Q3_K
    in a Q2_K...), output.weight's Q6_K (token_embd's too when tied) -> Q8_0 (its rule: ``nx % qk_k != 0``; Q5_K
    -> Q8_0 in the 1-2-bit i-quants), in every quantized file; a row not a multiple of 32 either is F16.
    Nemotron-3-Nano-30B-A3B (n_embd 2688, expert rows 1856) holds almost nothing else: its Q4_K_M is 22.5 GiB, not
    the 18.0 of 4.9 bits per weight (Ollama's nemotron-3-nano:30b blob: 22.35 GiB). 0 for a float file and an MXFP4
    one (llama.cpp's MXFP4_MOE types are not this rule's)."""
    q = quant.strip().upper()
    if q not in _K_MIX and q not in _IQ_FILE_TYPES and q not in _LEGACY_FILE_TYPES:
        return 0
    _, bpw = bits_per_weight(q)
    iq_low = q in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M")  # output Q5_K, not Q6_K
    out_bits = 0.0 if q == "Q8_0" else _Q8_0_BPW - _K_BPW["Q5_K"] if iq_low else _surplus_bpw("Q6_K")
    # output.weight's rows are n_embd wide, as token_embd's; tied, token_embd is quantized as the output is
    bits = bd.tok_embd_odd * out_bits * (2 if bd.output else 1)
    if q in _LEGACY_FILE_TYPES:
        base_bits = 0.0
    else:
        # a K mix's base type (_K_MIX's first: the ftype's default type, llama_tensor_get_type_impl), what
        # token_embd and every odd-rowed tensor without a rule of its own falls back from
        base_bits = _surplus_bpw(_K_MIX[q][0]) if q in _K_MIX else max(0.0, _IQ_FALLBACK_BPW - bpw)
    if bd.output:  # untied: token_embd keeps the mix's base type (TOKEN_EMBD's rules name none for these mixes)
        bits += bd.tok_embd_odd * (base_bits - out_bits)
    n = len(bd.attn)
    downs = tuple(a + b for a, b in zip(bd.dense_down_odd or (0,) * n, bd.experts_down_odd or (0,) * n, strict=True))
    for il, (a, d, x) in enumerate(
        zip(bd.attn_odd or (0,) * n, bd.dense_odd or (0,) * n, bd.experts_odd or (0,) * n, strict=True)
    ):
        k = _down_type(q, il, n)
        bits += (a + d + x - downs[il]) * base_bits + downs[il] * (base_bits if k is None else _surplus_bpw(k))
    bits += bd.nextn_odd * base_bits
    bits += bd.odd_32 * (_F16_BPW - bpw - base_bits)  # F16, not the fallback counted above
    return max(0, math.ceil(bits / 8))


def sized(
    bd: Breakdown,
    quant: str,
    total_bytes: int | None = None,
    *,
    per_layer_embd_bpw: float | None = None,
    expert_bpw: float | None = None,
    quantizer_embeddings: bool = False,
    bias_bytes: int = F32_BYTES,
) -> Breakdown:
    """Bytes of each part at ``quant``; scaled so that they sum to ``total_bytes`` when that is known.

    Tensors whose rows are not a multiple of QK_K are counted at the fallback rate
    (:func:`fallback_bits_per_weight`). ``per_layer_embd_bpw``: the bits of ``per_layer_token_embd`` when
    the file keeps it apart from the quant (Ollama's quantizer leaves it at its 16-bit source type); it is
    then not scaled. ``expert_bpw``: the routed experts' bits when a quantizer gives them their own types.
    ``quantizer_embeddings``: the file was made by llama.cpp's quantizer rules (an Ollama library blob), so
    token_embd and output take that quantizer's types exactly (:func:`_embedding_types`); a third-party
    file of the same quant name may choose its own (unsloth's dynamic quants do). ``bias_bytes``: the width of the
    routed experts' biases (Breakdown.experts_bias): f32 as llama.cpp converts them, 2 in Ollama's own gpt-oss
    conversion (convert/convert_gptoss.go keeps a 2-D tensor at its BF16 source type: ollama#11982's gpt-oss:120b
    "memory.weights.repeating" 58.6 GiB, 58.5 without them, 58.7 at f32)."""
    exp_bpw, bpw = bits_per_weight(quant)
    if expert_bpw is not None:
        exp_bpw = expert_bpw
    odd_bpw = fallback_bits_per_weight(quant)

    def b(n: int, odd: int, bits: float) -> float:
        return ((n - odd) * bits + odd * (odd_bpw if bits == bpw else bits)) / 8

    def per_block(ns: tuple[int, ...], odds: tuple[int, ...], bits: float) -> list[float]:
        return [b(n, odd, bits) for n, odd in zip(ns, odds or (0,) * len(ns), strict=True)]

    ple = b(bd.tok_embd_per_layer, 0, bpw if per_layer_embd_bpw is None else per_layer_embd_bpw)
    extra = bd.input_extra * F32_BYTES  # always f32 in the file: not scaled with the quant
    tok = b(bd.tok_embd, bd.tok_embd_odd, bpw)
    out = b(bd.output, bd.tok_embd_odd if bd.output else 0, bpw)
    attn = per_block(bd.attn, bd.attn_odd, bpw)
    dense = per_block(bd.dense, bd.dense_odd, bpw)
    experts = per_block(bd.experts, bd.experts_odd, exp_bpw)
    biases = [bias_bytes * n for n in bd.experts_bias] or [0] * len(experts)
    nextn = b(bd.nextn, bd.nextn_odd, bpw)
    fixed = (ple if per_layer_embd_bpw is not None else 0.0) + extra + sum(biases)
    embd_types = _embedding_types(quant) if quantizer_embeddings and not bd.tok_embd_odd else None
    if embd_types is not None:
        # the embeddings at the types the quantizer gives them, not the file's average (llama.cpp 0c1e570
        # src/llama-quant.cpp llama_tensor_get_type: output.weight -> Q6_K; token_embd keeps the mix's base
        # type, Q4_K for Q4_K_M, or the output's Q6_K when tied): exact, not scaled, so the CPU-resident
        # token_embd and the GPU's output layer are what the file holds and only the blocks take the rest
        tok_bits, out_bits = embd_types if bd.output else (embd_types[1], embd_types[1])
        tok = b(bd.tok_embd, 0, tok_bits)
        out = b(bd.output, 0, out_bits)
        fixed += tok + out
    est = tok + out + extra + sum(attn) + sum(dense) + sum(experts) + sum(biases) + nextn + ple - fixed
    k = max(0.0, total_bytes - fixed) / est if total_bytes and est else 1.0
    ke = k
    kp = 1.0 if per_layer_embd_bpw is not None else k
    if exp_bpw == MXFP4_BPW and exp_bpw != bpw and total_bytes and est:
        # MXFP4 experts are MXFP4 in every build; what else the file holds (BF16, Q8_0) takes the rest
        rest = est - sum(experts)
        k = max(0.0, total_bytes - fixed - sum(experts)) / rest if rest else 1.0
        ke = 1.0
    return Breakdown(
        tok_embd=round(tok * (1.0 if embd_types is not None else k)),
        output=round(out * (1.0 if embd_types is not None else k)),
        attn=tuple(round(x * k) for x in attn),
        dense=tuple(round(x * k) for x in dense),
        experts=tuple(round(x * ke + f) for x, f in zip(experts, biases, strict=True)),
        n_expert=bd.n_expert,
        n_expert_used=bd.n_expert_used,
        tok_embd_per_layer=round(ple * kp),
        input_extra=round(extra),
        nextn=round(nextn * k),
    )


def with_parts(
    spec: ModelSpec,
    config: Mapping[str, object],
    quant: str,
    projector_bytes: int = 0,
    *,
    sizes: Breakdown | None = None,
    expert_bpw: float | None = None,
) -> ModelSpec:
    """``spec`` with the sizes of its parts (embeddings, output, blocks, experts) counted from the config at
    ``quant`` and scaled to its weights (less a projector); unchanged when the config cannot be counted.
    ``sizes``: the parts in bytes when the caller has them (a profile, with Ollama's own quant choices).
    Every spec made from a config.json goes through this (a built-in profile, ``kvadvise hf``), so the
    routed experts, the layer split over several GPUs and partial offload are planned as for a GGUF, whose
    header lists the same parts."""
    bd = params(spec, config)
    if sizes is None:
        if bd is None or not spec.weights_bytes:
            return spec
        sizes = sized(bd, quant, max(1, spec.weights_bytes - projector_bytes), expert_bpw=expert_bpw)
    b = sizes
    layers = b.layers + (0,) * spec.n_layer_nextn
    # the largest tensor of each block, for op offload's copy (kvadvise.planner.offload): a merged
    # expert tensor (ffn_{gate,up,down}_exps: a third of the experts), else one of the FFN's matrices,
    # else q or o (about half the attention); an estimate from the config's shapes
    largest = tuple(max(x // 3, d // 3, a // 2) for a, d, x in zip(b.attn, b.dense, b.experts, strict=True))
    # per_layer_token_embd is an input tensor like token_embd (llama-arch.cpp: LLM_TENSOR_LAYER_INPUT, so on
    # the CPU: ModelSpec.input_extra_bytes); a tied output layer is a copy of token_embd alone (gemma4.cpp:
    # TENSOR_DUPLICATED), which kvadvise.planner.memory adds to the output layer's device as for any tied model
    # the output matmul reads token_embd when they are tied (llama.cpp duplicates it as the output layer)
    # (an encoder has no output layer: nothing reads token_embd but its lookup)
    tied_read = bool(bd is not None and not bd.output and spec.architecture not in _ENCODERS)
    ungated = spec.architecture in _UNGATED
    experts = (*b.experts, *(0,) * spec.n_layer_nextn)
    active = spec.active_params if bd is None else bd.active + (bd.tok_embd if tied_read else 0)
    return dataclasses.replace(
        spec,
        tok_embd_bytes=b.tok_embd,
        input_extra_bytes=b.tok_embd_per_layer + b.input_extra,
        output_bytes=b.output,
        expert_bytes=sum(b.experts),
        layer_bytes=layers,
        layer_expert_bytes=experts if any(b.experts) else (),
        # ffn_up_exps and ffn_gate_exps: a third of a block's experts each ({n_embd, n_ff_exp, n_expert}, as down),
        # half and none for ungated experts (up and down only: nemotron-h.cpp)
        layer_expert_up_bytes=tuple(x // (2 if ungated else 3) for x in experts) if any(b.experts) else (),
        layer_expert_gate_bytes=tuple(0 if ungated else x // 3 for x in experts) if any(b.experts) else (),
        layer_largest_tensor_bytes=largest + (0,) * spec.n_layer_nextn,
        active_params=active,
    )


# ggml-common.h block sizes: bytes per 256 weights of the K types a K-mix file is made of
_K_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# llama-quant.cpp llama_tensor_get_type (0c1e570): the K mixes whose every tensor type is known for a plain dense
# transformer, (the base type, the type of attn_v and ffn_down where use_more_bits)
_K_MIX_EXACT = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
# the dense architectures whose tensors are q, k, v, o, gate, up, down and two norms a block (qwen2: q/k/v biases);
# none of llama_tensor_get_type's per-architecture exceptions (falcon, fused QKV, experts). Not qwen3: Ollama's untied
# qwen3 blobs hold 0.2-0.3 GB more than this recipe (qwen3:8b 5,225,374,496 B, the recipe 5,021,827,072)
_K_MIX_ARCHS = frozenset({"llama", "qwen2"})


def k_mix_sizes(spec: ModelSpec, config: Mapping[str, object], quant: str) -> tuple[Breakdown, int] | None:
    """The parts of a plain dense transformer's llama.cpp K-mix file (Q4_K_M, Q5_K_M) in bytes, every tensor at the
    type llama_tensor_get_type gives it (llama-quant.cpp, 0c1e570), and the output layer's f32 vectors beside them
    (output_norm, llama 3's rope_freqs): the file's tensors exactly, not a download size spread over them (a library
    blob's size holds the GGUF header too: llama3.1:8b's 7,840,640 B of tokenizer). None where a rule is not followed
    here (another architecture or quant, experts, rows that are not whole 256-blocks).

    - attn_v and ffn_down: the mix's high type where use_more_bits(i, n) (the first eighth, the last eighth and every
      third between); the others the base type; a 70B-class (80-block) llama or qwen2 takes Q5_K for a Q4_K attn_v;
    - token_embd the base type (the output's Q6_K when tied: it is the output), output.weight Q6_K;
    - norms and biases f32.
    Checked against published loads: llama3.1:8b 4,617,396,224 B less token_embd as Ollama 0.18.2 required it,
    llama3.2:3b 1918.35 MiB on the GPU as Ollama 0.32.15's llm/llama_server.go quotes it."""
    mix = _K_MIX_EXACT.get(quant.strip().upper())
    arch = spec.architecture
    if mix is None or arch not in _K_MIX_ARCHS or spec.n_expert or any(spec.recurrent_layers) or spec.n_layer_nextn:
        return None
    hp = _hp(config)
    e, n_layer, hd = spec.n_embd, spec.n_layer, spec.n_embd_head_k
    n_ff = spec.n_ff
    if len(set(spec.n_head)) != 1 or len(set(spec.n_head_kv)) != 1 or spec.n_embd_head_v != hd or not n_ff:
        return None
    q_dim, kv_dim = spec.n_head[0] * hd, spec.n_head_kv[0] * hd
    if any(n % QK_K for n in (e, q_dim, n_ff)):
        return None  # a row the K types cannot hold: llama-quant.cpp's fallback types, not followed here
    base, high = (_K_BLOCK_BYTES[t] for t in mix)

    def mat(ne0: int, ne1: int, per_block: int) -> int:
        return ne0 * ne1 // QK_K * per_block

    def use_more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    v_low = _K_BLOCK_BYTES["Q5_K"] if mix[0] == "Q4_K" and n_layer == 80 and arch in ("llama", "qwen2") else base
    attn, dense = [], []
    for il in range(n_layer):
        more = use_more_bits(il, n_layer)
        a = mat(e, q_dim, base) + mat(e, kv_dim, base) + mat(e, kv_dim, high if more else v_low) + mat(q_dim, e, base)
        a += F32_BYTES * e  # attn_norm
        if arch == "qwen2":
            a += F32_BYTES * (q_dim + 2 * kv_dim)  # q, k and v biases
        attn.append(a)
        dense.append(2 * mat(e, n_ff, base) + mat(n_ff, e, high if more else base) + F32_BYTES * e)  # + ffn_norm
    tied = _tied(hp, arch)
    q6 = _K_BLOCK_BYTES["Q6_K"]
    tok = mat(e, spec.n_vocab, q6 if tied else base)
    out = 0 if tied else mat(e, spec.n_vocab, q6)
    rope = hp.get("rope_scaling")
    rope_freqs = hd // 2 * F32_BYTES if isinstance(rope, Mapping) and rope.get("rope_type") == "llama3" else 0
    sizes = Breakdown(tok_embd=tok, output=out, attn=tuple(attn), dense=tuple(dense), experts=(0,) * n_layer,
                      n_expert=0, n_expert_used=0)  # fmt: skip
    return sizes, F32_BYTES * e + rope_freqs  # output_norm, rope_freqs: in the output layer
