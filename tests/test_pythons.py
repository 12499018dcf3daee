"""kvadvise on every CPython it claims (``requires-python = ">=3.10"``) that this machine has.

The wheel is unpacked beside click (as ``pip install --target`` would lay it out) and each interpreter
plans the real Gemma 3 270M and a built-in profile; the JSON must be the one the test's own Python
prints. Found in issue 11: Python 3.12 gave dataclasses' ``_DataclassParams`` four more fields, and
a home-made dataclass once failed at import there (every command, exit 1), while CI ran 3.11 only.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
from live_state import without_live_ram

ROOT = Path(__file__).resolve().parent.parent


def _version(python: str) -> tuple[int, int] | None:
    try:
        p = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    if p.returncode != 0 or len(p.stdout.split()) != 2:
        return None  # e.g. a pyenv shim for a version that is not selected
    major, minor = map(int, p.stdout.split())
    return major, minor


def _pythons() -> dict[tuple[int, int], str]:
    """One interpreter per version >= 3.10 other than the one running the tests: pyenv's, then PATH's."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(os.path.join(pyenv, "versions", "3.*", "bin", "python3")))
    candidates += [p for v in range(10, 15) if (p := shutil.which(f"python3.{v}"))]
    found: dict[tuple[int, int], str] = {}
    for python in candidates:
        v = _version(python)
        if v is not None and v >= (3, 10) and v != sys.version_info[:2] and v not in found:
            found[v] = python
    return found


PYTHONS = _pythons()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked, with click beside it: nothing else of this venv."""
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_INDEX": "1"},
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = out.glob("kvadvise-*.whl")
    target = out / "site"
    zipfile.ZipFile(wheel).extractall(target)
    shutil.copytree(Path(click.__file__).parent, target / "click")
    return target


def _plan(python: str, site: Path, tmp: Path, argv: list[str]) -> dict[str, object]:
    home = tmp / "home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(site),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),  # each interpreter reads the header itself
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "OLLAMA_MODELS": str(home / "models"),
        "OLLAMA_HOST": "127.0.0.1:9",  # no server: the profile is planned
        "KVADVISE_OLLAMA_REGISTRY": "off",  # nor a registry
    }
    p = subprocess.run(
        [python, "-s", "-m", "kvadvise", *argv], capture_output=True, text=True, env=env, cwd=home, timeout=120
    )
    assert p.returncode == 0, (python, argv, p.stderr[-2000:])
    doc = json.loads(p.stdout)
    assert isinstance(doc, dict)
    return without_live_ram(doc)  # this machine's free RAM moves between two runs


@pytest.mark.skipif(not PYTHONS, reason="no other CPython >= 3.10 on this machine")
@pytest.mark.parametrize("version", sorted(PYTHONS), ids=lambda v: f"{v[0]}.{v[1]}")
def test_other_pythons_plan_as_this_one(version: tuple[int, int], site: Path, gemma_path: Path, tmp_path: Path) -> None:
    python = PYTHONS[version]
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / gemma_path.name).symlink_to(gemma_path)
    for argv in (
        ["gguf", str(folder), "--no-hardware", "--sort", "size", "--json"],
        # --ram: a plan's RAM check would otherwise follow this machine's free RAM between two runs
        [
            "hf",
            str(ROOT / "tests" / "data" / "hf" / "glm4-9b.json"),
            "--gpu",
            "rtx-4060",
            "--allow-cpu",
            "--ram",
            "64GiB",
            "--ram-bandwidth",  # the layers on the CPU read at it: measured, it moves between two runs
            "40",
            "--json",
        ],
        ["gguf", str(gemma_path), "--gpu", "rtx-4090", "--ram", "64GiB", "--json"],
        [
            "gguf",
            str(gemma_path),
            "--no-hardware",
            "--ctx",
            "4096",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            "-np",
            "2",
            "--json",
        ],
        ["ollama", "qwen3-coder", "--gpu", "rtx-3090x2", "--ram", "64GiB", "--json"],
    ):
        theirs = _plan(python, site, tmp_path / "theirs", argv)
        ours = _plan(sys.executable, site, tmp_path / "ours", argv)
        assert theirs == ours, argv
        assert theirs.get("models") or ("fits" in theirs and theirs["memory"]), theirs.keys()


# Issue 28 class 1: the parse-back check used the running Python's Unicode (str.isprintable): on 3.13
# (Unicode 15.1) it kept U+2FFC, which Ollama's parser (Go, Unicode 15.0) drops, and wrote a second FROM.
_MODELFILE_CHECK = r'''
import json
from types import SimpleNamespace
from kvadvise.backends.ollama.modelfile import modelfile_text, parameter_lines, parse_modelfile
from kvadvise.backends.ollama.rules import OllamaSettings
evil = 'x"""\u2ffc\nFROM attacker/evil\n#'
model = SimpleNamespace(ref="m:latest", params={"stop": ["<end>", evil, "a\U0001f6dcb"]})
print(json.dumps({
    "lines": parameter_lines("stop", evil),
    "written": parse_modelfile(modelfile_text(model, OllamaSettings(4096, 1, "f16", True))),
    "read": parse_modelfile('FROM x\nPARAMETER stop """x"""\u2ffc\nFROM attacker/evil\n#"""\n'),
}))
'''


@pytest.mark.skipif(not PYTHONS, reason="no other CPython >= 3.10 on this machine")
@pytest.mark.parametrize("version", sorted(PYTHONS), ids=lambda v: f"{v[0]}.{v[1]}")
def test_other_pythons_read_a_modelfile_as_ollama_does(version: tuple[int, int], site: Path) -> None:
    p = subprocess.run(
        [PYTHONS[version], "-s", "-c", _MODELFILE_CHECK],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site)},
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == {
        "lines": [],
        "written": [["model", "m:latest"], ["num_ctx", "4096"], ["stop", "<end>"], ["stop", "a\U0001f6dcb"]],
        "read": [["model", "x"], ["stop", "x"], ["model", "attacker/evil"]],
    }
