"""Advice an expert would sign: a context asked for keeps the cache choice, the default answers stay short,
which card to buy, speeds labelled where they are extrapolated or a range, and flash attention only where
the backend has a kernel for it."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import kvadvise
from kvadvise.cli import main

QWEN3_CODER_CONFIG = Path(__file__).resolve().parent / "data" / "hf" / "qwen3-coder-30b.json"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _config(doc: dict[str, object]) -> tuple[object, ...]:
    cfg = doc["config"]
    assert isinstance(cfg, dict)
    return cfg["n_ctx"], cfg["type_k"], cfg["type_v"], cfg["flash_attn"], doc["fits"]


# --- a context given keeps the rest of the choice ------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["ollama", "qwen3-coder", "--gpu", "rtx-4090"],
        ["hf", str(QWEN3_CODER_CONFIG), "--quant", "Q4_K_M", "--gpu", "rtx-4090"],
    ],
    ids=["ollama", "hf"],
)
def test_a_context_given_keeps_the_cache_choice(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--ctx 65536` asked what the default recommends (64k, q8_0, 100% on the GPU): the same plan, not a
    partial f16 plan at a third of the speed; `64k` is the same number."""
    rc, out, _ = run(capsys, *command, "--json")
    default = json.loads(out)
    assert rc == 0 and default["config"]["n_ctx"] == 65536 and default["config"]["type_k"] == "q8_0"
    for ctx in ("65536", "64k", "64K"):
        rc, out, _ = run(capsys, *command, "--ctx", ctx, "--json")
        doc = json.loads(out)
        assert rc == 0 and _config(doc) == _config(default), ctx
        assert doc["offload"] is None
    rc, out, _ = run(capsys, *command, "--ctx", "65536")
    assert "does not fit with f16; fits with q8_0 K/V" in re.sub(r"\n +", " ", out)  # the note says why not f16
    # where f16 fits, f16 it stays
    rc, out, _ = run(capsys, *command, "--ctx", "16384", "--json")
    assert json.loads(out)["config"]["type_k"] == "f16"


def test_token_counts_take_k_and_refuse_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    # "+8192": llama.cpp's -c reads it (std::stoi takes a sign) and -np +2 was taken; --ctx +8192 was refused
    for text, n in (("64k", 65536), ("128K", 131072), ("1.5k", 1536), ("8192", 8192), ("+8192", 8192)):
        rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--ctx", text, "--json")
        assert rc == 0 and json.loads(out)["config"]["n_ctx"] >= n, text
    for bad in ("64kb", "1.2", "k", "1" * 5000, "-64k", "++8192", "+", "+-1"):
        rc, out, err = run(capsys, "ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ctx", bad)
        assert rc == 2 and out == "" and "Traceback" not in err and len(err.splitlines()) <= 2, (bad, err)


# --- default answers of at most 30 lines, each warning once, no equal numbers compared -----------------------


@pytest.mark.parametrize(
    ("command", "rc"),
    [
        (["ollama", "qwen3-coder", "--gpu", "rtx-4090"], 0),  # 100 % on the GPU
        # a partial plan; the RAM given, not this machine's free RAM (22 GiB with the prompt cache: a shared
        # machine's free memory decided whether it ran)
        (["ollama", "qwen3-coder", "--gpu", "rtx-4060", "--ram", "64GiB"], 0),
        (["ollama", "llama3.3:70b", "--gpu", "rtx-4060", "--gpu-only"], 3),  # does not fit
        (["ollama", "qwen3-coder", "qwen3:4b", "nomic-embed-text", "--gpu", "rtx-4090"], 0),  # several models
        (["hf", str(QWEN3_CODER_CONFIG), "--quant", "Q4_K_M", "--gpu", "rtx-4060", "--ram", "64GiB"], 0),
    ],
    ids=["fits", "partial", "no-fit", "several", "llamacpp-partial"],
)
def test_default_answers_are_short(command: list[str], rc: int, capsys: pytest.CaptureFixture[str]) -> None:
    got, out, _ = run(capsys, *command)
    lines = out.splitlines()
    assert got == rc and len(lines) <= 30, out
    assert all(len(x) <= 100 for x in lines), [x for x in lines if len(x) > 100]  # a terminal's ~100 columns
    said = [x.strip() for x in lines if x.strip().startswith(("warning:", "note:"))]
    assert len(said) == len(set(said)), out  # each warning and note once
    for x in lines:  # "≈ 5 t/s at 4k ... against ≈ 5 t/s at 4k": no line compares equal figures
        m = re.search(r"(≈ [\d,]+ t/s[^;()]*) against (≈ [\d,]+ t/s[^;()]*)", x)
        assert m is None or m.group(1) != m.group(2), x
    assert "--memory=" not in out  # a container's limit is for --verbose and --json


# --- which card to buy -------------------------------------------------------------------------------------------


def test_which_card_to_buy(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gpus MODEL --target-ctx N` answers with the smallest card that runs it 100% on the GPU at N,
    then every card that does; none below the target is listed above one that reaches it."""
    rc, out, _ = run(capsys, "gpus", "qwen3-coder", "--target-ctx", "64k", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["target_ctx"] == 65536 and doc["cards"] and doc["smallest"] == doc["cards"][0]["card"]
    assert all(c["reaches_target"] and c["n_ctx"] >= 65536 for c in doc["cards"])
    memory = [c["memory_bytes"] for c in doc["cards"]]
    assert memory == sorted(memory) and min(memory) >= 24 * (1 << 30) - (1 << 30)
    assert "rtx-4060" in doc["short"]  # 8 GiB: not at 64k
    rc, out, _ = run(capsys, "gpus", "qwen3-coder", "--ctx", "64k", "--all", "--json")
    rows = json.loads(out)["cards"]
    reaches = [c["reaches_target"] for c in rows]
    assert reaches == sorted(reaches, reverse=True)  # every card that reaches it first
    rc, out, _ = run(capsys, "gpus", "qwen3-coder", "--target-ctx", "64k")
    head = re.sub(r"\n +", " ", out).splitlines()[0]  # the answer, wrapped to ~100 columns, read as one line
    assert head.startswith("qwen3-coder at 65,536 tokens, 100% on the GPU: the smallest card")
    rc, out, _err = run(capsys, "compare", "llama3.3:70b", "--gpu", "rtx-4090x2,rtx-6000-ada", "--ctx", "32k", "--json")
    entries = json.loads(out)["entries"]
    short = {e["card"]: e["reaches_target"] for e in entries}
    assert rc == 0 and short == {"rtx-4090x2": False, "rtx-6000-ada": True}
    rc, out, _ = run(
        capsys, "compare", "llama3.3:70b", "--gpu", "rtx-4090x2,rtx-6000-ada", "--ctx", "32k", "--sort", "speed"
    )
    table = [x for x in out.splitlines() if x.startswith("llama3.3:70b")]
    assert "rtx-6000-ada" in table[0] and "SHORT" in table[1]


# --- speeds: labelled when extrapolated, a range for a card given by its size -----------------------------------


def test_extrapolated_speeds_are_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    """An M4 Max at 64k: the Metal measurements reach 8k, so the 64k figure is an extrapolation and says so,
    in the text and in --json; the 4k figure is not."""
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "m4-max-64gb", "--json")
    sp = json.loads(out)["decode_estimate"]
    assert rc == 0 and sp["measured_what"] == "Metal"
    flags = {p["n_ctx"]: p["extrapolated"] for p in sp["at_context"]}
    assert flags[4096] is False and flags[65536] is True
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "m4-max-64gb")
    assert "extrapolated" in next(x for x in out.splitlines() if "decode (estimate)" in x)


def test_a_card_given_by_its_size_gets_a_speed_range(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "ollama", "qwen3:8b", "--vram", "24GiB")
    line = next(x for x in re.sub(r"\n +", " ", out).splitlines() if "decode (estimate)" in x)
    assert rc == 0 and " to " in line and "catalogue card(s) of 24 GiB" in line
    rc, out, _ = run(capsys, "ollama", "qwen3:8b", "--vram", "24GiB", "--json")
    sp = json.loads(out)["decode_estimate"]
    assert sp["low"] < sp["tokens_per_s"] < sp["high"] and "rtx-4090" in sp["note"]


def test_the_ram_bandwidth_and_its_source_are_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A partial plan's CPU share is read at the system memory's bandwidth: the figure and where it came from."""
    rc, out, _ = run(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4060", "--ram", "64GiB", "--json")
    off = json.loads(out)["offload"]
    assert rc == 0 and off is not None
    rc, out, _ = run(
        capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4060", "--ram", "64GiB", "--ram-bandwidth", "40", "--json"
    )
    doc = json.loads(out)
    text = json.dumps(doc)
    assert '"ram_bandwidth_bytes_per_s": 40000000000' in text and '"ram_bandwidth_source": "--ram-bandwidth"' in text


# --- flash attention only where the backend has the kernel ------------------------------------------------------


def test_no_flash_attention_where_cuda_has_no_kernel(tmp_path: Path) -> None:
    """A pre-MLA DeepSeek-V2 shape (K head != V head at GQA 1): CUDA has no flash-attention kernel, so llama.cpp
    runs without it; the recommender plans and chooses without it too (and no quantized V, which needs it),
    and says so in one reason. The CPU has the kernel: there it stays on."""
    from tinymodels import write_tiny_gguf

    from kvadvise.planner.memory import estimate, resolve

    spec = kvadvise.load_model(str(write_tiny_gguf(tmp_path / "legacy.gguf", "deepseek2-legacy", n_vocab=600)))
    plan = kvadvise.plan(spec, kvadvise.PlanRequest(vram_bytes=(64 << 20,), margin_bytes=0, device="cuda"))
    assert plan.recommendation is not None
    assert plan.config.flash_attn == "off" and plan.config.type_v.type_name == "f16"
    assert all(not o.flash_attn and o.type_v.type_name == "f16" for o in plan.recommendation.options)
    assert any("flash attention off: CUDA has no kernel" in r for r in plan.recommendation.reasons)
    # the plan says -fa off: with auto llama.cpp makes the cache for flash attention (V not transposed) and
    # turns it off afterwards, so each layer copies V transposed beside the scores (build_attn_mha's ggml_cont):
    # more device memory, by the copy of one layer's V cache (f16), and V's row indices on the host shrink
    auto, off = (estimate(spec, replace(plan.config, flash_attn=fa)) for fa in ("auto", "off"))
    assert off.device_bytes == plan.estimate.device_bytes
    n_kv = resolve(spec, plan.config).n_ctx_seq
    v_cont = n_kv * spec.n_embd_v_gqa_max() * 2
    assert auto.devices[0].compute_bytes - off.devices[0].compute_bytes == pytest.approx(v_cont, abs=1 << 20)
    assert auto.devices[0].kv_bytes == off.devices[0].kv_bytes  # one V width: transposed or not, the same size
    assert auto.host.compute_bytes < off.host.compute_bytes
    # a --ctx given: the cache choice is made without flash attention as well
    fixed = kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=2048, vram_bytes=(64 << 20,), margin_bytes=0))
    assert fixed.config.flash_attn == "off"
    cpu = kvadvise.plan(spec, kvadvise.PlanRequest(no_hardware=False, device="cpu", ram_bytes=8 << 30))
    assert cpu.config.flash_attn == "on"
