"""llama-server's router mode: several models behind one server, each in its own llama-server process
(llama.cpp tools/server, in build 0c1e570 = b11312 and newer: server-models.cpp).

The router starts with no model; ``--models-preset FILE`` names the models in an INI file, one section
each, whose keys are llama-server's own flags without the dashes (short forms allowed: ``c``, ``ngl``),
plus ``load-on-startup``; ``--models-max N`` (default 4, 0 = no limit) is how many may be loaded at once:
past it the least recently used idle model is unloaded (server_lru_sched::pick_victim). It counts
models, not memory: it is the plan that says whether N of them fit. ``models-max`` is the router's own
flag and is dropped from a preset (unset_reserved_args), so it goes on the command line.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvadvise.planner.memory import RunConfig
from kvadvise.runtime.llamaserver import server_args
from kvadvise.runtime.serverport import LEGACY_PORT

DEFAULT_MODELS_MAX = 4  # common/common.h models_max


@dataclass(frozen=True, slots=True)
class RoutedModel:
    """One model of the router's preset."""

    name: str  # the section: the name clients ask for ("model" in the request)
    path: str | None  # the GGUF file; None when no file of it is on this machine
    config: RunConfig
    device: str | None = None  # -dev: the one GPU it is pinned to (CUDA0), None for all of them
    embedding: bool = False  # --embedding: an embedding model (llama-server serves /v1/embeddings only)
    note: str | None = None  # a comment for the section
    load_on_startup: bool = True  # loaded when the router starts (the models that fit together)
    aliases: tuple[str, ...] = ()  # other names it answers to (--alias: tools/server/server-models.cpp add_model)


def preset_text(models: Sequence[RoutedModel], *, header: str = "") -> str:
    """The INI file for ``llama-server --models-preset FILE`` (tools/server/README.md, Model presets)."""
    lines = [f"; {line}" for line in header.splitlines()] if header else []
    lines.append("version = 1")
    for m in models:
        lines.append("")
        lines.append(f"[{section_name(m.name)}]")
        if m.note:
            lines.append(f"; {m.note}")
        for flag, _var, value in server_args(m.path or "", m.config):
            key = "model" if flag == "-m" else flag.lstrip("-")
            if key == "model" and m.path is None:
                lines.append(f"; model = /path/to/{m.name}.gguf  (no GGUF file of it on this machine)")
                continue
            lines.append(f"{key} = {_value(key, value if value is not None else 'true')}")
        if m.device:
            lines.append(f"device = {m.device}")
        if m.embedding:
            lines.append("embedding = true")
        if also := alias_names(m.aliases, (x.name for x in models)):
            # the preset's --alias, comma-separated (server_models::add_model splits it)
            lines.append(f"alias = {_value('alias', ','.join(also))}")
        lines.append(f"load-on-startup = {'true' if m.load_on_startup else 'false'}")
    return "\n".join(lines) + "\n"


def alias_names(aliases: Sequence[str], names: Iterable[str]) -> tuple[str, ...]:
    """The other names a model answers to, as the router and llama-swap read them: each once, none that is a model's
    own name (server_models::add_model throws "alias '%s' ... conflicts with existing model name")."""
    taken = {section_name(n) for n in names}
    return tuple(a for a in dict.fromkeys(section_name(x) for x in aliases) if a not in taken and a)


def section_name(name: str) -> str:
    """The name a client asks the router for, as its preset loader reads it back: it upper-cases the tag after
    the last ':' of a section (common/preset.cpp canonical_tag), so ``gemma3:latest`` would answer only to
    ``gemma3:LATEST``; the name is written without a tag (``:latest`` dropped, another tag joined by ``-``), and a
    registry host's port joined by ``-`` too (``localhost:5000/library/gem`` was served as
    ``localhost:5000/LIBRARY/GEM``)."""
    base, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag: the last ':' is a registry host's port
        return name.replace(":", "-")
    base = base.replace(":", "-")
    return base if tag.lower() == "latest" else f"{base}-{tag}"


def _value(key: str, value: str) -> str:
    """A value the loader reads back whole: it ends a value at any ``#`` or ``;``, spaces before it or not
    (common/preset.cpp at b11312: eol-start after zero or more spaces; a real llama-server read
    ``/data/C#1/models/...`` as ``/data/C``), and has no quoting, so such a value is refused with the reason."""
    import re

    from kvadvise.errors import InputError

    if re.search(r"[;#]", value) or "\n" in value or "\r" in value:
        raise InputError(
            f"router preset: {key} = {value!r}: llama-server's preset loader cuts a value at '#' or ';' "
            "(a comment) and cannot quote it",
            hint="rename or link the file to a path without '#' or ';', then write the preset",
        )
    return value


def router_command(preset_path: str, models_max: int, binary: str = "llama-server", port: int = LEGACY_PORT) -> str:
    """The router's command line for the preset: ``--models-max`` always stated (the default, 4, would let a
    model of the router's cache load beside the planned ones), and ``--port``: the default moves from 8080 to
    9931 (kvadvise.runtime.serverport), and clients set up for one keep finding the router on it."""
    return shlex.join([binary, "--models-preset", preset_path, "--models-max", str(models_max), "--port", str(port)])
