"""Child processes that hold GPU memory must never outlive kvadvise.

Each child runs in its own process group; on a timeout, an error, Ctrl-C,
SIGTERM, SIGHUP (the terminal closed, ssh dropped) or SIGQUIT the whole group
is killed and reaped before control returns. When kvadvise itself is killed
outright (SIGKILL, which no handler sees), the kernel kills the child: it is
started with PR_SET_PDEATHSIG = SIGKILL (Linux prctl(2)).

What a child prints is kept bounded (:class:`BoundedLog`): the lines the log
parser and the error messages need, and a tail; a chatty child cannot fill
kvadvise's memory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from kvadvise.errors import DoesNotFit, InputError


def find_tool(name: str, server: str | None) -> str | None:
    """A llama.cpp program (llama-fit-params, llama-perplexity): beside ``--llama-server`` (one build's
    tools are built together), else on PATH; None when neither has it."""
    import shutil
    from pathlib import Path

    if server:
        beside = Path(server).with_name(name)
        if beside.is_file():
            return str(beside)
    return shutil.which(name)


class _Terminated(Exception):
    """SIGTERM, SIGHUP or SIGQUIT arrived while a child was running."""


# every signal whose default action ends kvadvise and that a handler can catch (SIGINT is
# KeyboardInterrupt already); SIGKILL cannot be caught: PR_SET_PDEATHSIG covers it
_FATAL_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM, SIGHUP and SIGQUIT into an exception so the finally-blocks below kill the child group."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    old = {sig: signal.signal(sig, handler) for sig in _FATAL_SIGNALS}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _death_signal_setter() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when kvadvise dies (Linux); None elsewhere.

    libc is loaded here, in the parent: the function run between fork and exec only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # kvadvise died before the prctl: nobody would kill us later
            os._exit(1)

    return set_death_signal


MAX_LINE_CHARS = 8192  # a line longer than this is cut (the parser's lines are ~200 characters)
MAX_KEPT_LINES = 20_000  # lines the parser needs: a few hundred in a real log
TAIL_LINES = 200


class BoundedLog:
    """What kvadvise keeps of a child's output, in order: the lines ``needed`` matches (at most
    MAX_KEPT_LINES) and the last TAIL_LINES lines, each cut to MAX_LINE_CHARS."""

    def __init__(self, needed: re.Pattern[str]) -> None:
        self._needed = needed
        self._kept: list[tuple[int, str]] = []
        self._tail: collections.deque[tuple[int, str]] = collections.deque(maxlen=TAIL_LINES)
        self.lines_seen = 0

    def add(self, line: str) -> None:
        line = line[:MAX_LINE_CHARS]
        item = (self.lines_seen, line)
        self.lines_seen += 1
        if len(self._kept) < MAX_KEPT_LINES and self._needed.search(line):
            self._kept.append(item)
        self._tail.append(item)

    def read_from(self, stream: Any) -> None:
        """Read ``stream`` to its end, a bounded line at a time (a line without end cannot grow)."""
        while True:
            line = stream.readline(MAX_LINE_CHARS)
            if not line:
                return
            self.add(line)

    def text(self) -> str:
        merged = dict(self._kept)
        merged.update(self._tail)
        return "".join(line for _, line in sorted(merged.items()))


# what the llama.cpp log parser (kvadvise.runtime.llamalog), the build and failure messages use
LLAMA_LOG_NEEDED = re.compile(
    r"buffer size|size\s*=.*MiB|llama_context:|offloaded|build|error|fail|memory|invalid argument|abort|"
    r"exception|=== kvadvise-probe|^\{",
    re.IGNORECASE,
)


def kill_group(p: subprocess.Popen[str]) -> None:
    """Kill the child's process group, and every process it started that left the group (setsid)."""
    strays = _descendants(p.pid) if p.poll() is None else []  # found while the child lives: orphans are lost
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)  # also after the child exited: the rest of its group lives on
    for proc in strays:
        with contextlib.suppress(Exception):
            proc.kill()  # psutil checks it is still the same process
    with contextlib.suppress(Exception):
        p.wait(timeout=10)


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        return list(psutil.Process(pid).children(recursive=True))
    except Exception:  # gone already, or no psutil: the group kill still applies
        return []


@contextlib.contextmanager
def child(
    cmd: Sequence[str],
    *,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """Start ``cmd`` in a new process group; the group is killed when the block exits, however it exits."""
    try:
        p = subprocess.Popen(
            list(cmd),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
            errors="replace",
            preexec_fn=_death_signal_setter(),
        )
    except OSError as e:  # not there, not executable, a directory, not a program (ENOEXEC)
        raise InputError(
            f"{cmd[0]}: cannot run it ({e.strerror or type(e).__name__})",
            hint="give the path of an executable llama-server build",
        ) from None
    try:
        with _signals_raise():
            yield p
    except _Terminated:
        kill_group(p)
        raise KeyboardInterrupt from None
    finally:
        kill_group(p)


def run(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    what: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    needed: re.Pattern[str] = LLAMA_LOG_NEEDED,
) -> tuple[int, str, str]:
    """Run to completion (or kill it at the timeout); returns (exit code, stdout, stderr), each a BoundedLog's text
    (the lines ``needed`` matches, and a tail)."""
    with child(cmd, env=env, cwd=cwd) as p:
        logs = (BoundedLog(needed), BoundedLog(needed))
        readers = [
            threading.Thread(target=log.read_from, args=(stream,), daemon=True)
            for log, stream in zip(logs, (p.stdout, p.stderr), strict=True)
        ]
        for r in readers:
            r.start()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(p)
            raise DoesNotFit(
                f"{what} did not finish within {timeout_s:g} s; it was stopped",
                hint="raise --timeout, or try a smaller context",
            ) from None
        for r in readers:
            r.join(timeout=10)
        return p.returncode, logs[0].text(), logs[1].text()
