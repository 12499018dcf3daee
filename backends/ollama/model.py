"""An Ollama model, resolved: the one type every Ollama module shares (it imports none of them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvadvise.model.keys import Vision, key
from kvadvise.model.spec import ModelSpec

if TYPE_CHECKING:  # only a registry model carries one: the header reader is not imported for the others
    from kvadvise.backends.ollama.towers import Tower
    from kvadvise.model.gguf import GGUFHeader
    from kvadvise.model.projector import ProjectorSpec


@dataclass(frozen=True, slots=True)
class OllamaModel:
    """An Ollama model, resolved."""

    name: str  # without the default host/namespace and without the tag: "qwen3", "user/m", "hf.co/u/r"
    tag: str
    spec: ModelSpec
    params: dict[str, Any]  # the model's default options (params layer / /api/show parameters): num_ctx, stop, ...
    projector_bytes: int  # vision projector (mmproj) bytes, 0 if none or unknown
    model_bytes: int  # the GGUF blob (store), the tensors (API) or the download size (profile)
    source: str  # "store:<manifest path>" | "api:<host>" | "registry:<manifest URL>" | "profile:<id>"
    notes: tuple[str, ...] = ()
    digest: str | None = None  # sha256 of the manifest (store): the ID `ollama ps` shows
    projector_path: str | None = None  # the projector blob in the store (an mmproj GGUF), when there is one
    projector: ProjectorSpec | None = None  # the projector's header already read (a registry blob's, by range)
    # the model's GGUF holds its own vision tower (<arch>.vision.block_count: Ollama's engine format, gemma3 of its
    # library): server/images.go Capabilities says vision, as for a projector
    vision_tower: bool = False
    # that tower as Ollama >= 0.30 runs it: the blob itself as llama-server's --mmproj (kvadvise.backends.ollama.towers)
    tower: Tower | None = None

    @property
    def ref(self) -> str:
        """``name:tag``, what to give ``ollama run`` / ``FROM``."""
        return f"{self.name}:{self.tag}"

    @property
    def default_num_ctx(self) -> int | None:
        """The model's own num_ctx parameter, if it sets one."""
        v = self.params.get("num_ctx")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def has_vision_tower(header: GGUFHeader) -> bool:
    """The GGUF holds its own vision tower: server/images.go Capabilities reads ``f.KeyValue("vision.block_count")``,
    the key under the architecture's name (fs/ggml keyValue), and says the model has vision."""
    return key(Vision.BLOCK_COUNT, header.architecture) in header.metadata
