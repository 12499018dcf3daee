"""A network call given up on (kvadvise.deadline.within) leaves its worker blocked in the read; the console script
(kvadvise.cli.run) then leaves without finalizing the interpreter: one CI run (at 0013edf) printed the one-line error
and then aborted with "double free or corruption" (rc 134) while Python tore down around such a daemon thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from kvadvise import deadline
from kvadvise.errors import BackendUnreachable


def test_a_worker_given_up_on_is_remembered() -> None:
    release = threading.Event()

    def slow() -> int:
        release.wait(5)
        return 1

    with pytest.raises(BackendUnreachable):
        deadline.within(0.05, slow, lambda: BackendUnreachable("no answer in time"))
    assert deadline.abandoned_workers()
    release.set()
    for _ in range(100):
        if not deadline.abandoned_workers():
            break
        time.sleep(0.01)
    assert not deadline.abandoned_workers()  # it ended: nothing left to leave behind


def test_the_console_script_exits_with_mains_code_past_a_blocked_worker() -> None:
    """run() as the console script runs it: a worker still blocked when main() returns, the exit code main() gave, the
    error already flushed."""
    code = (
        "import threading, sys\n"
        "from kvadvise import deadline, cli\n"
        "from kvadvise.errors import BackendUnreachable\n"
        "def main():\n"
        "    try:\n"
        "        deadline.within(0.05, lambda: threading.Event().wait(60), lambda: BackendUnreachable('x'))\n"
        "    except BackendUnreachable:\n"
        "        print('kvadvise: error: no answer in time', file=sys.stderr)\n"
        "    return 3\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    assert p.returncode == 3, p.stderr
    assert p.stderr.strip() == "kvadvise: error: no answer in time"
