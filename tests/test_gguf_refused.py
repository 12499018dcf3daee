"""GGUF files llama.cpp's gguf.cpp refuses on this machine are refused before planning (exit 2, naming why), and
the premise is checked on the real llama-server: a file of the other byte order (gguf_init_from_file_impl reads
the version in the host's order: "is there a mismatch between the host and model endianness?") and a key holding
an array of arrays ("key '%s' has invalid GGUF type"). The round-10c reviewer's unfiled items."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)
from tinymodels import rewrite_gguf, write_tiny_gguf


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")


def _server_refuses(server: Path, model: Path, words: str) -> None:
    cmd = [str(server), "-m", str(model), "-c", "512", "--port", "0", "-ngl", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert p.returncode != 0 and words in (p.stdout + p.stderr), (p.stdout + p.stderr)[-3000:]


@pytest.mark.skipif(sys.byteorder != "little", reason="a big-endian host reads big-endian files")
def test_a_big_endian_file_is_refused_as_llama_cpp_refuses_it(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], real_llama_server: Path
) -> None:
    big = rewrite_gguf(tiny, tmp_path / "big.gguf", big_endian=True)
    rc, out, err = run(capsys, "gguf", str(tiny), "--no-hardware")
    assert rc == 0, err
    rc, out, err = run(capsys, "gguf", str(big), "--no-hardware")
    one_line_input_error(rc, err)
    assert "big-endian" in err and out == "", err
    _server_refuses(real_llama_server, big, "mismatch between the host and model endianness")


def test_an_array_of_arrays_is_refused_as_llama_cpp_refuses_it(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], real_llama_server: Path
) -> None:
    nested = rewrite_gguf(tiny, tmp_path / "nested.gguf", extra={"x.nested": [[1, 2], [3]]})
    same = rewrite_gguf(tiny, tmp_path / "same.gguf")
    rc, _, err = run(capsys, "gguf", str(same), "--no-hardware")
    assert rc == 0, err
    rc, out, err = run(capsys, "gguf", str(nested), "--no-hardware")
    one_line_input_error(rc, err)
    assert "x.nested is an array of arrays" in err and out == "", err
    _server_refuses(real_llama_server, nested, "invalid GGUF type")


def test_a_folder_lists_a_model_named_in_capitals(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise gguf DIR` where DIR holds MODEL.GGUF said "no .gguf file"; llama.cpp opens a file of any name."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "Q3.GGUF").write_bytes(tiny.read_bytes())
    rc, out, err = run(capsys, "gguf", str(folder), "--no-hardware")
    assert rc == 0 and "Q3.GGUF" in out, (rc, out, err)


def test_a_build_older_than_the_architecture_is_refused(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --llama-build b4800`: gemma3 came with b4875 (#12343); an older
    llama-server stops with "unknown model architecture: 'gemma3'", and was planned with the newest rules (the
    round-9 reviewer's unfiled item). Ollama runs its own engine's models whatever llama.cpp it pins: not refused."""
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--llama-build", "b4800", "--no-hardware")
    one_line_input_error(rc, err)
    assert "unknown model architecture: 'gemma3'" in err and "b4875" in err and out == "", err
    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--llama-build", "b4875", "--no-hardware")
    assert rc == 0, err
