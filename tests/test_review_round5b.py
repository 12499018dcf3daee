"""Review round 5b (the change 085dab1..691d990: pipeline parallelism, AMX, the Go engine's layout from 0.11.11):
one test per defect found, each of which failed there and is fixed since, each against llama.cpp's source
(b11312, the llama-cpp-python 0.3.36 vendor) or a run of its tools."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from ollama_fake import closed_port_url
from tinymodels import write_tiny_gguf

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.budget import plan_budget
from kvadvise.planner.fitsplit import fit_split
from kvadvise.planner.hardware import manual_many
from kvadvise.planner.memory import RunConfig, estimate

MIB = 1 << 20


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))


# Llama 3.1 8B's shape, Q4_K_M's tensor types (a sparse GGUF: the header only)
_LLAMA_8B = {"n_layer": 32, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "head": 128, "n_ff": 14336}
_Q4_K_M = {
    "attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K, "ffn_gate": Q.Q4_K,
    "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q4_K, "output": Q.Q6_K,
}  # fmt: skip


def test_fit_split_fills_the_last_device_as_llama_fit_measures_it_without_pipeline_parallelism(
    tmp_path: Path,
) -> None:
    """fit_split (kvadvise.planner.fitsplit: "filled back to front as llama.cpp's fit fills them") probes each
    device d with the layers not placed yet on device 0, a full offload, so pipeline parallelism's four copies of
    the split inputs are in device d's compute buffer. llama.cpp's fit probes device d with the devices before it
    holding nothing (common/fit.cpp set_ngl_tensor_split_tbo, l.552-556: n_gpu_layers = the sum of the devices'
    layers; the fill loop l.671-723 leaves ngl_per_device[0..d-1] at 0): a partial offload, which llama_context
    never pipelines (src/llama-context.cpp l.430-435, ``n_gpu_layers() > n_layer_all``). Measured with
    llama-fit-params b11312 over two loopback rpc-servers (24105 MiB free each), this model, ``-c 8192 -fa on
    -np 1 -fitt 1024,21105`` (budgets 23081 and 3000 MiB): its probe of RPC1 with 15 layers logs "sched copies =
    1", 2972 MiB (<= 3000), and it prints ``-ts 18,15``. kvadvise's probe of 15 layers is pipelined, 3076.6 MiB
    (unpipelined 2980.5), so it returns (19, 14): another split than the --fit it says it replays (and that
    Ollama >= 0.30's llama-server --fit, given no -ts, would pick)."""
    path = write_tiny_gguf(
        tmp_path / "llama-8b.gguf", "llama", n_vocab=128256, n_ctx_train=131072, sparse=True,
        dims=_LLAMA_8B, qtypes=_Q4_K_M,
    )  # fmt: skip
    spec = from_gguf(read_file(path))
    budget = plan_budget(manual_many([24105 * MIB, 4024 * MIB]), 1024 * MIB)
    assert budget.device_budgets == (23081 * MIB, 3000 * MIB)
    # llama-fit-params reserves the whole batch's logits (n_outputs_max 0); RPC devices have no context overhead
    cfg = RunConfig(
        n_ctx=8192, flash_attn="on", device="rpc", tensor_split=(1.0, 1.0), n_outputs_max=0, overhead_bytes=0
    )
    assert fit_split(spec, cfg, budget, as_run=False) == (18.0, 15.0)  # llama.cpp's fill (Ollama's --fit)
    # the split kvadvise writes as -ts runs pipelined: 18,15 leaves RPC1 over its 3000 MiB once the split's inputs are
    # copied, so the fill is redone on the plan as it runs (fitsplit.fit_split)
    run_split = fit_split(spec, cfg, budget)
    assert run_split == (19.0, 14.0) and budget.fits(estimate(spec, replace(cfg, tensor_split=run_split)))


def test_dry_run_keeps_token_embd_in_the_cpu_buffer_when_its_tied_output_copy_is_repacked(tmp_path: Path) -> None:
    """``kvadvise verify llamacpp MODEL --dry-run --device cpu`` on an AVX-512 CPU (KVADVISE_CPU=avx512), a Gemma 3
    whose token_embd is q4_0 and tied: exit 3, "CPU  0 / 18  <- differs: model -17.98". The change made the tied
    output layer a MatmulWeight of its own (kvadvise.model.architecture._matmul_weights, tied=True), which CPU_REPACK
    takes (llama-model-loader.cpp create_tensor l.1371-1376: the TENSOR_DUPLICATED output is a new tensor in
    CPU_REPACK's context; token_embd itself stays in CPU for its GET_ROWS), so est.repack_bytes counts the copy;
    but kvadvise.runtime.dryrun.cpu_buffer_bytes is ``spec.weights_bytes - est.repack_bytes`` ("less those
    repacked"): it takes token_embd out of the CPU buffer too (and, with AMX, the packed sizes, mmq.cpp
    get_row_size, not the tensors' own). llama-fit-params b11312 (``-c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 0
    -fitp on -v``) prints "Host 18 2 512" and "CPU_REPACK 18 = 18 + 0 + 0": token_embd in the Host's model, its
    copy in CPU_REPACK. At 085dab1 the CPU row agreed (18) and CPU_REPACK did not (0 / 18); now the reverse."""
    from kvadvise.planner.memory import estimate
    from kvadvise.runtime.dryrun import REPACK, Projected, compare

    qtypes = {n: Q.Q4_0 for n in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")}
    path = write_tiny_gguf(
        tmp_path / "gemma3-q4_0.gguf", "gemma3", n_vocab=262144, n_ctx_train=131072, sparse=True,
        qtypes={**qtypes, "ffn_down": Q.Q4_0},
    )  # fmt: skip
    spec = from_gguf(read_file(path))
    cfg = RunConfig(n_ctx=4096, flash_attn="on", device="cpu", cpu_repack="avx512", n_outputs_max=0)
    est = estimate(spec, cfg)
    measured = (Projected("Host", 18, 2, 512.50), Projected(REPACK, 18, 0, 0.0, in_table=False))
    rows = compare(spec, est, measured)
    assert [(r.name, r.ok) for r in rows] == [("CPU", True), (REPACK, True)], [r.differences for r in rows]


def test_min_ctx_hint_past_the_training_context_names_what_raises_it(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --vram 24GiB --min-ctx 64k -np 2`: exit 3. The hint once gave
    "--ctx 65536 plans that context as given" (per sequence it was half; then --ctx 131072): a context llama-server
    caps at the training context anyway (round 10b). It names what raises the cap: RoPE scaling and the
    context_length override, not a bare --ctx."""
    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--vram", "24GiB", "--min-ctx", "64k", "-np", "2")
    assert rc == 3, err
    assert "--override-kv gemma3.context_length=int:N" in err and "--ctx 1" not in err and "--ctx 6" not in err, err
