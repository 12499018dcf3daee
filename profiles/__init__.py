"""Built-in data (installed as kvadvise.profiles): GPUs, Ollama library models, use cases,
each entry with its source."""

from __future__ import annotations

from pathlib import Path


def read_text(name: str) -> str:
    """The text of a data file of this package. Read beside this module (importlib.resources
    costs more than the rest of a plan's start-up, and kvadvise never installs as a zip)."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


def path(name: str) -> Path:
    """A data file of this package, for a program that reads it by name (llama-perplexity -f)."""
    return Path(__file__).parent / name


# kld-text.txt, the text `kvadvise verify quality` measures on: the opening of Shakespeare's Coriolanus
# (public domain), the first 15,957 characters of tinyshakespeare (karpathy/char-rnn
# data/tinyshakespeare/input.txt @ 6f9487a6, itself from Project Gutenberg's Shakespeare).
KLD_TEXT = "kld-text.txt"
KLD_TEXT_SOURCE = "Shakespeare, Coriolanus act I (public domain; via karpathy/char-rnn tinyshakespeare)"
