"""A test oracle: Ollama's ``parser.ParseFile`` (parser/parser.go, ollama/ollama@00dc3af8) written out
line by line from the Go source, apart from kvadvise's port, with the printability function passed in.

It returns the commands (name, args) or raises ValueError where ParseFile returns an error; it does not
check parameter names (``ollama create`` does that later, in CreateRequest). The fuzzers compare what
kvadvise writes with what this reads under Go's IsPrint (Unicode 15.0).
"""

from __future__ import annotations

from collections.abc import Callable

NIL, NAME, VALUE, PARAMETER, MESSAGE, COMMENT = range(6)
COMMANDS = {"from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter"}
COMMANDS |= {"message", "requires"}
# unicode.IsSpace: what strings.TrimSpace trims
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
GO_SPACE += "\u2028\u2029\u202f\u205f\u3000"


def _alpha(r: str) -> bool:
    return "a" <= r <= "z" or "A" <= r <= "Z"


def _space(r: str) -> bool:
    return r in " \t"


def _newline(r: str) -> bool:
    return r in "\r\n"


def _next(r: str, cs: int) -> tuple[int, str]:
    """parseRuneForState."""
    if cs == NIL:
        if r == "#":
            return COMMENT, ""
        return (NIL, "") if _space(r) or _newline(r) else (NAME, r)
    if cs == NAME:
        if _alpha(r):
            return NAME, r
        if _space(r):
            return VALUE, ""
        raise ValueError("errInvalidCommand")
    if cs == VALUE:
        return (NIL, r) if _newline(r) or _space(r) else (VALUE, r)
    if cs == PARAMETER:
        if _alpha(r) or "0" <= r <= "9" or r == "_":
            return PARAMETER, r
        if _space(r):
            return VALUE, ""
        raise ValueError("io.ErrUnexpectedEOF")
    if cs == MESSAGE:
        if _alpha(r):
            return MESSAGE, r
        if _space(r):
            return VALUE, ""
        raise ValueError("io.ErrUnexpectedEOF")
    return (NIL, "") if _newline(r) else (COMMENT, "")


def _unquote(s: str) -> tuple[str, bool]:
    if s[:3] == '"""':
        return (s[3:-3], True) if len(s) >= 6 and s[-3:] == '"""' else ("", False)
    if s[:1] == '"':
        return (s[1:-1], True) if len(s) >= 2 and s[-1] == '"' else ("", False)
    return s, True


def parse_file(text: str, is_print: Callable[[str], bool]) -> list[tuple[str, str]]:
    """ParseFile, for text that is already decoded (a BOM at the start is dropped, as BOMOverride does)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    commands: list[tuple[str, str]] = []
    cmd_name, role, curr, b = "", "", NIL, ""
    for ch in text:
        nxt, r = _next(ch, curr)
        if nxt != curr:
            if curr == NAME:
                if b.lower() not in COMMANDS:
                    raise ValueError("errInvalidCommand")
                s = b.lower()
                if s == "from":
                    cmd_name = "model"
                elif s == "parameter":
                    nxt = PARAMETER
                else:
                    if s == "message":
                        nxt = MESSAGE
                    cmd_name = s
            elif curr == PARAMETER:
                cmd_name = b
            elif curr == MESSAGE:
                if b not in ("system", "user", "assistant"):
                    raise ValueError("errInvalidMessageRole")
                role = b
            elif curr == VALUE:
                s, ok = _unquote(b.strip(GO_SPACE))
                if not ok or _space(r):
                    b += r
                    continue
                if role:
                    s, role = f"{role}: {s}", ""
                commands.append((cmd_name, s))
            b = ""
            curr = nxt
        if r and is_print(r):
            b += r
    if curr == VALUE:
        s, ok = _unquote(b.strip(GO_SPACE))
        if not ok:
            raise ValueError("io.ErrUnexpectedEOF")
        commands.append((cmd_name, f"{role}: {s}" if role else s))
    elif curr not in (NIL, COMMENT):
        raise ValueError("io.ErrUnexpectedEOF")
    if not any(c == "model" for c, _ in commands):
        raise ValueError("errMissingFrom")
    return commands
