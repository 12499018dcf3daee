"""Round 13e of the red team (a reviewer in its own worktree): Ollama's server settings as this shell's environment
gives them, against Ollama's own code (ollama/ollama fb3076099687: envconfig/config.go, server/routes.go Serve,
server/sched.go). Each test reproduces one defect of the code at 5e2d1ef, where it fails; its docstring gives the
command, what happened, what should happen and the evidence."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from attack_helpers import no_server, run, use_store  # noqa: F401  (no_server: an autouse fixture)
from ollama_fake import build_store
from tinymodels import write_tiny_gguf

GIB = 1 << 30


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two qwen3 models trained on 8,192 tokens (alpha, beta) in an Ollama store."""
    base = tmp_path_factory.mktemp("r13e")
    root = base / "models"
    for name in ("alpha", "beta"):
        gguf = write_tiny_gguf(base / f"{name}.gguf", "qwen3", n_vocab=32000, name=name)
        build_store(root, gguf, hashlib.sha256(f"r13e/{name}".encode()).hexdigest(), model=name)
    return root


@pytest.fixture(autouse=True)
def _store(no_server: None, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path) -> None:  # noqa: F811
    use_store(monkeypatch, store, tmp_path)


# --- OLLAMA_GPU_OVERHEAD lowers the VRAM tier of Ollama's default context --------------------------------------------


def test_several_models_default_context_counts_ollama_gpu_overhead(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_GPU_OVERHEAD=2147483648 kvadvise ollama alpha beta --vram 24GiB --json`: kvadvise replays the
    scheduler at ``settings.context_length`` 32768 ("Ollama's VRAM tier") and shows each model at num_ctx 8,192
    (the tier capped at the training context) "as it loads now". Ollama's server/routes.go Serve (fb3076099687)
    computes the tier from ``totalVRAM += gpu.TotalMemory - envconfig.GpuOverhead()``: 24 GiB - 2 GiB = 22 GiB,
    under the 23 GiB threshold, so ``s.defaultNumCtx = 4096`` and both models load at 4,096 tokens.
    envconfig/config.go: ``GpuOverhead = Uint64("OLLAMA_GPU_OVERHEAD", 0)``, "Reserve a portion of VRAM per GPU".
    kvadvise reads the other server variables of this shell for this replay (together.settings:
    OLLAMA_CONTEXT_LENGTH, OLLAMA_NUM_PARALLEL, OLLAMA_MAX_LOADED_MODELS, ...) but never OLLAMA_GPU_OVERHEAD.
    Expected: the tier of 22 GiB, 4096."""
    monkeypatch.setenv("OLLAMA_GPU_OVERHEAD", str(2 * GIB))
    rc, out, err = run(capsys, "ollama", "alpha", "beta", "--vram", "24GiB", "--json")
    assert rc == 0, err
    settings = json.loads(out)["settings"]
    assert settings["context_length"] == 4096, settings


def test_installed_listing_default_context_counts_ollama_gpu_overhead(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_GPU_OVERHEAD=2147483648 kvadvise ollama --installed --vram 24GiB --json`: ``settings.default_ctx``
    is 32768 and every row's ``run_ctx`` (the context the model "runs at") is 8,192. A server started from this
    shell has ``defaultNumCtx`` 4096: server/routes.go Serve (fb3076099687) sums ``gpu.TotalMemory -
    envconfig.GpuOverhead()`` = 22 GiB < 23 GiB. docs/environment.md says `--installed` assumes the settings of a
    server started from this shell. Expected: default_ctx 4096 and run_ctx 4096."""
    monkeypatch.setenv("OLLAMA_GPU_OVERHEAD", str(2 * GIB))
    rc, out, err = run(capsys, "ollama", "--installed", "--vram", "24GiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["settings"]["default_ctx"] == 4096, doc["settings"]
    assert {m["run_ctx"] for m in doc["models"]} == {4096}, [(m["name"], m["run_ctx"]) for m in doc["models"]]


def test_single_model_default_context_warning_counts_ollama_gpu_overhead(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_GPU_OVERHEAD=2147483648 kvadvise ollama alpha --vram 24GiB --ctx 2048`: the plan warns "without these
    settings Ollama runs 8,192 tokens here (its default for this VRAM)". The server's default is 4,096 there:
    server/routes.go Serve (fb3076099687) sets the tier from ``gpu.TotalMemory - envconfig.GpuOverhead()`` = 22 GiB,
    under 23 GiB. Expected: the warning names 4,096 (or none that says 8,192)."""
    monkeypatch.setenv("OLLAMA_GPU_OVERHEAD", str(2 * GIB))
    rc, out, err = run(capsys, "ollama", "alpha", "--vram", "24GiB", "--ctx", "2048")
    assert rc == 0, err
    assert "Ollama runs 8,192 tokens here" not in out, out
