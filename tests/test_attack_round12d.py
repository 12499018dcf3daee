"""Review round 12d: kvadvise's plans against real llama.cpp (llama-server over loopback rpc-servers).

Each test runs `kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ... --json`, runs the llama-server command it
writes over real rpc-servers (tests/rpc_devices.py) and compares the JSON's buffers with what llama-server
prints (advisor/runtime/llamalog.py). The bar: 16 MiB or 3% per compute buffer; weights exact to 0.01 MiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import plan_and_run
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama
MIB = 1 << 20


def _plan_and_run(
    model: Path, size: str, extra: list[str], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
):
    return plan_and_run(model, [size], extra, real_llama_server, capsys)


def test_n_cpu_moe_over_rpc_host_compute_holds_the_experts_activations(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp qwen3moe(6 layers, n_embd 512, 32 experts x 768, 8 used) --rpc H:P=2GiB -ncmoe 2
    -c 4096 -ub 2048` -> `-fa on -ctk f16 -ctv f16 -ngl 999 --n-cpu-moe 2 -ub 2048 --rpc H:P`.

    Host (CPU) compute buffer: predicted 24.02 MiB, llama-server prints 164.05 MiB (140 MiB, 7x, UNDER);
    the device's compute 172.56 predicted vs 170.04 (fine). Same with -ts 1,1 / 1,2 over two devices (host
    24.02 vs 168.30) and at the default -ub 512 on a smaller shape (3.00 vs 8.54/9.07).

    Rule: ggml_backend_sched puts an op whose weight lives in a CPU buffer on the CPU backend
    (ggml_backend_sched_backend_id_from_cur: "operations with weights are preferably run on the same
    backend as the weights"); it would move it to the device only through offload_op, which ggml-rpc does
    not implement (kvadvise's own offload.py/memory.py say so). So the MUL_MAT_IDs of the --n-cpu-moe
    layers, their gate/up outputs [n_ff_exp, n_expert_used, n_ubatch] f32 (768*8*2048*4 = 48 MiB each)
    and the GLU/weighted-sum tensors, are allocated in the CPU compute buffer. The plan's host compute
    buffer does not count them: a RAM figure under by the whole expert activation set.
    """
    model = write_tiny_gguf(
        tmp_path / "qwen3moe.gguf",
        "qwen3moe",
        n_vocab=8000,
        dims=dict(n_layer=6, n_embd=512, n_expert=32, n_ff_exp=768, n_expert_used=8),
    )
    doc, got = _plan_and_run(model, "2GiB", ["-ncmoe", "2", "-c", "4096", "-ub", "2048"], real_llama_server, capsys)
    measured = sum(b.mib for b in got.buffers if b.buft == "CPU" and b.kind == "compute")
    predicted = doc["memory"]["host"]["compute_bytes"] / MIB
    assert abs(predicted - measured) <= max(16.0, 0.03 * measured), (predicted, measured)


def test_n_cpu_moe_does_not_move_a_dense_first_layer(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp deepseek2-mla(2 layers, leading_dense_block_count 1) --rpc H:P=2GiB -ncmoe 1
    -c 4096` -> `... -ngl 999 --n-cpu-moe 1 --rpc H:P`.

    Device model buffer: predicted 2.87 MiB, llama-server prints 2.96 MiB (UNDER by 0.09 MiB = 98,304 B,
    where the project claims weights exact to 0.01 MiB); the host's weights 2.05 vs 1.95 (token_embd only).
    Same for lfm2moe (leading_dense_block_count 1, -ncmoe 1 over two devices: 1.08 vs 1.23 on one, the
    host 2.11 vs 1.95) and glm4moe (-ncmoe 1: 0.71 vs 0.81).

    Rule: --n-cpu-moe N is N buffer-type overrides by absolute block index, llm_ffn_exps_block_regex(i) =
    ``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` for i < N (common/arg.cpp); blk.0 of these models is
    a dense FFN (ffn_gate/up/down, no *_exps), so --n-cpu-moe 1 moves nothing. kvadvise's
    cpu_moe_placement takes the expert layers from speed.expert_layer_ids, a size heuristic ("every layer
    whose weights reach the experts' share per layer") instead of the GGUF's tensor names or
    leading_dense_block_count, and then moves the *average* expert share (expert_bytes // n expert layers)
    out of each chosen layer rather than that layer's own *_exps bytes: here the dense layer is as large as
    the expert layer, so layer 0 counts as an expert layer and half the experts' bytes leave the device on
    paper. The same average misstates a quantized model whose experts differ by layer (llama-quantize's
    use_more_bits gives the first and last eighth of ffn_down_exps more bits in Q4_K_M/Q5_K_M).
    """
    model = write_tiny_gguf(tmp_path / "deepseek2-mla.gguf", "deepseek2-mla", n_vocab=8000)
    doc, got = _plan_and_run(model, "2GiB", ["-ncmoe", "1", "-c", "4096"], real_llama_server, capsys)
    (dev,) = doc["memory"]["devices"]
    measured = sum(b.mib for b in got.buffers if b.buft == dev["name"] and b.kind == "model")
    assert measured == pytest.approx(dev["weights_bytes"] / MIB, abs=0.01)
