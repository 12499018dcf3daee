"""Round 14a of the red team (a reviewer in its own worktree): "one question, one answer" -- every command and file
kvadvise prints for one planning request must run the plan it states. Ground truth: the real llama-server /
rpc-server of the tests' build (b11312, 0c1e570: tests/llama_server_build.py; an rpc-server on loopback is a
GPU-type device, as a GPU is on a user's machine: tests/rpc_devices.py), and llama.cpp's source where a build is
not at hand. Each test fails on the current code; its docstring gives the command, what the real program did and
the rule."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from rpc_devices import devices, run_server
from tinymodels import write_tiny_gguf

MIB = 1 << 20


def _offloaded(log: str) -> tuple[int, int]:
    """llama-server's ``load_tensors: offloaded N/M layers to GPU`` (the model's, the first one)."""
    m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    assert m, log[-3000:]
    return int(m[1]), int(m[2])


# --- 1. a draft model's command for an older build: flags that build does not know -----------------------------


def test_a_draft_model_command_for_an_older_build_uses_flags_that_build_knows(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 4k -md gemma-3-270m-q4_k_m.gguf --llama-build
    b7847` (a build kvadvise models whole: planner/builds.py SUPPORTED_FROM = 7830, and names b7847 = a5bb8ba4, the
    llama.cpp Ollama vendored) prints ``llama-server ... -md ... --spec-type draft-simple --spec-draft-n-max 3 -ngld
    999``. runtime/llamaserver.py server_args writes ``--spec-type draft-simple`` and ``--spec-draft-n-max`` for every
    build (round 9 asked for them "for a build that needs it": b11312, whose speculative types default to none).

    Those flags are b11312's. At a5bb8ba4 (b7847; Ollama's vendored copy: `git show
    b1fccabb3^:llama/llama.cpp/common/common.h`, Makefile.sync FETCH_HEAD=a5bb8ba4) ``struct
    common_params_speculative`` has no speculative type at all and ``n_max = 16`` (the flag was ``--draft-max``): the
    parser stops at ``error: invalid argument: --spec-type`` (common/arg.cpp: an argument not in arg_to_options).
    Later, llama-cpp-python 0.3.20's llama.cpp (f49e9178) has ``--spec-type`` for the n-gram kinds only
    (``[none|ngram-cache|ngram-simple|ngram-map-k|ngram-map-k4v|ngram-mod]``; anything else throws "unknown
    speculative decoding type without draft model"), and still ``--draft-max``; ``--spec-draft-n-max`` and
    ``draft-simple`` arrive with 0.3.24's af6528e6d, which removes ``--draft-max``. So the command kvadvise prints for
    b7847 never starts. Expected: for a build before the speculative types, ``-md DRAFT`` with that build's own
    ``--draft-max N`` (a draft model alone turns speculative decoding on there), no ``--spec-type`` nor
    ``--spec-draft-n-max`` -- in the command and in the LLAMA_ARG_* env (an unknown variable is ignored, so
    LLAMA_ARG_SPEC_DRAFT_N_MAX would leave that build's 16 drafted tokens, not the 3 planned)."""
    rc, out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "4k", "-md", str(gemma_path),
        "--llama-build", "b7847", "--json",
    )  # fmt: skip
    assert rc == 0, err
    server = json.loads(out)["llama_server"]
    words = shlex.split(server["run_command"])
    assert "-md" in words, words
    assert "--spec-type" not in words and "--spec-draft-n-max" not in words, server["run_command"]


# --- 2. `kvadvise gguf --device cpu`: the flags leave -ngl to llama.cpp, whose default is every layer -------------


def test_a_cpu_plans_flags_keep_the_layers_on_the_cpu_on_a_machine_with_a_gpu(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise gguf MODEL --device cpu --ctx 4096` (a plan for the CPU: "on the CPU ... fits in RAM") prints
    ``Settings (llama.cpp): -c 4096 -np 1 -fa on -ctk f16 -ctv f16`` -- no -ngl. summary.llama_flags drops -ngl when
    no GPU is planned, "llama.cpp's default (no layers) says it". `kvadvise llamacpp MODEL --device cpu --ctx 4096`,
    the same question, prints ``... -ngl 0``.

    b11312's default is every layer, not none: common/common.h ``n_gpu_layers = -1; // -1 is auto``, and
    src/llama-model.cpp llama_model::n_gpu_layers() ``params.n_gpu_layers >= 0 ? params.n_gpu_layers :
    hparams.n_layer_all + 1``. On a machine with a GPU (here an rpc-server on loopback, a GPU-type device), the real
    llama-server started with exactly those flags logs ``offloaded 3/3 layers to GPU`` (a tiny 2-block llama): the whole
    model, its K/V and a compute buffer go to the card the user planned to leave alone; with ``-ngl 0`` (the llamacpp
    command) nothing is offloaded. Expected: a CPU plan's flags say ``-ngl 0`` (as the llamacpp command does), so that they run the
    CPU plan wherever they are run."""
    from llama_server_build import rpc_server

    model = write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=2000)
    rc, out, err = run(capsys, "gguf", str(model), "--device", "cpu", "--ctx", "4096", "--llama-build", "b11312")
    assert rc == 0, err
    lines = out.splitlines()
    flags = shlex.split(lines[lines.index("Settings (llama.cpp):") + 1])
    assert flags[:2] == ["-c", "4096"], flags
    with devices(rpc_server(), 1) as eps:
        log = run_server(real_llama_server, model, flags, eps)
    on_gpu, total = _offloaded(log)
    assert on_gpu == 0, f"the CPU plan's flags {flags} put {on_gpu}/{total} layers on the GPU"


# --- 3. -c 0 with several slots: llama-server's --fit gives each slot the training context ---------------------


def test_ctx_0_with_several_slots_runs_the_context_the_plan_sized(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp MODEL --ctx 0 -np 2 --device cpu` (docs: ``--ctx 0 = n_ctx_train``, the total over all
    sequences) plans n_ctx 8,192, n_ctx_seq 4,096 and K/V 4.00 MiB for a model trained on 8,192 tokens, and prints
    ``llama-server -m MODEL -c 0 -np 2 -fa on -ctk f16 -ctv f16 -ngl 0``.

    The real b11312 llama-server started with that command (--fit is on by default: common/arg.cpp, ``-c 0`` also
    sets fit_params_min_ctx = UINT32_MAX) logs ``common_params_fit_impl: context size unset and KV cache not unified
    -> using 16384 for 2 sequences``, ``llama_context: n_ctx = 16384``, ``n_ctx_seq = 8192`` and ``CPU KV buffer size =
    8.00 MiB``: common/fit.cpp resolves an unset context to ``n_ctx_train * n_streams`` (n_streams = n_seq_max without
    -kvu) before it measures anything, and keeps it (the fit then stops at "n_gpu_layers already set by user" without
    restoring it). So the command holds twice the K/V the plan sized (on a GPU: twice the KV of the budget). Expected:
    the command runs the plan's context (e.g. ``-c 8192``, the number kvadvise resolved), or the plan sizes what ``-c 0
    -np 2`` allocates."""
    model = write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=2000, n_ctx_train=8192)
    rc, out, err = run(
        capsys, "llamacpp", str(model), "--ctx", "0", "-np", "2", "--device", "cpu", "--llama-build", "b11312", "--json"
    )
    assert rc == 0, err
    doc = json.loads(out)
    planned_kv = doc["memory"]["kv_bytes"]
    cmd = shlex.split(doc["llama_server"]["run_command"])
    args = [a for i, a in enumerate(cmd[1:], 1) if a != "-m" and cmd[i - 1] != "-m"]
    # run as printed: --fit as llama-server's default (run_server adds `--fit off`, which the user's command lacks)
    log = run_server(real_llama_server, model, [*args, "--fit", "on"], [])
    n_ctx = re.search(r"llama_context: n_ctx\s+=\s+(\d+)", log)
    kv = re.search(r"CPU KV buffer size =\s+([\d.]+) MiB", log)
    assert n_ctx and kv, log[-3000:]
    assert int(n_ctx[1]) == doc["config"]["n_ctx"], (
        f"planned n_ctx {doc['config']['n_ctx']} (K/V {planned_kv / MIB:.2f} MiB); `{doc['llama_server']['run_command']}` "
        f"ran n_ctx {n_ctx[1]} (K/V {kv[1]} MiB)"
    )


# --- 4. a CPU plan with a projector: the command puts the projector on the GPU ----------------------------------


def test_a_cpu_plans_projector_stays_on_the_cpu_on_a_machine_with_a_gpu(
    tmp_path: Path, real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma3.gguf --mmproj mmproj.gguf --device cpu --ctx 1024` plans the projector on the CPU
    (``-v``: "projector 7.97 MiB --mmproj gemma3: weights 2.72 MiB + compute 5.25 MiB", all in RAM; the plan is "on
    the CPU") and prints ``llama-server -m gemma3.gguf -c 1024 -np 1 -fa on -ctk f16 -ctv f16 -ngl 0 --mmproj
    mmproj.gguf``. -ngl 0 keeps the text model's layers on the CPU, not the projector: mtmd offloads it to the first
    GPU whatever -ngl says (common/common.h ``mmproj_use_gpu = true``; common/arg.cpp ``--mmproj-offload`` /
    ``--no-mmproj-offload``, "whether to enable GPU offloading for multimodal projector (default: enabled)";
    tools/mtmd/clip.cpp: ``ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_GPU)`` when use_gpu). On a machine with
    a GPU (an rpc-server on loopback here) the real llama-server started with those flags logs ``CLIP using
    RPC0[127.0.0.1:PORT] backend``: the projector's weights and compute buffer go to the card the CPU plan leaves
    alone (for Gemma 3 27B's projector, some 800 MiB of weights and its compute buffer). Expected: a CPU plan's
    command keeps the projector on the CPU (``--no-mmproj-offload``, or ``-dev none``)."""
    from llama_server_build import rpc_server
    from tinymmproj import write_tiny_mmproj

    text = write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3", n_vocab=32000)
    proj = write_tiny_mmproj(
        tmp_path / "mmproj.gguf", n_embd_text=128, image_size=224, patch_size=14, n_embd=128, n_ff=512, n_head=4, pool=4
    )
    rc, out, err = run(
        capsys, "llamacpp", str(text), "--mmproj", str(proj), "--device", "cpu", "--ctx", "1024", "-fa", "on",
        "--llama-build", "b11312", "--json",
    )  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["memory"]["projector"] is not None and doc["config"]["device"] == "cpu", doc["config"]
    cmd = shlex.split(doc["llama_server"]["run_command"])
    args = [a for i, a in enumerate(cmd[1:], 1) if a != "-m" and cmd[i - 1] != "-m"]
    with devices(rpc_server(), 1) as eps:
        log = run_server(real_llama_server, text, args, eps)
    clip = re.search(r"CLIP using (\S+) backend", log)
    assert clip, log[-3000:]
    assert clip[1] == "CPU", f"`{doc['llama_server']['run_command']}` put the CPU plan's projector on {clip[1]}"


# --- 5. the Python API's llama_server_command for a plan that fits with --n-cpu-moe -------------------------------


def test_the_apis_llama_server_command_runs_the_plans_expert_placement(tmp_path: Path) -> None:
    """docs/python-api.md: ``plan = kvadvise.plan(...)`` then ``kvadvise.llama_server_command(MODEL, plan.config)``, "the
    llama-server command line for a config". For a MoE model planned with ``PlanRequest(n_cpu_moe=5)`` on a card that
    holds it only so (`kvadvise llamacpp moe.gguf --vram 420MiB --margin 0 --ctx 4096 --n-cpu-moe 5`: "fits 100% on
    the GPU", "the routed experts of 5 layers (120.0 MiB) in RAM"), ``to_json(plan)["llama_server"]["run_command"]``
    is ``... -ngl 999 --n-cpu-moe 5`` but ``llama_server_command(MODEL, plan.config)`` is ``... -ngl 999`` alone:
    api.llama_server_command calls command_text(model, config) with n_cpu_moe=0, and the RunConfig carries no trace of
    the placement (host_experts is False). Run as the API prints it, llama-server loads every expert on the GPU
    (common/arg.cpp: only ``--n-cpu-moe N`` adds the CPU buffer overrides), 120 MiB more than the budget the plan said
    fits. Expected: the API's command for a plan is the plan's command (the placement the plan was sized for), as
    ``--json`` prints it -- e.g. llama_server_command taking the Plan, or the config carrying --n-cpu-moe."""
    import kvadvise

    model = write_tiny_gguf(
        tmp_path / "moe.gguf", "qwen3moe", n_vocab=4000,
        dims=dict(n_layer=6, n_embd=512, n_ff_exp=512, n_expert=16, n_expert_used=2),
    )  # fmt: skip
    request = kvadvise.PlanRequest(
        vram_bytes=(420 * MIB,), margin_bytes=0, n_ctx=4096, n_cpu_moe=5, ram_bytes=16 << 30, llama_build="b11312"
    )
    plan = kvadvise.plan(str(model), request)
    assert plan.fits is True and plan.cpu_moe is not None and plan.cpu_moe.n_cpu_moe == 5
    printed = kvadvise.to_json(plan)["llama_server"]["run_command"]
    assert "--n-cpu-moe 5" in printed, printed
    # (fixed: llama_server_command takes the Plan, whose placement a RunConfig does not carry; docs/python-api.md)
    api = kvadvise.llama_server_command(str(model), plan)
    assert shlex.split(api)[1:] == shlex.split(printed)[1:], f"API: {api}\n--json: {printed}"
