"""Published llama.cpp logs (tests/data/published/*.json) and what kvadvise predicts for each.

Each file is one run someone published: its source (URL where known), date, llama.cpp build,
launcher, command, the verbatim log excerpt (``raw``), the buffers it prints (MiB, as printed),
the model's hyper-parameters as a Hugging Face config.json (``hf_config``: the model's public
config, checked against the print_info/KV lines of the log) and the run config the log implies
(``run``: RunConfig's fields). kvadvise plans the run through the same path as ``kvadvise hf``
(:func:`kvadvise.model.hfconfig.from_config` -> :func:`kvadvise.planner.memory.estimate`).

A log kvadvise does not model (a fork, ``-nkvo``, an older build whose rules moved) carries
``xfail``: the reason. A split that llama.cpp runs without pipeline parallelism for a reason kvadvise takes no input
for (``-sm row``: llama_context enables it for -sm layer only) says so in ``run.pipeline`` (false). A partial offload with the output layer in host memory (a build before
builds.OUTPUT_FIRST) says so in ``run.output_on_host`` and gives the file's ``output_type``: a config.json
has no weights, and the op-offload copy is that tensor.

Public interface::

    LOGS: tuple[PublishedLog, ...]          # every file, sorted by id
    compare(log) -> tuple[BufferRow, ...]   # published vs predicted, per buffer
    table(rows) -> str                      # the accuracy table, markdown
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvadvise.model.ggml import GGMLType, row_bytes
from kvadvise.model.hfconfig import from_config
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate

DATA = Path(__file__).resolve().parent / "data" / "published"
MIB = 1 << 20
# The tolerance of issue 12 §5: KV exact to the printed 0.01 MiB; compute within 16 MiB or 3 %.
COMPUTE_ABS_MIB = 16.0
COMPUTE_REL = 0.03


@dataclass(frozen=True, slots=True)
class PublishedLog:
    """One published run (a file of tests/data/published)."""

    id: str
    source: str  # URL, or where the text was found when no URL is known
    source_url: str | None
    source_date: str
    build: str
    launcher: str  # the program that printed the log (llama-server, llama-cli, llama-cpp-python, ...)
    backend: str  # CUDA | Metal | Vulkan | ROCm | CPU | RPC (with the local device type after a +)
    command: str
    model: str
    hf_config: dict[str, Any]
    run: RunConfig
    host_buffer: str | None  # how the log names the host compute buffer (CUDA_Host, CPU, ...); None: CPU only
    kv_mib: dict[str, float]  # per buffer name, as printed (summed over the caches of a device)
    compute_mib: dict[str, float]  # per buffer name, as printed
    xfail: str | None
    notes: str
    raw: str
    # the file's output.weight type where the log shows it matters (a config.json gives no weights): sizes the
    # op-offload copy of a host-resident output layer (RunConfig.output_on_host)
    output_type: str | None = None


@dataclass(frozen=True, slots=True)
class BufferRow:
    """One printed buffer next to kvadvise's prediction."""

    log_id: str
    kind: str  # "kv" | "compute"
    buffer: str
    published_mib: float
    predicted_mib: float

    @property
    def ok(self) -> bool:
        if self.kind == "kv":
            return round(self.predicted_mib, 2) == round(self.published_mib, 2)
        return abs(self.predicted_mib - self.published_mib) <= max(COMPUTE_ABS_MIB, COMPUTE_REL * self.published_mib)


def _run(doc: dict[str, Any]) -> RunConfig:
    r = dict(doc)
    for k in ("type_k", "type_v"):
        if k in r:
            r[k] = GGMLType[r[k].upper()]
    for k in ("tensor_split", "device_names"):
        if k in r:
            r[k] = tuple(r[k])
    return RunConfig(**r)


def load(path: Path) -> PublishedLog:
    d = json.loads(path.read_text(encoding="utf-8"))
    return PublishedLog(
        id=d["id"],
        source=d["source"],
        source_url=d.get("source_url"),
        source_date=d["source_date"],
        build=d["build"],
        launcher=d["launcher"],
        backend=d["backend"],
        command=d["command"],
        model=d["model"],
        hf_config=d["hf_config"],
        run=_run(d["run"]),
        host_buffer=d.get("host_buffer"),
        kv_mib={k: float(v) for k, v in d["published_mib"].get("kv", {}).items()},
        compute_mib={k: float(v) for k, v in d["published_mib"]["compute"].items()},
        xfail=d.get("xfail"),
        notes=d.get("notes", ""),
        raw=d["raw"],
        output_type=d.get("output_type"),
    )


LOGS: tuple[PublishedLog, ...] = tuple(load(p) for p in sorted(DATA.glob("*.json")))


def predict(log: PublishedLog) -> MemoryEstimate:
    spec = from_config(log.hf_config, source=log.id)
    if log.output_type:
        spec = replace(spec, output_bytes=row_bytes(GGMLType[log.output_type], spec.n_embd) * spec.n_vocab)
    return estimate(spec, log.run)


def compare(log: PublishedLog) -> tuple[BufferRow, ...]:
    """Every buffer the log prints, with kvadvise's figure for it."""
    est = predict(log)
    kv = {d.name: d.kv_bytes / MIB for d in est.devices}
    compute = {d.name: d.compute_bytes / MIB for d in est.devices}
    if log.host_buffer is not None:
        compute[log.host_buffer] = est.host.compute_bytes / MIB
    rows = [BufferRow(log.id, "kv", name, mib, kv.get(name, 0.0)) for name, mib in log.kv_mib.items()]
    rows += [BufferRow(log.id, "compute", name, mib, compute.get(name, 0.0)) for name, mib in log.compute_mib.items()]
    return tuple(rows)


# the rows tests/test_published_logs.py compared, printed at the end of the session by tests/conftest.py
REPORT_ROWS: list[BufferRow] = []


def table(rows: tuple[BufferRow, ...] | list[BufferRow], logs: tuple[PublishedLog, ...] = LOGS) -> str:
    """Markdown: one line per printed buffer, published / predicted, the difference and pass/fail."""
    by_id = {log.id: log for log in logs}
    out = [
        "| log | backend | launcher | FA | buffer | kind | published MiB | kvadvise MiB | diff | ok |",
        "|---|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        log = by_id[r.log_id]
        mark = "pass" if r.ok else ("xfail" if log.xfail else "FAIL")
        out.append(
            f"| {r.log_id} | {log.backend} | {log.launcher} | {log.run.flash_attn} | {r.buffer} | {r.kind} "
            f"| {r.published_mib:.2f} | {r.predicted_mib:.2f} | {r.predicted_mib - r.published_mib:+.2f} | {mark} |"
        )
    return "\n".join(out)
