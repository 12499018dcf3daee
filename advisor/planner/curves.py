"""Chart data: device memory against context for each cache configuration (``--chart``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import CTX_PAD, RunConfig, estimate
from kvadvise.planner.policy import Option, config_at


@dataclass(frozen=True, slots=True)
class Curve:
    """Device memory against context for one cache configuration (the chart's line)."""

    type_k: GGMLType
    type_v: GGMLType
    flash_attn: bool
    points: tuple[tuple[int, int], ...]  # (context per sequence, device bytes)


def curves(
    spec: ModelSpec, base: RunConfig, budget: Budget, options: tuple[Option, ...], n: int = 48
) -> tuple[Curve, ...]:
    """Memory against context for each option, from 256 tokens to the model's maximum."""
    top = spec.n_ctx_train or max((o.n_ctx_max for o in options), default=CTX_PAD) * 2
    xs = sorted({max(CTX_PAD, top * i // n // CTX_PAD * CTX_PAD) for i in range(1, n + 1)})
    out = []
    for o in options:
        kv = (o.type_k, o.type_v)
        pts = tuple((x, estimate(spec, config_at(base, x, kv, o.flash_attn, budget.device)).device_bytes) for x in xs)
        out.append(Curve(o.type_k, o.type_v, o.flash_attn, pts))
    return tuple(out)
