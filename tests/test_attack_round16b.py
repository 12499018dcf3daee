"""Round 16b of the red team (a reviewer in its own worktree): the Apple path end to end after 73128d0 (a Mac of the
card list times its CPU share at the chip's unified-memory bandwidth; it keeps 4 GiB for macOS and 512 MiB for the
process out of its RAM; --users gives no concurrent decode where N sessions do not fit). Each test reproduces one
defect of the code at 8a3d26f, where it fails; its docstring gives the command, what the user sees, what is expected
and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)

GIB = 1 << 30
MIB = 1 << 20
HF = Path(__file__).resolve().parent / "data" / "hf"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, (rc, err)
    return json.loads(out)


def _last(estimate: dict) -> dict:
    """The deepest point of a decode estimate (the plan's own context)."""
    return estimate["at_context"][-1]


@pytest.mark.parametrize(
    ("model", "ctx", "cache", "small", "big"),
    [
        # 6 of 41 layers on the M4 Pro 24GB's CPU: 2.54 t/s at 64k; all 41 on the M4 Pro 64GB's GPU: 2.31 t/s
        ("mistral-nemo-12b", "65536", "f16", "m4-pro-24gb", "m4-pro-64gb"),
        # 6 of 41 layers on the M4 Max 48GB's CPU: 2.43 t/s at 16k; the M4 Max 128GB, all on the GPU: 2.23 t/s
        ("command-r-35b", "16384", "f16", "m4-max-48gb", "m4-max-128gb"),
        # 12 of 62 layers on the M4 Pro 24GB's CPU, K/V q8_0: 6.97 t/s at 32k; the M4 Pro 64GB, all on the GPU: 6.83
        ("gemma3-27b", "32768", "q8_0", "m4-pro-24gb", "m4-pro-64gb"),
    ],
    ids=["nemo12b-m4pro24-vs-64", "commandr35b-m4max48-vs-128", "gemma3-27b-m4pro24-vs-64"],
)
def test_a_macs_cpu_layers_do_not_decode_faster_than_its_own_gpu(
    model: str, ctx: str, cache: str, small: str, big: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf mistral-nemo-12b.json --quant Q4_K_M -c 65536 -ctk f16 -ctv f16 -fa on --gpu m4-pro-24gb`: "part
    on the CPU: 6 layers ... decode ≈ 2.5 t/s at 64k; GPU 273, RAM 273 GB/s". The same command with `--gpu
    m4-pro-64gb` (the same M4 Pro chip, 273 GB/s, the same config) fits every layer on the GPU: ≈ 2.3 t/s at 64k. So
    kvadvise tells a buyer that the 24 GB Mac, which has to run part of the model on its CPU cores, decodes ~10 %
    FASTER than the 64 GB one that runs it all on Metal (command-r 35B on an M4 Max 48GB vs 128GB, gemma3 27B with
    a q8_0 cache: the same). `kvadvise compare` sorts by that figure.

    On one Apple chip the CPU cores and the GPU read the same LPDDR memory: the CPU cluster reaches a fraction of
    the chip's published bandwidth (the number profiles/gpus.json gives, which is the GPU's), never more than the
    GPU does, and llama.cpp's CPU backend (ggml-cpu) runs the offloaded layers' attention with far less compute
    than Metal's flash-attention kernels; a split graph also synchronises the two backends every token. Moving
    layers from the GPU to the CPU of the same chip can only make a token slower. 73128d0 feeds the chip's
    unified-memory (GPU) bandwidth to the CPU share, which speed.py then reads at the CPU's factors, fitted against
    a *measured copy* bandwidth (EFFICIENCY["cpu"]: 0.60, KV_EFFICIENCY["cpu"]: 0.30, the latter "a guess") rather
    than Metal's fitted 0.80 / 0.10: the CPU's K/V reads come out 3x faster per byte than the GPU's. Expected: the
    partial plan on the smaller Mac is no faster than the whole-GPU plan on the larger Mac of the same chip and
    config."""
    args = ("hf", str(HF / f"{model}.json"), "--quant", "Q4_K_M", "-c", ctx, "-ctk", cache, "-ctv", cache, "-fa", "on")
    part = _plan(capsys, *args, "--gpu", small)
    whole = _plan(capsys, *args, "--gpu", big)
    off = part["offload"]
    assert not part["fits"] and off is not None and off["n_cpu_layers"] > 0, (
        "expected a partial plan on the smaller Mac"
    )
    assert whole["fits"], "expected the larger Mac to hold every layer"
    p, w = _last(off["decode_estimate"]), _last(whole["decode_estimate"])
    assert p["n_ctx"] == w["n_ctx"]
    assert p["tokens_per_s"] <= w["tokens_per_s"], (
        f"{small} with {off['n_cpu_layers']} layers on its CPU: {p['tokens_per_s']:.2f} t/s at {p['n_ctx']:,}; "
        f"{big}, the same chip with every layer on its GPU: {w['tokens_per_s']:.2f} t/s"
    )


def test_a_macs_ram_is_not_larger_than_its_unified_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf llama3.1-70b.json --quant Q4_K_M --gpu m4-max-48gb --ram 128GiB --target-ctx 64k`: exit 0,
    "65,536 tokens, K/V q8_0, part on the CPU: 27 layers (-ngl 54); GPU 34.41 GiB, RAM 17.46 GiB", "system RAM:
    60.15 GiB of 128.00 GiB (given with --ram): fits". An Apple M4 Max 48GB has 48 GB of memory in all: its GPU and
    its CPU share it (kvadvise's own note: "unified memory"; its own RAM source without --ram: "Apple M4 Max 48GB's
    unified memory", 48.00 GiB). A plan that keeps 60 GiB resident on a 48 GB Mac does not fit it: macOS swaps it
    to disk and decode collapses. Without --ram the same command plans 12,288 tokens (15 layers on the CPU) within
    the 48 GB. The --ram is taken as if the Mac had another 128 GiB beside its unified memory, as a PC's RAM is
    beside its card. Expected: on a Mac of the card list, --ram no larger than the chip's memory (refused with exit
    2, or capped): the plan's RAM total never above the Mac's 48 GiB."""
    rc, out, err = run(
        capsys, "hf", str(HF / "llama3.1-70b.json"), "--quant", "Q4_K_M", "--gpu", "m4-max-48gb", "--ram", "128GiB",
        "--target-ctx", "64k", "--json",
    )  # fmt: skip
    if rc == 2:
        one_line_input_error(rc, err)
        return
    assert rc == 0, err
    doc = json.loads(out)
    off = doc["offload"]
    ram = off["ram"] if off is not None and not doc["fits"] else doc["ram"]
    assert not (ram["fits"] and ram["total_bytes"] > 48 * GIB), (
        f"{ram['total_bytes'] / GIB:.2f} GiB kept resident 'fits' {ram['ram_bytes'] / GIB:.2f} GiB "
        f"({ram['ram_source']}) on a Mac with 48 GiB of memory in all"
    )


@pytest.mark.parametrize(
    "args",
    [
        # the Mac of 14d's test, its memory given with --ram: 47.93 GiB of 48.00 (39,936 tokens; 12,288 without --ram)
        ("llama3.1-70b", "--gpu", "m4-max-48gb", "--ram", "48GiB"),
        # a PC: 23.94 GiB of the 24.00 GiB given
        ("llama3.1-70b", "--gpu", "rtx-4090", "--ram", "24GiB", "--ram-bandwidth", "60"),
    ],
    ids=["m4-max-48gb-ram48", "rtx-4090-ram24"],
)
def test_a_plan_leaves_the_runtimes_process_its_share_of_the_ram_given(
    args: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf llama3.1-70b.json --quant Q4_K_M --gpu m4-max-48gb --ram 48GiB`: exit 0, "39,936 tokens, K/V q8_0,
    part on the CPU: 22 layers (-ngl 59) ... --cache-ram 0", "system RAM: 47.93 GiB of 48.00 GiB (given with --ram):
    fits": 70 MiB left for llama-server's own process. This is the plan round 14d's
    test_an_apple_plan_leaves_the_mac_room_for_the_process_itself rejected (the same 47.93 GiB of 48.00); 73128d0
    keeps hostram.PROCESS_BYTES (512 MiB, "the llama-server process beside its buffers ... about 450 MB measured",
    ggml-org/llama.cpp#27725) only for a Mac of the card list *without* --ram, "what MemAvailable leaves out
    elsewhere". It does not: MemAvailable is read, and --ram is given, before the runtime starts, so its process is
    not out of either. `--gpu rtx-4090 --ram 24GiB` on a PC: "23.94 GiB of 24.00 GiB (given with --ram): fits", 60 MiB
    left. Saying how much RAM is free (`--ram`, docs/commands.md: "the system RAM the plan may use") does not make
    the server's code, libraries and heap take nothing. Expected: at least PROCESS_BYTES (512 MiB) of the RAM given
    left beside what the plan keeps, with --ram as without it."""
    model, *rest = args
    doc = _plan(capsys, "hf", str(HF / f"{model}.json"), "--quant", "Q4_K_M", *rest)
    off = doc["offload"]
    assert not doc["fits"] and off is not None and off["runnable"], "expected a runnable partial plan"
    ram = off["ram"]
    left = ram["ram_bytes"] - ram["total_bytes"]
    assert left >= 512 * MIB, (
        f"the plan keeps {ram['total_bytes'] / GIB:.2f} GiB of the {ram['ram_bytes'] / GIB:.2f} GiB "
        f"({ram['ram_source']}): {left / MIB:.0f} MiB left for the runtime's process"
    )
