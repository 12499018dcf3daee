"""The one place the CLI writes to the terminal: results to stdout (text or JSON),
notes, errors and hints to stderr, each prefixed ``kvadvise:``.

Every text that reaches the terminal goes through :func:`safe`: model names,
``general.name``, parameters and server strings come from files and servers
a user may not trust, and a control character or ANSI escape in them could
rewrite what the user sees. kvadvise's own text has no control characters
but the newline, so escaping them all here fixes it at the root.
"""

from __future__ import annotations

import json
import re

import click

# C0 controls but \n and \t, DEL, the C1 controls, the Unicode line/paragraph separators, bidi marks,
# overrides and isolates, and lone surrogates (a file name that is not UTF-8 arrives as \udcXX: printed
# raw it cannot even be encoded, and the command would die on its own error message)
_UNSAFE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"  # compiled (and cached) by re on first use


def safe(text: str) -> str:
    r"""``text`` with every control character shown as an escape (``\x1b``, ``\u202e``), never acted on."""
    return re.sub(_UNSAFE, lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def result(text: str) -> None:
    """The command's answer, as text."""
    click.echo(safe(text))


def result_json(doc: object) -> None:
    """The command's answer, as one JSON document (JSON escapes control characters itself)."""
    click.echo(json.dumps(doc, indent=2))


def note(message: str) -> None:
    """Progress and side remarks, on stderr."""
    click.echo(safe(f"kvadvise: {message}"), err=True)


def error(message: str, hint: str | None = None) -> None:
    click.echo(safe(f"kvadvise: error: {message}"), err=True)
    if hint:
        click.echo(safe(f"kvadvise: hint: {hint}"), err=True)


def progress(done: int, total: int, what: str) -> None:
    """How far a long job is (``reading headers 340/1,000``), on stderr, rewritten in place and cleared
    when done: on a terminal only (a pipe or a log gets nothing), and only about every hundredth step."""
    import sys

    if not sys.stderr.isatty() or (done % max(1, total // 100) and done != total):
        return
    text = f"kvadvise: {what} {done:,}/{total:,}"
    click.echo(f"\r{' ' * len(text)}\r" if done == total else f"\r{text}", err=True, nl=False)
