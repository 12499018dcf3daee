"""Review round 13a: --n-cpu-moe by block index (a5e42c7) against real llama.cpp (llama-server over loopback
rpc-servers) and llama.cpp's source.

The device tests run `kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ... --json`, run the llama-server command it
writes over real rpc-servers (tests/rpc_devices.py) and compare the JSON's buffers with what llama-server prints
(advisor/runtime/llamalog.py). The bar: 16 MiB or 3% per compute buffer; weights exact to 0.01 MiB.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import plan_and_run
from tinymodels import write_tiny_gguf

MIB = 1 << 20

# n_embd 512, 32 experts of 768, 8 used: the experts' activations at -ub 2048 are 48 MiB per tensor
_BIG = dict(n_embd=512, n_expert=32, n_ff_exp=768, n_expert_used=8)


def _plan_and_run(
    model: Path, sizes: list[str], extra: list[str], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
):
    return plan_and_run(model, sizes, extra, real_llama_server, capsys)


def _first(got, buft: str, kind: str) -> float:
    """The first buffer of that kind on that device (the target context's; an MTP context's come after)."""
    return next(b.mib for b in got.buffers if b.buft == buft and b.kind == kind)


@pytest.mark.llama
def test_n_cpu_moe_past_the_trunk_moves_the_mtp_blocks_experts(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp glm4moe(n_layer_all 5: blk.0 dense, blk.1-3 MoE, blk.4 NextN with its own experts;
    n_embd 512, 32 experts x 768) --rpc H:P=4GiB --spec-type draft-mtp -ncmoe 5 -c 4096` -> `... -ngl 999
    --n-cpu-moe 5 --spec-type draft-mtp`.

    Device model buffer: predicted 94.60 MiB, llama-server prints 22.60 MiB (OVER by 72.00 MiB, exactly the
    NextN block's ffn_{gate,up,down}_exps); the host's CPU_Mapped grows by the same 72 MiB (240.09 -> 315.16
    between -ncmoe 4 and 5) while the plan's host weights stay 223.81 for both.

    Rule: --n-cpu-moe N adds llm_ffn_exps_block_regex(i) = ``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps``
    for every i < N (common/arg.cpp, llm_add_n_cpu_ffn_overrides): by absolute block index, so N = n_layer_all
    also moves blk.<n_layer>'s experts, which llama-server loads with --spec-type draft-mtp
    (models/glm4-moe.cpp load_arch_tensors: TENSOR_SKIP only when !ml.load_mtp). kvadvise's
    cpu_moe_placement takes its ids from speed.expert_layer_ids, which stops at range(spec.n_layer), although
    the spec's layer_expert_bytes (n_layer_all entries) lists the NextN block's experts.
    """
    model = write_tiny_gguf(tmp_path / "glm4moe.gguf", "glm4moe", n_vocab=8000, dims=dict(_BIG, n_layer_all=5))
    doc, got = _plan_and_run(
        model, ["4GiB"], ["--spec-type", "draft-mtp", "-ncmoe", "5", "-c", "4096"], real_llama_server, capsys
    )
    (dev,) = doc["memory"]["devices"]
    measured = _first(got, dev["name"], "model")
    assert measured == pytest.approx(dev["weights_bytes"] / MIB, abs=0.01)


@pytest.mark.llama
def test_every_expert_in_ram_device_compute_holds_no_expert_activations(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp qwen3moe(6 layers, n_embd 512, 32 experts x 768, 8 used) --rpc H:P=4GiB -ncmoe 10
    -c 4096 -ub 2048` (more than the layer count: every block's experts in RAM) -> `... -ngl 999
    --n-cpu-moe 10 -ub 2048`.

    Device compute buffer: predicted 172.56 MiB, llama-server prints 58.04 MiB (OVER by 114.5 MiB, 3x). The
    same at -ncmoe 6 (172.56 vs 58.04), over two devices -ts 1,1 -ncmoe 6 (172.56 vs 58.04 and 84.10), and on
    glm4moe(5 layers) with --spec-type draft-mtp -ncmoe 4 at -ub 512 (57.06 vs 15.11). The plan's figure is
    the full-offload one, as if the device still ran the routed experts.

    Rule: with every ffn_*_exps in a CPU buffer and a device without offload_op (ggml-rpc), every MUL_MAT_ID
    and its gate/up/GLU/down activations ([n_ff_exp, n_expert_used, n_ubatch] f32, 48 MiB each here) are
    scheduled on the CPU (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur: "operations with weights
    are preferably run on the same backend as the weights"), so they are allocated in the CPU's compute
    buffer (the plan's host compute, 164.08 vs 164.05, counts them) and none in the device's.
    """
    model = write_tiny_gguf(tmp_path / "qwen3moe.gguf", "qwen3moe", n_vocab=8000, dims=dict(_BIG, n_layer=6))
    doc, got = _plan_and_run(model, ["4GiB"], ["-ncmoe", "10", "-c", "4096", "-ub", "2048"], real_llama_server, capsys)
    (dev,) = doc["memory"]["devices"]
    measured = _first(got, dev["name"], "compute")
    predicted = dev["compute_bytes"] / MIB
    assert abs(predicted - measured) <= max(16.0, 0.03 * measured), (predicted, measured)


@pytest.mark.llama
def test_n_cpu_moe_glm4moe_device_compute_growth_is_not_there(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp glm4moe(n_layer_all 5, 1 NextN, blk.0 dense, shared expert; n_embd 512, 32 experts
    x 768, 8 used) --rpc H:P=4GiB -ncmoe 2 -c 4096 -ub 2048` -> `... -ngl 999 --n-cpu-moe 2 -ub 2048`.

    Device compute buffer: predicted 228.25 MiB, llama-server prints 168.79 MiB (OVER by 59.5 MiB, 35 %);
    the host's compute is right (164.08 vs 164.05).

    Rule: host_experts.host_experts_device_growth adds the peak it measured on qwen3next shapes (copies of the
    down projection's output, three expert activations, two shared-expert rows) for any model with a shared
    expert; on glm4moe (llama-server b11312 over RPC, ggml_backend_sched_split_graph) the device's buffer with
    blk.1's experts in RAM is exactly its full-offload size (168.79 MiB both; kvadvise's full-offload plan says
    172.56, fine), so the plan asks 59 MiB of VRAM
    that llama.cpp never allocates.
    """
    model = write_tiny_gguf(tmp_path / "glm4moe.gguf", "glm4moe", n_vocab=8000, dims=dict(_BIG, n_layer_all=5))
    doc, got = _plan_and_run(model, ["4GiB"], ["-ncmoe", "2", "-c", "4096", "-ub", "2048"], real_llama_server, capsys)
    (dev,) = doc["memory"]["devices"]
    measured = _first(got, dev["name"], "compute")
    predicted = dev["compute_bytes"] / MIB
    assert abs(predicted - measured) <= max(16.0, 0.03 * measured), (predicted, measured)


def _qwen3moe_spec(tmp_path: Path):
    from kvadvise.api import load_model

    model = write_tiny_gguf(tmp_path / "qwen3moe.gguf", "qwen3moe", n_vocab=8000, dims=dict(_BIG, n_layer=6))
    return load_model(str(model))


def test_api_hand_made_layer_expert_bytes_past_the_blocks_plan_negative_weights(tmp_path: Path) -> None:
    """`kvadvise.api.plan(spec, PlanRequest(n_ctx=4096, n_cpu_moe=3, vram_bytes=(8 GiB,), ram_bytes=16 GiB))`
    with a hand-made spec whose layer_expert_bytes are 1e9 per block (more than each block's layer_bytes,
    76.4 MB, and than expert_bytes, 453 MB, and weights_bytes, 475 MB).

    The plan: fits=True, CUDA0 weights_bytes = -2,533,681,664 (negative). check_spec lets the spec through
    (it checks only the tuple's length and that each value is a whole number), and cpu_moe_placement subtracts
    sum(layer_expert_bytes[:3]) = 3e9 from weights_bytes (its max(0, ...) clamps layer_bytes only). A block
    cannot hold more expert bytes than its own weights (llama.cpp: blk.N.ffn_*_exps are among blk.N's
    tensors); the spec must be refused, or the plan must not count negative bytes of VRAM.
    """
    from kvadvise.api import plan
    from kvadvise.entry import PlanRequest
    from kvadvise.errors import InputError

    s = _qwen3moe_spec(tmp_path)
    bad = dataclasses.replace(s, layer_expert_bytes=(10**9,) * s.n_layer_all)
    try:
        p = plan(bad, PlanRequest(n_ctx=4096, n_cpu_moe=3, vram_bytes=(8 << 30,), ram_bytes=16 << 30))
    except (InputError, ValueError):
        return  # refused: fine
    weights = [d.weights_bytes for d in p.estimate.devices]
    assert all(w >= 0 for w in weights), (p.fits, weights)


def test_api_layer_expert_bytes_without_layer_bytes_moves_nothing(tmp_path: Path) -> None:
    """`kvadvise.api.plan(spec, PlanRequest(n_ctx=4096, n_cpu_moe=3, vram_bytes=(8 GiB,), ram_bytes=16 GiB))`
    for a hand-made spec that lists each block's routed experts (layer_expert_bytes = 75,497,472 x 6, as
    from_gguf gives) but not the blocks' totals (layer_bytes = (), "unknown", which check_spec accepts).

    The GPU's weights: 466,318,336 B with n_cpu_moe=3, the same as with n_cpu_moe=0: nothing moved. llama.cpp
    moves blk.0-2's ffn_*_exps (3 x 75,497,472 = 226,492,416 B = 216 MiB) to the CPU (common/arg.cpp
    llm_add_n_cpu_ffn_overrides); expected 239,825,920 B. cpu_moe_placement returns "nothing moved" whenever
    layer_bytes is empty (`not any(spec.layer_bytes)`), though the bytes it moves now come from
    layer_expert_bytes, which the spec gives.
    """
    from kvadvise.api import plan
    from kvadvise.entry import PlanRequest

    s = _qwen3moe_spec(tmp_path)
    bare = dataclasses.replace(s, layer_bytes=(), layer_cuda_pad_bytes=(), layer_largest_tensor_bytes=())

    def gpu(n: int) -> int:
        p = plan(bare, PlanRequest(n_ctx=4096, n_cpu_moe=n, vram_bytes=(8 << 30,), ram_bytes=16 << 30))
        return sum(d.weights_bytes for d in p.estimate.devices)

    moved = sum(s.layer_expert_bytes[:3])
    assert gpu(0) - gpu(3) == moved, (gpu(0), gpu(3), moved)
