"""The check of one `benchmarks/gpu_truth.sh` run row: what kvadvise predicted against what llama.cpp
printed and NVML measured (issue 24 part 3).

A row holds ``verify`` (``kvadvise verify llamacpp --json``: ``memory`` predicted, ``measured``), the
``buffers`` of the raw llama-server log (``buft``, ``kind``, ``mib`` as printed) and, on a GPU, the
``nvml`` samples. The bars are the issue's: K/V exact (to the 0.005 MiB each printed %.2f figure
rounds), compute within 16 MiB or 3 % on the device and on the host, NVML's device total within 3 %.

Used by tests/test_cuda_truth.py on the rows committed under tests/data/measured/cuda/, and by
tests/test_gpu_truth.py on the CPU dry run's rows, so the check is exercised before a GPU is lent.
"""

from __future__ import annotations

from typing import Any

from oracle import DRY_TOLERANCE, MIB

COMPUTE_REL, COMPUTE_ABS_BYTES = DRY_TOLERANCE  # the compute bar every oracle test holds: 3 % or 16 MiB
NVML_REL = 0.03
_KV_KEYS = ("k_bytes", "v_bytes", "kv_bytes", "recurrent_bytes")


def _within(predicted: float, measured: float, abs_bytes: float, rel: float) -> bool:
    return abs(predicted - measured) <= max(abs_bytes, rel * abs(measured))


def check_run(row: dict[str, Any]) -> list[str]:
    """What in this run row misses its bar, one line each; [] when it holds."""
    rid = row.get("id", "?")
    if not row.get("ok"):
        return [f"{rid}: the run failed: {row.get('error')}"]
    v = row["verify"]
    mem, meas = v["memory"], v["measured"]
    buffers = row.get("buffers") or []
    problems: list[str] = []
    n_printed = max(1, sum(b["kind"] in ("KV", "RS") for b in buffers))
    for key in _KV_KEYS:
        if abs(meas[key] - mem[key]) > n_printed * 0.005 * MIB:
            problems.append(f"{rid}: {key} predicted {mem[key] / MIB:.2f} MiB, printed {meas[key] / MIB:.2f}")
    # --n-cpu-moe reaches llama-server through the run's wrapper, not through kvadvise verify: the plan is
    # the full offload's, so only what the experts' place does not change (K/V) is held for such a row.
    if (row.get("config") or {}).get("ncmoe"):
        return problems
    printed: dict[str, float] = {}
    for b in buffers:
        if b["kind"] == "compute":
            printed[b["buft"]] = printed.get(b["buft"], 0.0) + b["mib"] * MIB
    # each device as kvadvise names it (CUDA0, CPU for a CPU plan) is the buffer type llama.cpp prints;
    # what is left (CUDA_Host, or CPU beside a GPU) is the host's compute buffer
    for dev in mem["devices"]:
        got = printed.pop(dev["name"], 0.0)
        if not _within(dev["compute_bytes"], got, COMPUTE_ABS_BYTES, COMPUTE_REL):
            problems.append(
                f"{rid}: {dev['name']} compute predicted {dev['compute_bytes'] / MIB:.2f} MiB, printed {got / MIB:.2f}"
            )
    host_got = sum(printed.values())
    host_pred = mem["host"]["compute_bytes"]
    if not _within(host_pred, host_got, COMPUTE_ABS_BYTES, COMPUTE_REL):
        problems.append(f"{rid}: host compute predicted {host_pred / MIB:.2f} MiB, printed {host_got / MIB:.2f}")
    if meas.get("backend") not in (None, "CPU"):  # a GPU run: NVML's view of the device
        used = meas.get("device_used_bytes")
        if used is None:
            problems.append(f"{rid}: NVML measured nothing on a GPU run")
        elif not _within(mem["device_bytes"], used, 0, NVML_REL):
            problems.append(f"{rid}: device total predicted {mem['device_bytes'] / MIB:.0f} MiB, NVML {used / MIB:.0f}")
    return problems
