"""The oracle: kvadvise's memory model against real llama.cpp.

Every architecture kvadvise calls verified is built as a tiny random-weight
GGUF (tests/tinymodels.py) and loaded by llama.cpp (llama-cpp-python 0.3.36,
vendored llama.cpp 0c1e570) under a matrix of run configs, as is the real
Gemma 3 270M. KV, recurrent state, weights, output buffer and the resolved
context must match what llama.cpp prints to the 0.01 MiB it prints;
the compute buffer within 5% or 16 MiB. Configs llama.cpp refuses must be
refused by kvadvise too, and the other way round.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from oracle import Measured, check, describe, run_llama
from tinymodels import RECIPE_ARCH, RECIPES, write_tiny_gguf

from kvadvise.model.architecture import VERIFIED, from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import RunConfig

F16, Q8, Q4 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0

# Context sizes that are not multiples of 256, 1 to 4 sequences, unified or
# not, f16/q8_0/q4_0 and mixed K/V, flash attention on/off/auto, swa_full; logits
# reserved per sequence (llama-server, the default) or for the whole batch (n_outputs_max=0).
TINY_CONFIGS = (
    RunConfig(n_ctx=1000, type_k=F16, type_v=F16, flash_attn="on"),
    RunConfig(n_ctx=2048, n_parallel=4, type_k=Q8, type_v=Q8, flash_attn="on"),
    RunConfig(n_ctx=3000, type_k=Q4, type_v=F16, flash_attn="off"),
    RunConfig(n_ctx=1536, n_parallel=2, kv_unified=True, type_k=F16, type_v=Q8, flash_attn="auto"),
    RunConfig(n_ctx=4100, type_k=Q8, type_v=Q4, flash_attn="on", swa_full=True, n_batch=1024, n_ubatch=256),
    RunConfig(n_ctx=700, n_parallel=3, type_k=F16, type_v=F16, flash_attn="off", n_batch=512),
    RunConfig(n_ctx=2000, type_k=Q8, type_v=Q8, flash_attn="off"),  # quantized V without FA: refused
    RunConfig(n_ctx=1000, n_parallel=2, flash_attn="on", n_outputs_max=0),  # logits for the whole batch (the library)
)

TINY_VOCAB = 32000

GEMMA_CONFIGS = (
    RunConfig(n_ctx=4096, flash_attn="on"),
    RunConfig(n_ctx=10000, type_k=Q8, type_v=Q8, flash_attn="on"),  # padded to 10240
    RunConfig(n_ctx=4000, flash_attn="off"),
    RunConfig(n_ctx=8192, n_parallel=4, type_k=Q4, type_v=Q4, flash_attn="on"),
    RunConfig(n_ctx=2048, type_k=Q8, type_v=F16, flash_attn="off", swa_full=True),
    RunConfig(n_ctx=32768, n_parallel=2, kv_unified=True, flash_attn="auto"),
    RunConfig(n_ctx=6000, flash_attn="off", n_ubatch=128, n_batch=256),
    RunConfig(n_ctx=4096, flash_attn="on", n_outputs_max=0),  # as llama-cli / the library: 262k x 512 logits
    RunConfig(n_ctx=6000, flash_attn="off", n_ubatch=128, n_batch=256, n_outputs_max=0),
)


# Gemma 3n's per-layer embedding table is 256 x n_layer wide whatever the model's width (llama_hparams
# n_embd_altup): at 32,000 tokens it would be a 360 MB file
TINY_VOCAB_OF = {"gemma3n": 2048}


@cache
def _tiny(recipe: str, root: str) -> tuple[Path, list[Measured]]:
    # A real-size vocabulary, so that the logits dominate the compute buffer as they do in real models
    path = write_tiny_gguf(Path(root) / f"{recipe}.gguf", recipe, n_vocab=TINY_VOCAB_OF.get(recipe, TINY_VOCAB))
    return path, run_llama(path, list(TINY_CONFIGS))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("tiny"))


def test_every_verified_architecture_has_a_recipe() -> None:
    assert {RECIPE_ARCH[r] for r in RECIPES} >= VERIFIED


# Where a tiny model's compute buffer is not what kvadvise's rule is for, said and held (its KV, weights and
# context still match exactly; the rule is checked on real-size shapes by the allocation pass below)
TINY_COMPUTE_MISSES = {
    "gemma3n": "Gemma 3n's per-layer inputs have a fixed width (256 x n_layer per token), so in a 128-wide model "
    "they are nearly all of the compute buffer and ggml-alloc keeps about 3.8 times their size; the rule "
    "(1.5 times) is fitted to real-size shapes, where they are a tenth of it",
}


@pytest.mark.llama
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("i", range(len(TINY_CONFIGS)), ids=[describe(c) for c in TINY_CONFIGS])
def test_tiny_model_matches_llama_cpp(recipe: str, i: int, tiny_dir: str) -> None:
    path, measured = _tiny(recipe, tiny_dir)
    spec = from_gguf(read_file(path))
    assert spec.verified, spec.notes
    problems = check(recipe, spec, TINY_CONFIGS[i], measured[i])
    if recipe in TINY_COMPUTE_MISSES:  # everything but the compute buffer (as said), which may miss
        problems = [p for p in problems if not p.startswith("compute:")]
    assert problems == []


@cache
def _gemma(path: str) -> list[Measured]:
    return run_llama(Path(path), list(GEMMA_CONFIGS))


@pytest.mark.llama
@pytest.mark.parametrize("i", range(len(GEMMA_CONFIGS)), ids=[describe(c) for c in GEMMA_CONFIGS])
def test_gemma3_270m_matches_llama_cpp(i: int, gemma_path: Path) -> None:
    spec = from_gguf(read_file(gemma_path))
    assert check("gemma-3-270m Q4_K_M", spec, GEMMA_CONFIGS[i], _gemma(str(gemma_path))[i]) == []


# --- llama.cpp's own allocation pass on real-size layers (issue 25) ---------------------------------------
# llama-fit-params -fitp on: llama.cpp loads the model without allocating and reserves the context's graphs
# (common/fit.cpp), printing every compute buffer. Sparse GGUFs (tests/tinymodels.py, sparse=True) give
# real-size layers of every family at the cost of their headers. The CPU alone is one buffer; an rpc-server
# on loopback is a device: the device/host split, the split inputs and the per-device compute buffer of a GPU
# run, on the CPU (CUDA's own rules, its 128-byte alignment, FA kernels and op offload, are not: ggml-rpc
# runs the CPU backend and has no offload_op). Compared with kvadvise's plan for the same run: device and host
# compute within 16 MiB or 3 %.
DRY_CONFIGS = (
    ("rpc", 1024, RunConfig(n_ctx=32768, flash_attn="on", runtime="library")),  # masks of 32k cells, FA
    ("rpc", 1024, RunConfig(n_ctx=8192, flash_attn="off", runtime="library")),  # the scores without FA
    ("cpu", 1024, RunConfig(n_ctx=16384, n_parallel=4, flash_attn="on", runtime="library")),  # 4 streams
    ("rpc", 0, RunConfig(n_ctx=4096, flash_attn="on", runtime="library")),  # the published vocabulary: logits
)
# Where kvadvise's rule is known to miss by more than the tolerance, said and held (strict xfail)
# (Granite-4.0-H-Tiny's shape with the whole batch's logits and flash attention, 227.01 reserved and 202.00 planned,
# was held here until issue 37's round 26h: the last Mamba-2 block's feed-forward and rows under the logits,
# sizes._hybrid_output_rows)
DRY_MISSES: dict[tuple[str, int], str] = {}


@cache
def _sparse(recipe: str, vocab: int, root: str) -> Path:
    from oracle import REAL_SIZES, REAL_VOCAB

    n_vocab = vocab or REAL_VOCAB[recipe]
    path = Path(root) / f"{recipe}-{n_vocab}.gguf"
    if not path.exists():
        write_tiny_gguf(path, recipe, n_vocab=n_vocab, n_ctx_train=262144, dims=REAL_SIZES[recipe], sparse=True)
    return path


def _dry_cases() -> list[tuple[str, int]]:
    from oracle import REAL_VOCAB

    return [(r, i) for r in RECIPES for i, (_, vocab, _) in enumerate(DRY_CONFIGS) if vocab or r in REAL_VOCAB]


@pytest.mark.llama
@pytest.mark.parametrize(("recipe", "i"), _dry_cases(), ids=[f"{r}-{i}" for r, i in _dry_cases()])
def test_real_size_layers_match_llama_cpps_allocation_pass(
    recipe: str, i: int, tiny_dir: str, fit_params: Path, rpc_endpoint: str, request: pytest.FixtureRequest
) -> None:
    from oracle import dry_run, within

    from kvadvise.planner.memory import MIB, estimate

    where, vocab, base = DRY_CONFIGS[i]
    path = _sparse(recipe, vocab, tiny_dir)
    spec = from_gguf(read_file(path))
    if (recipe, i) in DRY_MISSES:
        request.applymarker(pytest.mark.xfail(reason=DRY_MISSES[recipe, i], strict=True))
    if where == "cpu":
        measured = dry_run(fit_params, path, base)
        est = estimate(spec, replace(base, device="cpu", cpu_repack="none"))
        assert within(est.compute_bytes, measured["CPU"]), (est.compute_bytes / MIB, measured)
        return
    measured = dry_run(fit_params, path, base, rpc=rpc_endpoint)
    (device,) = [k for k in measured if k.startswith("RPC")]
    est = estimate(spec, replace(base, device="rpc", device_names=(device,)))
    got = (est.devices[0].compute_bytes / MIB, est.host.compute_bytes / MIB)
    assert within(est.devices[0].compute_bytes, measured[device]), (got, measured)
    assert within(est.host.compute_bytes, measured.get("CPU", 0.0)), (got, measured)
