"""kvadvise: exact llama.cpp / Ollama memory planning.

The stable API lives in ``kvadvise.api`` and is re-exported here lazily, so
``import advisor`` stays cheap for the CLI::

    import kvadvise
    spec = advisor.load_model("model.gguf")
    rec = advisor.recommend(spec, advisor.gpu_profile("4090"))
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GGMLType",
    "Hardware",
    "MemoryEstimate",
    "ModelSpec",
    "Plan",
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
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")
