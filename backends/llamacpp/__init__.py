"""Backend: llama.cpp. A GGUF file, its llama-server command, and measuring a config on
the real runtime (runners.py: the user's llama-server or llama-cpp-python in a child,
probe.py: that child, childproc.py: killing it on every path); commands.py brings
``kvadvise llamacpp``, ``kvadvise verify llamacpp`` and ``kvadvise verify quality`` (perplexity.py:
llama.cpp's KL divergence of a quantized cache) through the plugin interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvadvise.model.spec import ModelSpec

if TYPE_CHECKING:
    import click

    from kvadvise.planner.memory import RunConfig
    from kvadvise.runtime.llamaserver import LlamaServer, ModelSource
    from kvadvise.runtime.verification import Measurement


class LlamaCppBackend:
    name = "llamacpp"
    summary = "llama.cpp: a GGUF file, its llama-server command, and `verify` on the real runtime"

    def load_spec(self, ref: str) -> ModelSpec:
        """A local file, or any remote name the gguf backend reads (URL, hf://, USER/REPO:QUANT)."""
        from kvadvise.backends.gguf_file import GGUFFileBackend

        return GGUFFileBackend().load_spec(ref)

    def register_commands(self, cli: click.Group, verify: click.Group) -> None:
        """``kvadvise llamacpp MODEL`` and ``kvadvise verify llamacpp MODEL`` (kvadvise.plugins.CommandProvider)."""
        from kvadvise.backends.llamacpp.commands import (
            llamacpp_command,
            verify_llamacpp_command,
            verify_quality_command,
        )

        cli.add_command(llamacpp_command)
        verify.add_command(verify_llamacpp_command)
        verify.add_command(verify_quality_command)

    def runtime(self) -> LlamaServer:
        """llama-server for a bare ModelSpec: no command line (kvadvise.plugins.RuntimeProvider)."""
        from kvadvise.runtime.llamaserver import LlamaServer

        return LlamaServer()

    def runtime_for(self, ref: str) -> tuple[ModelSpec, LlamaServer]:
        """``ref`` read as `kvadvise llamacpp REF` reads it, and llama-server bound to it: the plan carries
        its command line."""
        from kvadvise.runtime.llamaserver import LlamaServer

        return self.load_spec(ref), LlamaServer(self.model_source(ref))

    def model_source(self, ref: str) -> ModelSource:
        from kvadvise.backends.llamacpp.runners import model_source

        return model_source(ref)

    def measure(
        self,
        model_path: str,
        cfg: RunConfig,
        *,
        server: str | None = None,
        timeout_s: float = 600,
        progress: Callable[[str], None] = lambda _: None,
    ) -> Measurement:
        """Run ``cfg`` on real llama.cpp (kvadvise.plugins.Measurer)."""
        from kvadvise.backends.llamacpp.runners import measure

        return measure(model_path, cfg, server=server, timeout_s=timeout_s, progress=progress)
