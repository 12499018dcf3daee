"""Round 10b of the red team (a reviewer in its own worktree): "advice an expert would sign" -- the context a plan
promises against what llama-server really gives a slot, and a card's memory against what the driver reports. Each
test reproduces one defect of the code at 150410b and fails there; its docstring gives the command, what happened,
what should happen and the source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)

MiB = 1 << 20

# llama.cpp tools/server/server-context.cpp (load_model; the same lines in server.cpp of older builds):
#     const int n_ctx_train = llama_model_n_ctx_train(model_tgt);
#     int n_ctx_slot = llama_n_ctx_seq(ctx_tgt);
#     if (n_ctx_slot > n_ctx_train) {
#         SRV_WRN("the slot context (%d) exceeds the training context of the model (%d) - capping\n", ...);
#         n_ctx_slot = n_ctx_train;
#     }
# and src/llama-context.cpp warns "n_ctx_seq (%u) > n_ctx_train (%u) -- possible training context overflow".
# Published logs show it, e.g. "-c 65536" on Qwen3-8B: "the slot context (65536) exceeds the training context of the
# model (40960) - capping ... new slot, n_ctx = 40960", and requests past 40,960 tokens rejected.
_SAYS_CAPPED = re.compile(r"train(ed|ing)[^.;]*(context|tokens)|n_ctx_train|capp", re.IGNORECASE)


# --- 1. --ctx past the training context: the plan promises tokens llama-server never gives --------------------


def test_a_llamacpp_context_past_the_training_context_is_flagged(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 64k` (also 65536, 128000, 1m): exit 0,
    "65,536 tokens, K/V f16: fits 100% on the GPU", the command `llama-server ... -c 65536 -np 1 ...`, a decode
    estimate "≈ 367 t/s at 64k", and not one word that the model (gemma3, "trained on 32,768 tokens", which the
    plan itself prints) is asked for twice its training context: `notes` holds only the build note. llama-server
    caps each slot at n_ctx_train (tools/server/server-context.cpp: "the slot context (%d) exceeds the training
    context of the model (%d) - capping", n_ctx_slot = n_ctx_train), so the user allocates a 64k K/V cache of which
    a request can use 32,768 tokens, and a client told 65,536 gets "context exceeded" past 32k. `kvadvise ollama
    qwen3:8b --ctx 64k` already says "num_ctx 65,536 is past the model's training context" (Ollama clamps it);
    the llama.cpp path says nothing. Expected: a note (or the plan capped) saying that llama-server caps each slot
    at the 32,768-token training context (RoPE scaling / --override-kv being the way past it)."""
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "64k", "--json")
    assert rc == 0, err
    plan = json.loads(out)
    said = " ".join([*plan.get("notes", []), *map(str, plan.get("reasons", []))])
    assert _SAYS_CAPPED.search(said), said


# --- 2. --min-ctx's hint sends the user to that same uncapped context ---------------------------------------------


def test_the_min_ctx_hint_does_not_offer_a_context_llama_server_caps(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --min-ctx 64k`: exit 3, "nothing reaches
    --min-ctx 65,536: the best is f16/f16 at 32,768 tokens" and the hint "Gemma 3 270m was trained on 32,768
    tokens, where the recommendation stops; --ctx 65536 plans that context as given". Following it,
    `kvadvise llamacpp ... --ctx 64k --min-ctx 64k` exits 0 (the --min-ctx check passes) and prints `-c 65536`,
    yet llama-server gives each slot 32,768 tokens (server-context.cpp caps n_ctx_slot at n_ctx_train, "the slot
    context (65536) exceeds the training context of the model (32768) - capping"): the hint turns a correct
    refusal into a plan whose minimum is not met. Expected: the hint names what really raises the context past the
    training length (RoPE/YaRN scaling, `--override-kv <arch>.context_length=int:N`), not a bare `--ctx 65536`;
    and `--ctx 64k --min-ctx 64k` fails (exit 3) or at least says the slot is capped at 32,768."""
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--min-ctx", "64k")
    assert rc == 3, (rc, err)
    assert "--ctx 65536 plans that context as given" not in err, err
    rc, out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "64k", "--min-ctx", "64k", "--json"
    )
    said = " ".join(json.loads(out).get("notes", [])) if rc == 0 else ""
    assert rc == 3 or _SAYS_CAPPED.search(said), (rc, said, err)


# --- 3. H100 PCIe: the memory the driver reports, not 80 GiB ------------------------------------------------------


def test_the_h100_pcie_budget_is_what_the_driver_reports(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gpus --json`: h100-pcie ("NVIDIA H100 80GB PCIe") has usable_bytes 85,899,345,920 (80.0 GiB =
    81,920 MiB), so `--gpu h100-pcie` plans against 81,920 MiB less the margin. The driver reports less: published
    nvidia-smi output of the card reads "NVIDIA H100 PCIe ... 1MiB / 81559MiB" (driver 565.57.01; also 550.x logs
    "25169MiB / 81559MiB", "47809MiB / 81559MiB"), and cudaGetDeviceProperties gives a Global Memory Size of
    85,045,477,376 bytes. The SXM part already carries this (h100-sxm: nvml_total_bytes 85,520,809,984 = 81,559
    MiB, "usable 79.6 GiB", profiles/gpus.json citing modal-labs/modal-client#2797 and NVIDIA/nccl#1264); the PCIe
    entry has no nvml_total_bytes, so `kvadvise gpus` shows it as 80.0 GiB usable and every --gpu h100-pcie plan
    and `compare` column gets 361 MiB that does not exist (a plan "with 0.3 GiB spare" OOMs on the card).
    Expected: h100-pcie's usable memory at most 81,559 MiB, as NVML reports it."""
    rc, out, err = run(capsys, "gpus", "--json")
    assert rc == 0, err
    card = next(p for p in json.loads(out)["profiles"] if p["id"] == "h100-pcie")
    assert card["usable_bytes"] <= 81559 * MiB, card
