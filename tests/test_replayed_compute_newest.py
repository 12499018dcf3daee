"""The newest graph replayed (kvadvise.planner.llama_graph over planner.galloc) where the phases missed, checked
against llama-server b11312's own compute buffers on tiny sparse GGUFs of real shapes:

- **the CPU running every layer** (compute_bytes): the analytic phases missed a Q wider than n_embd (Ministral 3 3B:
  n_embd 3072, 32 heads of 128; 164.00 planned, 168.02 printed) and build_inp_embd's f32 "inp_embd" input, a graph
  input that shares the CPU's one buffer (LlamaShape.embd_select, builds.EMBD_SELECT);
- **a quantized cache** (builds.ATTN_ROT, ggml-org/llama.cpp#21038): Q, K, V and the attention's output go through
  a Hadamard matmul each, their outputs in the compute buffer (LlamaShape.k_rot / v_rot; Qwen3 of head 64 at q8_0
  on an RPC device: 158.02 replayed before, 166.05 printed);
- **an unknown build** (the newest rules) and a CUDA device plan the larger of the replay and the phases.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner import compute, memory

MIB = 1 << 20

SHAPES = {
    # Ministral 3 3B's widths (n_embd 3072, 32 heads of 128: Q wider than n_embd), as llama
    "ministral3-3b": ("llama", dict(n_layer=4, n_embd=3072, n_head=32, n_head_kv=8, head=128, n_ff=9216), 32000),
    # Qwen3-4B's n_embd and n_ff with heads of 64 (the rotation of a 64-wide head)
    "qwen3-h64": ("qwen3", dict(n_layer=4, n_embd=2560, n_head=32, n_head_kv=8, n_ff=9728), 151936),
    # Granite 3.x 2B's widths (heads of 64)
    "granite-2b": ("granite", dict(n_layer=4, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192), 49155),
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, (recipe, dims, vocab) in SHAPES.items():
        path = tmp_path_factory.mktemp("newest") / f"{name}.gguf"
        heads = (
            {"attention.key_length": dims["head"], "attention.value_length": dims["head"]} if "head" in dims else None
        )
        out[name] = write_tiny_gguf(path, recipe, dims=dims, sparse=True, n_vocab=vocab, extra_u32=heads)
    return out


@pytest.fixture(scope="module")
def one_device(real_llama_server: Path) -> Iterator[list[str]]:
    from llama_server_build import rpc_server
    from rpc_devices import devices

    with devices(rpc_server(), 1) as eps:
        yield eps


def _printed(server: Path, model: Path, args: list[str], endpoints: list[str]) -> list[float]:
    """The compute buffers llama-server prints, device first (MiB)."""
    from rpc_devices import run_server

    ngl = "99" if endpoints else "0"
    log = run_server(server, model, [*args, "-ngl", ngl, "--no-warmup", "--threads", "1"], endpoints)
    return [float(m) for m in re.findall(r"compute buffer size =\s+([\d.]+) MiB", log)]


def _planned(model: Path, args: list[str], endpoints: list[str], build: str | None = "b11312") -> list[float]:
    """kvadvise's compute buffers for the same run, device first (MiB)."""
    from kvadvise.cli import main

    where = [a for ep in endpoints for a in ("--rpc", f"{ep}=100GiB")] or ["--device", "cpu"]
    argv = ["llamacpp", str(model), *where, "--margin", "0", "--ram", "64GiB", "--json", *args]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main([*argv, *(["--llama-build", build] if build else [])])
    doc = json.loads(buf.getvalue())
    rows = [d["compute_bytes"] / MIB for d in doc["memory"]["devices"]]
    return rows + ([doc["memory"]["host"]["compute_bytes"] / MIB] if endpoints else [])


_Q8 = ["-ctk", "q8_0", "-ctv", "q8_0"]
_CPU = [
    # (model, flags, printed): llama-server b11312 with every layer on the CPU; kvadvise before: 164.00, 170.00
    # (UNDER 6.10), 170.00 (UNDER 6.05), 144.00 (8 over)
    ("ministral3-3b", ["-c", "8192", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on"], 168.02),
    ("ministral3-3b", ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on", *_Q8], 176.10),
    ("qwen3-h64", ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on", *_Q8], 176.05),
    ("granite-2b", ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on", *_Q8], 136.05),
    ("qwen3-h64", ["-c", "8192", "-np", "1", "-b", "2048", "-ub", "2048", "-fa", "off", "-ctk", "q4_0"], 2196.05),
]


@pytest.mark.llama
@pytest.mark.parametrize(("name", "flags", "printed"), _CPU, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_CPU)])
def test_cpu_running_every_layer(
    name: str, flags: list[str], printed: float, models: dict[str, Path], real_llama_server: Path
) -> None:
    assert _printed(real_llama_server, models[name], flags, []) == [printed]
    assert round(_planned(models[name], flags, [])[0], 2) == printed


_DEVICE = [
    # (model, flags, device printed): one RPC device; the replay before the rotation: 158.02 (UNDER 8.03), 136.02
    ("qwen3-h64", ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on", *_Q8], 166.05),
    ("granite-2b", ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "1024", "-fa", "on", *_Q8], 128.05),
    ("ministral3-3b", ["-c", "8192", "-np", "1", "-b", "512", "-ub", "512", "-fa", "on", "-ctk", "q4_0"], 74.07),
]


@pytest.mark.llama
@pytest.mark.parametrize(("name", "flags", "printed"), _DEVICE, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_DEVICE)])
def test_rotated_cache_on_a_device(
    name: str, flags: list[str], printed: float, models: dict[str, Path], real_llama_server: Path,
    one_device: list[str],
) -> None:  # fmt: skip
    device, host = _printed(real_llama_server, models[name], flags, one_device)
    assert device == printed
    planned = _planned(models[name], flags, one_device)
    assert round(planned[0], 2) == printed
    # the host's inputs, the rotations among them, to the 0.01 MiB ggml-alloc pads them to (never under by more)
    assert -0.02 <= planned[1] - host <= 0.02


def test_unknown_build_and_cuda_plan_the_larger(models: dict[str, Path]) -> None:
    """An unknown build (the newest rules) and a CUDA device take the larger of the replay and the phases: never
    below the replay, which is b11312's allocation (above), nor below the phases (Vulkan, planned as "cuda", reorders
    its graph)."""
    spec = from_gguf(read_file(models["ministral3-3b"]))
    for device, build in (("cuda", 11312), ("cuda", None), ("rpc", None), ("cpu", None)):
        cfg = memory.RunConfig(n_ctx=16384, n_parallel=2, n_ubatch=1024, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0,
                               flash_attn="on", device=device, llama_build=build)  # fmt: skip
        lay = memory.resolve(spec, cfg)
        exact = compute._exact_device_compute(spec, lay)
        assert exact is not None
        planned = compute.compute_bytes(spec, lay) if device == "cpu" else compute.device_compute_bytes(spec, lay)
        assert planned >= exact


def test_no_rotation_without_attention(tmp_path: Path) -> None:
    """llama_kv_cache rotates only where n_embd_head_k_all > 0: a Mamba-2 model (no attention, head 0) with a q8_0
    cache has none (a head of 0 once looped forever looking for the largest power of two dividing it)."""
    from kvadvise.planner.sizes import attn_rot

    model = write_tiny_gguf(tmp_path / "mamba2.gguf", "mamba2", dims={"n_layer": 2, "n_embd": 256}, sparse=True)
    spec = from_gguf(read_file(model))
    cfg = memory.RunConfig(n_ctx=4096, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0, flash_attn="on", device="cpu")
    assert spec.n_embd_head_k == 0
    assert attn_rot(spec, memory.resolve(spec, cfg)) == (0, 0)
    qwen3 = from_gguf(read_file(write_tiny_gguf(tmp_path / "q.gguf", "qwen3", dims={"n_embd": 1024, "n_head": 8})))
    assert qwen3.n_embd_head_k == 64
    assert attn_rot(qwen3, memory.resolve(qwen3, cfg)) == (64, 64)  # K's: the largest power of two from 64 dividing it
