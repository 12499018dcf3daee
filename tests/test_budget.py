"""One budget rule (kvadvise.planner.budget.plan_budget) for every command: a plan, a listing, ``compare``,
RPC hosts, the Python API. Issue 28 found two commands off the rule: ``compare`` skipped the 3 % kept
free for a built-in profile's published weights size, and a single ``--rpc`` host (a size given by hand,
like --vram) lost 512 MiB to a desktop display allowance."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from ollama_fake import closed_port_url

import kvadvise
from kvadvise.cli import main
from kvadvise.planner.budget import DISPLAY_ALLOWANCE_BYTES, budget_for, plan_budget
from kvadvise.planner.gpus import find_profile
from kvadvise.planner.hardware import RpcHost, from_profile, manual, rpc_hosts

MIB, GIB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def test_compare_keeps_the_profile_headroom_a_plan_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    """qwen3:32b on an RTX 4090: compare planned 28,672 tokens on 1 GiB margin + display only; the plan
    keeps 3 % of the profile's 20 GB weights free too (572 MiB). Now both say 23,552 on the same budget (24,576
    before b11312's graph was replayed for a CUDA plan: Qwen3-32B's Q, 64 heads of 128, is wider than its n_embd
    of 5120, and its compute buffer is 209.09 MiB, not the phases' 204: tests/test_replayed_compute_newest.py)."""
    plan = _json(capsys, "ollama", "qwen3:32b", "--gpu", "rtx-4090")
    (entry,) = _json(capsys, "compare", "qwen3:32b", "--gpu", "rtx-4090")["entries"]  # type: ignore[misc]
    budget = plan["budget"]
    assert isinstance(budget, dict)
    free = find_profile("rtx-4090").usable_bytes
    weights = 20_000_000_000  # profiles/ollama_models.json: Ollama's library size for qwen3:32b
    expected = free - 1024 * MIB - -(-weights * 3 // 100) - DISPLAY_ALLOWANCE_BYTES
    assert entry["budget_bytes"] == budget["budget_bytes"] == expected
    assert budget["headroom_notes"][0].startswith("572 MiB: 3% of the weights")
    assert entry["n_ctx"] == 23552


def test_a_single_rpc_host_keeps_no_display_allowance(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--rpc HOST:PORT=SIZE says what is free on the host, as --vram does: no display allowance (it took 512 MiB)."""
    doc = _json(capsys, "llamacpp", str(gemma_path), "--rpc", "127.0.0.1:50052=8GiB", "--ctx", "4096")
    budget = doc["budget"]
    assert isinstance(budget, dict)
    assert budget["device"] == "rpc" and budget["headroom_bytes"] == 0 and budget["headroom_notes"] == []
    assert budget["budget_bytes"] == 7 * GIB
    hw = rpc_hosts([RpcHost("127.0.0.1:50052", 8 * GIB)])
    assert plan_budget(hw) == budget_for(hw)  # the rule itself, without a model
    vram = manual(8 * GIB)
    assert plan_budget(vram) == budget_for(vram)


def test_a_listing_takes_the_budget_a_plan_takes(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise gguf DIR` sizes each model on the budget `kvadvise gguf FILE` plans it on (before, the
    listing skipped the display allowance and ignored --headless)."""
    d = tmp_path / "models"
    d.mkdir()
    (d / "gemma.gguf").symlink_to(gemma_path)
    for extra in ([], ["--headless"]):
        plan = _json(capsys, "gguf", str(gemma_path), "--gpu", "rtx-4090", *extra)
        listing = _json(capsys, "gguf", str(d), "--gpu", "rtx-4090", *extra)
        (row,) = listing["models"]  # type: ignore[misc]
        assert row["budget_bytes"] == listing["budget"]["budget_bytes"] == plan["budget"]["budget_bytes"]  # type: ignore[index]
        assert plan["budget"]["headroom_bytes"] == (0 if extra else DISPLAY_ALLOWANCE_BYTES)  # type: ignore[index]


def test_the_python_api_takes_the_budget_the_cli_takes(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kvadvise.recommend used free minus margin only; kvadvise.plan and the CLI kept the display allowance."""
    spec = kvadvise.load_model(str(gemma_path))
    hw = from_profile("rtx-4090")
    rec = kvadvise.recommend(spec, hw)
    doc = _json(capsys, "gguf", str(gemma_path), "--gpu", "rtx-4090")
    assert rec.budget.budget_bytes == doc["budget"]["budget_bytes"]  # type: ignore[index]
    assert kvadvise.plan(spec, hardware=hw).budget == rec.budget


def test_no_module_computes_a_budget_outside_the_rule() -> None:
    """Only kvadvise.planner.budget calls budget_for and with_headroom: every other module takes plan_budget,
    so a new command cannot skip part of the headroom again."""
    offenders = []
    for folder in ("advisor", "backends"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "advisor" / "planner" / "budget.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
                if name in ("budget_for", "with_headroom"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    assert offenders == []
