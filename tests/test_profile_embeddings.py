"""A profile's token embeddings and output layer at the types the quantizer gives them, not at the file's average.

llama.cpp 0c1e570 src/llama-quant.cpp ``llama_tensor_get_type``: in a Q4_K_M (Q4_K_S, Q5_K_*, Q6_K) file,
``output.weight`` becomes Q6_K and ``token_embd.weight`` keeps the ftype's default type (Q4_K for Q4_K_M), or the
output's Q6_K when the two are tied. Both sides of an Ollama load depend on it: token_embd is the whole host
share of a full offload (llama.cpp keeps the input layer on the CPU), the output layer sits on the GPU with the
last block. Spreading the download size evenly over every weight put qwen3:8b's token_embd at 376.8 MiB (Q4_K
holds it in 333.8) and its Q6_K output at 376.8 MiB (486.9): 43 MiB too much on the host and, with the blocks,
too little on the GPU, which is the held-out qwen3:8b / RTX 2060 row of issue 37 (Ollama put 61 MiB more weights
on the GPU and 43 MiB less on the host than planned, -1.3 % on the device).
"""

from __future__ import annotations

import pytest

from kvadvise.backends.ollama.profiles import profiles
from kvadvise.planner.memory import RunConfig, estimate

MIB = 1 << 20
Q4_K_BLOCK, Q6_K_BLOCK, QK_K = 144, 210, 256  # ggml-common.h: block_q4_K, block_q6_K bytes per 256 weights


def test_qwen3_8b_embeddings_are_q4_k_and_its_output_q6_k() -> None:
    p = profiles()["qwen3:8b"]
    spec = p.spec()
    n = 151_936 * 4_096  # n_vocab x n_embd, untied (tie_word_embeddings: false)
    assert spec.tok_embd_bytes == n // QK_K * Q4_K_BLOCK == 350_060_544  # 333.84 MiB
    assert spec.output_bytes == n // QK_K * Q6_K_BLOCK == 510_504_960  # 486.86 MiB
    # the blocks take the rest of the download size: the total is unchanged
    assert spec.tok_embd_bytes + spec.output_bytes + sum(spec.layer_bytes) == pytest.approx(spec.weights_bytes, abs=64)
    assert spec.weights_bytes == p.download_bytes


def test_qwen3_8b_full_offload_keeps_exactly_token_embd_on_the_host() -> None:
    """All 37 layers on the GPU: the host holds token_embd alone, at Q4_K's size. Before the rule (and with the
    library page's 5.2 GB) the plan was 376.8 MiB on the host and 4,582.3 on the GPU; issue 37's row puts
    Ollama at 43 MiB less and 61 MiB more (about 333.8 and 4,643.3). Now 333.8 and 4,649.5 from the exact blob
    size (5,225,374,496 B, the registry's manifest): the 6 MiB over are the GGUF header inside the blob."""
    spec = profiles()["qwen3:8b"].spec()
    est = estimate(spec, RunConfig(n_ctx=4096, device="cuda"))
    assert est.host.weights_bytes == 350_060_544
    device = est.devices[0].weights_bytes - spec.cuda_pad_bytes
    assert device == spec.weights_bytes - 350_060_544
    assert device / MIB == pytest.approx(4_649.5, abs=0.1)


def test_tied_embeddings_take_the_output_type() -> None:
    """qwen3:4b ties token_embd to the output: llama_tensor_get_type quantizes it as the output (Q6_K)."""
    spec = profiles()["qwen3:4b"].spec()
    n = 151_936 * 2_560
    assert spec.output_bytes == 0
    assert spec.tok_embd_bytes == n // QK_K * Q6_K_BLOCK


def test_other_quants_and_other_files_keep_the_even_spread() -> None:
    """A quant without the rule (Q8_0 here), or a file not known to come from llama.cpp's quantizer (a config.json
    planned with ``kvadvise hf``), keeps the embeddings at the file's average, scaled to its size."""
    from kvadvise.model.breakdown import params, sized

    p = profiles()["qwen3:8b"]
    spec = p.spec()
    bd = params(spec, p.config)
    assert bd is not None
    q8 = sized(bd, "Q8_0", 8_700_000_000, quantizer_embeddings=True)
    assert q8.tok_embd == q8.output  # same count, same (average) rate
    q4 = sized(bd, "Q4_K_M", 5_200_000_000, quantizer_embeddings=True)
    assert q4.tok_embd < q4.output
    plain = sized(bd, "Q4_K_M", 5_200_000_000)  # a third-party file of that name: the even spread
    assert plain.tok_embd == plain.output
