"""Hugging Face Hub names of GGUF models -> the files to read, through ``huggingface_hub``.

Names accepted (``REV`` defaults to ``main``)::

    hf://USER/REPO/PATH/FILE.gguf        a file in a repo
    hf://USER/REPO@REV/FILE.gguf         at a branch, tag or commit
    hf://USER/REPO[@REV][:QUANT]         the repo's file for a quant (default: Q4_K_M, then Q8_0, then the first)
    USER/REPO:QUANT                      the same, as llama.cpp's -hf and Ollama's hf.co/ names
    hf.co/USER/REPO[:QUANT]              (also huggingface.co/...)
    https://huggingface.co/USER/REPO/resolve/REV/FILE.gguf  (or /blob/: a browser link)

The file for a quant is chosen as llama.cpp does (common/download.cpp,
``find_best_model``): the first GGUF model file (no mmproj, imatrix, mtp-,
eagle3-, dflash-, dspark-) whose path matches ``QUANT[.-]`` case-insensitively,
and of a split model its first part; ``get_split_files`` then gives all parts.

``huggingface_hub`` lists the repo at the revision (``HfApi.model_info``: one
request, which also pins the commit) and builds the download URLs
(``hf_hub_url``); ``HF_TOKEN`` (or the token of ``hf auth login``),
``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` are honoured, read when the name is
resolved. A resolution is remembered (kvadvise.backends.remote.cache) so the same name
plans offline. The token is only ever put in an Authorization header; it is
never shown, logged or cached.
"""

from __future__ import annotations

import contextlib
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from kvadvise.backends.remote import cache as remotecache
from kvadvise.deadline import within
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model.splits import parse_name

DEFAULT_REVISION = "main"
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp find_best_model, when no tag is given
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # gguf_filename_is_model
_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_QUANT = r"[A-Za-z0-9_.+-]+"
_HF_URI = re.compile(rf"^hf://(?P<repo>{_REPO}?)(?:@(?P<rev>[^/:]+))?(?::(?P<quant>{_QUANT}))?(?:/(?P<file>.+))?$")
_BARE = re.compile(rf"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?(?P<repo>{_REPO}?)(?::(?P<quant>{_QUANT}))?$")
_WEB = re.compile(rf"^/(?P<repo>{_REPO}?)/(?:resolve|blob)/(?P<rev>[^/]+)/(?P<file>.+)$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class HubRef:
    """A model named on the Hub, before it is looked up."""

    repo_id: str
    revision: str = DEFAULT_REVISION
    filename: str | None = None  # a file in the repo, or None: choose one for ``quant``
    quant: str | None = None  # None: llama.cpp's default choice

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        bad = [
            c for c in self.revision + (self.filename or "") if ord(c) < 32 or c == "\x7f" or 0xD800 <= ord(c) < 0xE000
        ]
        if bad or not self.revision or (self.filename is not None and _bad_path(self.filename)):
            raise InputError(f"{self.repo_id}: not a Hub revision and file name the Hub could hold")

    @property
    def key(self) -> str:
        """The name in a canonical form (for the resolution cache)."""
        what = self.filename if self.filename is not None else f":{(self.quant or '').upper()}"
        return f"{endpoint()}|{self.repo_id}@{self.revision}|{what}"


@dataclass(frozen=True, slots=True)
class HubModel:
    """A resolved name: the repo at one commit and the model's file(s)."""

    repo_id: str
    commit: str  # the commit sha (or the revision asked for when the Hub gave none)
    files: tuple[str, ...]  # one file, or a split model's parts in order
    endpoint: str

    @property
    def pinned(self) -> bool:
        """True when ``commit`` is a commit sha: what it names never changes."""
        return bool(_SHA.match(self.commit))

    def url(self, filename: str) -> str:
        return file_url(self.repo_id, filename, self.commit, self.endpoint)

    def display(self, filename: str) -> str:
        return f"hf://{self.repo_id}/{filename}"

    def cache_key(self, filename: str) -> str:
        return f"hf:{self.endpoint}/{self.repo_id}@{self.commit}/{filename}"


# huggingface_hub validate_repo_id: each part 1-96 of [\w.-], no "--" or "..", no "-" or "." at either end
_REPO_PART = re.compile(r"^(?!.*(?:--|\.\.))[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?$", re.ASCII)


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if the Hub could hold such a repo (huggingface_hub's rules); InputError otherwise."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_REPO_PART.match(p) for p in parts):
        raise InputError(
            f"{repo_id!r} is not a Hub repo name: USER/REPO, each 1-96 letters, digits, '_', '-' or '.', "
            "without '--' or '..', not starting or ending with '-' or '.'",
            hint="copy the name from the repo's page on huggingface.co",
        )
    return repo_id


def _bad_path(filename: str) -> bool:
    return filename.startswith("/") or any(part in ("", ".", "..") for part in filename.split("/"))


def file_url(repo_id: str, filename: str, revision: str = DEFAULT_REVISION, base: str | None = None) -> str:
    """The download URL of a file, as huggingface_hub's hf_hub_url builds it: {endpoint}/{repo}/resolve/{rev}/{file}."""
    rev = urllib.parse.quote(revision, safe="")
    return f"{base or endpoint()}/{repo_id}/resolve/{rev}/{urllib.parse.quote(filename)}"


def parse_ref(ref: str) -> HubRef | None:
    """The Hub name in ``ref``, or None when ``ref`` is not one (a path, another URL)."""
    if ref.startswith("hf://"):
        m = _HF_URI.match(ref)
        if not m:
            raise InputError(f"{ref!r} is not a Hub name like hf://USER/REPO/FILE.gguf or hf://USER/REPO:Q4_K_M")
        rev = urllib.parse.unquote(m["rev"]) if m["rev"] else DEFAULT_REVISION
        if m["file"] and m["quant"]:
            raise InputError(f"{ref!r}: give a file or a quant, not both")
        return HubRef(m["repo"], rev, m["file"], _quant(m["quant"]))
    if ref.startswith(("http://", "https://")):
        from kvadvise.backends.remote.http_source import split_url

        p = split_url(ref)
        hub_hosts = {"huggingface.co", "hf.co"}
        if os.environ.get("HF_ENDPOINT"):
            hub_hosts.add(split_url(os.environ["HF_ENDPOINT"], what="HF_ENDPOINT").netloc.lower())
        if p.netloc.lower() not in hub_hosts:
            return None
        w = _WEB.match(p.path)
        if w:
            return HubRef(w["repo"], urllib.parse.unquote(w["rev"]), urllib.parse.unquote(w["file"]))
    m = _BARE.match(ref)
    if not m:
        return None
    prefixed = ref != m["repo"] and not ref.startswith(m["repo"] + ":")
    if m["quant"] is None and not prefixed:
        return None  # a bare USER/REPO is a relative path; a Hub name needs :QUANT or hf.co/
    return HubRef(m["repo"], DEFAULT_REVISION, None, _quant(m["quant"]))


def _quant(tag: str | None) -> str | None:
    return None if tag is None or tag.lower() == "latest" else tag


# -- settings (read when used, as a fresh huggingface_hub process would) ------


def endpoint() -> str:
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    v = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return v.strip().lower() in ("1", "on", "yes", "true")


def _token() -> str | None:
    from huggingface_hub import get_token

    tok = get_token()
    return tok or None


def auth_headers() -> dict[str, str]:
    """The Authorization header for the Hub, when a token is set (never shown)."""
    tok = _token()
    return {"Authorization": f"Bearer {tok}"} if tok else {}


def denied_hint(repo_id: str) -> str:
    page = f"{endpoint()}/{repo_id}"
    if _token():
        return f"the token set (HF_TOKEN or `hf auth login`) has no access: accept the licence on {page}, or use a token with read access"
    return f"gated or private: accept the licence on {page}, then export HF_TOKEN=<your token> (or run `hf auth login`)"


# -- resolution --------------------------------------------------------------


def resolve(ref: HubRef) -> HubModel:
    """Look ``ref`` up on the Hub (or, offline, in the resolution cache)."""
    if offline():
        cached = _cached(ref)
        if cached is None:
            raise BackendUnreachable(
                f"{_show(ref)}: offline (HF_HUB_OFFLINE is set) and this name was never resolved here",
                hint="plan it once with a network; the header is cached then",
            )
        return cached
    try:
        commit, files = _list(ref)
    except BackendUnreachable:
        cached = _cached(ref)
        if cached is None:
            raise
        return cached
    chosen = choose(files, ref)
    model = HubModel(ref.repo_id, commit or ref.revision, chosen, endpoint())
    remotecache.store_resolution(ref.key, {"repo": model.repo_id, "commit": model.commit, "files": list(model.files)})
    return model


def _show(ref: HubRef) -> str:
    rev = "" if ref.revision == DEFAULT_REVISION else f"@{ref.revision}"
    tail = f"/{ref.filename}" if ref.filename else f":{ref.quant}" if ref.quant else ""
    return f"hf://{ref.repo_id}{rev}{tail}"


def _cached(ref: HubRef) -> HubModel | None:
    v = remotecache.load_resolution(ref.key)
    if not v:
        return None
    files = v.get("files")
    repo, commit = v.get("repo"), v.get("commit")
    if not (isinstance(repo, str) and isinstance(commit, str) and isinstance(files, list) and files):
        return None
    if not all(isinstance(f, str) for f in files):
        return None
    return HubModel(repo, commit, tuple(files), endpoint())


def transport_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub's HTTP client raises for a network failure: OSError (requests, in
    huggingface_hub < 1.0), httpx.TransportError (1.x), httpx2.TransportError (2.x)."""
    import importlib

    errs: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError, AttributeError):
            errs.append(importlib.import_module(module).TransportError)
    return tuple(errs)


# A total deadline for one Hub API call (a server that drips a byte at a time must not stretch it)
HUB_DEADLINE_S = 30.0


def _list(ref: HubRef) -> tuple[str | None, list[str]]:
    """The commit sha and file list of the repo at ``ref.revision`` (HfApi.model_info: one request)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = _show(ref)
    try:
        info = within(
            HUB_DEADLINE_S,
            lambda: HfApi(endpoint=endpoint()).model_info(ref.repo_id, revision=ref.revision),
            lambda: BackendUnreachable(
                f"{name}: no complete answer from {endpoint()} within {HUB_DEADLINE_S:g} s", hint="check the network"
            ),
        )
    except GatedRepoError:
        raise InputError(f"{name}: access to {ref.repo_id} is restricted", hint=denied_hint(ref.repo_id)) from None
    except RevisionNotFoundError:
        raise InputError(f"{name}: {ref.repo_id} has no revision {ref.revision!r}") from None
    except RepositoryNotFoundError:
        raise InputError(
            f"{name}: no such repository on the Hub (or it is private)",
            hint="check the name; for a private repo export HF_TOKEN=<your token>",
        ) from None
    except OfflineModeIsEnabled:
        raise BackendUnreachable(f"{name}: huggingface_hub is in offline mode") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise InputError(f"{name}: the Hub refused access (HTTP {status})", hint=denied_hint(ref.repo_id)) from None
        if status == 404:
            raise InputError(f"{name}: not found on the Hub (HTTP 404)") from None
        raise BackendUnreachable(f"{name}: the Hub answered HTTP {status}", hint="try again later") from None
    except transport_errors() as e:
        raise BackendUnreachable(
            f"{name}: cannot reach {endpoint()} ({type(e).__name__})",
            hint="check the network; a name planned once before works offline",
        ) from None
    files = [s.rfilename for s in (info.siblings or [])]
    sha = info.sha if isinstance(info.sha, str) and info.sha else None
    return sha, files


def is_model_file(path: str) -> bool:
    """llama.cpp's gguf_filename_is_model: a .gguf that is not a projector, imatrix or draft model."""
    base = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(s in base for s in _NOT_MODEL)


def choose(files: Sequence[str], ref: HubRef) -> tuple[str, ...]:
    """The model's file(s) in ``files`` (a repo listing) for ``ref``: one file or all parts of a split model."""
    if ref.filename is not None:
        if files and ref.filename not in files:
            raise InputError(
                f"{_show(ref)}: no file {ref.filename!r} in {ref.repo_id}", hint=_listing_hint(files, ref.repo_id)
            )
        first = ref.filename
    else:
        first = _best(files, ref)
    name = parse_name(first)
    if name is None or name.count == 1:
        return (first,)
    if name.number != 1:
        raise InputError(
            f"{_show(ref)}: {first} is part {name.number} of {name.count}; llama.cpp loads the first part",
            hint=f"use hf://{ref.repo_id}/{name.part(1)}",
        )
    missing = [p for p in name.parts if files and p not in files]
    if missing:
        raise InputError(f"{_show(ref)}: {ref.repo_id} lacks part {missing[0]} of the split model {first}")
    return name.parts


def _best(files: Sequence[str], ref: HubRef) -> str:
    """llama.cpp find_best_model: the first model file matching QUANT[.-], skipping non-first split parts."""
    tags = (ref.quant,) if ref.quant else DEFAULT_QUANTS
    for tag in tags:
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_part(f):
                return f
    if not ref.quant:
        for f in files:
            if is_model_file(f) and _first_part(f):
                return f
        raise InputError(f"{_show(ref)}: {ref.repo_id} has no GGUF model file", hint="is it a GGUF repo?")
    raise InputError(
        f"{_show(ref)}: {ref.repo_id} has no GGUF file for {ref.quant}", hint=_listing_hint(files, ref.repo_id)
    )


def _first_part(path: str) -> bool:
    name = parse_name(path)
    return name is None or name.number == 1


def _listing_hint(files: Sequence[str], repo_id: str) -> str:
    models = [f for f in files if is_model_file(f) and _first_part(f)]
    if not models:
        return f"{repo_id} has no GGUF model files"
    shown = ", ".join(models[:8]) + (f", … ({len(models)} in all)" if len(models) > 8 else "")
    return f"GGUF files in {repo_id}: {shown}"
