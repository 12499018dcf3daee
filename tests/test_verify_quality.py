"""``kvadvise verify quality``: llama.cpp's own KL divergence of a quantized K/V cache against an f16 one
(the real llama-perplexity the suite builds, tests/llama_server_build.py, on the real Gemma 3 270M), the
figures stored per model and used by the next plan; its failures (no binary, a killed run, a text too
short, the deadline) are one line with a documented exit code and leave no temporary file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from kvadvise.cli import main
from kvadvise.model.ggml import GGMLType
from kvadvise.runtime import qualitycache

F16, Q8_0, Q4_0 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
SMALL = ["--ctx", "128", "--chunks", "3", "-t", "2"]  # 3 x 63 scored tokens: seconds on 2 cores


@pytest.fixture(scope="module")
def perplexity_binary() -> Path:
    from llama_server_build import BuildUnavailable, perplexity

    try:
        path = perplexity()
    except BuildUnavailable as e:
        pytest.skip(f"no llama-perplexity can be built here: {e}")
    return path


@pytest.fixture(autouse=True)
def _temp_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary files go under the test's own folder, so that what is left behind can be counted."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _quality(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object], str]:
    rc = main(["verify", "quality", *argv, "--json"])
    cap = capsys.readouterr()
    doc = json.loads(cap.out)["quality"] if rc == 0 else {}
    return rc, doc, cap.err


@pytest.mark.llama
def test_f16_against_f16_is_the_floor(
    gemma_path: Path, perplexity_binary: Path, _temp_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An f16 cache against the f16 reference: what is left is the reference's 16-bit storage of the log
    probabilities (tools/perplexity/README.md), mean KLD about 0 and the same top token everywhere."""
    argv = [str(gemma_path), "-ctk", "f16", "-ctv", "f16", *SMALL, "--llama-perplexity", str(perplexity_binary)]
    rc, doc, err = _quality(capsys, argv)
    assert rc == 0, err
    (row,) = doc["results"]  # type: ignore[misc]
    assert (row["type_k"], row["type_v"], row["n_ctx"], row["n_chunks"], row["n_scored"]) == ("f16", "f16", 128, 3, 189)
    assert abs(row["mean_kld"]) < 1e-4 and row["same_top_pct"] >= 99.0 and not row["too_lossy"]
    assert doc["llama_build"] == 11312
    assert "[1/2] f16 K/V reference" in err and "-fa on" in err  # progress on stderr, the flags shown
    assert not list(_temp_here.iterdir())  # the reference logits removed


@pytest.mark.llama
def test_q4_0_costs_more_than_q8_0_and_the_next_plan_cites_it(
    gemma_path: Path, perplexity_binary: Path, _temp_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The policy's quantized cache types, measured in one go: q4_0 K/V loses more than q8_0 K/V; the
    figures are stored under the model's sha256 and the next plan that picks a quantized cache cites them."""
    argv = [str(gemma_path), "--ctx", "256", "--chunks", "2", "-t", "2", "--llama-perplexity", str(perplexity_binary)]
    rc, doc, err = _quality(capsys, argv)
    assert rc == 0, err
    rows = {(r["type_k"], r["type_v"]): r for r in doc["results"]}  # type: ignore[attr-defined]
    assert set(rows) == {("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0")}
    q8, q4 = rows[("q8_0", "q8_0")], rows[("q4_0", "q4_0")]
    assert 0 < q8["mean_kld"] < q4["mean_kld"]
    assert q8["p99_kld"] < q4["p99_kld"] and q4["same_top_pct"] <= q8["same_top_pct"]
    assert not list(_temp_here.iterdir())

    key = qualitycache.model_key(str(gemma_path))
    stored = json.loads(qualitycache.path().read_text())["models"][key]
    assert {(r["type_k"], r["type_v"], r["n_ctx"]) for r in stored["results"]} == {
        ("q8_0", "q8_0", 256),
        ("q8_0", "q4_0", 256),
        ("q4_0", "q4_0", 256),
    }
    measured = qualitycache.lookup(str(gemma_path), 11312)
    assert measured is not None and measured.of((Q8_0, Q8_0)) is not None

    # 1700 MiB, --use long (32,768 tokens): f16 reaches 20,224 tokens, q8_0 the target. The reason is the
    # measured figure, not the FAQ: q8_0 chosen and its figure cited, or kept out and its figure cited
    plan = ["llamacpp", str(gemma_path), "--vram", "1700MiB", "--use", "long", "--json"]
    assert main(plan) == 0
    doc = json.loads(capsys.readouterr().out)
    text = "\n".join(doc["reasons"])
    assert "measured on this model (kvadvise verify quality)" in text and "Ollama FAQ" not in text, text
    assert f"mean KLD {q8['mean_kld']:.4g}, 99th percentile {q8['p99_kld']:.4g}" in text, text
    chosen = (doc["config"]["type_k"], doc["config"]["type_v"])
    assert chosen == (("f16", "f16") if q8["too_lossy"] else ("q8_0", "q8_0"))
    if q4["too_lossy"]:
        assert f"q4_0 K/V not chosen: measured on this model (kvadvise verify quality): mean KLD {q4['mean_kld']:.4g}" in text
    # without the measurement, the same plan quotes the FAQ
    qualitycache.path().unlink()
    assert main(plan) == 0
    assert "Ollama FAQ" in "\n".join(json.loads(capsys.readouterr().out)["reasons"])
