"""Backend plugins, discovered through the ``kvadvise.backends`` entry points.

The built-in backends (GGUF file, Hugging Face, ...) are declared in
kvadvise's own pyproject.toml exactly like a third-party one would be, so
``advisor`` never imports ``backends`` by name. A plugin that fails to load is
reported by name and skipped; it never breaks the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvadvise.errors import InputError
from kvadvise.model.spec import ModelSpec

if TYPE_CHECKING:
    import click

    from kvadvise.planner.memory import RunConfig
    from kvadvise.runtime.seam import Runtime
    from kvadvise.runtime.verification import Measurement

GROUP = "kvadvise.backends"


class Backend(Protocol):
    """A source of model specs (and, for runtimes, of commands, measurements and configs).

    Required: ``name``, ``summary`` and ``load_spec``. A backend says what more
    it can do with the optional protocols below (CAPABILITIES lists them):
    :class:`CommandProvider` brings its own commands, :class:`Measurer` runs a
    config on the real runtime. The built-in backends use exactly these.
    """

    name: str
    summary: str

    def load_spec(self, ref: str) -> ModelSpec:
        """Resolve ``ref`` (a path, a repo id, a model name) to a ModelSpec."""
        ...


@runtime_checkable
class CommandProvider(Protocol):
    """A backend that brings its own commands, as simonw/llm's ``register_commands`` hook.

    Called once, when the CLI first needs a command named after the backend:
    ``kvadvise NAME ...`` goes in ``cli``, ``kvadvise verify NAME ...`` in
    ``verify``. The commands may use kvadvise.ui.flags, .plan and .output,
    the pieces the built-in commands are made of. A backend without this gets
    the generic ``kvadvise NAME MODEL`` planning command.
    """

    def register_commands(self, cli: click.Group, verify: click.Group) -> None: ...


@runtime_checkable
class Measurer(Protocol):
    """A backend that runs a config on the real runtime and reports what it allocated."""

    def measure(
        self,
        model_path: str,
        cfg: RunConfig,
        *,
        server: str | None = None,
        timeout_s: float = 600,
        progress: Callable[[str], None] = ...,
    ) -> Measurement: ...


@runtime_checkable
class RuntimeProvider(Protocol):
    """A backend that brings a runtime (kvadvise.runtime.seam.Runtime): ``kvadvise.plan(..., runtime=NAME)``
    plans for it, and its commands do through the same entry (kvadvise.entry.plan_for)."""

    def runtime(self) -> Runtime:
        """The runtime for a model given as a bare ModelSpec."""
        ...

    def runtime_for(self, ref: str) -> tuple[ModelSpec, Runtime]:
        """``ref`` resolved, and the runtime bound to that model (its projector, its own settings)."""
        ...


@runtime_checkable
class BindsModel(Protocol):
    """A runtime object that carries its own options (Ollama's release, runner, platform) and binds itself to a
    model reference: ``kvadvise.plan("qwen3:8b", request, runtime=OllamaRuntime(ollama_version="0.12.3"))``
    asks what ``kvadvise ollama qwen3:8b --ollama-version 0.12.3`` asks."""

    def for_model(self, ref: str) -> tuple[ModelSpec, Runtime]:
        """``ref`` resolved as this runtime's backend resolves it, and a runtime with these options bound to it."""
        ...


# capability -> the optional methods that provide it (any one of them)
CAPABILITIES = {
    "resolve": ("load_spec",),
    "commands": ("register_commands",),
    "verify": ("measure", "verify_running"),
    "live-state": ("running_models",),
    "write-config": ("write_config",),
    "runtime": ("runtime_for",),
}


def capabilities(backend: object) -> tuple[str, ...]:
    return tuple(
        cap for cap, methods in CAPABILITIES.items() if any(callable(getattr(backend, m, None)) for m in methods)
    )


@dataclass(frozen=True, slots=True)
class BrokenPlugin:
    """A backend entry point that failed to load, and why."""

    name: str
    target: str
    error: str


@dataclass(frozen=True, slots=True)
class Registry:
    """What the entry points declare; a backend is imported only when asked for."""

    targets: dict[str, str]  # name -> "module:attr"

    def get(self, name: str) -> Backend:
        target = self.targets.get(name)
        if target is None:
            known = ", ".join(sorted(self.targets)) or "none"
            raise InputError(f"no backend named {name!r}", hint=f"installed backends: {known}")
        try:
            return _load(target)
        except InputError:
            raise
        except Exception as e:  # a plugin may fail in any way; say which one
            raise InputError(
                f"backend {name!r} ({target}) failed to load: {type(e).__name__}: {e}",
                hint="reinstall or remove the plugin; `kvadvise plugins` lists them all",
            ) from e

    def load_all(self) -> tuple[dict[str, Backend], tuple[BrokenPlugin, ...]]:
        """Import every backend; a broken plugin is reported by name and skipped."""
        backends: dict[str, Backend] = {}
        broken: list[BrokenPlugin] = []
        for name, target in sorted(self.targets.items()):
            try:
                backends[name] = _load(target)
            except Exception as e:  # a third-party plugin may fail in any way; report it, keep going
                broken.append(BrokenPlugin(name, target, f"{type(e).__name__}: {e}"))
        return backends, tuple(broken)


def discover() -> Registry:
    targets: dict[str, str] = {}
    for name, target in _entry_points(GROUP):
        targets.setdefault(name, target)
    return Registry(targets)


def _load(target: str) -> Backend:
    import importlib

    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr.strip() else ():
        obj = getattr(obj, part)
    backend = obj() if isinstance(obj, type) else obj
    if not all(hasattr(backend, a) for a in ("name", "summary", "load_spec")):
        raise TypeError("does not implement the Backend protocol (name, summary, load_spec)")
    return backend  # type: ignore[return-value]


def _entry_points(group: str) -> list[tuple[str, str]]:
    """(name, "module:attr") for ``group``, first distribution on sys.path wins.

    Reads the ``entry_points.txt`` of every installed distribution directly:
    importing importlib.metadata costs more than the rest of a kvadvise run.
    The result is the same as ``importlib.metadata.entry_points(group=group)``
    (tests/test_plugins.py checks that).
    """
    import os
    import re
    import sys

    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for base in sys.path:
        try:
            names = os.listdir(base or ".")
        except OSError:
            continue
        for d in sorted(names):
            if not d.endswith((".dist-info", ".egg-info")):
                continue
            path = os.path.join(base or ".", d, "entry_points.txt")
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            # the distribution's name, normalized as importlib.metadata does (PEP 503), first on sys.path wins
            stem = d.removesuffix(".dist-info").removesuffix(".egg-info").split("-")[0]
            dist = re.sub(r"[-_.]+", "-", stem).lower()
            if dist in seen:
                continue
            seen.add(dist)
            found.extend(_parse_group(text, group))
    return found


def _parse_group(text: str, group: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


# --- runtimes: the built-in ones and those the backends bring ---------------------------------------------


def runtime(name: str) -> Runtime:
    """The runtime called ``name``: llama-server, llama-cli, library (the library and its bindings), or one an
    installed backend brings (``ollama``: kvadvise.plugins.RuntimeProvider)."""
    if name == "llama-server":
        from kvadvise.runtime.llamaserver import LlamaServer

        return LlamaServer()
    if name == "llama-cli":
        from kvadvise.runtime.library import LlamaCli

        return LlamaCli()
    if name == "library":
        from kvadvise.runtime.library import LlamaLibrary

        return LlamaLibrary()
    registry = discover()
    if isinstance(name, str) and name in registry.targets:
        backend = registry.get(name)
        if isinstance(backend, RuntimeProvider):
            return backend.runtime()
    raise InputError(f"no runtime named {name!r}", hint="llama-server, llama-cli, library, or a backend's: ollama")


# the backend that resolves a model reference for a built-in runtime (kvadvise.api.plan given a name)
_LOADERS = {"llama-server": "llamacpp", "llama-cli": "gguf", "library": "gguf"}


def for_model(ref: str, name: str) -> tuple[ModelSpec, Runtime]:
    """``ref`` resolved by the backend of the runtime called ``name`` (``ollama``: the store, the server or a
    built-in profile; llama-server: a GGUF file, URL or Hub name, whose command the plan then carries), and
    the runtime bound to that model."""
    backend = discover().get(_LOADERS.get(name, name))
    if isinstance(backend, RuntimeProvider):
        spec, bound = backend.runtime_for(ref)
        return (spec, bound) if bound.name == name else (spec, runtime(name))
    return backend.load_spec(ref), runtime(name)
