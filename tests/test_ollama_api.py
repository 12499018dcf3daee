"""A running Ollama server, faked on 127.0.0.1: /api/show, /api/ps, /api/version, and every way it can fail."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ollama_fake import Failure, FakeOllama, closed_port_url, ps_entry, running_fake, show_payload

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama.api import (
    normalize_host,
    parse_parameters,
    processor,
    running_models,
    server_version,
    show_model,
    version_warning,
)
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import GGUFHeader, read_file

GiB = 1 << 30
PARAMETERS = 'stop                           "<end_of_turn>"\ntemperature                    1\ntop_k                          64\ntop_p                          0.95'


@pytest.fixture(scope="session")
def gemma_header(gemma_path: Path) -> GGUFHeader:
    return read_file(gemma_path)


@pytest.fixture
def fake(gemma_header: GGUFHeader) -> Iterator[FakeOllama]:
    state = FakeOllama()
    state.shows["gemma3-270m:latest"] = show_payload(gemma_header, parameters=PARAMETERS)
    with running_fake(state) as s:
        yield s


# --- the host -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:11435", "http://127.0.0.1:11435"),
        (":8080", "http://127.0.0.1:8080"),
        ("gpu-box", "http://gpu-box:11434"),
        ("gpu-box:1234", "http://gpu-box:1234"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://ollama.example.com", "https://ollama.example.com:443"),
        ("https://ollama.example.com:8443/ollama/", "https://ollama.example.com:8443/ollama"),
        ("[::]:11434", "http://[::1]:11434"),
        ("[fe80::1]", "http://[fe80::1]:11434"),
        ("::1", "http://[::1]:11434"),
        ("  127.0.0.1:11434 ", "http://127.0.0.1:11434"),
        # envconfig.Host reads the port with strconv.ParseInt(port, 10, 32): leading zeros are decimal
        ("127.0.0.1:011434", "http://127.0.0.1:11434"),
        ("[::1]:00000000011434", "http://[::1]:11434"),
    ],
)
def test_normalize_host(raw: str | None, url: str) -> None:
    assert normalize_host(raw) == url


@pytest.mark.parametrize(
    "raw",
    ["host:notaport", "host:0", "host:70000", "ftp://host", "[::1", "host:+11434", "host:000", "host:" + "9" * 5000],
)
def test_bad_host(raw: str) -> None:
    with pytest.raises(InputError, match="OLLAMA_HOST"):
        normalize_host(raw)


# --- /api/show ----------------------------------------------------------------------


def test_show_gives_the_same_spec_as_the_file(fake: FakeOllama, gemma_header: GGUFHeader) -> None:
    shown = show_model(fake.url, "gemma3-270m:latest")
    assert shown is not None
    api_spec, file_spec = from_gguf(shown.header), from_gguf(gemma_header)
    for f in ("architecture", "n_layer_all", "n_embd", "n_vocab", "n_ctx_train", "n_head", "n_head_kv"):
        assert getattr(api_spec, f) == getattr(file_spec, f), f
    for f in ("n_embd_head_k", "n_swa", "swa_layers", "kv_layers", "file_type"):
        assert getattr(api_spec, f) == getattr(file_spec, f), f
    # the tensor list gives the weights, to the byte
    assert api_spec.weights_bytes == file_spec.weights_bytes
    assert api_spec.tok_embd_bytes == file_spec.tok_embd_bytes
    assert shown.params == {"stop": ["<end_of_turn>"], "temperature": 1, "top_k": 64, "top_p": 0.95}
    assert shown.details["quantization_level"] == "Q8_0"
    body = fake.requests[-1][2]
    assert body == {"model": "gemma3-270m:latest", "verbose": True}  # verbose: arrays are not cut


def test_show_without_tensors_or_with_cut_arrays(fake: FakeOllama, gemma_header: GGUFHeader) -> None:
    payload = show_payload(gemma_header)
    payload["tensors"] = []
    payload["model_info"]["tokenizer.ggml.tokens"] = []  # what a non-verbose answer holds
    fake.shows["cut:latest"] = payload
    shown = show_model(fake.url, "cut:latest")
    assert shown is not None
    spec = from_gguf(shown.header)
    assert spec.weights_bytes == 0 and any("no tensors" in n for n in shown.notes)
    assert spec.n_vocab == 0  # neither tokens nor a vocab_size nor token_embd: unknown, not a wrong number


def test_show_404_is_none(fake: FakeOllama) -> None:
    assert show_model(fake.url, "nope:latest") is None


def test_show_500_is_unreachable_naming_the_host(fake: FakeOllama) -> None:
    fake.fail("/api/show", 500, "llama runner process has terminated")
    with pytest.raises(BackendUnreachable) as e:
        show_model(fake.url, "gemma3-270m:latest")
    assert fake.url in e.value.message and "500" in e.value.message and "\n" not in e.value.message


def test_show_400_is_input_error(fake: FakeOllama) -> None:
    fake.fail("/api/show", 400, "invalid model name")
    with pytest.raises(InputError, match="invalid model name"):
        show_model(fake.url, "gemma3-270m:latest")


def test_non_json_answer(fake: FakeOllama) -> None:
    fake.not_json("/api/show")
    with pytest.raises(BackendUnreachable, match="not JSON"):
        show_model(fake.url, "gemma3-270m:latest")


def test_slow_answer_times_out(fake: FakeOllama) -> None:
    fake.delays["/api/ps"] = 2.0
    t0 = time.monotonic()
    with pytest.raises(BackendUnreachable, match="did not answer"):
        running_models(fake.url, timeout=0.2)
    assert time.monotonic() - t0 < 1.5


def test_server_down() -> None:
    url = closed_port_url()
    for call in (lambda: running_models(url), lambda: server_version(url), lambda: show_model(url, "x")):
        with pytest.raises(BackendUnreachable) as e:
            call()
        assert url in e.value.message and "refused" in e.value.message
        assert e.value.exit_code == 4


def test_parse_parameters() -> None:
    text = (
        'num_keep                       24\nstop                           "<|start_header_id|>"\n'
        'stop                           "<|eot_id|>"\ntemperature                    0.6\nnum_ctx                        8192\n'
        "use_mmap                       false\n"
    )
    assert parse_parameters(text) == {
        "num_keep": 24,
        "stop": ["<|start_header_id|>", "<|eot_id|>"],
        "temperature": 0.6,
        "num_ctx": 8192,
        "use_mmap": False,
    }
    assert parse_parameters(None) == {} and parse_parameters("") == {}


# --- /api/ps ------------------------------------------------------------------------


def test_running_models(fake: FakeOllama) -> None:
    fake.running = [
        ps_entry("gemma3-270m:latest", size=800_000_000, size_vram=800_000_000, context_length=8192),
        ps_entry("qwen3-coder:30b", size=25 * GiB, size_vram=13 * GiB, context_length=65536, family="qwen3moe"),
    ]
    a, b = running_models(fake.url)
    assert (a.name, a.size, a.size_vram, a.context_length, a.processor) == (
        "gemma3-270m:latest",
        800_000_000,
        800_000_000,
        8192,
        "100% GPU",
    )
    assert b.processor == "48%/52% CPU/GPU" and b.size_cpu == 12 * GiB
    assert b.details["family"] == "qwen3moe" and b.expires_at.startswith("2026-") and len(b.digest) == 64


def test_running_models_empty_or_null(fake: FakeOllama) -> None:
    assert running_models(fake.url) == ()
    fake.failures["/api/ps"] = Failure(200, '{"models": null}')
    assert running_models(fake.url) == ()
    fake.failures["/api/ps"] = Failure(200, '{"models": [{"name": "x"}]}')
    with pytest.raises(BackendUnreachable, match="unexpected payload"):
        running_models(fake.url)


@pytest.mark.parametrize(
    ("size", "vram", "shown"),
    [
        (5_137_025_024, 5_137_025_024, "100% GPU"),  # memory-spec §6.d sample: size == size_vram
        (5_137_025_024, 0, "100% CPU"),
        (0, 0, "100% CPU"),  # size_vram == 0 is tested first
        (100, 52, "48%/52% CPU/GPU"),  # memory-spec §6.e example
        (100, 72, "28%/72% CPU/GPU"),  # issue #5 example
        (52 * 10**9, 49_920_000_000, "4%/96% CPU/GPU"),  # ollama#10128: 52 GB, 4%/96%
        (29 * 10**9, 24_360_000_000, "16%/84% CPU/GPU"),  # ollama#6160: 29 GB, 16%/84%
        (8, 7, "13%/87% CPU/GPU"),  # 12.5: Go's math.Round goes half away from zero (Python's round: 12)
        (8, 5, "38%/62% CPU/GPU"),  # 37.5
        (100, 101, "Unknown"),  # size_vram > size
        (0, 5, "Unknown"),
        (1000, 999, "0%/100% CPU/GPU"),
    ],
)
def test_processor_like_ollama_ps(size: int, vram: int, shown: str) -> None:
    assert processor(size, vram) == shown


# --- /api/version ---------------------------------------------------------------------


def test_server_version(fake: FakeOllama) -> None:
    assert server_version(fake.url) == "0.32.7"
    fake.version = ""
    assert server_version(fake.url) is None
    fake.fail("/api/version", 404, "not found")
    assert server_version(fake.url) is None


@pytest.mark.parametrize(
    ("version", "warns"),
    [
        ("0.5.7", True),
        ("0.12.3", True),
        ("0.29.9", True),
        ("v0.29.0-rc2", True),
        ("0.30.0", False),
        ("0.30.0-rc1", False),
        ("0.32.7", False),
        ("1.0.0", False),
        ("0.0.0", False),  # a development build
        ("unknown", False),
        (None, False),
        ("", False),
    ],
)
def test_version_warning(version: str | None, warns: bool) -> None:
    w = version_warning(version)
    assert (w is not None) == warns
    if w:
        assert version is not None
        assert "f16" in w and "OLLAMA_FLASH_ATTENTION=1" in w and version in w


def test_boundary_is_0_30() -> None:
    assert ollama_api.KV_FALLBACK_FIXED_IN == (0, 30, 0)


def test_host_none_reads_ollama_host(fake: FakeOllama, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"0.0.0.0:{fake.port}")  # what `ollama serve` binds; means this machine
    assert ollama_api.server_url(None) == fake.url
    assert server_version(None) == "0.32.7" and running_models() == ()


def test_cloud_model_without_model_info(fake: FakeOllama) -> None:
    fake.shows["gpt-oss:120b-cloud"] = {
        "model_info": {},
        "details": {"format": ""},
        "remote_host": "https://ollama.com",
    }
    with pytest.raises(InputError, match="no GGUF metadata"):
        show_model(fake.url, "gpt-oss:120b-cloud")


# --- the transport: the standard library's client, one for the API and remote headers ----------------

_IMPORT_PROBE = (
    "import sys; from kvadvise.cli import main; rc = main({argv!r}); "
    "print(rc, sorted(m for m in ('ollama', 'httpx', 'pydantic', 'http.client', 'urllib.request') if m in sys.modules))"
)


@pytest.mark.parametrize(
    ("server", "argv", "imported"),
    [
        ("down", ["ollama", "qwen3-coder", "--gpu", "4090", "--json"], []),
        ("up", ["ollama", "qwen3-coder", "--gpu", "4090", "--json"], ["http.client"]),
        ("up", ["ollama", "gemma3-270m", "--gpu", "4090", "--json"], ["http.client"]),
        ("up", ["ollama", "--installed", "--gpu", "4090", "--json"], ["http.client"]),
    ],
)
def test_no_official_client_and_no_urllib_for_a_local_server(
    server: str, argv: list[str], imported: list[str], fake: FakeOllama, tmp_path: Path
) -> None:
    """The `ollama` package (pydantic, httpx) is imported on no path; a server on this machine costs
    http.client alone, imported only once it accepted the connection (no server: not even that)."""
    import subprocess
    import sys

    host = fake.url if server == "up" else closed_port_url()
    fake.failures["/api/tags"] = Failure(200, '{"models": []}')  # the fake lists nothing
    code = _IMPORT_PROBE.format(argv=[*argv, "--host", host])
    # the registry is another server (kvadvise.backends.ollama.registry): not asked here
    env = {
        "OLLAMA_MODELS": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KVADVISE_OLLAMA_REGISTRY": "off",
    }
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout.strip().splitlines()[-1] == f"0 {imported}", p.stderr
    if server == "up":
        assert {path for _, path, _ in fake.requests} >= {"/api/show", "/api/ps", "/api/version"} - (
            {"/api/show"} if "--installed" in argv else set()
        )


def test_api_key_goes_as_a_bearer_token_to_the_servers_origin_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """OLLAMA_API_KEY as the official client sends it (Authorization: Bearer); a redirect to another
    origin (another port here) follows without it, as httpx and the browsers do."""
    from fault_server import Answer, serving

    monkeypatch.setenv("OLLAMA_API_KEY", "k3y-never-shown")
    with serving(lambda method, path: Answer(200, b'{"version": "0.32.7"}')) as target:
        moved = Answer(307, b"", {"Location": target.url + "/api/version"})
        with serving(lambda method, path: moved) as first:
            assert server_version(first.url) == "0.32.7"
    assert [r.headers.get("authorization") for r in first.requests] == ["Bearer k3y-never-shown"]
    assert [r.headers.get("authorization") for r in target.requests] == [None]
    assert first.requests[0].headers["user-agent"] == "kvadvise"


def test_proxies_of_the_environment_serve_remote_servers_never_this_machine(
    fake: FakeOllama, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fault_server import Answer, serving

    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with serving(lambda method, path: Answer(200, b'{"version": "9.9.9"}')) as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        assert server_version(fake.url) == "0.32.7" and proxy.requests == []  # loopback: straight to it
        assert server_version("http://ollama.example:11434") == "9.9.9"  # anywhere else: through the proxy
    assert [r.path for r in proxy.requests] == ["http://ollama.example:11434/api/version"]


def test_redirects_keep_a_post_only_where_http_says_so() -> None:
    """307/308 repeat the POST with its body; 303 (and 301/302 after a POST) continue as a GET (RFC 9110 §15.4)."""
    import json

    from fault_server import Answer, serving

    for status, method in ((307, "POST"), (308, "POST"), (303, "GET"), (302, "GET")):
        with serving(lambda m, path: Answer(200, json.dumps({"method": m}).encode())) as to:
            moved = Answer(status, b"", {"Location": to.url + "/api/show"})
            with serving(lambda m, path, moved=moved: moved) as first:
                doc = ollama_api.call(first.url, "POST", "/api/show", body={"model": "m"})
        assert doc == {"method": method} and [r.method for r in to.requests] == [method], status


@pytest.mark.parametrize("raw", ["a b", "host:0", "ftp://host", "[::1"])
def test_a_bad_host_flag_is_named_as_the_flag(
    raw: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--host 'a b'` said "OLLAMA_HOST 'a b': not a host name", a variable the user may not have set (and if set,
    not the value refused): the error names --host when --host gave it, OLLAMA_HOST when the environment did."""
    from kvadvise.cli import main

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    for args in (["ollama", "qwen3:8b", "--gpu", "rtx-4090"], ["verify", "ollama", "qwen3:8b"]):
        rc = main([*args, "--host", raw])
        err = capsys.readouterr().err
        assert rc == 2 and f"--host {raw!r}" in err and "OLLAMA_HOST" not in err, err
    monkeypatch.setenv("OLLAMA_HOST", raw)
    rc = main(["ollama", "qwen3:8b", "--gpu", "rtx-4090"])
    err = capsys.readouterr().err
    assert rc == 2 and f"OLLAMA_HOST {raw!r}" in err, err
