"""A repeat, presence or frequency penalty costs the CPU a pass over the vocabulary every token
(kvadvise.planner.speed.SAMPLER_PENALTY_S_PER_ENTRY: llama-sampling.cpp llama_sampler_penalties_apply looks every
candidate up; measured by benchmarks/bench_sampling.py, published in llama.cpp#24871). Ollama applied repeat_penalty
1.1 to every model that set none until 0.32.10 (ollama 6a261db7d) on its llama.cpp runners; its Go engine's sampler
applies none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvadvise.backends.ollama import versions
from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner import speed


def test_the_penalty_adds_its_pass_over_the_vocabulary(gemma_path: Path) -> None:
    """Gemma 3 270M (262,144 entries) on an RTX 4090: each token takes n_vocab x 13 ns (3.4 ms) longer."""
    spec = from_gguf(read_file(gemma_path))
    devs = [speed.Device("cuda", 1_008_000_000_000, clock_hz=2.52e9)]
    plain = speed.estimate(spec, 4096, devs)
    pen = speed.estimate(spec, 4096, devs, sampling_penalties=True)
    assert plain is not None and pen is not None
    added = 1 / pen.tokens_per_s - 1 / plain.tokens_per_s
    assert added == pytest.approx(262_144 * 13e-9, rel=1e-9)
    assert "the sampler's penalty visits them all again" in pen.note and "penalty" not in plain.note
    # sampling itself, penalty or not: every runtime samples each token over all 262,144 candidates on the CPU
    assert "samples each token on the CPU over all 262,144 candidates" in plain.note
    assert f"+{262_144 * speed.SAMPLING_S_PER_ENTRY * 1e3:.1f} ms counted" in plain.note


@pytest.mark.parametrize(
    ("version", "architecture", "params", "penalised"),
    [
        ("0.13.5", "qwen2", {}, True),  # the llamarunner, default repeat_penalty 1.1
        ("0.30.0", "qwen2", {}, True),  # llama-server, the same default
        ("0.32.9", "qwen2", {}, True),
        ("0.32.10", "qwen2", {}, False),  # the default is 1.0 from here
        ("0.32.10", "qwen35moe", {"presence_penalty": 1.5}, True),  # the library's qwen3.5 sets one
        ("0.30.0", "qwen2", {"repeat_penalty": 1}, False),  # PARAMETER repeat_penalty 1
        ("0.30.0", "qwen2", {"repeat_last_n": 0}, False),  # a window of no tokens
        ("0.20.2", "gptoss", {"repeat_penalty": 1.3}, False),  # the Go engine's sampler has no penalties
        (None, "qwen2", {}, False),  # an unknown version: the newest
    ],
)
def test_which_ollama_applies_a_penalty(
    version: str | None, architecture: str, params: dict[str, object], penalised: bool
) -> None:
    assert versions.release(version, architecture).sampling_penalties(params) is penalised


def test_an_ollama_plan_before_0_32_10_decodes_slower_and_says_why(
    coder_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """qwen2.5-coder:7b (152,064 entries) on an RTX 4090 at 8k: 2 ms a token more under Ollama 0.30.0 than 0.32.10."""

    def plan(version: str) -> dict[str, object]:
        args = ["ollama", "qwen2.5-coder:7b", "--gpu", "rtx-4090", "-c", "8192", "--ollama-version", version]
        assert main([*args, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert isinstance(doc, dict)
        return doc

    old, new = plan("0.30.0"), plan("0.32.10")
    t_old = 1 / old["decode_estimate"]["tokens_per_s"]  # type: ignore[index]
    t_new = 1 / new["decode_estimate"]["tokens_per_s"]  # type: ignore[index]
    assert t_old - t_new == pytest.approx(152_064 * 13e-9, rel=1e-6)
    said = " ".join(str(n) for n in old["notes"])  # type: ignore[union-attr]
    assert "repeat_penalty 1.1" in said and "PARAMETER repeat_penalty 1" in said
    assert "repeat_penalty" not in " ".join(str(n) for n in new["notes"])  # type: ignore[union-attr]


def test_a_file_that_sets_a_repeat_penalty_is_planned_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """general.sampling.penalty_repeat 1.05 (Qwen2.5-Instruct's generation_config.json, copied by convert_hf_to_gguf.py):
    llama-server samples with it unless --repeat-penalty says otherwise (common.cpp), so its plan counts the pass over
    the 152,064 candidates; the same file without the key, or with a window of 0 tokens, does not."""
    from tinymodels import write_tiny_gguf

    dims = {"n_layer": 28, "n_embd": 3584, "n_head": 28, "n_head_kv": 4, "n_ff": 18944}

    def plan(name: str, keys: dict[str, float]) -> dict[str, object]:
        gguf = write_tiny_gguf(tmp_path / name, "qwen2", n_vocab=152064, dims=dims, sparse=True, general_f32=keys)
        assert main(["gguf", str(gguf), "--gpu", "rtx-4090", "-c", "8192", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert isinstance(doc, dict)
        return doc

    plain = plan("plain.gguf", {})
    pen = plan("pen.gguf", {"general.sampling.penalty_repeat": 1.05})
    off = plan("off.gguf", {"general.sampling.penalty_repeat": 1.05, "general.sampling.penalty_last_n": 0.0})
    t = {k: 1 / d["decode_estimate"]["tokens_per_s"] for k, d in (("plain", plain), ("pen", pen), ("off", off))}  # type: ignore[index]
    assert t["pen"] - t["plain"] == pytest.approx(152_064 * 13e-9, rel=1e-6)
    assert t["off"] == pytest.approx(t["plain"], rel=1e-9)
    assert "--repeat-penalty 1 avoids it" in " ".join(str(n) for n in pen["notes"])  # type: ignore[union-attr]


def test_verify_compares_each_runner_with_what_it_timed(gemma_path: Path) -> None:
    """llama-server's predicted_per_second holds the CPU's sampling; the llama-cpp-python probe decodes fixed
    tokens with llama_decode alone. verify sets the plan's estimate beside each as it timed it: the server's
    with the sampling (the plan's own figure), the probe's without (262,144 candidates x 3.7 ns less a token)."""
    from dataclasses import fields

    import kvadvise
    from kvadvise.request import PlanRequest
    from kvadvise.runtime.verification import Measurement, compare

    plan = kvadvise.plan(str(gemma_path), PlanRequest(n_ctx=4096, gpu="rtx-4090", ram_bytes=32 << 30))
    assert plan.speed is not None
    blank: dict[str, object] = {f.name: 0 for f in fields(Measurement)} | {"backend": "CUDA", "llama_cpp_build": "b1"}
    blank |= {"device_used_bytes": None, "prompt_tokens_per_s": None, "n_ctx": 4096, "gpu_layers": None}
    blank |= {"total_layers": None, "prompt_tokens": None, "placements": (), "decode_tokens_per_s": 100.0}
    server = compare(plan, Measurement(**{**blank, "runner": "llama-server"}))  # type: ignore[arg-type]
    probe = compare(plan, Measurement(**{**blank, "runner": "llama-cpp-python"}))  # type: ignore[arg-type]
    assert server.decode_estimate_tokens_per_s == plan.speed.tokens_per_s
    assert probe.decode_estimate_tokens_per_s is not None
    unsampled = 1 / probe.decode_estimate_tokens_per_s
    assert unsampled == pytest.approx(1 / plan.speed.tokens_per_s - 262_144 * speed.SAMPLING_S_PER_ENTRY, rel=1e-9)


def test_the_users_own_penalty_is_a_flag(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    """--sampler-penalty (PlanRequest.sampling_penalties): the user's requests sample with a penalty; the plan
    counts its pass over the vocabulary (262,144 x 13 ns a token for Gemma 3 270M) and says so."""

    def plan(*extra: str) -> dict[str, object]:
        args = ["llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ram", "32GiB", "-c", "4096", *extra, "--json"]
        assert main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert isinstance(doc, dict)
        return doc

    plain, pen = plan(), plan("--sampler-penalty")
    tps = [d["decode_estimate"]["tokens_per_s"] for d in (plain, pen)]  # type: ignore[index]
    assert 1 / tps[1] - 1 / tps[0] == pytest.approx(262_144 * speed.SAMPLER_PENALTY_S_PER_ENTRY, rel=1e-6)
    assert "penalty visits them all again" in str(pen["decode_estimate"]["note"])  # type: ignore[index]
