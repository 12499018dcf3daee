"""Round 14c of the red team (a reviewer in its own worktree): config.json files of current Hub models, reconstructed
from memory (tests/data/hf/round14c/; what was checked since is in its SOURCES.md), planned with `kvadvise hf`, against what llama.cpp allocates
for the GGUF convert_hf_to_gguf.py makes of them (llama-cpp-python 0.3.36's vendored llama.cpp: conversion/*.py,
src/models/*.cpp, src/llama-hparams.cpp). Each test reproduces one defect of the code at 2e84dda, where it fails;
its docstring gives the command, what happened, what should happen and the arithmetic.

Parameter counts are in kvadvise's own basis (matrices; the norms and biases it leaves out are left out here too),
read from the weights note of `--json` ("Q4_K_M at 4.90 bits per weight x N parameters (counted from config.json,
...)")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, parameter_count, run  # noqa: F401  (no_server: an autouse fixture)

from kvadvise.model.hfconfig import gguf_metadata

DATA = Path(__file__).resolve().parent / "data" / "hf"
R14C = DATA / "round14c"


def _plan(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, dict[str, object]]:
    rc, out, err = run(
        capsys, "hf", str(path), "--quant", "Q4_K_M", "-c", "32768", "--gpu", "rtx4090", "--json", *extra
    )
    if rc == 2:
        return rc, {}
    assert rc in (0, 3), (rc, err)
    return rc, json.loads(out)


# --- Granite 4.0-H (GraniteMoeHybridForCausalLM, MoE): the shared expert is not counted -----------------------------


def test_granite4_h_small_counts_its_shared_expert(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf granite4-h-small.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json` (ibm-granite/granite-4.0-h-small:
    40 blocks, hidden 4096, 72 experts of intermediate_size 768, top 10, shared_intermediate_size 1536): "Q4_K_M at
    4.90 bits per weight x 31,432,839,168 parameters". The published model is 32.2B.

    convert_hf_to_gguf (conversion/granite.py GraniteHybridModel.set_gguf_parameters -> GraniteMoeModel
    .set_gguf_parameters) writes `granitehybrid.expert_shared_feed_forward_length = shared_intermediate_size` (1536),
    and modify_tensors splits shared_mlp.input_linear into ffn_gate_shexp / ffn_up_shexp when num_local_experts > 0.
    llama.cpp (src/models/granite-hybrid.cpp load_arch_tensors, `if (n_expert > 0) ... if (hparams.n_ff_shexp > 0)`)
    creates ffn_gate_shexp, ffn_up_shexp {4096, 1536} and ffn_down_shexp {1536, 4096} in every one of the 40 blocks,
    and build_layer_ffn runs them beside the routed experts. hfconfig._text_model writes the shared width only from
    `shared_expert_intermediate_size` (Qwen's name), so the GGUF metadata lacks it and breakdown.params counts the
    router alone in each block's dense part (11,796,480 = 40 x 4096 x 72):
    missing 40 x 3 x 4096 x 1536 = 754,974,720 parameters (462 MB at Q4_K_M, read for every token).
    Expected: 31,432,839,168 + 754,974,720 = 32,187,813,888 parameters (the published 32.2B)."""
    path = DATA / "granite4-h-small.json"
    md = gguf_metadata(json.loads(path.read_text()), source=str(path))
    assert md.get("granitehybrid.expert_shared_feed_forward_length") == 1536, sorted(md)
    _, plan = _plan(capsys, path)
    assert parameter_count(plan) == 32_187_813_888


# --- Granite 4.0 Micro: a non-hybrid GraniteMoeHybrid config with num_experts_per_tok 0 is "granite" -----------------


def test_granite4_micro_is_converted_to_granite_not_granitemoe(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf granite-4.0-micro.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json` (ibm-granite/granite-4.0-micro:
    GraniteMoeHybridForCausalLM with all 40 layer_types "attention", num_local_experts 0, num_experts_per_tok 0):
    model.architecture "granitemoe", and the notes say "architecture 'granitemoe' is not verified against llama.cpp;
    generic rules applied: every figure is an estimate".

    conversion/granite.py GraniteHybridModel.__init__: with no SSM layers, `has_experts = self.find_hparam(
    ["num_experts_per_tok", "num_experts_per_token"], optional=True)` is the value 0, falsy, so the model_arch becomes
    MODEL_ARCH.GRANITE ("granite"), a dense Granite llama.cpp loads with src/models/granite.cpp (the shared_mlp
    becomes ffn_gate/ffn_up/ffn_down since num_local_experts is 0). hfconfig._granitehybrid tests
    `hp.find(("num_experts_per_tok", ...))`, the (key, value) pair, which is truthy whenever the key is present, 0 or
    not. The same holds for granite-4.0-1b and granite-4.0-350m (the Nano family). Expected: architecture "granite",
    no "not verified" note (K/V 40 x 8 x 64 x 2 x 2 B = 80 KiB per token either way)."""
    _, plan = _plan(capsys, R14C / "granite-4.0-micro.json")
    model = plan["model"]
    assert model["architecture"] == "granite", model["architecture"]  # type: ignore[index]
    assert not any("not verified" in n for n in model["notes"]), model["notes"]  # type: ignore[index]


# --- Llama 4 (Llama4ForConditionalGeneration): planned with generic keys that drop the shared expert and the ------------
# --- interleaved dense layers; convert_hf_to_gguf maps the class (conversion/llama.py Llama4Model, arch llama4) --------


def test_llama4_scout_counts_the_shared_expert(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf llama-4-scout-17b-16e-instruct.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json`
    (meta-llama/Llama-4-Scout-17B-16E-Instruct, text_config: 48 layers, hidden 5120, 16 experts of intermediate_size
    8192, interleave_moe_layer_step 1): exit 0 with 101,729,566,720 parameters, 59.4 GB at Q4_K_M; the only word of
    doubt is a note that generic keys were used.

    convert_hf_to_gguf registers Llama4ForConditionalGeneration (conversion/llama.py Llama4Model: expert_feed_forward
    _length = intermediate_size 8192, feed_forward_length = intermediate_size_mlp 16384, interleave_moe_layer_step).
    llama.cpp src/models/llama4.cpp load_arch_tensors gives every MoE layer, beside ffn_{gate,up,down}_exps
    {5120, 8192, 16}, a shared expert ffn_{gate,up,down}_shexp of n_ff_shexp = n_ff_exp = 8192. kvadvise counts the
    routed experts, router, attention (48 x (2 x 5120 x 5120 + 2 x 5120 x 1024)) and untied embeddings
    (2 x 202048 x 5120) = 101,729,566,720, but not the 48 x 3 x 5120 x 8192 = 6,039,797,760 shared-expert
    parameters (3.7 GB at Q4_K_M, read for every token). Expected: refused (exit 2: the converter's keys are not
    emulated) or 107,769,364,480 parameters."""
    rc, plan = _plan(capsys, R14C / "llama-4-scout-17b-16e-instruct.json")
    assert rc == 2 or parameter_count(plan) == 107_769_364_480


def test_llama4_maverick_has_dense_layers_between_the_moe_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf llama-4-maverick-17b-128e-instruct.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json`
    (meta-llama/Llama-4-Maverick-17B-128E-Instruct: 48 layers, 128 experts of 8192, interleave_moe_layer_step 2,
    intermediate_size_mlp 16384 for the dense layers): 778,214,440,960 parameters (444 GiB at Q4_K_M), for a model
    published as 400B.

    llama.cpp (src/models/llama4.cpp: `is_moe_layer = n_moe_layer_step > 0 && (il + 1) % n_moe_layer_step == 0`,
    the step being the interleave_moe_layer_step the converter writes) has experts in the 24 odd layers only; the 24
    even ones hold a dense FFN of n_ff = intermediate_size_mlp 16384. Per layer: MoE 128 x 3 x 5120 x 8192
    + router 5120 x 128 + shared expert 3 x 5120 x 8192; dense 3 x 5120 x 16384; attention 2 x 5120 x 5120
    + 2 x 5120 x 1024; plus untied embeddings 2 x 202048 x 5120:
    24 x 16,232,611,840 + 24 x 251,658,240 + 48 x 62,914,560 + 2,068,971,520 = 400,711,352,320.
    kvadvise puts 128 experts in all 48 layers (breakdown.block_ffn reads decoder_sparse_step, not
    interleave_moe_layer_step). Expected: refused (exit 2) or 400,711,352,320 parameters."""
    rc, plan = _plan(capsys, R14C / "llama-4-maverick-17b-128e-instruct.json")
    assert rc == 2 or parameter_count(plan) == 400_711_352_320


# --- ERNIE 4.5 MoE: moe_num_experts is not a key the generic path reads, so a 21B MoE is planned as a 3B dense -------


def test_ernie45_21b_a3b_is_not_planned_as_a_3b_dense_model(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf ernie-4.5-21b-a3b-pt.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json` (baidu/ERNIE-4.5-21B-A3B-PT:
    Ernie4_5_MoeForCausalLM, 28 layers, hidden 2560, moe_num_experts 64, moe_k 6, moe_intermediate_size 1536,
    moe_num_shared_experts 2, moe_layer_start_index 1, intermediate_size 12288, tied embeddings): exit 0, "fits",
    n_expert 0 and 3,347,578,880 parameters (2.05 GiB of weights) - every layer a dense FFN of 12288.

    convert_hf_to_gguf registers the class (conversion/ernie.py Ernie4_5MoeModel: expert_count = moe_num_experts,
    expert_used_count = moe_k, leading_dense_block_count = moe_layer_start_index, expert_feed_forward_length =
    moe_intermediate_size, expert_shared_feed_forward_length = intermediate_size // num_key_value_heads = 3072);
    llama.cpp's ernie4_5-moe (src/models/ernie4-5-moe.cpp: `is_moe_layer = il >= n_layer_dense_lead && (il + 1) %
    n_moe_layer_step == 0`) has one dense layer and 27 MoE layers:
    embeddings 103424 x 2560 (tied) + 28 x attention (2 x 2560 x 2560 + 2 x 2560 x 512) + 3 x 2560 x 12288
    + 27 x (64 x 3 x 2560 x 1536 + 2560 x 64 + 3 x 2560 x 3072) = 21,825,290,240 parameters (the published 21B),
    12.5 GiB at Q4_K_M, 6.5 times what was planned. Expected: refused (exit 2) or 21,825,290,240 parameters."""
    rc, plan = _plan(capsys, R14C / "ernie-4.5-21b-a3b-pt.json")
    assert rc == 2 or parameter_count(plan) == 21_825_290_240


# --- Falcon-H1: every layer is attention AND Mamba-2; the SSM state is left out ----------------------------------------


def test_falcon_h1_keeps_a_mamba2_state_in_every_layer(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf falcon-h1-7b-instruct.json --quant Q4_K_M -c 32768 --gpu rtx4090 --json`
    (tiiuae/Falcon-H1-7B-Instruct: FalconH1ForCausalLM, 44 layers, mamba_d_ssm 3072, mamba_d_state 256,
    mamba_n_groups 1, mamba_d_conv 4): memory.recurrent_bytes 0, model.n_layer_recurrent 0.

    convert_hf_to_gguf registers the class (conversion/falcon_h1.py FalconH1Model over Mamba2Model: ssm.inner_size =
    mamba_d_ssm, ssm.state_size, ssm.group_count, ssm.conv_kernel), llama.cpp's falcon-h1 (src/models/falcon-h1.cpp
    load_arch_hparams: `std::fill(is_recr_impl..., true)`) makes every layer recurrent as well as attention, and the
    hybrid memory keeps per layer and sequence n_embd_r() + n_embd_s() f32 values (src/llama-hparams.cpp):
    (d_conv - 1) x (d_inner + 2 x n_group x d_state) + d_state x d_inner = 3 x (3072 + 512) + 256 x 3072
    = 797,184 floats = 3,188,736 B; x 44 layers = 140,304,384 B (134 MiB), none of it planned. The lower-cased
    model_type "falcon_h1" misses architecture._RECURRENT_AND_ATTENTION's "falcon-h1" (llama.cpp's name).
    Expected: refused (exit 2) or recurrent_bytes 140,304,384 at one sequence.

    (The file first read mamba_d_ssm 6144 / mamba_n_heads 48, written from memory, and 280,338,432 here; public copies
    of the published config.json, and transformers' FalconH1 table (7B: 24 Mamba heads of 128), give 3072 / 24.)"""
    rc, plan = _plan(capsys, R14C / "falcon-h1-7b-instruct.json")
    assert rc == 2 or plan["memory"]["recurrent_bytes"] == 140_304_384, plan["memory"]  # type: ignore[index]
