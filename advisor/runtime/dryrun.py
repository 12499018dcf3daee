"""llama.cpp's own no-allocation projection of a plan, beside kvadvise's: ``kvadvise verify llamacpp --dry-run``.

``llama-fit-params -fitp on`` (tools/fit-params, llama.cpp 0c1e570) loads the model with
``no_alloc`` and reserves the context's graphs without allocating (common/fit.cpp,
common_fit_print -> common_get_device_memory_data_impl): it prints, per device and for the host,
the model, context (KV, recurrent state, output buffer) and compute buffers it would allocate,
in whole MiB (rounded down); with ``-v`` its log also prints each compute buffer to 0.01 MiB
("sched_reserve: CUDA0 compute buffer size = 515.00 MiB"). It projects the flags it is given and
fits nothing. It reserves the logits of the whole batch (it has no --n-outputs-max), as the library
does: kvadvise's figure beside it is for the same.

The projection counts each buffer type's tensors as no_alloc sizes them (llama_model::memory_breakdown:
ggml_backend_alloc_ctx_tensors_from_buft_size), so on the CPU it differs from what a load maps by a rule,
not by chance: with mmap the CPU_Mapped buffer is the file span from the first to the last tensor kept on
the CPU (llama_model_loader::get_mapping_range), the bytes of the tensors repacked out of its middle
included, while the projection sums only the tensors left in the CPU buffer type. The CPU_REPACK buffer
itself is neither a host buffer type (ggml-cpu/repack.cpp leaves is_host unset) nor a model device's,
so common_get_device_memory_data_impl drops it from the table; common_memory_breakdown_print lists it
in the log on a line of its own. The Gemma 3 270M Q4_K_M on an AVX2 CPU: the load maps 235.16 MiB and
repacks 12.66 MiB (27 q4_K matrices); the projection's Host line is 222 (235.16 - 12.66, floored) and its
log's CPU_REPACK line 12. kvadvise compares its figure for the same (the CPU buffer's tensors) and says
what the load maps beside it.

This module parses that output and compares it with an estimate; running the binary is the llama.cpp
backend's job (kvadvise.backends.llamacpp.dryrun).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import MIB, MemoryEstimate
from kvadvise.planner.repack import REPACK_BUFFER

# common_fit_print: printf("%s %zu %zu %zu\n", device name, model, context, compute) in MiB; "Host" last
_TABLE = re.compile(r"^(\S+) ([0-9]{1,15}) ([0-9]{1,15}) ([0-9]{1,15}) ?$")  # bounded: never a 5,000-digit int()
# llama_context::sched_reserve: "%s: %10s compute buffer size = %8.2f MiB" (buffer type names)
_COMPUTE = re.compile(r"(\S+) compute buffer size = +([0-9]{1,15}(?:\.[0-9]{1,6})?) MiB")
# common_memory_breakdown_print's line for a buffer type counted neither for a device nor the host:
# "|   - CPU_REPACK   |    12 =    12 +     0 +     0    |" (self = model + context + compute, whole MiB)
_OTHER = re.compile(
    r"common_memory_breakdown_print: \|\s+- (\S+)\s+\|\s+([0-9]{1,15}) = +([0-9]{1,15}) \+ +([0-9]{1,15}) \+ +([0-9]{1,15})\s+\|"
)
HOST = "Host"
REPACK = REPACK_BUFFER
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
    in_table: bool = True  # False: a buffer type only its log lists (CPU_REPACK), in none of the table's lines


@dataclass(frozen=True, slots=True)
class DryRunRow:
    """A device's figures: kvadvise's and llama.cpp's, in MiB."""

    name: str
    ours_model: float
    ours_context: float
    ours_compute: float
    theirs: Projected

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
        return self.model_ok and self.context_ok and self.compute_ok

    @property
    def differences(self) -> str:
        """What differs, with by how much (MiB, kvadvise minus llama.cpp); empty when the row agrees."""
        out = []
        if not self.model_ok:
            out.append(f"model {self.ours_model - self.theirs.model_mib:+,.2f}")
        if not self.context_ok:
            out.append(f"context {self.ours_context - self.theirs.context_mib:+,.2f}")
        if not self.compute_ok:
            out.append(f"compute {self.ours_compute - self.theirs.compute_mib:+,.2f}")
        return ", ".join(out)


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
    for m in _OTHER.finditer(log):
        if m.group(1) != HOST:
            out.append(Projected(m.group(1), int(m.group(3)), int(m.group(4)), float(m.group(5)), in_table=False))
    return tuple(out)


def _compute_of(name: str, compute: dict[str, float]) -> float | None:
    """The log's compute buffer of a table row: the device's buffer type (CUDA0, RPC0[host:port]); for the
    host, the host buffer types summed (CPU, CUDA_Host, ...)."""
    if name == HOST:
        host = [v for k, v in compute.items() if k == "CPU" or k.endswith("_Host")]
        return sum(host) if host else None
    hits = [v for k, v in compute.items() if k == name or k.startswith(f"{name}[")]
    return hits[0] if len(hits) == 1 else None


def compare(spec: ModelSpec, est: MemoryEstimate, projected: tuple[Projected, ...]) -> tuple[DryRunRow, ...]:
    """kvadvise's devices and host beside llama.cpp's, matched in order (llama.cpp lists its devices as
    the plan does; the CPU of a CPU plan is llama-fit-params' Host). llama.cpp's context is the memory
    module (KV and recurrent state: llama_context::memory_breakdown), not the output buffer."""
    devices = [p for p in projected if p.name != HOST and p.in_table]
    host = next((p for p in projected if p.name == HOST), None)
    rows: list[DryRunRow] = []
    if est.layout.device == "cpu":
        d = est.devices[0]
        if host is not None:  # the tensors of the CPU buffer type, as no_alloc sums them (module docstring)
            rows.append(DryRunRow("CPU", cpu_buffer_bytes(spec, est) / MIB, (d.kv_bytes + d.recurrent_bytes) / MIB,
                                  d.compute_bytes / MIB, host))  # fmt: skip
        # the extra buffer types, each on its own line of the breakdown: CPU_REPACK's row, then AMX's on a CPU with AMX
        for name, ours in reversed(est.extra_buffers):
            extra = next((p for p in projected if p.name == name and not p.in_table), None)
            if extra is not None or ours:  # one side without the other is a difference
                rows.append(DryRunRow(name, ours / MIB, 0.0, 0.0, extra or Projected(name, 0, 0, 0.0)))
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


def cpu_buffer_bytes(spec: ModelSpec, est: MemoryEstimate) -> int:
    """A CPU plan's weights in the CPU buffer type as tensors, not as a mapped span: every tensor (the file's
    tensors are laid out at the CPU buffer's own 32-byte alignment, so their padded sum is their span) less
    those repacked, at their own sizes (AMX packs them larger; a tied output layer's copy takes nothing from it):
    what a --no-mmap load allocates beside CPU_REPACK and AMX and what the projection counts."""
    return spec.weights_bytes - est.repacked_tensor_bytes


def model_note(spec: ModelSpec, est: MemoryEstimate) -> str | None:
    """For a CPU plan whose load maps more than the projection counts: what kvadvise plans, and why."""
    if est.layout.device != "cpu":
        return None
    mapped = est.devices[0].weights_bytes - est.repack_bytes
    gap = mapped - cpu_buffer_bytes(spec, est)
    if gap <= 0 and not est.repack_bytes:
        return None
    extra = " and ".join(n for n, b in est.extra_buffers if b) or REPACK
    return (
        f"model: a load with mmap maps {mapped / MIB:,.2f} MiB (CPU_Mapped: the file span of the weights kept on "
        f"the CPU, {gap / MIB:,.2f} MiB of repacked tensors inside it) and allocates {est.repack_bytes / MIB:,.2f} "
        f"MiB of {extra}: {(mapped + est.repack_bytes) / MIB:,.2f} MiB, what kvadvise plans; llama-fit-params "
        f"counts the tensors of each buffer type and leaves {extra} out of its Host line"
    )


def table_text(rows: tuple[DryRunRow, ...]) -> str:
    """The figures side by side, one line per device: kvadvise / llama.cpp (difference) in MiB; a line that
    differs says which figure and by how much."""
    lines = [
        f"{'device':<24} {'model MiB':>22} {'context MiB':>22} {'compute MiB':>28}",
        f"{'':<24} {'kvadvise / llama.cpp':>22} {'kvadvise / llama.cpp':>22} {'kvadvise / llama.cpp (diff)':>28}",
    ]
    for r in rows:
        t = r.theirs
        diff = r.ours_compute - t.compute_mib
        mark = "" if r.ok else f"  <- differs: {r.differences}"
        name = r.name if t.in_table else f"{r.name} (log)"
        lines.append(  # model and context floored, as llama.cpp prints them
            f"{name:<24} {f'{int(r.ours_model):,} / {t.model_mib:,}':>22} "
            f"{f'{int(r.ours_context):,} / {t.context_mib:,}':>22} "
            f"{f'{r.ours_compute:,.2f} / {t.compute_mib:,.2f} ({diff:+,.2f})':>28}{mark}"
        )
    return "\n".join(lines)
