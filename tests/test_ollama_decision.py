"""Ollama <= 0.12's own layer decision (llm/memory.go, replayed by kvadvise.backends.ollama.estimate_legacy)
beside llama.cpp's allocation, in `kvadvise ollama`: where the two differ the advice sets the model's
num_gpu (Modelfile PARAMETER) to the layers that fit; llama-server's releases (--fit) get no replayed
decision (0.12.11 - 0.24's createLayout: tests/test_ollama_layout.py). A qwen2.5-coder:7b-shaped model (f16 weights) in a real on-disk store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama.estimate_legacy import LegacyGpu, estimate_gpu_layers, legacy_model
from kvadvise.cli import main


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc = main(["ollama", "qwen2.5-coder:7b", "--ctx", "8192", "--json", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)["ollama"]
    return doc


def test_where_ollamas_estimate_loads_more_layers_than_fit_num_gpu_holds_it_to_the_plan(
    coder_store: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = _plan(capsys, "--ollama-version", "0.12.10", "--vram", "6GiB")
    d = doc["decision"]
    # Ollama 0.12.10's estimate: 9 of 29 layers in 6 GiB; llama.cpp's allocation (the library at 7049736b2,
    # whole-batch logits, f16 cache) fits 7 (-ngl 7: the output layer and 6 blocks)
    assert (d["layers_offload"], d["layers_model"], d["planned_layers"], d["num_gpu"]) == (9, 29, 7, 7)
    assert "layers.offload=9" in d["log_line"] and 'memory.required.kv="448.0 MiB"' in d["log_line"]
    assert doc["modelfile_parameters"] == {"num_ctx": 8192, "num_gpu": 7}
    assert doc["release"]["claims_layers"] is True
    # the same figure straight from the port, for the GPU the plan had
    est = estimate_gpu_layers(
        legacy_model(read_header(coder_store)), [LegacyGpu(free_bytes=6 << 30, total_bytes=6 << 30)],
        num_ctx=8192, num_parallel=0, kv_cache_type="", flash_attention=False, version="0.12.10",
    )  # fmt: skip
    assert est.layers_offload == d["layers_offload"]
    mf = tmp_path / "Modelfile"
    assert main(["ollama", "qwen2.5-coder:7b", "--ctx", "8192", "--ollama-version", "0.12.10", "--vram", "6GiB",
                 "--write-modelfile", str(mf)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "PARAMETER num_gpu 7" in mf.read_text().splitlines()
    assert "only 7 fit as llama.cpp allocates them: PARAMETER num_gpu 7" in " ".join(text.split())
    assert "which kvadvise does not model" not in text


def test_where_both_load_every_layer_nothing_is_set(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan(capsys, "--ollama-version", "0.12.10", "--vram", "24GiB")
    assert (doc["decision"]["layers_offload"], doc["decision"]["num_gpu"]) == (29, None)
    assert doc["modelfile_parameters"] == {"num_ctx": 8192}


def test_llama_server_releases_get_no_replayed_decision(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0.30 and later: llama-server places the layers itself (--fit), which the plan models; 0.12.11 - 0.24
    (llm/server.go createLayout) are tests/test_ollama_layout.py's."""
    doc = _plan(capsys, "--ollama-version", "0.32.13", "--vram", "6GiB")
    assert doc["decision"] is None and "num_gpu" not in doc["modelfile_parameters"]
    assert doc["release"]["claims_layers"] is True


def test_the_library_gpt_oss_under_0_11_0_as_issue_37_saw_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt-oss:20b (the built-in profile: Ollama's own conversion, architecture gptoss, the Go engine) on a
    16 GB card with 15.6 GiB free under Ollama 0.11.0: 23 of 25 layers, as the issue reports of an RTX 4060 Ti
    (the layer sizes are the profile's, an even spread of the library's 14 GB). The Go engine's allocation is
    not modelled, so no num_gpu is set. 0.11.5 to 0.11.10 decide by llm/memory.go too, unless OLLAMA_NEW_ESTIMATES=1
    (NewLlamaServer: "newEstimates := textProcessor != nil && envconfig.NewMemoryEstimates()"): 0.11.5's estimate
    (MXFP4 as llama.cpp's type 39, the graph per slot) puts all 25 on the card; from 0.11.11 the Go engine's layout
    is a trial allocation, replayed (tests/test_ollama_engine_layout.py, tests/test_ollama_engine_layout_0_11.py)."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    rc = main(["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", "15.6GiB", "--ollama-version", "0.11.0", "--json"])
    out = json.loads(capsys.readouterr().out)["ollama"]
    assert rc == 0 and out["release"]["runner"] == "ollamarunner"
    d = out["decision"]
    assert (d["layers_offload"], d["layers_model"], d["num_gpu"], d["allocation_modelled"]) == (23, 25, None, False)
    assert "num_gpu" not in out["modelfile_parameters"]
    for version in ("0.11.5", "0.11.10"):
        rc = main(
            ["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", "15.6GiB", "--ollama-version", version, "--json"]
        )
        d = json.loads(capsys.readouterr().out)["ollama"]["decision"]
        assert rc == 0 and d["layers_by"] == "llm/memory.go" and (d["layers_offload"], d["layers_model"]) == (25, 25)
    for version in ("0.11.11", "0.12.6", "0.12.10"):
        rc = main(
            ["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", "15.6GiB", "--ollama-version", version, "--json"]
        )
        d = json.loads(capsys.readouterr().out)["ollama"]["decision"]
        assert rc == 0 and d["layers_by"].endswith("trial allocations") and d["layers_offload"] == 25, version
