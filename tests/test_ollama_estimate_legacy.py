"""The port of Ollama's llm/memory.go against published Ollama 0.11 decisions (tests/data/published/ollama-legacy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvadvise.backends.ollama.estimate_legacy import (
    GIB,
    MIB,
    LegacyGpu,
    LegacyModel,
    LegacyTensor,
    LegacyVersionNotModelled,
    estimate_gpu_layers,
    human_bytes2,
    legacy_model,
)
from kvadvise.model.gguf import read_file
from tests.tinymodels import write_tiny_gguf

DATA = Path(__file__).resolve().parent / "data" / "published" / "ollama-legacy"
BF16, F32, MXFP4_OLLAMA = 30, 0, 4


def gpt_oss_20b() -> LegacyModel:
    """gpt-oss:20b as Ollama's converter writes it (Ollama's own blob; its header is not stored here).

    Rebuilt from convert/convert_gptoss.go (v0.11.4): OpenAI's original checkpoint, qkv fused, the MoE
    mlp1/mlp2 blocks+scales joined into MXFP4 (Ollama's type 4) ffn_gate_up_exps / ffn_down_exps, and
    convert/reader.go tensorBase.Kind: 1-D tensors and ffn_gate_inp.weight F32, the other BF16 tensors
    BF16. Dimensions: openai/gpt-oss-20b config.json (24 layers, 2880 wide, 64 heads of 64, 8 KV heads,
    32 experts of 2880, 201,088 tokens). 13,766,359,296 bytes of tensors, the 13 GB Ollama lists.
    """
    e, n_layer, n_vocab = 2880, 24, 201088
    ts = [
        LegacyTensor("token_embd.weight", (e, n_vocab), BF16),
        LegacyTensor("output.weight", (e, n_vocab), BF16),
        LegacyTensor("output_norm.weight", (e,), F32),
    ]
    for il in range(n_layer):
        p = f"blk.{il}"
        ts += [
            LegacyTensor(f"{p}.attn_norm.weight", (e,), F32),
            LegacyTensor(f"{p}.attn_qkv.weight", (e, 64 * 64 + 2 * 8 * 64), BF16),
            LegacyTensor(f"{p}.attn_qkv.bias", (64 * 64 + 2 * 8 * 64,), F32),
            LegacyTensor(f"{p}.attn_sinks.weight", (64,), F32),
            LegacyTensor(f"{p}.attn_out.weight", (64 * 64, e), BF16),
            LegacyTensor(f"{p}.attn_out.bias", (e,), F32),
            LegacyTensor(f"{p}.ffn_norm.weight", (e,), F32),
            LegacyTensor(f"{p}.ffn_gate_inp.weight", (e, 32), F32),
            LegacyTensor(f"{p}.ffn_gate_inp.bias", (32,), F32),
            LegacyTensor(f"{p}.ffn_gate_up_exps.weight", (e, 2 * e, 32), MXFP4_OLLAMA),
            LegacyTensor(f"{p}.ffn_gate_up_exps.bias", (2 * e, 32), BF16),
            LegacyTensor(f"{p}.ffn_down_exps.weight", (e, e, 32), MXFP4_OLLAMA),
            LegacyTensor(f"{p}.ffn_down_exps.bias", (e, 32), BF16),
        ]
    return LegacyModel(
        architecture="gptoss",
        block_count=n_layer,
        embedding_length=e,
        head_count=(64,),
        head_count_kv=(8,),
        key_length=64,
        value_length=64,
        n_vocab=n_vocab,
        context_length=131072,
        tensors=tuple(ts),
        sliding_window=128,
        feed_forward_length=e,
    )


GPT_OSS = gpt_oss_20b()


def _published(name: str) -> dict[str, object]:
    data = json.loads((DATA / name).read_text())
    assert str(data["source"]).startswith(("https://github.com/ollama/ollama/issues/", "kvadvise issue 37"))
    published = data["published"]
    assert isinstance(published, dict)
    return published


def test_gpt_oss_20b_tensor_bytes_match_ollamas_blob_size() -> None:
    from kvadvise.backends.ollama.estimate_legacy import _tensor_bytes

    total = sum(_tensor_bytes(t, (0, 11, 4)) for t in GPT_OSS.tensors)
    assert total == 13_766_359_296  # `ollama list`: 13 GB; the library page: 14 GB


@pytest.mark.parametrize(
    ("version", "n_bytes"),
    [("0.10.1", 0), ("0.11.4", 0), ("0.11.5", 2880 * 2880 * 129 // 256), ("0.11.8", 2880 * 2880 * 17 // 32)],
)
def test_llama_cpp_mxfp4_type_39_by_version(version: str, n_bytes: int) -> None:
    """TensorType.BlockSize/TypeSize: type 39 unknown (0 B) until v0.11.5, a 256-block of 129 B in v0.11.5..7."""
    from kvadvise.backends.ollama.estimate_legacy import _tensor_bytes, parse_version

    assert (
        _tensor_bytes(LegacyTensor("blk.0.ffn_down_exps.weight", (2880, 2880), 39), parse_version(version)) == n_bytes
    )


# ollama#11769: rick-github's offload line, Ollama v0.11.3/v0.11.4 (server.go:175), one card with 3.6 GiB free
@pytest.mark.parametrize("version", ["0.11.3", "0.11.4"])
@pytest.mark.parametrize("free_gib", [3.551, 3.6, 3.649])  # every free figure HumanBytes2 prints as "3.6 GiB"
def test_published_ollama_11769_one_layer_of_gpt_oss(version: str, free_gib: float) -> None:
    pub = _published("ollama-11769-gptoss20b-v0.11.3.json")
    # total VRAM over 20 GiB (not low-VRAM mode): gpt-oss then runs at 8192, which the "30x MiB" kv implies
    gpu = LegacyGpu(free_bytes=int(free_gib * GIB), total_bytes=24 * GIB)
    e = estimate_gpu_layers(
        GPT_OSS, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
    )
    assert e.layers_model == pub["layers_model"]
    assert e.layers_offload == pub["layers_offload"]
    assert human_bytes2(e.available_bytes[0]) == pub["available"]
    assert human_bytes2(e.gpu_overhead_bytes) == pub["gpu_overhead"]
    assert human_bytes2(e.required_full_bytes) == pub["required_full"]
    assert human_bytes2(e.required_partial_bytes) == pub["required_partial"]
    assert human_bytes2(e.required_kv_bytes).startswith(str(pub["required_kv_prefix"]))
    assert e.required_kv_bytes == 300 * MIB  # 12 x 8192 + 12 x (4096 + 512) cells x 2,048 B


# ollama#11964: gpt-oss with OLLAMA_NUM_PARALLEL=5 on a machine over 20 GB: 8192 x 5 = 40960 before v0.11.5
def test_published_ollama_11964_gpt_oss_context_times_slots() -> None:
    pub = _published("ollama-11964-gptoss-np5-context.json")
    gpus = [LegacyGpu(free_bytes=15 * GIB, total_bytes=16 * GIB)] * 2
    e = estimate_gpu_layers(
        GPT_OSS, gpus, num_ctx=2048, num_parallel=5, kv_cache_type="", flash_attention=False, version="0.11.4"
    )
    assert e.num_ctx == pub["total_ctx"] == 40960
    assert e.num_parallel == pub["num_parallel"]
    # the same cache from v0.11.5, where GraphSize multiplies the per-slot 8192 itself
    later = estimate_gpu_layers(
        GPT_OSS, gpus, num_ctx=2048, num_parallel=5, kv_cache_type="", flash_attention=False, version="0.11.5"
    )
    assert later.num_ctx == 8192
    assert later.required_kv_bytes == e.required_kv_bytes == (12 * 40960 + 12 * (5 * 4096 + 512)) * 2048


# kvadvise issue 37: 23 of 25 on an RTX 4060 Ti 16 GB; the free memory is assumed (not published)
@pytest.mark.parametrize("version", ["0.11.0", "0.11.1", "0.11.2"])
# 23 layers from 16,538,553,345 B to 17,025,066,112 B free (15.40-15.86 GiB)
@pytest.mark.parametrize("free_mib", [15_773, 16_000, 16_236])
def test_issue37_rtx_4060_ti_23_of_25(version: str, free_mib: int) -> None:
    pub = _published("kvadvise-issue37-gptoss20b-decisions.json")["rtx_4060_ti_16gb"]
    assert isinstance(pub, dict)
    gpu = LegacyGpu(free_bytes=free_mib * MIB, total_bytes=16_380 * MIB)  # nvidia-smi total of a 4060 Ti 16 GB
    e = estimate_gpu_layers(
        GPT_OSS, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
    )
    assert (e.layers_model, e.layers_offload) == (pub["layers_model"], pub["layers_offload"])
    assert e.num_ctx == 8192  # v0.11.0-v0.11.3 raise gpt-oss to 8192 whatever the VRAM
    assert human_bytes2(e.graph_partial_bytes) == "4.0 GiB"  # partial = 2 x full (v0.11.0-v0.11.2)


@pytest.mark.parametrize(("free_mib", "layers"), [(15_772, 22), (16_237, 24)])
def test_issue37_rtx_4060_ti_band_edges(free_mib: int, layers: int) -> None:
    gpu = LegacyGpu(free_bytes=free_mib * MIB, total_bytes=16_380 * MIB)
    e = estimate_gpu_layers(
        GPT_OSS, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.11.0"
    )
    assert e.layers_offload == layers


def test_issue37_rtx_4060_ti_fits_from_v0_11_3() -> None:
    gpu = LegacyGpu(free_bytes=16_000 * MIB, total_bytes=16_380 * MIB)
    for version, ctx in (("0.11.3", 8192), ("0.11.4", 4096)):  # v0.11.4: low-VRAM mode keeps 4096
        e = estimate_gpu_layers(
            GPT_OSS, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
        )
        assert (e.layers_offload, e.num_ctx) == (25, ctx)


# kvadvise issue 37: 17 of 25 on two RTX 5060 Ti 16 GB with 5 slots (free memory assumed equal on both cards)
@pytest.mark.parametrize("version", ["0.11.3", "0.11.4"])
# 17 layers from 16,458,183,937 B to 16,785,339,648 B free per card (15.33-15.63 GiB)
@pytest.mark.parametrize("free_mib", [15_696, 15_850, 16_007])
def test_issue37_two_rtx_5060_ti_5_slots_17_of_25(version: str, free_mib: int) -> None:
    pub = _published("kvadvise-issue37-gptoss20b-decisions.json")["rtx_5060_ti_16gb_x2"]
    assert isinstance(pub, dict)
    gpus = [LegacyGpu(free_bytes=free_mib * MIB, total_bytes=16_311 * MIB)] * pub["gpus"]
    e = estimate_gpu_layers(
        GPT_OSS,
        gpus,
        num_ctx=4096,
        num_parallel=pub["num_parallel"],
        kv_cache_type="",
        flash_attention=False,
        version=version,
    )
    assert (e.layers_model, e.layers_offload) == (pub["layers_model"], pub["layers_offload"])
    assert sum(e.layers_split) == 17 and e.gpu_indices == (0, 1)
    assert e.num_ctx == 40960
    assert human_bytes2(e.graph_partial_bytes) == "10.0 GiB"  # 4 x 64/8 x kv(40960 x 24 layers) / 6


def test_two_rtx_5060_ti_all_layers_from_v0_11_5() -> None:
    gpus = [LegacyGpu(free_bytes=15_850 * MIB, total_bytes=16_311 * MIB)] * 2
    e = estimate_gpu_layers(
        GPT_OSS, gpus, num_ctx=4096, num_parallel=5, kv_cache_type="", flash_attention=False, version="0.11.5"
    )
    assert e.layers_offload == 25  # the halved gptoss graph (5.0 GiB): both cards, 13 + 12
    e8 = estimate_gpu_layers(
        GPT_OSS, gpus, num_ctx=4096, num_parallel=5, kv_cache_type="", flash_attention=False, version="0.11.8"
    )
    assert (e8.layers_offload, e8.gpu_indices, e8.flash_attention) == (25, (0,), True)  # one card fits


# ollama#11688: "on a 4070 ... loading 12/25 layers" (2025-08-06, Ollama 0.11.0-0.11.3; free memory unknown)
@pytest.mark.parametrize(
    ("version", "free_mib_band"),
    [("0.11.0", (10_627, 11_097)), ("0.11.2", (10_627, 11_097)), ("0.11.3", (8_579, 9_049))],
)
def test_published_ollama_11688_rtx_4070_12_of_25(version: str, free_mib_band: tuple[int, int]) -> None:
    pub = _published("ollama-11688-gptoss20b-rtx4070-12of25.json")
    for free_mib in free_mib_band:  # the band of free memory that gives 12 layers at that version
        gpu = LegacyGpu(free_bytes=free_mib * MIB, total_bytes=12_282 * MIB)  # nvidia-smi total of a 4070
        e = estimate_gpu_layers(
            GPT_OSS, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
        )
        assert (e.layers_model, e.layers_offload) == (pub["layers_model"], pub["layers_offload"])
    below = LegacyGpu(free_bytes=(free_mib_band[0] - 1) * MIB, total_bytes=12_282 * MIB)
    e = estimate_gpu_layers(
        GPT_OSS, [below], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
    )
    assert e.layers_offload == 11


# ollama#11731: 0.11.3, RTX 5090 + 5070 Ti, 131072 context, q8_0, flash attention: "almost entirely on CPU"
def test_published_ollama_11731_gpt_oss_131072_on_cpu() -> None:
    pub = _published("ollama-11731-gptoss20b-5090-5070ti-131072-cpu.json")
    gpus = [LegacyGpu(free_bytes=31 * GIB, total_bytes=32 * GIB), LegacyGpu(free_bytes=15 * GIB, total_bytes=16 * GIB)]
    e = estimate_gpu_layers(
        GPT_OSS,
        gpus,
        num_ctx=pub["num_ctx"],
        num_parallel=pub["num_parallel"],
        kv_cache_type=pub["kv_cache_type"],
        flash_attention=pub["flash_attention"],
        version=pub["version"],
    )
    assert e.layers_offload == 0 and pub["on_cpu"]
    assert not e.flash_attention and e.kv_cache_type == ""  # v0.11.2-v0.11.4: no flash attention for gptoss
    assert human_bytes2(e.graph_partial_bytes) == "32.0 GiB"  # 4 x 64/8 x (24 x 131072 x 2 KiB) / 6: no card holds it


@pytest.mark.parametrize("version", ["0.11.11", "0.12.3", "0.12.10"])
def test_refuses_gpt_oss_where_the_new_layout_decides(version: str) -> None:
    gpu = LegacyGpu(free_bytes=15 * GIB)
    with pytest.raises(LegacyVersionNotModelled):
        estimate_gpu_layers(
            GPT_OSS, [gpu], num_ctx=8192, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
        )


def test_refuses_new_estimates_and_new_engine(tmp_path: Path) -> None:
    gpu = LegacyGpu(free_bytes=15 * GIB)
    with pytest.raises(LegacyVersionNotModelled):  # OLLAMA_NEW_ESTIMATES=1 lays gpt-oss out anew in v0.11.5+
        estimate_gpu_layers(
            GPT_OSS, [gpu], num_ctx=8192, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.11.6",
            new_estimates=True,
        )  # fmt: skip
    llama = legacy_model(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=512)))
    with pytest.raises(LegacyVersionNotModelled):  # OLLAMA_NEW_ENGINE=1 in v0.11.11+
        estimate_gpu_layers(
            llama, [gpu], num_ctx=8192, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.12.0",
            new_engine=True,
        )  # fmt: skip
    e = estimate_gpu_layers(
        llama, [gpu], num_ctx=8192, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.12.0"
    )
    assert e.layers_offload == llama.block_count + 1


@pytest.mark.parametrize("version", ["0.7.0", "0.6.8", "0.12.11", "0.13.0", "0.30.8"])
def test_refuses_versions_without_this_estimator(version: str) -> None:
    with pytest.raises(LegacyVersionNotModelled):
        estimate_gpu_layers(
            GPT_OSS, [LegacyGpu(free_bytes=15 * GIB)], num_ctx=8192, num_parallel=1,
            kv_cache_type="", flash_attention=False, version=version,
        )  # fmt: skip


def test_llama_header_kv_and_graph(tmp_path: Path) -> None:
    """A llama GGUF read from its header: Ollama's kv (2 bytes per f16 element) and llama graph formulas."""
    model = legacy_model(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=512)))
    assert model.architecture == "llama"
    heads, heads_kv = max(model.head_count), max(model.head_count_kv)
    e = estimate_gpu_layers(
        model, [LegacyGpu(free_bytes=8 * GIB)], num_ctx=4096, num_parallel=2,
        kv_cache_type="q8_0", flash_attention=True, version="0.12.10",
    )  # fmt: skip
    head = model.embedding_length // min(model.head_count)
    ctx = 8192  # num_ctx x num_parallel (GraphSize multiplies from v0.11.5)
    assert e.kv_cache_type == "q8_0" and e.flash_attention
    assert e.required_kv_bytes == model.block_count * ctx * 2 * head * heads_kv * 1  # q8_0: 1 byte
    batch, emb = 512, model.embedding_length
    full = max(4 * batch * (1 + 4 * emb + ctx * (1 + heads)), 4 * batch * (emb + model.n_vocab))
    assert e.graph_full_bytes == full
    assert e.layers_offload == model.block_count + 1


def test_unset_parallel_before_v0_11_5(tmp_path: Path) -> None:
    """OLLAMA_NUM_PARALLEL unset: v0.9.x loads 2 slots when they fit (defaultParallel 2), v0.10.0+ 1."""
    model = legacy_model(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=512)))
    gpu = LegacyGpu(free_bytes=8 * GIB)
    two, one = (
        estimate_gpu_layers(
            model, [gpu], num_ctx=4096, num_parallel=0, kv_cache_type="", flash_attention=False, version=version
        )
        for version in ("0.9.6", "0.10.0")
    )
    assert (two.num_parallel, two.num_ctx) == (2, 8192)
    assert (one.num_parallel, one.num_ctx) == (1, 4096)
    assert two.required_kv_bytes == 2 * one.required_kv_bytes


def test_per_layer_head_counts_refused_before_v0_9_3(tmp_path: Path) -> None:
    from dataclasses import replace

    model = legacy_model(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=512)))
    per_layer = replace(model, head_count_kv=(2,) + (1,) * (model.block_count - 1))
    gpu = LegacyGpu(free_bytes=8 * GIB)
    with pytest.raises(LegacyVersionNotModelled):
        estimate_gpu_layers(
            per_layer, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.9.2"
        )
    e = estimate_gpu_layers(
        per_layer, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.9.3"
    )
    assert e.layers_offload == model.block_count + 1


# Ollama's own unit test: llm/memory_test.go TestEstimateGPULayers (v0.11.4; the same figures in v0.12.10),
# https://github.com/ollama/ollama/blob/v0.11.4/llm/memory_test.go
def _ollama_dummy_llama() -> LegacyModel:
    blocks = [LegacyTensor(f"blk.{i}.attn.weight", (1, 1, 1, 1), F32) for i in range(5)]
    return LegacyModel(
        architecture="llama",
        block_count=5,
        embedding_length=4096,
        head_count=(32,),
        head_count_kv=(32,),
        key_length=None,
        value_length=None,
        n_vocab=1,
        context_length=32,
        tensors=(*blocks, LegacyTensor("output.weight", (1, 1, 1, 1), F32)),
    )


@pytest.mark.parametrize("version", ["0.11.4", "0.12.10"])
@pytest.mark.parametrize(
    ("layer0", "layer1", "expect0", "expect1"),
    [(1, 1, 1, 1), (2, 1, 2, 1), (2, 2, 2, 2), (1, 2, 1, 2), (3, 3, 3, 3), (4, 4, 3, 3), (6, 6, 3, 3), (0, 3, 0, 3)],
)
def test_ollamas_own_memory_test_dual_cuda(version: str, layer0: int, layer1: int, expect0: int, expect1: int) -> None:
    from kvadvise.backends.ollama.estimate_legacy import estimate_on_gpus

    model = _ollama_dummy_llama()
    graph_partial, graph_full, layer_size, output = 202_377_216, 171_968_512, 33_554_436, 4  # "derived from the dummy"
    minimum = 2048 if version == "0.11.4" else 457 * MIB
    free = [minimum + layer_size + n * layer_size + 1 + max(graph_full, graph_partial) for n in (layer0, layer1)]
    free[0 if layer0 > 0 else 1] += output
    gpus = [LegacyGpu(free_bytes=f, library="cuda", minimum_bytes=minimum) for f in free]
    e = estimate_on_gpus(
        model, gpus, num_ctx=2048, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
    )
    assert (e.layers_offload, e.layers_split) == (expect0 + expect1, (expect0, expect1))
    assert e.graph_partial_bytes == graph_partial and e.graph_full_bytes == graph_partial  # two GPUs: partial
    single = estimate_on_gpus(
        model, gpus[:1], num_ctx=2048, num_parallel=1, kv_cache_type="", flash_attention=False, version=version
    )
    assert (single.graph_partial_bytes, single.graph_full_bytes) == (graph_partial, graph_full)
    if e.layers_offload < model.block_count + 1:
        assert e.required_partial_bytes < e.required_full_bytes
        assert e.required_partial_bytes == sum(e.allocations_bytes)
    else:
        assert e.required_partial_bytes == e.required_full_bytes == sum(e.allocations_bytes)


@pytest.mark.parametrize(
    ("library", "mib"),
    [
        # v0.11.11, v0.12.3 (discover/gpu.go, gpu_darwin.go), v0.12.4, v0.12.6 (devInfoToInfoList), v0.12.7 (ml.DeviceInfo)
        ("cuda", (457, 457, 457, 457, 457)),
        ("ROCm", (457, 457, 457, 457, 457)),
        ("metal", (512, 512, 0, 0, 512)),
        ("Vulkan", (0, 0, 0, 0, 457)),
        ("cpu", (0, 0, 0, 0, 0)),
    ],
)
def test_minimum_memory_by_gpu_discovery(library: str, mib: tuple[int, ...]) -> None:
    """GpuInfo.MinimumMemory as each release's discovery sets it: v0.12.4's runner-based discovery
    (discover/gpu.go devInfoToInfoList) gives it to CUDA and ROCm alone, so Metal has none until v0.12.7's
    ml.DeviceInfo.MinimumMemory() (Metal 512 MiB, every other GPU 457)."""
    from kvadvise.backends.ollama.estimate_legacy import minimum_memory

    versions = ((0, 11, 11), (0, 12, 3), (0, 12, 4), (0, 12, 6), (0, 12, 7))
    assert tuple(minimum_memory(library, v) // MIB for v in versions) == mib


def test_ollamas_own_memory_test_cpu() -> None:
    from kvadvise.backends.ollama.estimate_legacy import estimate_on_gpus

    cpu = LegacyGpu(free_bytes=0, library="cpu")
    e = estimate_on_gpus(
        _ollama_dummy_llama(), [cpu], num_ctx=2048, num_parallel=1, kv_cache_type="", flash_attention=False,
        version="0.11.4",
    )  # fmt: skip
    assert (e.layers_offload, e.required_partial_bytes) == (0, 0)


def test_gemma2_loses_flash_attention_in_v0_11_11(tmp_path: Path) -> None:
    """fs/ggml SupportsFlashAttention: gemma2 refused from v0.11.11, so its q8_0 cache request is dropped."""
    model = legacy_model(read_file(write_tiny_gguf(tmp_path / "gemma2.gguf", "gemma2", n_vocab=512)))
    gpu = LegacyGpu(free_bytes=8 * GIB)
    before, after = (
        estimate_gpu_layers(
            model, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="q8_0", flash_attention=True, version=version
        )
        for version in ("0.11.10", "0.11.11")
    )
    assert (before.flash_attention, before.kv_cache_type) == (True, "q8_0")
    assert (after.flash_attention, after.kv_cache_type) == (False, "")
    assert after.required_kv_bytes == 2 * before.required_kv_bytes  # Ollama's 2 vs 1 byte per element


def test_projector_on_the_first_gpu(tmp_path: Path) -> None:
    model = legacy_model(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=512)))
    gpu = LegacyGpu(free_bytes=8 * GIB)
    bare, mm = (
        estimate_gpu_layers(
            model, [gpu], num_ctx=4096, num_parallel=1, kv_cache_type="", flash_attention=False, version="0.12.10",
            projector_bytes=projector,
        )
        for projector in (0, 600 * MIB)
    )  # fmt: skip
    assert mm.allocations_bytes[0] - bare.allocations_bytes[0] == 600 * MIB


def test_human_bytes2() -> None:
    assert [human_bytes2(b) for b in (0, 1023, 1024, 300 * MIB, 15 * GIB + 512 * MIB)] == [
        "0 B", "1023 B", "1.0 KiB", "300.0 MiB", "15.5 GiB",
    ]  # fmt: skip
