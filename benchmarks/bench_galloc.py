"""Benchmark: the device's compute buffer of dense llama-architecture models and qwen3moe as ggml-alloc sizes it,
against kvadvise's exact plan (kvadvise.planner.galloc over kvadvise.planner.llama_graph) and its analytic model.

Grid: Llama 3.2 1B / 3B, Llama 3.1 8B, Mistral 7B v0.3, Granite 3.3 8B, Phi-3 mini / medium, Qwen2.5 3B / 7B,
Qwen3 4B / 8B, Qwen3-30B-A3B and two tiny qwen3moe (published shapes, sparse GGUFs: header only,
tests/tinymodels.py) x flash attention on/off x n_ctx 2048/4096/6144/8192/32768 x the logits reserved for
the whole batch (the library: llama-fit-params -fitp on, tests/oracle.py dry_run) or for one row
(llama-server b11312: n_outputs_max = n_parallel = 1; its -fit pass, a no-allocation reserve of the same
graph, read from its -v log: llama-fit-params takes no n_outputs_max). All layers on one loopback rpc-server
device; n_batch 2048, n_ubatch 512. "agree" is equality to the 0.01 MiB llama.cpp prints.

    python benchmarks/bench_galloc.py [--only NAME,...] [--host-experts]

``--host-experts``: qwen3moe shapes with the routed experts of the first N blocks in host memory (--n-cpu-moe 0, 1, 2,
3 and the last three counts) at three configs, llama-fit-params against compute.host_experts_device_compute.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_arch_sweep import CASES, Case  # noqa: E402
from llama_server_build import fit_params, llama_server, rpc_server  # noqa: E402
from oracle import dry_run, fit_params_args  # noqa: E402
from rpc_devices import devices  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.planner.compute import analytic_device_compute  # noqa: E402
from kvadvise.planner.memory import MIB, RunConfig, estimate, resolve  # noqa: E402

# Qwen shapes from each model's HF config.json (num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, vocab_size)
QWEN_CASES = (
    Case("qwen2.5-3b", "qwen2", dict(n_layer=36, n_embd=2048, n_head=16, n_head_kv=2, n_ff=11008), 151936),
    Case("qwen2.5-7b", "qwen2", dict(n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944), 152064),
    Case("qwen3-4b", "qwen3", dict(n_layer=36, n_embd=2560, n_head=32, n_head_kv=8, head=128, n_ff=9728), 151936),
    Case("qwen3-8b", "qwen3", dict(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=12288), 151936),
)
# qwen3moe (build_moe_ffn replayed): Qwen3-30B-A3B's widths (HF config.json: num_experts 128, num_experts_per_tok 8,
# moe_intermediate_size 768; 8 of its 48 layers: b11312's graph of uniform blocks allocates the same from the third on)
# and two tiny shapes (4 of 256 experts; one used expert, whose sum is a ggml_cont)
MOE_CASES = (
    Case("qwen3-30b-a3b", "qwen3moe", dict(n_layer=8, n_embd=2048, n_head=32, n_head_kv=4, head=128, n_ff=6144,
                                           n_expert=128, n_expert_used=8, n_ff_exp=768), 151936),
    Case("qwen3moe-tiny", "qwen3moe", dict(n_layer=6, n_embd=1024, n_head=16, n_head_kv=4, head=64, n_expert=256,
                                           n_expert_used=4, n_ff_exp=256), 32000),
    Case("qwen3moe-tiny-u1", "qwen3moe", dict(n_layer=6, n_embd=1024, n_head=16, n_head_kv=4, head=64, n_expert=16,
                                              n_expert_used=1, n_ff_exp=512), 32000),
)  # fmt: skip
LLAMA_CASES = tuple(c for c in CASES if c.recipe in ("llama", "phi3", "granite")) + QWEN_CASES + MOE_CASES
N_CTX = (2048, 4096, 6144, 8192, 32768)
OUTPUTS = {"batch": "library", "1 row": "llama-server"}
_COMPUTE = re.compile(r"sched_reserve:\s+(RPC\d+\[[^\]]*\]) compute buffer size =\s+([\d.]+) MiB")


def server_fit_pass(model: Path, cfg: RunConfig, timeout_s: float = 120) -> float:
    """The RPC device's compute buffer (MiB) of llama-server's -fit pass (common_fit_params: the model and
    context made with no_alloc, n_outputs_max as the server sets it), read from its -v log. The server is
    stopped there, while it goes on to send the weights; the rpc-server it was sending them to may not survive
    that, so each call has its own."""
    tail: list[str] = []
    for _ in range(3):
        with devices(rpc_server(), 1) as eps:
            args = fit_params_args(cfg, rpc=eps[0])
            cmd = [str(llama_server()), "-m", str(model), "-fit", "on", "-v", "--port", "0", *args]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                assert p.stderr is not None
                t0 = time.monotonic()
                for line in p.stderr:
                    tail = [*tail[-20:], line]
                    m = _COMPUTE.search(line)
                    if m:
                        return float(m.group(2))
                    if time.monotonic() - t0 > timeout_s:
                        break
            finally:
                p.kill()
                p.wait()
    raise RuntimeError(f"llama-server printed no RPC compute buffer: {model} {cfg}\n{''.join(tail)}")


@dataclass(frozen=True)
class Row:
    case: str
    config: str
    measured_mib: float
    analytic: int
    planned: int

    @property
    def agrees(self) -> bool:
        return round(self.planned / MIB, 2) == self.measured_mib

    def line(self) -> str:
        a = self.analytic / MIB
        p = self.planned / MIB
        return (
            f"| {self.case} | {self.config} | {self.measured_mib:.2f} | {a:.2f} ({a - self.measured_mib:+.2f}) | "
            f"{p:.2f} ({p - self.measured_mib:+.2f}) | {'yes' if self.agrees else 'NO'} |"
        )


def sweep(cases: Sequence[Case], folder: Path, endpoint: str) -> list[Row]:
    rows = []
    for case in cases:
        path = folder / f"{case.name}.gguf"
        write_tiny_gguf(path, case.recipe, n_vocab=case.n_vocab, n_ctx_train=262144, dims=case.dims, sparse=True)
        spec = from_gguf(read_file(path))
        for outputs, runtime in OUTPUTS.items():
            for fa in ("on", "off"):
                for n_ctx in N_CTX:
                    cfg = RunConfig(n_ctx=n_ctx, flash_attn=fa, runtime=runtime)
                    if runtime == "llama-server":
                        measured = server_fit_pass(path, cfg)
                    else:
                        found = dry_run(fit_params(), path, cfg, rpc=endpoint)
                        (measured,) = [v for k, v in found.items() if k.startswith("RPC")]
                    plan = replace(cfg, device="rpc", device_names=("RPC0",))
                    est = estimate(spec, plan)
                    analytic = analytic_device_compute(spec, resolve(spec, plan))
                    rows.append(
                        Row(case.name, f"fa={fa} c={n_ctx} outputs={outputs}", measured, analytic,
                            est.devices[0].compute_bytes)
                    )  # fmt: skip
                    print(rows[-1].line(), flush=True)
    return rows


# --host-experts: bench_fit's tiny qwen3moe and the 8-used-experts shape of tests/test_attack_round21a.py beside MOE_CASES
HOST_EXPERT_CASES = (
    *MOE_CASES,
    Case("qwen3moe-bench-fit", "qwen3moe", dict(n_layer=8, n_embd=512, n_head=8, n_head_kv=2, head=64, n_expert=16,
                                                n_expert_used=4, n_ff_exp=256), 32000),
    Case("qwen3moe-u8", "qwen3moe", dict(n_layer=8, n_embd=1024, n_head=16, n_head_kv=4, head=64, n_expert=16,
                                         n_expert_used=8, n_ff_exp=512), 8000),
)  # fmt: skip
HOST_CONFIGS = (
    RunConfig(n_ctx=4096, flash_attn="on", runtime="library"),
    RunConfig(n_ctx=16384, flash_attn="on", n_ubatch=2048, n_batch=2048, runtime="library"),
    RunConfig(n_ctx=8192, flash_attn="off", runtime="library"),
)


def host_experts_sweep(cases: Sequence[Case], folder: Path, endpoint: str) -> tuple[int, int]:
    """--n-cpu-moe N on one rpc-server (llama-fit-params) against compute.host_experts_device_compute; prints a row per
    case and config, returns (exact, runs)."""
    from kvadvise.planner.compute import device_compute_bytes, host_experts_device_compute

    exact = runs = 0
    print("| model | config | --n-cpu-moe N: measured MiB (kvadvise's error) |\n|---|---|---|")
    for case in cases:
        path = folder / f"{case.name}.gguf"
        write_tiny_gguf(path, case.recipe, n_vocab=case.n_vocab, n_ctx_train=262144, dims=case.dims, sparse=True)
        spec = from_gguf(read_file(path))
        for cfg in HOST_CONFIGS:
            lay = resolve(spec, replace(cfg, device="rpc", device_names=("RPC0",)))
            cells = []
            for n in sorted({0, 1, 2, 3, spec.n_layer - 2, spec.n_layer - 1, spec.n_layer}):
                found = dry_run(fit_params(), path, cfg, rpc=endpoint, extra=["--n-cpu-moe", str(n)] if n else [])
                (measured,) = [v for k, v in found.items() if k.startswith("RPC")]
                planned = (host_experts_device_compute(spec, lay, n) if n else device_compute_bytes(spec, lay)) or 0
                runs += 1
                # as printed: the -v log's 0.01 MiB, or the stdout table's whole MiB where that line was lost at exit
                exact += f"{planned / MIB:.2f}" == f"{measured:.2f}" or (
                    measured.is_integer() and round(planned / MIB) == measured
                )
                cells.append(f"{n}: {measured:.2f} ({planned / MIB - measured:+.2f})")
            config = f"c={cfg.n_ctx} ub={cfg.n_ubatch} fa={cfg.flash_attn}"
            print(f"| {case.name} | {config} | {', '.join(cells)} |", flush=True)
    return exact, runs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--host-experts", action="store_true",
                    help="qwen3moe with --n-cpu-moe 0 to all (HOST_EXPERT_CASES) instead of the full offload grid")  # fmt: skip
    args = ap.parse_args(argv)
    names = {n for n in args.only.split(",") if n}
    if args.host_experts:
        with tempfile.TemporaryDirectory() as tmp, devices(rpc_server(), 1) as eps:
            cases = [c for c in HOST_EXPERT_CASES if not names or c.name in names]
            exact, runs = host_experts_sweep(cases, Path(tmp), eps[0])
        print(f"\n{runs} runs; kvadvise's plan as llama.cpp printed it on {exact}")
        return 0
    cases = [c for c in LLAMA_CASES if not names or c.name in names]
    print("| model | config | measured (MiB) | analytic (error) | exact plan (error) | agree |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, devices(rpc_server(), 1) as eps:
        rows = sweep(cases, Path(tmp), eps[0])
    before = sum(round(r.analytic / MIB, 2) == r.measured_mib for r in rows)
    after = sum(r.agrees for r in rows)
    worst = max(rows, key=lambda r: abs(r.analytic / MIB - r.measured_mib))
    print(f"\n{len(rows)} runs; analytic model exact on {before}, exact plan on {after}; the analytic model's worst: "
          f"{worst.case} {worst.config} {worst.analytic / MIB - worst.measured_mib:+.2f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
