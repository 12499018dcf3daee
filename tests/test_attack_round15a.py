"""Round 15a of the red team (a reviewer in its own worktree): the changes of fbd8089 (2e84dda..fbd8089: the partial
offload's last block, the fill redone as it runs, --margin refused, Ollama by version, llama-server commands, the
recommender's 4,096-token floor). Each test fails on fbd8089 because of a real defect; its docstring gives the
command, what the user sees, what is expected and why (vendored llama.cpp: /tmp/lcpp/llama_cpp_python-0.3.36/vendor/
llama.cpp; Ollama: the ollama/ollama repository at the tag named)."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from rpc_devices import devices, run_server, within_bar
from tinymodels import write_tiny_gguf

GIB = 1 << 30
MIB = 1 << 20
HF = Path(__file__).resolve().parent / "data" / "hf"


def _doc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    rc, out, err = run(capsys, *args, "--json")
    return rc, (json.loads(out) if out.strip() else {}), err


def _running_ctx(doc: dict) -> int:
    """The context per sequence of the plan that runs: the plan's own when it fits, else its partial offload's."""
    cfg = doc["config"]
    if doc["fits"]:
        return cfg["n_ctx"] // max(1, cfg["n_parallel"])
    off = doc.get("offload") or {}
    return off.get("n_ctx", 0) if off.get("runnable") else 0


# --- 1. the 4,096-token floor (recommender.FIT_MIN_CTX) where no partial offload can take over -----------------


def test_a_cpu_plan_below_4096_tokens_is_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf qwen3-8b.json --quant Q4_K_M --device cpu --ram 6GiB`: on fbd8089 exit 3, "on the CPU: 4,096
    tokens, K/V q8_0: DOES NOT FIT ... no settings to apply", the reason "4,096 tokens per slot (the GPU alone
    reaches 2,816): fewer is not a context to work in; llama.cpp's --fit ... keeps part of the model on the CPU
    instead". At 2e84dda the same command printed "2,048 tokens, K/V q8_0: fits in RAM" and its -c 2048 command.

    The floor was added so that a short 100 %-GPU plan gives way to a partial offload at the target (fbd8089's
    recommender: "the plan that runs keeps part of the model on the CPU"). A CPU plan has no GPU and no partial
    offload: the whole model is already on the CPU, and llama.cpp's --fit (common/fit.cpp, which only moves layers
    off GPUs) has nothing to do there. Raising the context to 4,096 turns a plan that runs into "no plan that runs"
    (docs/exit-codes.md: exit 3) and a note about "the GPU alone" on a machine with none. Expected: exit 0, a plan
    that fits the RAM (the largest context it holds)."""
    rc, doc, _err = _doc(
        capsys, "hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--device", "cpu", "--ram", "6GiB",
        "--ram-bandwidth", "60",
    )  # fmt: skip
    assert rc == 0 and doc.get("fits"), (
        f"exit {rc}, fits {doc.get('fits')}, {doc.get('config', {}).get('n_ctx')} tokens: {doc.get('reasons')}"
    )


def test_a_gpu_plan_below_4096_tokens_stands_when_no_partial_offload_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama codellama:13b --gpu rtx-3080-10gb --ram 512MiB` (700MiB since the RAM check keeps 512 MiB for the process: 512 MiB of RAM runs nothing)`: on fbd8089 exit 3, "DOES NOT FIT, not even
    with part on the CPU (16,384 tokens, K/V q8_0: the RAM is short too)", no settings. At 2e84dda: "2,048 tokens,
    K/V q8_0: fits 100% on the GPU" (its system RAM check: fits), `PARAMETER num_ctx 2048`.

    The 4,096-token floor replaces the short GPU plan by "the plan that runs ... the partial offload at the target"
    (fbd8089's commit message); where the RAM cannot take any layer, no partial offload runs, and the 2,048-token
    plan the GPU holds is still a plan that runs. docs/exit-codes.md: exit 3 is "no plan that runs"; policy.md rule
    8: "the best plan that runs". Expected: exit 0 and a plan that runs (the 100 %-GPU context, below 4,096)."""
    rc, doc, err = _doc(
        capsys, "ollama", "codellama:13b", "--gpu", "rtx-3080-10gb", "--ram", "700MiB", "--ram-bandwidth", "60"
    )
    assert rc == 0 and _running_ctx(doc) > 0, (
        f"exit {rc}: fits {doc.get('fits')} at {doc.get('config', {}).get('n_ctx')}, offload "
        f"{(doc.get('offload') or {}).get('runnable')}: {err.strip()}"
    )


# --- 2. partial offload over two devices with an uneven -ts: the output layer's device ---------------------------


def test_two_devices_uneven_split_partial_offload_puts_the_output_layer_where_llama_cpp_does(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp llama(8 blocks, n_embd 1024, n_ff 4096, n_vocab 32000) --rpc A=76MiB --rpc B=76MiB
    -c 4096 -ts 3,1 --margin 0 --ram 16GiB` -> partial plan `-c 4096 -np 1 -fa on -ctk q8_0 -ctv q8_0 -ngl 2 -ts
    3,1`, offload.devices_bytes A 46.27 MiB, B 74.52 MiB (both within 76). llama-server b11312 runs that command
    with A holding 109.04 MiB (model 92.51 + KV 4.25 + compute 12.28: 33 MiB over its 76 MiB) and B nothing.

    llama_model::load_tensors (src/llama-model.cpp, get_layer_buft_list): with -ngl 2, i_gpu_start = 9 - 2 = 7 and
    act_gpu_layers = 2; block 7 goes to upper_bound(splits = [0.75, 1], 0/2) = A and the output layer (il =
    n_layer = 8) to upper_bound(splits, 1/2) = A too. In the full offload the output layer is B's (8/9 > 0.75).
    offload._on_devices starts from the full offload's per-device totals (``layers.fixed``, the output layer on B)
    and moves only the blocks to their partial owner; the output layer stays on B (fbd8089's _partial_owner gives
    the right owner, A, to tail_cut but the weights are not moved). Expected: each device's prediction within the
    project's bar (16 MiB or 3 %) of what llama-server allocates there."""
    from llama_server_build import rpc_server

    from kvadvise.cli import main
    from kvadvise.runtime.llamalog import parse

    model = write_tiny_gguf(
        tmp_path / "llama.gguf", "llama", n_vocab=32000, dims=dict(n_layer=8, n_embd=1024, head=256, n_ff=4096)
    )
    with devices(rpc_server(), 2) as eps:
        rpc = [a for ep in eps for a in ("--rpc", f"{ep}=76MiB")]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(
                ["llamacpp", str(model), *rpc, "-c", "4096", "-ts", "3,1", "--margin", "0", "--ram", "16GiB", "--json"]
            )
        doc = json.loads(buf.getvalue())
        off = doc["offload"]
        # (fixed: the output layer moves with -ngl 2 to A, which then holds 109 MiB; the plan is -ngl 1, run as printed)
        assert off is not None and off["runnable"] and off["n_gpu_layers"] in (1, 2), off
        cmd = shlex.split(doc["llama_server"]["offload_command"])
        args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
        got = parse(run_server(real_llama_server, model, args, eps).splitlines())
    real = [
        sum(b.mib for b in got.buffers if b.buft == f"RPC0[{ep}]" and b.kind in ("model", "KV", "compute"))
        for ep in eps
    ]
    predicted = [b / MIB for b in off["devices_bytes"]]
    assert all(within_bar(p, m) for p, m in zip(predicted, real, strict=True)), (predicted, real)


# --- 3. --margin of the whole card: the CLI refuses it, the Python API plans it --------------------------------


def test_the_python_api_refuses_a_whole_card_margin_as_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama codellama:13b --gpu 4090 --margin 30GiB`: exit 2, "kvadvise: error: --margin 30,720 MiB is
    the whole card (24,564 MiB): nothing is left for the model" (fbd8089, entry.check_margin). The same question in
    Python, `kvadvise.plan("codellama:13b", hardware=kvadvise.gpu_profile("4090"), margin_bytes="30GiB",
    runtime="ollama")`, returns a Plan (fits False, runnable False, 4,096 tokens): entry.plan_for checks the margin
    only ``if hardware is None``, and hardware= is how the API gives --gpu.

    docs/python-api.md: `plan` is "what the command line answers for the same question"; "Arguments are checked as
    the CLI checks its flags, with the same messages (one check ...): a wrong one raises kvadvise.errors.InputError
    ... with the exit code the CLI would give". Expected: an InputError (exit code 2), as the command."""
    import kvadvise
    from kvadvise.errors import InputError

    rc, _, err = run(capsys, "ollama", "codellama:13b", "--gpu", "4090", "--margin", "30GiB")
    assert rc == 2 and "whole card" in err, (rc, err)
    with pytest.raises(InputError):
        p = kvadvise.plan(
            "codellama:13b", hardware=kvadvise.gpu_profile("4090"), margin_bytes="30GiB", runtime="ollama"
        )
        pytest.fail(f"the API planned it: fits {p.fits}, runnable {p.runnable}, {p.config.n_ctx} tokens")


# --- 4. Ollama before 0.30 on two GPUs: "as few GPUs as possible" at the num_ctx asked ----------------------------


def test_ollama_before_0_30_spreads_a_context_one_gpu_cannot_hold(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama qwen2.5-coder:14b --gpu rtx3060-12gb,rtx3060-12gb --ollama-version 0.12.3`: "on NVIDIA
    GeForce RTX 3060 12GB: 7,168 tokens, K/V f16: fits 100% on the GPU", `PARAMETER num_ctx 7168` -- the answer for
    ONE 3060; the second card is never used. The same command with --ollama-version 0.30.0: 32,768 tokens (the
    target) over both cards.

    fbd8089's OllamaRuntime.place for a runner before 0.30 replans the model on one GPU (the recommender picks the
    context that GPU holds) and keeps that plan whenever it fits, citing assignLayers. But v0.20.0:llm/server.go
    assignLayers packs "the maximum number of layers onto the smallest set of GPUs" for the layers' sizes at the
    num_ctx the request carries: `for i := lastUsedGPU; i < len(gpus); i++ { gpuLayers = findBestFit(layers,
    gpus[:i+1], ...); if gpuLayers.Sum() == len(layers) ... break }` -- with num_ctx 32768 in the Modelfile the
    layers do not fit one 3060 and Ollama spreads them over both (v0.12.3:server/sched.go likewise tries one GPU,
    then all, at req.opts). Packing decides where a context goes, not how large it may be: kvadvise shrinks the
    context 4.5x to stay on one card. Expected: two cards reach more context than one (the target here)."""
    common = ("--ollama-version", "0.12.3", "--ram", "64GiB", "--ram-bandwidth", "60")
    rc1, one, err1 = _doc(capsys, "ollama", "qwen2.5-coder:14b", "--gpu", "rtx3060-12gb", *common)
    rc2, two, err2 = _doc(capsys, "ollama", "qwen2.5-coder:14b", "--gpu", "rtx3060-12gb,rtx3060-12gb", *common)
    assert rc1 == 0 and rc2 == 0, (err1, err2)
    assert _running_ctx(two) > _running_ctx(one), (
        f"one 3060: {_running_ctx(one):,} tokens; two 3060s: {_running_ctx(two):,} tokens "
        f"({[n for n in two['notes'] if 'GPU' in n][:1]})"
    )
