"""README.md and the CLI cannot drift: every command and every option of every command is
documented, and every command the README heads a section with exists."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kvadvise.cli import cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


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
    missing = [" ".join(path) for path in _commands(cli) if f"`kvadvise {' '.join(path)}" not in README]
    assert missing == []


def test_every_option_is_documented() -> None:
    missing = []
    for path, cmd in _commands(cli).items():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                longs = [o for o in p.opts if o.startswith("--")]
                if longs and not any(f"`{o}" in README or f" {o}" in README for o in longs):
                    missing.append(f"kvadvise {' '.join(path)} {longs[0]}")
    assert missing == []


def test_every_command_the_readme_heads_exists() -> None:
    known = {" ".join(path) for path in _commands(cli)}
    # the command's words: up to its first argument (MODEL, NAME[:TAG]) or option (--installed)
    headed = re.findall(r"^### `kvadvise ([a-z][a-z ]*?)(?: [A-Z\[-]|`|\|)", README, flags=re.M)
    assert headed and [h.strip() for h in headed if h.strip() not in known] == []
