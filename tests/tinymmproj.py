"""Tiny random-weight vision projectors (``mmproj`` GGUF files) that llama.cpp's mtmd loads beside a
tiny text model: a SigLIP-style ViT with Gemma 3's projector (tools/mtmd/clip.cpp load_hparams /
load_tensors, tools/mtmd/models/siglip.cpp, llama.cpp 0c1e570 as vendored by llama-cpp-python 0.3.36).

    write_tiny_mmproj(path, *, n_embd_text, image_size=64, patch_size=8, n_embd=64, n_ff=128,
                      n_head=4, n_layer=2, pool=2) -> Path

Keys: general.architecture "clip", clip.projector_type "gemma3", clip.has_vision_encoder,
clip.vision.{image_size, patch_size, embedding_length, feed_forward_length, block_count,
projection_dim, attention.head_count, attention.layer_norm_epsilon, image_mean, image_std,
projector.scale_factor (the pooling kernel; Gemma 3's default is 4)}, clip.use_gelu.
Tensors (ggml order): v.patch_embd.weight [p, p, 3, n_embd] f16 (ggml_conv_2d), v.patch_embd.bias,
v.position_embd.weight [n_embd, n_patches], per block ln1/ln2, attn_q/k/v/out, ffn_up/ffn_down
(weights f16, biases f32), v.post_ln, mm.input_projection.weight [n_embd_text, n_embd] (siglip.cpp
transposes it), mm.soft_emb_norm.weight [n_embd]. The text model's n_embd must equal
``n_embd_text`` (mtmd_init_from_file checks it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

__all__ = ["write_tiny_mmproj"]

STD = 0.02


def write_tiny_mmproj(
    path: Path,
    *,
    n_embd_text: int,
    image_size: int = 64,
    patch_size: int = 8,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 4,
    n_layer: int = 2,
    pool: int = 2,
    seed: int = 0,
) -> Path:
    rng = np.random.RandomState(seed)
    path = Path(path)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-mmproj")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projector.scale_factor", pool)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def mat(name: str, *ne: int) -> None:
        w.add_tensor(name, (rng.standard_normal(tuple(reversed(ne))) * STD).astype(np.float16))

    def vec(name: str, *ne: int, value: float | None = None) -> None:
        shape = tuple(reversed(ne))
        data = np.full(shape, value, dtype=np.float32) if value is not None else rng.standard_normal(shape) * STD
        w.add_tensor(name, data.astype(np.float32))

    n_patches = (image_size // patch_size) ** 2
    mat("v.patch_embd.weight", patch_size, patch_size, 3, n_embd)
    vec("v.patch_embd.bias", n_embd)
    vec("v.position_embd.weight", n_embd, n_patches)
    for il in range(n_layer):
        p = f"v.blk.{il}"
        for norm in ("ln1", "ln2"):
            vec(f"{p}.{norm}.weight", n_embd, value=1.0)
            vec(f"{p}.{norm}.bias", n_embd, value=0.0)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(f"{p}.{proj}.weight", n_embd, n_embd)
            vec(f"{p}.{proj}.bias", n_embd)
        mat(f"{p}.ffn_up.weight", n_embd, n_ff)
        vec(f"{p}.ffn_up.bias", n_ff)
        mat(f"{p}.ffn_down.weight", n_ff, n_embd)
        vec(f"{p}.ffn_down.bias", n_embd)
    vec("v.post_ln.weight", n_embd, value=1.0)
    vec("v.post_ln.bias", n_embd, value=0.0)
    mat("mm.input_projection.weight", n_embd_text, n_embd)
    vec("mm.soft_emb_norm.weight", n_embd, value=1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
