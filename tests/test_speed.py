"""The speed model (kvadvise.planner.speed, kvadvise.planner.prefill): decode and prompt processing against the
published measurements it was fitted on and those held out, and the plans that use it (kvadvise hf with MoE
and several GPUs, --n-cpu-moe, the CPU's share at a measured or given RAM bandwidth)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import llama_server_build  # at collection: its cache path is read before the tests' isolated home replaces it
import pytest
from click.testing import CliRunner

from kvadvise.backends.ollama.profiles import profiles
from kvadvise.cli import cli, main
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import cpuspeed, prefill, speed

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
QWEN3_CODER = ROOT / "tests" / "data" / "hf" / "qwen3-coder-30b.json"
GIB = 1 << 30


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_speed", ROOT / "benchmarks" / "bench_speed.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    return _bench()


def _json(args: list[str]) -> dict[str, Any]:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code in (0, 3), res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


# -- the data and the accuracy bars -----------------------------------------------------------------


def test_every_row_has_a_source_a_split_and_an_input(bench) -> None:  # type: ignore[no-untyped-def]
    doc = bench.load()
    assert len(bench.decode_rows(doc)) >= 140 and len(bench.prefill_rows(doc)) >= 70
    for r in doc["rows"]:
        assert r["source"] and r["source_date"], r["id"]
        assert r.get("decode_tps") or r.get("prompt_tps"), r["id"]
        assert bench.split_of(r) in bench.SPLITS and bench.input_kind(r) in bench.INPUTS, r["id"]
        assert r["gpu"] in bench.cards(doc) or r.get("bandwidth_gbs"), r["id"]
    held = [r for r in bench.decode_rows(doc) if bench.split_of(r) == "holdout"]
    assert len(held) >= 50
    assert {bench.input_kind(r) for r in held} == set(bench.INPUTS)  # each kind of input held out


def test_decode_accuracy_fit_and_held_out(bench) -> None:  # type: ignore[no-untyped-def]
    """Within ±25 %: 97 of the 106 fit rows; 53 of the 63 held-out rows (GGUF 12/19, config.json 33/33,
    profiles 8/11; issue 37 added the hybrid MoE rows and the GCN/CDNA rows: the F16 and BF16 files on gfx906 come out
    1.6x too slow at the GCN class, fitted on quantized files); before issue 25 a config.json counted every MoE expert
    (0.10-0.33x). Issue 37 (MoE low bits): the Qwen3.5-35B-A3B rows that name an early llama.cpp build are planned at
    it (speed.EARLY_BUILD_RECURRENT_S): the fit row on b8125 went from 1.25 to 1.06 (96 -> 97 fit rows) and the
    held-out IQ3_S row on b8125 from 1.50 to 1.16 (52 -> 53); the held-out UD-Q3_K_XL (RTX 3090) and APEX Nano
    (RTX 5070 Ti) rows name no build and stay 1.56 and 1.43 too fast. Issue 37 round 4 held out four hybrid rows beyond
    Qwen3.5 (501-504: Qwen3-Coder-Next on an A100-SXM4 at b10107, 1.57 and 1.54 too fast, and on a GB10, 1.24;
    Nemotron-3-Nano on a GB10, 1.41): 53/63 -> 54/67. The fixed time per layer scaled by the card's clock
    (speed.clock_factor): fit 97 -> 100 of 106 (Llama 2 7B on an A100 1.62 -> 1.23), held-out 54 -> 57 of 67 (the
    A100 hybrid rows 1.57 -> 0.98, the RTX 3090 UD-Q3_K_XL row 1.56 -> 1.25); a config.json's --quant counting the
    quantizer's fallback types for rows not a multiple of 256 (breakdown.fallback_surplus_bytes): Nemotron-3-Nano's
    Q4_K_M 18.0 -> 22.3 GiB, its GB10 row 1.41 -> 1.20 (58 of 67). The fallback costed from each tensor's own type
    (ffn_down's Q6_K -> Q8_0 in the use_more_bits layers of a Q4_K_M, output.weight Q6_K -> Q8_0): DeepSeek-Coder-V2-
    Lite Q4_K_M 10.33 -> 10.48 GB (its 64 experts' ffn_down rows are 1,408 wide), and the held-out M4 Pro row (116,
    llmfit) 0.752 -> 0.744, past the edge: 57 of 67. Held-out rows 505-509 (Qwen3.6/3.5-35B-A3B on one and two RTX 5060 Ti
    and an RTX 5080, llama-server): four within, the RTX 5080 Q3_K_S row (509, 1.46) not: 61 of 72. The CPU's
    sampling over the vocabulary counted where the row's figure holds it (llama-server, Ollama; speed.SAMPLING_S_PER_
    ENTRY, measured by benchmarks/bench_server_loop.py): fit 100 -> 101 (gpt-oss-20b on a 7900 XT through llama-server
    1.26 -> 1.16), held-out 61 -> 62 (APEX Nano 1.41 -> 1.22 in, the RTX 5080 row 1.46 -> 1.27 still out, an M4
    Pro llmfit row 0.78 -> 0.72 out, an Ollama M-series row 1.26 -> 1.18 in). The RTX 5080 row names no build but its
    results file is dated 2026-03-04: planned at its bound, b8201 (measurements.json llama_build, dated by its
    llama_build_source), it is 0.92, not 1.27, and every hybrid MoE row timed through llama-server is within: 63 of 72.
    No factor moved."""
    t = bench.decode_table(bench.load())
    fit = [x for r, x in t if bench.split_of(r) == "fit"]
    held = [(r, x) for r, x in t if bench.split_of(r) == "holdout"]
    assert bench.share_within(fit, 0.25) >= 101 / 106
    assert bench.share_within([x for _, x in held], 0.25) >= 63 / 72
    # the hybrid MoE rows timed through llama-server (issue 37): all within 25 %
    hybrid = {r["id"]: x for r, x in held if r["arch"] == "qwen35moe" and bench.times_sampling(r)}
    assert len(hybrid) >= 6 and {i for i, x in hybrid.items() if abs(x - 1) > 0.25} == set()
    config = [x for r, x in held if bench.input_kind(r) == "config"]
    assert bench.share_within(config, 0.25) >= 13 / 16


def test_prefill_accuracy_fit_and_held_out(bench) -> None:  # type: ignore[no-untyped-def]
    """Within ±30 %: 58 of the 66 fit rows, 18 of the 26 held-out rows, 76 of all 92 (83 %). Issue 37 added the Gated
    DeltaNet hybrids' rows (ids 401+: 4 fit, 12 held out; see test_hybrid_prefill_rows_fit_and_held_out): the rows before
    them keep 54 of 62 and 10 of 14; the held-out share is 18/26 since the four Qwen3-Coder-Next rows on an A100 miss."""
    t = bench.prefill_table(bench.load())
    everything = [x for _, x in t]
    assert bench.share_within(everything, 0.30) >= 0.80
    assert bench.share_within([x for r, x in t if bench.split_of(r) == "fit"], 0.30) >= 0.80
    assert bench.share_within([x for r, x in t if bench.split_of(r) == "holdout"], 0.30) >= 18 / 26
    before = [(r, x) for r, x in t if r["id"] < 400]
    assert sum(1 for r, x in before if bench.split_of(r) == "fit" and 0.7 <= x <= 1.3) >= 54
    assert sum(1 for r, x in before if bench.split_of(r) == "holdout" and 0.7 <= x <= 1.3) >= 10


def test_ranges_are_the_spread_of_the_rows(bench) -> None:  # type: ignore[no-untyped-def]
    doc = bench.load()
    rows = [
        x for r, x in bench.decode_table(doc) if bench.split_of(r) in ("fit", "holdout")
    ]  # sweeps: runs of their own
    assert bench.band_80(rows) == pytest.approx(speed.RANGE, abs=0.02)
    assert bench.band_80([x for _, x in bench.prefill_table(doc)]) == pytest.approx(prefill.PREFILL_RANGE, abs=0.02)


def test_every_gpu_profile_has_a_compute_figure_with_its_basis() -> None:
    from kvadvise.planner.gpus import load_profiles

    for p in load_profiles():
        assert p.fp16_tflops and 1 < p.fp16_tflops < 2000, p.id
        assert p.fp16_tflops_basis, p.id
    by_id = {p.id: p for p in load_profiles()}
    assert by_id["rtx-4090"].fp16_tflops == 330.3  # Ada whitepaper: FP16 tensor, FP16 accumulate, dense
    assert by_id["a100-80gb-sxm"].fp16_tflops == 312.0


# -- decode ------------------------------------------------------------------------------------------


def test_gpt_oss_ranks_above_llama_on_a_4090() -> None:
    """Published: gpt-oss-20b decodes more than half again as fast as llama3.1:8b on a 4090 (llama.cpp GGUFs with
    Q8_0 attention). Ollama's gpt-oss:20b keeps attention and the output in BF16 (14 GB), so it reads more per token:
    the estimate for the profile is still well ahead (the old one put it at 0.4x). The published figures are
    llama-bench's, which never samples: compared without the CPU's sampling time (speed.sampling_seconds), which
    narrows the gap for every runtime that samples (201,088 candidates against 128,256)."""
    gpu = [speed.Device("cuda", 1_008_000_000_000)]
    oss_spec, llama_spec = profiles()["gpt-oss:20b"].spec(), profiles()["llama3.1:8b"].spec()
    oss = speed.estimate(oss_spec, 4096, gpu)
    llama = speed.estimate(llama_spec, 4096, gpu)
    assert oss is not None and llama is not None

    def decode_s(est: speed.SpeedEstimate, spec: ModelSpec) -> float:
        return 1 / est.tokens_per_s - speed.sampling_seconds(spec)

    assert decode_s(llama, llama_spec) > 1.3 * decode_s(oss, oss_spec)
    assert oss.tokens_per_s > 1.2 * llama.tokens_per_s


def test_speed_falls_with_context_and_moe_reads_only_used_experts() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    reads = speed.weight_reads(spec)
    assert reads.moe and reads.experts == pytest.approx(spec.expert_bytes * 8 / 128, rel=1e-6)
    est = speed.estimate(spec, 65536, [speed.Device("cuda", 1_008_000_000_000)])
    assert est is not None and [c for c, _ in est.points] == [4096, 65536]
    assert est.points[0][1] > est.points[1][1]
    assert est.low < est.tokens_per_s < est.high
    assert "at 4k" in est.text() and "at 64k" in est.text()


def test_a_hybrids_recurrent_layers_cost_their_state_and_their_kernels(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: each Gated DeltaNet layer of Qwen3.5-35B-A3B reads and writes back its state (32 heads x 128 x 128
    f32 and the conv window: 2.2 MB) for every token and launches 61 kernels where an attention layer launches 43.
    Before, the RTX 5090's 214 t/s (llama-bench, b8870) was predicted at 252; with the rule, 204; with the card's
    2,407 MHz boost clock (the fixed time scales with it, speed.clock_factor), 198."""
    doc = bench.load()
    row = next(r for r in doc["rows"] if r["id"] == 157)
    spec = bench.row_spec(doc, row)
    reads = speed.weight_reads(spec)
    assert reads.recurrent_layers == 30 and reads.kernels == speed.LayerKernels(43, 61)
    assert reads.state == 2 * 4 * 30 * (4 * 6144 + 32 * 128 * 128)  # conv: (d_conv - 1) x 6144 channels
    assert reads.layer_units == pytest.approx(10 + 30 * 61 / 43)
    assert bench.decode_estimate(doc, row) == pytest.approx(row["decode_tps"], rel=0.08)
    plain = speed.Reads(reads.dense, reads.experts, reads.expert_layers, reads.n_layer, reads.moe)
    dev = bench.row_devices(doc, row, spec)
    assert speed.seconds_per_token(reads, 0, dev) > speed.seconds_per_token(plain, 0, dev) + 30 * 0.3 * 65e-6


def test_a_moes_routed_experts_at_low_bits_cost_what_a_dense_models_weights_do(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: one RTX 4090 decoding the same Qwen3.5-35B-A3B UD-Q3_K_XL and UD-Q4_K_XL files (and Qwen3.6's at
    b8820) at six llama.cpp builds (jiegec/kb, the "moe-sweep" rows). At each build the Q3_K file comes out as far
    from the measured as the Q4_K one (within 3 %; llama-bench's own spread is 1-2 %) with the dense sweeps' per-type
    cost alone: the batch-1 MUL_MAT_ID runs the dense mmvq kernel with the expert ids (ggml-cuda.cu
    ggml_cuda_mul_mat_id -> ggml_cuda_mul_mat_vec_q; mmvq.cu mul_mat_vec_q, channel_x = ids[channel_dst]), the same
    vec_dot per weight, so routed experts need no cost of their own."""
    import math

    doc = bench.load()
    groups: dict[str, list[float]] = {}
    for r, x in bench.decode_table(doc):
        if bench.split_of(r) == "moe-sweep":
            assert r["arch"] == "qwen35moe" and r["gpu"] == "rtx-4090" and r["llama_build"]
            assert 0.90 <= x <= 1.10, r["id"]
            groups.setdefault(r["sweep"], []).append(math.log(x))
    assert len(groups) == 7 and sum(len(v) for v in groups.values()) == 14
    assert all(len(v) == 2 and abs(v[0] - v[1]) < 0.03 for v in groups.values())


def test_early_llama_cpp_builds_decode_a_hybrid_moe_slower(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: the same files on the same RTX 4090 decode 1.4-1.6x slower at b8148-b8207 than at b8820 (116.5 and
    108.8 t/s vs 173.7 for UD-Q3_K_XL), by the same time per token at 3 and at 4 bits: the builds' fixed costs,
    fitted per Gated DeltaNet layer on those rows (speed.EARLY_BUILD_RECURRENT_S). A row run on such a build is
    planned at it; an unknown build is planned as the newest. The held-out IQ3_S row (RTX 5060 Ti, stock b8125),
    1.38x too fast at the newest build's cost (with llama-server's sampling), comes out 1.09x; the two held-out rows that name no build keep theirs."""
    doc = bench.load()
    rows = {r["id"]: r for r in doc["rows"]}
    spec = bench.row_spec(doc, rows[176])
    reads = speed.weight_reads(spec)
    assert reads.architecture == "qwen35moe" and reads.recurrent_layers == 30
    assert speed.early_build_seconds(reads, None) == speed.early_build_seconds(reads, 8720) == 0.0
    assert speed.early_build_seconds(reads, 8396) == pytest.approx(30 * speed.EARLY_BUILD_RECURRENT_S[8720])
    assert speed.early_build_seconds(reads, 8125) == pytest.approx(30 * sum(speed.EARLY_BUILD_RECURRENT_S.values()))
    dense = speed.weight_reads(bench.row_spec(doc, rows[157]))
    other = speed.Reads(dense.dense, 0, 0, 40, False, 0, 30, architecture="qwen35")
    assert speed.early_build_seconds(other, 8125) == 0.0  # measured on qwen35moe only
    # CUDA only: a Metal device takes no step
    gpu = speed.Device("metal", 800_000_000_000)
    assert speed.seconds_per_token(reads, 0, [gpu], llama_build=8125) == speed.seconds_per_token(reads, 0, [gpu])

    def ratio(row_id: int, build: int | None) -> float:
        r = dict(rows[row_id], llama_build=build, id=-row_id if build is None else row_id)
        return bench.decode_estimate(doc, r) / r["decode_tps"]

    for rid in (191, 193, 195, 197):  # before b8720: the newest build's cost is 1.25x too fast or more
        assert ratio(rid, None) > 1.25 and 0.95 <= ratio(rid, rows[rid]["llama_build"]) <= 1.05
    assert ratio(176, None) > 1.35 and 0.85 <= ratio(176, 8125) <= 1.2
    # the held-out Q3_K_S row (RTX 5080, Windows) names no build but is dated 2026-03-04: at most b8201, released
    # 2026-03-05 (its llama_build_source), before both steps: 1.27x too fast as the newest, 0.92 at its bound
    assert rows[509]["llama_build"] == 8201 and rows[509]["source_date"] == "2026-03-04"
    assert "345481" in rows[509]["llama_build_source"]
    assert ratio(509, None) > 1.25 and 0.85 <= ratio(509, 8201) <= 1.0
    # the held-out UD-Q3_K_XL (RTX 3090) and APEX Nano (RTX 5070 Ti) rows name no build: planned as the newest, the
    # 3090's comes to the edge of 25 % once its 1,695 MHz clock stretches the fixed time (1.56 before: 1.252; its
    # runner is not named, so no sampling is counted), the 5070 Ti's (2,452 MHz) was 1.41x too fast until
    # llama-server's sampling over 248,320 candidates was counted (speed.SAMPLING_S_PER_ENTRY): 1.22
    table = {r["id"]: x for r, x in bench.decode_table(doc)}
    assert "llama_build" not in rows[161] and "llama_build" not in rows[162]
    assert 1.15 < table[161] < 1.3 and 1.15 < table[162] < 1.25
    # a plan for an old build says so
    dev = bench.row_devices(doc, rows[176], spec)
    old, new = speed.estimate(spec, 4096, dev, llama_build=8125), speed.estimate(spec, 4096, dev)
    assert old is not None and new is not None and old.tokens_per_s < 0.8 * new.tokens_per_s
    assert "b8125 decodes this hybrid slower" in old.note and "b8125" not in new.note
    # a plan for an unknown build says what an older one would take (at the card's clock: the RTX 5060 Ti's 2,572 MHz)
    assert "planned for llama.cpp b8720 or later: a build before it decodes this hybrid up to 2.8 ms" in new.note
    assert "planned for" not in old.note and "0.98x the 2,520 MHz" in new.note


def test_a_card_given_by_its_size_is_timed_on_the_backend_given() -> None:
    """`--vram 24GiB --device vulkan`: the catalogue's cards of that size are timed on Vulkan (its factors), not
    each on its own backend; without --device each keeps its own (the RX 7900 XTX on ROCm, the others on CUDA)."""
    base = ["ollama", "llama3.1:8b", "--vram", "24GiB", "--ram", "64GiB", "--json"]
    own, vulkan = _json(base), _json([*base, "--device", "vulkan"])
    assert "(vulkan" not in own["speed_note"] and "(rocm" in own["speed_note"]  # the middle card: the RX 7900 XTX
    assert "(vulkan" in vulkan["speed_note"] and "(cuda" not in vulkan["speed_note"]
    assert "(rocm" not in vulkan["speed_note"]
    assert own["decode_tokens_per_s"] != vulkan["decode_tokens_per_s"]


def test_a_gcn_card_decodes_at_its_class_and_an_unknown_card_at_the_default(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: an MI50 (gfx906) under ROCm reads about a third of its HBM2 bandwidth, not RDNA's 70 %. Its profile
    names the class (speed_class "gcn"); a card given by --vram/--bandwidth takes it where its size and bandwidth are
    an MI50's, else keeps ROCm's default and says so. Fitted
    on three gfx906 rows (stock llama.cpp), held out: one gfx906 card at IQ3_XXS (llama.cpp#27962), the gfx906 fork
    of hipfire#126, and the MI100 (CDNA 1), which stays on ROCm's default class."""
    t = {r["id"]: (r, x) for r, x in bench.decode_table(bench.load())}
    gcn = [(r, x) for r, x in t.values() if bench._decode_class(r) == "rocm-gcn"]
    fit = [x for r, x in gcn if bench.split_of(r) == "fit"]
    assert len(fit) == 3 and all(0.85 <= x <= 1.15 for x in fit)
    held_quantized = [x for r, x in gcn if bench.split_of(r) == "holdout" and r["quant_key"] not in ("F16", "BF16")]
    assert len(held_quantized) == 2 and all(0.75 <= x <= 1.25 for x in held_quantized)
    mi100 = [x for r, x in t.values() if r["gpu"] == "mi100"]
    assert len(mi100) == 2 and all(0.75 <= x <= 1.25 for x in mi100)  # CDNA 1: ROCm's default carries
    by_default = speed.EFFICIENCY["rocm"]["dense"] / speed.EFFICIENCY["rocm-gcn"]["dense"]
    assert 1.8 <= by_default <= 2.4  # the 2x issue 37 reported

    card = _json(["ollama", "qwen3:14b", "--gpu", "mi50-32gb", "--json"])
    given = _json(["ollama", "qwen3:14b", "--vram", "32GiB", "--bandwidth", "1024", "--device", "rocm", "--json"])
    assert "(rocm, GCN class)" in card["speed_note"]
    # 32 GiB at 1,024 GB/s on ROCm is what the catalogue's MI50 32GB is: its class (entry._catalogue_class)
    assert "(rocm, GCN class)" in given["speed_note"] and given["decode_tokens_per_s"] == card["decode_tokens_per_s"]
    other = _json(["ollama", "qwen3:14b", "--vram", "24GiB", "--bandwidth", "960", "--device", "rocm", "--json"])
    assert "default class assumed" in other["speed_note"] and "GCN" in other["speed_note"]
    cuda = _json(["ollama", "qwen3:14b", "--vram", "32GiB", "--bandwidth", "1024", "--json"])  # CUDA's factors
    first = [d["decode_estimate"]["tokens_per_s"] for d in (card, cuda)]  # at 4k: the weights' reads dominate
    assert first[0] < 0.6 * first[1]
    vulkan = _json(["ollama", "qwen3:14b", "--gpu", "mi50-32gb", "--device", "vulkan", "--json"])
    assert "(vulkan)" in vulkan["speed_note"]  # no Vulkan class: the class is ROCm's


def test_low_bit_and_i_quant_weights_cost_more_than_their_bytes(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: a 2-3-bit K-quant or an i-quant costs its batch-1 matvec more per weight than its bytes (mmvq's
    unpacking, the i-quants' codebook grids). One model at several quants on one card (the "sweep" rows) comes out
    about equally far from the measured once that work is counted, where the low-bit rows were the fast outliers;
    the hybrid MoE rows at Q3_K/Q2_K (held out) move towards the measured."""
    import math

    doc = bench.load()
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for r in bench.decode_rows(doc):
        if r.get("sweep"):
            sweeps.setdefault(r["sweep"], []).append(r)
    assert len(sweeps) >= 3 and sum(len(v) for v in sweeps.values()) >= 12

    def spread() -> float:
        total = 0.0
        for rows in sweeps.values():
            xs = [math.log(bench.decode_estimate(doc, r) / r["decode_tps"]) for r in rows]
            total += sum((x - sum(xs) / len(xs)) ** 2 for x in xs)
        return total

    hybrid = [r for r in doc["rows"] if r["id"] in (161, 162)]
    with_cost = spread(), [bench.decode_estimate(doc, r) / r["decode_tps"] for r in hybrid]
    saved = dict(speed.DEQUANT_FLOPS_PER_WEIGHT)
    try:
        speed.DEQUANT_FLOPS_PER_WEIGHT.clear()
        bytes_only = spread(), [bench.decode_estimate(doc, r) / r["decode_tps"] for r in hybrid]
    finally:
        speed.DEQUANT_FLOPS_PER_WEIGHT.update(saved)
    assert with_cost[0] < 0.5 * bytes_only[0]
    assert all(1 < a < b for a, b in zip(with_cost[1], bytes_only[1], strict=True))
    # the type is the file type's default tensor type (llama-quant.cpp llama_ftype_get_default_type)
    from kvadvise.model.quants import default_type

    assert [default_type(q) for q in ("Q3_K_M", "Q2_K_S", "IQ2_M", "IQ3_XS", "MXFP4_MOE", "q4_K", "bf16")] == [
        "Q3_K",
        "Q2_K",
        "IQ2_S",
        "IQ3_S",
        "MXFP4",
        "Q4_K",
        "BF16",
    ]
    assert speed.dequant_flops("IQ2_XXS") == speed.dequant_flops("IQ3_XXS") > 0  # no row: the same grid lookup
    assert speed.dequant_flops("Q4_K") == speed.dequant_flops("MXFP4") == 0
    # the work is done at the card's compute: a card of unknown compute counts none of it
    reads = speed.weight_reads(bench.row_spec(doc, hybrid[0]))
    assert reads.weight_type == "Q3_K" and reads.n_weights > 0
    known = speed.Device("cuda", 936_000_000_000, flops_per_s=142e12)
    unknown = speed.Device("cuda", 936_000_000_000)
    extra = reads.n_weights * speed.dequant_flops("Q3_K") / 142e12
    assert speed.seconds_per_token(reads, 0, [known]) == pytest.approx(
        speed.seconds_per_token(reads, 0, [unknown]) + extra
    )


def test_a_hybrid_layer_costs_its_kinds_kernels() -> None:
    """Issue 37 round 4: every hybrid beyond Qwen counted a recurrent layer as an attention layer. Nemotron-3-Nano gives
    each mixer and each FFN a layer of its own (23 Mamba-2, 23 MoE, 6 attention; nemotron-h.cpp): 27, 23 and 10 kernels
    against 33 for an attention layer and its FFN, 36.7 blocks where it counted 52; granite-4.0-h-small (MoE, 36 Mamba-2
    of 40 layers) 50 against 35. A dense transformer keeps one block per layer."""
    from kvadvise.backends.hf import HFBackend

    nano = speed.weight_reads(profiles()["nemotron-3-nano:30b"].spec())
    assert (nano.recurrent_layers, nano.ffn_layers, nano.n_layer) == (23, 23, 52)
    assert nano.kernels == speed.LayerKernels(10, 27, 23)
    assert nano.layer_units == pytest.approx((6 * 10 + 23 * 27 + 23 * 23) / 33)
    granite = speed.weight_reads(
        HFBackend().load_spec(str(ROOT / "tests/data/hf/granite4-h-small.json"), quant="Q4_K_M")
    )
    assert granite.moe and granite.kernels == speed.DECODE_KERNELS[("granitehybrid", True)]
    assert granite.layer_units == pytest.approx(4 + 36 * 50 / 35)
    dense = speed.weight_reads(profiles()["qwen3:14b"].spec())
    assert dense.kernels is None and dense.layer_units == dense.n_layer


# recipe -> its DECODE_KERNELS key; the MoE layouts are tinymodels' count-only recipes (not in RECIPES)
_KERNEL_RECIPES = {
    "qwen35": ("qwen35", False),
    "qwen3next": ("qwen3next", True),
    "granitehybrid": ("granitehybrid", False),
    "granitehybrid-moe": ("granitehybrid", True),
    "lfm2": ("lfm2", False),
    "lfm2moe": ("lfm2moe", True),
    "nemotron_h_moe": ("nemotron_h_moe", True),
}


def test_every_decode_kernels_entry_is_recounted() -> None:
    assert set(_KERNEL_RECIPES.values()) | {("qwen35moe", True)} == set(speed.DECODE_KERNELS)
    # qwen35moe builds qwen3next's layers (models/qwen35moe.cpp): the same counts
    assert speed.DECODE_KERNELS[("qwen35moe", True)] == speed.DECODE_KERNELS[("qwen3next", True)]


@pytest.mark.llama
@pytest.mark.parametrize("recipe", list(_KERNEL_RECIPES))
def test_decode_kernels_are_llama_cpps_own(recipe: str, tmp_path: Path) -> None:
    """DECODE_KERNELS recounted on the real llama.cpp: llama-fit-params -ub 1 reserves the one-token graph, and
    GGML_SCHED_DEBUG=2 prints its nodes with their sources (ggml-backend.cpp ggml_backend_sched_print_assignments, views
    left out); per layer kind, each layer's. A node belongs to the layer its name says (cb's "name-il", a recurrent
    layer's "cache_r_lN" state), else to the layer of the weights or state it reads, else to the layer whose norm came
    last: a recurrent layer's state copies are scheduled within the layer before it. Every layer of a kind must count
    the same (the last also holds the output's nodes)."""
    import re
    import subprocess

    from gguf import GGUFReader
    from tinymodels import write_tiny_gguf

    try:
        binary = llama_server_build.fit_params()
    except llama_server_build.BuildUnavailable as e:
        pytest.skip(f"no llama-fit-params: {e}")
    n_layer = 8
    dims = {"n_layer": n_layer} | ({"n_dense": 0} if recipe == "lfm2moe" else {})  # every layer MoE
    path = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe, dims=dims)
    cmd = [str(binary), "-m", str(path), "-c", "512", "-b", "1", "-ub", "1", "-ngl", "0", "-fitp", "on", "-v"]
    env = {**os.environ, "GGML_SCHED_DEBUG": "2"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=True)
    graph = (p.stdout + p.stderr).split("reserving a graph for ubatch with n_tokens =    1")[1]
    graph = re.sub(r"\d+\.\d+\.\d+\.\d+ D ", "", graph.split("reserving a graph")[0])  # the log's timestamps
    per_layer: dict[int, list[str]] = {}
    span = -1
    for chunk in graph.split("node #")[1:]:
        m = re.match(r"\s*\d+ \(\s*([^)]*?)\):\s+(.+?) \(\s*\d+K\)(.*)", chunk, re.S)
        assert m, chunk
        op, name, sources = m.groups()
        norm = re.match(r"(?:norm|attn_norm)-(\d+)$", name)
        span = max(span, int(norm.group(1))) if norm else span
        own = re.search(r"-(\d+)$|^cache_[a-z]+_l(\d+)", name)
        read = [int(a or b) for a, b in re.findall(r"blk\.(\d+)\.|cache_[a-z]+_l(\d+)", sources)]
        il = int(own.group(1) or own.group(2)) if own else max(read) if read else span
        per_layer.setdefault(il, []).append(op)
    assert sorted(per_layer) == list(range(-1, n_layer))
    # each layer's kind from the file: a recurrent mixer's tensors, else attention's, else an FFN alone
    names = " ".join(t.name for t in GGUFReader(path).tensors)

    def kind(il: int) -> str:
        if re.search(rf"blk\.{il}\.(ssm_|shortconv)", names):
            return "recurrent"
        return "attention" if f"blk.{il}.attn_k." in names else "ffn"

    counts: dict[str, set[int]] = {}
    for il in range(n_layer - 1):
        counts.setdefault(kind(il), set()).add(len(per_layer[il]))
    assert all(len(v) == 1 for v in counts.values()), counts  # every layer of a kind alike
    got = {k: v.pop() for k, v in counts.items()}
    want = speed.DECODE_KERNELS[_KERNEL_RECIPES[recipe]]
    assert got == {k: getattr(want, k) for k in ("attention", "recurrent", "ffn") if getattr(want, k)}


def test_partial_offload_adds_the_cpu_time() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    gpu = [speed.Device("cuda", 448_000_000_000)]
    full = speed.estimate(spec, 4096, gpu)
    part = speed.estimate(spec, 4096, gpu, cpu_expert_layers=24)
    assert full is not None and part is not None
    assert part.tokens_per_s < full.tokens_per_s


def test_hf_config_of_a_moe_reads_only_the_experts_in_use() -> None:
    """kvadvise hf counted every expert of a config.json as read per token (issue 25: 0.10-0.33x); its spec now
    has the config's parts, as a built-in profile's and a GGUF's: the same reads as the profile of the model."""
    from kvadvise.backends.hf import HFBackend

    spec = HFBackend().load_spec(str(QWEN3_CODER), quant="Q4_K_M")
    assert spec.n_expert == 128 and spec.expert_bytes > 0.85 * spec.weights_bytes
    assert 2.9e9 < spec.active_params < 3.2e9  # Qwen3-30B-A3B: 3.3 B active with the embeddings, 3.0 B without
    reads = speed.weight_reads(spec)
    assert (reads.dense + reads.experts) < 0.12 * spec.weights_bytes
    prof = profiles()["qwen3-coder:30b"].spec()
    gpu = [speed.Device("cuda", 1_008_000_000_000)]
    a, b = speed.estimate(spec, 4096, gpu), speed.estimate(prof, 4096, gpu)
    assert a is not None and b is not None and a.tokens_per_s == pytest.approx(b.tokens_per_s, rel=0.05)
    assert "every expert is counted" not in a.note


def test_hf_with_two_gpus_splits_the_weights_and_fits() -> None:
    """kvadvise hf with two GPUs put every weight on the last card (its spec had no block sizes) and said it did
    not fit: each card now holds its layers' share, and two 16 GB cards hold Qwen3-Coder-30B Q4_K_M."""
    doc = _json(["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "5070-ti,5060-ti", "--json"])
    w = [d["weights_bytes"] for d in doc["memory"]["devices"]]
    assert len(w) == 2 and min(w) > 0.35 * sum(w)
    assert doc["fits"] is True


def test_unequal_gpus_read_at_their_own_bandwidth_by_their_share() -> None:
    """Two unequal cards were planned at the slower one's bandwidth (0.69-0.79x for a 5070 Ti + 5060 Ti): each
    device now reads its share of the layers at its own bandwidth, the times added (layers run in turn)."""
    spec = profiles()["qwen3:14b"].spec()
    devs = speed.devices(spec, "cuda", [896_000_000_000, 448_000_000_000], (16.0, 16.0))
    assert [round(d.share, 2) for d in devs] == [pytest.approx(0.5, abs=0.06)] * 2
    mixed = speed.estimate(spec, 4096, devs)
    slow = speed.estimate(spec, 4096, speed.devices(spec, "cuda", [448_000_000_000] * 2, (16.0, 16.0)))
    fast = speed.estimate(spec, 4096, speed.devices(spec, "cuda", [896_000_000_000] * 2, (16.0, 16.0)))
    assert mixed is not None and slow is not None and fast is not None
    assert slow.tokens_per_s * 1.25 < mixed.tokens_per_s < fast.tokens_per_s
    # the time per token is each card's share over its bandwidth: the harmonic mean of the two
    reads = speed.weight_reads(spec)
    kv = speed.kv_read_bytes(spec, 4096)
    t = sum(
        (reads.dense + reads.experts) * d.share / (speed.EFFICIENCY["cuda"]["dense"] * d.bandwidth_bytes_per_s)
        + kv * d.share / (speed.KV_EFFICIENCY["cuda"] * d.bandwidth_bytes_per_s)
        for d in devs
    )
    t += spec.n_layer * speed.LAYER_OVERHEAD_S["cuda"]
    t += spec.n_vocab * speed.SAMPLING_S_PER_ENTRY  # the CPU samples each token, serially
    assert mixed.tokens_per_s == pytest.approx(1 / t, rel=1e-9)


def test_a_plan_on_unequal_cards_says_each_share() -> None:
    doc = _json(["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "5070-ti,5060-ti", "--ctx", "8192", "--json"])
    est = doc["decode_estimate"]
    assert est is not None and "896 GB/s (cuda" in est["note"] and "448 GB/s (cuda" in est["note"]


# -- the CPU's share: RAM bandwidth, measured or given ----------------------------------------------


def test_ram_bandwidth_is_measured_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpuspeed, "_busy", lambda: None)  # the machine as idle (the next test: busy)
    t0 = time.perf_counter()
    r = cpuspeed.measured_bandwidth.__wrapped__()
    took = time.perf_counter() - t0
    assert r.bytes_per_s > 100_000_000 and "measured" in r.source and str(tmp_path) in r.source
    assert took < 5  # about 0.1 s on a desktop; this shared 2-core machine is slower
    doc = json.loads(cpuspeed.cache_path().read_text())
    assert doc["bytes_per_s"] == r.bytes_per_s and doc["machine"] == cpuspeed._machine_key()

    def no(*a: object, **k: object) -> float:
        raise AssertionError("measured again")

    monkeypatch.setattr(cpuspeed, "measure", no)
    again = cpuspeed.measured_bandwidth.__wrapped__()
    assert again.bytes_per_s == r.bytes_per_s


def test_a_busy_machine_measures_the_copies_own_time_and_a_quiet_one_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2-core VM measured 5 GB/s by the wall clock while busy and ~15 quiet, and every partial plan's speed
    moved 3x with it. Busy: the copies' own CPU time is measured (measure_under_load) and kept, marked; the
    first quiet run measures again the wall-clock way and replaces it; a quiet figure is never re-measured."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[str] = []
    monkeypatch.setattr(cpuspeed, "measure", lambda: calls.append("quiet") or 15e9)
    monkeypatch.setattr(cpuspeed, "measure_under_load", lambda: calls.append("busy") or 17e9)
    monkeypatch.setattr(cpuspeed, "_busy", lambda: 7.5)
    r = cpuspeed.measured_bandwidth.__wrapped__()
    assert r.bytes_per_s == 17e9 and "busy (load 7.5)" in r.source and calls == ["busy"]
    assert json.loads(cpuspeed.cache_path().read_text())["under_load"] == 7.5
    assert cpuspeed.measured_bandwidth.__wrapped__().bytes_per_s == 17e9 and calls == ["busy"]  # still busy: kept
    monkeypatch.setattr(cpuspeed, "_busy", lambda: None)
    assert cpuspeed.measured_bandwidth.__wrapped__().bytes_per_s == 15e9 and calls == ["busy", "quiet"]
    monkeypatch.setattr(cpuspeed, "_busy", lambda: 9.0)
    assert cpuspeed.measured_bandwidth.__wrapped__().bytes_per_s == 15e9 and calls == ["busy", "quiet"]


def test_the_figure_under_a_real_load_is_the_quiet_one() -> None:
    """Real work beside it (processes spinning on every CPU and two copying memory): the copies' own time
    gives about what the quiet machine's wall clock gives, where the wall clock under that load reads a
    fraction of it (side by side in one run; the bound is wide: a shared CI machine is noisy)."""
    import subprocess
    import sys

    quiet = cpuspeed.measure()
    spin = "while True: pass"
    copy = "import ctypes\na=ctypes.create_string_buffer(64<<20)\nb=ctypes.create_string_buffer(64<<20)\n"
    copy += "while True: ctypes.memmove(a, b, 64<<20)"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    hogs += [subprocess.Popen([sys.executable, "-c", copy]) for _ in range(2)]
    try:
        time.sleep(1.0)
        loaded_wall = cpuspeed.measure()
        loaded = cpuspeed.measure_under_load()
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
    print(f"quiet {quiet / 1e9:.1f} GB/s; under load: wall clock {loaded_wall / 1e9:.1f}, own time {loaded / 1e9:.1f}")
    assert 0.5 * quiet <= loaded <= 2.5 * quiet


def test_busy_means_a_load_above_the_logical_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpuspeed.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpuspeed.os, "getloadavg", lambda: (2.5, 1.0, 1.0), raising=False)
    assert cpuspeed._busy() == 2.5
    monkeypatch.setattr(cpuspeed.os, "getloadavg", lambda: (1.9, 3.0, 3.0), raising=False)
    assert cpuspeed._busy() is None

    def unavailable() -> tuple[float, float, float]:
        raise OSError("no load average")

    monkeypatch.setattr(cpuspeed.os, "getloadavg", unavailable, raising=False)
    assert cpuspeed._busy() is None


def test_a_plan_that_fits_the_gpu_never_measures_the_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(*a: object, **k: object) -> float:
        raise AssertionError("a plan that needs no CPU speed measured the RAM")

    monkeypatch.setattr(cpuspeed, "measure", no)
    monkeypatch.setattr(cpuspeed, "measured_bandwidth", lambda: no())
    doc = _json(["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--json"])
    assert doc["fits"] is True and doc["decode_estimate"] is not None


def test_ram_bandwidth_flag_sets_the_cpu_share() -> None:
    """Experts on the CPU came out 1.5-1.7x too fast at a fixed 60 GB/s: the CPU's share is read at the
    bandwidth given (or measured), and the note says which."""
    base = ["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "rtx-4060-ti-16gb", "--n-cpu-moe", "30", "--json"]
    slow = _json([*base, "--ram-bandwidth", "30"])["decode_estimate"]
    fast = _json([*base, "--ram-bandwidth", "90"])["decode_estimate"]
    assert slow["tokens_per_s"] < 0.75 * fast["tokens_per_s"]
    assert "30 GB/s system memory (--ram-bandwidth)" in slow["note"]
    seeded = _json(base)["decode_estimate"]  # the seeded cache of tests/conftest.py: 30 GB/s "measured"
    assert seeded["tokens_per_s"] == pytest.approx(slow["tokens_per_s"])
    assert "seeded by tests/conftest.py" in seeded["note"]


# -- --n-cpu-moe -------------------------------------------------------------------------------------


def test_n_cpu_moe_plans_that_placement() -> None:
    """--n-cpu-moe N: the routed experts of layers 0..N-1 in RAM (common/arg.cpp, LLM_FFN_EXPS_REGEX); the GPU
    holds the rest, its compute buffer a copy of the largest expert tensor (op offload); decode reads those
    experts from RAM, prefill copies them over PCIe once per ubatch."""
    base = ["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "rtx-4090", "--ctx", "16384", "--json"]
    full = _json(base)
    part = _json([*base, "--n-cpu-moe", "24", "--ram-bandwidth", "60"])
    moved = part["memory"]["host"]["weights_bytes"] - full["memory"]["host"]["weights_bytes"]
    spec = profiles()["qwen3-coder:30b"].spec()  # the same config, another weights size: the share is the same
    assert moved == pytest.approx(24 / 48 * spec.expert_bytes / spec.weights_bytes * 18_697_763_875, rel=0.02)
    dev_full, dev_part = full["memory"]["devices"][0], part["memory"]["devices"][0]
    copy = dev_part["compute_bytes"] - dev_full["compute_bytes"]
    assert 50 << 20 < copy < 300 << 20  # the largest of the moved expert tensors (a third of a layer's experts)
    assert dev_full["weights_bytes"] - dev_part["weights_bytes"] == pytest.approx(moved, abs=1 << 20)
    assert part["fits"] is True
    assert part["decode_estimate"]["tokens_per_s"] < 0.6 * full["decode_estimate"]["tokens_per_s"]
    assert part["prefill"]["tokens_per_s"] < full["prefill"]["tokens_per_s"]
    assert "cross PCIe once per ubatch" in part["prefill"]["note"]
    assert any("--n-cpu-moe 24: the routed experts of 24 layers" in n for n in part["notes"])


def test_n_cpu_moe_with_a_recommendation_counts_the_gpu_part_only() -> None:
    """Without --ctx the context is recommended for what the GPU holds: more context than with every expert
    on a 16 GB card."""
    base = ["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "rtx-4060-ti-16gb", "--json", "--ram-bandwidth", "60"]
    alone = _json(base)
    with_cpu = _json([*base, "--n-cpu-moe", "30"])
    assert with_cpu["fits"] is True
    assert with_cpu["config"]["n_ctx"] >= alone["config"]["n_ctx"]
    assert with_cpu["memory"]["devices"][0]["total_bytes"] <= with_cpu["budget"]["budget_bytes"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-cpu-moe", "4", "--allow-cpu"], "give one"),
        (["--n-cpu-moe", "4", "--device", "cpu"], "--device cpu"),
    ],
)
def test_n_cpu_moe_refused_with_contradicting_flags(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused by the request's one check (kvadvise.request.check), as the API refuses it: exit 2."""
    rc = main(["hf", str(QWEN3_CODER), "--quant", "Q4_K_M", "--gpu", "rtx-4090", *args])
    assert rc == 2 and message in capsys.readouterr().err


def test_n_cpu_moe_on_a_dense_model_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    dense = str(ROOT / "tests" / "data" / "hf" / "qwen3-8b.json")
    rc = main(["hf", dense, "--quant", "Q4_K_M", "--gpu", "rtx-4090", "--n-cpu-moe", "4"])
    assert rc == 2 and "no routed experts" in capsys.readouterr().err


def test_n_cpu_moe_is_llama_cpp_only(capsys: pytest.CaptureFixture[str]) -> None:
    """Ollama has no such setting (it places the experts itself): refused, as its other llama.cpp-only flags."""
    rc = main(["ollama", "qwen3-coder:30b", "--gpu", "rtx-4090", "--n-cpu-moe", "4"])
    assert rc == 2 and "--n-cpu-moe: llama.cpp only" in capsys.readouterr().err


def test_n_cpu_moe_counts_only_layers_with_experts() -> None:
    """llama.cpp's regex matches blk.I.ffn_*_exps: a model whose first layers are dense (GLM, DeepSeek:
    first_k_dense_replace) moves nothing from them."""
    from kvadvise.planner.offload import cpu_moe_placement

    spec = profiles()["deepseek-coder-v2:16b"].spec()  # first_k_dense_replace 1: layer 0 is dense
    ids = speed.expert_layer_ids(spec)
    assert ids[0] == 1 and len(ids) == spec.n_layer - 1
    p = cpu_moe_placement(spec, 3, "cuda", 512)
    assert p.expert_layers == (1, 2)
    assert p.host_bytes == pytest.approx(2 * spec.expert_bytes / len(ids), abs=2)


# -- prompt processing -------------------------------------------------------------------------------


def test_prefill_in_the_plan_text_and_json() -> None:
    res = CliRunner().invoke(
        cli, ["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ctx", "32768", "--prompt-tokens", "20000"]
    )
    assert res.exit_code == 0, res.output
    assert "  prompt: ≈ " in res.output and "20,000 tokens in" in res.output and "19k tokens in" not in res.output
    res = CliRunner().invoke(
        cli, ["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ctx", "32768", "--prompt-tokens", "20000", "-v"]
    )
    assert "\n  prompt: ≈ " in res.output and "20,000 tokens in" in res.output
    doc = _json(["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ctx", "32768", "--prompt-tokens", "20000", "--json"])
    pf = doc["prefill"]
    assert pf["n_prompt"] == 20000 and pf["seconds"] == pytest.approx(20000 / pf["tokens_per_s"])
    assert pf["low"] < pf["tokens_per_s"] < pf["high"]
    # the default: 4k and the whole planned context, the longer prompt slower per token (the attention grows)
    doc = _json(["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ctx", "32768", "--json"])
    pts = doc["prefill"]["at_prompt"]
    assert [p["n_prompt"] for p in pts] == [4096, 32768]
    assert pts[1]["tokens_per_s"] < pts[0]["tokens_per_s"]


def test_prefill_is_compute_bound_and_attention_grows_with_depth() -> None:
    spec = profiles()["llama3.1:8b"].spec()
    gpu = [speed.Device("cuda", 1_008_000_000_000, flops_per_s=330.3e12)]
    s0 = prefill.prefill_seconds(spec, 2048, gpu)
    s32 = prefill.prefill_seconds(spec, 2048, gpu, depth=32768)
    assert s0 is not None and s32 is not None and s32 > 1.3 * s0
    flops = 2048 * 2 * spec.active_params
    assert s0 == pytest.approx(
        flops / (prefill.PREFILL_EFFICIENCY["cuda"]["dense"] * 330.3e12)
        + 2048 * prefill.attention_flops(spec, 1024) / (prefill.PREFILL_EFFICIENCY["cuda"]["dense"] * 330.3e12)
    )
    a100 = [speed.Device("cuda", 2_039_000_000_000, flops_per_s=312e12, name="NVIDIA A100-SXM4-80GB")]
    assert prefill.prefill_key("cuda", a100[0].name) == "cuda-dc"
    s_a100 = prefill.prefill_seconds(spec, 2048, a100)
    assert s_a100 is not None and s_a100 > s0  # llama.cpp's MMQ kernels do not use the A100's extra tensor rate
    assert prefill.prefill_seconds(spec, 2048, [speed.Device("cuda", 10**12)]) is None  # no compute figure


def test_recurrent_scan_flops_follow_llama_cpp_kernels() -> None:
    """The recurrent layers' prompt work per token, as b11312's CUDA kernels do it: a Gated DeltaNet layer 7 FLOPs per
    state element (gated_delta_net_cuda: S^T k, decay + rank-1 update, S^T q); Mamba-2 the SSD path's four GEMMs per
    chunk of 256 tokens (ssm_scan_ssd_f32_cuda) above a ubatch of 128, the token-by-token scan below; no recurrent
    layer, no scan. The hybrids' figures come from their Ollama profiles' GGUF headers."""
    q9 = profiles()["qwen3.5:9b"].spec()  # 24 Gated DeltaNet layers of 32 value heads x 128 x 128
    assert sum(q9.recurrent_layers[: q9.n_layer]) == 24
    assert prefill.recurrent_flops(q9) == prefill.RecurrentFlops(24 * 7.0 * 128 * 32 * 128, 0.0)
    nemo = profiles()["nemotron-3-nano:30b"].spec()  # 23 Mamba-2 layers: d_inner 4096, d_state 128, 8 groups
    n_rec = sum(nemo.recurrent_layers[: nemo.n_layer])
    assert n_rec == 23
    ssd = 2.0 * 256 * 128 * 8 + 4.0 * 128 * 4096 + 2.0 * 256 * 4096
    assert prefill.recurrent_flops(nemo, 512) == prefill.RecurrentFlops(0.0, n_rec * ssd)
    assert prefill.recurrent_flops(nemo, 64) == prefill.RecurrentFlops(n_rec * 5.0 * 128 * 4096, 0.0)
    assert prefill.recurrent_flops(profiles()["llama3.1:8b"].spec()) == prefill.RecurrentFlops(0.0, 0.0)


def test_recurrent_scan_costs_the_same_at_any_depth() -> None:
    """A Gated DeltaNet layer's scan adds a fixed time per prompt token at RECURRENT_PREFILL_EFFICIENCY of the peak, the
    same after 32k cached tokens as from an empty cache (its state does not grow); the attention layers' cost grows."""
    spec = profiles()["qwen3.5:9b"].spec()
    gpu = [speed.Device("cuda", 1_008_000_000_000, flops_per_s=330.3e12)]
    scan_s = 2048 * prefill.recurrent_flops(spec).scan / (prefill.RECURRENT_PREFILL_EFFICIENCY["cuda"] * 330.3e12)
    saved = dict(prefill.RECURRENT_PREFILL_EFFICIENCY)
    try:
        with_scan = [prefill.prefill_seconds(spec, 2048, gpu, depth=d) for d in (0, 32768)]
        prefill.RECURRENT_PREFILL_EFFICIENCY["cuda"] = 1e30  # the scan free
        without = [prefill.prefill_seconds(spec, 2048, gpu, depth=d) for d in (0, 32768)]
    finally:
        prefill.RECURRENT_PREFILL_EFFICIENCY.update(saved)
    for w, wo in zip(with_scan, without, strict=True):
        assert w is not None and wo is not None and w - wo == pytest.approx(scan_s)
    assert without[1] is not None and without[0] is not None and without[1] > 1.2 * without[0]


def test_recurrent_efficiency_is_the_kernels_microbenchmark() -> None:
    """The fitted share (1.8 % of the FP16 peak on CUDA) agrees with llama.cpp#22587's microbenchmark of the kernel
    b11312 runs (its master column, RTX 5090, S_v 128, 32 value heads: 279.6 µs for 512 tokens, 525.1 µs for 1,024):
    one token of one layer in (525.1 - 279.6) / 512 µs, against 7 x 32 x 128 x 128 FLOPs at 1.8 % of 419 TFLOPS."""
    per_token_s = (525.1e-6 - 279.6e-6) / 512
    modelled_s = 7 * 32 * 128 * 128 / (prefill.RECURRENT_PREFILL_EFFICIENCY["cuda"] * 419e12)
    assert modelled_s == pytest.approx(per_token_s, rel=0.10)


def test_hybrid_prefill_rows_fit_and_held_out(bench) -> None:  # type: ignore[no-untyped-def]
    """The Gated DeltaNet hybrids' prompt rows (rows 401+): Qwen3.5 9B/27B/35B-A3B on an RTX 4090 (fit), Qwen3.6-35B-A3B
    on the same card and Qwen3.5-9B BF16 on an RTX 5090 (held out, chosen before the fit), and, collected after the fit,
    a Qwen3.6-27B on an RTX 5090 and Qwen3-Coder-Next on an A100 at b10107. With the scan the consumer cards' rows are all
    within ±30 % (0.77-1.21, the 5090's 27B at 8k and 32k too); without it the 35B-A3B rows on the 4090 come out 1.34-1.42x
    too fast (4 of the first 8 within, 8 of 8 with it). The A100's qwen3next rows stay 1.37-1.85x too fast (2.07-2.32x
    without the scan: its 512 experts of 512 wide see ~10 tokens each per ubatch, an MoE-side cost the model lacks). The search over the fit rows alone lands on the committed share.
    The 4090's pp1024 @ depth rows are recorded, not scored: even with the scan the estimate after a 32k cache is over
    1.3x too fast (that build's head-256 attention, not the scan)."""
    doc = bench.load()
    hybrid = [r for r in bench.prefill_rows(doc) if prefill.recurrent_flops(bench.row_spec(doc, r)).scan]
    assert {r["id"] for r in hybrid} == {401, 405, 409, 413, *range(417, 429)}
    assert {bench.split_of(r) for r in hybrid if r["id"] >= 417} == {"holdout"}
    ratios = {r["id"]: bench.prefill_estimate(doc, r) / r["prompt_tps"] for r in hybrid}
    a100 = {
        i for i in ratios if bench.row_spec(doc, next(r for r in hybrid if r["id"] == i)).architecture == "qwen3next"
    }
    assert a100 == {421, 422, 423, 424} and all(ratios[i] > 1.3 for i in a100), ratios
    assert all(0.7 <= x <= 1.3 for i, x in ratios.items() if i not in a100), ratios
    saved = dict(prefill.RECURRENT_PREFILL_EFFICIENCY)
    try:
        prefill.RECURRENT_PREFILL_EFFICIENCY.update({"cuda": 1e30, "cuda-dc": 1e30})
        free = {r["id"]: bench.prefill_estimate(doc, r) / r["prompt_tps"] for r in hybrid}
        assert sum(1 for i, x in free.items() if i <= 420 and 0.7 <= x <= 1.3) == 4 and min(free[409], free[413]) > 1.3
        assert all(free[i] > 1.1 * ratios[i] for i in a100)  # the scan closes part of the A100's gap (2.3x -> 1.85x)
        fit = [r for r in hybrid if bench.split_of(r) == "fit"]

        def loss(x: float) -> float:
            prefill.RECURRENT_PREFILL_EFFICIENCY["cuda"] = x
            return sum(math.log(bench.prefill_estimate(doc, r) / r["prompt_tps"]) ** 2 for r in fit)

        assert min((x / 1000 for x in range(2, 101)), key=loss) == pytest.approx(saved["cuda"], abs=0.002)
    finally:
        prefill.RECURRENT_PREFILL_EFFICIENCY.update(saved)
    deep = [r for r in doc["rows"] if r["id"] in range(401, 417) and r.get("prompt_depth")]
    assert len(deep) == 12 and all(r["excluded"] for r in deep)
    for r in deep:
        if r["prompt_depth"] >= 32768:
            assert bench.prefill_estimate(doc, r) / r["prompt_tps"] > 1.3, r["id"]


def test_cpu_plans_get_decode_and_prefill_from_this_machine() -> None:
    doc = _json(["ollama", "qwen3:8b", "--device", "cpu", "--ctx", "4096", "--json", "--ram-bandwidth", "40"])
    assert doc["decode_estimate"] is not None and "40 GB/s system memory" in doc["decode_estimate"]["note"]
    assert doc["prefill"] is not None and "TFLOPS CPU" in doc["prefill"]["note"]


def test_verify_prints_prompt_measured_over_estimated(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify llamacpp: llama-server's timings.prompt_per_second beside kvadvise's prefill estimate for the same
    prompt (timings.prompt_n tokens), with measured / estimated."""
    from oracle import run_llama

    from kvadvise.planner.memory import RunConfig

    real = run_llama(gemma_path, [RunConfig(n_ctx=4096, flash_attn="on")])[0].text
    logfile = tmp_path / "llama.log"
    logfile.write_text("build: 7000 (0c1e570) with cc for x86_64-linux-gnu\n" + real)
    server = tmp_path / "llama-server"
    server.write_text(
        f'#!/bin/sh\nexec {sys.executable} {TESTS / "fake_llama_server.py"} --log {logfile} --mode ok "$@"\n'
    )
    server.chmod(0o755)
    rc = main(
        ["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "-fa", "on", "--llama-server", str(server), "--json"]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["measured"]["prompt_tokens"] == 256 and doc["measured"]["prompt_tokens_per_s"] == 500.0
    assert doc["prompt_estimate_tokens_per_s"] > 0
    rc = main(["verify", "llamacpp", str(gemma_path), "--ctx", "4096", "-fa", "on", "--llama-server", str(server)])
    out, _ = capsys.readouterr()
    ratio = 500.0 / doc["prompt_estimate_tokens_per_s"]
    assert f"measured / estimated = {ratio:.2f}" in out and "for 256 tokens" in out


@pytest.mark.llama
def test_n_cpu_moe_per_device_is_what_llama_server_allocates(
    real_llama_server: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Real llama.cpp (the llama-server the tests build, two rpc-servers on loopback as devices, -ts 1,1): with
    --n-cpu-moe 2 each device's model buffer is the plan's to 0.01 MiB (the experts of layers 0 and 1 leave the
    first device), and the CPU's buffer holds them (ggml-rpc has no op offload: no copy)."""
    from llama_server_build import rpc_server as built
    from rpc_devices import devices, run_server
    from tinymodels import write_tiny_gguf

    import kvadvise
    from kvadvise.planner.memory import RunConfig, estimate
    from kvadvise.planner.offload import cpu_moe_placement, with_cpu_moe
    from kvadvise.runtime.llamalog import parse

    rpc = built()
    if not rpc.exists():
        pytest.skip(f"no rpc-server beside {real_llama_server}")
    model = write_tiny_gguf(tmp_path_factory.mktemp("ncmoe") / "qwen3moe.gguf", "qwen3moe", n_vocab=32000)
    spec = kvadvise.load_model(str(model))
    cfg = RunConfig(n_ctx=4096, flash_attn="on", device="rpc", tensor_split=(1.0, 1.0))
    placement = cpu_moe_placement(spec, 2, "rpc", cfg.n_ubatch)
    assert placement.expert_layers == (0, 1) and placement.op_offload_bytes == 0
    est = with_cpu_moe(estimate(placement.gpu_spec, cfg), placement)
    full = estimate(spec, cfg)
    with devices(rpc, 2) as eps:
        args = ["-c", "4096", "-fa", "on", "-ngl", "99", "-ts", "1,1", "--n-cpu-moe", "2"]
        log = run_server(real_llama_server, model, args, eps)
    got = parse(log.splitlines())
    for ep, d, f in zip(eps, est.devices, full.devices, strict=True):
        name = next(b.buft for b in got.buffers if b.buft.endswith(f"[{ep}]") and b.kind == "model")
        mib = sum(b.mib for b in got.buffers if b.buft == name and b.kind == "model")
        assert mib == pytest.approx(d.weights_bytes / (1 << 20), abs=0.01), (name, mib, d.weights_bytes)
        if d is est.devices[0]:
            assert f.weights_bytes - d.weights_bytes == placement.host_bytes  # layers 0 and 1 are on device 0
    cpu = sum(b.mib for b in got.buffers if b.buft.startswith("CPU") and b.kind == "model")
    assert cpu * (1 << 20) >= spec.tok_embd_bytes + placement.host_bytes - (1 << 14)


def test_the_fixed_time_per_layer_scales_with_the_cards_clock(bench) -> None:  # type: ignore[no-untyped-def]
    """The fixed time per layer and token is the run time of small, latency-bound kernels: it scales with the SM clock
    (speed.CLOCK_REFERENCE_HZ: the RTX 4090's 2,520 MHz, where it was fitted). A card's boost clock comes from
    profiles/gpus.json into the plan's devices; each device of a split runs its share of the layers at its own."""
    from kvadvise.planner import budget as budget_mod
    from kvadvise.planner import hardware

    doc = bench.load()
    rows = {r["id"]: r for r in doc["rows"]}
    spec = bench.row_spec(doc, rows[161])
    reads = speed.weight_reads(spec)
    ref = speed.Device("cuda", 936_000_000_000, clock_hz=speed.CLOCK_REFERENCE_HZ)
    slow = speed.Device("cuda", 936_000_000_000, clock_hz=1_695_000_000)  # an RTX 3090's boost clock
    fixed = reads.layer_units * speed.LAYER_OVERHEAD_S["cuda"]
    assert speed.seconds_per_token(reads, 0, [slow]) - speed.seconds_per_token(reads, 0, [ref]) == pytest.approx(
        fixed * (2520 / 1695 - 1)
    )
    # unknown clock, or a backend the factor was not measured on: the reference's
    assert speed.clock_factor([speed.Device("cuda", 1)]) == speed.clock_factor([ref]) == 1.0
    assert speed.clock_factor([speed.Device("rocm", 1, clock_hz=1e9)]) == 1.0
    # two GPUs: each its share of the layers
    pair = [speed.Device("cuda", 1, share=0.5, clock_hz=1.26e9), speed.Device("cuda", 1, share=0.5, clock_hz=2.52e9)]
    assert speed.clock_factor(pair) == pytest.approx(1.5)
    # the profile's clock reaches a plan's devices
    hw = hardware.from_profiles("rtx-3090")
    assert hw is not None and hw.gpus[0].clock_hz == 1_695_000_000
    devs = speed.plan_devices(spec, budget_mod.budget_for(hw, 1 << 30))
    assert devs is not None and devs[0].clock_hz == 1_695_000_000
    # the held-out Qwen3.5-35B-A3B on an RTX 3090 (no build named): 1.56x too fast with the 4090's fixed time
    assert bench.decode_estimate(doc, rows[161]) / rows[161]["decode_tps"] < 1.3


def test_a_card_given_by_its_size_is_timed_at_each_catalogue_cards_clock() -> None:
    """`--vram 24GiB` (no --bandwidth): the speed is the range over the catalogue's 24 GiB cards, each at its own
    bandwidth and its own boost clock. Each card was timed at the reference clock (the budget's unknown clock: factor
    1): qwen3-8b at Q4_K_M, 4,096 tokens, the range's low end (an L4, 2,040 MHz) 44.3 t/s where `--gpu l4` says 43.3,
    the median 112.9 -> 104.6. A hand-made speed.Device of a NaN, infinite or negative clock takes the reference's."""
    from kvadvise.planner.gpus import load_profiles

    base = ["hf", "tests/data/hf/qwen3-8b.json", "--quant", "Q4_K_M", "-c", "4096", "--ram", "64GiB", "--json"]
    size = _json([*base, "--vram", "24GiB"])
    cards = [
        p.id for p in load_profiles() if not p.unified_memory and abs(p.memory_bytes - 24 * 2**30) <= 0.03 * 24 * 2**30
    ]
    each = {c: _json([*base, "--gpu", c])["decode_estimate"]["tokens_per_s"] for c in cards}
    est = size["decode_estimate"]
    print({c: round(t, 1) for c, t in each.items()}, est["low"], est["high"], est["tokens_per_s"])
    assert len(cards) >= 3 and "rtx-3090" in cards
    assert min(each.values()) == pytest.approx(est["low"], rel=1e-9)
    assert max(each.values()) == pytest.approx(est["high"], rel=1e-9)
    for bad in (math.nan, math.inf, -1e9):
        assert speed.clock_factor([speed.Device("cuda", 1, clock_hz=bad)]) == 1.0
    # nor a share of 0 or NaN: the factor was 0 (no fixed time) or NaN
    for share in (0.0, math.nan):
        assert speed.clock_factor([speed.Device("cuda", 1, share=share, clock_hz=1.26e9)]) == pytest.approx(2.0)


def test_a_partial_offloads_prompt_copies_the_cpu_layers_k_and_v_each_ubatch() -> None:
    """Whole layers on the CPU run their attention on the GPU for prompt batches, each ubatch copying the K and V
    read so far (memory.cpu_layers_attention_bytes: the same copies in the compute buffer). Qwen2.5-14B with 36 of
    48 layers on the CPU, f16 cache: 4 KiB a cell and layer; a 65,536-token prompt in 128 ubatches of 512 reads
    512, 1,024, ... 65,536 cells: 36 x 4,096 B x 512 x (128 x 129 / 2) = 623 GB over PCIe, 31 s at 20 GB/s."""
    from kvadvise.model.hfconfig import from_config
    from kvadvise.planner.memory import RunConfig

    spec = from_config(json.loads((ROOT / "tests" / "data" / "hf" / "qwen2.5-14b.json").read_text()), source="test")
    kv = prefill.cpu_layers_kv(spec, RunConfig(n_ctx=65536), 36)
    assert kv is not None and kv.bytes_per_cell == 36 * 2 * (8 * 128 * 2) and kv.swa_bytes_per_cell == 0
    copied = prefill.cpu_kv_copy_bytes(kv, 65536, 512)
    assert copied == kv.bytes_per_cell * 512 * (128 * 129 // 2)
    gpu = speed.Device("cuda", 272_000_000_000, 1.0, flops_per_s=121e12, name="rtx-4060")
    cpu_bytes = spec.weights_bytes * 36 // 48
    without = prefill.prefill_seconds(spec, 65536, [gpu], n_ubatch=512, cpu_bytes=cpu_bytes)
    with_kv = prefill.prefill_seconds(spec, 65536, [gpu], n_ubatch=512, cpu_bytes=cpu_bytes, cpu_kv=kv)
    assert without is not None and with_kv is not None
    assert math.isclose(with_kv - without, copied / speed.PCIE_BYTES_PER_S)
    # a batch under 32 tokens is not op-offloaded: the CPU runs that attention, nothing is copied
    small = prefill.prefill_seconds(spec, 4096, [gpu], n_ubatch=16, cpu_bytes=cpu_bytes, cpu_flops_per_s=1e12)
    assert small == prefill.prefill_seconds(
        spec, 4096, [gpu], n_ubatch=16, cpu_bytes=cpu_bytes, cpu_flops_per_s=1e12, cpu_kv=kv
    )
    # no attention layer on the CPU, or a hybrid's recurrent ones only: nothing
    assert prefill.cpu_layers_kv(spec, RunConfig(n_ctx=65536), 0) is None
