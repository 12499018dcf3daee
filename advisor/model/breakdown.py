"""Where a model's weights are: parameters per part, from its config.json, and their size at a quant.

A GGUF lists its tensors; a model planned from a config.json (a built-in
profile, ``kvadvise hf`` without a file) does not. This counts the parameters
of each part the way convert_hf_to_gguf.py lays them out (llama.cpp 0c1e570):

- ``token_embd`` (n_vocab × n_embd) and ``output`` (the same, or none when tied);
- per block: attention (q, k, v, o; MLA's low-rank projections for
  DeepSeek-2/3), the dense FFN (gate, up, down; up and down for the
  ungated MLPs of StarCoder2 and GPT-BigCode), shared experts and the router,
  and the routed experts (n_expert × the expert FFN).

Norms and biases (< 0.1 %) are left out. Sizes at a quant use llama.cpp's
whole-file bits per weight (:mod:`kvadvise.model.quants`); MXFP4 builds keep
only the experts at MXFP4 (4.25 bits) and the rest at BF16 (Ollama's
gpt-oss) unless told otherwise. When the real file size is known, the parts are
scaled to it, so their shares stay those of the config and the sum is exact.
Recurrent and hybrid layers (Mamba, gated delta-net) are not covered: None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from kvadvise.model.spec import ModelSpec

# MXFP4: 32 4-bit values + one 8-bit scale per block (ggml-common.h block_mxfp4)
MXFP4_BPW = 4.25
_UNGATED = frozenset({"starcoder2", "starcoder", "gpt2", "falcon", "phi2"})
# tie_word_embeddings when a config.json leaves it out: the transformers config class's default
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "starcoder2", "command-r", "cohere2"})


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Parameters (or bytes, after :func:`sized`) of each part of a model."""

    tok_embd: int
    output: int  # 0: tied to tok_embd
    attn: tuple[int, ...]  # per block
    dense: tuple[int, ...]  # per block: dense FFN, shared experts, router (read for every token)
    experts: tuple[int, ...]  # per block: every routed expert
    n_expert: int
    n_expert_used: int

    @property
    def total(self) -> int:
        return self.tok_embd + self.output + sum(self.attn) + sum(self.dense) + sum(self.experts)

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
        """What one token of decode reads, without the token embedding (one row of it is looked up)."""
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


def params(spec: ModelSpec, config: Mapping[str, object]) -> Breakdown | None:
    """Parameters of each part of ``spec`` (made from ``config``); None for recurrent or hybrid models."""
    if any(spec.recurrent_layers) or not spec.n_embd:
        return None
    hp = _hp(config)
    e = spec.n_embd
    tied = bool(hp.get("tie_word_embeddings", spec.architecture in _TIED_BY_DEFAULT))
    tok = spec.n_vocab * e
    n_layer = spec.n_layer_all - spec.n_layer_nextn
    gated = 2 if spec.architecture in _UNGATED else 3
    n_expert, n_used = spec.n_expert, spec.n_expert_used
    expert_ff = _int(hp, "moe_intermediate_size", "expert_intermediate_size") or spec.n_ff
    dense_ff = _int(hp, "intermediate_size") or spec.n_ff
    shared_ff = _int(hp, "shared_expert_intermediate_size")
    if not shared_ff and _int(hp, "n_shared_experts"):
        shared_ff = _int(hp, "n_shared_experts") * expert_ff
    first_dense = _int(hp, "first_k_dense_replace")
    step = _int(hp, "decoder_sparse_step", default=1) or 1
    mlp_only = hp.get("mlp_only_layers")
    dense_only = set(mlp_only) if isinstance(mlp_only, list) else set()
    attn, dense, experts = [], [], []
    for il in range(n_layer):
        if spec.is_mla:
            n_head = spec.n_head[il]
            q_lora = _int(hp, "q_lora_rank")
            kv_lora = _int(hp, "kv_lora_rank")
            rope = _int(hp, "qk_rope_head_dim")
            nope = _int(hp, "qk_nope_head_dim")
            v_head = _int(hp, "v_head_dim")
            qk = nope + rope
            q = e * q_lora + q_lora * n_head * qk if q_lora else e * n_head * qk
            attn.append(q + e * (kv_lora + rope) + kv_lora * n_head * (nope + v_head) + n_head * v_head * e)
        else:
            swa = spec.swa_layers[il]
            hk = spec.n_embd_head_k_swa if swa else spec.n_embd_head_k
            hv = spec.n_embd_head_v_swa if swa else spec.n_embd_head_v
            nh, nkv = spec.n_head[il], spec.n_head_kv[il]
            attn.append(e * (nh * hk + nkv * (hk + hv)) + nh * hv * e)
        moe = bool(n_expert) and il >= first_dense and il not in dense_only and (il + 1) % step == 0
        if moe:
            experts.append(n_expert * gated * e * expert_ff)
            dense.append(gated * e * shared_ff + e * n_expert)  # shared experts, router
        else:
            experts.append(0)
            dense.append(gated * e * dense_ff)
    return Breakdown(
        tok_embd=tok,
        output=0 if tied else tok,
        attn=tuple(attn),
        dense=tuple(dense),
        experts=tuple(experts),
        n_expert=n_expert,
        n_expert_used=n_used,
    )


def bits_per_weight(quant: str) -> tuple[float, float]:
    """(bits per weight of the routed experts, of everything else) at a GGUF quant (Ollama's names)."""
    from kvadvise.model.quants import quant_bpw

    q = quant.strip().upper()
    if q in ("MXFP4", "MXFP4_MOE"):
        return MXFP4_BPW, 16.0  # Ollama's gpt-oss: experts MXFP4, attention/embeddings/router BF16
    _, bpw = quant_bpw(q)
    return bpw, bpw


def sized(bd: Breakdown, quant: str, total_bytes: int | None = None) -> Breakdown:
    """Bytes of each part at ``quant``; scaled so that they sum to ``total_bytes`` when that is known."""
    exp_bpw, bpw = bits_per_weight(quant)

    def b(n: int, bits: float) -> float:
        return n * bits / 8

    parts = (
        b(bd.tok_embd, bpw),
        b(bd.output, bpw),
        [b(n, bpw) for n in bd.attn],
        [b(n, bpw) for n in bd.dense],
        [b(n, exp_bpw) for n in bd.experts],
    )
    est = parts[0] + parts[1] + sum(parts[2]) + sum(parts[3]) + sum(parts[4])
    k = total_bytes / est if total_bytes and est else 1.0
    ke = k
    if exp_bpw != bpw and total_bytes and est:
        # MXFP4 experts are MXFP4 in every build; what else the file holds (BF16, Q8_0) takes the rest
        rest = est - sum(parts[4])
        k = max(0.0, total_bytes - sum(parts[4])) / rest if rest else 1.0
        ke = 1.0
    return Breakdown(
        tok_embd=round(parts[0] * k),
        output=round(parts[1] * k),
        attn=tuple(round(x * k) for x in parts[2]),
        dense=tuple(round(x * k) for x in parts[3]),
        experts=tuple(round(x * ke) for x in parts[4]),
        n_expert=bd.n_expert,
        n_expert_used=bd.n_expert_used,
    )


def with_parts(
    spec: ModelSpec,
    config: Mapping[str, object],
    quant: str,
    projector_bytes: int = 0,
    *,
    sizes: Breakdown | None = None,
) -> ModelSpec:
    """``spec`` with the sizes of its parts (embeddings, output, blocks, experts) counted from the config at
    ``quant`` and scaled to its weights (less a projector); unchanged when the config cannot be counted.
    ``sizes``: the parts in bytes when the caller has them. Every spec made from a config.json goes through
    this (a built-in profile, ``kvadvise hf``), so the routed experts, the layer split over several GPUs and
    partial offload are planned as for a GGUF, whose header lists the same parts."""
    bd = params(spec, config)
    if bd is None or not spec.weights_bytes:
        return spec
    b = sizes if sizes is not None else sized(bd, quant, max(1, spec.weights_bytes - projector_bytes))
    layers = b.layers + (0,) * spec.n_layer_nextn
    # the largest tensor of each block, for op offload's copy (kvadvise.planner.offload): a merged
    # expert tensor (ffn_{gate,up,down}_exps: a third of the experts), else one of the FFN's matrices,
    # else q or o (about half the attention); an estimate from the config's shapes
    largest = tuple(max(x // 3, d // 3, a // 2) for a, d, x in zip(b.attn, b.dense, b.experts, strict=True))
    # the output matmul reads token_embd when they are tied (llama.cpp duplicates it as the output layer)
    active = bd.active if bd.output else bd.active + bd.tok_embd
    return dataclasses.replace(
        spec,
        tok_embd_bytes=b.tok_embd,
        output_bytes=b.output,
        expert_bytes=sum(b.experts),
        layer_bytes=layers,
        layer_largest_tensor_bytes=largest + (0,) * spec.n_layer_nextn,
        active_params=active,
    )
