"""The output layer alone on a device that does not op-offload (-ngl 1 over an rpc-server): what it takes in from the
last block, which ran on the CPU (memory.output_layer_alone_bytes, offload.partial_offload's split_compute).

ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp b11312, "expand gpu up") gives the weightless ops between
the last block's last weight and output_norm to the output layer's device; GGML_SCHED_DEBUG=2 shows its split's inputs.
llama-server b11312 over one loopback rpc-server, 16k cells, f16 cache, one output row (what it reserves); the device's
compute buffer (printed total less the model buffer), MiB:

| shape (n_vocab 8000) | -ub | fa | printed | planned before | planned |
| qwen35moe, Qwen3.5-35B-A3B's widths (8 layers, 32 of 256 experts) | 2048 | on | 48.01 | 240.09 | 48.09 |
| the same | 512 | on | 12.00 | 60.05 | 12.05 |
| the same, 64k q8_0 (round 23a's qwen3.5-35b-output-alone: 79.27 printed, 271.35 planned) | 2048 | on | 48.01 | 240.09 | 48.09 |
| the same | 512 | off | 12.00 | 60.05 | 12.05 |
| qwen3next of the same widths | 2048 / 512 | on | 48.01 / 12.00 | 240.09 / 60.05 | 48.09 / 12.05 |
| qwen3next | 1024 | off | 24.00 | | 24.06 |
| gpt-oss-20b's widths (n_embd = n_ff_exp 2880, 4 used) | 2048 / 512 | on | 135.03 / 33.76 | 202.59 / 50.67 | 135.03 / 33.76 |
| gpt-oss-20b | 1024 | off | 67.52 | | 67.52 |
| gpt-oss, 8 used experts of 512 beside n_embd 1024 | 2048 / 512 | on | 80.06 / 20.02 | 120.09 / 30.05 | 80.06 / 20.02 |
| qwen35 dense (Qwen3.5-9B's widths), llama, qwen3moe, qwen2moe, mixtral | 2048, 512 | on | unchanged: 0.05-64.00 |
  planned 0.08-64.03 |

(bytes, GGML_RPC_DEBUG=1: gpt-oss-20b at -ub 2048 allocates 141590560, planned 141590656; the narrow one 83951648,
planned 83951744.) qwen3next / qwen35moe: the split's inputs are ffn_moe_out, ffn_shexp, shared_expert_gate and
attn_residual, three [n_embd, n_ubatch] f32 (the routed sum runs on the CPU before the shared expert's weights; its
one and a half [n_embd, n_expert_used, n_ubatch] f32 were planned beside); gpt-oss: the experts' output after the
ADD_ID of its bias, weighted and summed on the device into one more row beside the residual.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rpc_devices import run_server, within_bar
from test_attack_round19d import _devices
from test_attack_round23a import SHAPES
from test_host_experts import _device_mib
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.compute import device_compute_bytes
from kvadvise.planner.host_experts import host_experts_device_growth
from kvadvise.planner.memory import RunConfig, output_layer_alone_bytes, resolve

pytestmark = pytest.mark.llama
MIB = 1 << 20

_SHAPES = {
    **SHAPES,
    "qwen3next-a3b": ("qwen3next", SHAPES["qwen3.5-35b-a3b"][1]),
    # Qwen/Qwen3.5-9B's widths in 8 layers
    "qwen3.5-9b": ("qwen35", dict(n_layer=8, n_embd=4096, n_head=16, n_head_kv=4, head=256, n_rot=64, n_ff=12288,
                                  interval=4, d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32)),
}  # fmt: skip

_CASES = [
    ("qwen3.5-35b-a3b", 16384, 2048, "on", "f16"),
    ("qwen3.5-35b-a3b", 16384, 512, "on", "f16"),
    ("qwen3.5-35b-a3b", 65536, 2048, "on", "q8_0"),
    ("qwen3.5-35b-a3b", 16384, 512, "off", "f16"),
    ("qwen3next-a3b", 16384, 2048, "on", "f16"),
    ("qwen3next-a3b", 16384, 1024, "off", "f16"),
    ("gpt-oss-20b", 16384, 2048, "on", "f16"),
    ("gpt-oss-20b", 16384, 512, "on", "f16"),
    ("gpt-oss-20b", 16384, 1024, "off", "f16"),
    ("gpt-oss-narrow-8", 16384, 2048, "on", "f16"),
    ("gpt-oss-narrow-8", 16384, 512, "on", "f16"),
    ("qwen3.5-9b", 16384, 2048, "on", "f16"),
    ("qwen3-30b-a3b", 16384, 2048, "on", "f16"),
    ("qwen1.5-moe-a2.7b", 16384, 2048, "on", "f16"),
    ("mixtral-8x7b", 16384, 512, "on", "f16"),
]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_output_layer_alone_takes_in_the_last_blocks_tail(
    case: tuple, rpc_endpoint: str, real_llama_server: Path, tmp_path: Path
) -> None:
    """`-ngl 1` (with --n-cpu-moe past every block, as kvadvise writes it) over one rpc-server: the device's compute
    buffer as llama-server b11312 prints it against memory.output_layer_alone_bytes: never under, within the bar."""
    name, n_ctx, ub, fa, kv = case
    recipe, dims = _SHAPES[name]
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", recipe, n_vocab=8000, n_ctx_train=131072, dims=dims,
                            sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn=fa, type_k=t,
                                  type_v=t, device="rpc", runtime="llama-server"))  # fmt: skip
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", fa, "-np", "1", "-ngl", "1",
            "-ctk", kv, "-ctv", kv, "--no-warmup", "--threads", "1"]  # fmt: skip
    if spec.n_expert:
        args += ["--n-cpu-moe", str(spec.n_layer)]
    dev = _devices(run_server(real_llama_server, model, args, [rpc_endpoint]), [rpc_endpoint])[0]
    measured = dev.total - dev.weights
    planned = output_layer_alone_bytes(spec, lay)
    assert planned >= measured * MIB - 0.005 * MIB and within_bar(planned / MIB, measured), (planned / MIB, measured)


# a gpt-oss of n_embd 2048 with gpt-oss's 64 heads of 64 (4 of 16 experts of 2048): its first block's experts on the
# host grow the device by a whole experts' output
_GPT_OSS_W2048_H64 = dict(n_layer=8, n_embd=2048, n_head=64, n_head_kv=8, head=64, n_swa=128, n_expert=16,
                          n_expert_used=4, n_ff_exp=2048)  # fmt: skip


@pytest.mark.parametrize("ub", [512, 2048])
def test_gpt_oss_first_blocks_experts_on_the_host_can_grow_the_device(
    ub: int, fit_params: Path, rpc_endpoint: str, tmp_path: Path
) -> None:
    """Round 23a held gpt-oss's growth at --n-cpu-moe 1 as over ("the first block's experts on the host grow
    nothing"): true of gpt-oss's own widths with flash attention from 8k cells, not a rule. llama-fit-params b11312's
    device compute over one rpc-server, `-ngl 99 -fa on -c N --n-cpu-moe K`, MiB (K = 0 is the full offload):

    | shape | ctx, -ub | K=0 | 1 | 2 | 3 | 4 | 6 | 7 | 8 |
    | gpt-oss-120b's widths (n_embd 2880, 64 heads) | 16k, 512 | 103.52 | 103.51 | 126.01 | 126.01 | | 126.01 | 78.82 |
      58.51 |
    | the same | 4k / 6k / 7k, 512 | 91.52 / 93.52 / 94.52 | 93.13 / 99.14 / 100.14 | the same as K=1 |
    | the same | 8k / 12k / 32k, 512 | 95.52 / 99.52 / 119.52 | no growth | +22.49 (one experts' output) |
    | gpt-oss-20b's widths | 6k / 7k, 2048 | 380.08 / 384.08 | 402.58 / 406.58 | 402.57 / 406.57 |
    | n_embd 2048, 64 heads (this test) | 16k, 512 | 80.77 | 96.76 | 80.76 | 96.76 | 80.76 | 80.76 | 64.76 | 64.76 |
    | the same | 16k, 2048 | 329.08 | 393.04 | 329.04 | 393.04 |
    | n_embd 1024 or 2048 with as many heads of 64 | 4k-32k | no growth at any K |
    | gpt-oss-120b, -fa off | 16k, 1024 | 4227.52 | 4247.78 at every K from 1 to 8 |

    The copied-in experts' output ([n_embd, n_expert_used, n_ubatch] f32, ggml_backend_sched_split_graph) lands in a
    hole or above the peak as ggml-alloc's best fit finds it, alternating with the blocks here (odd K grows, even K
    does not): no condition on K alone holds, so host_experts.host_experts_device_growth keeps one output for every K
    between 1 and n_layer - 2 (96.83 / 393.31 planned, 80.83 / 329.31 at full offload)."""
    model = write_tiny_gguf(tmp_path / "gpt-oss.gguf", "gpt-oss", n_vocab=8000, n_ctx_train=131072,
                            dims=_GPT_OSS_W2048_H64, sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    lay = resolve(spec, RunConfig(n_ctx=16384, n_ubatch=ub, n_batch=2048, flash_attn="on", type_k=GGMLType.F16,
                                  type_v=GGMLType.F16, device="rpc", runtime="library"))  # fmt: skip
    args = ["-c", "16384", "-ub", str(ub), "-b", "2048", "-fa", "on", "-np", "1", "-ngl", "99", "-ctk", "f16",
            "-ctv", "f16", "--n-cpu-moe", "1"]  # fmt: skip
    measured = _device_mib(fit_params, model, args, rpc_endpoint)
    planned = device_compute_bytes(spec, lay) + host_experts_device_growth(spec, lay)
    assert measured > device_compute_bytes(spec, lay) / MIB  # the growth at K = 1
    assert planned >= measured * MIB and within_bar(planned / MIB, measured), (planned / MIB, measured)


@pytest.mark.parametrize(
    ("shape", "budget", "ctx", "flags"),
    [
        pytest.param("gpt-oss-20b", 200, 16384, ["-ub", "2048", "-ctk", "f16", "-ctv", "f16"], id="gpt-oss-20b-200"),
        pytest.param("qwen3next-a3b", 120, 32768, ["-ub", "2048"], id="qwen3next-120"),
        pytest.param("qwen3.5-35b-a3b", 100, 16384, ["-ub", "1024", "-fa", "off"], id="qwen3.5-35b-100-fa-off"),
    ],
)
def test_the_output_layer_alone_is_planned_as_it_runs(
    shape: str, budget: int, ctx: int, flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """`kvadvise llamacpp MODEL --rpc EP=BUDGET --margin 0 --ctx N FLAGS` plans `-ngl 1 --n-cpu-moe 8` (the output
    layer alone), run by llama-server b11312 over a loopback rpc-server (test_attack_round19d._case): gpt-oss-20b's
    widths 178.99 MiB predicted and printed (43.96 of weights, as --fit places them); the qwen3next 79.35 / 79.27; the
    qwen35moe without flash attention 55.32 / 55.26. Before, each was refused (246.55 MiB for the gpt-oss: one and a
    half experts' outputs beside the output phase, 271.35 / 87.30 for round 23a's qwen35moe ones)."""
    from test_attack_round19d import _case, _check

    recipe, dims = _SHAPES[shape]
    _check(_case(tmp_path, recipe, dims, [budget], ctx, flags, real_llama_server))
