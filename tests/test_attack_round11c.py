"""Round 11c of the red team (a reviewer in its own worktree): "which card should I buy" and "how many users" --
`kvadvise gpus [MODEL]`, `kvadvise compare ... --gpu/--vram`, and `--users N`. Each test reproduces one defect of the
code at 903e9c4 and fails there; its docstring gives the command, what happened, what should happen and the source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)

MiB = 1 << 20
GiB = 1 << 30


def _profile(capsys: pytest.CaptureFixture[str], card_id: str) -> dict[str, object]:
    rc, out, err = run(capsys, "gpus", "--json", "--no-hardware")
    assert rc == 0, err
    return next(p for p in json.loads(out)["profiles"] if p["id"] == card_id)


# --- 1. RTX PRO 6000 Blackwell: the memory the driver reports, not 96 GiB -----------------------------------------


def test_the_rtx_pro_6000_blackwell_budget_is_what_the_driver_reports(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gpus --json --no-hardware`: rtx-pro-6000-blackwell ("NVIDIA RTX PRO 6000 Blackwell (Workstation/
    Server/Max-Q) 96GB") has usable_bytes 103,079,215,104 (96.0 GiB = 98,304 MiB): the entry has no
    nvml_total_bytes, so `--gpu rtx-pro-6000-blackwell` (and `gpus MODEL`, `compare`) plans against 98,304 MiB less
    the margin. The driver reports 417 MiB less: public nvidia-smi captures of the card all read "97887MiB" --
    "NVIDIA RTX PRO 6000 Blac... | 0MiB / 97887MiB" (driver 570.172.08, ECC on), "15MiB / 97887MiB" (ECC off),
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition mem=2/97887MiB", the Server Edition "97887MiB" (driver
    595.91.07 and 610.57.04), and CUDA's own "VRAM: 97886 MiB" / "(97,887 MiB)" (a find_string for "97887MiB" over
    the public code index returns ten such captures; GDDR7's ECC is on-die, so ECC on or off reads the same). The
    catalogue already carries the reported figure for its other cards (rtx-5090 32,607 MiB, h100 81,559 MiB, h200
    143,771 MiB, l40s 46,068 MiB: profiles/gpus.json nvml_total_bytes, "from_profile plans with it when known"), so a
    plan "with 0.3 GiB spare" on this card is one that OOMs. Expected: usable memory at most 97,887 MiB."""
    card = _profile(capsys, "rtx-pro-6000-blackwell")
    assert card["usable_bytes"] <= 97887 * MiB, card


# --- 2. DGX Spark: 128 GiB of LPDDR5X of which CUDA sees 121.7 GiB, shared with the OS ----------------------------


def test_the_dgx_spark_budget_is_what_cuda_reports_not_the_whole_ram(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gpus --json --no-hardware`: dgx-spark has memory_bytes = usable_bytes = 137,438,953,472 (128 GiB),
    and `kvadvise compare qwen3:8b --gpu dgx-spark --json` plans a budget_bytes of 126.35 GiB (128 GiB less the 1 GiB
    margin, the display allowance and the profile headroom). The profile's own note says "planned as the whole 128 GiB
    less what the OS holds", but nothing is taken for the OS, and the GPU cannot even see 128 GiB: on GB10 CUDA
    reports a total of 121.69 GiB ("Free memory on cuda:0 at boot caps at 101.3-102.2 GiB of 121.69",
    MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47, headless, caches dropped), the OS sees "Total RAM: 121Gi (128GB
    unified memory)" (NVIDIA/NemoClaw#3251), and vLLM's recipe needs --gpu-memory-utilization 0.85 on it "because
    GB10's unified memory can't satisfy the default 0.92" (vllm-project/recipes#632). `gpus MODEL` therefore
    recommends the Spark for models that need up to ~126 GiB, 4.7+ GiB past what exists, while the same catalogue
    takes 1/4 of an Apple machine's unified memory away for the OS. Expected: the Spark's usable memory at most what
    CUDA reports (121.69 GiB), and the plan's budget below it."""
    card = _profile(capsys, "dgx-spark")
    assert card["usable_bytes"] <= int(121.69 * GiB), card
    rc, out, err = run(capsys, "compare", "qwen3:8b", "--gpu", "dgx-spark", "--json")
    assert rc == 0, err
    entry = json.loads(out)["entries"][0]
    assert entry["budget_bytes"] < int(121.69 * GiB), entry


# --- 3. --users: "yes" to sessions longer than llama-server gives a slot -------------------------------------------


def test_the_users_answer_is_not_yes_for_sessions_past_the_training_context(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4060 --users 2 --ctx 128k`: the answer, printed first,
    is "2 users at 64k each (K/V f16) on NVIDIA GeForce RTX 4060 8GB: yes; at most 29" (JSON users.fits true,
    n_ctx_user 65,536, max_users 29), and the command is `llama-server ... -c 131072 -np 2`. Gemma 3 270M was trained on
    32,768 tokens (the plan prints it), and llama-server caps every slot there: tools/server/server-context.cpp
    `n_ctx_slot()` returns `std::min(res, llama_model_n_ctx_train(model_tgt))` and load_model warns "the slot context
    (%d) exceeds the training context of the model (%d) - capping" (b11312, the build the plan names). So each of the
    two users gets 32,768 tokens, not 65,536: a request past 32k is refused, and "at most 29" counts sessions of a
    length none of them can have. The plan itself adds a note further down ("llama-server caps each slot at 32,768"),
    which contradicts its own first line. Expected: the users answer is for what a slot really holds -- "no" for
    64k each (or the per-user context reported as the 32,768 a slot gets), not "yes" at 65,536."""
    rc, out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4060", "--users", "2", "--ctx", "128k", "--json"
    )
    assert rc in (0, 3), err
    users = json.loads(out)["users"]
    assert not (users["fits"] and users["n_ctx_user"] > 32768), users


# --- 4. compare --vram: a decode speed for a card whose bandwidth nobody gave ------------------------------------


def test_compare_with_a_hand_given_vram_does_not_state_one_speed_it_does_not_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise compare qwen3:8b --vram 24GiB` prints "qwen3:8b  24 GiB  yes  40k ... T/S@4K ~102  T/S@CTX ~55"
    (JSON decode_4k_tokens_per_s 101.8, bandwidth_source null) and not a word on where the speed comes from; and
    compare refuses `--bandwidth` ("No such option"), so the user cannot give it. The same budget in a plan says it
    does not know: `kvadvise ollama qwen3:8b --vram 24GiB` gives "≈ 41 to 109 t/s at 4k ...; 6 catalogue card(s) of
    24 GiB: 300-1,008 GB/s" (an L4 at 300 GB/s to an RTX 4090 at 1,008 GB/s: a 2.7x spread), and `--bandwidth`
    (docs/commands.md, common flags: "with --vram: the card's memory bandwidth in GB/s, for the decode-speed
    estimate") narrows it. A buyer comparing a 24 GiB card by hand in `compare` is shown the top of that range as
    the card's speed (an L4 decodes at ~41). Expected: compare with `--vram` either takes `--bandwidth` or does not
    state one figure: null speed, or a note/range naming the assumption, as the plan does."""
    rc, out, err = run(capsys, "compare", "qwen3:8b", "--vram", "24GiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    entry = doc["entries"][0]
    said = " ".join(n for c in doc["cards"] for n in c["notes"])
    rc_bw, _, err_bw = run(capsys, "compare", "qwen3:8b", "--vram", "24GiB", "--bandwidth", "300")
    assert rc_bw == 0 or entry["decode_4k_tokens_per_s"] is None or "GB/s" in said, (entry, said, err_bw)
