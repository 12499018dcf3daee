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
from test_attack_round20a import _GPT_OSS, _QWEN3MOE
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama


# fixed (sizes.graph_sizes: the absorbed MLA attention's live set, qk_nope + 3 qk_rope + 2 kv_lora_rank + 128 f32 a head
# and token; split._GATHER_AFTER_LOOP: deepseek2 gathers its output rows inside the last block): never over a budget now.
# Held: the share, below --fit's where the rule's few MiB over a tiny shape's figure cost a block at --margin 0
_HELD_DSV2_SHARE = pytest.mark.xfail(
    strict=True,
    reason="held: the GPU share, not the budget: on this tiny MLA shape the attention rule is 8-16 MiB over at -ub 2048 "
    "(272 planned, 256.31 printed at full offload), and at --margin 0 that keeps the plan a block (or the experts of one) "
    "below --fit's",
)


@pytest.mark.parametrize(
    ("budgets", "ctx", "flags"),
    [
        pytest.param([300], 16384, ["-ub", "2048"], id="one-device-ub2048"),
        pytest.param([350], 4096, ["-ub", "2048"], id="one-device-4k", marks=_HELD_DSV2_SHARE),
        pytest.param([400], 8192, ["-ub", "1024"], id="one-device-ub1024"),
        pytest.param([300, 300], 16384, ["-ub", "2048"], id="two-devices"),
        pytest.param(
            [250, 250, 100], 16384, ["-ub", "2048", "-np", "2"], id="three-devices-np2", marks=_HELD_DSV2_SHARE
        ),
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
    printed buffer grows 7.7 MiB more (264.02 vs 256.30) where host_experts._NO_HOST_EXPERTS_GROWTH plans none for deepseek2.
    Rule (best guess): memory.graph_sizes' MLA attention term misses one query-sized f32 tensor per ubatch token (and
    its expert term the n_expert_used scaling of the peak); the partial plan inherits it.
    """
    c = _case(tmp_path, "deepseek2-mla", _DSV2, budgets, ctx, flags, real_llama_server)
    _check(c)


# fixed: deepseek2 gathers its output rows inside the last block (split._GATHER_AFTER_LOOP): 15.69 planned, 15.66 printed
def test_deepseek2_output_layer_alone_device(tmp_path: Path, real_llama_server: Path) -> None:
    """OVER (the safe side, wastes a device). `kvadvise llamacpp deepseek2-mla(same tiny shape) --rpc A=85MiB --rpc
    B=40MiB --margin 0 --ctx 16384 -ub 2048` -> `-c 16384 -np 1 -fa on -ctk q8_0 -ctv q8_0 -ngl 1 --n-cpu-moe 8 -ts
    0.08,0.04 -ub 2048` (the output layer alone, on A).

    A predicted 79.67 MiB (15.63 weights + 64.04 compute); llama-server b11312 (AMX off, as the test suite runs it:
    tests/conftest.py _amx_off) prints 15.66 (15.63 + 0.03 compute): OVER by 64 MiB (5x). Also [150,150], [200,40]
    -fa off, [200,200,200] 32k q4_0: the same 79.67 planned.
    Note, not this test's expectation: with the CPU's AMX buffer type left on (a Sapphire Rapids host; llama-server
    prints an "AMX model" buffer) the same command prints 105.63 (compute 90.00: 24.0 / 46.0 / 90.0 MiB at -ub 512 /
    1024 / 2048, independent of ctx, -fa and n_expert_used; 12.0 / 45.0 with n_head 8, i.e. n_head x 704 f32 a token
    -- the last CPU block's MLA attention intermediates): 20.6 MiB over A's budget there.
    Rule (best guess): kvadvise sizes the output layer's device for a gather-after-loop model (split._GATHER_AFTER_LOOP)
    with the whole ubatch's logits (62.5 MiB for 8000 x 2048 f32), where llama-server's reserve has one output row; a
    qwen2moe output-only device prints 0.04 MiB for 63.67 planned too.
    """
    c = _case(tmp_path, "deepseek2-mla", _DSV2, [85, 40], 16384, ["-ub", "2048"], real_llama_server)
    _check(c)


# fixed: the absorbed MLA attention's live set (sizes.graph_sizes)
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


_QWEN3MOE_U8 = {**_QWEN3MOE, "n_expert_used": 8}  # Qwen3-30B-A3B's 8 used experts
_GPT_OSS_U8 = {**_GPT_OSS, "n_expert_used": 8}


# fixed (host_experts.cpu_experts_boundary_bytes: the qwen3moe device at its first block after the CPU's experts, the last
# block alone, every expert on the host; llama-server b11312 over rpc-servers, 2-8 used experts): the qwen3moe cases
# pass. Held: gpt-oss with 8 used experts narrower than n_embd (not gpt-oss's own shapes, where n_ff_exp = n_embd)
_HELD_GPT_OSS_U8 = pytest.mark.xfail(
    strict=True,
    reason="held: gpt-oss with 8 used experts of n_ff_exp = n_embd / 2 (not a shape gpt-oss ships): plain -ngl plans one experts' output of growth where 1.5 come (8 MiB under at -ub 1024) and the plan stops short of --fit's share or over-plans the CPU blocks' device by 80 MiB; at gpt-oss-20b's own dimensions (n_ff_exp = n_embd) the host experts' growth is exact (host_experts.host_experts_device_growth)",
)


@pytest.mark.parametrize(
    ("recipe", "dims", "budgets", "flags"),
    [
        pytest.param("qwen3moe", _QWEN3MOE_U8, [250], ["-ub", "2048"], id="qwen3moe-u8-250"),
        pytest.param("qwen3moe", _QWEN3MOE_U8, [400], ["-ub", "2048"], id="qwen3moe-u8-400"),
        pytest.param("gpt-oss", _GPT_OSS_U8, [300], ["-ub", "2048"], id="gpt-oss-u8-300", marks=_HELD_GPT_OSS_U8),
        pytest.param("gpt-oss", _GPT_OSS_U8, [450], ["-ub", "2048"], id="gpt-oss-u8-450", marks=_HELD_GPT_OSS_U8),
        pytest.param(
            "gpt-oss", _GPT_OSS_U8, [350], ["-ub", "1024"], id="gpt-oss-u8-350-ub1024", marks=_HELD_GPT_OSS_U8
        ),
        pytest.param("qwen3moe", _QWEN3MOE_U8, [150, 150, 150], ["-ub", "2048"], id="qwen3moe-u8-3dev"),
    ],
)
def test_moe_eight_used_experts_partial_device_over_budget(
    recipe: str, dims: dict, budgets: list[int], flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side). The round-20 shapes (8 layers, n_embd 1024, 16 heads, 4 kv, head 64, 16 experts x 512; gpt-oss
    with n_swa 128) with n_expert_used 8 instead of 4 (Qwen3-30B-A3B uses 8 of 128), --ctx 16384:

    | model, budget, flags | kvadvise's command | predicted | printed | over budget |
    | qwen3moe [250] -ub 2048 | -ngl 4 --n-cpu-moe 8 (q8_0) | 240.65 | 256.47 | 6.5 |
    | qwen3moe [400] -ub 2048 | -ngl 3 (plain) | 387.08 | 402.90 | 2.9 |
    | gpt-oss [300] -ub 2048 | -ngl 7 --n-cpu-moe 8 | 294.17 | 309.96 | 10.0 |
    | gpt-oss [450] -ub 2048 | -ngl 9 --n-cpu-moe 5 (-ctv q8_0) | 449.85 | 473.66 | 23.7 |
    | gpt-oss [350] -ub 1024 | -ngl 9 --n-cpu-moe 5 (-ctv q8_0) | 348.13 | 360.05 | 10.1 |
    | qwen3moe [150,150,150] -ub 2048 | -ngl 2 --n-cpu-moe 8 -ts 0.15,0.15,0.15 | A 133.63, B 111.67 | A 157.70, B 15.67 | A 7.7 |

    UNDER by 15.8, 15.8, 15.8, 23.8, 11.9, 24.1 (A) MiB. In the three-device case llama.cpp deals block 7 (experts on
    the CPU) to A and the output layer to B (load_tensors: layer il at il / act_gpu_layers against the -ts split
    points); A prints 144.13 MiB of compute (120.06 planned), B 0.04 (96.04 planned: partial_offload.tail_cut's
    1.5 x expert_out for the output layer's device, which here holds no block but is not the device after the host
    experts either -- A is; qwen3moe gathers its output rows inside the last block, so B receives one row). The same
    144.13 on each device holding one block with host experts at -ngl 3 --n-cpu-moe 8 -ts 1,2 ([200,200]: B 149.26
    planned, 173.33 printed); 112.10 with n_expert_used 4. Straight on llama-server (one rpc-server, -ub 2048, q8_0): the
    qwen3moe-u8 device's compute is 176.32 MiB at -ngl 99 (kvadvise 184.31: over, fine), 264.13 at -ngl 3 and at
    -ngl 8 (+87.8 MiB; kvadvise adds expert_out = [n_embd, n_expert_used, n_ubatch] f32 = 64 MiB), 176.32 with
    --n-cpu-moe 3 (no growth). With n_expert_used 4 the round-20 figure was +32.03 = expert_out exactly: the growth is
    not linear in n_expert_used (4 -> 32 MiB, 8 -> 88 MiB). gpt-oss-u8 at -ngl 99: 209.10 printed, 193.31 planned
    (full offload already 15.8 under; with n_expert_used 2: 105.35 printed vs 121.31 planned, 4: 137.35 vs 145.31,
    so the planned expert term grows slower than the real one), 217.12 with --n-cpu-moe 3.
    Rule (best guess): memory.expert_activation_bytes / the MoE FFN peak of graph_sizes scale the [n_ff_exp,
    n_expert_used, n_ubatch] and [n_embd, n_expert_used, n_ubatch] tensors with a factor fitted at n_expert_used 4;
    at 8 the live set holds more of them (the mul_mat_id gate/up/down outputs and the weighted copy, ggml-alloc in
    ggml_backend_sched_reserve). partial_offload.tail_cut's expert_out should follow the same term (about 1.37 x at 8).
    """
    c = _case(tmp_path, recipe, dims, budgets, 16384, flags, real_llama_server)
    _check(c)


@pytest.mark.xfail(
    strict=True,
    reason="held: as _HELD_GPT_OSS_U8: gpt-oss with 8 used experts of n_ff_exp = n_embd / 2 at -np 2: the plain -ngl 4 plan 16 MiB under on its first device, -ngl 3 70 MiB over",
)
@pytest.mark.parametrize("budgets", [pytest.param([450, 60], id="450-60"), pytest.param([400, 60], id="400-60")])
def test_gpt_oss_eight_used_np2_host_experts_device_over_budget(
    budgets: list[int], tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER by 95.7 MiB (OOM side). `kvadvise llamacpp gpt-oss(8 layers, n_embd 1024, 16 heads, 4 kv, head 64, n_swa
    128, 16 experts x 512, 8 used; n_vocab 8000) --rpc A=450MiB --rpc B=60MiB --margin 0 --ctx 16384 -ub 2048 -np 2`
    -> `-c 16384 -np 2 -fa on -ctk f16 -ctv f16 -ngl 9 --n-cpu-moe 5 -ts 0.44,0.06 -ub 2048`.

    A predicted 428.33 MiB; llama-server b11312 prints 524.06 (model 185.02 + KV 64 + 18 + compute 257.04): UNDER by
    95.7 MiB (18 %), 74 MiB over A's 450. [400,60] (-ngl 9 --n-cpu-moe 6): 380.20 vs 411.93 (31.7 under, 11.9 over).
    The same model at -ngl 99 -np 2 prints 177.07 MiB of compute (193.07 at -np 1); with --n-cpu-moe 5 at -np 2,
    257.04: +80 MiB = [n_embd, n_expert_used, n_ubatch] f32 (64 MiB) + 16, where at -np 1 --n-cpu-moe 3 the growth is
    8 MiB (217.12 vs 209.10). kvadvise plans no host-experts growth for a MoE without shared experts
    (host_experts.host_experts_device_growth returns 0 without n_ff_shexp: "A qwen3moe of the same size ... moves by at most
    0.5 MiB", measured at n_expert_used 4, -np 1).
    Rule (best guess): with several sequences (-np 2, the sliding-window cache per sequence, its mask's shape) the
    device's peak moves to the split after the host experts, where the copy of the experts' output is live; the
    growth should be planned for a MoE without shared experts too when n_cpu_moe > n_cpu (ggml_backend_sched_split_graph,
    ggml/src/ggml-backend.cpp).
    """
    c = _case(tmp_path, "gpt-oss", _GPT_OSS_U8, budgets, 16384, ["-ub", "2048", "-np", "2"], real_llama_server)
    _check(c)


_HELD_SMALL_UNDER = pytest.mark.xfail(
    strict=True,
    reason="held: within the 16 MiB / 3 % bar but over a --margin 0 budget by 3-16 MiB (gpt-oss host experts, cohere2's split, gemma3 at -np 3-4: the SWA mask of several sequences): kvadvise's default margin covers these; at --margin 0 the bar is the promise",
)


@pytest.mark.parametrize(
    ("recipe", "dims", "budgets", "ctx", "flags"),
    [
        pytest.param(
            "gpt-oss", _GPT_OSS, [390, 60], 16384, ["-ub", "2048"], id="gpt-oss-390-60", marks=_HELD_SMALL_UNDER
        ),
        pytest.param(
            "gpt-oss",
            _GPT_OSS,
            [250, 100],
            16384,
            ["-ub", "1024", "-np", "2"],
            id="gpt-oss-np2",
            marks=_HELD_SMALL_UNDER,
        ),
        # passes since round 26d (compute._split_layer_peak: a freed mask narrower than a row of n_embd stays a hole):
        # -ngl 2 -ts 0.15,0.06 planned, A 97.16 predicted, 85.22 printed (the -ngl 3 plan's A had been 148.10 / 151.29)
        pytest.param("cohere2", "cohere2", [150, 60], 16384, ["-ub", "1024", "-np", "2"], id="cohere2-np2"),
        pytest.param(
            "gemma3",
            "gemma3",
            [260, 260],
            16384,
            ["-ub", "2048", "-np", "3", "-ctk", "q8_0", "-ctv", "q8_0"],
            id="gemma3-np3",
            marks=_HELD_SMALL_UNDER,
        ),
        pytest.param(
            "gemma3",
            "gemma3",
            [260, 260],
            16384,
            ["-ub", "2048", "-np", "4", "-ctk", "q8_0", "-ctv", "q8_0"],
            id="gemma3-np4",
            marks=_HELD_SMALL_UNDER,
        ),
        pytest.param(
            "cohere2",
            "cohere2",
            [288, 150],
            32768,
            ["-ub", "2048", "-np", "4", "-ctk", "q8_0", "-ctv", "q8_0"],
            id="cohere2-np4-32k",
            marks=_HELD_SMALL_UNDER,
        ),
    ],
)
def test_small_under_inside_the_bar_still_over_a_budget(
    recipe: str,
    dims: dict | str,
    budgets: list[int],
    ctx: int,
    flags: list[str],
    tmp_path: Path,
    real_llama_server: Path,
) -> None:
    """UNDER (OOM side), inside the 16 MiB / 3 % bar but over the declared budget (goal 1), --margin 0:

    | case | kvadvise's command | A predicted | A printed | budget |
    | gpt-oss (4 used) [390,60] -ub 2048 | -ngl 9 --n-cpu-moe 5 -ts 0.38,0.06 (-ctv q8_0) | 386.22 | 394.00 | 390 |
    | gpt-oss [250,100] -ub 1024 -np 2 | -ngl 9 --n-cpu-moe 6 -ts 8,1 | 248.20 | 252.10 | 250 |
    | cohere2 [150,60] -ub 1024 -np 2 | -ngl 3 -ts 2,1 (q8_0) | 148.10 | 151.29 | 150 |
    | gemma3 [260,260] -ub 2048 -np 3 q8_0 | -c 16383 -ngl 7 -ts 3,4 | B 249.41 | B 263.72 | 260 |
    | gemma3 [260,260] -ub 2048 -np 4 q8_0 | -ngl 7 -ts 3,4 | B 251.80 | B 260.03 | 260 |
    | cohere2 [288,150] 32k -ub 2048 -np 4 q8_0 | -ngl 6 -ts 0.28,0.15 | A 286.95, B 149.70 | A 303.19, B 125.74 | 288 |

    gpt-oss (n_expert_used 4) straight on llama-server, -ub 2048: compute 137.35 MiB at -ngl 99 (kvadvise 145.31),
    153.09 with --n-cpu-moe 1, 3 or 5, 129.09 with 8: +15.74 MiB (+7.86 at -ub 1024, +3.92 at 512) when some but not
    all experts are in host memory, which host_experts_device_growth plans as 0 for a MoE without shared experts; the
    full offload's 8 MiB of slack hides half of it. cohere2 (8 layers, n_embd 1024, 8 heads, 2 kv, n_ff 4096, n_swa
    512, pattern 4): 3.2 MiB under at -np 1, 2 and 4 whenever A holds blocks 5-7 (the global block 7 among them) with
    B holding the output layer or nothing (also [140,60] 32k -ub 512 -np 2: 139.70 vs 140.87); likely the split
    mask rule (compute._split_layer_peak) for cohere2, whose last layer is a global one, missing one [n_embd, n_ubatch]
    f32 row or the SWA mask's padding. gemma3 (8 layers, n_embd 1024, 8 heads, 2 kv, head 128, n_ff 4096, n_swa 512;
    global block 5), B holding blocks 4-7 and the output layer: printed compute 144.30 MiB at -np 3 (KV 8.77 + 7.97),
    planned about 130; the same device is planned OVER by 7.8 MiB at -np 1 and 2 (243.83 vs 236.07, 246.49 vs
    238.72) and UNDER by 14.3 / 8.2 at -np 3 / 4 (3.3 at 32k -np 3): the sequences' split of the sliding-window
    cache (-np 3 leaves 5461 cells a sequence, not a multiple of 256) and its mask per stream (llm_graph_input_attn_kv_
    iswa, src/llama-graph.cpp) are likely sized for one stream. (gemma3 -np 4: --fit's own placement prints 260.03
    on B too.) cohere2 -np 4 at 32k (16.2 MiB under, just off the bar too): A holds blocks 3-6 (global block 3), B
    block 7 (global) and the output layer; printed compute A 154.23, B 64.11 (KV A 17.00 + 15.94, B 17.00); planned
    about 138.0 and 88.1: the compute is split between the two devices the other way round from what is printed.
    Same shape over three devices [310,210,110] (-ngl 6 -ts 4,1,1): A 286.95 planned, 303.19 printed.
    """
    if dims == "cohere2":
        dims = {"n_layer": 8, "n_embd": 1024, "n_head": 8, "n_head_kv": 2, "n_ff": 4096, "n_swa": 512}
    elif dims == "gemma3":
        dims = {"n_layer": 8, "n_embd": 1024, "n_head": 8, "n_head_kv": 2, "n_ff": 4096, "head": 128, "n_swa": 512}
    c = _case(tmp_path, recipe, dims, budgets, ctx, flags, real_llama_server)
    _check(c)
