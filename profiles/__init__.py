"""Built-in data (installed as kvadvise.profiles): GPUs, Ollama library models, use cases,
each entry with its source."""

from __future__ import annotations

from pathlib import Path


def read_text(name: str) -> str:
    """The text of a data file of this package. Read beside this module (importlib.resources
    costs more than the rest of a plan's start-up, and kvadvise never installs as a zip)."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")
