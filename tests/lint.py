"""ruff and mypy over the package as it installs: ``python tests/lint.py``.

mypy cannot follow setuptools' editable-install finder, and the source folders
(advisor/, backends/, profiles/) are not named as the package they install as
(kvadvise, kvadvise.backends, kvadvise.profiles). So this lays out
build/typecheck/kvadvise as links to the source files and checks that.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    tree = ROOT / "build" / "typecheck"
    shutil.rmtree(tree, ignore_errors=True)
    pkg = tree / "kvadvise"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "advisor").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "backends").symlink_to(ROOT / "backends")
    (pkg / "profiles").symlink_to(ROOT / "profiles")
    rc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "advisor", "backends", "tests", "benchmarks"], cwd=ROOT
    ).returncode
    rc |= subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "advisor", "backends"], cwd=ROOT
    ).returncode
    mypy = [sys.executable, "-m", "mypy", "-p", "kvadvise", "--config-file", str(ROOT / "pyproject.toml")]
    rc |= subprocess.run(mypy, cwd=tree).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
