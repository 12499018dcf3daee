"""Round 21b: the latest Ollama and speed changes, through the commands users run.

Ollama's CPU batch (server/sched.go automaticGenerationBatch, v0.30.0 to v0.32.15 alike): the scheduler runs
``applyAutomaticGenerationBatch(completion, predictedCtx, ...)`` on every load of a completion model whose num_batch
is not set (routes.go usesAutomaticNumBatch: neither the request nor the Modelfile names it), where
``predictedCtx = effectiveLlamaServerContext(num_ctx, f, numParallel)`` = min(num_ctx, training context) x slots.
Without a GPU ``availableMemoryForPlacement`` returns 0, ``generationBatchFits`` returns true, and the batch is
``generationBatchForContext``: 2048 past 32,768, 1024 past 4,096, else 512; llm/llama_server.go appendBatchArgs
passes it as ``-b N -ub N``.

The stores are real on-disk Ollama stores (tests/ollama_fake.py build_store) holding tiny GGUFs
(tests/tinymodels.py); no Ollama server answers (attack_helpers.no_server: a closed port), the registry is off.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_server, run, use_store  # noqa: F401  (no_server: autouse)


def _go_batch(effective_ctx: int) -> int:
    """v0.32.15:server/sched.go generationBatchForContext (what a CPU-only load runs: no memory to check)."""
    return 2048 if effective_ctx > 32768 else 1024 if effective_ctx > 4096 else 512


def _store(tmp_path: Path, models: dict[str, tuple[str, int]]) -> Path:
    from ollama_fake import build_store
    from tinymodels import write_tiny_gguf

    root = tmp_path / "ostore"
    for name, (recipe, ctx) in models.items():
        p = write_tiny_gguf(tmp_path / f"{name}.gguf", recipe, n_ctx_train=ctx)
        build_store(root, p, hashlib.sha256(p.read_bytes()).hexdigest(), model=name)
    return root


@pytest.fixture
def qstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store with ``qa`` (qwen3, trained on 131,072 tokens) and ``qb`` (llama, 8,192)."""
    root = _store(tmp_path, {"qa": ("qwen3", 131072), "qb": ("llama", 8192)})
    use_store(monkeypatch, root, tmp_path)
    return root


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc, out, err = run(capsys, "ollama", *args, "--json")
    assert rc in (0, 3), (rc, err)
    return json.loads(out)


# --- (1) the CPU's automatic num_batch where kvadvise chooses the context ------------------------------------------


def test_r21b_cpu_recommended_context_runs_ollamas_batch(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Command: ``kvadvise ollama qa --device cpu --json`` (no --ctx: kvadvise recommends the context).
    kvadvise: recommends num_ctx 32,768 (the Modelfile it prints and writes: ``PARAMETER num_ctx 32768``, no
    num_batch) but plans that context at ``n_batch 2048, n_ubatch 512`` (the text's --verbose: "batch 2048/512");
    with ``--ctx 32768`` the same plan is -b 1024 -ub 1024 with twice the compute buffer.
    True (v0.32.15:server/sched.go load -> applyAutomaticGenerationBatch -> automaticGenerationBatch ->
    generationBatchForContext; availableMemoryForPlacement = 0 without a GPU, so generationBatchFits is true):
    Ollama loads the Modelfile's num_ctx 32,768 on the CPU as ``-b 1024 -ub 1024`` (llm/llama_server.go
    appendBatchArgs). The compute buffer planned is about half what llama-server allocates (UNDER).
    Missing rule: runtime.shape applies the CPU batch only when the request names n_ctx; the recommendation's
    chosen context (and each option's) needs the same batch_for_context.
    Fixed: the search plans every context it tries at the batch Ollama picks for it (RunConfig.auto_batch).
    """
    plan = _json(capsys, "qa", "--device", "cpu")
    ctx = plan["config"]["n_ctx"]
    assert plan["ollama"]["modelfile_parameters"].get("num_batch") is None  # Ollama chooses the batch itself
    want = _go_batch(ctx)
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (want, want), (ctx, plan["config"])
    fixed = _json(capsys, "qa", "--device", "cpu", "--ctx", str(ctx))
    assert (fixed["config"]["n_batch"], fixed["config"]["n_ubatch"]) == (want, want)
    assert plan["memory"]["compute_bytes"] == fixed["memory"]["compute_bytes"], (
        plan["memory"]["compute_bytes"], fixed["memory"]["compute_bytes"])  # fmt: skip


def test_r21b_cpu_target_ctx_past_32k_runs_2048(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Command: ``kvadvise ollama qa --device cpu --target-ctx 65536 --json``.
    kvadvise: num_ctx 65,536 (Modelfile ``PARAMETER num_ctx 65536``, no num_batch), planned at -b 2048 -ub 512;
    ``--ctx 65536`` plans -b 2048 -ub 2048 (compute 278,921,216 B there vs 69,730,304 B here: 75 % UNDER).
    True (v0.32.15:server/sched.go generationBatchForContext: 65,536 > 32,768 -> 2048; no GPU -> no memory
    check): Ollama runs ``-b 2048 -ub 2048``. Missing rule: as above, the batch of the context kvadvise chose.
    """
    plan = _json(capsys, "qa", "--device", "cpu", "--target-ctx", "65536")
    ctx = plan["config"]["n_ctx"]
    assert ctx == 65536
    assert plan["ollama"]["modelfile_parameters"].get("num_batch") in (None, 2048)
    assert plan["config"]["n_ubatch"] == _go_batch(ctx) == 2048, plan["config"]


def test_r21b_cpu_users_batch_is_the_whole_context(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Command: ``kvadvise ollama qa --device cpu --users 3 --json``.
    kvadvise: OLLAMA_NUM_PARALLEL=3, num_ctx 32,768 per user (n_ctx 98,304 in all), planned at -ub 512.
    True (v0.32.15:server/sched.go effectiveLlamaServerContext: min(num_ctx, train) x numParallel = 98,304 >
    32,768 -> generationBatchForContext 2048): Ollama runs ``-b 2048 -ub 2048`` (UNDER: a quarter of the
    compute buffer's batch). Missing rule: the CPU batch for the recommended context x slots.
    """
    plan = _json(capsys, "qa", "--device", "cpu", "--users", "3")
    total = plan["config"]["n_ctx"]
    assert plan["config"]["n_parallel"] == 3
    assert plan["config"]["n_ubatch"] == _go_batch(total), plan["config"]


def test_r21b_cpu_explicit_ctx_batches_guard(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression guard (passes): with --ctx given, the CPU batch is Go's for num_ctx x slots.
    ``kvadvise ollama qa --device cpu --ctx N [--parallel P] --json``: 4096 -> 512, 4097 -> 1024, 32768 -> 1024,
    65536 -> 2048, 2048 x 4 slots -> 1024, 8192 x 4 -> 1024 (v0.32.15:server/sched.go generationBatchForContext on
    effectiveLlamaServerContext)."""
    for ctx, par in ((4096, 1), (4097, 1), (32768, 1), (65536, 1), (2048, 4), (8192, 4)):
        plan = _json(capsys, "qa", "--device", "cpu", "--ctx", str(ctx), "--parallel", str(par))
        want = _go_batch(min(ctx, 131072) * par)
        assert plan["config"]["n_ubatch"] == want, (ctx, par, plan["config"])


def test_r21b_cpu_4k_batch_is_512_both(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Command: ``kvadvise ollama qa --device cpu --ctx 4096 --json`` (Ollama's CPU default num_ctx: routes.go
    defaultNumCtx 4096 under 23 GiB of VRAM). kvadvise: config n_batch 2048, n_ubatch 512 (--verbose "batch
    2048/512"). True: automaticGenerationBatch sets opts.NumBatch = 512 and llm/llama_server.go appendBatchArgs
    passes ``-b 512 -ub 512`` (opts.NumBatch > 0). Minor (n_batch: llama-server's output buffer is sized by
    n_outputs_max, not n_batch), but the configuration shown is not the one Ollama runs. Missing rule: on the CPU
    set n_batch = n_ubatch = batch_for_context even when it equals the default -ub.
    """
    plan = _json(capsys, "qa", "--device", "cpu", "--ctx", "4096")
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (512, 512), plan["config"]


def test_r21b_api_plan_target_ctx_cpu_batch(qstore: Path) -> None:
    """API: ``kvadvise.plan("qa", PlanRequest(device="cpu", target_ctx=65536), runtime="ollama")``.
    kvadvise: config n_ctx 65,536, n_batch 2048, n_ubatch 512 (and PlanRequest(device="cpu") alone: 32,768 at
    2048/512), where PlanRequest(n_ctx=16384, device="cpu") gets Ollama's 1024/1024.
    True (v0.32.15:server/sched.go generationBatchForContext): 65,536 -> -b 2048 -ub 2048; 32,768 -> 1024/1024.
    """
    import kvadvise
    from kvadvise import PlanRequest

    for req in (PlanRequest(device="cpu", target_ctx=65536), PlanRequest(device="cpu")):
        p = kvadvise.plan("qa", req, runtime="ollama")
        want = _go_batch(p.config.n_ctx)
        assert (p.config.n_batch, p.config.n_ubatch) == (want, want), (req.target_ctx, p.config.n_ctx)


# --- (5) speed: a vision tower inside a store blob is not read per token either ------------------------------------


def test_r21b_store_blob_tower_not_read_per_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gemma3 blob as Ollama's converter writes it (``gemma3.vision.*`` keys, ``v.*`` tower tensors and
    ``mm.mm_input_projection`` inside the model blob, 53 MB of them here) beside the same text model without them.
    Command: ``kvadvise ollama g3v --ctx 4096 --json`` with ``--device cpu`` / ``--gpu m1-max-64gb`` /
    ``--gpu rtx-4090``, and the same for ``g3t`` (no tower).
    kvadvise: decode 180-290 t/s (g3v) vs 1,480-2,120 t/s (g3t) on this machine's CPU, 692 vs 828 on the M1 Max, 1,706 vs 1,897 on the
    4090: the tower is read per token for a store blob, while the last commit stops reading it for a built-in
    profile (ModelSpec.tower_bytes = Profile.projector_bytes), so ``kvadvise ollama gemma3:4b`` from the profile and
    from the pulled blob disagree by the 834 MB tower.
    True: a text token's graph (Ollama's model/models/gemma3 Forward without images; llama.cpp's gemma3 graph) reads
    no v.* / mm.* tensor: the decode rate is the text model's (within a few %). Speed UNDER (too slow), not memory.
    Missing rule: from_gguf (or the Ollama resolver for a blob) sets tower_bytes to the v.*/mm.*/a.* tensors' bytes.
    """

    _gemma3_store(tmp_path, monkeypatch)
    bad = []
    for dev in (("--device", "cpu"), ("--gpu", "m1-max-64gb"), ("--gpu", "rtx-4090")):
        rate = {}
        for m in ("g3t", "g3v"):
            plan = _json(capsys, m, "--ctx", "4096", *dev)
            rate[m] = plan["decode_estimate"]["at_context"][0]["tokens_per_s"]
        if rate["g3v"] < 0.95 * rate["g3t"]:
            bad.append((dev[-1], round(rate["g3v"]), round(rate["g3t"])))
    assert not bad, bad


# --- several models on the CPU ---------------------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="held: several models on the CPU (Ollama keeps up to 3 in RAM) are refused: the replay of sched.go places models on GPUs",
)
def test_r21b_several_models_on_the_cpu_are_planned(qstore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Command: ``kvadvise ollama qa qb --device cpu --ctx 16384``.
    kvadvise: exit 2, "no GPU to place the models on: Ollama's scheduler places models on GPUs".
    True (v0.32.15:server/sched.go processPending): with no GPU, maxRunners = defaultModelsPerGPU (3) x max(0, 1)
    = 3, and a second model's load(requireFull=true) skips the pre-flight eviction check (``len(loadGpus) > 0`` is
    false), so a CPU-only Ollama keeps up to 3 models loaded together in RAM, each a llama-server with its own
    automatic -b/-ub (qa at 16,384: 1024; qb capped at its 8,192 training context: 1024). Missing rule:
    together.hardware refuses a CPU-only machine instead of planning the runners in system RAM.
    """
    rc, _out, err = run(capsys, "ollama", "qa", "qb", "--device", "cpu", "--ctx", "16384")
    assert rc in (0, 3), (rc, err)
    assert "no GPU to place" not in err


# --- an embedding model's batch (llm/llama_server.go) ---------------------------------------------------------------


@pytest.mark.parametrize("dev", [("--device", "cpu"), ("--gpu", "rtx-4090")])
def test_r21b_embedding_model_batch_single_plan(
    dev: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Command: ``kvadvise ollama bge-m3 --ctx 8192 --json`` (built-in profile) on the CPU and on an RTX 4090.
    kvadvise: config n_batch 2048, n_ubatch 512, compute 35,655,808 B on the 4090 (33.5 MB on the CPU); the
    several-model plan ``kvadvise ollama qwen3:8b bge-m3 --gpu rtx-4090 --ctx 8192`` loads bge-m3 with num_batch
    2048 (scheduler.py says so too); the single plan at ``--batch 1024`` is 71.3 MB, at 4096 285 MB, so -ub 2048 is
    about 143 MB: the single plan's compute is ~75 % UNDER.
    True (v0.30.0 - v0.32.15: server/routes.go shouldApplyEmbeddingBatchDefault -> llm.WithDefaultEmbeddingNumBatch:
    opts.NumBatch = DefaultEmbeddingNumBatchForContext(num_ctx) = min(2048, 8192) = 2048; llm/llama_server.go
    appendBatchArgs(embedding): ``--embedding -b 2048 -ub 2048`` (embeddingBatchSize = min(2048, num_ctx x 1))).
    Missing rule: runtime.shape skips embedding models (``not scheduler.is_embedding(spec)``) but gives them no
    batch of their own: -b = -ub = min(2048, num_ctx x slots) on every device, as together.py already does.
    """
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    plan = _json(capsys, "bge-m3", "--ctx", "8192", *dev)
    n_ctx = plan["config"]["n_ctx"]
    want = min(2048, n_ctx)
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (want, want), plan["config"]


# --- the automatic num_batch on a GPU: the single-model plan never runs it ------------------------------------------


def _mib(b: int) -> float:
    return b / 2**20


def test_r21b_gpt_oss_120b_strix_halo_published_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Command: ``kvadvise ollama gpt-oss:120b --gpu ryzen-ai-max-395-128gb --device rocm --ctx 262144
    --parallel 2 --ollama-version 0.30.2 --json``.
    kvadvise: -b 2048 -ub 512; ROCm0 K/V 9,270 MiB, host compute 140 MiB.
    True: ollama/ollama#16480 (2026-06-04, Ollama 0.30.2, Radeon 8060S, ROCm available 120.6 GiB) starts
    ``llama-server ... -c 262144 -np 2 --flash-attn on -b 1024 -ub 1024`` (server/sched.go
    automaticGenerationBatch: 2048 for 262,144 tokens, lowered to 1024 by generationBatchHasHeadroom); the same
    load's memory breakdown (ollama/ollama#16416, 2026-06-02) prints ``ROCm0 ... 61223 + 9306 + 796`` and
    ``Host 1104 + 0 + 281`` MiB: K/V 9,306 MiB (kvadvise 36 MiB UNDER: the SWA cache's n_ubatch cells) and host
    compute 281 MiB (kvadvise 141 MiB UNDER, 50 %). Missing rule: the single-model plan on a GPU never applies
    scheduler.automatic_batch (only together.py's scheduler replay and, since the last commit, the CPU do).
    Fixed (RunConfig.auto_batch, scheduler.batch_steps), planned on the memory that machine's ROCm reported (120.6
    GiB, ``--vram``): the catalogue card is its 96 GiB BIOS share, where Ollama's 75 % headroom for -ub 1024 is not
    met by its 78.6 GB prediction (the file and an f16 K/V of 262,144 tokens) and -ub 512 is what it runs.
    """
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    plan = _json(capsys, "gpt-oss:120b", "--vram", "120.6GiB", "--bandwidth", "256", "--device", "rocm", "--ctx",
                 "262144", "--parallel", "2", "--ollama-version", "0.30.2")  # fmt: skip
    assert plan["config"]["n_ubatch"] == 1024, plan["config"]
    card = _json(capsys, "gpt-oss:120b", "--gpu", "ryzen-ai-max-395-128gb", "--device", "rocm", "--ctx", "262144",
                 "--parallel", "2", "--ollama-version", "0.30.2")  # fmt: skip
    assert card["config"]["n_ubatch"] == 512, card["config"]  # 96 GiB: 0.75 x 103.1 GB < 78.6 GB predicted
    dev = plan["memory"]["devices"][0]
    assert abs(_mib(dev["kv_bytes"]) - 9306) <= 1, _mib(dev["kv_bytes"])
    assert abs(_mib(plan["memory"]["host"]["compute_bytes"]) - 281) <= 2, _mib(plan["memory"]["host"]["compute_bytes"])


@pytest.mark.xfail(
    strict=True,
    reason="held: ROCm0's compute 796 MiB printed, 433 planned at -ub 1024 for gpt-oss-120b at 262,144 cells x 2 slots: the cause is not known here (a ROCm log without the graph)",
)
def test_r21b_gpt_oss_120b_strix_halo_rocm_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Command: as above with ``--batch 1024`` (the -b/-ub Ollama 0.30.2 passed, so the batch is not at issue).
    kvadvise: ROCm0 compute 433 MiB (K/V 9,306 and host compute 281 MiB agree with the log).
    True: ollama/ollama#16416 (2026-06-02): ``ROCm0 (8060S Graphics) | ... (71326 = 61223 + 9306 + 796)``: 796 MiB
    of compute on ROCm0: kvadvise 363 MiB (46 %) UNDER on the device. Rule unknown (guess: the ROCm/HIP flash
    attention path for gpt-oss's attention sinks at 2 x 131,072 cells keeps an f32 KQ or a larger mask per
    ubatch than the CUDA path kvadvise sizes).
    """
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    plan = _json(capsys, "gpt-oss:120b", "--gpu", "ryzen-ai-max-395-128gb", "--device", "rocm", "--ctx", "262144",
                 "--parallel", "2", "--ollama-version", "0.30.2", "--batch", "1024")  # fmt: skip
    dev = plan["memory"]["devices"][0]
    assert _mib(dev["compute_bytes"]) >= 796 * 0.95, _mib(dev["compute_bytes"])


def test_r21b_gpu_single_plan_runs_ollamas_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Command: ``kvadvise ollama qwen3:8b --gpu rtx-4090 --ctx 16384 --json`` (and ``--gpu m1-max-64gb``).
    kvadvise: -b 2048 -ub 512 (--verbose "batch 2048/512"), compute 144 MiB on the 4090.
    True (v0.32.15:server/sched.go load: applyAutomaticGenerationBatch with predictedCtx 16,384 ->
    generationBatchForContext 1024; generationBatchFits: a ~6 GiB prediction is under 75 % of the ~23.5 GiB free
    and the 768 MiB surcharge fits under 80 %; flash attention on/auto, so not the CUDA no-FA cap): Ollama runs
    ``-b 1024 -ub 1024`` on both cards; the compute buffer grows with -ub (UNDER). Missing rule: as above.
    Fixed: scheduler.batch_steps replays automaticGenerationBatch for the plan's GPUs (RunConfig.auto_batch).
    """
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    bad = []
    for gpu in ("rtx-4090", "m1-max-64gb"):
        plan = _json(capsys, "qwen3:8b", "--gpu", gpu, "--ctx", "16384")
        if plan["config"]["n_ubatch"] != _go_batch(plan["config"]["n_ctx"]):
            bad.append((gpu, plan["config"]["n_batch"], plan["config"]["n_ubatch"]))
    assert not bad, bad


# --- speed: Apple rows of current builds against the decode range ---------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="held: Metal at current builds decodes a small dense model 19-21 % faster than planned on M1 Max, M2 Pro and M4 alike: Metal's fixed time per layer (145 us), not the M1 class",
)
@pytest.mark.parametrize(
    ("gpu", "measured", "source"),
    [
        ("m1-max-64gb", 46.2, "https://github.com/brand-o/normiebench/issues/40 (2026-03-08, MacBook Pro M1 Max 64GB)"),
        ("m2-pro-16gb", 33.0, "https://github.com/AlexsJones/llmfit/pull/1031 (2026-09-13, apple-m2-pro)"),
        ("m4-16gb", 20.87, "https://github.com/brand-o/normiebench/issues/3 (2026-03-08, Mac Mini M4 16GB)"),
    ],
    ids=["m1-max", "m2-pro", "m4"],
)
def test_r21b_apple_decode_inside_its_range(
    gpu: str, measured: float, source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Command: ``kvadvise ollama llama3.1:8b --gpu GPU --ctx 512 --json`` (decode_estimate low..high).
    kvadvise: M1 Max 36.4 t/s (30.2-43.7), M2 Pro 26.8 (22.2-32.1), M4 17.0 (14.1-20.4).
    True: llama.cpp Metal tg128 of Llama 3.1 8B Q4_K_M: M1 Max 46.2 t/s (normiebench #40), M2 Pro 33.0
    (llama.cpp; Ollama llama3.1:8b-instruct-q4_K_M 34.1; llmfit #1031), M4 20.87 (normiebench #3): kvadvise 21 %,
    19 %, 19 % too slow and each measurement above its own high bound. The new M1 class (0.56) was fitted on
    XiongjieDai's 2023-24 M1 Max row (35.73 t/s); a current build decodes the same model ~30 % faster on the
    same M1 Max, and the M2 Pro / M4 rows (Metal's 0.80) are off by as much: the gap looks like Metal's
    per-layer fixed time (LAYER_OVERHEAD_S['metal']) at current builds, not M1's bandwidth share. Speed UNDER
    (too slow: conservative, but `compare` and `gpus` show M-series cards ~20 % slower than they are).
    """
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    est = _json(capsys, "llama3.1:8b", "--gpu", gpu, "--ctx", "512")["decode_estimate"]
    assert est["low"] <= measured <= est["high"], (gpu, round(est["tokens_per_s"], 1), est["low"], est["high"], source)


# --- (3) an Ollama-format architecture that Ollama's own llama-server loads (llama/compat) --------------------------


@pytest.mark.xfail(
    strict=True,
    reason="held, in part: Ollama's llama-server loads its own engine's blobs (gptoss, qwen25vl) through its llama/compat renames; a gptoss blob of a library name is planned from its built-in profile now, a blob of another name (and qwen25vl) is still refused: the compat renames of keys and tensors are not replayed",
)
@pytest.mark.parametrize(
    ("recipe", "arch", "loads_as"), [("gpt-oss", "gptoss", "gpt-oss"), ("qwen2", "qwen25vl", "qwen2vl")]
)
def test_r21b_ollama_format_blob_runs_on_ollamas_llama_server(
    recipe: str, arch: str, loads_as: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A store blob in Ollama's own naming, as ``ollama pull gpt-oss:20b`` (architecture ``gptoss``, the library
    blob sha256-b112e727...) or ``ollama pull qwen2.5vl`` (``qwen25vl``) leaves it.
    Command: ``kvadvise ollama y{arch} --device cpu --ctx 4096 --ollama-version 0.32.15``.
    kvadvise: exit 2, "llama.cpp (b11312) does not know the architecture 'gptoss' ... so there is nothing to
    plan", hint "a llama.cpp build that supports it is needed" (the built-in profile of gpt-oss:20b is planned).
    True: Ollama 0.30.0 - 0.32.15 ships its llama-server with llama/compat/llama-ollama-compat.cpp, whose
    translate_metadata dispatches ``handle_gptoss`` (arch_name -> "gpt-oss") and ``handle_qwen25vl`` (-> "qwen2vl",
    qwen25vl.* keys mirrored); ollama/ollama#16416 (2026-06-02, 0.30) logs "handle_gptoss: detected Ollama-format
    gpt-oss GGUF; applying compatibility fixes" and a full memory breakdown for the gpt-oss:120b library blob. So
    the model loads and has a plan. Missing rule: for Ollama >= 0.30, read a store blob's architecture through
    the compat layer's renames (gptoss, qwen25vl, glm4moelite, deepseekocr, olmo3, glmocr, ...) before
    from_gguf's known-architecture check.
    """
    import hashlib as _h

    from ollama_fake import build_store
    from tinymodels import rewrite_gguf, write_tiny_gguf

    src = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe)
    blob = rewrite_gguf(src, tmp_path / f"{arch}.gguf", arch=arch)
    root = tmp_path / "ostore"
    build_store(root, blob, _h.sha256(blob.read_bytes()).hexdigest(), model=f"y{arch}")
    use_store(monkeypatch, root, tmp_path)
    rc, _out, err = run(capsys, "ollama", f"y{arch}", "--device", "cpu", "--ctx", "4096", "--ollama-version", "0.32.15")
    assert rc in (0, 3), (rc, err, loads_as)


# --- Ollama >= 0.30: an in-blob tower is the runner's --mmproj --------------------------------------------------------


def test_r21b_inblob_tower_is_mmproj_with_raised_fit_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gemma3 blob with its vision tower inside (v.* and mm.* tensors: 53,411,328 B), beside the same text model
    without it. Command: ``kvadvise ollama g3v --gpu rtx-4090 --ctx 4096 --ollama-version 0.32.15 --json`` and the
    same for ``g3t``.
    kvadvise: both plans keep the same budget (24,146,608,128 B: a 1 GiB margin), ``memory.projector`` None: the
    tower is planned as text weights and nothing more.
    True (v0.32.15:llm/llama_server.go NewLlamaServer: ``compatClipArches["gemma3"]`` and v.* tensors -> projectors =
    [modelPath], mmprojMemoryRequirement = the v./mm./a. tensors' bytes; llamaServerLaunchConfig.extraEnvsForStart ->
    LLAMA_ARG_FIT_TARGET = ceil((mmproj + 1 GiB) / MiB) = 1,075 MiB in place of 1,024; appendMMProjArgs ``--mmproj``
    the blob itself, offloaded to the GPU): llama-server's --fit keeps at least ceil(mmproj / MiB) = 51 MiB more free
    than for the text model (plus the clip compute the projector allocates), so the budget is that much smaller (for
    gemma3:4b's 834 MB tower: 796 MiB). Missing rule: rules.projector_margin_bytes for an in-blob tower
    (OllamaModel.projector_bytes is 0 for a store blob whose projector is inline).
    """
    import numpy as np

    vt = _gemma3_store(tmp_path, monkeypatch)
    mmproj = sum(int(np.prod(s)) * np.dtype(t).itemsize for s, t in vt.values())
    assert mmproj == 53_411_328
    args = ("--gpu", "rtx-4090", "--ctx", "4096", "--ollama-version", "0.32.15")
    plain = _json(capsys, "g3t", *args)["budget"]["budget_bytes"]
    vision = _json(capsys, "g3v", *args)["budget"]["budget_bytes"]
    raise_mib = -(-mmproj // 2**20)
    assert plain - vision >= raise_mib * 2**20, (plain, vision, raise_mib)


def test_r21b_inblob_tower_is_the_projector_not_text_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, the whole plan (kvadvise.backends.ollama.towers). Ollama 0.32.15: llama/compat hides the tower from
    the text model's loader (llama-ollama-compat.cpp add_skip_prefix "v.", "mm.") and mtmd loads it from the blob
    (handle_gemma3_clip: patch and position embeddings promoted to F32): the text weights are g3t's to the byte, the
    projector holds the tower's tensors (the two embeddings at 4 bytes a value) and the compute of one 896 x 896
    warmup image, the budget is Ollama's raise (51 MiB) less, and no LLAMA_ARG_FIT_TARGET is advised (Ollama sets it;
    one set on the server would stand for every model). Ollama 0.20.2's runners load the blob whole: unchanged."""
    import numpy as np

    vt = _gemma3_store(tmp_path, monkeypatch)
    args = ("--gpu", "rtx-4090", "--ctx", "4096", "--ollama-version", "0.32.15")
    plain, vision = _json(capsys, "g3t", *args), _json(capsys, "g3v", *args)
    dev_t, dev_v = plain["memory"]["devices"][0], vision["memory"]["devices"][0]
    assert dev_v["weights_bytes"] == dev_t["weights_bytes"]
    proj = vision["memory"]["projector"]
    stored = {n: int(np.prod(s)) * np.dtype(t).itemsize for n, (s, t) in vt.items()}
    f32 = ("v.patch_embedding.weight", "v.position_embedding.weight")
    want = sum(-(-(b * 2 if n in f32 else b) // 128) * 128 for n, b in stored.items())  # CUDA's 128-byte alignment
    assert proj["weights_bytes"] == want, (proj["weights_bytes"], want)
    assert proj["compute_bytes"] == 22 * 4096 * 1152  # kvadvise.planner.projector: flash attention's ViT block
    assert plain["budget"]["budget_bytes"] - vision["budget"]["budget_bytes"] == 51 * 2**20
    assert vision["ollama"]["settings"]["fit_target_mib"] is None
    assert "LLAMA_ARG_FIT_TARGET" not in vision["ollama"]["env"], vision["ollama"]["env"]
    assert any("its own --mmproj" in n for n in vision["notes"])
    old = ("--gpu", "rtx-4090", "--ctx", "4096", "--ollama-version", "0.20.2")
    t20, v20 = _json(capsys, "g3t", *old), _json(capsys, "g3v", *old)
    assert v20["memory"].get("projector") is None
    assert t20["budget"]["budget_bytes"] == v20["budget"]["budget_bytes"]


def test_r21b_gptoss_store_blob_of_a_library_name_is_planned_from_its_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ollama pull gpt-oss:20b` leaves a blob of Ollama's own conversion (architecture ``gptoss``), which llama.cpp's
    loader reads through Ollama's llama/compat renames; `kvadvise ollama gpt-oss:20b` refused it ("llama.cpp does not
    know the architecture 'gptoss'", exit 2) where the built-in profile plans the same model. Now the blob of a
    library name is planned from that profile, and the plan says so."""
    import hashlib as _h
    import json

    from ollama_fake import build_store
    from tinymodels import rewrite_gguf, write_tiny_gguf

    src = write_tiny_gguf(tmp_path / "gpt-oss.gguf", "gpt-oss")
    blob = rewrite_gguf(src, tmp_path / "gptoss.gguf", arch="gptoss")
    root = tmp_path / "ostore"
    build_store(root, blob, _h.sha256(blob.read_bytes()).hexdigest(), model="gpt-oss", tag="20b")
    use_store(monkeypatch, root, tmp_path)
    rc, out, err = run(capsys, "ollama", "gpt-oss:20b", "--gpu", "rtx-4090", "--ctx", "8192", "--json")
    assert rc in (0, 3), err
    doc = json.loads(out)
    assert doc["model"]["architecture"] == "gpt-oss"
    assert "Ollama's own gptoss conversion" in json.dumps(doc["ollama"]), doc["ollama"]


def _gemma3_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[tuple[int, ...], object]]:
    """A store of two gemma3 blobs, ``g3t`` (text) and ``g3v`` (the same with a small vision tower in the blob, as
    Ollama's own conversion writes it: ``gemma3.vision.*`` keys, ``v.*`` and ``mm.*`` tensors); the tower's tensors."""
    import numpy as np
    from ollama_fake import build_store
    from tinymodels import rewrite_gguf, write_tiny_gguf

    txt = write_tiny_gguf(tmp_path / "g3.gguf", "gemma3", n_vocab=512)
    vt: dict[str, tuple[tuple[int, ...], object]] = {
        "v.patch_embedding.weight": ((1152, 3, 14, 14), np.float16),
        "v.position_embedding.weight": ((4096, 1152), np.float16),
        "v.blk.0.attn_q.weight": ((1152, 1152), np.float16),
        "v.blk.0.ffn_up.weight": ((4304 * 4, 1152), np.float16),
        "v.post_layernorm.weight": ((1152,), np.float32),
        "mm.mm_input_projection.weight": ((128, 1152), np.float16),
    }
    keys = {"gemma3.vision.block_count": 1, "gemma3.vision.image_size": 896, "gemma3.vision.patch_size": 14,
            "gemma3.vision.num_channels": 3, "gemma3.vision.attention.head_count": 16,
            "gemma3.vision.embedding_length": 1152}  # fmt: skip
    g = rewrite_gguf(txt, tmp_path / "g3v.gguf", uints=keys, zeros=vt)  # type: ignore[arg-type]
    root = tmp_path / "ostore"
    build_store(root, txt, hashlib.sha256(txt.read_bytes()).hexdigest(), model="g3t")
    build_store(root, g, hashlib.sha256(g.read_bytes()).hexdigest(), model="g3v")
    use_store(monkeypatch, root, tmp_path)
    return vt


def test_r21b_inblob_tower_is_no_text_matmul(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvadvise.model.architecture.from_gguf on the blob with its tower: the tower's bytes stay ModelSpec.tower_bytes,
    but no text token multiplies by them (active_params, the prompt's FLOPs) and the text model's loader does not
    repack them (matmul_weights: a v.* weight was taken for the output layer's, block -1)."""
    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file

    _gemma3_store(tmp_path, monkeypatch)
    text, tower = from_gguf(read_file(tmp_path / "g3.gguf")), from_gguf(read_file(tmp_path / "g3v.gguf"))
    assert tower.tower_bytes == 53_411_328 and text.tower_bytes == 0
    assert tower.active_params == text.active_params
    assert [(w.n_bytes, w.block) for w in tower.matmul_weights] == [(w.n_bytes, w.block) for w in text.matmul_weights]


def test_r21b_profile_tower_is_the_projector_on_llama_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kvadvise ollama gemma3:4b --gpu rtx-4090 --ctx 8192`` from the built-in profile (no blob in the store): the
    library blob holds its 834 MB tower (profiles/ollama_library.json), which Ollama 0.32.15 passes as its own --mmproj
    (kvadvise.backends.ollama.towers.profile_tower). Only its size is known, so it is planned as a projector blob whose
    header does not read (rules.projector_margin_bytes): out of the text weights, the budget less
    ceil((834 MB + 1 GiB) / MiB) MiB, nothing advised for LLAMA_ARG_FIT_TARGET. Ollama 0.20.2 (its own runners) loads
    the blob whole: the weights keep the tower, the budget its 1 GiB margin."""
    use_store(monkeypatch, tmp_path / "store", tmp_path)
    args = ("gemma3:4b", "--gpu", "rtx-4090", "--ctx", "8192")
    new, old = _json(capsys, *args, "--ollama-version", "0.32.15"), _json(capsys, *args, "--ollama-version", "0.20.2")
    tower = 834_000_000
    assert old["memory"]["weights_bytes"] - new["memory"]["weights_bytes"] == tower
    raise_bytes = -(-(tower + 2**30) // 2**20) * 2**20
    # (a profile's weights are a published size: 3 % of them is kept free, kvadvise.planner.budget, less 3 % of the tower)
    assert old["budget"]["budget_bytes"] - new["budget"]["budget_bytes"] == raise_bytes - tower * 3 // 100
    assert "LLAMA_ARG_FIT_TARGET" not in new["ollama"]["env"]
    assert any("1 GiB of margin stands in" in n for n in new["notes"])
