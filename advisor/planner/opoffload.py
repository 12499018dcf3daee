"""Partial offload's extra device compute: llama.cpp's op offload.

llama.cpp 0c1e570, ggml/src/ggml-backend.cpp:
- ggml_backend_sched_backend_id_from_cur: an op whose weight sits in a host buffer (a layer kept on the
  CPU) is given to a higher-priority backend that wants it (cause "1.off"): sched->op_offload (on by
  default; llama-server --no-op-offload) and the device's offload_op, which for CUDA is a batch of at
  least 32 rows (ggml-cuda.cu get_op_batch_size / op_offload_min_batch_size, GGML_OP_OFFLOAD_MIN_BATCH)
  and for Metal a MUL_MAT / MUL_MAT_ID of such a batch; ggml-rpc has none.
- ggml-org/llama.cpp#6083 moved this into the scheduler: the weights are copied into the compute buffer,
  which grows markedly under partial offload.
- ggml_backend_sched_split_graph: such a weight is an input of the GPU split and is copied into the
  GPU's compute buffer; a weight the GPU cannot read in place starts a new split ("by starting a new
  split, the memory of the previously offloaded weights can be reused"), so one copy is alive at a time.

The graph llama.cpp reserves is a prompt batch of n_ubatch tokens (sched_reserve), so with
n_ubatch >= 32 the GPU's compute buffer grows by the largest weight kept on the CPU, however few
layers that is: kvadvise adds the largest tensor of the CPU-resident blocks (as a CUDA buffer sizes
it) to the full-offload device compute. An estimate, not measured here: an upper bound where that copy
and the activation peak are not alive together (no CUDA or Metal device in the test suite; ggml-rpc
does not op-offload, so the loopback RPC runs cannot show it).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvadvise.model.spec import ModelSpec

OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu: GGML_OP_OFFLOAD_MIN_BATCH's default
OP_OFFLOAD_DEVICES = ("cuda", "metal")  # backends with an offload_op (not ggml-rpc)


def op_offload_bytes(spec: ModelSpec, cpu_blocks: Iterable[int], device: str, n_ubatch: int) -> int | None:
    """The copy of the largest CPU-resident weight the GPU's compute buffer holds; 0 where nothing is
    op-offloaded, None where the per-tensor sizes are unknown (a model planned from a profile)."""
    if device not in OP_OFFLOAD_DEVICES or n_ubatch < OP_OFFLOAD_MIN_BATCH:
        return 0
    blocks = list(cpu_blocks)
    if not blocks:
        return 0
    if not spec.layer_largest_tensor_bytes:
        return None
    return max(spec.layer_largest_tensor_bytes[il] for il in blocks)
