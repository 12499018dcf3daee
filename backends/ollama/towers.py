"""A vision or audio tower inside an Ollama blob (its own conversion: ``{arch}.vision.*`` keys, ``v.*``, ``mm.*`` and
``a.*`` tensors beside the text model's), as Ollama >= 0.30 runs it.

llm/llama_server.go (ollama fb30760) NewLlamaServer: a blob of an architecture in ``compatClipArches`` that holds
``v.*`` tensors and has no projector layer of its own is passed to llama-server as its own ``--mmproj``; the
llama/compat layer hides the tower from the text model's loader (llama-ollama-compat.cpp ``add_skip_prefix(ml,
"v.")``, ``"mm."``, ``"a."``) and translates it for mtmd's clip loader (``handle_gemma3_clip`` and the others:
``clip.projector_type``, the ``clip.vision.*`` keys). So the tower is a projector, not text weights: mtmd loads it
on the first GPU with its compute buffer, llama-server adds that memory to its --fit target
(tools/server/server-context.cpp), and Ollama raises LLAMA_ARG_FIT_TARGET by the tower's tensors as stored
(``mmprojMemoryRequirement``: the v./mm./a. tensors' sizes; kvadvise.backends.ollama.rules.projector_margin_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvadvise.model.architecture import TOWER_PREFIXES
from kvadvise.model.ggml import GGMLType, cuda_alloc_bytes
from kvadvise.model.gguf import GGUFHeader
from kvadvise.model.keys import LLM, Vision, key
from kvadvise.model.projector import ProjectorSpec, ProjectorTensor, count
from kvadvise.model.spec import ModelSpec

# llm/llama_server.go compatClipArches, and the projector type llama/compat's clip handler gives each
# (llama-ollama-compat.cpp: gguf_set_val_str(meta, "clip.projector_type" / "clip.vision.projector_type", ...))
CLIP_ARCHS: dict[str, str] = {
    "gemma3": "gemma3",
    "gemma4": "gemma4v",
    "qwen35": "qwen3vl_merger",
    "qwen35moe": "qwen3vl_merger",
    "qwen25vl": "qwen2.5vl_merger",
    "qwen3vl": "qwen3vl_merger",
    "qwen3vlmoe": "qwen3vl_merger",
    "mistral3": "pixtral",
    "deepseekocr": "deepseekocr",
    "glmocr": "glm4v",
    "llama4": "llama4",
    "nemotron_h_omni": "nemotron_v2_vl",
}
# handle_gemma3_clip promotes these to F32 at load ("Metal's IM2COL convolution requires F32")
_F32_AT_LOAD = {"gemma3": ("v.patch_embedding.weight", "v.position_embedding.weight")}


@dataclass(frozen=True, slots=True)
class Tower:
    """The tower of a blob, as Ollama >= 0.30 loads it."""

    file_bytes: int  # the v./mm./a. tensors as stored: Ollama's mmproj memory requirement
    cuda_pad_bytes: int  # what CUDA's buffers added to them where the text model's figure counted them
    # the projector mtmd loads (kvadvise.planner.projector sizes its weights and compute); None: the blob's keys do
    # not say its warmup image, so its compute is not known
    projector: ProjectorSpec | None


def inline_tower(header: GGUFHeader) -> Tower | None:
    """The tower Ollama >= 0.30 passes as ``--mmproj`` (the blob itself), or None: another architecture, no ``v.*``
    tensor."""
    arch = header.architecture
    if arch not in CLIP_ARCHS or not any(t.name.startswith("v.") for t in header.tensors):
        return None
    tensors = [t for t in header.tensors if t.name.startswith(TOWER_PREFIXES)]  # mmprojMemoryRequirement's prefixes
    promoted = _F32_AT_LOAD.get(arch, ())
    loaded = tuple(
        ProjectorTensor(GGMLType.F32, t.shape[0] if t.shape else 1, t.n_bytes * 2)  # 2-byte floats to 4
        if t.name in promoted and t.ggml_type == GGMLType.F16  # (promote_tensor_to_f32: an F16 tensor only)
        else ProjectorTensor(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes)
        for t in tensors
    )

    def num(template: str) -> int:  # a key under the blob's architecture (keys.Vision: convert/convert_gemma3.go)
        return count(header, key(template, arch))

    readable = num(Vision.IMAGE_SIZE) and num(Vision.PATCH_SIZE) and num(Vision.EMBEDDING_LENGTH)
    projector = (
        ProjectorSpec(
            source=header.source,
            projector_type=CLIP_ARCHS[arch],
            has_vision=True,
            has_audio=any(t.name.startswith("a.") for t in tensors),
            image_size=num(Vision.IMAGE_SIZE),
            patch_size=num(Vision.PATCH_SIZE),
            n_embd=num(Vision.EMBEDDING_LENGTH),
            n_ff=num(Vision.FEED_FORWARD_LENGTH),
            n_head=num(Vision.HEAD_COUNT),
            n_layer=num(Vision.BLOCK_COUNT),
            projection_dim=num(LLM.EMBEDDING_LENGTH),  # handle_gemma3_clip: the text model's width
            tensors=loaded,
        )
        if readable
        else None
    )
    pad = sum(cuda_alloc_bytes(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes) - t.n_bytes for t in tensors)
    return Tower(sum(t.n_bytes for t in tensors), pad, projector)


def profile_tower(spec: ModelSpec) -> Tower | None:
    """The tower of a built-in profile's blob (ModelSpec.tower_bytes, a published size): only its size is known, so
    not its compute (None for an architecture Ollama does not pass as its own --mmproj)."""
    if spec.architecture not in CLIP_ARCHS or not spec.tower_bytes:
        return None
    return Tower(spec.tower_bytes, 0, None)


def text_model(spec: ModelSpec, tower: Tower) -> ModelSpec:
    """``spec`` as llama-server's loader sees the blob through llama/compat: without the tower's tensors (their bytes
    and CUDA padding; kvadvise.model.architecture already keeps them out of the matmul weights and active
    parameters)."""
    return replace(
        spec,
        weights_bytes=spec.weights_bytes - tower.file_bytes,
        cuda_pad_bytes=max(0, spec.cuda_pad_bytes - tower.cuda_pad_bytes),
        tower_bytes=0,
    )


def tower_note(tower: Tower, version: str | None) -> str:
    """What the plan says of the tower."""
    mib = tower.file_bytes / (1 << 20)
    said = (
        f"Ollama{f' {version}' if version else ''} passes this blob to llama-server as its own --mmproj, so its "
        f"{mib:,.0f} MiB vision tower is the projector (on the first GPU, with its compute buffer), not text weights, "
        f"and Ollama raises the fit target by its size (llm/llama_server.go)"
    )
    if tower.projector is None:
        said += "; its image size is not known here, so 1 GiB of margin stands in for its weights and compute"
    return said
