"""ruff and mypy over the package as it installs: ``python tests/lint.py``.

The source folders (advisor/, backends/, profiles/) are installed as kvadvise, kvadvise.backends and
kvadvise.profiles. The developers' install (README, Quick start: ``pip install -e '.[test]'
--config-settings editable_mode=strict``) lays the package out as links to these files under
build/__editable__*/, which mypy reads as the package it is (setuptools' default editable mode maps
the names with an import hook that mypy cannot follow).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    rc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "advisor", "backends", "tests", "benchmarks"], cwd=ROOT
    ).returncode
    rc |= subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "advisor", "backends"], cwd=ROOT
    ).returncode
    spec = importlib.util.find_spec("kvadvise")
    if spec is None or spec.origin is None or "__editable__" not in spec.origin:
        print(
            "tests/lint.py: mypy needs the strict editable install: "
            "python3 -m pip install -e '.[test]' --config-settings editable_mode=strict",
            file=sys.stderr,
        )
        return rc | 2
    mypy = [sys.executable, "-m", "mypy", "-p", "kvadvise", "--config-file", str(ROOT / "pyproject.toml")]
    rc |= subprocess.run(mypy, cwd=ROOT / "build").returncode  # not the source root: advisor/ is not kvadvise
    return rc


if __name__ == "__main__":
    sys.exit(main())
