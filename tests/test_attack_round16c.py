"""Round 16c of the red team (a reviewer in its own worktree): today's conversions (2ccaa46: Llama 4, ERNIE 4.5 MoE,
Falcon-H1, the Granite shared experts) planned with `kvadvise hf`, against what llama.cpp (llama-cpp-python 0.3.36's
vendored llama.cpp: conversion/*.py, src/models/*.cpp, src/llama-kv-cache-iswa.cpp, src/llama-hparams.cpp) and
convert_hf_to_gguf (with transformers' AutoConfig) do with the same files. Each test fails on 8a3d26f because of a
real defect; its docstring gives the command, what happened, what should happen and the arithmetic.

Checked and found right (no test): Llama 4's chunked cache (12 full layers x n_ctx + 36 layers x
GGML_PAD(min(n_ctx, 8192 + n_ubatch), 256) = 8704 cells, also with -np 4, -kvu and --swa-full; attention_chunk_size
is ignored as llama4.cpp hard-codes n_swa 8192), Scout's and Maverick's parameter counts and active bytes per token,
ERNIE 4.5's leading dense block and shared-expert width, Falcon-H1's state (3 x (3072 + 512) + 256 x 3072 floats a
layer and sequence) and its parameter count, the missing- and odd-key fuzz of all five round-14c configs (exit 0/2/3,
no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, parameter_count, run  # noqa: F401  (no_server: an autouse fixture)

DATA = Path(__file__).resolve().parent / "data" / "hf"
R14C = DATA / "round14c"
R16C = DATA / "round16c"


def _plan(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, str, dict[str, object]]:
    rc, out, err = run(
        capsys, "hf", str(path), "--quant", "Q4_K_M", "-c", "32768", "-ctk", "f16", "-ctv", "f16", "--gpu",
        "rtx4090", "--json", *extra,
    )  # fmt: skip
    return rc, err, (json.loads(out) if rc in (0, 3) else {})


# --- a build older than the architecture: planned as if it could load the model ---------------------------------------


@pytest.mark.parametrize(
    ("config", "arch"),
    [
        ("llama-4-scout-17b-16e-instruct.json", "llama4"),
        ("falcon-h1-7b-instruct.json", "falcon-h1"),
        ("ernie-4.5-21b-a3b-pt.json", "ernie4_5-moe"),
    ],
)
def test_a_build_older_than_todays_architectures_is_refused(
    capsys: pytest.CaptureFixture[str], config: str, arch: str
) -> None:
    """`kvadvise hf CONFIG --quant Q4_K_M -c 32768 --gpu rtx4090 --llama-build b4875 --json` for Llama 4 Scout,
    Falcon-H1-7B and ERNIE-4.5-21B-A3B: exit 0 or 3, a full plan "planned for llama.cpp b4875 (--llama-build): the
    memory rules of that build" (Falcon-H1 and ERNIE: "fits").

    b4875 is the March 2025 build (planner/builds.py's own witness for gemma3: ggml-org/llama.cpp#12345, "I just tested
    b4875"). None of these architectures existed in llama.cpp then, so llm_arch_from_string stops the load with
    "unknown model architecture: '<arch>'":
    - llama4: the model was published on 2025-04-05; llama.cpp added it in b5074 (#12791;
      abetlen/llama-cpp-python#1994, 2025-04-08: "unknown model architecture: 'llama4'" ... "Please update to
      ... releases/tag/b5074");
    - falcon-h1: ggml-org/llama.cpp#13681 (2025-05-21) asks for it; #14534 added it in July 2025
      (Vali-98/ChatterUI#399, 2025-07-09: "Falcon-H1 has just been merged");
    - ernie4_5-moe: ggml-org/llama.cpp#14465 (2025-06-30: "llama.cpp only supports the 0.3B dense ERNIE 4.5");
      #14658 added it in July 2025 (ollama/ollama#11244 points to b5924).
    planner/builds.py ARCH_FIRST_BUILD lists command-r, gemma3, glm4moe and gemma4 only, so check_architecture lets
    today's three through. Expected: exit 2 with the one-line "llama.cpp b4875 does not know the <arch>
    architecture" (an entry per architecture: llama4 from b5074, falcon-h1 and ernie4_5-moe from their July 2025
    builds; a lower bound of each is enough to refuse b4875)."""
    rc, err, _ = _plan(capsys, R14C / config, "--llama-build", "b4875")
    one_line_input_error(rc, err)
    assert arch in err, err


# --- Llama 4: a slim text_config (transformers' save_pretrained diff) is refused -------------------------------------


def test_llama4_slim_text_config_gets_llama4_text_config_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf round16c/llama-4-scout-17b-16e-instruct-slim.json --quant Q4_K_M -c 32768 -ctk f16 -ctv f16
    --gpu rtx4090 --json`: exit 2, "num_hidden_layers is missing".

    The file is round14c's Scout with every text_config key dropped whose value equals transformers' Llama4TextConfig
    default (configuration_llama4.py __init__: vocab_size 202048, hidden_size 5120, intermediate_size 8192,
    intermediate_size_mlp 16384, num_hidden_layers 48, num_attention_heads 40, num_key_value_heads 8, head_dim 128,
    num_local_experts 16, num_experts_per_tok 1, interleave_moe_layer_step 1, attention_chunk_size 8192, ...): the
    config.json save_pretrained writes for a re-saved Scout (PretrainedConfig.to_diff_dict diffs a sub-config
    against its class defaults, as Gemma 3's published text_config shows). convert_hf_to_gguf reads it through
    AutoConfig.from_pretrained(...).to_dict() (conversion/base.py load_hparams), which restores every default, so
    the GGUF is the full Scout's: 48 blocks, hidden 5120, 40 heads, 8 KV heads of 128, 16 experts.
    hfconfig._LLAMA4_TEXT_DEFAULTS (today's answer to "a slim text_config") holds 5 of those keys; without
    num_hidden_layers (or hidden_size, num_attention_heads, vocab_size) the conversion is refused, and a text_config that lacks only num_key_value_heads is planned with 40
    KV heads (llama.cpp's n_head_kv = n_head fallback): 5 x the K/V. Expected: the full file's plan,
    107,769,364,480 parameters and the same K/V bytes (12 full layers x 32768 cells + 36 chunked layers x 8704
    cells, x 8 x 128 x 2 B x 2 (K and V) = 1,610,612,736 + 1,283,457,024 = 2,894,069,760 B)."""
    rc_full, _, full = _plan(capsys, R14C / "llama-4-scout-17b-16e-instruct.json")
    assert rc_full in (0, 3)
    assert full["memory"]["kv_bytes"] == 2_894_069_760  # type: ignore[index]
    rc, err, slim = _plan(capsys, R16C / "llama-4-scout-17b-16e-instruct-slim.json")
    assert rc in (0, 3), (rc, err)
    assert parameter_count(slim) == parameter_count(full) == 107_769_364_480
    assert slim["memory"]["kv_bytes"] == full["memory"]["kv_bytes"]  # type: ignore[index]
