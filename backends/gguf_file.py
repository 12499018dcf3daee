"""Backend: a GGUF model, local or remote, read header only.

``ref`` is, in this order:

- an ``http://`` or ``https://`` URL (a Hub link goes through the Hub);
- an ``hf://`` Hub name (kvadvise.backends.remote.hub);
- a local file (its header is cached by kvadvise.backends.gguf_cache);
- ``USER/REPO:QUANT`` or ``hf.co/USER/REPO[:QUANT]``, when no such local path exists.

Split models (``-00001-of-00003.gguf``) are read part by part and merged
(kvadvise.model.splits); the first part must be given, as llama.cpp requires.
Remote headers are read with HTTP range requests (kvadvise.backends.remote.http_source)
and cached by URL and ETag, or by Hub commit (kvadvise.backends.remote.cache); a cached
header is used when the server cannot be reached or the Hub is offline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from kvadvise.backends import gguf_cache as headercache
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model import splits
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import GGUFHeader
from kvadvise.model.spec import ModelSpec

if TYPE_CHECKING:  # the remote modules are imported only for remote names: a local plan starts fast
    import click

    from kvadvise.backends.remote.hub import HubRef


class GGUFFileBackend:
    name = "gguf"
    summary = (
        "a GGUF file: a path, an https:// URL, hf://USER/REPO/FILE.gguf or USER/REPO:QUANT "
        "(header only, over HTTP range requests when remote; split models merged; headers are cached)"
    )

    def register_commands(self, cli: click.Group, verify: click.Group) -> None:
        """``kvadvise gguf MODEL`` and ``kvadvise gguf DIR`` (kvadvise.plugins.CommandProvider)."""
        from kvadvise.backends.gguf_dir import with_folder_listing
        from kvadvise.ui.flags import DRAFT_OPTIONS, MMPROJ_OPTION
        from kvadvise.ui.show import plan_command

        command = plan_command(
            "gguf",
            "Memory for a GGUF model: a file, an https:// URL, hf://USER/REPO/FILE.gguf or USER/REPO:QUANT "
            "(header only).",
            self.load_spec,
            options=(MMPROJ_OPTION, *DRAFT_OPTIONS),
        )
        cli.add_command(with_folder_listing(command, self.load_spec))  # `kvadvise gguf DIR` lists a folder

    def load_spec(self, ref: str) -> ModelSpec:
        header = load_header(ref)
        spec = from_gguf(header)
        parts = header.extra.get("split_parts")
        if isinstance(parts, tuple) and len(parts) > 1:
            spec = replace(
                spec, notes=(*spec.notes, f"split model: {len(parts)} parts, the tensors of all parts summed")
            )
        return spec


def load_header(ref: str) -> GGUFHeader:
    """The (merged) header of the model ``ref`` names."""
    if not ref.strip():
        raise InputError(
            "MODEL is empty", hint="give a GGUF file, an https:// URL, hf://USER/REPO/FILE.gguf or USER/REPO:QUANT"
        )
    path = _as_pathlib_shows(os.path.expanduser(ref))
    if not ref.startswith(("http://", "https://", "hf://")) and os.path.exists(path):
        return read_local(path)  # without importing the remote modules: a local plan starts fast
    from kvadvise.backends.remote import hub

    if ref.startswith(("http://", "https://")):
        named = hub.parse_ref(ref)
        return read_hub(named) if named is not None else read_url(ref)
    if ref.startswith("hf://"):
        named = hub.parse_ref(ref)
        assert named is not None  # parse_ref raises on a malformed hf:// name
        return read_hub(named)
    named = hub.parse_ref(ref)
    if named is not None:
        return read_hub(named)
    return read_local(path)


# -- local ---------------------------------------------------------------------


def _as_pathlib_shows(path: str) -> str:
    """``str(pathlib.Path(path))`` without importing pathlib (~3 ms of start-up): no ``.`` parts, doubled
    or trailing slashes (``model.gguf/`` names the file); ``..`` is kept, since it may cross a symlink."""
    if os.sep != "/":  # Windows' drives and separators: pathlib itself, off the start-up that matters here
        from pathlib import Path

        return str(Path(path))
    root = "//" if path.startswith("//") and not path.startswith("///") else "/" if path.startswith("/") else ""
    return root + "/".join(part for part in path.split("/") if part not in ("", ".")) or "."


def read_local(path: str | os.PathLike[str]) -> GGUFHeader:
    path = os.fspath(path)  # a Python caller's pathlib.Path: the split-name parser takes text
    first = headercache.read(path)
    n = splits.check_first(first)
    if n == 1:
        return first
    name = splits.parse_name(path)
    if name is None or name.count != n or name.number != 1:
        raise InputError(
            f"{path}: part 1 of a split model of {n} parts, but its name does not end in -00001-of-{n:05d}.gguf",
            hint="llama.cpp finds the other parts by that name; keep the names gguf-split gave them",
        )
    parts = [first]
    for i, p in enumerate(name.parts[1:], start=2):
        if not os.path.isfile(p):
            raise InputError(f"{p}: part {i} of {n} of the split model is missing", hint="download every part")
        parts.append(headercache.read(p))
    return splits.merge(parts)


# -- remote --------------------------------------------------------------------


def read_url(url: str) -> GGUFHeader:
    """A GGUF on any HTTP server; the other parts of a split model are found by name."""
    from kvadvise.backends.remote.http_source import cache_key, display_url, split_url

    first = remote_header(url, key=f"url:{cache_key(url)}")
    n = splits.check_first(first)
    if n == 1:
        return first
    from urllib.parse import urlunsplit  # remote names only: a local plan starts without it

    p = split_url(url)
    name = splits.parse_name(p.path)
    if name is None or name.count != n:
        raise InputError(
            f"{display_url(url)}: part 1 of a split model of {n} parts, but the URL is not named -00001-of-{n:05d}.gguf"
        )
    parts = [first]
    for part_path in name.parts[1:]:
        part_url = urlunsplit((p.scheme, p.netloc, part_path, p.query, ""))
        parts.append(remote_header(part_url, key=f"url:{cache_key(part_url)}"))
    return splits.merge(parts)


def read_hub(ref: HubRef) -> GGUFHeader:
    """A GGUF in a Hub repo: all parts of a split model, each header read at the resolved commit."""
    from kvadvise.backends.remote import hub

    model = hub.resolve(ref)
    headers: Callable[[], Mapping[str, str]] = hub.auth_headers
    parts = [
        remote_header(
            model.url(f),
            key=model.cache_key(f),
            name=model.display(f),
            immutable=model.commit if model.pinned else None,
            headers=headers,
            denied_hint=hub.denied_hint(model.repo_id),
            offline=hub.offline(),
        )
        for f in model.files
    ]
    if len(parts) == 1:
        n = splits.check_first(parts[0])
        if n > 1:
            raise InputError(f"{model.display(model.files[0])}: split into {n} parts but its name says otherwise")
        return parts[0]
    return splits.merge(parts)


def remote_header(
    url: str,
    *,
    key: str,
    name: str | None = None,
    immutable: str | None = None,
    headers: Callable[[], Mapping[str, str]] | None = None,
    denied_hint: str | None = None,
    offline: bool = False,
) -> GGUFHeader:
    """Read one remote header, or take it from the cache.

    ``immutable``: the Hub commit the URL is pinned to; a cached header read
    at that commit is used without asking the server. Otherwise the cached
    header's ETag is sent with the first request (If-None-Match) and a 304 or
    the same ETag keeps it; a server that cannot be reached falls back to it.
    """
    from kvadvise.backends.remote import cache as remotecache
    from kvadvise.backends.remote.http_source import HTTPSource, display_url
    from kvadvise.model.gguf import read_header

    shown = name or display_url(url)
    if immutable is not None:
        hit = remotecache.load(key, shown, immutable)
        if hit is not None:
            return hit.header
    cached = remotecache.load(key, shown)
    if offline:
        if cached is None:
            raise BackendUnreachable(
                f"{shown}: offline and its header is not cached", hint="plan it once with a network"
            )
        return cached.header
    with HTTPSource(url, headers=headers() if headers else None, name=shown, denied_hint=denied_hint) as src:
        etag = cached.validator if cached is not None and immutable is None else None
        try:
            unchanged = src.open(if_none_match=etag if etag and not etag.startswith("size:") else None)
        except BackendUnreachable:
            if cached is None:
                raise
            return cached.header
        validator = immutable or src.etag or (f"size:{src.size()};{src.last_modified}" if src.last_modified else None)
        if cached is not None and (unchanged or (validator is not None and validator == cached.validator)):
            return cached.header
        header = read_header(src)
    remotecache.store(key, header, validator)
    return header
