"""Built-in profiles of Ollama library models (profiles/ollama_models.json)."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from kvadvise.backends.ollama.name import parse_name
from kvadvise.backends.ollama.profiles import find_profile, profile_ids, profiles
from kvadvise.model.spec import SWA_NONE, SWA_STANDARD
from kvadvise.planner.memory import RunConfig, estimate

GiB = 1 << 30
F16 = 2

REQUIRED = {
    "qwen3-coder": ["30b"],
    "qwen2.5-coder": ["7b", "14b", "32b"],
    "qwen3": ["8b", "14b", "30b-a3b", "32b"],
    "llama3.1": ["8b", "70b"],
    "llama3.2": ["1b", "3b"],
    "gemma3": ["4b", "12b", "27b"],
    "gpt-oss": ["20b", "120b"],
    "deepseek-r1": ["8b", "14b", "32b"],
    "mistral": ["7b"],
    "phi4": ["14b"],
}
LATEST = {
    "qwen3-coder": "30b",
    "qwen2.5-coder": "7b",
    "qwen3": "8b",
    "llama3.1": "8b",
    "llama3.2": "3b",
    "gemma3": "4b",
    "gpt-oss": "20b",
    "deepseek-r1": "8b",
    "mistral": "7b",
    "phi4": "14b",
}


def test_the_file_is_json_with_models() -> None:
    doc = json.loads(files("kvadvise.profiles").joinpath("ollama_models.json").read_text(encoding="utf-8"))
    assert isinstance(doc["models"], dict) and doc["_about"]


@pytest.mark.parametrize(("model", "tag"), [(m, t) for m, tags in REQUIRED.items() for t in tags])
def test_required_models(model: str, tag: str) -> None:
    p = find_profile(parse_name(f"{model}:{tag}"))
    assert p is not None and p.id == f"{model}:{tag}"


@pytest.mark.parametrize(("model", "tag"), LATEST.items())
def test_latest_aliases(model: str, tag: str) -> None:
    p = find_profile(parse_name(model))
    assert p is not None and p.id == f"{model}:{tag}"


@pytest.mark.parametrize("pid", profile_ids())
def test_every_profile_has_sources_and_loads(pid: str) -> None:
    p = profiles()[pid]
    assert p.source.strip() and p.hf_repo.strip() and p.confidence.strip()
    if p.download_bytes is not None:
        assert p.download_bytes > 100_000_000 and p.download_source and p.download_size
    if p.aliases:
        assert all(a.split(":")[0] == pid.split(":")[0] for a in p.aliases)
    spec = p.spec()
    assert spec.n_layer > 0 and spec.n_vocab > 0 and spec.n_ctx_train > 0
    assert spec.source == f"profile:{pid}" and spec.name == pid
    assert spec.notes[0].startswith("planned from a built-in profile")
    if p.download_bytes:
        assert spec.weights_bytes == p.download_bytes
        assert spec.notes[0] == f"planned from a built-in profile; weights size from {p.download_source}"
    else:  # never 0: a plan with no weights would say anything fits
        assert spec.weights_bytes > 1_000_000_000 and "weights estimated as" in spec.notes[0]
    # every layer of every profile holds KV in these architectures (no recurrent ones here)
    assert not spec.has_recurrent and all(spec.kv_layers)
    assert estimate(spec, RunConfig(n_ctx=4096, flash_attn="on")).kv_bytes > 0


@pytest.mark.parametrize(
    ("pid", "published"),
    # the parameter counts on the models' Hugging Face cards
    [("qwen3:8b", 8.2e9), ("qwen3:14b", 14.8e9), ("qwen3:32b", 32.8e9), ("qwen2.5-coder:7b", 7.61e9),
     ("qwen2.5-coder:14b", 14.7e9), ("qwen2.5-coder:32b", 32.5e9), ("llama3.1:8b", 8.03e9), ("phi4:14b", 14.7e9)],
)  # fmt: skip
def test_dense_parameter_count_matches_the_published_one(pid: str, published: float) -> None:
    from kvadvise.backends.ollama.profiles import dense_params

    p = profiles()[pid]
    n = dense_params(p.spec(), p.config)
    assert n is not None and abs(n - published) / published < 0.015, n


def test_profile_without_a_download_size_gets_q4_k_m_weights() -> None:
    import dataclasses

    # every shipped profile has a size now (issue 14); the fallback is for one that has none
    p = dataclasses.replace(profiles()["qwen3:32b"], download_bytes=None, quantization=None)
    spec = p.spec()
    # 32.76 B parameters x 4.90 bits per weight (llama.cpp's Q4_K_M figure, tools/quantize/quantize.cpp)
    assert 19.5e9 < spec.weights_bytes < 20.5e9 and spec.file_type == "q4_K"
    moe = profiles()["qwen3:30b-a3b"]
    from kvadvise.backends.ollama.profiles import dense_params

    assert dense_params(moe.spec(), moe.config) is None  # MoE: not this formula


def test_qwen3_coder_30b_kv_per_token() -> None:
    """48 layers x 4 KV heads x 128 x 2 (K and V) x 2 B (f16) = 98,304 B per token."""
    spec = find_profile(parse_name("qwen3-coder:30b")).spec()  # type: ignore[union-attr]
    assert (spec.architecture, spec.n_layer, spec.n_head_kv[0], spec.n_embd_head_k) == ("qwen3moe", 48, 4, 128)
    per_token = 48 * 4 * 128 * 2 * F16
    assert per_token == 98_304
    est = estimate(spec, RunConfig(n_ctx=32768, flash_attn="on"))
    assert est.kv_bytes_per_token == per_token and est.kv_bytes == 3 * GiB
    assert spec.file_type == "q4_K"


def test_sliding_window_models() -> None:
    g = find_profile(parse_name("gemma3:27b")).spec()  # type: ignore[union-attr]
    assert g.swa_type == SWA_STANDARD and g.n_swa == 1024 and sum(g.swa_layers) == 52  # 62 layers, 1 in 6 global
    o = find_profile(parse_name("gpt-oss:20b")).spec()  # type: ignore[union-attr]
    assert o.n_swa == 128 and sum(o.swa_layers) == 12 and o.file_type == "mxfp4"
    phi = find_profile(parse_name("phi4")).spec()  # type: ignore[union-attr]
    assert phi.swa_type == SWA_NONE  # llama.cpp disables phi3's window


def test_unknown_and_non_library() -> None:
    assert find_profile(parse_name("qwen3:0.6b")) is None
    assert find_profile(parse_name("jdoe/qwen3:8b")) is None
    assert find_profile(parse_name("QWEN3:8B")) is not None  # Ollama names are case-insensitive
