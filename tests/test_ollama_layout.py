"""Ollama's layout of the llamarunner (v0.12.11 - v0.24: llm/server.go llamaServer.Load, createLayout):
Ollama's own llm/server_test.go cases, and published server logs (tests/data/published/ollama-layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama import layout
from kvadvise.backends.ollama.estimate_legacy import legacy_model
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
    without the output layer: 9 blocks (19..27) from the last one down; llama.cpp's allocation fits 7 layers
    at the 0.12.11 - 0.13.2 pin (b6840) and 8 at the later pins, so num_gpu holds the load to that."""
    doc = _plan(capsys, "--ollama-version", version, "--vram", "6GiB")
    d = doc["decision"]
    planned = 7 if version in ("0.12.11", "0.13.0") else 8
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
