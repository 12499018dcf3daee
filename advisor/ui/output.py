"""The one place the CLI writes to the terminal: results to stdout (text or JSON),
notes, errors and hints to stderr, each prefixed ``kvadvise:``.

Every text that reaches the terminal goes through :func:`safe`: model names,
``general.name``, parameters and server strings come from files and servers
a user may not trust, and a control character or ANSI escape in them could
rewrite what the user sees. kvadvise's own text has no control characters
but the newline, so escaping them all here fixes it at the root. A newline
inside such a string would still start a line of its own: a note, an error,
a hint and a :func:`line` are one line whatever they hold
(kvadvise.text.one_line), and the text builders make each row one line.

Output to a closed pipe (``kvadvise ... | head -1``) ends the command as a
program killed by SIGPIPE would, exit 141, with nothing more written
(:class:`OutputClosed`).
"""

from __future__ import annotations

import json
import re

import click

from kvadvise.errors import InputError
from kvadvise.text import one_line

# C0 controls but \n and \t, DEL, the C1 controls, the Unicode line/paragraph separators, bidi marks,
# overrides and isolates, and lone surrogates (a file name that is not UTF-8 arrives as \udcXX: printed
# raw it cannot even be encoded, and the command would die on its own error message)
_UNSAFE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"  # compiled (and cached) by re on first use


def safe(text: str) -> str:
    r"""``text`` with every control character shown as an escape (``\x1b``, ``\u202e``), never acted on."""
    return re.sub(_UNSAFE, lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class OutputClosed(Exception):
    """stdout or stderr is a pipe whose reader has gone (EPIPE): the command stops (kvadvise.cli.main)."""


# What a stream that cannot encode them (cp1252, latin-1: `kvadvise ... > plan.txt` on Windows) gets instead
_ASCII = str.maketrans({"≈": "~", "≤": "<=", "≥": ">=", "×": "x", "→": "->", "—": "-", "–": "-", "µ": "u", "…": "..."})


def _echo(text: str, *, err: bool = False) -> None:
    import sys

    if (sys.stderr if err else sys.stdout) is None:  # started with the stream closed (>&-): nothing reaches anyone
        raise InputError(
            f"cannot write to {'stderr' if err else 'stdout'} (it is closed)",
            hint="send the output somewhere it can be written",
        )
    try:
        try:
            click.echo(text, err=err)
        except UnicodeEncodeError:  # the plan in the stream's own characters, not an internal error
            stream = sys.stderr if err else sys.stdout
            encoding = str(getattr(stream, "encoding", None) or "ascii")
            plain = text.translate(_ASCII).encode(encoding, errors="replace").decode(encoding, errors="replace")
            click.echo(plain, err=err)
    except BrokenPipeError:
        raise OutputClosed from None
    except OSError as e:  # a full disk (> /dev/full), an I/O error: where the output was sent, exit 2
        raise InputError(
            f"cannot write to {'stderr' if err else 'stdout'} ({e.strerror or e})",
            hint="send the output somewhere it can be written",
        ) from None


def result(text: str) -> None:
    """The command's answer, as text (several lines: each built one line by kvadvise.text.lines)."""
    _echo(safe(text))


def line(text: str) -> None:
    """One line of the command's answer: a line break in it (a name, a path) is shown escaped."""
    _echo(safe(one_line(text)))


def result_json(doc: object) -> None:
    """The command's answer, as one JSON document (JSON escapes control characters itself)."""
    _echo(json.dumps(doc, indent=2))


def note(message: str) -> None:
    """Progress and side remarks, on stderr."""
    _echo(safe(one_line(f"kvadvise: {message}")), err=True)


def note_line(text: str) -> None:
    """A line that goes on with the note before it (a hint to apply a file), on stderr."""
    _echo(safe(one_line(text)), err=True)


ERROR_WIDTH = 1000  # an error or hint longer than this (it quotes a 5,000-character input) is cut in the middle


def error(message: str, hint: str | None = None) -> None:
    _echo(safe(one_line(_clip(f"kvadvise: error: {message}"))), err=True)
    if hint:
        _echo(safe(one_line(_clip(f"kvadvise: hint: {hint}"))), err=True)


def _clip(text: str) -> str:
    """``text`` with its middle cut out past :data:`ERROR_WIDTH`: what was read starts it, why ends it."""
    if len(text) <= ERROR_WIDTH:
        return text
    keep = (ERROR_WIDTH - 40) // 2
    return f"{text[:keep]} ... ({len(text) - 2 * keep:,} characters) ... {text[-keep:]}"


def progress(done: int, total: int, what: str) -> None:
    """How far a long job is (``reading headers 340/1,000``), on stderr, rewritten in place and cleared
    when done: on a terminal only (a pipe or a log gets nothing), and only about every hundredth step."""
    import sys

    if not sys.stderr.isatty() or (done % max(1, total // 100) and done != total):
        return
    text = f"kvadvise: {what} {done:,}/{total:,}"
    click.echo(f"\r{' ' * len(text)}\r" if done == total else f"\r{text}", err=True, nl=False)
