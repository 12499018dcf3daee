"""One planning request, whatever the source: estimate a given config, or
recommend one, against the hardware at hand or a card planned for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvadvise.errors import ConfigError
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES, Budget, plan_budget
from kvadvise.planner.fitsplit import refit
from kvadvise.planner.hardware import Hardware, RpcHost
from kvadvise.planner.hostram import HostRam, plan_host_ram
from kvadvise.planner.memory import MemoryEstimate, RunConfig, auto_batched, estimate
from kvadvise.planner.policy import Policy
from kvadvise.planner.recommender import (
    Recommendation,
    cache_for_ctx,
    fixed_ctx_alternatives,
    recommend,
    refit_reason,
    wants_offload,
)

if TYPE_CHECKING:  # the speed model loads only for a plan with a GPU budget, the offload with --allow-cpu
    from kvadvise.planner.offload import CpuMoe, Offload
    from kvadvise.planner.prefill import PrefillEstimate
    from kvadvise.planner.speed import SpeedEstimate
    from kvadvise.planner.users import UsersAnswer


@dataclass(frozen=True, slots=True)
class HardwareRequest:
    """Which hardware to plan for: a named card, sizes given by hand, or the GPUs found."""

    gpu: str | None = None  # plan for a card from profiles/gpus.json
    vram_bytes: tuple[int, ...] | None = None  # budgets given by hand, one per GPU
    probe: bool = True  # else: no hardware (estimate only)
    bandwidth_bytes_per_s: int | None = None  # --bandwidth, with --vram
    rpc: tuple[RpcHost, ...] = ()  # --rpc HOST:PORT=SIZE: hosts of llama.cpp's RPC backend
    ram_bandwidth_bytes_per_s: int | None = None  # --ram-bandwidth: the system memory's (else measured)
    ram_bytes: int | None = None  # --ram SIZE: the system RAM a plan may use, in place of what is free now


@dataclass(frozen=True, slots=True)
class AdviceSummary:
    """A runtime's part of the short answer (kvadvise.summary): what to set, and the lines that go with it."""

    title: str  # "Settings (Ollama)"
    settings: tuple[str, ...]  # one line each, what the user sets
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    command: str | None = None  # the program's command line: the answer's last line (``| tail -1`` takes it)


@runtime_checkable
class RuntimeAdvice(Protocol):
    """What a runtime adds to a plan: its settings, warnings and files (kvadvise.runtimes; Ollama's is
    kvadvise.backends.ollama.advice.OllamaAdvice, llama-server's kvadvise.runtime.llamaserver.ServerAdvice)."""

    @property
    def key(self) -> str:
        """Its key in the plan's JSON document ("ollama", "llama_server")."""
        ...

    def json_doc(self) -> dict[str, object]: ...

    def summary(self) -> AdviceSummary: ...

    def text(self) -> str:
        """The whole advice, for --verbose."""
        ...

    def next_steps(self, written: Sequence[tuple[str, str]]) -> tuple[str, tuple[str, ...]]:
        """What to run to apply it, given the files written as (option, path): a title and the steps."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """A model, its recommended run configuration, the estimate and the hardware it is for."""

    spec: ModelSpec
    config: RunConfig
    estimate: MemoryEstimate
    hardware: Hardware | None
    budget: Budget | None
    fits: bool | None
    recommendation: Recommendation | None  # None when the user fixed --ctx
    notes: tuple[str, ...] = ()
    speed: SpeedEstimate | None = None  # decode estimate (a GPU plan that fits); with --ctx too
    # the best plan that runs when the GPUs alone do not fit (unless --gpu-only), or --allow-cpu's plan at
    # the target: what stays on the CPU
    offload: Offload | None = None
    prefill: PrefillEstimate | None = None  # prompt processing at the plan's context (a plan that fits)
    cpu_moe: CpuMoe | None = None  # --n-cpu-moe N: the experts kept in RAM, as planned
    ram: HostRam | None = None  # what the config keeps in system RAM, against the RAM (a plan with hardware)
    runtime: str = (
        "llama-server"  # the runtime it is for (kvadvise.runtime.seam): llama-server, llama-cli, library, ollama
    )
    n_ctx_requested: int | None = None  # the -c asked for (None: recommended), before llama.cpp pads it
    advice: RuntimeAdvice | None = None  # what that runtime adds: its settings, warnings, command
    users: UsersAnswer | None = None  # --users N: how many sessions of the context fit (kvadvise.planner.users)

    @property
    def partial(self) -> Offload | None:
        """The partial offload planned because the GPUs alone do not fit, whether it runs or not (the RAM may be
        short too); None when the plan's own config is what runs, or nothing was planned."""
        return self.offload if self.fits is False else None

    @property
    def offload_to_run(self) -> Offload | None:
        """The partial offload to run when the GPUs alone do not fit (None: the plan's own config)."""
        off = self.partial
        return off if off is not None and off.runnable else None

    @property
    def runnable(self) -> bool | None:
        """A plan that runs was printed: the config fits the GPUs and the RAM, or (when it does not fit the
        GPUs) its partial offload fits both. None without hardware (nothing to check against)."""
        if self.fits is None:
            return None
        if self.fits:
            return self.ram is None or self.ram.fits
        return self.offload is not None and self.offload.runnable


@dataclass(frozen=True, slots=True)
class MeasuredOverhead:
    """A device's fixed cost as ``verify --save-calibration`` measured it. Planning is pure:
    the caller reads the calibration store (kvadvise.runtime.calibration) and passes this in."""

    overhead_bytes: int
    source: str  # said in the plan's notes: what was measured, where and when


def hardware_for(req: HardwareRequest) -> Hardware | None:
    hw = _hardware_for(req)
    if hw is not None and req.ram_bandwidth_bytes_per_s:
        hw = replace(
            hw, ram_bandwidth_bytes_per_s=req.ram_bandwidth_bytes_per_s, ram_bandwidth_source="--ram-bandwidth"
        )
    return hw


def _hardware_for(req: HardwareRequest) -> Hardware | None:
    from kvadvise.planner import hardware

    if req.rpc:
        hw: Hardware | None = hardware.rpc_hosts(req.rpc)
    elif req.vram_bytes is not None:
        hw = hardware.manual_many(req.vram_bytes, req.bandwidth_bytes_per_s)
    elif req.gpu:
        hw = hardware.from_profiles(req.gpu)
    else:
        hw = hardware.probe() if req.probe else None
    if hw is not None and req.ram_bytes is not None:
        hw = hardware.with_ram(hw, req.ram_bytes)
    return hw


# Cards that llama.cpp does not run through CUDA: how it names their buffers, and what the plan assumes
BACKEND_PREFIX = {"rocm": "ROCm", "vulkan": "Vulkan", "sycl": "SYCL"}
BACKEND_NOTES = {
    "rocm": "ROCm: llama.cpp builds ggml-cuda with HIP, so the buffers are CUDA's (as published ROCm logs print "
    "them); the HIP runtime's own memory is taken to be CUDA's",
    "vulkan": "Vulkan: buffers planned with CUDA's rules (ggml-vulkan sizes its compute buffer its own way: an "
    "approximation); the speed uses factors fitted on Vulkan measurements",
    "sycl": "SYCL: buffers planned with CUDA's rules (ggml-sycl sizes its compute buffer its own way: an "
    "approximation); the speed uses the Vulkan factors (too few SYCL measurements)",
}


def check_projector(spec: ModelSpec, base: RunConfig) -> None:
    """A projector made for another model is refused before planning: llama-server exits when the width of
    its embeddings is not the text model's (tools/mtmd/mtmd.cpp mtmd_init_from_file: "mismatch between text
    model (n_embd = %d) and mmproj (n_embd = %d)", "you may be using wrong mmproj")."""
    p = base.mmproj
    if p is not None and p.n_embd_text and spec.n_embd and p.n_embd_text != spec.n_embd:
        raise ConfigError(
            f"--mmproj {p.source}: its {p.projector_type} projector makes embeddings of width {p.n_embd_text:,}; "
            f"{spec.name or spec.architecture} takes {spec.n_embd:,} (llama-server refuses the pair: "
            '"mismatch between text model and mmproj")',
            hint="give the mmproj-*.gguf published beside this model",
        )


def make_plan(
    spec: ModelSpec,
    base: RunConfig,
    *,
    recommend_ctx: bool,
    hw: Hardware | None,
    policy: Policy,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    measured_overhead: MeasuredOverhead | None = None,
    notes: tuple[str, ...] = (),
    prompt_tokens: int | None = None,
    n_cpu_moe: int = 0,
) -> Plan:
    """``recommend_ctx``: pick context, cache types and FA; else estimate ``base`` as given.

    ``measured_overhead`` replaces the default per-device overhead on a GPU plan (unless
    ``base`` sets one); ``notes`` are carried into the plan (e.g. why a calibration was skipped).
    ``prompt_tokens``: the prompt the prefill estimate times (default 4k); ``n_cpu_moe``: llama.cpp's
    --n-cpu-moe N, planned as given (kvadvise.planner.offload.cpu_moe_placement).
    """
    check_projector(spec, base)
    if not recommend_ctx:
        notes = (*notes, *past_training_context(spec, base))
    if n_cpu_moe:
        return _with_cpu_moe(
            spec,
            base,
            n_cpu_moe,
            recommend_ctx=recommend_ctx,
            hw=hw,
            policy=policy,
            margin_bytes=margin_bytes,
            measured_overhead=measured_overhead,
            notes=notes,
            prompt_tokens=prompt_tokens,
        )
    budget = (
        plan_budget(hw, margin_bytes, spec=spec, headless=policy.headless, weights_uncertain=policy.weights_uncertain)
        if hw is not None
        else None
    )
    if hw is not None and hw.gpus and base.overhead_bytes is None and measured_overhead is not None:
        base = replace(base, overhead_bytes=measured_overhead.overhead_bytes)
        notes = (
            *notes,
            f"overhead {measured_overhead.overhead_bytes / (1 << 20):,.0f} MiB from {measured_overhead.source}",
        )
    n_gpu = len(budget.device_free) if budget is not None else 0
    if base.tensor_split and len(base.tensor_split) != max(1, n_gpu):
        raise ConfigError(
            f"--tensor-split has {len(base.tensor_split)} shares for {max(1, n_gpu)} GPU(s)",
            hint="one share per GPU, e.g. --gpu rtx-3090x2 -ts 3,1",
        )
    if budget is not None and budget.device == "rpc" and hw is not None and not base.rpc_servers:
        # llama-server --rpc HOST:PORT,...: each host a device, named as llama.cpp prints it
        base = replace(
            base,
            rpc_servers=tuple(g.rpc_endpoint or "" for g in hw.gpus),
            device_names=tuple(g.name for g in hw.gpus),
        )
    if budget is not None and budget.device == "cuda" and budget.backend in BACKEND_PREFIX and not base.device_names:
        # an AMD or Intel card: its buffers are named after its backend (ROCm0, Vulkan0, SYCL0)
        prefix = BACKEND_PREFIX[budget.backend]
        base = replace(base, device_names=tuple(f"{prefix}{i}" for i in range(max(1, budget.n_gpu))))
        notes = (*notes, BACKEND_NOTES[budget.backend])
    if budget is not None and budget.device == "cuda" and hw is not None and len(hw.gpus) == 1 and hw.gpus[0].index:
        # one card of several (llama.cpp -dev CUDA1): its buffers are named by its own index
        prefix = BACKEND_PREFIX.get(budget.backend, "CUDA")
        base = replace(base, device_names=(f"{prefix}{hw.gpus[0].index}",))
    if budget is not None and n_gpu > 1 and not base.tensor_split:
        # several GPUs and no -ts: llama.cpp splits the layers by each device's free memory
        # (llama_model::load_tensors); in GiB, so the command can state the same split (-ts); where that
        # leaves a device short, its --fit moves layers between them (kvadvise.planner.fitsplit)
        base = replace(base, tensor_split=tuple(round(f / (1 << 30), 2) for f in budget.device_free))
        policy = replace(policy, fit_split=True)
    if recommend_ctx and budget is not None:
        rec = recommend(spec, base, budget, policy)
        prefill = _prefill(spec, rec.config, budget, rec.fits, prompt_tokens, rec.offload)
        ram = plan_host_ram(spec, rec.config, rec.estimate, budget) if rec.fits else None
        return Plan(
            spec, rec.config, rec.estimate, hw, budget, rec.fits, rec, notes, rec.speed, rec.offload,
            prefill=prefill, ram=ram,
        )  # fmt: skip
    cfg = replace(base, device=budget.device) if budget is not None and base.device == "auto" else base
    if cfg.device == "auto":
        cfg = replace(cfg, device="cpu")
    cfg = auto_batched(cfg, spec.n_ctx_train)  # the batch the runtime picks for the context asked
    if budget is not None and policy.fixed_kv is None:  # --ctx alone: the cache type is still the policy's
        cfg, chosen = cache_for_ctx(spec, cfg, budget, policy)
        notes = (*notes, *chosen)
    est = estimate(spec, cfg)
    fits = budget.fits(est) if budget is not None else None
    if budget is not None and not fits and policy.fit_split:  # the --ctx as given, layers moved as --fit moves them
        moved = refit(spec, cfg, budget, as_run=policy.fit_as_run)
        if moved is not None:
            notes = (*notes, refit_reason(cfg.tensor_split, moved.cfg.tensor_split))
            cfg, est = moved.cfg, moved.estimate
            fits = budget.fits(est)  # pipelined, a little above what --fit measured (fitsplit)
    speed = None
    if fits and budget is not None:
        from kvadvise.planner.recommender import decode_speed

        speed = decode_speed(spec, cfg, budget)[2]
    offload = None
    if budget is not None and not fits:
        alt = fixed_ctx_alternatives(spec, cfg, budget, policy)
        notes = (*notes, alt) if alt else notes
        if wants_offload(policy, False, False):  # the --ctx as given, with part of the model on the CPU
            from kvadvise.planner.offload import plan_offload

            n_seq = max(1, (cfg.n_ctx or spec.n_ctx_train) // max(1, cfg.n_parallel))  # -c 0: the training context
            kv = (cfg.type_k, cfg.type_v)
            offload, why = plan_offload(spec, replace(cfg, n_ctx=0), budget, n_seq, kv, policy)
            notes = (*notes, *why)
    prefill = _prefill(spec, cfg, budget, fits, prompt_tokens, offload) if budget is not None else None
    ram = plan_host_ram(spec, cfg, est, budget) if budget is not None and fits else None
    return Plan(spec, cfg, est, hw, budget, fits, None, notes, speed, offload, prefill=prefill, ram=ram)


def past_training_context(spec: ModelSpec, cfg: RunConfig) -> tuple[str, ...]:
    """A note when the context asked for a sequence is past the one the model was trained on. llama-server (and
    llama-cli, its context since #17824) caps each slot there (tools/server/server-context.cpp load_model: "the
    slot context (%d) exceeds the training context of the model (%d) - capping"): the cache past it is allocated
    and no request can use it. The library only warns (llama_context: "possible training context overflow")."""
    n_par = max(1, cfg.n_parallel)
    # a unified cache (-kvu) is one pool the slots share: each is capped at n_ctx_train, all of it used while
    # the slots together hold up to n_parallel x n_ctx_train (server-context.cpp n_ctx_slot)
    n_seq = -(-cfg.n_ctx // n_par) if cfg.kv_unified else cfg.n_ctx // n_par
    if not spec.n_ctx_train or n_seq <= spec.n_ctx_train:
        return ()
    past = f"{n_seq:,} tokens a sequence is past the {spec.n_ctx_train:,} {spec.name} was trained on"
    longer = (
        f"a longer context needs RoPE scaling (--rope-scaling yarn --rope-scale F --yarn-orig-ctx "
        f"{spec.n_ctx_train}) and --override-kv {spec.architecture}.context_length=int:N"
    )
    if cfg.runtime == "library":
        return (f"{past}: llama.cpp warns of a training context overflow, and past it the output degrades; {longer}",)
    return (
        f"{past}: {cfg.runtime} caps each slot at {spec.n_ctx_train:,} (server-context.cpp load_model), the cache "
        f"past it is allocated and never used; --ctx {spec.n_ctx_train * max(1, cfg.n_parallel)} is what runs; "
        f"{longer}",
    )


def _prefill(
    spec: ModelSpec,
    cfg: RunConfig,
    budget: Budget,
    fits: bool | None,
    prompt_tokens: int | None,
    offload: Offload | None,
    n_cpu_moe: int = 0,
) -> PrefillEstimate | None:
    """The prompt-processing estimate of a plan that fits, or of its partial offload."""
    from kvadvise.planner.prefill import plan_prefill

    if offload is not None:
        n_ctx = offload.n_ctx * max(1, cfg.n_parallel)
        at = replace(cfg, n_ctx=n_ctx, type_k=offload.type_k, type_v=offload.type_v)
        return plan_prefill(
            spec,
            at,
            budget,
            prompt_tokens=prompt_tokens,
            n_cpu_moe=offload.n_cpu_moe,
            n_cpu_layers=offload.n_cpu_layers,
            cpu_output=offload.output_on_host,
        )
    if not fits:
        return None
    return plan_prefill(spec, cfg, budget, prompt_tokens=prompt_tokens, n_cpu_moe=n_cpu_moe)


def _with_cpu_moe(
    spec: ModelSpec,
    base: RunConfig,
    n_cpu_moe: int,
    *,
    recommend_ctx: bool,
    hw: Hardware | None,
    policy: Policy,
    margin_bytes: int,
    measured_overhead: MeasuredOverhead | None,
    notes: tuple[str, ...],
    prompt_tokens: int | None,
) -> Plan:
    """A plan with ``--n-cpu-moe N``: the GPUs' memory planned for the model as they hold it (the experts of
    the first N layers in RAM), the estimate shown for the whole model, the speeds with those experts read
    and copied from RAM."""
    from kvadvise.planner.memory import OP_OFFLOAD_DEVICES, OP_OFFLOAD_MIN_BATCH
    from kvadvise.planner.offload import cpu_moe_placement, with_cpu_moe
    from kvadvise.planner.speed import plan_decode

    if not spec.n_expert or not spec.expert_bytes:
        raise ConfigError(
            f"--n-cpu-moe {n_cpu_moe}: {spec.name} has no routed experts to keep on the CPU",
            hint="--n-cpu-moe is for MoE models; a dense model's layers stay on the CPU with -ngl",
        )
    device = "cpu" if hw is None or not hw.gpus else ("metal" if any(g.unified_memory for g in hw.gpus) else "cuda")
    if hw is not None and hw.gpus and all(g.rpc_endpoint for g in hw.gpus):
        device = "rpc"  # ggml-rpc has no offload_op: the experts run in CPU splits, no weight is copied in
    placement = cpu_moe_placement(spec, n_cpu_moe, device, base.n_ubatch, mtp=base.mtp)
    offloads = device in OP_OFFLOAD_DEVICES and base.n_ubatch >= OP_OFFLOAD_MIN_BATCH
    inner = make_plan(
        placement.gpu_spec,
        replace(
            base,
            op_offload_copy_bytes=placement.op_offload_bytes or 0,
            host_experts=device != "cpu" and not offloads and bool(placement.expert_layers),
            pipeline=base.pipeline and n_cpu_moe == 0,  # --n-cpu-moe N is a tensor override, even over no experts
        ),
        recommend_ctx=recommend_ctx,
        hw=hw,
        policy=policy,
        margin_bytes=margin_bytes,
        measured_overhead=measured_overhead,
        notes=notes,
    )
    if inner.budget is not None and inner.fits is False and inner.offload is not None:
        # the experts of N layers in RAM are not enough: the plan that runs is the whole model's partial offload
        # (more experts on the CPU, as without --n-cpu-moe); the one searched on placement.gpu_spec counted
        # neither the N layers' experts in RAM nor their reads (its RAM 13-38 GB short, its decode up to 3x)
        whole = make_plan(
            spec,
            base,
            recommend_ctx=recommend_ctx,
            hw=hw,
            policy=policy,
            margin_bytes=margin_bytes,
            measured_overhead=measured_overhead,
            notes=notes,
            prompt_tokens=prompt_tokens,
        )
        kept = f"the experts of {whole.offload.n_cpu_moe} layers" if whole.offload and whole.offload.n_cpu_moe else ""
        said = f"--n-cpu-moe {n_cpu_moe} does not fit the GPU" + (
            f": the plan that runs keeps {kept} on the CPU" if kept else ": the plan that runs is the whole model's"
        )
        return replace(whole, notes=(*whole.notes, said))
    est = with_cpu_moe(inner.estimate, placement)
    size = placement.host_bytes
    shown = f"{size / (1 << 30):.2f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):,.1f} MiB"
    moved = (
        f"--n-cpu-moe {n_cpu_moe}: the routed experts of {len(placement.expert_layers)} layers "
        f"({shown}) in RAM (llama.cpp's CPU buffer), the rest as -ngl places it"
    )
    if not offloads and placement.expert_layers and device != "cpu":
        moved += (
            "; they run in CPU splits (no op offload on this device), and the first device's compute buffer grows "
            "at each boundary (an estimate)"
        )
    if placement.op_offload_bytes:
        moved += (
            f"; the first GPU's compute buffer holds a copy of the largest of them during its layer's matmul "
            f"({placement.op_offload_bytes / (1 << 20):,.1f} MiB, op offload, an estimate)"
        )
    speed = prefill = None
    if inner.budget is not None and inner.fits:
        speed = plan_decode(spec, inner.config, inner.budget, n_cpu_moe=n_cpu_moe)
        prefill = _prefill(spec, inner.config, inner.budget, True, prompt_tokens, None, n_cpu_moe)
    rec = inner.recommendation
    if rec is not None:
        rec = replace(
            rec,
            estimate=est,
            speed=speed,
            decode_tokens_per_s=speed.points[-1][1] if speed is not None else None,
            speed_note=f"{speed.text()}; {speed.note}" if speed is not None else None,
        )
    # the experts in RAM are the host's: with_cpu_moe put them in the estimate's host weights
    ram = plan_host_ram(spec, inner.config, est, inner.budget) if inner.budget is not None and inner.fits else None
    return replace(
        inner,
        spec=spec,
        estimate=est,
        recommendation=rec,
        speed=speed,
        prefill=prefill,
        cpu_moe=placement,
        ram=ram,
        notes=(*inner.notes, moved),
    )
