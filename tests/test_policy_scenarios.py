"""Issue 13's scenarios: what `kvadvise ollama` recommends on the built-in profiles and cards, with its
reasons; the MLA/flash-attention-off case; the written files parsed back (Ollama's parser, dash and
bash, systemd-analyze where available)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ollama_fake import closed_port_url

from kvadvise.backends.ollama.modelfile import parameters_of, parse_modelfile
from kvadvise.cli import main
from kvadvise.model.ggml import GGMLType
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import with_weights
from kvadvise.planner.budget import budget_for
from kvadvise.planner.hardware import Gpu, Hardware
from kvadvise.planner.memory import RunConfig
from kvadvise.planner.policy import Policy
from kvadvise.planner.recommender import recommend

MIB, GIB = 1 << 20, 1 << 30
DATA = Path(__file__).parent / "data" / "hf"


@pytest.fixture(autouse=True)
def no_store_no_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    rc = main(["ollama", *args, "--json"])
    out, _ = capsys.readouterr()
    return rc, json.loads(out)


def reasons(doc: dict[str, object]) -> str:
    r = doc["reasons"]
    assert isinstance(r, list)
    return "\n".join(r)


def test_qwen3_coder_on_a_24gb_card_gets_64k_q8_0_with_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090")
    c, b, m = doc["config"], doc["budget"], doc["memory"]
    assert rc == 0 and doc["fits"] is True
    assert (c["n_ctx_seq"], c["type_k"], c["type_v"]) == (65536, "q8_0", "q8_0")  # not q4_0 at 219k
    # kept free: the 1 GiB fit margin, 3 % of the profile's 19 GB (Ollama's library size), 512 MiB for the display
    assert b["margin_bytes"] == 1024 * MIB and b["headroom_bytes"] == 570_000_000 + 512 * MIB
    assert b["free_bytes"] - m["device_bytes"] >= b["margin_bytes"] + b["headroom_bytes"]  # all of it kept free
    text = reasons(doc)
    assert "64k on a card of 16 GB or more" in text and "3% of the weights" in text and "display" in text
    assert "high GQA" in text and "q4_0 would reach" in text
    q4 = [o for o in doc["options"] if o["type_k"] == "q4_0"]
    assert q4 and q4[0]["allowed"] is False and q4[0]["n_ctx_max"] > 65536  # shown, never chosen
    assert "OLLAMA_CONTEXT_LENGTH" not in doc["ollama"]["env"]
    assert doc["ollama"]["env"]["OLLAMA_KV_CACHE_TYPE"] == "q8_0"
    assert doc["ollama"]["verify_command"].endswith("--kv-cache-type q8_0 --num-ctx 65536")


def test_q4_0_only_when_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--use", "long", "--allow-q4")
    assert rc == 0 and doc["config"]["type_k"] == "q4_0"
    assert "q4_0 because you allowed it" in reasons(doc) and "small-medium loss" in reasons(doc)
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--use", "long")
    assert doc["config"]["type_k"] == "q8_0" and "the target is not reached" in reasons(doc)
    assert "--allow-q4 (q4_0 reaches" in reasons(doc) and "--allow-cpu" in reasons(doc)


def test_qwen3_coder_on_an_8gb_card_does_not_fit_and_says_what_would(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu-only keeps the strict answer: 100 % on the GPU or nothing (exit 3, no settings); without it the
    same card gets the plan that runs, part on the CPU (tests/test_offload_default.py)."""
    rc, doc = plan(capsys, "qwen3-coder", "--vram", "8GiB", "--gpu-only", "--ram", "64GiB")
    assert rc == 3 and doc["fits"] is False and doc["runnable"] is False and doc["offload"] is None
    assert doc["target_ctx"] == 32768  # 32k below 16 GB
    assert "more memory" in reasons(doc) and "without --gpu-only" in reasons(doc)
    assert doc["decode_tokens_per_s"] is None  # no speed for a plan that does not fit
    assert doc["ollama"]["verify_command"] is None and doc["ollama"]["apply"] == []
    main(["ollama", "qwen3-coder", "--vram", "8GiB", "--gpu-only"])
    out, _ = capsys.readouterr()
    assert "PARAMETER num_ctx" not in out and "no settings to apply" in out and "decode (estimate)" not in out


def test_gpt_oss_on_16gb_keeps_an_f16_k_cache(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "gpt-oss:20b", "--gpu", "rtx-4080")
    c = doc["config"]
    assert rc == 0 and doc["fits"] is True and c["type_k"] == "f16" and c["type_v"] == "f16"
    assert all(o["type_k"] == "f16" for o in doc["options"])
    assert "attention sinks" in reasons(doc)
    # 14 GB in Ollama's library: 64k fits with the f16 cache the attention sinks need
    assert c["n_ctx_seq"] % 1024 == 0 and c["n_ctx_seq"] == 65536


def test_llama31_8b_on_8gb_gets_32k_q8_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "llama3.1:8b", "--vram", "8GiB")
    c = doc["config"]
    assert rc == 0 and doc["target_ctx"] == 32768
    assert c["type_k"] == "q8_0" and c["n_ctx_seq"] % 1024 == 0 and c["n_ctx_seq"] >= 28672
    # 3 % of the weights, rounded up: the 4,912,898,304 B of tensors of the 4,920,738,944 B blob (Ollama's library;
    # the rest is its GGUF header, kvadvise.model.breakdown.k_mix_sizes); no display allowance for --vram
    assert doc["budget"]["headroom_bytes"] == -(-4_912_898_304 * 3 // 100)
    assert "no noticeable impact" in reasons(doc)


def test_qwen3_32b_on_24gb_says_q8_0_cannot_reach_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "qwen3:32b", "--gpu", "rtx-4090")
    c = doc["config"]
    assert rc == 0 and doc["target_ctx"] == 40960  # 64k capped at n_ctx_train
    assert c["type_k"] == "q8_0" and c["n_ctx_seq"] < 40960
    text = reasons(doc)
    assert "the target is not reached" in text and "a smaller quantization of the weights" in text
    assert "--allow-q4" in text


def test_70b_on_80gb_gets_f16_at_64k(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "llama3.1:70b", "--gpu", "a100-80gb")
    c = doc["config"]
    assert rc == 0 and (c["n_ctx_seq"], c["type_k"]) == (65536, "f16")
    assert "display" not in reasons(doc)  # a data-centre card drives no display
    assert "reproduces tokens exactly" in reasons(doc)


def test_cpu_only_aims_for_32k(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "llama3.1:8b", "--device", "cpu")
    assert doc["target_ctx"] == 32768 and "32k on the CPU" in reasons(doc)
    assert rc in (0, 3)


def test_headless_and_repeatable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--headless")
    assert doc["budget"]["headroom_bytes"] == 570_000_000
    mf = tmp_path / "Modelfile"
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--repeatable", "--write-modelfile", str(mf))
    assert rc == 0 and doc["config"]["type_k"] == "f16" and doc["ollama"]["env"]["OLLAMA_NUM_PARALLEL"] == "1"
    params = parameters_of(parse_modelfile(mf.read_text()))
    assert params["seed"] == ["42"] and params["temperature"] == ["0"]


def test_flash_attention_off_means_f16_v(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "-fa", "off")
    assert rc == 0 and (doc["config"]["type_k"], doc["config"]["type_v"]) == ("f16", "f16")
    assert doc["ollama"]["env"]["OLLAMA_FLASH_ATTENTION"] == "0"


def test_mla_with_flash_attention_off_is_not_refused() -> None:
    """The bug: MLA + FA off proposed q8_0 K / f16 V, which llama.cpp refuses for MLA (exit 2)."""
    cfg = json.loads((DATA / "deepseek-coder-v2-16b.json").read_text())
    cfg.pop("_source", None)
    spec = with_weights(from_config(cfg, source="test"), 10_000_000_000)
    hw = Hardware((Gpu(0, "NVIDIA A10", 24 * GIB, 24 * GIB, 0, None, None),), 64 * GIB, 60 * GIB, "test")
    rec = recommend(spec, RunConfig(flash_attn="off"), budget_for(hw), Policy())
    assert all(o.type_k == o.type_v == GGMLType.F16 for o in rec.options)
    assert rec.fits and "V cache stays f16" in "\n".join(rec.reasons)


def test_llamacpp_only_knobs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (["-kvu"], ["--swa-full"], ["-ub", "256"]):
        assert main(["ollama", "qwen3-coder", "--gpu", "rtx-4090", *flag]) == 2
        assert "llama.cpp only" in capsys.readouterr().err


def test_ctx_that_does_not_fit_says_what_does(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_only = ("--gpu", "rtx-4090", "--gpu-only")
    rc, doc = plan(capsys, "qwen3-coder", *gpu_only, "--ctx", "65536", "-ctk", "f16")
    assert rc == 3 and any("does not fit with f16; fits with q8_0 K/V" in n for n in doc["notes"])
    rc, doc = plan(capsys, "qwen3-coder", *gpu_only, "--ctx", "262144")
    assert rc == 3 and any("fits up to" in n for n in doc["notes"])
    # without --gpu-only the same --ctx runs with part on the CPU, in the cache type given (exit 0)
    rc, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--ram", "64GiB", "--ctx", "65536", "-ctk", "f16")
    assert rc == 0 and doc["fits"] is False and doc["runnable"] is True
    assert doc["offload"]["type_k"] == "f16" and doc["offload"]["n_ctx"] == 65536
    assert any("does not fit with f16; fits with q8_0 K/V" in n for n in doc["notes"])


def test_written_files_parse_back(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    mf, env, dropin = tmp_path / "Modelfile", tmp_path / "ollama.env", tmp_path / "kvadvise.conf"
    args = ["--write-modelfile", str(mf), "--write-env", str(env), "--write-systemd", str(dropin)]
    rc, _ = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--server-default", *args)
    assert rc == 0
    text = mf.read_text()
    assert text.startswith("# needs OLLAMA_FLASH_ATTENTION=1 and OLLAMA_KV_CACHE_TYPE=q8_0")
    assert ("num_ctx", "65536") in parse_modelfile(text)
    for sh in ("dash", "bash"):
        exe = shutil.which(sh)
        if exe is None:
            continue
        out = subprocess.run(
            [exe, "-c", 'set -a; . ./ollama.env; echo "$OLLAMA_KV_CACHE_TYPE $OLLAMA_CONTEXT_LENGTH"'],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.split() == ["q8_0", "65536"], sh
    assert 'Environment="OLLAMA_CONTEXT_LENGTH=65536"' in dropin.read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit_dir = tmp_path / "units"
    (unit_dir / "ollama.service.d").mkdir(parents=True)
    (unit_dir / "ollama.service").write_text("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n")
    shutil.copy(dropin, unit_dir / "ollama.service.d" / "zz-kvadvise.conf")
    r = subprocess.run(
        [analyze, "verify", str(unit_dir / "ollama.service")],
        capture_output=True,
        text=True,
        env={"SYSTEMD_UNIT_PATH": f"{unit_dir}:", "PATH": "/usr/bin:/bin"},
    )
    assert "kvadvise.conf" not in r.stderr, r.stderr


@pytest.mark.parametrize("where", ["macos", "windows", "docker"])
def test_platform_hints(capsys: pytest.CaptureFixture[str], where: str) -> None:
    _, doc = plan(capsys, "qwen3-coder", "--gpu", "rtx-4090", "--platform", where)
    first = doc["ollama"]["apply"][0]
    assert {"macos": "launchctl setenv", "windows": "setx", "docker": "docker rm -f ollama"}[where] in first
    assert doc["ollama"]["apply"][-1].startswith("kvadvise verify ollama qwen3-coder-64k")
