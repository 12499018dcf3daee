"""Writing the files kvadvise generates (Modelfiles, env files, systemd drop-ins, charts, caches).

A file is never overwritten unless asked (``force``), and never left half
written: the text goes to a temporary file in the same directory, which then
takes the target's name in one ``os.replace`` (or ``os.link`` when the target
must not exist yet, so a file created meanwhile is not clobbered either).
Several files asked for by one command are one write (:func:`write_files`):
every target is checked, then every one is written to its temporary file,
then all are renamed; a failure at any step removes every temporary file and
puts back what the renames before it changed, so it leaves all the targets as
they were. Every failure is an :class:`InputError` naming the path and what to
do. Caches (:func:`write_cache_file`) are best effort and leave no temporary
file either.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvadvise.errors import InputError

if TYPE_CHECKING:
    from pathlib import Path

FILE_MODE = 0o644  # generated configs are not secret; the directory decides who may read them


@dataclass(frozen=True, slots=True)
class NewFile:
    """One file a command writes: the option that names it (for messages), where, and what."""

    option: str  # "--write-env", "--chart-file"
    path: str
    data: bytes
    replace: bool = False  # overwritten without --force (a chart image is); else only with force


def text_file(option: str, path: str, text: str) -> NewFile:
    """A text file to write, UTF-8 (a file name that is not UTF-8 stays the bytes it was)."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise InputError(f"{option or path}: the text holds {text[e.start : e.end]!a}, which is not Unicode") from None
    return NewFile(option, path, data)


def write_text_file(path: str | os.PathLike[str], text: str, *, force: bool) -> Path:
    """Write ``text`` to ``path`` atomically; refuse to overwrite unless ``force``. Returns the path."""
    (target,) = write_files([text_file("", os.fspath(path), text)], force=force)
    return target


def write_files(files: Sequence[NewFile], *, force: bool, inputs: Sequence[str] = ()) -> tuple[Path, ...]:
    """Write every file or none: check them all (:func:`check_targets`), write each to a temporary file
    beside its target, then give each its name. A failure anywhere leaves every target as it was: the
    temporary files are removed and the renames already done are undone (a replaced file comes back from
    a hard link, or a copy, made before it was replaced). ``inputs``: the files the command read (the
    model), never written over, ``force`` or not."""
    _refuse_inputs(files, inputs)
    check_targets(
        [(f.option or f.path, f.path) for f in files], force=force, replace={f.path for f in files if f.replace}
    )
    targets = [_check_target(f.path, force=force or f.replace) for f in files]
    temps: list[str] = []
    done: list[tuple[Path, str | None]] = []  # (target, its backup or None when it was new)
    try:
        for f, target in zip(files, targets, strict=True):
            temps.append(_write_temp(target.parent, target.name, f.data))
        for f, target, tmp in zip(files, targets, temps, strict=True):
            done.append((target, _commit(tmp, target, replace=force or f.replace)))
    except BaseException:
        for target, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is None:
                    os.unlink(target)
                else:
                    os.replace(backup, target)
        raise
    finally:
        for leftover in [*temps, *(b for _, b in done if b is not None)]:
            with contextlib.suppress(OSError):
                if os.path.lexists(leftover):
                    os.unlink(leftover)
    return tuple(targets)


def _identity(path: str) -> tuple[int, int] | None:
    """The file a path names, through links (device, inode): a hard link and a symbolic link to it are it."""
    try:
        st = os.stat(os.path.expanduser(path))
    except (OSError, ValueError):  # no such file (a reference that is no path), a NUL byte
        return None
    return (st.st_dev, st.st_ino)


def _refuse_inputs(files: Sequence[NewFile], inputs: Sequence[str]) -> None:
    """``--write-env model.gguf --force`` replaced the model the plan was read from with a settings file: the
    one thing the user cannot get back from kvadvise. A file the command read is refused as a target."""
    read = {i for i in map(_identity, inputs) if i is not None}
    for f in files:
        if read and _identity(f.path) in read:
            raise InputError(
                f"{f.option or 'the output'} {f.path}: it is the model this plan was read from; kvadvise never "
                "writes over a file it reads, --force or not",
                hint="give the file another name",
            )


def _commit(tmp: str, target: Path, *, replace: bool) -> str | None:
    """Give ``tmp`` the name ``target``; the backup of what it replaced (None: there was nothing)."""
    try:
        if not replace:
            _link_new(tmp, target)
            return None
        backup = _backup(target)
        try:
            os.replace(tmp, target)
        except BaseException:
            if backup is not None:
                with contextlib.suppress(OSError):
                    os.unlink(backup)
            raise
        return backup
    except OSError as e:
        raise _os_error(target, e) from None


def _backup(target: Path) -> str | None:
    """A second name for what ``target`` is now (a hard link, else a copy), so that a rename can be undone."""
    if not os.path.lexists(target):
        return None
    import secrets

    for _ in range(100):
        backup = os.path.join(target.parent, f".{target.name}.{secrets.token_hex(6)}.old")
        try:
            os.link(target, backup, follow_symlinks=False)  # a symlink is kept as the link it is
            return backup
        except FileExistsError:
            continue
        except OSError:
            break  # no hard links on this file system: a copy
    import shutil
    import tempfile

    fd, backup = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
    os.close(fd)
    try:
        shutil.copy2(target, backup, follow_symlinks=False)
    except BaseException:
        os.unlink(backup)
        raise
    return backup


def write_cache_file(path: str | os.PathLike[str], text: str) -> bool:
    """For caches, best effort: ``text`` at ``path`` atomically (its folder made); False on any failure, and
    never a temporary file left behind (a full disk, a folder that cannot be written, an interrupt)."""
    import tempfile

    target = os.fspath(path)
    parent = os.path.dirname(target) or "."
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
        return True
    except (OSError, ValueError):
        return False
    finally:
        with contextlib.suppress(OSError):
            if os.path.lexists(tmp):
                os.unlink(tmp)


def _check_target(path: str | os.PathLike[str], *, force: bool) -> Path:
    """``path`` as a file that may be written now: its folder exists, it is not a folder, and it does not
    exist yet unless ``force``."""
    from pathlib import Path  # only to write: reading a model file starts without pathlib

    if "\x00" in os.fspath(path):
        raise InputError(f"{os.fspath(path)!a}: not a file name (it holds a NUL byte)")
    try:
        target = Path(path).expanduser()
    except RuntimeError:  # ~user of no such user
        raise InputError(f"{path}: no such user's home folder", hint="give the folder itself") from None
    parent = target.parent
    try:
        # `existing/`: a folder's name (the shell's `> existing/` is "Is a directory"); Path drops the slash, and
        # --force wrote the file `existing`
        if target.is_dir() or os.fspath(path).endswith(("/", os.sep)):
            raise InputError(f"{target}: is a directory", hint="give a file name")
        if not parent.exists():
            raise InputError(f"{parent}: no such directory", hint=f"create it first: mkdir -p {parent}")
        if not parent.is_dir():
            raise InputError(f"{parent}: not a directory")
        if not force and (target.exists() or target.is_symlink()):
            raise InputError(f"{target} already exists", hint="pass --force to overwrite it")
        if target.is_symlink():  # overwritten as an editor or `>` does: through the link, which stays
            resolved = Path(os.path.realpath(target))
            if not resolved.is_symlink():  # a loop of links is left to the checks below, as it is
                return _check_target(resolved, force=force)
        if target.exists() and not target.is_file():
            # --force replaces a file, never a device, a FIFO or a socket: `--write-env /dev/null --force` renamed
            # a regular file over /dev/null (as root), breaking every program that writes there
            raise InputError(
                f"{target}: not a regular file; --force overwrites only files", hint="give the path of a file"
            )
    except OSError as e:  # a name too long, a folder that cannot be searched
        raise _os_error(target, e) from None
    return target


def check_targets(
    targets: Sequence[tuple[str, str | None]], *, force: bool, replace: set[str] | frozenset[str] = frozenset()
) -> None:
    """Before writing several files (each with the option that names it; one option may name several, as
    --write-modelfiles does): every one can be written and no two are the same file, so a refusal leaves none of
    them written rather than some. A path in ``replace`` is overwritten without ``force``."""
    seen: dict[str, str] = {}
    for option, path in targets:
        if path is None:
            continue
        if not path.strip():
            raise InputError(f"{option}: the path is empty", hint="give a file name")
        key = os.path.realpath(_check_target(path, force=force or path in replace))
        if key in seen:
            who = (
                f"{option} names one file twice"
                if seen[key] == option
                else f"{seen[key]} and {option} name the same file"
            )
            raise InputError(f"{who} ({path})", hint="give each its own file")
        seen[key] = option


def _write_temp(parent: Path, name: str, data: bytes) -> str:
    try:
        import tempfile  # only when a file is written: it costs every start a few ms

        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _os_error(parent, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _os_error(parent, e) from None
        raise
    return tmp


def _link_new(tmp: str, target: Path) -> None:
    """Give ``tmp`` the name ``target`` only if nothing has that name (atomic create-if-absent)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise InputError(f"{target} already exists", hint="pass --force to overwrite it") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # a filesystem without hard links (FAT, some network mounts): checked just above, replace now
        if target.exists():
            raise InputError(f"{target} already exists", hint="pass --force to overwrite it") from None
        os.replace(tmp, target)


def _os_error(where: Path, e: OSError) -> InputError:
    if e.errno == errno.EROFS:
        return InputError(f"{where}: read-only file system", hint="write the file somewhere else")
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return InputError(
            f"{where}: permission denied",
            hint="write it to a directory you own (then copy it with sudo), or run with the needed rights",
        )
    if e.errno == errno.ENOSPC:
        return InputError(f"{where}: no space left on device")
    return InputError(f"{where}: cannot write ({e.strerror or e})")


@dataclass(frozen=True, slots=True)
class FolderFiles:
    """The files of a folder tree with one suffix, and the subfolders that could not be read."""

    files: tuple[str, ...]  # sorted by path component, as pathlib sorts them
    skipped: tuple[str, ...]  # "<folder> (permission denied)"


def files_below(folder: str | os.PathLike[str], suffix: str) -> FolderFiles:
    """The regular files (or links to one) named ``*<suffix>`` (any case) in ``folder`` and below, symlinked folders not
    followed (as ``Path.rglob``). ``rglob`` passes over a folder it cannot read without a word; here each one
    is named in ``skipped``."""
    found: list[tuple[str, ...]] = []
    skipped: list[str] = []

    def skip(e: OSError) -> None:
        why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or type(e).__name__)
        skipped.append(f"{e.filename} ({why})")

    top = os.fspath(folder)
    for here, _, names in os.walk(top, onerror=skip):
        for name in names:
            path = os.path.join(here, name)
            if name.lower().endswith(suffix.lower()) and os.path.isfile(path):  # MODEL.GGUF: llama.cpp opens any name
                found.append(tuple(os.path.relpath(path, top).split(os.sep)))
    return FolderFiles(tuple(os.path.join(top, *parts) for parts in sorted(found)), tuple(skipped))


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor for ``path``, which must be a regular file.

    Opened with O_NONBLOCK so a FIFO in its place cannot block the open, then
    checked with fstat on the descriptor itself (no race with a swap after a
    stat): a FIFO, a device such as /dev/zero, a socket or a directory is an
    InputError. The caller closes the descriptor.
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{p}: permission denied") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    except ValueError:  # a NUL byte: no file has such a name
        raise InputError(f"{p!a}: not a file name (it holds a NUL byte)") from None
    import stat

    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise InputError(f"{p}: is a directory, not a file")
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a file"
        )
        raise InputError(f"{p}: {kind}, not a regular file", hint="give the path of a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return fd


def read_regular_bytes(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (InputError past it, or for any other kind of file)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"{path}: larger than {max_bytes:,} bytes; not read")
    return data


def read_regular_text(path: str | os.PathLike[str], *, max_bytes: int) -> str:
    data = read_regular_bytes(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


MAX_JSON_DEPTH = 64  # manifests, /api/show answers, config.json and caches nest a few levels


def load_json(data: str | bytes | bytearray, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for text from files and servers, with a nesting bound.

    Python's parser recurses: ``[[[[...`` 100,000 deep raises RecursionError,
    and a document a little under its limit would raise it later in whatever
    walks it. Both are a ``json.JSONDecodeError`` (a ValueError) here, which
    every caller already turns into its domain error; so is a number of more
    than 4,300 digits, which int() refuses with a plain ValueError.
    """
    try:
        doc = json.loads(data)
    except RecursionError:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", "", 0) from None
    except (json.JSONDecodeError, UnicodeDecodeError):  # bytes that are not UTF-8: a ValueError that says so
        raise
    except ValueError:  # int() past sys.get_int_max_str_digits() (4,300 digits): not a JSONDecodeError
        raise json.JSONDecodeError(f"a number of more than {sys.get_int_max_str_digits():,} digits", "", 0) from None
    # level by level: one list per depth rather than a tuple per container (a header cache entry holds
    # ~1,000 of them, read on every start)
    level: list[Any] = [doc] if isinstance(doc, (dict, list)) else []
    for _ in range(max_depth):
        if not level:
            return doc
        level = [x for v in level for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list))]
    if level:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", "", 0)
    return doc
