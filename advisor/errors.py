"""Domain errors. Core code raises these; only ``kvadvise.cli.main`` turns them
into a one-line message and an exit code (documented in docs/exit-codes.md)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BUG = 1
EXIT_INPUT = 2
EXIT_NO_FIT = 3
EXIT_UNREACHABLE = 4
EXIT_PIPE = 141  # the reader of the output went away (`| head`): as a program killed by SIGPIPE (128 + 13)


class KvadviseError(Exception):
    """Base class: a message for the user and an optional hint."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(KvadviseError):
    """Bad input or usage: a file, a flag value, a config that cannot be read."""


class GGUFError(InputError):
    """A GGUF header that cannot be trusted (truncated, corrupt, hostile)."""


class ConfigError(InputError):
    """A run configuration llama.cpp would refuse (e.g. quantized V without FA)."""


class DoesNotFit(KvadviseError):
    """Nothing fits the memory budget, or a verification failed."""

    exit_code = EXIT_NO_FIT


class BackendUnreachable(KvadviseError):
    """A server or service the command needs did not answer."""

    exit_code = EXIT_UNREACHABLE
