"""Several devices without -ts: where the split by free memory leaves a device short of its budget, the layers
are filled back to front as llama.cpp's --fit fills them (common/fit.cpp, kvadvise.planner.fitsplit), and the
command carries that split; a split that fits, or one the user gave, is kept."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from ollama_fake import closed_port_url

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.budget import plan_budget
from kvadvise.planner.fitsplit import fit_split
from kvadvise.planner.hardware import manual_many
from kvadvise.planner.memory import RunConfig, estimate

MIB, GIB = 1 << 20, 1 << 30


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    rc = main([*args, "--ram", "16GiB", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def test_a_small_first_card_gets_no_layers_and_the_plan_runs(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1.46 GiB and 3 GiB: by free memory the first card would take a third of the layers and miss its budget
    (its CUDA context alone is 330 MiB of its 476 MiB); filled back to front, the second card takes all 19
    (18 blocks and the output layer), as llama.cpp's fit would; asked for no split, the model stays on the
    second card alone (-dev CUDA1), and the first holds nothing, not even a CUDA context (the fill itself:
    test_the_fill_is_back_to_front_and_tight)."""
    doc = _plan(capsys, "llamacpp", str(gemma_path), "--vram", "1500MiB,3GiB", "--ctx", "32768")
    assert [(d["name"], d["n_layers"]) for d in doc["memory"]["devices"]] == [("CUDA1", 19)]
    cmd = shlex.split(doc["llama_server"]["command"])
    assert cmd[cmd.index("-dev") + 1] == "CUDA1" and "-ts" not in cmd


def test_the_fill_is_back_to_front_and_tight(gemma_path: Path) -> None:
    """Each device from the last takes the most layers its budget holds: one more would not fit."""
    spec = from_gguf(read_file(gemma_path))
    budget = plan_budget(manual_many([2048 * MIB, 1600 * MIB]), 1024 * MIB)  # budgets 1,024 and 576 MiB
    cfg = RunConfig(n_ctx=32768, device="cuda", flash_attn="on", tensor_split=(2.0, 1.5625))
    assert not budget.fits(estimate(spec, cfg))  # by free memory the second card's share misses its budget
    split = fit_split(spec, cfg, budget)
    assert split is not None and sum(split) == spec.n_layer_all + 1
    est = estimate(spec, replace(cfg, tensor_split=split))
    assert budget.fits(est) and [d.n_layers for d in est.devices] == [int(x) for x in split] == [18, 1]
    last = len(split) - 1
    more = tuple(x + (1 if i == last else -1 if i == 0 else 0) for i, x in enumerate(split))
    assert estimate(spec, replace(cfg, tensor_split=more)).devices[last].total_bytes > budget.device_budgets[last]


def test_a_split_that_fits_and_a_given_split_are_kept(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan(capsys, "llamacpp", str(gemma_path), "--vram", "24GiB,16GiB", "--ctx", "32768", "-ts", "24,16")
    cmd = shlex.split(doc["llama_server"]["command"])
    assert cmd[cmd.index("-ts") + 1] == "24,16"  # as given: it fits, nothing moved
    assert not any("layers per device" in n for n in doc["notes"])
    rc = main(["llamacpp", str(gemma_path), "--vram", "1500MiB,3GiB", "--ctx", "32768", "-ts", "1,2", "--json"])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    # every layer does not fit the first card at -ts 1,2; the user's -ts is the user's: not moved, a layer goes to
    # the CPU instead (a partial offload, which llama.cpp does not pipeline: no copies of the split's inputs)
    cmd = shlex.split(doc["llama_server"]["command"])
    assert rc == 0 and cmd[cmd.index("-ts") + 1] == "1,2" and doc["offload"]["n_gpu_layers"] == 18


def test_nothing_to_fit_when_the_devices_cannot_hold_every_layer(gemma_path: Path) -> None:
    spec = from_gguf(read_file(gemma_path))
    budget = plan_budget(manual_many([1400 * MIB, 1400 * MIB]), 1024 * MIB)
    cfg = RunConfig(n_ctx=131072, device="cuda", flash_attn="on", tensor_split=(1.37, 1.37))
    assert fit_split(spec, cfg, budget) is None
