"""Compute buffers when a device runs only part of the model and does not op-offload the rest (issue 37): the
routed experts of some layers in host memory (--n-cpu-moe N), or only the output layer on the device (-ngl 1).

llama.cpp's own allocation pass (llama-fit-params b11312, no allocation) on a loopback RPC device (ggml-rpc has no
offload_op, so what stays on the CPU runs in CPU splits): the small qwen3next of benchmarks/bench_fit.py, whose
device buffer grows from 9.07 MiB at full offload to 12-13 MiB with --n-cpu-moe 1-4 (the plans that were 1 MiB
over the budget), and Qwen3.5-35B-A3B's shape (qwen3next with its dimensions, a 32,000-token vocabulary so that
the layers and not the logits make the peak). kvadvise's plan (its full-offload figure and
kvadvise.planner.host_experts.host_experts_device_growth; the output phase alone for -ngl 1) must never be below what
llama.cpp reserves, and within 16 MiB or 3 % of it (Qwen3.5-35B-A3B's shape at n_ubatch 2048: 26-42 MiB over).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import pytest
from tinymodels import write_tiny_gguf

from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.compute import device_compute_bytes
from kvadvise.planner.host_experts import host_experts_device_growth
from kvadvise.planner.memory import RunConfig, output_layer_compute_bytes, resolve

MIB = 1 << 20
SMALL = {"n_layer": 8, "n_embd": 512, "n_expert": 16, "n_ff_exp": 256, "n_ff_shexp": 256}  # bench_fit's qwen3next
QWEN35_A3B = dict(  # Qwen3.5-35B-A3B's config.json (tests/data/hf/qwen3.5-35b-a3b.json) as a qwen3next
    n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head=256, n_rot=64, n_ff=5120, n_expert=256, n_expert_used=8,
    n_ff_exp=512, n_ff_shexp=512, d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32,
)  # fmt: skip
# (model, n_ctx, n_ubatch, cache type, --n-cpu-moe values): the small model and one dimension of it changed at a
# time (what moves the peak: rows of n_embd, the routed experts' width and count, the shared expert's width)
CASES = (
    ("small", 4096, 512, GGMLType.F16, (1, 2, 4, 7)),
    ("small", 4096, 2048, GGMLType.F16, (1, 2)),
    ("small", 16384, 512, GGMLType.F16, (1, 2, 5)),
    ("small-n_embd-1024", 4096, 512, GGMLType.F16, (1, 2)),
    ("small-n_expert_used-4", 4096, 2048, GGMLType.F16, (1, 2)),
    ("small-n_ff_exp-1024", 4096, 512, GGMLType.F16, (1, 2)),
    ("small-n_ff_shexp-1024", 4096, 2048, GGMLType.F16, (1, 2)),
    ("a3b", 65536, 512, GGMLType.Q8_0, (1, 2, 40)),
    ("a3b", 65536, 2048, GGMLType.Q8_0, (1, 40)),
)


@cache
def _model(name: str, root: str) -> Path:
    path = Path(root) / f"{name}.gguf"
    if name.startswith("small"):
        dims = dict(SMALL)
        if name != "small":
            key, value = name.removeprefix("small-").rsplit("-", 1)
            dims[key] = int(value)
        return write_tiny_gguf(path, "qwen3next", n_ctx_train=32768, dims=dims, sparse=True)
    return write_tiny_gguf(path, "qwen3next", n_vocab=32000, n_ctx_train=262144, dims=QWEN35_A3B, sparse=True)


def _device_mib(binary: Path, model: Path, args: list[str], endpoint: str) -> float:
    from kvadvise.runtime.dryrun import HOST, parse

    cmd = [str(binary), "-m", str(model), "-fitp", "on", "-v", "--rpc", endpoint, "-fit", "off", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    rows = {row.name: row.compute_mib for row in parse(p.stdout, p.stderr) if row.name != HOST}
    assert p.returncode == 0 and len(rows) == 1, (p.stdout + p.stderr)[-2000:]
    return next(iter(rows.values()))


def _close(predicted: int, measured_mib: float) -> bool:
    return abs(predicted - measured_mib * MIB) <= max(16 * MIB, 0.03 * measured_mib * MIB)


@pytest.mark.llama
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-ub{c[2]}")
def test_experts_in_host_memory_grow_the_device_buffer_as_planned(
    case: tuple[str, int, int, GGMLType, tuple[int, ...]], fit_params: Path, rpc_endpoint: str, tmp_path: Path
) -> None:
    name, n_ctx, ub, kv, n_cpu_moe = case
    model = _model(name, str(tmp_path))
    spec = from_gguf(read_file(model))
    cfg = RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), type_k=kv, type_v=kv, flash_attn="on",
                    device="rpc", runtime="library")  # fmt: skip
    lay = resolve(spec, cfg)
    planned = device_compute_bytes(spec, lay) + host_experts_device_growth(spec, lay)
    args = ["-c", str(n_ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-fa", "on", "-np", "1", "-ngl", "99"]
    args += ["-ctk", kv.type_name, "-ctv", kv.type_name]
    full = _device_mib(fit_params, model, args, rpc_endpoint)
    grown = [_device_mib(fit_params, model, [*args, "--n-cpu-moe", str(n)], rpc_endpoint) for n in n_cpu_moe]
    assert max(grown) > full  # the growth the rule is for
    for n, measured in zip(n_cpu_moe, grown, strict=True):
        assert planned >= measured * MIB, (n, planned / MIB, measured)  # never under: a plan stays in its budget
        # at n_ubatch 2048 the bound is 26 MiB (4.6 %) over on Qwen3.5-35B-A3B's shape (586 vs 560.4 MiB, 544.4 with
        # all 40 layers' experts in RAM): a known miss, the safe way
        assert _close(planned, measured) or (name == "a3b" and planned - measured * MIB <= 42 * MIB), (n, planned / MIB)


@pytest.mark.llama
def test_the_output_layer_alone_reserves_its_own_phase(fit_params: Path, rpc_endpoint: str, tmp_path: Path) -> None:
    """-ngl 1 (bench_fit's Gemma 3 at 16k: --fit placed it, kvadvise charged the full offload's 32 MiB): the device
    reserves the logits and the rows that make them, not the layers' peak."""
    model = _model("small", str(tmp_path))
    spec = from_gguf(read_file(model))
    for n_ctx in (4096, 16384):
        lay = resolve(spec, RunConfig(n_ctx=n_ctx, flash_attn="on", device="rpc", runtime="library"))
        args = ["-c", str(n_ctx), "-fa", "on", "-np", "1", "-ngl", "1"]
        measured = _device_mib(fit_params, model, args, rpc_endpoint)
        planned = output_layer_compute_bytes(spec, lay)
        assert planned >= measured * MIB and _close(planned, measured), (n_ctx, planned / MIB, measured)
        assert planned < device_compute_bytes(spec, lay)


@pytest.mark.llama
def test_a_plan_with_n_cpu_moe_on_an_rpc_device(fit_params: Path, rpc_endpoint: str, tmp_path: Path) -> None:
    """``kvadvise llamacpp --rpc EP=SIZE --n-cpu-moe N``: the RPC device does not op-offload (before: op offload's
    copy of an expert weight was planned on it), its compute buffer is planned with the boundaries' growth, at or
    above what llama.cpp reserves and within 16 MiB or 3 %."""
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout

    from kvadvise.cli import main

    model = _model("small", str(tmp_path))
    for n in (1, 2, 4):
        out = io.StringIO()
        argv = ["llamacpp", str(model), "--rpc", f"{rpc_endpoint}=1GiB", "--margin", "0", "--n-cpu-moe", str(n)]
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            assert main([*argv, "--ctx", "4096", "--llama-build", "b11312", "--json"]) == 0
        doc = json.loads(out.getvalue())
        planned = doc["memory"]["devices"][0]["compute_bytes"]
        notes = " ".join(doc["notes"])
        assert "CPU splits" in notes and "op offload" in notes and "copy of the largest" not in notes
        args = ["-c", "4096", "-fa", "on", "-np", "1", "-ngl", "99", "--n-cpu-moe", str(n)]
        measured = _device_mib(fit_params, model, args, rpc_endpoint)
        assert planned >= measured * MIB and _close(planned, measured), (n, planned / MIB, measured)


# gpt-oss-20b's config.json (openai/gpt-oss-20b: hidden 2880, 64 heads of 64, 8 KV heads, 32 experts, 4 used,
# intermediate 2880, sliding window 128) in 8 blocks, the vocabulary small so that the blocks make the peak
GPT_OSS_20B = dict(n_layer=8, n_embd=2880, n_head=64, n_head_kv=8, head=64, n_expert=32, n_expert_used=4,
                   n_ff_exp=2880, n_swa=128)  # fmt: skip


@pytest.mark.llama
@pytest.mark.parametrize("ub", [512, 2048])
def test_gpt_oss_blocks_after_host_experts_hold_one_more_experts_output(
    ub: int, fit_params: Path, rpc_endpoint: str, tmp_path: Path
) -> None:
    """gpt-oss's routed experts carry biases (ggml_add_id, src/models/openai-moe.cpp): with --n-cpu-moe 3 the device's
    later blocks, which run their own experts, reserve one [n_embd, n_expert_used, n_ubatch] f32 more than the full
    offload (llama-fit-params b11312: 510.04 MiB at -ub 2048 where the full offload is 420.08; 126.01 and 103.52 at
    -ub 512). With every expert in host memory the device runs no expert at all (240.04 at -ub 2048)."""
    model = write_tiny_gguf(tmp_path / "gpt-oss-20b.gguf", "gpt-oss", n_vocab=8000, n_ctx_train=131072,
                            dims=GPT_OSS_20B, sparse=True)  # fmt: skip
    spec = from_gguf(read_file(model))
    lay = resolve(spec, RunConfig(n_ctx=16384, n_ubatch=ub, n_batch=2048, flash_attn="on", device="rpc",
                                  runtime="library"))  # fmt: skip
    args = ["-c", "16384", "-ub", str(ub), "-b", "2048", "-fa", "on", "-np", "1", "-ngl", "99"]
    full = _device_mib(fit_params, model, args, rpc_endpoint)
    grown = _device_mib(fit_params, model, [*args, "--n-cpu-moe", "3"], rpc_endpoint)
    planned = device_compute_bytes(spec, lay) + host_experts_device_growth(spec, lay)
    assert grown > full + 20  # the growth the rule is for: one experts' output (22.5 MiB at -ub 512)
    assert planned >= grown * MIB and _close(planned, grown), (planned / MIB, grown)
    assert host_experts_device_growth(spec, lay, device_experts=False) == 0
