"""llama-swap's config file: several llama-server processes behind one proxy, each started from its ``cmd``
when a client asks for its model, stopped after ``ttl`` seconds idle, and ``groups`` that say which models
may run at once (mostlygeek/llama-swap at 0bdb3720199f, 2026-08-22: config.example.yaml, config-schema.json,
internal/config/load.go).

- ``cmd`` is split as a POSIX shell would split it (internal/config/commands.go SanitizeCommand: lines that
  start with ``#`` dropped, then shlex.Posix.Split; on Windows shlex.Windows.Split, the C runtime's rules, where
  a single quote is a character), so each argument is written quoted for the platform it runs on, one flag a
  line; ``${PORT}`` is llama-swap's macro for the port it assigns (a reserved macro name, load.go).
- a group with ``swap: false`` keeps all its members loaded at once; ``exclusive: true`` unloads every
  other group when one of its members is asked for; a model belongs to one group only, and a model in no
  group goes to the default group (one model at a time: AddDefaultGroupToConfig). So groups of models that
  fit together, each exclusive, never run a set that does not fit.
- the top-level ``groups:`` key is read by every llama-swap release; newer ones also read it under
  ``routing.router.settings`` and refuse a config that uses both (load.go), so only the top-level key is
  written.

YAML is written by hand (no YAML library is a dependency): keys and strings as JSON strings, which YAML
1.2 reads as double-quoted scalars; the ``cmd`` as a literal block.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from kvadvise.errors import InputError

PORT_MACRO = "${PORT}"  # llama-swap's reserved macro: the port it assigns to this model's process
FOREVER_TTL_S = 0  # config.example.yaml: "a ttl of 0 will mean never unload"


@dataclass(frozen=True, slots=True)
class SwapModel:
    """One model of the config: the name clients ask for and the llama-server command that serves it."""

    name: str
    args: tuple[str, ...]  # the command line without --port: the binary, then the planned flags
    ttl_s: int  # seconds idle before llama-swap stops it; 0 = never
    comments: tuple[str, ...] = ()  # written as ``#`` lines of the cmd (llama-swap drops them)
    aliases: tuple[str, ...] = ()  # other names it answers to (the model's ``aliases``: config-schema.json)


@dataclass(frozen=True, slots=True)
class SwapGroup:
    """Models that stay loaded together (``swap: false``), alone on the machine (``exclusive: true``)."""

    name: str
    members: tuple[str, ...]


def config_text(
    models: Sequence[SwapModel],
    groups: Sequence[SwapGroup],
    *,
    header: Sequence[str] = (),
    windows: bool | None = None,
) -> str:
    """The YAML config for ``llama-swap --config FILE``; ``windows``: quoted for llama-swap on Windows (default:
    this machine's)."""
    win = sys.platform == "win32" if windows is None else windows
    names = [m.name for m in models]
    grouped = [x for g in groups for x in g.members]
    if len(set(names)) != len(names) or len(set(grouped)) != len(grouped) or not set(grouped) <= set(names):
        # load.go: "model member %s is used in multiple groups"; members are model IDs of the models section
        raise ValueError("llama-swap: every group member must be one model of the config, in one group only")
    lines = [f"# {h}" for h in header]
    lines.append("models:")
    for m in models:
        lines.append(f"  {_string(m.name)}:")
        lines.append("    cmd: |")
        lines.extend(f"      # {c}" for c in m.comments)
        args = [*m.args[:1], "--port", PORT_MACRO, *m.args[1:]]
        lines.extend(f"      {line}" for line in _cmd_lines(args, windows=win))
        lines.append(f"    ttl: {int(m.ttl_s)}")
        if m.aliases:
            lines.append("    aliases:")
            lines.extend(f"      - {_string(a)}" for a in m.aliases)
    if groups:
        lines.append("groups:")
        for g in groups:
            lines.append(f"  {_string(g.name)}:")
            lines.append("    swap: false")
            lines.append("    exclusive: true")
            lines.append("    members:")
            lines.extend(f"      - {_string(x)}" for x in g.members)
    return "\n".join(lines) + "\n"


def _string(s: str) -> str:
    """A YAML double-quoted scalar: a JSON string (YAML 1.2 is a superset of JSON; ensure_ascii keeps it
    printable)."""
    return json.dumps(s, ensure_ascii=True)


def _cmd_lines(args: Sequence[str], *, windows: bool = False) -> list[str]:
    """The command, a flag and its value a line, each argument shell-quoted (SanitizeCommand splits the
    joined lines as a POSIX shell does). A value that llama-swap would read as a macro (``${``) or that
    breaks the block (a line break) is refused."""
    for a in args:
        if a != PORT_MACRO and "${" in a:
            raise InputError(
                f"llama-swap: {a!r} holds '${{', which llama-swap reads as a macro",
                hint="rename or link the file to a path without '${', then write the config",
            )
        if "\n" in a or "\r" in a:
            raise InputError(f"llama-swap: {a!r} holds a line break", hint="rename the file")
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if i > 0 and a.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(f"{a} {_quote(args[i + 1], windows)}")
            i += 2
            continue
        out.append(_quote(a, windows))
        i += 1
    return out


def _quote(a: str, windows: bool = False) -> str:
    if a == PORT_MACRO:
        return a
    # Windows: the C runtime's quoting (subprocess.list2cmdline), which shlex.Windows.Split reads back
    return subprocess.list2cmdline([a]) if windows else shlex.quote(a)
