"""Round 14b of the red team (a reviewer in its own worktree): Ollama by version and by environment. Each test runs
``kvadvise ollama NAME --ollama-version X`` (or several models) over a real on-disk store of tiny GGUFs, with no
server, and compares what kvadvise plans or says with what that release's Go code does (the tag's source in the
ollama/ollama mirror: ``git --git-dir=/work/.mirror/ollama+ollama/repo show TAG:PATH``). Each fails on the code
at 2e84dda; its docstring gives the command, what the user sees, what is expected and the Go source that proves it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from attack_helpers import no_server, run, use_store  # noqa: F401  (no_server: an autouse fixture)
from ollama_fake import build_store
from tinymodels import write_tiny_gguf

# name -> (tiny recipe, extra {arch}.* uint32 keys): qwen3e is a Qwen3-Embedding-like blob (a decoder with
# qwen3.pooling_type = 3, LAST, as llama.cpp's converter writes for Qwen3-Embedding)
MODELS = {
    "qwen2t": ("qwen2", None),
    "qwen3t": ("qwen3", None),
    "qwen3e": ("qwen3", {"pooling_type": 3}),
    "lfm2t": ("lfm2", None),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("r14b")
    root = base / "models"
    for name, (recipe, extra) in MODELS.items():
        gguf = write_tiny_gguf(base / f"{name}.gguf", recipe, n_vocab=32000, name=name, extra_u32=extra)
        build_store(root, gguf, hashlib.sha256(f"r14b/{name}".encode()).hexdigest(), model=name)
    return root


@pytest.fixture(autouse=True)
def _store(no_server: None, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path) -> None:  # noqa: F811
    use_store(monkeypatch, store, tmp_path)


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    rc, out, err = run(capsys, "ollama", *args, "--json")
    assert rc == 0, err
    return json.loads(out)


# --- a pre-release before 0.30 is claimed to carry its release's llama.cpp ---------------------------------------------


def test_a_prerelease_before_0_30_does_not_claim_its_releases_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama qwen2t --ollama-version 0.13.3-rc0 --vram 24GiB --json`: ``ollama.release.llama_cpp`` is
    ``{"commit": "17f7f4baad8b...", "pinned_on": "2025-12-10"}`` and the text says "runs qwen2 in its built-in
    llamarunner on llama.cpp 17f7f4baa", with ``source`` "v0.13.3". The tag v0.13.3-rc0 vendors another llama.cpp:
    ``v0.13.3-rc0:Makefile.sync`` FETCH_HEAD=7f8ef50cce40e3e7e4526a3696cb45658190e69a (b7108, 0.13.2's), only
    v0.13.3-rc1 moved to 17f7f4baa (likewise ``v0.15.5-rc1:Makefile.sync`` FETCH_HEAD=a5bb8ba4c, not the release's
    ec98e2002). kvadvise's own rule (api.py _VERSION: "a pre-release's llama.cpp pin is not claimed
    (versions.release)") is applied only from 0.30 (versions.release checks ``prerelease`` in the llama-server branch
    alone). Expected: no pin claimed for a pre-release (llama_cpp null), or the rc's own (7f8ef50cc)."""
    doc = plan(capsys, "qwen2t", "--ollama-version", "0.13.3-rc0", "--vram", "24GiB", "--ctx", "4096")
    claimed = doc["ollama"]["release"]["llama_cpp"]
    assert claimed is None or claimed["commit"].startswith("7f8ef50cc"), claimed


# --- the architectures forced to one slot are the newest release's, for every release ----------------------------------


def test_single_slot_warning_follows_the_releases_list(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama lfm2t --ollama-version 0.15.4 -np 2 --vram 24GiB --json` warns "Ollama forces num_parallel = 1
    for lfm2" while the plan, the env (OLLAMA_NUM_PARALLEL=2) and the verify command are for 2 slots. Ollama 0.15.4
    runs lfm2 with 2 slots: ``v0.15.4:server/sched.go`` load forces one slot only for ``[]string{"mllama",
    "qwen3vl", "qwen3vlmoe"}``; lfm2, lfm2moe and qwen3next join the list at v0.15.5, qwen35/qwen35moe/nemotron_h
    at v0.17.1, nemotron_h_omni at v0.22.0; 0.11.5 - 0.12.6 force only ``mllama`` (``slices.Contains(
    req.model.Config.ModelFamilies, "mllama")``). kvadvise's rules.SINGLE_SLOT_ARCHS is v0.32.15's list, used for
    every --ollama-version (advice.py). Expected: no such warning for 0.15.4 (the list by release)."""
    doc = plan(capsys, "lfm2t", "--ollama-version", "0.15.4", "-np", "2", "--vram", "24GiB", "--ctx", "4096")
    warnings = doc["ollama"]["warnings"]
    assert not any("forces num_parallel = 1" in w for w in warnings), warnings


# --- an embedding model that is a decoder (pooling_type in the GGUF) ---------------------------------------------------


def test_a_decoder_embedding_model_gets_no_flash_attention_before_0_30(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama qwen3e --ollama-version 0.12.5 -ctk q8_0 --vram 24GiB --json` (a Qwen3-Embedding-like blob:
    architecture qwen3 with ``qwen3.pooling_type``) plans flash attention on and a q8_0 K/V cache, and writes
    OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0. Ollama 0.12.5 runs it with neither:
    ``v0.12.5:fs/ggml/ggml.go`` SupportsFlashAttention starts ``_, isEmbedding := f.KV()[fmt.Sprintf(
    "%s.pooling_type", ...)]; if isEmbedding { return false }``, and ``v0.12.5:llm/server.go`` NewLlamaServer turns
    fa off ("flash attention enabled but not supported by model") and then keeps the cache f16 (the quantized type is
    set only ``if fa``); the same at every tag to v0.24.0 (v0.20.0: "OLLAMA_FLASH_ATTENTION must be enabled to use a
    quantized OLLAMA_KV_CACHE_TYPE"). kvadvise's versions.supports_flash_attention stands in for the pooling_type
    check with "no K/V layer", which holds for bert encoders only, not for a decoder with a pooling head (qwen3,
    qwen2 embedding models keep a K/V cache). Not the known "GPU without flash attention" case: the model refuses
    it here, on any GPU. Expected: flash attention off and an f16 cache for this release."""
    doc = plan(capsys, "qwen3e", "--ollama-version", "0.12.5", "-ctk", "q8_0", "--vram", "24GiB", "--ctx", "4096")
    cfg = doc["config"]
    assert (cfg["flash_attn"], cfg["type_k"], cfg["type_v"]) == (False, "f16", "f16"), cfg


def test_several_models_give_a_decoder_embedding_model_one_slot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_NUM_PARALLEL=4 kvadvise ollama qwen3t qwen3e --vram 24GiB --json`: the scheduler replay predicts the
    same bytes for the embedding model qwen3e (a qwen3 blob with ``qwen3.pooling_type``) as for the chat model qwen3t
    (4 slots each, and the automatic batch 1024 for both). Ollama gives a model without the completion capability one
    slot and no automatic batch: ``v0.32.15:server/images.go`` Capabilities: ``if f.KeyValue("pooling_type").Valid()
    { CapabilityEmbedding } else { CapabilityCompletion }``; ``v0.32.15:server/sched.go`` load: ``if !completion {
    numParallel = 1 }``, applyAutomaticGenerationBatch returns at once ``if !completion``. kvadvise's own comment
    (scheduler.py EMBEDDING_ARCHS: "an embedding model: its GGUF has a pooling type") is implemented as "an encoder
    architecture" (together.request: ``spec.architecture in sched.EMBEDDING_ARCHS``), which misses every decoder
    embedding model (qwen3-embedding, gte-Qwen2). Expected: qwen3e predicted for one slot, less than qwen3t."""
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "4")
    doc = plan(capsys, "qwen3t", "qwen3e", "--vram", "24GiB")
    steps = {s["model"]: s for s in doc["asked"]["steps"]}
    chat, emb = steps["qwen3t:latest"], steps["qwen3e:latest"]
    assert emb["predicted_bytes"] < chat["predicted_bytes"], (emb, chat)


# --- several GPUs under a release before 0.30 -------------------------------------------------------------------------


def test_a_release_before_0_30_is_not_placed_by_llama_servers_80_percent_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise ollama qwen2t --ollama-version 0.20.0 --vram 480MiB,480MiB --margin 0 --ctx 4096 --json`: the plan is
    spread over both GPUs with the note "Ollama spreads it over the 2 GPUs: it does not fit in 80 % of one GPU's free
    memory", while its own replay of 0.20.0's decision (``ollama.decision.log_line``) puts every layer on one GPU
    (``GPULayers:3[ID:1 Layers:3(0..2)]``). The 80 % rule is llama-server's placement, new in v0.30.0
    (``v0.30.0:server/sched.go`` selectLlamaServerPlacement / bestSingleGPUFit; absent from every tag to v0.24.0).
    Ollama 0.20.0 lays the layers out itself: ``v0.20.0:llm/server.go`` assignLayers "Try to pack things into as
    few GPUs as possible" (findBestFit over gpus[:1], then gpus[:2]), with no 80 % share. kvadvise's
    OllamaRuntime.place applies the llama-server rule to every release. Expected: no 80 % note for 0.20.0 and the
    plan on the one GPU its layout uses."""
    doc = plan(
        capsys, "qwen2t", "--ollama-version", "0.20.0", "--vram", "480MiB,480MiB", "--margin", "0", "--ctx", "4096"
    )
    notes = doc["notes"]
    assert not any("80 %" in n for n in notes), notes
    assert len(doc["hardware"]["gpus"]) == 1, (doc["hardware"]["gpus"], doc["ollama"]["decision"]["log_line"])


def test_ollama_sched_spread_reaches_the_replayed_layout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_SCHED_SPREAD=1 kvadvise ollama qwen2t --ollama-version 0.20.0 --gpu rtx-4090x2 --ctx 4096 --json`: the
    plan keeps both GPUs ("OLLAMA_SCHED_SPREAD is set: Ollama spreads the model over all the GPUs") but the replayed
    decision of 0.20.0 prints ``GPULayers:3[ID:0 Layers:3(0..2)]``, every layer on GPU 0. With the variable set,
    ``v0.20.0:llm/server.go`` assignLayers skips the packing loop: ``} else { gpuLayers = findBestFit(layers, gpus,
    requestedLayers, !requireFull) }``, whose bisection of the capacity spreads the layers over both GPUs
    (envconfig.SchedSpread() is read there, not only by the scheduler). kvadvise's layout port takes ``sched_spread``
    (layout.create_layout(..., sched_spread=True) gives both GPUs) but decision._decide_layout /
    _decide_engine / estimate_gpu_layers never pass it. Expected: the replayed layout uses both GPUs."""
    monkeypatch.setenv("OLLAMA_SCHED_SPREAD", "1")
    doc = plan(capsys, "qwen2t", "--ollama-version", "0.20.0", "--gpu", "rtx-4090x2", "--ctx", "4096")
    assert len(doc["hardware"]["gpus"]) == 2
    line = doc["ollama"]["decision"]["log_line"]
    layers = line[line.index("GPULayers") :]
    assert "ID:0" in layers and "ID:1" in layers, line
