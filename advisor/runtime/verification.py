"""Verification: what a real llama.cpp run allocated, against the prediction.

A runner (backends/llamacpp.py: the user's llama-server, or llama-cpp-python
in a child process) loads the model, runs a short benchmark and hands back
its log; this module turns the log into a Measurement and compares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvadvise.planner.planning import Plan
from kvadvise.planner.repack import EXTRA_BUFFERS
from kvadvise.runtime.llamalog import MIB, LoadLog, is_host

# "build: 7000 (0c1e570) with ..." (older builds), "common_params_print_info: build 1 (0c1e570) with ..."
# (a build from a source tarball without git says "build 0 (unknown)")
BUILD = re.compile(r"\bbuild(?: info)?:?\s+(\d+)\s*\(([0-9a-f]+|unknown)\)")


@dataclass(frozen=True, slots=True)
class Measurement:
    """What a real llama.cpp allocated and how fast it ran."""

    runner: str  # "llama-server" | "llama-cpp-python"
    backend: str  # "CUDA" | "CPU" | ... from the buffer names
    llama_cpp_build: str
    k_bytes: int
    v_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    weights_bytes: int
    compute_bytes: int
    output_bytes: int
    device_used_bytes: int | None  # NVML: used after load - used before; None without a GPU
    prompt_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    n_ctx: int | None
    gpu_layers: int | None  # "offloaded N/M layers to GPU"
    total_layers: int | None
    repack_bytes: int = 0  # CPU_REPACK and AMX: CPU-only copies of some quantized matrices, inside weights_bytes
    # False: llama.cpp ran without the CPU's extra buffer types (AMX, CPU_REPACK), as llama-server --no-repack does:
    # with them it crashed (kvadvise.backends.llamacpp.runners.measure_with_python)
    extra_bufts: bool = True
    prompt_tokens: int | None = None  # the prompt prompt_tokens_per_s timed (llama-server's timings.prompt_n)
    # every load's "offloaded N/M layers to GPU", in order (a server woken from idle loads again)
    placements: tuple[tuple[int, int], ...] = ()
    # the buffers on the GPUs alone (not CPU, CPU_Mapped, CUDA_Host...): what NVML's figure holds besides the
    # context's own memory (kvadvise.runtime.calibration); None where not read
    gpu_buffer_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ByteErrors:
    """measured - predicted, per component (bytes)."""

    k_bytes: int
    v_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    weights_bytes: int
    compute_bytes: int
    output_bytes: int


@dataclass(frozen=True, slots=True)
class Verification:
    """A plan beside its measurement, with the differences."""

    plan: Plan
    measured: Measurement
    error: ByteErrors
    fits: bool
    verdict: str
    reasons: tuple[str, ...]
    # kvadvise's prefill estimate for the measured prompt on the plan's hardware (kvadvise.planner.prefill)
    prompt_estimate_tokens_per_s: float | None = None
    # the plan's decode estimate for what the runner timed: llama-server's figure holds the CPU's sampling, the
    # llama-cpp-python probe's (llama_decode alone) does not (kvadvise.planner.speed.sampling_seconds)
    decode_estimate_tokens_per_s: float | None = None


def _b(mib: float) -> int:
    return round(mib * MIB)


def measurement_from_log(
    log: LoadLog,
    *,
    runner: str,
    build: str,
    n_ctx: int | None,
    device_used_bytes: int | None,
    prompt_tokens_per_s: float | None,
    decode_tokens_per_s: float | None,
    prompt_tokens: int | None = None,
) -> Measurement:
    """Sizes as llama.cpp printed them (to 0.01 MiB)."""
    gpu = sorted({b.buft.rstrip("0123456789") for b in log.buffers if not is_host(b.buft) or b.buft.endswith("_Host")})
    backend = "/".join(x.removesuffix("_Host") for x in gpu if not x.endswith("_Host")) or "CPU"
    return Measurement(
        runner=runner,
        backend=backend,
        llama_cpp_build=build,
        k_bytes=_b(sum(s.k_mib for s in log.kv)),
        v_bytes=_b(sum(s.v_mib for s in log.kv)),
        kv_bytes=_b(log.mib("KV")),
        recurrent_bytes=_b(log.mib("RS")),
        weights_bytes=_b(log.mib("model")),
        compute_bytes=_b(log.mib("compute")),
        output_bytes=_b(log.mib("output")),
        device_used_bytes=device_used_bytes,
        prompt_tokens_per_s=prompt_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        n_ctx=n_ctx,
        gpu_layers=log.gpu_layers,
        total_layers=log.total_layers,
        repack_bytes=_b(sum(b.mib for b in log.buffers if b.kind == "model" and b.buft in EXTRA_BUFFERS)),
        prompt_tokens=prompt_tokens,
        placements=log.placements,
        gpu_buffer_bytes=_b(sum(b.mib for b in log.buffers if not is_host(b.buft))),
    )


def planned_gpu_layers(plan: Plan) -> int | None:
    """The layers the plan puts on the GPUs, as "offloaded N/M layers to GPU" counts them (None: a CPU plan)."""
    if plan.offload is not None:
        return plan.offload.n_gpu_layers
    if plan.estimate.layout.device not in ("cuda", "metal", "rpc"):
        return None
    return sum(d.n_layers for d in plan.estimate.devices)


def placement_drift(plan: Plan, placements: tuple[tuple[int, int], ...]) -> str | None:
    """What a run's loads say against the plan's placement: a later load with fewer GPU layers than the first
    (a server woken from idle re-runs --fit and may place fewer, with a silent slowdown: llama.cpp#24684;
    the fix, PR #27807, was closed unmerged), or a load with fewer than planned. None: no drift."""
    if not placements:
        return None
    seen = ", then ".join(f"{g}/{t}" for g, t in placements)
    first = placements[0][0]
    if any(g < first for g, _ in placements[1:]):
        return (
            f"placement drifted: the server loaded {seen} layers on the GPU; a server woken from idle "
            "(--sleep-idle-seconds) re-runs --fit and may place fewer layers, about 20 % slower (llama.cpp#24684); "
            "give -c and -ngl explicitly, as kvadvise's command does, so that a wake loads the same placement"
        )
    planned = planned_gpu_layers(plan)
    if planned is not None and placements[-1][0] < planned:
        return f"placement differs from the plan: the server loaded {seen} layers on the GPU, the plan {planned}"
    return None


def build_from_log(text: str, fallback: str) -> str:
    """The build of the last start in ``text`` (a journal holds every start: an upgrade's is the later one)."""
    found = BUILD.findall(text)
    return f"b{found[-1][0]} ({found[-1][1]})" if found else fallback


def compare(plan: Plan, m: Measurement) -> Verification:
    est = plan.estimate
    err = ByteErrors(
        k_bytes=m.k_bytes - est.k_bytes,
        v_bytes=m.v_bytes - est.v_bytes,
        kv_bytes=m.kv_bytes - est.kv_bytes,
        recurrent_bytes=m.recurrent_bytes - est.recurrent_bytes,
        weights_bytes=m.weights_bytes - est.weights_bytes,
        compute_bytes=m.compute_bytes - est.compute_bytes,
        output_bytes=m.output_bytes - est.output_bytes,
    )
    reasons: list[str] = []
    on_gpu = m.backend != "CPU"
    if on_gpu:
        all_on_gpu = m.gpu_layers is not None and m.gpu_layers == m.total_layers
        within = True
        if plan.budget is not None and m.device_used_bytes is not None:
            within = m.device_used_bytes <= plan.budget.free_bytes
            reasons.append(
                f"device memory used by the run: {m.device_used_bytes / MIB:,.0f} MiB of {plan.budget.free_bytes / MIB:,.0f} MiB free"
            )
        fits = all_on_gpu and within
        cpu_layers = (m.total_layers or 0) - (m.gpu_layers or 0)
        verdict = "fits: 100% GPU, 0 layers on CPU" if fits else f"does not fit: {cpu_layers} layers on the CPU"
        if all_on_gpu and not within:
            verdict = "does not fit: device memory went past what was free"
        if m.gpu_layers is None or m.total_layers is None:  # a log cut before load_tensors' "offloaded N/M" line
            verdict = "not verified: the run's output does not say how many layers it offloaded (load_tensors)"
    elif est.layout.device in ("cuda", "metal", "rpc"):
        # the plan is for a GPU, the run used none (a CPU-only build, no driver, or no device it could
        # use): the buffers are not the ones the plan predicts, and nothing was shown to fit
        fits = False
        verdict = (
            f"not verified: the plan is for {est.layout.device} but llama.cpp ran on the CPU "
            "(a CPU-only build, or no GPU it could use)"
        )
    else:
        fits = True
        verdict = "ran on the CPU: the result covers CPU buffers only (no GPU in this run)"
    if m.repack_bytes or est.repack_bytes:
        reasons.append(
            f"weights include {m.repack_bytes / MIB:,.2f} MiB of CPU_REPACK and AMX (predicted "
            f"{est.repack_bytes / MIB:,.2f} MiB, {plan.config.cpu_repack} layouts): llama.cpp's repacked copies of "
            "some quantized matrices for faster CPU matmuls, anonymous memory beside the mapped file"
        )
    drift = placement_drift(plan, m.placements)
    if drift is not None:
        reasons.append(drift)
    if abs(err.kv_bytes) > MIB // 100:
        reasons.append(f"KV cache differs from the prediction by {err.kv_bytes / MIB:+.2f} MiB")
    return Verification(
        plan, m, err, fits, verdict, tuple(reasons), _prompt_estimate(plan, m), _decode_estimate(plan, m)
    )


def _decode_estimate(plan: Plan, m: Measurement) -> float | None:
    """The plan's decode estimate as the runner times it: without the sampling for the llama-cpp-python probe,
    which decodes fixed tokens and never samples (backends/llamacpp/probe.py)."""
    sp = plan.speed
    if m.decode_tokens_per_s is None or sp is None or not sp.tokens_per_s:
        return None
    if m.runner == "llama-server":
        return sp.tokens_per_s
    from kvadvise.planner.speed import sampling_seconds

    t = 1 / sp.tokens_per_s - sampling_seconds(plan.spec, penalties=plan.config.sampling_penalties)
    return 1 / t if t > 0 else None


def _prompt_estimate(plan: Plan, m: Measurement) -> float | None:
    """kvadvise's prefill estimate for the prompt the run timed, on the plan's hardware (None: unknown)."""
    if m.prompt_tokens_per_s is None or not m.prompt_tokens or plan.budget is None:
        return None
    from kvadvise.planner.prefill import plan_prefill

    est = plan_prefill(plan.spec, plan.config, plan.budget, prompt_tokens=m.prompt_tokens)
    return est.tokens_per_s if est is not None else None
