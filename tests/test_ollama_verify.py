"""`verify`: after launch, is the model 100% on the GPU with the context asked for? Against the fake server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ollama_fake import FakeOllama, closed_port_url, ps_entry, running_fake, tags_entry

from kvadvise.backends.ollama.verify import verify
from kvadvise.errors import BackendUnreachable, InputError

GiB = 1 << 30
FULL = ps_entry("gemma3-270m:latest", size=900_000_000, size_vram=900_000_000, context_length=8192)
SPILLED = ps_entry("qwen3-coder:30b", size=25 * GiB, size_vram=13 * GiB, context_length=65536)


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    with running_fake() as s:
        yield s


def test_fits(fake: FakeOllama) -> None:
    fake.running = [SPILLED, FULL]
    v = verify(fake.url, "gemma3-270m", load=False, num_ctx=8192, predicted_total_bytes=850_000_000)
    assert v.loaded and v.fits and v.reasons == ()
    assert (v.name, v.size, v.size_vram, v.context_length, v.processor) == (
        "gemma3-270m:latest",
        900_000_000,
        900_000_000,
        8192,
        "100% GPU",
    )
    assert v.predicted_total_bytes == 850_000_000 and v.difference_bytes == 50_000_000
    assert [r[:2] for r in fake.requests] == [("GET", "/api/ps")]  # no load asked, none done


def test_spilled(fake: FakeOllama) -> None:
    fake.running = [SPILLED]
    v = verify(fake.url, "qwen3-coder:30b", load=False, num_ctx=65536, predicted_total_bytes=None)
    assert v.loaded and not v.fits
    assert v.processor == "48%/52% CPU/GPU" and v.difference_bytes is None
    assert any("spilled" in r and "48%/52% CPU/GPU" in r for r in v.reasons)


def test_not_loaded(fake: FakeOllama) -> None:
    fake.running = [SPILLED]
    v = verify(fake.url, "gemma3-270m", load=False, num_ctx=8192, predicted_total_bytes=1)
    assert not v.loaded and not v.fits and v.processor == "" and v.size == 0
    assert any("is not loaded" in r and "qwen3-coder:30b" in r for r in v.reasons)
    assert any("--load" in r for r in v.reasons)


def test_context_differs(fake: FakeOllama) -> None:
    fake.running = [FULL]
    v = verify(fake.url, "gemma3-270m:latest", load=False, num_ctx=32768, predicted_total_bytes=None)
    assert v.loaded and not v.fits and v.processor == "100% GPU"
    assert any("context 8,192, asked 32,768" in r for r in v.reasons)
    assert verify(fake.url, "gemma3-270m", load=False, num_ctx=None, predicted_total_bytes=None).fits


def test_load_then_check(fake: FakeOllama) -> None:
    fake.loads["gemma3-270m:latest"] = FULL
    v = verify(fake.url, "gemma3-270m", load=True, num_ctx=16384, predicted_total_bytes=None, keep_alive="10m")
    method, path, body = fake.requests[0]
    assert (method, path) == ("POST", "/api/generate")
    assert body == {
        "model": "gemma3-270m",
        "prompt": "",
        "stream": False,
        "keep_alive": "10m",
        "options": {"num_ctx": 16384},
    }
    assert fake.requests[1][:2] == ("GET", "/api/ps")
    assert v.loaded and v.fits and v.context_length == 16384


def test_load_clamped_context(fake: FakeOllama) -> None:
    """A server that runs another context than asked (Ollama clamps num_ctx to n_ctx_train)."""
    fake.loads["gemma3-270m:latest"] = {**FULL, "context_length": 32768, "fixed_context": True}
    v = verify(fake.url, "gemma3-270m", load=True, num_ctx=65536, predicted_total_bytes=None)
    assert v.loaded and not v.fits and v.context_length == 32768


def test_load_spilled(fake: FakeOllama) -> None:
    fake.loads["qwen3-coder:30b"] = SPILLED
    v = verify(fake.url, "qwen3-coder:30b", load=True, num_ctx=65536, predicted_total_bytes=24 * GiB)
    assert not v.fits and v.difference_bytes == 1 * GiB


def test_load_unknown_model(fake: FakeOllama) -> None:
    with pytest.raises(InputError, match="does not have nope:latest") as e:
        verify(fake.url, "nope", load=True, num_ctx=4096, predicted_total_bytes=None)
    assert e.value.hint == "ollama pull nope:latest"


def test_load_failure_is_reported(fake: FakeOllama) -> None:
    fake.fail("/api/generate", 400, "model requires more system memory (30.1 GiB) than is available (12.0 GiB)")
    v = verify(fake.url, "qwen3-coder:30b", load=True, num_ctx=65536, predicted_total_bytes=None)
    assert not v.loaded and not v.fits
    assert any("more system memory" in r for r in v.reasons)


def test_load_crash_is_reported_not_unreachable(fake: FakeOllama) -> None:
    fake.fail("/api/generate", 500, "llama runner process has terminated: cudaMalloc failed: out of memory")
    v = verify(fake.url, "qwen3-coder:30b", load=True, num_ctx=65536, predicted_total_bytes=None)
    assert not v.loaded and not v.fits
    assert any("HTTP 500" in r and "out of memory" in r for r in v.reasons)


def test_server_down() -> None:
    with pytest.raises(BackendUnreachable) as e:
        verify(closed_port_url(), "gemma3-270m", load=False, num_ctx=None, predicted_total_bytes=None)
    assert e.value.exit_code == 4 and "\n" not in e.value.message


def test_server_down_during_load() -> None:
    with pytest.raises(BackendUnreachable):
        verify(closed_port_url(), "gemma3-270m", load=True, num_ctx=4096, predicted_total_bytes=None)


def test_server_error_on_ps(fake: FakeOllama) -> None:
    fake.fail("/api/ps", 500, "boom")
    with pytest.raises(BackendUnreachable, match="500"):
        verify(fake.url, "gemma3-270m", load=False, num_ctx=None, predicted_total_bytes=None)


# --- issue 13: digest, old servers, a measured generate, the server's real cache type -------------


def test_matched_by_digest(fake: FakeOllama) -> None:
    fake.running = [ps_entry("qwen3-coder:30b", size=20 * GiB, size_vram=20 * GiB, context_length=65536)]
    digest = fake.running[0]["digest"]
    v = verify(fake.url, "qwen3-coder:latest", load=False, num_ctx=65536, predicted_total_bytes=None, digest=digest)
    assert v.loaded and v.fits and v.matched_by == "digest" and v.name == "qwen3-coder:30b"
    assert any("the same digest" in r for r in v.reasons)
    other = verify(fake.url, "qwen3-coder:latest", load=False, num_ctx=65536, predicted_total_bytes=None)
    assert not other.loaded  # without the digest the names differ


def test_old_server_without_context_length_is_not_a_failure(fake: FakeOllama) -> None:
    entry = dict(FULL)
    del entry["context_length"]
    fake.running = [entry]
    v = verify(fake.url, "gemma3-270m", load=False, num_ctx=8192, predicted_total_bytes=None)
    assert v.loaded and v.fits and not v.context_checked
    assert any("cannot be checked" in r and "v0.9.7" in r for r in v.reasons)


def test_short_generate_measures_speed(fake: FakeOllama) -> None:
    fake.loads["gemma3-270m:latest"] = FULL
    v = verify(fake.url, "gemma3-270m", load=True, num_ctx=8192, predicted_total_bytes=None, measure_speed=True)
    assert v.fits and v.prompt_tokens_per_s == pytest.approx(2000) and v.decode_tokens_per_s == pytest.approx(50)
    gen = [b for m, p, b in fake.requests if p == "/api/generate" and b.get("prompt")]
    assert gen and gen[0]["options"]["num_predict"] == 64 and gen[0]["options"]["num_ctx"] == 8192


def test_server_kv_cache_type_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvadvise.backends.ollama.config import server_kv_cache_type

    none = tmp_path / "none"
    monkeypatch.delenv("OLLAMA_KV_CACHE_TYPE", raising=False)
    assert server_kv_cache_type("q4_0", None, none) == ("q4_0", "--kv-cache-type")
    env = tmp_path / "ollama.env"
    env.write_text("OLLAMA_FLASH_ATTENTION=1\nOLLAMA_KV_CACHE_TYPE=q8_0\n")
    assert server_kv_cache_type(None, env, none)[0] == "q8_0"
    d = tmp_path / "ollama.service.d"
    d.mkdir()
    (d / "override.conf").write_text('[Service]\nEnvironment="OLLAMA_KV_CACHE_TYPE=q4_0"\n')
    (d / "zz-kvadvise.conf").write_text('[Service]\nEnvironment="OLLAMA_KV_CACHE_TYPE=q8_0"\n')
    kv, src = server_kv_cache_type(None, None, d)
    assert kv == "q8_0" and "zz-kvadvise.conf" in src  # the last drop-in wins, as in systemd
    assert server_kv_cache_type(None, None, none)[0] == "f16"
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "Q8_0")
    assert server_kv_cache_type(None, None, none)[0] == "q8_0"


@pytest.mark.parametrize(("runner_bytes", "fits"), [(880_000_000, True), (100_000_000, False)])
def test_nvml_cross_checks_the_runner(
    runner_bytes: int, fits: bool, fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """/api/ps says 100% GPU; NVML says how much the Ollama runner really holds (ollama/ollama#7323, #9704):
    the llama-server `ollama serve` started for this model's blob (tests/fake_runner.py)."""
    import sys

    from fake_runner import running
    from test_hardware import FakeDevice, FakeNVML, FakeProc

    blob = str(tmp_path / "blobs" / ("sha256-" + "c" * 64))
    with running(tmp_path / "procs", serve_blob=blob) as p:
        pid = p.pids["llama-server"]
        nvml = FakeNVML([FakeDevice(b"NVIDIA GeForce RTX 4090", 24 * GiB, compute=[FakeProc(pid, runner_bytes)])])
        monkeypatch.setitem(sys.modules, "pynvml", nvml.module())
        fake.running = [FULL]
        v = verify(fake.url, "gemma3-270m", load=False, num_ctx=8192, predicted_total_bytes=None, model_path=blob)
    assert v.processor == "100% GPU" and v.fits is fits and v.runner_pid == pid
    assert any(f"runner (pid {pid}) holding only 100,000,000 B" in r for r in v.reasons) is (not fits)


def test_verify_prints_the_estimate_beside_the_measure(
    fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On a machine whose GPU the card list knows (here an RTX 4090 stands in for NVML), the decode
    estimate is printed beside Ollama's measured tokens/s."""
    import json

    from kvadvise.cli import main
    from kvadvise.planner import hardware

    monkeypatch.setattr(hardware, "probe", lambda: hardware.from_profile("rtx-4090"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))  # no store: the built-in profile plans the model
    fake.loads["llama3.1:8b"] = ps_entry("llama3.1:8b", size=6 * GiB, size_vram=6 * GiB, context_length=8192)
    argv = ["verify", "ollama", "llama3.1:8b", "--host", fake.url, "--load", "--num-ctx", "8192"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decode_tokens_per_s"] == pytest.approx(50) and doc["decode_estimate_tokens_per_s"] > 50
    assert main(argv) == 0
    assert "measured / estimated = " in capsys.readouterr().out


# --- issue 29.2: names resolved through /api/tags digests and the library's aliases, on a remote server ----

CODER_DIGEST = "9b1a8e0a3c1d4b7f2e6d5c4b3a29180716f5e4d3c2b1a09f8e7d6c5b4a392817"  # one manifest, two names


def _remote(fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A server whose store is not on this machine: no local manifests; the server knows no /api/show."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store-here"))
    monkeypatch.setenv("OLLAMA_HOST", fake.url)


def _coder_ps(name: str, ctx: int = 65536) -> dict[str, object]:
    return {**ps_entry(name, size=20 * GiB, size_vram=20 * GiB, context_length=ctx), "digest": CODER_DIGEST}


@pytest.mark.parametrize("asked", ["qwen3-coder:30b", "qwen3-coder"])
def test_remote_server_matched_by_the_digest_it_lists(
    asked: str, fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ollama run qwen3-coder` loaded the model as qwen3-coder:latest; the user asks for qwen3-coder:30b. The
    server (not this machine's store) lists both names with one digest: matched by that digest."""
    import json

    from kvadvise.cli import main

    _remote(fake, monkeypatch, tmp_path)
    fake.tags = [tags_entry("qwen3-coder:latest", CODER_DIGEST), tags_entry("qwen3-coder:30b", CODER_DIGEST)]
    fake.running = [FULL, _coder_ps("qwen3-coder:latest" if asked.endswith(":30b") else "qwen3-coder:30b")]
    assert main(["verify", "ollama", asked, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["loaded"] and doc["fits"] and doc["matched_by"] == "digest"
    # the server is asked first whether it is up (verify needs it), then for the model
    assert [p for _m, p, _b in fake.requests] == ["/api/version", "/api/show", "/api/ps", "/api/tags"]


def test_remote_server_listing_one_name_is_matched_by_the_library_alias(
    fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only qwen3-coder:latest was pulled: the server does not list qwen3-coder:30b, so no digest is known for
    it; Ollama's library names the two as one model (the built-in profile's alias): matched, and said so."""
    from kvadvise.backends.ollama.resolve import library_names

    _remote(fake, monkeypatch, tmp_path)
    fake.tags = [tags_entry("qwen3-coder:latest", CODER_DIGEST), tags_entry("gemma3-270m:latest", "ab" * 32)]
    fake.running = [_coder_ps("qwen3-coder:latest")]
    aliases = library_names("qwen3-coder:30b")
    assert aliases == ("qwen3-coder:latest",)
    v = verify(fake.url, "qwen3-coder:30b", load=False, num_ctx=65536, predicted_total_bytes=None, aliases=aliases)
    assert v.loaded and v.fits and v.matched_by == "alias" and v.name == "qwen3-coder:latest"
    assert any("qwen3-coder:latest in Ollama's library" in r and "does not list" in r for r in v.reasons)
    # another model loaded under its own name is not taken for it
    fake.running = [FULL]
    v = verify(fake.url, "qwen3-coder:30b", load=False, num_ctx=65536, predicted_total_bytes=None, aliases=aliases)
    assert not v.loaded and any("gemma3-270m:latest" in r for r in v.reasons)


def test_load_by_a_name_the_server_lists_under_another(fake: FakeOllama) -> None:
    """--load qwen3-coder:30b on a server that has only qwen3-coder:latest: it loads that one (the /api/tags
    digest, else the library alias) instead of stopping at "does not have"."""
    fake.tags = [tags_entry("qwen3-coder:latest", CODER_DIGEST)]
    fake.loads["qwen3-coder:latest"] = _coder_ps("qwen3-coder:latest")
    v = verify(fake.url, "qwen3-coder:30b", load=True, num_ctx=65536, predicted_total_bytes=None, digest=CODER_DIGEST)
    loads = [b["model"] for m, p, b in fake.requests if p == "/api/generate"]
    assert loads == ["qwen3-coder:30b", "qwen3-coder:latest"]
    assert v.loaded and v.fits and v.matched_by == "digest"
    assert any("loaded qwen3-coder:latest (the same digest)" in r for r in v.reasons)
    with pytest.raises(InputError, match="does not have nope:latest"):
        verify(fake.url, "nope", load=True, num_ctx=4096, predicted_total_bytes=None, aliases=("nope:1b",))


def test_predicted_at_the_context_the_server_reports(
    fake: FakeOllama, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --num-ctx and no num_ctx in the model: the runner holds the context Ollama chose (OLLAMA_CONTEXT_LENGTH,
    or its VRAM tier), which /api/ps reports: the prediction is for that context, not for none."""
    import json

    from kvadvise.backends.ollama import rules
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.cli import main
    from kvadvise.planner.memory import estimate

    _remote(fake, monkeypatch, tmp_path)
    fake.tags = [tags_entry("qwen3-coder:30b", CODER_DIGEST)]
    fake.running = [_coder_ps("qwen3-coder:30b", ctx=32768)]
    assert main(["verify", "ollama", "qwen3-coder:30b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    spec = resolve("qwen3-coder:30b", use_api=False).spec
    want = estimate(spec, rules.run_config(32768, 1, "f16")).total_bytes
    assert doc["predicted_ctx"] == 32768 and doc["predicted_total_bytes"] == want
    assert doc["difference_bytes"] == 20 * GiB - want
    # asked for 65,536, the server runs 32,768 (a clamp, or an earlier load): flagged, and predicted at 32,768
    assert main(["verify", "ollama", "qwen3-coder:30b", "--num-ctx", "65536"]) == 3
    out = capsys.readouterr().out
    assert f"predicted {want / 1e9:.2f} GB at context 32,768" in out and "context 32,768, asked 65,536" in out


def test_a_server_failing_api_tags_still_verifies(fake: FakeOllama) -> None:
    """/api/tags is asked only when no name matches; a server that fails it (4xx or 5xx) is still verified from
    /api/ps: by the store's digest, the library alias, or "not loaded"."""
    fake.fail("/api/tags", 500, "boom")
    fake.running = [_coder_ps("qwen3-coder:latest")]
    v = verify(fake.url, "qwen3-coder:30b", load=False, num_ctx=65536, predicted_total_bytes=None)
    assert not v.loaded and any("is not loaded" in r for r in v.reasons)
    v = verify(
        fake.url, "qwen3-coder:30b", load=False, num_ctx=65536, predicted_total_bytes=None, aliases=("qwen3-coder",)
    )
    assert v.loaded and v.matched_by == "alias"


@pytest.mark.parametrize("name", ["", " ", "a b", "x\x00y"])
def test_a_name_that_is_no_name_is_refused_before_the_server_is_asked(
    name: str, fake: FakeOllama, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`verify ollama ""` (an unset shell variable) asked the server, and with none up said exit 4, "start it":
    the name is refused first (exit 2), as `kvadvise ollama ""` refuses it; the server is never asked."""
    from kvadvise.cli import main

    for host in (fake.url, closed_port_url()):
        monkeypatch.setenv("OLLAMA_HOST", host)
        fake.requests.clear()
        rc = main(["verify", "ollama", name])
        err = capsys.readouterr().err
        assert rc == 2 and ("empty model name" in err or "not a valid Ollama model name" in err), err
        assert fake.requests == []
