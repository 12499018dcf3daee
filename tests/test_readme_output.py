"""The outputs README.md and docs/*.md quote are the program's: every block marked ``<!-- output: checked -->`` is
run and compared line by line (tests/readme_output.py; ``python tests/readme_output.py --write`` regenerates
them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from readme_output import README, ROOT, Example, examples, filtered, pages, run, setting, stages

EXAMPLES = [(page, ex) for page in pages() for ex in examples(page.read_text(encoding="utf-8"))]


def test_the_readme_has_checked_examples() -> None:
    found = list(examples(README.read_text(encoding="utf-8")))
    assert len(found) >= 4
    assert found[0].command.startswith("kvadvise ollama "), "the front page starts with an Ollama plan"
    assert any(ex.command.startswith("kvadvise llamacpp ") for ex in found)


def test_every_page_is_looked_at() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/commands.md", "docs/policy.md"} <= names
    assert sum(1 for page, _ in EXAMPLES if page != README) >= 10


@pytest.mark.parametrize(
    ("page", "example"), EXAMPLES, ids=[f"{p.relative_to(ROOT).as_posix()}: {ex.command}" for p, ex in EXAMPLES]
)
def test_quoted_output_is_what_the_program_prints(
    page: Path, example: Example, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = setting(tmp_path, gemma_path)
    monkeypatch.chdir(tmp_path)
    printed = run(example.command, env)
    assert printed.strip(), f"{example.command!r} prints nothing here: a filter that selects nothing quotes nothing"
    assert printed.rstrip("\n").splitlines() == example.shown.rstrip("\n").splitlines(), (
        f"{page.relative_to(ROOT)} is stale: python tests/readme_output.py --write"
    )


def test_filters_as_the_shell_applies_them() -> None:
    """``| grep``, ``| head`` and ``| tail`` after a command, as GNU grep and coreutils give them."""
    assert stages("kvadvise gguf m.gguf --gpu 'rtx 3060' | grep -E 'a|b' -A1 | tail -2  # note") == [
        ["kvadvise", "gguf", "m.gguf", "--gpu", "rtx 3060"],
        ["grep", "-E", "a|b", "-A1"],
        ["tail", "-2"],
    ]
    text = "x\na 1\n  more\ny\nz\nb 2\n  more\nw\n"
    assert filtered(text, [["grep", "-A1", "^[ab] "]]) == "a 1\n  more\n--\nb 2\n  more\n"
    assert filtered(text, [["grep", "-v", "more"], ["head", "-n", "2"]]) == "x\na 1\n"
    assert filtered(text, [["tail", "-1"]]) == "w\n"
    with pytest.raises(ValueError, match="only grep, head and tail"):
        filtered(text, [["sort"]])
