"""kvadvise: exact llama.cpp / Ollama memory planning.

The stable API lives in ``kvadvise.api`` and is re-exported here lazily, so
``import kvadvise`` stays cheap for the CLI::

    import kvadvise
    plan = kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(gpu="rtx-4090"), runtime="ollama")
    print(kvadvise.to_json(plan)["ollama"]["env"])
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GGMLType",
    "Hardware",
    "MemoryEstimate",
    "ModelSpec",
    "Plan",
    "PlanRequest",
    "Policy",
    "Recommendation",
    "RunConfig",
    "Verification",
    "estimate",
    "gpu_profile",
    "llama_server_command",
    "load_model",
    "plan",
    "probe_hardware",
    "recommend",
    "to_json",
    "verify_llamacpp",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvadvise import api

        return getattr(api, name)
    raise AttributeError(f"module 'kvadvise' has no attribute {name!r}")
