"""Review round 19d: kvadvise's partial plan against llama.cpp's own ``--fit`` on real allocations, on architectures
and settings benchmarks/bench_fit.py's grid lacks (lfm2, granitehybrid, mamba2, gpt-oss, gemma3 over two devices,
q8_0 caches, -np 2, -ub 2048, flash attention off).

Each test writes a sparse tiny GGUF (tests/tinymodels.py), starts loopback rpc-servers (tests/rpc_devices.py), and

(a) plans: ``kvadvise llamacpp MODEL --rpc EP=BUDGET [...] --margin 0 --ctx N FLAGS --ram 16GiB --llama-build b11312
    --json`` (``offload.devices_bytes``: each device's predicted total);
(b) runs its ``run_command`` (llama-server, --fit off) over the same servers: each device's real total is every
    non-host buffer llama-server prints for it (model + KV + RS + compute), its weights the model buffers;
(c) runs llama-server with the plan's cache settings (-c -np -fa -ctk -ctv -b -ub; no -ngl/-ts/--n-cpu-moe) and
    ``--fit on -fitt FREE-BUDGET,...`` (common/fit.cpp, common_params_fit_impl): the b11312 rpc-server reports the
    host's physical memory (MemTotal) as each device's free memory, so the margin leaves each device its budget.
    --fit's own placement is checked to be inside every budget before it is compared with.

The goal the project is held to: (1) no device really allocates more than its declared budget; (2) each device's
predicted total within 16 MiB or 3 % of the real one; (3) at least as many weights on the devices as --fit puts
there. Vendored source: /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp (b11312).
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import devices, run_server, within_bar
from tinymodels import write_tiny_gguf

pytestmark = pytest.mark.llama
MIB = 1 << 20
_DENSE = {"n_layer": 8, "n_embd": 1024, "n_head": 8, "n_head_kv": 2, "n_ff": 4096}
_GEMMA3 = {**_DENSE, "head": 128, "n_swa": 512}
_GPT_OSS = {
    "n_layer": 8,
    "n_embd": 1024,
    "n_head": 16,
    "n_head_kv": 4,
    "head": 64,
    "n_swa": 128,
    "n_expert": 16,
    "n_expert_used": 4,
    "n_ff_exp": 512,
}
_DSV2 = {
    "n_layer": 8,
    "n_embd": 1024,
    "n_head": 16,
    "n_ff": 4096,
    "kv_lora": 512,
    "qk_rope": 64,
    "qk_nope": 128,
    "v_head": 128,
    "q_lora": 384,
    "n_expert": 16,
    "n_expert_used": 4,
    "n_ff_exp": 512,
}
_MAMBA2 = {"n_layer": 8, "n_embd": 1024, "d_inner": 2048, "d_state": 128, "n_head": 32}


@dataclass
class Device:
    weights: float  # MiB: the model buffers on it
    total: float  # MiB: every buffer on it (model + KV + RS + compute)


@dataclass
class Case:
    budgets: list[int]  # MiB
    predicted: list[float]  # MiB, offload.devices_bytes
    ours: list[Device]
    fit: list[Device]
    command: str

    def report(self) -> str:
        return (
            f"{self.command}\nbudgets {self.budgets} MiB; predicted {[round(p, 2) for p in self.predicted]};"
            f" real {[round(d.total, 2) for d in self.ours]} (weights {[round(d.weights, 2) for d in self.ours]});"
            f" --fit {[round(d.total, 2) for d in self.fit]} (weights {[round(d.weights, 2) for d in self.fit]})"
        )


def _devices(text: str, eps: list[str]) -> list[Device]:
    from kvadvise.runtime.llamalog import parse

    log = parse(text.splitlines())
    out = []
    for ep in eps:
        mine = [b for b in log.buffers if b.buft == f"RPC0[{ep}]"]
        out.append(Device(sum(b.mib for b in mine if b.kind == "model"), sum(b.mib for b in mine)))
    return out


def _mem_total_mib() -> int:
    """What the CPU backend behind rpc-server reports as a device's free memory (benchmarks/bench_fit.py)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal")


def _case(tmp: Path, recipe: str, dims: dict, budgets: list[int], ctx: int, flags: list[str], server: Path) -> Case:
    from llama_server_build import rpc_server

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp / f"{recipe}.gguf", recipe, n_vocab=8000, n_ctx_train=32768, dims=dims, sparse=True)
    with devices(rpc_server(), len(budgets)) as eps:
        rpc = [a for ep, b in zip(eps, budgets, strict=True) for a in ("--rpc", f"{ep}={b}MiB")]
        argv = ["llamacpp", str(model), *rpc, "--margin", "0", "--ctx", str(ctx), *flags]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main([*argv, "--ram", "16GiB", "--llama-build", "b11312", "--json"])
        doc = json.loads(buf.getvalue())
        off = doc["offload"]
        assert doc["fits"] is False and isinstance(off, dict) and off["runnable"], doc.get("offload")
        run = shlex.split(doc["llama_server"]["run_command"])
        args = run[run.index("-m") + 2 :]
        i = args.index("--rpc")
        del args[i : i + 2]
        common = ["--no-warmup", "--threads", "1"]
        ours = _devices(run_server(server, model, [*args, *common], eps), eps)
        keep = {"-c", "-np", "-fa", "-ctk", "-ctv", "-b", "-ub"}
        cache = [x for j, a in enumerate(args) if a in keep and j + 1 < len(args) for x in (a, args[j + 1])]
        free = _mem_total_mib()
        fitt = ",".join(str(free - b) for b in budgets)
        fit = _devices(run_server(server, model, [*cache, "--fit", "on", "-fitt", fitt, *common], eps), eps)
    return Case(
        budgets,
        [b / MIB for b in off["devices_bytes"]],
        ours,
        fit,
        "kvadvise " + " ".join(argv[:2] + argv[2 + 2 * len(budgets) :]) + f" -> {' '.join(args)}",
    )


def _check(c: Case) -> None:
    """The three goals, each device; --fit's placement must itself be inside the budgets to be compared with."""
    msg = c.report()
    assert all(d.total <= b for d, b in zip(c.ours, c.budgets, strict=True)), "over a budget: " + msg
    assert all(within_bar(p, d.total) for p, d in zip(c.predicted, c.ours, strict=True)), "off the bar: " + msg
    assert all(d.total <= b for d, b in zip(c.fit, c.budgets, strict=True)), "--fit over a budget (void): " + msg
    ours, fit = sum(d.weights for d in c.ours), sum(d.weights for d in c.fit)
    assert ours >= fit - 0.01, f"fewer weights than --fit ({ours:.2f} vs {fit:.2f} MiB): " + msg


@pytest.mark.parametrize(
    ("budgets", "flags"),
    [
        pytest.param([333, 333], ["-ub", "2048", "-ctk", "f16", "-ctv", "f16"], id="ub2048"),
    ],
)
def test_iswa_two_devices_the_first_device_takes_more_than_its_budget(
    budgets: list[int], flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side). `kvadvise llamacpp gemma3(8 layers, n_embd 1024, 8 heads, 2 kv, head 128, n_ff 4096,
    n_swa 512, n_vocab 8000; tied) --rpc A=333MiB --rpc B=333MiB --margin 0 --ctx 16384 -ub 2048 -ctk f16 -ctv f16`
    -> `-c 16384 -np 1 -fa auto -ctk f16 -ctv f16 -ngl 8 -ts 5,4 -ub 2048`.

    Predicted A 301.08, B 272.66 MiB; llama-server prints A 357.15 (model 145.08 + KV 26.00 + compute 186.07) and B
    200.70 (model 73.66 + KV 5.00 + compute 122.04): A UNDER by 56.1 MiB (16 %) and 24 MiB over its 333 MiB budget,
    B OVER by 72 MiB. At -ub 512 (149 MiB each, not a case here: inside the bar): `-ngl 6 -ts 0.15,0.15`, A predicted
    136.0 vs 150.1 printed (over its 149 MiB by 1.1: blocks 3-5, the global block 5 among them), B 122.7 vs 104.7.
    (--fit at 333/333 puts 218.8 MiB of weights at 248.1/245.8 MiB: inside.)

    Rule: llama_model::load_tensors (src/llama-model.cpp) places each offloaded layer il, the output layer included,
    at ``float(il - i_gpu_start) / act_gpu_layers`` against the cumulative -ts split points: at -ngl 8 -ts 5,4
    blocks 1-5 go to A (145.08 MiB = 5 blocks) and blocks 6-7 with the output layer to B (73.66). The likely miss
    is the compute: A, which holds the global-attention block 5, prints 186.07 MiB and B, with sliding-window
    blocks only, 122.04; the 64 MiB between them is the full-context KQ mask
    (16384 x 2048 f16), built by llm_graph_input_attn_kv_iswa (src/llama-graph.cpp) and allocated by
    ggml_backend_sched (ggml/src/ggml-backend.cpp) only on a device whose layers read it. If kvadvise places
    the blocks as llama.cpp does (offload.devices_bytes gives totals only), its compute is B 272.66 - 78.66 = 194 and
    A 301.08 - 171.08 = 130: the larger figure on the device with the output layer, where the global layer's device
    needs the mask.
    """
    c = _case(tmp_path, "gemma3", _GEMMA3, budgets, 16384, flags, real_llama_server)
    _check(c)


@pytest.mark.xfail(
    strict=True,
    reason="held, in part: the command now states -fa on for a hybrid's partial plan (the 596 MiB of compute without "
    "flash attention are gone: 191.70 printed, within the budget); what is left is the partial device's compute, "
    "152 planned where 112 are printed (test_lfm2_partial_device_keeps_the_full_offloads_compute)",
)
def test_hybrid_fa_auto_partial_plan_runs_without_flash_attention(tmp_path: Path, real_llama_server: Path) -> None:
    """UNDER by 444 MiB (OOM side). `kvadvise llamacpp lfm2(8 layers, n_embd 1024, 8 heads, 2 kv, n_ff 4096, layers
    2 and 5 attention, the others short conv; n_vocab 8000) --rpc A=260MiB --margin 0 --ctx 8192 -ub 2048 -ctk f16
    -ctv f16` -> `-c 8192 -np 1 -fa auto -ctk f16 -ctv f16 -ngl 3 -ub 2048` (blocks 6, 7 and the output layer on A).

    Predicted 231.68 MiB; llama-server prints 675.69 (model 79.67 + RS 0.02 + compute 596.00), 416 MiB over the
    260 MiB budget. Its log: "resolve_fused_ops: layer 5 is assigned to device CPU but Flash Attention is assigned
    to device RPC0 (usually due to missing support)", "Flash Attention not supported, set to disabled": the compute
    holds the KQ matrix, 8 heads x 8192 x 2048 f32 = 512 MiB. With `-fa on` the same -ngl 3 prints 112.01 MiB of
    compute. The same at -ngl 6 (layer 2 on the CPU, 616 MiB) and on granitehybrid -ngl 2 (layer 6 attention on the
    CPU, block 7 mamba2 on the device: 596 MiB vs 144 at -ngl 3); not on llama, gemma2 or qwen3next at any -ngl, and
    not with a quantized V cache (flash attention forced on: "enabling flash_attn since it is required for quantized
    V cache"). --fit (same flags) picks -ngl 4 (block 5 on the device), 228.74 MiB, flash attention on.

    Rule: src/llama-context.cpp, llama_context::resolve_fused_ops: with -fa auto it reserves a probe graph and turns
    flash attention off for the whole context when any FLASH_ATTN_EXT node's backend (ggml_backend_sched's pass
    that expands the device's backend up over weightless ops, ggml/src/ggml-backend.cpp) differs from
    model.dev_layer(il); in a hybrid model whose last CPU layer is attention and whose first device layer is
    recurrent, that layer's FA op is taken by the device. kvadvise plans -fa auto as flash attention on for every
    partial -ngl; it should write -fa on (as it does when it recommends) or avoid that boundary.
    """
    flags = ["-ub", "2048", "-ctk", "f16", "-ctv", "f16"]
    c = _case(tmp_path, "lfm2", dict(_DENSE), [260], 8192, flags, real_llama_server)
    _check(c)


@pytest.mark.xfail(
    strict=True,
    reason="held: over, the safe side: a device holding part of LFM2's blocks keeps the full offload's compute "
    "(152 MiB planned, 112 printed at -ngl 3 and 4, 144 at full offload); the partial device's own graph is not "
    "modelled for hybrids",
)
def test_lfm2_partial_device_keeps_the_full_offloads_compute(tmp_path: Path, real_llama_server: Path) -> None:
    """OVER (wastes a layer), below --fit. `kvadvise llamacpp lfm2(as above) --rpc A=260MiB --margin 0 --ctx 8192
    -ub 2048 -fa on -ctk f16 -ctv f16` -> `-c 8192 -np 1 -fa on -ctk f16 -ctv f16 -ngl 3 -ub 2048`.

    Predicted 231.68 MiB; llama-server prints 191.70 (model 79.67 + RS 0.02 + compute 112.01): OVER by 40 MiB (21 %).
    kvadvise's plan for -ngl 4 says 268.69 (> 260), llama-server prints 228.74 (model 108.68 + KV 8 + compute
    112.04) and --fit picks exactly that (-ngl 4: 108.68 MiB of weights vs kvadvise's 79.67). At full offload the
    device's compute is 144.05 printed (152 predicted); 112 at every partial -ngl (3 and 4 here).

    Rule: the partial plan (advisor/planner/offload.py, partial_offload: ``layers.fixed``) keeps the full offload's
    device compute (152 MiB) for a device holding part of the blocks; with the input layer and the first blocks on
    the CPU the device's peak (ggml_backend_sched's graph_reserve, ggml/src/ggml-backend.cpp) is 40 MiB less. The
    same over-estimate was held for qwen3moe with every expert on the host (round 15c); here a dense hybrid.
    """
    flags = ["-ub", "2048", "-fa", "on", "-ctk", "f16", "-ctv", "f16"]
    c = _case(tmp_path, "lfm2", dict(_DENSE), [260], 8192, flags, real_llama_server)
    _check(c)


@pytest.mark.xfail(
    strict=True,
    reason="held, below --fit by 0.47 MiB: the plan is now plain -ngl 2 (51.70 MiB of weights, 73.77 planned, 67.79 "
    "printed: within the bar), --fit 52.17 with one layer's up experts on the device (-ot, LAYER_FRACTION_UP): "
    "kvadvise moves whole layers or whole expert sets only",
)
def test_hybrid_moe_partial_device_over_predicted(tmp_path: Path, real_llama_server: Path) -> None:
    """OVER (wastes expert weights), below --fit. `kvadvise llamacpp nemotron_h_moe(7 layers "MEMEM*E": mamba2, MoE
    (16 experts x 512, 4 used, no gate; shared expert 1024), one attention; n_embd 1024, 8 heads, 2 kv, head 128;
    n_vocab 8000) --rpc A=82MiB --margin 0 --ctx 8192 -np 2 -ctk f16 -ctv f16` -> `-c 8192 -np 2 -fa auto -ctk f16
    -ctv f16 -ngl 7 --n-cpu-moe 7` (block 0 on the CPU, every routed expert on the CPU).

    Predicted 80.6 MiB; llama-server prints 64.53 (model 36.39 + KV 8.00 + RS 0.14 + compute 20.00): OVER by 16.1 MiB
    (25 %). --fit puts 52.17 MiB of weights on the device at 79.38 MiB (inside 82): "(8, 7, GATE)", one layer's up
    experts (15.78 MiB) on the device, -ngl 8.

    Rule (best guess, not pinned): the 16 MiB is one 16-expert matrix; kvadvise's device weights for --n-cpu-moe 7
    keep one of nemotron_h_moe's expert tensors (ffn_up_exps / ffn_down_exps, no gate: src/llama-model.cpp,
    LLM_ARCH_NEMOTRON_H_MOE) on the device, where llama.cpp's --n-cpu-moe pattern (common/arg.cpp,
    llm_ffn_exps_block_regex: blk.N.ffn_(up|down|gate|gate_up)_(ch|)exps) moves them all.
    """
    dims = {
        "n_layer": 7,
        "n_embd": 1024,
        "n_head": 8,
        "n_head_kv": 2,
        "head": 128,
        "n_expert": 16,
        "n_expert_used": 4,
        "n_ff_exp": 512,
        "n_ff_shexp": 1024,
    }
    c = _case(
        tmp_path, "nemotron_h_moe", dims, [82], 8192, ["-np", "2", "-ctk", "f16", "-ctv", "f16"], real_llama_server
    )
    _check(c)


@pytest.mark.parametrize(
    ("recipe", "dims", "budget", "ctx", "flags"),
    [
        pytest.param(
            "gpt-oss", _GPT_OSS, 269, 16384, ["-np", "2", "-ctk", "f16", "-ctv", "f16"], id="gpt-oss-part-layer"
        ),
        pytest.param(
            "deepseek2-mla",
            _DSV2,
            233,
            16384,
            ["-np", "2", "-ctk", "q4_0", "-ctv", "q4_0"],
            id="deepseek2-mla-whole-layers",
        ),
    ],
)
def test_moe_fit_puts_more_expert_weights_on_the_device(
    recipe: str, dims: dict, budget: int, ctx: int, flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """Below --fit (granularity). `kvadvise llamacpp gpt-oss(8 layers, n_embd 1024, 16 heads, 4 kv, head 64, n_swa 128,
    16 experts x 512, 4 used; n_vocab 8000) --rpc A=269MiB --margin 0 --ctx 16384 -np 2 -ctk f16 -ctv f16` ->
    `-c 16384 -np 2 -fa on -ctk f16 -ctv f16 -ngl 9 --n-cpu-moe 6`.

    Predicted 249.35, printed 250.52 MiB (exact; model 152.52). --fit puts 168.49 MiB of weights on A at 265.26 MiB
    (inside 269): its log "trying to fit one extra layer with overflow_type=LAYER_FRACTION_UP ... (9, 7, UP)" -- the
    6th CPU layer's ffn_up_exps (16 MiB) on the device, its gate and down on the CPU. kvadvise's next whole step
    (--n-cpu-moe 5) is 297.47 predicted, rightly refused. Same on deepseek2-mla (q8_0, 291 MiB: kvadvise 158.16 vs
    --fit 189.16 MiB at 283.49) and glm4moe (-np 2, 267 MiB: 197.18 vs 213.11 at 263.04, overflow_type ATTN).

    Rule: common/fit.cpp, common_params_fit_impl, "try fitting at least part of one more layer": after the whole
    layers it tries LAYER_FRACTION_UP / GATE / ATTN for one more layer and writes the matching tensor_buft_overrides
    (-ot); kvadvise's partial plan moves only whole layers (-ngl) or a layer's whole expert set (--n-cpu-moe), and
    could emit the same -ot for the boundary layer.

    deepseek2-mla (8 layers, n_embd 1024, 16 heads, kv_lora 512, q_lora 384, 16 experts x 512, 4 used, 1 dense lead;
    n_vocab 8000) --rpc A=233MiB --ctx 16384 -np 2 -ctk q4_0 -ctv q4_0: kvadvise `-ngl 8 --n-cpu-moe 8` (every
    expert on the CPU), predicted 207.5, printed 213.5 (weights 122.02). --fit's first pass keeps whole layers:
    `-ngl 6` (blocks 3-7 with their experts and the output layer), 222.9 MiB printed, 139.62 MiB of weights
    (common_params_fit_impl's ngl_per_device before its MoE pass: it keeps the plain -ngl when that already fits). Also
    at -fa off f16 538 MiB: 122.0 vs 154.8 (--fit -ngl 7), and granitehybrid-moe 235 MiB: 148.1 vs 171.2 (-ngl 7).
    kvadvise's partial plan appears to try --n-cpu-moe before dropping whole layers, without comparing plain -ngl N.
    """
    c = _case(tmp_path, recipe, dims, [budget], ctx, flags, real_llama_server)
    _check(c)


@pytest.mark.parametrize(
    ("recipe", "dims", "budgets", "ctx", "flags"),
    [
        pytest.param(
            "llama",
            {**_DENSE, "head": 128},
            [139, 185],
            16384,
            ["-ctk", "q8_0", "-ctv", "q8_0", "-np", "2"],
            id="llama-q8-np2",
        ),
        pytest.param(
            "gpt-oss",
            _GPT_OSS,
            [210, 210],
            16384,
            ["-ctk", "f16", "-ctv", "f16"],
            id="gpt-oss",
            marks=pytest.mark.xfail(
                strict=True,
                reason="held: 228.45 MiB of weights where --fit puts 264.74 (152.52 before): --n-cpu-moe N keeps the "
                "experts of the first N layers, all on the first device, where --fit overflows each device's own "
                "boundary layer (-ot per device): not expressible with --n-cpu-moe",
            ),
        ),
        pytest.param(
            "mamba2",
            _MAMBA2,
            [81, 81],
            8192,
            ["-np", "2"],
            id="mamba2-np2",
            marks=pytest.mark.xfail(
                strict=True,
                reason="held: over, the safe side: a recurrent model's split keeps the rule with its copies "
                "(compute.unpipelined_split_compute: 77.5 and 74.5 MiB planned, 57.0 and 58.0 printed), so fewer "
                "layers than --fit's are planned",
            ),
        ),
    ],
)
def test_two_devices_the_split_leaves_a_device_half_empty(
    recipe: str, dims: dict, budgets: list[int], ctx: int, flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """Below --fit (wasted device memory), and for the hybrids OVER-predicted. Two rpc-servers, budgets below:

    | model | budgets | kvadvise | predicted | printed (weights) | --fit printed (weights) |
    | llama q8_0 -np 2, 16k | 139, 185 | -ngl 4 -ts 0.14,0.18 | 113.0, 69.2 | 111.1, 69.2 (58.0+44.6) |
      111.1, 164.2 (58.0+102.7) |
    | gpt-oss f16, 16k | 210, 210 | -ngl 9 --n-cpu-moe 6 -ts 0.21,0.21 | 94.5, 194.7 | 90.4, 201.9 (25.4+127.1) |
      195.8, 205.5 (143.6+121.2) |
    | (not run here) granitehybrid -np 2, 8k | 143, 143 | -ngl 4 -ts 0.14,0.14 | 114.4, 99.3 |
      106.4, 78.9 (65.3+52.0) | 105.8, 122.0 (72.7+81.0) |
    | mamba2 -np 2, 8k | 81, 81 | -ngl 4 -ts 0.08,0.08 | 67.0, 74.5 | 57.0, 58.0 (25.2+28.2) |
      71.7, 78.6 (37.9+40.9) |

    kvadvise's weights are 65 %, 57 %, 76 % and 68 % of --fit's; its emptier device is 37 %, 43 %, 55 %, 70 % full.
    (Also: phi3 -fa off, 295/393 MiB: 111.6 vs 175.7 MiB of weights; glm4moe q8_0 247/247: 341.2 vs 391.1;
    deepseek2-mla q8_0 252/252: 254.1 vs 333.1; gemma2 -fa off -np 2 189/284: 135.7 vs 195.7; lfm2 -fa on 128/128:
    108.6 vs 140.7, B predicted 89.7 vs 59.7 printed; qwen3next 99/99: 103.2 vs 115.2. Equal: gemma2 q8_0 221/221,
    llama -ub 2048 428/428. The real Gemma 3 270M Q4_K_M -fa off f16 8k, 236/236 MiB: kvadvise `-ngl 1 -ts 18,1`,
    the output layer alone on A (170.0 MiB of weights, B empty); --fit 189.9/171.0 MiB, 231.4 MiB of weights.)
    mamba2 B OVER-predicted by 16.5 MiB (28 %), granitehybrid B by 20.4 MiB (26 %).

    Rule: common/fit.cpp, common_params_fit_impl fills the devices one after the other (ngl_per_device) and writes
    the tensor split as per-device layer counts, so each device is filled to its own target. kvadvise keeps a -ts
    proportional to the budgets and lowers one -ngl until every device fits; llama_model::load_tensors
    (src/llama-model.cpp) then deals the offloaded layers by ``float(il - i_gpu_start) / act_gpu_layers`` against
    that split, so the device that runs out first (llama: A, 113 of 139) sets -ngl and the other keeps most of its
    budget. kvadvise should choose -ts (layer counts) per device, as --fit does. For the recurrent models the
    per-device figure is also over-estimated (B: 74.5 predicted vs 58.0).
    """
    c = _case(tmp_path, recipe, dims, budgets, ctx, flags, real_llama_server)
    _check(c)
