"""Several models on one Ollama server (issue 29.4): the rules of Ollama's server/sched.go (fb3076099687) as
kvadvise.backends.ollama.scheduler replays them, and ``kvadvise ollama A B C`` against a fake server whose
loaded models (/api/ps) take GPU memory."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ollama_fake import FakeOllama, build_store, closed_port_url, ps_entry, running_fake

from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.together import keep_alive_seconds
from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import RunConfig, estimate

GiB = 1 << 30
MiB = 1 << 20
SHA = "5c4a1c4f4bb5ac2a9ee5da5e5f4ab76d9ba9e5e4a6b2be5e1d0b6d9e1e9dbb2a"  # any: the store links the file


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def req(
    name: str,
    file_gib: float,
    *,
    plan_gib: float | None = None,
    ctx: int = 4096,
    parallel: int = 1,
    completion: bool = True,
    keep_alive_s: float = sched.DEFAULT_KEEP_ALIVE_S,
    key: str | None = None,
) -> sched.Request:
    """A model with Llama-3-8B-like shapes (32 layers, 4096 wide, 32 heads, 8 KV heads), its planned size per
    GPU split evenly over the GPUs it is placed on."""
    plan = int((plan_gib if plan_gib is not None else file_gib) * GiB)
    return sched.Request(
        name=name,
        model_key=key or f"name:{name}",
        file_bytes=int(file_gib * GiB),
        n_layer=32,
        n_embd=4096,
        n_head_max=32,
        n_head_kv_min=8,
        num_ctx=ctx,
        num_parallel=parallel,
        completion=completion,
        keep_alive_s=keep_alive_s,
        fit_target_bytes=1024 * MiB,
        footprint=lambda _ctx, _b, frees: tuple(plan // len(frees) for _ in frees),
    )


def gpus(*free_gib: float, total_gib: float = 24.0) -> tuple[sched.Gpu, ...]:
    return tuple(sched.Gpu(i, f"GPU{i}", int(total_gib * GiB), int(f * GiB)) for i, f in enumerate(free_gib))


# --- the rules of server/sched.go -------------------------------------------------------------------------


def test_predict_server_vram_is_ollamas_formula() -> None:
    """llm.PredictServerVRAM: file + 2 x layers x min(head_count_kv) x (embedding_length / max(head_count)) x
    min(num_ctx, n_ctx_train) x num_parallel x 2 bytes (f16 whatever the cache type)."""
    r = req("m", 4.0, ctx=8192, parallel=2)
    assert sched.predict_server_vram(r) == 4 * GiB + 2 * 32 * 8 * 128 * 8192 * 2 * 2
    no_kv_heads = sched.Request(**{**_fields(r), "n_head_kv_min": 0})  # a recurrent layer: Ollama takes 1
    assert sched.predict_server_vram(no_kv_heads) == 4 * GiB + 2 * 32 * 1 * 128 * 16384 * 2


def _fields(r: sched.Request) -> dict[str, object]:
    return {f: getattr(r, f) for f in r.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("ctx", "predicted_gib", "available_gib", "batch"),
    [
        (4096, 5, 24, 512),  # <= 4k: 512
        (8192, 5, 24, 1024),  # > 4k: 1024 when it fits with 75 % headroom
        (65536, 5, 24, 2048),  # > 32k: 2048 with 60 % headroom and its 2 GiB surcharge
        (65536, 16, 24, 1024),  # 16 > 60 % of 24: one step down
        (65536, 19, 24, 512),  # 19 > 75 % of 24 (and the 768 MiB would not fit under 80 %)
    ],
)
def test_automatic_batch(ctx: int, predicted_gib: int, available_gib: int, batch: int) -> None:
    r = req("m", 1.0, ctx=ctx)
    assert sched.automatic_batch(r, predicted_gib * GiB, available_gib * GiB, gpus(available_gib)) == batch


def test_automatic_batch_without_flash_attention_on_a_small_cuda_card() -> None:
    r = sched.Request(**{**_fields(req("m", 1.0, ctx=8192)), "flash_attention": False})
    assert sched.automatic_batch(r, GiB, 8 * GiB, gpus(8, total_gib=8)) == 256
    assert sched.automatic_batch(r, GiB, 20 * GiB, gpus(20)) == 512


def _lookup(steps: tuple[tuple[int, int], ...], ctx: int) -> int:
    """RunConfig.auto_batch as memory.auto_batched reads it."""
    return next((b for upto, b in steps if ctx <= upto), steps[-1][1])


def test_batch_steps_by_hand() -> None:
    """scheduler.batch_steps for one 24 GiB GPU with 20 GiB free and a 4 GiB file of Llama-3-8B's shape (Ollama's
    prediction: the file + 131,072 bytes of f16 K/V per token). By hand, sched.go automaticGenerationBatch:
    up to 4,096 tokens 512; past it 1024 while predicted <= 75 % of 20 GiB (15 GiB: 90,112 tokens) and the 768 MiB
    surcharge fits under 80 % (16 GiB - 768 MiB: 92,160 tokens, the higher); past 32,768 2048 while predicted <= 60 %
    (12 GiB: 65,536 tokens), then 1024 up to 90,112 tokens, then 512."""
    r = req("m", 4.0)
    steps = sched.batch_steps(r, gpus(20), upto=131072)
    per_token = 2 * 32 * 8 * 128 * 2
    assert per_token == 131072
    assert steps == ((4096, 512), (32768, 1024), (65536, 2048), (90112, 1024), (131072, 512)), steps
    assert ((15 - 4) * GiB // per_token, (16 * GiB - 768 * MiB - 4 * GiB) // per_token) == (90112, 92160)


@pytest.mark.parametrize(
    ("frees", "file_gib", "fa"),
    [((20.0,), 4.0, True), ((7.5,), 2.0, True), ((7.5,), 2.0, False), ((23.0,), 20.0, True), ((),  4.0, True),
     ((11.0, 5.0), 6.0, True), ((9.0, 9.0), 9.0, True), ((20.0,), 4.0, False)],
)  # fmt: skip
def test_batch_steps_is_automatic_batch_at_every_context(frees: tuple[float, ...], file_gib: float, fa: bool) -> None:
    """The steps give at every whole context what automaticGenerationBatch gives for that context on the GPUs
    selectLlamaServerPlacement picks (scheduler._placement), nothing loaded: checked at every 64th token and at each
    step's bounds and the token after it, on one GPU, two, none, and CUDA without flash attention (256 past 4k on 8
    GiB or less)."""
    r = sched.Request(**{**_fields(req("m", file_gib)), "flash_attention": fa})
    gs = tuple(sched.Gpu(i, f"GPU{i}", 8 * GiB if f < 8 else 24 * GiB, int(f * GiB)) for i, f in enumerate(frees))
    upto = 262144
    steps = sched.batch_steps(r, gs, upto=upto)
    free = [g.free_bytes for g in gs]

    def direct(ctx: int) -> int:
        q = sched.Request(**{**_fields(r), "num_ctx": ctx})
        p = sched.predict_server_vram(q)
        where = sched._placement(free, gs, p, False) if gs else ()
        return sched.automatic_batch(q, p, sum(free[i] for i in where), [gs[i] for i in where])

    points = {*range(1, upto + 1, 64), *(u for u, _ in steps), *(u + 1 for u, _ in steps if u < upto)}
    bad = [(c, _lookup(steps, c), direct(c)) for c in sorted(points) if _lookup(steps, c) != direct(c)]
    assert not bad, (steps, bad[:5])
    assert all(a[0] < b[0] and a[1] != b[1] for a, b in itertools.pairwise(steps)), steps  # compressed, ascending


def test_one_model_plan_runs_ollamas_batch_at_the_context_it_picks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kvadvise ollama`` on a GPU, the context recommended (no --ctx) and given: the plan's -b and -ub are the
    automatic num_batch Ollama >= 0.30 picks for that whole context on that card (scheduler.batch_steps), its compute
    buffer that of that -ub (RunConfig.auto_batch at every context the search tries), the Modelfile without a
    num_batch (one would fix it), a note when it is not 512; --batch stays what it says."""
    from attack_helpers import use_store
    from tinymodels import write_tiny_gguf

    g = write_tiny_gguf(tmp_path / "q.gguf", "qwen3", n_ctx_train=131072)
    build_store(tmp_path / "ostore", g, SHA, model="qa")
    use_store(monkeypatch, tmp_path / "ostore", tmp_path)
    for extra in ((), ("--ctx", "16384"), ("--ctx", "65536"), ("--ctx", "4096")):
        rc, out, err = run(capsys, "ollama", "qa", "--gpu", "rtx-4090", "--ollama-version", "0.32.15", "--json", *extra)
        assert rc == 0, err
        doc = json.loads(out)
        cfg = doc["config"]
        want = sched.batch_for_context(cfg["n_ctx"])  # a tiny file: every check passes on a 4090
        assert (cfg["n_batch"], cfg["n_ubatch"]) == (want, want), (extra, cfg)
        assert "num_batch" not in doc["ollama"]["modelfile_parameters"], doc["ollama"]["modelfile_parameters"]
        said = [n for n in doc["notes"] if "automatic num_batch" in n]
        assert bool(said) == (want != 512), (extra, said)
        by_hand = estimate(
            from_gguf(read_file(g)),
            RunConfig(n_ctx=cfg["n_ctx"], n_batch=want, n_ubatch=want, flash_attn="on", device="cuda"),
        )
        assert doc["memory"]["compute_bytes"] == by_hand.compute_bytes
    rc, out, err = run(capsys, "ollama", "qa", "--gpu", "rtx-4090", "--ctx", "65536", "--batch", "256", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["config"]["n_batch"], doc["config"]["n_ubatch"]) == (256, 256)
    assert doc["ollama"]["modelfile_parameters"]["num_batch"] == 256


def test_first_model_loads_whatever_its_size_the_next_is_checked_at_80_percent() -> None:
    """load(): nothing loaded, no pre-flight (a model too large spills through --fit); with others loaded,
    the prediction plus the batch surcharge must be at most 80 % of the free memory, else one is evicted."""
    big = req("big", 30.0)
    res = sched.schedule([big], gpus(23.5))
    assert [s.action for s in res.steps] == ["load"] and res.steps[0].spilled and res.resident[0].spilled
    a, b = req("a", 12.0), req("b", 8.0)
    res = sched.schedule([a, b], gpus(23.5))
    # after a: 23.5 - 12 = 11.5 GiB free; b predicts 8 GiB + 0.5 GiB of f16 K/V at 4k = 8.5 <= 9.2 (80 %)
    assert [s.action for s in res.steps] == ["load", "load"] and res.together(["a", "b"])
    assert res.steps[1].available_bytes == int(23.5 * GiB) - 12 * GiB
    c = req("c", 9.0)
    res = sched.schedule([a, c], gpus(23.5))
    # c predicts 9.5 GiB > 80 % of 11.5 GiB (9.2): a is evicted, c loads alone
    assert [(s.action, s.model, s.evicted) for s in res.steps] == [
        ("load", "a", None),
        ("evict", "c", "a"),
        ("load", "c", None),
    ]
    assert res.evictions == (("a", "c"),) and not res.together(["a", "c"])


def test_free_memory_is_the_smaller_of_reported_and_total_less_the_runners() -> None:
    """updateFreeSpace: a runner Ollama accounts for is taken out of the total, even where the device
    reports more free (its free memory report lags)."""
    loaded = sched.Runner("old", "name:old", (10 * GiB,), sched.DEFAULT_KEEP_ALIVE_S, 4096, preloaded=True)
    # the GPU reports 20 GiB free (lagging), Ollama computes 24 - 10 = 14: 14 wins
    res = sched.schedule([req("new", 11.0)], gpus(20), loaded=[loaded])
    assert res.steps[0].action == "evict" and res.steps[0].evicted == "old"  # 11.5 > 80 % of 14 = 11.2
    res = sched.schedule([req("new", 10.0)], gpus(20), loaded=[loaded])
    assert [s.action for s in res.steps] == ["load"] and res.steps[0].available_bytes == 14 * GiB


def test_the_limit_on_loaded_models_evicts_the_shortest_keep_alive_then_by_model_key() -> None:
    """OLLAMA_MAX_LOADED_MODELS (default 3 per GPU) counts runners, not bytes; findRunnerToUnload sorts by
    sessionDuration, then by model key (the blob path)."""
    small = [
        req(n, 0.5, key=k) for n, k in (("a", "blobs/sha256-bb"), ("b", "blobs/sha256-aa"), ("c", "blobs/sha256-cc"))
    ]
    res = sched.schedule(small, gpus(23.5), max_loaded=2)
    assert res.evictions == (("b", "c"),)  # equal keep-alive: the smaller blob path goes
    keep = [small[0], sched.Request(**{**_fields(small[1]), "keep_alive_s": sched.FOREVER_S}), small[2]]
    assert sched.schedule(keep, gpus(23.5), max_loaded=2).evictions == (("a", "c"),)
    assert sched.schedule(small * 1, gpus(23.5)).max_loaded == 3  # the default: 3 per GPU
    assert sched.schedule(small, gpus(23.5, 23.5)).max_loaded == 6
    assert sched.schedule(small, gpus(23.5, 23.5)).together(["a", "b", "c"])


def test_placement_on_one_gpu_of_several() -> None:
    """selectLlamaServerPlacement: the GPU with the most free memory whose 80 % holds the prediction; a
    discrete GPU before an integrated one; all of them when none holds it alone."""
    res = sched.schedule([req("m", 8.0)], gpus(12, 20))
    assert res.steps[0].gpus == (1,)
    integrated = (sched.Gpu(0, "iGPU", 32 * GiB, 30 * GiB, integrated=True), *gpus(12)[0:1])
    integrated = (integrated[0], sched.Gpu(1, "GPU1", 24 * GiB, 12 * GiB))
    assert sched.schedule([req("m", 8.0)], integrated).steps[0].gpus == (1,)
    res = sched.schedule([req("m", 30.0, plan_gib=30.0)], gpus(20, 20))
    assert res.steps[0].gpus == (0, 1) and not res.steps[0].spilled  # 15 GiB on each
    assert sched.schedule([req("m", 8.0)], gpus(12, 20), spread=True).steps[0].gpus == (0, 1)


def test_a_loaded_model_is_reused_or_reloaded_at_another_context() -> None:
    runner = sched.Runner("m", "name:m", (5 * GiB,), sched.DEFAULT_KEEP_ALIVE_S, 4096, preloaded=True)
    assert [s.action for s in sched.schedule([req("m", 4.0)], gpus(18), loaded=[runner]).steps] == ["reuse"]
    res = sched.schedule([req("m", 4.0, ctx=8192)], gpus(18), loaded=[runner])
    assert [s.action for s in res.steps] == ["evict", "load"] and "context 4,096, asked 8,192" in res.steps[0].why


def test_embedding_models_carry_no_batch_surcharge() -> None:
    """A model without the completion capability: no surcharge (generationBatchSurchargeForCompletion)."""
    chat = req("chat", 1.0, ctx=65536)
    emb = sched.Request(**{**_fields(chat), "name": "emb", "completion": False})
    a, b = sched.schedule([chat], gpus(23.5)), sched.schedule([emb], gpus(23.5))
    assert a.steps[0].predicted_bytes - b.steps[0].predicted_bytes == 2 * GiB


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("", 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("90", 90.0), ("-1", float("inf")), ("-1m", float("inf")),
     ("0", 0.0), ("soon", 300.0)],
)  # fmt: skip
def test_keep_alive_as_envconfig_reads_it(text: str, seconds: float) -> None:
    assert keep_alive_seconds(text) == seconds


# --- the command, against the fake server ---------------------------------------------------------------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeOllama]:
    """This machine: an RTX 4090 (NVML stands in); the server answers /api/ps; no store here."""
    from kvadvise.planner import hardware

    monkeypatch.setattr(hardware, "probe", lambda: hardware.from_profile("rtx-4090"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_MAX_LOADED_MODELS", "OLLAMA_KEEP_ALIVE", "OLLAMA_NUM_PARALLEL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OLLAMA_KV_CACHE_TYPE", raising=False)
    with running_fake() as s:
        monkeypatch.setenv("OLLAMA_HOST", s.url)
        yield s


def test_three_models_fit_together_and_the_settings_keep_them(
    fake: FakeOllama, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = tmp_path / "ollama.env"
    rc, out, err = run(capsys, "ollama", "qwen3:8b", "gemma3:4b", "llama3.2:3b", "--write-env", str(env), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fit_together"] and doc["recommended"] is None and doc["recommended_contexts"] == {}
    steps = doc["asked"]["steps"]
    assert [(s["action"], s["model"], s["gpus"]) for s in steps] == [
        ("load", "qwen3:8b", [0]),
        ("load", "gemma3:4b", [0]),
        ("load", "llama3.2:3b", [0]),
    ]
    # each is checked against what is free after the ones before: 80 % of it holds Ollama's prediction
    for before, s in itertools.pairwise(steps):
        assert s["available_bytes"] < before["available_bytes"]
        assert s["predicted_bytes"] <= s["available_bytes"] * 0.8
    assert doc["settings"]["context_length"] == 32768 and doc["settings"]["context_source"] == "Ollama's VRAM tier"
    assert doc["env"] == {"OLLAMA_KEEP_ALIVE": "-1"}
    assert env.read_text().splitlines()[1:] == ["OLLAMA_KEEP_ALIVE=-1"]
    assert "apply it with" in err


def test_models_loaded_now_take_memory_and_are_evicted(fake: FakeOllama, capsys: pytest.CaptureFixture[str]) -> None:
    """/api/ps holds a 20 GiB model: the free memory is what is left, and the next model's prediction is over
    80 % of it, so the loaded model is evicted (it is the only runner), then the requests load."""
    fake.running = [ps_entry("big:70b", size=20 * GiB, size_vram=20 * GiB, context_length=4096)]
    rc, out, err = run(capsys, "ollama", "qwen3:8b", "llama3.2:3b", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    steps = doc["asked"]["steps"]
    assert (steps[0]["action"], steps[0]["evicted"]) == ("evict", "big:70b")
    assert [s["model"] for s in steps if s["action"] == "load"] == ["qwen3:8b", "llama3.2:3b"]
    assert "big:70b" not in [r["model"] for r in doc["asked"]["resident"]]
    # with a small model loaded, it stays, and it counts against OLLAMA_MAX_LOADED_MODELS
    fake.running = [ps_entry("tiny:1b", size=GiB, size_vram=GiB, context_length=4096)]
    rc, out, _ = run(capsys, "ollama", "qwen3:8b", "llama3.2:3b", "gemma3:4b", "--json")
    doc = json.loads(out)
    # the 4th runner of at most 3: one goes (equal keep-alive: the smallest key, here the name)
    assert [(s["evicted"], s["cause"]) for s in doc["asked"]["steps"] if s["action"] == "evict"] == [
        ("llama3.2:3b", "count")
    ]
    assert doc["asked"]["resident"][0] | {"vram_bytes": None} == {
        "model": "tiny:1b",
        "vram_bytes": None,
        "num_ctx": 4096,
        "spilled": False,
        "loaded_before": True,
    }
    # the fix: room for 4 runners, and each model's own context where the server's would evict one; never a
    # server-wide context below 8k
    assert rc == 0 and doc["recommended_max_loaded_models"] == 4
    assert doc["env"]["OLLAMA_MAX_LOADED_MODELS"] == "4" and "OLLAMA_CONTEXT_LENGTH" not in doc["env"]
    assert all(c >= 4096 for c in doc["recommended_contexts"].values())
    assert doc["recommended_contexts"].get("qwen3:8b", 32768) >= 8192
    assert not doc["recommended"]["evictions"]


def test_the_context_that_keeps_them_together(fake: FakeOllama, capsys: pytest.CaptureFixture[str]) -> None:
    """Two 24 GB cards (48 GiB: Ollama's default context is 262,144): gemma3:12b's prediction at that context
    (f16, every layer, 131,072 tokens) fills both cards and evicts qwen3:14b. The plan keeps the first model's
    context (its training context, 40,960) and gives gemma3:12b its own (a Modelfile), each on its own GPU:
    no server-wide context."""
    rc, out, err = run(capsys, "ollama", "qwen3:14b", "gemma3:12b", "--gpu", "rtx-3090x2", "--verbose")
    assert rc == 0, err
    assert "2. gemma3:12b: evicts qwen3:14b" in out and "The plan that keeps them loaded" in out
    assert "ollama create gemma3-12b-32k -f gemma3-12b-32k.Modelfile" in out and "OLLAMA_CONTEXT_LENGTH" not in out
    rc, out, _ = run(capsys, "ollama", "qwen3:14b", "gemma3:12b", "--gpu", "rtx-3090x2", "--json")
    doc = json.loads(out)
    rec = doc["recommended"]["steps"]
    assert [(s["model"], s["gpus"]) for s in rec] == [("qwen3:14b", [0]), ("gemma3:12b", [1])]
    assert doc["recommended_contexts"] == {"gemma3:12b": 32768}
    resident = {r["model"]: r["num_ctx"] for r in doc["recommended"]["resident"]}
    assert resident == {"qwen3:14b": 40960, "gemma3:12b": 32768}
    # --ctx fixes the server's context: only the cache type and the limit are searched; exit 3 when nothing
    # keeps them together, with what would
    rc, out, err = run(capsys, "ollama", "qwen3-coder:30b", "gemma3:12b", "--gpu", "rtx-4090", "--ctx", "65536")
    assert rc == 3 and "do not all stay loaded together" in out


def test_the_expert_plan_for_a_coding_model_and_its_helpers(
    fake: FakeOllama, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """qwen3-coder, qwen3:4b and nomic-embed-text on a 4090. The plan keeps the coding model at 28k with a q8_0
    cache (at f16 it reaches only 12k beside the others), qwen3:4b at 4k, the embedding model at its batch; never a
    server-wide 2k context. The files: the env, a Modelfile each, the router preset, all written. (gemma3:4b was the
    helper here until its vision tower was planned as Ollama >= 0.30 runs it, its own --mmproj with the fit target
    raised by its 795 MiB: beside the coding model at 8k it no longer fits, and the plan says so with that target.)"""
    folder = tmp_path / "mf"
    env = tmp_path / "ollama.env"
    args = ("ollama", "qwen3-coder", "qwen3:4b", "nomic-embed-text", "--gpu", "rtx-4090")
    rc, out, err = run(capsys, *args, "--write-modelfiles", str(folder), "--write-env", str(env))
    assert rc == 0, err
    assert len(out.splitlines()) <= 30, out
    assert "qwen3-coder-28k" in out and "OLLAMA_KV_CACHE_TYPE=q8_0" in out and "OLLAMA_CONTEXT_LENGTH" not in out
    assert (folder / "qwen3-coder-28k.Modelfile").read_text().count("PARAMETER num_ctx 28672") == 1
    assert "FROM qwen3:4b" in (folder / "qwen3-4b-4k.Modelfile").read_text()
    assert "OLLAMA_KV_CACHE_TYPE=q8_0" in env.read_text()
    # all or none: an --write-env refused (it exists, no --force) leaves no Modelfile folder made for nothing
    other = tmp_path / "mf2"
    rc, out, err = run(capsys, *args, "--write-modelfiles", str(other), "--write-env", str(env))
    assert rc == 2 and "already exists" in err and not other.exists(), err
    rc, out, _ = run(capsys, *args, "--json")
    doc = json.loads(out)
    assert doc["recommended_kv_cache_type"] == "q8_0"
    assert doc["recommended_contexts"] == {"qwen3-coder:latest": 28672, "qwen3:4b": 4096}
    assert doc["tried"] == [
        {"kv_cache_type": "f16", "first_model_ctx": 12288},
        {"kv_cache_type": "q8_0", "first_model_ctx": 28672},
    ]
    # Ollama's own prediction decided: each model after the first within 80 % of what was free
    loads = [s for s in doc["recommended"]["steps"] if s["action"] == "load"]
    assert all(s["predicted_bytes"] <= 0.8 * s["available_bytes"] for s in loads[1:])
    # on a 16 GB card they do not: what to leave out, and which card would hold them, with the numbers
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "qwen3:4b", "nomic-embed-text", "--gpu", "rtx-4060-ti-16gb")
    assert rc == 3 and "at the least (" in out and "a card of" in out
    # gemma3:4b's tower: --fit keeps ceil((834 MB + 1 GiB) / MiB) = 1,820 MiB free for it
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "gemma3:4b", "nomic-embed-text", "--gpu", "rtx-4090")
    said = " ".join(out.split())  # (the text is wrapped)
    assert rc == 3 and "gemma3:4b needs" in said and "--fit keeps 1,820 MiB of it free" in said, out


def test_options_for_one_model_are_refused(fake: FakeOllama, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (["--write-modelfile", "M"], ["--min-ctx", "4096"], ["--allow-cpu"]):
        rc, out, err = run(capsys, "ollama", "qwen3:8b", "gemma3:4b", *flag)
        assert rc == 2 and out == "" and "for one model" in err
    rc, _, err = run(capsys, "ollama", "qwen3:8b", "--write-preset", "x.ini")
    assert rc == 2 and "several models" in err


def _tiny_bert(path: Path) -> Path:
    """A tiny nomic-bert GGUF (the architecture of nomic-embed-text): an encoder, no KV cache in llama.cpp."""
    from gguf import GGUFWriter

    a = "nomic-bert"
    w = GGUFWriter(str(path), a)
    w.add_name("tiny nomic-bert")
    for k, v in (("block_count", 2), ("context_length", 2048), ("embedding_length", 64)):
        w.add_uint32(f"{a}.{k}", v)
    w.add_uint32(f"{a}.feed_forward_length", 128)
    w.add_uint32(f"{a}.attention.head_count", 4)
    w.add_uint32(f"{a}.pooling_type", 1)
    w.add_tokenizer_model("bert")
    w.add_token_list([f"t{i}" for i in range(100)])
    rng = np.random.RandomState(0)
    shapes = {"token_embd.weight": (64, 100), "token_types.weight": (64, 2)}
    for il in range(2):
        shapes |= {f"blk.{il}.attn_qkv.weight": (64, 192), f"blk.{il}.attn_output.weight": (64, 64)}
        shapes |= {f"blk.{il}.ffn_up.weight": (64, 128), f"blk.{il}.ffn_down.weight": (128, 64)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape[::-1]).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_store_models_an_embedding_model_and_a_router_preset(
    tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two models of this machine's store (the real Gemma 3 270M and a nomic-bert embedding model): the
    embedding model gets one slot and no K/V (llama.cpp makes none for an encoder); --write-preset writes
    them as a llama-server router preset with their blob paths; nothing is overwritten without --force."""
    import hashlib

    from kvadvise.planner import hardware

    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, params={"num_ctx": 8192})
    bert = _tiny_bert(tmp_path / "bert.gguf")
    build_store(root, bert, hashlib.sha256(bert.read_bytes()).hexdigest(), model="nomic-embed-text")
    spec = from_gguf(read_file(bert))  # llama_model::create_memory: no memory module for an encoder
    est = estimate(spec, RunConfig(n_ctx=2048, device="cuda"))
    assert not any(spec.kv_layers) and est.kv_bytes == 0
    # no output tensor (src/models/nomic-bert.cpp): the GPU holds the blocks, not a copy of token_embd
    # token_types (an input tensor, llama-arch.cpp LLM_TENSOR_LAYER_INPUT) stays on the CPU with token_embd
    assert spec.input_extra_bytes > 0
    assert est.devices[0].weights_bytes == (
        spec.weights_bytes - spec.tok_embd_bytes - spec.input_extra_bytes + spec.cuda_pad_bytes
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "2")
    monkeypatch.setattr(hardware, "probe", lambda: hardware.from_profile("rtx-4060-ti-16gb"))
    preset = tmp_path / "models.ini"
    args = ("ollama", "gemma3-270m", "nomic-embed-text", "--write-preset", str(preset))
    rc, out, err = run(capsys, *args)
    assert rc == 0, err
    assert "no Ollama server answered" in out and "2 models on one Ollama server" in out
    text = preset.read_text()
    sections = text.split("\n[")[1:]
    # no tag: the preset loader upper-cases it (common/preset.cpp canonical_tag), so a client asking for
    # gemma3-270m:latest would not find gemma3-270m:LATEST
    assert sections[0].startswith("gemma3-270m]") and sections[1].startswith("nomic-embed-text]")
    gemma, emb = sections
    assert f"model = {root / 'blobs' / ('sha256-' + SHA)}" in gemma
    assert "c = 16384\nnp = 2" in gemma  # its own num_ctx 8,192 x OLLAMA_NUM_PARALLEL 2
    assert "c = 2048\nnp = 1" in emb and "embedding = true" in emb  # the training context, one slot
    assert f"llama-server --models-preset {preset} --models-max 2" in err
    rc, _, err = run(capsys, *args)
    assert rc == 2 and "exists" in err  # never overwritten without --force
    rc, out, _ = run(capsys, "ollama", "gemma3-270m", "nomic-embed-text", "--json")
    doc = json.loads(out)
    emb_step = next(s for s in doc["asked"]["steps"] if s["model"] == "nomic-embed-text:latest")
    assert emb_step["num_batch"] == 2048  # min(2048, num_ctx x slots), not the automatic batch
    resident = {r["model"]: r for r in doc["asked"]["resident"]}
    assert resident["nomic-embed-text:latest"]["num_ctx"] == 2048
    assert resident["gemma3-270m:latest"]["num_ctx"] == 8192


@pytest.mark.parametrize(
    "flag",
    [["--ollama-version", "0.12.3"], ["--ollama-version", "0.12"], ["--runner", "mlx"], ["--mlx-quant", "int4"]],
    ids=["version", "bad-version", "runner", "mlx-quant"],
)
def test_release_and_runner_options_are_refused_where_they_are_not_planned(
    flag: list[str], fake: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama A B --ollama-version 0.12.3` and `--installed --ollama-version 0.12.3` planned the newest
    release without a word (and took '0.12', which `kvadvise ollama A` refuses, with exit 0): the scheduler's
    replay and the listing do not plan a release, a runner or an MLX type. Refused, exit 2, nothing printed."""
    rc, out, err = run(capsys, "ollama", "qwen3:8b", "gemma3:4b", "--gpu", "rtx-4090", *flag)
    assert rc == 2 and out == "" and flag[0] in err and "for one model" in err, err
    rc, out, err = run(capsys, "ollama", "--installed", "--gpu", "rtx-4090", *flag)
    assert rc == 2 and out == "" and flag[0] in err, err


def test_one_model_named_twice_is_one_model(fake: FakeOllama, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama qwen3:8b qwen3:8b`: planned once, and said so ("1 models on one Ollama server")."""
    rc, out, err = run(capsys, "ollama", "gemma3:4b", "gemma3:4b", "--gpu", "rtx-4090")
    assert rc == 0 and out.startswith("1 model on one Ollama server") and "named twice" in out + err, out
