"""Review round 13c: kvadvise's plans over several devices against real llama.cpp (llama-server over loopback
rpc-servers, tests/rpc_devices.py).

Each test runs `kvadvise llamacpp MODEL --rpc H:P=SIZE --rpc H:P=SIZE ... --json`, runs the llama-server command
it writes over real rpc-servers and compares the plan's buffers of the device that holds the output layer (the
last one) with what llama-server prints (kvadvise.runtime.llamalog.parse). The bar: 16 MiB or 3 % per compute
buffer. llama-server runs with n_outputs_max = one row per slot (b11312), so its worst-case graph
(llama_context::graph_reserve, src/llama-context.cpp) selects the output rows with inp_out_ids *inside the last
block*: every token of the ubatch goes through the last block's attention, only n_outputs rows go on to its FFN and
the output layer (src/models/llama.cpp: ``if (il == n_layer - 1 && inp_out_ids) { cur = ggml_get_rows(ctx0, cur,
inp_out_ids); inpSA = ggml_get_rows(ctx0, inpSA, inp_out_ids); }``; the same in every model's graph). On one
device the earlier blocks set the peak and this does not show; over several devices (-ts) the device that holds
the last block(s) and the output layer is sized by kvadvise.planner.split.split_compute as if the last block and
the output phase ran the whole ubatch (``layer`` from graph_sizes of its blocks at n_ubatch rows; ``out = logits +
2 * s.embd_bytes`` on the device with the output layer), so its compute buffer is over-predicted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import plan_and_run, within_bar
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama
MIB = 1 << 20


def _plan_and_run(
    model: Path, sizes: list[str], extra: list[str], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
):
    return plan_and_run(model, sizes, extra, real_llama_server, capsys)


def _last_device_compute(doc: dict, got) -> tuple[float, float]:
    dev = doc["memory"]["devices"][-1]
    measured = sum(b.mib for b in got.buffers if b.buft == dev["name"] and b.kind == "compute")
    return dev["compute_bytes"] / MIB, measured


def test_a_device_holding_only_the_last_block_runs_its_ffn_on_the_output_rows(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(4 layers, n_embd 1024, head 256, n_ff 4096, n_vocab 8000) --rpc A=2GiB --rpc B=2GiB
    -c 4096 -ts 1,1` -> `-c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 999 -ts 1,1 --rpc A,B`.

    The split (llama_model::load_tensors, 5 layers incl. the output one, points 0.5): blocks 0-2 on the first
    device, block 3 and the output layer on the second. Second device's compute buffer: predicted 62.06 MiB,
    llama-server prints 30.04 MiB (2.07x, OVER by 32 MiB); the first device 54.06 vs 54.04 (exact). With -ub 1024
    it is 124.13 vs 60.08, and with --users 4 -ub 1024 (-np 4) 100.13 vs 36.08.

    Rule: the last block selects the output rows before its FFN (src/models/llama.cpp, ``il == n_layer - 1 &&
    inp_out_ids``: ggml_get_rows(cur, inp_out_ids)), and llama-server reserves n_outputs = n_seqs rows
    (llama_context::graph_reserve's worst case, n_outputs_max = 1 per slot, src/llama-context.cpp). So a device
    whose only block is the last one never holds the FFN's [n_ff, n_ubatch] f32 gate/up/act tensors (16 MiB each
    at n_ubatch 1024): its peak is the last block's attention and its split inputs. kvadvise's split_compute
    (advisor/planner/split.py) sizes that device's ``layer`` with graph_sizes(part.spec, lay).mix_bytes, the FFN
    at the whole ubatch (60 MiB at -ub 1024), the same as any block's.
    """
    model = write_tiny_gguf(
        tmp_path / "llama.gguf", "llama", n_vocab=8000, dims=dict(n_layer=4, n_embd=1024, head=256, n_ff=4096)
    )
    doc, got = _plan_and_run(model, ["2GiB", "2GiB"], ["-c", "4096", "-ts", "1,1"], real_llama_server, capsys)
    predicted, measured = _last_device_compute(doc, got)
    assert within_bar(predicted, measured), (predicted, measured)


@pytest.mark.xfail(
    strict=True,
    reason="held: 20 MiB over (the safe side) on these toy shapes (n_ff four times n_embd, -ub 1024); the same rule is exact on the real shapes of benchmarks/bench_split.py (Llama 3.1 8B, Qwen3 0.6B), and the split inputs GGML_SCHED_DEBUG prints are one hidden state on both: the 20 MiB sit in the live set, not yet explained",
)
@pytest.mark.parametrize(
    ("recipe", "dims"),
    [
        ("llama", dict(n_layer=6, n_embd=1024, head=256, n_ff=4096)),
        ("qwen35", dict(n_layer=6, n_embd=1024, n_ff=4096)),
    ],
    ids=["llama-6-layers", "qwen35-hybrid"],
)
def test_the_device_with_the_output_layer_is_not_over_predicted_by_a_second_hidden_state(
    recipe: str, dims: dict, tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(6 layers, n_embd 1024, head 256, n_ff 4096) --rpc A=2GiB --rpc B=2GiB -c 4096
    -ub 1024 -ts 1,1` -> `... -ngl 999 -ts 1,1 -ub 1024 --rpc A,B` (pipeline parallelism enabled, 4 sched copies).

    The last device (blocks 4-5 + output layer): predicted 124.13 MiB, llama-server prints 104.08 MiB (OVER by
    20.05 MiB, 19 %); the first device 108.12 vs 108.08 (exact). The same 20 MiB over with llama 4 layers -ts 1,3
    (124.13 vs 104.08), on the hybrid qwen35 (6 layers, n_embd 1024, -ts 1,1 -ub 1024: 124.13 vs 106.13), on
    gemma3 (8 layers, n_embd 1024, n_ff 4096: 134.19 vs 115.14), gpt-oss (4 layers, n_embd 1024, n_ff_exp 1024:
    100.19 vs 81.08), lfm2 and granitehybrid at n_embd 1024 -ub 1024 (88.13 vs 72.11, 90.12 vs 70.11 on one of the
    two devices), and mamba2 (4 layers, n_embd 1024, d_inner 2048, -c 8192 -ts 1,1: 154.16 vs 125.84).

    Rule: split_compute (advisor/planner/split.py) counts on every device after the first ``2 * s.embd_bytes``
    of split inputs (the previous block's l_out and the next block's weightless rms norm, per its docstring from
    llama-fit-params' whole-batch graph), each in N_COPIES = 4 copies (ggml_backend_sched_split_graph,
    ggml/src/ggml-backend.cpp, GGML_SCHED_MAX_COPIES), and ``out = logits + 2 * embd`` on the output device.
    The 20.05 MiB over matches one [n_embd, n_ubatch] f32 in 4 copies plus one more (4 x 4 + 4 MiB at n_embd 1024,
    n_ubatch 1024), i.e. the second hidden-state input that llama-server's graph (n_outputs = 1 per slot,
    src/llama-context.cpp graph_reserve, the output rows gathered inside the last block) apparently does not copy
    into the last device. That mechanism is inferred from the sizes; GGML_SCHED_DEBUG printed no split list
    through llama-server's log, so it was not traced. The measured figures are the finding.
    """
    model = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe, n_vocab=8000, dims=dims)
    doc, got = _plan_and_run(
        model, ["2GiB", "2GiB"], ["-c", "4096", "-ub", "1024", "-ts", "1,1"], real_llama_server, capsys
    )
    predicted, measured = _last_device_compute(doc, got)
    assert within_bar(predicted, measured), (predicted, measured)


def test_a_device_holding_only_the_output_layer_computes_one_row(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp mamba2(4 layers, n_embd 1024, d_inner 2048, n_vocab 8000) --rpc A=2GiB --rpc B=2GiB -c 8192
    -ub 1024 -ts 2,1` -> `-c 8192 -np 1 -fa on -ctk f16 -ctv f16 -ngl 999 -ts 2,1 -ub 1024 --rpc A,B`.

    The split (5 layers incl. the output one, points 2/3): every block on the first device, the output layer
    (output.weight 15.63 MiB, the plan's weights exact) alone on the second. Second device's compute buffer:
    predicted 40.09 MiB, llama-server prints 0.05 MiB (OVER by 40 MiB; 800x). The first device 73.10 vs 64.79.

    Rule: the last block gathers the output rows (ggml_get_rows(cur, inp_out_ids), src/models/mamba.cpp /
    graph-context-mamba.cpp, as every model's graph) and llama-server reserves n_outputs = 1 row per slot
    (llama_context::graph_reserve, src/llama-context.cpp), so a device with nothing but output_norm and output
    computes [n_embd, 1] and [n_vocab, 1] tensors: a few KiB. kvadvise's split_compute (advisor/planner/split.py)
    gives the device with the output layer ``out = logits + 2 * s.embd_bytes`` ([n_embd, n_ubatch] f32 twice) plus
    4 copies of ``inputs`` that count ``2 * s.embd_bytes`` again (the hidden state and a norm at the whole ubatch):
    40 MiB for tensors of one row.
    """
    model = write_tiny_gguf(
        tmp_path / "mamba2.gguf", "mamba2", n_vocab=8000, dims=dict(n_layer=4, n_embd=1024, d_inner=2048)
    )
    doc, got = _plan_and_run(
        model, ["2GiB", "2GiB"], ["-c", "8192", "-ub", "1024", "-ts", "2,1"], real_llama_server, capsys
    )
    last = doc["memory"]["devices"][-1]
    assert last["n_layers"] == 1  # the output layer only
    predicted, measured = _last_device_compute(doc, got)
    assert within_bar(predicted, measured), (predicted, measured)
