"""Each device's compute buffer when the layers are split over several devices (-sm layer, pipeline parallelism),
kvadvise's plan against llama.cpp b11312's own no-allocation reserve, on 2 and 3 loopback rpc-servers (issue 37).

Grid: real-size shapes (tests/tinymodels.py ``dims=``, ``sparse=True``: the header only) of dense (Llama 3.1 8B,
Qwen3 0.6B), MoE without a shared expert (Qwen3-30B-A3B, gpt-oss-20b: SWA) and with one (Qwen1.5-MoE-A2.7B,
DeepSeek-V2-Lite: MLA), Gemma 3 12B (SWA) and hybrids (Qwen3.5-9B: gated delta net, Qwen3.5-35B-A3B: gated delta
net + MoE with a shared expert, Granite-4.0-H-Tiny: Mamba-2, LFM2-1.2B: short conv) x flash attention on/off x
n_ctx 4096 / 32768 x -ts 1,1 / 3,1 / 1,1,1 x the logits of the whole batch (llama-fit-params -fitp on: the library,
the library) or of one row (llama-server's -fit pass: n_outputs_max = 1). n_batch 2048, n_ubatch 512.

    python benchmarks/bench_split.py [--only NAME,...] [--quick] [--measured FILE] [--no-pipeline]

``--no-pipeline`` measures the same splits without pipeline parallelism: llama.cpp turns it off for any tensor
override (llama_model::has_tensor_overrides), so the runs add ``-ot`` with a pattern no tensor matches, and the
plans are for b10454, whose RPC devices report no events (kvadvise.planner.builds RPC_EVENTS) and whose rules
are b11312's for these devices otherwise: a split as a build before RPC_EVENTS, or any Vulkan one before
VULKAN_EVENTS, makes it.

Prints one row per device: planned / measured MiB and the error, then the count within the bar of
tests/test_devices.py (5 % or 8 MiB), under it and over it, and the worst rows; the same count for the host's
(CPU) compute buffer beside them. ``--measured FILE`` keeps llama.cpp's
figures in a JSON file (read back when present), so that a change of the plan is compared on the same runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server_build import fit_params, llama_server, rpc_server  # noqa: E402
from oracle import REAL_SIZES, fit_params_args  # noqa: E402
from rpc_devices import devices  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.planner import builds  # noqa: E402
from kvadvise.planner.memory import MIB, RunConfig, estimate  # noqa: E402

# (name, recipe, dims, vocabulary): published shapes (tests/oracle.py REAL_SIZES, benchmarks/bench_moe_shared.py)
MODELS: tuple[tuple[str, str, dict[str, int], int], ...] = (
    ("llama-3.1-8b", "llama", REAL_SIZES["llama"], 128256),
    ("qwen3-0.6b", "qwen3", REAL_SIZES["qwen3"], 151936),
    ("qwen3-30b-a3b", "qwen3moe", REAL_SIZES["qwen3moe"], 151936),
    ("qwen1.5-moe-a2.7b", "qwen2moe", dict(n_layer=24, n_embd=2048, n_head=16, n_head_kv=16, n_ff=5632, n_expert=60,
                                           n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632), 151936),
    ("qwen3.5-35b-a3b", "qwen3next", dict(n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head=256, n_rot=64,
                                          n_ff=5120, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                                          d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32), 248320),
    ("deepseek-v2-lite", "deepseek2-mla", REAL_SIZES["deepseek2-mla"], 102400),
    ("gpt-oss-20b", "gpt-oss", REAL_SIZES["gpt-oss"], 201088),
    ("gemma-3-12b", "gemma3", REAL_SIZES["gemma3"], 262208),
    ("qwen3.5-9b", "qwen35", REAL_SIZES["qwen35"], 248320),
    ("granite-4.0-h-tiny", "granitehybrid", REAL_SIZES["granitehybrid"], 100352),
    ("lfm2-1.2b", "lfm2", REAL_SIZES["lfm2"], 65536),
)  # fmt: skip
SPLITS = ("1,1", "3,1", "1,1,1")
N_CTX = (4096, 32768)
OUTPUTS = {"batch": "library", "1 row": "llama-server"}
BAR = (0.05, 8.0)  # tests/test_devices.py: within 5 % or 8 MiB
_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")


def _reserved(lines: Sequence[str], n_dev: int) -> list[float] | None:
    """The first reserve's compute buffers (MiB): the devices in order, then the host (CPU)."""
    found = [m for m in map(_COMPUTE.search, lines) if m]
    if len(found) < n_dev + 1:
        return None
    return [float(m.group(2)) for m in found[: n_dev + 1]]


# an override no tensor matches: it only turns pipeline parallelism off (llama_context, has_tensor_overrides)
NO_PIPELINE = ("-ot", r"no_such_tensor\.weight=CPU")


def _extra(cfg: RunConfig) -> tuple[str, ...]:
    return NO_PIPELINE if builds.older_than(cfg.llama_build, builds.RPC_EVENTS) else ()


def fit_params_pass(model: Path, cfg: RunConfig, endpoints: Sequence[str]) -> list[float]:
    """llama-fit-params -fitp on (no allocation; the whole batch's logits) over ``endpoints``."""
    args = [*fit_params_args(cfg, rpc=",".join(endpoints)), "-ts", ",".join(f"{x:g}" for x in cfg.tensor_split)]
    args += _extra(cfg)
    cmd = [str(fit_params()), "-m", str(model), "-fitp", "on", "-v", *args]
    for _ in range(3):  # a loopback rpc-server that was busy answers the next time
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        got = _reserved(p.stderr.splitlines(), len(endpoints))
        if p.returncode == 0 and got is not None:
            return got
    raise RuntimeError(f"llama-fit-params failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")


def server_fit_pass(model: Path, cfg: RunConfig, n_dev: int, timeout_s: float = 120) -> list[float]:
    """llama-server's -fit pass (common_fit_params: no allocation, n_outputs_max as the server sets it), read from
    its -v log; the server is stopped there (it would go on to send the weights), with rpc-servers of its own."""
    tail: list[str] = []
    for _ in range(3):
        with devices(rpc_server(), n_dev) as eps:
            args = [*fit_params_args(cfg, rpc=",".join(eps)), "-ts", ",".join(f"{x:g}" for x in cfg.tensor_split)]
            args += _extra(cfg)
            cmd = [str(llama_server()), "-m", str(model), "-fit", "on", "-v", "--port", "0", *args]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                assert p.stderr is not None
                t0 = time.monotonic()
                lines: list[str] = []
                for line in p.stderr:
                    lines.append(line)
                    tail = [*tail[-20:], line]
                    got = _reserved(lines, n_dev)
                    if got is not None:
                        return got
                    if time.monotonic() - t0 > timeout_s:
                        break
            finally:
                p.kill()
                p.wait()
    raise RuntimeError(f"llama-server printed no compute buffers: {model} {cfg}\n{''.join(tail)}")


@dataclass(frozen=True)
class Row:
    run: str
    device: int  # its index in the split
    layers: int  # as "offloaded N/M layers" counts them
    planned_mib: float
    measured_mib: float

    @property
    def error_mib(self) -> float:
        return self.planned_mib - self.measured_mib

    @property
    def within(self) -> bool:
        return abs(self.error_mib) <= max(BAR[1], BAR[0] * self.measured_mib)

    def line(self) -> str:
        e = self.error_mib
        flag = "ok" if self.within else ("UNDER" if e < 0 else "over")
        return (
            f"| {self.run} | {self.device} ({self.layers}) | {self.planned_mib:.2f} / {self.measured_mib:.2f} | "
            f"{e:+.2f} ({e / self.measured_mib:+.1%}) | {flag} |"
        )


def sweep(
    names: set[str], quick: bool, folder: Path, measured: dict[str, list[float]], pipeline: bool = True
) -> tuple[list[Row], list[Row]]:
    """Each device's row, and the host's (its CPU compute buffer: the graph inputs and their copies)."""
    rows: list[Row] = []
    host: list[Row] = []
    with devices(rpc_server(), 3) as eps:
        for name, recipe, dims, vocab in MODELS:
            if names and name not in names:
                continue
            path = folder / f"{name}.gguf"
            write_tiny_gguf(path, recipe, n_vocab=vocab, n_ctx_train=262144, dims=dims, sparse=True)
            spec = from_gguf(read_file(path))
            for outputs, runtime in OUTPUTS.items():
                for fa in ("on", "off"):
                    for n_ctx in N_CTX[:1] if quick else N_CTX:
                        for ts in SPLITS:
                            split = tuple(float(x) for x in ts.split(","))
                            cfg = RunConfig(n_ctx=n_ctx, flash_attn=fa, runtime=runtime, tensor_split=split)
                            run = f"{name} fa={fa} c={n_ctx} -ts {ts} outputs={outputs}"
                            if not pipeline:
                                cfg = replace(cfg, llama_build=builds.RPC_EVENTS - 1)
                                run += " no-pipeline"
                            if run not in measured:
                                if runtime == "llama-server":
                                    measured[run] = server_fit_pass(path, cfg, len(split))
                                else:
                                    measured[run] = fit_params_pass(path, cfg, eps[: len(split)])
                            est = estimate(spec, replace(cfg, device="rpc"))
                            for d, dev in enumerate(est.devices):
                                rows.append(
                                    Row(run, d, dev.n_layers, dev.compute_bytes / MIB, measured[run][d])
                                )  # fmt: skip
                                print(rows[-1].line(), flush=True)
                            host.append(Row(run, -1, 0, est.host.compute_bytes / MIB, measured[run][-1]))
    return rows, host


def summary(rows: Sequence[Row]) -> str:
    within = sum(r.within for r in rows)
    under = sum(not r.within and r.error_mib < 0 for r in rows)
    over = len(rows) - within - under
    worst_under = sorted(rows, key=lambda r: r.error_mib / r.measured_mib)[:3]
    worst_over = sorted(rows, key=lambda r: -r.error_mib / r.measured_mib)[:3]
    out = [f"\n{len(rows)} buffers: {within} within the bar (5 % or 8 MiB), {under} under, {over} over"]
    out += ["worst under:", *(r.line() for r in worst_under), "worst over:", *(r.line() for r in worst_over)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--quick", action="store_true", help="n_ctx 4096 only")
    ap.add_argument("--measured", type=Path, help="a JSON file of llama.cpp's figures, read and extended")
    ap.add_argument("--no-pipeline", action="store_true", help="the splits without pipeline parallelism")
    a = ap.parse_args(argv)
    measured: dict[str, list[float]] = {}
    if a.measured and a.measured.exists():
        measured = json.loads(a.measured.read_text())
    print("| run | device (layers) | planned / measured MiB | error | bar |")
    print("|---|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows, host = sweep(
                {n for n in a.only.split(",") if n}, a.quick, Path(tmp), measured, pipeline=not a.no_pipeline
            )
    finally:
        if a.measured:
            a.measured.write_text(json.dumps(measured, indent=0))
    print(summary(rows))
    print("\nthe host (CPU) beside them:" + summary(host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
