"""DeepSeek-Coder-V2-Lite as Ollama's library ships it: the 2024 GGUF, before llama.cpp's MLA conversion (fused
attn_kv_b, no attn_k_b/attn_v_b, no *_mla keys), so a full cache of 16 heads of K 192 and V 128. CUDA has no
flash-attention kernel for that head pair at GQA 1, so -fa auto resolves off there (and on the CPU it stays on).

llama.cpp's own allocation pass (llama-fit-params -fitp on, b11312) on a sparse GGUF of the model's real
dimensions (tests/data/hf/deepseek-coder-v2-16b.json), with an rpc-server on loopback as the device and flash
attention off as CUDA runs it: kvadvise's device compute buffer must be within 16 MiB or 3 % and never more
than 3 % under. The vocabulary is 1,024 tokens, so that the layers and not llama-fit-params' 512 rows of logits
(llama-server reserves one) are the peak.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import MIB, RunConfig, estimate

HF = Path(__file__).resolve().parent / "data" / "hf" / "deepseek-coder-v2-16b.json"

CASES = (
    RunConfig(n_ctx=4096, flash_attn="off", runtime="library"),
    RunConfig(n_ctx=8192, flash_attn="off", runtime="library"),
    RunConfig(n_ctx=8192, flash_attn="off", runtime="library", n_batch=1024, n_ubatch=1024),
    RunConfig(n_ctx=16384, flash_attn="off", runtime="library", n_ubatch=256),
)


def test_the_real_size_recipe_is_deepseek_coder_v2_lite() -> None:
    from oracle import REAL_SIZES

    hf = json.loads(HF.read_text())
    dims = REAL_SIZES["deepseek2-legacy"]
    assert (dims["n_layer"], dims["n_embd"], dims["n_head"]) == (
        hf["num_hidden_layers"],
        hf["hidden_size"],
        hf["num_attention_heads"],
    )
    assert (dims["qk_nope"], dims["qk_rope"], dims["v_head"], dims["kv_lora"]) == (
        hf["qk_nope_head_dim"],
        hf["qk_rope_head_dim"],
        hf["v_head_dim"],
        hf["kv_lora_rank"],
    )
    assert "q_lora_rank" not in hf and dims["q_lora"] == 0
    assert (dims["n_expert"], dims["n_expert_used"], dims["n_expert_shared"], dims["n_ff_exp"]) == (
        hf["n_routed_experts"],
        hf["num_experts_per_tok"],
        hf["n_shared_experts"],
        hf["moe_intermediate_size"],
    )
    assert (dims["n_dense_lead"], dims["n_ff"]) == (hf["first_k_dense_replace"], hf["intermediate_size"])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from oracle import REAL_SIZES

    path = tmp_path_factory.mktemp("dsv2lite") / "deepseek-coder-v2-lite-legacy.gguf"
    return write_tiny_gguf(
        path, "deepseek2-legacy", n_vocab=1024, n_ctx_train=163840, dims=REAL_SIZES["deepseek2-legacy"], sparse=True
    )


@pytest.fixture(scope="module")
def rpc_endpoint() -> Iterator[tuple[Path, str]]:
    from llama_server_build import BuildUnavailable, fit_params, rpc_server
    from rpc_devices import devices

    try:
        binary = fit_params()
    except BuildUnavailable as e:
        pytest.skip(f"no llama-fit-params can be built here: {e}")
    with devices(rpc_server(), 1) as eps:
        yield binary, eps[0]


@pytest.mark.llama
@pytest.mark.parametrize("cfg", CASES, ids=[f"c{c.n_ctx}-ub{c.n_ubatch}" for c in CASES])
def test_legacy_deepseek_v2_lite_without_flash_attention(
    cfg: RunConfig, model: Path, rpc_endpoint: tuple[Path, str]
) -> None:
    from oracle import dry_run, within

    binary, endpoint = rpc_endpoint
    measured = dry_run(binary, model, cfg, rpc=endpoint)
    (device,) = [k for k in measured if k.startswith("RPC")]
    est = estimate(from_gguf(read_file(model)), replace(cfg, device="rpc", device_names=(device,)))
    got = est.devices[0].compute_bytes
    assert within(got, measured[device]), (got / MIB, measured)
    assert got >= 0.97 * measured[device] * MIB, (got / MIB, measured)
    assert within(est.host.compute_bytes, measured["CPU"]), (est.host.compute_bytes / MIB, measured)
