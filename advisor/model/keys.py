"""Every GGUF metadata key kvadvise reads or writes, in one place (the schema).

Names follow gguf-py's ``constants.py`` (``Keys.LLM.BLOCK_COUNT =
"{arch}.block_count"``) and llama.cpp's ``src/llama-arch.cpp`` (LLM_KV_NAMES,
commit 0c1e570). Architecture keys are templates with ``{arch}``: fill them
with :func:`key`. A misspelt name is an AttributeError at import time (and a
mypy error), never a key that is silently absent and read as 0.
"""

from __future__ import annotations

from typing import Final


def key(template: str, arch: str) -> str:
    """The key ``template`` names for architecture ``arch`` ("{arch}.block_count" -> "llama.block_count")."""
    return template.format(arch=arch)


class General:
    ARCHITECTURE: Final = "general.architecture"
    NAME: Final = "general.name"
    ALIGNMENT: Final = "general.alignment"
    FILE_TYPE: Final = "general.file_type"
    # the sampling defaults convert_hf_to_gguf.py copies from generation_config.json (llama-arch.cpp
    # LLM_KV_GENERAL_SAMPLING_*), which llama-server takes unless a flag sets them (common.cpp)
    SAMPLING_PENALTY_REPEAT: Final = "general.sampling.penalty_repeat"
    SAMPLING_PENALTY_LAST_N: Final = "general.sampling.penalty_last_n"


class LLM:
    VOCAB_SIZE: Final = "{arch}.vocab_size"
    CONTEXT_LENGTH: Final = "{arch}.context_length"
    EMBEDDING_LENGTH: Final = "{arch}.embedding_length"
    EMBEDDING_LENGTH_PER_LAYER: Final = "{arch}.embedding_length_per_layer_input"
    BLOCK_COUNT: Final = "{arch}.block_count"
    FEED_FORWARD_LENGTH: Final = "{arch}.feed_forward_length"
    EXPERT_FEED_FORWARD_LENGTH: Final = "{arch}.expert_feed_forward_length"
    EXPERT_SHARED_FEED_FORWARD_LENGTH: Final = "{arch}.expert_shared_feed_forward_length"
    EXPERT_COUNT: Final = "{arch}.expert_count"
    EXPERT_USED_COUNT: Final = "{arch}.expert_used_count"
    EXPERT_SHARED_COUNT: Final = "{arch}.expert_shared_count"
    INTERLEAVE_MOE_LAYER_STEP: Final = "{arch}.interleave_moe_layer_step"
    LEADING_DENSE_BLOCK_COUNT: Final = "{arch}.leading_dense_block_count"
    MOE_LATENT_SIZE: Final = "{arch}.moe_latent_size"
    NEXTN_PREDICT_LAYERS: Final = "{arch}.nextn_predict_layers"
    FULL_ATTENTION_INTERVAL: Final = "{arch}.full_attention_interval"
    TOKEN_SHIFT_COUNT: Final = "{arch}.token_shift_count"
    POOLING_TYPE: Final = "{arch}.pooling_type"


class Attention:
    HEAD_COUNT: Final = "{arch}.attention.head_count"
    HEAD_COUNT_KV: Final = "{arch}.attention.head_count_kv"
    KEY_LENGTH: Final = "{arch}.attention.key_length"
    VALUE_LENGTH: Final = "{arch}.attention.value_length"
    KEY_LENGTH_SWA: Final = "{arch}.attention.key_length_swa"
    VALUE_LENGTH_SWA: Final = "{arch}.attention.value_length_swa"
    KEY_LENGTH_MLA: Final = "{arch}.attention.key_length_mla"
    VALUE_LENGTH_MLA: Final = "{arch}.attention.value_length_mla"
    KV_LORA_RANK: Final = "{arch}.attention.kv_lora_rank"
    SLIDING_WINDOW: Final = "{arch}.attention.sliding_window"
    SLIDING_WINDOW_PATTERN: Final = "{arch}.attention.sliding_window_pattern"
    SHARED_KV_LAYERS: Final = "{arch}.attention.shared_kv_layers"
    RECURRENT_LAYERS: Final = "{arch}.attention.recurrent_layers"
    CAUSAL: Final = "{arch}.attention.causal"


class SSM:
    CONV_KERNEL: Final = "{arch}.ssm.conv_kernel"
    INNER_SIZE: Final = "{arch}.ssm.inner_size"
    STATE_SIZE: Final = "{arch}.ssm.state_size"
    TIME_STEP_RANK: Final = "{arch}.ssm.time_step_rank"
    GROUP_COUNT: Final = "{arch}.ssm.group_count"


class WKV:
    HEAD_SIZE: Final = "{arch}.wkv.head_size"


class ShortConv:
    L_CACHE: Final = "{arch}.shortconv.l_cache"


class Vision:
    """A vision encoder's: ``{arch}`` is "clip" in an mmproj file (tools/mtmd/clip-impl.h KEY_*), the text model's in an
    Ollama blob that holds its own tower (convert/convert_gemma3.go, read by server/images.go Capabilities)."""

    IMAGE_SIZE: Final = "{arch}.vision.image_size"
    PATCH_SIZE: Final = "{arch}.vision.patch_size"
    EMBEDDING_LENGTH: Final = "{arch}.vision.embedding_length"
    FEED_FORWARD_LENGTH: Final = "{arch}.vision.feed_forward_length"
    HEAD_COUNT: Final = "{arch}.vision.attention.head_count"
    BLOCK_COUNT: Final = "{arch}.vision.block_count"
    PROJECTION_DIM: Final = "{arch}.vision.projection_dim"
    PROJECTOR_TYPE: Final = "{arch}.vision.projector_type"


class Tokenizer:
    LIST: Final = "tokenizer.ggml.tokens"
    MODEL: Final = "tokenizer.ggml.model"  # "llama" (SentencePiece), "gpt2" (BPE), ...
    TOKEN_TYPE_COUNT: Final = "tokenizer.ggml.token_type_count"  # BERT's token types (token_types.weight rows)


class Split:
    COUNT: Final = "split.count"
    NO: Final = "split.no"
    TENSORS_COUNT: Final = "split.tensors.count"


# The type llama.cpp's loader takes each key as: llama_model::load_hparams fills a uint32_t field from the
# common keys of every architecture, and GGUFMeta::GKV::get_kv (src/llama-model-loader.cpp) throws "key %s has
# wrong type %s but expected type %s" for any other type, present and optional alike. get_key_or_arr's keys may
# also be an array of u32 or i32 (one value a layer).
U32_KEYS: Final = (
    LLM.CONTEXT_LENGTH,
    LLM.EMBEDDING_LENGTH,
    LLM.BLOCK_COUNT,
    LLM.EXPERT_COUNT,
    Attention.KEY_LENGTH,
    Attention.VALUE_LENGTH,
)
# (expert_used_count too at b11312: nemotron_h_moe's converter writes one a layer)
U32_OR_ARRAY_KEYS: Final = (
    LLM.FEED_FORWARD_LENGTH,
    LLM.EXPERT_USED_COUNT,
    Attention.HEAD_COUNT,
    Attention.HEAD_COUNT_KV,
)
STRING_KEYS: Final = (General.ARCHITECTURE, General.NAME)
