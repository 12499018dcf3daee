"""AMX: on a CPU with AMX, llama.cpp's first extra buffer type takes a matmul's 2-D weights of its types and packs
them (ggml/src/ggml-cpu/amx/amx.cpp, mmq.cpp get_row_size; kvadvise.planner.repack amx_takes, amx_bytes); CPU_REPACK
then takes what its layouts fit of the rest. A tied model's output layer is a packed copy of token_embd.

Measured: llama-cpp-python 0.3.36's own llama.cpp (b11312; pip builds its wheel with -march=native, so with AMX on
such a CPU), loading only: its decode faults on some Sapphire Rapids machines (ggml-org/llama.cpp#20824), and the
rest of the suite runs it without AMX (tests/conftest.py _amx_off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.errors import InputError
from kvadvise.planner.memory import MIB, RunConfig, estimate
from kvadvise.planner.repack import CPU_ENV, cpu_isa, plan_repack
from kvadvise.runtime.llamalog import parse

DATA = Path(__file__).parent / "data" / "measured" / "amx_b11312.json"


def _has_amx() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return {"amx_tile", "amx_int8", "avx512_vnni"} <= set(flags)


def test_the_gemma_3_270m_load_measured_on_an_amx_cpu(gemma_path: Path) -> None:
    """The committed load (tests/data/measured/amx_b11312.json): 213.91 MiB of AMX, the tied output layer's q8_0
    copy of token_embd (262,144 x 640, 38 bytes a block of 32 packed: 190.0 MiB), q8_0 attn_v, q4_K attn_output and
    q4_K/q6_K ffn_down; the mapped file beside it whole (235.16 MiB: token_embd stays mapped for its get_rows).
    Without AMX, AVX-512's CPU_REPACK takes its q4_K matrices only (12.66 MiB: tests/test_repack.py measures it
    with the suite's llama-server), and no copy of the output layer (q8_0 has no x86 layout)."""
    doc = json.loads(DATA.read_text())
    spec = kvadvise.load_model(str(gemma_path))
    cfg = RunConfig(n_ctx=512, device="cpu", cpu_repack="amx")
    est = estimate(spec, cfg)
    assert round(est.amx_bytes / MIB, 2) == doc["mib"]["AMX"] == 213.91
    assert round((est.weights_bytes - est.repack_bytes) / MIB, 2) == doc["mib"]["CPU_Mapped"] == 235.16
    assert est.repack_bytes == est.amx_bytes  # nothing left for CPU_REPACK
    avx512 = estimate(spec, replace(cfg, cpu_repack="avx512"))
    assert avx512.amx_bytes == 0 and round(avx512.repack_bytes / MIB, 2) == 12.66


def test_amx_takes_2d_weights_and_leaves_experts_to_cpu_repack(tmp_path: Path) -> None:
    """The tiny Mixtral: AMX takes the q8_0 attention and the f16 output (2-D, rows a multiple of 32); the q4_0
    experts (3-D, MUL_MAT_ID) go to CPU_REPACK as on any AVX-512 CPU; token_embd (get_rows) stays mapped."""
    spec = kvadvise.load_model(str(write_tiny_gguf(tmp_path / "mixtral.gguf", "mixtral", n_vocab=32000)))
    amx, avx512 = plan_repack(spec, "amx"), plan_repack(spec, "avx512")
    assert amx.amx_bytes > 0
    assert amx.repack_bytes - amx.amx_bytes == avx512.repack_bytes  # the experts, as without AMX
    experts = sum(w.n_bytes for w in spec.matmul_weights if w.experts and w.type_name == "q4_0")
    assert avx512.repack_bytes >= experts > 0
    q8 = [w for w in spec.matmul_weights if not w.experts and w.type_name == "q8_0"]
    assert q8 and all(w.ne1 % 32 == 0 for w in q8)
    # q8_0 packed: 4 bytes more per block of 32 (the compensation); f16 as it is
    packed_q8 = sum(w.n_bytes + w.ne1 * w.ne0 // 32 * 4 for w in q8)
    f16 = sum(w.n_bytes for w in spec.matmul_weights if w.type_name == "f16")
    assert amx.amx_bytes == pytest.approx(packed_q8 + f16, abs=32 * len(spec.matmul_weights))


@pytest.mark.llama
@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX")
@pytest.mark.parametrize("name", ["gemma-3-270m", "mixtral"])
def test_llama_cpp_with_amx_allocates_what_the_plan_says(name: str, gemma_path: Path, tmp_path: Path) -> None:
    """llama-cpp-python with AMX (the shim the suite preloads taken out of this one child): its AMX, CPU_REPACK and
    mapped buffers, to the 0.01 MiB it prints, against the plan for this CPU without the suite's KVADVISE_CPU."""
    path = gemma_path if name == "gemma-3-270m" else write_tiny_gguf(tmp_path / "m.gguf", "mixtral", n_vocab=32000)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", CPU_ENV)}
    code = "import sys\nfrom llama_cpp import Llama\nLlama(model_path=sys.argv[1], n_gpu_layers=0, n_ctx=512)\n"
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = parse(run.stderr.splitlines())

    def mib(buft: str) -> float:
        return sum(b.mib for b in got.buffers if b.buft == buft and b.kind == "model")

    old = os.environ.pop(CPU_ENV, None)
    try:
        assert cpu_isa() == "amx"
    finally:
        if old is not None:
            os.environ[CPU_ENV] = old
    est = estimate(kvadvise.load_model(str(path)), RunConfig(n_ctx=512, device="cpu", cpu_repack="amx"))
    assert mib("AMX") == pytest.approx(est.amx_bytes / MIB, abs=0.01), run.stderr[-2000:]
    assert mib("CPU_REPACK") == pytest.approx((est.repack_bytes - est.amx_bytes) / MIB, abs=0.01)
    assert mib("CPU_Mapped") == pytest.approx((est.weights_bytes - est.repack_bytes) / MIB, abs=0.01)


def test_kvadvise_cpu_names_the_cpu_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """KVADVISE_CPU: the CPU a CPU plan's extra buffers are for (avx512 for an AMX CPU whose llama.cpp was built
    without AMX); a name kvadvise does not know is a one-line error, not a guess."""
    monkeypatch.setenv(CPU_ENV, "AVX2")
    assert cpu_isa() == "avx2"
    monkeypatch.setenv(CPU_ENV, "amx")
    assert cpu_isa() == "amx"
    for bad in ("sapphire", "auto", "off"):
        monkeypatch.setenv(CPU_ENV, bad)
        with pytest.raises(InputError, match="KVADVISE_CPU"):
            cpu_isa()


def test_the_dry_run_of_an_amx_build_agrees_row_by_row(gemma_path: Path) -> None:
    """`verify llamacpp --dry-run --device cpu` against a llama-fit-params built with AMX (committed: its table
    and log, tests/data/measured/amx_b11312.json): its Host line counts the CPU buffer's tensors (211 MiB: every
    tensor but the ones AMX took, at their own sizes), and an AMX line of its own (213); kvadvise's rows match both
    to the MiB, and its note names AMX, not CPU_REPACK."""
    from kvadvise.runtime import dryrun

    doc = json.loads(DATA.read_text())["dry_run"]
    projected = dryrun.parse(doc["stdout"], "\n".join(doc["stderr_lines"]) + "\n" + doc["stdout"])
    spec = kvadvise.load_model(str(gemma_path))
    est = estimate(spec, RunConfig(n_ctx=4096, device="cpu", flash_attn="on", runtime="library", cpu_repack="amx"))
    rows = dryrun.compare(spec, est, projected)
    assert [r.name for r in rows] == ["CPU", "AMX"] and all(r.ok for r in rows), rows
    note = dryrun.model_note(spec, est)
    assert note is not None and "213.91 MiB of AMX" in note and "CPU_REPACK" not in note
