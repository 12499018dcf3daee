"""The kvadvise command line.

The core brings the group, ``verify``, ``calibration`` and ``plugins``; every
model command (``gguf``, ``hf``, ``llamacpp``, ``ollama`` and their ``verify``
subcommands) is brought by its backend through the plugin interface
(kvadvise.plugins.CommandProvider), exactly as a third-party plugin would,
and loaded only when asked for. Commands only parse, call and render;
``main()`` is the only place that turns errors into messages and exit codes.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import ClassVar

import click

from kvadvise.errors import EXIT_BUG, EXIT_INPUT, EXIT_PIPE, KvadviseError
from kvadvise.ui import output


class _BackendCommands:
    """Finds a command that is not a core one among the installed backends, by name."""

    registered: ClassVar[set[str]] = set()

    @classmethod
    def find(cls, group: click.Group, ctx: click.Context, name: str) -> click.Command | None:
        from kvadvise.plugins import CommandProvider, discover

        registry = discover()
        if name not in registry.targets:
            if group is not cli:  # a verify command not named after its backend (`verify quality`: llama.cpp's)
                cls.names(group, ctx)  # registers every backend's commands, as --help does
                return click.Group.get_command(group, ctx, name)
            return None
        backend = registry.get(name)
        if name not in cls.registered:
            cls.registered.add(name)
            if isinstance(backend, CommandProvider):
                backend.register_commands(cli, verify)
        cmd = click.Group.get_command(group, ctx, name)
        if cmd is None and group is cli:  # a backend without commands of its own: the generic one
            from kvadvise.ui.show import plan_command

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

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command name gets the close ones: `kvadvise olama` -> did you mean ollama?"""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            if not args or "No such command" not in e.message:
                raise
            import difflib

            close = difflib.get_close_matches(args[0], self.list_commands(ctx), n=2, cutoff=0.6)
            if not close:
                raise
            raise click.UsageError(
                f"No such command {args[0]!r}; did you mean {' or '.join(close)}?", ctx=ctx
            ) from None

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
        return _run(argv)
    except output.OutputClosed:  # stderr closed too, while an error was being told
        return _output_closed()
    except KvadviseError as e:  # stderr could not be written either (a full disk): the exit code tells
        if _debug(argv):
            raise
        return e.exit_code


def _run(argv: list[str] | None) -> int:
    try:
        rc = cli.main(args=argv, prog_name="kvadvise", standalone_mode=False)
    except output.OutputClosed:
        return _output_closed()
    except SystemExit as e:
        # click's own output (--help, a usage error) to a closed pipe: click.core.Command.main catches EPIPE,
        # wraps the streams (_PacifyFlushWrapper) and calls sys.exit(1), even with standalone_mode=False
        if e.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
            return _output_closed()
        raise
    except KvadviseError as e:
        if _debug(argv):
            raise
        output.error(e.message, e.hint)
        return e.exit_code
    except click.exceptions.Abort:
        output.note("aborted")
        return 130
    except click.exceptions.NoArgsIsHelpError as e:  # `kvadvise verify`: its help, as help, on stderr
        if e.ctx is not None:
            for line in e.ctx.get_help().splitlines():
                output.note_line(line)
        return EXIT_INPUT
    except click.ClickException as e:
        output.error(_as_typed(e, sys.argv[1:] if argv is None else argv), _usage_hint(e))
        return EXIT_INPUT
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except BrokenPipeError:
        return _output_closed()
    except OSError as e:
        if _debug(argv):
            raise
        if e.filename is None and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            # click's own output (--help) to a full disk: as output.result says it
            output.error(f"cannot write the output ({e.strerror})", "send the output somewhere it can be written")
            return EXIT_INPUT
        if e.filename is None:
            return _bug(e)
        # a file system refusal no check foresaw (a folder that cannot be entered): the path and why, exit 2
        why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or type(e).__name__)
        output.error(f"{os.fsdecode(e.filename)}: {why}")
        return EXIT_INPUT
    except Exception as e:
        if _debug(argv):
            raise
        return _bug(e)
    return rc if isinstance(rc, int) else 0


def _as_typed(e: click.ClickException, argv: list[str]) -> str:
    """click's message, an unknown short option named as the user typed it: click reads ``-ngl`` as ``-n -g -l``
    and says "No such option '-n'", a letter nobody typed (llama.cpp's -ngl is the layers kvadvise plans)."""
    if isinstance(e, click.NoSuchOption) and not e.option_name.startswith("--"):
        typed = next(
            (a for a in argv if a.startswith(e.option_name) and len(a) > len(e.option_name) and a[1] != "-"), None
        )
        if typed is not None:
            return f"No such option {typed.partition('=')[0]!r}."
    return e.format_message()


def _usage_hint(e: click.ClickException) -> str | None:
    """A missing argument or a bad option: the command's usage line, and where to read more."""
    ctx = getattr(e, "ctx", None)
    if not isinstance(e, click.UsageError) or ctx is None or isinstance(e, click.NoSuchOption):
        return None
    if isinstance(e, (click.MissingParameter, click.BadArgumentUsage)):
        return f"{ctx.get_usage().strip()}  (kvadvise {ctx.command_path.partition(' ')[2]} --help: the flags, examples)"
    return None


def _bug(e: BaseException) -> int:
    output.note(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
    return EXIT_BUG


def _output_closed() -> int:
    """The reader of stdout (or stderr) went away: say nothing more, exit 141 as `yes | head -1`'s yes does.
    Both streams are pointed at /dev/null so Python's final flush cannot fail on them (exit 120, a
    traceback of BrokenPipeError)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return EXIT_PIPE
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            continue
    os.close(devnull)
    return EXIT_PIPE


def run() -> None:
    """The console script: main()'s exit code; where a network call was given up on and its worker is still blocked in
    a read, the streams are flushed and the process leaves without finalizing the interpreter (os._exit), which a
    daemon thread inside a read can crash (kvadvise.deadline)."""
    code = main()
    from kvadvise import deadline

    if deadline.abandoned_workers():
        import contextlib

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
