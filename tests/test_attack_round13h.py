"""Round 13h of the red team (a reviewer in its own worktree): hf configs and GGUF headers of recent families against
llama.cpp's loader (src/models/*.cpp) and convert_hf_to_gguf.py (conversion/*.py, llama-cpp-python 0.3.36's vendored
llama.cpp). Each test reproduces one defect of the code at 24d1c3b, where it fails; its docstring gives the command,
what happened, what should happen and the evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)

from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import GGUFHeader

MIB = 1 << 20


def _header(md: dict[str, object]) -> GGUFHeader:
    return GGUFHeader(
        source="t.gguf", version=3, byte_order="<", metadata=md, tensors=(), alignment=32,
        header_bytes=0, data_offset=0, data_bytes=0, file_bytes=None,
    )  # fmt: skip


# --- EXAONE 4.0 1.2B: llama.cpp has no sliding window unless the model has 64 layers ---------------------------------

_EXAONE4_1P2B = {
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 2048, "intermediate_size": 4096,
    "num_hidden_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 65536, "vocab_size": 102400, "sliding_window": None, "sliding_window_pattern": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_exaone4_gguf_with_30_layers_has_no_swa_layers() -> None:
    """An exaone4 GGUF of EXAONE-4.0-1.2B's shape (30 layers, 8 KV heads x 64, no sliding_window key, as
    conversion/exaone.py writes it when config.json's sliding_window is null): kvadvise (architecture.py _SWA_RULES
    "exaone4": _SwaRule(4, n_swa_default=4096), applied to every exaone4) plans 23 of the 30 layers as SWA layers of
    4,096 cells. llama.cpp (src/models/exaone4.cpp load_arch_hparams) sets swa_type STANDARD, n_swa 4096 and
    load_swa_pattern(ml, 4) only `if (hparams.n_layer() == 64)` (the 32B); any other block count keeps
    LLAMA_SWA_TYPE_NONE: every layer caches the whole context. At -c 32768 that is 1,920 MiB of f16 K/V, not 655."""
    md: dict[str, object] = {
        "general.architecture": "exaone4", "exaone4.block_count": 30, "exaone4.context_length": 65536,
        "exaone4.embedding_length": 2048, "exaone4.feed_forward_length": 4096, "exaone4.attention.head_count": 32,
        "exaone4.attention.head_count_kv": 8, "exaone4.attention.key_length": 64, "exaone4.attention.value_length": 64,
        "exaone4.vocab_size": 102400,
    }  # fmt: skip
    spec = from_gguf(_header(md), known_only=False)
    assert not any(spec.swa_layers), (spec.swa_type, spec.n_swa, spec.swa_layers)


def test_exaone4_1p2b_config_kv_is_the_full_context_on_every_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf exaone-4.0-1.2b/config.json --quant Q4_K_M -c 32768 --json` (30 layers, 8 KV heads x 64,
    sliding_window null): model.n_layer_swa 23, n_swa 4096; the verbose table says "K cache 327.50 MiB 7 full
    layers x 32,768 + 23 SWA layers x 4,608 cells". llama.cpp's exaone4 (src/models/exaone4.cpp) has no SWA for a
    30-layer model (only n_layer == 64 gets swa_type STANDARD), and convert_hf_to_gguf (conversion/exaone.py
    Exaone4Model) writes no sliding_window for a null one: K = 30 x 32,768 x 8 x 64 x 2 B = 960 MiB (3x more)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_EXAONE4_1P2B))
    rc, out, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "-c", "32768", "--json")
    assert rc in (0, 3), (rc, err)
    model = json.loads(out)["model"]
    assert model["n_layer_swa"] == 0, model


# --- Gemma 3n: the "full KV assumed" note beside a plan that applies SWA -----------------------------------------------


def test_unmapped_gemma3n_note_says_full_kv_but_swa_is_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf gemma-3n-E4B/config.json --quant Q4_K_M -c 32768 --verbose` (Gemma3nForConditionalGeneration,
    35 layers, sliding_window 512, layer_types 4 sliding : 1 full; intermediate_size given as one number here, the
    real list is refused): the notes say "its sliding-window layers are not applied (full KV assumed: an upper
    bound)" (hfconfig._convert), while the same plan's K cache is "7 full layers x 32,768 + 28 SWA layers x 512
    cells" and model.n_layer_swa is 28 with model.n_swa 0 (architecture._SWA_RULES "gemma3n" applied to the generic
    keys, which carry no sliding_window: a window of 0 tokens, the 512 cells are only the ubatch). The note contradicts
    the figure beside it, and the window is neither the config's 512 nor anything llama.cpp would run (gemma3n's
    loader requires {arch}.attention.sliding_window; the converter writes 512 from the config). Expected: the note
    matches the plan (SWA applied, at the config's window) or the plan matches the note (full KV)."""
    n = 35
    types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    config = {
        "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
        "text_config": {
            "model_type": "gemma3n_text", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": n,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 262400,
            "hidden_size_per_layer_input": 256, "max_position_embeddings": 32768, "sliding_window": 512,
            "layer_types": types, "num_kv_shared_layers": 15, "torch_dtype": "bfloat16",
        },
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc, out, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "-c", "32768", "--json")
    assert rc in (0, 3), (rc, err)
    d = json.loads(out)
    notes = " ".join(d["model"]["notes"]) + " " + json.dumps(d.get("notes"))
    says_full = "full KV assumed" in notes
    planned_swa = d["model"]["n_layer_swa"] > 0
    assert not (says_full and planned_swa), (d["model"]["n_layer_swa"], notes)


# --- Mistral Small 3.x / Devstral 2512 / Magistral 2509: the converter maps Mistral3ForConditionalGeneration --------


def test_mistral3_conditional_generation_is_not_called_unmapped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf Mistral-Small-3.1-24B-Instruct-2503/config.json --quant Q4_K_M -c 32768 --json`
    (architectures ["Mistral3ForConditionalGeneration"], text_config model_type "mistral"): the notes say "config.json
    'mistral3' is not mapped to a llama.cpp architecture; generic converter keys used" although kvadvise converts it
    with its own _CONVERTERS["mistral3"] and convert_hf_to_gguf registers the class (conversion/mistral3.py
    @ModelBase.register("Mistral3ForConditionalGeneration", "Ministral3ForCausalLM") -> Ministral3Model(LlamaModel),
    MODEL_ARCH.MISTRAL3, an architecture kvadvise's GGUF reader knows). ARCH_BY_HF_CLASS lacks the class, so a
    correctly planned model (K/V 5.00 GiB = 40 x 8 x 128 x 2 x 2 B x 32,768) is presented as a guess."""
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "text_config": {
            "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
            "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
            "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072,
        },
        "vision_config": {"hidden_size": 1024, "model_type": "pixtral"}, "torch_dtype": "bfloat16",
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc, out, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "-c", "32768", "--json")
    assert rc in (0, 3), (rc, err)
    notes = " ".join(json.loads(out)["model"]["notes"])
    assert "not mapped" not in notes, notes
