"""CPU_REPACK on real llama.cpp: a CPU run of a model with repackable matmul weights (the real Gemma 3
270M, Q4_K_M: its q4_K matrices; the tiny "mixtral": q4_0 experts) prints a ``CPU_REPACK model buffer``
beside ``CPU_Mapped``; kvadvise predicts both to the 0.01 MiB llama.cpp prints, with this machine's
repack rule, and the mapped buffer alone with ``--no-repack``. The resident memory of the server
says whether the copy is extra memory: its anonymous RSS grows by the repacked bytes, while the
mapped file stays resident as well (RssFile), so both count.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rpc_devices import run_server
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.planner.memory import RunConfig, estimate
from kvadvise.planner.repack import cpu_isa
from kvadvise.runtime.llamalog import parse

MIB = 1 << 20


def _rss(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmRSS"):
            out[key] = int(value.split()[0]) * 1024
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("repack-models")
    return {"mixtral": write_tiny_gguf(d / "mixtral.gguf", "mixtral", n_vocab=32000), "gemma-3-270m": gemma_path}


@pytest.mark.llama
@pytest.mark.parametrize("name", ["gemma-3-270m", "mixtral"])
def test_cpu_repack_buffers_and_rss(name: str, models: dict[str, Path], real_llama_server: Path) -> None:
    isa = cpu_isa()
    spec = kvadvise.load_model(str(models[name]))
    cfg = RunConfig(n_ctx=4096, device="cpu", flash_attn="on")
    runs = {}
    for repack in (True, False):
        rss: dict[str, int] = {}
        args = ["-c", "4096", "-np", "1", "-ngl", "0", "-fa", "on", *([] if repack else ["--no-repack"])]
        log = run_server(real_llama_server, models[name], args, [], on_ready=lambda pid, r=rss: r.update(_rss(pid)))
        got = parse(log.splitlines())
        assert "CPU_Mapped model buffer size" in log, log[-3000:]
        mapped = sum(b.mib for b in got.buffers if b.buft == "CPU_Mapped" and b.kind == "model")
        packed = sum(b.mib for b in got.buffers if b.buft == "CPU_REPACK" and b.kind == "model")
        est = estimate(spec, replace(cfg, cpu_repack=isa if repack else "none"))
        assert packed == pytest.approx(est.repack_bytes / MIB, abs=0.01), (name, repack, isa)
        assert mapped == pytest.approx((est.weights_bytes - est.repack_bytes) / MIB, abs=0.01), (name, repack)
        runs[repack] = (packed, rss)
        print(
            f"{name} repack={repack} ({isa}): CPU_Mapped {mapped:.2f} MiB, CPU_REPACK {packed:.2f} MiB "
            f"(predicted {est.repack_bytes / MIB:.2f}), RSS { ({k: round(v / MIB, 1) for k, v in rss.items()}) }"
        )
    packed, with_rss = runs[True]
    if isa == "none" or not with_rss:
        return
    assert packed > 0, f"{name}: this {isa} CPU repacks nothing"
    # the copy is extra anonymous memory; the mapped file stays resident beside it
    grow = with_rss["RssAnon"] - runs[False][1]["RssAnon"]
    assert abs(grow / MIB - packed) <= max(4.0, 0.1 * packed), (name, grow / MIB, packed)
    assert with_rss["RssFile"] >= 0.9 * spec.weights_bytes, (name, with_rss)


def test_repack_rules_by_cpu(tmp_path: Path) -> None:
    """Which matrices each CPU repacks (repack.cpp ggml_repack_get_optimal_repack_type), on the tiny MoE:
    q8_0 attention, q4_0 experts, a q8_0 token_embd (get_rows: never) and an f16 output."""
    from kvadvise.model.gguf import read_file
    from kvadvise.planner.repack import plan_repack

    path = write_tiny_gguf(tmp_path / "mixtral.gguf", "mixtral", n_vocab=32000)
    tensors = read_file(path).tensors
    spec = kvadvise.load_model(str(path))
    experts = [t for t in tensors if "_exps" in t.name]
    attention = [t for t in tensors if ".attn_" in t.name and t.ggml_type.type_name == "q8_0"]
    assert len(experts) == 6 and len(attention) == 8
    x86 = plan_repack(spec, "avx2")  # q4_0 only: the experts (3-D, MUL_MAT_ID)
    assert (x86.repack_bytes, x86.n_tensors) == (sum(t.n_bytes for t in experts), 6)
    # the experts of the last block end the file: the mapped span loses them
    last_kept = max(t.offset + t.n_bytes for t in tensors if t not in experts)
    assert x86.mapped_bytes == last_kept - min(t.offset for t in tensors)
    arm = plan_repack(spec, "arm-dotprod")  # and q8_0 matrices with rows % 4 == 0; never token_embd
    assert arm.repack_bytes == sum(t.n_bytes for t in experts + attention) and arm.n_tensors == 14
    assert plan_repack(spec, "none").repack_bytes == plan_repack(spec, "off").repack_bytes == 0
    assert plan_repack(spec, "none").mapped_bytes == spec.weights_bytes
