"""Backend: an Ollama model by name (``qwen3-coder``, ``qwen3:8b``, ``hf.co/user/repo:Q4_K_M``).

The package: name.py (names), store.py (the on-disk store), api.py (a running
server), registry.py (Ollama's registry: a tag's manifest and its blobs' headers
before the pull), snapshots.py (built-in snapshots of the registry's headers),
profiles.py (built-in profiles), resolve.py (them all in order),
model.py (the resolved model), rules.py (how Ollama runs llama-server),
advice.py, config.py and modelfile.py (what to set and write), verify.py
(``/api/ps`` after a run), commands.py (``kvadvise ollama`` and ``kvadvise
verify ollama``, registered through the plugin interface). Submodules never
import this package's ``__init__``; it imports them lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.resolve import resolve
from kvadvise.model.spec import ModelSpec

if TYPE_CHECKING:
    import click

    from kvadvise.backends.ollama.advice import LiveState
    from kvadvise.backends.ollama.runtime import OllamaRuntime
    from kvadvise.backends.ollama.verify import OllamaVerification
    from kvadvise.planner.planning import Plan
    from kvadvise.runtime.seam import Written

__all__ = ["OllamaBackend", "OllamaModel", "resolve"]


class OllamaBackend:
    name = "ollama"
    summary = "an Ollama model by name: the local model store, a running server (OLLAMA_HOST), or a built-in profile"

    def load_spec(self, ref: str) -> ModelSpec:
        from kvadvise.backends.ollama import api

        with api.session():
            return resolve(ref).spec

    def register_commands(self, cli: click.Group, verify: click.Group) -> None:
        """``kvadvise ollama NAME``, ``kvadvise ollama --installed`` and ``kvadvise verify ollama NAME``
        (kvadvise.plugins.CommandProvider)."""
        from kvadvise.backends.ollama.commands import ollama_command, verify_ollama_command, with_installed

        cli.add_command(with_installed(ollama_command))  # NAME optional: `kvadvise ollama --installed` lists the store
        verify.add_command(verify_ollama_command)

    def runtime(self) -> OllamaRuntime:
        """Ollama as a runtime, for a bare ModelSpec (kvadvise.plugins.RuntimeProvider)."""
        from kvadvise.backends.ollama.runtime import OllamaRuntime

        return OllamaRuntime()

    def runtime_for(self, ref: str) -> tuple[ModelSpec, OllamaRuntime]:
        """``ref`` resolved as `kvadvise ollama REF` resolves it, and Ollama (its default options) bound to that
        model."""
        from kvadvise.backends.ollama.runtime import OllamaRuntime

        return OllamaRuntime().for_model(ref)

    def builtin_models(self) -> tuple[tuple[str, ModelSpec], ...]:
        """The built-in profiles (profiles/ollama_models.json) as (model:tag, spec): what `kvadvise compare`
        compares when it is given no model. Not the embedding models (encoders: no K/V cache, no decode)."""
        from kvadvise.backends.ollama.profiles import profiles
        from kvadvise.model.architecture import ENCODER_ARCHS

        seen = {p.id: p for p in profiles().values()}
        specs = ((pid, seen[pid].spec()) for pid in sorted(seen))
        return tuple((pid, spec) for pid, spec in specs if spec.architecture not in ENCODER_ARCHS)

    def running_models(self, host: str | None = None) -> LiveState:
        """Live state: the server's version and what /api/ps says it holds."""
        from kvadvise.backends.ollama.advice import live_state

        return live_state(host)

    def write_config(
        self, plan: Plan, *, modelfile: str | None, env: str | None, systemd: str | None, force: bool
    ) -> tuple[Written, ...]:
        """Modelfile, env file, systemd drop-in of an Ollama plan (its runtime's writers): atomic, all or
        none, never over a file without ``force``."""
        from kvadvise.backends.ollama.runtime import WRITERS
        from kvadvise.runtime.seam import read_files, write_outputs

        paths = {"--write-modelfile": modelfile, "--write-env": env, "--write-systemd": systemd}
        return write_outputs(plan, WRITERS, paths, force=force, inputs=read_files(plan))

    def verify_running(
        self, name: str, *, host: str | None, load: bool, num_ctx: int | None, predicted_total_bytes: int | None
    ) -> OllamaVerification:
        """After `ollama run`: /api/ps must show size_vram == size and the context asked for."""
        from kvadvise.backends.ollama.verify import verify

        return verify(host, name, load=load, num_ctx=num_ctx, predicted_total_bytes=predicted_total_bytes)
