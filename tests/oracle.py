"""Run real llama.cpp (llama-cpp-python, in a child process) and compare what it
allocates with kvadvise's prediction."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
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


# --- llama.cpp's own allocation pass (issue 25): llama-fit-params -fitp on, no allocation -----------------
# Real-size layers of every family a tiny recipe builds (tests/tinymodels.py), written sparse (header only): the
# shapes of a published model of each family, so that every term of the compute buffer shows (the masks at
# 32k cells, MoE experts, gated delta net, Mamba-2, MLA, SWA). The vocabulary is 1,024 tokens by default, so
# that the layers, not the logits, are the peak; REAL_VOCAB gives the published one.
REAL_SIZES: dict[str, dict[str, int]] = {
    "llama": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=14336),  # Llama-3.1-8B
    "mixtral": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=14336, n_expert=8, n_expert_used=2),
    "qwen2": dict(n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944),  # Qwen2.5-7B
    "qwen3": dict(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, head=128, n_ff=3072),  # Qwen3-0.6B
    "qwen3moe": dict(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head=128, n_ff=6144, n_expert=128,
                     n_expert_used=8, n_ff_exp=768),  # Qwen3-30B-A3B
    "gemma2": dict(n_layer=42, n_embd=3584, n_head=16, n_head_kv=8, head=256, n_ff=14336, n_swa=4096),  # 9B
    "gemma3": dict(n_layer=48, n_embd=3840, n_head=16, n_head_kv=8, head=256, n_ff=15360, n_swa=1024),  # 12B
    "gemma3n": dict(n_layer=30, n_embd=2048, n_head=8, n_head_kv=2, head=256, n_ff=8192, n_swa=512),  # Gemma 3n E2B
    "gemma4": dict(n_layer=35, n_embd=1536, n_head=8, n_head_kv=1, head=512, head_swa=256, n_ff=6144, n_swa=512,
                   n_embd_per_layer=256, shared_kv=20),  # Gemma 4 E2B (its shared layers' double-wide MLP aside)
    "gemma4-moe": dict(n_layer=30, n_embd=2816, n_head=16, n_head_kv=8, n_head_kv_full=2, head=512, head_swa=256,
                       n_ff=2112, n_swa=1024, n_expert=128, n_expert_used=8, n_ff_exp=704),  # Gemma 4 26B-A4B
    "gpt-oss": dict(n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head=64, n_swa=128, n_expert=32,
                    n_expert_used=4, n_ff_exp=2880),  # gpt-oss-20b
    "phi3": dict(n_layer=32, n_embd=3072, n_head=32, n_head_kv=32, n_ff=8192),  # Phi-3-mini
    "command-r": dict(n_layer=40, n_embd=8192, n_head=64, n_head_kv=8, n_ff=22528),  # Command-R 35B
    "cohere2": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_swa=4096, swa_pattern=4),
    "granite": dict(n_layer=40, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12800),  # Granite-3.3-8B
    "deepseek2-mla": dict(n_layer=27, n_embd=2048, n_head=16, n_ff=10944, qk_nope=128, qk_rope=64, v_head=128,
                          kv_lora=512, q_lora=0, n_expert=64, n_expert_used=6, n_expert_shared=2, n_ff_exp=1408,
                          n_dense_lead=1),  # DeepSeek-V2-Lite
    "deepseek2-legacy": dict(n_layer=27, n_embd=2048, n_head=16, n_ff=10944, qk_nope=128, qk_rope=64, v_head=128,
                             kv_lora=512, q_lora=0, n_expert=64, n_expert_used=6, n_expert_shared=2, n_ff_exp=1408,
                             n_dense_lead=1),  # DeepSeek-V2-Lite, a pre-MLA GGUF
    "glm4moe": dict(n_layer_all=47, n_nextn=1, n_embd=4096, n_head=96, n_head_kv=8, head=128, n_rot=64, n_ff=10944,
                    n_expert=128, n_expert_used=8, n_expert_shared=1, n_ff_exp=1408, n_dense_lead=1),  # GLM-4.5-Air
    "qwen35": dict(n_layer=32, n_embd=4096, n_head=16, n_head_kv=4, head=256, n_rot=64, n_ff=12288, interval=4,
                   d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32),  # Qwen3.5-9B
    "qwen3next": dict(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head=256, n_rot=64, n_ff=5120, n_expert=512,
                      n_expert_used=10, n_ff_exp=512, n_ff_shexp=512, d_conv=4, gdn_head=128, n_k_heads=16,
                      n_v_heads=32),  # Qwen3-Next-80B-A3B
    "mamba2": dict(n_layer=64, n_embd=2560, d_conv=4, d_inner=5120, d_state=128, n_head=80, n_group=1),  # 2.7B
    "lfm2": dict(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, l_cache=3),  # LFM2-1.2B
    "granitehybrid": dict(n_layer=40, n_embd=1536, n_head=12, n_head_kv=4, n_ff=4096, d_conv=4, d_state=128,
                          n_ssm_head=48, n_group=1),  # Granite-4.0-H-Tiny's shape
}  # fmt: skip
REAL_VOCAB = {
    "llama": 128256,
    "qwen3": 151936,
    "gemma3": 262208,
    "gemma3n": 262144,
    "gemma4": 262144,
    "gpt-oss": 201088,
    "qwen35": 248320,
    "granitehybrid": 100352,  # Granite-4.0-H's
}
DRY_TOLERANCE = (0.03, 16 * MIB)  # issue 25: 16 MiB or 3 %


def fit_params_args(cfg: RunConfig, *, rpc: str | None = None) -> list[str]:
    """llama-fit-params flags for ``cfg`` (the plan's llama-server flags; -ngl 99 onto an RPC device)."""
    args = ["-c", str(cfg.n_ctx), "-fa", cfg.flash_attn, "-ub", str(cfg.n_ubatch), "-b", str(cfg.n_batch)]
    args += ["-np", str(cfg.n_parallel), "-ctk", cfg.type_k.type_name, "-ctv", cfg.type_v.type_name]
    if rpc:
        args += ["--rpc", rpc, "-ngl", "99"]
    else:
        args += ["-ngl", "0"]
    return args


def dry_run(
    binary: Path,
    model: Path,
    cfg: RunConfig,
    *,
    rpc: str | None = None,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Every compute buffer llama.cpp's no-allocation pass reserves for ``cfg`` (device name -> MiB; the host as
    "CPU"): CPU alone, or an RPC device and the host. ``extra``: more flags after the plan's (a placement: -ngl,
    -ot); ``env``: the child's environment (default: this one's).

    Read as ``verify llamacpp --dry-run`` reads it (kvadvise.runtime.dryrun.parse): the stdout table is the source
    that always arrives (stdio is flushed at exit); the -v log's 0.01 MiB lines refine it where they survive, since
    common_log's worker thread is never joined at exit (common/log.cpp, common_log_main; llama.cpp#22142)."""
    from kvadvise.runtime.dryrun import HOST, parse

    cmd = [str(binary), "-m", str(model), "-fitp", "on", "-v", *fit_params_args(cfg, rpc=rpc), *extra]
    for _ in range(3):  # a loopback rpc-server that was busy answers the next time
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
        found = {("CPU" if row.name == HOST else row.name): row.compute_mib for row in parse(p.stdout, p.stderr)}
        if p.returncode == 0 and "CPU" in found:
            return found
    raise RuntimeError(f"llama-fit-params failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")


def within(predicted: int, measured_mib: float) -> bool:
    rel, absolute = DRY_TOLERANCE
    return abs(predicted - measured_mib * MIB) <= max(absolute, rel * measured_mib * MIB)
