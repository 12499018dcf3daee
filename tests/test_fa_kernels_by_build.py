"""Which cache types CUDA's flash attention has a kernel for, by llama.cpp build (kvadvise.planner.builds
FA_QUANT_ANY_HEAD, FA_KV_ANY_PAIR; kvadvise.planner.memory.cuda_flash_attn_missing). Where it has none, the op
runs on the CPU: before b6646 (ggml-org/llama.cpp#16208) a quantized cache at any head size but 128; before
b11312 a K type other than V's, or q4_1/q5_0/q5_1 in a default build. kvadvise never chooses such a cache, says
why, and says so of one the user names."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvadvise.cli import main
from kvadvise.model.ggml import GGMLType
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner.memory import cuda_flash_attn_missing

HF = Path(__file__).parent / "data" / "hf"
MIRROR = Path("/work/.mirror/ollama+ollama/repo")  # a bare clone with every tag (skipped where absent)
F16, Q8_0, Q4_0, Q5_1, IQ4_NL = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.IQ4_NL


def _spec(name: str) -> ModelSpec:
    return from_config(json.loads((HF / f"{name}.json").read_text(encoding="utf-8")), source=name)


def test_a_quantized_cache_at_head_size_128_only_before_b6646() -> None:
    gemma3, qwen3 = _spec("gemma3-12b"), _spec("qwen3-8b")  # head size 256, 128
    assert {gemma3.n_embd_head_k, qwen3.n_embd_head_k} == {256, 128}
    old = cuda_flash_attn_missing(gemma3, Q8_0, Q8_0, 6500)
    assert (
        old is not None
        and "llama.cpp before b6646 has kernels for a quantized cache at head size 128 only, not 256" in old
    )
    assert cuda_flash_attn_missing(gemma3, Q8_0, Q8_0, builds.FA_QUANT_ANY_HEAD) is None
    assert cuda_flash_attn_missing(gemma3, Q8_0, Q8_0, None) is None  # an unknown build: the newest
    assert cuda_flash_attn_missing(gemma3, F16, F16, 6500) is None  # f16 at 256 had one
    assert cuda_flash_attn_missing(qwen3, Q8_0, Q8_0, 6500) is None
    assert cuda_flash_attn_missing(gemma3, IQ4_NL, IQ4_NL, None) is not None  # no build has iq4_nl


def test_one_type_in_k_and_v_before_b11312() -> None:
    qwen3 = _spec("qwen3-8b")
    for k, v in ((Q8_0, Q4_0), (F16, Q8_0), (Q5_1, Q5_1)):
        old = cuda_flash_attn_missing(qwen3, k, v, 10500)
        assert old is not None and "before b11312" in old, (k, v)
        assert cuda_flash_attn_missing(qwen3, k, v, builds.FA_KV_ANY_PAIR) is None
    assert cuda_flash_attn_missing(qwen3, Q8_0, Q8_0, 10500) is None
    assert cuda_flash_attn_missing(qwen3, Q4_0, Q4_0, 10500) is None


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    common = ["hf", str(HF / "gemma3-12b.json"), "--quant", "Q4_K_M", "--gpu", "rtx-4060-ti-16gb", "--ram", "32GiB"]
    assert main([*common, *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_the_advice_keeps_an_f16_cache_where_the_build_has_no_quantized_kernel(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Gemma 3 12B (head size 256) at a 131k target on a 16 GB card: q8_0 reaches it from b6646 on; on b6500
    a q8_0 cache would run every attention on the CPU, so the plan stays f16 at 105k and says why."""
    new = _plan(capsys, "--target-ctx", "131072", "--llama-build", "b6646")
    old = _plan(capsys, "--target-ctx", "131072", "--llama-build", "b6500")
    config_new, config_old = new["config"], old["config"]
    assert isinstance(config_new, dict) and isinstance(config_old, dict)
    assert (config_new["type_k"], config_new["n_ctx"]) == ("q8_0", 131072)
    assert config_old["type_k"] == config_old["type_v"] == "f16" and config_old["n_ctx"] < 131072
    reasons = "\n".join(str(r) for r in old["reasons"])  # type: ignore[attr-defined]
    assert (
        "a quantized cache is not chosen: llama.cpp before b6646 has kernels for a quantized cache at head size 128"
        in reasons
    )
    assert "do not reproduce tokens exactly" not in reasons


def test_a_named_cache_without_a_kernel_is_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    def notes(*args: str) -> str:
        doc = _plan(capsys, "-c", "8192", *args)
        return "\n".join(str(n) for n in doc["notes"])  # type: ignore[attr-defined]

    flagged = notes("-ctk", "q8_0", "-ctv", "q4_0", "--llama-build", "b10500")
    assert "flash attention is on but CUDA has no kernel for it" in flagged and "one type in K and V only" in flagged
    assert "flash attention is on but" not in notes("-ctk", "q8_0", "-ctv", "q4_0")  # b11312 takes any pair


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no ollama/ollama mirror here")
def test_the_rule_as_ollamas_vendored_ggml_has_it() -> None:
    """Ollama 0.12.3 vendors ggml from e54d41bef (2025-08-14): supports_op takes a quantized K at head size 128
    only (f16 at 64 and 256); 0.12.4 vendors b6646, whose fattn.cu has no head-size test for q4_0/q8_0 but one
    type in K and V (GGML_CUDA_FA_ALL_QUANTS off)."""

    def show(tag: str, path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(MIRROR), "show", f"{tag}:ml/backend/ggml/ggml/src/ggml-cuda/{path}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    old = show("v0.12.3", "ggml-cuda.cu")
    assert "if (op->src[0]->ne[0] == 128) {" in old
    assert "op->src[0]->ne[0] == 256 && op->src[1]->type == GGML_TYPE_F16 && op->src[2]->type == GGML_TYPE_F16" in old
    new = show("v0.12.4", "fattn.cu")
    assert "K->ne[0] != 128" not in new and "if (K->type != V->type) {" in new


def _hf(capsys: pytest.CaptureFixture[str], model: str, *args: str) -> dict[str, object]:
    assert main(["hf", str(HF / f"{model}.json"), "--quant", "Q4_K_M", "--ram", "32GiB", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_a_vulkan_card_is_not_planned_by_cudas_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    """Intel Arc B580 through Vulkan: ggml-vulkan's flash attention has kernels of its own (q8_0 at head size 256,
    mixed K/V), so b6500's CUDA rule does not take q8_0 away (a review found it did: f16 at 39,936)."""
    doc = _hf(capsys, "gemma3-12b", "--gpu", "arc-b580", "--target-ctx", "131072", "--llama-build", "b6500")
    config = doc["config"]
    assert isinstance(config, dict) and config["type_k"] == "q8_0", config
    assert not any("CUDA" in str(r) for r in doc["reasons"])  # type: ignore[attr-defined]


def test_a_fixed_mixed_cache_with_fa_auto_resolves_off(capsys: pytest.CaptureFixture[str]) -> None:
    """-ctk q8_0 -ctv f16 at b11000 with flash attention auto: llama.cpp's auto finds no kernel for K != V and
    turns it off (the V cache is f16), so the plan is without flash attention, not on with the CPU doing it."""
    doc = _hf(capsys, "qwen3-8b", "--gpu", "rtx-4060-ti-16gb", "-ctk", "q8_0", "-ctv", "f16", "--llama-build", "b11000")
    config = doc["config"]
    assert isinstance(config, dict) and config["flash_attn"] is False, config
    assert "flash attention is on but" not in "\n".join(str(n) for n in doc["notes"])  # type: ignore[attr-defined]


def test_repeatable_is_not_explained_by_a_missing_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _hf(
        capsys, "gemma3-12b", "--gpu", "rtx-4060-ti-16gb", "--target-ctx", "131072", "--llama-build", "b6500",
        "--repeatable",
    )  # fmt: skip
    reasons = [str(r) for r in doc["reasons"]]  # type: ignore[attr-defined]
    assert any("(--repeatable)" in r for r in reasons)
    assert not any(r.startswith("a quantized cache is not chosen") for r in reasons), reasons


def test_f32_and_bf16_caches_by_build() -> None:
    """CUDA flash attention read an f32 cache from #16546 (b6840 has it, Ollama 0.12.6's 7049736b2 not) and a
    bf16 one from #20525 (b8816 has it, ec98e2002 not)."""
    qwen3 = _spec("qwen3-8b")
    for t, since in ((GGMLType.F32, builds.FA_F32), (GGMLType.BF16, builds.FA_BF16)):
        old = cuda_flash_attn_missing(qwen3, t, t, since - 1)
        assert old is not None and f"llama.cpp before b{since} has no kernel" in old
        assert cuda_flash_attn_missing(qwen3, t, t, since) is None


def test_attention_on_the_cpu_is_in_the_decode_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    """A named q8_0 cache for Gemma 3 12B on b6500 runs its attention on the CPU: each token copies the K/V
    read so far to the host (PCIe, speed.PCIE_BYTES_PER_S) and the CPU reads it (speed.cpu_attention_seconds),
    so the estimate falls with the depth; on b6646 the GPU reads it."""
    from kvadvise.planner import speed

    args = ("-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "--ram-bandwidth", "60", "--gpu", "rtx-4060-ti-16gb")
    old, new = (_hf(capsys, "gemma3-12b", *args, "--llama-build", b) for b in ("b6500", "b6646"))
    est_old, est_new = old["decode_estimate"], new["decode_estimate"]
    assert isinstance(est_old, dict) and isinstance(est_new, dict)
    assert "flash attention runs on the CPU" in est_old["note"] and "runs on the CPU" not in est_new["note"]
    spec = _spec("gemma3-12b")
    for p_old, p_new in zip(est_old["at_context"], est_new["at_context"], strict=True):
        depth = p_old["n_ctx"]
        added = speed.cpu_attention_seconds(spec, depth, Q8_0, Q8_0, 60_000_000_000)
        assert 1 / p_old["tokens_per_s"] - 1 / p_new["tokens_per_s"] == pytest.approx(added, rel=0.02), depth
    assert est_old["at_context"][-1]["tokens_per_s"] < 0.3 * est_new["at_context"][-1]["tokens_per_s"]  # at 32k
