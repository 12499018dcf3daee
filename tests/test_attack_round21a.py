"""Review round 21a: the partial-offload rework (each device's own blocks' compute both ways, ``expert_out`` after the
CPU's MoE layers, the fill from the last device, plain -ngl for a MoE, split masks, -fa on for hybrids) against real
allocations.

Same harness as tests/test_attack_round19d.py (imported: ``_case`` / ``_check``): a sparse tiny GGUF, loopback
rpc-servers as devices, ``kvadvise llamacpp MODEL --rpc EP=BUDGET ... --margin 0 --ctx N FLAGS --ram 16GiB
--llama-build b11312 --json``, its run_command run with llama-server b11312 (--fit off), and llama-server's own
``--fit on -fitt FREE-BUDGET`` for comparison; each device's real total is every buffer llama-server prints for it.
Vendored source: /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp (b11312).

What passed (regression guards not written here, see the round's report): qwen2moe / qwen35moe / gpt-oss plain -ngl
and --n-cpu-moe over 1-3 devices, gemma2 / gemma3 / cohere2 with unequal budgets over 2-3 devices, phi3 / qwen2 /
cohere2 / gpt-oss with a small last device. Every UNDER found is on deepseek2 (MLA, shared experts).
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import devices, run_server
from test_attack_round19d import _DSV2, MIB, _case, _check, _devices
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama


@pytest.mark.parametrize(
    ("budgets", "ctx", "flags"),
    [
        pytest.param([300], 16384, ["-ub", "2048"], id="one-device-ub2048"),
        pytest.param([350], 4096, ["-ub", "2048"], id="one-device-4k"),
        pytest.param([400], 8192, ["-ub", "1024"], id="one-device-ub1024"),
        pytest.param([300, 300], 16384, ["-ub", "2048"], id="two-devices"),
        pytest.param([250, 250, 100], 16384, ["-ub", "2048", "-np", "2"], id="three-devices-np2"),
    ],
)
def test_deepseek2_partial_device_compute_over_budget(
    budgets: list[int], ctx: int, flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side). `kvadvise llamacpp deepseek2-mla(8 layers, n_embd 1024, 16 heads, kv_lora 512, q_lora 384,
    qk_nope 128, qk_rope 64, v_head 128, 16 experts x 512, 4 used, 1 shared, 1 dense lead; n_vocab 8000) --rpc
    EP=BUDGET ... --margin 0 --ctx N FLAGS` (q8_0 chosen):

    | budgets, ctx, flags | kvadvise's command | predicted | printed | over budget |
    | [300] 16k -ub 2048 | -ngl 3 --n-cpu-moe 8 | 297.15 | 329.17 (46.03 + KV 19.12 + compute 264.02) | 29.2 |
    | [350] 4k -ub 2048 (f16 cache) | -ngl 8 --n-cpu-moe 8 | 337.52 | 361.82 | 11.8 |
    | [400] 8k -ub 1024 | -ngl 9 --n-cpu-moe 6 | 392.41 | 404.56 | 4.6 |
    | [300,300] 16k -ub 2048 | -ngl 3 --n-cpu-moe 8 -ts 0.29,0.29 | A 281.52 | A 313.54 | 13.5 |
    | [250,250,100] -np 2 -ub 2048 | -ngl 5 --n-cpu-moe 8 -ts 2,2,1 | A 249.52, B 249.52 | A 265.54, B 273.82 | 15.5, 23.8 |

    UNDER by 32.0 MiB (10 %), 24.3, 12.2, 32.0, 16.0 / 24.3 MiB.

    Source of most of it: the full offload's own compute figure. The same model at -ngl 99 (llama-server b11312 over
    one rpc-server, -fa on, q8_0): the device's compute buffer prints 52.08 / 104.15 / 208.30 MiB at -ub 512 / 1024
    / 2048 (ctx 4096) and 64.08 / 128.15 / 256.30 (ctx 16384); kvadvise's memory.devices[0].compute_bytes says 46 /
    92 / 184 and 58 / 116 / 232: 6 / 12 / 24 MiB under, independent of the context, 12 KiB a token = 3072 f32 =
    n_head x (qk_nope + qk_rope), one more [n_embd_head_k, n_head, n_ubatch] f32 query (the MLA graph, src/models/
    deepseek2.cpp, at b11312: q_nope absorbed through wk_b and concatenated with q_pe; the peak is in the attention
    block, not the experts: n_ff_exp 512 -> 1024 leaves the printed 208.30 unchanged). Varying the shape: n_head 8
    140.30 printed vs 136.00; n_expert_used 8 240.34 vs 200.31 (40 MiB under). With --n-cpu-moe on an RPC device the
    printed buffer grows 7.7 MiB more (264.02 vs 256.30) where memory._NO_HOST_EXPERTS_GROWTH plans none for deepseek2.
    Rule (best guess): memory.graph_sizes' MLA attention term misses one query-sized f32 tensor per ubatch token (and
    its expert term the n_expert_used scaling of the peak); the partial plan inherits it.
    """
    c = _case(tmp_path, "deepseek2-mla", _DSV2, budgets, ctx, flags, real_llama_server)
    _check(c)


def test_deepseek2_output_layer_alone_device(tmp_path: Path, real_llama_server: Path) -> None:
    """UNDER (OOM side). `kvadvise llamacpp deepseek2-mla(same tiny shape) --rpc A=85MiB --rpc B=40MiB --margin 0 --ctx
    16384 -ub 2048` -> `-c 16384 -np 1 -fa on -ctk q8_0 -ctv q8_0 -ngl 1 --n-cpu-moe 8 -ts 0.08,0.04 -ub 2048` (the
    output layer alone, on A).

    A predicted 79.67 MiB (15.63 weights + 64.04 compute); llama-server prints 105.63 (15.63 + 90.00 compute): UNDER
    by 25.96 MiB (25 %), 20.6 MiB over A's 85 MiB. Also [150,150], [200,40] -fa off, [200,200,200] 32k q4_0: the same
    79.67 vs 105.63 (inside those budgets).
    The output-only device's compute, straight on llama-server (-ngl 1): 24.0 / 46.0 / 90.0 MiB at -ub 512 / 1024 /
    2048, the same at ctx 4096, 16384 and 32768 and with -fa off; n_expert_used 8: the same 90.0; n_head 8: 12.0 / 45.0.
    So it is not the logits (62.5 MiB for 8000 x 2048 f32) nor the experts' output (n_expert_used does not move it),
    but 11 KiB a token per 16 heads = n_head x 704 f32 (704 = kv_lora + qk_rope + v_head, or kv_lora + qk_nope +
    qk_rope) plus n_head/8 MiB: the last CPU block's MLA attention intermediates.
    Rule (best guess): deepseek2 gathers the output rows after the layer loop (split._GATHER_AFTER_LOOP), and the
    weightless ops of the last block's absorbed attention are handed by ggml_backend_sched (ggml/src/ggml-backend.cpp,
    the passes that expand a GPU backend over unassigned nodes) to the output layer's device; kvadvise's output-layer
    figure (memory.output_layer_compute_bytes) sizes the logits instead, and partial_offload.tail_cut's 1.5 x
    expert_out is (rightly here) skipped for a model with shared experts.
    """
    c = _case(tmp_path, "deepseek2-mla", _DSV2, [85, 40], 16384, ["-ub", "2048"], real_llama_server)
    _check(c)


def test_deepseek2_full_offload_said_to_fit_takes_more_than_the_budget(tmp_path: Path, real_llama_server: Path) -> None:
    """UNDER (OOM side), the root of the partial cases above. `kvadvise llamacpp deepseek2-mla(same tiny shape) --rpc
    A=815MiB --margin 0 --ctx 16384 -ub 2048 -ctk q8_0 -ctv q8_0 -fa on` says it fits (802.66 MiB planned: 494.16
    weights + 76.50 KV + 232.00 compute) and runs -ngl 99; llama-server b11312 prints 826.96 (494.16 + 76.50 + 256.30
    compute): UNDER by 24.3 MiB (2.9 % of the total, 9.5 % of the compute), 12 MiB over the budget. See
    test_deepseek2_partial_device_compute_over_budget for the shape scan (n_head x (qk_nope + qk_rope) f32 a token).
    """
    from llama_server_build import rpc_server

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp_path / "ds.gguf", "deepseek2-mla", n_vocab=8000, n_ctx_train=32768, dims=_DSV2,
                            sparse=True)  # fmt: skip
    budget = 815
    with devices(rpc_server(), 1) as eps:
        argv = ["llamacpp", str(model), "--rpc", f"{eps[0]}={budget}MiB", "--margin", "0", "--ctx", "16384", "-ub",
                "2048", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--ram", "16GiB", "--llama-build", "b11312",
                "--json"]  # fmt: skip
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(argv)
        doc = json.loads(buf.getvalue())
        if not doc["fits"]:
            return  # refused: fine
        run = shlex.split(doc["llama_server"]["run_command"])
        args = run[run.index("-m") + 2 :]
        i = args.index("--rpc")
        del args[i : i + 2]
        real = _devices(run_server(real_llama_server, model, [*args, "--no-warmup", "--threads", "1"], eps), eps)[0]
    planned = doc["memory"]["devices"][0]["total_bytes"] / MIB
    assert real.total <= budget, f"{' '.join(args)}: planned {planned:.2f}, printed {real.total:.2f} > {budget} MiB"
