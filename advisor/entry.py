"""The one planning entry: :func:`plan_for` answers a :class:`~kvadvise.request.PlanRequest` for a model
on a runtime. The command line (every backend's command), the Python API and the several-model modes call
it; the runtime (kvadvise.runtime.seam) says what it changes about the question.

What is read from the machine is read here, once, and passed down, so the planner stays pure: the
hardware (NVML, or the card planned for), a calibration ``verify --save-calibration`` stored for this
GPU, the llama.cpp build on PATH, this CPU's repack rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.request import PlanRequest, check

MIB = 1 << 20

if TYPE_CHECKING:
    from kvadvise.model.projector import ProjectorSpec
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Gpu, Hardware
    from kvadvise.planner.planning import HardwareRequest, MeasuredOverhead, Plan
    from kvadvise.planner.policy import Policy
    from kvadvise.planner.quality import MeasuredQuality
    from kvadvise.runtime.llamabuild import BuildChoice
    from kvadvise.runtime.seam import Runtime, Shaped


def plan_for(
    spec: ModelSpec,
    request: PlanRequest,
    runtime: Runtime | None = None,
    *,
    hardware: Hardware | None = None,
    found_build: BuildChoice | None = None,
) -> Plan:
    """The plan for ``spec`` asked by ``request`` on ``runtime`` (default: llama-server).

    ``hardware``: the machine when the caller has it already (the API's ``hardware=``); else the request
    says (``gpu``, ``vram_bytes``, ``rpc``) or this machine is probed. ``found_build``: the llama.cpp build
    the caller found itself (verify: the binary it runs), used where the request says ``auto``."""
    from kvadvise.runtime.seam import refuse

    if runtime is None:
        from kvadvise.runtime.llamaserver import LlamaServer

        runtime = LlamaServer()
    check(request)
    if request.users:
        return _plan_users(spec, request, runtime, hardware=hardware, found_build=found_build)
    refuse(runtime, request)
    shaped = runtime.shape(spec, request)
    spec = shaped.spec or spec  # the model as the runtime loads it
    check(shaped.request)
    hw = hardware if hardware is not None else hardware_of(shaped.request)
    if hardware is None and hw is not None:  # (compare checks its cards together: check_margin)
        check_margin(shaped.request.margin_bytes, hw.gpus)
    if hardware is not None and shaped.request.ram_bandwidth_gbs is not None:
        hw = replace(
            hardware,
            ram_bandwidth_bytes_per_s=int(shaped.request.ram_bandwidth_gbs * 1e9),
            ram_bandwidth_source="--ram-bandwidth",
        )
    if hardware is not None and hw is not None and shaped.request.ram_bytes:  # the request's --ram, as the command's
        from kvadvise.planner.hardware import with_ram

        hw = with_ram(hw, shaped.request.ram_bytes)
    from kvadvise.planner.hardware import PROBED_SOURCES

    # this machine: probed here, or by the API's probe_hardware() (its calibration, "no GPU found")
    probed = _probes(shaped.request) and (hardware is None or hardware.source in PROBED_SOURCES)
    hw, no_gpu = without_gpu(shaped.request, hw) if probed else (hw, None)
    check_machine(shaped.request, hw, runtime=runtime.name)
    hw = with_backend(shaped.request, hw)
    # once: it may run a binary; a build the runtime pins (Ollama's, by its version) is not KVADVISE_LLAMA_BUILD's
    build = _llama_build(spec, shaped.request, runtime, shaped.build or found_build, pinned=shaped.build is not None)
    if shaped.build is None:  # llama.cpp's own programs (Ollama runs its engines' models whatever it pins)
        from kvadvise.planner.builds import check_architecture

        check_architecture(spec.architecture, build[0])
    plan = _plan(spec, shaped, runtime, hw, probed=probed, build=build)

    def replan(alone: Hardware) -> Plan:
        narrowed = replace(shaped, request=replace(shaped.request, tensor_split=()))
        return _plan(spec, narrowed, runtime, alone, probed=probed, build=build)

    if not shaped.request.tensor_split:  # -ts: the split was asked for, as given
        plan = runtime.place(plan, replan)
    if shaped.notes or no_gpu:
        plan = replace(plan, notes=(*plan.notes, *shaped.notes, *((no_gpu,) if no_gpu else ())))
    return runtime.advise(plan, shaped.request)


def _plan_users(
    spec: ModelSpec,
    request: PlanRequest,
    runtime: Runtime,
    *,
    hardware: Hardware | None,
    found_build: BuildChoice | None,
) -> Plan:
    """--users N: the plan for N slots (-np N), and the answer of kvadvise.planner.users on the plan's own
    config and budget (its cache types, batch, GPUs): do N sessions of the context per slot fit, how many
    would, one slot each and unified. Where a unified cache holds more and the runtime passes -kvu (not
    Ollama), the plan is made again with it."""
    from kvadvise.planner.users import users_per_card

    asked = replace(request, users=0, n_parallel=request.users)
    plan = plan_for(spec, asked, runtime, hardware=hardware, found_build=found_build)
    if plan.budget is None:
        return plan
    n = request.users
    if request.n_ctx is not None or plan.recommendation is None:
        n_ctx_user = max(1, plan.config.n_ctx // max(1, plan.config.n_parallel))  # --ctx is over all slots
    else:
        n_ctx_user = plan.recommendation.target_ctx  # --target-ctx, --use, else the policy's, per slot
    allowed = "kv_unified" not in runtime.refused
    users_spec = plan.spec  # the model as the runtime loads it (Shaped.spec)
    if request.n_cpu_moe:  # the sessions on the GPUs as the plan holds the model: the experts of N layers in RAM
        from kvadvise.planner.offload import cpu_moe_placement

        users_spec = cpu_moe_placement(
            plan.spec, request.n_cpu_moe, plan.config.device, plan.config.n_ubatch, mtp=plan.config.mtp
        ).gpu_spec
    answer = users_per_card(
        users_spec,
        plan.config,
        plan.budget,
        n,
        n_ctx_user,
        unified_allowed=allowed,
        unified_given=request.kv_unified,
        decode=not request.n_cpu_moe,  # the concurrent decode model reads every weight from the GPUs
    )
    if answer.chosen.kv_unified and not request.kv_unified:
        plan = plan_for(spec, replace(asked, kv_unified=True), runtime, hardware=hardware, found_build=found_build)
    return replace(plan, users=answer)


def _probes(r: PlanRequest) -> bool:
    """This machine's GPUs are what the plan is for (not a card named, sizes given, RPC hosts, or none)."""
    return not r.gpu and r.vram_bytes is None and not r.rpc and not r.no_hardware


def hardware_request(r: PlanRequest) -> HardwareRequest:
    from kvadvise.planner.planning import HardwareRequest

    return HardwareRequest(
        gpu=r.gpu,
        vram_bytes=r.vram_bytes,
        rpc=r.rpc,
        probe=not r.no_hardware,
        bandwidth_bytes_per_s=None if r.bandwidth_gbs is None else int(r.bandwidth_gbs * 1e9),
        ram_bandwidth_bytes_per_s=None if r.ram_bandwidth_gbs is None else int(r.ram_bandwidth_gbs * 1e9),
        ram_bytes=r.ram_bytes,
    )


def hardware_of(r: PlanRequest) -> Hardware | None:
    """The machine the request plans for: the cards named, the sizes given, the RPC hosts, or this one."""
    from kvadvise.planner.planning import hardware_for

    return hardware_for(hardware_request(r))


# --device rocm|vulkan: the ggml backend that runs a discrete GPU (the memory rules stay the discrete GPU's,
# RunConfig.device "cuda": ROCm is ggml-cuda built with HIP; Vulkan is planned with them, BACKEND_NOTES)
GPU_BACKENDS = ("rocm", "vulkan")


def run_device(device: str) -> str:
    """The memory model's device for ``--device``: a discrete GPU of any backend is planned as "cuda"."""
    return "cuda" if device in GPU_BACKENDS else device


def without_gpu(r: PlanRequest, hw: Hardware | None) -> tuple[Hardware | None, str | None]:
    """A GPU backend asked for (``--device cuda|rocm|vulkan|metal``) where this machine's probe found no GPU: no
    budget, an estimate (as ``--no-hardware``), and the note that says so. The system RAM was taken as the
    GPU's budget ("-ngl 999 ... FITS") beside the probe's "planning for the CPU"."""
    if hw is None or hw.gpus or r.device not in ("cuda", "metal", *GPU_BACKENDS):
        return hw, None
    why = hw.notes[0].split(";")[0] if hw.notes else "none"
    return None, (
        f"--device {r.device}: no GPU found here ({why}): estimated without a budget; --gpu NAME or --vram SIZE "
        "plans it against one, --device cpu against the RAM"
    )


def check_margin(margin_bytes: int, gpus: Sequence[Gpu]) -> None:
    """A margin the size of the largest card leaves no plan to make: a mistyped unit, refused, not a question of fit
    (where the cards' memory is known; the default margin on a 1 GiB card is a plan that does not fit: exit 3)."""
    from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES

    biggest = max((g.total_bytes for g in gpus), default=0)
    if biggest and margin_bytes >= biggest and margin_bytes != DEFAULT_MARGIN_BYTES:
        raise InputError(
            f"--margin {margin_bytes / MIB:,.0f} MiB is the whole card ({biggest / MIB:,.0f} MiB): nothing is left "
            "for the model",
            hint="--margin is what stays free on each GPU, e.g. --margin 1GiB (llama.cpp's -fitt default)",
        )


def check_machine(r: PlanRequest, hw: Hardware | None, *, runtime: str = "llama-server") -> None:
    """A machine that cannot exist is refused: ``--device metal`` on an NVIDIA card, ``--device cuda`` on an
    Apple chip or an AMD or Intel card (Metal runs only on Apple Silicon, CUDA only on NVIDIA cards), ``--device
    rocm`` on a card that is not AMD's (HIP runs AMD cards), ``--device vulkan`` on an Apple chip (llama.cpp runs
    Metal there); NVIDIA and AMD cards in one llama.cpp process other than through Vulkan (Ollama runs a
    llama-server per GPU library, and is not refused)."""
    if hw is not None and runtime != "ollama" and r.device != "vulkan":
        _one_gpu_library(hw)
    if hw is None or r.device not in ("cuda", "metal", *GPU_BACKENDS):
        return
    for g in hw.gpus:
        if r.device == "metal" and g.backend != "metal":
            what = "a --vram budget is a discrete GPU's" if hw.source == "manual" else f"{g.name} is not an Apple GPU"
            raise InputError(
                f"--device metal: {what} (Metal runs on Apple Silicon)",
                hint="drop --device, or plan an Apple chip by name (`kvadvise gpus` lists them: --gpu m4-max-64gb)",
            )
        if r.device in ("cuda", "vulkan") and g.backend == "metal":
            raise InputError(
                f"--device {r.device}: {g.name} runs Metal, not {r.device.upper() if r.device == 'cuda' else 'Vulkan'}",
                hint="drop --device, or use --device metal",
            )
        # a --vram budget has no vendor: any backend may run it
        if r.device == "rocm" and g.backend not in ("rocm", "vulkan") and hw.source != "manual":
            raise InputError(
                f"--device rocm: {g.name} is not an AMD GPU (ROCm/HIP runs AMD cards)",
                hint="drop --device, or use --device vulkan (any vendor) or cuda",
            )
        # CUDA runs NVIDIA cards only (an AMD card runs the same ggml-cuda code through HIP: --device rocm)
        if r.device == "cuda" and g.backend not in ("cuda", "metal") and hw.source != "manual":
            raise InputError(
                f"--device cuda: {g.name} is not an NVIDIA GPU (CUDA runs NVIDIA cards)",
                hint="drop --device, or use --device " + ("rocm or vulkan" if g.backend == "rocm" else "vulkan"),
            )


def _one_gpu_library(hw: Hardware) -> None:
    """CUDA and ROCm cards together: one llama.cpp build cannot hold both backends (both compile ggml-cuda;
    built together HIP's symbols win and the CUDA device is gone, ggml-org/llama.cpp#29048), and a process with
    both would name them CUDA0 and ROCm0, not the CUDA0/CUDA1 split or `-dev ROCm1` a plan of both made."""
    nvidia = next((g.name for g in hw.gpus if g.backend == "cuda"), None)
    amd = next((g.name for g in hw.gpus if g.backend == "rocm"), None)
    if nvidia and amd and hw.source != "manual":
        raise InputError(
            f"{nvidia} (CUDA) and {amd} (ROCm) cannot run in one llama.cpp process: a build holds CUDA or HIP, "
            "not both (llama.cpp#29048)",
            hint="--device vulkan runs both; or plan one card (--gpu NAME), or each apart (kvadvise compare)",
        )


def with_backend(r: PlanRequest, hw: Hardware | None) -> Hardware | None:
    """``--device rocm|vulkan``: every GPU runs on that backend (its buffers are named after it, ROCm0/Vulkan0,
    and its speed uses that backend's factors, kvadvise.planner.speed.EFFICIENCY); otherwise the GPUs keep
    theirs (a catalogue card's profiles/gpus.json "backend", a --vram budget's CUDA)."""
    if hw is None or r.device not in GPU_BACKENDS:
        return hw
    return replace(hw, gpus=tuple(_catalogue_class(replace(g, backend=r.device)) for g in hw.gpus))


def _catalogue_class(gpu: Gpu) -> Gpu:
    """A card given by size and bandwidth on a backend whose catalogue cards of that size and bandwidth share one
    decode class (profiles/gpus.json speed_class): that class. 32 GiB at 1,024 GB/s on ROCm is an MI50/MI60
    (gfx906), which decodes at about half the share of its bandwidth RDNA cards reach (kvadvise.planner.speed)."""
    from kvadvise.planner.gpus import load_profiles

    if gpu.speed_class or not gpu.bandwidth_bytes_per_s:
        return gpu
    bw = gpu.bandwidth_bytes_per_s
    classes = {
        p.speed_class or ""
        for p in load_profiles()
        if p.backend == gpu.backend
        and abs(p.usable_bytes - gpu.total_bytes) <= p.usable_bytes // 20  # within 5 %
        and abs(p.bandwidth_bytes_per_s - bw) <= p.bandwidth_bytes_per_s // 50  # within 2 %
    }
    if len(classes) != 1 or not (cls := classes.pop()):
        return gpu
    return replace(gpu, speed_class=cls)


def policy_of(
    r: PlanRequest,
    runtime: Runtime,
    *,
    weights_uncertain: bool = False,
    quality: MeasuredQuality | None = None,
    ctx_floor: int = 0,
    expert_offload: bool = True,
    output_first: bool | None = None,
    expert_overflow: bool = False,
) -> Policy:
    """The recommender's policy for the request on ``runtime``; ``quality``: what `verify quality` measured
    on the model (kvadvise.runtime.qualitycache), if anything."""
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.policy import Policy, load_use_cases, needs_opt_in

    fixed = None
    if r.type_k or r.type_v:
        fixed = (cache_type(r.type_k or "f16"), cache_type(r.type_v or "f16"))
    return Policy(
        fixed_kv=fixed,
        target_ctx=r.target_ctx or (load_use_cases()[r.use] if r.use else 0),
        min_ctx=r.min_ctx,
        ctx_floor=ctx_floor,
        expert_offload=expert_offload,
        expert_overflow=expert_overflow and expert_offload,
        output_first=output_first,
        repeatable=r.repeatable,
        allow_cpu=r.allow_cpu,
        same_type_kv=runtime.same_type_kv,
        fit_as_run=getattr(runtime, "states_split", True),  # optional: kvadvise.runtime.seam.LlamaCppRuntime
        use=r.use,
        allow_q4=r.allow_q4 or (fixed is not None and needs_opt_in(fixed)),
        weights_uncertain=weights_uncertain,
        headless=r.headless,
        gpu_only=r.gpu_only,
        quality=quality,
    )


def _plan(
    spec: ModelSpec,
    shaped: Shaped,
    runtime: Runtime,
    hw: Hardware | None,
    *,
    probed: bool,
    build: tuple[int | None, tuple[str, ...]],
) -> Plan:
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.memory import RunConfig, flash_attn_note
    from kvadvise.planner.planning import make_plan

    r = shaped.request
    measured, notes = _calibration(hw.gpus[0].name if probed and hw is not None and hw.gpus else None)
    llama_build, build_notes = build
    kv = (cache_type(r.type_k or "f16"), cache_type(r.type_v or "f16"))
    base = RunConfig(
        n_ctx=r.n_ctx or 0,
        n_parallel=r.n_parallel,
        kv_unified=r.kv_unified,
        n_batch=r.n_batch,
        n_ubatch=r.n_ubatch,
        type_k=kv[0],
        type_v=kv[1],
        flash_attn=r.flash_attn,
        swa_full=r.swa_full,
        device=run_device(r.device),
        device_names=_backend_names(r, hw),
        overhead_bytes=r.overhead_bytes,
        runtime=runtime.program,
        n_outputs_max=r.n_outputs_max,
        tensor_split=r.tensor_split,
        cpu_repack=_cpu_repack(r.cpu_repack),
        mmproj=_projector(r.mmproj),
        draft=r.draft,
        type_k_draft=cache_type(r.type_k_draft),
        type_v_draft=cache_type(r.type_v_draft),
        mtp=r.spec_type == "draft-mtp",
        spec_draft_n_max=r.spec_draft_n_max,
        llama_build=llama_build,
        sampling_penalties=r.sampling_penalties,
        embeddings=shaped.embeddings,
        auto_batch=shaped.auto_batch(hw) if shaped.auto_batch is not None else (),
    )
    policy = policy_of(
        r,
        runtime,
        weights_uncertain=shaped.weights_uncertain,
        quality=_measured_quality(spec, llama_build),
        ctx_floor=shaped.ctx_floor,
        expert_offload=shaped.expert_offload,
        output_first=shaped.output_first,
        expert_overflow=shaped.expert_overflow,
    )
    plan = make_plan(
        spec,
        base,
        recommend_ctx=r.n_ctx is None,
        hw=hw,
        policy=policy,
        margin_bytes=r.margin_bytes + shaped.extra_margin_bytes,
        measured_overhead=measured,
        notes=(*notes, *build_notes),
        prompt_tokens=r.prompt_tokens,
        n_cpu_moe=r.n_cpu_moe,
    )
    if base.mtp:
        from kvadvise.render import mtp_note

        # what turning MTP off buys: the same search without the MTP context (only when kvadvise picks -c)
        plain_ctx = None
        if r.n_ctx is None and plan.fits:
            plain = make_plan(
                spec,
                replace(base, mtp=False),
                recommend_ctx=True,
                hw=hw,
                policy=replace(policy, quality=None),  # as it has been: the search without the measured quality
                margin_bytes=r.margin_bytes + shaped.extra_margin_bytes,
                measured_overhead=measured,
                n_cpu_moe=r.n_cpu_moe,
            )
            plain_ctx = plain.config.n_ctx if plain.fits else None
        plan = replace(plan, notes=(*plan.notes, mtp_note(spec, plan.config, plan.estimate, plain_ctx)))
    fa_note = flash_attn_note(spec, plan.config)
    plan = replace(plan, runtime=runtime.name, n_ctx_requested=r.n_ctx)
    return replace(plan, notes=(*plan.notes, fa_note)) if fa_note else plan


def _backend_names(r: PlanRequest, hw: Hardware | None) -> tuple[str, ...]:
    """``--device rocm|vulkan`` without a card (``--no-hardware``, none found): the one device named after the
    backend asked for (ROCm0, Vulkan0), as make_plan names a card's; a card's own names come from its budget."""
    from kvadvise.planner.planning import BACKEND_PREFIX

    if r.device not in GPU_BACKENDS or (hw is not None and hw.gpus):
        return ()
    return (f"{BACKEND_PREFIX[r.device]}0",)


def _llama_build(
    spec: ModelSpec, r: PlanRequest, runtime: Runtime, found: BuildChoice | None, *, pinned: bool = False
) -> tuple[int | None, tuple[str, ...]]:
    """--llama-build: the build the plan follows (kvadvise.runtime.llamabuild) and what the plan says about it;
    for an unknown build and llama-server, how much more an older server's logits would take."""
    import os

    from kvadvise.runtime import llamabuild

    option, source = r.llama_build, "--llama-build"
    if option == "auto" and not pinned:  # KVADVISE_LLAMA_BUILD, as --llama-build's default reads it: the API alike
        raw = os.environ.get(llamabuild.ENV, "")
        if raw:
            llamabuild.check_env(raw)
            source = llamabuild.ENV
        option = raw.strip() or "auto"
    choice = found if found is not None and option == "auto" else llamabuild.choose(option, source=source)
    more = None
    if choice.build is None and runtime.program != "library" and r.n_outputs_max is None:
        rows = min(r.n_ubatch, r.n_batch) - r.n_parallel
        more = 4 * rows * spec.n_vocab / (1 << 20) if rows > 0 else None
    return choice.build, llamabuild.notes(choice, runtime=runtime.program, older_server_mib=more)


def _projector(path: str | ProjectorSpec | None) -> ProjectorSpec | None:
    """--mmproj FILE: the projector's header (a local file, as llama-server's --mmproj takes it)."""
    if path is None or not isinstance(path, str):
        return path
    from kvadvise.model.gguf import read_file
    from kvadvise.model.projector import projector_from_gguf

    return projector_from_gguf(read_file(path))


def _cpu_repack(rule: str) -> str:
    """The CPU_REPACK rule of a CPU plan: "auto" is this machine's CPU (kvadvise.planner.repack; --no-hardware
    leaves the GPUs alone, not the CPU a CPU plan runs on), "off" with --no-repack."""
    if rule != "auto":
        return rule
    from kvadvise.planner.repack import cpu_isa

    return cpu_isa()


def _measured_quality(spec: ModelSpec, llama_build: int | None) -> MeasuredQuality | None:
    """What `kvadvise verify quality` measured on this model file, if anything (never raises)."""
    from kvadvise.runtime.qualitycache import lookup

    return lookup(spec.source, llama_build)


def _calibration(gpu_name: str | None) -> tuple[MeasuredOverhead | None, tuple[str, ...]]:
    """The overhead ``verify --save-calibration`` measured on this machine's GPU, if any."""
    if gpu_name is None:
        return None, ()
    from kvadvise.runtime.calibration import measured_overhead

    return measured_overhead(gpu_name)
