"""Built-in snapshots of library tags read from Ollama's registry (``profiles/ollama_library.json``).

What ``benchmarks/library_profiles.py`` wrote from the registry: for each tag its manifest as served, its
params, and the GGUF headers of its model blob and projector (long arrays kept as their length, as the
header cache keeps them), with the registry and the date each was read. Offline, such a tag is planned
from its real header as of that date, exactly as from the registry; a refresh is one command. The file
ships empty until that command is run with a network (no figure in it is typed by hand).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from kvadvise.backends.ollama import registry
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.name import OllamaName
from kvadvise.errors import InputError

RESOURCE = "ollama_library.json"
FORMAT = 1


def _load_text() -> str:
    from kvadvise.profiles import read_text

    return read_text(RESOURCE)


@cache
def _entries() -> Mapping[str, Any]:
    import json

    try:
        doc = json.loads(_load_text())
    except (OSError, ValueError) as e:  # a broken install, not the user's input
        raise InputError(f"built-in snapshots ({RESOURCE}) cannot be read: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("models"), dict):
        raise InputError(f"built-in snapshots ({RESOURCE}): not format {FORMAT} with a 'models' object")
    return {str(k).lower(): v for k, v in doc["models"].items()}


def names() -> tuple[str, ...]:
    """The tags held (``model:tag``), sorted: for "did you mean"."""
    return tuple(sorted(_entries()))


def find(name: OllamaName) -> OllamaModel | None:
    """The snapshot of a library tag (``qwen3:8b``), planned as the registry read it then; None for others."""
    from kvadvise.backends.gguf_cache import decode

    if not name.is_library:
        return None
    entry = _entries().get(f"{name.model}:{name.tag}".lower())
    if not isinstance(entry, dict):
        return None
    try:
        base, date = str(entry["registry"]), str(entry["date"])
        url = registry.manifest_url(base, name)
        manifest = registry.parse_manifest(str(entry["manifest"]).encode("utf-8"), base, name, url)
        model = decode(entry["header"], manifest.blob_url(registry.model_layers(manifest)[-1].digest))
        projector = entry.get("projector_header")
        headers = registry.Headers(model, decode(projector, "projector") if projector else None)
        params = dict(entry.get("params") or {})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"built-in snapshots ({RESOURCE}): {name.display}: {e!r}") from None
    said = f"planned from the registry's header as read on {date} (built-in snapshot of {url})"
    return registry.build_model(manifest, params, headers, source=f"snapshot:{url}@{date}", said=said)
