"""Backend: a local GGUF file."""

from __future__ import annotations

from advisor.architecture import from_gguf
from advisor.headercache import read
from advisor.spec import ModelSpec


class GGUFFileBackend:
    name = "gguf"
    summary = "a local GGUF file (header only; the weights are never read; headers are cached)"

    def load_spec(self, ref: str) -> ModelSpec:
        return from_gguf(read(ref))
