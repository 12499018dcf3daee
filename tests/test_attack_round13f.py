"""Round 13f of the red team (a reviewer in its own worktree): "which card should I buy" (`kvadvise compare`,
`kvadvise gpus MODEL`, `--gpu NAMExN`) read as a demanding buyer reads it. Each test reproduces one defect of the
code at 24d1c3b, where it fails; its docstring gives the command, the figures that contradict each other and why a
user would call the answer wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)

GIB = 1 << 30
HF = Path(__file__).resolve().parent / "data" / "hf"


def test_compare_does_not_drop_a_repeated_vram(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise compare gemma-3-270m-q4_k_m.gguf --vram 24GiB --vram 16GiB`: exit 0 and one row, card
    "16 GiB" (headroom +14.3 GiB): the 24 GiB budget is silently dropped (click keeps the last value). Every plan
    command takes a repeated `--vram` as a list of cards (docs/commands.md: `--vram 24GiB --vram 16GiB`, "each
    card its own margin ... and budget"), and compare's own `--gpu` takes a repeated value as a list too
    (`--gpu a --gpu b`: two rows). A user who writes both sizes asks about both; getting the answer for one of
    them, with no word that the other was ignored, is wrong. Expected: the two budgets answered (two rows, or one
    two-GPU row), or the repeat refused with exit 2 as compare's `--vram 24GiB,16GiB` is."""
    rc, out, err = run(capsys, "compare", str(gemma_path), "--vram", "24GiB", "--vram", "16GiB", "--json")
    if rc == 2:
        one_line_input_error(rc, err)
        return
    assert rc == 0, err
    doc = json.loads(out)
    budgets = {c["card"] for c in doc["cards"]}
    n_gpu = sum(c["n_gpu"] for c in doc["cards"])
    assert n_gpu == 2 or len(budgets) == 2, f"--vram 24GiB --vram 16GiB planned as {doc['cards']}"


def test_two_apple_chips_are_not_one_machine_with_more_gpu_memory_than_ram(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise hf tests/data/hf/llama3.1-70b.json --quant Q4_K_M --gpu m4-max-64gbx2 --target-ctx 128k --json`
    plans two Metal devices in one llama.cpp process ("2 x Apple M4 Max 64GB": Metal0 41.78 GiB of 47.00 GiB,
    Metal1 40.47 GiB of 47.00 GiB, `-ts 48,48`) and says "fits the GPU": 88.3 GB on the GPU (budget 100.9 GB,
    94 GiB) while the same plan's system RAM is "64.00 GiB (Apple M4 Max 64GB's unified memory)". The GPU of a
    Mac is carved out of its unified memory: a GPU budget larger than the machine's whole RAM cannot exist. A Mac
    has one GPU, and two Macs are two machines (llama.cpp reaches a second one only over RPC), so `compare` ranks
    "m4-max-64gbx2" beside real cards (llama3.1:70b --use code: yes, f16, +41.4 GiB headroom) and
    `--gpu m4-max-64gb,m2-16gb` is planned as one process with `-ts 48,10.67`. Apple beside NVIDIA is refused
    ("one process runs one kind of machine"); expected: several Apple chips refused the same way (exit 2), or at
    least a GPU budget no larger than the unified memory the plan's own RAM check uses."""
    rc, out, err = run(
        capsys,
        "hf",
        str(HF / "llama3.1-70b.json"),
        "--quant",
        "Q4_K_M",
        "--gpu",
        "m4-max-64gbx2",
        "--target-ctx",
        "128k",
        "--json",
    )
    if rc == 2:
        one_line_input_error(rc, err)
        return
    doc = json.loads(out)
    ram_bytes = doc["ram"]["ram_bytes"]
    assert doc["budget"]["budget_bytes"] <= ram_bytes, (
        f"GPU budget {doc['budget']['budget_bytes'] / GIB:.2f} GiB on a machine of {ram_bytes / GIB:.2f} GiB "
        f"(fits the GPU: {doc['fits']})"
    )


def test_compare_does_not_print_zero_tokens_per_second_for_a_plan_that_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise compare llama3.1:70b --vram 200GiB --bandwidth 10`: the row says FITS yes, 64k, and
    T/S@4K "~0", T/S@CTX "~0"; the JSON of the same command has decode_4k_tokens_per_s 0.20 and
    decode_tokens_per_s 0.13, and `kvadvise ollama llama3.1:70b --vram 200GiB --bandwidth 10` prints
    "≈ 0.2 t/s at 4k". speed.tps_label exists for this ("never "0" for a plan that runs") and compare's own
    PART ON CPU column and `kvadvise gpus MODEL` use it, but the two T/S columns print f"~{tps:,.0f}". "0 tokens
    a second" reads as "does not run", beside FITS yes. Expected: ~0.2 and ~0.1 (tps_label)."""
    rc, out, err = run(capsys, "compare", "llama3.1:70b", "--vram", "200GiB", "--bandwidth", "10", "--json")
    assert rc == 0, err
    e = json.loads(out)["entries"][0]
    assert e["fits"] and 0 < e["decode_4k_tokens_per_s"] < 0.5, e
    rc, out, err = run(capsys, "compare", "llama3.1:70b", "--vram", "200GiB", "--bandwidth", "10")
    assert rc == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("llama3.1:70b"))
    assert "~0 " not in row + " ", row


def test_compare_does_not_show_spare_headroom_for_a_pair_that_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise compare gemma3:12b --gpu rtx-4060x2 -np 4`: FITS "NO", CONTEXT "-", and HEADROOM "+0.8 GiB"
    (JSON: fits false, headroom_bytes +809,823,168: device_bytes 13,979,562,368 against budget_bytes
    14,789,385,536, both summed over the two cards). The plan it summarises says why it does not fit: "CUDA1 needs
    7.00 GiB of its 6.89 GiB" (`kvadvise ollama gemma3:12b --gpu rtx-4060x2 -np 4`). The column is "budget − what
    it takes" (docs/commands.md); a positive figure beside NO tells a buyer there is memory to spare on a pair
    that does not fit: on two cards the total hides the card that is short. Expected: a negative headroom (the
    short card's) whenever FITS is NO."""
    # (since the fill is redone on the pipelined plan where llama.cpp's fill leaves a card short, fitsplit.fit_split,
    # gemma3:12b fits this pair at -np 4 with -ts 29,20: every pair of the built-in grid that does not fit is checked)
    rc, out, err = run(capsys, "compare", "--gpu", "rtx-4060x2", "-np", "4", "--json")
    assert rc == 0, err
    short = [e for e in json.loads(out)["entries"] if not e["fits"]]
    assert len(short) > 5, short
    for e in short:
        assert e["headroom_bytes"] < 0, (
            f"{e['model']}: fits false with headroom {e['headroom_bytes'] / GIB:+.2f} GiB "
            f"({e['device_bytes']:,} of {e['budget_bytes']:,})"
        )
