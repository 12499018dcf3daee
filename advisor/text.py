"""Text from files, servers and the command line, made fit for one line of output.

A model name, a file name, a parameter or a server's error message may hold a
line break; printed inside a table row or a note, it starts a row of its own
that kvadvise never wrote (a forged model in ``ollama --installed``, a second
``kvadvise:`` message). :func:`one_line` shows every line break as its escape,
so a line kvadvise builds stays one line. The control characters other than
the newline are escaped by ``kvadvise.ui.output.safe`` on the way out.
"""

from __future__ import annotations

import re

# What str.splitlines() breaks at: LF, CR, VT, FF, the file/group/record separators, NEL, LS, PS
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    r"""``text`` with every line break shown as its escape (``\n``, ``\r``, ``\x85``, ``\u2028``)."""
    if not _LINE_BREAKS.search(text):
        return text
    return _LINE_BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def lines(rows: list[str]) -> str:
    """Rows, each one line (:func:`one_line`), joined by newlines."""
    return "\n".join(one_line(r) for r in rows)
