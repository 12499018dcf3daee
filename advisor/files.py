"""Writing the files kvadvise generates (Modelfiles, env files, systemd drop-ins).

A file is never overwritten unless asked (``force``), and never left half
written: the text goes to a temporary file in the same directory, which then
takes the target's name in one ``os.replace`` (or ``os.link`` when the target
must not exist yet, so a file created meanwhile is not clobbered either).
Every failure is an :class:`InputError` naming the path and what to do.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from advisor.errors import InputError

FILE_MODE = 0o644  # generated configs are not secret; the directory decides who may read them


def write_text_file(path: str | os.PathLike[str], text: str, *, force: bool) -> Path:
    """Write ``text`` to ``path`` atomically; refuse to overwrite unless ``force``. Returns the path."""
    target = Path(path).expanduser()
    parent = target.parent
    if target.is_dir():
        raise InputError(f"{target}: is a directory", hint="give a file name")
    if not parent.exists():
        raise InputError(f"{parent}: no such directory", hint=f"create it first: mkdir -p {parent}")
    if not parent.is_dir():
        raise InputError(f"{parent}: not a directory")
    if not force and (target.exists() or target.is_symlink()):
        raise InputError(f"{target} already exists", hint="pass --force to overwrite it")
    tmp = _write_temp(parent, target.name, text)
    try:
        if force:
            os.replace(tmp, target)
        else:
            _link_new(tmp, target)
    except OSError as e:
        raise _os_error(target, e) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return target


def _write_temp(parent: Path, name: str, text: str) -> str:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _os_error(parent, e) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
    except OSError as e:
        os.unlink(tmp)
        raise _os_error(parent, e) from None
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
