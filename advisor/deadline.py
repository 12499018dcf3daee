"""Total deadlines for blocking network calls.

A socket timeout bounds one read: a server that drips a byte every few
seconds never trips it, and a 10 s timeout becomes hours. :func:`within` runs
the call in a worker thread and gives up on it when the time is spent, however
the server behaves (headers, body, redirects, retries inside a library). The
worker is a daemon thread: its socket timeout still ends it, and it never
holds the process open. The call's context variables go with it.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kvadvise.errors import KvadviseError

T = TypeVar("T")

# the workers given up on: still blocked in a read when the program ends (kvadvise.cli.run leaves without finalizing
# the interpreter then: a daemon thread inside an SSL or socket read while Python tears down once ended in "double
# free or corruption", rc 134, after the one-line error had been printed)
_abandoned: list[threading.Thread] = []


def abandoned_workers() -> bool:
    """Whether a worker :func:`within` gave up on is still running."""
    return any(t.is_alive() for t in _abandoned)


def within(seconds: float, fn: Callable[[], T], on_timeout: Callable[[], KvadviseError]) -> T:
    """``fn()``'s result or exception, or ``on_timeout()`` raised once ``seconds`` have passed."""
    if seconds <= 0:
        raise on_timeout()
    box: dict[str, object] = {}
    ctx = contextvars.copy_context()

    def work() -> None:
        try:
            box["value"] = ctx.run(fn)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=work, name="kvadvise-deadline", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        _abandoned.append(t)
        raise on_timeout()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


class Deadline:
    """A point in time several calls share: ``remaining()`` seconds are left for the next one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()
