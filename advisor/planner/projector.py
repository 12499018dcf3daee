"""A multimodal projector's memory: its weights and the compute buffers mtmd reserves for it.

llama.cpp 0c1e570, tools/mtmd/clip.cpp:
- Device (clip_ctx ctor): the projector runs on ``--mmproj-device``, else the first device of ``-dev``
  (common/arg.cpp), else the first GPU llama.cpp finds (ggml_backend_init_by_type GPU, then IGPU:
  the first CUDA card, Metal, or the first RPC host); with ``--no-mmproj-offload`` or no GPU, the CPU.
  kvadvise puts it on the plan's first device.
- Weights (clip_model_loader::load_tensors): one buffer of that device's default type holding every
  tensor (ggml_backend_alloc_ctx_tensors_from_buft: each padded to the buffer's alignment; CUDA pads
  quantized rows to 512 values). Exact for files whose tensors are all loaded, which is what
  converters write.
- Compute (warmup -> reserve_compute_meta): the graph of one image of the warmup size (image_size for
  the SigLIP family) is reserved on a scheduler of [device, CPU]: the device buffer holds the
  activations, the CPU buffer the graph input (the f32 image, 3 x side x side, on the CPU backend as
  every graph input is); on the CPU alone, one buffer, where the image is dead by the peak.
  ``--mmproj`` shares the text model's flash-attention setting.

The CPU buffer is exact. The device buffer has no closed form (ggml-alloc); kvadvise's figure is the
largest live set of the ViT block as measured on real llama.cpp (tests/test_projector.py, SigLIP /
Gemma 3 projectors on an RPC device): the feed-forward step holds 4·P·(n_ff + 3·n_embd) bytes, the
attention 22·P·n_embd with flash attention, or the f32 scores 4·P²·n_head plus 24·P·n_embd without
(P patches). It is an estimate: exact on the SigLIP graph on CPU-backed devices; other projector types
(dynamic resolution, window attention, audio encoders) and GPU kernels may differ, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.model.ggml import ALIGNMENT, cuda_alloc_bytes, pad
from kvadvise.model.projector import ProjectorSpec

MIB = 1 << 20
# projector types whose vision graph is clip_graph_siglip with the image_size warmup (clip.cpp,
# clip_get_graph_builder and load_hparams): the estimate is measured on this graph
SIGLIP_TYPES = frozenset({"gemma3", "idefics3", "lfm2", "janus_pro", "phi4"})


@dataclass(frozen=True, slots=True)
class ProjectorMemory:
    """What ``--mmproj`` adds: on the projector's device its weights and compute buffer, in RAM the
    compute buffer of the graph input."""

    weights_bytes: int  # exact (the tensors of the file, as the device's buffer sizes them)
    compute_bytes: int  # on the device: an estimate (see compute_note)
    host_compute_bytes: int  # the CPU buffer: the f32 warmup image
    compute_note: str  # how the compute figure was obtained


def projector_memory(p: ProjectorSpec, device: str, *, flash_attn: bool) -> ProjectorMemory:
    """The projector's buffers on ``device`` (cpu, cuda, metal, rpc)."""
    if device == "cuda":
        weights = sum(cuda_alloc_bytes(t.ggml_type, t.ne0, t.n_bytes) for t in p.tensors)
    else:
        weights = sum(pad(t.n_bytes, ALIGNMENT[device]) for t in p.tensors)
    if not p.has_vision or not p.n_patches:
        return ProjectorMemory(weights, 0, 0, "audio encoder: compute buffer not estimated")
    n_p, e = p.n_patches, p.n_embd
    ffn = 4 * n_p * (p.n_ff + 3 * e)
    attn = 22 * n_p * e if flash_attn else 4 * n_p * n_p * p.n_head + 24 * n_p * e
    activations = max(ffn, attn)
    image = 4 * 3 * p.image_size * p.image_size  # inp_raw, f32 [side, side, 3]
    note = f"estimate: the ViT graph of one {p.image_size}x{p.image_size} warmup image ({n_p:,} patches)"
    if p.projector_type not in SIGLIP_TYPES:
        note += f"; projector type {p.projector_type} is not measured (its warmup size and graph may differ)"
    if device == "cpu":  # one scheduler backend, one buffer: the input image dies before the peak
        return ProjectorMemory(weights, pad(max(activations, image), ALIGNMENT["cpu"]), 0, note)
    return ProjectorMemory(weights, pad(activations, ALIGNMENT[device]), pad(image, ALIGNMENT["cpu"]), note)
