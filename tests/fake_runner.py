"""Processes whose command lines are those of Ollama's server, runners and clients, for `verify ollama`'s
runner check: each is this Python sleeping under another argv[0] (``Popen(executable=sys.executable)``).

- ``ollama serve`` starting ``<dir>/lib/ollama/llama-server --model BLOB --port N`` as its child (Ollama >= 0.30,
  llm/llama_server.go startLlamaServer);
- ``ollama runner --model BLOB --port N`` (the runners before it);
- ``ollama run NAME`` (a client) and a ``llama-server`` no Ollama started.

Python takes ``runner``, ``run`` or ``serve`` as the script to run: a file of that name in the working folder
sleeps (or starts the child and sleeps).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

SLEEP = "import time\ntime.sleep(120)\n"


@dataclass
class Procs:
    pids: dict[str, int]  # "serve", "llama-server", "runner", "client", "stray" -> pid


def _llama_server_argv(folder: Path, blob: str, port: int) -> list[str]:
    # python's -c takes the code; the rest (--model, --port) is left to sys.argv, as llama-server's own flags
    return [str(folder / "lib" / "ollama" / "llama-server"), "-c", SLEEP, "--model", blob, "--port", str(port)]


@contextmanager
def running(
    folder: Path,
    *,
    serve_blob: str | None = None,
    runner_blob: str | None = None,
    client: bool = False,
    stray_blob: str | None = None,
) -> Iterator[Procs]:
    """Start the processes asked for in ``folder``; kill them all on the way out."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("runner", "run"):
        (folder / name).write_text(SLEEP)
    started: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    try:
        if serve_blob is not None:
            child = _llama_server_argv(folder, serve_blob, 41001)
            (folder / "serve").write_text(
                f"import subprocess, time\nsubprocess.Popen({child!r}, executable={sys.executable!r})\n"
                "time.sleep(120)\n"
            )
            serve = subprocess.Popen(["ollama", "serve"], executable=sys.executable, cwd=folder)
            started.append(serve)
            pids["serve"] = serve.pid
        if runner_blob is not None:
            argv = ["ollama", "runner", "--model", runner_blob, "--port", "41002"]
            started.append(subprocess.Popen(argv, executable=sys.executable, cwd=folder))
            pids["runner"] = started[-1].pid
        if client:
            started.append(subprocess.Popen(["ollama", "run", "gemma3-270m"], executable=sys.executable, cwd=folder))
            pids["client"] = started[-1].pid
        if stray_blob is not None:
            argv = _llama_server_argv(folder, stray_blob, 41003)
            started.append(subprocess.Popen(argv, executable=sys.executable, cwd=folder))
            pids["stray"] = started[-1].pid
        deadline = time.monotonic() + 10
        while serve_blob is not None and "llama-server" not in pids:
            kids = psutil.Process(pids["serve"]).children()
            if kids:
                pids["llama-server"] = kids[0].pid
            elif time.monotonic() > deadline:
                raise RuntimeError("the fake ollama serve started no llama-server")
            else:
                time.sleep(0.05)
        yield Procs(pids)
    finally:
        for p in started:
            for kid in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else ():
                kid.kill()
            p.kill()
            p.wait()
