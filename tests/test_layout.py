"""The package's shape: one installed name, layers that import downward, no import circles."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the installed name of each source folder (pyproject.toml [tool.setuptools.package-dir])
FOLDERS = {"advisor": "kvadvise", "backends": "kvadvise.backends", "profiles": "kvadvise.profiles"}


def _modules() -> dict[str, Path]:
    """kvadvise.* module name -> source file, for every module of the three folders."""
    out: dict[str, Path] = {}
    for folder, pkg in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The kvadvise modules ``name`` imports (at any depth of the file: lazy imports count too)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:  # `from pkg import submodule` is an import of the submodule
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    """No module reaches itself through imports, lazy ones included (a package's __init__ may
    import its submodules; a submodule that imports its package's names would close a circle)."""
    assert _cycles(_graph()) == []


# layers, lowest first: a module may import its own layer and those below, never above
LAYERS = [
    ("kvadvise.errors", "kvadvise.files", "kvadvise.deadline", "kvadvise.text", "kvadvise.units"),
    ("kvadvise.model",),
    ("kvadvise.planner",),
    ("kvadvise.request",),
    ("kvadvise.runtime",),
    ("kvadvise.plugins", "kvadvise.render", "kvadvise.summary", "kvadvise.entry"),
    ("kvadvise.api", "kvadvise.ui"),
    ("kvadvise.cli", "kvadvise.__main__"),
    ("kvadvise.backends",),
]


def _layer(name: str) -> int:
    best = (-1, -1)
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best[1]:
                best = (i, len(p))
    return best[0]


def test_layers_import_downward() -> None:
    upward = [
        f"{a} -> {b}"
        for a, deps in _graph().items()
        for b in deps
        if _layer(a) >= 0 and _layer(b) > _layer(a) and a != "kvadvise"
    ]
    assert upward == []


def test_backends_never_import_the_cli() -> None:
    """A backend brings its commands as a third-party plugin would: from kvadvise.ui (flags, output, the plan
    on the screen) and kvadvise.entry (the one planning entry), never from kvadvise.cli (the group and main)."""
    offenders = [
        f"{a} -> {b}"
        for a, deps in _graph().items()
        for b in deps
        if a.startswith("kvadvise.backends") and (b == "kvadvise.cli" or b.startswith("kvadvise.cli."))
    ]
    assert offenders == []


def test_the_wheel_installs_one_package(tmp_path: Path) -> None:
    """No top-level advisor, backends or profiles reaches site-packages: only kvadvise."""
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if p.returncode != 0 and "No module named" in p.stderr:  # pragma: no cover - setuptools missing in the venv
        pytest.skip(f"cannot build a wheel here: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("kvadvise-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kvadvise"}
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"kvadvise/profiles/gpus.json", "kvadvise/py.typed", "kvadvise/backends/ollama/commands.py"} <= names
    # every module and data file of the three folders is in the wheel: a subpackage missing from
    # pyproject.toml's package list (or a data suffix missing from package-data) fails here
    wanted = {
        f"{name.replace('.', '/')}{'/__init__' if path.name == '__init__.py' else ''}.py"
        for name, path in _modules().items()
    }
    for folder, pkg in FOLDERS.items():
        for data in (ROOT / folder).rglob("*"):
            if data.is_file() and data.suffix in (".json", ".toml", ".typed"):
                wanted.add("/".join([*pkg.split("."), *data.relative_to(ROOT / folder).parts]))
    assert sorted(wanted - names) == []


def test_every_package_is_listed_in_pyproject() -> None:
    """pyproject.toml names the packages one by one (the package-dir mapping rules out find:)."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(text.split("packages = [", 1)[1].split("]", 1)[0].replace('"', " ").replace(",", " ").split())
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages == listed


def test_the_installed_package_is_this_source() -> None:
    """The developers' install (README: pip install -e '.[test]' --config-settings editable_mode=strict) is a
    tree of links to these files, which mypy and import checkers can read; a module added since the install
    is missing from it until the install is run again."""
    import importlib.util

    missing = []
    for name, path in _modules().items():
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or Path(spec.origin).resolve() != path.resolve():
            missing.append(f"{name} ({spec.origin if spec else 'not found'})")
    assert missing == [], "reinstall: python3 -m pip install -e '.[test]' --config-settings editable_mode=strict"


def _shadowing_folder(tmp_path: Path) -> Path:
    """A user's project folder with packages named like kvadvise's source folders, that fail if imported."""
    for name in ("advisor", "backends", "profiles"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} was imported')\n")
    (tmp_path / "backends" / "llamacpp_probe.py").write_text("raise SystemExit(1)\n")
    return tmp_path


def test_runs_from_a_folder_holding_advisor_backends_and_profiles(tmp_path: Path, gemma_path: Path) -> None:
    cwd = _shadowing_folder(tmp_path)
    for argv in (
        [sys.executable, "-m", "kvadvise", "gguf", str(gemma_path), "--gpu", "4090", "--json"],
        [str(Path(sys.executable).with_name("kvadvise")), "gguf", str(gemma_path), "--no-hardware", "--ctx", "4096"],
        [sys.executable, "-m", "kvadvise", "plugins", "--json"],
    ):
        p = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
        assert p.returncode == 0, (argv, p.stderr)
        assert "broken" not in p.stdout or '"broken": []' in p.stdout


@pytest.mark.llama
def test_verify_runs_from_a_folder_holding_backends(tmp_path: Path, gemma_path: Path) -> None:
    """The bug this layout fixes: verify's llama-cpp-python child was `python -m backends.llamacpp_probe`,
    which a user's own backends/ package shadowed (reported as "llama.cpp crashed", exit 3)."""
    cwd = _shadowing_folder(tmp_path)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no llama-server on PATH: the llama-cpp-python child runs
    argv = [str(Path(sys.executable).with_name("kvadvise")), "verify", "llamacpp", str(gemma_path)]
    p = subprocess.run(
        [*argv, "--ctx", "512", "--no-hardware", "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = __import__("json").loads(p.stdout)
    assert doc["measured"]["runner"] == "llama-cpp-python"
    assert doc["error"]["kv_bytes"] == 0
