"""The absorbed MLA blocks' compute (src/models/deepseek2.cpp at b11312), against llama.cpp's own allocation pass
(llama-fit-params -fitp on over a loopback rpc-server, as tests/test_host_experts.py).

Which tensors are alive at the peak depends on where ggml-alloc's best fit left the previous block's residual
(GGML_SCHED_DEBUG=2 and a replay of the node sequence): the attention's stack (Q's hole, Q_nope absorbed, q_pe,
Qcur) sits above two rows of n_embd where the routed experts' down projection did not fit in gate's and up's hole
(Kimi-K2, DeepSeek-V2/V3), above that projection's rows where it did (GLM-4.7-Flash's 40-head variant); the first MoE
block after the dense ones keeps the hole of the attention's [v_head, n_head] output under its feed-forward.
One closed sum (qk_nope + 3 qk_rope + 2 kv_lora + 128 f32 a head, the MoE phase above a Qcur-sized hole) was exact
on GLM-4.7-Flash and DeepSeek-V2-Lite but 11-21 % over on Kimi-K2's and DeepSeek-V3's shapes (and 1 % under on the
40-head one); kvadvise.planner.sizes replays the blocks through kvadvise.planner.galloc instead. Printed against
planned, MiB (one RPC device, n_vocab 8000; "before": the closed sum):

| shape | ctx, -ub, -fa, cache | printed | planned | before |
| Kimi-K2 (n_embd 7168, 64 heads, q_lora 1536, n_ff 18432) | 16k, 512, on, f16 | 268.01 | 268.01 | 324.08 |
| Kimi-K2 | 16k, 2048, on, f16 | 1072.03 | 1072.03 | 1296.31 |
| Kimi-K2 | 8k, 512, off, f16 | 1242.01 | 1242.01 | 1298.00 |
| Kimi-K2's widths, 16 / 32 / 96 / 128 heads | 16k, 512, on, f16 | 256.00 / 260.00 / 299.01 / 394.01 | the same | 270.08 / 288.08 / 360.08 / 426.00 |
| DeepSeek-V3 (128 heads, 3 dense blocks) | 16k, 512, on, f16 | 394.01 | 394.01 | 426.00 |
| DeepSeek-V3 | 32k, 2048, on, q8_0 | 1640.03 | 1640.03 | 1768.00 |
| DeepSeek-V3 | 8k, 1024, off, f16 | 4884.02 | 4884.02 | 5076.00 |
| DeepSeek-V2 (n_embd 5120, 128 heads) | 16k, 512, on, f16 | 382.01 | 382.01 | 414.00 |
| GLM-4.7-Flash (20 heads) | 16k, 512 / 2048, on, f16 | 94.01 / 376.03 | the same | 94.00 / 376.00 |
| GLM-4.7-Flash, 40 heads, n_ff 4096 | 16k, 512 / 2048, on, f16 | 149.27 / 597.06 | the same | 148.00 / 592.00 |
| DeepSeek-V2-Lite (16 heads, no q_lora) | 16k, 512 / 2048, on, f16 | 92.13 / 368.53 | the same | 92.12 / 368.50 |
| DeepSeek-V2-Lite | 16k, 512, off, f16 | 598.27 | 598.27 | 617.00 |
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_host_experts import _device_mib
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import RunConfig, device_compute_bytes, resolve

MIB = 1 << 20
# the leading dense blocks and a few MoE blocks of each (the vocabulary small: the blocks make the peak; ggml-alloc's
# layout repeats from the third MoE block on, so a few blocks are the whole model's peak)
SHAPES = {
    # zai-org/GLM-4.7-Flash config.json (tests/test_attack_round22a.py GLM47_FLASH)
    "glm-4.7-flash": dict(n_layer=6, n_embd=2048, n_head=20, n_ff=10240, qk_nope=192, qk_rope=64, v_head=256,
                          kv_lora=512, q_lora=768, n_expert=64, n_expert_used=4, n_expert_shared=1, n_ff_exp=1536,
                          n_dense_lead=1),
    # deepseek-ai/DeepSeek-V2-Lite (tests/oracle.py)
    "deepseek-v2-lite": dict(n_layer=6, n_embd=2048, n_head=16, n_ff=10944, qk_nope=128, qk_rope=64, v_head=128,
                             kv_lora=512, q_lora=0, n_expert=64, n_expert_used=6, n_expert_shared=2, n_ff_exp=1408,
                             n_dense_lead=1),
    # a GLM-4.7-Flash with twice the heads and a narrow dense block: the attention makes the peak
    "mla-40-heads": dict(n_layer=6, n_embd=2048, n_head=40, n_ff=4096, qk_nope=192, qk_rope=64, v_head=256,
                         kv_lora=512, q_lora=768, n_expert=64, n_expert_used=4, n_expert_shared=1, n_ff_exp=1536,
                         n_dense_lead=1),
    # moonshotai/Kimi-K2-Instruct config.json (384 experts cut to 16): the first MoE block's down projection peaks
    "kimi-k2": dict(n_layer=6, n_embd=7168, n_head=64, n_ff=18432, qk_nope=128, qk_rope=64, v_head=128, kv_lora=512,
                    q_lora=1536, n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=2048, n_dense_lead=1),
    # deepseek-ai/DeepSeek-V3 config.json (256 experts cut to 16, its three dense blocks): the attention peaks
    "deepseek-v3": dict(n_layer=7, n_embd=7168, n_head=128, n_ff=18432, qk_nope=128, qk_rope=64, v_head=128,
                        kv_lora=512, q_lora=1536, n_expert=16, n_expert_used=8, n_expert_shared=1, n_ff_exp=2048,
                        n_dense_lead=3),
    # deepseek-ai/DeepSeek-V2 config.json (160 experts cut to 16)
    "deepseek-v2": dict(n_layer=6, n_embd=5120, n_head=128, n_ff=12288, qk_nope=128, qk_rope=64, v_head=128,
                        kv_lora=512, q_lora=1536, n_expert=16, n_expert_used=6, n_expert_shared=2, n_ff_exp=1536,
                        n_dense_lead=1),
}  # fmt: skip

# llama-fit-params b11312's device compute buffer over one rpc-server (MiB as printed): a shape (with overrides),
# -c, -ub, -fa, the cache type
PRINTED = [
    ("kimi-k2", {}, 16384, 512, "on", "f16", 268.01),
    ("kimi-k2", {}, 16384, 2048, "on", "f16", 1072.03),
    ("kimi-k2", {}, 8192, 512, "off", "f16", 1242.01),
    ("kimi-k2", {"n_head": 16}, 16384, 512, "on", "f16", 256.00),
    ("kimi-k2", {"n_head": 32}, 16384, 512, "on", "f16", 260.00),
    ("kimi-k2", {"n_head": 96}, 16384, 512, "on", "f16", 299.01),  # n_ff = the heads' Q width (wq_b told apart)
    ("kimi-k2", {"n_head": 128}, 16384, 512, "on", "f16", 394.01),
    ("kimi-k2", {"n_head": 16}, 8192, 512, "off", "f16", 348.01),
    ("kimi-k2", {"q_lora": 0}, 16384, 1024, "on", "f16", 536.02),
    ("kimi-k2", {"kv_lora": 256}, 16384, 1024, "on", "f16", 536.02),
    ("kimi-k2", {"n_ff": 4096}, 16384, 1024, "on", "f16", 504.17),
    ("kimi-k2", {"n_expert_used": 2}, 16384, 1024, "on", "f16", 436.02),
    ("deepseek-v3", {}, 16384, 512, "on", "f16", 394.01),
    ("deepseek-v3", {}, 32768, 2048, "on", "q8_0", 1640.03),
    ("deepseek-v3", {}, 8192, 1024, "off", "f16", 4884.02),
    ("deepseek-v2", {}, 16384, 512, "on", "f16", 382.01),
    ("glm-4.7-flash", {}, 16384, 512, "on", "f16", 94.01),
    ("glm-4.7-flash", {}, 16384, 2048, "on", "f16", 376.03),
    ("glm-4.7-flash", {"n_head": 48, "n_expert": 16}, 16384, 512, "on", "f16", 170.08),
    ("glm-4.7-flash", {"n_head": 96, "n_expert": 16}, 16384, 512, "on", "f16", 296.08),
    ("mla-40-heads", {}, 16384, 512, "on", "f16", 149.27),
    ("mla-40-heads", {}, 16384, 2048, "on", "f16", 597.06),
    ("deepseek-v2-lite", {}, 16384, 512, "on", "f16", 92.13),
    ("deepseek-v2-lite", {}, 16384, 2048, "on", "f16", 368.53),
    ("deepseek-v2-lite", {}, 16384, 512, "off", "f16", 598.27),
]


def _planned(tmp_path: Path, name: str, dims: dict, n_ctx: int, ub: int, fa: str, kv: str) -> tuple[Path, int]:
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", "deepseek2-mla", n_vocab=8000, n_ctx_train=131072,
                            dims={**SHAPES[name], **dims}, sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    t = GGMLType[kv.upper()]
    lay = resolve(spec, RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn=fa, type_k=t, type_v=t,
                                  device="rpc", runtime="library"))  # fmt: skip
    return model, device_compute_bytes(spec, lay)


def _id(case: tuple) -> str:
    name, dims, n_ctx, ub, fa, kv, _ = case
    return "-".join([name, *(f"{k}{v}" for k, v in dims.items()), str(n_ctx), str(ub), fa, kv])


@pytest.mark.parametrize("case", PRINTED, ids=_id)
def test_mla_blocks_planned_as_llama_cpp_printed_them(case: tuple, tmp_path: Path) -> None:
    """The replay of the blocks (sizes._mla_layers_bytes) gives the printed buffer to its last digit (0.01 MiB, and
    half of one added so that the plan is not below the print; the router's few KiB of per-token tensors aside)."""
    name, dims, n_ctx, ub, fa, kv, printed = case
    _, planned = _planned(tmp_path, name, dims, n_ctx, ub, fa, kv)
    assert abs(planned / MIB - printed) <= 0.02, (planned / MIB, printed)


@pytest.mark.llama
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize(("ub", "fa"), [(512, "on"), (2048, "on"), (512, "off")])
def test_mla_compute_is_never_under_the_allocation_pass(
    name: str, ub: int, fa: str, fit_params: Path, rpc_endpoint: str, tmp_path: Path
) -> None:
    n_ctx = 16384 if fa == "on" else 8192
    model, planned = _planned(tmp_path, name, {}, n_ctx, ub, fa, "f16")
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", "2048", "-fa", fa, "-np", "1", "-ngl", "99"]
    measured = _device_mib(fit_params, model, args, rpc_endpoint)
    # never under the print (0.01 MiB), and within a MiB above it
    assert measured * MIB - 0.01 * MIB <= planned <= measured * MIB + MIB, (planned / MIB, measured)
