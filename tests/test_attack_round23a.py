"""Review round 23a: the new MoE and MLA compute rules (memory.cpu_experts_boundary_bytes / offload.tail_cut,
memory.host_experts_device_growth for gpt-oss, sizes.graph_sizes' absorbed MLA attention, split._GATHER_AFTER_LOOP)
against real allocations of llama.cpp b11312.

Two harnesses:
- fast: llama.cpp's own allocation pass (llama-fit-params -fitp on, over one loopback rpc-server; tests/test_host_experts.py
  ``_device_mib``) against kvadvise.planner.memory's device compute figure;
- end to end: tests/test_attack_round19d.py ``_case`` / ``_check`` (``kvadvise llamacpp MODEL --rpc EP=BUDGET ...
  --margin 0 --ctx N FLAGS --json``, its run_command run by llama-server b11312 over loopback rpc-servers, compared
  with the budgets, the bar 16 MiB / 3 %, and llama-server's own --fit).
Vendored source: /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp (b11312).
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
from test_attack_round19d import _case, _check, _devices
from test_host_experts import _close, _device_mib
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import RunConfig, device_compute_bytes, host_experts_device_growth, resolve

pytestmark = pytest.mark.llama
MIB = 1 << 20

# real models' dimensions in a few layers (experts cut to 16-32: the count moves only the router's logits)
MLA = {
    # moonshotai/Kimi-K2-Instruct config.json: 64 heads, n_embd 7168, q_lora 1536
    "kimi-k2": dict(n_layer=3, n_embd=7168, n_head=64, n_ff=18432, qk_nope=128, qk_rope=64, v_head=128, kv_lora=512,
                    q_lora=1536, n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=2048, n_dense_lead=1),
    # deepseek-ai/DeepSeek-V3 config.json: 128 heads
    "deepseek-v3": dict(n_layer=3, n_embd=7168, n_head=128, n_ff=18432, qk_nope=128, qk_rope=64, v_head=128,
                        kv_lora=512, q_lora=1536, n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=2048,
                        n_dense_lead=1),
    # zai-org/GLM-4.7-Flash
    "glm-4.7-flash": dict(n_layer=4, n_embd=2048, n_head=20, n_ff=10240, qk_nope=192, qk_rope=64, v_head=256,
                          kv_lora=512, q_lora=768, n_expert=16, n_expert_used=4, n_expert_shared=1, n_ff_exp=1536,
                          n_dense_lead=1),
}  # fmt: skip

QWEN3MOE = {
    # Qwen/Qwen3-30B-A3B config.json (128 experts cut to 32)
    "qwen3-30b-a3b": dict(n_layer=6, n_embd=2048, n_head=32, n_head_kv=4, head=128, n_expert=32, n_expert_used=8,
                          n_ff_exp=768),
    # Qwen/Qwen3-235B-A22B config.json (128 experts cut to 16)
    "qwen3-235b": dict(n_layer=4, n_embd=4096, n_head=64, n_head_kv=4, head=128, n_expert=16, n_expert_used=8,
                       n_ff_exp=1536),
}  # fmt: skip
GLM4MOE = {
    # zai-org/GLM-4.5-Air config.json (128 experts cut to 16; one dense lead block, the MTP block appended)
    "glm-4.5-air": dict(n_layer_all=5, n_nextn=1, n_embd=4096, n_head=96, n_head_kv=8, head=128, n_rot=64,
                        n_ff=10944, n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=1408, n_dense_lead=1),
}  # fmt: skip

_MLA_CASES = [
    ("kimi-k2", 16384, 512, "on", "f16"),
    ("kimi-k2", 16384, 2048, "on", "f16"),
    ("kimi-k2", 65536, 1024, "on", "q8_0"),
    ("deepseek-v3", 4096, 512, "on", "f16"),
    ("deepseek-v3", 16384, 1024, "on", "f16"),
    ("glm-4.7-flash", 32768, 1024, "on", "q8_0"),
    ("glm-4.7-flash", 8192, 512, "off", "f16"),
    ("kimi-k2", 8192, 512, "off", "f16"),
]


@pytest.mark.parametrize("case", _MLA_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mla_full_offload_compute(case: tuple, fit_params: Path, rpc_endpoint: str, tmp_path: Path) -> None:
    name, n_ctx, ub, fa, kv = case
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", "deepseek2-mla", n_vocab=8000, n_ctx_train=131072,
                            dims=MLA[name], sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn=fa, type_k=t,
                                  type_v=t, device="rpc", runtime="library"))  # fmt: skip
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", fa, "-np", "1", "-ngl", "99",
            "-ctk", kv, "-ctv", kv]  # fmt: skip
    measured = _device_mib(fit_params, model, args, rpc_endpoint)
    planned = device_compute_bytes(spec, lay)
    assert planned >= 0.99 * measured * MIB and _close(planned, measured), (planned / MIB, measured)


# gpt-oss's biased experts with --n-cpu-moe on an RPC device (memory.host_experts_device_growth)
GPT_OSS = {
    # openai/gpt-oss-120b config.json: n_embd 2880, 64 heads of 64, 8 kv heads, 4 used experts of 2880, swa 128
    "gpt-oss-120b": dict(n_layer=8, n_embd=2880, n_head=64, n_head_kv=8, head=64, n_swa=128, n_expert=16,
                         n_expert_used=4, n_ff_exp=2880),
    # gpt-oss-20b: 24 layers, 32 experts: same widths
    "gpt-oss-20b": dict(n_layer=8, n_embd=2880, n_head=64, n_head_kv=8, head=64, n_swa=128, n_expert=32,
                        n_expert_used=4, n_ff_exp=2880),
    # a narrower, more-used variant (the rule's n_ff_exp < n_embd branch)
    "gpt-oss-narrow-8": dict(n_layer=8, n_embd=1024, n_head=16, n_head_kv=4, head=64, n_swa=128, n_expert=16,
                             n_expert_used=8, n_ff_exp=512),
}  # fmt: skip

_GPT_CASES = [
    ("gpt-oss-120b", 16384, 512, "f16", (1, 4, 7)),
    ("gpt-oss-120b", 32768, 1024, "q8_0", (2, 8)),
    ("gpt-oss-20b", 65536, 2048, "f16", (1, 6)),
    ("gpt-oss-narrow-8", 16384, 2048, "f16", (1, 3, 8)),
    ("gpt-oss-narrow-8", 4096, 512, "q8_0", (2, 5)),
]


@pytest.mark.parametrize("case", _GPT_CASES, ids=lambda c: f"{c[0]}-{c[1]}-ub{c[2]}-{c[3]}")
def test_gpt_oss_host_experts_growth(case: tuple, fit_params: Path, rpc_endpoint: str, tmp_path: Path) -> None:
    name, n_ctx, ub, kv, n_cpu_moe = case
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", "gpt-oss", n_vocab=8000, n_ctx_train=131072, dims=GPT_OSS[name],
                            sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn="on", type_k=t,
                                  type_v=t, device="rpc", runtime="library"))  # fmt: skip
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", "on", "-np", "1", "-ngl", "99",
            "-ctk", kv, "-ctv", kv]  # fmt: skip
    full = device_compute_bytes(spec, lay)
    bad = []
    for n in n_cpu_moe:
        measured = _device_mib(fit_params, model, [*args, "--n-cpu-moe", str(n)], rpc_endpoint)
        planned = full + host_experts_device_growth(spec, lay, device_experts=n < spec.n_layer)
        if not (planned >= measured * MIB and _close(planned, measured)):
            bad.append((n, round(planned / MIB, 2), measured))
    assert not bad, bad


MIXTRAL = {
    # mistralai/Mixtral-8x7B config.json: 8 experts of 14336, 2 used (the recipe's experts q4_0)
    "mixtral-8x7b": dict(n_layer=3, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=14336, n_expert=8,
                         n_expert_used=2),
}  # fmt: skip
SHAPES = {**{k: ("qwen3moe", v) for k, v in QWEN3MOE.items()}, **{k: ("glm4moe", v) for k, v in GLM4MOE.items()},
          **{k: ("mixtral", v) for k, v in MIXTRAL.items()}, **{k: ("gpt-oss", v) for k, v in GPT_OSS.items()}}

_FULL_CASES = [
    ("glm-4.5-air", 16384, 512, "on", "f16"),
    ("glm-4.5-air", 16384, 1024, "on", "f16"),
    ("glm-4.5-air", 65536, 2048, "on", "q8_0"),
    ("qwen3-30b-a3b", 32768, 2048, "on", "q8_0"),
    ("qwen3-235b", 16384, 1024, "on", "f16"),
    ("mixtral-8x7b", 32768, 512, "on", "f16"),
    ("mixtral-8x7b", 8192, 2048, "off", "f16"),
]


@pytest.mark.parametrize("case", _FULL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_moe_full_offload_compute(case: tuple, fit_params: Path, rpc_endpoint: str, tmp_path: Path) -> None:
    name, n_ctx, ub, fa, kv = case
    recipe, dims = SHAPES[name]
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", recipe, n_vocab=8000, n_ctx_train=131072, dims=dims,
                            sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn=fa, type_k=t,
                                  type_v=t, device="rpc", runtime="library"))  # fmt: skip
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", fa, "-np", "1", "-ngl", "99",
            "-ctk", kv, "-ctv", kv]  # fmt: skip
    measured = _device_mib(fit_params, model, args, rpc_endpoint)
    planned = device_compute_bytes(spec, lay)
    assert planned >= 0.99 * measured * MIB and _close(planned, measured), (planned / MIB, measured)


def _said_to_fit(tmp: Path, recipe: str, dims: dict, budget: int, ctx: int, flags: list[str], server: Path):
    """kvadvise's own one-device plan (``fits`` true: the run_command as given, -ngl 999 and the user's --n-cpu-moe),
    run by llama-server b11312 over one rpc-server: (kvadvise's device total, the printed total, the command)."""
    from llama_server_build import rpc_server

    from kvadvise.cli import main

    model = write_tiny_gguf(tmp / f"{recipe}.gguf", recipe, n_vocab=8000, n_ctx_train=32768, dims=dims, sparse=True)
    with devices(rpc_server(), 1) as eps:
        argv = ["llamacpp", str(model), "--rpc", f"{eps[0]}={budget}MiB", "--margin", "0", "--ctx", str(ctx), *flags]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main([*argv, "--ram", "16GiB", "--llama-build", "b11312", "--json"])
        doc = json.loads(buf.getvalue())
        assert doc["fits"] is True, doc.get("offload")
        run = shlex.split(doc["llama_server"]["run_command"])
        args = run[run.index("-m") + 2 :]
        i = args.index("--rpc")
        del args[i : i + 2]
        real = _devices(run_server(server, model, [*args, "--no-warmup", "--threads", "1"], eps), eps)[0]
    return doc["memory"]["devices"][0]["total_bytes"] / MIB, real.total, " ".join(args)


def test_mixtral_one_layers_experts_on_the_host_said_to_fit_goes_over_the_budget(
    tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side). `kvadvise llamacpp mixtral(Mixtral-8x7B's widths in 3 layers: n_embd 4096, 32 heads, 8 kv,
    8 experts of 14336 (q4_0), 2 used; n_vocab 8000) --rpc A=2740MiB --margin 0 --ctx 16384 -ub 2048 --n-cpu-moe 1`
    says it fits (-ngl 999 --n-cpu-moe 1 -fa on, f16 cache): 2726.67 MiB planned (compute 832.19).
    llama-server b11312 prints 2758.52 (model 1702.48 + KV 192.00 + compute 864.04): UNDER by 31.85 MiB (1.2 % of
    the total, 3.8 % of the compute) and 18.5 MiB over the budget. At -ub 1024: 2310.58 planned, 2326.50 printed
    (16 under). The full offload of the same model is planned right (test_moe_full_offload_compute[mixtral-*]).
    Rule (best guess): memory.host_experts_device_growth plans nothing for an MoE without shared experts and without
    biases; the device's blocks after a block whose experts ran on the CPU (ggml-rpc has no offload_op) grow by one
    [n_embd, n_ubatch] f32 (4096 x 2048 x 4 = 32 MiB; 16 at -ub 1024): the expert output copied back beside the
    residual, as for gpt-oss but one row, not n_expert_used of them (2 used experts of 14336, wider than n_embd).
    """
    planned, real, cmd = _said_to_fit(tmp_path, "mixtral", MIXTRAL["mixtral-8x7b"], 2740, 16384,
                                      ["-ub", "2048", "--n-cpu-moe", "1"], real_llama_server)  # fmt: skip
    assert real <= 2740 and real - 16 <= planned <= real + max(16, 0.03 * real), (cmd, planned, real)


def test_gpt_oss_narrow_experts_all_on_the_host_said_to_fit_goes_over_the_budget(
    tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side). `kvadvise llamacpp gpt-oss(8 layers, n_embd 1024, 16 heads of 64, 4 kv, swa 128, 16 experts of
    512, 8 used; n_vocab 8000) --rpc A=320MiB --margin 0 --ctx 16384 -ub 2048 -ctk f16 -ctv f16 --n-cpu-moe 8` says it
    fits: `-ngl 999 --n-cpu-moe 8 -fa auto`, 290.77 MiB planned (56.27 weights + 73 KV + 161.5 compute).
    llama-server b11312 prints 354.31 (compute 225.04): UNDER by 63.5 MiB (18 %; 28 % of the compute), 34 MiB over
    the budget. llama-fit-params' allocation pass on the same shape: 193.08 MiB at full offload, 289.04 with
    --n-cpu-moe 1-5, 225.04 with 6, 7 or 8 (test_gpt_oss_host_experts_growth[gpt-oss-narrow-8-16384-ub2048-f16]).
    gpt-oss-120b's widths (n_ff_exp = n_embd = 2880, 4 used) at --n-cpu-moe 8 are planned right (240.41 / 240.04).
    Rule (best guess): offload's "every expert on the host" cut (no gate/up/GLU on the device, device_compute_bytes
    with n_ff_exp 1) does not hold for gpt-oss: its biased experts' ggml_add_id outputs and the [n_embd,
    n_expert_used, n_ubatch] f32 expert output (64 MiB here) stay on the device, so with experts narrower than n_embd
    the device keeps the full offload's figure plus half an output (193 + 32 = 225).
    """
    planned, real, cmd = _said_to_fit(tmp_path, "gpt-oss", GPT_OSS["gpt-oss-narrow-8"], 320, 16384,
                                      ["-ub", "2048", "-ctk", "f16", "-ctv", "f16", "--n-cpu-moe", "8"],
                                      real_llama_server)  # fmt: skip
    assert real <= 320 and real - 16 <= planned <= real + max(16, 0.03 * real), (cmd, planned, real)
