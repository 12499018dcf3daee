"""Built-in profiles of Ollama library models (profiles/ollama_models.json)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.ollama.name import parse_name
from kvadvise.backends.ollama.profiles import find_profile, profile_ids, profiles
from kvadvise.model.architecture import ENCODER_ARCHS
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
    # issue 29: what Ollama leads with (its README's quick start, the Cline / VS Code / NemoClaw docs)
    "gemma4": ["e2b", "e4b", "26b", "31b"],
    "qwen3.5": ["9b", "27b", "35b"],
    "qwen3.6": ["27b", "35b"],
    "nemotron-3-nano": ["30b"],
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
    # the library's :latest (the tag list lists it at the same size; gemma4, qwen3.5 and qwen3.6 by digest too)
    "mistral-nemo": "12b",
    "devstral": "24b",
    "gemma4": "e4b",
    "qwen3.5": "9b",
    "qwen3.6": "35b",
    "nemotron-3-nano": "30b",
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
    assert p.hf_repo.strip() and p.confidence in ("full", "partial")
    assert p.config_source.url == f"https://huggingface.co/{p.hf_repo}/blob/main/config.json"
    assert p.config_source.kind in ("copy", "transcription") and (
        p.config_source.ref or p.config_source.kind == "transcription"
    )
    encoder = p.spec().architecture in ENCODER_ARCHS  # an embedding model: all-minilm:22m's blob is 46 MB
    if p.download_bytes is not None:
        assert p.download_bytes > (10_000_000 if encoder else 100_000_000) and p.download_source and p.download_size
    if p.aliases:
        assert all(a.split(":")[0] == pid.split(":")[0] for a in p.aliases) and p.aliases_source is not None
    spec = p.spec()
    assert spec.n_layer > 0 and spec.n_vocab > 0 and spec.n_ctx_train > 0
    assert spec.source == f"profile:{pid}" and spec.name == pid
    assert spec.sources[0] == f"built-in profile {pid}" and spec.sources[-1].startswith(f"config: {p.hf_repo}")
    if p.download_bytes:
        # the blob less the MTP block llama.cpp does not load (qwen3.5/3.6: one block, 1.4-3.6 % of it);
        # Gemma 4 E2B/E4B: plus the copy of token_embd their tied output layer is (the per-layer embeddings
        # stay with token_embd on the CPU)
        copy = spec.output_bytes if "copy of token_embd" in " ".join(spec.notes) else 0
        if p.sized_by_types:  # the parts at their exact types: what the library's rounded figure ("65 GB") rounds
            assert f"{spec.weights_bytes / 1e9:.0f} GB" == p.download_size, (spec.weights_bytes, p.download_size)
        elif p.exact_parts(spec) is not None:  # a K mix's tensors at their types: the rounded figure, or less the header
            assert abs(spec.weights_bytes - copy - p.download_bytes) <= 0.05 * p.download_bytes
        else:
            assert 0.95 * p.download_bytes < spec.weights_bytes - copy <= p.download_bytes
        assert spec.sources[1] == p.weights_line
    else:  # never 0: a plan with no weights would say anything fits
        assert spec.weights_bytes > 1_000_000_000 and "weights estimated as" in spec.notes[0]
    if encoder:  # llama_model::create_memory makes no memory module for an encoder: no KV at any context
        assert not any(spec.kv_layers) and spec.output_bytes == 0 and spec.input_extra_bytes > 0
        assert estimate(spec, RunConfig(n_ctx=spec.n_ctx_train, flash_attn="on")).kv_bytes == 0
        return
    # every layer holds KV except the recurrent layers of the hybrids (and Nemotron-H's MLP/MoE blocks)
    assert any(spec.kv_layers)
    if not spec.has_recurrent:
        assert all(spec.kv_layers) or spec.architecture == "gemma4"  # Gemma 4 E2B/E4B share the last layers' KV
    assert estimate(spec, RunConfig(n_ctx=4096, flash_attn="on")).kv_bytes > 0
    assert all(len(line) <= 200 for line in (*spec.notes, *spec.sources)), (spec.notes, spec.sources)


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            if k != "config":  # the published config.json is copied as it is
                yield from _strings(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")


# what research notes look like: the tools that found a figure, verdicts on older data, chatter
_LEFTOVERS = re.compile(
    r"find_string|index id|\bstale\b|irrelevant|current profile|not re-checked|from memory|this session"
    r"|a public GitHub copy|offset ~|\bunverified\b|too low|too high|inferred unless|\?\?|TODO",
    re.IGNORECASE,
)


@pytest.mark.parametrize("resource", ["ollama_models.json", "gpus.json", "usecases.json"])
def test_profile_data_holds_no_research_leftovers(resource: str) -> None:
    """Sources are short and checkable (a URL or repo@commit path, a date, a kind), not a researcher's notes:
    no tool names, no verdicts on older profiles, no sentence longer than 200 characters (issue 26.5)."""
    doc = json.loads(files("kvadvise.profiles").joinpath(resource).read_text(encoding="utf-8"))
    for path, text in _strings(doc):
        assert not _LEFTOVERS.search(text), f"{resource} {path}: {text!r}"
        assert len(text) <= 200, f"{resource} {path}: {len(text)} characters"


def test_the_leftover_check_catches_what_the_data_used_to_hold() -> None:
    old = [
        "exact bytes ... in a vendored manifest found by find_string (index id 28308313783)",
        "commit 'Update Mistral size' changed 4.1 GB -> 4.4 GB. Current profile uses 4.1GB: stale",
        "Ollama 0.12.5 pull EOF bug (ollama/ollama#12660) irrelevant to size",
        "third-party 'about 18GB' in current profile is too low; Ollama shows 19 GB",
        "a public GitHub copy— markdown file dumping '## config.json' blocks per HF repo",
    ]
    assert all(_LEFTOVERS.search(t) for t in old)
    assert not any(_LEFTOVERS.search(t) for t in ["Jeffser/Alpaca@7bc6f67d src/ollama_models.py", "2026-04-03"])


def test_provenance_for_json() -> None:
    prov = profiles()["gemma4:e4b"].provenance()
    assert prov["weights"] == {
        "bytes": 9_608_350_245, "shown": "9.6 GB", "kind": "exact", "date": "2026-07-20",
        "ref": "ollama/ollama@fb307609 docs/openapi.yaml (/api/tags example, digest c6eb396dbd59)",
        "url": "https://ollama.com/library/gemma4:e4b",
    }  # fmt: skip
    assert prov["config"]["hf_repo"] == "google/gemma-4-E4B-it" and prov["config"]["confidence"] == "partial"
    assert prov["projector"]["kind"] == "estimate" and prov["aliases"]["names"] == ["gemma4:latest"]
    counted = profiles()["qwen3.5:27b"].provenance()["projector"]
    assert counted["kind"] == "count" and counted["bytes"] == profiles()["qwen3.5:27b"].projector_bytes > 0.9e9


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


def test_json_plan_of_a_profile_carries_its_sources(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The text plan prints one line per source; --json has the whole provenance (issue 26.5)."""
    from ollama_fake import closed_port_url

    from kvadvise.cli import main

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    assert main(["ollama", "gemma4", "--gpu", "rtx-4090", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ollama"]["source"] == "profile:gemma4:e4b"
    assert doc["ollama"]["provenance"] == profiles()["gemma4:e4b"].provenance()
    assert doc["model"]["sources"][:2] == ["built-in profile gemma4:e4b", "weights: 9.6 GB, exact bytes, 2026-07-20"]
