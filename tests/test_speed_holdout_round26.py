"""Round 26e: held-out decode speed for hybrid and MoE models, on rows in no earlier file.

tests/data/speed/holdout_round26.json holds 21 published batch-1 decode figures that are in none of
measurements.json, holdout_round19.json, holdout_round20.json and holdout_round22.json (model config, card, backend and
program kind checked pair by pair), in their row schema (source, source_date, note on each row):
  hybrid MoE (3): Qwen3.5-35B-A3B on a Radeon 8060S through ROCm, Qwen3.6-35B-A3B on a DGX Spark, LFM2.5-8B-A1B on
    an M5 Max (Ollama);
  hybrid dense (5): Qwen3.5-4B on a DGX Spark, an RX 7900 XT (ROCm) and an M4 Pro; Qwen3.5-0.8B on a DGX Spark and a
    GTX 1050 Ti;
  plain MoE (13): GLM-4.7-Flash (MLA, the deepseek2 graph) on a Radeon 8060S (Vulkan and ROCm), a DGX Spark, an M5 Max
    and an M5 Pro (Ollama); Qwen3-30B-A3B on the 8060S (Vulkan and ROCm) and Qwen3-Coder-30B-A3B on an RX 7900 XT;
    ERNIE-4.5-21B-A3B on an RX 7900 XT and an M4 Pro; gpt-oss-120b on the 8060S (ROCm); gpt-oss-20b on an RTX A4000 and
    a Radeon AI PRO R9700 (Vulkan).
Sources: kyuz0/amd-strix-halo-toolboxes docs/results.json at three commits (llama-bench tg128, -ngl 99 -mmp 0 -fa 1),
AlexsJones/llmfit's community bench files at 3f44fd30 (`llmfit bench` against llama-server or Ollama), and
geerlingguy/ai-benchmarks' README 'gpt-oss 20b' table (llama-bench tg128 through Vulkan on an Intel 265K host).
Nothing here fits anything: the rows are merged into the loaded doc with rounds 19c/20c/22c's and each is estimated as
those rounds estimate a row (bench_speed.decode_estimate, plus the CPU's sampling time for llama-server / Ollama
figures). The bar is issue 37's: within ±25 % of the published tokens/s, row by row. Rows that pass stay as regression
guards; the five outside are strict xfails whose reasons start "FINDING:".

Shares within ±25 % at writing: hybrid MoE 2/3, hybrid dense 3/5, plain MoE 11/13 (16/21 in all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from speed_holdout import holdout, load_bench, merged, read
from test_attack_round19c import _check, _ratio, _row  # one row estimated and checked, as rounds 19c, 20c and 22c

EXTRA = holdout(26)
EARLIER = [holdout(n) for n in (19, 20, 22)]
BAND = 0.25
HYBRID = ("qwen35moe", "qwen35", "qwen3next", "nemotron_h_moe", "granitehybrid", "lfm2", "lfm2moe")


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_bench("bench_speed_r26e")


def _extra(path: Path = EXTRA) -> dict[str, Any]:
    return read(path)


@pytest.fixture(scope="module")
def doc(bench: Any) -> dict[str, Any]:
    """measurements.json with the earlier rounds' and this round's configs, cards and rows merged in (ids kept)."""
    return merged(bench, [*EARLIER, EXTRA])


# -- the data ----------------------------------------------------------------------------------------


def test_rows_are_new_sourced_and_held_out(bench: Any, doc: dict[str, Any]) -> None:
    """Every row has a source, a date, a note, split 'holdout', an input kind bench_speed knows, a card bench_speed
    knows (or one of this file's cards, its bandwidth also on the row as bandwidth_gbs), an id from 2601 that no
    earlier file uses, and is not one of their rows under another id (same file size, card, backend and published
    figure) nor the same model config on the same card and backend through the same program kind; at least 15 rows,
    at least 6 of them hybrid or hybrid MoE."""
    base = bench.load()
    earlier = base["rows"] + [r for p in EARLIER for r in _extra(p)["rows"]]
    extra = _extra()
    rows = extra["rows"]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) and min(ids) >= 2601
    assert not set(ids) & {r["id"] for r in earlier}
    assert len(rows) >= 15
    known = {(r.get("weights_gib"), r["gpu"], r["backend"], r.get("decode_tps")) for r in earlier}
    pairs = {(r["config"], r["gpu"], r["backend"], bench.times_sampling(r)) for r in earlier}
    cards = bench.cards(doc)  # the merged doc's: bench_speed caches the first doc's cards
    for r in rows:
        assert r["source"] and r["source_date"] and r["note"], r["id"]
        assert r["split"] == "holdout" and bench.input_kind(r) in bench.INPUTS, r["id"]
        assert r["decode_tps"] and r["quant_key"] and r["config"], r["id"]
        assert r["gpu"] in cards, r["id"]
        assert r["gpu"] not in extra["cards"] or r.get("bandwidth_gbs"), r["id"]
        assert (r.get("weights_gib"), r["gpu"], r["backend"], r.get("decode_tps")) not in known, r["id"]
        assert (r["config"], r["gpu"], r["backend"], bench.times_sampling(r)) not in pairs, r["id"]
    mine = [(r["config"], r["gpu"], r["backend"], bench.times_sampling(r)) for r in rows]
    assert len(mine) == len(set(mine))
    assert sum(r["arch"] in HYBRID for r in rows) >= 6


def test_every_config_and_card_names_its_source() -> None:
    extra = _extra()
    for key, c in extra["configs"].items():
        assert c["source"] and c["config"], key
    for key, card in extra["cards"].items():
        assert card["source"] and card["bandwidth_bytes_per_s"] > 0, key


# -- findings ----------------------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: Qwen3.5-35B-A3B UD-Q4_K_XL through ROCm 7.2 (b8577) on a Radeon 8060S: kvadvise 60.45 t/s vs "
    "47.78 published, ratio 1.265 (OVER 26.5 %); the same file's Vulkan row (round 19c 1926) is 1.149 and its plain "
    "MoE Qwen3-30B-A3B ROCm row 0.923: ROCm's 30 Gated DeltaNet layers on gfx1151 cost more than the recurrent "
    "state read kvadvise gives them (no ROCm recurrent-layer cost)",
)
def test_qwen35_35b_a3b_rocm_on_strix_halo(bench: Any, doc: dict[str, Any]) -> None:
    """Qwen3.5-35B-A3B on a Ryzen AI Max+ 395's Radeon 8060S through ROCm decodes 21 % slower than kvadvise plans.

    API: bench_speed.decode_estimate for row 2601 (what `kvadvise ... --gpu ryzen-ai-max-395-128gb` reports with a
    ROCm backend): 60.45 t/s vs 47.78 published (tg128 47.78 ± 0.01, ROCm 7.2 toolbox, build 2405d59cb (8577), kyuz0
    results.json @a7ace8d, runs of 29 Mar 2026). OVER 26.5 % (kvadvise too fast: plans a faster agent loop than runs).
    The same run's Vulkan RADV figure, 59.13, is round 19c's 1926 (ratio 1.149), so ROCm is 19 % slower than Vulkan on
    this hybrid; for the plain MoE Qwen3-30B-A3B the two backends differ by 15 % (2602 Vulkan b7670 68.71, 0.852;
    2603 ROCm b7816 58.57, 0.923) and kvadvise follows (its ROCm class is slower), but for the hybrid the ROCm gap is
    wider and the estimate leans fast on both backends (1902, Qwen3.6-35B-A3B ROCm b9193, 1.146; 2203, Qwen3-Next-80B
    ROCm b7816, 1.211). Reading: the Gated DeltaNet layers (ssm_conv, gated_delta_net and their gating matmuls: 30 of
    40 layers) run as many small kernels whose fixed time on gfx1151 through HIP is larger than Vulkan's; kvadvise
    counts them as the recurrent state's bytes at the backend's K/V efficiency plus the common per-layer time.
    Missing rule (guessed, not checked): a per-recurrent-layer fixed time by backend (ROCm > Vulkan > CUDA), as
    speed.EARLY_BUILD_RECURRENT_S already carries one for early builds."""
    _check(bench, doc, 2601)


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: GLM-4.7-Flash q8_0 through Ollama on an M5 Pro: kvadvise 38.38 t/s vs 52.85 published, ratio "
    "0.726 (UNDER 27 %); 0.69 GB of the 4.84 GB kvadvise reads a token is the NextN (MTP) block that llama.cpp's "
    "deepseek2 graph never runs (b11312 src/models/deepseek2.cpp loops il < n_layer, the trunk)",
)
def test_glm47_flash_q8_on_m5_pro(bench: Any, doc: dict[str, Any]) -> None:
    """GLM-4.7-Flash at Q8_0 on an M5 Pro decodes 1.38x as fast as kvadvise plans.

    API: bench_speed.decode_estimate for row 2609: 38.38 t/s vs 52.85 published (llmfit 1.1.6, 3 runs against Ollama,
    avgTps 52.85 over 300 tokens; https://github.com/AlexsJones/llmfit/blob/3f44fd30a43d2619146f7bc0aa66c90aa54d78e6/
    llmfit-core/data/community/apple-m5-pro/1785439736-dcd891fe.json). UNDER 27 % (kvadvise too slow: it would steer a
    user off a model that runs fine). The other GLM-4.7-Flash rows sit inside: Q4_K_M on an M5 Max through Ollama
    (2608) 1.147, on a DGX Spark (2607) 1.092, UD-Q8_K_XL on the 8060S (2604 Vulkan 0.843, 2605 ROCm 0.894).
    What kvadvise reads a token (speed.weight_reads): dense 2.65 GB + routed experts 1.85 GB + output 0.34 GB at Q8_0.
    The trunk's non-expert bytes (47 blocks' layer_bytes less their experts) and the output come to 1.96 GB of the 2.99
    GB dense+output: the 0.69 GB left is the NextN block (num_nextn_predict_layers 1: a 64-expert MoE layer + MLA
    attention + eh_proj, about 0.64 B weights) that the file holds and ModelSpec.weights_bytes counts, which
    weight_reads puts in 'dense' as weights - embeddings - experts. llama.cpp b11312 loads it (deepseek2.cpp
    load_tensors, mtp_flags) but its decode graph runs the trunk only (`for (int il = 0; il < n_layer; ++il)`, where
    llm_graph_context's n_layer is hparams.n_layer() = n_layer_all - n_layer_nextn: llama-graph.cpp and
    llama-hparams.cpp; the NextN block runs only in an MTP context). Without it (a probe, not the expectation) the estimate is 42.99 t/s (0.813).
    Missing rule: weight_reads leaves the NextN blocks out of the per-token bytes. Not fixed here: every qwen35moe and
    qwen35 row carries the same kind of gap (0.07-1.9 GB: Qwen3.5's mtp_num_hidden_layers 1), and the CUDA qwen35moe
    fit and moe-sweep rows (51, 157-159, 191-204, at 0.88-1.03) were fitted with it in; dropping it moves those rows
    15-25 % faster (the same probe: 2608 to 1.244, 2601 to 1.54), a refit this round did not do. The
    rest of the gap (Q8_0 on Metal, Ollama's own deepseek2 engine) is not separated."""
    _check(bench, doc, 2609)


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: gpt-oss-20b on an RTX A4000 through Vulkan (265K host): kvadvise 126.64 t/s vs 93.55 published, "
    "ratio 1.354 (OVER 35 %); the same table's consumer cards fit (RTX 4090 0.947, 4070 Ti 0.867, 3060 1.227): the "
    "Ampere cards through Vulkan (A4000 43 %, 3060 48 % of their bandwidth) run slower than the Vulkan class fitted on "
    "Ada / RDNA rows allows; no per-architecture Vulkan class, no clock scaling outside CUDA",
)
def test_gpt_oss_20b_on_rtx_a4000_vulkan(bench: Any, doc: dict[str, Any]) -> None:
    """gpt-oss-20b on an RTX A4000 (Vulkan) decodes 26 % slower than kvadvise plans.

    API: bench_speed.decode_estimate for row 2617 (card rtx-a4000, 448 GB/s, no profile): 126.64 t/s vs 93.55
    published (geerlingguy/ai-benchmarks README @bdf94413 'gpt-oss 20b' table, 'Intel 265K Custom PC (Nvidia RTX
    A4000)', issue 36). OVER 35 % (kvadvise too fast). The table's other cards through the same Vulkan build:
    RTX 4090 279.65 (measurements.json 35, 0.947), RTX 4070 Ti 163.14 (36, 0.867), RTX 3060 83.96 (37, 1.227), Radeon
    AI PRO R9700 163.26 (2618, 1.080). Published 10.7 ms a token; kvadvise's reads (dense 0.67 GB + routed experts
    1.39 GB) take 4.6 ms at 448 GB/s: the card shows 43 % of its bandwidth, the RTX 3060 (360 GB/s, 11.9 ms) 48 % and
    sits at the fast edge too, the Ada cards inside. Reading: both Ampere cards (GA104 / GA106) run this graph through
    Vulkan slower than kvadvise's Vulkan class, fitted with the Ada and RDNA rows, allows; the A4000 is also a 140 W
    single-slot card at 1.56 GHz boost, and the fixed time per layer is clock-scaled only for CUDA
    (speed.clock_factor). Missing rule (guessed): a Vulkan decode class for Ampere (or Vulkan's fixed per-layer time scaled by
    the card's clock as CUDA's is); two rows, one build unknown: not checkable here."""
    _check(bench, doc, 2617)


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: Qwen3.5-0.8B Q4_0 on a DGX Spark (llama-server): kvadvise 193.6 t/s vs 262.18 published, ratio "
    "0.738 (UNDER 26 %): 5.17 ms planned for a 3.81 ms token; a 24-layer, 1024-wide hybrid is almost all fixed time "
    "and kvadvise's CUDA per-layer time (65 us at the RTX 4090's clock: the GB10 has no boost_clock_mhz) is too large "
    "for it, as round 22c found for 2048-wide dense models on an RTX 5070",
)
def test_qwen35_08b_on_gb10(bench: Any, doc: dict[str, Any]) -> None:
    """Qwen3.5-0.8B on a DGX Spark decodes 1.35x as fast as kvadvise plans.

    API: bench_speed.decode_estimate for row 2620: 193.6 t/s vs 262.18 published (llmfit 1.1.9, 3 runs of 300 tokens
    against llama-server; https://github.com/AlexsJones/llmfit/blob/3f44fd30a43d2619146f7bc0aa66c90aa54d78e6/llmfit-core/
    data/community/nvidia-gb10/1786611367-06d57be3-2.json). UNDER 26 %. The same file's larger Qwen3.5 rows lean the
    other way (4B 2613 1.068, 9B 2208 1.140, 27B 2207 1.205): the error grows as the model shrinks, the mark of a
    per-layer fixed time that does not shrink with the layer's width (round 22c's held RTX 5070 Qwen3-1.7B row 2233,
    0.745, is the same pattern on a dense model). Missing rule (guessed): CUDA's fixed time per layer scaled by the
    layer's width (its kernels' launch-bound share), and a clock for the GB10."""
    _check(bench, doc, 2620)


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: Qwen3.5-0.8B on a GTX 1050 Ti (Pascal, 112 GB/s; llama-server, backend not printed): kvadvise "
    "120.54 t/s vs 50.01 published, ratio 2.41 (OVER 141 %); a probe of the same box's Qwen3-4B (17.32 t/s in the same "
    "file) comes out at 2.09 too: the whole card runs at half of kvadvise's CUDA class (fitted on Turing and later), "
    "or the run was not on the GPU at all",
)
def test_qwen35_08b_on_gtx_1050_ti(bench: Any, doc: dict[str, Any]) -> None:
    """Qwen3.5-0.8B on a GTX 1050 Ti decodes at 41 % of kvadvise's plan.

    API: bench_speed.decode_estimate for row 2621 (card gtx-1050-ti, 112 GB/s, no profile): 120.54 t/s vs 50.01
    published (llmfit 1.1.3, 3 runs of 300 tokens against llama-server, Xeon E5-2680 v4 host; https://github.com/
    AlexsJones/llmfit/blob/3f44fd30a43d2619146f7bc0aa66c90aa54d78e6/llmfit-core/data/community/nvidia-geforce-gtx-1050-ti/
    1785427599-bb74bb6f.json, 2026-07-30). OVER 141 % (kvadvise far too fast). Not the hybrid: a probe with the file's
    Qwen3-4B Q4_K_M (17.32 t/s; kvadvise 36.18) is at 2.09, and the file's Qwen3-0.6B runs at 76.85 where a 0.4 GB
    model on 112 GB/s would stream at ~200. Reading: Pascal (sm_61: no tensor cores, dp4a MMVQ) runs llama.cpp's CUDA
    decode kernels far below its bandwidth, or llmfit's llama-server was a CPU or Vulkan build on that box (the file
    does not say). Missing rule: a decode class for pre-Turing NVIDIA cards; one box, backend unknown: held."""
    _check(bench, doc, 2621)


# -- regression guards (pass now) --------------------------------------------------------------------

GUARDS = [2602, 2603, 2604, 2605, 2606, 2607, 2608, 2610, 2611, 2612, 2613, 2614, 2615, 2616, 2618, 2619]


@pytest.mark.parametrize("row_id", GUARDS)
def test_regression_guards(bench: Any, doc: dict[str, Any], row_id: int) -> None:
    """Rows within ±25 % now (ratio kvadvise / published at writing).
    Radeon 8060S (kyuz0 results.json, llama-bench tg128): Qwen3-30B-A3B-2507 UD-Q6_K_XL Vulkan b7670 (2602, 0.852) and
    ROCm b7816 (2603, 0.923); GLM-4.7-Flash UD-Q8_K_XL Vulkan b9187 (2604, 0.843) and ROCm b9187 (2605, 0.894);
    gpt-oss-120b ROCm b9187 (2606, 0.804). DGX Spark (llmfit, llama-server): GLM-4.7-Flash Q4_K_M (2607, 1.092),
    Qwen3.5-4B (2613, 1.068), Qwen3.6-35B-A3B Q4_K_M (2616, 1.038). M5 Max (llmfit, Ollama): glm-4.7-flash (2608,
    1.147), lfm2.5:8b (2619, 0.907). RX 7900 XT ROCm (llmfit, llama-server): ERNIE-4.5-21B-A3B (2610, 1.216),
    Qwen3-Coder-30B-A3B (2611, 1.152), Qwen3.5-4B (2614, 1.092). M4 Pro (llmfit, llama-server): ERNIE-4.5-21B-A3B
    (2612, 0.923), Qwen3.5-4B (2615, 0.887). Radeon AI PRO R9700 Vulkan (geerlingguy): gpt-oss-20b (2618, 1.080)."""
    _check(bench, doc, row_id)


def test_every_row_is_checked_by_one_test() -> None:
    groups = [[2601], [2609], [2617], [2620], [2621], GUARDS]
    flat = [i for g in groups for i in g]
    assert len(flat) == len(set(flat))
    assert sorted(flat) == sorted(r["id"] for r in _extra()["rows"])


def test_ratios_at_writing(bench: Any, doc: dict[str, Any]) -> None:
    """Every row is estimated (no error, a positive figure) and its published figure is the row's own."""
    for r in _extra()["rows"]:
        est, pub, _ = _ratio(bench, doc, r["id"])
        assert est > 0 and pub == r["decode_tps"] and _row(doc, r["id"])["id"] == r["id"], r["id"]
