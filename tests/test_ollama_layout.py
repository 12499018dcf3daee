"""Ollama's layout of the llamarunner (v0.12.11 - v0.24: llm/server.go llamaServer.Load, createLayout):
Ollama's own llm/server_test.go cases, and published server logs (tests/data/published/ollama-layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama import layout
from kvadvise.backends.ollama.estimate_legacy import LegacyModel, LegacyTensor, legacy_model
from kvadvise.backends.ollama.layout import LayoutGpu, LayoutLoadRefused
from kvadvise.cli import main

MIB = 1024**2
MIN = 457 * MIB
SYSTEM = {"system_free_bytes": 512 * MIB, "system_swap_bytes": 256 * MIB, "system_total_bytes": 1024**3}


def _gpu(i: int, free: int, library: str = "", integrated: bool = False) -> LayoutGpu:
    return LayoutGpu(f"gpu{i}", f"gpu{i}", library, free, integrated)


G0 = _gpu(0, 128 * MIB + MIN)
G1 = _gpu(1, 256 * MIB + MIN)
SINGLE = [_gpu(0, 256 * MIB + MIN)]
L50 = [50 * MIB] * 3
L100 = [100 * MIB] * 4
IG1 = _gpu(1, 256 * MIB + MIN, integrated=True)

# llm/server_test.go TestLLMServerFitGPU (v0.13.0; the same cases to v0.24.0), expected as its Hash compares:
# the GPUs holding layers, in order, with their layers
FIT_GPU_CASES = [
    ("No GPU", [], L50, -1, False, []),
    ("Full single GPU", SINGLE, L50, -1, False, [("gpu0", (0, 1, 2))]),
    ("Partial single GPU", SINGLE, L100, -1, False, [("gpu0", (1, 2))]),
    ("Single GPU with numGPU 1", SINGLE, L50, 1, False, [("gpu0", (1,))]),
    ("Single GPU with numGPU 0", SINGLE, L50, 0, False, []),
    ("Single GPU with numGPU 999", SINGLE, L100, 999, False, [("gpu0", (0, 1, 2, 3))]),
    ("Multi GPU fits on one", [G0, G1], L50, -1, False, [("gpu1", (0, 1, 2))]),
    ("Multi GPU split", [G0, G1], [256 * MIB, 50 * MIB, 50 * MIB], -1, False, [("gpu1", (0,)), ("gpu0", (1, 2))]),
    ("Multi GPU partial", [G0, G1], [256 * MIB, 256 * MIB, 50 * MIB], -1, False, [("gpu1", (1,))]),
    ("Multi GPU numGPU 1", [G0, G1], L50, 1, False, [("gpu1", (1,))]),
    ("Multi GPU numGPU 2", [G0, G1], [256 * MIB, 50 * MIB, 50 * MIB], 2, False, [("gpu1", (0,)), ("gpu0", (1,))]),
    (
        "Multi GPU numGPU 999",
        [G0, G1],
        [256 * MIB, 256 * MIB, 50 * MIB],
        999,
        False,
        [("gpu1", (0, 1)), ("gpu0", (2,))],
    ),
    (
        "Multi GPU different libraries",
        [_gpu(0, 128 * MIB + MIN, "CUDA"), _gpu(1, 256 * MIB + MIN, "ROCm")],
        [128 * MIB, 128 * MIB, 50 * MIB],
        -1,
        False,
        [("gpu1", (0, 1))],
    ),
    ("iGPU", [_gpu(0, 256 * MIB + MIN, integrated=True)], L50, -1, False, [("gpu0", (0, 1, 2))]),
    ("iGPU + dGPU", [G0, IG1], L50, -1, False, [("gpu1", (0,)), ("gpu0", (1, 2))]),
    ("iGPU + dGPU fits on one", [G0, IG1], [50 * MIB, 50 * MIB], -1, False, [("gpu0", (0, 1))]),
    ("iGPU + dGPU partial", [G0, IG1], L100, -1, False, [("gpu1", (0, 1)), ("gpu0", (2,))]),
    ("iGPU + dGPU numGPU 1", [G0, IG1], L100, 1, False, [("gpu0", (2,))]),
    ("iGPU + dGPU numGPU 999", [G0, IG1], L100, 999, False, [("gpu0", (0,)), ("gpu1", (1, 2, 3))]),
]


@pytest.mark.parametrize("version", ["0.13.0", "0.24.0"])
@pytest.mark.parametrize(("name", "gpus", "layers", "num_gpu", "require_full", "expected"), FIT_GPU_CASES)
def test_ollama_fit_gpu_cases(name, gpus, layers, num_gpu, require_full, expected, version):
    got = layout.create_layout(gpus, layers, version=version, requested=num_gpu, require_full=require_full, **SYSTEM)
    assert [(g.device_id, tuple(sorted(g.layers))) for g in got if g.layers] == expected, name


@pytest.mark.parametrize(
    ("gpus", "num_gpu"),
    [([_gpu(0, 256 * MIB + MIN)], -1), ([_gpu(0, 256 * MIB)], 4)],  # "requireFull", "requireFull numGPU"
)
def test_ollama_require_full_refused(gpus, num_gpu):
    with pytest.raises(LayoutLoadRefused):
        layout.create_layout(gpus, L100, version="0.13.0", requested=num_gpu, require_full=True, **SYSTEM)


def test_no_gpu_require_full_from_0_13_1():
    """v0.24.0's "No GPU" case loads with requireFull and expects no error ("Should not try to evict");
    v0.13.0's verifyLayout had no GPU check and refused."""
    assert layout.create_layout([], L50, version="0.24.0", require_full=True, **SYSTEM) == ()
    with pytest.raises(LayoutLoadRefused):
        layout.create_layout([], L50, version="0.13.0", require_full=True, **SYSTEM)


def test_layers_text_as_go_prints():
    gl = (layout.GpuLayers("GPU-a", (0, 1, 2)), layout.GpuLayers("GPU-b", (3, 5)))
    assert layout.layers_text(gl) == "5[ID:GPU-a Layers:3(0..2) ID:GPU-b Layers:2[3 5]]"
    assert layout.layers_text(()) == "[]"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc = main(["ollama", "qwen2.5-coder:7b", "--ctx", "8192", "--json", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)["ollama"]
    return doc


@pytest.mark.parametrize("version", ["0.12.11", "0.13.0", "0.20.2", "0.24.0"])
def test_kvadvise_ollama_replays_the_llamarunner_layout(
    coder_store: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    """qwen2.5-coder:7b (f16 weights, 29 layers) in 6 GiB: Ollama's layout tries all 29 layers (no fit), then
    without the output layer: 9 blocks (19..27) from the last one down; llama.cpp's allocation fits 7 layers, so
    num_gpu holds the load to that. Every pin offloads the output layer last (before llama.cpp#18148): num_gpu 7
    is the last 7 blocks, and the tied token_embd the output matmul reads stays on the CPU, its op-offload copy
    (1 GiB of f16) beside the logits in the GPU's compute buffer (planned 8 at the later pins while the output
    layer was planned on the GPU first, as b11312 places it)."""
    doc = _plan(capsys, "--ollama-version", version, "--vram", "6GiB")
    d = doc["decision"]
    planned = 7
    assert (d["layers_offload"], d["layers_model"], d["planned_layers"], d["num_gpu"]) == (9, 29, planned, planned)
    assert d["layers_by"] == "llm/server.go createLayout over fs/ggml GraphSize"
    assert "GPULayers:9[ID:0 Layers:9(19..27)]" in d["log_line"]
    assert doc["modelfile_parameters"]["num_gpu"] == planned
    # the same layout straight from the port: the 9 blocks and their KV on CUDA0, the partial graph
    lay = layout.llama_server_load(
        legacy_model(read_header(coder_store)), [LayoutGpu("0", "CUDA0", "CUDA", 6 << 30)],
        version=version, num_ctx=8192,
    )  # fmt: skip
    groups = {f"blk.{i}": 0 for i in range(28)}
    header = read_header(coder_store)
    for t in header.tensors:
        blk = ".".join(t.name.split(".")[:2])
        if blk in groups:
            groups[blk] += t.n_bytes
    assert lay.gpus[0].weights_bytes == sum(groups[f"blk.{i}"] for i in range(19, 28))
    assert lay.gpus[0].cache_bytes == 9 * 8192 * (128 + 128) * 4 * 2  # 4 KV heads, K and V heads of 128, f16 (2 B)
    assert lay.gpus[0].graph_bytes == lay.graph_partial_bytes


def test_a_full_fit_leaves_num_gpu_unset(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan(capsys, "--ollama-version", "0.20.2", "--vram", "24GiB")
    assert (doc["decision"]["layers_offload"], doc["decision"]["num_gpu"]) == (29, None)
    assert "num_gpu" not in doc["modelfile_parameters"]


# ------------------------------------------------------------------------------ published logs

DATA = Path(__file__).resolve().parent / "data" / "published" / "ollama-layout"
GIB = 1024**3
F32, Q4_0, Q6_K = 0, 2, 14  # GGUF type numbers


def _bytes(shape: tuple[int, ...], type_id: int) -> int:
    n = 1
    for d in shape:
        n *= d
    return {F32: n * 4, Q4_0: n * 18 // 32, Q6_K: n * 210 // 256}[type_id]


def _transcribed(header: dict[str, Any]) -> LegacyModel:
    """The tensors the printed header and type counts imply (the data file's "transcription")."""
    e, ff, nv = header["embedding_length"], header["feed_forward_length"], header["n_vocab"]
    t: list[LegacyTensor] = [
        LegacyTensor("token_embd.weight", (e, nv), Q4_0),
        LegacyTensor("output_norm.weight", (e,), F32),
        LegacyTensor("output.weight", (e, nv), Q6_K),
    ]
    if header["architecture"] == "chatglm":
        qkv = e + 2 * header["head_count_kv"] * (e // header["head_count"])
        per_block = [
            ("attn_norm.weight", (e,), F32), ("attn_qkv.weight", (e, qkv), Q4_0), ("attn_qkv.bias", (qkv,), F32),
            ("attn_output.weight", (e, e), Q4_0), ("ffn_norm.weight", (e,), F32),
            ("ffn_up.weight", (e, 2 * ff), Q4_0), ("ffn_down.weight", (ff, e), Q4_0),
        ]  # fmt: skip
    else:  # phi3
        half_rot = header["rope_dimension_count"] // 2
        t += [LegacyTensor(f"rope_factors_{k}.weight", (half_rot,), F32) for k in ("long", "short")]
        per_block = [
            ("attn_norm.weight", (e,), F32), ("attn_qkv.weight", (e, 3 * e), Q4_0),
            ("attn_output.weight", (e, e), Q4_0), ("ffn_norm.weight", (e,), F32),
            ("ffn_up.weight", (e, 2 * ff), Q4_0), ("ffn_down.weight", (ff, e), Q4_0),
        ]  # fmt: skip
    t += [LegacyTensor(f"blk.{i}.{n}", s, ty) for i in range(header["block_count"]) for n, s, ty in per_block]
    return LegacyModel(
        architecture=header["architecture"],
        block_count=header["block_count"],
        embedding_length=e,
        head_count=(header["head_count"],),
        head_count_kv=(header["head_count_kv"],),
        key_length=None,
        value_length=None,
        n_vocab=nv,
        context_length=header["context_length"],
        tensors=tuple(t),
        feed_forward_length=ff,
    )


def _published() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / "yyc3-ollama-0.17.0-metal-m4-codegeex4-phi3.json").read_text())
    assert doc["source"].startswith("https://github.com/")
    return doc


@pytest.mark.parametrize("index", [0, 1])
def test_the_transcribed_tensors_are_the_logged_models(index: int) -> None:
    """The transcription reproduces the printed type counts and llama.cpp's buffers to the 0.01 MiB."""
    load = _published()["loads"][index]
    model = _transcribed(load["header"])
    names = {"f32": F32, "q4_0": Q4_0, "q6_K": Q6_K}
    counts = {k: sum(1 for t in model.tensors if t.type_id == names[k]) for k in load["header"]["tensor_types"]}
    assert counts == load["header"]["tensor_types"] and len(model.tensors) == load["header"]["n_tensors"]
    cpu = sum(_bytes(t.shape, t.type_id) for t in model.tensors if t.name.startswith("token_embd"))
    gpu = sum(_bytes(t.shape, t.type_id) for t in model.tensors if not t.name.startswith("token_embd"))
    assert (round(cpu / MIB, 2), round(gpu / MIB, 2)) == (
        load["llama_cpp_buffers_mib"]["CPU_Mapped"],
        load["llama_cpp_buffers_mib"]["Metal_Mapped"],
    )


def _metal(free: int) -> LayoutGpu:
    return LayoutGpu("0", "Metal", "Metal", free)


def _metal_totals(doc: dict[str, Any]) -> list[int]:
    """Every recommendedMaxWorkingSetSize the log's "26800.60 MB" (bytes / 1e6, two decimals) can be: the Metal
    device's total, and its free memory before the first model (all but a few MB)."""
    mb = doc["published"]["recommended_max_working_set_mb"]
    return [round((mb - 0.005) * 1e6) + k * 1000 for k in range(11)]


def _memory(lay: layout.LayoutDecision) -> dict[str, str]:
    g = lay.gpus[0]
    return {
        "model_weights": layout.human_bytes2(g.weights_bytes),
        "kv_cache": layout.human_bytes2(g.cache_bytes),
        "compute_graph": layout.human_bytes2(g.graph_bytes),
        "total_memory": layout.human_bytes2(lay.total_bytes),
    }


def test_ollama_0_17_0_codegeex4_then_phi3_on_an_m4() -> None:
    """Ollama 0.17.0 on an Apple M4 (25.0 GiB of Metal): codegeex4 (chatglm Q4_0) at 32768 tokens, 41 of 41
    layers and its memory lines as printed; then phi3 mini 128k at 32768 tokens with codegeex4 loaded (free
    16.9 GiB: the total less codegeex4's 8.1 GiB, sched.go updateFreeSpace) must load fully (requireFull): the
    layout places 32 of 33 once phi3's 2 GiB graph is reserved, and Ollama evicts ("loaded layers"=32); after
    the eviction 33 of 33 with its memory lines as printed. The Metal total is recommendedMaxWorkingSetSize
    (ggml-metal-device.m ggml_metal_device_get_memory at v0.17.0), replayed for every value its printed
    "26800.60 MB" can be; the 0.1 GiB of "free=16.9 GiB" alone would leave 33 possible above 16.905 GiB."""
    doc = _published()
    glm, phi = doc["loads"]
    glm_model, phi_model = _transcribed(glm["header"]), _transcribed(phi["header"])
    for total in _metal_totals(doc):
        lay = layout.llama_server_load(glm_model, [_metal(total)], version="0.17.0", num_ctx=32768)
        assert layout.human_bytes2(total) == glm["published"]["free"]
        assert f"{lay.total_layers}" == str(glm["published"]["model_layers"])
        assert layout.layers_text(lay.gpu_layers) == glm["published"]["gpu_layers"]
        assert _memory(lay) == {k: glm["published"][k] for k in ("model_weights", "kv_cache", "compute_graph",
                                                                   "total_memory")}  # fmt: skip
        # the device reports more free than that (codegeex4 allocates less than Ollama predicts): the total
        # less the prediction is what the scheduler keeps
        after = layout.free_after_loaded(total, total, lay.vram_by_gpu_bytes[0])
        assert layout.human_bytes2(after) == phi["published"]["first_try_free"]
        with pytest.raises(LayoutLoadRefused) as refused:
            layout.llama_server_load(phi_model, [_metal(after)], version="0.17.0", num_ctx=32768, require_full=True)
        assert refused.value.loaded_layers == phi["published"]["first_try_loaded_layers"]
        lay = layout.llama_server_load(phi_model, [_metal(total)], version="0.17.0", num_ctx=32768)
        assert layout.layers_text(lay.gpu_layers) == phi["published"]["gpu_layers"]
        assert _memory(lay) == {k: phi["published"][k] for k in ("model_weights", "kv_cache", "compute_graph",
                                                                  "total_memory")}  # fmt: skip


def test_a_vision_models_projector_is_not_counted() -> None:
    """llamaServer.Load sizes the projector from loadRequest.LoraPath (the adapters) at every tag to v0.24.0:
    a vision model is laid out as its text model (no projector, no vision graph)."""
    from dataclasses import replace

    header = _published()["loads"][1]["header"]
    text = _transcribed(header)
    vision = replace(text, has_vision=True)
    gpu = [LayoutGpu("GPU-a", "CUDA0", "CUDA", 4 * GIB)]
    a = layout.llama_server_load(text, gpu, version="0.24.0", num_ctx=8192)
    b = layout.llama_server_load(vision, gpu, version="0.24.0", num_ctx=8192)
    assert a == b and 0 < a.layers_offload < a.total_layers
