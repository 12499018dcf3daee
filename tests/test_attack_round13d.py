"""Review round 13d: the last three commits (split_compute's output-rows rules for a device holding only the last
block or only the output layer; per-device weights of models with non-block tensors) against real llama.cpp:
llama-server over loopback rpc-servers (tests/rpc_devices.plan_and_run), the same build as the vendored source
(/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp). The bar: compute within 16 MiB or 3 %; weights to 0.01 MiB.
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


def _device(doc: dict, got, d: int) -> tuple[dict, float, float]:
    """(the plan's device d, llama-server's compute MiB there, llama-server's model MiB there)"""
    dev = doc["memory"]["devices"][d]
    compute = sum(b.mib for b in got.buffers if b.buft == dev["name"] and b.kind == "compute")
    model = sum(b.mib for b in got.buffers if b.buft == dev["name"] and b.kind == "model")
    return dev, compute, model


@pytest.mark.xfail(
    strict=True,
    reason="held: 18 MiB over (the safe side): the last device of a split at -ub 1024 holds less than kvadvise's two hidden-state inputs and a layer plan, as test_attack_round13c's toy splits (not yet explained); the FFN at the whole ubatch is right for qwen35 (it gathers after the loop)",
)
def test_qwen35_last_block_alone_runs_its_ffn_on_the_whole_ubatch(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp qwen35(6 layers: 2 and 5 attention, n_embd 1024, n_ff 4096, n_vocab 8000) --rpc A=2GiB
    --rpc B=2GiB -c 4096 -ts 2,1 -ub 1024` -> `... -np 1 -fa on -ngl 999 -ts 2,1 -ub 1024 --rpc A,B`.

    The split: blocks 0-4 on the first device, block 5 (attention) and the output layer on the second. Second
    device's compute: predicted 78.13 MiB, llama-server prints 106.13 MiB (UNDER by 28 MiB, 26 %). With --users 4
    (-np 4) 54.13 vs 82.13 (28 under). The first device is exact (108.12 vs 108.13). At -ub 512: 39.06 vs 53.06.

    Rule: Qwen3.5 (and Qwen3-Next, Qwen3.5-MoE, Gemma 4, gpt-oss) gathers the output rows inside the last block only
    when ``cparams.embeddings_nextn_masked`` (src/models/qwen35.cpp: ``if (il == n_layer - 1 && inp_out_ids &&
    cparams.embeddings_nextn_masked)``); by default (llama-context.cpp: embeddings_nextn_masked = false) the
    ggml_get_rows(cur, inp_out_ids) comes after the layer loop, so the last block's FFN runs the whole ubatch.
    split.split_compute's new last-block rule (``part.layers == (last,) and rows_out < ub and kv_layers[last]``)
    sizes its FFN at the output rows for every model, as in src/models/llama.cpp.
    """
    model = write_tiny_gguf(
        tmp_path / "qwen35.gguf", "qwen35", n_vocab=8000, dims=dict(n_layer=6, n_embd=1024, n_ff=4096)
    )
    doc, got = plan_and_run(
        model, ["2GiB", "2GiB"], ["-c", "4096", "-ts", "2,1", "-ub", "1024"], real_llama_server, capsys
    )
    dev, measured, _ = _device(doc, got, -1)
    assert dev["n_layers"] == 2  # block 5 and the output layer
    predicted = dev["compute_bytes"] / MIB
    assert within_bar(predicted, measured), (predicted, measured)


@pytest.mark.parametrize(
    ("recipe", "dims", "ts"),
    [
        ("qwen35", dict(n_layer=6, n_embd=1024, n_ff=4096), "6,1"),
        ("gemma4-moe", dict(n_embd=1024), "3,1"),
        ("gemma4", dict(n_embd=1024), "7,1"),
    ],
    ids=["qwen35", "gemma4-moe", "gemma4"],
)
def test_output_layer_alone_of_a_model_that_gathers_after_the_loop(
    recipe: str, dims: dict, ts: str, tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp qwen35(6 layers, n_embd 1024, n_ff 4096, n_vocab 8000) --rpc A=2GiB --rpc B=2GiB -c 4096
    -ts 6,1 -ub 1024` -> `... -ngl 999 -ts 6,1 -ub 1024 --rpc A,B`: every block on the first device, the output
    layer alone on the second. Second device's compute: predicted 0.05 MiB, llama-server prints 20.03 MiB (UNDER by
    20 MiB, 400x). The same on gemma4-moe (6 layers, n_embd 1024, -ts 3,1: 0.05 vs 20.03) and gemma4 (9 layers,
    n_embd 1024, -ts 7,1: 0.05 vs 20.03).

    Rule: these models gather the output rows after the layer loop (src/models/qwen35.cpp, gemma4.cpp:
    ``if (!cparams.embeddings_nextn_masked && inp_out_ids) cur = ggml_get_rows(ctx0, cur, inp_out_ids);`` after
    ``for (int il ...)``), so the device with the output layer receives the last block's whole [n_embd, n_ubatch]
    hidden state (in the scheduler's copies) and gathers it there. split.split_compute's new output-layer-alone rule
    (``part.last and not part.layers``: ``row = 4 * rows_out * n_embd``) assumes the rows were gathered inside the
    last block on the previous device, as src/models/llama.cpp does.
    """
    model = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe, n_vocab=8000, dims=dims)
    doc, got = plan_and_run(
        model, ["2GiB", "2GiB"], ["-c", "4096", "-ts", ts, "-ub", "1024"], real_llama_server, capsys
    )
    dev, measured, _ = _device(doc, got, -1)
    assert dev["n_layers"] == 1  # the output layer only
    predicted = dev["compute_bytes"] / MIB
    assert within_bar(predicted, measured), (predicted, measured)


@pytest.mark.parametrize(
    ("recipe", "dims", "ctx"),
    [("gemma3n", dict(n_embd=512), "2048"), ("gemma4", dict(n_embd=1024), "4096")],
    ids=["gemma3n", "gemma4"],
)
def test_per_layer_model_proj_sits_with_block_0(
    recipe: str, dims: dict, ctx: str, tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma3n(22 layers, n_embd 512, n_vocab 8000) --rpc A=2GiB --rpc B=2GiB -c 2048 -ts 1,1
    -ub 1024` -> `... -ngl 999 -ts 1,1 -ub 1024 --rpc A,B`.

    First device's model buffer: predicted 24.24 MiB, llama-server prints 29.74 MiB (UNDER by 5.50 MiB); the last
    device 36.52 vs 31.02 (over by the same 5.50 = per_layer_model_proj, [512, 256 * 22] f16). On gemma4 (9 layers,
    n_embd 1024, per-layer width 16, -ts 1,1): 11.66 vs 11.94 and 25.49 vs 25.21 (0.28 MiB = [1024, 144] f16). On a
    real Gemma 4 E4B-sized model that tensor is tens of MiB planned on the wrong card.

    Rule: models/gemma3n.cpp and gemma4.cpp create it as ``create_tensor(tn(LLM_TENSOR_PER_LAYER_MODEL_PROJ,
    "weight", 0), ...)`` (block index 0), and llama-arch.cpp lists PER_LAYER_MODEL_PROJ (and PER_LAYER_PROJ_NORM)
    as LLM_TENSOR_LAYER_REPEATING, so llama_model_loader (src/llama-model-loader.cpp, ``case
    LLM_TENSOR_LAYER_REPEATING: buft_list = buft_list_layer``) puts it in block 0's buffer, the first device's;
    kvadvise counts it with the output layer's device.
    """
    model = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe, n_vocab=8000, dims=dims)
    doc, got = plan_and_run(
        model, ["2GiB", "2GiB"], ["-c", ctx, "-ts", "1,1", "-ub", "1024"], real_llama_server, capsys
    )
    for d in (0, 1):
        dev, _, measured = _device(doc, got, d)
        assert dev["weights_bytes"] / MIB == pytest.approx(measured, abs=0.01), (
            d,
            dev["weights_bytes"] / MIB,
            measured,
        )


@pytest.mark.xfail(
    strict=True,
    reason="held: Gemma 3n's compute is a known miss (tests/test_oracle.py TINY_COMPUTE_MISSES: its fixed-width per-layer inputs, 256 x n_layer per token, dominate a small model's buffer and the rule is fitted to real sizes); 98.54 MiB printed, 52.50 planned at -ub 1024 over an RPC device: UNDER, to be modelled with its graph",
)
def test_gemma3n_device_compute_over_rpc(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma3n(22 layers, n_embd 512, n_vocab 8000) --rpc A=2GiB -c 2048 -ub 1024` ->
    `... -np 1 -fa on -ctk f16 -ctv f16 -ngl 999 -ub 1024 --rpc A` (one device).

    Device compute: predicted 52.50 MiB, llama-server prints 98.54 MiB (UNDER by 46 MiB, 47 %). Over two devices
    (-ts 1,1) 80.19 vs 262.20 and 88.19 vs 276.14; at the recipe's own n_embd 128 (-ts 1,1, -ub 512) 31.34 vs 90.10
    and 32.34 vs 98.57. Every other recipe tried in this round is within the bar on the first device.

    Rule: not traced (GGML_SCHED_DEBUG was not read). gemma3n's graph (src/models/gemma3n.cpp) runs altup's 4
    streams ([n_embd, n_tokens, 4]) and the per-layer inputs through every block and gathers the output rows only
    after the loop (``ggml_tensor * inp_out_ids = build_inp_out_ids(); cur = ggml_get_rows(...)`` at line 296),
    with its per_layer_token_embd lookups (LLM_TENSOR_LAYER_INPUT, CPU) feeding the device; the measured figure is
    the finding: the plan's VRAM for this model over an RPC device is half of what llama.cpp allocates.
    """
    model = write_tiny_gguf(tmp_path / "gemma3n.gguf", "gemma3n", n_vocab=8000, dims=dict(n_embd=512))
    doc, got = plan_and_run(model, ["2GiB"], ["-c", "2048", "-ub", "1024"], real_llama_server, capsys)
    dev, measured, _ = _device(doc, got, 0)
    predicted = dev["compute_bytes"] / MIB
    assert within_bar(predicted, measured), (predicted, measured)
