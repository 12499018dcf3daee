"""Modelfiles: the one kvadvise writes, and Ollama's parser to read one back.

Writing follows ``parser.Command.String`` (``FROM x``, ``PARAMETER k v``,
values quoted by ``quote``); values are formatted as Go's ``%v`` prints the
params blob (what ``ollama show --modelfile`` writes). Reading is a port of
``parser.ParseFile``'s state machine (Ollama ``parser/parser.go``):
instructions are case-insensitive, ``#`` starts a comment, ``\"\"\"`` (or ``"``)
values may span lines, and PARAMETER names are checked against the JSON tags
of ``api.Options`` + ``api.Runner`` (memory-spec.md §6.g), as ``ollama
create`` does ("unknown parameter"). A rune is kept only where Go's
``strconv.IsPrint`` keeps it, with Go's Unicode 15.0.0 tables (goprint.py),
never the running Python's: on 3.13 (Unicode 15.1) ``str.isprintable`` kept
U+2FFC, which Ollama drops, and a value that read back as one ``stop`` here
was a second ``FROM`` to Ollama.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvadvise.backends.ollama.goprint import is_print
from kvadvise.errors import InputError

if TYPE_CHECKING:
    from kvadvise.backends.ollama.model import OllamaModel
    from kvadvise.backends.ollama.rules import OllamaSettings

RUNNER_PARAMETERS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "draft_num_predict")
PREDICT_PARAMETERS = (
    "num_keep",
    "seed",
    "num_predict",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_last_n",
    "temperature",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
)
VALID_PARAMETERS = frozenset(RUNNER_PARAMETERS + PREDICT_PARAMETERS)
# parser.go deprecatedParameters: `ollama create` warns and skips them
DEPRECATED_PARAMETERS = frozenset(
    {
        "penalize_newline",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mlock",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
    }
)
# parser.go isValidCommand; the name each gets in a parsed command ("from" becomes "model")
INSTRUCTIONS = frozenset(
    {
        "from",
        "license",
        "template",
        "system",
        "adapter",
        "draft",
        "renderer",
        "parser",
        "parameter",
        "message",
        "requires",
    }
)
_NOT_PARAMETERS = frozenset(INSTRUCTIONS - {"from", "parameter"} | {"model"})
_MESSAGE_ROLES = ("system", "user", "assistant")
# the settings kvadvise writes itself; the model's own values for these are replaced
_OWN = ("num_ctx", "num_batch")


# --- writing -------------------------------------------------------------------


def quote(s: str) -> str:
    """parser.go quote."""
    if "\n" in s or s.startswith(" ") or s.endswith(" "):
        if '"' in s:
            return '"""' + s + '"""'
        return '"' + s + '"'
    return s


def format_value(v: object) -> str | None:
    """A parameter value as Go's %v prints what the params blob decodes to; None if it has no text form."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else repr(v)
    if isinstance(v, str):
        return v
    return None


def parameter_lines(name: str, value: object) -> list[str]:
    """``PARAMETER name value`` lines; a list value (``stop``) gives one line per item.

    Only lines that Ollama's parser reads back as exactly this one parameter
    with exactly this value: a value with a ``\\r`` or ``\\n``, a ``\"\"\"``
    that closes its own quote, a character the parser drops, would become a
    second instruction (``SYSTEM``, ``ADAPTER``, ``FROM``, another ``PARAMETER
    num_ctx`` that wins) or another value. Such an item gives no line.
    """
    items: Iterable[object] = value if isinstance(value, (list, tuple)) else (value,)
    out = []
    for item in items:
        text = format_value(item)
        if text is None:
            continue
        line = f"PARAMETER {name} {quote(text)}"
        if _reads_back(line, name, text):
            out.append(line)
    return out


REPEATABLE_SEED = 42


def _reads_back(line: str, name: str, text: str) -> bool:
    """``line`` alone, after a FROM, parses to the one command (name, text)."""
    try:
        return parse_modelfile(f"FROM x\n{line}\n") == [("model", "x"), (name, text)]
    except InputError:
        return False


def modelfile_text(model: OllamaModel, s: OllamaSettings, header: str = "") -> str:
    """``header`` (comment lines), ``FROM name:tag``, ``PARAMETER num_ctx N`` (``num_batch`` only when set;
    ``seed`` and ``temperature 0`` for a repeatable plan), then the model's own parameters.

    Parameters ``ollama create`` would refuse (unknown or deprecated names),
    values its parser would read as more than one value or instruction, and
    the model's own ``num_gpu`` under a full-offload plan (it would override
    the plan's layer count) are left out, with a comment saying so. The text
    is parsed back with the parser port before it is returned: the only
    ``FROM`` and ``num_ctx`` are kvadvise's own.
    """
    lines = [f"FROM {model.ref}", f"PARAMETER num_ctx {s.num_ctx}"]
    if s.num_batch is not None:
        lines.append(f"PARAMETER num_batch {s.num_batch}")
    own: tuple[str, ...] = _OWN
    if s.num_gpu is not None:  # the layers that fit, where the release's own estimate would load fewer
        lines.append(f"PARAMETER num_gpu {s.num_gpu}")
        own += ("num_gpu",)
    if s.repeatable:  # the same tokens run after run: a fixed seed and greedy sampling
        lines += [f"PARAMETER seed {REPEATABLE_SEED}", "PARAMETER temperature 0"]
        own += ("seed", "temperature")
    left_out: list[tuple[str, str]] = []
    for k, v in model.params.items():
        if k in own:
            continue
        if k not in VALID_PARAMETERS:
            left_out.append((k, "not accepted by `ollama create`"))
            continue
        if k == "num_gpu" and s.full_offload:
            # stated, not left out: `ollama create` merges the base model's parameters into the new model's for every
            # key the Modelfile does not set (server/create.go setParameters), so its num_gpu would stay and
            # override the plan's layers; -1 is Ollama's own default (api.Options NumGPU: all that fit)
            lines += ["# kvadvise: the model's own num_gpu would keep layers on the CPU", "PARAMETER num_gpu -1"]
            continue
        got = parameter_lines(k, v)
        n_items = len(v) if isinstance(v, (list, tuple)) else 1
        if len(got) < n_items:
            left_out.append((k, "a value Ollama's parser would read as more than one value or instruction"))
        lines.extend(got)
    for k, why in left_out:
        lines.append(f"# kvadvise: left out the model's parameter {_comment_safe(k)} ({why})")
    text = header + "\n".join(lines) + "\n"
    _check(text, model.ref, s)
    return text


def _comment_safe(k: str) -> str:
    """A parameter name for a comment line: repr, with nothing the parser ends a line at."""
    return ascii(k)


def _check(text: str, ref: str, s: OllamaSettings) -> None:
    """Parse the text back: one FROM (``ref``), one num_ctx (``s.num_ctx``), else refuse to write it."""
    cmds = parse_modelfile(text)
    froms = [a for c, a in cmds if c == "model"]
    ctxs = [a for c, a in cmds if c == "num_ctx"]
    others = {c for c, _ in cmds} & (_NOT_PARAMETERS - {"model"})
    if froms != [ref] or ctxs != [str(s.num_ctx)] or others:
        raise InputError(f"refusing to write a Modelfile for {ref!r} that Ollama would read differently")


# --- reading -------------------------------------------------------------------

_NIL, _NAME, _VALUE, _PARAMETER, _MESSAGE, _COMMENT = range(6)


def _is_alpha(r: str) -> bool:
    return "a" <= r <= "z" or "A" <= r <= "Z"


def _is_space(r: str) -> bool:
    return r in (" ", "\t")


def _is_newline(r: str) -> bool:
    return r in ("\r", "\n")


# Go's unicode.IsSpace, what strings.TrimSpace trims (Python's str.strip also trims U+001C-U+001F)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


class _Unexpected(Exception):
    """parser.go io.ErrUnexpectedEOF / errInvalidCommand from parseRuneForState."""


def _rune(r: str, cs: int) -> tuple[int, str]:
    """parser.go parseRuneForState: (next state, the rune to keep or "")."""
    if cs == _NIL:
        if r == "#":
            return _COMMENT, ""
        if _is_space(r) or _is_newline(r):
            return _NIL, ""
        return _NAME, r
    if cs == _NAME:
        if _is_alpha(r):
            return _NAME, r
        if _is_space(r):
            return _VALUE, ""
        raise _Unexpected("an instruction must be one of " + ", ".join(sorted(INSTRUCTIONS)))
    if cs == _VALUE:
        if _is_newline(r) or _is_space(r):
            return _NIL, r
        return _VALUE, r
    if cs == _PARAMETER:
        if _is_alpha(r) or (r.isascii() and r.isdigit()) or r == "_":
            return _PARAMETER, r
        if _is_space(r):
            return _VALUE, ""
        raise _Unexpected("a PARAMETER needs a name and a value")
    if cs == _MESSAGE:
        if _is_alpha(r):
            return _MESSAGE, r
        if _is_space(r):
            return _VALUE, ""
        raise _Unexpected("a MESSAGE needs a role and a text")
    # comment
    if _is_newline(r):
        return _NIL, ""
    return _COMMENT, ""


def _unquote(s: str) -> tuple[str, bool]:
    """parser.go unquote."""
    if s.startswith('"""'):
        if len(s) >= 6 and s.endswith('"""'):
            return s[3:-3], True
        return "", False
    if s.startswith('"'):
        if len(s) >= 2 and s.endswith('"'):
            return s[1:-1], True
        return "", False
    return s, True


def parse_modelfile(text: str, *, source: str = "Modelfile") -> list[tuple[str, str]]:
    """Parse a Modelfile with Ollama's rules: ``(name, args)`` per instruction, in order.

    Names are Ollama's: ``model`` for FROM, the parameter's name for PARAMETER
    (``num_ctx``, ``stop``, ...), the lower-cased instruction otherwise;
    MESSAGE args are ``role: text``. InputError (with the line) for what
    ``ollama create`` would refuse: an unknown instruction or parameter, an
    unterminated quote, no FROM.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    commands: list[tuple[str, str]] = []
    name = ""
    role = ""
    curr = _NIL
    line = 1
    buf: list[str] = []

    def fail(msg: str) -> InputError:
        return InputError(f"{source} (line {line}): {msg}")

    for ch in text:
        if _is_newline(ch):
            line += 1
        try:
            nxt, r = _rune(ch, curr)
        except _Unexpected as e:
            raise fail(str(e)) from None
        if nxt != curr:
            if curr == _NAME:
                word = "".join(buf)
                if word.lower() not in INSTRUCTIONS:
                    raise fail(f"unknown instruction {word!r}")
                low = word.lower()
                if low == "from":
                    name = "model"
                elif low == "parameter":
                    nxt = _PARAMETER
                elif low == "message":
                    nxt = _MESSAGE
                    name = low
                else:
                    name = low
            elif curr == _PARAMETER:
                name = "".join(buf)
            elif curr == _MESSAGE:
                role = "".join(buf)
                if role not in _MESSAGE_ROLES:
                    raise fail('message role must be one of "system", "user", or "assistant"')
            elif curr == _VALUE:
                value, ok = _unquote("".join(buf).strip(_GO_SPACE))
                if not ok or _is_space(r):
                    buf.append(r)
                    continue
                if role:
                    value, role = f"{role}: {value}", ""
                commands.append((name, value))
            buf.clear()
            curr = nxt
        if r and is_print(r):  # strconv.IsPrint(r), Go's tables
            buf.append(r)

    if curr == _VALUE:
        value, ok = _unquote("".join(buf).strip(_GO_SPACE))
        if not ok:
            raise fail("unterminated quoted value at the end of the file")
        if role:
            value = f"{role}: {value}"
        commands.append((name, value))
    elif curr not in (_NIL, _COMMENT):
        raise fail("the file ends inside an instruction")

    for cmd, _ in commands:
        if cmd not in _NOT_PARAMETERS and cmd not in VALID_PARAMETERS and cmd not in DEPRECATED_PARAMETERS:
            raise InputError(
                f"{source}: unknown parameter {cmd!r}", hint="valid: " + ", ".join(sorted(VALID_PARAMETERS))
            )
    if not any(cmd == "model" for cmd, _ in commands):
        raise InputError(f"{source}: no FROM line")
    return commands


def parameters_of(commands: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The PARAMETER values of parsed commands, by name (``stop`` may repeat)."""
    out: dict[str, list[str]] = {}
    for cmd, args in commands:
        if cmd not in _NOT_PARAMETERS:
            out.setdefault(cmd, []).append(args)
    return out
