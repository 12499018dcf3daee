"""The layer split llama.cpp's ``--fit`` picks when the split by free memory leaves a device short of its margin.

Without ``-ts``, llama.cpp splits the layers by each device's free memory (llama_model::load_tensors). With
``--fit on`` (llama-server's default, and Ollama >= 0.30's), when a device would keep less free than its
target (``-fitt``, 1024 MiB by default), ``common_fit_params`` fills the devices back to front instead: the
last device takes as many whole layers as fit its target, then the one before it, and so on; the number of
layers per device becomes the tensor split (common/fit.cpp, ``common_params_fit_impl`` step 3,
``set_ngl_tensor_split_tbo``: ``tensor_split[id] = n_layer``; llama.cpp 0c1e570). kvadvise does the same for
a plan of several devices without ``-ts`` and writes the result as ``-ts``, so the command is the split that
was planned. What does not fit on the devices even so is the partial offload's job (kvadvise.planner.offload).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate


def fit_split(spec: ModelSpec, cfg: RunConfig, budget: Budget, *, as_run: bool = True) -> tuple[float, ...] | None:
    """Layers per device (the output layer counted with the last device's, as llama.cpp counts ``n_layer + 1``)
    such that every device stays within its own budget at ``cfg``, filled back to front as llama.cpp's fit
    fills them; None when there is one device, or when the devices cannot hold every layer.

    Each trial is a partial offload (common/fit.cpp set_ngl_tensor_split_tbo: the devices before the one filled
    hold nothing yet), which llama_context never pipelines, so the trials and the check are planned without
    pipeline parallelism, as llama.cpp measures them: the split it picks. The full offload then runs pipelined,
    a little above (the split inputs' copies): where that leaves a device over its budget, the fill is redone on the
    pipelined plan, which kvadvise writes as -ts (``as_run`` False: a runtime that runs llama.cpp's --fit itself,
    Ollama >= 0.30, whose fill stands); whether the split returned fits is the caller's test."""
    budgets = budget.device_budgets
    n_dev = len(budgets)
    if n_dev < 2 or len(cfg.tensor_split) != n_dev:
        return None
    measured = replace(cfg, pipeline=False)  # every trial a partial offload, as llama.cpp's fit measures it (above)
    split = _fill(spec, measured, budgets)
    if budget.fits(estimate(spec, replace(cfg, tensor_split=split))):
        return split
    # kvadvise writes the split as -ts, and the full offload runs pipelined: where llama.cpp's fill leaves a device
    # over its budget once the split's inputs are copied (a device left with the last block alone: its trial runs
    # the output rows alone), the fill is redone on the plan as it runs
    if as_run:
        run_split = _fill(spec, cfg, budgets)
        if budget.fits(estimate(spec, replace(cfg, tensor_split=run_split))):
            return run_split
    return split if budget.fits(estimate(spec, replace(measured, tensor_split=split))) else None


def _fill(spec: ModelSpec, cfg: RunConfig, budgets: tuple[int, ...]) -> tuple[float, ...]:
    """The layers per device, each device from the last taking the most its budget holds at ``cfg``."""

    def device_bytes(split: tuple[float, ...], d: int) -> int:
        return estimate(spec, replace(cfg, tensor_split=split)).devices[d].total_bytes

    return fill_back_to_front(spec.n_layer_all + 1, budgets, device_bytes)


def fill_back_to_front(
    n_layers: int, budgets: Sequence[int], device_bytes: Callable[[tuple[float, ...], int], int]
) -> tuple[float, ...]:
    """``n_layers`` layers dealt over the devices as common/fit.cpp common_params_fit_impl fills them: the last device
    takes the most it holds within its budget, then the one before it, the first device the rest; the counts are the
    tensor split llama.cpp is given (set_ngl_tensor_split_tbo). ``device_bytes(split, d)``: device ``d``'s total at
    that split (the layers not placed yet on device 0)."""
    n_dev = len(budgets)
    counts = [0] * n_dev

    def within(d: int, k: int) -> bool:
        trial = list(counts)
        trial[d] = k
        trial[0] += n_layers - sum(trial)
        return device_bytes(tuple(float(c) for c in trial), d) <= budgets[d]

    for d in range(n_dev - 1, 0, -1):
        left = n_layers - sum(counts)
        lo, hi = 0, left  # the most layers device d holds within its budget (0 if not even its fixed costs fit)
        if within(d, hi):
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if within(d, mid):
                    lo = mid
                else:
                    hi = mid
        counts[d] = lo
    counts[0] = n_layers - sum(counts)
    return tuple(float(c) for c in counts)


@dataclass(frozen=True, slots=True)
class Refit:
    """A plan's config with the layers moved as llama.cpp's --fit moves them (:func:`fit_split`), and its estimate
    as it runs: pipelined where llama.cpp pipelines the full offload, a little above what --fit measured, so
    whether it fits is the caller's test (``budget.fits(refit.estimate)``)."""

    cfg: RunConfig
    estimate: MemoryEstimate


def refit(spec: ModelSpec, cfg: RunConfig, budget: Budget, *, as_run: bool = True) -> Refit | None:
    """``cfg`` with :func:`fit_split`'s split and its estimate; None where there is no such split."""
    split = fit_split(spec, cfg, budget, as_run=as_run)
    if split is None:
        return None
    moved = replace(cfg, tensor_split=split)
    return Refit(moved, estimate(spec, moved))
