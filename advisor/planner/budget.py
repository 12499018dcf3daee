"""The memory a plan may use, per device: free memory minus the fit margin and the headroom the
uncertainty calls for. One rule, :func:`plan_budget`, for every command: a plan, a listing of many
models, ``compare``, RPC hosts and the Python API.

- the margin: what llama.cpp's own fit keeps free per device (common/arg.cpp: -fitt, 1024 MiB);
- 3 % of the weights when their size is a published figure (a built-in profile);
- a display allowance on a single desktop GPU (not a data-centre card, not Apple's unified memory,
  not a budget given by hand with --vram or --rpc), unless --headless.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.errors import InputError

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.memory import MemoryEstimate

MIB = 1 << 20
# llama.cpp's own fit keeps this much free per device (common/arg.cpp: -fitt, default 1024 MiB)
DEFAULT_MARGIN_BYTES = 1024 * MIB
# Plans from a built-in profile: the weights figure is a published download size (Ollama's
# library shows 19 GB for qwen3-coder:30b where older figures say 18 GB): keep 3 % of it free.
PROFILE_WEIGHTS_HEADROOM = (3, 100)
PROFILE_SOURCE = "profile:"  # ModelSpec.source of a built-in profile (backends/ollama/profiles.py)
# A single desktop GPU also drives the display: 0.3 to 1 GB in use (shared/user-evidence.md).
DISPLAY_ALLOWANCE_BYTES = 512 * MIB
# Hardware.source of budgets the user gave by hand (--vram, --rpc): they said what is free
GIVEN_BY_HAND = frozenset({"manual", "rpc"})
# a pattern, compiled (and cached by re) on first use: start-up pays nothing for it
_DATACENTER_GPU = r"\b(tesla|a2|a10g?|a16|a30|a40|a100|a800|h100|h200|h800|h20|l4|l20|l40s?|t4|v100|p100|p40|k80|b100|b200|gb200|gh200)\b"


@dataclass(frozen=True, slots=True)
class Budget:
    """The memory a plan may use, per device, after margins and reservations."""

    device: str  # "cuda" | "metal" (Apple: unified memory) | "rpc" | "cpu"
    total_bytes: int
    free_bytes: int
    margin_bytes: int
    budget_bytes: int  # free - margin: what the model may take
    source: str  # nvml | profile:<id> | manual | ram
    n_gpu: int
    bandwidth_bytes_per_s: int | None
    bandwidth_source: str | None
    backend: str = "cuda"  # the GPUs' ggml backend (speed factors, buffer names): cuda | rocm | vulkan | sycl | metal
    headroom_bytes: int = 0  # kept free besides the margin (already taken out of budget_bytes)
    headroom_notes: tuple[str, ...] = ()  # why, one line each
    # with several GPUs, each one's own budget (its free memory minus its margin and its share of the
    # headroom): a plan fits only when every device fits its own; budget_bytes is their sum
    device_budgets: tuple[int, ...] = ()
    device_free: tuple[int, ...] = ()  # each GPU's free memory: llama.cpp's default split (-ts) follows it
    # the speed model's per-GPU figures (kvadvise.planner.speed.plan_devices): each GPU's bandwidth (decode)
    # and FP16 tensor peak (prompt processing), () unless every GPU's is known, and its name
    device_bandwidths: tuple[int, ...] = ()
    device_flops: tuple[float, ...] = ()
    device_names: tuple[str, ...] = ()
    device_classes: tuple[str, ...] = ()  # each GPU's decode class (Gpu.speed_class; "": its backend's default)
    device_clocks_hz: tuple[float, ...] = ()  # each GPU's boost clock (Gpu.clock_hz; 0: unknown)
    flops_source: str | None = None
    ram_bandwidth_bytes_per_s: int | None = None  # --ram-bandwidth; None: measured when a plan needs it
    ram_bandwidth_source: str = "--ram-bandwidth"  # where that figure comes from (a Mac's: its unified memory)
    # system RAM a plan may use beside (kvadvise.planner.hostram): free now, or given with --ram
    ram_bytes: int = 0
    ram_source: str = ""
    ram_kept_bytes: int = 0  # of ram_bytes, what the OS holds (Hardware.ram_kept_bytes: a Mac of the card list)

    def fits(self, est: MemoryEstimate) -> bool:
        """Every device within its own budget (one budget for one device, or the CPU)."""
        return self.slack_bytes(est) >= 0

    def slack_bytes(self, est: MemoryEstimate) -> int:
        """What is left of the tightest device's budget (negative: over it)."""
        if len(self.device_budgets) > 1 and len(est.devices) == len(self.device_budgets):
            return min(b - d.total_bytes for d, b in zip(est.devices, self.device_budgets, strict=True))
        return self.budget_bytes - est.device_bytes


def plan_budget(
    hw: Hardware,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    *,
    spec: ModelSpec | None = None,
    headless: bool = False,
    weights_uncertain: bool = False,
) -> Budget:
    """The budget of every plan: :func:`budget_for` with the headroom of :func:`with_headroom`.
    ``spec``: the model (its weights' provenance); None for a budget shown before any model."""
    return with_headroom(budget_for(hw, margin_bytes), hw, spec, headless=headless, weights_uncertain=weights_uncertain)


def budget_for(hw: Hardware, margin_bytes: int = DEFAULT_MARGIN_BYTES) -> Budget:
    """Free memory minus the margin, summed over the GPUs (llama.cpp splits layers across them);
    no headroom: plans take theirs through :func:`plan_budget`."""
    if margin_bytes < 0:
        raise InputError("the margin cannot be negative")
    if hw.gpus:
        free = sum(g.free_bytes for g in hw.gpus)
        total = sum(g.total_bytes for g in hw.gpus)
        margin = margin_bytes * len(hw.gpus)
        bw = [g.bandwidth_bytes_per_s for g in hw.gpus]
        bandwidth = min(b for b in bw if b) if any(bw) else None  # layers run one GPU after another
        src = next((g.bandwidth_source for g in hw.gpus if g.bandwidth_source), None)
        backend = "metal" if any(g.unified_memory for g in hw.gpus) else hw.gpus[0].backend
        # the memory rules: ROCm builds are ggml-cuda compiled with HIP (the same buffers, as published
        # ROCm logs print them); Vulkan and SYCL are planned with them too (see GPU_BACKEND_NOTE)
        device = "rpc" if all(g.rpc_endpoint for g in hw.gpus) else ("metal" if backend == "metal" else "cuda")
        budget = Budget(
            device,
            total,
            free,
            margin,
            max(0, free - margin),
            hw.source,
            len(hw.gpus),
            bandwidth,
            src,
            backend,
            ram_bytes=hw.ram_free_bytes,
            ram_source=hw.ram_source,
            ram_kept_bytes=hw.ram_kept_bytes,
        )
        if len(hw.gpus) > 1:
            per = tuple(max(0, g.free_bytes - margin_bytes) for g in hw.gpus)
            budget = replace(budget, device_budgets=per, device_free=tuple(g.free_bytes for g in hw.gpus))
        flops = [g.flops_per_s for g in hw.gpus]
        return replace(
            budget,
            device_bandwidths=tuple(b for b in bw if b) if all(bw) else (),
            device_flops=tuple(f for f in flops if f) if all(flops) else (),
            device_names=tuple(g.name for g in hw.gpus),
            device_classes=tuple(g.speed_class for g in hw.gpus),
            device_clocks_hz=tuple(g.clock_hz for g in hw.gpus),
            flops_source=next((g.flops_source for g in hw.gpus if g.flops_source), None),
            ram_bandwidth_bytes_per_s=hw.ram_bandwidth_bytes_per_s,
            ram_bandwidth_source=hw.ram_bandwidth_source,
        )
    free = hw.ram_free_bytes
    cpu = Budget(
        "cpu",
        hw.ram_total_bytes,
        free,
        margin_bytes,
        max(0, free - margin_bytes),
        "ram",
        0,
        None,
        None,
        ram_bytes=max(0, free - margin_bytes),  # the CPU runs the model: RAM is its device, with the margin
        # (said with the figure: "of 31.00 GiB" for --ram 32GiB reads as the user's number)
        ram_source=f"{hw.ram_source}, less the {margin_bytes / MIB:,.0f} MiB margin" if margin_bytes else hw.ram_source,
        ram_kept_bytes=hw.ram_kept_bytes,
    )
    return replace(
        cpu, ram_bandwidth_bytes_per_s=hw.ram_bandwidth_bytes_per_s, ram_bandwidth_source=hw.ram_bandwidth_source
    )


def weights_published(spec: ModelSpec) -> bool:
    """The weights size is a published figure, not the file's own: a spec from a built-in profile."""
    return spec.source.startswith(PROFILE_SOURCE)


def with_headroom(
    budget: Budget, hw: Hardware, spec: ModelSpec | None, *, headless: bool = False, weights_uncertain: bool = False
) -> Budget:
    """The budget with the headroom the uncertainty calls for taken out, and why (in ``headroom_notes``).

    - weights whose size is a published figure (a built-in profile, or ``weights_uncertain``): keep 3 % free;
    - a single desktop GPU (not a data-centre card, not Apple's unified memory, not a budget given by
      hand with --vram or --rpc) also drives the display: 512 MiB unless ``headless``.
    """
    extra, notes = 0, []
    if spec is not None and spec.weights_bytes and (weights_uncertain or weights_published(spec)):
        num, den = PROFILE_WEIGHTS_HEADROOM
        n = -(-spec.weights_bytes * num // den)
        extra += n
        notes.append(f"{n / MIB:,.0f} MiB: 3% of the weights, whose size comes from a built-in profile")
    if budget.device != "cpu" and not headless and len(hw.gpus) == 1 and hw.source not in GIVEN_BY_HAND:
        g = hw.gpus[0]
        if not g.unified_memory and not re.search(_DATACENTER_GPU, g.name.lower()):
            extra += DISPLAY_ALLOWANCE_BYTES
            notes.append(
                f"{DISPLAY_ALLOWANCE_BYTES / MIB:,.0f} MiB for the display a desktop GPU also drives (--headless: none)"
            )
    if not extra:
        return budget
    n = max(1, len(budget.device_budgets))
    return replace(
        budget,
        headroom_bytes=budget.headroom_bytes + extra,
        headroom_notes=budget.headroom_notes + tuple(notes),
        budget_bytes=max(0, budget.budget_bytes - extra),
        device_budgets=tuple(max(0, b - -(-extra // n)) for b in budget.device_budgets),
    )
