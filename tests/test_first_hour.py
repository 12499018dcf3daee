"""A newcomer's first hour: every step kvadvise prints works as printed or says plainly why not, errors read
as errors (usage as usage, "did you mean" first), the apply steps are said once per platform."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from ollama_fake import FakeOllama, closed_port_url, running_fake

from kvadvise.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeOllama]:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    with running_fake() as s:
        monkeypatch.setenv("OLLAMA_HOST", s.url)
        yield s


def _verify_step(out: str) -> list[str]:
    """The `kvadvise verify ...` line of the answer's Next block, as argv."""
    line = next(x.strip() for x in out.splitlines() if x.strip().startswith("kvadvise verify ollama "))
    return shlex.split(line)[1:]


def test_the_printed_verify_step_says_what_is_wrong(
    fake: FakeOllama, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last step of the main answer, run as printed: with the server up and the model not created yet,
    it says to create it (exit 2), not to pull a model that does not exist; with the server down, it says
    the server is down (exit 4)."""
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090")
    step = _verify_step(out)
    assert rc == 0 and step[:3] == ["verify", "ollama", "qwen3-coder-64k"]
    rc, out, err = run(capsys, *step)
    assert rc == 2 and out == "" and "not on the server yet" in err and "ollama create qwen3-coder-64k" in err
    assert "ollama pull" not in err
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, err = run(capsys, *step)
    lines = err.splitlines()
    assert rc == 4 and lines[0].startswith("kvadvise: error: no Ollama server at ") and "ollama serve" in lines[1]


def test_apply_steps_are_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an env file, a drop-in and a Modelfile written, each file is named once on stderr and the Next
    block (stdout) says how to apply them: the drop-in, not the env file's EnvironmentFile= edit as well."""
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(
        capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--platform", "linux",
        "--write-env", "E", "--write-systemd", "kvadvise.conf", "--write-modelfile", "Modelfile",
    )  # fmt: skip
    assert rc == 0
    assert err.count("kvadvise: wrote ") == 3 and "apply it with" not in err and "EnvironmentFile" not in err
    next_block = out[out.index("Next (linux") :]
    assert next_block.count("sudo cp ") == 1 and "EnvironmentFile" not in next_block
    assert "ollama create qwen3-coder-64k -f Modelfile" in next_block


def test_docker_steps_recreate_the_container_and_create_inside_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--platform", "docker")
    steps = out[out.index("Next (docker") :].splitlines()[1:]
    assert rc == 0 and steps[0].strip().startswith("docker rm -f ollama") and "volume keeps the models" in steps[0]
    assert steps[1].strip().startswith("docker run -d --gpus=all -e OLLAMA_FLASH_ATTENTION=1")
    assert any(s.strip().startswith("docker cp Modelfile ollama:/tmp/Modelfile") for s in steps)
    assert any(s.strip() == "docker exec ollama ollama create qwen3-coder-64k -f /tmp/Modelfile" for s in steps)
    assert not any(s.strip().startswith("ollama create") for s in steps)


@pytest.mark.parametrize(
    ("args", "first", "second"),
    [
        (["verify"], "Usage: kvadvise verify [OPTIONS] COMMAND [ARGS]...", ""),
        (
            ["verify", "ollama"],
            "kvadvise: error: Missing argument 'NAME'.",
            "kvadvise: hint: Usage: kvadvise verify ollama",
        ),
        (["olama"], "kvadvise: error: No such command 'olama'; did you mean ollama", None),
        (
            ["ollama", "qwen3-coder", "--gpu", "2x3090"],
            "kvadvise: error: --gpu '2x3090': read as 3,090 cards",
            "kvadvise: hint: the count goes last: --gpu 3090x2",
        ),
        (["ollama", "qwen3-codr"], "kvadvise: error: qwen3-codr:latest: not found; did you mean qwen3-coder", None),
    ],
)
def test_errors_read_as_errors(
    args: list[str], first: str, second: str | None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Usage printed as usage (no literal \\n), a missing argument with the command's usage line, "did you
    mean" first on a short line, the size/count parser saying what it read."""
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, err = run(capsys, *args)
    lines = err.splitlines()
    assert rc == 2 and out == "" and "\\n" not in err
    assert lines[0].startswith(first), err
    assert len(lines[0]) <= 120, lines[0]
    if second is not None:
        assert lines[1].startswith(second), err


def test_gpus_table_ids_never_run_into_names(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gpus", "--no-hardware")
    rows = out.splitlines()[1:]
    assert rc == 0 and rows
    for row in rows:
        card_id = row.split()[0]
        assert row.startswith(card_id + " "), row  # a space after every id, the longest included
    rc, out, _ = run(capsys, "gpus", "--json", "--no-hardware")
    assert any(p["id"] == "rtx-pro-6000-blackwell" for p in json.loads(out)["profiles"])


def test_the_chart_marks_a_partial_plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """qwen3-coder on an 8 GB card runs with part on the CPU: the chart marks that plan's GPU share (with the RAM
    given: a partial plan's answer must not hang on this machine's free RAM)."""
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4060", "--ram", "64GiB", "--chart")
    chart = out[out.index("memory on the device (GiB)") :].split("\nNext")[0].splitlines()
    assert rc == 0 and sum(line.count("*") for line in chart[:-1]) == 1
    assert "(32,768 tokens," in chart[-1]


def test_rpc_server_commands_say_it_has_no_authentication(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    rc, out, _ = run(
        capsys, "llamacpp", str(gemma_path), "--rpc", "10.0.0.2:50052=8GiB", "--rpc", "10.0.0.3:50052=8GiB", "-v"
    )
    assert rc == 0 and "rpc-server -H 0.0.0.0 -p 50052" in out and "no authentication" in out
