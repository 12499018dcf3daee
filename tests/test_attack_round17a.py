"""Round 17a of the red team (a reviewer in its own worktree): the changes of 8660807..4558b29 (the runtime's process
kept out of every plan's RAM, the 4,096-token floor reached by partial offload, --min-ctx raising the target, a Mac's
RAM and apply steps, several Ollama models refusing --margin, the partial offload's per-device rules). Each test
reproduces one defect of the code at 4558b29, where it fails; its docstring gives the command, what the user sees,
what is expected and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)

GIB = 1 << 30
MIB = 1 << 20
HF = Path(__file__).resolve().parent / "data" / "hf"


def _doc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    rc, out, err = run(capsys, *args, "--json")
    return rc, json.loads(out), err


# --- 1. a CPU plan sized to the RAM less the margin, then checked with 512 MiB more kept: exit 3 -------------------


@pytest.mark.parametrize(
    "command",
    [
        ("ollama", "qwen3:8b", "--device", "cpu", "--ram", "8GiB"),
        ("hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--device", "cpu", "--ram", "8GiB"),
    ],
    ids=["ollama-qwen3-8b", "hf-qwen3-8b"],
)
def test_a_cpu_plan_is_sized_to_the_ram_its_own_check_leaves(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """A laptop without a GPU and 8 GiB free:

        kvadvise ollama qwen3:8b --device cpu --ram 8GiB
        kvadvise hf tests/data/hf/qwen3-8b.json --quant Q4_K_M --device cpu --ram 8GiB

    exit 3: "qwen3:8b on the CPU: 24,576 tokens, K/V q8_0: fits the GPU, but NOT the system RAM", "memory: 6.79
    GiB of 7.00 GiB", "system RAM: 14.79 GiB of 7.00 GiB (given with --ram, less the 1,024 MiB margin): DOES NOT
    FIT" (the hf config: 29,696 tokens, "6.97 GiB of 7.00 GiB", exit 3); nothing written, no command. Yet a
    shorter context runs: the same hf command with `-c 16384` is exit 0, "fits in RAM" (--ram 9GiB: 32,768
    tokens, exit 0). 4ffa14b made every plan keep hostram.PROCESS_BYTES (512 MiB, "the llama-server process beside
    its buffers", ggml-org/llama.cpp#27725) out of the RAM (hostram.plan_host_ram: ``kept = ram_kept_bytes +
    PROCESS_BYTES``), but the CPU plan's context is still searched against budget_for's ``ram_bytes = free -
    margin`` (planner/budget.py), which keeps nothing for that process: the recommender fills the RAM to within a
    few MiB, and the RAM check it then runs takes 512 MiB more, so whenever the RAM (not the target) bounds a CPU
    plan it is refused. docs/policy.md rule 8 / docs/exit-codes.md: exit 3 is "it does not fit"; here the
    recommendation does not fit by its own construction while a smaller context does. Expected: the CPU plan's
    context searched within the RAM less the margin and the process's 512 MiB, exit 0, a plan that runs (its
    `ram.fits`)."""
    rc, doc, err = _doc(capsys, *command)
    assert rc == 0 and doc["runnable"] is True, (
        rc,
        doc["config"]["n_ctx_seq"],
        doc["ram"] and (doc["ram"]["total_bytes"] / GIB, doc["ram"]["ram_bytes"] / GIB, doc["ram"]["kept_bytes"]),
        err,
    )
    assert doc["ram"]["fits"], doc["ram"]


# --- 2. a CPU plan short of RAM says it "fits the GPU" ---------------------------------------------------------------


def test_a_cpu_plan_short_of_ram_does_not_say_it_fits_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf tests/data/hf/qwen3-8b.json --quant Q4_K_M --device cpu --ram 8GiB -c 24576` (a machine without
    a GPU, `--device cpu`): exit 3 with the headline "qwen3-8b.json on the CPU: 24,576 tokens, K/V q8_0: fits the
    GPU, but NOT the system RAM". There is no GPU in this plan (its budget's device is the CPU; "on the CPU" in the
    same line); a CPU plan that fits says "fits in RAM" (summary.headline's ``on_cpu``), one that does not fit its
    memory says "DOES NOT FIT" without "the GPU", but the RAM branch ignores ``on_cpu``. 4ffa14b makes it the
    common answer of a RAM-bound CPU plan (test 1: `ollama qwen3:8b --device cpu --ram 8GiB`, no -c). Expected: no
    "GPU" in the headline of a plan that runs on the CPU ("fits its memory, but NOT the system RAM", or "DOES NOT
    FIT the system RAM")."""
    rc, out, _err = run(
        capsys, "hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--device", "cpu", "--ram", "7GiB", "-c", "24576"
    )  # fmt: skip  (8 GiB fits now: a CPU plan's margin holds the process)
    lines = out.splitlines()
    head = " ".join(lines[:2])  # the headline, wrapped
    assert rc == 3 and "on the CPU" in lines[0], out
    assert "GPU" not in head, head


# --- 3. a Mac with --ram below its GPU's share: the GPU's context is not bounded by the RAM it lives in --------------


def test_a_mac_given_less_ram_gets_a_shorter_context_not_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A Mac user with other programs open says how much is free, as README's "`--ram SIZE` below stands in for the
    RAM free on your machine" tells them (4ffa14b: a --ram up to the Mac's memory is taken, above it refused):

        kvadvise hf tests/data/hf/qwen3-8b.json --quant Q4_K_M --gpu m4-pro-24gb --ram 8GiB

    exit 3, nothing written: "40,960 tokens, K/V f16: fits the GPU, but NOT the system RAM", "memory: 10.57 GiB of
    15.00 GiB", "system RAM: 18.98 GiB of 8.00 GiB (given with --ram): DOES NOT FIT". The same command with `-c 8192`
    is exit 0 ("fits", 7.42 GiB of the 8 GiB). On a Mac the GPU's buffers are the RAM (docs/policy.md, System RAM:
    "a Mac of the card list: its unified memory, the GPU's share included"; JSON `ram.gpu_shared_bytes`), so the K/V
    the recommender adds to fill the GPU's 15 GiB budget (the wired share of 24 GB, apple_gpu_share_bytes) is RAM the
    user said is not there: the context is searched against a budget the plan's own RAM check then refuses. Less RAM
    should give a shorter context (as --ram 12GiB: 40,960 fits), not exit 3 with no plan. Expected: exit 0, a plan
    that runs (`runnable`), of at least the 8,192 tokens that fit."""
    rc, doc, err = _doc(capsys, "hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--gpu", "m4-pro-24gb",
                        "--ram", "8GiB")  # fmt: skip
    ctx = doc["config"]["n_ctx_seq"] if doc["fits"] else (doc["offload"] or {}).get("n_ctx")
    assert rc == 0 and doc["runnable"] is True, (rc, ctx, doc["ram"] and doc["ram"]["total_bytes"] / GIB, err)
    assert ctx >= 8192, ctx


# --- 4. a Mac's --ram (what is free) shrinks the GPU's wired limit the MLX runner is checked against ----------------


def test_the_mlx_runners_wired_limit_is_the_macs_not_the_free_ram(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama gemma3:4b --gpu m4-pro-24gb --ram 24GiB` (or without --ram): exit 0, the MLX runner's row
    "total 14.87 GiB against the GPU's share 16.00 GiB of 24.00 GiB (iogpu.wired_limit_mb): fits". The same Mac with
    18 GiB free, `--ram 18GiB`: exit 3, "DOES NOT FIT the GPU", "total 14.87 GiB against the GPU's share 12.00 GiB of
    18.00 GiB (iogpu.wired_limit_mb): does NOT fit: macOS swaps past it", while the same answer's note still says
    "the GPU may use 2/3 of 24.0 GiB = 16.0 GiB by default (macOS recommendedMaxWorkingSetSize)", the llama.cpp
    memory line "5.13 GiB of 14.91 GiB" and "system RAM: 17.34 GiB of 18.00 GiB: fits". The wired limit is macOS's
    default for the machine's installed memory (MTLDevice.recommendedMaxWorkingSetSize; planner/gpus.py
    apple_gpu_share_bytes takes "the Mac's memory"), not a share of what happens to be free: backends/ollama/
    runtime.py passes ``plan.hardware.ram_total_bytes`` to mlx_memory, which hardware.with_ram has replaced with
    --ram. So a user saying how much RAM is free (18 of 24 GiB) is told the model no longer fits the GPU, which a
    24 GiB --ram (more free RAM, the same GPU) fits. Expected: the MLX runner's wired limit is the Mac's 16 GiB
    whatever --ram says (JSON runner.mlx.wired_limit_bytes), and the plan fits as with --ram 24GiB."""
    rc24, d24, _ = _doc(capsys, "ollama", "gemma3:4b", "--gpu", "m4-pro-24gb", "--ram", "24GiB")
    rc18, d18, _ = _doc(capsys, "ollama", "gemma3:4b", "--gpu", "m4-pro-24gb", "--ram", "18GiB")
    m24, m18 = d24["ollama"]["runner"]["mlx"], d18["ollama"]["runner"]["mlx"]
    assert rc24 == 0 and m24["fits"] and m24["wired_limit_bytes"] == 16 * GIB, m24
    assert m18["wired_limit_bytes"] == m24["wired_limit_bytes"], (m18["wired_limit_bytes"] / GIB, m18["ram_bytes"])
    assert rc18 == 0 and d18["fits"], (rc18, d18["ram"]["fits"])


# --- 5. "system RAM: 420.05 MiB of 800.00 MiB: DOES NOT FIT": the 512 MiB kept is never said on a PC ---------------


def test_the_ram_line_says_what_it_keeps_when_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf tests/data/hf/qwen3-8b.json --quant Q4_K_M --gpu rtx-4090 --runtime library --ram 800MiB`: exit 3,
    "fits the GPU, but NOT the system RAM", and the line that should say why:

        system RAM: 420.05 MiB of 800.00 MiB (given with --ram): DOES NOT FIT

    420 MiB of 800 MiB does not fit, with nothing else on the line or anywhere in the answer to explain it. 4ffa14b
    keeps hostram.PROCESS_BYTES (512 MiB) of every plan's RAM (`ram.kept_bytes` 536,870,912 in --json, "fits":
    false), but the RAM source is annotated with what is kept only for a Mac (hostram.plan_host_ram: ``if
    budget.ram_kept_bytes: source += "..., X GiB of it left to the OS and the runtime's process"``, a Mac's
    "(Apple M4 Pro 24GB's unified memory, 4.50 GiB of it left to the OS and the runtime's process)"); on every other
    machine it now keeps 512 MiB silently. A user at `--ram 1GiB` reads "420.05 MiB of 1.00 GiB: fits" and cannot
    tell why 800 MiB does not do. Expected: the line says the 512 MiB kept for the runtime's process (as a Mac's
    does), or counts it in the figure it compares."""
    rc, out, _err = run(capsys, "hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--gpu", "rtx-4090",
                        "--runtime", "library", "--ram", "800MiB")  # fmt: skip
    assert rc == 3, out
    text = out.replace("\n", " ")
    line = text[text.index("system RAM:") :].split("  why:")[0].split("  note:")[0]
    assert "DOES NOT FIT" in line, line
    assert "process" in line or "512" in line, line


def test_json_md_kept_bytes_is_not_zero_off_a_mac(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/json.md (the `ram` object): "`kept_bytes` (of `ram_bytes`, kept for macOS and the runtime's process on a
    Mac of the card list; else 0)"; docs/schema/plan.schema.json: "Of ram_bytes, kept for the OS and the runtime's
    process (a Mac of the card list); 0 elsewhere." A tool author who reads `ram_bytes - total_bytes` as the RAM to
    spare on a PC (kept_bytes documented 0) gets it 512 MiB too high: `kvadvise hf qwen3-8b.json --quant Q4_K_M --gpu
    rtx-4090 --ram 32GiB --json` has `"kept_bytes": 536870912` since 4ffa14b ("every plan's RAM keeps the runtime's
    own process ... not only a Mac's"), which did not touch either document. Expected: the documents say what the
    field holds (512 MiB for the process everywhere, plus macOS's share on a Mac), or the field is 0 off a Mac."""
    rc, doc, _err = _doc(capsys, "hf", str(HF / "qwen3-8b.json"), "--quant", "Q4_K_M", "--gpu", "rtx-4090",
                         "--ram", "32GiB")  # fmt: skip
    assert rc == 0
    kept = doc["ram"]["kept_bytes"]
    docs = Path(__file__).resolve().parent.parent / "docs"
    said_zero = "Mac of the card list; else 0" in " ".join((docs / "json.md").read_text().split()) or (
        "0 elsewhere" in (docs / "schema" / "plan.schema.json").read_text()
    )
    assert not (kept != 0 and said_zero), f"kept_bytes {kept:,} off a Mac; docs/json.md and the schema say 0"


# --- 7. the API drops a request's ram_bytes beside hardware= (a Mac's 64 GiB too) ------------------------------------


@pytest.mark.parametrize(("card", "ram"), [("rtx-4090", 1 * GIB), ("m4-pro-24gb", 16 * GIB)], ids=["pc", "mac"])
def test_the_api_plans_the_ram_a_request_gives_beside_hardware(gemma_path: Path, card: str, ram: int) -> None:
    """The command `kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ram 1GiB --json` plans against 1 GiB
    (`ram.ram_bytes` 1,073,741,824, "given with --ram"); on a Mac, `--gpu m4-pro-24gb --ram 16GiB` against 16 GiB,
    and `--ram 64GiB` there is refused (4ffa14b: "more than the 24 GiB of unified memory this Mac has in all", exit
    2). The Python API with the card as docs/python-api.md shows it (`hardware=kvadvise.gpu_profile(...)`):

        kvadvise.plan(path, kvadvise.PlanRequest(ram_bytes=1 << 30), hardware=kvadvise.gpu_profile("rtx-4090"))

    plans against this machine's free RAM ("this machine's, free now", 22.5 GiB here), the Mac against its 24 GiB
    ("Apple M4 Pro 24GB's unified memory, 4.50 GiB of it left to the OS ..."); a `ram_bytes=64 << 30` on the Mac is
    neither refused nor used. entry.plan_for applies the request's `ram_bandwidth_gbs` to the hardware= it is given
    but never its `ram_bytes` (hardware_of/with_ram run only without hardware=), and api.plan's clash check ("hardware=
    is the command line's --gpu: what --gpu is refused beside is refused beside it, never dropped") does not name
    ram_bytes. docs/python-api.md: a PlanRequest is "the command line's question (... every field has the default of
    its flag)". Expected: the plan's RAM is the request's ram_bytes, as --ram with --gpu (or the pair refused, never
    the field dropped)."""
    import kvadvise
    from kvadvise.errors import KvadviseError

    try:
        plan = kvadvise.plan(str(gemma_path), kvadvise.PlanRequest(ram_bytes=ram), hardware=kvadvise.gpu_profile(card))
    except KvadviseError:
        return  # refused: not dropped
    got = kvadvise.to_json(plan)["ram"]
    assert got["ram_bytes"] == ram, (got["ram_bytes"] / GIB, got["ram_source"])


# --- 8. command-r / cohere2: the output layer alone on a device copies in a whole-ubatch row set ----------------------


@pytest.mark.llama
@pytest.mark.parametrize("recipe", ["command-r", "cohere2"])
@pytest.mark.parametrize("ubatch", ["1024", "2048"])
def test_output_layer_alone_of_a_parallel_block_model_fits_its_device(
    recipe: str, ubatch: str, tmp_path: Path, real_llama_server: Path
) -> None:
    """`kvadvise llamacpp command-r(8 layers, n_embd 1024, n_ff 4096, n_vocab 32000: the tied output 62.5 MiB f16)
    --rpc A=63MiB -c 4096 -ub 1024 --margin 0 --ram 16GiB` -> "part on the CPU", `-ngl 1` (every block on the CPU,
    the output layer alone on A), `offload.devices_bytes` 62.64 MiB, runnable. llama-server b11312 over the
    rpc-server prints for A: model 62.50 + compute 4.01 = 66.51 MiB, 3.5 MiB over the 63 MiB budget kvadvise says it
    fits (-ub 2048: compute 8.01, 70.51 MiB; cohere2 the same). For llama, qwen2/3, gemma2/3, granite, phi3 the same
    -ngl 1 is exact (62.63 printed, 62.64 planned).

    The compute is one [n_embd, n_ubatch] f32 tensor (1024 x 1024 x 4 = 4 MiB; 8 MiB at -ub 2048), not the gathered
    row: src/models/command-r.cpp (cohere2.cpp alike) runs attention and the FFN in parallel off one norm and gathers
    the last block's `cur`, `inpL` and `ffn_inp` (ggml_get_rows(..., inp_out_ids)) where the gathered `inpL` and
    `attn_out` feed only the final weightless adds (`cur = ggml_add(cur, inpL); cur = ggml_add(cur, attn_out)`), so
    ggml_backend_sched's "expand gpu up" pass (ggml/src/ggml-backend.cpp) gives those get_rows to the output norm's
    device, which copies their whole-ubatch sources in. (llama.cpp's sequential blocks feed the gathered residual to
    the CPU's own ffn_norm: the gather stays on the CPU.) 8660807 sizes the output layer alone at the rows the last
    block gathers for every model outside split._GATHER_AFTER_LOOP (memory.output_layer_compute_bytes ->
    split_compute(DeviceLayers((), True, ...)): 0.14 MiB), measured on a qwen3moe only; before it planned the whole
    batch's logits (safe). Expected: the plan that says it fits A fits A as llama-server runs it (at most the 63 MiB
    given)."""
    import contextlib
    import io
    import shlex

    from llama_server_build import rpc_server
    from rpc_devices import devices, run_server
    from tinymodels import write_tiny_gguf

    from kvadvise.cli import main
    from kvadvise.runtime.llamalog import parse

    dims = dict(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=4096)
    model = write_tiny_gguf(tmp_path / f"{recipe}.gguf", recipe, n_vocab=32000, dims=dims)
    with devices(rpc_server(), 1) as eps:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(["llamacpp", str(model), "--rpc", f"{eps[0]}=63MiB", "-c", "4096", "-ub", ubatch, "--margin", "0",
                  "--ram", "16GiB", "--json"])  # fmt: skip
        doc = json.loads(buf.getvalue())
        off = doc["offload"]
        if off is None:  # (fixed: -ngl 1 is sized at the whole batch's hidden state, over 63 MiB: nothing runs, exit 3)
            assert not doc["fits"], doc
            return
        assert not doc["fits"] and off["runnable"], off
        cmd = shlex.split(doc["llama_server"]["offload_command"])
        args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
        got = parse(run_server(real_llama_server, model, args, eps).splitlines())
    real = sum(b.mib for b in got.buffers if b.buft == f"RPC0[{eps[0]}]" and b.kind in ("model", "KV", "compute"))
    planned = off["devices_bytes"][0] / MIB
    assert real <= 63.0, f"-ngl {off['n_gpu_layers']}: {real:.2f} MiB on a 63 MiB device ({planned:.2f} planned)"
