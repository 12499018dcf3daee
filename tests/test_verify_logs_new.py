"""The log lines ``verify llamacpp`` reads, in every spelling published llama.cpp builds print: the memory
breakdown table (llama_print_memory_breakdown, llama_memory_breakdown_print, common_memory_breakdown_print; a
wrapped or a signed ``unaccounted``), --fit's lines (llama_params_fit_impl, common_params_fit_impl) and
llama-server's estimate of an MTP context; published excerpts committed with their URLs
(tests/data/published_lines/), and real b11312 llama-server logs, one of a server that slept and woke.
A woken server's placement is compared with the plan (llama.cpp#24684).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from rpc_devices import _free_port, _kill
from tinymodels import write_tiny_gguf

from kvadvise.runtime.llamalog import BreakdownRow, last_load, parse
from kvadvise.runtime.verification import placement_drift

DATA = Path(__file__).resolve().parent / "data" / "published_lines"


def _lines(name: str) -> list[str]:
    text = (DATA / name).read_text(encoding="utf-8")
    assert text.startswith("# source: https://github.com/"), name  # every excerpt names where it was published
    return [line for line in text.splitlines() if not line.startswith("#")]


def _consistent(r: BreakdownRow) -> None:
    """The table's own arithmetic, to the MiB each figure was rounded to."""
    assert abs(r.self_mib - (r.model_mib + r.context_mib + r.compute_mib)) <= 2, r
    if r.free_mib is not None and r.total_mib is not None and r.unaccounted_mib is not None:
        assert abs(r.total_mib - (r.free_mib + r.self_mib + r.unaccounted_mib)) <= 2, r


@pytest.mark.parametrize(
    ("name", "func", "devices", "fit_lines", "mtp_mib"),
    [
        ("pr15860-first-breakdown.log", "llama_print_memory_breakdown", ["CUDA0", "CUDA1", "CUDA2", "CPU"], 0, None),
        ("issue19437-llama-prefix-wrapped.log", "llama_memory_breakdown_print", ["CUDA0", "Host"], 1, None),
        ("pr21489-llama-params-fit.log", None, [], 2, None),
        ("pr25465-common-prefix-mtp.log", "common_memory_breakdown_print", ["CUDA0", "Host"] * 2, 1, 648.03),
        ("ollama17482-mtp-load.log", "common_memory_breakdown_print", ["CUDA0", "Host"], 1, 581.77),
        ("pr16031-common-fit-layers.log", "common_memory_breakdown_print", ["CUDA0", "CUDA1", "Host"], 4, None),
    ],
)
def test_published_lines_of_every_build_parse(
    name: str, func: str | None, devices: list[str], fit_lines: int, mtp_mib: float | None
) -> None:
    log = parse(_lines(name))
    assert [r.name for r in log.breakdown] == devices
    assert all(r.func == func for r in log.breakdown)
    for r in log.breakdown:
        _consistent(r)
    assert (len(log.fit.lines) if log.fit else 0) == fit_lines
    assert log.mtp_context_mib == mtp_mib


def test_figures_of_the_old_and_the_renamed_lines() -> None:
    old = parse(_lines("issue19437-llama-prefix-wrapped.log"))
    # 17592186036877 MiB is -7539 wrapped by size_t arithmetic (2**64 B / 2**20): the table's own sum says -7538
    assert old.breakdown[0].unaccounted_mib == 17592186036877 - 2**44 == -7539
    assert old.fit is not None and (old.fit.n_ctx_from, old.fit.n_ctx_to) == (262144, 30000)
    new = parse(_lines("pr25465-common-prefix-mtp.log"))
    assert new.breakdown[0] == BreakdownRow(
        "common_memory_breakdown_print", "CUDA0 (RTX 5090)", 32111, 31605, 18058, 16386, 1024, 648, -17552
    )
    host = new.breakdown[1]
    assert (host.total_mib, host.free_mib, host.self_mib, host.model_mib, host.compute_mib) == (
        None,
        None,
        1234,
        682,
        552,
    )
    fit = parse(_lines("pr21489-llama-params-fit.log")).fit
    assert fit is not None and (fit.projected_mib, fit.free_mib) == (3287, 110100)
    first = parse(_lines("pr15860-first-breakdown.log")).breakdown
    assert (first[0].total_mib, first[0].unaccounted_mib) == (24080, 451)
    assert (first[-1].total_mib, first[-1].self_mib, first[-1].context_mib) == (515628, 72, 57)


def test_a_woken_server_that_placed_fewer_layers_is_said_to_have_drifted() -> None:
    """ggml-org/llama.cpp#27807 (2026-08-27, RTX 3090, Qwen3.6-27B-MTP-Q4_K_M, fit-ctx 131072): "the first load
    offloads 65/66 layers, but after sleep/wake the re-fit lands on 64/66 and throughput drops ~20% silently"."""
    from kvadvise.planner.planning import Plan

    plan = object.__new__(Plan)  # placement_drift reads the plan only when the loads agree with each other
    said = placement_drift(plan, ((65, 66), (64, 66)))
    assert said is not None and "65/66, then 64/66" in said and "llama.cpp#24684" in said and "-ngl" in said


@pytest.mark.llama
def test_real_server_that_slept_and_woke(
    real_llama_server: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b11312 with --sleep-idle-seconds: the wake loads again (a second "load_model: loading model") and re-runs
    --fit (common_params_fit_impl, common_memory_breakdown_print): verify reads the last load's buffers, once,
    and every load's placement; the same placement twice is no drift."""
    from kvadvise.cli import main

    model = write_tiny_gguf(tmp_path / "glm.gguf", "glm4moe", n_vocab=32000)
    port = _free_port()
    cmd = [str(real_llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-lv", "4"]
    cmd += ["-c", "4096", "-np", "1", "-fa", "on", "--sleep-idle-seconds", "1"]
    log_path = tmp_path / "server.log"
    with log_path.open("w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "entering sleeping state" not in log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline and p.poll() is None, log_path.read_text()[-2000:]
                time.sleep(0.2)
            body = json.dumps({"prompt": "hi", "n_predict": 1}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body)
            with urllib.request.urlopen(req, timeout=60) as r:  # wakes it
                assert r.status == 200
        finally:
            _kill(p)
    text = log_path.read_text(errors="replace")
    lines = text.splitlines()
    everything, last = parse(lines), parse(last_load(lines))
    assert len(everything.placements) == 2 and everything.placements[0] == everything.placements[1]
    assert {b.kind for b in last.buffers} >= {"model", "KV", "compute", "output"}
    assert last.mib("KV") == pytest.approx(everything.mib("KV") / 2)  # one load's, not both
    assert everything.fit is not None and everything.fit.projected_mib is not None  # the wake re-ran --fit
    host = [r for r in everything.breakdown if r.name == "Host"]
    assert len(host) == 2 and host[0] == host[1]
    assert host[0].model_mib == int(last.mib("model"))  # whole MiB, rounded down
    # verify --log: the plan against the last load; no drift said
    argv = ["verify", "llamacpp", str(model), "--log", str(log_path), "--ctx", "4096", "-fa", "on", "--device", "cpu"]
    assert main([*argv, "--no-repack", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["kv_bytes"] == 0 and doc["measured"]["runner"] == "llama-server (its log)"
    assert doc["measured"]["kv_bytes"] == round(last.mib("KV") * (1 << 20))
    assert not any("drift" in r for r in doc["reasons"])


@pytest.mark.llama
def test_attach_finds_the_server_on_either_default_port(
    real_llama_server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify llamacpp --attach HOST (no port) asks the default ports in turn (8080, then 9931, where the default
    moves: llama.cpp#26508); stood in here by a port nothing listens on, then the real server's. Its /props context
    and slots are compared with the plan: the same is exit 0, another context exit 3."""
    from kvadvise.cli import main
    from kvadvise.runtime import serverport

    model = write_tiny_gguf(tmp_path / "glm.gguf", "glm4moe", n_vocab=32000)
    port, closed = _free_port(), _free_port()
    cmd = [str(real_llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    p = subprocess.Popen(
        [*cmd, "-c", "4096", "-np", "2", "-kvu"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        monkeypatch.setattr(serverport, "DEFAULT_PORTS", (closed, port))
        deadline = time.monotonic() + 120
        while (found := serverport.find_server("127.0.0.1")) is None:
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.3)
        assert found.url == f"http://127.0.0.1:{port}" and found.n_slots == 2 and found.n_ctx == 4096
        assert found.is_sleeping is False and found.model_path == str(model)
        base = ["verify", "llamacpp", str(model), "--attach", "127.0.0.1", "--device", "cpu", "-np", "2", "-kvu"]
        assert main([*base, "--ctx", "4096"]) == 0
        assert "runs the plan's context and slots" in capsys.readouterr().out
        assert main([*base, "--ctx", "8192"]) == 3
        assert "its context per slot is 4,096, the plan's 8,192" in capsys.readouterr().out
        # no server there: a backend unreachable (exit 4, as `verify ollama` without an Ollama server)
        assert main([*base[:4], f"127.0.0.1:{closed}", *base[5:], "--ctx", "4096"]) == 4
    finally:
        _kill(p)


def test_router_command_names_its_port() -> None:
    from kvadvise.runtime.router import router_command

    assert router_command("m.ini", 2).endswith("--models-max 2 --port 8080")


def _props_server(family: int, host: str, model_path: str) -> tuple[object, int]:
    """A loopback stand-in of llama-server's /props (tools/server: model_path, default_generation_settings.n_ctx,
    total_slots), on ``host`` of address ``family``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps(
        {"model_path": model_path, "default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
    ).encode()

    class Props(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/props" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = family

    server = Server((host, 0), Props)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_attach_takes_an_ipv6_host_and_refuses_one_that_is_no_host(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--attach [::1]:PORT` (parse_address takes an IPv6 host in brackets) asked http://::1:PORT/props, a URL
    that names no host, so an IPv6 llama-server was never found (exit 2, "no llama-server answered"); `--attach
    "a b"` ended in an internal error (http.client.InvalidURL, exit 1)."""
    import socket

    from kvadvise.cli import main

    server, port = _props_server(socket.AF_INET6, "::1", str(gemma_path))
    try:
        rc = main(["verify", "llamacpp", str(gemma_path), "--attach", f"[::1]:{port}", "--device", "cpu", "-c", "4096"])
        out, err = capsys.readouterr()
        assert rc == 0 and f"http://[::1]:{port}" in out and "runs the plan's context and slots" in out, err
    finally:
        server.shutdown()  # type: ignore[attr-defined]
    for bad in ("a b", "x\ty:80", "host/path:80"):
        rc = main(["verify", "llamacpp", str(gemma_path), "--attach", bad])
        err = capsys.readouterr().err
        assert rc == 2 and "internal error" not in err and "--attach" in err, (bad, err)


def test_attach_reads_a_port_as_llama_server_reads_its_own(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`llama-server --port 08080` listens on 8080 (common/arg.cpp std::stoi); `--attach 127.0.0.1:08080` was
    refused ("the port must be a number from 1 to 65535"). A bracketed address with text after it (`[::1]junk`)
    or no closing bracket had that text dropped without a word: refused (exit 2)."""
    from kvadvise.runtime.serverport import parse_address

    assert parse_address("127.0.0.1:08080") == ("127.0.0.1", 8080)
    assert parse_address("[::1]:0000000000000000008080") == ("::1", 8080)
    from kvadvise.cli import main

    for bad, what in (("[::1]junk", "[ADDRESS]:PORT"), ("[::1", "[ADDRESS]:PORT"), ("h:00000", "1 to 65535"),
                      ("h:" + "9" * 5000, "1 to 65535")):  # fmt: skip
        rc = main(["verify", "llamacpp", str(gemma_path), "--attach", bad])
        err = capsys.readouterr().err
        assert rc == 2 and what in err and "internal error" not in err, (bad, err)
