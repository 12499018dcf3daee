"""Ollama's popular embedding models as built-in profiles (profiles/ollama_models.json): "chat + embeddings"
planned before ``ollama pull``. An encoder (llama.cpp's bert and nomic-bert) gets no memory module
(llama_model::create_memory), so no K/V cache, and its batch is not capped by the context (llama-context.cpp:
"with causal attention, the batch size is limited by the context size"); its input tables (token_embd,
token_types, position_embd) stay on the CPU (LLM_TENSOR_LAYER_INPUT)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ollama_fake import closed_port_url

from kvadvise.backends.ollama import OllamaBackend
from kvadvise.backends.ollama.name import parse_name
from kvadvise.backends.ollama.profiles import find_profile, suggestions
from kvadvise.cli import main
from kvadvise.model.architecture import ENCODER_ARCHS
from kvadvise.planner.memory import RunConfig, estimate, resolve

EMBEDDING = ("nomic-embed-text:v1.5", "mxbai-embed-large:335m", "bge-m3:567m", "all-minilm:22m", "all-minilm:33m")
# (architecture, blocks, trained context) as llama.cpp's converter writes them (conversion/bert.py)
SHAPES = {
    "nomic-embed-text:v1.5": ("nomic-bert", 12, 2048),
    "mxbai-embed-large:335m": ("bert", 24, 512),
    "bge-m3:567m": ("bert", 24, 8192),
    "all-minilm:22m": ("bert", 6, 512),
    "all-minilm:33m": ("bert", 12, 512),
}


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))


@pytest.mark.parametrize("pid", EMBEDDING)
def test_an_embedding_profile_plans_as_an_encoder(pid: str) -> None:
    spec = find_profile(parse_name(pid)).spec()  # type: ignore[union-attr]
    arch, n_layer, n_ctx_train = SHAPES[pid]
    assert (spec.architecture, spec.n_layer, spec.n_ctx_train) == (arch, n_layer, n_ctx_train)
    assert spec.architecture in ENCODER_ARCHS and not any(spec.kv_layers) and spec.output_bytes == 0
    est = estimate(spec, RunConfig(n_ctx=spec.n_ctx_train, device="cuda"))
    assert est.kv_bytes == 0 and est.recurrent_bytes == 0
    # the input tables in the CPU's buffer, every block on the GPU (no output layer, so no tied copy)
    assert spec.input_extra_bytes > 0  # token_types (and BERT's position_embd), f32 in the file
    assert est.host.weights_bytes == spec.tok_embd_bytes + spec.input_extra_bytes
    assert est.devices[0].weights_bytes - spec.cuda_pad_bytes == (
        spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes
    )


def test_an_encoders_batch_is_not_capped_by_its_context() -> None:
    """llama-context.cpp: ``n_batch = causal_attn ? min(n_ctx, n_batch) : n_batch``."""
    bert = find_profile(parse_name("mxbai-embed-large")).spec()  # type: ignore[union-attr]
    qwen = find_profile(parse_name("qwen3:8b")).spec()  # type: ignore[union-attr]
    cfg = RunConfig(n_ctx=512, n_batch=2048, n_ubatch=512, device="cuda")
    assert resolve(bert, cfg).n_batch == 2048
    assert resolve(qwen, cfg).n_batch == 512


def test_nomic_embed_text_plan_leaves_the_servers_cache_type_alone(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["ollama", "nomic-embed-text", "--gpu", "rtx-4090", "--ram", "32GiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["fits"] is True and doc["memory"]["kv_bytes"] == 0
    assert doc["ollama"]["model"] == "nomic-embed-text:latest"
    assert "OLLAMA_KV_CACHE_TYPE" not in doc["ollama"]["env"]  # a K/V cache type would change nothing
    assert "--kv-cache-type" not in doc["ollama"]["verify_command"]
    rc = main(["ollama", "nomic-embed-text", "--gpu", "rtx-4090", "--ram", "32GiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "2,048 tokens, no K/V cache" in out and "the cache type changes nothing" in out
    assert "OLLAMA_KV_CACHE_TYPE" not in out and "decode" not in out


def test_chat_and_embeddings_together(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["ollama", "qwen3:8b", "nomic-embed-text", "--gpu", "rtx-4090", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and [m["architecture"] for m in doc["models"]] == ["qwen3", "nomic-bert"]
    resident = {r["model"]: r for r in doc["asked"]["resident"]}
    assert set(resident) == {"qwen3:8b", "nomic-embed-text:latest"}
    assert resident["nomic-embed-text:latest"]["num_ctx"] == 2048  # Ollama caps num_ctx at the training context
    assert 0 < sum(resident["nomic-embed-text:latest"]["vram_bytes"]) < 1 << 30


def test_did_you_mean_finds_them_and_compare_leaves_them_out() -> None:
    assert "nomic-embed-text" in suggestions(parse_name("nomic-embed"))
    assert "mxbai-embed-large" in suggestions(parse_name("mxbai-embed"))
    compared = dict(OllamaBackend().builtin_models())
    assert compared and not any(spec.architecture in ENCODER_ARCHS for spec in compared.values())
    assert "qwen3:8b" in compared and "nomic-embed-text:v1.5" not in compared
