"""README.md is a front page and docs/ the reference, and neither can rot: the front page stays short, every
page is reachable, every link and anchor resolves, every file and every ``kvadvise.`` name a page quotes
exists, and the code the pages show runs (the Python API examples, the plugin example, the writer example).
The quoted outputs are checked by test_readme_output.py, the commands and flags by test_readme.py."""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from readme_output import setting

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "tests" / "README.md"]
# published by another change beside these pages: linked before it lands, checked once it has
PUBLISHED_APART = {"docs/schema/plan.schema.json"}
# dotted names that are not kvadvise's modules: a file name (the systemd drop-in), one a benchmark's history names
NOT_NAMES = {"kvadvise.conf", "kvadvise.frozen"}

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _prose(page: Path) -> str:
    """The page without its fenced blocks (commands, outputs, code)."""
    return _FENCE.sub("", _text(page))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#{1,6} (.*)$", _prose(page), flags=re.M):
        s = _slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_readme_is_a_front_page() -> None:
    lines = _text(README).splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move reference to docs/"
    text = "\n".join(lines)
    quick = text[text.index("## Quick start") :]
    # CI (.ci/run) runs the Quick start's install and test command as it is written here
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install = "python3 -m pip install -e '.[test]' --config-settings editable_mode=strict && python3 -m pytest"
    assert install in ci and install in quick
    assert "python3 -m venv .venv" in quick and "git clone " in quick


def test_every_docs_page_is_in_the_index_and_on_the_front_page() -> None:
    index, front = _text(DOCS / "README.md"), _text(README)
    for page in sorted(DOCS.glob("*.md")):
        if page.name == "README.md":
            continue
        assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"
        assert f"](docs/{page.name}" in front, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            if _rel(dest) not in PUBLISHED_APART:
                broken.append(target)
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=_rel)
def test_the_files_a_page_names_exist(page: Path) -> None:
    missing = []
    for span in _CODE.findall(_prose(page)):
        for path in re.findall(
            r"(?<![\w/.-])((?:advisor|backends|tests|benchmarks|profiles|docs|\.ci)/[\w./-]*\w)", span
        ):
            if not (ROOT / path).exists() and path not in PUBLISHED_APART:
                missing.append(path)
    assert missing == []


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_the_kvadvise_names_a_page_quotes_exist(page: Path) -> None:
    names = {
        n for span in _CODE.findall(_prose(page)) for n in re.findall(r"(?<![\w.])kvadvise(?:\.[A-Za-z_]\w*)+", span)
    }
    assert sorted(n for n in names - NOT_NAMES if not _resolves(n)) == []


@pytest.fixture
def in_the_setting(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixed setting the checked outputs run in (tests/readme_output.py), as this process's environment."""
    for var, value in setting(tmp_path, gemma_path).items():
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _blocks(page: Path, mark: str, lang: str) -> list[str]:
    return re.findall(re.escape(mark) + r"\n```" + lang + r"\n(.*?)```", _text(page), re.S)


@pytest.mark.parametrize("page", [README, DOCS / "python-api.md"], ids=_rel)
def test_the_python_examples_run(page: Path, in_the_setting: Path) -> None:
    blocks = _blocks(page, "<!-- python: runs -->", "python")
    assert blocks
    for code in blocks:
        exec(compile(code, f"{_rel(page)} example", "exec"), {"__name__": "example"})


def _module(name: str, code: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(code, f"{name} (from the docs)", "exec"), module.__dict__)
    return module


def test_the_plugin_example_registers_and_plans(in_the_setting: Path, gemma_path: Path) -> None:
    (code,) = re.findall(r"```python\n(# my_runtime/__init__.py\n.*?)```", _text(DOCS / "plugins.md"), re.S)
    module = _module("my_runtime", code)
    backend = module.MyRuntime()
    assert all(hasattr(backend, a) for a in ("name", "summary", "load_spec"))

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file
    from kvadvise.plugins import CommandProvider, capabilities

    assert isinstance(backend, CommandProvider) and capabilities(backend) == ("resolve", "commands")
    backend.load_spec = lambda ref: from_gguf(read_file(str(gemma_path)))  # no /var/lib/myrt here
    group, verify = click.Group("kvadvise"), click.Group("verify")
    backend.register_commands(group, verify)
    result = CliRunner().invoke(group, ["myrt", "gemma", "--ctx", "4k", "--vram", "2GiB", "--ram", "8GiB"])
    assert result.exit_code == 0, result.output
    assert "Gemma 3 270m" in result.output and "-c 4096" in result.output


def test_the_writer_example_adds_an_output_file(in_the_setting: Path) -> None:
    (code,) = re.findall(r"```python\n# advisor/runtime/llamaswap.py\n(.*?)```", _text(DOCS / "development.md"), re.S)
    module = _module("llamaswap", code)

    import kvadvise
    from kvadvise.runtime.llamaserver import WRITERS
    from kvadvise.runtime.seam import Writer, write_outputs
    from kvadvise.ui.show import writer_options, writer_paths

    writer = module.LLAMA_SWAP
    assert isinstance(writer, Writer) and writer.dest == "write_llama_swap"
    writers = (*WRITERS, writer)

    @click.command()
    @writer_options(writers)
    def command(**kwargs: object) -> None:
        paths = writer_paths(kwargs, writers)
        plan = kvadvise.plan("gemma-3-270m-q4_k_m.gguf", kvadvise.PlanRequest(gpu="rtx-3060", use="code"))
        for w in write_outputs(plan, writers, paths, force=bool(kwargs["force"])):
            click.echo(f"{w.option} {w.path}: {' '.join(w.hints)}")

    result = CliRunner().invoke(command, ["--write-llama-swap", "swap.yaml"])
    assert result.exit_code == 0, result.output
    assert "run it with: llama-swap --config swap.yaml" in result.output
    text = (in_the_setting / "swap.yaml").read_text(encoding="utf-8")
    assert "cmd: llama-server -m gemma-3-270m-q4_k_m.gguf -c 32768" in text


def test_the_developer_guide_names_every_floor() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_layout import LAYERS

    guide = _text(DOCS / "development.md")
    floors = guide[guide.index("## The floors") : guide.index("## The invariants")]
    for layer in LAYERS:
        for name in layer:
            short = name.removeprefix("kvadvise.")
            if short == "__main__":  # `python -m kvadvise`, beside the CLI
                continue
            assert f"`{short}.py`" in floors or f"`{short}/`" in floors, name


def test_the_table_of_files_lives_in_the_developer_guide() -> None:
    assert "## Which file a change touches" in _text(DOCS / "development.md")
    assert "Which file a change touches" not in _text(ROOT / "tests" / "README.md")
