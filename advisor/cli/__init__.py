"""The kvadvise command line.

The core brings the group, ``verify``, ``calibration`` and ``plugins``; every
model command (``gguf``, ``hf``, ``llamacpp``, ``ollama`` and their ``verify``
subcommands) is brought by its backend through the plugin interface
(kvadvise.plugins.CommandProvider), exactly as a third-party plugin would,
and loaded only when asked for. Commands only parse, call and render;
``main()`` is the only place that turns errors into messages and exit codes.
"""

from __future__ import annotations

import os
import sys
from typing import ClassVar

import click

from kvadvise.cli import output
from kvadvise.errors import EXIT_BUG, EXIT_INPUT, KvadviseError


class _BackendCommands:
    """Finds a command that is not a core one among the installed backends, by name."""

    registered: ClassVar[set[str]] = set()

    @classmethod
    def find(cls, group: click.Group, ctx: click.Context, name: str) -> click.Command | None:
        from kvadvise.plugins import CommandProvider, discover

        registry = discover()
        if name not in registry.targets:
            return None
        backend = registry.get(name)
        if name not in cls.registered:
            cls.registered.add(name)
            if isinstance(backend, CommandProvider):
                backend.register_commands(cli, verify)
        cmd = click.Group.get_command(group, ctx, name)
        if cmd is None and group is cli:  # a backend without commands of its own: the generic one
            from kvadvise.cli.plan import plan_command

            cmd = plan_command(name, f"Memory for {backend.summary} (a plugin).", backend.load_spec)
            cli.add_command(cmd)
        return cmd

    @classmethod
    def names(cls, group: click.Group, ctx: click.Context) -> list[str]:
        """For --help: the core's commands and those of every backend that loads (a broken
        plugin is left out here; `kvadvise plugins` names it, and calling it says why)."""
        from kvadvise.plugins import discover

        names = set(click.Group.list_commands(group, ctx))
        for name in discover().targets:
            try:
                found = cls.find(group, ctx, name)
            except KvadviseError:
                continue
            if found is not None:
                names.add(name)
        return sorted(names)


# Core commands whose modules load only when asked for (their imports would slow every other command)
_LAZY_CORE = {
    "compare": ("kvadvise.cli.compare", "compare"),
    "gpus": ("kvadvise.cli.gpus", "gpus"),
    "calibration": ("kvadvise.cli.admin", "calibration_group"),
    "plugins": ("kvadvise.cli.admin", "plugins"),
}


class BackendGroup(click.Group):
    """A group whose commands are the core's plus those the installed backends bring."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = _BackendCommands.names(self, ctx)
        return sorted({*names, *_LAZY_CORE}) if self is cli else names

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if self is cli and name in _LAZY_CORE and name not in self.commands:
            import importlib

            module, attr = _LAZY_CORE[name]
            self.add_command(getattr(importlib.import_module(module), attr))
        return super().get_command(ctx, name) or _BackendCommands.find(self, ctx, name)


@click.group(cls=BackendGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvadvise")
@click.option("--debug", is_flag=True, envvar="KVADVISE_DEBUG", help="Show tracebacks (also KVADVISE_DEBUG=1).")
def cli(debug: bool) -> None:
    """Memory advisor for llama.cpp and Ollama: KV cache, weights and buffers, exactly as llama.cpp allocates them."""


@cli.group(cls=BackendGroup)
def verify() -> None:
    """Prove a config on the real runtime: did it fit, what did it take, how fast was it."""


def _debug(argv: list[str] | None) -> bool:
    return "--debug" in (sys.argv[1:] if argv is None else argv) or os.environ.get("KVADVISE_DEBUG", "") not in (
        "",
        "0",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error becomes one line on stderr and a documented exit code."""
    try:
        rc = cli.main(args=argv, prog_name="kvadvise", standalone_mode=False)
    except KvadviseError as e:
        if _debug(argv):
            raise
        output.error(e.message, e.hint)
        return e.exit_code
    except click.exceptions.Abort:
        output.note("aborted")
        return 130
    except click.ClickException as e:
        output.error(e.format_message())
        return EXIT_INPUT
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except BrokenPipeError:
        return 0
    except Exception as e:
        if _debug(argv):
            raise
        output.note(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
        return EXIT_BUG
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
