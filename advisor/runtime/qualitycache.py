"""Where ``kvadvise verify quality`` keeps what it measured, and how a plan finds it again.

$XDG_CACHE_HOME/kvadvise/kv-quality.json (default ~/.cache), one entry per model: the model is its
file's sha256 (an Ollama blob's name is its digest already: ``sha256-<hex>``), each figure keyed by the
llama-perplexity build, the cache type, the chunk size and the text. A plan finds the entry of its
model file by the path, size and modification time the measurement recorded (hashing gigabytes at
every plan would cost more than the plan), or by the blob's digest. A missing or unreadable file is
no measurement: a plan never fails on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from kvadvise.errors import InputError, KvadviseError
from kvadvise.files import write_text_file
from kvadvise.model.ggml import cache_type
from kvadvise.planner.quality import CacheQuality, MeasuredQuality

FORMAT = 1
_BLOB = re.compile(r"sha256[-:]([0-9a-f]{64})")


def path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvadvise" / "kv-quality.json"


def model_key(model_path: str) -> str:
    """The model's identity: an Ollama blob's digest from its name, else the file's sha256."""
    m = _BLOB.fullmatch(Path(model_path).name)
    if m:
        return m[1]
    h = hashlib.sha256()
    with open(model_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp(model_path: str) -> dict[str, object]:
    st = os.stat(model_path)
    return {"path": os.path.realpath(model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _read() -> dict[str, object]:
    try:
        doc = json.loads(path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"format": FORMAT, "models": {}}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("models"), dict):
        return {"format": FORMAT, "models": {}}
    return doc


def save(model_path: str, key: str, results: tuple[CacheQuality, ...], text_sha256: str) -> Path:
    """Add ``results`` to the model's entry: a figure of the same build, cache type, chunk size and text
    replaces the older one."""
    doc = _read()
    models = doc["models"]
    assert isinstance(models, dict)
    entry = models.get(key) if isinstance(models.get(key), dict) else None
    entry = dict(entry or {})
    stamp = _stamp(model_path)
    files = [f for f in entry.get("files", []) if isinstance(f, dict) and f.get("path") != stamp["path"]]
    rows = [r for r in entry.get("results", []) if isinstance(r, dict)]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for q in results:
        row: dict[str, object] = {
            "type_k": q.type_k.type_name,
            "type_v": q.type_v.type_name,
            "n_ctx": q.n_ctx,
            "n_chunks": q.n_chunks,
            "mean_kld": q.mean_kld,
            "p99_kld": q.p99_kld,
            "same_top_pct": q.same_top_pct,
            "seconds": round(q.seconds, 2),
            "llama_build": q.llama_build,
            "text_sha256": text_sha256,
            "measured_at": when,
        }
        same = ("type_k", "type_v", "n_ctx", "llama_build", "text_sha256")
        rows = [r for r in rows if any(r.get(k) != row[k] for k in same)] + [row]
    models[key] = {"files": [*files, stamp], "results": rows}
    target = path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"{target.parent}: cannot create it ({e.strerror or e}); the figures above were not stored",
            hint="set XDG_CACHE_HOME to a writable folder",
        ) from None
    return write_text_file(target, json.dumps(doc, indent=1) + "\n", force=True)


def _row(r: object) -> CacheQuality | None:
    if not isinstance(r, dict):
        return None
    try:
        build = r.get("llama_build")
        return CacheQuality(
            type_k=cache_type(str(r["type_k"])),
            type_v=cache_type(str(r["type_v"])),
            n_ctx=int(r["n_ctx"]),
            n_chunks=int(r["n_chunks"]),
            mean_kld=float(r["mean_kld"]),
            p99_kld=float(r["p99_kld"]),
            same_top_pct=float(r["same_top_pct"]),
            seconds=float(r["seconds"]),
            llama_build=int(build) if isinstance(build, int) else None,
        )
    except (KeyError, TypeError, ValueError, KvadviseError):  # a hand-edited or older row: no measurement
        return None


def lookup(source: str, llama_build: int | None = None) -> MeasuredQuality | None:
    """The measurements of the model file ``source``, if any (never raises); those of ``llama_build`` when
    there are some, else of any build."""
    if not source or not os.path.isfile(source):
        return None
    models = _read()["models"]
    assert isinstance(models, dict)
    m = _BLOB.fullmatch(Path(source).name)
    found: object = models.get(m[1]) if m else None
    key = m[1] if m else ""
    if found is None:
        try:
            stamp = _stamp(source)
        except OSError:
            return None
        for k, entry in models.items():
            if isinstance(entry, dict) and any(f == stamp for f in entry.get("files", [])):
                found, key = entry, k
                break
    if not isinstance(found, dict):
        return None
    rows = [q for q in map(_row, found.get("results", [])) if q is not None]
    same_build = [q for q in rows if llama_build is not None and q.llama_build == llama_build]
    rows = same_build or rows
    return MeasuredQuality(key, tuple(rows)) if rows else None
