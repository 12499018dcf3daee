"""Bugs found while reshaping the package (the "one installed package" issue), each held here."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fault_server import Answer, serving

import kvadvise
from kvadvise.backends.ollama import api as ollama_api
from kvadvise.cli import main
from kvadvise.errors import EXIT_INPUT
from kvadvise.runtime import calibration


def test_api_and_cli_plan_on_the_same_device(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RunConfig's device defaults to "auto", as --device does: both plan a given --ctx on the card."""
    spec = kvadvise.load_model(str(gemma_path))
    api_doc = kvadvise.to_json(
        kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=4096), hardware=kvadvise.gpu_profile("4090"))
    )
    assert main(["gguf", str(gemma_path), "--ctx", "4096", "--gpu", "4090", "--json"]) == 0
    cli_doc = json.loads(capsys.readouterr().out)
    assert api_doc["config"]["device"] == cli_doc["config"]["device"] == "cuda"
    assert api_doc["memory"] == cli_doc["memory"]
    # without hardware both estimate the CPU
    assert kvadvise.estimate(spec, kvadvise.RunConfig(n_ctx=4096)).layout.device == "cpu"


def test_margin_zero_is_accepted(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's -fitt 0 is legal, and kvadvise itself suggests a smaller margin."""
    assert main(["gguf", str(gemma_path), "--gpu", "4090", "--margin", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    b = doc["budget"]
    assert b["margin_bytes"] == 0
    assert b["budget_bytes"] == b["free_bytes"] - b["headroom_bytes"]  # only the display allowance is kept
    assert main(["gguf", str(gemma_path), "--gpu", "4090", "--margin", "-1GiB"]) == EXIT_INPUT
    assert main(["gguf", str(gemma_path), "--gpu", "4090", "--margin", "lots"]) == EXIT_INPUT


def test_verify_takes_no_planned_card(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run is measured on this machine: --gpu/--vram (a card you do not own) are not options of verify."""
    for flag in (["--gpu", "4090"], ["--vram", "24GiB"]):
        assert main(["verify", "llamacpp", str(gemma_path), "--ctx", "512", *flag]) == EXIT_INPUT
        assert "No such option" in capsys.readouterr().err


@pytest.mark.parametrize(
    "doc",
    [
        {"format": 1, "entries": [{"device": "NVIDIA X", "overhead_bytes": 1}]},  # fields missing
        {"format": 2, "entries": []},  # a newer format
        {
            "format": 1,
            "entries": [
                {
                    "device": "NVIDIA X",
                    "llama_cpp_build": "b",
                    "runner": "r",
                    "model": "m",
                    "config": "c",
                    "measured_at": "t",
                    "overhead_bytes": -5,
                    "compute_ratio": 1.0,
                }
            ],
        },
        "not json at all",
    ],
    ids=["missing field", "newer format", "negative overhead", "not JSON"],
)
def test_a_bad_calibration_file_is_skipped_and_can_be_cleared(
    doc: object, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = calibration.path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    measured, notes = calibration.measured_overhead("NVIDIA X")
    assert measured is None and len(notes) == 1 and "ignored" in notes[0]
    assert main(["calibration", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["entries"] == [] and len(shown["notes"]) == 1
    assert main(["gguf", str(gemma_path), "--gpu", "4090"]) == 0  # plans are not stopped by it
    assert main(["calibration", "clear"]) == 0
    assert not p.exists()


def test_a_good_entry_survives_a_bad_one(tmp_path: Path) -> None:
    good = {"device": "NVIDIA X", "llama_cpp_build": "b7000", "runner": "llama-server", "model": "m",
            "config": "-c 4096", "measured_at": "2026-12-03T00:00:00Z", "overhead_bytes": 400 << 20,
            "compute_ratio": 1.01}  # fmt: skip
    p = calibration.path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"format": 1, "entries": [good, {"device": 3}]}))
    measured, notes = calibration.measured_overhead("NVIDIA X")
    assert measured is not None and measured.overhead_bytes == 400 << 20
    assert notes and "1 calibration entry malformed" in notes[0]


def test_a_hung_ollama_server_costs_one_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """/api/show times out; /api/ps and /api/version are then not asked again within the command."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty-store"))
    real = ollama_api._call
    calls: list[str] = []

    def counted(url: str, method: str, path: str, **kw: Any) -> Any:
        calls.append(path)
        return real(url, method, path, **{**kw, "timeout": 0.5})

    monkeypatch.setattr(ollama_api, "_call", counted)
    with serving(lambda method, path: Answer(200, b"{}", delay_s=3.0)) as srv:
        t0 = time.monotonic()
        rc = main(["ollama", "qwen3-coder", "--gpu", "4090", "--host", srv.url])
        took = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert rc == 0, err  # the built-in profile plans it; the live state is reported as unread
    assert calls == ["/api/show"]
    assert took < 2.5
    assert "live state not read" in out


def test_weights_label_is_the_file_type(gemma_path: Path) -> None:
    """general.file_type = 15 (Q4_K_M); the largest tensor (the 262k-token embedding) is q8_0."""
    assert kvadvise.load_model(str(gemma_path)).file_type == "Q4_K_M"


def test_runtime_decides_the_logits_rows(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama-server reserves one logits row per slot, and so does llama-cli, which runs llama-server's context
    since ggml-org/llama.cpp#17824 (tools/cli links llama-server-impl; published log 053: b11151's llama-cli,
    378.02 MiB, one row); the library (llama-completion, llama-cpp-python) the batch. A llama-cli older than
    b9467 takes the whole batch, as the llama-server of its time did."""
    docs = {}
    for runtime in ("llama-server", "llama-cli", "library"):
        argv = ["gguf", str(gemma_path), "--ctx", "4096", "-fa", "on", "-np", "2", "--no-hardware", "--json"]
        assert main([*argv, "--runtime", runtime, "--llama-build", "b11312"]) == 0
        docs[runtime] = json.loads(capsys.readouterr().out)
    server, cli = docs["llama-server"], docs["library"]
    assert (server["config"]["runtime"], server["config"]["n_outputs_max"]) == ("llama-server", 2)
    assert (docs["llama-cli"]["config"]["runtime"], docs["llama-cli"]["config"]["n_outputs_max"]) == ("llama-cli", 2)
    assert docs["llama-cli"]["memory"] == server["memory"]
    assert (cli["config"]["runtime"], cli["config"]["n_outputs_max"]) == ("library", 2048)
    argv = ["gguf", str(gemma_path), "--ctx", "4096", "-fa", "on", "-np", "2", "--no-hardware", "--json"]
    assert main([*argv, "--runtime", "llama-cli", "--llama-build", "b9442"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["n_outputs_max"] == 2048
    # 510 more rows of 262,144 f32 logits (ubatch 512 rows against 2), less the layers' own peak (masks and
    # activations, ~18 MiB) that the server's buffer keeps (real llama.cpp: 514.50 against 22.77 MiB)
    extra = cli["memory"]["compute_bytes"] - server["memory"]["compute_bytes"]
    assert extra >= 4 * 262144 * 480
    assert main(["gguf", str(gemma_path), "--ctx", "4096", "--n-outputs-max", "2", "--runtime", "library",
                 "--llama-build", "b11312", "-fa", "on", "-np", "2", "--no-hardware", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["memory"] == server["memory"]


def test_ollama_runs_llama_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    assert main(["ollama", "qwen3-coder", "--gpu", "4090", "--runtime", "llama-cli"]) == EXIT_INPUT
    assert "runs every GGUF model with llama-server" in capsys.readouterr().err
    assert main(["ollama", "qwen3-coder", "--gpu", "4090", "--n-outputs-max", "4"]) == EXIT_INPUT
    assert main(["ollama", "qwen3-coder", "--gpu", "4090", "--runtime", "llama-server", "--json"]) == 0


def test_several_gpus_are_not_one_big_card(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two 24 GB cards: each holds its layers, its compute buffer and its own CUDA context, within its own budget."""
    argv = ["llamacpp", str(gemma_path), "--ctx", "8192", "--json"]
    assert main([*argv, "--gpu", "rtx-3090x2", "-ts", "3,1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    devs = doc["memory"]["devices"]
    assert [d["name"] for d in devs] == ["CUDA0", "CUDA1"]
    assert [d["n_layers"] for d in devs] == [15, 4]  # 18 layers + output, split at 3/4 as llama.cpp does
    assert all(d["overhead_bytes"] == 330 << 20 for d in devs)  # a CUDA context on each card
    assert sum(d["total_bytes"] for d in devs) == doc["memory"]["device_bytes"]
    assert [d["budget_bytes"] for d in devs] == doc["budget"]["device_budgets_bytes"]
    assert "-ts 3,1" in doc["llama_server"]["command"]
    assert doc["llama_server"]["env"]["LLAMA_ARG_TENSOR_SPLIT"] == "3,1"
    # by free memory when -ts is 1,1: two equal cards split evenly
    assert main([*argv, "--gpu", "rtx-3090,rtx-3090", "-ts", "1,1"]) == 0
    even = json.loads(capsys.readouterr().out)["memory"]["devices"]
    assert [d["n_layers"] for d in even] == [10, 9]
    # no -ts, and it fits one card: on that card alone (-dev CUDA0), the other left free
    assert main([*argv, "--gpu", "rtx-3090,rtx-3090"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc["memory"]["devices"]] == ["CUDA0"]
    assert doc["llama_server"]["env"]["LLAMA_ARG_DEVICE"] == "CUDA0" and "-dev CUDA0" in doc["llama_server"]["command"]
    # one card of 8 GiB and one of 2 GiB: the model fits the 8 GiB one alone, and stays there
    assert main(["gguf", str(gemma_path), "--ctx", "4096", "--vram", "8GiB,2GiB", "--json"]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)["memory"]["devices"]] == ["CUDA0"]
    assert main([*argv, "--gpu", "rtx-3090x2", "-ts", "1,1,1"]) == EXIT_INPUT  # three shares, two cards


def test_apple_plans_are_metal(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unified memory is planned as Metal: no CUDA row padding, Metal's overhead (512 MiB, Ollama's
    MinimumMemory on Metal), the layers offloaded (-ngl), the Metal speed factors."""
    argv = ["llamacpp", str(gemma_path), "--ctx", "8192", "--json"]
    assert main([*argv, "--gpu", "m4-max-64gb"]) == 0
    mac = json.loads(capsys.readouterr().out)
    assert main([*argv, "--gpu", "rtx-4090"]) == 0
    nv = json.loads(capsys.readouterr().out)
    assert mac["config"]["device"] == "metal" and mac["budget"]["device"] == "metal"
    (dev,) = mac["memory"]["devices"]
    assert dev["name"] == "Metal" and dev["overhead_bytes"] == 512 << 20
    assert nv["memory"]["devices"][0]["name"] == "CUDA0" and nv["memory"]["devices"][0]["overhead_bytes"] == 330 << 20
    # the same weights, but CUDA pads quantized rows to 512 values and Metal does not
    assert dev["weights_bytes"] < nv["memory"]["devices"][0]["weights_bytes"]
    assert dev["kv_bytes"] == nv["memory"]["devices"][0]["kv_bytes"]  # f16 rows of 256: no padding either way
    assert "-ngl 999" in mac["llama_server"]["command"]


def test_ollama_places_a_model_on_one_gpu_when_it_fits_there(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server/sched.go: one GPU when the model takes at most 80 % of its free memory, else all of them;
    OLLAMA_SCHED_SPREAD spreads it anyway."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    monkeypatch.delenv("OLLAMA_SCHED_SPREAD", raising=False)

    def plan(name: str) -> dict[str, Any]:
        assert main(["ollama", name, "--gpu", "rtx-3090x2", "--json"]) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    small = plan("llama3.1:8b")
    assert len(small["memory"]["devices"]) == 1 and any("on one GPU" in n for n in small["notes"])
    assert small["memory"]["device_bytes"] <= 0.8 * small["budget"]["free_bytes"]
    big = plan("llama3.1:70b")
    assert len(big["memory"]["devices"]) == 2 and any("spreads it over the 2 GPUs" in n for n in big["notes"])
    monkeypatch.setenv("OLLAMA_SCHED_SPREAD", "1")
    spread = plan("llama3.1:8b")
    assert len(spread["memory"]["devices"]) == 2 and any("OLLAMA_SCHED_SPREAD is set" in n for n in spread["notes"])
