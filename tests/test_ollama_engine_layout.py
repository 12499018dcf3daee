"""Ollama's Go engine (ollamarunner) layout, 0.12.7 - 0.24 (kvadvise.backends.ollama.engine_layout; 0.11.11 - 0.12.6:
tests/test_ollama_engine_layout_0_11.py): the memory its runner reports per layer (ml/backend/ggml/ggml.go New,
kvcache/causal.go Causal.Init) from real GGUF headers (tests/tinymodels.py at real-model dimensions, header only),
and ollamaServer.Load's trial loads over it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama import engine_layout as el
from kvadvise.backends.ollama import estimate_legacy
from kvadvise.backends.ollama.estimate_legacy import LegacyModel, LegacyTensor, legacy_model
from kvadvise.backends.ollama.layout import GpuLayers, LayoutGpu
from kvadvise.cli import main
from kvadvise.model.ggml import GGMLType, pad

MIB, GIB = 1024**2, 1024**3
# gemma3:4b's text model (google/gemma-3-4b-it config.json): 34 layers, 2560 wide, 8 heads, 4 KV heads of 256
GEMMA3_4B = {"n_layer": 34, "n_embd": 2560, "n_head": 8, "n_head_kv": 4, "head": 256, "n_ff": 10240, "n_swa": 1024}
# qwen3:8b (Qwen/Qwen3-8B config.json): 36 layers, 4096 wide, 32 heads, 8 KV heads of 128, ff 12288
QWEN3_8B = {"n_layer": 36, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "head": 128, "n_ff": 12288}


@pytest.fixture(scope="module")
def gemma3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tinymodels import write_tiny_gguf

    tmp = tmp_path_factory.mktemp("gemma3")
    return write_tiny_gguf(tmp / "g.gguf", "gemma3", n_vocab=262144, n_ctx_train=131072, dims=GEMMA3_4B, sparse=True)


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tinymodels import write_tiny_gguf

    tmp = tmp_path_factory.mktemp("qwen3")
    return write_tiny_gguf(tmp / "q.gguf", "qwen3", n_vocab=151936, n_ctx_train=40960, dims=QWEN3_8B, sparse=True)


def _cuda(free: int) -> list[LayoutGpu]:
    return [LayoutGpu("GPU-0", "CUDA0", "CUDA", free)]


def test_weights_per_layer_as_the_go_backend_places_them(gemma3_path: Path) -> None:
    """Every block's tensors on its layer, each padded to CUDA's 128 bytes (f16: no row padding); the tied
    token_embd is InputWeights on the CPU and, again, the output layer's output.weight with output_norm."""
    header = read_header(gemma3_path)
    model = legacy_model(header)
    n = model.block_count
    everything = (GpuLayers("GPU-0", tuple(range(n + 1))),)
    cells = el.cache_cells(model, 8192, 1, 512, True, (0, 13, 0))
    rep = el.runner_report(model, _cuda(24 * GIB), everything, cells=cells, cache_dtype=GGMLType.F16, graph_bytes=1)
    by_layer = [0] * (n + 1)
    for t in header.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            by_layer[int(parts[1])] += pad(t.n_bytes, 128)
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    norm = next(t for t in header.tensors if t.name == "output_norm.weight")
    assert not any(t.name == "output.weight" for t in header.tensors)  # tied
    by_layer[n] = pad(embd.n_bytes, 128) + pad(norm.n_bytes, 128)
    assert rep.memory.gpu_weights[0] == by_layer and rep.memory.cpu_weights == [0] * (n + 1)
    assert rep.input_bytes == pad(embd.n_bytes, 32)  # the CPU's 32-byte alignment
    assert rep.memory.gpu_graph == [1]  # the graph on the GPU that holds layers
    # on the CPU the same blocks weigh their 32-byte-aligned bytes, and the GPU holds no graph
    rep = el.runner_report(model, _cuda(24 * GIB), (), cells=cells, cache_dtype=GGMLType.F16, graph_bytes=1)
    assert rep.memory.cpu_weights[0] == sum(pad(t.n_bytes, 32) for t in header.tensors if t.name.startswith("blk.0."))
    assert rep.memory.gpu_graph == [0]


def test_cuda_pads_a_quantized_row_to_512_values() -> None:
    """ggml-cuda get_alloc_size: q8_0 K of 128 x 8 heads x 8192 cells gets one row's padding (384 values)."""
    n_bytes = 128 * 8 * 8192 // 32 * 34
    assert el.tensor_alloc_bytes(int(GGMLType.Q8_0), (128, 8, 8192), "k", "CUDA") == pad(n_bytes + 384 // 32 * 34, 128)
    assert el.tensor_alloc_bytes(int(GGMLType.Q8_0), (128, 8, 8192), "k", None) == n_bytes
    assert el.tensor_alloc_bytes(4, (64, 32), "blk.0.ffn_up_exps.weight", None) == 64 * 32 // 32 * 17  # Ollama MXFP4
    assert el.tensor_alloc_bytes(30, (32,), "blk.0.ffn_up_exps.bias", None) == 32 * 4  # bf16 bias -> f32


def _model(arch: str, n_layer: int, swa: int) -> LegacyModel:
    return LegacyModel(arch, n_layer, 256, (4,), (2,), 64, 64, 1000, 131072, (), sliding_window=swa)


@pytest.mark.parametrize(
    ("arch", "num_ctx", "parallel", "fa", "version", "expected"),
    [
        # gemma3: 5 SWA layers then a global one; SWA cells = window + batch (1024 + 512), global = num_ctx
        ("gemma3", 8192, 1, True, "0.13.0", (1536,) * 5 + (8192,)),
        # two slots: the window + 1 per slot, + the batch, padded to 256: 2 x 1025 + 512 = 2562 -> 2816
        ("gemma3", 8192, 2, True, "0.13.0", (2816,) * 5 + (16384,)),
        # a window as large as the context: the whole context
        ("gemma3", 1024, 1, True, "0.13.0", (1024,) * 6),
        # gpt-oss: even layers keep 4096 tokens (NewSWAMemCache) + the batch, odd ones the context
        ("gptoss", 8192, 1, True, "0.13.0", (4608, 8192) * 3),
        ("gptoss", 4096, 1, True, "0.13.0", (4096, 4096) * 3),
        # padding 32 without flash attention before 0.14.0, 256 from 0.14.0
        ("qwen3", 1100, 1, False, "0.13.5", (1120,) * 6),
        ("qwen3", 1100, 1, False, "0.14.0", (1280,) * 6),
    ],
)
def test_cache_cells_as_causal_init(
    arch: str, num_ctx: int, parallel: int, fa: bool, version: str, expected: tuple[int, ...]
) -> None:
    model = _model(arch, 6, 1024 if arch == "gemma3" else 128)
    v = estimate_legacy.parse_version(version)
    assert el.cache_cells(model, num_ctx, parallel, min(512, num_ctx), fa, v) == expected


def test_gemma3_4b_kv_cache_bytes(gemma3_path: Path) -> None:
    """gemma3:4b at num_ctx 8192, f16: 29 SWA layers of 1536 cells and 5 global of 8192, K and V of 4 x 256
    heads x 2 bytes: 29 x 6 MiB + 5 x 32 MiB = 334 MiB."""
    model = legacy_model(read_header(gemma3_path))
    lay = el.ollama_server_load(model, _cuda(0), version="0.13.0", num_ctx=8192, graph_bytes=GRAPH)
    assert lay.layers_offload == 0 and lay.cpu.cache_bytes == 334 * MIB
    assert lay.cache_cells.count(8192) == 5 and lay.cache_cells.count(1536) == 29


# a graph for the layout tests: what graph_stand_in gives qwen3:8b at 8k with flash attention, 104.01 MiB (b11312's
# graph replayed at CUDA's 128-byte alignment, above the phases' 104.00: kvadvise.planner.compute.device_compute_bytes)
GRAPH = 109_062_272


def _expected_layers(layer_bytes: list[int], free: int) -> int:
    """Independent of createLayout: every layer where all fit a GPU's free memory less 457 MiB and the graph,
    else the top blocks that do (the output layer left on the CPU)."""
    room = free - 457 * MIB - GRAPH
    if sum(layer_bytes) <= room:
        return len(layer_bytes)
    k, used = 0, 0
    for size in reversed(layer_bytes[:-1]):
        if used + size > room:
            break
        used, k = used + size, k + 1
    return k


@pytest.mark.parametrize("free_gib", [0.5, 4, 6, 8, 10, 24])
def test_ollama_server_load_settles_as_its_trial_loop(qwen3_path: Path, free_gib: float) -> None:
    model = legacy_model(read_header(qwen3_path))
    free = int(free_gib * GIB)
    lay = el.ollama_server_load(model, _cuda(free), version="0.20.0", num_ctx=8192, graph_bytes=GRAPH)
    gpu_all = el.runner_report(
        model, _cuda(free), (GpuLayers("GPU-0", tuple(range(lay.total_layers))),),
        cells=lay.cache_cells, cache_dtype=GGMLType.F16, graph_bytes=0,
    ).memory  # fmt: skip
    layer_bytes = [w + c for w, c in zip(gpu_all.gpu_weights[0], gpu_all.gpu_cache[0], strict=True)]
    assert lay.layers_offload == _expected_layers(layer_bytes, free)
    if 0 < lay.layers_offload < lay.total_layers:  # the top blocks, the output layer on the CPU
        assert lay.gpu_layers[0].layers == tuple(range(36 - lay.layers_offload, 36))
    assert lay.gpus[0].graph_bytes == (GRAPH if lay.layers_offload else 0)
    assert lay.approximation == el.APPROXIMATION


def test_qwen3_8b_f16_on_8_gib(qwen3_path: Path) -> None:
    """qwen3:8b-shaped f16 at 8k on 8 GiB free, flash attention: the graph stand-in is 104.01 MiB; a block is
    368 MiB of weights, its norms and 32 MiB of K/V: (8192 - 457 - 104) MiB holds 19 of them, the top ones, in
    4 trial loads (the all-GPU Fit, the 19-layer Fit that repeats, the Alloc, and the layout reported once
    more)."""
    import kvadvise.api as api

    graph = el.graph_stand_in(
        api.load_model(str(qwen3_path)), num_ctx=8192, num_parallel=1, batch=512, flash_attention=True,
        kv_cache_type="",
    )  # fmt: skip
    assert graph == GRAPH
    lay = el.ollama_server_load(
        legacy_model(read_header(qwen3_path)), _cuda(8 * GIB), version="0.13.0", num_ctx=8192, graph_bytes=graph
    )
    assert lay.gpus[0].cache_bytes == 19 * 32 * MIB and lay.cpu.cache_bytes == 17 * 32 * MIB
    assert lay.gpu_layers == (GpuLayers("GPU-0", tuple(range(17, 36))),) and lay.loads == 4
    assert lay.log_line().endswith("GPULayers:19[ID:GPU-0 Layers:19(17..35)]")


def test_the_graph_stand_in_is_llama_cpps_with_one_output_row_per_slot(qwen3_path: Path) -> None:
    """reserveWorstCaseGraph reserves ``parallel`` output rows, not the batch's: the stand-in is kvadvise's
    llama.cpp compute buffer with n_outputs_max = slots; fs/ggml GraphSize, which reserves the whole batch's
    logits (vocab x batch x 4 bytes), is not what the Go engine allocates."""
    import kvadvise.api as api
    from kvadvise.planner.memory import RunConfig, estimate

    spec = api.load_model(str(qwen3_path))
    for parallel, fa, kv in ((1, True, ""), (2, True, "q8_0"), (1, False, "")):
        got = el.graph_stand_in(
            spec, num_ctx=4096, num_parallel=parallel, batch=512, flash_attention=fa, kv_cache_type=kv
        )
        t = GGMLType.Q8_0 if kv else GGMLType.F16
        cfg = RunConfig(
            n_ctx=4096 * parallel, n_parallel=parallel, n_batch=512, n_ubatch=512, type_k=t, type_v=t,
            flash_attn="on" if fa else "off", device="cuda", n_outputs_max=parallel, runtime="llama-server",
        )  # fmt: skip
        assert got == estimate(spec, cfg).devices[0].compute_bytes
        whole_batch = estimate(spec, RunConfig(**{**_fields(cfg), "n_outputs_max": 512})).devices[0].compute_bytes
        assert got < whole_batch  # the batch's logits: 151,936 x 512 x 4 bytes more rows


def _fields(cfg: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def test_refused_architectures_and_versions(qwen3_path: Path) -> None:
    model = legacy_model(read_header(qwen3_path))
    with pytest.raises(el.EngineLayoutNotModelled, match=r"0\.11\.11 to 0\.24"):
        el.ollama_server_load(model, _cuda(GIB), version="0.11.10", num_ctx=4096, graph_bytes=GRAPH)
    with pytest.raises(el.EngineLayoutNotModelled, match="chunked attention"):
        el.ollama_server_load(_model("llama4", 4, 0), _cuda(GIB), version="0.13.0", num_ctx=4096, graph_bytes=GRAPH)


def test_before_0_12_11_one_bisection_spreads_the_layers_over_every_gpu(qwen3_path: Path) -> None:
    """v0.12.7 - v0.12.10 run the same ollamaServer.Load, createLayout and ggml.go New as v0.12.11 but for
    findBestFit's ml.ByPerformance groups (and assignLayers' equal treatment of GPUs under num_gpu), both v0.12.11's:
    on discrete GPUs the three lay a qwen3:8b-shaped f16 model out alike (13 blocks on 6 GiB; 24 on 6 + 5 GiB), while
    beside an integrated GPU v0.12.11 fills the discrete one with the top blocks first and v0.12.10's single
    bisection fills from the last GPU of the sorted list, the integrated one (34 blocks either way)."""
    model = legacy_model(read_header(qwen3_path))
    discrete = [LayoutGpu("GPU-0", "CUDA0", "CUDA", 6 * GIB), LayoutGpu("GPU-1", "CUDA1", "CUDA", 5 * GIB)]
    for gpus, n in ((discrete[:1], 13), (discrete, 24)):
        lays = [
            el.ollama_server_load(model, gpus, version=v, num_ctx=8192, graph_bytes=GRAPH).gpu_layers
            for v in ("0.12.7", "0.12.10", "0.12.11")
        ]
        assert lays[0] == lays[1] == lays[2] and sum(len(g.layers) for g in lays[0]) == n
    mixed = [discrete[0], LayoutGpu("GPU-1", "CUDA1", "CUDA", 9 * GIB, integrated=True)]
    old, new = (
        {g.device_id: g.layers for g in el.ollama_server_load(model, mixed, version=v, num_ctx=8192,
                                                              graph_bytes=GRAPH).gpu_layers}
        for v in ("0.12.10", "0.12.11")
    )  # fmt: skip
    assert old == {"GPU-0": tuple(range(2, 15)), "GPU-1": tuple(range(15, 36))}
    assert new == {"GPU-0": tuple(range(23, 36)), "GPU-1": tuple(range(2, 23))}


def test_kvadvise_ollama_prints_the_go_engines_decision(
    gemma3_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama gemma3:4b --ollama-version 0.13.0`: the Go engine's layout in ollama.decision, its
    approximation said, no num_gpu (the plan is llama.cpp's library, not the Go engine's allocation)."""
    from ollama_fake import build_store, closed_port_url

    build_store(tmp_path / "models", gemma3_path, hashlib.sha256(gemma3_path.read_bytes()).hexdigest(),
                model="gemma3", tag="4b")  # fmt: skip
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc = main(["ollama", "gemma3:4b", "--ctx", "8192", "--vram", "6GiB", "--ollama-version", "0.13.0", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)["ollama"]
    d = doc["decision"]
    assert doc["release"]["runner"] == "ollamarunner"
    assert d["layers_by"] == "llm/server.go createLayout over the Go runner's trial allocations"
    assert d["approximation"] == el.APPROXIMATION and d["allocation_modelled"] is False and d["num_gpu"] is None
    assert d["layers_model"] == 35 and 0 < d["layers_offload"] < 35
    assert f"GPULayers:{d['layers_offload']}[ID:0 Layers:{d['layers_offload']}(" in d["log_line"]
    assert "num_gpu" not in doc["modelfile_parameters"]


def test_the_ram_check_counts_the_input_weights(gemma3_path: Path) -> None:
    """verifyLayout's cpuSize starts from memory.InputWeights (token_embd, always on the CPU): with no GPU
    room, a system with one byte less than every layer and the embeddings is refused."""
    from kvadvise.backends.ollama.layout import LayoutLoadRefused

    model = legacy_model(read_header(gemma3_path))
    lay = el.ollama_server_load(model, _cuda(0), version="0.13.0", num_ctx=8192, graph_bytes=GRAPH)
    needed = lay.cpu.weights_bytes + lay.cpu.cache_bytes
    kwargs: dict[str, Any] = {"version": "0.13.0", "num_ctx": 8192, "graph_bytes": GRAPH}
    assert el.ollama_server_load(model, _cuda(0), system_free_bytes=needed, **kwargs).layers_offload == 0
    with pytest.raises(LayoutLoadRefused, match="more system memory"):
        el.ollama_server_load(model, _cuda(0), system_free_bytes=needed - 1, **kwargs)


def test_with_no_gpu_the_graph_is_the_cpus(gemma3_path: Path) -> None:
    """With no GPU, Context.Reserve books the whole graph on the CPU backend: the CPU's "compute graph" line
    (tests/test_ollama_engine_published.py: 96.0 MiB logged by Ollama 0.16.1) and verifyLayout's cpuSize
    (memory.InputWeights + memory.CPU.Graph + the layers): one byte less than all three is refused. Beside a GPU
    the CPU's share is not modelled (0)."""
    from kvadvise.backends.ollama.layout import LayoutLoadRefused

    model = legacy_model(read_header(gemma3_path))
    kwargs: dict[str, Any] = {"version": "0.13.0", "num_ctx": 8192, "graph_bytes": GRAPH}
    lay = el.ollama_server_load(model, [], **kwargs)
    assert (lay.layers_offload, lay.cpu.graph_bytes) == (0, GRAPH)
    assert lay.memory_lines()[-1] == 'msg="compute graph" device=CPU size="104.0 MiB"'
    needed = lay.cpu.weights_bytes + lay.cpu.cache_bytes + GRAPH
    assert el.ollama_server_load(model, [], system_free_bytes=needed, **kwargs).layers_offload == 0
    with pytest.raises(LayoutLoadRefused, match="more system memory"):
        el.ollama_server_load(model, [], system_free_bytes=needed - 1, **kwargs)
    assert el.ollama_server_load(model, _cuda(0), **kwargs).cpu.graph_bytes == 0


@pytest.mark.parametrize(
    ("free_a", "free_b", "expected"), [(6, 4, (13, 8)), (10, 10, (19, 18)), (16, 2, (37,))]
)  # fmt: skip
def test_two_gpus_each_within_its_free_memory(
    qwen3_path: Path, free_a: int, free_b: int, expected: tuple[int, ...]
) -> None:
    """Two CUDA GPUs (qwen3:8b-shaped f16, 8k): a block and its K/V weigh 400 MiB, so (6144 - 457 - 104) MiB
    holds 13 and (4096 - 457 - 104) MiB 8, the lower blocks on the first GPU; 10 + 10 GiB hold all 37 layers
    over both; 16 GiB alone holds them all, so the second GPU is not used (as few GPUs as hold every layer).
    Each GPU in use holds the graph and no more than its free memory less 457 MiB."""
    gpus = [LayoutGpu("GPU-a", "CUDA0", "CUDA", free_a * GIB), LayoutGpu("GPU-b", "CUDA1", "CUDA", free_b * GIB)]
    model = legacy_model(read_header(qwen3_path))
    lay = el.ollama_server_load(model, gpus, version="0.13.0", num_ctx=8192, graph_bytes=GRAPH)
    assert tuple(len(g.layers) for g in lay.gpu_layers) == expected
    assert [g.device_id for g in lay.gpu_layers] == ["GPU-a", "GPU-b"][: len(expected)]
    placed = [i for g in lay.gpu_layers for i in g.layers]
    assert placed == list(range(placed[0], placed[0] + len(placed)))  # contiguous, GPU-a below GPU-b
    for d, g in zip(lay.gpus, gpus, strict=True):
        used = any(gl.device_id == g.device_id for gl in lay.gpu_layers)
        assert d.graph_bytes == (GRAPH if used else 0)
        assert d.weights_bytes + d.cache_bytes + d.graph_bytes <= g.free_bytes - 457 * MIB


def test_the_library_gpt_oss_profile_gets_the_go_engines_decision(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt-oss:20b from its built-in profile (Ollama's gptoss conversion, the Go engine): its layout is replayed
    (from 0.11.11, tests/test_ollama_decision.py); all 25 layers on 15.6 GiB at 8k, part on 8 GiB, the top blocks
    first."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    layers = {}
    for vram in ("15.6GiB", "8GiB"):
        rc = main(["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", vram, "--ollama-version", "0.13.0", "--json"])
        d = json.loads(capsys.readouterr().out)["ollama"]["decision"]
        assert rc == 0 and d["layers_by"].endswith("trial allocations") and d["num_gpu"] is None
        layers[vram] = d["layers_offload"]
        assert d["layers_model"] == 25
    assert layers["15.6GiB"] == 25 and 0 < layers["8GiB"] < 24


def test_a_graph_larger_than_the_room_explores_the_intermediate_layouts(qwen3_path: Path) -> None:
    """3.5 GiB free and a 3 GiB graph: with the graph no block fits ((3584 - 457 - 3072) MiB), so the next
    trial has no layer, reports no graph, and 7 blocks fit: more than the last layout, so ollamaServer.Load
    forces 6, 5, ... 0 layers, each reported with the graph again, and keeps the first that a new layout
    over its report does not undercut: 0. Fit: the all-GPU trial, the empty one, 7 forced; Alloc: the empty
    one and 7 forced again (the past layouts were cleared); then the final report: 18 loads, nothing on the
    GPU."""
    model = legacy_model(read_header(qwen3_path))
    lay = el.ollama_server_load(model, _cuda(3584 * MIB), version="0.13.0", num_ctx=8192, graph_bytes=3072 * MIB)
    assert (lay.layers_offload, lay.loads, lay.gpus[0].graph_bytes) == (0, 18, 0)
    lay = el.ollama_server_load(model, _cuda(4000 * MIB), version="0.13.0", num_ctx=8192, graph_bytes=3072 * MIB)
    assert (lay.layers_offload, lay.loads) == (1, 4)  # (4000 - 457 - 3072) MiB: one 400 MiB block


def test_tensor_routing_as_ggml_go_new() -> None:
    """ggml.go New's switch, by a dotted part of the name: the input tables on the CPU (token_embd, once more
    as the output layer's output.weight when there is no output tensor); output, output_norm, cls, the
    per-layer tables and every vision (v., mm., s.) tensor in the output layer; rope_freqs in every block;
    a block's tensors by the first number in the name (blk.3.attn_output is a block's, not the output's);
    anything else on the CPU."""
    f32 = 0
    names = [
        "token_embd.weight", "position_embd.weight", "output_norm.weight", "cls.weight", "per_layer_token_embd.weight",
        "v.blk.0.attn_q.weight", "mm.input_projection.weight", "s.position_embd.weight", "rope_freqs.weight",
        "blk.3.attn_output.weight", "blk.0.ffn_up.weight", "tied_extra.weight",
    ]  # fmt: skip
    tensors = tuple(LegacyTensor(n, (32,), f32) for n in names)
    model = LegacyModel("gemma3", 4, 32, (1,), (1,), 32, 32, 10, 128, tensors)
    layer_of: dict[str, list[int]] = {}
    for p in el.place_tensors(model):
        layer_of.setdefault(p.tensor.name, []).append(p.layer)
    assert layer_of == {
        "token_embd.weight": [-1, 4], "position_embd.weight": [-1], "output_norm.weight": [4], "cls.weight": [4],
        "per_layer_token_embd.weight": [4], "v.blk.0.attn_q.weight": [4], "mm.input_projection.weight": [4],
        "s.position_embd.weight": [-1], "rope_freqs.weight": [0, 1, 2, 3], "blk.3.attn_output.weight": [3],
        "blk.0.ffn_up.weight": [0], "tied_extra.weight": [-1],
    }  # fmt: skip
    with_output = LegacyModel(
        "gemma3", 4, 32, (1,), (1,), 32, 32, 10, 128, (*tensors, LegacyTensor("output.weight", (32,), f32))
    )
    assert [p.layer for p in el.place_tensors(with_output) if p.tensor.name == "token_embd.weight"] == [-1]
