"""Child processes that hold GPU memory must never outlive kvadvise.

Each child runs in its own process group; on a timeout, an error, Ctrl-C or
SIGTERM the whole group is killed and reaped before control returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from kvadvise.errors import DoesNotFit, InputError


class _Terminated(Exception):
    """SIGTERM arrived while a child was running."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into an exception so the finally-blocks below kill the child group."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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
        )
    except OSError as e:  # not there, not executable, a directory, not a program (ENOEXEC)
        raise InputError(
            f"{cmd[0]}: cannot run it ({e.strerror or type(e).__name__})",
            hint="give the path of an executable llama-server build",
        ) from None
    try:
        with _sigterm_raises():
            yield p
    except _Terminated:
        kill_group(p)
        raise KeyboardInterrupt from None
    finally:
        kill_group(p)


def run(
    cmd: Sequence[str], *, timeout_s: float, what: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[int, str, str]:
    """Run to completion (or kill it at the timeout); returns (exit code, stdout, stderr)."""
    with child(cmd, env=env, cwd=cwd) as p:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(p)
            raise DoesNotFit(
                f"{what} did not finish within {timeout_s:g} s; it was stopped",
                hint="raise --timeout, or try a smaller context",
            ) from None
        return p.returncode, out, err
