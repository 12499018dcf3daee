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


# The default answers' width: a terminal of 100 columns shows each line whole (issue 39: "~100 characters")
WIDTH = 100
# A row's label (``memory: ``, ``why: ``, ``note: ``): its continuation lines start under the text after it
_LABEL = re.compile(r"\s*(?:[a-z][A-Za-z ()/-]{0,40}: )?")


def _breaks(text: str, width: int, floor: int) -> dict[str, int]:
    """Where ``text`` may break, by separator: the end of the last ``; ``, ``: ``, ``, `` and space in
    ``[floor, width]`` outside parentheses (``(past 34k: extrapolated)`` is read whole)."""
    found: dict[str, int] = {}
    depth = 0
    for i, ch in enumerate(text[:width]):
        depth += (ch == "(") - (ch == ")")
        if depth <= 0 and ch == " " and i + 1 >= floor:
            sep = text[i - 1 : i + 1] if text[i - 1] in ";:," else " "
            found[sep] = i + 1
    return found


def wrapped(row: str, width: int = WIDTH) -> list[str]:
    """A prose row of an answer as lines of at most ``width`` characters (a word longer than that stays
    whole). It breaks where the sentence does: after the last ``; `` that fits, else ``: ``, else ``, ``
    or a space two-thirds into the line, never inside parentheses and never in the first third (no line is a stub); each continuation
    starts under the text after the row's label (``memory: ``), or 4 spaces deeper than the row when it
    has none. Commands are never given here: a wrapped command would not run."""
    if len(row) <= width:
        return [row]
    indent = len(row) - len(row.lstrip())
    label = _LABEL.match(row)
    lead = label.end() if label is not None and label.end() > indent else indent + 4
    pad = " " * min(lead, width // 3)
    out, rest = [], row
    while len(rest) > width:
        at = _breaks(rest, width + 1, max(len(pad) + 1, width // 3))
        full = 2 * width // 3  # a comma or a space only where the line is two-thirds full, if it can be
        late = [at[s] for s in (", ", " ") if at.get(s, 0) >= full]
        cut = at.get("; ") or at.get(": ") or (late[0] if late else 0) or at.get(", ") or at.get(" ")
        if not cut:  # before the parenthesis rather than inside it, if that leaves a quarter of a line
            cut = max(_breaks(rest, width + 1, max(len(pad) + 1, width // 4)).values(), default=0)
        if not cut:  # a parenthesis longer than the line: inside it, at its last space that fits
            cut = rest.rfind(" ", max(len(pad) + 1, width // 3), width + 1) + 1
        if not cut:  # a word longer than the line: whole, up to the next space
            cut = (rest.find(" ", width) + 1) or len(rest)
        out.append(rest[:cut].rstrip())
        rest = pad + rest[cut:].lstrip()
        if not rest.strip():
            return out
    return [*out, rest]


def command_lines(row: str, width: int = WIDTH) -> list[str]:
    """A command row of an answer as lines of at most ``width`` characters where it can be: broken before an
    option (a word that starts with ``-``), each line but the last ending in `` \\`` (a POSIX shell's
    continuation, so the lines still run when pasted), continuations 4 spaces deeper; an option longer than a
    line stays whole."""
    if len(row) <= width:
        return [row]
    indent = len(row) - len(row.lstrip())
    pad = " " * (indent + 4)
    words = row.split(" ")[indent:]
    out: list[str] = []
    line = " " * indent + words[0]
    for i, w in enumerate(words[1:], 1):
        starts = w.startswith("-") and i + 1 < len(words)
        if starts and len(line) + 1 + len(w) + 1 + len(words[i + 1]) + 2 > width and line.strip():
            out.append(line + " \\")
            line = pad + w
        else:
            line += " " + w
    return [*out, line]
