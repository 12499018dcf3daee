"""Round 11b of the red team (a reviewer in its own worktree): the verifiers -- `verify llamacpp --log` fed the log
of a load that failed, of another context or another model, or of an older build; `--save-calibration`; and
`--timeout` across verify's own retries. Each test reproduces one defect of the code at 903e9c4 and fails there;
its docstring gives the command, what happened, what should, and the evidence."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from attack_helpers import no_internal_error, no_server, run  # noqa: F401  (no_server: an autouse fixture)
from tinymodels import write_tiny_gguf

MIB = 1 << 20
GPU = "NVIDIA GeForce RTX 4090"

# A b11312 llama-server's load of a tiny qwen3 (3 layers with the output, 2 KV layers) on one CUDA GPU, as
# tools/server/server-context.cpp, src/llama-model.cpp (load_tensors), src/llama-context.cpp and
# src/llama-kv-cache.cpp print it (the lines a real CPU run of the suite's llama-server printed, CUDA's buffer names)
LOAD_HEAD = (
    "0.00.018.830 I cmn  common_param: common_params_print_info: build 11312 (0c1e570) with GNU 12.2.0 for Linux "
    "x86_64\n"
    "0.00.027.088 I srv    load_model: loading model '{model}'\n"
    "0.00.033.067 I load_tensors: offloading output layer to GPU\n"
    "0.00.033.088 I load_tensors: offloading 1 repeating layers to GPU\n"
    "0.00.033.088 I load_tensors: offloaded 3/3 layers to GPU\n"
    "0.00.033.090 I load_tensors:   CPU_Mapped model buffer size =     0.07 MiB\n"
    "0.00.033.091 I load_tensors:        CUDA0 model buffer size =     0.81 MiB\n"
    "0.00.034.346 I llama_context: n_ctx                 = {n_ctx}\n"
    "0.00.034.346 I llama_context: n_ctx_seq             = {n_ctx}\n"
    "0.00.034.349 I llama_context: flash_attn            = enabled\n"
    "0.00.034.695 I llama_context:  CUDA_Host  output buffer size =     0.00 MiB\n"
)


def _kv(n_ctx: int) -> str:
    mib = n_ctx / 1024  # 2 layers x 256 (K) + 256 (V) f16 values per token: 1 KiB a token
    return (
        f"0.00.034.900 I llama_kv_cache:      CUDA0 KV buffer size = {mib:8.2f} MiB\n"
        f"0.00.034.901 I llama_kv_cache: size = {mib:7.2f} MiB ({n_ctx:6d} cells,   2 layers,  1/1 seqs), "
        f"K (f16): {mib / 2:7.2f} MiB, V (f16): {mib / 2:7.2f} MiB\n"
    )


def _ok_tail() -> str:
    return (
        "0.00.035.817 I sched_reserve:      CUDA0 compute buffer size =     6.26 MiB\n"
        "0.00.035.818 I sched_reserve:  CUDA_Host compute buffer size =     0.02 MiB\n"
        "0.00.036.000 I srv    load_model: initializing slots, n_slots = 1\n"
        "0.00.036.100 I srv  llama_server: model loaded\n"
    )


def _log(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server.log"
    p.write_text(text)
    return p


# --- 1. verify --log: a load that failed is "fits: 100% GPU", exit 0 ------------------------------------------

# what a b11312 llama-server printed, verbatim but for its timestamps, when the compute buffer (CUDA) or the KV cache
# (the suite's real llama-server, run on the CPU under `ulimit -v 300000` at -c 1048576) could not be allocated
OOM_CUDA = (
    "0.00.040.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 34.50 MiB on device 0: cudaMalloc "
    "failed: out of memory\n"
    "0.00.040.001 E ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 36175872\n"
    "0.00.040.002 E graph_reserve: failed to allocate compute buffers\n"
    "0.00.040.003 E llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers\n"
    "0.00.040.004 E cmn  common_init_: failed to create context with model '{model}'\n"
    "0.00.040.005 E srv    load_model: failed to create_context with model '{model}'\n"
    "0.00.040.006 I srv    operator(): operator(): cleaning up before exit...\n"
    "0.00.040.007 E srv  llama_server: exiting due to model loading error\n"
)
OOM_CPU = (
    "0.00.018.830 I cmn  common_param: common_params_print_info: build 11312 (0c1e570) with GNU 12.2.0 for Linux "
    "x86_64\n"
    "0.00.027.088 I srv    load_model: loading model '{model}'\n"
    "0.00.033.088 I load_tensors: offloaded 3/3 layers to GPU\n"
    "0.00.033.090 I load_tensors:   CPU_Mapped model buffer size =     0.88 MiB\n"
    "0.00.034.346 I llama_context: n_ctx                 = 1048576\n"
    "0.00.034.346 I llama_context: n_ctx_seq             = 1048576\n"
    "0.00.034.695 I llama_context:        CPU  output buffer size =     0.00 MiB\n"
    "0.00.138.640 E ggml_aligned_malloc: insufficient memory (attempted to allocate 1024.00 MB)\n"
    "0.00.138.692 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 1073741824\n"
    "0.00.138.693 E alloc_tensor_range: failed to allocate CPU buffer of size 1073741824\n"
    "0.00.142.048 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n"
    "0.00.142.100 E cmn  common_init_: failed to create context with model '{model}'\n"
    "0.00.142.105 E srv    load_model: failed to create_context with model '{model}'\n"
    "0.00.142.109 I srv    operator(): operator(): cleaning up before exit...\n"
    "0.00.143.041 E srv  llama_server: exiting due to model loading error\n"
)


@pytest.mark.parametrize("which", ["cuda-compute", "cpu-kv"])
def test_a_log_of_a_load_that_ran_out_of_memory_is_a_failed_verification(
    which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 32768 -fa on --log server.log` where the log is that of a
    llama-server whose load failed: the weights and the KV cache were allocated, then `cudaMalloc failed: out of
    memory` / `failed to allocate compute pp buffers` / `exiting due to model loading error` (the server is not
    running). kvadvise prints the table (compute "measured 0") and the verdict "fits: 100% GPU, 0 layers on CPU",
    exit 0; for the CPU log (a real one: the suite's llama-server under `ulimit -v`, KV allocation failed) "ran
    on the CPU: ...", exit 0. backends/llamacpp/commands.py _from_log keeps every buffer line of the last load and
    never looks at whether the load ended in an error; verification.compare decides on the offload line alone.
    The launch path says the same run failed (runners._failure_reason: exit 3, "llama-server stopped while
    loading"). Upstream: src/llama-context.cpp throws "failed to allocate compute pp buffers" (graph_reserve
    failed), tools/server/server.cpp SRV_ERR("exiting due to model loading error"). docs/exit-codes.md: 3 is "a
    verification failed (llama.cpp crashed, ran out of memory, ...)", 0 is "verify: it fits as predicted".
    Expected: exit 3 with a verdict that says the load failed, never "fits"."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    if which == "cuda-compute":
        text = LOAD_HEAD.format(model=model, n_ctx=32768) + _kv(32768) + OOM_CUDA.format(model=model)
        ctx = "32768"
    else:
        text = OOM_CPU.format(model=model)
        ctx = "1048576"
    rc, out, err = run(
        capsys, "verify", "llamacpp", str(model), "--ctx", ctx, "-fa", "on", "--log", str(_log(tmp_path, text))
    )
    no_internal_error(rc, err)
    assert rc == 3, (rc, out, err)
    assert "fits: 100% GPU" not in out and "ran on the CPU: the result covers" not in out, out


# --- 2. verify --log: another context than the plan's passes ---------------------------------------------------


def test_a_log_of_another_context_than_the_plans_is_not_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 32768 -fa on --log server.log` where the server's last load ran
    `-c 4096` (`llama_context: n_ctx = 4096`, a KV cache of 4,096 cells: the user's service file still has the
    old -c, or --fit shrank it): exit 0, "fits: 100% GPU, 0 layers on CPU", with "KV cache differs from the
    prediction by -28.00 MiB" as a side note. The context asked for was never loaded, so nothing shows that it
    fits; a user reads "fits" and raises the service's -c to 32768. commands.py _from_log reads n_ctx into the
    measurement and verification.compare never compares it (nor the KV cache) with the plan. `--attach` compares
    the same thing and fails (serverport.attach_checks: "its context per slot is 4,096, the plan's 32,768", exit
    3), as `verify ollama` does for another context (docs/commands.md: "3 when it ... runs another context").
    docs/exit-codes.md: verify's 0 is "it fits as predicted". Expected: exit 3 and a verdict that names the
    context the server ran beside the plan's."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    text = LOAD_HEAD.format(model=model, n_ctx=4096) + _kv(4096) + _ok_tail()
    rc, out, err = run(
        capsys, "verify", "llamacpp", str(model), "--ctx", "32768", "-fa", "on", "--log", str(_log(tmp_path, text))
    )
    no_internal_error(rc, err)
    assert rc == 3, (rc, out)
    assert "fits: 100% GPU" not in out, out


# --- 3. verify --log: the log of another model ---------------------------------------------------------------


def test_a_log_of_another_model_is_not_compared_as_this_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 -fa on --log server.log` where the log is of a server that
    loaded another file (`load_model: loading model '/models/Qwen3-8B-Q4_K_M.gguf'`, 37/37 layers and 4.4 GiB of
    CUDA0 weights: the log of the other service on the box, or of the model before the one being planned): exit
    0, "fits: 100% GPU, 0 layers on CPU", the 8B's buffers in the "measured" column against the tiny model's
    prediction. _from_log never reads which model the log loaded, although llama-server prints it at every load
    (tools/server/server-context.cpp: SRV_INF("loading model '%s'"), kvadvise's own llamalog.LOAD_MARKER).
    `--attach` checks it (serverport.attach_checks: "it serves X, not Y", exit 3). Expected: the other model
    said, and no pass (exit 3, or 2 for a log that is not this model's)."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    text = (
        "build: 11312 (0c1e570) with GNU 12.2.0 for Linux x86_64\n"
        "srv    load_model: loading model '/models/Qwen3-8B-Q4_K_M.gguf'\n"
        "load_tensors: offloaded 37/37 layers to GPU\n"
        "load_tensors:   CPU_Mapped model buffer size =   333.84 MiB\n"
        "load_tensors:        CUDA0 model buffer size =  4455.35 MiB\n"
        "llama_context: n_ctx                 = 4096\n"
        "llama_context:  CUDA_Host  output buffer size =     0.58 MiB\n"
        "llama_kv_cache:      CUDA0 KV buffer size =   576.00 MiB\n"
        "llama_kv_cache: size =  576.00 MiB (  4096 cells,  36 layers,  1/1 seqs), K (f16):  288.00 MiB, "
        "V (f16):  288.00 MiB\n"
        "sched_reserve:      CUDA0 compute buffer size =   304.75 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =    16.01 MiB\n"
    )
    rc, out, err = run(
        capsys, "verify", "llamacpp", str(model), "--ctx", "4096", "-fa", "on", "--log", str(_log(tmp_path, text))
    )
    no_internal_error(rc, err)
    assert rc != 0, out
    assert "Qwen3-8B-Q4_K_M.gguf" in out + err, (out, err)


# --- 4. --save-calibration: the host's buffers are taken off the GPU's overhead --------------------------------


def test_the_calibrated_overhead_counts_only_the_gpus_buffers(gemma_path: Path) -> None:
    """`kvadvise verify llamacpp gemma-3-270m-q4_k_m.gguf --ctx 4096 -fa on --save-calibration` on an RTX 4090
    where the run used 400 MiB of device memory beyond llama.cpp's GPU buffers (CUDA context, cuBLAS, pools):
    the stored overhead is about 222 MiB, not 400. runtime/calibration.py from_verification subtracts every
    buffer the log printed (`weights_bytes` is the sum of all "model buffer" lines, `compute_bytes` of all
    "compute buffer" lines) from NVML's device figure, the host's too: the CPU_Mapped weights (llama.cpp keeps the
    input layer, token_embd, on the CPU: src/llama-model.cpp "there is very little benefit to offloading the input
    layer, so always keep it on the CPU") and the CUDA_Host compute buffer, neither of which is device memory.
    For Gemma 3's 262k vocabulary that is 170 MiB; for a 70B with a 128k vocabulary the token_embd alone is
    ~550 MiB, and the overhead is clamped to 0. Later plans for that GPU use it (docs/commands.md: "later plans
    for that GPU use it"): the plan promises ~180-550 MiB the card does not have. Expected: the overhead is NVML's
    figure less the GPU's own buffers (400 MiB here, to the MiB)."""
    from kvadvise.backends.gguf_cache import read
    from kvadvise.model.architecture import from_gguf
    from kvadvise.planner.hardware import Gpu, Hardware
    from kvadvise.planner.memory import RunConfig
    from kvadvise.planner.planning import make_plan
    from kvadvise.planner.policy import Policy
    from kvadvise.runtime import calibration
    from kvadvise.runtime.llamalog import parse
    from kvadvise.runtime.verification import compare, measurement_from_log

    spec = from_gguf(read(gemma_path))
    hw = Hardware((Gpu(0, GPU, 24564 * MIB, 24000 * MIB, 0, None, None),), 1 << 36, 1 << 35, "nvml")
    plan = make_plan(
        spec, RunConfig(n_ctx=4096, flash_attn="on", device="cuda"), recommend_ctx=False, hw=hw, policy=Policy()
    )
    est = plan.estimate
    (dev,) = est.devices
    host_weights = est.weights_bytes - dev.weights_bytes  # token_embd, CPU_Mapped
    host_compute = est.compute_bytes - dev.compute_bytes  # CUDA_Host
    assert host_weights > 100 * MIB and host_compute > 0
    log = parse(
        [
            "load_tensors: offloaded 19/19 layers to GPU",
            f"load_tensors:   CPU_Mapped model buffer size = {host_weights / MIB:8.2f} MiB",
            f"load_tensors:        CUDA0 model buffer size = {dev.weights_bytes / MIB:8.2f} MiB",
            f"llama_kv_cache:      CUDA0 KV buffer size = {dev.kv_bytes / MIB:8.2f} MiB",
            f"sched_reserve:      CUDA0 compute buffer size = {dev.compute_bytes / MIB:8.2f} MiB",
            f"sched_reserve:  CUDA_Host compute buffer size = {host_compute / MIB:8.2f} MiB",
        ]
    )
    gpu_buffers = dev.weights_bytes + dev.kv_bytes + dev.compute_bytes
    m = measurement_from_log(
        log,
        runner="llama-server",
        build="b11312 (0c1e570)",
        n_ctx=4096,
        device_used_bytes=gpu_buffers + 400 * MIB,  # NVML: the GPU's buffers and 400 MiB of CUDA's own
        prompt_tokens_per_s=None,
        decode_tokens_per_s=None,
    )
    v = compare(plan, m)
    assert v.fits, v.verdict
    cal = calibration.from_verification(v, GPU)
    assert cal.overhead_bytes is not None
    assert abs(cal.overhead_bytes - 400 * MIB) <= MIB, cal.overhead_bytes / MIB


# --- 5. --log --save-calibration: a measured overhead erased --------------------------------------------------


def test_saving_a_log_without_a_device_figure_keeps_the_measured_overhead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an RTX 4090 whose overhead `verify llamacpp ... --save-calibration` measured (400 MiB, build b11312),
    `kvadvise verify llamacpp q3.gguf --ctx 4096 -fa on --log server.log --save-calibration` (a b11312 log):
    "calibration for NVIDIA GeForce RTX 4090 saved", and the measured overhead is gone: `calibration show` lists
    one entry with `overhead_bytes: null`, and later plans fall back to the default overhead without a word. A log
    has no device figure (NVML is not read: _from_log passes device_used_bytes=None, so from_verification stores
    overhead None), and calibration.save replaces the entry of the same device and build whatever it holds.
    docs/commands.md: --save-calibration "stores the measured device overhead ... later plans for that GPU use
    it". Expected: the measured 400 MiB kept (an entry that measured no overhead does not replace one that did,
    or --log with --save-calibration says it has nothing to store)."""
    from kvadvise.planner import hardware
    from kvadvise.planner.hardware import Gpu, Hardware
    from kvadvise.runtime import calibration

    calibration.save(
        calibration.Calibration(
            GPU, "b11312 (0c1e570)", "llama-server", 400 * MIB, 1.0, "tiny-qwen3", "-c 4096", "2026-01-01T00:00:00Z"
        )
    )
    assert calibration.measured_overhead(GPU)[0] is not None
    gpu = Hardware((Gpu(0, GPU, 24564 * MIB, 24000 * MIB, 0, None, None),), 1 << 36, 1 << 35, "nvml")
    monkeypatch.setattr(hardware, "probe", lambda: gpu)
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    text = LOAD_HEAD.format(model=model, n_ctx=4096) + _kv(4096) + _ok_tail()
    rc, out, err = run(
        capsys,
        "verify",
        "llamacpp",
        str(model),
        "--ctx",
        "4096",
        "-fa",
        "on",
        "--log",
        str(_log(tmp_path, text)),
        "--save-calibration",
    )
    no_internal_error(rc, err)
    kept = calibration.measured_overhead(GPU)[0]
    assert kept is not None and kept.overhead_bytes == 400 * MIB, (kept, out, err)


# --- 6. --timeout: one deadline, not one per retry ----------------------------------------------------------

AMX_THEN_HANG = """\
import os, signal, sys, time
if "--no-repack" in sys.argv:
    time.sleep(60)  # the second run never becomes ready
    sys.exit(0)
sys.stdout.write("load_tensors:          AMX model buffer size =     9.05 MiB\\n")
sys.stdout.flush()
time.sleep(2.5)  # most of the --timeout, then llama.cpp#20824's fault at the warmup
os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_the_timeout_is_one_deadline_across_the_no_repack_retry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 --llama-server ./llama-server --timeout 3` with a llama-server
    that prints its AMX model buffer, dies of SIGSEGV 2.5 s later (ggml-org/llama.cpp#20824) and, run again with
    --no-repack, never becomes ready: kvadvise returns after about 5.5 s, not 3. backends/llamacpp/runners.py
    measure_with_server retries (at most three runs: without --fit/-lv, with --no-repack) and hands each run the
    whole timeout_s (`_measure_with_server(..., timeout_s=timeout_s)`, a fresh `deadline = time.monotonic() +
    timeout_s`); measure_with_python does the same for its --no-repack rerun. docs/commands.md: the child is
    killed on "`--timeout SECONDS` (a total deadline for the whole run; default 600)"; a default of 600 s can
    thus take 30 minutes. `verify quality` keeps one Deadline over all its runs (perplexity.measure). Expected:
    stopped at the --timeout given (3 s, with a second for the stop), exit 3."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    script = tmp_path / "fake_server.py"
    script.write_text(AMX_THEN_HANG)
    server = tmp_path / "llama-server"
    server.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    server.chmod(0o755)
    t0 = time.monotonic()
    rc, _out, err = run(
        capsys, "verify", "llamacpp", str(model), "--ctx", "4096", "--llama-server", str(server), "--timeout", "3"
    )
    elapsed = time.monotonic() - t0
    no_internal_error(rc, err)
    assert "AMX" in err, err  # the retry this test is about did run
    assert rc == 3, (rc, err)
    assert elapsed < 4.5, f"--timeout 3 stopped after {elapsed:.1f} s"


# --- 7. an older build's KV line: K and V "measured 0" ----------------------------------------------------------


def test_an_older_builds_kv_summary_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 -fa on --log server.log --json` with the log of a llama-server
    of mid-2025 (b5898, before n_stream): its KV summary reads `llama_kv_cache_unified: size = 4.00 MiB ( 4096
    cells, 2 layers, 1 seqs), K (f16): 2.00 MiB, V (f16): 2.00 MiB`. kvadvise prints "K cache 2.00 MiB predicted,
    0 measured, -2.00 MiB" (JSON measured.k_bytes 0, v_bytes 0): advisor/runtime/llamalog.py _KV_SUMMARY takes
    only the later `1/1 seqs` spelling. Upstream: src/llama-kv-cache-unified.cpp of that time printed
    "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs), K (%s): ..." (n_seq_max alone; "%2u/%u seqs" came
    with n_stream); tests/data/published/038-rocm-qwen3-14b-q8-b5898-... holds such a line from a real b5898 run
    (ROCm/ROCm#5104). The module's docstring and docs/commands.md say --log reads the formats builds have
    printed. Expected: measured K and V of 2 MiB each, as the line says."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    text = (
        "build: 5898 (cbc68be5) with cc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0 for x86_64-linux-gnu\n"
        f"srv    load_model: loading model '{model}'\n"
        "load_tensors: offloaded 3/3 layers to GPU\n"
        "load_tensors:   CPU_Mapped model buffer size =     0.07 MiB\n"
        "load_tensors:        CUDA0 model buffer size =     0.81 MiB\n"
        "llama_context: n_ctx         = 4096\n"
        "llama_context: flash_attn    = 1\n"
        "llama_context:  CUDA_Host  output buffer size =     0.00 MiB\n"
        "llama_kv_cache_unified:      CUDA0 KV buffer size =     4.00 MiB\n"
        "llama_kv_cache_unified: size =    4.00 MiB (  4096 cells,   2 layers,  1 seqs), K (f16):    2.00 MiB, "
        "V (f16):    2.00 MiB\n"
        "llama_context:      CUDA0 compute buffer size =     6.26 MiB\n"
        "llama_context:  CUDA_Host compute buffer size =     0.02 MiB\n"
    )
    rc, out, err = run(
        capsys,
        "verify",
        "llamacpp",
        str(model),
        "--ctx",
        "4096",
        "-fa",
        "on",
        "--log",
        str(_log(tmp_path, text)),
        "--json",
    )
    no_internal_error(rc, err)
    measured = json.loads(out)["measured"]
    assert (measured["k_bytes"], measured["v_bytes"]) == (2 * MIB, 2 * MIB), measured


# --- 8. the build of the last load, not the first in the log --------------------------------------------------


def test_the_build_is_that_of_the_last_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 -fa on --log <(journalctl -u llama-server) --json` where the
    journal holds a start of b5898 and, after an upgrade, a start of b11312 whose load is the last: kvadvise says
    "measured with llama-server (its log) (b5898 (cbc68be5) ...)", re-plans for b5898's rules (JSON config
    llama_build 5898) and a --save-calibration would file the entry under b5898. commands.py _from_log compares
    the last load (after the last "load_model: loading model") but takes the build with build_from_log(text),
    the first "build: N (hash)" of the whole text. Expected: the build printed before the last load, b11312."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    old = (
        "build: 5898 (cbc68be5) with cc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0 for x86_64-linux-gnu\n"
        f"srv    load_model: loading model '{model}'\n"
        "load_tensors: offloaded 3/3 layers to GPU\n"
        "load_tensors:        CUDA0 model buffer size =     0.81 MiB\n"
        "llama_kv_cache_unified:      CUDA0 KV buffer size =     4.00 MiB\n"
        "llama_context:      CUDA0 compute buffer size =    10.26 MiB\n"
        "srv  llama_server: received signal 15, terminating\n"
    )
    text = old + LOAD_HEAD.format(model=model, n_ctx=4096) + _kv(4096) + _ok_tail()
    rc, out, err = run(
        capsys,
        "verify",
        "llamacpp",
        str(model),
        "--ctx",
        "4096",
        "-fa",
        "on",
        "--log",
        str(_log(tmp_path, text)),
        "--json",
    )
    no_internal_error(rc, err)
    doc = json.loads(out)
    assert doc["measured"]["llama_cpp_build"].startswith("b11312"), doc["measured"]["llama_cpp_build"]
