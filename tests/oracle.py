"""Run real llama.cpp (llama-cpp-python, in a child process) and compare what it
allocates with kvadvise's prediction."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvadvise.backends.llamacpp.runners import probe_request
from kvadvise.errors import ConfigError
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import MIB, MemoryEstimate, RunConfig, estimate
from kvadvise.runtime import llamalog

ROOT = Path(__file__).resolve().parent.parent
MARK = "=== kvadvise-probe request "
COMPUTE_TOLERANCE = (0.05, 16 * MIB)  # the bar: within 5% or 16 MiB


@dataclass(frozen=True)
class Measured:
    out: dict[str, object]
    log: llamalog.LoadLog
    text: str


def run_llama(model: Path, cfgs: list[RunConfig], timeout_s: float = 900) -> list[Measured]:
    """Load ``model`` once per config in one child process; parse each log."""
    # No CPU_REPACK copies: the CPU model buffer is then exactly the mmap-ed file span.
    reqs = [probe_request(str(model), c, bench=False, extra_bufts=False) for c in cfgs]
    p = subprocess.run(
        [sys.executable, "-m", "kvadvise.backends.llamacpp.probe", json.dumps(reqs)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
    )
    outs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    chunks = p.stderr.split(MARK)[1:]
    if len(outs) != len(cfgs) or len(chunks) != len(cfgs):
        raise RuntimeError(f"probe returned {len(outs)} results for {len(cfgs)} requests:\n{p.stderr[-3000:]}")
    return [Measured(o, llamalog.parse(c.splitlines()), c) for o, c in zip(outs, chunks, strict=True)]


def mib(n: int) -> str:
    """How llama.cpp prints a size: %.2f MiB."""
    return f"{n / MIB:.2f}"


@dataclass
class Row:
    model: str
    config: str
    predicted: dict[str, str]
    measured: dict[str, str]
    compute_pred: int = 0
    compute_meas: int = 0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def markdown(self) -> str:
        keys = ("n_ctx", "kv", "k", "v", "rs", "weights", "output", "compute")
        lines = [
            "| model | config | " + " | ".join(f"{k} pred / meas (MiB)" for k in keys) + " |",
            "|---|---|" + "---|" * len(keys),
        ]
        worst_bytes, worst_rel = 0, 0.0
        for r in self.rows:
            cells = [f"{r.predicted.get(k, '-')} / {r.measured.get(k, '-')}" for k in keys]
            lines.append(f"| {r.model} | {r.config} | " + " | ".join(cells) + " |")
            if r.compute_meas:
                err = abs(r.compute_pred - r.compute_meas)
                worst_bytes = max(worst_bytes, err)
                if r.compute_meas >= COMPUTE_TOLERANCE[1]:  # relative error only where it means something
                    worst_rel = max(worst_rel, err / r.compute_meas)
        lines.append("")
        lines.append(
            f"{len(self.rows)} configurations; largest compute-buffer error {worst_bytes / MIB:.2f} MiB, "
            f"and {worst_rel:.1%} among buffers of {COMPUTE_TOLERANCE[1] // MIB} MiB or more."
        )
        return "\n".join(lines)


REPORT = Report()


def describe(cfg: RunConfig) -> str:
    parts = [f"c={cfg.n_ctx}", f"{cfg.type_k.type_name}/{cfg.type_v.type_name}", f"fa={cfg.flash_attn}"]
    if cfg.n_parallel > 1:
        parts.append(f"np={cfg.n_parallel}" + ("u" if cfg.kv_unified else ""))
    if cfg.swa_full:
        parts.append("swa_full")
    if cfg.n_outputs_max is not None:
        parts.append(f"outputs={cfg.n_outputs_max or 'batch'}")
    if cfg.n_ubatch != 512 or cfg.n_batch != 2048:
        parts.append(f"b={cfg.n_batch}/{cfg.n_ubatch}")
    return " ".join(parts)


def check(model_name: str, spec: ModelSpec, cfg: RunConfig, m: Measured) -> list[str]:
    """Compare prediction and measurement; return the mismatches (empty = agree)."""
    try:
        est: MemoryEstimate | None = estimate(spec, cfg)
    except ConfigError as e:
        est = None
        if m.out.get("ok"):
            return [f"kvadvise refused ({e}) but llama.cpp accepted the config"]
        REPORT.rows.append(Row(model_name, describe(cfg), {"n_ctx": "refused"}, {"n_ctx": "refused"}))
        return []
    if not m.out.get("ok"):
        return [f"llama.cpp failed ({m.out.get('error')}) but kvadvise predicted {est.total_bytes} B"]
    log = m.log
    lay = est.layout
    bad: list[str] = []

    def same(what: str, pred: object, meas: object) -> None:
        if pred != meas:
            bad.append(f"{what}: predicted {pred}, llama.cpp {meas}")

    same("n_ctx", lay.n_ctx, m.out["n_ctx"])
    same("n_ctx_seq", str(lay.n_ctx_seq), log.cparams.get("n_ctx_seq"))
    same("n_batch", lay.n_batch, m.out["n_batch"])
    same("n_ubatch", lay.n_ubatch, m.out["n_ubatch"])
    same("flash_attn", lay.flash_attn, log.cparams.get("flash_attn") in ("enabled", "auto"))
    # each KV cache, in the order llama.cpp prints them (non-SWA first)
    same("caches", [(c.cells, c.n_layers) for c in est.caches], [(s.cells, s.layers) for s in log.kv])
    for c, s in zip(est.caches, log.kv, strict=False):
        same(f"{c.kind} K MiB", mib(c.k_bytes), f"{s.k_mib:.2f}")
        same(f"{c.kind} V MiB", mib(c.v_bytes), f"{s.v_mib:.2f}")
    kv_meas = log.mib("KV")
    rs_meas = log.mib("RS")
    # one KV buffer per cache (per device); each printed size is rounded on its own
    same(
        "KV buffers MiB",
        [mib(c.k_bytes + c.v_bytes) for c in est.caches],
        [f"{b.mib:.2f}" for b in log.buffers if b.kind == "KV"],
    )
    same("RS buffer MiB", mib(est.recurrent_bytes), f"{rs_meas:.2f}")
    mapped = [b.mib for b in log.buffers if b.kind == "model" and b.buft == "CPU_Mapped"]
    same("weights (CPU_Mapped) MiB", mib(est.weights_bytes), f"{sum(mapped):.2f}")
    same("output MiB", mib(est.output_bytes), f"{log.mib('output'):.2f}")
    comp_meas = round(log.mib("compute") * MIB)
    rel, absolute = COMPUTE_TOLERANCE
    if abs(est.compute_bytes - comp_meas) > max(rel * comp_meas, absolute):
        bad.append(f"compute: predicted {mib(est.compute_bytes)} MiB, llama.cpp {comp_meas / MIB:.2f} MiB")
    REPORT.rows.append(
        Row(
            model_name,
            describe(cfg),
            {
                "n_ctx": str(lay.n_ctx),
                "kv": mib(est.kv_bytes),
                "k": mib(est.k_bytes),
                "v": mib(est.v_bytes),
                "rs": mib(est.recurrent_bytes),
                "weights": mib(est.weights_bytes),
                "output": mib(est.output_bytes),
                "compute": mib(est.compute_bytes),
            },
            {
                "n_ctx": str(m.out["n_ctx"]),
                "kv": f"{kv_meas:.2f}",
                "k": f"{sum(s.k_mib for s in log.kv):.2f}",
                "v": f"{sum(s.v_mib for s in log.kv):.2f}",
                "rs": f"{rs_meas:.2f}",
                "weights": f"{sum(mapped):.2f}",
                "output": f"{log.mib('output'):.2f}",
                "compute": f"{comp_meas / MIB:.2f}",
            },
            est.compute_bytes,
            comp_meas,
        )
    )
    return bad
