"""Round 12b of the red team (a reviewer in its own worktree): the files kvadvise writes and the "apply it" steps it
prints, against what the programs that read them accept: llama-server's router preset loader (common/preset.cpp at
b11312, the llama.cpp llama-cpp-python 0.3.36 vendors), Ollama's Docker instructions (ollama/ollama fb30760
docs/docker.mdx), `docker cp`, systemd's drop-in directories, and the platform the steps are printed for. Each test
reproduces one defect of the code at 0515fb6, where it fails; its docstring gives the command, what happened, what
should happen and the evidence."""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from ollama_fake import build_store
from tinymodels import write_tiny_gguf

from kvadvise.backends.ollama import config as oc

OLLAMA = ("--vram", "8GiB", "--ctx", "4096")


@pytest.fixture(scope="module")
def hash_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ollama store under a folder whose name holds a '#' (``/data/C#1/models``), two qwen3 models in it."""
    base = tmp_path_factory.mktemp("r12b") / "C#1"
    base.mkdir()
    root = base / "models"
    for name in ("alpha", "beta"):
        gguf = write_tiny_gguf(base / f"{name}.gguf", "qwen3", n_vocab=32000, name=name)
        build_store(root, gguf, hashlib.sha256(f"r12b/{name}".encode()).hexdigest(), model=name)
    return root


@pytest.fixture(autouse=True)
def _store(no_server: None, monkeypatch: pytest.MonkeyPatch, hash_store: Path, tmp_path: Path) -> None:  # noqa: F811
    monkeypatch.setenv("OLLAMA_MODELS", str(hash_store))  # no server (no_server): the store alone
    monkeypatch.chdir(tmp_path)


def _steps(out: str) -> list[str]:
    return out.split("\nNext (", 1)[1].splitlines()[1:] if "\nNext (" in out else []


# --- 1. the router preset's model path is cut at a '#' -------------------------------------------------------------


def _preset_values(text: str) -> dict[tuple[str, str], str]:
    """common/preset.cpp parse_ini_from_file, b11312: ``kv-line ::= ident ws "=" ws value eol`` with
    ``value ::= (!eol-start .)*`` and ``eol-start ::= ws ([;#] / newline / EOF)``, ``ws ::= [ \\t]*`` (zero or more:
    a '#' or ';' anywhere in a value starts a comment)."""
    out: dict[tuple[str, str], str] = {}
    section = ""
    for line in text.splitlines():
        if m := re.fullmatch(r"\[[ \t]*([^]]*?)[ \t]*\].*", line):
            section = m[1]
            continue
        if m := re.match(r"([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*((?:(?![ \t]*(?:[;#]|$)).)*)", line):
            out[(section, m[1])] = m[2]
    return out


def test_the_router_preset_keeps_a_model_path_with_a_hash_whole(
    capsys: pytest.CaptureFixture[str], hash_store: Path
) -> None:
    """`OLLAMA_MODELS='/data/C#1/models' kvadvise ollama alpha beta --vram 8GiB --ctx 4096 --write-preset m.ini`:
    exit 0 and ``model = /data/C#1/models/blobs/sha256-...`` in each section. llama-server's preset loader
    (common/preset.cpp at b11312, parse_ini_from_file) ends a value at ``ws ([;#] / newline / EOF)`` with ``ws ::=
    [ \\t]*``, so zero spaces before the '#' are enough: it reads ``model = /data/C``. Run for real with the test
    suite's b11312 llama-server (``llama-server --models-preset m.ini --models-max 2``), GET /models answers
    ``"args": [..., "--model", "/tmp/r12/C", ...]`` for both models, and each child exits with "failed to load
    model from /tmp/r12/C". kvadvise's guard (runtime/router.py _value) refuses only ``[ \\t][;#]``, a space before
    the '#'. Expected: a preset whose every model value the loader reads back whole, or a one-line refusal (exit 2)
    naming the '#', as for `' #'`."""
    rc, _out, err = run(capsys, "ollama", "alpha", "beta", *OLLAMA, "--write-preset", "m.ini")
    if rc == 2:  # refused, with the reason: as good as a file the loader reads whole
        assert "#" in err, err
        return
    assert rc == 0, err
    values = _preset_values(Path("m.ini").read_text())
    models = {s: v for (s, k), v in values.items() if k == "model"}
    assert set(models) == {"alpha", "beta"}, values
    for section, value in models.items():
        assert value.startswith(str(hash_store / "blobs" / "sha256-")), (section, value)


# --- 2. the Docker step for an AMD GPU is the NVIDIA one --------------------------------------------------------------


def test_the_docker_step_for_an_amd_gpu_passes_the_amd_devices(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama alpha --gpu rx-7900-xtx --ctx 4096 --platform docker`: the plan is for a Radeon RX 7900
    XTX and the printed step is ``docker run -d --gpus=all -e ... -v ollama:/root/.ollama -p 11434:11434 --name
    ollama ollama/ollama``, Ollama's NVIDIA command. On a host with an AMD GPU and no NVIDIA Container Toolkit,
    ``--gpus=all`` fails ("could not select device driver \\"\\" with capabilities: [[gpu]]"), and the container
    gets no GPU either way: ROCm needs the /dev/kfd and /dev/dri devices. Ollama's own instructions (ollama/ollama
    fb30760 docs/docker.mdx, "AMD GPU"): ``docker run -d --device /dev/kfd --device /dev/dri -v
    ollama:/root/.ollama -p 11434:11434 --name ollama ollama/ollama:rocm``. Expected: for an AMD GPU the printed
    docker run passes ``--device /dev/kfd --device /dev/dri`` (and the rocm image), not ``--gpus=all``."""
    rc, out, err = run(capsys, "ollama", "alpha", "--gpu", "rx-7900-xtx", "--ctx", "4096", "--platform", "docker")
    assert rc == 0, err
    docker_run = " ".join(s.strip() for s in _steps(out) if "docker run" in s or "ollama/ollama" in s)
    assert "docker run" in docker_run, out
    assert "--gpus" not in docker_run and "/dev/kfd" in docker_run and "/dev/dri" in docker_run, docker_run


# --- 3. `docker cp` of a Modelfile whose name holds a ':' -------------------------------------------------------------


def test_the_docker_cp_step_copies_a_modelfile_named_with_a_colon(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama alpha --vram 8GiB --ctx 4096 --platform docker --write-modelfile alpha:latest.Modelfile`
    (a Modelfile named after the model, tag and all): the file is written and the step printed is ``docker cp
    alpha:latest.Modelfile ollama:/tmp/Modelfile``. docker cp reads a ``NAME:PATH`` argument as a container's path
    (container "alpha", path "latest.Modelfile"): the copy fails ("copying between containers is not supported" /
    "No such container"), and `docker exec ollama ollama create ... -f /tmp/Modelfile` after it finds no file.
    docs.docker.com, docker container cp, Corner cases: "If you use a : in a local machine path, you must be
    explicit with a relative or absolute path, for example: /path/to/file:name.txt or ./file:name.txt". (The
    --env-file step already writes ``./ollama.env``: config._dot_path.) Expected: the source of the docker cp
    step has a '/' before any ':' (``./alpha:latest.Modelfile``)."""
    rc, out, err = run(
        capsys, "ollama", "alpha", *OLLAMA, "--platform", "docker", "--write-modelfile", "alpha:latest.Modelfile"
    )
    assert rc == 0, err
    assert Path("alpha:latest.Modelfile").is_file()
    cps = [shlex.split(s, comments=True) for s in _steps(out) if s.strip().startswith("docker cp")]
    assert len(cps) == 1, out
    src = cps[0][2]
    assert Path(src).resolve() == Path("alpha:latest.Modelfile").resolve(), src
    assert ":" not in src or "/" in src.split(":", 1)[0], f"docker cp reads {src!r} as CONTAINER:PATH"


# --- 4. a drop-in written in ollama.service.d under a name systemd does not read -------------------------------------


def test_a_dropin_written_in_place_without_conf_is_not_said_to_apply(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`sudo kvadvise ollama alpha --vram 8GiB --ctx 4096 -ctk q8_0 -ctv q8_0 --write-systemd
    /etc/systemd/system/ollama.service.d/kvadvise`: the file is written there and the one step printed is ``sudo
    systemctl daemon-reload && sudo systemctl restart ollama``. systemd never reads it: systemd.unit(5), "Along
    with a unit file foo.service, a "drop-in" directory foo.service.d/ may exist. All files with the suffix
    ".conf" from this directory will be merged" -- the server restarts with its old cache type and the plan's
    q8_0 is silently not applied. kvadvise knows it (config.dropin_name: "systemd reads only *.conf drop-ins"),
    and names a copy elsewhere zz-kvadvise.conf, but a file written in place keeps its name and gets only the
    reload. (The drop-in folder is this test's own, in place of /etc/systemd/system/ollama.service.d.) Expected:
    a refusal (exit 2) naming .conf, or a step that gives it a name ending in .conf before the reload."""
    dropins = tmp_path / "ollama.service.d"
    dropins.mkdir()
    monkeypatch.setattr(oc, "SYSTEMD_DROPIN_DIR", dropins)
    target = dropins / "kvadvise"
    rc, out, err = run(
        capsys, "ollama", "alpha", *OLLAMA, "-ctk", "q8_0", "-ctv", "q8_0", "--write-systemd", str(target)
    )
    if rc == 2:
        assert ".conf" in err, err
        return
    assert rc == 0, err
    steps = "\n".join(_steps(out))
    assert "daemon-reload" in steps, out
    before_reload = steps.split("daemon-reload", 1)[0]
    assert re.search(r"\.conf\b", before_reload), f"systemd reads only *.conf in {dropins}; the steps:\n{steps}"


# --- 5. several models: the env file's apply step on Windows is a POSIX shell and systemd ----------------------------


def test_several_models_on_windows_get_steps_that_run_there(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvadvise ollama alpha beta --vram 8GiB --ctx 4096 --write-env ollama.env` on Windows (kvadvise's own
    platform detection, config.current_platform, answering "windows"): "wrote ollama.env; apply it with: ``set -a
    && . ./ollama.env && set +a && ollama serve`` / (systemd: add EnvironmentFile=... to the [Service] of
    ollama.service)". Neither runs on Windows: PowerShell and cmd.exe have no ``set -a`` or ``.`` sourcing, and
    there is no systemd; `--platform windows` is refused for several models ("for one model; with several, give
    each its own run"), so there is no way to get the right steps. The same run for one model prints ``setx
    OLLAMA_... value`` and "then quit Ollama (taskbar icon) and start it again" (config.apply_hints_server), as
    Ollama's FAQ (docs/faq.mdx, "Setting environment variables on Windows") says. Expected: on Windows, the
    several-model env file's steps are Windows steps (setx, or the FAQ's user variables), no POSIX sourcing and no
    systemd."""
    monkeypatch.setattr(oc, "current_platform", lambda: "windows")
    rc, one, err = run(capsys, "ollama", "alpha", *OLLAMA, "--write-env", "one.env")
    assert rc == 0 and "setx" in one, (rc, err, one)  # one model: Windows steps
    rc, out, err = run(capsys, "ollama", "alpha", "beta", *OLLAMA, "--write-env", "ollama.env")
    assert rc == 0, err
    said = out + err
    assert "wrote ollama.env" in said, said
    assert "set -a" not in said and "systemd" not in said, said
    assert "setx" in said, said


# --- the reviewer's unfiled item: llama-swap's cmd on Windows -----------------------------------------------------


def test_a_llama_swap_cmd_on_windows_is_quoted_as_windows_splits_it() -> None:
    """llama-swap splits a cmd with shlex.Windows.Split on Windows (internal/config/commands.go SanitizeCommand,
    mostlygeek/llama-swap), the C runtime's rules where a single quote is a character: kvadvise's POSIX quoting
    (shlex.quote) gave `-m 'C:\\Users\\Al Bo\\...\\sha256-ab'`, which llama-server got as `'C:\\Users\\Al` and
    `Bo\\...'`. On Windows the path is double-quoted; elsewhere single-quoted as before."""
    from kvadvise.runtime.llamaswap import SwapModel, config_text

    blob = "C:\\Users\\Al Bo\\.ollama\\models\\blobs\\sha256-ab"
    model = SwapModel("alpha", ("llama-server", "-m", blob, "-c", "4096"), 0)
    win = config_text([model], [], windows=True)
    assert f'-m "{blob}"' in win and "'" not in win, win
    posix = config_text([model], [], windows=False)
    assert f"-m '{blob}'" in posix, posix


def test_an_env_file_path_with_a_percent_is_escaped_for_systemd(tmp_path: Path) -> None:
    """`--write-env '50%.env'`: the hint "add EnvironmentFile=/…/50%.env" is read by systemd with its specifiers
    expanded (systemd.unit(5), "Specifiers": "%%" is a single percent sign), so '%.e' is no file; written '%%'."""
    from kvadvise.backends.ollama.config import apply_hint_env

    hint = apply_hint_env(tmp_path / "50%.env")[1]
    assert "EnvironmentFile=" in hint and "50%%.env" in hint and "50%.env" not in hint.replace("%%", ""), hint
