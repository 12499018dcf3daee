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
from kvadvise.model.keys import Vision, key


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
    # the width of the embeddings it hands the text model (clip_n_mmproj_embd, without Qwen3-VL's deepstack
    # copies): mtmd_init_from_file refuses a text model whose n_embd differs; 0 when the type is not known here
    n_embd_text: int = 0

    @property
    def n_patches(self) -> int:
        """Patches of the warmup image (clip.cpp get_dummy_batch: warmup_image_size = image_size)."""
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0


# tools/mtmd/clip.cpp clip_n_mmproj_embd (0c1e570): the tensor, and its dimension, that gives the width of
# the embeddings a projector type hands the text model (tensor names: tools/mtmd/clip-impl.h, load_tensors)
_OUT_WIDTH: dict[str, tuple[tuple[str, int], ...]] = {
    "gemma3": (("mm.input_projection.weight", 0),),
    "gemma4v": (("mm.input_projection.weight", 1),),
    "gemma4uv": (("mm.input_projection.weight", 1),),
    # LLaVA's MLP: mm.2 (Yi's variant, MLP_NORM: mm.3's bias)
    "mlp": (("mm.3.bias", 0), ("mm.2.weight", 1)),
    "pixtral": (("mm.2.weight", 1),),
    "phi4": (("mm.2.weight", 1),),
    "lightonocr": (("mm.2.weight", 1),),
    "lfm2": (("mm.2.weight", 1),),
    "kimivl": (("mm.2.weight", 1),),
    "internvl": (("mm.3.weight", 1),),
    "idefics3": (("mm.model.fc.weight", 1),),
    "qwen2vl_merger": (("mm.2.bias", 0),),
    "qwen2.5vl_merger": (("mm.2.bias", 0),),
    "qwen3vl_merger": (("mm.2.bias", 0),),  # per path: the text model's n_embd_inp repeats it as often
}


def _n_embd_text(projector_type: str, header: GGUFHeader) -> int:
    shapes = {t.name: t.shape for t in header.tensors}
    for name, dim in _OUT_WIDTH.get(projector_type, ()):
        shape = shapes.get(name)
        if shape is not None and len(shape) > dim:
            return int(shape[dim])
    return 0


def count(header: GGUFHeader, name: str) -> int:
    """The whole number the key ``name`` holds, 0 where it is absent or not a number (a projector's optional sizes)."""
    v = header.metadata.get(name)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def projector_from_gguf(header: GGUFHeader) -> ProjectorSpec:
    """The projector described by an mmproj header; a file that is not one is refused (GGUFError)."""
    meta = header.metadata
    if header.architecture != "clip":
        raise GGUFError(
            f"{header.source}: not a multimodal projector (general.architecture is {header.architecture!r}, "
            "not 'clip')",
            hint="--mmproj takes the mmproj-*.gguf file published beside a vision model",
        )

    def num(template: str) -> int:
        return count(header, key(template, "clip"))

    def text(name: str) -> str:
        v = meta.get(name)
        return v if isinstance(v, str) else ""

    has_vision = meta.get("clip.has_vision_encoder") is True
    has_audio = meta.get("clip.has_audio_encoder") is True
    if not has_vision and not has_audio:
        raise GGUFError(f"{header.source}: the projector has neither a vision nor an audio encoder")
    projector_type = text("clip.projector_type") or text(key(Vision.PROJECTOR_TYPE, "clip")) or "unknown"
    return ProjectorSpec(
        source=header.source,
        projector_type=projector_type,
        has_vision=has_vision,
        has_audio=has_audio,
        image_size=num(Vision.IMAGE_SIZE) if has_vision else 0,
        patch_size=num(Vision.PATCH_SIZE) if has_vision else 0,
        n_embd=num(Vision.EMBEDDING_LENGTH),
        n_ff=num(Vision.FEED_FORWARD_LENGTH),
        n_head=num(Vision.HEAD_COUNT),
        n_layer=num(Vision.BLOCK_COUNT),
        projection_dim=num(Vision.PROJECTION_DIM),
        tensors=tuple(ProjectorTensor(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes) for t in header.tensors),
        n_embd_text=_n_embd_text(projector_type, header),
    )
