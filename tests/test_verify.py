"""`kvadvise verify llamacpp`: real llama.cpp, failure paths, no orphaned children."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from oracle import COMPUTE_TOLERANCE

from kvadvise.cli import main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MIB = 1 << 20


# Every process a test starts inherits this variable with the test's own value, so the checks below
# count the processes of this test only, not those another session runs on the same machine.
SESSION_VAR = "KVTEST_PROCESS_MARK"


def _ours(p: psutil.Process) -> bool:
    mark = os.environ.get(SESSION_VAR)
    if not mark:
        return True
    try:
        return p.environ().get(SESSION_VAR) == mark
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def llama_servers() -> list[psutil.Process]:
    """Running llama-server processes this test started (the real binary: the first word of the command line)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if cmd and os.path.basename(cmd[0]) == "llama-server" and _ours(p):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def children_named(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])) and _ours(p):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.fixture(autouse=True)
def _no_orphans(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> object:
    monkeypatch.setenv(SESSION_VAR, f"{os.getpid()}:{request.node.nodeid}")
    yield
    time.sleep(0.1)
    assert children_named("kvadvise.backends.llamacpp.probe") == []
    assert children_named("fake_llama_server.py") == []
    assert llama_servers() == []


def verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object] | None, str]:
    rc = main(["verify", "llamacpp", *args, "--json", "--no-hardware"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


@pytest.mark.llama
@pytest.mark.parametrize(
    ("ctx", "kv", "cells"),
    [("4096", "f16", 4096), ("10000", "q8_0", 10240)],
)
def test_real_llama_cpp_kv_exact_compute_close(
    ctx: str, kv: str, cells: int, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", ctx, "-ctk", kv, "-ctv", kv, "-fa", "on")
    assert rc == 0, err
    assert doc is not None
    m, e = doc["measured"], doc["error"]
    assert isinstance(m, dict) and isinstance(e, dict)
    assert m["n_ctx"] == cells and m["runner"] == "llama-cpp-python" and m["backend"] == "CPU"
    # llama.cpp prints each buffer to 0.01 MiB: "exact" is exact to what it prints (two KV buffers: SWA and full)
    printed = MIB // 200 + 1
    assert abs(e["kv_bytes"]) <= 2 * printed and abs(e["k_bytes"]) <= 2 * printed and abs(e["v_bytes"]) <= 2 * printed
    assert e["recurrent_bytes"] == 0 and abs(e["output_bytes"]) <= printed
    rel, absolute = COMPUTE_TOLERANCE
    assert abs(e["compute_bytes"]) <= max(rel * m["compute_bytes"], absolute)
    assert m["decode_tokens_per_s"] > 0 and m["prompt_tokens_per_s"] > 0
    assert doc["fits"] is True and "CPU buffers only" in str(doc["verdict"])


@pytest.mark.llama
def test_allocation_that_cannot_succeed_exits_3(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 16M cells of f32 K and V: ~92 GiB of KV on a 24 GiB machine; llama.cpp's allocation fails
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", "16000000", "-ctk", "f32", "-ctv", "f32", "-fa", "on")
    assert rc == 3 and doc is None
    assert "allocate" in err or "memory" in err
    assert "Traceback" not in err


@pytest.mark.llama
def test_file_llama_cpp_rejects_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(TESTS))
    from gguf import GGUFReader, GGUFWriter
    from tinymodels import write_tiny_gguf

    good = write_tiny_gguf(tmp_path / "good.gguf", "llama")
    # same header shape, but a required tensor renamed: our header checks pass, llama.cpp's loader refuses it
    r = GGUFReader(good)
    w = GGUFWriter(tmp_path / "bad.gguf", "llama")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        name = "blk.0.attn_q.weight_renamed" if t.name == "blk.0.attn_q.weight" else t.name
        w.add_tensor(name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, _doc, err = verify(capsys, str(tmp_path / "bad.gguf"), "--ctx", "512")
    assert rc == 3 and "llama.cpp failed" in err


@pytest.mark.llama
def test_timeout_stops_the_child(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _doc, err = verify(capsys, str(gemma_path), "--ctx", "4096", "--timeout", "0.3")
    assert rc == 3 and "did not finish within 0.3 s" in err


def verify_command(model: Path, server: Path) -> list[str]:
    """`kvadvise verify llamacpp` in a process of its own, for the signal tests."""
    cmd = [sys.executable, "-m", "kvadvise", "verify", "llamacpp", str(model), "--ctx", "4096", "--no-hardware"]
    return [*cmd, "--llama-server", str(server)]


def fake_server(tmp_path: Path, log: str, mode: str) -> Path:
    logfile = tmp_path / "llama.log"
    logfile.write_text(log)
    script = tmp_path / "llama-server"
    script.write_text(
        f'#!/bin/sh\nexec {sys.executable} {TESTS / "fake_llama_server.py"} --log {logfile} --mode {mode} "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def real_log(gemma_path: Path) -> str:
    """What real llama.cpp printed loading Gemma 3 270M at -c 4096 -fa on (the server's log has the same lines)."""
    from oracle import run_llama

    from kvadvise.planner.memory import RunConfig

    return run_llama(gemma_path, [RunConfig(n_ctx=4096, flash_attn="on")])[0].text


@pytest.mark.llama
def test_llama_server_runner(
    gemma_path: Path, real_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(tmp_path, "build: 7000 (0c1e570) with cc for x86_64-linux-gnu\n" + real_log, "ok")
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", "4096", "-fa", "on", "--llama-server", str(server))
    assert rc == 0, err
    assert doc is not None and isinstance(doc["measured"], dict) and isinstance(doc["error"], dict)
    assert doc["measured"]["runner"] == "llama-server"
    assert doc["measured"]["llama_cpp_build"] == "b7000 (0c1e570)"
    assert (doc["measured"]["prompt_tokens_per_s"], doc["measured"]["decode_tokens_per_s"]) == (500.0, 50.0)
    assert abs(doc["error"]["kv_bytes"]) <= 2 * (MIB // 200 + 1)


@pytest.mark.llama
def test_llama_server_without_fit_or_verbosity_flags_is_run_without_them(
    gemma_path: Path, real_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(tmp_path, real_log, "old")
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", "4096", "-fa", "on", "--llama-server", str(server))
    assert rc == 0, err
    assert "does not know --fit / -lv: running it without them" in err
    assert doc is not None and isinstance(doc["error"], dict) and abs(doc["error"]["kv_bytes"]) <= 2 * (MIB // 200 + 1)


@pytest.mark.parametrize(("mode", "message"), [("crash", "stopped while loading"), ("hang", "did not become ready")])
def test_llama_server_failures_exit_3(
    mode: str, message: str, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(tmp_path, "load_tensors: loading model\n", mode)
    rc, _doc, err = verify(capsys, str(gemma_path), "--ctx", "4096", "--llama-server", str(server), "--timeout", "2")
    assert rc == 3 and message in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_child(sig: signal.Signals, gemma_path: Path, tmp_path: Path) -> None:
    server = fake_server(tmp_path, "load_tensors: loading model\n", "hang")
    p = subprocess.Popen(verify_command(gemma_path, server), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not children_named("fake_llama_server.py") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children_named("fake_llama_server.py"), "the fake server never started"
    os.kill(p.pid, sig)
    rc = p.wait(timeout=20)
    assert rc != 0
    assert "Traceback" not in (p.stderr.read() if p.stderr else "")


# -- the real llama-server (built once from llama-cpp-python's llama.cpp: tests/llama_server_build.py) ----


@pytest.mark.llama
@pytest.mark.parametrize(("ctx", "kv", "cells"), [("4096", "f16", 4096), ("10000", "q8_0", 10240)])
def test_real_llama_server_kv_exact_compute_close(
    ctx: str, kv: str, cells: int, real_llama_server: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = (str(gemma_path), "--ctx", ctx, "-ctk", kv, "-ctv", kv, "-fa", "on")
    rc, doc, err = verify(capsys, *args, "--llama-server", str(real_llama_server))
    assert rc == 0, err
    assert doc is not None
    m, e = doc["measured"], doc["error"]
    assert isinstance(m, dict) and isinstance(e, dict)
    assert m["runner"] == "llama-server" and m["backend"] == "CPU" and m["n_ctx"] == cells
    # parsed from its log: "b0 (unknown)" when built from the sdist (no git), else "b7000 (0c1e570)"
    assert re.fullmatch(r"b\d+ \((?:[0-9a-f]{7,}|unknown)\)", str(m["llama_cpp_build"]))
    printed = MIB // 200 + 1
    assert abs(e["kv_bytes"]) <= 2 * printed and abs(e["k_bytes"]) <= 2 * printed and abs(e["v_bytes"]) <= 2 * printed
    assert e["recurrent_bytes"] == 0 and abs(e["output_bytes"]) <= printed
    # weights: the mapped file span and, on a CPU with repacked layouts, the CPU_REPACK copies (Gemma's q4_K)
    assert abs(e["weights_bytes"]) <= 2 * printed
    # llama-server reserves logits for one output per slot, not the whole batch: ~23 MiB, not ~515
    rel, absolute = COMPUTE_TOLERANCE
    assert m["compute_bytes"] < 64 * MIB
    assert abs(e["compute_bytes"]) <= max(rel * m["compute_bytes"], absolute)
    assert m["decode_tokens_per_s"] > 0 and m["prompt_tokens_per_s"] > 0
    # the same config through llama-cpp-python measures the same buffers
    rc, doc2, err = verify(capsys, *args)
    assert rc == 0, err
    assert doc2 is not None and isinstance(doc2["measured"], dict)
    for key in ("kv_bytes", "k_bytes", "v_bytes", "compute_bytes", "output_bytes", "weights_bytes"):
        assert doc2["measured"][key] == m[key], key


@pytest.mark.llama
@pytest.mark.parametrize(
    "args",
    [
        ("--ctx", "8192", "-np", "2", "-fa", "on"),  # two slots: 4096 cells each, logits for 2 outputs
        ("--ctx", "8192", "-np", "3", "-kvu", "-fa", "off", "-ctk", "q8_0"),  # unified cache, scores materialised
        ("--ctx", "6000", "-fa", "on", "-ctk", "q4_0", "-ctv", "q4_0", "-ub", "256", "-b", "1024"),
    ],
    ids=["np2", "np3-unified-fa-off", "q4_0-ub256"],
)
def test_real_llama_server_slots_and_batches(
    args: tuple[str, ...], real_llama_server: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc, err = verify(capsys, str(gemma_path), *args, "--llama-server", str(real_llama_server))
    assert rc == 0, err
    assert doc is not None and isinstance(doc["error"], dict) and isinstance(doc["measured"], dict)
    e, m = doc["error"], doc["measured"]
    printed = MIB // 200 + 1
    assert abs(e["kv_bytes"]) <= 2 * printed and abs(e["output_bytes"]) <= printed
    rel, absolute = COMPUTE_TOLERANCE
    assert abs(e["compute_bytes"]) <= max(rel * m["compute_bytes"], absolute)


@pytest.mark.llama
def test_real_llama_server_that_cannot_allocate_exits_3(
    real_llama_server: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--ctx", "16000000", "-ctk", "f32", "-ctv", "f32", "-fa", "on", "--llama-server", str(real_llama_server))
    rc, doc, err = verify(capsys, str(gemma_path), *args)
    assert rc == 3 and doc is None
    assert "llama-server stopped while loading" in err and "Traceback" not in err


@pytest.mark.llama
def test_real_llama_server_timeout_and_sigterm_leave_no_process(real_llama_server: Path, gemma_path: Path) -> None:
    base = verify_command(gemma_path, real_llama_server)
    p = subprocess.run([*base, "--timeout", "0.2"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 3 and "did not become ready within 0.2 s" in p.stderr
    assert llama_servers() == []
    q = subprocess.Popen(base, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not llama_servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert llama_servers(), "llama-server never started"
    q.send_signal(signal.SIGTERM)
    _, err = q.communicate(timeout=60)
    assert q.returncode != 0 and "Traceback" not in err


@pytest.mark.llama
def test_real_llama_server_on_the_cpu_does_not_verify_a_cuda_plan(
    real_llama_server: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--device cuda` on a CPU build (this machine's): llama.cpp runs, but on the CPU, so the CUDA plan
    is not verified: exit 3 and a verdict that says why, never a pass."""
    rc, doc, _ = verify(
        capsys, str(gemma_path), "--ctx", "1024", "--device", "cuda", "--llama-server", str(real_llama_server)
    )
    assert rc == 3
    assert doc["measured"]["backend"] == "CPU" and doc["fits"] is False
    assert doc["verdict"].startswith("not verified: the plan is for cuda but llama.cpp ran on the CPU")


# --- verify llamacpp --dry-run: llama.cpp's own no-allocation projection beside the plan (issue 25) ---------


@pytest.fixture(scope="module")
def fit_params_binary(real_llama_server: Path) -> Path:
    from llama_server_build import fit_params

    path = fit_params()
    if not path.exists():
        pytest.skip(f"no llama-fit-params beside {real_llama_server}")
    return path


@pytest.mark.llama
@pytest.mark.parametrize(
    "flags",
    [
        ["--ctx", "4096", "-fa", "on"],
        ["--ctx", "8192", "-fa", "off", "-np", "2", "--ubatch", "256"],
        ["--ctx", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "--swa-full"],
    ],
    ids=["fa-on", "fa-off-np2", "q8-swa-full"],
)
def test_dry_run_prints_llama_cpps_projection_beside_the_plan(
    flags: list[str], gemma_path: Path, fit_params_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real Gemma 3 270M on the CPU: llama-fit-params projects the plan (no allocation) and its figures are
    printed beside kvadvise's per device; they agree (compute within 16 MiB or 3 %, KV to the MiB), exit 0."""
    argv = ["verify", "llamacpp", str(gemma_path), *flags, "--dry-run", "--llama-fit-params", str(fit_params_binary)]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["dry_run"]
    assert doc["agree"] and doc["binary"] == str(fit_params_binary) and doc["llama_build"] == 11312
    cpu, *repack = doc["devices"]
    assert cpu["name"] == "CPU" and cpu["ok"] and cpu["differences"] == ""
    assert cpu["llama_cpp_mib"]["context"] == int(cpu["kvadvise_mib"]["context"])  # KV, floored as it prints
    assert abs(cpu["compute_diff_mib"]) <= max(16, 0.03 * cpu["llama_cpp_mib"]["compute"])
    # the model is judged too (issue 37): the projection's Host line is the tensors of the CPU buffer type,
    # 235.16 MiB of file less the 12.66 MiB of q4_K matrices repacked on an AVX2 CPU = 222.50, floored 222
    assert cpu["llama_cpp_mib"]["model"] == int(cpu["kvadvise_mib"]["model"])
    if repack:  # this CPU repacks: the log's own CPU_REPACK line, beside what kvadvise plans for it
        (r,) = repack
        assert r["name"] == "CPU_REPACK" and not r["in_table"] and r["ok"]
        assert cpu["kvadvise_mib"]["model"] + r["kvadvise_mib"]["model"] == pytest.approx(235.16, abs=0.01)
        assert "maps 235.16 MiB" in doc["note"] and "leaves CPU_REPACK out of its Host line" in doc["note"]
    assert "-fitp on" in doc["command"] and "-ngl 0" in doc["command"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "llama.cpp's own projection (no allocation)" in text and "kvadvise and llama.cpp agree" in text
    assert re.search(r"^CPU +(\d+) / \1 +(\d+) / \2 +[\d.,]+ / [\d.,]+ \([+-][\d.]+\)$", text, re.M), text


@pytest.mark.llama
def test_dry_run_flags_a_model_figure_it_does_not_share(
    gemma_path: Path, fit_params_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real llama-fit-params' output, its Host model figure raised by 13 MiB (the mapped span kvadvise plans,
    235, where the projection counts 222): marked with the figure and its difference, exit 3, never "agree"."""
    real = subprocess.run(
        [str(fit_params_binary), "-m", str(gemma_path), "-c", "4096", "-fa", "on", "-ngl", "0", "-fitp", "on", "-v"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    host = re.search(r"^Host (\d+) (\d+) (\d+) ?$", real.stdout, re.M)
    assert host, real.stdout
    log = tmp_path / "log.txt"
    log.write_text(real.stderr)
    fake = tmp_path / "llama-fit-params"
    fake.write_text(f"#!/bin/sh\ncat '{log}' >&2\necho 'Host {int(host[1]) + 13} {host[2]} {host[3]}'\n")
    fake.chmod(0o755)
    argv = ["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "-fa", "on", "--dry-run", "--llama-fit-params"]
    assert main([*argv, str(fake)]) == 3
    out = capsys.readouterr().out
    assert re.search(r"<- differs: model -12\.\d\d$", out, re.M) and "differ (marked)" in out, out
    assert "and llama.cpp agree" not in out


def test_dry_run_without_llama_fit_params_exits_4(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No llama-fit-params given, beside --llama-server or on PATH: exit 4 and one line saying how to give one."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run"]) == 4
    err = capsys.readouterr().err
    assert "no llama-fit-params" in err and "--llama-fit-params" in err and "Traceback" not in err


def test_dry_run_disagreement_exits_3(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A projection that differs from the plan is marked and exits 3: a fake llama-fit-params that prints the
    table and log lines llama.cpp prints (common_fit_print, sched_reserve) with a compute buffer 108 MiB larger."""
    fake = tmp_path / "llama-fit-params"
    fake.write_text(
        "#!/bin/sh\necho 'sched_reserve:        CPU compute buffer size =   622.50 MiB' >&2\necho 'Host 222 27 622'\n"
    )
    fake.chmod(0o755)
    assert (
        main(["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run", "--llama-fit-params", str(fake)])
        == 3
    )
    out = capsys.readouterr().out
    assert "<- differs" in out and "differ (marked)" in out and "(-108.00)" in out


def test_dry_run_that_fails_exits_3_with_its_last_words(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "llama-fit-params"
    fake.write_text("#!/bin/sh\necho 'llama_model_load: error loading model: boom' >&2\nexit 1\n")
    fake.chmod(0o755)
    args = ["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run", "--llama-fit-params", str(fake)]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "llama-fit-params failed (exit 1)" in err and "boom" in err


def test_an_empty_llama_fit_params_is_refused_not_taken_as_none(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--llama-fit-params "$FIT"` with FIT unset was taken as no --llama-fit-params at all (exit 4, "put it on
    PATH"); an empty value is refused as every other option's is (exit 2, docs/exit-codes.md)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    for value in ("", " "):
        rc = main(["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run", "--llama-fit-params", value])
        err = capsys.readouterr().err
        assert rc == 2 and "--llama-fit-params" in err and "empty" in err, err


@pytest.mark.parametrize(
    "extra",
    [["--save-calibration"], ["--log", "LOG"], ["--attach", "127.0.0.1:1"]],
    ids=["save-calibration", "log", "attach"],
)
def test_dry_run_refuses_what_it_would_not_do(
    extra: list[str], gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run with --save-calibration, --log or --attach ran the dry run alone and said 0: nothing measured was
    saved, the log or the server named was never read. One mode at a time (exit 2), and nothing is run."""
    fake = tmp_path / "llama-fit-params"
    ran = tmp_path / "ran"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\necho 'Host 222 27 514'\n")
    fake.chmod(0o755)
    log = tmp_path / "server.log"
    log.write_text("llama_context: CPU compute buffer size = 514.50 MiB\n")
    extra = [str(log) if x == "LOG" else x for x in extra]
    args = ["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run", "--llama-fit-params", str(fake)]
    rc = main([*args, *extra])
    err = capsys.readouterr().err
    assert rc == 2 and "--dry-run" in err and extra[0] in err and not ran.exists(), err
    assert len(err.strip().splitlines()) <= 2


def test_log_and_attach_together_are_refused(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--log and --attach: --attach was dropped without a word and the log compared."""
    log = tmp_path / "server.log"
    log.write_text("llama_context: CPU compute buffer size = 514.50 MiB\n")
    rc = main(["verify", "llamacpp", str(gemma_path), "--log", str(log), "--attach", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--log" in err and "--attach" in err, err


def test_dry_run_that_fails_silently_says_so(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A llama-fit-params that exits without a word: the error ended in "(exit 3): " and nothing after it."""
    fake = tmp_path / "llama-fit-params"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    args = ["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "--dry-run", "--llama-fit-params", str(fake)]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "llama-fit-params failed (exit 3, no output)" in err, err


def test_a_log_that_is_no_file_is_refused_or_read_to_its_end(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify llamacpp MODEL --log /dev/zero` read until the machine ran out of memory (killed: exit 137), and
    `--log FIFO` with no writer waited forever. A device is refused, unread (exit 2); a pipe is read to its end
    (`--log <(journalctl ...)`: a FIFO no one writes to is empty: no buffer sizes, exit 2); a log is read up to
    256 MiB (a sparse file past it: refused, not read)."""
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        f.truncate((256 << 20) + 1)  # a hole: no disk used
    for log, what in (("/dev/zero", "a device, not a regular file"), (str(fifo), "no buffer sizes"),
                      (str(big), "more than 256 MiB; not read")):  # fmt: skip
        t0 = time.monotonic()
        assert main(["verify", "llamacpp", str(gemma_path), "--log", log]) == 2
        err = capsys.readouterr().err
        assert what in err and "internal error" not in err and time.monotonic() - t0 < 30, err


@pytest.mark.llama
def test_a_probe_killed_with_the_extra_buffer_types_measures_again_without_them(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-cpp-python's wheel has ggml-cpu's AMX buffer type on an AMX CPU, whose mul_mat faults on some Sapphire
    Rapids machines (ggml-org/llama.cpp#20824): verify said "llama.cpp crashed (exit code -11)" and stopped. A child
    killed by a signal with the extra buffer types on is run once more without them, and the plan compared with it
    is the --no-repack one (here the first child's death is played: the tests keep AMX out, tests/amx_off.c)."""
    from kvadvise.backends.llamacpp import runners

    real = runners._probe
    calls: list[bool] = []

    def probe(model_path: str, cfg: object, *, extra_bufts: bool, timeout_s: float) -> tuple[int, str, str]:
        calls.append(extra_bufts)
        if extra_bufts:
            return -11, "", "sched_reserve: graph: nodes = 727, splits = 1"
        return real(model_path, cfg, extra_bufts=extra_bufts, timeout_s=timeout_s)  # type: ignore[arg-type]

    monkeypatch.setattr(runners, "_probe", probe)
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", "4096")
    assert rc == 0, err
    assert calls == [True, False]
    assert "measuring again without them" in err and "llama.cpp#20824" in err
    assert doc is not None and doc["config"]["cpu_repack"] == "off"
    assert any("--no-repack" in n for n in doc["notes"])
    assert abs(doc["error"]["weights_bytes"]) <= 2 * (MIB // 200 + 1)  # no CPU_REPACK measured, none predicted


@pytest.mark.llama
def test_a_llama_server_killed_with_its_weights_in_the_amx_buffer_is_run_again_with_no_repack(
    gemma_path: Path, real_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A native llama-server on some Sapphire Rapids machines loads the CPU's weights into ggml-cpu's AMX buffer and
    dies of SIGSEGV at its warmup (ggml-org/llama.cpp#20824; the log's last lines: "AMX model buffer size", then the
    warmup). verify said "llama-server stopped while loading: exit code -11"; it runs it once more with --no-repack,
    the AMX buffer left out, and compares with that plan, saying so."""
    server = fake_server(tmp_path, real_log, "amx")
    rc, doc, err = verify(capsys, str(gemma_path), "--ctx", "4096", "-fa", "on", "--llama-server", str(server))
    assert rc == 0, err
    assert "crashed with its CPU weights in the AMX buffer" in err and "--no-repack" in err
    assert doc is not None and doc["config"]["cpu_repack"] == "off"
    assert any("--no-repack" in n for n in doc["notes"])
    assert doc["measured"]["runner"] == "llama-server"
