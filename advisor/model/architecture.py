"""GGUF metadata -> ModelSpec, with llama.cpp's per-architecture rules.

Every rule cites where llama.cpp 0c1e570 (vendored by llama-cpp-python
0.3.36) sets it; ``src/models/<arch>.cpp`` is ``load_arch_hparams`` of that
architecture. Architectures not in VERIFIED get the generic rules from the
keys present and a note saying so.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvadvise.errors import GGUFError
from kvadvise.model.ggml import GGMLType, cuda_alloc_bytes
from kvadvise.model.gguf import (
    T_ARRAY,
    T_INT32,
    T_STRING,
    T_UINT32,
    TYPE_NAMES,
    GGUFArray,
    GGUFHeader,
    TensorInfo,
    Value,
)
from kvadvise.model.keys import (
    LLM,
    SSM,
    STRING_KEYS,
    U32_KEYS,
    U32_OR_ARRAY_KEYS,
    WKV,
    Attention,
    General,
    ShortConv,
    Tokenizer,
    key,
)
from kvadvise.model.quants import file_type_label
from kvadvise.model.spec import SWA_CHUNKED, SWA_NONE, SWA_STANDARD, MatmulWeight, ModelSpec, SSMDims

# llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h), plus gate_up: routed experts
_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_EXPERT_UP = re.compile(r"\.ffn_up_(ch|)exps")
_EXPERT_GATE = re.compile(r"\.ffn_gate_(ch|)exps")
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")
# tensors outside blk.N that llama.cpp creates with block index 0, so on block 0's device (LLM_TENSOR_LAYER_REPEATING:
# src/models/gemma3n.cpp and gemma4.cpp, create_tensor(tn(LLM_TENSOR_PER_LAYER_MODEL_PROJ, "weight", 0), ...), b11312)
_BLOCK0_TENSORS = frozenset({"per_layer_model_proj.weight", "per_layer_proj_norm.weight"})


def _block_index(name: str) -> int | None:
    """The block a tensor is loaded with (llama_model_loader: its device is that block's), None for the input and
    output layers' tensors."""
    if m := _BLOCK_TENSOR.match(name):
        return int(m[1])
    return 0 if name in _BLOCK0_TENSORS else None


# llama_hparams::n_altup (src/llama-hparams.h, b11312): Gemma 3n's residual streams, not read from the file
GEMMA3N_ALTUP = 4

# Architectures whose KV, recurrent state and weights kvadvise's tests check
# against real llama.cpp (tests/test_oracle.py builds a model of each).
VERIFIED = frozenset(
    {
        "llama",
        "qwen2",
        "qwen3",
        "qwen3moe",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4",
        "gpt-oss",
        "phi3",
        "command-r",
        "cohere2",
        "granite",
        "deepseek2",
        "glm4moe",
        "qwen3next",
        "qwen35",
        "mamba2",
        "lfm2",
        "granitehybrid",
    }
)


# Every architecture llama.cpp 0c1e570 (b11312) knows: src/llama-arch.cpp, LLM_ARCH_NAMES. A GGUF of any
# other architecture fails there with "unknown model architecture" (llm_arch_from_string -> LLM_ARCH_UNKNOWN).
LLAMA_ARCHITECTURES = frozenset(
    {
        "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
        "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
        "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3",
        "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3",
        "phimoe", "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma",
        "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba",
        "mamba2", "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
        "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr",
        "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais",
        "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6",
        "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch", "granite_swa",
        "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2", "bailingmoe3", "dots1", "dots3note",
        "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl",
        "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe",
        "seed_oss", "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
        "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5",
        "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
        "qwen3tts", "pockettts",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _SwaRule:
    """How an architecture lays out its sliding-window layers (llama-model.cpp, load_hparams)."""

    pattern: int  # default n_pattern for load_swa_pattern (overridden by {arch}.attention.sliding_window_pattern)
    swa_type: str = SWA_STANDARD
    n_swa_default: int = 0  # used when the file has no sliding_window key
    needs_key: bool = False  # SWA only when {arch}.attention.sliding_window > 0 is present
    dense_first: bool = False
    only_n_layer: int = 0  # SWA only for a model of this many layers (exaone4.cpp: the 32B's 64), 0: any


# src/models/<arch>.cpp load_arch_hparams -> load_swa_pattern(ml, n_pattern)
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, n_swa_default=4096),  # gemma2.cpp: n_swa = 4096 default
    "gemma3": _SwaRule(6, needs_key=True),  # gemma3.cpp: only if found_swa && n_swa > 0
    "gemma3n": _SwaRule(5),
    "cohere2": _SwaRule(4),  # cohere2.cpp
    "gpt-oss": _SwaRule(2),  # openai-moe.cpp
    "llama4": _SwaRule(4, swa_type=SWA_CHUNKED, n_swa_default=8192),  # llama4.cpp: 3 chunked, 1 full
    "exaone4": _SwaRule(4, n_swa_default=4096, only_n_layer=64),  # exaone4.cpp: if (hparams.n_layer() == 64)
}

# Pure recurrent architectures: every layer holds state, none holds KV.
_RECURRENT_ALL = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Hybrids whose recurrent layers are those with head_count_kv == 0
# (granite-hybrid.cpp, lfm2.cpp: is_recr_impl[il] = n_head_kv(il) == 0).
_RECURRENT_BY_ZERO_KV = frozenset({"granitehybrid", "lfm2", "lfm2moe", "jamba", "plamo2"})
# nemotron-h.cpp: is_recr_impl[i] = i < n_layer() && n_head_kv(i) == 0 && n_ff(i) == 0; llama_model::create_memory
# gives attention only to !is_recr(il) && n_ff(il) == 0: the MLP blocks (n_ff != 0) hold neither.
_RECURRENT_NEMOTRON_H = frozenset({"nemotron_h", "nemotron_h_moe"})
# falcon-h1.cpp fills is_recr_impl with true, and create_memory's filter_attn passes every layer: each layer
# holds an attention cache and a Mamba-2 state.
_RECURRENT_AND_ATTENTION = frozenset({"falcon-h1"})
# The recurrent mixer each family runs (src/models/*.cpp build_*_layer), for its compute-buffer activations.
# the MoE architectures whose graph takes the expert width as n_ff / n_expert_used when the GGUF has no
# expert_feed_forward_length (llama.cpp b11312 src/models/: qwen2moe, qwen3moe, qwen3vlmoe, qwen35moe, qwen3next,
# glm4-moe, grovemoe, llada-moe, rnd1)
_N_FF_EXP_PER_USED = frozenset(
    {"qwen2moe", "qwen3moe", "qwen3vlmoe", "qwen35moe", "qwen3next", "glm4moe", "grovemoe", "llada-moe", "rnd1"}
)
_SSM_KIND = {
    **dict.fromkeys(("mamba2", "granitehybrid", "falcon-h1", "nemotron_h", "nemotron_h_moe", "plamo2"), "mamba2"),
    **dict.fromkeys(("mamba", "jamba"), "mamba"),
    **dict.fromkeys(("qwen3next", "qwen35", "qwen35moe"), "gdn"),
    **dict.fromkeys(("lfm2", "lfm2moe"), "shortconv"),
    **dict.fromkeys(("rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"), "rwkv"),
}
# Blocks whose attention and feed-forward read the same normed input and are summed (command-r.cpp,
# cohere2.cpp, phi2.cpp, gptj.cpp, falcon.cpp): the attention output lives through the feed-forward.
_PARALLEL_BLOCK = frozenset({"command-r", "cohere2", "cohere2moe", "phi2", "gptj", "falcon"})
# Hybrids with {arch}.full_attention_interval (qwen3next.cpp, qwen35.cpp):
# is_recr[i] = i < n_layer() && (i + 1) % interval != 0, default interval 4.
_RECURRENT_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})


def _penalty_repeat(header: GGUFHeader) -> float:
    """The file's default repeat penalty (General.SAMPLING_PENALTY_REPEAT), 1.0 without one or with a penalty window of
    0 tokens; a value that is not a finite number is ignored, as common.cpp's strtof leaves the default."""
    md = header.metadata
    v, last_n = md.get(General.SAMPLING_PENALTY_REPEAT), md.get(General.SAMPLING_PENALTY_LAST_N)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return 1.0
    if isinstance(last_n, (int, float)) and not isinstance(last_n, bool) and last_n == 0:
        return 1.0
    return float(v)


class _Keys:
    """Typed access to metadata with the {arch} prefix filled in."""

    def __init__(self, header: GGUFHeader, arch: str) -> None:
        self.md: Mapping[str, Value] = header.metadata
        self.arch = arch
        self.source = header.source

    def raw(self, template: str) -> Value | None:
        return self.md.get(key(template, self.arch))

    def num(self, template: str, default: int | None = None) -> int:
        v = self.raw(template)
        if v is None:
            if default is None:
                raise GGUFError(f"{self.source}: required key {key(template, self.arch)} is missing")
            return default
        if isinstance(v, GGUFArray):
            if not v.values:
                raise GGUFError(
                    f"{self.source}: {key(template, self.arch)} is an array of {v.count} values, not a number"
                )
            # llama.cpp's get_key_or_arr: the largest per-layer value sizes the model-wide field
            return max(self._count(x, template) for x in v.values)
        return self._count(v, template)

    def per_layer(self, template: str, n: int, default: int | None) -> tuple[int, ...]:
        """get_key_or_arr: a scalar broadcast to every layer, or one value per layer."""
        v = self.raw(template)
        if isinstance(v, GGUFArray):
            if v.values is None or len(v.values) != n:
                raise GGUFError(f"{self.source}: {key(template, self.arch)} has {v.count} values for {n} layers")
            return tuple(self._count(x, template) for x in v.values)
        return (self.num(template, default),) * n

    def _count(self, v: object, template: str) -> int:
        """A non-negative whole number, or a GGUFError naming the key (strings, nested arrays, NaN...)."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GGUFError(f"{self.source}: {key(template, self.arch)} should be a number, got {type(v).__name__}")
        if not math.isfinite(v):
            raise GGUFError(f"{self.source}: {key(template, self.arch)} is {v}, not a count")
        if v < 0:
            raise GGUFError(f"{self.source}: {key(template, self.arch)} is negative ({v})")
        return int(v)

    def bools(self, template: str, n: int) -> tuple[bool, ...] | None:
        v = self.raw(template)
        if isinstance(v, GGUFArray) and v.values is not None and len(v.values) == n:
            return tuple(bool(x) for x in v.values)
        return None


def _swa_pattern(n_layer: int, n_layer_all: int, n_pattern: int, dense_first: bool) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern (src/llama-hparams.cpp)."""
    out = []
    for il in range(n_layer_all):
        if il >= n_layer:
            out.append(False)
        elif dense_first:
            out.append(n_pattern == 0 or il % n_pattern != 0)
        else:
            out.append(n_pattern == 0 or il % n_pattern < n_pattern - 1)
    return tuple(out)


def _swa(k: _Keys, arch: str, n_layer: int, n_layer_all: int) -> tuple[str, int, tuple[bool, ...]]:
    none = (SWA_NONE, 0, (False,) * n_layer_all)
    n_swa_key = k.raw(Attention.SLIDING_WINDOW)
    rule = _SWA_RULES.get(arch)
    if rule is None:
        # lfm2.cpp: with a sliding window, every attention layer is SWA.
        if arch in ("lfm2", "lfm2moe") and isinstance(n_swa_key, int) and n_swa_key > 0:
            kv = k.per_layer(Attention.HEAD_COUNT_KV, n_layer_all, 0)
            return SWA_STANDARD, n_swa_key, tuple(h > 0 for h in kv)
        # Unknown or non-SWA architectures: only an explicit pattern array makes layers SWA.
        explicit = k.bools(Attention.SLIDING_WINDOW_PATTERN, n_layer_all)
        if explicit and isinstance(n_swa_key, int) and n_swa_key > 0 and arch not in ("phi3",):
            return SWA_STANDARD, n_swa_key, explicit
        return none  # phi3.cpp: "Phi SWA is currently disabled"
    if rule.needs_key and not (isinstance(n_swa_key, int) and n_swa_key > 0):
        return none
    if rule.only_n_layer and n_layer != rule.only_n_layer:
        return none
    n_swa = k.num(Attention.SLIDING_WINDOW, rule.n_swa_default)
    if arch == "llama4" and n_swa_key == 0:
        return none
    if n_swa <= 0:
        # no window known (gemma3n.cpp and openai-moe.cpp require the key; a header made from a config the converter
        # does not map has none): every layer full, the upper bound the plan's note says, never a window of 0
        return none
    # llama_model_base::load_swa_pattern: a bool array wins, else an int n_pattern, else the arch default
    explicit = k.bools(Attention.SLIDING_WINDOW_PATTERN, n_layer_all)
    if explicit is not None:
        return rule.swa_type, n_swa, explicit
    pat = k.raw(Attention.SLIDING_WINDOW_PATTERN)
    n_pattern = pat if isinstance(pat, int) and not isinstance(pat, bool) else rule.pattern
    return rule.swa_type, n_swa, _swa_pattern(n_layer, n_layer_all, n_pattern, rule.dense_first)


def _recurrent(k: _Keys, arch: str, n_layer: int, n_layer_all: int, n_head_kv: tuple[int, ...]) -> tuple[bool, ...]:
    if arch in _RECURRENT_ALL or arch in _RECURRENT_AND_ATTENTION:
        return (True,) * n_layer_all
    if arch in _RECURRENT_NEMOTRON_H:
        n_ff = k.per_layer(LLM.FEED_FORWARD_LENGTH, n_layer_all, 0)
        return tuple(il < n_layer and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layer_all))
    if arch in _RECURRENT_BY_ZERO_KV:
        return tuple(h == 0 for h in n_head_kv)
    if arch in _RECURRENT_BY_INTERVAL:
        explicit = k.bools(Attention.RECURRENT_LAYERS, n_layer_all)
        if explicit is not None:
            return explicit
        interval = k.num(LLM.FULL_ATTENTION_INTERVAL, 4)
        return tuple(il < n_layer and interval > 0 and (il + 1) % interval != 0 for il in range(n_layer_all))
    return (False,) * n_layer_all


def _recurrent_dims(k: _Keys, n_embd: int) -> tuple[int, int]:
    """llama_hparams::n_embd_r() and n_embd_s() (src/llama-hparams.cpp)."""
    wkv = k.num(WKV.HEAD_SIZE, 0)
    if wkv:
        return k.num(LLM.TOKEN_SHIFT_COUNT, 2) * n_embd, n_embd * wkv
    l_cache = k.num(ShortConv.L_CACHE, 0)
    d_conv = k.num(SSM.CONV_KERNEL, 0)
    d_inner = k.num(SSM.INNER_SIZE, 0)
    d_state = k.num(SSM.STATE_SIZE, 0)
    n_group = k.num(SSM.GROUP_COUNT, 0)
    if l_cache:
        return n_embd * (l_cache - 1), d_state * d_inner
    n_r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return n_r, d_state * d_inner


def _n_vocab(header: GGUFHeader, k: _Keys) -> int:
    toks = header.metadata.get(Tokenizer.LIST)
    if isinstance(toks, GGUFArray):
        return toks.count
    v = k.raw(LLM.VOCAB_SIZE)
    if isinstance(v, int):
        return v
    for t in header.tensors:
        if t.name == "token_embd.weight" and len(t.shape) >= 2:
            return t.shape[1]
    return 0


# Types the CPU backend has a repacked layout for (ggml/src/ggml-cpu/repack.cpp,
# ggml_repack_get_optimal_repack_type, llama.cpp 0c1e570) or AMX kernels for (ggml/src/ggml-cpu/amx/common.h
# qtype_has_amx_kernels, and f16: amx.cpp supports_op); which of them a CPU uses: kvadvise.planner.repack
_REPACK_TYPES = frozenset(
    t.type_name
    for t in (
        GGMLType.Q1_0, GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
        GGMLType.Q2_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q8_0,
        GGMLType.Q4_1, GGMLType.IQ4_XS, GGMLType.F16,
    )
)  # fmt: skip
# an Ollama-format blob's own vision/audio tower beside the text model's tensors (ModelSpec.tower_bytes)
TOWER_PREFIXES = ("v.", "mm.", "a.")
# llama-arch.cpp LLM_TENSOR_INFOS: the input layer's tensors besides token_embd (kept on the CPU with it)
_INPUT_EXTRA = frozenset({"per_layer_token_embd.weight", "position_embd.weight", "token_types.weight"})
# 2-D weights that are read by GET_ROWS or another op, never by a matmul (src/llama-arch.cpp LLM_TENSOR_INFOS)
_NOT_MATMUL = re.compile(r"^(token_embd|per_layer_token_embd|pos_embd|token_types|enc\.token_embd)\.|conv1d|_norm\.")


def _matmul_weights(loaded: list[TensorInfo], tied: bool) -> tuple[tuple[MatmulWeight, ...], tuple[int, int]]:
    """The repackable matmul weights (llama_model_loader::create_tensor picks each tensor's buffer type by
    its op: MUL_MAT on a 2-D weight, MUL_MAT_ID on 3-D experts) and the span of every other tensor; ``tied``: the
    output layer is a copy of token_embd (no output.weight), a MUL_MAT weight of its own."""
    out: list[MatmulWeight] = []
    first, last = -1, 0
    for t in loaded:
        if tied and t.name == "token_embd.weight" and t.ggml_type.type_name in _REPACK_TYPES and len(t.shape) >= 2:
            out.append(MatmulWeight(t.ggml_type.type_name, t.shape[1], t.n_bytes, t.offset, -1, t.shape[0], tied=True))
        dims = _n_dims(t.shape)
        is_expert = bool(_EXPERT_TENSOR.search(t.name))
        if (
            t.ggml_type.type_name in _REPACK_TYPES
            and t.name.endswith(".weight")
            and not _NOT_MATMUL.search(t.name)
            and dims == (3 if is_expert else 2)
        ):
            m = _BLOCK_TENSOR.match(t.name)
            block = int(m[1]) if m else -1
            out.append(
                MatmulWeight(t.ggml_type.type_name, t.shape[1], t.n_bytes, t.offset, block, t.shape[0], is_expert)
            )
        else:
            first = t.offset if first < 0 else min(first, t.offset)
            last = max(last, t.offset + t.n_bytes)
    return tuple(out), ((first, last) if first >= 0 else (0, 0))


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


# llama_model::create_memory (src/llama-model.cpp, llama.cpp 0c1e570) makes no memory module for these
# architectures (res = nullptr): encoders (the BERT family, which embedding models such as nomic-embed-text,
# bge-m3 and mxbai-embed-large are) and diffusion models. No KV cache, whatever the context.
NO_MEMORY_ARCHS = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
    }
)
# Of those, the encoders (src/models/bert.cpp, nomic-bert.cpp, ...): no output tensor either (they pool
# the hidden states into an embedding), so no tied copy of token_embd is made for an output layer.
ENCODER_ARCHS = NO_MEMORY_ARCHS - {"wavtokenizer-dec", "dream", "llada", "llada-moe", "rnd1"}


def _check_heads(
    header: GGUFHeader,
    arch: str,
    by_name: Mapping[str, TensorInfo],
    n_embd: int,
    n_head: Sequence[int],
    n_head_kv: Sequence[int],
    n_layer: int,
) -> None:
    """A header that says a width of 0, or 0 (KV) heads in a layer that holds attention tensors: llama.cpp
    refuses the file (llama_model::load_hparams "invalid n_rot: 32, expected 0"; load_tensors check_tensor_dims
    "tensor 'blk.0.attn_q.weight' has wrong shape; expected 128, 0", b11312). A recurrent layer marks itself with
    0 KV heads and has no attention tensors, so only a layer holding them is checked."""
    if n_embd == 0 and by_name:
        raise GGUFError(f"{header.source}: {arch}.embedding_length is 0", hint=_LOAD_REFUSED)
    for il in range(n_layer):
        for count, tensor, name in ((n_head, "attn_q", "head_count"), (n_head_kv, "attn_k", "head_count_kv")):
            if count[il] == 0 and f"blk.{il}.{tensor}.weight" in by_name:
                raise GGUFError(
                    f"{header.source}: {arch}.attention.{name} is 0 for layer {il}, which holds "
                    f"blk.{il}.{tensor}.weight",
                    hint=_LOAD_REFUSED,
                )


def _check_widths(spec: ModelSpec, by_name: Mapping[str, TensorInfo]) -> None:
    """A layer's K and V rows as its header says (head width x KV heads, the width each token takes in the cache)
    and its Q (head width x heads) against its attn_k/attn_v/attn_q tensors: llama.cpp creates them with exactly these widths and refuses a file whose
    tensors differ (src/llama-model.cpp create_tensor_qkv, n_embd_k_gqa/n_embd_v_gqa; llama-model-loader.cpp
    check_tensor_dims, b11312). Whatever count makes them differ (head_count 4294967295, whose head width
    n_embd / n_head is 0, head_count_kv past the tensor, a key_length no tensor has) is a file llama.cpp cannot
    load, and a KV figure computed from it would be nonsense. Only layers with a cache are checked: a recurrent
    or linear-attention layer sizes its tensors from other keys, and MLA caches the compressed K."""
    _check_ff_width(spec, by_name)
    if spec.is_mla:
        return
    keys = f"{spec.architecture}.attention"
    for il in range(spec.n_layer_all):
        if not spec.kv_layers[il]:
            continue
        for tensor, want in (("attn_k", spec.n_embd_k_gqa(il)), ("attn_v", spec.n_embd_v_gqa(il))):
            t = by_name.get(f"blk.{il}.{tensor}.weight")
            if t is None or len(t.shape) < 2 or t.shape[1] == want or not _refuses(spec, want):
                continue
            head = want // spec.n_head_kv[il]
            raise GGUFError(
                f"{spec.source}: layer {il}'s {tensor[-1].upper()} rows are {head:,} x {spec.n_head_kv[il]:,} heads = "
                f"{want:,} wide by the header ({keys}.head_count {spec.n_head[il]:,}, head_count_kv "
                f"{spec.n_head_kv[il]:,}, embedding_length {spec.n_embd:,}), but blk.{il}.{tensor}.weight is "
                f"{t.shape[1]:,} wide",
                hint=_LOAD_REFUSED,
            )
        head_k = spec.n_embd_head_k_swa if spec.swa_layers[il] else spec.n_embd_head_k
        q = by_name.get(f"blk.{il}.attn_q.weight")
        # Q is n_head heads of the K width (create_tensor_qkv's n_embd_head_k * n_head), or twice that where Q
        # carries its output gate (qwen3next, qwen35: n_embd_head_k * n_head * 2)
        n_embd_q = head_k * spec.n_head[il]
        if (
            q is not None
            and len(q.shape) >= 2
            and q.shape[1] not in (n_embd_q, 2 * n_embd_q)
            and _refuses(spec, n_embd_q)
        ):
            raise GGUFError(
                f"{spec.source}: layer {il}'s Q is {spec.n_head[il]:,} heads ({keys}.head_count) of {head_k:,} = "
                f"{n_embd_q:,} wide by the header, but blk.{il}.attn_q.weight is {q.shape[1]:,} wide",
                hint=_LOAD_REFUSED,
            )


_NO_ROW_WIDER = 1 << 20  # no real model's K, V or Q row is a million wide (the widest are tens of thousands)


def _refuses(spec: ModelSpec, width: int) -> bool:
    """Whether a width the tensors do not have is refused: always for an architecture verified against llama.cpp
    (VERIFIED: kvadvise's head widths are llama.cpp's there); elsewhere, where a rule kvadvise does not know could
    size the tensors, only a width no model has (0, or past a million: head_count 4294967295 and the like)."""
    return spec.verified or width == 0 or width > _NO_ROW_WIDER


# a dense feed-forward's ffn_down is {n_ff, n_embd} (src/models/*.cpp, b11312) but in Qwen (v1), whose
# feed_forward_length counts gate and up together ({n_ff/2, n_embd}, src/models/qwen.cpp), and Arctic, whose
# dense residual branch is {n_embd, n_embd} (src/models/arctic.cpp)
_FF_DOWN_DIVISOR = {"qwen": 2}
_FF_DOWN_OTHER = frozenset({"arctic"})


def _check_ff_width(spec: ModelSpec, by_name: Mapping[str, TensorInfo]) -> None:
    """{arch}.feed_forward_length wider than every dense ffn_down: llama.cpp creates each dense layer's
    ffn_down {n_ff(il), n_embd} and refuses the file ("check_tensor_dims: tensor 'blk.0.ffn_gate.weight' has
    wrong shape; expected 128, 4294967295", llama-fit-params b11312); kvadvise sized the compute buffer from it
    (a key of 4294967295: terabytes, "does not fit"). Only the widest is checked: a per-layer width, a MoE
    layer without a dense ffn_down, makes the others legitimately narrower."""
    if spec.architecture in _FF_DOWN_OTHER:
        return
    dense = [
        t.shape[0]
        for il in range(spec.n_layer_all)
        if (t := by_name.get(f"blk.{il}.ffn_down.weight")) is not None and len(t.shape) == 2
    ]
    want = spec.n_ff // _FF_DOWN_DIVISOR.get(spec.architecture, 1)
    if dense and want > max(dense) and (spec.verified or want > 64 * _NO_ROW_WIDER):
        raise GGUFError(
            f"{spec.source}: {spec.architecture}.feed_forward_length is {spec.n_ff:,}, but the widest dense "
            f"feed-forward (ffn_down) is {max(dense):,}",
            hint=_LOAD_REFUSED,
        )


_C_MAX = 2**31 - 1  # the largest -c llama.cpp takes (common/arg.cpp std::stoi: int32)


def _n_ctx_train(header: GGUFHeader, k: _Keys, arch: str) -> int:
    """{arch}.context_length; one past the largest -c is refused here, where its key can be named: the model's
    maximum context (the recommendation's target, -c 0) is no context llama.cpp's -c can ask for, and the
    search for it ended in RunConfig's int32 check, which names neither the file nor the key."""
    n = k.num(LLM.CONTEXT_LENGTH, 0)
    if n > _C_MAX:
        raise GGUFError(
            f"{header.source}: {arch}.context_length is {n:,}, more than llama.cpp's -c takes ({_C_MAX:,})",
            hint="the header is not to be trusted: a real model's training context is far below",
        )
    return n


def _check_types(header: GGUFHeader, arch: str) -> None:
    """A file's keys of the type llama.cpp's loader takes them as (keys.U32_KEYS...), and its training context
    present: llama_model::load_hparams reads {arch}.context_length as required ("key not found in model"). Only a
    file's own header (value_types): metadata kvadvise made from a config.json or /api/show has no types."""
    types = header.value_types
    if not types:
        return
    if header.byte_order != ("<" if sys.byteorder == "little" else ">"):
        # gguf.cpp gguf_init_from_file_impl reads the version in the host's order: "this GGUF file version %u is
        # extremely large, is there a mismatch between the host and model endianness?"
        raise GGUFError(
            f"{header.source}: a {'big' if header.byte_order == '>' else 'little'}-endian GGUF: llama.cpp on a "
            f"{sys.byteorder}-endian machine refuses it (gguf.cpp: a mismatch between the host and model endianness)",
            hint="download or convert the model for this machine's byte order",
        )

    def wrong(name: str, t: int, expected: str) -> GGUFError:
        return GGUFError(
            f"{header.source}: key {name} has wrong type {TYPE_NAMES.get(t, t)} but expected type {expected}: "
            "llama.cpp refuses to load it (llama-model-loader.cpp, GGUFMeta get_kv)",
            hint="the file was written by a converter that does not follow the GGUF schema: convert it again",
        )

    for name, t in types.items():  # gguf.cpp gguf_init_from_file_impl: an array of arrays is an invalid type
        value = header.metadata.get(name)
        if t == T_ARRAY and isinstance(value, GGUFArray) and value.item_type == T_ARRAY:
            raise GGUFError(
                f"{header.source}: key {name} is an array of arrays: llama.cpp refuses the file (gguf.cpp: "
                '"key has invalid GGUF type")',
                hint="the file was written by a converter that does not follow the GGUF schema: convert it again",
            )
    for template in U32_KEYS:
        name = key(template, arch)
        if name in types and types[name] != T_UINT32:
            raise wrong(name, types[name], "u32")
    for template in U32_OR_ARRAY_KEYS:
        name = key(template, arch)
        t = types.get(name, T_UINT32)
        value = header.metadata.get(name)
        if t == T_ARRAY and isinstance(value, GGUFArray) and value.item_type not in (T_UINT32, T_INT32):
            raise wrong(name, value.item_type, "an array of u32 or i32")
        if t not in (T_UINT32, T_ARRAY):
            raise wrong(name, t, "u32")
    for name in STRING_KEYS:
        if name in types and types[name] != T_STRING:
            raise wrong(name, types[name], "string")
    if key(LLM.CONTEXT_LENGTH, arch) not in types:
        raise GGUFError(
            f"{header.source}: key not found in model: {key(LLM.CONTEXT_LENGTH, arch)}: llama.cpp refuses to load "
            "it (llama_model::load_hparams reads the training context as required)",
            hint="the file was written without its training context: convert it again",
        )


_LOAD_REFUSED = "llama.cpp refuses to load it (the header does not match the tensors): the file is corrupt"


def from_gguf(header: GGUFHeader, *, known_only: bool = True) -> ModelSpec:
    """The ModelSpec of a GGUF header. ``known_only``: refuse an architecture llama.cpp does not know (a GGUF
    file llama.cpp would refuse to load); off for metadata kvadvise made itself (a config.json it could
    not map is planned with generic rules, as an estimate)."""
    arch = header.architecture
    _check_types(header, arch)
    k = _Keys(header, arch)
    notes: list[str] = []
    n_layer_all = k.num(LLM.BLOCK_COUNT)
    if n_layer_all == 0 or n_layer_all > 100_000:
        raise GGUFError(f"{header.source}: {arch}.block_count is {n_layer_all}")
    n_layer_nextn = k.num(LLM.NEXTN_PREDICT_LAYERS, 0)
    if n_layer_nextn > n_layer_all:
        raise GGUFError(f"{header.source}: nextn_predict_layers {n_layer_nextn} > block_count {n_layer_all}")
    n_layer = n_layer_all - n_layer_nextn
    n_embd = k.num(LLM.EMBEDDING_LENGTH)
    n_head = k.per_layer(Attention.HEAD_COUNT, n_layer_all, 0)
    # llama_model::load_hparams: head_count_kv defaults to head_count (MHA)
    n_head_kv = (
        k.per_layer(Attention.HEAD_COUNT_KV, n_layer_all, n_head[0])
        if k.raw(Attention.HEAD_COUNT_KV) is not None
        else n_head
    )
    head0 = n_head[0] or max(n_head, default=0)
    default_head = n_embd // head0 if head0 else 0
    n_embd_head_k = k.num(Attention.KEY_LENGTH, default_head)
    n_embd_head_v = k.num(Attention.VALUE_LENGTH, default_head)
    n_embd_head_k_swa = k.num(Attention.KEY_LENGTH_SWA, n_embd_head_k)
    n_embd_head_v_swa = k.num(Attention.VALUE_LENGTH_SWA, n_embd_head_v)
    is_mla = k.num(Attention.KEY_LENGTH_MLA, 0) > 0 and k.num(Attention.VALUE_LENGTH_MLA, 0) > 0

    swa_type, n_swa, swa_layers = _swa(k, arch, n_layer, n_layer_all)
    recurrent = _recurrent(k, arch, n_layer, n_layer_all, n_head_kv)
    n_embd_r, n_embd_s = _recurrent_dims(k, n_embd) if any(recurrent) else (0, 0)

    # Which layers own KV in the main context (create_memory filters):
    # trunk only (il < n_layer(): MTP blocks are filtered), not recurrent, with KV heads.
    kv_layers = tuple(
        il < n_layer and (arch in _RECURRENT_AND_ATTENTION or not recurrent[il]) and n_head_kv[il] > 0
        for il in range(n_layer_all)
    )
    if arch in _RECURRENT_NEMOTRON_H:  # create_memory: !is_recr(il) && n_ff(il) == 0
        n_ff_l = k.per_layer(LLM.FEED_FORWARD_LENGTH, n_layer_all, 0)
        kv_layers = tuple(ok and n_ff_l[il] == 0 for il, ok in enumerate(kv_layers))
    if arch in NO_MEMORY_ARCHS:  # encoders and diffusion models: no KV cache at all
        kv_layers = (False,) * n_layer_all
    if arch in ("gemma3n", "gemma4"):
        # n_layer_kv_from_start = n_layer - shared_kv_layers: later layers reuse a cache
        shared = k.num(Attention.SHARED_KV_LAYERS, 0)
        kv_layers = tuple(ok and il < n_layer - shared for il, ok in enumerate(kv_layers))

    by_name = {t.name: t for t in header.tensors}
    _check_heads(header, arch, by_name, n_embd, n_head, n_head_kv, n_layer)
    tok_embd = by_name.get("token_embd.weight")
    output = by_name.get("output.weight")
    # llama.cpp skips the MTP/NextN blocks' tensors unless asked to load them
    # (src/models/glm4-moe.cpp and others: mtp_flags |= TENSOR_SKIP when !load_mtp).
    mtp_prefixes = tuple(f"blk.{il}." for il in range(n_layer, n_layer_all))
    loaded = [t for t in header.tensors if not (mtp_prefixes and t.name.startswith(mtp_prefixes))]
    if len(loaded) < len(header.tensors):
        skipped = sum(t.n_bytes for t in header.tensors) - sum(t.n_bytes for t in loaded)
        notes.append(f"MTP/NextN block weights ({skipped:,} B) are not loaded by llama.cpp by default")
    # The file span of the loaded tensors: what llama.cpp's mmap-ed CPU model buffer
    # covers (a buffer from the host pointer [first offset, last end)).
    weights_bytes = max(t.offset + t.n_bytes for t in loaded) - min(t.offset for t in loaded) if loaded else 0
    expert_bytes = sum(t.n_bytes for t in loaded if _EXPERT_TENSOR.search(t.name))
    layer_bytes = [0] * n_layer_all
    layer_experts = [0] * n_layer_all
    layer_up = [0] * n_layer_all
    layer_gate = [0] * n_layer_all
    for t in loaded:
        if (il := _block_index(t.name)) is not None and il < n_layer_all:
            layer_bytes[il] += t.n_bytes
            if _EXPERT_TENSOR.search(t.name):
                layer_experts[il] += t.n_bytes
                layer_up[il] += t.n_bytes if _EXPERT_UP.search(t.name) else 0
                layer_gate[il] += t.n_bytes if _EXPERT_GATE.search(t.name) else 0
    # the input layer's extra tables stay in the CPU's buffer: no CUDA padding (token_embd's pads its tied copy)
    cuda_pad = sum(
        cuda_alloc_bytes(t.ggml_type, t.shape[0], t.n_bytes) - t.n_bytes for t in loaded if t.name not in _INPUT_EXTRA
    )
    layer_pad = [0] * n_layer_all
    layer_largest = [0] * n_layer_all
    for t in loaded:
        if (il := _block_index(t.name)) is not None and il < n_layer_all:
            alloc = cuda_alloc_bytes(t.ggml_type, t.shape[0], t.n_bytes)
            layer_pad[il] += alloc - t.n_bytes
            layer_largest[il] = max(layer_largest[il], alloc)
    # an Ollama-format blob's own tower (ModelSpec.tower_bytes) is no text matmul: never repacked by the text model's
    # loader (llama/compat skips it) nor multiplied by a text token
    text = [t for t in loaded if not t.name.startswith(TOWER_PREFIXES)]
    matmul_weights, fixed_span = _matmul_weights(text, output is None and arch not in ENCODER_ARCHS)
    active_params = _active_params(text, k.num(LLM.EXPERT_COUNT, 0), k.num(LLM.EXPERT_USED_COUNT, 0))
    # the MTP/NextN blocks, loaded only for a draft-mtp context (kvadvise.planner.mtp)
    nextn_bytes = [0] * n_layer_nextn
    nextn_pad = [0] * n_layer_nextn
    nextn_experts = [0] * n_layer_nextn
    for t in header.tensors:
        if (m := _BLOCK_TENSOR.match(t.name)) and n_layer <= int(m[1]) < n_layer_all:
            nextn_bytes[int(m[1]) - n_layer] += t.n_bytes
            if _EXPERT_TENSOR.search(t.name):
                nextn_experts[int(m[1]) - n_layer] += t.n_bytes
            nextn_pad[int(m[1]) - n_layer] += cuda_alloc_bytes(t.ggml_type, t.shape[0], t.n_bytes) - t.n_bytes
    every = header.tensors
    span_all = max(t.offset + t.n_bytes for t in every) - min(t.offset for t in every) if every else 0
    nextn_span = max(0, span_all - weights_bytes) if n_layer_nextn else 0
    type_bytes: Counter[str] = Counter()
    for t in header.tensors:
        if len(t.shape) >= 2:
            type_bytes[t.ggml_type.type_name] += t.n_bytes
    # The quant mix the file was made with (general.file_type), as llama.cpp prints it; without it,
    # the type that holds the most bytes (a Q4_K_M file's largest tensor can be a q8_0 embedding).
    file_type = file_type_label(header.metadata.get(General.FILE_TYPE)) or (
        type_bytes.most_common(1)[0][0] if type_bytes else "unknown"
    )

    if known_only and arch not in LLAMA_ARCHITECTURES:
        raise GGUFError(
            f"{header.source}: llama.cpp (b11312) does not know the architecture {arch!r}: it refuses to load "
            'this model ("unknown model architecture", src/llama-arch.cpp), so there is nothing to plan',
            hint="a llama.cpp build that supports it is needed; kvadvise plans only what llama.cpp can run",
        )
    verified = arch in VERIFIED
    if not verified:
        notes.append(
            f"architecture {arch!r} is not verified against llama.cpp; generic rules applied: every figure is an "
            "estimate"
        )
    if is_mla:
        notes.append("MLA: llama.cpp stores only the compressed K (V is a view of it)")
    n_expert = k.num(LLM.EXPERT_COUNT, 0)
    n_ff = k.num(LLM.FEED_FORWARD_LENGTH, 0)
    # the MoE FFN's width: expert_feed_forward_length, else feed_forward_length (llama.cpp's MoE llama models), or
    # for the Qwen-MoE family and its kin n_ff / n_expert_used (src/models/qwen3moe.cpp et al.: "n_ff_exp =
    # hparams.n_ff_exp() ? hparams.n_ff_exp() : n_ff / n_expert_used")
    n_used = k.num(LLM.EXPERT_USED_COUNT, 0)
    fallback = n_ff // n_used if arch in _N_FF_EXP_PER_USED and n_used else n_ff
    n_ff_exp = k.num(LLM.EXPERT_FEED_FORWARD_LENGTH, fallback) if n_expert else 0
    n_ff_shexp = k.num(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0) or n_ff_exp * k.num(LLM.EXPERT_SHARED_COUNT, 0)
    if arch == "llama4":  # llama4.cpp load_arch_tensors: a shared expert of n_ff_shexp = n_ff_exp in each MoE layer
        n_ff_shexp = n_ff_exp
    ssm = None
    if any(recurrent) and arch in _SSM_KIND:
        kind = _SSM_KIND[arch]
        conv = k.num(ShortConv.L_CACHE, 0) if kind == "shortconv" else k.num(SSM.CONV_KERNEL, 0)
        ssm = SSMDims(
            kind=kind,
            d_conv=conv,
            d_inner=k.num(SSM.INNER_SIZE, 0),
            d_state=k.num(SSM.STATE_SIZE, 0),
            n_group=k.num(SSM.GROUP_COUNT, 0),
            n_head=k.num(SSM.TIME_STEP_RANK, 0),
        )
    name = header.metadata.get(General.NAME)
    spec = ModelSpec(
        name=name if isinstance(name, str) and name else arch,
        architecture=arch,
        source=header.source,
        n_layer_all=n_layer_all,
        n_layer_nextn=n_layer_nextn,
        n_embd=n_embd,
        n_vocab=_n_vocab(header, k),
        n_ctx_train=_n_ctx_train(header, k, arch),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_embd_head_k_swa=n_embd_head_k_swa,
        n_embd_head_v_swa=n_embd_head_v_swa,
        n_swa=n_swa,
        swa_type=swa_type,
        swa_layers=swa_layers,
        recurrent_layers=recurrent,
        kv_layers=kv_layers,
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        is_mla=is_mla,
        n_embd_head_k_mla=k.num(Attention.KEY_LENGTH_MLA, 0) if is_mla else 0,
        n_embd_head_v_mla=k.num(Attention.VALUE_LENGTH_MLA, 0) if is_mla else 0,
        n_ff=n_ff,
        n_expert=n_expert,
        n_expert_used=k.num(LLM.EXPERT_USED_COUNT, 0),
        weights_bytes=weights_bytes,
        tok_embd_bytes=tok_embd.n_bytes if tok_embd else 0,
        input_extra_bytes=sum(t.n_bytes for t in loaded if t.name in _INPUT_EXTRA),
        # a GGUF's per_layer_token_embd, or a header made from a config.json (no tensors: the key alone)
        n_embd_per_layer=k.num(LLM.EMBEDDING_LENGTH_PER_LAYER, 0)
        if "per_layer_token_embd.weight" in by_name or not header.tensors
        else 0,
        n_altup=GEMMA3N_ALTUP if arch == "gemma3n" else 0,
        output_bytes=output.n_bytes if output else 0,
        file_type=file_type,
        verified=verified,
        notes=tuple(notes),
        expert_bytes=expert_bytes,
        layer_bytes=tuple(layer_bytes),
        layer_expert_bytes=tuple(layer_experts) if expert_bytes else (),
        layer_expert_up_bytes=tuple(layer_up) if expert_bytes else (),
        layer_expert_gate_bytes=tuple(layer_gate) if expert_bytes else (),
        cuda_pad_bytes=cuda_pad,
        layer_cuda_pad_bytes=tuple(layer_pad),
        matmul_weights=matmul_weights,
        layer_largest_tensor_bytes=tuple(layer_largest),
        fixed_span=fixed_span,
        nextn_layer_bytes=tuple(nextn_bytes),
        nextn_layer_cuda_pad_bytes=tuple(nextn_pad),
        nextn_span_bytes=nextn_span,
        nextn_layer_expert_bytes=tuple(nextn_experts) if any(nextn_experts) else (),
        active_params=active_params,
        n_ff_exp=n_ff_exp,
        n_ff_shexp=n_ff_shexp,
        parallel_block=arch in _PARALLEL_BLOCK,
        head_count_kv_in_file=k.raw(Attention.HEAD_COUNT_KV) is not None,
        # an Ollama-format blob's own vision/audio tower (v.*, mm.*, a.* tensors beside the text model's): loaded, never
        # read to decode a text token (a llama.cpp GGUF keeps its projector in a separate mmproj file)
        tower_bytes=sum(t.n_bytes for t in loaded if t.name.startswith(TOWER_PREFIXES)),
        sampling_penalty_repeat=_penalty_repeat(header),
        ssm=ssm,
        pooling=k.raw(LLM.POOLING_TYPE) is not None,
    )
    _check_widths(spec, by_name)
    return spec


def _active_params(loaded: list[TensorInfo], n_expert: int, n_expert_used: int) -> int:
    """The parameters one token multiplies by (ModelSpec.active_params): every tensor but the token
    embeddings (a row lookup; a model without output.weight multiplies by token_embd instead), the routed
    experts (ffn_*_exps, as --n-cpu-moe matches them) at n_expert_used of n_expert."""
    total = experts = embd = 0
    has_output = False
    for t in loaded:
        n = math.prod(t.shape)
        if t.name == "token_embd.weight":
            embd = n
        elif "token_embd" in t.name:  # per_layer_token_embd (Gemma 3n): looked up too
            continue
        elif _EXPERT_TENSOR.search(t.name):
            experts += n
        else:
            total += n
            has_output = has_output or t.name == "output.weight"
    used = experts * n_expert_used // n_expert if n_expert and n_expert_used else experts
    return total + used + (0 if has_output else embd)
