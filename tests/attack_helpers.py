"""What the review rounds' tests (tests/test_attack_round5-8.py) share: a command run in-process, the one-line error
every bad input must get, and a machine with no Ollama server and an empty store (an autouse fixture: import it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ollama_fake import closed_port_url

from kvadvise.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``kvadvise ARGS``: exit code, stdout, stderr."""
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_input_error(rc: int, err: str) -> None:
    """Exit 2 and at most two lines on stderr, the first ``kvadvise: error:``; never kvadvise's own bug."""
    lines = err.strip().splitlines()
    assert rc == 2 and lines and lines[0].startswith("kvadvise: error:"), (rc, err)
    assert "internal error" not in err and "Traceback" not in err and len(lines) <= 2, err


def no_internal_error(rc: int, err: str) -> None:
    """Whatever the exit, not exit 1 (docs/exit-codes.md: kvadvise's own bug) nor a traceback."""
    assert rc != 1 and "internal error" not in err and "Traceback" not in err, (rc, err)


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Ollama server answers (OLLAMA_HOST: a closed port) and the store is empty."""
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    (tmp_path / "store" / "manifests").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))


# this shell's Ollama settings (envconfig reads them), which an Ollama test plans without
OLLAMA_ENV = (
    "OLLAMA_CONTEXT_LENGTH",
    "OLLAMA_NUM_PARALLEL",
    "OLLAMA_KV_CACHE_TYPE",
    "OLLAMA_FLASH_ATTENTION",
    "OLLAMA_SCHED_SPREAD",
    "OLLAMA_GPU_OVERHEAD",
    "OLLAMA_MAX_LOADED_MODELS",
    "OLLAMA_KEEP_ALIVE",
    "OLLAMA_NEW_ENGINE",
)


def use_store(monkeypatch: pytest.MonkeyPatch, store: Path, cwd: Path) -> None:
    """The Ollama store ``store`` (OLLAMA_MODELS), no registry, none of this shell's OLLAMA_* settings, ``cwd`` as the
    working folder (where files are written)."""
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in OLLAMA_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(cwd)


def parameter_count(plan: dict[str, object]) -> int:
    """The parameters a config.json plan counted, from its model note ("... × N parameters")."""
    import re

    notes = plan["model"]["notes"]  # type: ignore[index]
    found = [re.search(r"× ([\d,]+) parameters", n) for n in notes]  # type: ignore[union-attr]
    counts = [int(m.group(1).replace(",", "")) for m in found if m]
    assert len(counts) == 1, notes
    return counts[0]
