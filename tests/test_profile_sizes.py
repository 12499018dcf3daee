"""Every built-in profile's download size against the weights its config gives at its quantization.

The weights are recounted from the config (kvadvise.model.breakdown: embeddings, attention or the
recurrent mixer of hybrid blocks, FFN, experts, MTP blocks, with the tensor shapes llama.cpp's loader
gives them) at llama.cpp's bits per weight for the quant and Ollama's own choices (per-layer embeddings
and vision towers unquantized, qwen3.5's experts), plus the vision/audio tower the blob embeds; a stated
size more than 5 % away means a wrong size, a wrong quant or a wrong config.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from tinymodels import write_tiny_gguf

from kvadvise.backends.ollama.profiles import KINDS, profile_ids, profiles
from kvadvise.model.architecture import from_gguf
from kvadvise.model.breakdown import fallback_bits_per_weight, params, params_from_metadata, sized, vision_params
from kvadvise.model.gguf import read_file
from kvadvise.model.hfconfig import from_config
from kvadvise.planner.memory import RunConfig, estimate

TOLERANCE = 0.05


def _recount(pid: str) -> tuple[int, int]:
    p = profiles()[pid]
    spec = from_config(p.config, source=pid)
    bd = params(spec, p.config)
    assert bd is not None, pid
    assert p.quantization and p.download_bytes
    return p.sizes(spec, bd).total + p.projector_bytes, p.download_bytes


# the tiny GGUFs llama.cpp loads in tests/test_oracle.py: their tensors have the shapes its loader asks for
# (the hybrids: qwen35.cpp / qwen3next.cpp Gated DeltaNet blocks, mamba2.cpp / granite-hybrid.cpp Mamba-2 ones);
# MLA and glm4moe's layer placement need the config, which a GGUF does not carry
@pytest.mark.parametrize(
    "recipe",
    ["llama", "mixtral", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "gpt-oss", "phi3", "command-r",
     "cohere2", "granite", "qwen35", "qwen3next", "mamba2", "granitehybrid"],
)  # fmt: skip
def test_the_count_matches_the_tensors_llama_cpp_loads(tmp_path: Path, recipe: str) -> None:
    """Every block's count equals the elements of its tensors, less norms and biases (1-D vectors; gpt-oss's
    2-D expert biases), which the count leaves out or includes as a handful of values."""
    header = read_file(write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe))
    spec = from_gguf(header)
    names = {t.name for t in header.tensors}
    bd = params_from_metadata(spec, header.metadata, {"tie_word_embeddings": "output.weight" not in names})
    assert bd is not None
    block = [0] * spec.n_layer_all
    small = [0] * spec.n_layer_all
    for t in header.tensors:
        if m := re.match(r"blk\.(\d+)\.", t.name):
            n = math.prod(t.shape)
            block[int(m[1])] += n
            if t.name.endswith(".bias") or sum(1 for x in t.shape if x > 1) < 2:
                small[int(m[1])] += n
    assert bd.tok_embd == math.prod(next(t.shape for t in header.tensors if t.name == "token_embd.weight"))
    for il in range(spec.n_layer):
        assert abs(bd.layers[il] - block[il]) <= small[il], (recipe, il, bd.layers[il], block[il], small[il])
    if spec.has_recurrent:
        assert any(a and r for a, r in zip(bd.attn, spec.recurrent_layers, strict=True))


@pytest.mark.parametrize("pid", profile_ids())
def test_stated_size_is_within_5_percent_of_the_recount(pid: str) -> None:
    counted, stated = _recount(pid)
    assert abs(stated - counted) / counted <= TOLERANCE, (
        f"{pid}: stated {stated / 1e9:.2f} GB, counted {counted / 1e9:.2f}"
    )


@pytest.mark.parametrize("pid", profile_ids())
def test_every_size_has_a_source_and_a_date(pid: str) -> None:
    p = profiles()[pid]
    src = p.download_source
    assert src is not None and src.kind in KINDS and src.date and (src.ref or src.url) and p.quantization
    assert p.weights_line == f"weights: {p.download_size}, {KINDS[src.kind]}, {src.date}"


@pytest.mark.parametrize(
    ("pid", "size"),
    # Ollama's library (issue 14): the sizes the old profiles had wrong, and the exact /api/tags totals;
    # gemma4:e4b: the /api/tags example of ollama/ollama@fb307609 docs/openapi.yaml (issue 29)
    [("qwen3-coder:30b", 19e9), ("llama3.1:8b", 4_920_738_944), ("llama3.1:70b", 43e9),
     ("deepseek-r1:70b", 42_520_397_704), ("llama3.3:70b", 42_520_413_916), ("mistral:7b", 4.4e9),
     ("gemma4:e4b", 9_608_350_245)],
)  # fmt: skip
def test_corrected_sizes(pid: str, size: float) -> None:
    assert profiles()[pid].download_bytes == size


def test_parameter_counts_of_moe_models() -> None:
    """The published totals: Qwen3-Coder-30B-A3B 30.5 B (3.3 B active), gpt-oss-20b 20.9 B (3.6 B active),
    gpt-oss-120b 116.8 B (5.1 B active), Mixtral 8x7B 46.7 B."""
    for pid, total, active in [
        ("qwen3-coder:30b", 30.5e9, 3.3e9),
        ("gpt-oss:20b", 20.9e9, 3.6e9),
        ("gpt-oss:120b", 116.8e9, 5.1e9),
        ("mixtral:8x7b", 46.7e9, 12.9e9),
    ]:
        p = profiles()[pid]
        bd = params(from_config(p.config, source=pid), p.config)
        assert bd is not None
        assert abs(bd.total - total) / total < 0.01, (pid, bd.total)
        # read per token; model cards count the token embedding in "active" or not (OpenAI does not)
        assert min(abs(bd.active - active), abs(bd.active + bd.tok_embd - active)) / active < 0.03, (pid, bd.active)


@pytest.mark.parametrize(
    ("pid", "published", "rel"),
    [
        # the safetensors count of Qwen/Qwen3.5-9B (text, MTP block and vision tower), as the model card of
        # https://huggingface.co/Brooooooklyn/Qwen3.5-9B-unsloth-mlx quotes it: 9,653,104,368
        ("qwen3.5:9b", 9_653_104_368, 0.001),
        # /api/tags parameter_size "8.0B" of gemma4:e4b (ollama/ollama@fb307609 docs/openapi.yaml); towers ~0.45 B
        ("gemma4:e4b", 8.0e9, 0.01),
        # "25.8B" on https://ollama.com/library/gemma4:26b-a4b-it-q8_0 (the 26B's Q8_0 tag: the same weights)
        ("gemma4:26b", 25.8e9, 0.005),
        # "31.6B total parameters": the model card of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16
        ("nemotron-3-nano:30b", 31.6e9, 0.005),
    ],
)
def test_parameter_counts_of_hybrid_and_new_models(pid: str, published: int, rel: float) -> None:
    """The recount of Gated DeltaNet, Mamba-2, per-layer-embedding and MoE blocks against published totals:
    everything in the blob, MTP block and vision/audio towers included."""
    p = profiles()[pid]
    bd = params(from_config(p.config, source=pid), p.config)
    assert bd is not None
    towers = vision_params(p.config) or p.projector_bytes // 2
    assert abs(bd.total + towers - published) / published < rel, (pid, bd.total + towers)


def test_nemotron_3_nano_blocks() -> None:
    """hybrid_override_pattern MEMEM*E...: 23 Mamba-2, 23 MoE, 6 attention blocks; only the 6 hold KV and only
    the 23 Mamba-2 ones recurrent state (nemotron-h.cpp: is_recr = n_head_kv == 0 && n_ff == 0)."""
    p = profiles()["nemotron-3-nano:30b"]
    spec = p.spec()
    assert spec.architecture == "nemotron_h_moe" and spec.n_layer_all == 52
    assert (sum(spec.kv_layers), sum(spec.recurrent_layers)) == (6, 23)
    kv_per_token = 6 * 2 * 128 * 2 * 2  # 6 layers x 2 KV heads x 128 x (K and V) x 2 B (f16)
    est = estimate(spec, RunConfig(n_ctx=32768, flash_attn="on"))
    assert est.kv_bytes_per_token == kv_per_token == 6144
    # llama_hparams::n_embd_r/s: (d_conv - 1)(d_inner + 2 n_group d_state), d_state d_inner; d_inner 64 x 64
    assert (spec.n_embd_r, spec.n_embd_s) == (3 * (4096 + 2 * 8 * 128), 128 * 4096)
    bd = params(spec, p.config)
    assert bd is not None and bd.n_expert == 128 and bd.n_expert_used == 6
    attn = [a for a, kv, r in zip(bd.attn, spec.kv_layers, spec.recurrent_layers, strict=True) if not kv and not r]
    assert set(attn) == {0}  # the MoE blocks have no attention


def test_qwen35_mtp_block_is_in_the_blob_not_in_the_weights() -> None:
    """Ollama's qwen3.5 blobs carry the MTP block (llama/compat: qwen35 'translates embedded MTP tensors');
    llama.cpp does not load it (qwen35.cpp: mtp_flags = TENSOR_SKIP), so the plan's weights are the blob less
    the block and the projector stays in."""
    p = profiles()["qwen3.5:27b"]
    spec = p.spec()
    bd = params(from_config(p.config, source="x"), p.config)
    assert bd is not None and bd.nextn > 0 and spec.n_layer_nextn == 1
    s = p.sizes(spec, bd, p.download_bytes - p.projector_bytes if p.download_bytes else None)
    assert spec.weights_bytes == p.download_bytes - s.nextn
    assert sum(spec.layer_bytes) + spec.tok_embd_bytes + spec.output_bytes == pytest.approx(
        spec.weights_bytes - p.projector_bytes, abs=256
    )
    assert spec.layer_bytes[-1] == 0  # the MTP block holds nothing in memory


def test_per_layer_embeddings_stay_on_the_token_embedding_side() -> None:
    """Gemma 4 E4B's per_layer_token_embd (262144 x 256·42) is Ollama's largest tensor, kept at 16 bits; it is
    looked up like token_embd, so a plan places it with token_embd (on the CPU), not in a block."""
    p = profiles()["gemma4:e4b"]
    spec = p.spec()
    bd = params(spec, p.config)
    assert bd is not None and bd.tok_embd_per_layer == 262_144 * 256 * 42
    ple_bytes = bd.tok_embd_per_layer * 2  # Ollama keeps it at 16 bits
    assert spec.input_extra_bytes == ple_bytes and spec.output_bytes == 0  # tied to token_embd
    assert spec.weights_bytes == p.download_bytes
    assert spec.tok_embd_bytes + spec.input_extra_bytes + sum(spec.layer_bytes) == pytest.approx(
        spec.weights_bytes - p.projector_bytes, abs=256
    )
    # planned on a GPU: both tables in the CPU's buffer, the output layer's copy of token_embd alone on the GPU
    # (with everything else: the blocks, the vision tower the blob carries)
    from kvadvise.planner.memory import RunConfig, estimate

    est = estimate(spec, RunConfig(n_ctx=4096, device="cuda"))
    assert est.host.weights_bytes == spec.tok_embd_bytes + ple_bytes
    assert est.devices[0].weights_bytes - spec.cuda_pad_bytes == spec.weights_bytes - ple_bytes


def test_rows_that_a_k_quant_cannot_hold_fall_back() -> None:
    """Nemotron-3-Nano's hidden size 2688 is not a multiple of 256 (QK_K): llama.cpp and Ollama give those
    tensors Q5_0 for Q4_K and Q8_0 for Q6_K (llama-quant.cpp tensor_type_fallback), which is why its Q4_K_M
    blob is 24 GB, not the 19 GB 4.9 bits per weight would give."""
    bpw = fallback_bits_per_weight("Q4_K_M")
    assert 6.0 < bpw < 6.2
    assert fallback_bits_per_weight("Q8_0") == fallback_bits_per_weight("Q8_0")  # 32-blocks: no fallback
    p = profiles()["nemotron-3-nano:30b"]
    bd = params(from_config(p.config, source="x"), p.config)
    assert bd is not None
    plain = sized(bd, "Q4_K_M").total
    assert sized(bd, "Q4_K_M").total > 1.2 * (bd.total * 4.899 / 8) and plain > 23e9


def test_profile_parts_add_up_for_partial_offload() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    assert spec.expert_bytes > 0.9 * spec.weights_bytes - spec.tok_embd_bytes - spec.output_bytes
    assert sum(spec.layer_bytes) + spec.tok_embd_bytes + spec.output_bytes == pytest.approx(spec.weights_bytes, abs=64)
    assert len(spec.layer_bytes) == spec.n_layer_all
