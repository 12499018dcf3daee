"""Ollama model names, parsed as Ollama's types/model/name.go does."""

from __future__ import annotations

import pytest

from kvadvise.backends.ollama.name import OllamaName, parse_name
from kvadvise.errors import InputError


@pytest.mark.parametrize(
    ("ref", "parts", "display"),
    [
        ("qwen3-coder", ("registry.ollama.ai", "library", "qwen3-coder", "latest"), "qwen3-coder:latest"),
        ("qwen3:8b", ("registry.ollama.ai", "library", "qwen3", "8b"), "qwen3:8b"),
        ("llama3.2:3b", ("registry.ollama.ai", "library", "llama3.2", "3b"), "llama3.2:3b"),
        ("qwen3:30b-a3b", ("registry.ollama.ai", "library", "qwen3", "30b-a3b"), "qwen3:30b-a3b"),
        ("library/mistral", ("registry.ollama.ai", "library", "mistral", "latest"), "mistral:latest"),
        ("jdoe/coder:v1.2", ("registry.ollama.ai", "jdoe", "coder", "v1.2"), "jdoe/coder:v1.2"),
        ("example.com/team/m:q4", ("example.com", "team", "m", "q4"), "example.com/team/m:q4"),
        ("localhost:5000/team/m", ("localhost:5000", "team", "m", "latest"), "localhost:5000/team/m:latest"),
        (
            "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
            ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
            "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
        ),
        ("https://hf.co/user/repo:IQ4_XS", ("hf.co", "user", "repo", "IQ4_XS"), "hf.co/user/repo:IQ4_XS"),
        ("  gemma3:4b  ", ("registry.ollama.ai", "library", "gemma3", "4b"), "gemma3:4b"),
    ],
)
def test_parse(ref: str, parts: tuple[str, str, str, str], display: str) -> None:
    n = parse_name(ref)
    assert n.manifest_parts() == parts
    assert n.display == display


def test_library_and_short_names() -> None:
    assert parse_name("qwen3").is_library and parse_name("qwen3").short == "qwen3"
    assert not parse_name("jdoe/qwen3").is_library and parse_name("jdoe/qwen3").short == "jdoe/qwen3"
    n = parse_name("hf.co/u/r:Q8_0")
    assert not n.is_library and n.short == "hf.co/u/r" and n.full == "hf.co/u/r:Q8_0"


def test_same_model_ignores_case_and_defaults() -> None:
    assert parse_name("Mistral").same_model(parse_name("registry.ollama.ai/library/mistral:latest"))
    assert not parse_name("mistral:7b").same_model(parse_name("mistral"))


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "   ",
        "qwen3:",  # a tag separator with no tag
        ":8b",  # no model
        "a/b/c/d",  # four parts: the host would be "a/b"
        "../etc/passwd",  # a namespace/host that is not a name
        "-model",  # must start with a letter, digit or _
        "mo del",
        "na.me/model",  # a namespace may not contain "."
        "model:ta:g",
        "model:t@g",
        "m" * 81,  # model longer than 80
        "qwen3:" + "t" * 81,
        "ünïcode",
    ],
)
def test_bad_names_are_input_errors(ref: str) -> None:
    with pytest.raises(InputError, match="name"):
        parse_name(ref)


def test_frozen() -> None:
    n = parse_name("qwen3")
    assert isinstance(n, OllamaName)
    with pytest.raises(AttributeError):
        n.tag = "x"  # type: ignore[misc]
