"""llama.cpp's own no-allocation projection of a plan, beside kvadvise's: ``kvadvise verify llamacpp --dry-run``.

``llama-fit-params -fitp on`` (tools/fit-params, llama.cpp 0c1e570) loads the model with
``no_alloc`` and reserves the context's graphs without allocating (common/fit.cpp,
common_fit_print -> common_get_device_memory_data_impl): it prints, per device and for the host,
the model, context (KV, recurrent state, output buffer) and compute buffers it would allocate,
in whole MiB (rounded down); with ``-v`` its log also prints each compute buffer to 0.01 MiB
("sched_reserve: CUDA0 compute buffer size = 515.00 MiB"). It projects the flags it is given and
fits nothing. It reserves the logits of the whole batch (it has no --n-outputs-max), as the library
does: kvadvise's figure beside it is for the same.

This module parses that output and compares it with an estimate; running the binary is the llama.cpp
backend's job (kvadvise.backends.llamacpp.dryrun).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvadvise.planner.memory import MIB, MemoryEstimate

# common_fit_print: printf("%s %zu %zu %zu\n", device name, model, context, compute) in MiB; "Host" last
_TABLE = re.compile(r"^(\S+) ([0-9]{1,15}) ([0-9]{1,15}) ([0-9]{1,15}) ?$")  # bounded: never a 5,000-digit int()
# llama_context::sched_reserve: "%s: %10s compute buffer size = %8.2f MiB" (buffer type names)
_COMPUTE = re.compile(r"(\S+) compute buffer size = +([0-9]{1,15}(?:\.[0-9]{1,6})?) MiB")
HOST = "Host"
# the tolerance for a compute buffer: 16 MiB or 3 %; model and context are compared to the
# whole MiB llama-fit-params prints (it rounds down)
COMPUTE_ABS_MIB = 16.0
COMPUTE_REL = 0.03


@dataclass(frozen=True, slots=True)
class Projected:
    """One device (or the host) as llama-fit-params projects it, in MiB."""

    name: str  # the device's name (CUDA0, RPC0, CPU) or "Host"
    model_mib: int
    context_mib: int
    compute_mib: float  # to 0.01 MiB from the log where it printed it, else the whole MiB of the table


@dataclass(frozen=True, slots=True)
class DryRunRow:
    """A device's figures: kvadvise's and llama.cpp's, in MiB."""

    name: str
    ours_model: float
    ours_context: float
    ours_compute: float
    theirs: Projected
    judge_model: bool = True  # False for a CPU plan: kvadvise counts the mmap-ed span, the dry run no mmap

    @property
    def compute_ok(self) -> bool:
        if not math.isfinite(self.theirs.compute_mib):  # a figure that is not a number never agrees
            return False
        diff = abs(self.ours_compute - self.theirs.compute_mib)
        return diff <= max(COMPUTE_ABS_MIB, COMPUTE_REL * self.theirs.compute_mib)

    @property
    def model_ok(self) -> bool:  # the table rounds down: ours must round down to it
        return int(self.ours_model) == self.theirs.model_mib

    @property
    def context_ok(self) -> bool:
        return abs(int(self.ours_context) - self.theirs.context_mib) <= 1  # the sum of floors vs floor of a sum

    @property
    def ok(self) -> bool:
        return (self.model_ok or not self.judge_model) and self.context_ok and self.compute_ok


def parse(stdout: str, log: str) -> tuple[Projected, ...]:
    """The devices and the host of ``llama-fit-params -fitp on -v`` (its stdout table and its log)."""
    compute = {m.group(1): float(m.group(2)) for m in _COMPUTE.finditer(log)}
    out = []
    for line in stdout.splitlines():
        m = _TABLE.match(line.strip())
        if m is None:
            continue
        name, model, context, table_compute = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        exact = _compute_of(name, compute)
        out.append(Projected(name, model, context, exact if exact is not None else float(table_compute)))
    return tuple(out)


def _compute_of(name: str, compute: dict[str, float]) -> float | None:
    """The log's compute buffer of a table row: the device's buffer type (CUDA0, RPC0[host:port]); for the
    host, the host buffer types summed (CPU, CUDA_Host, ...)."""
    if name == HOST:
        host = [v for k, v in compute.items() if k == "CPU" or k.endswith("_Host")]
        return sum(host) if host else None
    hits = [v for k, v in compute.items() if k == name or k.startswith(f"{name}[")]
    return hits[0] if len(hits) == 1 else None


def compare(est: MemoryEstimate, projected: tuple[Projected, ...]) -> tuple[DryRunRow, ...]:
    """kvadvise's devices and host beside llama.cpp's, matched in order (llama.cpp lists its devices as
    the plan does; the CPU of a CPU plan is llama-fit-params' Host). llama.cpp's context is the memory
    module (KV and recurrent state: llama_context::memory_breakdown), not the output buffer."""
    devices = [p for p in projected if p.name != HOST]
    host = next((p for p in projected if p.name == HOST), None)
    rows: list[DryRunRow] = []
    if est.layout.device == "cpu":
        d = est.devices[0]
        if host is not None:  # the CPU_REPACK copies are a buffer of their own, not in the Host line
            weights = d.weights_bytes - est.repack_bytes
            rows.append(DryRunRow("CPU", weights / MIB, (d.kv_bytes + d.recurrent_bytes) / MIB,
                                  d.compute_bytes / MIB, host, judge_model=False))  # fmt: skip
        return tuple(rows)
    for i in range(max(len(est.devices), len(devices))):  # every device on either side: one missing is 0
        if i >= len(est.devices):
            p = devices[i]
            rows.append(DryRunRow(f"{p.name} (not planned)", 0.0, 0.0, 0.0, p))
            continue
        d = est.devices[i]
        p = devices[i] if i < len(devices) else Projected(d.name, 0, 0, 0.0)
        rows.append(DryRunRow(d.name, d.weights_bytes / MIB, (d.kv_bytes + d.recurrent_bytes) / MIB,
                              d.compute_bytes / MIB, p))  # fmt: skip
    if host is not None:
        h = est.host
        rows.append(DryRunRow(HOST, h.weights_bytes / MIB, 0.0, h.compute_bytes / MIB, host))
    return tuple(rows)


def table_text(rows: tuple[DryRunRow, ...]) -> str:
    """The figures side by side, one line per device: kvadvise / llama.cpp (difference) in MiB."""
    lines = [
        f"{'device':<24} {'model MiB':>22} {'context MiB':>22} {'compute MiB':>28}",
        f"{'':<24} {'kvadvise / llama.cpp':>22} {'kvadvise / llama.cpp':>22} {'kvadvise / llama.cpp (diff)':>28}",
    ]
    for r in rows:
        t = r.theirs
        diff = r.ours_compute - t.compute_mib
        mark = "" if r.ok else "  <- differs"
        lines.append(
            f"{r.name:<24} {f'{r.ours_model:,.0f} / {t.model_mib:,}':>22} "
            f"{f'{r.ours_context:,.0f} / {t.context_mib:,}':>22} "
            f"{f'{r.ours_compute:,.2f} / {t.compute_mib:,.2f} ({diff:+,.2f})':>28}{mark}"
        )
    return "\n".join(lines)
