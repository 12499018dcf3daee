"""`kvadvise compare`: models side by side on one card, one model on many cards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ollama_fake import closed_port_url

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.hardware import from_profile
from kvadvise.planner.memory import RunConfig
from kvadvise.planner.planning import make_plan
from kvadvise.planner.policy import Policy

GiB = 1 << 30


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))


def test_builtin_profiles_on_one_card(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "compare", "--gpu", "rtx-4090", "--use", "agent", "--sort", "speed", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["target_ctx"] == 65536 and doc["cards"][0]["source"] == "profile:rtx-4090"
    es = doc["entries"]
    assert len(es) >= 20 and {e["card"] for e in es} == {"rtx-4090"}
    speeds = [e["decode_4k_tokens_per_s"] or 0 for e in es]  # --sort speed: by the figure at 4k
    assert speeds == sorted(speeds, reverse=True)
    big = next(e for e in es if e["model"] == "llama3.1:70b")
    assert big["fits"] is False and big["n_ctx"] == 0 and big["decode_tokens_per_s"] is None
    coder = next(e for e in es if e["model"] == "qwen3-coder:30b")
    assert coder["fits"] and coder["n_ctx"] == 65536 and coder["type_k"] == "q8_0"
    assert coder["headroom_bytes"] == coder["budget_bytes"] - coder["device_bytes"] > 0
    rc, out, _ = run(capsys, "compare", "--gpu", "rtx-4090", "--use", "agent", "--sort", "context")
    lines = out.splitlines()
    assert lines[2].split()[:4] == ["MODEL", "CARD", "FITS", "CONTEXT"]
    assert lines[-1].split()[2] == "NO"


def test_one_model_on_many_cards(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(
        capsys,
        "compare",
        str(gemma_path),
        "--gpu",
        "rtx-4090,rtx-5090,rtx-3090x2,m4-max-64gb",
        "--use",
        "chat",
        "--json",
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert [e["card"] for e in doc["entries"]] == ["rtx-4090", "rtx-5090", "rtx-3090x2", "m4-max-64gb"]
    assert doc["cards"][2]["n_gpu"] == 2
    spec = from_gguf(read_file(gemma_path))
    plan = make_plan(
        spec, RunConfig(n_ctx=0), recommend_ctx=True, hw=from_profile("rtx-5090"), policy=Policy(target_ctx=8192)
    )
    e = doc["entries"][1]
    assert e["n_ctx"] == 8192 and e["device_bytes"] == plan.estimate.device_bytes
    assert e["decode_tokens_per_s"] == pytest.approx(plan.recommendation.decode_tokens_per_s)
    x2 = doc["entries"][2]  # the model fits one of the two cards: it is planned there alone (-dev CUDA0)
    one = make_plan(
        spec, RunConfig(n_ctx=0), recommend_ctx=True, hw=from_profile("rtx-3090"), policy=Policy(target_ctx=8192)
    )
    assert one.budget is not None and x2["budget_bytes"] == one.budget.budget_bytes


def test_explicit_backend_and_no_fit_exit_3(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "compare", f"gguf:{gemma_path}", "--vram", "100MiB", "--margin", "0")
    assert rc == 3 and "NO" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["compare", "--gpu", "rtx-9999"], 2, "kvadvise gpus"),
        (["compare", "--gpu", "rtx-4090", "--vram", "8GiB"], 2, "not both"),
        (["compare", "--use", "chat", "--target-ctx", "4096", "--gpu", "t4"], 2, "not both"),
        (["compare", "no-such-model:1b", "--gpu", "t4"], 2, "not found"),
        (["compare", "--gpu", "t4", "--sort", "price"], 2, "Invalid value"),
    ],
)
def test_errors(args: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == code and out == "" and message in err


# --- issue 30.3: compare made faster, no result changed --------------------------------------------


class _NeverHit(dict):  # type: ignore[type-arg]
    """A memo that forgets at once: every estimate computes the layer shapes and splits afresh."""

    def get(self, key: object, default: object = None) -> object:
        return default


def _plans(sample: list[tuple[dict[str, Any], tuple[str, ...]]]) -> list[tuple[str, str, int, Any]]:
    from kvadvise.cli.compare import card, plan_pair, resolve_models

    specs = resolve_models(())
    out = []
    for i, (s, names) in enumerate(sample):
        for c in (card(n) for n in names):
            for name, spec in specs:
                p = plan_pair(spec, c.hardware, target=s["target"], use=s["use"], n_parallel=s["n_parallel"],
                             margin=1 << 30, repeatable=s["repeatable"])  # fmt: skip
                out.append((name, c.label, i, p))
    return out


def test_memoized_plans_equal_plans_computed_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare remembers per model what does not depend on the card (issue 30.3: 3.9x faster,
    benchmarks/bench_compare.py): every built-in profile on 8 cards under 4 settings plans exactly as
    with nothing remembered - context, cache types, every byte, options, decode figures and reasons."""
    from kvadvise.planner import hardware, layout, split

    # this machine's free RAM moves between the two passes; the plans read it (a partial offload's RAM)
    monkeypatch.setattr(hardware, "_ram_now", lambda: (64 << 30, 48 << 30))
    sample = [
        (
            {"target": 0, "use": None, "n_parallel": 1, "repeatable": False},
            ("t4", "rtx-3060", "rtx-4090", "rtx-5090", "rtx-3090x2", "a100-80gb", "m4-max-64gb", "rx-7900-xtx"),
        ),
        ({"target": 0, "use": "long", "n_parallel": 1, "repeatable": False}, ("rtx-4090", "m4-max-64gb")),
        ({"target": 8192, "use": None, "n_parallel": 4, "repeatable": False}, ("rtx-3060", "rtx-3090x2")),
        ({"target": 0, "use": None, "n_parallel": 1, "repeatable": True}, ("t4", "a100-80gb")),
    ]
    memo = _plans(sample)
    monkeypatch.setattr(layout, "_SHAPES", _NeverHit())
    monkeypatch.setattr(split, "_SPLITS", _NeverHit())
    fresh = _plans(sample)
    assert len(memo) == len(fresh) > 500
    for (name, label, i, a), (_, _, _, b) in zip(memo, fresh, strict=True):
        assert a.config == b.config and a.estimate == b.estimate and a.fits == b.fits, (name, label, i)
        ra, rb = a.recommendation, b.recommendation
        assert ra.options == rb.options and ra.reasons == rb.reasons and ra.speed == rb.speed, (name, label, i)


def test_decode_at_4k_and_at_the_context_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29.3: phi4 (16k) ranked above llama3.1:8b (64k) by each one's speed at its own context, though at
    4k llama3.1:8b is much faster; both figures are printed and labelled, --sort speed takes the 4k one, and the
    header says the target the plans used (64k on a 24 GB card), not "each model's training context"."""
    rc, out, err = run(capsys, "compare", "phi4:14b", "llama3.1:8b", "--gpu", "rtx-4090", "--sort", "speed", "--json")
    assert rc == 0, err
    es = {e["model"]: e for e in json.loads(out)["entries"]}
    phi, llama = es["phi4:14b"], es["llama3.1:8b"]
    assert (phi["n_ctx"], llama["n_ctx"]) == (16384, 65536)
    assert phi["decode_tokens_per_s"] > llama["decode_tokens_per_s"]  # each at its own context
    assert llama["decode_4k_tokens_per_s"] > 1.5 * phi["decode_4k_tokens_per_s"]  # at one depth
    assert [e["model"] for e in json.loads(out)["entries"]] == ["llama3.1:8b", "phi4:14b"]
    plan = make_plan(
        read_profile("llama3.1:8b"),
        RunConfig(n_ctx=0),
        recommend_ctx=True,
        hw=from_profile("rtx-4090"),
        policy=Policy(),
    )
    assert plan.speed is not None and plan.speed.points[0][0] == 4096
    assert llama["decode_4k_tokens_per_s"] == pytest.approx(plan.speed.points[0][1])
    assert llama["decode_tokens_per_s"] == pytest.approx(plan.speed.points[-1][1])

    rc, out, _ = run(capsys, "compare", "phi4:14b", "llama3.1:8b", "--gpu", "rtx-4090", "--sort", "speed")
    head, legend, columns, first = out.splitlines()[:4]
    assert "target 64k per slot (the default on this card), capped at each model's training context" in head
    assert "training context;" not in head.replace("capped at each model's training context", "")
    assert "4k tokens of context, and at its CONTEXT; sorted by the 4k figure" in legend
    assert columns.split()[-5:] == ["T/S@4K", "T/S@CTX", "PART", "ON", "CPU"]
    assert first.split()[0] == "llama3.1:8b" and first.split()[-3:-1] == [  # then PART ON CPU: -
        f"~{llama['decode_4k_tokens_per_s']:,.0f}",
        f"~{llama['decode_tokens_per_s']:,.0f}",
    ]
    rc, out, _ = run(capsys, "compare", "phi4:14b", "--gpu", "rtx-4090", "--use", "long")
    assert "target (--use long): each model's training context" in out.splitlines()[0]
    rc, out, _ = run(capsys, "compare", "phi4:14b", "--gpu", "rtx-4090,rtx-3060", "--target-ctx", "8192")
    assert "target 8k per slot (--target-ctx)" in out.splitlines()[0]


def read_profile(pid: str) -> Any:
    from kvadvise.backends.ollama.profiles import profiles

    return profiles()[pid].spec()
