"""Round 22a (hunter: MoE runs with the experts in host memory, published compute buffers).

The published-log hunt of this round found no new log that prints ``CUDA0/CUDA_Host compute buffer size``
together with a complete command (-c, -ub, -fa, the -ot / --n-cpu-moe pattern, the build) for a MoE model that
is not already in tests/data/published (032: gpt-oss-20b --n-cpu-moe 14 on Vulkan, 033: Qwen3.6-35B-A3B with the
experts of blocks 6-39 in CUDA_Host). What the hunt did turn up is that the MLA model the round was asked to
prefer, GLM-4.7-Flash, cannot be planned from its config.json at all; the tests below pin that.

GLM-4.7-Flash's config.json (zai-org/GLM-4.7-Flash, transformers 5.0.0rc0), the fields as published on the model
card and repeated field by field in public code (e.g. github.com/blap/Mod,
src/inference_pio/models/glm_4_7_flash/config.py, "from real config"): Glm4MoeLiteForCausalLM / glm4_moe_lite,
hidden 2048, 47 layers + 1 NextN layer, 20 heads, q_lora_rank 768, kv_lora_rank 512, qk_nope 192, qk_rope 64,
v_head 256, 64 routed experts (4 used) of 1536, 1 shared expert, first_k_dense_replace 1, dense FFN 10240,
vocab 154880, 202752 positions.
"""

from __future__ import annotations

import pytest

from kvadvise.errors import InputError
from kvadvise.model.hfconfig import from_config
from kvadvise.planner.memory import RunConfig, estimate

MIB = 1 << 20

GLM47_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "pad_token_id": 154820,
    "eos_token_id": [154820, 154827, 154829],
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "max_position_embeddings": 202752,
    "moe_intermediate_size": 1536,
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.8,
    "num_experts_per_tok": 4,
    "first_k_dense_replace": 1,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "num_hidden_layers": 47,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 1.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "vocab_size": 154880,
    "q_lora_rank": 768,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
}

# llama.cpp b11312, src/llama-kv-cache.cpp (llama_kv_cache ctor): an MLA model (hparams.is_mla()) stores K only
# (has_v = !is_mla), one row of n_embd_k_gqa = kv_lora_rank + n_rot = 512 + 64 = 576 values per layer and cell;
# src/llama-model.cpp (create_memory): the main context's cache filters out the NextN layers
# (il < hparams.n_layer() = 48 - 1). At 32,768 cells and an f16 cache: 47 x 576 x 2 B x 32768 = 1692.00 MiB
# (derived from those rules, not read off a printed line; the shape is the one published GLM-4.7-Flash loads print:
# arch deepseek2, n_layer 47, n_head_kv 1, n_embd_head_k 576, n_embd_head_v 512, n_embd_k_gqa 576 --
# ollama/ollama#15855, ikawrakow/ik_llama.cpp#1167's "logs running on mainline", January 2026).
GLM47_KV_32K_F16 = 47 * 576 * 2 * 32768


def test_glm47_flash_config_is_planned_as_deepseek2_mla() -> None:
    """FINDING. ``kvadvise hf zai-org/GLM-4.7-Flash -c 32768 -ctk f16`` (API: ``from_config(<its config.json>)``)
    says: "error: 'glm4_moe_lite' is a mixture of experts (n_routed_experts 64) that kvadvise does not map to a
    llama.cpp architecture" (exit 2, hint: convert it and plan the GGUF). True: llama.cpp converts it, and
    llama-server runs it, as ``deepseek2`` -- b11312 conversion/glm.py ``@ModelBase.register("Glm4MoeLiteForCausalLM")
    class Glm4MoeLiteModel(DeepseekV2Model): model_arch = gguf.MODEL_ARCH.DEEPSEEK2`` (block_count = 47 + 1 NextN
    layer, nextn_predict_layers 1); published loads print ``arch = deepseek2, n_layer = 47, n_embd_head_k = 576``
    (ollama/ollama#15855, 2026; ikawrakow/ik_llama.cpp#1167's mainline llama-server log, January 2026). Its KV
    cache at 32,768 cells, f16, by llama.cpp b11312's rules: 1692.00 MiB (47 x 576 x 2 B per cell, no V: a view of
    K). Missing rule: ARCH_BY_HF_CLASS /
    ARCH_BY_MODEL_TYPE lack ``Glm4MoeLiteForCausalLM`` / ``glm4_moe_lite`` -> ``deepseek2`` (the DeepseekV2 writer,
    with the NextN layer appended as glm4moe's are). The model of the round's list ("GLM-4.7-Flash (deepseek2 arch,
    MLA)") gets no plan from its config at all; the same dimensions under DeepseekV3ForCausalLM plan fine (the
    guard below)."""
    try:
        spec = from_config(GLM47_FLASH, source="zai-org/GLM-4.7-Flash")
    except InputError as e:
        pytest.fail(f"GLM-4.7-Flash's config.json is refused: {e}")
    assert spec.architecture == "deepseek2"
    assert spec.is_mla and spec.n_layer == 47
    est = estimate(spec, RunConfig(n_ctx=32768, flash_attn="on", device="cuda", llama_build=11312))
    assert est.kv_bytes == GLM47_KV_32K_F16, (est.kv_bytes / MIB, GLM47_KV_32K_F16 / MIB)


def test_glm47_flash_dimensions_through_the_deepseek_v3_writer_size_the_mla_cache_as_llamacpp() -> None:
    """Regression guard (passes). The same config with ``architectures = DeepseekV3ForCausalLM`` (the class the
    GLM-4.7-Flash converter derives from) plans as deepseek2 MLA with llama.cpp's cache: 47 trunk layers, K only,
    576 values per cell: 1692.00 MiB at 32,768 cells f16 (llama.cpp b11312 src/llama-kv-cache.cpp, has_v =
    !is_mla; src/llama-model.cpp create_memory, NextN layers filtered). Shows the finding above is the missing
    class mapping only, not the MLA rules."""
    cfg = dict(GLM47_FLASH, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    spec = from_config(cfg, source="GLM-4.7-Flash as DeepseekV3")
    assert spec.architecture == "deepseek2" and spec.is_mla
    assert spec.n_layer == 47 and spec.n_embd_head_k == 576 and spec.n_embd_head_v == 512
    est = estimate(spec, RunConfig(n_ctx=32768, flash_attn="on", device="cuda", llama_build=11312))
    assert est.kv_bytes == GLM47_KV_32K_F16
    assert est.v_bytes == 0
