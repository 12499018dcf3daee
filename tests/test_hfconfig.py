"""kvadvise.model.hfconfig: published config.json files -> the ModelSpec llama.cpp builds from their GGUF.

Every config under tests/data/hf/ is a published config.json (its "_source" key
says where it was copied from and what, if anything, was changed). Every
expected number is written out as the arithmetic of the published values and
llama.cpp's rule: K and V rows are n_head_kv * head_dim values per layer, f16
is 2 bytes, so one token costs n_layer * n_head_kv * head_dim * 2 (K+V) * 2 B.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvadvise.errors import InputError
from kvadvise.model.ggml import GGMLType
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import SWA_NONE, SWA_STANDARD, ModelSpec
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate

DATA = Path(__file__).resolve().parent / "data" / "hf"
KiB, GiB = 1 << 10, 1 << 30
F16 = 2  # bytes per K/V value in the default cache type


def load(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    assert raw.pop("_source"), f"{name}.json has no provenance"
    return raw


def spec_of(name: str, **kw: Any) -> ModelSpec:
    return from_config(load(name), source=f"{name}.json", **kw)


def run(spec: ModelSpec, n_ctx: int) -> MemoryEstimate:
    return estimate(spec, RunConfig(n_ctx=n_ctx, flash_attn="on"))


# --- the headline numbers -----------------------------------------------------


def test_qwen3_coder_30b_a3b() -> None:
    spec = spec_of("qwen3-coder-30b")
    assert spec.architecture == "qwen3moe" and spec.verified
    assert spec.n_layer_all == 48 and spec.n_layer == 48
    assert spec.n_head == (32,) * 48
    assert spec.n_head_kv == (4,) * 48
    assert spec.n_embd_head_k == spec.n_embd_head_v == 128
    assert (spec.n_expert, spec.n_expert_used) == (128, 8)
    assert spec.n_ctx_train == 262144 and spec.n_vocab == 151936
    assert spec.swa_type == SWA_NONE and not spec.has_recurrent
    per_token = 48 * 4 * 128 * 2 * F16
    assert per_token == 98_304
    assert run(spec, 32768).kv_bytes_per_token == per_token
    assert run(spec, 32768).kv_bytes == per_token * 32768 == 3 * GiB
    assert run(spec, 65536).kv_bytes == per_token * 65536 == 6 * GiB
    assert run(spec, 262144).kv_bytes == per_token * 262144 == 24 * GiB


def test_qwen3_coder_kv_heads_not_attention_heads() -> None:
    """num_attention_heads (32) in place of num_key_value_heads (4) would claim 48 GiB at 64k."""
    spec = spec_of("qwen3-coder-30b")
    wrong = 48 * 32 * 128 * 2 * F16 * 65536
    assert wrong == 48 * GiB
    assert run(spec, 65536).kv_bytes == 48 * 4 * 128 * 2 * F16 * 65536 == 6 * GiB != wrong


def test_qwen25_coder_7b() -> None:
    cfg = load("qwen2.5-coder-7b")
    assert "head_dim" not in cfg  # the published config has none: 3584 / 28
    spec = from_config(cfg, source="qwen2.5-coder-7b.json")
    assert spec.architecture == "qwen2" and spec.n_layer_all == 28
    assert spec.n_head_kv == (4,) * 28
    assert spec.n_embd_head_k == spec.n_embd_head_v == 3584 // 28 == 128
    per_token = 28 * 4 * (3584 // 28) * 2 * F16
    assert per_token == 57_344 == 56 * KiB
    est = run(spec, 32768)
    assert est.kv_bytes_per_token == per_token
    assert est.kv_bytes == per_token * 32768 == int(1.75 * GiB)


def test_llama31_70b() -> None:
    spec = spec_of("llama3.1-70b")
    assert spec.architecture == "llama" and spec.n_layer_all == 80
    assert spec.n_head_kv == (8,) * 80 and spec.n_embd_head_k == 8192 // 64 == 128
    assert spec.n_ctx_train == 131072  # max_position_embeddings; the llama3 rope scaling is a separate key
    per_token = 80 * 8 * (8192 // 64) * 2 * F16
    assert per_token == 320 * KiB
    est = run(spec, 131072)
    assert est.kv_bytes_per_token == per_token
    assert est.kv_bytes == per_token * 131072 == 40 * GiB


# --- sliding window -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "n_layer", "n_kv", "head", "why"),
    [
        # gemma-3-4b-it's text_config omits heads / kv heads / head_dim: Gemma3TextConfig defaults 8 / 4 / 256
        ("gemma3-4b", 34, 4, 256, "defaults"),
        ("gemma3-12b", 48, 8, 256, "published"),
        ("gemma3-27b", 62, 16, 128, "published (head_dim 128, not 5376 / 32 = 168)"),
    ],
)
def test_gemma3_swa(name: str, n_layer: int, n_kv: int, head: int, why: str) -> None:
    spec = spec_of(name)
    assert spec.architecture == "gemma3" and spec.n_layer_all == n_layer, why
    assert spec.n_head_kv == (n_kv,) * n_layer and spec.n_embd_head_k == head
    assert spec.swa_type == SWA_STANDARD and spec.n_swa == 1024
    # llama.cpp gemma3.cpp: load_swa_pattern(ml, 6): layer il is global when il % 6 == 5
    global_layers = [il for il in range(n_layer) if il % 6 == 5]
    assert [il for il in range(n_layer) if not spec.swa_layers[il]] == global_layers
    n_global = len(global_layers)
    assert n_global == {34: 5, 48: 8, 62: 10}[n_layer]
    est = run(spec, 32768)
    # only the global layers grow with the context
    assert est.kv_bytes_per_token == n_global * n_kv * head * 2 * F16
    # SWA cache: GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256) = GGML_PAD(1024 + 512, 256) = 1536 cells
    swa_cells = 1536
    row = n_kv * head * 2 * F16
    assert est.kv_bytes == n_global * row * 32768 + (n_layer - n_global) * row * swa_cells


def test_gemma2_9b_swa() -> None:
    spec = spec_of("gemma2-9b")
    assert spec.architecture == "gemma2" and spec.n_swa == 4096
    # gemma2.cpp: load_swa_pattern(ml, 2): even layers slide
    assert spec.swa_layers == tuple(il % 2 == 0 for il in range(42))
    assert run(spec, 32768).kv_bytes_per_token == 21 * 8 * 256 * 2 * F16


@pytest.mark.parametrize(("name", "n_layer", "n_expert"), [("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)])
def test_gpt_oss_swa(name: str, n_layer: int, n_expert: int) -> None:
    cfg = load(name)
    spec = from_config(cfg, source=name)
    assert spec.architecture == "gpt-oss" and spec.n_layer_all == n_layer
    assert (spec.n_expert, spec.n_expert_used) == (n_expert, 4)
    assert spec.n_swa == 128 and spec.swa_type == SWA_STANDARD
    # openai-moe.cpp: load_swa_pattern(ml, 2) -- the same layers the published layer_types mark sliding
    assert spec.swa_layers == tuple(t == "sliding_attention" for t in cfg["layer_types"])
    assert spec.swa_layers == tuple(il % 2 == 0 for il in range(n_layer))
    n_full = n_layer // 2
    est = run(spec, 32768)
    assert est.kv_bytes_per_token == n_full * 8 * 64 * 2 * F16
    # SWA cache: GGML_PAD(128 + 512, 256) = 768 cells
    assert est.kv_bytes == n_full * 8 * 64 * 2 * F16 * 32768 + n_full * 8 * 64 * 2 * F16 * 768


def test_qwen2_has_no_swa_in_llama_cpp() -> None:
    """qwen2.cpp reads no sliding window and the converter writes none, whatever config.json says."""
    cfg = load("qwen2.5-14b")
    assert cfg["sliding_window"] == 131072 and cfg["max_window_layers"] == 48
    spec = from_config(cfg, source="qwen2.5-14b.json")
    assert spec.swa_type == SWA_NONE and not any(spec.swa_layers)
    flipped = from_config({**cfg, "use_sliding_window": True, "sliding_window": 4096}, source="qwen2.5-14b.json")
    assert flipped == spec
    assert run(spec, 32768).kv_bytes_per_token == 48 * 8 * (5120 // 40) * 2 * F16


@pytest.mark.parametrize(
    ("name", "arch", "n_layer", "n_kv", "head"),
    [
        ("starcoder2-15b", "starcoder2", 40, 4, 6144 // 48),  # sliding_window 4096: starcoder2.cpp has no SWA
        ("phi3-3.8b", "phi3", 32, 32, 3072 // 32),  # sliding_window 2047: phi3.cpp "Phi SWA is currently disabled"
        ("phi4-14b", "phi3", 40, 10, 5120 // 40),
        ("mistral-7b", "llama", 32, 8, 4096 // 32),
    ],
)
def test_sliding_window_ignored(name: str, arch: str, n_layer: int, n_kv: int, head: int) -> None:
    spec = spec_of(name)
    assert spec.architecture == arch and spec.swa_type == SWA_NONE and not spec.has_swa
    assert run(spec, 32768).kv_bytes == n_layer * n_kv * head * 2 * F16 * 32768


# --- MLA ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "n_layer", "n_expert", "n_used"), [("deepseek-v3", 61, 256, 8), ("deepseek-coder-v2-16b", 27, 64, 6)]
)
def test_deepseek_mla(name: str, n_layer: int, n_expert: int, n_used: int) -> None:
    cfg = load(name)
    spec = from_config(cfg, source=name)
    assert spec.architecture == "deepseek2" and spec.is_mla and spec.verified
    # deepseek.py: head_count_kv 1, key_length kv_lora_rank + qk_rope_head_dim, value_length kv_lora_rank
    assert spec.n_head_kv == (1,) * n_layer
    assert spec.n_embd_head_k == cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 512 + 64 == 576
    assert spec.n_embd_head_v == 512
    assert (spec.n_expert, spec.n_expert_used) == (n_expert, n_used)
    assert spec.n_ctx_train == 163840  # max_position_embeddings (= yarn factor 40 * 4096)
    est = run(spec, 32768)
    assert est.v_bytes == 0  # V is a view of the compressed K
    assert est.kv_bytes_per_token == n_layer * 576 * F16
    assert est.kv_bytes == n_layer * 576 * F16 * 32768


def test_deepseek_v3_mtp_layer_is_dropped() -> None:
    cfg = load("deepseek-v3")
    assert cfg["num_nextn_predict_layers"] == 1
    spec = from_config(cfg, source="deepseek-v3.json")
    assert spec.n_layer_all == 61 and spec.n_layer_nextn == 0  # DeepseekV2Model.skip_mtp
    assert any("MTP" in n for n in spec.notes)


# --- hybrids, MTP ------------------------------------------------------------------


def test_qwen35_27b_hybrid() -> None:
    cfg = load("qwen3.5-27b")
    text = cfg["text_config"]  # nested: read transparently
    spec = from_config(cfg, source="qwen3.5-27b.json")
    assert spec.architecture == "qwen35" and spec.verified
    assert spec.n_layer_all == 64 + 1 and spec.n_layer_nextn == 1  # mtp_num_hidden_layers
    assert spec.recurrent_layers == (*(t == "linear_attention" for t in text["layer_types"]), False)
    attn = [il for il in range(64) if (il + 1) % 4 == 0]
    assert [il for il in range(65) if spec.kv_layers[il]] == attn and len(attn) == 16
    assert sum(spec.recurrent_layers) == 48
    # conv state (d_conv - 1) * (d_inner + 2 * n_group * d_state); delta state d_state * d_inner
    d_inner, d_state, n_group = 128 * 48, 128, 16
    assert spec.n_embd_r == (4 - 1) * (d_inner + 2 * n_group * d_state)
    assert spec.n_embd_s == d_state * d_inner
    est = run(spec, 32768)
    assert est.kv_bytes_per_token == 16 * 4 * 256 * 2 * F16
    assert est.recurrent_bytes == 48 * 4 * ((4 - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)


def test_qwen35_moe() -> None:
    spec = spec_of("qwen3.5-35b-a3b")
    assert spec.architecture == "qwen35moe" and spec.n_layer_all == 41 and spec.n_layer_nextn == 1
    assert (spec.n_expert, spec.n_expert_used) == (256, 8)
    assert run(spec, 32768).kv_bytes_per_token == 10 * 2 * 256 * 2 * F16


def test_glm45_air_and_nextn() -> None:
    cfg = load("glm-4.5-air")
    spec = from_config(cfg, source="glm-4.5-air.json")
    assert spec.architecture == "glm4moe" and spec.n_layer_all == 46 and spec.n_layer_nextn == 0
    assert (spec.n_expert, spec.n_expert_used) == (128, 8)
    per_token = 46 * 8 * 128 * 2 * F16
    assert run(spec, 32768).kv_bytes_per_token == per_token
    # This copy lacks num_nextn_predict_layers; with it, glm.py appends the MTP block to
    # block_count and writes nextn_predict_layers, which holds no KV in the main context.
    mtp = from_config({**cfg, "num_nextn_predict_layers": 1}, source="glm-4.5-air.json")
    assert mtp.n_layer_all == 47 and mtp.n_layer_nextn == 1 and mtp.n_layer == 46
    assert run(mtp, 32768).kv_bytes_per_token == per_token


def test_granite4_hybrid() -> None:
    spec = spec_of("granite4-h-small")
    assert spec.architecture == "granitehybrid"
    assert sum(spec.kv_layers) == 4 and sum(spec.recurrent_layers) == 36
    assert spec.n_ctx_train == 2**20  # granite.py: no RoPE -> context_length 2**20
    assert any("mamba_n_groups" in n for n in spec.notes)  # missing from the excerpt
    d_inner, d_state, d_conv, n_group = 2 * 4096, 128, 4, 1  # mamba_expand * hidden_size
    assert (spec.n_embd_r, spec.n_embd_s) == ((d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner)
    est = run(spec, 32768)
    assert est.kv_bytes_per_token == 4 * 8 * (4096 // 32) * 2 * F16
    assert est.recurrent_bytes == 36 * 4 * ((d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)


def test_nemotron_3_nano_hybrid() -> None:
    """nemotron.py NemotronHModel: one mixer per block from hybrid_override_pattern (M Mamba-2, * attention,
    E MoE); head_count_kv only on the 6 attention blocks, feed_forward_length only on the 23 MoE ones, so
    llama.cpp's nemotron-h.cpp marks the 23 Mamba-2 blocks recurrent (n_head_kv == 0 && n_ff == 0)."""
    cfg = load("nemotron-3-nano-30b-a3b")
    pattern = cfg["hybrid_override_pattern"]
    spec = from_config(cfg, source="nemotron-3-nano-30b-a3b.json")
    assert spec.architecture == "nemotron_h_moe" and spec.n_layer_all == len(pattern) == 52
    assert spec.recurrent_layers == tuple(c == "M" for c in pattern)
    assert spec.kv_layers == tuple(c == "*" for c in pattern)
    assert (pattern.count("M"), pattern.count("E"), pattern.count("*")) == (23, 23, 6)
    assert spec.n_ctx_train == 2**20  # GraniteHybridModel: no RoPE
    assert (spec.n_expert, spec.n_expert_used, spec.n_ff) == (128, 6, 1856)
    d_inner, d_state, n_group, d_conv = 64 * 64, 128, 8, 4  # mamba_num_heads * mamba_head_dim
    assert (spec.n_embd_r, spec.n_embd_s) == ((d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner)
    est = run(spec, 32768)
    assert est.kv_bytes_per_token == 6 * 2 * 128 * 2 * F16
    assert est.recurrent_bytes == 23 * 4 * ((d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)


def test_gemma4_26b_and_31b() -> None:
    """gemma.py Gemma4Model: the SWA layers from layer_types (5 of every 6), global_head_dim 512 on the full
    layers and head_dim 256 on the SWA ones, num_global_key_value_heads on the full layers."""
    for name, n_layer, kv_swa, kv_full, n_expert in (("gemma4-26b-a4b", 30, 8, 2, 128), ("gemma4-31b", 60, 16, 4, 0)):
        cfg = load(name)
        spec = from_config(cfg, source=f"{name}.json")
        full = [il for il, t in enumerate(cfg["text_config"]["layer_types"]) if t == "full_attention"]
        assert spec.architecture == "gemma4" and spec.n_layer_all == n_layer and spec.n_expert == n_expert
        assert [il for il in range(n_layer) if not spec.swa_layers[il]] == full == list(range(5, n_layer, 6))
        assert spec.swa_type == SWA_STANDARD and spec.n_swa == 1024 and all(spec.kv_layers)
        assert (spec.n_embd_head_k, spec.n_embd_head_k_swa) == (512, 256)
        assert {spec.n_head_kv[il] for il in full} == {kv_full}
        assert {spec.n_head_kv[il] for il in range(n_layer) if il not in full} == {kv_swa}
        # only the full layers grow with the context: K and V of kv_full heads x 512 each
        assert spec.n_embd_k_gqa(full[0]) == kv_full * 512 and spec.n_embd_k_gqa(0) == kv_swa * 256


def test_gemma4_e4b_shares_kv() -> None:
    """num_kv_shared_layers 18: the last 18 layers reuse earlier caches (gemma4.cpp n_layer_kv_from_start =
    n_layer - 18), so 24 layers hold KV: 4 full (5, 11, 17, 23) and 20 SWA."""
    spec = spec_of("gemma4-e4b")
    assert spec.architecture == "gemma4" and spec.n_layer_all == 42
    assert [il for il in range(42) if spec.kv_layers[il]] == list(range(24))
    assert [il for il in range(24) if not spec.swa_layers[il]] == [5, 11, 17, 23]
    assert run(spec, 32768).kv_bytes_per_token == 4 * 2 * 512 * 2 * F16


def test_qwen36_is_qwen35moe() -> None:
    spec = spec_of("qwen3.6-35b-a3b")
    assert spec.architecture == "qwen35moe" and spec.n_layer_all == 41 and spec.n_layer_nextn == 1
    assert sum(spec.kv_layers) == 10 and sum(spec.recurrent_layers) == 30
    assert run(spec, 32768).kv_bytes_per_token == 10 * 2 * 256 * 2 * F16


# --- converter details -------------------------------------------------------------


def test_mha_fallback_when_num_key_value_heads_missing() -> None:
    cfg = load("codellama-7b")
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] == 32  # MHA as published
    del cfg["num_key_value_heads"]
    spec = from_config(cfg, source="codellama-7b.json")
    assert spec.n_head_kv == (32,) * 32
    # the converter writes no head_count_kv then (conversion/base.py: only when the config has one); llama.cpp takes
    # head_count, Ollama's estimate 1 (HeadCountKVMin)
    assert not spec.head_count_kv_in_file
    assert dataclasses.replace(spec, head_count_kv_in_file=True) == spec_of("codellama-7b")
    assert run(spec, 16384).kv_bytes == 32 * 32 * (4096 // 32) * 2 * F16 * 16384 == 8 * GiB


def test_head_dim_missing_is_hidden_over_heads() -> None:
    cfg = load("qwen3-8b")
    assert cfg["head_dim"] == 4096 // 32 == 128
    del cfg["head_dim"]
    spec = from_config(cfg, source="qwen3-8b.json")
    assert spec == spec_of("qwen3-8b")
    assert run(spec, 32768).kv_bytes_per_token == 36 * 8 * (4096 // 32) * 2 * F16


def test_explicit_head_dim_wins() -> None:
    spec = spec_of("mistral-nemo-12b")  # head_dim 128, hidden_size / heads = 160
    assert spec.n_embd_head_k == 128 != 5120 // 32
    assert run(spec, 32768).kv_bytes_per_token == 40 * 8 * 128 * 2 * F16


def test_yarn_context_is_max_position_embeddings() -> None:
    cfg = load("deepseek-r1-8b")
    assert cfg["rope_scaling"]["factor"] * cfg["rope_scaling"]["original_max_position_embeddings"] == 131072
    assert spec_of("deepseek-r1-8b").n_ctx_train == cfg["max_position_embeddings"] == 131072


def test_command_r_context_prefers_model_max_length() -> None:
    cfg = load("command-r-35b")
    spec = from_config(cfg, source="command-r-35b.json")
    assert spec.architecture == "command-r" and spec.n_ctx_train == 8192
    assert run(spec, 8192).kv_bytes_per_token == 40 * 64 * (8192 // 64) * 2 * F16
    # c4ai-command-r-v01 publishes model_max_length 131072 (not in this copy): command_r.py uses it
    assert from_config({**cfg, "model_max_length": 131072}, source="x").n_ctx_train == 131072


def test_chatglm_glm4_9b() -> None:
    """glm.py ChatGLMModel: KV heads are multi_query_group_num (2, not the 32 attention heads), the FFN is
    ffn_hidden_size, the context seq_length, the vocab padded_vocab_size. GLM-4-9B-chat is published as
    9.4 B parameters; Ollama's glm4:9b Q4_0 blob is 5,455,319,040 B."""
    from kvadvise.model.breakdown import params, sized

    cfg = load("glm4-9b")
    spec = from_config(cfg, source="glm4-9b.json")
    assert spec.architecture == "chatglm" and spec.n_layer == 40 and spec.n_vocab == 151552
    assert spec.n_ctx_train == 131072 and spec.n_ff == 13696
    assert run(spec, 8192).kv_bytes_per_token == 40 * 2 * 128 * 2 * F16
    bd = params(spec, cfg)
    assert bd is not None and abs(bd.total - 9.4e9) / 9.4e9 < 0.01
    assert abs(sized(bd, "Q4_0").total - 5_455_319_040) / 5_455_319_040 < 0.01


def test_mixtral_is_llama_with_experts() -> None:
    spec = spec_of("mixtral-8x7b")
    assert spec.architecture == "llama" and (spec.n_expert, spec.n_expert_used) == (8, 2)
    assert run(spec, 32768).kv_bytes_per_token == 32 * 8 * 128 * 2 * F16


def test_granite_dense() -> None:
    spec = spec_of("granite3.3-8b")
    assert spec.architecture == "granite" and spec.n_vocab == 49159
    assert run(spec, 32768).kv_bytes_per_token == 40 * 8 * (4096 // 32) * 2 * F16


def test_model_type_when_architectures_missing() -> None:
    cfg = load("qwen2.5-coder-7b")
    del cfg["architectures"]
    assert from_config(cfg, source="x").architecture == "qwen2"
    gemma = load("gemma3-4b")
    del gemma["architectures"], gemma["model_type"]  # only text_config.model_type gemma3_text is left
    assert from_config(gemma, source="x").architecture == "gemma3"


def test_unknown_architecture_gets_generic_rules_and_a_note() -> None:
    # Synthetic: a llama-shaped config under a class kvadvise does not map.
    cfg = {
        "architectures": ["Olmo2ForCausalLM"],
        "model_type": "olmo2",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 100352,
        "max_position_embeddings": 4096,
    }
    spec = from_config(cfg, source="olmo2.json")
    assert spec.architecture == "olmo2" and not spec.verified
    assert any("'olmo2' is not verified" in n for n in spec.notes)
    assert run(spec, 4096).kv_bytes_per_token == 16 * 16 * (2048 // 16) * 2 * F16


def test_mamba2_rules() -> None:
    # Synthetic (no published Mamba-2 config in the store): checks mamba.py Mamba2Model's keys.
    cfg = {"architectures": ["Mamba2ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256, "vocab_size": 1001}
    spec = from_config(cfg, source="m2.json")
    assert spec.architecture == "mamba2" and spec.n_ctx_train == 2**20  # "arbitrary value"
    assert spec.recurrent_layers == (True,) * 4 and not any(spec.kv_layers)
    assert spec.n_vocab == 1008  # rounded up to a multiple of 16
    d_inner, d_state, d_conv, n_group = 2 * 256, 128, 4, 1  # converter defaults: expand 2, d_state 128, d_conv 4
    assert (spec.n_embd_r, spec.n_embd_s) == ((d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner)


def test_lfm2_rules() -> None:
    # Synthetic (no published LFM2 config in the store): lfm2.py zeroes head_count_kv on "conv" layers.
    cfg = {
        "architectures": ["Lfm2ForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "conv_L_cache": 3,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "vocab_size": 65536,
    }
    spec = from_config(cfg, source="lfm2.json")
    assert spec.architecture == "lfm2" and spec.n_head_kv == (0, 2, 0, 2)
    assert spec.recurrent_layers == (True, False, True, False)
    assert spec.n_embd_r == 512 * (3 - 1)  # n_embd * (l_cache - 1)
    assert run(spec, 4096).kv_bytes_per_token == 2 * 2 * (512 // 8) * 2 * F16
    del cfg["layer_types"]
    cfg["full_attn_idxs"] = [1, 3]  # older configs: transformers' Lfm2Config derives layer_types
    assert from_config(cfg, source="lfm2.json") == spec


def test_weights_and_file_type() -> None:
    spec = spec_of("llama3.1-70b")
    assert (spec.weights_bytes, spec.tok_embd_bytes, spec.output_bytes, spec.file_type) == (0, 0, 0, "unknown")
    sized = spec_of("llama3.1-70b", weights_bytes=141_107_412_992)
    assert sized.weights_bytes == 141_107_412_992 and sized.file_type == "bf16"
    assert run(sized, 4096).weights_bytes == 141_107_412_992


def test_config_is_not_modified() -> None:
    for name in ("granite3.3-8b", "deepseek-v3", "gemma3-4b", "qwen3.5-27b"):
        cfg = load(name)
        before = copy.deepcopy(cfg)
        from_config(cfg, source=name)
        assert cfg == before


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_every_fixture_converts(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert {"hf_repo", "source"} <= raw["_source"].keys() or "copied_from" in raw["_source"]
    del raw["_source"]
    spec = from_config(raw, source=path.name)
    assert spec.source == path.name and any(spec.kv_layers)
    assert len(spec.n_head_kv) == len(spec.swa_layers) == len(spec.kv_layers) == spec.n_layer_all


# --- bad input ---------------------------------------------------------------------


def _base() -> dict[str, Any]:
    return load("qwen3-coder-30b")


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers is missing"),
        (lambda c: c.pop("hidden_size"), "hidden_size is missing"),
        (lambda c: c.pop("num_attention_heads"), "num_attention_heads is missing"),
        (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers is 0"),
        (lambda c: c.update(num_hidden_layers=-48), "num_hidden_layers is negative"),
        (lambda c: c.update(num_hidden_layers=10**9), "larger than any real model"),
        (lambda c: c.update(max_position_embeddings=10**15), "max_position_embeddings"),
        (lambda c: c.update(num_key_value_heads=-4), "num_key_value_heads is negative"),
        (lambda c: c.update(num_key_value_heads=64), "larger than num_attention_heads"),
        (lambda c: c.update(head_dim=127.5), "head_dim should be a whole number"),
        (lambda c: c.update(hidden_size="2048"), "hidden_size should be a whole number"),
        (lambda c: c.update(num_hidden_layers=True), "num_hidden_layers should be a whole number"),
        (lambda c: c.update(num_experts_per_tok=256), "num_experts_per_tok"),
        (lambda c: c.update(vocab_size=-1), "vocab_size is negative"),
        (lambda c: c.update(text_config=[1, 2]), "text_config should be a JSON object"),
        (lambda c: (c.pop("architectures"), c.pop("model_type")), "neither architectures nor model_type"),
    ],
)
def test_bad_input(mutate: Any, words: str) -> None:
    cfg = _base()
    mutate(cfg)
    with pytest.raises(InputError) as err:
        from_config(cfg, source="bad/config.json")
    assert "bad/config.json" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("config", [[], "config", 42, None])
def test_not_a_mapping(config: Any) -> None:
    with pytest.raises(InputError, match=r"bad\.json: a config\.json must hold a JSON object"):
        from_config(config, source="bad.json")


def test_bad_layer_types_and_weights() -> None:
    cfg = load("qwen3.5-27b")
    cfg["text_config"] = {**cfg["text_config"], "layer_types": cfg["text_config"]["layer_types"][:2]}
    with pytest.raises(InputError, match=r"q35\.json: layer_types has 2 entries for 64 layers"):
        from_config(cfg, source="q35.json")
    with pytest.raises(InputError, match="weights_bytes"):
        from_config(_base(), source="w.json", weights_bytes=-1)
    gpt = load("gpt-oss-20b")
    del gpt["sliding_window"]
    with pytest.raises(InputError, match=r"gpt\.json: sliding_window is missing"):
        from_config(gpt, source="gpt.json")


@pytest.mark.parametrize(
    ("key", "said"), [("num_key_value_heads", "num_key_value_heads is 0"), ("head_dim", "head_dim is 0")]
)
def test_zero_kv_heads_or_head_size_is_refused(key: str, said: str) -> None:
    """A Llama config.json with num_key_value_heads 0 or head_dim 0 was planned with a K/V of 0 bytes per token
    (exit 0); convert_hf_to_gguf.py writes the 0 as it is (head_count_kv, key_length) and llama.cpp refuses the
    file (check_tensor_dims: attn_k expected 0 wide). Refused like num_attention_heads 0 (exit 2)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072,
    }  # fmt: skip
    assert from_config(cfg, source="ok.json").n_head_kv[0] == 8
    with pytest.raises(InputError) as e:
        from_config({**cfg, key: 0}, source="config.json")
    assert said in e.value.message and e.value.exit_code == 2


def test_a_local_path_that_is_no_config_says_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf /dev/zero` said "no such file" of a device that is there, and `kvadvise hf FOLDER` of a
    folder without a config.json said "FOLDER: no such file": each says what the path is (exit 2)."""
    import os

    from kvadvise.cli import main

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    empty = tmp_path / "empty"
    empty.mkdir()
    for ref, what in (
        (str(fifo), "a FIFO, not a regular file"),
        (str(empty), "no config.json in this folder"),
        (str(tmp_path / "none.json"), "none.json: no such file"),
    ):
        assert main(["hf", ref, "--no-hardware"]) == 2
        err = capsys.readouterr().err
        assert what in err and err.count("\n") <= 2, err


def test_a_cache_type_whose_blocks_do_not_divide_a_row_is_passed_over() -> None:
    """3 heads of 85 (hidden 256 / 3): without flash attention (CUDA has no kernel for 85) a q8_0 K row of 255
    is no whole number of q8_0's blocks of 32, which llama.cpp's cache cannot hold (ggml_row_size asserts). The
    recommendation tried it and ended in that error (exit 2) for a question that named no cache type; it passes
    the type over and recommends f16. Asked for by name, the type is still refused."""
    import kvadvise
    from kvadvise.errors import ConfigError

    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 3, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}  # fmt: skip
    spec = from_config(cfg, source="config.json")
    plan = kvadvise.plan(spec, hardware=kvadvise.gpu_profile("rtx-4090"))
    assert (plan.config.type_k.type_name, plan.config.type_v.type_name, plan.fits) == ("f16", "f16", True)
    with pytest.raises(ConfigError, match="255 is not a multiple"):
        kvadvise.plan(spec, RunConfig(n_ctx=4096, type_k=GGMLType.Q8_0, flash_attn="off"))


def test_quant_of_a_config_counts_the_quantizers_fallback_types() -> None:
    """A tensor whose rows are not a multiple of 256 cannot hold a K-quant: llama.cpp's quantizer gives it a 32-block
    type (llama-quant.cpp tensor_type_fallback: Q4_K -> Q5_0, Q6_K -> Q8_0). Nemotron-3-Nano-30B-A3B (n_embd 2688,
    expert rows 1856) is almost all such tensors: its Q4_K_M is what Ollama's library ships, 24 GB (the profile's
    download size), not the 19.3 GB of 4.9 bits per weight. Qwen3-8B (n_embd 4096, n_ff 12288) has none: unchanged."""
    from kvadvise.backends.hf import HFBackend
    from kvadvise.backends.ollama.profiles import profiles
    from kvadvise.model.breakdown import fallback_bits_per_weight, fallback_surplus_bytes, params

    hf = HFBackend()
    nemotron = hf.load_spec(str(DATA / "nemotron-3-nano-30b-a3b.json"), quant="Q4_K_M")
    shipped = profiles()["nemotron-3-nano:30b"].download_bytes
    assert shipped == 24_000_000_000
    assert nemotron.weights_bytes == pytest.approx(shipped, rel=0.01)
    config = json.loads((DATA / "nemotron-3-nano-30b-a3b.json").read_text())
    bd = params(from_config(config, source="t"), config)
    assert bd is not None and sum(bd.experts_odd) == sum(bd.experts)  # every expert row is 2688 or 1856 wide
    # token_embd Q4_K -> Q5_0 (+1 bit a weight), output.weight Q6_K -> Q8_0 (+1.9375); tied, token_embd is the
    # output's type
    tied = dataclasses.replace(bd, output=0)
    assert fallback_surplus_bytes(tied, "Q4_K_M") - fallback_surplus_bytes(bd, "Q4_K_M") == pytest.approx(
        -bd.tok_embd_odd * 1.0 / 8, abs=1
    )
    assert any("tensor_type_fallback" in n for n in nemotron.notes)
    qwen_config = json.loads((DATA / "qwen3-8b.json").read_text())
    qwen = params(from_config(qwen_config, source="t"), qwen_config)
    assert qwen is not None and fallback_surplus_bytes(qwen, "Q4_K_M") == 0
    # an i-quant's 256-block types fall back to IQ4_NL (4.5 bits per weight); the 32-block types need no fallback,
    # but the odd-rowed output.weight is Q8_0 in any quantized file (Q6_K in Q4_0's rule), and nothing in a Q8_0's
    assert fallback_bits_per_weight("IQ2_XXS") == 4.5 and fallback_bits_per_weight("IQ4_XS") == 4.5
    assert fallback_surplus_bytes(bd, "IQ2_XXS") > fallback_surplus_bytes(bd, "Q4_K_M") > 0
    assert fallback_surplus_bytes(bd, "Q4_0") == math.ceil(bd.tok_embd_odd * 1.9375 / 8)
    assert fallback_surplus_bytes(bd, "Q8_0") == fallback_surplus_bytes(bd, "F16") == 0


# second-state/glm-4-9b-chat-GGUF's files (llama.cpp's quantizer, 2024), as its model card lists them, GB:
# https://huggingface.co/second-state/glm-4-9b-chat-GGUF/resolve/2011b8e5293cbd391700ca99b4767d660238c87d/README.md
_GLM4_9B_PUBLISHED_GB = {"Q2_K": 3.99, "Q3_K_S": 4.59, "Q3_K_M": 5.06, "Q3_K_L": 5.28}


@pytest.mark.parametrize(("quant", "published_gb"), sorted(_GLM4_9B_PUBLISHED_GB.items()))
def test_the_fallback_costs_each_tensors_own_type(quant: str, published_gb: float) -> None:
    """GLM-4-9B's ffn_down rows (n_ff 13,696) are its only odd ones, and llama_tensor_get_type_impl gives ffn_down
    its own type: Q3_K in a Q2_K (-> Q4_0: +1.06 bits a weight), Q5_K in a Q3_K_L (-> Q5_1: +0.5), Q4_K/Q5_K in a
    Q3_K_M. The file is larger by what that type's fallback adds (the rate already holds the chosen type): each
    quant within 2 % of the published file. Charged the mix's average fallback instead, Q2_K came to 4.18 GB (+4.6 %,
    the Q4_K share of its mix at Q5_0); before the fallback was counted every one was 4-7 % short."""
    from kvadvise.backends.hf import HFBackend

    spec = HFBackend().load_spec(str(DATA / "glm4-9b.json"), quant=quant)
    print(quant, spec.weights_bytes / 1e9, published_gb)
    assert spec.weights_bytes / 1e9 == pytest.approx(published_gb, rel=0.02)


def test_an_mxfp4_checkpoints_experts_stay_mxfp4_at_any_quant() -> None:
    """gpt-oss's GGUFs keep the routed experts MXFP4 (4.25 bits) whatever the file's quant name; only the other
    tensors take the quant's types. Published: unsloth's gpt-oss-120b-F16.gguf is 60.87 GiB (llama-bench, Framework
    community, https://community.frame.work/t/will-the-ai-max-395-128gb-be-able-to-run-gpt-oss-120b/73280/26);
    bartowski's gpt-oss-20b Q6_K 12.04 GB "with all FFN kept at MXFP4_MOE" (its model card,
    https://mygguf.com/models/bartowski_openai_gpt-oss-20b-GGUF.html). Before, the experts took the quant's rate:
    F16 would be 218 GiB, Q6_K 17.2 GB."""
    from kvadvise.backends.hf import HFBackend

    hf = HFBackend()
    big = hf.load_spec(str(DATA / "gpt-oss-120b.json"), quant="F16")
    assert big.weights_bytes / (1 << 30) == pytest.approx(60.87, rel=0.01)
    small = hf.load_spec(str(DATA / "gpt-oss-20b.json"), quant="Q6_K")
    assert small.weights_bytes / 1e9 == pytest.approx(12.04, rel=0.01)
    assert any("stay MXFP4" in n for n in small.notes)
    # and the parts say so: the routed experts are their MXFP4 bytes at any quant (24 layers x 32 experts x 3 x
    # 2880 x 2880 at 4.25 bits), what a partial offload moves and a token reads, and their f32 biases (gate, up
    # {2880, 32} and down {2880, 32} a layer: llama-quant.cpp quantizes no bias; --n-cpu-moe moves them too)
    experts = 24 * 32 * 3 * 2880 * 2880 * 4.25 / 8 + 24 * 32 * 3 * 2880 * 4
    for quant in ("Q6_K", "Q4_K_M", "F16"):
        assert hf.load_spec(str(DATA / "gpt-oss-20b.json"), quant=quant).expert_bytes == pytest.approx(
            experts, rel=2e-3
        )
