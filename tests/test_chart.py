"""The memory-against-context chart: in the terminal (--chart) and as an image (--chart-file .svg/.png)."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvadvise.cli import main

GiB = 1 << 30


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _recommended(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> int:
    """The context per sequence the plan recommends for this card (the policy decides it, not the chart)."""
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--vram", "640MiB", "--margin", "0", "--json")
    assert rc == 0
    return int(json.loads(out)["config"]["n_ctx_seq"])


def test_terminal_chart_reads_clearly(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = _recommended(capsys, gemma_path)
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--vram", "640MiB", "--margin", "0", "--chart")
    assert rc == 0
    chart = out[out.index("memory on the device (GiB)") :].split("\n(--verbose")[0].splitlines()  # the tail after it
    budget_lines = [line for line in chart if line.endswith(" budget")]
    assert len(budget_lines) == 1 and budget_lines[0].lstrip().startswith("0.62 =")  # one budget line, labelled
    assert sum(line.count("*") for line in chart[:-1]) == 1  # the recommended point, once
    assert "context per sequence (tokens)" in out and "32k" in out
    legend = chart[-1]
    for part in (
        "f = f16",
        "8 = q8_0",
        "m = q8_0 K / q4_0 V",
        "4 = q4_0",
        "= budget",
        f"* = recommended ({n:,} tokens",
    ):
        assert part in legend
    plotted = "".join(chart[1:-4])
    assert all(mark in plotted for mark in "f8m4")  # every curve visible, not hidden under another


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_chart_file(suffix: str, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    n = _recommended(capsys, gemma_path)
    path = tmp_path / f"chart{suffix}"
    rc, out, err = run(
        capsys, "gguf", str(gemma_path), "--vram", "640MiB", "--margin", "0", "--chart-file", str(path), "--json"
    )
    assert rc == 0 and f"wrote {path}" in err and out.startswith("{")
    data = path.read_bytes()
    if suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (1000, 600)
        return
    root = ET.fromstring(data)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg" and root.get("width") == "720pt" and root.get("height") == "432pt"
    text = data.decode()
    for label in ("f16", "q8_0", "q4_0", "budget 0.62 GiB", f"recommended: {n:,} tokens", "context per sequence"):
        assert label in text  # matplotlib keeps text as comments/ids in the SVG
    assert len(root.findall(f".//{ns}path")) > 10


def test_chart_file_errors(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "1GiB", "--chart-file", str(tmp_path / "c.jpg"))
    assert rc == 2 and ".svg or .png" in err
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "1GiB", "--chart-file", str(tmp_path / "no/c.svg"))
    assert rc == 2 and "no such directory" in err


def test_chart_file_without_matplotlib(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    rc, out, err = run(capsys, "gguf", str(gemma_path), "--vram", "1GiB", "--chart-file", str(tmp_path / "c.svg"))
    # said before any plan is printed, with an install command that works from a checkout (not on PyPI)
    assert rc == 2 and out == "" and "python3 -m pip install matplotlib" in err and "kvadvise[chart]" not in err
