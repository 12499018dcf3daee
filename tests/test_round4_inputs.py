"""Inputs that ended in an internal error (exit 1), a wrong plan or a file that cannot be read back: each
class fixed at its root, each held here. Round 4 of the red team's reproductions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ollama_fake import closed_port_url, running_fake

from kvadvise.cli import main

DIGITS = "9" * 5000


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    (tmp_path / "store" / "manifests").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))  # an empty store


@pytest.mark.parametrize("value", ["²", DIGITS, "٣", "-1", "2.5", "'3'"])
@pytest.mark.parametrize(
    "name", ["OLLAMA_NUM_PARALLEL", "OLLAMA_MAX_LOADED_MODELS", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_KEEP_ALIVE"]
)
def test_ollama_settings_are_read_as_ollama_reads_them(
    name: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """envconfig.Uint: ASCII digits, else the default (a superscript or 5,000 digits reached int() and ended
    in exit 1); quotes are trimmed (envconfig.Var)."""
    monkeypatch.setenv(name, value)
    rc, out, err = run(capsys, "ollama", "qwen3:8b", "gemma3:4b", "--gpu", "rtx-4090", "--json")
    assert rc in (0, 3) and "internal error" not in err, err
    json.loads(out)
    rc, out, err = run(capsys, "ollama", "--installed", "--gpu", "rtx-4090", "--json")
    assert rc == 0 and "internal error" not in err, err


def test_quoted_settings_count_as_ollama_counts_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", '"2"')
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "'q8_0'")
    rc, out, _ = run(capsys, "ollama", "qwen3:8b", "gemma3:4b", "--gpu", "rtx-4090", "--json")
    settings = json.loads(out)["settings"]
    assert rc == 0 and settings["num_parallel"] == 2 and settings["kv_cache_type"] == "q8_0"


@pytest.mark.parametrize(
    "args",
    [
        ["ollama", "qwen3:8b", "--vram", "8GiB", "--bandwidth", "1e308"],
        ["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ram-bandwidth", "1e308"],
        ["gguf", "x.gguf", "--rpc", "h:²=1GiB"],
        ["gguf", "x.gguf", "--rpc", f"h:{DIGITS}=1GiB"],
        ["ollama", "qwen3:8b", "--gpu", f"rtx-3090x{DIGITS}"],
        ["compare", "qwen3:8b", "--gpu", f"rtx-3090x{DIGITS}"],
        ["ollama", "qwen3:8b", "--ctx", DIGITS],
        ["gpus", "qwen3:8b", "--target-ctx", "1e308"],
    ],
    ids=["bandwidth", "ram-bandwidth", "rpc-superscript", "rpc-digits", "gpu-digits", "compare-digits", "ctx", "gpus"],
)
def test_huge_and_foreign_numbers_are_input_errors(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, *args)
    lines = err.splitlines()
    assert rc == 2 and out == "" and lines[0].startswith("kvadvise: error:"), err
    assert len(lines[0]) <= 1020 and "internal error" not in err


def test_a_server_version_of_5000_digits(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with running_fake() as fake:
        fake.version = DIGITS + ".1.1"
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        rc, _, err = run(capsys, "ollama", "qwen3:8b", "--gpu", "rtx-4090")
    assert rc == 0 and "internal error" not in err


def test_a_legacy_output_encoding_degrades_to_ascii(tmp_path: Path) -> None:
    """cp1252 (Windows' `kvadvise ... > plan.txt`): ≈ and ≤ ended in UnicodeEncodeError, exit 1."""
    env = {**os.environ, "PYTHONIOENCODING": "cp1252", "OLLAMA_HOST": closed_port_url()}
    p = subprocess.run(
        [sys.executable, "-m", "kvadvise", "ollama", "qwen3-coder", "--gpu", "rtx-4090"],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode("cp1252")
    assert "decode (estimate): ~ " in text


def test_a_closed_stdout_is_an_error(tmp_path: Path) -> None:
    """`kvadvise ... >&-`: the plan reached no one and the run said 0."""
    cmd = f"{sys.executable} -m kvadvise ollama qwen3:8b --gpu rtx-4090 >&-"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "stdout (it is closed)" in p.stderr


@pytest.mark.parametrize("name", ["my conf.conf", "x;touch pwned.conf", "$(touch pwned).conf"])
def test_printed_commands_quote_the_names_they_did_not_make(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    monkeypatch.chdir(tmp_path)
    rc, out, err = run(
        capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--platform", "linux", "--write-systemd", name
    )
    assert rc == 0, err
    cp = next(x.strip() for x in out.splitlines() if "sudo cp " in x)
    words = shlex.split(cp)
    assert words[:2] == ["sudo", "cp"] and words[2] == str(tmp_path / name) and len(words) == 4


def test_a_commented_out_setting_is_not_the_live_one(tmp_path: Path) -> None:
    from kvadvise.backends.ollama.config import server_kv_cache_type

    env = tmp_path / "ollama.env"
    env.write_text("OLLAMA_KV_CACHE_TYPE=q8_0\n# OLLAMA_KV_CACHE_TYPE=q4_0\n", encoding="utf-8")
    assert server_kv_cache_type(None, str(env))[0] == "q8_0"
    env.write_text('OLLAMA_KV_CACHE_TYPE="q4_0"\n', encoding="utf-8")
    assert server_kv_cache_type(None, str(env))[0] == "q4_0"


def test_the_router_preset_reads_back_as_written(tmp_path: Path) -> None:
    """llama-server's preset loader upper-cases a section's tag and cuts a value at ' #' or ' ;'
    (common/preset.cpp): names are written without a tag, and a value it would cut is refused."""
    from kvadvise.errors import InputError
    from kvadvise.planner.memory import RunConfig
    from kvadvise.runtime.router import RoutedModel, preset_text

    text = preset_text(
        [
            RoutedModel("gemma3-270m:latest", "/m/g.gguf", RunConfig(n_ctx=4096)),
            RoutedModel("qwen3:8b", None, RunConfig(n_ctx=4096)),
        ]
    )
    assert "[gemma3-270m]" in text and "[qwen3-8b]" in text and ":latest]" not in text
    with pytest.raises(InputError, match="cuts a value"):
        preset_text([RoutedModel("m", "/models/my #1.gguf", RunConfig(n_ctx=4096))])


def test_one_model_under_two_names_is_planned_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """qwen3-coder and qwen3-coder:30b are one model (Ollama serves both from one runner): planned once, not
    'they do not stay loaded together'; the same name twice writes no duplicate preset section."""
    preset = tmp_path / "p.ini"
    rc, out, err = run(
        capsys, "ollama", "qwen3-coder", "qwen3-coder:30b", "qwen3:4b", "--gpu", "rtx-4090",
        "--write-preset", str(preset),
    )  # fmt: skip
    assert rc == 0, out + err
    assert "qwen3-coder:30b is qwen3-coder:latest: one runner serves both" in out
    sections = [x for x in preset.read_text().splitlines() if x.startswith("[")]
    assert len(sections) == len(set(sections)) == 2


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_ram_budget_is_the_containers(version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a 2 GiB cgroup the RAM a plan may use is what is left of 2 GiB, not what the host has free
    (llama-server would be killed by the OOM killer): the tightest limit up the hierarchy, v2 or v1."""
    from kvadvise.planner import hardware

    (tmp_path / "proc/self").mkdir(parents=True)
    gib = 1 << 30
    if version == "v2":
        (tmp_path / "proc/self/cgroup").write_text("0::/docker/abc\n")
        leaf = tmp_path / "sys/fs/cgroup/docker/abc"
        leaf.mkdir(parents=True)
        (leaf / "memory.max").write_text(f"{2 * gib}\n")
        (leaf / "memory.current").write_text(f"{gib // 2}\n")
        (leaf.parent / "memory.max").write_text("max\n")
    else:
        (tmp_path / "proc/self/cgroup").write_text("4:memory:/docker/abc\n0::/\n")
        leaf = tmp_path / "sys/fs/cgroup/memory/docker/abc"
        leaf.mkdir(parents=True)
        (leaf / "memory.limit_in_bytes").write_text(f"{2 * gib}\n")
        (leaf / "memory.usage_in_bytes").write_text(f"{gib // 2}\n")
        (leaf.parent / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert hardware.cgroup_memory(str(tmp_path)) == (2 * gib, gib // 2)
    monkeypatch.setattr(hardware, "cgroup_memory", lambda: (2 * gib, gib // 2))
    monkeypatch.setattr(hardware, "_ram_host", lambda: (64 * gib, 48 * gib))
    assert hardware._ram_now() == (2 * gib, gib + gib // 2)


def test_the_dry_run_never_agrees_with_what_it_cannot_compare(tmp_path: Path) -> None:
    """llama-fit-params printing an infinite or 5,000-digit figure, or a device the plan does not have: a
    disagreement (exit 3), never agreement, never an internal error."""
    from tinymodels import write_tiny_gguf

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file
    from kvadvise.planner.memory import RunConfig, estimate
    from kvadvise.runtime import dryrun

    spec = from_gguf(read_file(write_tiny_gguf(tmp_path / "m.gguf", "llama", n_vocab=600)))
    est = estimate(spec, RunConfig(n_ctx=4096, device="cuda", n_outputs_max=0))
    d = est.devices[0]
    mib = 1 << 20
    row = f"CUDA0 {d.weights_bytes // mib} {(d.kv_bytes + d.recurrent_bytes) // mib} {d.compute_bytes // mib}"
    host = f"Host {est.host.weights_bytes // mib} 0 {est.host.compute_bytes // mib}"
    assert all(r.ok for r in dryrun.compare(spec, est, dryrun.parse(f"{row}\n{host}\n", "")))
    inf_log = "CUDA0 compute buffer size = " + "9" * 400 + ".00 MiB"
    assert dryrun.parse(f"{row}\n", inf_log)[0].compute_mib == float(d.compute_bytes // mib)  # not read: the table's
    huge = dryrun.parse(f"CUDA0 {'9' * 5000} 0 0\n{host}\n", "")
    assert not all(r.ok for r in dryrun.compare(spec, est, huge))  # the device is missing: a disagreement
    extra = dryrun.parse(f"{row}\nCUDA1 10000 0 0\n{host}\n", "")
    rows = dryrun.compare(spec, est, extra)
    assert any(r.name == "CUDA1 (not planned)" and not r.ok for r in rows)
    nan = dryrun.Projected("CUDA0", 0, 0, float("inf"))
    assert not dryrun.DryRunRow("CUDA0", 0, 0, 0, nan).compute_ok
