"""Review round 13i: kvadvise's partial-offload plans (`-ngl N`, `--n-cpu-moe N`) against real llama.cpp (llama-server
b11312 over loopback rpc-servers, tests/rpc_devices.py).

Each test runs `kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ... --margin 0 --ram 16GiB --json` with a SIZE the model
does not fit, then runs the partial plan's command (``llama_server.offload_command``; the plan's ``fits`` is false
for a partial plan, so tests/rpc_devices.plan_and_run's assert does not apply: _partial below is its copy without
it) over the same rpc-servers, and compares ``offload.devices_bytes`` (each device's predicted total) with what
llama-server prints for that device (model + KV + compute, kvadvise.runtime.llamalog.parse). The bar: 16 MiB or 3 %.

The rule these missed (vendored llama.cpp, /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp): src/models/llama.cpp
``if (il == n_layer - 1 && inp_out_ids) { cur = ggml_get_rows(ctx0, cur, inp_out_ids); ... }`` -- the last block
selects the output rows before its FFN, and llama-server reserves n_outputs = one row per slot
(src/llama-context.cpp llama_context::graph_reserve). A device that does not op-offload (ggml-rpc) runs the
CPU blocks in CPU splits (ggml/src/ggml-backend.cpp ggml_backend_sched_backend_id_from_cur: ops follow their
weights), so a device left with only the last block(s) and/or the output layer never holds an FFN at the whole
ubatch. kvadvise's partial_offload (advisor/planner/offload.py) keeps every device's full-offload compute buffer
(``layers.fixed`` from the full-offload estimate) for any -ngl except -ngl 1 on one device (``split_compute``'s
``output_only``), so a device holding the last block alone, or the output layer alone on a second device, is
planned with a whole block's FFN activations.

Fixed: partial_offload's tail_cut sizes such a device as a split's device without pipeline parallelism
(compute.unpipelined_split_compute), where the last block alone is now split.unpipelined_last_block_compute:
the masks and the attention less the hidden state copied in, or the output rows' FFN (48.30 MiB printed, 48.36
planned at -ub 2048).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import partial_plan_and_run, within_bar
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama
MIB = 1 << 20
_LLAMA = dict(n_layer=8, n_embd=1024, head=256, n_ff=4096)  # 8 blocks of 30 MiB f16, n_ff 4096


def _partial(model: Path, sizes: list[str], extra: list[str], llama_server: Path, *, ngl: int | None = None):
    """The plan (JSON) and, per device endpoint order, the real totals of the partial plan's command (or of the
    same command with ``-ngl ngl``): rpc_devices.partial_plan_and_run."""
    return partial_plan_and_run(model, sizes, extra, llama_server, ngl=ngl)


def test_ngl_2_the_last_block_alone_on_the_device_runs_its_ffn_on_one_row(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(8 layers, n_embd 1024, n_ff 4096, n_vocab 8000) --rpc H:P=200MiB -c 4096 -ub 2048
    --margin 0` -> partial plan `-c 4096 -np 1 -fa on -ctk q8_0 -ctv q8_0 -ngl 2 -ub 2048` (7 of 8 blocks on the
    CPU; the device holds block 7 and the output layer).

    Device total: predicted 185.93 MiB (offload.devices_bytes), llama-server prints 98.19 (model 45.64 + KV 4.25 +
    compute 48.30): OVER by 87.7 MiB (1.9x). The plan's compute is the full offload's 136 MiB (every block's FFN
    at 2,048 rows: [4096, 2048] f32 = 32 MiB per tensor); the CPU, which runs blocks 0-6, prints 136.31.

    Rule: the last block gathers the output rows before its FFN (src/models/llama.cpp, ``il == n_layer - 1 &&
    inp_out_ids``: ggml_get_rows), n_outputs = 1 row per slot in llama-server's reserve
    (src/llama-context.cpp graph_reserve), and ggml-rpc does not op-offload, so the CPU blocks' activations are
    the CPU's (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur). partial_offload (offload.py) keeps the
    full offload's compute for the device (``layers.fixed``), lowering it only at -ngl 1 (``output_only``).
    """
    model = write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=8000, dims=_LLAMA)
    doc, real = _partial(model, ["200MiB"], ["-c", "4096", "-ub", "2048"], real_llama_server)
    assert doc["offload"]["n_gpu_layers"] == 2, doc["offload"]
    predicted = doc["offload"]["devices_bytes"][0] / MIB
    assert within_bar(predicted, real[0]), (predicted, real)


def test_the_over_prediction_keeps_a_block_on_the_cpu_that_fits_the_device(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(8 layers, n_embd 1024, n_ff 4096) --rpc H:P=120MiB -c 4096 -ub 2048 --margin 0`
    -> `-ngl 1` (every block on the CPU, the device holding the output layer alone: 15.66 MiB real, 31.66
    planned). The same command with `-ngl 2` (block 7 on the device too) really allocates 98.19 MiB on it (model
    45.64 + KV 4.25 + compute 48.30), within the 120 MiB, while kvadvise sizes -ngl 2 at 185.93 MiB and so
    keeps block 7 on the CPU: a partial plan one layer short of what fits (the CPU runs that layer's matmuls at the
    system memory's bandwidth).

    Rule: as in test_ngl_2_the_last_block_alone_on_the_device_runs_its_ffn_on_one_row (src/models/llama.cpp:
    the last block's FFN runs on inp_out_ids' rows; offload.py partial_offload keeps the full offload's compute).
    """
    model = write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=8000, dims=_LLAMA)
    doc, real = _partial(model, ["120MiB"], ["-c", "4096", "-ub", "2048"], real_llama_server, ngl=2)
    assert real[0] <= 120, real  # -ngl 2 really fits the device's 120 MiB
    assert doc["offload"]["n_gpu_layers"] >= 2, (doc["offload"]["n_gpu_layers"], real)


def test_two_devices_partial_the_output_layer_alone_on_the_second(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(8 layers, n_embd 1024, n_ff 4096) --rpc A=100MiB --rpc B=100MiB -c 4096 -ts 1,1
    --margin 0` -> `-c 4096 -np 1 -fa on -ctk q8_0 -ctv q8_0 -ngl 2 -ts 1,1` (blocks 0-6 on the CPU; of the two
    offloaded layers block 7 goes to A, the output layer to B: llama_model::load_tensors' (il - i_gpu_start) /
    act_gpu_layers split).

    Predicted (offload.devices_bytes) vs llama-server: A 68.27 vs 46.54 MiB (model 30.01 + KV 4.25 + compute
    12.28: OVER by 21.7), B 49.64 vs 15.66 MiB (model 15.63 + compute 0.03: OVER by 34.0, 3.2x). Both devices keep
    the full two-device offload's 34 MiB compute buffer.

    Rule: B holds the output layer alone and computes one row's logits (n_outputs = 1 per slot,
    src/llama-context.cpp graph_reserve; the last block's ggml_get_rows(inp_out_ids), src/models/llama.cpp), A
    holds the last block alone (its FFN on that one row); the blocks on the CPU are computed by the CPU (ggml-rpc
    does not op-offload). offload.py partial_offload / _on_devices add and remove block weights and KV from the
    full offload's per-device totals but keep each device's full-offload compute (split.py's last-block and
    output-alone rules are applied only to the full offload's split).
    """
    model = write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=8000, dims=_LLAMA)
    doc, real = _partial(model, ["100MiB", "100MiB"], ["-c", "4096", "-ts", "1,1"], real_llama_server)
    assert doc["offload"]["n_gpu_layers"] == 2, doc["offload"]
    predicted = [b / MIB for b in doc["offload"]["devices_bytes"]]
    assert all(within_bar(p, m) for p, m in zip(predicted, real, strict=True)), (predicted, real)
