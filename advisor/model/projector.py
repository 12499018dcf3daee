"""A multimodal projector (``mmproj`` GGUF, general.architecture "clip"): what llama.cpp's mtmd loads
beside a text model with ``llama-server --mmproj FILE``.

Keys and tensors as tools/mtmd/clip.cpp reads them (clip_model_loader::load_hparams and load_tensors,
keys in tools/mtmd/clip-impl.h; llama.cpp 0c1e570): clip.projector_type (or clip.vision.projector_type
for files with several modalities), clip.has_vision_encoder / clip.has_audio_encoder, and for vision
clip.vision.{image_size, patch_size, embedding_length, feed_forward_length, attention.head_count,
block_count, projection_dim}.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.errors import GGUFError
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import GGUFHeader


@dataclass(frozen=True, slots=True)
class ProjectorTensor:
    """One tensor of the projector, as its device buffer sizes it."""

    ggml_type: GGMLType
    ne0: int
    n_bytes: int


@dataclass(frozen=True, slots=True)
class ProjectorSpec:
    """What the memory model needs to know about a projector file."""

    source: str  # the path, as llama-server's --mmproj gets it
    projector_type: str  # clip.projector_type: gemma3, qwen2vl_merger, pixtral, ...
    has_vision: bool
    has_audio: bool
    image_size: int  # clip.vision.image_size: llama.cpp reserves the compute graph for one image of this side
    patch_size: int
    n_embd: int  # clip.vision.embedding_length
    n_ff: int  # clip.vision.feed_forward_length
    n_head: int  # clip.vision.attention.head_count
    n_layer: int  # clip.vision.block_count
    projection_dim: int  # clip.vision.projection_dim
    tensors: tuple[ProjectorTensor, ...]

    @property
    def n_patches(self) -> int:
        """Patches of the warmup image (clip.cpp get_dummy_batch: warmup_image_size = image_size)."""
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0


def projector_from_gguf(header: GGUFHeader) -> ProjectorSpec:
    """The projector described by an mmproj header; a file that is not one is refused (GGUFError)."""
    meta = header.metadata
    if header.architecture != "clip":
        raise GGUFError(
            f"{header.source}: not a multimodal projector (general.architecture is {header.architecture!r}, "
            "not 'clip')",
            hint="--mmproj takes the mmproj-*.gguf file published beside a vision model",
        )

    def num(key: str) -> int:
        v = meta.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    def text(key: str) -> str:
        v = meta.get(key)
        return v if isinstance(v, str) else ""

    has_vision = meta.get("clip.has_vision_encoder") is True
    has_audio = meta.get("clip.has_audio_encoder") is True
    if not has_vision and not has_audio:
        raise GGUFError(f"{header.source}: the projector has neither a vision nor an audio encoder")
    return ProjectorSpec(
        source=header.source,
        projector_type=text("clip.projector_type") or text("clip.vision.projector_type") or "unknown",
        has_vision=has_vision,
        has_audio=has_audio,
        image_size=num("clip.vision.image_size") if has_vision else 0,
        patch_size=num("clip.vision.patch_size") if has_vision else 0,
        n_embd=num("clip.vision.embedding_length"),
        n_ff=num("clip.vision.feed_forward_length"),
        n_head=num("clip.vision.attention.head_count"),
        n_layer=num("clip.vision.block_count"),
        projection_dim=num("clip.vision.projection_dim"),
        tensors=tuple(ProjectorTensor(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes) for t in header.tensors),
    )
