"""A cache of headers read from remote GGUF files, in the user's cache dir.

Remote entries are keyed by a string the caller builds from the file's
address (a URL without its query, or a Hub repo, commit and file name) and
carry a validator: the ETag the server sent, or the commit a Hub file was
read at. A lookup with a validator only returns an entry with the same one;
a lookup without (offline) returns whatever was stored last. Named
resolutions (``USER/REPO:QUANT`` -> commit and files) are kept next to them
so a plan works offline once it has been made online.

Nothing secret is stored: keys and sources are built from addresses without
query strings, and no request header is ever written. Best effort like
kvadvise.backends.gguf_cache: an unreadable entry is a miss, a failed write is silent,
``KVADVISE_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvadvise.backends.gguf_cache import cache_dir, decode, enabled, encode
from kvadvise.errors import InputError
from kvadvise.files import load_json, read_regular_text, write_cache_file
from kvadvise.model.gguf import GGUFHeader

FORMAT = 1
MAX_ENTRY_BYTES = 256 << 20  # a cached header (a 262k-token vocabulary is ~10 MB of JSON)


@dataclass(frozen=True, slots=True)
class CachedHeader:
    """A remote GGUF header from the cache, with the validator to revalidate it."""

    header: GGUFHeader
    validator: str | None  # the ETag or commit it was read at; None when the server gave neither


def remote_dir() -> Path:
    return cache_dir() / "remote"


def _entry(kind: str, key: str) -> Path:
    digest = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()[:40]
    return remote_dir() / f"{kind}-{digest}.json"


def _read(kind: str, key: str) -> dict[str, Any] | None:
    if not enabled():
        return None
    try:
        doc = load_json(read_regular_text(_entry(kind, key), max_bytes=MAX_ENTRY_BYTES))
    except (OSError, ValueError, InputError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key:
        return None
    return doc


def _write(kind: str, key: str, doc: dict[str, Any]) -> None:
    if not enabled():
        return
    # best effort; no temporary file left
    write_cache_file(_entry(kind, key), json.dumps({"format": FORMAT, "key": key, **doc}, separators=(",", ":")))


def load(key: str, source: str, validator: str | None = None) -> CachedHeader | None:
    """The header stored under ``key``: only if read at ``validator`` when one is given."""
    doc = _read("header", key)
    if doc is None:
        return None
    stored = doc.get("validator")
    if validator is not None and stored != validator:
        return None
    try:
        return CachedHeader(decode(doc["header"], source), stored if isinstance(stored, str) else None)
    except (KeyError, TypeError, ValueError):
        return None


def store(key: str, header: GGUFHeader, validator: str | None) -> None:
    _write("header", key, {"validator": validator, "header": encode(header)})


def load_resolution(name: str) -> dict[str, Any] | None:
    """What ``name`` (a Hub model name with its revision) resolved to last time."""
    doc = _read("name", name)
    value = doc.get("value") if doc else None
    return value if isinstance(value, dict) else None


def store_resolution(name: str, value: Mapping[str, Any]) -> None:
    _write("name", name, {"value": dict(value)})
