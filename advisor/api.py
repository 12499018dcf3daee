"""The stable Python API: the same questions the CLI answers, as functions.

Frozen dataclasses in and out; ``to_json`` gives exactly the document
``--json`` prints for the same inputs, so a tool and the CLI always agree.
Arguments are checked as the CLI checks its flags, with the same messages:
a wrong one raises a domain error (:class:`kvadvise.errors.InputError`, or
``ConfigError`` for a run configuration llama.cpp would refuse), never an
AttributeError from deep inside. A margin may be given in bytes or as the CLI
takes it (``"1GiB"``); a cache type as a GGMLType or its name (``"q8_0"``).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvadvise.errors import InputError
from kvadvise.model.ggml import GGMLType as GGMLType  # re-exported by kvadvise.__all__
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES, plan_budget
from kvadvise.planner.hardware import Hardware
from kvadvise.planner.memory import MemoryEstimate, RunConfig
from kvadvise.planner.planning import Plan
from kvadvise.planner.policy import Policy
from kvadvise.planner.recommender import Recommendation
from kvadvise.request import PlanRequest as PlanRequest  # re-exported by kvadvise.__all__
from kvadvise.request import check
from kvadvise.runtime.verification import Verification
from kvadvise.units import MAX_SIZE_BYTES

if TYPE_CHECKING:
    from kvadvise.runtime.seam import Runtime

MAX_TIMEOUT_S = 86400.0  # as the CLI's --timeout: 0.1 to 86400 s


def _invalid(param: str, message: str, hint: str | None = None) -> InputError:
    """The error click gives for a bad flag value, for an argument: ``Invalid value for 'margin_bytes': ...``."""
    return InputError(f"Invalid value for {param!r}: {message}", hint=hint)


def _need(param: str, value: object, kind: type, what: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _invalid(param, f"expected {what}, got {type(value).__name__} {_shown(value)}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(param: str, value: object) -> str:
    """A name or path: a str (or os.PathLike), not empty, no NUL byte (the CLI's TEXT)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    _need(param, value, str, "a str")
    assert isinstance(value, str)
    if not value.strip():
        raise _invalid(param, "the value is empty")
    if "\x00" in value:
        raise _invalid(param, f"{value!a} holds a NUL byte")
    return value


def _margin(value: object) -> int:
    """Bytes (an int >= 0) or a size as the CLI's --margin takes it ("1GiB", "0")."""
    if isinstance(value, str):
        from kvadvise.units import parse_size

        try:
            return parse_size(value, allow_zero=True)
        except InputError as e:
            raise _invalid("margin_bytes", e.message, e.hint) from None
    _need("margin_bytes", value, int, "a whole number of bytes or a size such as '1GiB'")
    assert isinstance(value, int)
    if value < 0:
        raise _invalid("margin_bytes", f"{value} is negative: the margin cannot be negative")
    if value > MAX_SIZE_BYTES:  # what --margin takes (an int64, as llama.cpp's -fitt)
        raise _invalid("margin_bytes", f"{value} is more than {MAX_SIZE_BYTES:,} bytes")
    return value


def _config(value: object, param: str = "config") -> RunConfig:
    """A RunConfig; cache types given by name are parsed as -ctk/-ctv are (model.ggml.cache_type)."""
    _need(param, value, RunConfig, "a RunConfig")
    assert isinstance(value, RunConfig)
    from kvadvise.model.ggml import KV_CACHE_TYPES, cache_type

    names = tuple(t.type_name for t in KV_CACHE_TYPES)
    named: dict[str, Any] = {}
    for field in ("type_k", "type_v", "type_k_draft", "type_v_draft"):
        v = getattr(value, field)
        if isinstance(v, str):
            if v not in names:  # as the CLI's -ctk/-ctv choices say it
                raise _invalid(f"{param}.{field}", f"{v!r} is not one of " + ", ".join(map(repr, names)) + ".")
            named[field] = cache_type(v)
    cfg = replace(value, **named) if named else value
    for name in ("type_k", "type_v"):
        _need(f"{param}.{name}", getattr(cfg, name), GGMLType, "a GGMLType or a cache type name")
    if cfg.draft is not None:
        _need(f"{param}.draft", cfg.draft, ModelSpec, "a ModelSpec")
    return cfg


def _policy(value: object) -> Policy:
    """A Policy, its values checked as the request's are (the messages of --use, --target-ctx...), its fixed cache
    types given by name parsed as -ctk/-ctv are."""
    _need("policy", value, Policy, "a Policy")
    assert isinstance(value, Policy)
    request = _policy_request(value, PlanRequest())
    check(request)
    if value.quality is not None:
        from kvadvise.planner.quality import MeasuredQuality

        _need(
            "policy.quality",
            value.quality,
            MeasuredQuality,
            "a MeasuredQuality (what kvadvise verify quality measured)",
        )
    if value.fixed_kv is None:
        return value
    from kvadvise.model.ggml import cache_type

    return replace(value, fixed_kv=(cache_type(str(request.type_k)), cache_type(str(request.type_v))))


def _kv_name(param: str, v: object) -> str:
    if isinstance(v, GGMLType):
        return v.type_name
    if isinstance(v, str):
        return v
    raise _invalid(param, f"expected a GGMLType or a cache type name, got {type(v).__name__} {_shown(v)}")


def _policy_request(p: Policy, r: PlanRequest) -> PlanRequest:
    """The request's wishes from a Policy (the same fields the flags set)."""
    fixed = p.fixed_kv
    if fixed is not None and (not isinstance(fixed, tuple) or len(fixed) != 2):
        raise _invalid("policy.fixed_kv", f"expected (type_k, type_v), got {_shown(fixed)}")
    return replace(
        r,
        type_k=_kv_name("policy.fixed_kv", fixed[0]) if fixed else r.type_k,
        type_v=_kv_name("policy.fixed_kv", fixed[1]) if fixed else r.type_v,
        target_ctx=p.target_ctx,
        min_ctx=p.min_ctx,
        repeatable=p.repeatable,
        use=p.use,
        allow_cpu=p.allow_cpu,
        gpu_only=p.gpu_only,
        allow_q4=p.allow_q4,
        headless=p.headless,
    )


def _config_request(cfg: RunConfig) -> PlanRequest:
    """The request a RunConfig states: its context fixed (0 = the training context, as -c 0), its cache
    types, its flags, its build."""
    _need("config", cfg, RunConfig, "a RunConfig or a PlanRequest")
    # a RunConfig cannot leave its cache types out: its defaults (f16, f16) stand for "not given", as the
    # flags' do, and the policy chooses (PlanRequest(type_k="f16") fixes f16)
    default = cfg.type_k == GGMLType.F16 and cfg.type_v == GGMLType.F16
    return PlanRequest(
        n_ctx=cfg.n_ctx,
        type_k=None if default else _kv_name("config.type_k", cfg.type_k),
        type_v=None if default else _kv_name("config.type_v", cfg.type_v),
        flash_attn=cfg.flash_attn,
        n_parallel=cfg.n_parallel,
        kv_unified=cfg.kv_unified,
        n_batch=cfg.n_batch,
        n_ubatch=cfg.n_ubatch,
        swa_full=cfg.swa_full,
        device=cfg.device,
        n_outputs_max=cfg.n_outputs_max,
        tensor_split=tuple(cfg.tensor_split),
        cpu_repack=cfg.cpu_repack,
        mmproj=cfg.mmproj,
        draft=cfg.draft,
        type_k_draft=_kv_name("config.type_k_draft", cfg.type_k_draft),
        type_v_draft=_kv_name("config.type_v_draft", cfg.type_v_draft),
        spec_type="draft-mtp" if cfg.mtp else "none",
        spec_draft_n_max=cfg.spec_draft_n_max,
        sampling_penalties=cfg.sampling_penalties,
        # RunConfig's default build stands for "not given", as --llama-build's: KVADVISE_LLAMA_BUILD, the
        # llama-server on PATH, else b11312's rules, with the note that says which
        llama_build=(
            "auto"
            if cfg.llama_build == RunConfig().llama_build
            else "unknown"
            if cfg.llama_build is None
            else f"b{cfg.llama_build}"
        ),
        overhead_bytes=cfg.overhead_bytes,
    )


# RunConfig's fields the planner sets itself (placement, op offload, pipelining, the devices found): estimate()
# takes them; plan() decides them, so one given to it is refused rather than dropped without a word
_PLANNED_FIELDS: tuple[str, ...] = ("device_names", "devices", "rpc_servers", "op_offload_copy_bytes")
_PLANNED_FIELDS += ("host_experts", "pipeline", "output_on_host", "auto_batch")


def _planner_fields(cfg: RunConfig) -> None:
    default = RunConfig()
    for name in _PLANNED_FIELDS:
        if getattr(cfg, name) != getattr(default, name):
            raise _invalid(
                f"config.{name}",
                f"{getattr(cfg, name)!r}: plan() places the model itself",
                hint="estimate() takes a RunConfig as it is; plan() a PlanRequest (gpu=, rpc=, n_cpu_moe=...)",
            )


def request(
    config: RunConfig | PlanRequest | None = None,
    *,
    hardware: Hardware | None = None,
    policy: Policy | None = None,
    margin_bytes: int | str | None = None,
) -> PlanRequest:
    """The :class:`PlanRequest` the arguments of :func:`plan` state, checked as the command line checks its
    flags (the same messages). A PlanRequest is taken as it is; a RunConfig fixes the context (0 = the
    model's training context, as ``--ctx 0``); none: kvadvise recommends the context and the cache types.
    Without ``hardware`` and without a PlanRequest that names some, nothing is probed: an estimate."""
    if isinstance(config, PlanRequest):
        if policy is not None or margin_bytes is not None:
            raise InputError(
                "give the policy and the margin in the PlanRequest (target_ctx, use, margin_bytes...)",
                hint="kvadvise.PlanRequest(n_ctx=..., target_ctx=..., margin_bytes=...)",
            )
        r = config
    else:
        r = PlanRequest() if config is None else _config_request(config)
        r = replace(r, no_hardware=hardware is None)
        if policy is not None:
            _need("policy", policy, Policy, "a Policy")
            r = _policy_request(policy, r)
        if margin_bytes is not None:
            r = replace(r, margin_bytes=_margin(margin_bytes))
    if r.no_hardware and hardware is not None:
        r = replace(r, no_hardware=False)
    return check(r)


def load_model(ref: str, backend: str = "gguf") -> ModelSpec:
    """A model spec from any installed backend: "gguf" (a file), "hf" (config.json or repo id), "ollama", a plugin..."""
    from kvadvise.plugins import discover

    return discover().get(_text("backend", backend)).load_spec(_text("ref", ref))


def estimate(spec: ModelSpec, config: RunConfig) -> MemoryEstimate:
    """What llama.cpp allocates for ``spec`` run with ``config``."""
    from kvadvise.planner.memory import estimate as _estimate

    _need("spec", spec, ModelSpec, "a ModelSpec")
    return _estimate(spec, _config(config))


def probe_hardware() -> Hardware:
    """This machine's NVIDIA GPUs (NVML) and RAM; no GPU is not an error."""
    from kvadvise.planner.hardware import probe

    return probe()


def gpu_profile(name: str) -> Hardware:
    """A card you don't own, from profiles/gpus.json ("4090", "A100 80GB", "m3-max-36"...)."""
    from kvadvise.planner.hardware import from_profile

    return from_profile(_text("name", name))


def recommend(
    spec: ModelSpec,
    hardware: Hardware,
    policy: Policy | None = None,
    base: RunConfig | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
) -> Recommendation:
    """Context, K/V cache types and flash attention that keep ``spec`` inside ``hardware``'s memory."""
    from kvadvise.planner.recommender import recommend as _recommend

    _need("spec", spec, ModelSpec, "a ModelSpec")
    _need("hardware", hardware, Hardware, "a Hardware (gpu_profile, probe_hardware)")
    cfg = _config(base, "base") if base is not None else RunConfig()
    pol = _policy(policy) if policy is not None else Policy()
    from kvadvise.entry import check_margin

    margin = _margin(margin_bytes)
    check_margin(margin, hardware.gpus)  # as the command and plan() refuse a whole-card margin
    budget = plan_budget(hardware, margin, spec=spec, headless=pol.headless, weights_uncertain=pol.weights_uncertain)
    return _recommend(spec, cfg, budget, pol)


def plan(
    model: ModelSpec | str,
    config: RunConfig | PlanRequest | None = None,
    hardware: Hardware | None = None,
    policy: Policy | None = None,
    margin_bytes: int | str | None = None,
    *,
    runtime: str | Runtime = "llama-server",
) -> Plan:
    """What the command line answers for the same question (kvadvise.entry.plan_for, the one entry).

    ``model``: a ModelSpec, or a reference the runtime's backend resolves (``"qwen3-coder"`` for
    ``runtime="ollama"``: its store entry, its projector, its own num_ctx; a GGUF path or Hub name for
    llama-server, whose command line the plan then carries). ``config``: a :class:`PlanRequest` (the
    command line's question, field for flag), or a RunConfig whose context is fixed (0 = the training
    context, as ``--ctx 0``); none: the context and cache types are recommended. ``runtime``:
    "llama-server", "llama-cli" (llama-server's context), "library" (the library and its bindings) or a backend's
    ("ollama"); or a runtime object
    with its own options, as a backend's command takes them (``OllamaRuntime(ollama_version="0.12.3")``:
    ``kvadvise ollama MODEL --ollama-version 0.12.3``)."""
    from kvadvise.entry import plan_for
    from kvadvise.plugins import BindsModel, for_model
    from kvadvise.plugins import runtime as named
    from kvadvise.runtime.seam import Runtime

    if isinstance(runtime, str) or not isinstance(runtime, Runtime):
        name = _text("runtime", runtime)
        if isinstance(model, str):
            spec, rt = for_model(_text("model", model), name)
        else:
            _need("model", model, ModelSpec, "a ModelSpec or a model reference")
            spec, rt = model, named(name)
    elif isinstance(model, str):  # a runtime object: its options, bound to the model its backend resolves
        if not isinstance(runtime, BindsModel):
            raise _invalid(
                "runtime", f"{runtime.name} takes a ModelSpec, or give it by name (runtime={runtime.name!r})"
            )
        spec, rt = runtime.for_model(_text("model", model))
    else:
        _need("model", model, ModelSpec, "a ModelSpec or a model reference")
        spec, rt = model, runtime
    assert isinstance(rt, Runtime)
    from kvadvise.model.spec import check_spec

    if (wrong := check_spec(spec)) is not None:  # a ModelSpec made or changed by hand
        raise _invalid("model", f"ModelSpec: {wrong}", hint="kvadvise.load_model(...) reads one from a model")
    if hardware is not None:
        from kvadvise.planner.hardware import check_hardware

        _need("hardware", hardware, Hardware, "a Hardware (gpu_profile, probe_hardware)")
        if (wrong := check_hardware(hardware)) is not None:  # a Hardware made or changed by hand
            raise _invalid("hardware", f"Hardware: {wrong}", hint="kvadvise.gpu_profile(...) or probe_hardware()")
    if config is not None and not isinstance(config, (RunConfig, PlanRequest)):
        raise _invalid("config", f"expected a RunConfig or a PlanRequest, got {type(config).__name__}")
    if isinstance(config, RunConfig):
        _planner_fields(config)
        # the program is the runtime's (runtime= names it; an old Ollama's is the library): one asked for otherwise
        if config.runtime not in (RunConfig().runtime, rt.program):
            raise _invalid(
                "config.runtime",
                f"{config.runtime!r}, but the plan is for {rt.name} ({rt.program}'s rules)",
                hint=f"give runtime={config.runtime!r} to plan()",
            )
    # hardware= is the command line's --gpu: what --gpu is refused beside is refused beside it, never dropped
    asked_none = isinstance(config, PlanRequest) and config.no_hardware
    r = request(config, hardware=hardware, policy=policy, margin_bytes=margin_bytes)
    clash = (
        "gpu" if r.gpu is not None
        else "vram_bytes" if r.vram_bytes is not None
        else "rpc" if r.rpc
        else "no_hardware" if asked_none
        else "device='cpu'" if r.device == "cpu"
        else None
    )  # fmt: skip
    if hardware is not None and clash is not None:
        raise _invalid(
            "hardware",
            f"given beside the request's {clash}: one of them would be dropped",
            hint="give the machine once: hardware=, or the request's gpu= / vram_bytes= / rpc= / device=",
        )
    if hardware is not None:  # as the command refuses --gpu CARD --margin of the whole card (entry.check_margin)
        from kvadvise.entry import check_margin

        check_margin(r.margin_bytes, hardware.gpus)
    return plan_for(spec, r, rt, hardware=hardware)


def llama_server_command(model_path: str, config: RunConfig | Plan) -> str | None:
    """The llama-server command line for ``model_path`` run with ``config``; given a Plan, the command that runs it
    (its partial offload or its --n-cpu-moe placement, as ``--json``'s ``llama_server.run_command``: a RunConfig
    alone does not carry the placement), None for a plan that runs nowhere (``run_command`` null)."""
    from kvadvise.runtime.llamaserver import ModelSource, args_text, command_text, plan_args

    path = _text("model_path", model_path)
    if isinstance(config, Plan):
        if config.runnable is False:
            return None
        # a URL as --json's run_command points at it (-mu); a Hub name is the llamacpp backend's (its runners)
        src = ModelSource.url(path) if path.startswith(("http://", "https://")) else ModelSource.path(path)
        return args_text(plan_args(src, config, config.offload_to_run))
    return command_text(path, _config(config))


def verify_llamacpp(model_path: str, plan_: Plan, *, server: str | None = None, timeout_s: float = 600) -> Verification:
    """Run ``plan_.config`` on real llama.cpp and compare with the prediction."""
    from kvadvise.plugins import Measurer, discover
    from kvadvise.runtime.verification import compare

    model_path = _text("model_path", model_path)
    _need("plan_", plan_, Plan, "a Plan (kvadvise.plan)")
    if server is not None:
        server = _text("server", server)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise _invalid("timeout_s", f"expected a number of seconds, got {type(timeout_s).__name__}")
    if not math.isfinite(timeout_s):
        raise _invalid("timeout_s", f"{str(timeout_s)!r} is not a finite number")
    if not 0.1 <= timeout_s <= MAX_TIMEOUT_S:
        raise _invalid("timeout_s", f"{float(timeout_s)} is not in the range 0.1<=x<=86400.")
    backend = discover().get("llamacpp")
    if not isinstance(backend, Measurer):
        raise InputError("the installed llamacpp backend cannot run a model (no measure())")
    return compare(plan_, backend.measure(model_path, plan_.config, server=server, timeout_s=timeout_s))


def to_json(obj: Plan | Verification) -> dict[str, Any]:
    """The document `--json` prints for the same result."""
    from kvadvise.render import plan_dict, verification_dict

    if isinstance(obj, Verification):
        return verification_dict(obj)
    _need("obj", obj, Plan, "a Plan or a Verification")
    return plan_dict(obj)
