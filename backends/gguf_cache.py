"""A cache of GGUF headers already read, in the user's cache dir.

A 262k-token vocabulary makes a header several MB that must be walked string
by string; a second plan of the same file should not pay that again. Entries
are keyed by the file's real path and trusted only while its size, mtime,
ctime, inode and device are unchanged *and* the header's own bytes still have
the CRC-32 that was read (a rewrite within the same second, or one that put the
mtime back, keeps every stamp on a coarse file system; the check guards against
accidents, not an attacker, who cannot set the ctime anyway: CRC-32 reads a
6.5 MB header in 1.5 ms where sha256 takes 4 ms plus 2.5 ms to import
OpenSSL, on every start; walking the header costs seconds). The cache is best effort: an
unreadable or stale entry is ignored and a failed write is silent.
``KVADVISE_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import TYPE_CHECKING, Any

from kvadvise.errors import InputError
from kvadvise.files import load_json, open_regular, read_regular_text, write_cache_file
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import GGUFArray, GGUFHeader, TensorInfo, Value

if TYPE_CHECKING:
    from pathlib import Path

FORMAT = 3  # 2: ctime and device in the stamp, the header bytes hashed; 3: CRC-32, not sha256
MAX_ENTRY_BYTES = 256 << 20  # a 262k-token vocabulary is ~10 MB of JSON


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvadvise", "headers")


def cache_dir() -> Path:
    from pathlib import Path  # not on the path of a cache hit: pathlib and urllib.parse cost ~3 ms of start-up

    return Path(_cache_root())


def enabled() -> bool:
    return os.environ.get("KVADVISE_NO_CACHE", "") in ("", "0")


def _identity(path: str | os.PathLike[str]) -> tuple[str, list[int]] | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _header_digest(real: str, header_bytes: int) -> str | None:
    """CRC-32 of the file's first ``header_bytes`` bytes (the header the entry holds); None if unreadable."""
    try:
        fd = open_regular(real)
    except InputError:
        return None
    import mmap  # mapped, not read: no copy of a header of several MB

    with os.fdopen(fd, "rb") as f:
        try:
            if os.fstat(f.fileno()).st_size < header_bytes or header_bytes <= 0:
                return None
            with mmap.mmap(f.fileno(), header_bytes, access=mmap.ACCESS_READ) as m:
                return f"{zlib.crc32(m):08x}-{header_bytes}"
        except (OSError, ValueError):
            return None


def _entry_path(real: str) -> str:
    # a cheap name, whatever the path's bytes (UTF-8 or not); the entry itself records the path it belongs to
    return os.path.join(_cache_root(), f"{zlib.crc32(os.fsencode(real)):08x}-{len(real)}.json")


def _entry(real: str) -> Path:
    from pathlib import Path

    return Path(_entry_path(real))


def load(path: str | os.PathLike[str]) -> GGUFHeader | None:
    if not enabled():
        return None
    ident = _identity(path)
    if ident is None:
        return None
    real, stamp = ident
    try:
        doc = load_json(read_regular_text(_entry_path(real), max_bytes=MAX_ENTRY_BYTES))
        if doc.get("format") != FORMAT or doc.get("path") != os.fsencode(real).hex() or doc.get("stamp") != stamp:
            return None
        header = decode(doc["header"], os.fspath(path))
        if doc.get("crc32") != _header_digest(real, header.header_bytes):
            return None
        return header
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InputError):
        return None


def store(path: str | os.PathLike[str], header: GGUFHeader) -> None:
    if not enabled():
        return
    ident = _identity(path)
    if ident is None:
        return
    real, stamp = ident
    target = _entry(real)
    digest = _header_digest(real, header.header_bytes)
    if digest is None:
        return
    path_hex = os.fsencode(real).hex()
    doc = {"format": FORMAT, "path": path_hex, "stamp": stamp, "crc32": digest, "header": encode(header)}
    write_cache_file(target, json.dumps(doc, separators=(",", ":")))  # best effort; no temporary file left


def _enc_value(v: Value) -> Any:
    if isinstance(v, GGUFArray):
        vals = None if v.values is None else [_enc_value(x) for x in v.values]
        return {"a": [v.item_type, v.count, vals]}
    if isinstance(v, float):
        return {"f": v}  # keeps 1.0 a float, not an int
    return v


def _dec_value(v: Any) -> Value:
    if isinstance(v, dict):
        if "f" in v:
            return float(v["f"])
        item_type, count, vals = v["a"]
        return GGUFArray(int(item_type), int(count), None if vals is None else tuple(_dec_value(x) for x in vals))
    if isinstance(v, (bool, int, str)):
        return v
    raise TypeError(f"unexpected cached value {v!r}")


def encode(h: GGUFHeader) -> dict[str, Any]:
    return {
        "version": h.version,
        "byte_order": h.byte_order,
        "metadata": {k: _enc_value(v) for k, v in h.metadata.items()},
        "tensors": [[t.name, list(t.shape), int(t.ggml_type), t.offset, t.n_bytes] for t in h.tensors],
        "alignment": h.alignment,
        "header_bytes": h.header_bytes,
        "data_offset": h.data_offset,
        "data_bytes": h.data_bytes,
        "file_bytes": h.file_bytes,
    }


def decode(d: dict[str, Any], source: str) -> GGUFHeader:
    return GGUFHeader(
        source=source,
        version=int(d["version"]),
        byte_order=str(d["byte_order"]),
        metadata={str(k): _dec_value(v) for k, v in d["metadata"].items()},
        tensors=tuple(TensorInfo(n, tuple(s), GGMLType(t), o, b) for n, s, t, o, b in d["tensors"]),
        alignment=int(d["alignment"]),
        header_bytes=int(d["header_bytes"]),
        data_offset=int(d["data_offset"]),
        data_bytes=int(d["data_bytes"]),
        file_bytes=d["file_bytes"],
    )


def read(path: str | os.PathLike[str]) -> GGUFHeader:
    """The header of a local GGUF file: from the cache when the file is unchanged."""
    from kvadvise.model.gguf import read_file

    header = load(path)
    if header is None:
        header = read_file(path)
        store(path, header)
    return header
