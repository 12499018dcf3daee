"""Builds before ggml-org/llama.cpp#23764 (b9410) with flash attention and a sliding window: the KQ mask is an f32
graph input, cast to f16 at the first layer that reads it (build_attn_inp_kv_iswa: one mask per cache kind). A model
whose first attention layers are sliding-window ones (gpt-oss: layer 0, then every other; Gemma 3: layers 0-4 of each
6) runs those layers with the full-attention mask's f32 input still alive, their feed-forward (or MoE, with op
offload's copy of a CPU-resident expert) on top of it.

The figures below were measured with the allocation pass of 364a7a6 (the llama.cpp Ollama 0.12.5 vendors, b67xx) on
a device that allocates nothing (ggml_backend_sched and ggml-alloc sizing its buffers as for CUDA: 128-byte
alignment, every op supported, CUDA's offload_op), on sparse GGUFs of the shapes named; that harness is not part of
the tests, the figures are what it printed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gguf import GGMLQuantizationType
from oracle import REAL_SIZES
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import MIB, RunConfig, estimate, resolve
from kvadvise.planner.offload import cpu_moe_placement

RUN = RunConfig(flash_attn="on", device="cuda", runtime="library", device_names=("CUDA0",))


def test_gemma3_leading_sliding_window_layers(tmp_path: Path) -> None:
    """Gemma 3 12B's layers (six of them, a 1,024-token vocabulary so that the layers are the peak) at 32k cells:
    181.52 MiB measured on the device; before this rule kvadvise planned 146 (-20 %)."""
    dims = dict(REAL_SIZES["gemma3"], n_layer=6)
    spec = from_gguf(read_file(write_tiny_gguf(tmp_path / "g3.gguf", "gemma3", n_vocab=1024, dims=dims, sparse=True)))
    old = replace(RUN, n_ctx=32768, llama_build=6699)
    got = estimate(spec, old).devices[0].compute_bytes
    assert abs(got / MIB - 181.52) <= max(16, 0.03 * 181.52)
    # the difference to a build with the f16 mask: the full mask's f32 input instead of its f16 cast
    lay = resolve(spec, old)
    new = estimate(spec, replace(old, llama_build=9410)).devices[0].compute_bytes
    assert got - new == 2 * lay.n_ubatch * lay.n_ctx_seq


def test_gpt_oss_experts_on_the_cpu_at_131k(tmp_path: Path) -> None:
    """gpt-oss-20b, MXFP4 experts, every expert in host memory (--cpu-moe), 131072 cells: 456.98 MiB measured on
    the device (the op-offload copy of an expert tensor during layer 0, a sliding-window layer, beside the 256 MiB
    f32 input of the full-attention mask); kvadvise planned 419 (-8.3 %), now never under."""

    def mxfp4_experts(path: Path) -> Path:
        import tinymodels

        moe = tinymodels._moe

        def _moe(*args: object, **kw: object) -> None:
            moe(*args, **{**kw, "qtype": GGMLQuantizationType.MXFP4})  # type: ignore[arg-type]

        tinymodels._moe = _moe
        try:
            return write_tiny_gguf(
                path, "gpt-oss", n_vocab=201088, n_ctx_train=131072, dims=REAL_SIZES["gpt-oss"], sparse=True
            )
        finally:
            tinymodels._moe = moe

    spec = from_gguf(read_file(mxfp4_experts(tmp_path / "gpt-oss-20b.gguf")))
    placement = cpu_moe_placement(spec, spec.n_layer, "cuda", 512)
    cfg = replace(RUN, n_ctx=131072, llama_build=6699, op_offload_copy_bytes=placement.op_offload_bytes or 0)
    got = estimate(placement.gpu_spec, cfg).devices[0].compute_bytes / MIB
    assert 0.97 * 456.98 <= got <= 1.05 * 456.98
    assert resolve(spec, cfg).n_ctx_swa == 768  # n_swa 128 + n_ubatch 512, padded to 256 with flash attention
