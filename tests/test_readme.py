"""The documentation and the CLI cannot drift: every command and every option of every command is
documented in docs/commands.md (the reference of every command and flag), and every command a page
heads a section with (README.md, docs/*.md) exists."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kvadvise.cli import cli

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
PAGES = {
    p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
    for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
}


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    ctx = click.Context(group)
    out: dict[tuple[str, ...], click.Command] = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out[(*prefix, name)] = cmd
        if isinstance(cmd, click.Group):
            out.update(_commands(cmd, (*prefix, name)))
    return out


def test_every_command_has_a_section() -> None:
    headed = re.findall(r"^#{2,3} .*$", COMMANDS, flags=re.M)
    missing = [" ".join(path) for path in _commands(cli) if not any(f"`kvadvise {' '.join(path)}" in h for h in headed)]
    assert missing == []


def test_every_option_is_documented() -> None:
    missing = []
    for path, cmd in _commands(cli).items():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                longs = [o for o in p.opts if o.startswith("--")]
                if longs and not any(re.search(rf"[` ]{re.escape(o)}(?![\w-])", COMMANDS) for o in longs):
                    missing.append(f"kvadvise {' '.join(path)} {longs[0]}")
    assert missing == []


def test_every_command_a_page_heads_exists() -> None:
    known = {" ".join(path) for path in _commands(cli)}
    headed = {}
    for name, text in PAGES.items():
        # the command's words: up to its first argument (MODEL, NAME[:TAG]) or option (--installed)
        for h in re.findall(r"^#{1,3} .*?`kvadvise ([a-z][a-z ]*?)(?: [A-Z\[-]|`|\|)", text, flags=re.M):
            headed[h.strip()] = name
    assert headed and {h: page for h, page in headed.items() if h not in known} == {}
