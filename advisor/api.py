"""The stable Python API: the same questions the CLI answers, as functions.

Frozen dataclasses in and out; ``to_json`` gives exactly the document
``--json`` prints for the same inputs, so a tool and the CLI always agree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvadvise.model.ggml import GGMLType as GGMLType  # re-exported by advisor.__all__
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES, plan_budget
from kvadvise.planner.hardware import Hardware
from kvadvise.planner.memory import MemoryEstimate, RunConfig
from kvadvise.planner.planning import Plan, make_plan
from kvadvise.planner.policy import Policy
from kvadvise.planner.recommender import Recommendation
from kvadvise.runtime.verification import Verification


def load_model(ref: str, backend: str = "gguf") -> ModelSpec:
    """A model spec from any installed backend: "gguf" (a file), "hf" (config.json or repo id), "ollama", a plugin..."""
    from kvadvise.plugins import discover

    return discover().get(backend).load_spec(ref)


def estimate(spec: ModelSpec, config: RunConfig) -> MemoryEstimate:
    """What llama.cpp allocates for ``spec`` run with ``config``."""
    from kvadvise.planner.memory import estimate as _estimate

    return _estimate(spec, config)


def probe_hardware() -> Hardware:
    """This machine's NVIDIA GPUs (NVML) and RAM; no GPU is not an error."""
    from kvadvise.planner.hardware import probe

    return probe()


def gpu_profile(name: str) -> Hardware:
    """A card you don't own, from profiles/gpus.json ("4090", "A100 80GB", "m3-max-36"...)."""
    from kvadvise.planner.hardware import from_profile

    return from_profile(name)


def recommend(
    spec: ModelSpec,
    hardware: Hardware,
    policy: Policy | None = None,
    base: RunConfig | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
) -> Recommendation:
    """Context, K/V cache types and flash attention that keep ``spec`` inside ``hardware``'s memory."""
    from kvadvise.planner.recommender import recommend as _recommend

    policy = policy or Policy()
    budget = plan_budget(
        hardware, margin_bytes, spec=spec, headless=policy.headless, weights_uncertain=policy.weights_uncertain
    )
    return _recommend(spec, base or RunConfig(), budget, policy)


def plan(
    spec: ModelSpec,
    config: RunConfig | None = None,
    hardware: Hardware | None = None,
    policy: Policy | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
) -> Plan:
    """What the CLI computes: ``config`` with n_ctx set = estimate it; n_ctx None/0 with hardware = recommend."""
    cfg = config or RunConfig()
    if cfg.cpu_repack == "auto":  # the CPU a CPU plan runs on: this machine's, as the CLI does
        from kvadvise.planner.repack import cpu_isa

        cfg = replace(cfg, cpu_repack=cpu_isa())
    return make_plan(
        spec,
        cfg,
        recommend_ctx=hardware is not None and cfg.n_ctx == 0,
        hw=hardware,
        policy=policy or Policy(),
        margin_bytes=margin_bytes,
    )


def llama_server_command(model_path: str, config: RunConfig) -> str:
    from kvadvise.runtime.llamaserver import command_text

    return command_text(model_path, config)


def verify_llamacpp(model_path: str, plan_: Plan, *, server: str | None = None, timeout_s: float = 600) -> Verification:
    """Run ``plan_.config`` on real llama.cpp and compare with the prediction."""
    from kvadvise.errors import InputError
    from kvadvise.plugins import Measurer, discover
    from kvadvise.runtime.verification import compare

    backend = discover().get("llamacpp")
    if not isinstance(backend, Measurer):
        raise InputError("the installed llamacpp backend cannot run a model (no measure())")
    return compare(plan_, backend.measure(model_path, plan_.config, server=server, timeout_s=timeout_s))


def to_json(obj: Plan | Verification) -> dict[str, Any]:
    """The document `--json` prints for the same result."""
    from kvadvise.render import plan_dict, verification_dict

    return verification_dict(obj) if isinstance(obj, Verification) else plan_dict(obj)
