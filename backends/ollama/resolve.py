"""Backend: an Ollama model by name (``qwen3-coder``, ``qwen3:8b``, ``hf.co/user/repo:Q4_K_M``).

Resolution, first that works:

1. the on-disk store (``$OLLAMA_MODELS``, ``~/.ollama/models``, the Linux
   service's ``/usr/share/ollama/.ollama/models``): the GGUF blob's header,
   the params layer, the projector; no server needed;
2. a running server at ``OLLAMA_HOST`` (``/api/show``, verbose);
3. the registry the name is pulled from (registry.ollama.ai, ``hf.co``, a host
   in the name; kvadvise.backends.ollama.registry): the tag's manifest and its
   blobs' real headers by range reads, to plan exactly before ``ollama pull``;
4. offline, a built-in snapshot of the registry's headers (``profiles/ollama_library.json``,
   kvadvise.backends.ollama.snapshots), else a built-in profile (``profiles/ollama_models.json``).

A server or a registry that does not answer is not an error here (the profile
may still plan the model, with a note); it is one of the tries the final
error lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import registry as ollama_registry
from kvadvise.backends.ollama import snapshots
from kvadvise.backends.ollama import store as ollama_store
from kvadvise.backends.ollama.model import OllamaModel, has_vision_tower
from kvadvise.backends.ollama.name import OllamaName, parse_name
from kvadvise.backends.ollama.profiles import Profile, find_profile, suggestions
from kvadvise.backends.ollama.towers import inline_tower, profile_tower
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model.architecture import from_gguf

if TYPE_CHECKING:
    from pathlib import Path


MESSAGE_COLUMNS = 100  # the not-found line, less the CLI's "kvadvise: error: "


def resolve(
    ref: str,
    *,
    host: str | None = None,
    roots: Sequence[Path] | None = None,
    use_api: bool = True,
    use_registry: bool = True,
    use_profiles: bool = True,
    timeout: float = ollama_api.DEFAULT_TIMEOUT,
) -> OllamaModel:
    """Find ``ref`` in the store, then on the server, then in the registry, then in the built-in profiles.

    ``host`` defaults to ``$OLLAMA_HOST``; ``roots`` to the store roots Ollama uses. InputError saying
    in one short line what was tried, and the closest library names, when none has the model.
    """
    name = parse_name(ref)
    tried: list[str] = []  # one word or two per try, for the one line
    failures: list[str] = []  # what did not answer and why, for the hint

    search = ollama_store.store_roots() if roots is None else tuple(roots)
    entry = ollama_store.find(name, search)
    if entry is not None:
        try:
            return from_store(name, entry)
        except InputError:
            own = _own_conversion(name, entry) if use_profiles else None
            if own is None:
                raise
            return own
    skipped = ollama_store.skipped(name, search)  # a store that cannot be searched: named, then passed over
    tried.append("store")
    failures.extend(skipped)

    notes: tuple[str, ...] = skipped  # what a later try that finds the model carries
    if use_api:
        url = ollama_api.server_url(host)
        try:
            shown = ollama_api.show_model(url, name.display, timeout=timeout)
        except BackendUnreachable as e:
            tried.append("server")
            failures.append(f"the server did not answer: {e.message}")
            notes = (*notes, f"the Ollama server could not be asked ({e.message})")
        else:
            if shown is not None:
                found = _from_api(name, url, shown)
                return dataclasses.replace(found, notes=(*skipped, *found.notes))
            tried.append("server")

    if use_registry:
        base = ollama_registry.registry_url(name)
        if base is None:
            failures.append(f"the registry was not asked ({ollama_registry.REGISTRY_ENV}=off)")
        else:
            try:
                model = ollama_registry.read_model(name, base)
            except BackendUnreachable as e:
                tried.append("registry")
                failures.append(f"the registry did not answer: {e.message}")
                notes = (*notes, f"the registry could not be read ({_short(e.message)}): planned offline")
            except ollama_registry.Refused as e:  # private, or not there: said, and the chain goes on
                tried.append("registry")
                failures.append(e.message)
            else:
                if model is not None:
                    return dataclasses.replace(model, notes=(*notes, *model.notes))
                tried.append("registry")

    close: tuple[str, ...] = ()
    if use_profiles:
        snapshot = snapshots.find(name)  # the registry's own header of the tag, as read on a date: exact
        if snapshot is not None:
            return dataclasses.replace(snapshot, notes=(*notes, *snapshot.notes))
        profile = find_profile(name)
        if profile is not None:
            return _from_profile(name, profile, notes)
        close = suggestions(name, snapshots.names())
        tried.append("profiles")

    # a model name kvadvise does not know that resembles one it does is most likely a typo: the known name
    # first; a known model with a tag kvadvise has no profile of (qwen3:0.6b) is most likely real: pull first
    pull = f"ollama pull {name.display}"
    hint = pull
    if close and close[0].split(":")[0] == name.model.lower():
        hint = f"{pull}; or kvadvise ollama {close[0]} (a tag kvadvise knows)"
    elif close:
        hint = f"kvadvise ollama {close[0]}; or {pull} if the library has that name"
    # one short line (the CLI's "kvadvise: error: " before it: ~120 columns): "did you mean" first, then what
    # was tried; fewer close names rather than a second line; why a try failed goes in the hint
    where = f" (tried {', '.join(tried)})"
    head = f"{name.display}: not found"
    for n in range(len(close), 0, -1):
        head = f"{name.display}: not found; did you mean {', '.join(close[:n])}?"
        if len(head + where) <= MESSAGE_COLUMNS:
            break
    raise InputError(head + where, hint="; ".join((hint, *failures)))


def library_names(ref: str) -> tuple[str, ...]:
    """The other names of ``ref`` in Ollama's library, from the built-in profiles (qwen3-coder:latest and
    qwen3-coder:30b are one model): what ``verify ollama`` matches a loaded model by when neither its name
    nor a digest does. () for a name no profile knows."""
    try:
        name = parse_name(ref)
    except InputError:
        return ()
    profile = find_profile(name)  # None off the library
    if profile is None:
        return ()
    own = f"{name.model}:{name.tag}".lower()
    return tuple(n for n in (profile.id, *profile.aliases) if n.lower() != own)


def _from_profile(name: OllamaName, profile: Profile, notes: tuple[str, ...]) -> OllamaModel:
    """The model of a built-in profile of the library."""
    if profile.id.lower() != f"{name.model}:{name.tag}".lower():
        notes = (*notes, f"{name.display} is {profile.id} in Ollama's library")
    spec = profile.spec()
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params={},
        projector_bytes=0,
        model_bytes=profile.download_bytes or 0,
        source=f"profile:{profile.id}",
        notes=notes,  # the profile's own notes are the spec's, printed with the plan
        tower=profile_tower(spec),
    )


def _own_conversion(name: OllamaName, entry: ollama_store.StoreEntry) -> OllamaModel | None:
    """A store blob of Ollama's own conversion (architecture ``gptoss``, which llama.cpp's loader knows as ``gpt-oss``
    through Ollama's llama/compat renames) planned from the built-in profile of the library's model; None for any
    other blob, or without a profile of the name."""
    from kvadvise.backends.gguf_cache import read as read_header
    from kvadvise.backends.ollama.versions import LIBRARY_ARCHITECTURES

    try:
        arch = read_header(entry.model_blob).architecture
    except InputError:
        return None
    profile = find_profile(name)
    if profile is None or arch not in LIBRARY_ARCHITECTURES.values():
        return None
    note = f"{name.display}'s blob is Ollama's own {arch} conversion: planned from the built-in profile {profile.id}"
    return _from_profile(name, profile, (*entry.notes, note))


def from_store(name: OllamaName, entry: ollama_store.StoreEntry) -> OllamaModel:
    """The model of a store entry already found (its manifest read): its header through the cache."""
    from kvadvise.backends.gguf_cache import read as read_header  # a model in the store: its blob's header

    blob = entry.model_blob
    subject = ollama_store.blob_subject(name, "model blob", blob)
    read = False
    try:
        # the reader and from_gguf name their source: the model the user named, not a path under blobs/
        header = dataclasses.replace(read_header(blob), source=subject)
        read = True
        spec = from_gguf(header)
    except InputError as e:  # a GGUFError mostly: the same kind, said of the model
        message = e.message.removeprefix(f"{blob}: ")
        raise type(e)(
            message if message.startswith(subject) else f"{subject}: {message}",
            # a header that reads is the blob the registry serves (an architecture only Ollama's engine runs):
            # its own hint, not a pull that brings back the same bytes
            hint=ollama_store.blob_hint(name, blob, e.hint if read and e.hint else None),
        ) from None
    notes = list(entry.notes)
    file_type = entry.config.get("file_type")
    if isinstance(file_type, str) and file_type:
        notes.append(f"quantization {file_type} (from the model's config blob)")
    spec = dataclasses.replace(spec, source=str(entry.model_blob), notes=(*spec.notes, *entry.notes))
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params=dict(entry.params),
        projector_bytes=entry.projector_bytes,
        model_bytes=entry.model_bytes,
        source=f"store:{entry.manifest_path}",
        notes=tuple(notes),
        digest=entry.manifest_digest,
        projector_path=str(entry.projector_blob) if entry.projector_blob is not None else None,
        vision_tower=has_vision_tower(header),
        tower=inline_tower(header),
    )


def _from_api(name: OllamaName, url: str, shown: ollama_api.ShownModel) -> OllamaModel:
    spec = from_gguf(shown.header)
    spec = dataclasses.replace(spec, notes=(*spec.notes, *shown.notes))
    notes = list(shown.notes)
    quant = shown.details.get("quantization_level")
    if isinstance(quant, str) and quant:
        notes.append(f"quantization {quant} (from the server)")
    return OllamaModel(
        name=name.short,
        tag=name.tag,
        spec=spec,
        params=dict(shown.params),
        projector_bytes=0,
        model_bytes=spec.weights_bytes,
        source=f"api:{url}",
        vision_tower=has_vision_tower(shown.header),
        tower=inline_tower(shown.header),
        notes=tuple(notes),
    )


def _short(message: str) -> str:
    """``https://registry.ollama.ai/v2/library/x/manifests/latest: unknown host`` -> ``registry.ollama.ai:
    unknown host``: the host and the reason fit one line of the answer."""
    url, sep, why = message.partition(": ")
    if sep and url.startswith(("https://", "http://")):
        from urllib.parse import urlsplit

        return f"{urlsplit(url).netloc}: {why}"
    return message
