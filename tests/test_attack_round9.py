"""Round 9 of the red team (a reviewer in its own worktree): the llama.cpp side -- the command kvadvise prints for
unusual flags and builds, the recommended context, `compare`, and `verify llamacpp --log`. Each test reproduces one
defect of the code at ddc4e22 and fails there; its docstring gives the command, what happened and what should."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from tinymodels import write_tiny_gguf

# --- 1. verify --log: a long line takes quadratic time ---------------------------------------------------------


def test_a_log_with_one_long_line_is_read_in_linear_time(tmp_path: Path) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 --log server.log` where the log holds one line of 100,000
    characters without a space (a base64 image or a long prompt that llama-server logs at -lv 3 and more, a
    minified JSON body) before the usual load lines: it runs for about a minute (a 40,000-character line: 9 s, a
    50 MB line: more than 11 minutes of CPU, never finished). advisor/runtime/llamalog.py's buffer-line pattern
    (line 34, ``(?P<func>[A-Za-z_]\\w*):\\s+...buffer size``) is searched over every line: at each start position
    ``\\w*`` runs to the end of the word and backtracks, O(n^2) in the line's length (the memory_breakdown pattern
    at line 54 adds more). Expected: the log read in time linear in its size (a few seconds at most), e.g. with
    the pattern anchored or a line that holds no "buffer size" skipped."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    log = tmp_path / "server.log"
    log.write_text(
        "x" * 100_000 + "\n"
        "load_tensors: offloaded 3/3 layers to GPU\n"
        "load_tensors:   CPU_Mapped model buffer size =     0.25 MiB\n"
        "load_tensors:        CUDA0 model buffer size =     1.57 MiB\n"
        "llama_context: n_ctx         = 4096\n"
        "llama_kv_cache:      CUDA0 KV buffer size =     4.00 MiB\n"
        "sched_reserve:      CUDA0 compute buffer size =     6.50 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =     0.02 MiB\n"
    )
    cmd = [sys.executable, "-m", "kvadvise", "verify", "llamacpp", str(model), "--ctx", "4096", "--log", str(log)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=15, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("verify --log with a 100,000-character line did not finish in 15 s")
    assert "Traceback" not in done.stderr and done.returncode != 1, done.stderr


# --- 2. --llama-build before -fa took a value ------------------------------------------------------------------


def test_the_command_for_an_old_build_gives_flash_attention_as_that_build_parses_it(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 8k --llama-build b5000`: exit 0, the plan
    "planned for llama.cpp b5000 (--llama-build): the memory rules of that build", and the command `llama-server -m
    ... -c 8192 -np 1 -fa on -ctk f16 ...` (also `-fa off` with `-fa off`, and `LLAMA_ARG_FLASH_ATTN=on` in
    --write-env). Until llama.cpp#15434 (flash_attn_type, 2025-08-30, about b6325) common/arg.cpp's -fa/--flash-attn
    was a switch without a value (`params.flash_attn = true`), so b5000 reads `on` as an argument of its own and
    stops with "error: invalid argument: on"; its env handler takes only "1"/"true" for a switch, so
    LLAMA_ARG_FLASH_ATTN=on is ignored without a word. advisor/runtime/llamaserver.py server_args always writes
    ("-fa", cfg.flash_attn), whatever cfg.llama_build. Expected: for a build before the value form, `-fa` alone
    when flash attention is on and nothing when it is off (or the plan refused for that build)."""
    rc, out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "8k", "--llama-build", "b5000", "--json"
    )
    assert rc == 0, err
    command = json.loads(out)["llama_server"]["command"]
    assert not re.search(r"(^| )-fa (on|off|auto)( |$)", command), command


# --- 3. -md without --spec-type: the draft is freed at start-up ------------------------------------------------


def test_a_draft_model_command_turns_speculative_decoding_on(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 4k -md gemma-3-270m-q4_k_m.gguf
    --llama-build b11312`: the command is `llama-server ... -md gemma-3-270m-q4_k_m.gguf -ngld 999` and the plan
    charges the draft's weights and context on the GPU. At b11312 that command never drafts: common_params
    speculative.types defaults to {none} (common/common.h:373), -md does not change it (common/arg.cpp: the type is
    inferred only from MTP/DFlash/DSpark/EAGLE-3 metadata or sidecars, common_speculative_types_from_gguf returns {}
    for a plain model), so common_speculative_init adds no implementation and returns nullptr (common/speculative.cpp,
    "no implementations specified"), and llama-server then resets spec_init, freeing the draft model and its
    context (tools/server/server-context.cpp load_model: `if (spec) ... else { spec_init.reset(); ctx_dft =
    nullptr; ... }`). llama.cpp's docs/speculative.md lists `draft-simple` as the --spec-type of a plain draft
    model. The --spec-type choice of kvadvise has only none|draft-mtp, so the user cannot ask for it either.
    Expected: the command (and LLAMA_ARG_SPEC_TYPE in the env) carries `--spec-type draft-simple` for a build
    that needs it, and the plan charges what that turns on (common_speculative_n_max: the target reserves
    1 + --spec-draft-n-max logits rows per slot)."""
    rc, out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "4k", "-md", str(gemma_path),
        "--llama-build", "b11312", "--json",
    )  # fmt: skip
    assert rc == 0, err
    server = json.loads(out)["llama_server"]
    assert "-md" in server["command"].split(), server["command"]
    assert "--spec-type draft-simple" in server["command"], server["command"]
    assert server["env"].get("LLAMA_ARG_SPEC_TYPE") == "draft-simple", server["env"]


# --- 4. --target-ctx rounded down below the target -------------------------------------------------------------


def test_the_recommended_context_is_not_rounded_below_the_target(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --target-ctx 5000`: "4,096 tokens, K/V f16: fits
    100% on the GPU" with 21.8 GiB spare, the command `-c 4096`, and under -v "f16 K/V: ... it reaches the target"
    -- 4,096 < 5,000. (--target-ctx 6000 gives 5,120, 8191 gives 7,168, 20000 gives 19,456; with -np 3: 4,096 x 3.)
    planner/recommender.py recommend: `n_ctx_seq = n_ctx_seq // CTX_ROUND * CTX_ROUND` floors the target to a
    multiple of 1,024 even when the chosen cache type reaches 32,768. The same floor makes `--target-ctx 5000
    --min-ctx 5000` exit 3 ("nothing reaches --min-ctx 5,000: the best is f16/f16 at 32,768 tokens", hint "would
    fit with a larger memory budget") and `compare --ctx 5000` say SHORT. Expected: a context that reaches the
    target when the memory holds it (llama.cpp pads -c 5000 to 5,120 itself)."""
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--target-ctx", "5000", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fits"] is True
    assert doc["config"]["n_ctx_seq"] >= 5000, doc["config"]


# --- 5. compare's context is not the plan's ---------------------------------------------------------------------


@pytest.mark.parametrize("ctx", ["1", "1000"])
def test_compare_reports_the_context_its_plan_holds(
    ctx: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise compare gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 1000 --json`: entries[0].n_ctx is 1000 (the
    table's CONTEXT column: 1,000; with --ctx 1: 1), while `kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090
    --target-ctx 1000` plans the same pair at 1,024 tokens (n_ctx_seq 1024, "llama.cpp pads to 256"; --target-ctx 1:
    256) -- with the same device_bytes, so compare sized the padded cache and printed the unpadded request.
    docs/json.md (compare): `n_ctx` is the context per sequence of the plan. Expected: compare's n_ctx is the
    plan's per-sequence context, as `llamacpp` gives it for the same target."""
    rc, out, err = run(capsys, "compare", str(gemma_path), "--gpu", "rtx-4090", "--ctx", ctx, "--json")
    assert rc == 0, err
    entry = json.loads(out)["entries"][0]
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--target-ctx", ctx, "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert entry["device_bytes"] == plan["memory"]["device_bytes"]  # the same plan
    assert entry["n_ctx"] == plan["config"]["n_ctx_seq"], (entry["n_ctx"], plan["config"]["n_ctx_seq"])


# --- the reviewer's unfiled item: -ts 0,1 and the decode line -------------------------------------------------


@pytest.mark.parametrize(("ts", "named", "unnamed"), [("0,1", "1,008 GB/s", "360"), ("1,0", "360 GB/s", "1,008")])
def test_decode_line_names_only_the_cards_that_hold_layers(
    ts: str, named: str, unnamed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf gemma3-12b.json --quant Q4_K_M --gpu rtx3060 --gpu rtx4090 -ts 0,1`: every layer is on the
    4090 (llama.cpp's -ts gives a device with a 0 share no layer: llama_model::load_tensors' splits), and the decode
    estimate is the 4090's, but the line said "at 360 + 1,008 GB/s". Expected: only the cards that read layers."""
    config = Path(__file__).parent / "data" / "hf" / "gemma3-12b.json"
    args = ["hf", str(config), "--quant", "Q4_K_M", "--gpu", "rtx3060", "--gpu", "rtx4090", "--ctx", "8192"]
    rc, out, err = run(capsys, *args, "-ts", ts)
    assert rc == 0, err
    line = next(x for x in out.splitlines() if "decode (estimate)" in x)
    assert line.endswith(f"at {named}") and unnamed not in line.split("; at ")[-1], line
    rc, out, err = run(capsys, *args, "-ts", "1,1")
    assert rc == 0, err
    assert "at 360 + 1,008 GB/s" in out
