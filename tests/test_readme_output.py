"""The outputs README.md quotes are the program's: every block marked ``<!-- output: checked -->`` is run and
compared line by line (tests/readme_output.py; ``python tests/readme_output.py --write`` regenerates them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from readme_output import README, Example, examples, run, setting


def test_the_readme_has_checked_examples() -> None:
    found = list(examples(README.read_text(encoding="utf-8")))
    assert len(found) >= 3
    assert any(ex.command.startswith("kvadvise ollama ") for ex in found)


@pytest.mark.parametrize("example", list(examples(README.read_text(encoding="utf-8"))), ids=lambda ex: ex.command)
def test_readme_output_is_what_the_program_prints(
    example: Example, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = setting(tmp_path, gemma_path)
    monkeypatch.chdir(tmp_path)
    printed = run(example.command, env)
    assert printed.rstrip("\n").splitlines() == example.shown.rstrip("\n").splitlines(), (
        "README.md is stale: python tests/readme_output.py --write"
    )
