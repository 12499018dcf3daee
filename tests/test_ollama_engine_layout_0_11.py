"""Ollama's Go engine (ollamarunner) layout at 0.11.11 - 0.12.6 (kvadvise.backends.ollama.engine_layout), against the
same replay at 0.12.7 (tests/test_ollama_engine_layout.py) and the Go source of each tag.

ollamaServer.Load's trial loop, ggml.go New's weights and the models' caches read the same from v0.11.11 to v0.12.7;
what changes a layout before v0.12.7, each gate at its tag: GPU discovery's MinimumMemory per device (v0.11.11 -
v0.12.3 discover/gpu.go and gpu_darwin.go: CUDA, ROCm 457 MiB, Metal 512; v0.12.4 - v0.12.6 discover/gpu.go
devInfoToInfoList: CUDA and ROCm 457 MiB, Metal and Vulkan 0), discover's ByFreeMemory (free memory alone, no
integrated GPUs apart), createLayout's early return (num_gpu 0 or no GPU: no layout and no RAM check), assignLayers'
forced request under a required full load (to v0.12.5), Causal.Init's sliding window (to v0.12.3: no extra cell per
slot, a window of exactly num_ctx kept), NewLlamaServer's flash attention (to v0.12.3: on for a model that wants it
whatever OLLAMA_FLASH_ATTENTION says). The shapes are real models' (tests/tinymodels.py, header only)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama import engine_layout as el
from kvadvise.backends.ollama import estimate_legacy, layout
from kvadvise.backends.ollama.estimate_legacy import LegacyModel, legacy_model
from kvadvise.backends.ollama.layout import GpuLayers, LayoutGpu, LayoutLoadRefused
from kvadvise.cli import main
from kvadvise.model.ggml import GGMLType

MIB, GIB = 1024**2, 1024**3
MIRROR = Path("/work/.mirror/ollama+ollama/repo")  # a bare clone with every tag (skipped where absent)
mirror = pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no ollama/ollama mirror here")
OLD = ("0.11.11", "0.12.0", "0.12.3", "0.12.4", "0.12.5", "0.12.6")  # each server.go / discover/ text of the range

# gemma3:4b's text model, qwen3:8b (their config.json), gpt-oss:20b (MXFP4 experts, tests/oracle.py REAL_SIZES)
GEMMA3_4B = {"n_layer": 34, "n_embd": 2560, "n_head": 8, "n_head_kv": 4, "head": 256, "n_ff": 10240, "n_swa": 1024}
QWEN3_8B = {"n_layer": 36, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "head": 128, "n_ff": 12288}
GPT_OSS_20B = {"n_layer": 24, "n_embd": 2880, "n_head": 64, "n_head_kv": 8, "head": 64, "n_swa": 128, "n_expert": 32,
               "n_expert_used": 4, "n_ff_exp": 2880}  # fmt: skip
# graph_stand_in at num_ctx 8192, batch 512, flash attention, f16 (1 and 4 slots alike): the tests pass it as is
GRAPH = {"gemma3": 84 * MIB, "qwen3": 104 * MIB, "gpt-oss": 95 * MIB}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LegacyModel]:
    from tinymodels import write_tiny_gguf

    tmp = tmp_path_factory.mktemp("engine011")
    mxfp4 = {k: GGMLQuantizationType.MXFP4 for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
    paths = {
        "gemma3": write_tiny_gguf(tmp / "g.gguf", "gemma3", n_vocab=262144, n_ctx_train=131072, dims=GEMMA3_4B,
                                  sparse=True),
        "qwen3": write_tiny_gguf(tmp / "q.gguf", "qwen3", n_vocab=151936, n_ctx_train=40960, dims=QWEN3_8B, sparse=True),
        "gpt-oss": write_tiny_gguf(tmp / "o.gguf", "gpt-oss", n_vocab=201088, n_ctx_train=131072, dims=GPT_OSS_20B,
                                   sparse=True, qtypes=mxfp4),
    }  # fmt: skip
    return {name: legacy_model(read_header(p)) for name, p in paths.items()}


def _gpu(free: int, library: str = "CUDA", i: int = 0, integrated: bool = False) -> LayoutGpu:
    return LayoutGpu(f"GPU-{i}", f"{library}{i}", library, free, integrated)


def _load(model: LegacyModel, gpus: Sequence[LayoutGpu], version: str, **kw: Any) -> el.EngineLayout:
    kw.setdefault("graph_bytes", GRAPH.get(model.architecture, GRAPH["qwen3"]))
    return el.ollama_server_load(model, gpus, version=version, num_ctx=8192, **kw)


def _layer_bytes(model: LegacyModel, cells: Sequence[int], library: str = "CUDA") -> list[int]:
    """Each layer's weights and K/V on a GPU of ``library`` (ggml.go New, Causal.Init's ``cells``)."""
    n = model.block_count + 1
    rep = el.runner_report(
        model, [_gpu(1 << 50, library)], (GpuLayers("GPU-0", tuple(range(n))),), cells=cells,
        cache_dtype=GGMLType.F16, graph_bytes=0,
    ).memory  # fmt: skip
    return [w + c for w, c in zip(rep.gpu_weights[0], rep.gpu_cache[0], strict=True)]


def _v(version: str) -> tuple[int, int, int]:
    return estimate_legacy.parse_version(version)


def _greedy(layer_bytes: Sequence[int], rooms: Sequence[int]) -> int:
    """assignLayers over GPUs of ``rooms`` (the sorted order) at capacity 1, independent of the port: greedyFit from
    the last layer down onto the last GPU, moving to the one before when a layer does not fit, never back; every
    layer, else once more without the output layer. The layers placed."""
    placed = 0
    for layers in (layer_bytes, layer_bytes[:-1]):
        free, d, placed = list(rooms), len(rooms) - 1, 0
        for size in reversed(layers):
            while d >= 0 and size > free[d]:
                d -= 1
            if d < 0:
                break
            free[d] -= size
            placed += 1
        if placed == len(layers):
            return placed
    return placed


def _top_blocks(layer_bytes: Sequence[int], room: int) -> int:
    """One GPU's assignLayers, independent of the port: every layer when all fit ``room``, else the top blocks up to
    the first that does not (greedyFit from the last layer down, the output layer dropped)."""
    if sum(layer_bytes) <= room:
        return len(layer_bytes)
    used, k = 0, 0
    for size in reversed(layer_bytes[:-1]):
        if used + size > room:
            break
        used, k = used + size, k + 1
    return k


# ------------------------------------------------------------------------------------------------ the gates


@pytest.mark.parametrize(
    ("library", "mib"),
    [
        # v0.11.11 .. v0.12.3 .. v0.12.4 .. v0.12.6, v0.12.7 (ml.DeviceInfo.MinimumMemory())
        ("CUDA", (457, 457, 457, 457, 457)),
        ("ROCm", (457, 457, 457, 457, 457)),
        ("Metal", (512, 512, 0, 0, 512)),  # devInfoToInfoList sets it for CUDA and ROCm alone
        ("Vulkan", (0, 0, 0, 0, 457)),
    ],
)
def test_minimum_memory_is_gpu_discoverys_per_device_before_0_12_7(library: str, mib: tuple[int, ...]) -> None:
    got = tuple(
        _gpu(8 * GIB, library).minimum_bytes_at(_v(v)) // MIB
        for v in ("0.11.11", "0.12.3", "0.12.4", "0.12.6", "0.12.7")
    )
    assert got == mib
    assert layout.available_bytes([_gpu(8 * GIB, library)], 0, (0, 12, 5)) == (8 * GIB - mib[2] * MIB,)


@pytest.mark.parametrize(
    ("arch", "num_ctx", "parallel", "version", "expected"),
    [
        # to v0.12.3: no extra cell per slot past the window, 2 x 1024 + 512; v0.12.4: 2 x 1025 + 512 -> 2816
        ("gemma3", 8192, 2, "0.12.3", (2560,) * 5 + (16384,)),
        ("gemma3", 8192, 2, "0.12.4", (2816,) * 5 + (16384,)),
        ("gemma3", 8192, 4, "0.11.11", (4608,) * 5 + (32768,)),
        ("gemma3", 8192, 4, "0.12.6", (4864,) * 5 + (32768,)),
        # a window of exactly num_ctx: kept (window + batch) to v0.12.3, the whole context from v0.12.4
        ("gemma3", 1024, 1, "0.12.3", (1536,) * 5 + (1024,)),
        ("gemma3", 1024, 1, "0.12.4", (1024,) * 6),
        ("gptoss", 4096, 1, "0.12.0", (4608, 4096) * 3),
        ("gptoss", 4096, 1, "0.12.5", (4096, 4096) * 3),
        # gpt-oss keeps 4096 tokens, far past its 128-token window: the extra cell changes nothing
        ("gptoss", 8192, 4, "0.12.3", (16896, 32768) * 3),
        ("gptoss", 8192, 4, "0.12.4", (16896, 32768) * 3),
    ],
)
def test_causal_init_before_0_12_4(
    arch: str, num_ctx: int, parallel: int, version: str, expected: tuple[int, ...]
) -> None:
    model = LegacyModel(
        arch, 6, 256, (4,), (2,), 64, 64, 1000, 131072, (), sliding_window=1024 if arch == "gemma3" else 128
    )
    v = _v(version)
    assert el.cache_cells(model, num_ctx, parallel, min(512, num_ctx), True, v) == expected


# ----------------------------------------------------------------- one 16 GB GPU and two 8 GB GPUs, CUDA


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "gpt-oss"])
@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("free_gib", [15, 6])
def test_one_cuda_gpu_as_its_trial_loop(
    models: dict[str, LegacyModel], name: str, parallel: int, free_gib: int
) -> None:
    """One CUDA GPU (15 GiB free: a 16 GB card; 6 GiB), num_ctx 8192, 1 and 4 slots: every release of the range puts on
    it what fits its free memory less 457 MiB (CUDA's MinimumMemory at every tag) and the graph: the whole model, or
    the top blocks (the output layer on the CPU). A model without a sliding-window cache at several slots is laid out
    as v0.12.7 lays it out."""
    model = models[name]
    free = free_gib * GIB
    for version in (*OLD, "0.12.7"):
        lay = _load(model, [_gpu(free)], version, num_parallel=parallel)
        sizes = _layer_bytes(model, lay.cache_cells)
        n = _top_blocks(sizes, free - 457 * MIB - GRAPH[name])
        assert lay.layers_offload == n, version
        if 0 < n < lay.total_layers:
            assert lay.gpu_layers == (GpuLayers("GPU-0", tuple(range(model.block_count - n, model.block_count))),)
        assert lay.available_bytes == (free - 457 * MIB,)
        if name != "gemma3" or parallel == 1:
            assert lay.gpu_layers == _load(model, [_gpu(free)], "0.12.7", num_parallel=parallel).gpu_layers


def test_gemma3_at_4_slots_keeps_one_block_more_before_0_12_4(models: dict[str, LegacyModel]) -> None:
    """gemma3:4b, 4 slots, 8k, f16 on 6 GiB free: a sliding-window layer of 4608 cells (4 x 1024 + 512) is 18 MiB of
    K/V to v0.12.3, of 4864 (4 x 1025 + 512, padded to 256) 19 MiB from v0.12.4; a block weighs 180 MiB, a global
    layer's K/V (32768 cells) 128 MiB. In 6144 - 457 - 84 = 5603 MiB the top 26 blocks fit at 198 MiB (5589 MiB), 25 at
    199 (5413 MiB; 26 would be 5611)."""
    model = models["gemma3"]
    old, new = (_load(model, [_gpu(6 * GIB)], v, num_parallel=4) for v in ("0.12.3", "0.12.4"))
    assert (old.cpu.cache_bytes + old.gpus[0].cache_bytes) // MIB == 29 * 18 + 5 * 128
    assert (new.cpu.cache_bytes + new.gpus[0].cache_bytes) // MIB == 29 * 19 + 5 * 128
    assert old.gpu_layers == (GpuLayers("GPU-0", tuple(range(8, 34))),)
    assert new.gpu_layers == (GpuLayers("GPU-0", tuple(range(9, 34))),)


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "gpt-oss"])
@pytest.mark.parametrize("parallel", [1, 4])
def test_two_cuda_gpus(models: dict[str, LegacyModel], name: str, parallel: int) -> None:
    """Two CUDA GPUs of 8 GiB free, 8k: as many layers as greedyFit places from the top onto the last GPU of the
    sorted list (free memory alike: the scheduler's order), then the first, each in its free memory less 457 MiB and
    the graph; the lower blocks on the first GPU; the same layout at every release of the range as at v0.12.7 but
    for gemma3's sliding-window cache at 4 slots (1 MiB a layer to v0.12.3)."""
    model = models[name]
    gpus = [_gpu(8 * GIB, i=0), _gpu(8 * GIB, i=1)]
    room = 8 * GIB - 457 * MIB - GRAPH[name]
    for version in OLD:
        lay = _load(model, gpus, version, num_parallel=parallel)
        sizes = _layer_bytes(model, lay.cache_cells)
        assert lay.layers_offload == _greedy(sizes, [room, room]), version
        placed = [i for g in lay.gpu_layers for i in g.layers]
        assert placed == list(range(placed[0], placed[0] + len(placed)))
        assert [g.device_id for g in lay.gpu_layers] == ["GPU-0", "GPU-1"]
        for d in lay.gpus:
            assert d.weights_bytes + d.cache_bytes <= room and d.graph_bytes == GRAPH[name]
        if name != "gemma3" or parallel == 1 or _v(version) >= el.SWA_STOP_TOKEN_FROM:
            assert lay.gpu_layers == _load(model, gpus, "0.12.7", num_parallel=parallel).gpu_layers, version


def test_qwen3_8b_at_4_slots_on_two_gpus(models: dict[str, LegacyModel]) -> None:
    """qwen3:8b, 4 slots, 8k: a block is 368 MiB of weights and 128 MiB of K/V (32768 cells), 496 MiB; each 8 GiB GPU
    holds 15 (7440 of 8192 - 457 - 104 = 7631 MiB): blocks 6..20 on the first, 21..35 on the second, 0..5 and the
    output layer on the CPU, from v0.11.11 as at v0.12.7."""
    for version in ("0.11.11", "0.12.6", "0.12.7"):
        lay = _load(models["qwen3"], [_gpu(8 * GIB, i=0), _gpu(8 * GIB, i=1)], version, num_parallel=4)
        assert lay.gpu_layers == (GpuLayers("GPU-0", tuple(range(6, 21))), GpuLayers("GPU-1", tuple(range(21, 36))))
        assert lay.log_line().endswith("GPULayers:30[ID:GPU-0 Layers:15(6..20) ID:GPU-1 Layers:15(21..35)]")


# ----------------------------------------------------------------------------- what differs before 0.12.7


def test_metal_has_no_minimum_at_0_12_4_to_0_12_6(models: dict[str, LegacyModel]) -> None:
    """qwen3:8b at 8k on a Metal GPU with 8 GiB free: 400 MiB a block; v0.12.7 (and v0.11.11 - v0.12.3, the old
    discovery's metalMinimumMemory) keep 512 MiB aside, 8192 - 512 - 104 = 7576 MiB: 18 blocks; v0.12.4 - v0.12.6's
    runner discovery gives Metal no MinimumMemory, 8088 MiB: 20 blocks."""
    model = models["qwen3"]
    sizes = _layer_bytes(model, (8192,) * 36, "Metal")
    counts = {}
    for version in (*OLD, "0.12.7"):
        lay = _load(model, [_gpu(8 * GIB, "Metal")], version)
        minimum = 0 if (0, 12, 4) <= _v(version) <= (0, 12, 6) else 512 * MIB
        assert lay.layers_offload == _top_blocks(sizes, 8 * GIB - minimum - GRAPH["qwen3"]), version
        assert lay.available_bytes == (8 * GIB - minimum,)
        counts[version] = lay.layers_offload
    assert counts == {"0.11.11": 18, "0.12.0": 18, "0.12.3": 18, "0.12.4": 20, "0.12.5": 20, "0.12.6": 20, "0.12.7": 18}


def test_an_integrated_gpu_is_sorted_by_its_free_memory_alone(models: dict[str, LegacyModel]) -> None:
    """discover's ByFreeMemory (to v0.12.6) compares free memory only: a discrete GPU of 6 GiB beside an integrated
    one of 9 GiB is laid out as if both were discrete (the integrated one first, most free; the top blocks from the
    last, the discrete one); v0.12.7's ml.ByFreeMemory sorts the integrated GPU last, so it takes the top blocks."""
    model = models["qwen3"]
    mixed = [_gpu(6 * GIB, i=0), _gpu(9 * GIB, i=1, integrated=True)]
    discrete = [_gpu(6 * GIB, i=0), _gpu(9 * GIB, i=1)]
    old = _load(model, mixed, "0.12.6")
    assert old.gpu_layers == _load(model, discrete, "0.12.6").gpu_layers
    assert {g.device_id: g.layers for g in old.gpu_layers} == {
        "GPU-1": tuple(range(2, 23)),
        "GPU-0": tuple(range(23, 36)),
    }
    new = {g.device_id: g.layers for g in _load(model, mixed, "0.12.7").gpu_layers}
    assert new == {"GPU-0": tuple(range(2, 15)), "GPU-1": tuple(range(15, 36))}


def test_no_gpu_or_num_gpu_0_skips_the_ram_check_before_0_12_7(models: dict[str, LegacyModel]) -> None:
    """createLayout to v0.12.6 returns an empty layout before any check when num_gpu is 0 or there is no GPU (the
    scheduler's lone "cpu" device): a system with 1 byte free is not refused there; from v0.12.7 verifyLayout runs
    on every layout and refuses it."""
    model = models["gemma3"]
    for gpus, num_gpu in (([], -1), ([_gpu(16 * GIB)], 0)):
        for version in OLD:
            lay = _load(model, gpus, version, num_gpu=num_gpu, system_free_bytes=1)
            assert (lay.layers_offload, lay.gpu_layers) == (0, ()), version
        with pytest.raises(LayoutLoadRefused, match="more system memory"):
            _load(model, gpus, "0.12.7", num_gpu=num_gpu, system_free_bytes=1)


def test_a_required_full_load_forces_num_gpu_before_0_12_6(models: dict[str, LegacyModel]) -> None:
    """num_gpu 14 of qwen3:8b (400 MiB a block) on 6 GiB free, the load required full (another model loaded): 13 fit
    (6144 - 457 - 104 = 5583 MiB). To v0.12.5 assignLayers forces the request on the last GPU anyway (findBestFit at
    1000 times the free memory) and verifyLayout accepts num_gpu layers; from v0.12.6 ("Perform eviction when
    num_gpu is set") it does not force under requireFull, so 13 < 14 asks the scheduler to evict."""
    model = models["qwen3"]
    for version in ("0.11.11", "0.12.5"):
        lay = _load(model, [_gpu(6 * GIB)], version, num_gpu=14, require_full=True)
        assert lay.gpu_layers == (GpuLayers("GPU-0", tuple(range(22, 36))),), version
    for version in ("0.12.6", "0.12.7"):
        with pytest.raises(LayoutLoadRefused, match="evicting"):
            _load(model, [_gpu(6 * GIB)], version, num_gpu=14, require_full=True)
    assert _load(model, [_gpu(6 * GIB)], "0.12.6", num_gpu=14).layers_offload == 14  # not required full: forced


def test_libraries_before_0_12_7(models: dict[str, LegacyModel]) -> None:
    """Vulkan comes with v0.12.6 (no MinimumMemory there: devInfoToInfoList); a library whose discovery before
    v0.12.7 is not ported (oneAPI: 95% of the free memory, no minimum) is refused; ROCm is CUDA's 457 MiB."""
    model = models["qwen3"]
    with pytest.raises(el.EngineLayoutNotModelled, match="no Vulkan backend"):
        _load(model, [_gpu(6 * GIB, "Vulkan")], "0.12.5")
    assert _load(model, [_gpu(6 * GIB, "Vulkan")], "0.12.6").available_bytes == (6 * GIB,)
    with pytest.raises(el.EngineLayoutNotModelled, match="SYCL"):
        _load(model, [_gpu(6 * GIB, "SYCL")], "0.12.3")
    assert _load(model, [_gpu(6 * GIB, "ROCm")], "0.12.3").available_bytes == (6 * GIB - 457 * MIB,)


def test_gpt_oss_keeps_flash_attention_before_0_12_4(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NewLlamaServer to v0.12.3: "fa := envconfig.FlashAttention(); if f.FlashAttention() { fa = true }": gpt-oss
    wants flash attention, so OLLAMA_FLASH_ATTENTION=0 leaves it on (the plan and the Go engine's cache padding of
    256); v0.12.4's envconfig.FlashAttention(f.FlashAttention()) turns it off. The layout is replayed at both."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    got = {}
    for version in ("0.12.3", "0.12.4"):
        args = ["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", "15.6GiB", "-fa", "off"]
        rc = main([*args, "--ollama-version", version, "--json"])
        doc = json.loads(capsys.readouterr().out)
        d = doc["ollama"]["decision"]
        assert rc == 0 and d["layers_by"].endswith("trial allocations") and d["layers_offload"] == 25
        got[version] = doc["config"]["flash_attn"]
    assert got == {"0.12.3": True, "0.12.4": False}


def test_0_11_10_and_earlier_are_not_this_layout(models: dict[str, LegacyModel]) -> None:
    with pytest.raises(el.EngineLayoutNotModelled, match=r"0\.11\.11 to 0\.24") as refused:
        _load(models["qwen3"], [_gpu(6 * GIB)], "0.11.10")
    assert "OLLAMA_NEW_ESTIMATES" in (refused.value.hint or "")


# --------------------------------------------------------------------------------- the source of each tag


def _show(tag: str, path: str) -> str:
    p = subprocess.run(["git", "-C", str(MIRROR), "show", f"{tag}:{path}"], capture_output=True, text=True)
    assert p.returncode == 0, f"{tag}:{path}"
    return p.stdout


@mirror
@pytest.mark.parametrize("version", [*OLD, "0.12.7"])
def test_the_gates_rest_on_each_tags_source(version: str) -> None:
    tag = f"v{version}"
    v = _v(version)
    server = _show(tag, "llm/server.go")
    device_info = v >= layout.DEVICE_INFO_FROM
    # MinimumMemory: a field GPU discovery sets, to v0.12.6; ml.DeviceInfo's method from v0.12.7
    assert ("+ gl[i].MinimumMemory +" in server) is not device_info
    assert ("+ gl[i].MinimumMemory() +" in server) is device_info
    if device_info:
        device = _show(tag, "ml/device.go")
        assert (
            'if d.Library == "Metal" {\n\t\treturn 512 * format.MebiByte\n\t}\n\treturn 457 * format.MebiByte' in device
        )
        assert "if a[i].Integrated && !a[j].Integrated {" in device  # ml.ByFreeMemory
    else:
        types = _show(tag, "discover/types.go")
        assert "func (a ByFreeMemory) Less(i, j int) bool { return a[i].FreeMemory < a[j].FreeMemory }" in types
        gpu, darwin = _show(tag, "discover/gpu.go"), _show(tag, "discover/gpu_darwin.go")
        runners = v >= estimate_legacy.RUNNER_DISCOVERY_FROM
        assert "metalMinimumMemory = 512 * format.MebiByte" in darwin
        assert ("info.MinimumMemory = metalMinimumMemory" in darwin) is not runners
        if runners:  # devInfoToInfoList: CUDA and ROCm only
            assert (
                'if dev.Library == "CUDA" || dev.Library == "ROCm" {\n\t\t\tinfo.MinimumMemory = 457 * format.MebiByte'
                in gpu
            )
        else:
            assert (
                "cudaMinimumMemory = 457 * format.MebiByte" in gpu
                and "rocmMinimumMemory = 457 * format.MebiByte" in gpu
            )
            assert "gpuInfo.MinimumMemory = cudaMinimumMemory" in gpu
            assert "MinimumMemory: rocmMinimumMemory" in _show(tag, "discover/amd_linux.go")
    # createLayout's early return, to v0.12.6
    early = "if s.totalLayers == 0 || s.options.NumGPU == 0 || len(systemGPUs) == 0 ||"
    assert (early in server) is (v < el.VERIFY_ALWAYS_FROM)
    # assignLayers' forced request
    forced = "forceRequest := i == len(gpus)-1 && !requireFull" in server
    assert forced is (v >= layout.FORCE_UNLESS_FULL_FROM)
    assert forced or "forceRequest := i == len(gpus)-1\n" in server
    # NewLlamaServer's flash attention
    from kvadvise.backends.ollama.versions import FA_OVERRIDE_FROM

    assert ("fa := envconfig.FlashAttention(f.FlashAttention())" in server) is (v >= FA_OVERRIDE_FROM)
    # Causal.Init's sliding window
    causal = _show(tag, "kvcache/causal.go")
    assert ("c.swaMemorySize = max(c.swaMemorySize, c.swaWindowSize+1)" in causal) is (v >= el.SWA_STOP_TOKEN_FROM)
    assert ("if int(c.swaMemorySize) > capacity {" in causal) is (v < el.SWA_STOP_TOKEN_FROM)
    # what the replay takes as unchanged from v0.11.11 to v0.12.7: the trial loop, the weights' sizes, the cache's
    # padding and size, the caches of gpt-oss and gemma3, the vision tensors in the output layer
    assert "if _, ok := pastAllocations[newGPULayers.Hash()]; !ok && newGPULayers.Sum() <= gpuLayers.Sum() {" in server
    assert 'slog.Debug("exploring intermediate layers", "layer", i)' in server
    assert "for operation := LoadOperationFit; operation < LoadOperationCommit; operation++ {" in server
    assert "cpuSize := memory.InputWeights" in server and "if requireFull {" in server
    assert "return &ollamaServer{llmServer: s}, nil" in server
    ggml = _show(tag, "ml/backend/ggml/ggml.go")
    assert "size := pad(C.ggml_backend_buft_get_alloc_size(bt, tt), C.ggml_backend_buft_get_alignment(bt))" in ggml
    assert 'case strings.HasPrefix(t.Name, "v.") || strings.HasPrefix(t.Name, "mm."):' in ggml
    assert "CachePadding: 256, MaskDType: ml.DTypeF16" in ggml and "CachePadding: 32, PermutedV: true" in ggml
    assert "cacheSize = (maxSequences * int(c.swaMemorySize)) + maxBatch" in causal
    assert "cache.Init(model.Backend(), kvCacheTypeFromStr(kvCacheType), numSlots, int(numCtx), batchSize)" in _show(
        tag, "runner/ollamarunner/cache.go"
    )
    assert 'kvcache.NewSWAMemCache(int32(c.Uint("attention.sliding_window")), 4096, m.Shift)' in _show(
        tag, "model/models/gptoss/model.go"
    )
    assert "gemmaGlobalCacheCount = 6" in _show(tag, "model/models/gemma3/model_text.go")
