"""Round 16a of the red team (a reviewer in its own worktree): README.md and docs/ read as a newcomer reads them,
against this session's changes (the 4,096-token floor and the partial offload at the target, --min-ctx reached by
partial offload, a CPU plan's -ngl 0, the whole-card --margin refused, Apple chips' RAM, llama_server_command).
Each test reproduces one defect of the current code, where it fails; its docstring gives what the newcomer reads,
what they run, what happens, and what they expected."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)
from ollama_fake import ps_entry, running_fake, show_payload

QWEN3_CODER_CONFIG = Path(__file__).resolve().parent / "data" / "hf" / "qwen3-coder-30b.json"

# --- 1. --min-ctx above the default target: exit 3, though the partial offload runs it -----------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["ollama", "qwen3-coder"],
        ["hf", str(QWEN3_CODER_CONFIG), "--quant", "Q4_K_M"],
    ],
    ids=["ollama", "hf"],
)
def test_min_ctx_above_the_default_target_is_reached_by_the_partial_offload(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """docs/policy.md:79-82: "`--min-ctx N` is reached by the plan that runs: where the GPU alone holds less, the
    partial offload (as in rule 8); it fails with exit 3 and a hint ... when less than N runs, or with `--gpu-only`
    when less than N fits the GPU". A newcomer with a 24 GB card and 64 GiB of RAM who needs 128k runs

        kvadvise ollama qwen3-coder --gpu rtx-4090 --ram 64GiB --min-ctx 131072

    and gets exit 3: "kvadvise: error: nothing reaches --min-ctx 131,072: the best is q8_0/q8_0 at 80,896 tokens",
    hint "would fit with 2.48 GiB more memory ... or a smaller quantization" (the same with `kvadvise hf
    qwen3-coder-30b.json --quant Q4_K_M`). Yet 131,072 tokens do run: the same command with `--target-ctx 131072`
    added prints "131,072 tokens, K/V q8_0, part on the CPU", exit 0. --min-ctx is checked against the default
    target (64k), and only the 100 %-GPU context is compared with it; the hint does not even name the partial
    offload (a `--target-ctx` below `--min-ctx` is refused, exit 2, but the default one silently caps it).
    Expected: exit 0 and the partial offload at 131,072 tokens (the target raised to --min-ctx), as the docs say."""
    rc, out, err = run(capsys, *command, "--gpu", "rtx-4090", "--ram", "64GiB", "--min-ctx", "131072", "--json")
    assert rc == 0, (rc, err)
    doc = json.loads(out)
    assert doc["runnable"] is True and doc["offload"] is not None, doc["offload"]
    assert doc["offload"]["n_ctx"] >= 131072, doc["offload"]["n_ctx"]


# --- 2. kvadvise.llama_server_command gives a command for a plan that does not run ---------------------------------


def test_llama_server_command_of_a_plan_that_does_not_run_is_none(gemma_path: Path) -> None:
    """docs/python-api.md:117 (the functions' table): "`llama_server_command(model_path, plan)` | the llama-server
    command that runs a plan (its partial offload and `--n-cpu-moe` too, as `--json`'s `run_command`)", and
    docs/json.md: `run_command` is "null when nothing runs". A tool author plans Gemma 3 270M for a 500 MiB GPU:

        plan = kvadvise.plan(path, kvadvise.PlanRequest(vram_bytes=(500 << 20,), margin_bytes=0))
        kvadvise.to_json(plan)["llama_server"]["run_command"]   # None: the CLI prints "no command: this plan
                                                                 # does not fit", exit 3
        kvadvise.llama_server_command(path, plan)
        # 'llama-server -m ... -c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 999'

    The function hands back a command that puts the whole model on a GPU it does not fit (llama-server then fails
    to allocate, or --fit moves layers the plan never counted); with `gpu_only=True` it is `-c 256 ... -ngl 999`.
    Expected: what `run_command` says, None (or an error saying nothing runs), never a command for a plan that does
    not run."""
    import kvadvise
    from kvadvise.errors import KvadviseError

    for request in (
        kvadvise.PlanRequest(vram_bytes=(500 << 20,), margin_bytes=0),
        kvadvise.PlanRequest(vram_bytes=(500 << 20,), margin_bytes=0, gpu_only=True),
    ):
        plan = kvadvise.plan(str(gemma_path), request)
        assert kvadvise.to_json(plan)["llama_server"]["run_command"] is None
        try:
            got = kvadvise.llama_server_command(str(gemma_path), plan)
        except KvadviseError:
            got = None
        assert got is None, got


# --- 3. several models: --margin accepted and silently ignored (a whole-card margin too) --------------------------


def test_several_models_do_not_ignore_margin(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/commands.md:70 (common flags): "`--margin SIZE` ... the memory budget"; docs/exit-codes.md: exit 2 for
    "a bad flag value"; `kvadvise ollama qwen3:8b --gpu rtx-4090 --margin 30GiB` is refused: "--margin 30,720 MiB is
    the whole card (24,564 MiB): nothing is left for the model", exit 2 (and so are compare, hf, llamacpp). With two
    models

        kvadvise ollama qwen3:8b gemma3:4b --gpu rtx-4090 --margin 30GiB

    answers "All stay loaded together at the server's settings." (9.6 + 4.5 GiB on a card it was just told keeps
    30 GiB free), exit 0; `--margin 20GiB` prints exactly the default margin's answer: the flag is accepted and
    dropped (backends/ollama/together.py: "the fit margin is the scheduler's own here"), and --write-env writes no
    LLAMA_ARG_FIT_TARGET, which a single-model plan writes for "another margin" (docs/commands.md:389).
    docs/commands.md:472 lists what several models refuse (`--ollama-version`, `--runner`, `--mlx-quant`: exit 2);
    --margin is not among them. Expected: the whole-card margin refused (exit 2) as everywhere else, and a smaller
    one either planned (the answer changes) or refused, never silently dropped."""
    models = ("ollama", "qwen3:8b", "gemma3:4b", "--gpu", "rtx-4090")
    rc, _out, err = run(capsys, *models, "--margin", "30GiB")
    one_line_input_error(rc, err)
    assert "whole card" in err, err
    rc_default, out_default, _ = run(capsys, *models)
    rc20, out20, _err20 = run(capsys, *models, "--margin", "20GiB")
    assert rc20 == 2 or (rc20, out20) != (rc_default, out_default), out20


# --- 4. a Mac's Ollama answer: a 126-column runner line, 34 lines ---------------------------------------------------


# (fixed: the runner row, the RAM kept for macOS and the GPU's share are one line each: 30 lines)
def test_ollama_on_a_mac_default_answer_is_short_and_narrow(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/README.md:253: "Default answers in ~100 columns (prose wrapped where the sentence breaks ...)"
    (test_expert_advice.py::test_default_answers_are_short holds <= 30 lines of <= 100 columns, for NVIDIA cards
    only); README: "By default a plan prints about 25 lines". The README's own model on a popular Mac:

        kvadvise ollama qwen3-coder --gpu m4-pro-24gb

    prints 34 lines, one of 126 columns that is never wrapped:

        "  runner: llama.cpp (llama-server): Ollama (version unknown: planned for the newest): its MLX runner has
        no model for qwen3moe"

    (every Ollama plan on an Apple chip has this row; `ollama gemma3:12b --gpu m4-pro-24gb` has four rows of 116 to
    209 columns, 45 lines). Expected: every line within 100 columns and about 25 lines (<= 30, as the NVIDIA
    answers are held to)."""
    rc, out, _err = run(capsys, "ollama", "qwen3-coder", "--gpu", "m4-pro-24gb")
    assert rc == 0
    lines = out.splitlines()
    assert all(len(x) <= 100 for x in lines if x.lstrip().startswith("runner:")), [x for x in lines if len(x) > 100]
    assert len(lines) <= 30, out


# --- 5. a CPU plan prints `kvadvise verify ollama` as its last step; it always fails (exit 3, "spilled") ------------


def test_the_verify_step_of_a_cpu_plan_passes_when_the_model_runs_as_planned(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """README (Quick start, Prove it): "`verify ollama` reads what the server really runs ... 100% on the GPU, with
    the context asked for"; docs/json.md: `verify_command` is "null when nothing runs, and for a partial offload:
    `verify ollama` checks a 100 % GPU plan". A newcomer without a GPU (or with `--device cpu`) runs

        kvadvise ollama gemma3-270m --device cpu --ram 16GiB

    "... on the CPU: 32,768 tokens, K/V f16: fits in RAM", whose Next steps end with
    `kvadvise verify ollama gemma3-270m-32k --load --kv-cache-type f16 --num-ctx 32768`. They follow the steps; the
    server runs the model exactly as planned: 100 % on the CPU (there is no GPU), context 32,768. The printed
    verify step then says "- spilled: 900,000,000 of 900,000,000 B are on the CPU (100% CPU) / does not fit as
    asked", exit 3 (docs/exit-codes.md: "a verification failed ... the model spilled to the CPU"). A step the plan
    prints that can only fail. Expected: a CPU plan prints no verify step that checks for the GPU (verify_command
    null, as for a partial offload), or its verify step passes when the model runs on the CPU as planned."""
    from kvadvise.model.gguf import read_file

    header = read_file(str(gemma_path))
    with running_fake() as fake:
        fake.shows["gemma3-270m:latest"] = show_payload(header)
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        rc, out, err = run(capsys, "ollama", "gemma3-270m", "--device", "cpu", "--ram", "16GiB", "--json")
        assert rc == 0, err
        doc = json.loads(out)
        step = doc["ollama"]["verify_command"]
        if step is None:
            return  # no GPU check offered for a CPU plan: fine
        args = shlex.split(step)
        assert args[:3] == ["kvadvise", "verify", "ollama"], step
        name = args[3]
        num_ctx = int(args[args.index("--num-ctx") + 1])
        # the user ran the Next steps: `ollama create NAME`, and the server runs it as planned, on the CPU
        fake.shows[f"{name}:latest"] = show_payload(header, parameters=f"num_ctx {num_ctx}")
        fake.loads[f"{name}:latest"] = ps_entry(f"{name}:latest", size=900_000_000, size_vram=0, context_length=num_ctx)
        rc, out, err = run(capsys, *args[1:])
    assert rc == 0, (step, out, err)


# --- 6. a partial offload shrunk below the target: the default answer never says so -------------------------------


def test_a_partial_offload_below_the_target_says_why(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/policy.md:58-65 (rule 8): when 4,096 tokens do not fit 100 % on the GPU, "the fastest partial offload
    that runs (...): its context (the target), cache type, -ngl ..."; and "A plan that fits neither way (the
    partial offload does not fit the RAM either, or even every layer on the CPU leaves too much on the GPU) exits 3
    and writes nothing". With four slots:

        kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --vram 600MiB --margin 0 --ram 32GiB -np 4

    the target is 32,768 tokens per slot (32k below 16 GB), and the answer is "21,504 tokens x 4 slots, K/V q8_0,
    part on the CPU", exit 0: the context was searched down (planner/offload.py `shrink`), which the docs do not
    describe. Its only "why" is "does not fit: 0.68 GiB at 4,096 tokens, the GPU has 0.59 GiB"; nothing in the
    default answer names the 32,768 target or why it was cut (only --verbose says "32,768 tokens per sequence do
    not fit the GPU with any layers on the CPU; 21,504 do"). The same on a Mac: `kvadvise ollama qwen3-coder --gpu
    m4-pro-24gb` plans 19,456 of a 65,536 target, cut for the RAM, unsaid. A 100 %-GPU answer short of its target
    always says "f16 reaches 11,008 of 32,768". Expected: the default answer says the partial offload reaches less
    than the target and why (and policy.md says the context may be searched down)."""
    rc, out, _err = run(capsys, "llamacpp", str(gemma_path), "--vram", "600MiB", "--margin", "0", "--ram", "32GiB",
                        "-np", "4")  # fmt: skip
    assert rc == 0
    head = out.splitlines()[0]
    assert "part on the CPU" in head and "32,768 tokens" not in head, head  # the shrunk plan, as reproduced
    said = [x for x in out.splitlines()[1:] if not x.lstrip().startswith("model:")]  # "trained on 32,768 tokens"
    assert any("32,768" in x for x in said), out


# --- 7. an Apple chip with --ram past its unified memory: a 29.58 GiB plan "fits" a 24 GB Mac ----------------------


def test_a_mac_is_not_planned_with_more_ram_than_it_has(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/policy.md:226-231 (System RAM): the RAM a plan is checked against is "the RAM free now ... or given
    (`--ram SIZE`; a Mac of the card list: its unified memory, the GPU's share included, less what the plan leaves
    macOS, about 4 GB at idle ... `ram.kept_bytes`)"; policy.md: "Contradictory flags are refused (exit 2)". A Mac
    user who copies the README's `--ram 64GiB` runs

        kvadvise hf tests/data/hf/qwen3-coder-30b.json --quant Q4_K_M --gpu m4-pro-24gb --ram 64GiB

    and gets a 64k partial offload with "system RAM: 29.58 GiB of 64.00 GiB (given with --ram): fits", exit 0, on
    a machine that has 24 GB in all (`ram.kept_bytes` 0: nothing left to macOS either). Without --ram the same
    command plans 24,576 tokens within 24 GiB less 4.5 GiB. Expected: a --ram larger than the chip's unified memory
    refused (exit 2) or capped at it (the plan's RAM never above 24 GiB, less what macOS keeps)."""
    rc, out, err = run(capsys, "hf", str(QWEN3_CODER_CONFIG), "--quant", "Q4_K_M", "--gpu", "m4-pro-24gb",
                       "--ram", "64GiB", "--json")  # fmt: skip
    if rc == 2:
        one_line_input_error(rc, err)
        return
    doc = json.loads(out)
    ram = doc["ram"] or doc["offload"]["ram"]  # the partial offload's, where the config does not fit the GPU
    assert ram["ram_bytes"] - ram["kept_bytes"] <= 24 * (1 << 30) - 4 * (1 << 30), ram


# --- 8. a CPU plan says "of 31.00 GiB (given with --ram)" for --ram 32GiB --------------------------------------------


def test_a_cpu_plan_quotes_the_ram_it_was_given(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README: "`--ram SIZE` below stands in for the RAM free on your machine"; its examples print "system RAM: 8.44
    GiB of 32.00 GiB (given with --ram)" for `--ram 32GiB`. On the CPU (no GPU, or `--device cpu`):

        kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --device cpu --ram 32GiB

    prints "memory: 611 MiB of 31.00 GiB" and "system RAM: 8.83 GiB of 31.00 GiB (given with --ram)"; `kvadvise
    ollama qwen3:8b --device cpu --ram 16GiB` prints "memory: 9.50 GiB of 14.85 GiB" and "system RAM: 15.00 GiB of
    15.00 GiB (given with --ram)". The user gave 32 (16) GiB: the --margin meant for "each GPU" (`--help`: "Memory
    kept free per GPU") came off, and the line attributes the result to the user. Expected: the RAM line quotes
    what --ram gave ("of 32.00 GiB (given with --ram)"), as it does with a GPU, or says what was taken off."""
    rc, out, _err = run(capsys, "llamacpp", str(gemma_path), "--device", "cpu", "--ram", "32GiB")
    assert rc == 0
    line = next(x for x in out.splitlines() if "system RAM" in x)
    m = re.search(r"of ([\d.]+) GiB \(given with --ram\)", line)
    assert m is None or m.group(1) == "32.00", line
