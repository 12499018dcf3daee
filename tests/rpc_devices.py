"""Several llama.cpp devices on one machine: ``rpc-server`` processes on loopback, each a device
(``RPC0[127.0.0.1:PORT]``, ...) that llama-server splits layers over exactly as over several GPUs.

Every process started here is in its own session and is killed on every path (``devices()`` is
a context manager; ``run_server`` kills llama-server once its buffers are printed).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

# the rows of tests/test_devices.py's runs ("| run | device | model | KV | compute |", predicted after the slash),
# printed at the end of the session by tests/conftest.py
REPORT: list[str] = []
REPORT_HEAD = "| run | device | model MiB | KV MiB | compute MiB |\n|---|---|---|---|---|"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(p: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


@contextmanager
def devices(rpc_server: Path, n: int, *, debug_logs: Path | None = None) -> Iterator[list[str]]:
    """``n`` rpc-servers on loopback; yields their HOST:PORT endpoints. ``debug_logs``: a folder where
    each writes ``rpc-N.log`` with GGML_RPC_DEBUG=1 (every buffer it allocates, with its size)."""
    procs: list[subprocess.Popen[bytes]] = []
    endpoints: list[str] = []
    try:
        for i in range(n):
            port = _free_port()
            env, err = None, None
            if debug_logs is not None:
                env, err = {**os.environ, "GGML_RPC_DEBUG": "1"}, open(debug_logs / f"rpc-{i}.log", "wb")  # noqa: SIM115
            try:
                procs.append(
                    subprocess.Popen(
                        [str(rpc_server), "-H", "127.0.0.1", "-p", str(port)],
                        stdout=subprocess.DEVNULL,
                        stderr=err if err is not None else subprocess.DEVNULL,
                        start_new_session=True,
                        env=env,
                    )
                )
            finally:
                if err is not None:
                    err.close()
            endpoints.append(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        for ep in endpoints:  # wait until each one accepts connections
            host, port = ep.rsplit(":", 1)
            while True:
                try:
                    socket.create_connection((host, int(port)), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"rpc-server at {ep} did not start") from None
                    time.sleep(0.1)
        yield endpoints
    finally:
        for p in procs:
            _kill(p)


def run_server(
    llama_server: Path,
    model: Path,
    args: Sequence[str],
    endpoints: Sequence[str],
    timeout_s: float = 180,
    on_ready: Callable[[int], None] | None = None,
) -> str:
    """Start llama-server with the devices, read its log until it listens (every buffer is printed by
    then), stop it; the log. ``on_ready(pid)`` runs while it listens (e.g. to read its memory)."""
    cmd = [str(llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(_free_port())]
    cmd += ["--fit", "off", "-lv", "4", *args]
    if endpoints:
        cmd += ["--rpc", ",".join(endpoints)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if "listening on" in line or time.monotonic() > deadline:
                if on_ready is not None and "listening on" in line:
                    on_ready(p.pid)
                break
    finally:
        _kill(p)
    return "".join(lines)


def plan_and_run(model: Path, sizes: Sequence[str], extra: Sequence[str], llama_server: Path, capsys: object):
    """``kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ... EXTRA --json`` over ``len(sizes)`` loopback rpc-servers,
    then the llama-server command it writes over those same servers: the plan's JSON and the buffers llama-server
    printed (kvadvise.runtime.llamalog.parse). ``capsys``: pytest's fixture (the plan is read from stdout)."""
    import json
    import shlex

    from llama_server_build import rpc_server

    from kvadvise.cli import main
    from kvadvise.runtime.llamalog import parse

    with devices(rpc_server(), len(sizes)) as eps:
        rpc = [a for ep, size in zip(eps, sizes, strict=True) for a in ("--rpc", f"{ep}={size}")]
        main(["llamacpp", str(model), *rpc, *extra, "--ram", "16GiB", "--json"])
        doc = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
        assert doc["fits"], doc
        cmd = shlex.split(doc["llama_server"]["command"])
        args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
        got = parse(run_server(llama_server, model, args, eps).splitlines())
    return doc, got


def partial_plan_and_run(
    model: Path, sizes: Sequence[str], extra: Sequence[str], llama_server: Path, *, ngl: int | None = None
) -> tuple[dict[str, object], list[float]]:
    """``kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ... EXTRA --margin 0 --ram 16GiB --json`` over fresh loopback
    rpc-servers, a model they do not hold whole, then its partial plan's command (``llama_server.offload_command``;
    ``ngl``: the same with ``-ngl ngl``) over the same servers: the plan's JSON and each device's real total (model +
    KV + compute, MiB, in endpoint order)."""
    import contextlib
    import io
    import json
    import shlex

    from llama_server_build import rpc_server

    from kvadvise.cli import main
    from kvadvise.runtime.llamalog import parse

    with devices(rpc_server(), len(sizes)) as eps:
        rpc = [a for ep, size in zip(eps, sizes, strict=True) for a in ("--rpc", f"{ep}={size}")]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(["llamacpp", str(model), *rpc, *extra, "--margin", "0", "--ram", "16GiB", "--json"])
        doc = json.loads(buf.getvalue())
        off = doc["offload"]
        assert isinstance(off, dict) and off["runnable"], off
        cmd = shlex.split(doc["llama_server"]["offload_command"])
        args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
        if ngl is not None:
            args[args.index("-ngl") + 1] = str(ngl)
        got = parse(run_server(llama_server, model, args, eps).splitlines())
    real = [
        sum(b.mib for b in got.buffers if b.buft == f"RPC0[{ep}]" and b.kind in ("model", "KV", "compute"))
        for ep in eps
    ]
    return doc, real


def stop(p: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Stop a server started by a test: SIGTERM, 30 s to exit, then SIGKILL."""
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def within_bar(predicted_mib: float, measured_mib: float) -> bool:
    """The project's bar for a compute buffer: 16 MiB or 3 % of what llama.cpp printed."""
    return abs(predicted_mib - measured_mib) <= max(16.0, 0.03 * measured_mib)
