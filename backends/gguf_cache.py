"""A cache of GGUF headers already read, in the user's cache dir.

A 262k-token vocabulary makes a header several MB that must be walked string
by string; a second plan of the same file should not pay that again, and a
listing of a thousand files should cost a thousand stats and small reads.
Entries are keyed by the file's device and inode and trusted while its size,
mtime, ctime, inode and device are unchanged: the kernel sets the ctime to the
current time on every write, truncate, rename over or utime (a program can
put the mtime back, never the ctime), so any rewrite after the stamp was
taken shows in it. The one blind spot is a rewrite within the same tick of
the file system's clock as the change the stamp recorded (ctime is as coarse
as a jiffy on Linux, a second or two elsewhere): an entry whose file changed
less than ``RACY_NS`` before it was stamped is *racy* (git's word for the same
problem of its index), and only such an entry keeps a CRC-32 of the header's
bytes that a hit checks. The first hit once the window has passed stores it
again without the CRC. The check guards against accidents, not an attacker.
The cache is best effort: an unreadable or stale entry is ignored and a
failed write is silent. ``KVADVISE_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from typing import TYPE_CHECKING, Any

from kvadvise.errors import InputError
from kvadvise.files import open_regular, read_regular_text, write_cache_file
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import GGUFArray, GGUFHeader, TensorInfo, Value

if TYPE_CHECKING:
    from pathlib import Path

# 2: ctime and device in the stamp, the header bytes hashed; 3: CRC-32, not sha256; 4: keyed by device and
# inode, the CRC in racy entries only; 5: each key's value type
FORMAT = 5
# A file changed this close to the moment its stamp was taken may be rewritten within the same clock tick
# without a new ctime: its entry keeps the header's CRC. 2 s covers the coarsest clocks (FAT's mtime).
RACY_NS = 2_000_000_000
MAX_ENTRY_BYTES = 256 << 20  # an entry (metadata and tensor list, long arrays as a length) is a few KB to ~1 MB


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvadvise", "headers")


def cache_dir() -> Path:
    from pathlib import Path  # not on the path of a cache hit: pathlib and urllib.parse cost ~3 ms of start-up

    return Path(_cache_root())


def enabled() -> bool:
    return os.environ.get("KVADVISE_NO_CACHE", "") in ("", "0")


def _identity(path: str | os.PathLike[str]) -> list[int] | None:
    """The stamp of the file ``path`` names (through symlinks): size, mtime, ctime, inode, device."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _racy(stamp: list[int], now_ns: int) -> bool:
    """The file changed (mtime or ctime) within RACY_NS of ``now_ns``, or later (a clock ahead of ours)."""
    return max(stamp[1], stamp[2]) > now_ns - RACY_NS


def _header_digest(path: str | os.PathLike[str], stamp: list[int], header_bytes: int) -> str | None:
    """CRC-32 of the first ``header_bytes`` bytes of the file ``stamp`` names; None if unreadable or another file."""
    try:
        fd = open_regular(path)
    except InputError:
        return None
    import mmap  # mapped, not read: no copy of a header of several MB

    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(f.fileno())
            if (st.st_ino, st.st_dev) != (stamp[3], stamp[4]) or st.st_size < header_bytes or header_bytes <= 0:
                return None
            with mmap.mmap(f.fileno(), header_bytes, access=mmap.ACCESS_READ) as m:
                return f"{zlib.crc32(m):08x}-{header_bytes}"
        except (OSError, ValueError):
            return None


def _entry_path(stamp: list[int]) -> str:
    # one entry per file (device and inode): hard links share it, a path needs no realpath (a lstat per
    # component) to find it; a new file on a reused inode has another ctime, so its stamp differs
    return os.path.join(_cache_root(), f"{stamp[4]:x}-{stamp[3]:x}.json")


def _entry(stamp: list[int]) -> Path:
    from pathlib import Path

    return Path(_entry_path(stamp))


def load(path: str | os.PathLike[str]) -> GGUFHeader | None:
    """The cached header of ``path`` when its stamp is unchanged (a racy entry: and its header bytes):
    a stat and the read of a small file."""
    if not enabled():
        return None
    stamp = _identity(path)
    if stamp is None:
        return None
    try:
        # json.loads, not files.load_json: the entry is kvadvise's own, and load_json's walk over every
        # container (its nesting bound) was a sixth of a warm listing; a nested one fails as a miss below
        doc = json.loads(read_regular_text(_entry_path(stamp), max_bytes=MAX_ENTRY_BYTES))
        if doc.get("format") != FORMAT or doc.get("stamp") != stamp:
            return None
        header = decode(doc["header"], os.fspath(path))
        crc = doc.get("crc32")
        if crc is not None:
            if crc != _header_digest(path, stamp, header.header_bytes):
                return None
            if not _racy(stamp, time.time_ns()):  # the window has passed: the stamp will do from now on
                _write(stamp, None, doc["header"])
        return header
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, InputError):
        return None


def store(path: str | os.PathLike[str], header: GGUFHeader, stamped: tuple[list[int], int] | None) -> None:
    """Keep ``header``, read from ``path`` after ``stamped`` (its stamp and the time it was taken:
    :func:`stamp_of`, before the read, so that a write during the read shows as a changed stamp)."""
    if not enabled() or stamped is None:
        return
    stamp, taken_ns = stamped
    crc = None
    if _racy(stamp, taken_ns):
        crc = _header_digest(path, stamp, header.header_bytes)
        if crc is None:
            return
    _write(stamp, crc, encode(header))


def stamp_of(path: str | os.PathLike[str]) -> tuple[list[int], int] | None:
    """``path``'s stamp and when it was taken; None when it cannot be stat'ed."""
    now = time.time_ns()
    stamp = _identity(path)
    return None if stamp is None else (stamp, now)


def _write(stamp: list[int], crc: str | None, header: dict[str, Any]) -> None:
    target = _entry(stamp)
    doc = {"format": FORMAT, "stamp": stamp, "header": header}
    if crc is not None:
        doc["crc32"] = crc
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
        "value_types": dict(h.value_types),
    }


# the GGML types by number: a dict lookup is ~15x cheaper than GGMLType(n), and a warm listing of a
# thousand headers looks up hundreds of thousands of tensor types
_GGML_TYPES = {int(t): t for t in GGMLType}


def decode(d: dict[str, Any], source: str) -> GGUFHeader:
    return GGUFHeader(
        source=source,
        version=int(d["version"]),
        byte_order=str(d["byte_order"]),
        metadata={str(k): _dec_value(v) for k, v in d["metadata"].items()},
        tensors=tuple(TensorInfo(n, tuple(s), _GGML_TYPES[t], o, b) for n, s, t, o, b in d["tensors"]),
        alignment=int(d["alignment"]),
        header_bytes=int(d["header_bytes"]),
        data_offset=int(d["data_offset"]),
        data_bytes=int(d["data_bytes"]),
        file_bytes=d["file_bytes"],
        value_types={str(k): int(t) for k, t in d.get("value_types", {}).items()},
    )


def read(path: str | os.PathLike[str]) -> GGUFHeader:
    """The header of a local GGUF file: from the cache when the file is unchanged."""
    from kvadvise.model.gguf import read_file

    header = load(path)
    if header is None:
        stamped = stamp_of(path)  # before the read: a write while it reads changes the stamp stored
        header = read_file(path)
        store(path, header, stamped)
    return header
