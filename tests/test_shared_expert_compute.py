"""Round 24b: the MoE feed-forward of models with a shared expert (glm4moe, qwen2moe; deepseek2 kept as it was) at
full offload on one device, against llama.cpp b11312's own allocation pass (llama-fit-params -fitp on over one
loopback rpc-server, tests/test_host_experts.py ``_device_mib``).

The rule (sizes._moe_phase and the dense lead block's phase in sizes.graph_sizes), read from ggml-alloc's best fit
(ggml/src/ggml-alloc.c ggml_dyn_tallocr_alloc) over build_moe_ffn (src/llama-graph.cpp) and src/models/glm4-moe.cpp /
qwen2moe.cpp: below the feed-forward the attention leaves the masks, the normed input and the residual (2E) and the
hole of its Q ([n_head * n_embd_head_k, n_ubatch] f32, the flash attention's output before wo). The routed
experts' gate (F = [n_ff_exp, n_expert_used, n_ubatch] f32) takes that hole where it fits beside the router's few
tensors, so only the up and the SwiGLU product stack (2F, not 3F); the down projection's output (Eu = [n_embd,
n_expert_used, n_ubatch]) lands in the Q hole or the up's once they are freed, else on top; the routed output (the
first add of its views, E) is allocated while Eu is alive and stacks on top where no hole holds it. A MoE model's
dense lead block stacks its rows the same way above the Q hole (2E + Q + 3 rows, 2 where the gate fits the hole),
beside the inputs' device copies (positions, row indices, output ids; with a quantized cache the Hadamard
rotations, src/llama-kv-cache.cpp build_input_k_rot). Measured, -ngl 99 -np 1, n_vocab 8000, printed / planned
before (main at 461be4d) / planned now, MiB:

| shape | -c, -ub, cache | printed | before | now |
| GLM-4.5-Air (n_embd 4096, 96 heads, 8 of 16 experts of 1408, 1 shared, dense lead n_ff 10944) | 16k, 512, f16 | 164.01 | 186.08 | 164.08 |
| GLM-4.5-Air | 64k, 2048, q8_0 | 848.12 | 936.31 | 848.31 |
| GLM-4.5-Air, n_ff_exp 768 | 16k, 512, f16 | 144.01 | 156.08 | 144.08 |
| GLM-4.5-Air, 2 used (the dense lead block is the peak) | 16k, 512, f16 | 98.76 | 104.13 | 98.76 |
| GLM-4.5-Air, 2 used | 64k, 2048, q8_0 (the K/V rotations) | 587.12 | 608.50 | 587.13 |
| 64 heads, n_ff 9216, 4 of 1024 (the dense block's gate misses the Q hole) | 32k, 512, f16 | 118.01 | 120.08 | 118.01 |
| the same | 4k, 2048, q8_0 | 360.12 | 368.31 | 360.13 |
| 16 heads, 6 of 256, 4 shared (the routed output on top of Eu) | 4k, 1024, f16 | 172.02 | 170.16 UNDER | 172.16 |
| qwen2moe, n_embd 4096, 32 heads, 8 of 16 experts of 256, shared 1024 | 16k, 512, f16 | 112.01 | 116.08 | 112.08 |
| DeepSeek-V2-Lite (deepseek2, MLA, 6 of 16, 2 shared): unchanged, a guard | 16k, 512, f16 | 92.13 | 92.13 | 92.13 |

Also checked (/tmp scratch, not here): a port of this graph to kvadvise.planner.galloc reproduces every printed figure
above to 0.07 MiB; over 1,500 glm4moe and 1,500 qwen2moe shapes (n_embd 1024-4096, 16-96 heads, n_ff_exp 256-3072,
2-8 used, 1-4 shared, -ub 512-2048, 4k-32k cells) the rule plans none newly under where n_head * head <= 3 n_embd
(every real model: GLM-4.5-Air 3x, GLM-4.5 2.4x, Qwen3 2x).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_host_experts import _device_mib
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.compute import device_compute_bytes
from kvadvise.planner.memory import RunConfig, resolve

pytestmark = pytest.mark.llama

MIB = 1 << 20
# zai-org/GLM-4.5-Air config.json (128 experts cut to 16; one dense lead block, the MTP block appended)
GLM45_AIR = dict(n_layer_all=5, n_nextn=1, n_embd=4096, n_head=96, n_head_kv=8, head=128, n_rot=64, n_ff=10944,
                 n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=1408, n_dense_lead=1)  # fmt: skip
SHAPES: dict[str, tuple[str, dict[str, int]]] = {
    "glm-4.5-air": ("glm4moe", GLM45_AIR),
    "glm-4.5-air-ffexp-768": ("glm4moe", {**GLM45_AIR, "n_ff_exp": 768}),
    "glm-4.5-air-used-2": ("glm4moe", {**GLM45_AIR, "n_expert_used": 2}),
    "glm-64-heads": ("glm4moe", {**GLM45_AIR, "n_head": 64, "n_ff": 9216, "n_expert_used": 4, "n_ff_exp": 1024}),
    "glm-16-heads-narrow": ("glm4moe", {**GLM45_AIR, "n_head": 16, "n_ff": 9216, "n_expert_used": 6,
                                        "n_expert_shared": 4, "n_ff_exp": 256}),
    "qwen2moe-narrow": ("qwen2moe", dict(n_layer=4, n_embd=4096, n_head=32, n_head_kv=32, n_expert=16, n_expert_used=8,
                                         n_ff_exp=256, n_ff_shexp=1024)),
    # deepseek-ai/DeepSeek-V2-Lite (tests/test_mla_compute.py), 64 experts cut to 16
    "deepseek-v2-lite": ("deepseek2-mla", dict(n_layer=6, n_embd=2048, n_head=16, n_ff=10944, qk_nope=128, qk_rope=64,
                                               v_head=128, kv_lora=512, q_lora=0, n_expert=16, n_expert_used=6,
                                               n_expert_shared=2, n_ff_exp=1408, n_dense_lead=1)),
}  # fmt: skip
# (shape, n_ctx, n_ubatch, cache type, printed MiB)
CASES = [
    ("glm-4.5-air", 16384, 512, "f16", 164.01),
    ("glm-4.5-air", 65536, 2048, "q8_0", 848.12),
    ("glm-4.5-air-ffexp-768", 16384, 512, "f16", 144.01),
    ("glm-4.5-air-used-2", 16384, 512, "f16", 98.76),
    ("glm-4.5-air-used-2", 65536, 2048, "q8_0", 587.12),
    ("glm-64-heads", 32768, 512, "f16", 118.01),
    ("glm-64-heads", 4096, 2048, "q8_0", 360.12),
    ("glm-16-heads-narrow", 4096, 1024, "f16", 172.02),
    ("qwen2moe-narrow", 16384, 512, "f16", 112.01),
    ("deepseek-v2-lite", 16384, 512, "f16", 92.13),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:4])))
def test_shared_expert_moe_compute_is_exact_and_never_under(
    case: tuple[str, int, int, str, float], fit_params: Path, rpc_endpoint: str, tmp_path: Path
) -> None:
    name, n_ctx, ub, kv, printed = case
    recipe, dims = SHAPES[name]
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", recipe, n_vocab=8000, n_ctx_train=131072, dims=dims,
                            sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn="on", type_k=t,
                                  type_v=t, device="rpc", runtime="library"))  # fmt: skip
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", "on", "-np", "1", "-ngl", "99",
            "-ctk", kv, "-ctv", kv]  # fmt: skip
    # the pass prints the table's figure or, now and then over the same rpc-server, up to 0.8 MiB less (98.00 for
    # 98.76, 172.00 for 172.02: seen here and in the round's sweeps, not explained)
    measured = _device_mib(fit_params, model, args, rpc_endpoint)
    assert printed - 1 <= measured <= printed + 0.01, (measured, printed)
    planned = device_compute_bytes(spec, lay)
    # never under (llama.cpp prints two decimals) and exact to the MiB
    assert (max(measured, printed) - 0.01) * MIB <= planned <= (printed + 1) * MIB, (planned / MIB, measured)
