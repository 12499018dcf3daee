"""Hugging Face config.json -> ModelSpec, as llama.cpp sees the GGUF converted from it.

Two steps, each following the code that defines it:

1. ``convert_hf_to_gguf.py`` (llama.cpp 0c1e570, ``conversion/*.py``) decides
   which GGUF keys a config becomes. This module emulates the ``__init__`` and
   ``set_gguf_parameters`` of the converter class of each mapped architecture,
   key for key (the metadata the memory model needs, nothing else).
2. :func:`kvadvise.model.architecture.from_gguf` applies llama.cpp's per-architecture
   rules to those keys (SWA patterns, recurrent layers, MLA, NextN/MTP).
   It is reused as is, so a config.json and the GGUF converted from it give
   the same ModelSpec and no rule lives in two places.

Rules of the converter that matter for memory and are easy to get wrong:

- ``head_count_kv`` is ``num_key_value_heads``, never ``num_attention_heads``
  (when it is missing llama.cpp defaults to MHA, as transformers does).
- Only the architectures whose llama.cpp model reads a sliding window get one:
  qwen2/qwen3, llama/mistral and starcoder2 GGUFs have no SWA whatever
  ``sliding_window`` / ``use_sliding_window`` say; phi3 writes it but
  llama.cpp disables it. gemma2/gemma3/cohere2/gpt-oss use llama.cpp's own
  layer pattern (the converter writes no pattern key for them).
- deepseek2 (DeepSeek V2/V3) is MLA: head_count_kv 1, key_length
  kv_lora_rank + qk_rope_head_dim, value_length kv_lora_rank, and its MTP
  layers are dropped (``skip_mtp``), so num_nextn_predict_layers adds nothing.
- glm4moe and qwen3next/qwen35 append their MTP layers to block_count and
  write nextn_predict_layers.
- Nemotron-H (nemotron_h / nemotron_h_moe) has one mixer per block, read from
  hybrid_override_pattern: head_count_kv and feed_forward_length are per-layer
  arrays, zero except on the attention and MLP/MoE blocks.
- Gemma 4 writes its SWA layers as a bool array from layer_types, the head
  size of full-attention layers (global_head_dim) apart from the SWA ones,
  per-layer KV heads, shared KV layers and per-layer embeddings.
- context_length is max_position_embeddings as published (rope scaling such
  as yarn is written to separate keys); command-r prefers model_max_length;
  mamba2 and hybrid Granite 4 (NoPE) write 2**20.
- The encoders of Ollama's embedding models (BERT, XLM-RoBERTa: "bert"; Nomic BERT: "nomic-bert") write
  attention.causal false and tokenizer.ggml.token_type_count; XLM-RoBERTa's context is
  max_position_embeddings less 1 + pad_token_id, nomic-embed-text v1.5's the 2048 it was trained for.
- ``load_hparams`` goes through transformers' AutoConfig, which fills class
  defaults for keys a config.json omits; the nested Gemma 3 text_config relies
  on this, so Gemma3TextConfig's defaults are applied here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from kvadvise.errors import GGUFError, InputError
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import T_BOOL, T_INT32, GGUFArray, GGUFHeader, Value
from kvadvise.model.keys import LLM, SSM, Attention, General, ShortConv, Tokenizer, key
from kvadvise.model.spec import ModelSpec

__all__ = ["ARCH_BY_HF_CLASS", "ARCH_BY_MODEL_TYPE", "from_config", "gguf_metadata"]

# convert_hf_to_gguf.py dispatches on architectures[0] (ModelBase.register in
# conversion/*.py); the value is the GGUF general.architecture it writes.
ARCH_BY_HF_CLASS: Mapping[str, str] = {
    "LLaMAForCausalLM": "llama",  # llama.py LlamaModel
    "LlamaForCausalLM": "llama",
    "Llama4ForConditionalGeneration": "llama4",  # llama.py Llama4Model (the text model; the vision tower apart)
    "Llama4ForCausalLM": "llama4",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    # Mistral Small 3.1/3.2, Devstral, Magistral, Ministral 3 (conversion/mistral3.py: the text model as mistral3)
    "Mistral3ForConditionalGeneration": "mistral3",
    "Ministral3ForCausalLM": "mistral3",
    "Qwen2ForCausalLM": "qwen2",  # qwen.py Qwen2Model
    "Qwen2Model": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2moe",  # qwen.py Qwen2MoeModel
    "Qwen3ForCausalLM": "qwen3",  # qwen.py Qwen3Model
    "Qwen3Model": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",  # qwen.py Qwen3MoeModel
    "Qwen3NextForCausalLM": "qwen3next",  # qwen.py Qwen3NextModel
    "Qwen3_5ForConditionalGeneration": "qwen35",  # qwen.py Qwen3_5TextModel
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5MoeForConditionalGeneration": "qwen35moe",  # qwen.py Qwen3_5MoeTextModel
    "Qwen3_5MoeForCausalLM": "qwen35moe",
    "Gemma2ForCausalLM": "gemma2",  # gemma.py Gemma2Model
    "Gemma3ForCausalLM": "gemma3",  # gemma.py Gemma3Model
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",  # gemma.py Gemma4Model
    "Gemma4ForConditionalGeneration": "gemma4",
    "GptOssForCausalLM": "gpt-oss",  # gpt_oss.py GptOssModel
    "Phi3ForCausalLM": "phi3",  # phi.py Phi3MiniModel
    "CohereForCausalLM": "command-r",  # command_r.py CommandR2Model
    "Cohere2ForCausalLM": "cohere2",  # command_r.py Cohere2Model
    "GraniteForCausalLM": "granite",  # granite.py GraniteModel
    "GraniteMoeForCausalLM": "granitemoe",  # granite.py GraniteMoeModel
    "GraniteMoeSharedForCausalLM": "granitemoe",
    "GraniteMoeHybridForCausalLM": "granitehybrid",  # granite.py GraniteHybridModel
    "BambaForCausalLM": "granitehybrid",
    "FalconH1ForCausalLM": "falcon-h1",  # falcon_h1.py FalconH1Model
    "Ernie4_5_MoeForCausalLM": "ernie4_5-moe",  # ernie.py Ernie4_5MoeModel
    "NemotronHForCausalLM": "nemotron_h",  # nemotron.py NemotronHModel (nemotron_h_moe with experts)
    "DeepseekV2ForCausalLM": "deepseek2",  # deepseek.py DeepseekV2Model
    "DeepseekV3ForCausalLM": "deepseek2",
    "Glm4ForCausalLM": "glm4",  # glm.py Glm4Model (GLM-4-0414, GLM-Z1)
    "Glm4MoeForCausalLM": "glm4moe",  # glm.py Glm4MoeModel
    "Glm4MoeLiteForCausalLM": "deepseek2",  # glm.py Glm4MoeLiteModel(DeepseekV2Model): GLM-4.7-Flash, MLA
    "Mamba2ForCausalLM": "mamba2",  # mamba.py Mamba2Model
    "Lfm2ForCausalLM": "lfm2",  # lfm2.py LFM2Model
    "LFM2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2moe",  # lfm2.py LFM2MoeModel
    "Starcoder2ForCausalLM": "starcoder2",  # starcoder.py StarCoder2Model
    "ChatGLMModel": "chatglm",  # glm.py ChatGLMModel (GLM-4-9B-chat, Ollama's glm4)
    "ChatGLMForConditionalGeneration": "chatglm",
    # the encoders Ollama's embedding models are (conversion/bert.py): BertModel and XLMRobertaModel write
    # llama.cpp's "bert", NomicBertModel "nomic-bert" (nomic-bert-moe with moe_every_n_layers, not mapped)
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
    "XLMRobertaModel": "bert",
    "NomicBertModel": "nomic-bert",
}

# For a config.json without "architectures": its model_type (top level or text_config).
ARCH_BY_MODEL_TYPE: Mapping[str, str] = {
    "llama": "llama",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe": "qwen35moe",
    "qwen3_5_moe_text": "qwen35moe",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "gpt_oss": "gpt-oss",
    "phi3": "phi3",
    "cohere": "command-r",
    "cohere2": "cohere2",
    "granite": "granite",
    "granitemoe": "granitemoe",
    "granitemoeshared": "granitemoe",
    "granitemoehybrid": "granitehybrid",
    "bamba": "granitehybrid",
    "falcon_h1": "falcon-h1",
    "ernie4_5_moe": "ernie4_5-moe",
    "nemotron_h": "nemotron_h",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
    "glm4": "glm4",
    "glm4_moe": "glm4moe",
    "glm4_moe_lite": "deepseek2",
    "mamba2": "mamba2",
    "lfm2": "lfm2",
    "lfm2_moe": "lfm2moe",
    "starcoder2": "starcoder2",
    "chatglm": "chatglm",
    "bert": "bert",
    "xlm-roberta": "bert",
    "nomic_bert": "nomic-bert",
}

# transformers Gemma3TextConfig.__init__ defaults (configuration_gemma3.py). The
# converter loads configs through AutoConfig, so a slim text_config (gemma-3-4b-it
# lists only a few keys) gets these; gemma.py Gemma3Model repeats some as fallbacks.
_GEMMA3_TEXT_DEFAULTS: Mapping[str, object] = {
    "vocab_size": 262_208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
}

_LLAMA4_TEXT_DEFAULTS: Mapping[str, object] = {
    # transformers' Llama4TextConfig.__init__ defaults (configuration_llama4.py): save_pretrained drops a sub-config's
    # keys equal to them (to_diff_dict), and the converter reads the config through AutoConfig, which restores them
    "vocab_size": 202048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "rope_theta": 500000.0,
}

# by architecture: the text_config defaults AutoConfig fills in (convert_hf_to_gguf reads the config through it)
_TEXT_DEFAULTS: Mapping[str, Mapping[str, object]] = {"gemma3": _GEMMA3_TEXT_DEFAULTS, "llama4": _LLAMA4_TEXT_DEFAULTS}

# What no real model exceeds; larger values are typos or hostile input.
_U32_MAX = (1 << 32) - 1
_MAX_LAYERS = 10_000
_MAX_DIM = 1 << 20  # widths, head sizes, head and expert counts
_MAX_VOCAB = 1 << 24
_LIMITS: Mapping[str, int] = {
    "max_position_embeddings": _U32_MAX,
    "model_max_length": _U32_MAX,
    "n_ctx": _U32_MAX,
    "n_positions": _U32_MAX,
    "max_length": _U32_MAX,
    "max_sequence_length": _U32_MAX,
    "sliding_window": _U32_MAX,
    "vocab_size": _MAX_VOCAB,
    "n_layers": _MAX_LAYERS,
    "num_hidden_layers": _MAX_LAYERS,
    "n_layer": _MAX_LAYERS,
    "num_layers": _MAX_LAYERS,
    "num_nextn_predict_layers": _MAX_LAYERS,
    "mtp_num_hidden_layers": _MAX_LAYERS,
}

# Renames in ModelBase.load_hparams (conversion/base.py): these become text_config.
_TEXT_CONFIG_ALIASES = ("llm_config", "lm_config", "language_config", "lfm")
_LAYER_KEYS = ("n_layers", "num_hidden_layers", "n_layer", "num_layers")
_CTX_KEYS = ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length")
_EMBD_KEYS = ("hidden_size", "n_embd", "dim")
_FF_KEYS = ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner", "hidden_dim")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")
_HEAD_KV_KEYS = ("num_key_value_heads", "n_kv_heads")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_EXPERT_USED_KEYS = ("num_experts_per_tok", "num_experts_per_token", "top_k_experts")
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
# expert counts by the names configs give them (ERNIE 4.5: moe_num_experts). An unmapped config with experts is
# refused: where its experts sit (dense leading blocks, an interleave step), their width and any shared experts are
# rules of each converter class, and the generic keys would plan it as a dense model or guess them
_MOE_COUNT_KEYS = (*_EXPERT_KEYS, "moe_num_experts", "num_routed_experts", "n_experts")


class _HParams:
    """The converter's ``self.hparams``: text_config merged over the top level (TextModel.__init__)."""

    def __init__(self, config: Mapping[str, object], source: str) -> None:
        self.source = source
        top = dict(config)
        for alias in _TEXT_CONFIG_ALIASES:
            if alias in top:
                top["text_config"] = top[alias]
        thinker = top.get("thinker_config")
        if isinstance(thinker, Mapping) and "text_config" in thinker:
            top["text_config"] = thinker["text_config"]
        text = top.get("text_config")
        if text is not None and not isinstance(text, Mapping):
            raise InputError(f"{source}: text_config should be a JSON object, got {type(text).__name__}")
        self.top: dict[str, object] = top
        self.text: Mapping[str, object] = text or {}
        self.hp: dict[str, object] = {**top, **self.text}

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.source}: {what}")

    def get(self, key: str, default: object = None) -> object:
        return self.hp.get(key, default)

    def find(self, keys: Iterable[str]) -> tuple[str, object] | None:
        """ModelBase.find_hparam: the first key present (its value may be null)."""
        for k in keys:
            if k in self.hp:
                return k, self.hp[k]
        return None

    def check_int(self, key: str, v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(f"{key} should be a whole number, got {v!r}")
        if isinstance(v, float):
            if not v.is_integer():
                raise self.fail(f"{key} should be a whole number, got {v!r}")
            v = int(v)
        if v < 0:
            raise self.fail(f"{key} is negative ({v})")
        limit = _LIMITS.get(key, _MAX_DIM)
        if v > limit:
            raise self.fail(f"{key} is {v}, larger than any real model (limit {limit})")
        return v

    def num(self, keys: Sequence[str]) -> int | None:
        """find_hparam(keys, optional=True), checked; None when absent or null."""
        found = self.find(keys)
        if found is None or found[1] is None:
            return None
        return self.check_int(*found)

    def need(self, keys: Sequence[str], why: str = "") -> int:
        v = self.num(keys)
        if v is None:
            names = " / ".join(keys)
            raise self.fail(f"{names} is missing" + (f" ({why})" if why else ""))
        return v

    def strs(self, key: str, n: int) -> list[str] | None:
        v = self.hp.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(f"{key} should be a list of strings")
        if len(v) != n:
            raise self.fail(f"{key} has {len(v)} entries for {n} layers")
        return list(v)


class _Writer:
    """gguf_writer: later writes of a key overwrite earlier ones (GGUFWriter.add_key_value)."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.md: dict[str, Value] = {General.ARCHITECTURE: arch}
        self.block_count = 0

    def put(self, template: str, value: Value | None) -> None:
        if value is not None:
            self.md[key(template, self.arch)] = value

    def ints(self, template: str, values: Sequence[int]) -> None:
        self.md[key(template, self.arch)] = GGUFArray(T_INT32, len(values), tuple(values))

    def bools(self, template: str, values: Sequence[bool]) -> None:
        self.md[key(template, self.arch)] = GGUFArray(T_BOOL, len(values), tuple(values))


_Convert = Callable[[_HParams, _Writer, list[str]], None]


def _text_model(hp: _HParams, w: _Writer) -> None:
    """TextModel.set_gguf_parameters (conversion/base.py), the keys every architecture starts from."""
    w.put(LLM.BLOCK_COUNT, w.block_count)
    w.put(LLM.CONTEXT_LENGTH, hp.num(_CTX_KEYS))
    w.put(LLM.EMBEDDING_LENGTH, hp.num(_EMBD_KEYS))
    w.put(LLM.FEED_FORWARD_LENGTH, hp.num(_FF_KEYS))
    w.put(Attention.HEAD_COUNT, hp.num(_HEAD_KEYS))
    kv = hp.find(_HEAD_KV_KEYS)
    if kv is not None and isinstance(kv[1], list):  # per-layer list set by lfm2 / lfm2moe
        w.ints(Attention.HEAD_COUNT_KV, [hp.check_int(kv[0], x) for x in kv[1]])
    else:
        w.put(Attention.HEAD_COUNT_KV, hp.num(_HEAD_KV_KEYS))
    w.put(LLM.EXPERT_COUNT, hp.num(_EXPERT_KEYS))
    w.put(LLM.EXPERT_USED_COUNT, hp.num(_EXPERT_USED_KEYS))
    # The MoE widths the converters write (qwen.py, deepseek.py, glm.py: expert_feed_forward_length from
    # moe_intermediate_size; the shared experts' width or count): they size the compute buffer's expert
    # activations (kvadvise.planner.memory); absent, llama.cpp's MoE llama models use feed_forward_length.
    w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, hp.num(("moe_intermediate_size",)))
    w.put(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, hp.num(("shared_expert_intermediate_size",)))
    w.put(LLM.EXPERT_SHARED_COUNT, hp.num(("n_shared_experts", "num_shared_experts")))
    head_dim = hp.num(("head_dim",))
    w.put(Attention.KEY_LENGTH, head_dim)
    w.put(Attention.VALUE_LENGTH, head_dim)


def _vocab(hp: _HParams, w: _Writer, pad: int = 1) -> None:
    """n_vocab: the token list the converter writes has vocab_size entries (padded for Mamba-2)."""
    v = hp.num(("vocab_size",))
    if not v:  # conversion/base.py get_vocab_base asserts the tokenizer's ids < vocab_size; without one it counts
        # the tokenizer's, which a config.json alone does not have: no embeddings, output or logits would be planned
        raise hp.fail(f"vocab_size is {'missing' if v is None else 0}: the vocabulary is not known")
    w.put(LLM.VOCAB_SIZE, -(v // -pad) * pad)


def _generic(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    _text_model(hp, w)
    _vocab(hp, w)


def _llama(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """llama.py LlamaModel: TextModel keys + vocab_size. Mistral's sliding_window is not written."""
    _generic(hp, w, notes)


def _granite(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """granite.py GraniteModel: pops head_dim ("No head_dim support"), then LlamaModel."""
    hp.hp.pop("head_dim", None)
    _llama(hp, w, notes)


def _granite_shared(hp: _HParams, w: _Writer) -> None:
    """granite.py GraniteMoeModel.set_gguf_parameters (GraniteMoeShared, and GraniteHybridModel through it): the
    shared experts' width from shared_intermediate_size when set (granite-moe.cpp / granite-hybrid.cpp create
    ffn_{gate,up,down}_shexp beside the routed experts when n_ff_shexp > 0)."""
    if shared_ff := hp.num(("shared_intermediate_size",)):
        w.put(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, shared_ff)


def _granitemoe(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """granite.py GraniteMoeModel: GraniteModel's keys + the shared experts' width."""
    _granite(hp, w, notes)
    _granite_shared(hp, w)


def _llama4(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """llama.py Llama4Model: intermediate_size is the experts' width (expert_feed_forward_length) and
    intermediate_size_mlp the dense layers' (feed_forward_length); interleave_moe_layer_step places the MoE
    layers (llama4.cpp: (il + 1) % step == 0), each with a shared expert as wide as a routed one. No
    sliding_window is written unless every layer_types entry is full_attention (then 0): llama.cpp's llama4
    uses chunked attention of 8192 tokens on 3 layers of 4."""
    why = "Llama 4"
    if not hp.num(_EXPERT_KEYS):  # llama4.cpp load_arch_tensors: "model cannot have zero experts"
        raise hp.fail("num_local_experts is 0: llama.cpp's llama4 cannot have zero experts (load_arch_tensors)")
    moe_ff = hp.need(("intermediate_size",), why)
    hp.hp["intermediate_size"] = hp.need(("intermediate_size_mlp",), why)  # Llama4Model.__init__ swaps them
    _llama(hp, w, notes)
    w.put(LLM.INTERLEAVE_MOE_LAYER_STEP, hp.need(("interleave_moe_layer_step",), why))
    w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, moe_ff)
    layer_types = hp.get("layer_types")
    nope = hp.get("no_rope_layers")
    if layer_types is None and isinstance(nope, list) and nope:  # Llama4TextConfig: full attention where no RoPE
        layer_types = ["chunked_attention" if x else "full_attention" for x in nope]
    if isinstance(layer_types, list) and all(t == "full_attention" for t in layer_types):
        w.put(Attention.SLIDING_WINDOW, 0)  # "all layers are full attention (for MobileLLM), disable swa"


def _ernie45moe(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """ernie.py Ernie4_5MoeModel: TextModel keys + moe_num_experts / moe_k, moe_layer_interval as the interleave
    step, moe_layer_start_index dense leading blocks, moe_intermediate_size, and with shared experts their count
    and a width of intermediate_size // num_key_value_heads (the converter's rule)."""
    why = "ERNIE 4.5 MoE"
    _text_model(hp, w)
    w.put(LLM.EXPERT_COUNT, hp.need(("moe_num_experts",), why))
    w.put(LLM.EXPERT_USED_COUNT, hp.need(("moe_k",), why))
    step = hp.need(("moe_layer_interval",), why)
    if step == 0:  # ernie4-5-moe.cpp: GGML_ASSERT(n_moe_layer_step > 0)
        raise hp.fail("moe_layer_interval is 0: llama.cpp's ernie4_5-moe requires a step > 0")
    w.put(LLM.INTERLEAVE_MOE_LAYER_STEP, step)
    w.put(LLM.LEADING_DENSE_BLOCK_COUNT, hp.need(("moe_layer_start_index",), why))
    w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, hp.num(("moe_intermediate_size",)))
    n_shared = hp.num(("moe_num_shared_experts",))
    if n_shared is not None:
        w.put(LLM.EXPERT_SHARED_COUNT, n_shared)
        ff, kv = hp.num(("intermediate_size",)), hp.num(("num_key_value_heads",))
        if n_shared > 0 and ff is not None and kv:
            w.put(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, ff // kv)
    _vocab(hp, w)


def _gemma2(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """gemma.py Gemma2Model: its own keys; head_count_kv falls back to head_count; sliding_window."""
    w.put(LLM.CONTEXT_LENGTH, hp.num(("max_position_embeddings",)))
    w.put(LLM.EMBEDDING_LENGTH, hp.num(("hidden_size",)))
    w.put(LLM.BLOCK_COUNT, w.block_count)
    w.put(LLM.FEED_FORWARD_LENGTH, hp.num(("intermediate_size",)))
    n_head = hp.num(("num_attention_heads",))
    w.put(Attention.HEAD_COUNT, n_head)
    kv = hp.num(("num_key_value_heads",))
    w.put(Attention.HEAD_COUNT_KV, kv if kv is not None else n_head)
    head_dim = hp.num(("head_dim",))
    w.put(Attention.KEY_LENGTH, head_dim)
    w.put(Attention.VALUE_LENGTH, head_dim)
    w.put(Attention.SLIDING_WINDOW, hp.num(("sliding_window",)))  # absent: llama.cpp's gemma2 default 4096
    _vocab(hp, w)


def _gemma3(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """gemma.py Gemma3Model: sliding_window unless sliding_window_pattern == 1 (llama.cpp uses pattern 6)."""
    _text_model(hp, w)
    if hp.get("sliding_window_pattern") != 1:
        w.put(Attention.SLIDING_WINDOW, hp.need(("sliding_window",)))
    _vocab(hp, w)


def _gemma4(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """gemma.py Gemma4Model over Gemma3Model.set_gguf_parameters: the SWA layers from layer_types (a bool
    array), global_head_dim on full-attention layers and head_dim on SWA ones, shared KV layers, per-layer
    embeddings, and per-layer KV heads when num_global_key_value_heads is set; use_double_wide_mlp doubles
    the FFN of the KV-shared layers."""
    n_layer = w.block_count
    layer_types = hp.strs("layer_types", n_layer)
    if layer_types is None:
        raise hp.fail("layer_types is missing (Gemma 4 writes its SWA pattern from it)")
    swa = [t == "sliding_attention" for t in layer_types]
    _text_model(hp, w)
    w.put(LLM.CONTEXT_LENGTH, hp.num(("max_position_embeddings",)) or 131_072)  # Gemma3Model's defaults
    w.put(Attention.HEAD_COUNT, hp.num(("num_attention_heads",)) or 8)
    if hp.get("sliding_window_pattern") != 1:
        w.put(Attention.SLIDING_WINDOW, hp.need(("sliding_window",)))
    n_kv_swa = hp.num(("num_key_value_heads",))
    w.put(Attention.HEAD_COUNT_KV, 4 if n_kv_swa is None else n_kv_swa)
    shared = hp.num(("num_kv_shared_layers",)) or 0
    w.put(Attention.SHARED_KV_LAYERS, shared)
    w.put(LLM.EMBEDDING_LENGTH_PER_LAYER, hp.num(("hidden_size_per_layer_input",)) or 0)
    w.bools(Attention.SLIDING_WINDOW_PATTERN, swa)
    head_full = hp.need(("global_head_dim",), "Gemma 4 full-attention head size")
    head_swa = hp.num(("head_dim",)) or 256
    w.put(Attention.KEY_LENGTH, head_full)
    w.put(Attention.VALUE_LENGTH, head_full)
    w.put(Attention.KEY_LENGTH_SWA, head_swa)
    w.put(Attention.VALUE_LENGTH_SWA, head_swa)
    w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, hp.num(("expert_intermediate_size", "moe_intermediate_size")))
    n_ff = hp.num(("intermediate_size",))
    if hp.get("use_double_wide_mlp") and n_ff is not None:
        w.ints(LLM.FEED_FORWARD_LENGTH, [n_ff if il < n_layer - shared else 2 * n_ff for il in range(n_layer)])
    n_kv_full = hp.num(("num_global_key_value_heads",))
    if n_kv_full is not None and n_kv_swa is not None:
        w.ints(Attention.HEAD_COUNT_KV, [n_kv_swa if s else n_kv_full for s in swa])
    _vocab(hp, w)


def _gpt_oss(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """gpt_oss.py GptOssModel: TextModel keys + hparams["sliding_window"]; llama.cpp uses pattern 2."""
    _text_model(hp, w)
    w.put(Attention.SLIDING_WINDOW, hp.need(("sliding_window",), "convert_hf_to_gguf.py requires it for gpt-oss"))
    _vocab(hp, w)


def _phi3(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """phi.py Phi3MiniModel: its own keys, no key_length; sliding_window (llama.cpp disables Phi SWA)."""
    w.put(LLM.CONTEXT_LENGTH, hp.num(("n_positions", "max_position_embeddings")))
    w.put(LLM.EMBEDDING_LENGTH, hp.num(("hidden_size", "n_embd")))
    w.put(LLM.FEED_FORWARD_LENGTH, hp.num(("intermediate_size",)))
    w.put(LLM.BLOCK_COUNT, w.block_count)
    n_head = hp.num(("num_attention_heads", "n_head"))
    w.put(Attention.HEAD_COUNT, n_head)
    kv = hp.num(("num_key_value_heads", "n_head_kv"))
    w.put(Attention.HEAD_COUNT_KV, kv if kv is not None else n_head)  # AutoConfig: None -> MHA
    w.put(Attention.SLIDING_WINDOW, hp.num(("sliding_window",)) or 0)
    _vocab(hp, w)


def _command_r(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """command_r.py CommandR2Model: max_position_embeddings = model_max_length if present."""
    ctx = hp.find(("model_max_length", "max_position_embeddings"))
    if ctx is not None:
        hp.hp["max_position_embeddings"] = ctx[1]
    _generic(hp, w, notes)


def _cohere2(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """command_r.py Cohere2Model: TextModel keys + sliding_window; llama.cpp uses pattern 4."""
    _text_model(hp, w)
    w.put(Attention.SLIDING_WINDOW, hp.need(("sliding_window",), "convert_hf_to_gguf.py requires it for cohere2"))
    _vocab(hp, w)


def _deepseek2(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """deepseek.py DeepseekV2Model: MLA as MQA with one wide KV head; MTP layers skipped. glm.py Glm4MoeLiteModel
    (GLM-4.7-Flash, b11312) converts as it does but keeps its MTP layers: appended to block_count, with
    nextn_predict_layers written (the main context's cache leaves them out: llama_model::create_memory)."""
    archs = hp.top.get("architectures")
    lite = hp.top.get("model_type") == "glm4_moe_lite" or (
        isinstance(archs, list) and "Glm4MoeLiteForCausalLM" in archs
    )
    nextn = (hp.num(("num_nextn_predict_layers",)) or 0) if lite else 0
    w.block_count += nextn
    hp.hp["num_key_value_heads"] = 1
    _text_model(hp, w)
    kv_lora_rank = hp.num(("kv_lora_rank",)) if "kv_lora_rank" in hp.hp else 512
    if kv_lora_rank is None:
        raise hp.fail("kv_lora_rank is null")
    rope = hp.need(("qk_rope_head_dim",), "DeepSeek MLA")
    nope = hp.need(("qk_nope_head_dim",), "DeepSeek MLA")
    v_head = hp.need(("v_head_dim",), "DeepSeek MLA")
    w.put(Attention.KV_LORA_RANK, kv_lora_rank)
    w.put(Attention.KEY_LENGTH, kv_lora_rank + rope)
    w.put(Attention.VALUE_LENGTH, kv_lora_rank)
    w.put(Attention.KEY_LENGTH_MLA, nope + rope)
    w.put(Attention.VALUE_LENGTH_MLA, v_head)
    w.put(LLM.EXPERT_COUNT, hp.num(("n_routed_experts",)))
    if nextn:
        w.put(LLM.NEXTN_PREDICT_LAYERS, nextn)
    _vocab(hp, w)
    if hp.num(("num_nextn_predict_layers",)) and not lite:
        notes.append("the DeepSeek MTP layers (num_nextn_predict_layers) are dropped by convert_hf_to_gguf.py")


def _glm4(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """glm.py Glm4Model (conversion/glm.py, read at 051139f5): TextModel keys + the token list; it adds
    rope.dimension_count (head_dim x
    partial_rotary_factor, 0.5 by default), which sizes no buffer (the partial rope keeps Q and K's shape)."""
    _generic(hp, w, notes)


def _glm4moe(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """glm.py Glm4MoeModel: MTP layers appended to block_count, nextn_predict_layers written."""
    nextn = hp.num(("num_nextn_predict_layers",)) or 0
    w.block_count += nextn
    _text_model(hp, w)
    w.put(LLM.EXPERT_COUNT, hp.num(("n_routed_experts",)))
    if nextn:
        w.put(LLM.NEXTN_PREDICT_LAYERS, nextn)
    _vocab(hp, w)


def _qwen3next(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """qwen.py Qwen3NextModel (and Qwen3.5 / 3.5-MoE): Gated DeltaNet layers + MTP."""
    n_layer = w.block_count
    n_mtp = hp.num(("mtp_num_hidden_layers",)) or 0
    if n_mtp == 0 and w.arch == "qwen3next":
        notes.append("Qwen3-Next MTP layers are counted from the weights by the converter; not in config.json")
    w.block_count += n_mtp
    _text_model(hp, w)
    if n_mtp:
        w.put(LLM.NEXTN_PREDICT_LAYERS, n_mtp)
    why = "Gated DeltaNet layers"
    w.put(SSM.CONV_KERNEL, hp.need(("linear_conv_kernel_dim",), why))
    w.put(SSM.STATE_SIZE, hp.need(("linear_key_head_dim",), why))
    w.put(SSM.GROUP_COUNT, hp.need(("linear_num_key_heads",), why))
    n_v_heads = hp.need(("linear_num_value_heads",), why)
    w.put(SSM.TIME_STEP_RANK, n_v_heads)
    w.put(SSM.INNER_SIZE, hp.need(("linear_value_head_dim",), why) * n_v_heads)
    layer_types = hp.strs("layer_types", n_layer)
    if layer_types is not None:
        w.bools(Attention.RECURRENT_LAYERS, [t == "linear_attention" for t in layer_types] + [False] * n_mtp)
    interval = hp.num(("full_attention_interval",))
    w.put(LLM.FULL_ATTENTION_INTERVAL, 4 if interval is None else interval)
    # Qwen2MoeModel.set_gguf_parameters, which Qwen3NextModel extends (absent in the dense Qwen3.5)
    w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, hp.num(("moe_intermediate_size",)))
    w.put(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, hp.num(("shared_expert_intermediate_size",)))
    _vocab(hp, w)


def _mamba2(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """mamba.py Mamba2Model (reads config.json directly, no AutoConfig)."""
    d_model = hp.need(("hidden_size", "d_model", "dim"))
    expand = hp.num(("mamba_expand", "expand")) or 2
    d_inner = hp.num(("mamba_d_ssm", "intermediate_size", "d_inner")) or expand * d_model
    n_group = hp.num(("n_groups",)) or 1
    d_conv = hp.num(("conv_kernel", "d_conv")) or 4
    d_state = hp.num(("state_size", "d_state")) or 128
    head_dim = hp.num(("mamba_d_head", "head_dim")) or 64
    w.put(LLM.CONTEXT_LENGTH, 1 << 20)  # "arbitrary value; for those who use the default"
    w.put(LLM.EMBEDDING_LENGTH, d_model)
    w.put(LLM.FEED_FORWARD_LENGTH, 0)
    w.put(Attention.HEAD_COUNT, 0)
    w.put(LLM.BLOCK_COUNT, w.block_count)
    w.put(SSM.CONV_KERNEL, d_conv)
    w.put(SSM.INNER_SIZE, d_inner)
    w.put(SSM.STATE_SIZE, d_state)
    w.put(SSM.TIME_STEP_RANK, d_inner // head_dim if head_dim else 0)
    w.put(SSM.GROUP_COUNT, n_group)
    pad = hp.num(("pad_vocab_size_multiple",)) or 16  # Mamba2Model.set_vocab rounds the vocab up
    _vocab(hp, w, pad)


def _falcon_h1(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """falcon_h1.py FalconH1Model over Mamba2Model (config.json read directly; find_hparam with the "mamba"
    prefix): Mamba2Model's SSM keys with d_inner = mamba_d_ssm and time_step_rank d_inner // mamba_d_head, then the
    attention and FFN keys over its zeros. llama.cpp's falcon-h1 (falcon-h1.cpp load_arch_hparams) makes every
    layer recurrent as well as attention: architecture._RECURRENT_AND_ATTENTION."""

    def find(keys: Sequence[str]) -> int | None:  # FalconH1Model.find_hparam: the keys, then "mamba_" + each
        return hp.num([*keys, *(f"mamba_{k}" for k in keys)])

    why = "Falcon-H1"
    d_inner = find(("mamba_d_ssm",))
    n_group = find(("n_groups",))
    d_head = find(("d_head",))
    if d_inner is None or n_group is None or d_head is None:
        raise hp.fail("mamba_d_ssm / mamba_n_groups / mamba_d_head is missing (Falcon-H1's Mamba-2 mixer)")
    if not d_head or d_inner % d_head:  # FalconH1Model.set_gguf_parameters asserts it
        raise hp.fail(f"mamba_d_ssm ({d_inner}) is not a multiple of mamba_d_head ({d_head})")
    head_dim = find(("mamba_d_head", "head_dim")) or 64  # Mamba2Model.set_gguf_parameters
    w.put(LLM.EMBEDDING_LENGTH, hp.need(("hidden_size", "d_model", "dim")))
    w.put(LLM.BLOCK_COUNT, w.block_count)
    w.put(LLM.CONTEXT_LENGTH, hp.num(("max_position_embeddings",)) or 0)  # over Mamba2Model's 2**20
    w.put(LLM.FEED_FORWARD_LENGTH, hp.need(("intermediate_size",), why))
    w.put(Attention.HEAD_COUNT, hp.need(("num_attention_heads",), why))
    w.put(Attention.HEAD_COUNT_KV, hp.need(("num_key_value_heads",), why))
    head = hp.need(("head_dim",), why)
    w.put(Attention.KEY_LENGTH, head)
    w.put(Attention.VALUE_LENGTH, head)
    w.put(SSM.CONV_KERNEL, find(("conv_kernel", "d_conv")) or 4)
    w.put(SSM.INNER_SIZE, d_inner)
    w.put(SSM.STATE_SIZE, find(("state_size", "d_state")) or 128)
    w.put(SSM.TIME_STEP_RANK, d_inner // head_dim)
    w.put(SSM.GROUP_COUNT, n_group)
    _vocab(hp, w)  # set_vocab is _set_vocab_gpt2: vocab_size entries, not padded as Mamba2Model pads


def _granitehybrid(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """granite.py GraniteHybridModel: Mamba-2 layers (head_count_kv 0) + attention layers; mamba_* keys."""
    n_layer = w.block_count

    def find(keys: Sequence[str]) -> int | None:  # find_hparam with the "mamba" prefix
        return hp.num([*keys, *(f"mamba_{k}" for k in keys)])

    layer_types = hp.strs("layer_types", n_layer)
    if layer_types is not None:
        attn = [i for i, t in enumerate(layer_types) if t == "attention"]
    elif isinstance(idx := hp.get("attn_layer_indices"), list) and idx:
        attn = [hp.check_int("attn_layer_indices", i) for i in idx]
    else:
        period = hp.num(("attn_layer_period",))
        offset = hp.num(("attn_layer_offset",))
        if not period or offset is None:
            raise hp.fail("layer_types (or attn_layer_indices / attn_layer_period) is missing for a hybrid Granite")
        attn = [i for i in range(n_layer) if i % period == offset]
    has_ssm = len(set(attn)) < n_layer
    if not has_ssm:  # "non-hybrid" members of the family become granite / granitemoe
        # GraniteHybridModel.__init__: has_experts is find_hparam's value, so num_experts_per_tok 0 (granite-4.0-micro,
        # -1b, -350m) is a dense "granite", not "granitemoe"
        used = hp.find(("num_experts_per_tok", "num_experts_per_token"))
        w.arch = "granitemoe" if used is not None and used[1] else "granite"
        w.md = {General.ARCHITECTURE: w.arch}
        _granitemoe(hp, w, notes)  # set_gguf_parameters is GraniteMoeModel's in either case
        return
    hp.hp.pop("head_dim", None)  # GraniteModel
    _text_model(hp, w)
    _granite_shared(hp, w)
    d_model = find(("mamba_head_dim", "hidden_size", "d_model"))
    if not d_model:
        raise hp.fail("hidden_size is missing")
    n_group = find(("n_groups", "num_groups"))
    if n_group is None:
        notes.append("mamba_n_groups is missing (the converter requires it); assumed 1")
        n_group = 1
    expand = find(("expand", "num_heads"))
    if expand is None:
        raise hp.fail("mamba_expand is missing (hybrid Granite)")
    d_conv, d_state = find(("conv_kernel", "d_conv")), find(("state_size", "d_state", "state_dim", "ssm_state_size"))
    if d_conv is None or d_state is None:
        raise hp.fail("mamba_d_conv / mamba_d_state is missing (hybrid Granite)")
    w.put(SSM.CONV_KERNEL, d_conv)
    w.put(SSM.STATE_SIZE, d_state)
    w.put(SSM.GROUP_COUNT, n_group)
    w.put(SSM.INNER_SIZE, expand * d_model)
    w.put(SSM.TIME_STEP_RANK, find(("n_heads", "num_heads")))
    kv = hp.need(("num_key_value_heads", "n_head_kv", "mamba_num_key_value_heads", "mamba_n_head_kv"))
    w.ints(Attention.HEAD_COUNT_KV, [kv if i in attn else 0 for i in range(n_layer)])
    archs = hp.top.get("architectures")
    if not (isinstance(archs, list) and "BambaForCausalLM" in archs):
        w.put(LLM.CONTEXT_LENGTH, 1 << 20)  # no RoPE: the converter writes 2**20 over max_position_embeddings
    _vocab(hp, w, 8)


def _nemotron_h(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """nemotron.py NemotronHModel over GraniteHybridModel: one mixer per block, from hybrid_override_pattern
    ("M" Mamba-2, "*" attention, "-" MLP, "E" MoE); nemotron_h_moe when the config has num_experts_per_tok.
    head_count_kv is 0 except on attention blocks and feed_forward_length 0 except on MLP/MoE blocks,
    which is how llama.cpp tells the recurrent blocks apart (nemotron-h.cpp: n_head_kv == 0 && n_ff == 0)."""
    moe = "num_experts_per_tok" in hp.hp
    if moe:
        w.arch = "nemotron_h_moe"
        w.md = {General.ARCHITECTURE: w.arch}
    pattern = hp.get("hybrid_override_pattern") or hp.get("layers_block_type")
    if isinstance(pattern, list):
        w.block_count = len(pattern)
        kinds = ["*" if p in ("attention", "full_attention") else "E" if p == "moe" else "M" for p in pattern]
    elif isinstance(pattern, str) and len(pattern) == w.block_count:
        kinds = list(pattern)
    else:
        raise hp.fail(f"hybrid_override_pattern should name the {w.block_count} blocks (M, *, - or E)")
    mlp = "E" if moe else "-"
    n_mtp = (hp.num(("num_nextn_predict_layers",)) or 0) if moe else 0
    if n_mtp:  # the MTP head becomes one trailing block with an attention and a MoE sub-layer
        kinds.append("+")
        w.block_count += 1

    def find(keys: Sequence[str]) -> int | None:  # GraniteHybridModel.find_hparam, "mamba" prefix
        return hp.num([*keys, *(f"mamba_{k}" for k in keys)])

    head_dim = hp.num(("head_dim", "attention_head_dim"))
    if head_dim is None:
        raise hp.fail("head_dim is missing (Nemotron-H attention)")
    hp.hp.pop("head_dim", None)  # GraniteModel: "No head_dim support"; NemotronHModel writes its own
    _text_model(hp, w)
    d_model = find(("mamba_head_dim", "hidden_size", "d_model"))
    n_heads = find(("num_heads",))
    n_group = find(("n_groups", "num_groups"))
    d_conv = find(("conv_kernel", "d_conv"))
    d_state = find(("state_size", "d_state", "state_dim", "ssm_state_size"))
    if None in (d_model, n_heads, n_group, d_conv, d_state):
        raise hp.fail("mamba_head_dim / mamba_num_heads / n_groups / conv_kernel / ssm_state_size is missing")
    assert d_model is not None and n_heads is not None
    w.put(SSM.CONV_KERNEL, d_conv)
    w.put(SSM.STATE_SIZE, d_state)
    w.put(SSM.GROUP_COUNT, n_group)
    w.put(SSM.INNER_SIZE, n_heads * d_model)  # NemotronHModel: d_inner = num_heads * mamba_head_dim
    w.put(SSM.TIME_STEP_RANK, find(("n_heads", "num_heads")))
    kv = hp.need(("num_key_value_heads", "n_head_kv"))
    w.ints(Attention.HEAD_COUNT_KV, [kv if k in "*+" else 0 for k in kinds])
    w.put(LLM.CONTEXT_LENGTH, 1 << 20)  # GraniteHybridModel: no RoPE, so context_length 2**20
    w.put(Attention.KEY_LENGTH, head_dim)
    w.put(Attention.VALUE_LENGTH, head_dim)
    ff = hp.need(("moe_intermediate_size",) if moe else ("intermediate_size", "n_inner", "hidden_dim"))
    w.ints(LLM.FEED_FORWARD_LENGTH, [ff if k in (mlp, "+") else 0 for k in kinds])
    if moe:
        w.put(LLM.EXPERT_FEED_FORWARD_LENGTH, ff)
        w.put(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, hp.need(("moe_shared_expert_intermediate_size",)))
        w.put(LLM.EXPERT_COUNT, hp.need(("n_routed_experts",)))
        w.put(LLM.EXPERT_SHARED_COUNT, hp.num(("n_shared_experts",)))
        w.put(LLM.MOE_LATENT_SIZE, hp.num(("moe_latent_size",)))
    if n_mtp:
        w.put(LLM.NEXTN_PREDICT_LAYERS, n_mtp)
    _vocab(hp, w, 8)  # NemotronHModel.set_vocab pads to a multiple of 8


def _lfm2(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """lfm2.py LFM2Model / LFM2MoeModel: head_count_kv 0 on the short-conv layers."""
    n_layer = w.block_count
    layer_types = hp.strs("layer_types", n_layer)
    if layer_types is None:  # transformers Lfm2Config builds layer_types from full_attn_idxs
        idxs = hp.get("full_attn_idxs")
        if not isinstance(idxs, list):
            raise hp.fail("layer_types (or full_attn_idxs) is missing for LFM2")
        full = {hp.check_int("full_attn_idxs", i) for i in idxs}
        layer_types = ["full_attention" if i in full else "conv" for i in range(n_layer)]
    kv = hp.need(("num_key_value_heads",))
    if w.arch == "lfm2":
        hp.hp["num_key_value_heads"] = [kv if t != "conv" else 0 for t in layer_types]
    else:
        hp.hp["num_key_value_heads"] = [kv if t == "full_attention" else 0 for t in layer_types]
    _text_model(hp, w)
    w.put(ShortConv.L_CACHE, hp.need(("conv_L_cache",), "LFM2 short convolutions"))
    if w.arch == "lfm2moe":  # lfm2.py LFM2MoeModel: the leading dense blocks
        w.put(LLM.LEADING_DENSE_BLOCK_COUNT, hp.need(("num_dense_layers",), "LFM2-MoE"))
    elif hp.get("block_auto_adjust_ff_dim"):  # lfm2.py LFM2Model._add_feed_forward_length
        ff = hp.need(("block_ff_dim", "intermediate_size"), "LFM2's feed-forward")
        ff = int(2 * ff / 3)
        mult = hp.get("block_ffn_dim_multiplier")
        if mult is not None:
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult <= 64:
                raise hp.fail(f"block_ffn_dim_multiplier should be a number from 0 to 64, got {mult!r}")
            ff = int(mult * ff)
        multiple_of = hp.num(("block_multiple_of",)) or 1
        ff = multiple_of * ((ff + multiple_of - 1) // multiple_of)
        w.put(LLM.FEED_FORWARD_LENGTH, hp.check_int("block_ff_dim x block_ffn_dim_multiplier", ff))
    _vocab(hp, w)


def _chatglm(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """glm.py ChatGLMModel.set_gguf_parameters: ChatGLM's own names (multi_query_group_num KV heads,
    seq_length, ffn_hidden_size); the token list has padded_vocab_size entries (set_vocab_gpt2)."""
    n_embd = hp.need(("hidden_size", "n_embed"))
    n_head = hp.need(("n_head", "num_attention_heads"))
    w.put(LLM.CONTEXT_LENGTH, hp.num(("seq_length",)) or n_embd)
    w.put(LLM.EMBEDDING_LENGTH, n_embd)
    w.put(LLM.FEED_FORWARD_LENGTH, hp.num(("ffn_hidden_size", "intermediate_size")) or 4 * n_embd)
    w.put(LLM.BLOCK_COUNT, w.block_count)
    w.put(Attention.HEAD_COUNT, n_head)
    kv = hp.num(("multi_query_group_num", "num_key_value_heads"))
    w.put(Attention.HEAD_COUNT_KV, n_head if kv is None else kv)
    w.put(LLM.VOCAB_SIZE, hp.num(("padded_vocab_size", "vocab_size")))


def _bert(hp: _HParams, w: _Writer, notes: list[str]) -> None:
    """bert.py BertModel / XLMRobertaModel / NomicBertModel: TextModel keys, attention.causal false and the
    token type count (set_vocab: type_vocab_size, default 1), which sizes token_types.weight. XLMRobertaModel
    (and RobertaModel) drop the first 1 + pad_token_id rows of the position embeddings and lower
    max_position_embeddings by as many (_xlmroberta_tokenizer_init: bge-m3's 8194 becomes 8192); NomicBertModel
    writes the 2048 tokens nomic-embed-text v1/v1.5 were trained for over its n_positions 8192. The pooling
    type comes from sentence-transformers' modules.json, not config.json: not written (no memory depends on it)."""
    archs = hp.top.get("architectures")
    cls = archs[0] if isinstance(archs, list) and archs else None
    roberta = cls == "XLMRobertaModel" or (cls is None and hp.top.get("model_type") == "xlm-roberta")
    if roberta and (pad := hp.num(("pad_token_id",))) is not None and "max_position_embeddings" in hp.hp:
        hp.hp["max_position_embeddings"] = max(0, hp.need(("max_position_embeddings",)) - (1 + pad))
    if w.arch == "nomic-bert":
        npos, trained = hp.num(("n_positions",)), hp.num(("max_trained_positions",))
        trained = 2048 if trained is None else trained
        if npos == 8192 and trained == 2048:
            hp.hp["n_positions"] = 2048  # "nomic-embed-text v1 and v1.5 are trained for 2048 tokens"
        elif npos == 2048 and trained == 2048:
            hp.hp["n_positions"] = 512  # nomic-embed-text-v2-moe
        else:
            raise hp.fail(f"n_positions {npos} / max_trained_positions {trained}: not a nomic-bert the converter knows")
    _text_model(hp, w)
    w.put(Attention.CAUSAL, False)
    n_types = hp.num(("type_vocab_size",))
    w.md[Tokenizer.TOKEN_TYPE_COUNT] = 1 if n_types is None else n_types
    _vocab(hp, w)


_CONVERTERS: Mapping[str, _Convert] = {
    "llama": _llama,
    "mistral3": _llama,
    "qwen2": _generic,
    "qwen2moe": _generic,
    "qwen3": _generic,
    "qwen3moe": _generic,
    "qwen3next": _qwen3next,
    "qwen35": _qwen3next,
    "qwen35moe": _qwen3next,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma4": _gemma4,
    "gpt-oss": _gpt_oss,
    "phi3": _phi3,
    "command-r": _command_r,
    "cohere2": _cohere2,
    "granite": _granite,
    "granitemoe": _granitemoe,
    "llama4": _llama4,
    "ernie4_5-moe": _ernie45moe,
    "falcon-h1": _falcon_h1,
    "granitehybrid": _granitehybrid,
    "nemotron_h": _nemotron_h,
    "deepseek2": _deepseek2,
    "glm4": _glm4,
    "glm4moe": _glm4moe,
    "mamba2": _mamba2,
    "lfm2": _lfm2,
    "lfm2moe": _lfm2,
    "starcoder2": _generic,
    "chatglm": _chatglm,
    "bert": _bert,
    "nomic-bert": _bert,
}
# Attention-free architectures: num_attention_heads is not required.
_NO_ATTENTION = frozenset({"mamba2"})


def _architecture(hp: _HParams) -> tuple[str, str | None]:
    """(GGUF architecture, HF class or model_type it came from when unmapped)."""
    cls: object = None
    archs = hp.top.get("architectures")
    if isinstance(archs, list) and archs:
        cls = archs[0]
    text_archs = hp.text.get("architectures")
    if isinstance(text_archs, list) and text_archs:  # get_model_architecture: the sub-config's wins
        cls = text_archs[0]
    if cls is not None:
        if not isinstance(cls, str):
            raise hp.fail(f"architectures should hold class names, got {cls!r}")
        if cls in ARCH_BY_HF_CLASS:
            return ARCH_BY_HF_CLASS[cls], None
    types = [t for t in (hp.top.get("model_type"), hp.text.get("model_type")) if isinstance(t, str) and t]
    if cls is None:
        for t in types:
            if t in ARCH_BY_MODEL_TYPE:
                return ARCH_BY_MODEL_TYPE[t], None
    name = types[0] if types else (cls if isinstance(cls, str) else "")
    if not name:
        raise hp.fail("neither architectures nor model_type says which model this is")
    return name.lower(), name


# the MoE architectures llama.cpp refuses without experts (src/models/qwen2moe.cpp, qwen3moe.cpp, qwen3vlmoe.cpp,
# glm4-moe.cpp, ...: "n_expert must be > 0"), whose converters write the experts' width from moe_intermediate_size
_EXPERTS_REQUIRED = frozenset({"qwen2moe", "qwen3moe", "qwen3vlmoe", "glm4moe"})


def _check(hp: _HParams, arch: str) -> int:
    """Required keys and cross-checks, before anything is converted. Returns block_count."""
    n_layer = hp.num(_LAYER_KEYS)
    if n_layer is None:
        raise hp.fail("num_hidden_layers is missing")
    if n_layer == 0:
        raise hp.fail("num_hidden_layers is 0")
    n_embd = hp.num((*_EMBD_KEYS, "d_model"))
    if not n_embd:
        raise hp.fail("hidden_size is missing" if n_embd is None else "hidden_size is 0")
    if arch not in _NO_ATTENTION:
        n_head = hp.num(_HEAD_KEYS)
        if n_head is None:
            raise hp.fail("num_attention_heads is missing")
        if n_head == 0:
            raise hp.fail("num_attention_heads is 0")
        kv = hp.num(_HEAD_KV_KEYS)
        if n_head and kv is not None and kv > n_head:
            raise hp.fail(f"num_key_value_heads ({kv}) is larger than num_attention_heads ({n_head})")
        # convert_hf_to_gguf.py writes a 0 as it is (head_count_kv, key_length) and llama.cpp refuses the file
        # (load_tensors check_tensor_dims: attn_k 0 wide); planned, it was a K/V of 0 bytes per token
        if kv == 0:
            raise hp.fail("num_key_value_heads is 0")
        if hp.get("head_dim") == 0:
            raise hp.fail("head_dim is 0")
    n_expert = hp.num(_EXPERT_KEYS)
    n_used = hp.num(_EXPERT_USED_KEYS)
    if n_expert is not None and n_used is not None and n_used > n_expert > 0:
        raise hp.fail(f"num_experts_per_tok ({n_used}) is larger than the expert count ({n_expert})")
    if arch in _EXPERTS_REQUIRED:  # src/models/<arch>.cpp: "n_expert must be > 0", "n_expert_used must be > 0"
        if not n_expert:
            raise hp.fail(f"num_experts is {'missing' if n_expert is None else 0}: llama.cpp's {arch} needs experts")
        if not n_used:
            raise hp.fail(
                f"num_experts_per_tok is {'missing' if n_used is None else 0}: llama.cpp's {arch} needs at least one"
            )
        if hp.num(("moe_intermediate_size",)) is None:
            # convert_hf_to_gguf writes no expert_feed_forward_length then, and llama.cpp takes intermediate_size /
            # num_experts_per_tok, a width the checkpoint's expert tensors need not have: their size is not known
            raise hp.fail("moe_intermediate_size is missing: the experts' width is not known")
    for name in ("vocab_size", "head_dim", "sliding_window", "intermediate_size"):
        if hp.get(name) is not None:
            hp.check_int(name, hp.get(name))
    return n_layer


def _positive(v: object) -> bool:
    """An expert count that says experts: a positive number, or a list of them (one per modality or layer)."""
    if isinstance(v, list):
        return any(_positive(x) for x in v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _sliding_layers(hp: _HParams) -> bool:
    lt = hp.get("layer_types")
    return isinstance(lt, list) and any(t in ("sliding_attention", "sliding_window") for t in lt)


def gguf_metadata(config: Mapping[str, object], *, source: str) -> Mapping[str, Value]:
    """The GGUF metadata convert_hf_to_gguf.py writes for ``config`` (the keys the memory model reads):
    what :mod:`kvadvise.model.breakdown` shapes each tensor from, as llama.cpp's loader does."""
    return _convert(config, source)[0].metadata


def _convert(config: Mapping[str, object], source: str) -> tuple[GGUFHeader, _HParams, list[str]]:
    if not isinstance(config, Mapping):
        raise InputError(f"{source}: a config.json must hold a JSON object, got {type(config).__name__}")
    hp = _HParams(config, source)
    arch, unmapped = _architecture(hp)
    notes: list[str] = []
    if unmapped is not None:
        experts = [k for k in _MOE_COUNT_KEYS if _positive(hp.get(k))]
        if experts:
            raise InputError(
                f"{source}: {unmapped!r} is a mixture of experts ({experts[0]} {hp.get(experts[0])!r}) that kvadvise "
                "does not map to a llama.cpp architecture: which layers hold experts, their width and any shared "
                "experts are rules of each converter class, so its weights cannot be counted from config.json",
                hint="convert it with llama.cpp's convert_hf_to_gguf.py and plan the GGUF (kvadvise gguf FILE)",
            )
        notes.append(f"config.json {unmapped!r} is not mapped to a llama.cpp architecture; generic converter keys used")
        if _sliding_layers(hp) or hp.get("sliding_window"):
            notes.append("its sliding-window layers are not applied (full KV assumed: an upper bound)")
    for k, v in _TEXT_DEFAULTS.get(arch, {}).items():  # what AutoConfig restores of a slim text_config
        hp.hp.setdefault(k, v)
    n_layer = _check(hp, arch)
    w = _Writer(arch)
    w.block_count = n_layer
    _CONVERTERS.get(arch, _generic)(hp, w, notes)
    name = hp.top.get("_name_or_path")
    w.md[General.NAME] = name if isinstance(name, str) and name else source
    header = GGUFHeader(
        source=source,
        version=3,
        byte_order="<",
        metadata=w.md,
        tensors=(),
        alignment=32,
        header_bytes=0,
        data_offset=0,
        data_bytes=0,
        file_bytes=None,
    )
    return header, hp, notes


def from_config(config: Mapping[str, object], *, source: str, weights_bytes: int | None = None) -> ModelSpec:
    """The ModelSpec llama.cpp builds from the GGUF that convert_hf_to_gguf.py makes of ``config``.

    ``weights_bytes``: size of the weights when known (a config.json does not say); 0 otherwise.
    Raises InputError naming ``source`` for a config that cannot describe a model.
    """
    if weights_bytes is not None and (
        isinstance(weights_bytes, bool) or not isinstance(weights_bytes, int) or weights_bytes < 0
    ):
        raise InputError(f"{source}: weights_bytes must be a non-negative integer, got {weights_bytes!r}")
    header, hp, notes = _convert(config, source)
    try:
        spec = from_gguf(header, known_only=False)  # an unmapped config: generic rules, an estimate
    except GGUFError as e:  # should not happen after _check; keep the source and say where it came from
        raise InputError(f"{e.message} (GGUF metadata converted from config.json)") from None
    dtype = hp.get("torch_dtype", hp.get("dtype"))
    file_type = "unknown"
    if weights_bytes and isinstance(dtype, str) and "quantization_config" not in hp.hp:
        file_type = _DTYPES.get(dtype, "unknown")
    return dataclasses.replace(spec, weights_bytes=weights_bytes or 0, file_type=file_type, notes=(*notes, *spec.notes))
