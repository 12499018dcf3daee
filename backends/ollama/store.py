"""Ollama's on-disk model store: manifests and blobs, read without a server.

Layout (memory-spec.md §6.f; Ollama ``manifest/``, ``envconfig.Models()``):
``<root>/manifests/<host>/<namespace>/<model>/<tag>`` is a JSON manifest whose
layers name blobs by digest; ``<root>/blobs/sha256-<hex>`` holds each blob.
The ``application/vnd.ollama.image.model`` layer is the GGUF, the ``params``
layer a JSON map of default options, a ``projector`` layer a vision
projector (its memory counts).

Everything read here comes from files other programs wrote, so: every digest
is checked against ``^sha256[:-][0-9a-fA-F]{64}$`` before it becomes a path,
no manifest or blob may resolve (through symlinks) outside the store root,
and JSON files are size-capped before they are parsed.

A store, or a folder of one, that cannot be entered (the Linux service's
store under /usr/share/ollama, mode 0750, for a user outside the ``ollama``
group) is skipped and named (:func:`skipped`, :attr:`Manifests.skipped`),
never the end of the command: the other stores, the server and the built-in
profiles still plan.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvadvise.backends.ollama.name import OllamaName
from kvadvise.errors import InputError
from kvadvise.files import load_json, open_regular

MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_PARAMS = "application/vnd.ollama.image.params"
MEDIA_PROJECTOR = "application/vnd.ollama.image.projector"
MEDIA_ADAPTER = "application/vnd.ollama.image.adapter"
MEDIA_DRAFT = "application/vnd.ollama.image.draft"
MEDIA_TENSOR = "application/vnd.ollama.image.tensor"

DIGEST_RE = re.compile(r"^sha256[:-][0-9a-fA-F]{64}$")
MAX_JSON_BYTES = 4 << 20  # manifests, params and config blobs are a few KB
MAX_PARAMS_LAYERS = 16  # a real manifest has one

SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux install script's `ollama` user


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of a manifest: a blob by media type, digest and size."""

    media_type: str
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """What the store holds for one model name."""

    root: Path
    manifest_path: Path
    manifest_digest: str  # sha256 hex of the manifest bytes: the ID `ollama ps` / `ollama list` show
    model_blob: Path
    model_bytes: int  # size of the GGUF blob
    params: dict[str, Any]  # the params layer: the model's default options
    projector_bytes: int  # projector blobs, 0 without
    config: dict[str, Any]  # the config blob (ConfigV2): model_family, file_type, ...
    notes: tuple[str, ...]
    projector_blob: Path | None = None  # the (first) projector blob on disk: an mmproj GGUF


def store_roots() -> tuple[Path, ...]:
    """Where to look: ``$OLLAMA_MODELS`` alone when set, else ``~/.ollama/models`` then the service's store."""
    env = os.environ.get("OLLAMA_MODELS", "").strip()
    if env:
        return (Path(env).expanduser(),)
    return (Path("~/.ollama/models").expanduser(), SERVICE_STORE)


def check_digest(digest: object, where: str) -> str:
    """The digest if it is a well-formed sha256 digest; InputError otherwise (never a path)."""
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        shown = repr(digest)[:100]
        raise InputError(f"{where}: invalid blob digest {shown} (expected sha256:<64 hex digits>)")
    return digest


def blob_path(root: Path, digest: str, where: str) -> Path:
    """``<root>/blobs/sha256-<hex>`` for a checked digest; refuses one that leaves the store."""
    d = check_digest(digest, where)
    path = root / "blobs" / ("sha256-" + d[7:])  # Ollama: strings.ReplaceAll(digest, ":", "-")
    return _inside(root, path, where)


@functools.lru_cache(maxsize=16)
def _real_root(root: Path) -> str:
    """The store's own real path: resolved once per process, not for each of a listing's thousand blobs."""
    return os.path.realpath(root)


def _inside(root: Path, path: Path, where: str) -> Path:
    real_root = _real_root(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise InputError(
            f"{where}: {path} resolves to {real}, outside the model store {real_root}; refusing to read it",
            hint="a symlink in the store points elsewhere; remove it and `ollama pull` the model again",
        )
    return path


def skipped_note(root: Path, what: str) -> str:
    """A note for a store (or a folder of it, ``what``) that could not be read."""
    if root == SERVICE_STORE:
        return f"skipped {what}: the Linux service's store belongs to the `ollama` user (join its group)"
    return f"skipped {what}"


def _why(e: OSError) -> str:
    return "permission denied" if isinstance(e, PermissionError) else (e.strerror or type(e).__name__)


def _manifest(root: Path, name: OllamaName) -> Path:
    return root / "manifests" / Path(*name.manifest_parts())


def _probe(path: Path) -> OSError | None:
    """The error of an lstat of ``path`` (None when it exists): ENOENT or ENOTDIR when it is not there,
    EACCES when a folder on the way cannot be searched."""
    try:
        os.lstat(path)
    except OSError as e:
        return e
    return None


def find(name: OllamaName, roots: Sequence[Path] | None = None) -> StoreEntry | None:
    """The model ``name`` in the first store that has its manifest; None when no store has it (a store
    that cannot be searched is passed over: :func:`skipped` says which)."""
    for root in store_roots() if roots is None else roots:
        manifest = _manifest(root, name)
        if _probe(manifest) is not None or not os.path.isdir(root):
            continue
        return _read_entry(root, manifest, name)
    return None


def skipped(name: OllamaName, roots: Sequence[Path]) -> tuple[str, ...]:
    """The stores :func:`find` passed over for ``name`` because it could not look in them, and why."""
    out = []
    for root in roots:
        e = _probe(_manifest(root, name))
        if e is not None and not isinstance(e, (FileNotFoundError, NotADirectoryError)):
            out.append(skipped_note(root, f"the model store {root} ({_why(e)})"))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Manifests:
    """The manifests of one store (``manifests/<host>/<namespace>/<model>/<tag>``), and the folders of it
    that could not be read."""

    root: Path
    present: bool  # the store has a manifests folder that could be read
    names: tuple[OllamaName, ...]
    skipped: tuple[str, ...]  # "<folder> (permission denied)"


def list_manifests(root: Path) -> Manifests:
    """Every manifest of the store at ``root``, sorted, as ``manifests/*/*/*/*`` matches them (files or
    symlinks four levels down); a folder that cannot be read is named in ``skipped``, not left out silently."""
    names: list[OllamaName] = []
    skipped_dirs: list[str] = []

    def scan(folder: str, parts: tuple[str, ...]) -> bool:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            skipped_dirs.append(f"{folder} ({_why(e)})")
            return False
        for entry in entries:
            try:
                if len(parts) == 3:
                    if entry.is_file() or entry.is_symlink():
                        names.append(OllamaName(*parts, entry.name))
                elif entry.is_dir():
                    scan(entry.path, (*parts, entry.name))
            except OSError as e:
                skipped_dirs.append(f"{entry.path} ({_why(e)})")
        return True

    present = scan(os.path.join(root, "manifests"), ())
    return Manifests(root, present, tuple(names), tuple(skipped_dirs))


def blob_subject(name: OllamaName, what: str, path: Path) -> str:
    """How an error about a blob of ``name`` begins: the model the user named and which of its blobs, the digest
    shortened as Ollama shortens it ("pulling 3f4273cb72a5", server/download.go): ``qwen3:8b: its model blob
    sha256-3f4273cb72a5``. The whole path goes in the hint (:func:`blob_hint`)."""
    return f"{name.display}: its {what} {path.name[:19]}"


def blob_hint(name: OllamaName, path: Path, hint: str | None = None) -> str:
    """The hint of an error about a blob: its path, and how it is fetched again. ``ollama pull`` keeps a blob
    that is there whatever it holds (server/download.go downloadBlob: a blob that exists is a cache hit, and
    PullModel verifies only what it downloaded, v0.33.0), so the blob goes first."""
    fix = hint or f"remove it and run `ollama pull {name.display}` (ollama pull keeps a blob that is there)"
    return f"{fix} (the blob: {path})"


def _open(path: Path, subject: str, hint: str | None = None) -> int:
    """A descriptor of ``path``, a regular file (a FIFO, a device or a socket in the store is refused, unread).
    ``subject``: what an error calls it (the manifest's path, or a blob of the model named); ``hint``: its hint."""
    try:
        return open_regular(path)
    except InputError as e:
        if not os.path.lexists(path):
            raise InputError(f"{subject} is missing", hint=hint) from None
        if "permission denied" in e.message:
            raise InputError(
                f"{subject} cannot be read: permission denied",
                hint="the Linux service's store belongs to the `ollama` user: run as a user who can read it"
                + (f" ({path})" if hint else ""),
            ) from None
        raise InputError(f"{subject}: {e.message.partition(': ')[2]}", hint=hint or e.hint) from None


def _read_bytes(path: Path, subject: str, what: str, hint: str | None = None, limit: int = MAX_JSON_BYTES) -> bytes:
    try:
        with os.fdopen(_open(path, subject, hint), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"{subject} cannot be read ({e.strerror})", hint=hint) from None
    if len(data) > limit:
        raise InputError(f"{subject} is larger than {limit:,} bytes; not an Ollama {what}", hint=hint)
    return data


def _parse_json(data: bytes, subject: str, hint: str | None = None) -> Any:
    try:
        return load_json(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{subject} is not text (corrupt?)", hint=hint) from None
    except json.JSONDecodeError as e:
        raise InputError(f"{subject} is not valid JSON ({e.msg} at line {e.lineno})", hint=hint) from None


def manifest_layers(doc: Mapping[str, Any], path: Path | str) -> Iterator[Layer]:
    """The layers of a manifest (``path``: where it came from, for messages), each digest checked."""
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise InputError(f"{path}: the manifest has no list of layers")
    for i, raw in enumerate(layers):
        if not isinstance(raw, dict):
            raise InputError(f"{path}: layer #{i} of the manifest is not an object")
        media = raw.get("mediaType")
        size = raw.get("size", 0)
        if not isinstance(media, str):
            raise InputError(f"{path}: layer #{i} of the manifest has no mediaType")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InputError(f"{path}: layer #{i} of the manifest has an invalid size {size!r}")
        yield Layer(media, check_digest(raw.get("digest"), f"{path}: layer #{i}"), size)


def _read_entry(root: Path, manifest: Path, name: OllamaName) -> StoreEntry:
    where = str(manifest)
    _inside(root, manifest, where)
    data = _read_bytes(manifest, f"{manifest}: the manifest", "manifest")
    doc = _parse_json(data, f"{manifest}: the manifest")
    if not isinstance(doc, dict):
        raise InputError(f"{manifest}: the manifest is not a JSON object")
    layers = list(manifest_layers(doc, manifest))
    notes: list[str] = []

    # Ollama's GetModel walks the layers in order and each model layer replaces the one before:
    # the last one is the model it loads (server/images.go, `case "application/vnd.ollama.image.model"`)
    model_layers = [la for la in layers if la.media_type == MEDIA_MODEL]
    if not model_layers:
        kind = "safetensors/MLX" if any(la.media_type == MEDIA_TENSOR for la in layers) else "non-GGUF"
        raise InputError(
            f"{name.display}: a {kind} model (its manifest {manifest} has no {MEDIA_MODEL} layer)",
            hint="kvadvise plans GGUF models, which Ollama runs on llama.cpp",
        )
    if len(model_layers) > 1:
        notes.append(f"the manifest has {len(model_layers)} model layers; Ollama loads the last one, planned here")
    model_blob = blob_path(root, model_layers[-1].digest, where)
    if not os.path.lexists(model_blob):
        raise InputError(
            f"{blob_subject(name, 'model blob', model_blob)} is missing (the store is incomplete)",
            hint=blob_hint(name, model_blob, f"ollama pull {name.display}"),
        )
    fd = _open(model_blob, blob_subject(name, "model blob", model_blob), blob_hint(name, model_blob))
    model_bytes = os.fstat(fd).st_size
    os.close(fd)

    # The work per manifest is bounded by what it names, not by how often it names it: a 4 MiB
    # manifest can repeat one layer ~30,000 times. Each blob is read once (a repeat changes
    # nothing: Ollama decodes the same options again), and a manifest naming more distinct JSON
    # blobs than a real one ever has is refused.
    params: dict[str, Any] = {}
    seen: set[str] = set()
    for layer in layers:
        if layer.media_type != MEDIA_PARAMS or layer.digest in seen:
            continue
        seen.add(layer.digest)
        if len(seen) > MAX_PARAMS_LAYERS:
            raise InputError(f"{manifest}: the manifest names more than {MAX_PARAMS_LAYERS} params layers")
        path = blob_path(root, layer.digest, where)
        subject, hint = blob_subject(name, "params blob", path), blob_hint(name, path)
        doc_p = _parse_json(_read_bytes(path, subject, "params blob", hint), subject, hint)
        if not isinstance(doc_p, dict):
            raise InputError(f"{subject} is not a JSON object", hint=hint)
        params.update(doc_p)

    projector_bytes = 0
    projector_blob: Path | None = None
    projectors: set[str] = set()
    for layer in layers:
        if layer.media_type != MEDIA_PROJECTOR or layer.digest in projectors:
            continue
        projectors.add(layer.digest)
        path = blob_path(root, layer.digest, where)
        if not os.path.lexists(path):
            projector_bytes += layer.size
            notes.append(f"projector blob {path.name} is missing; its size is taken from the manifest")
            continue
        fd = _open(path, blob_subject(name, "projector blob", path), blob_hint(name, path))
        projector_bytes += os.fstat(fd).st_size
        os.close(fd)
        projector_blob = projector_blob or path
    if projector_bytes:
        notes.append(f"vision projector: {projector_bytes:,} B (Ollama passes it to llama-server as --mmproj)")
    if any(la.media_type == MEDIA_ADAPTER for la in layers):
        notes.append("has a LoRA adapter layer; its memory is not counted")
    if any(la.media_type == MEDIA_DRAFT for la in layers):
        notes.append("has a draft model layer; its memory is not counted")

    config: dict[str, Any] = {}
    cfg = doc.get("config")
    if isinstance(cfg, dict) and cfg.get("digest") is not None:
        path = blob_path(root, cfg["digest"], where)
        try:
            subject = blob_subject(name, "config blob", path)
            doc_c = _parse_json(_read_bytes(path, subject, "config blob"), subject)
        except InputError as e:
            notes.append(f"config blob unreadable: {e.message}")
        else:
            if isinstance(doc_c, dict):
                config = doc_c
    return StoreEntry(
        root=root,
        manifest_path=manifest,
        manifest_digest=_sha256(data),
        model_blob=model_blob,
        model_bytes=model_bytes,
        params=params,
        projector_bytes=projector_bytes,
        config=config,
        notes=tuple(notes),
        projector_blob=projector_blob,
    )


def _sha256(data: bytes) -> str:
    import hashlib  # only when a model is in the store: hashlib costs a few ms of every start

    return hashlib.sha256(data).hexdigest()
