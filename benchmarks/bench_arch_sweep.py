"""Benchmark: kvadvise's device and host compute buffers against llama.cpp's own allocation pass, over the
published shapes of popular non-Qwen model families.

For every case (a family's published layer shapes and vocabulary, written as a sparse GGUF: header only,
tests/tinymodels.py) and every run config (flash attention on/off x n_ctx 4096/32768 at n_batch 2048 /
n_ubatch 512, and LLamaSharp's context: kv_unified, n_batch = n_ubatch = 512; every one reserving the whole
batch's logits, as the library does; llama-fit-params takes no -kvu, and with one sequence a unified cache is
the same single stream), llama-fit-params (b11312, -fitp on: no allocation) reserves the graph with
all layers on one loopback rpc-server device, and prints the device's and the host's compute buffers
(tests/oracle.py dry_run). kvadvise plans the same run (kvadvise.planner.memory.estimate, device "rpc").

The table is the result (no asserts; tests/test_arch_sweep.py holds a few cases): predicted / measured MiB and
the device's error; "UNDER" marks a device or host prediction more than 1 % under llama.cpp's.

    python benchmarks/bench_arch_sweep.py [--only NAME,...] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server_build import fit_params, rpc_server  # noqa: E402
from oracle import REAL_SIZES, dry_run  # noqa: E402
from rpc_devices import devices  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.planner.memory import MIB, RunConfig, estimate  # noqa: E402


@dataclass(frozen=True)
class Case:
    """A published model's shape: a tinymodels recipe, its dimensions and its vocabulary."""

    name: str
    recipe: str
    dims: dict[str, int]
    n_vocab: int


# Shapes from each model's HF config.json (num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, sliding_window, vocab_size).
CASES = (
    Case("llama-3.2-1b", "llama", dict(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head=64, n_ff=8192), 128256),
    Case("llama-3.2-3b", "llama", dict(n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, head=128, n_ff=8192), 128256),
    Case("llama-3.1-8b", "llama", REAL_SIZES["llama"], 128256),
    Case("mistral-7b-v0.3", "llama", dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=14336),
         32768),
    Case("gemma-2-9b", "gemma2", REAL_SIZES["gemma2"], 256000),
    Case("gemma-3-4b", "gemma3", dict(n_layer=34, n_embd=2560, n_head=8, n_head_kv=4, head=256, n_ff=10240,
                                      n_swa=1024), 262208),
    Case("gemma-3-12b", "gemma3", REAL_SIZES["gemma3"], 262208),
    Case("gemma-3-27b", "gemma3", dict(n_layer=62, n_embd=5376, n_head=32, n_head_kv=16, head=128, n_ff=21504,
                                       n_swa=1024), 262208),
    Case("phi-3-mini", "phi3", REAL_SIZES["phi3"], 32064),
    Case("phi-3-medium", "phi3", dict(n_layer=40, n_embd=5120, n_head=40, n_head_kv=10, n_ff=17920), 32064),
    Case("command-r-35b", "command-r", REAL_SIZES["command-r"], 256000),
    Case("command-r7b", "cohere2", REAL_SIZES["cohere2"], 256000),
    Case("gpt-oss-20b", "gpt-oss", REAL_SIZES["gpt-oss"], 201088),
    Case("granite-3.3-8b", "granite", REAL_SIZES["granite"], 49159),
    Case("deepseek-v2-lite", "deepseek2-mla", REAL_SIZES["deepseek2-mla"], 102400),
)  # fmt: skip

CONFIGS: tuple[tuple[str, RunConfig], ...] = tuple(
    (f"fa={fa} c={c}", RunConfig(n_ctx=c, flash_attn=fa, runtime="library"))
    for fa in ("on", "off")
    for c in (4096, 32768)
) + tuple(
    (f"LLamaSharp fa={fa} c={c}", RunConfig(n_ctx=c, flash_attn=fa, n_batch=512, kv_unified=True, runtime="library"))
    for fa in ("on", "off")
    for c in (4096,)
)


@dataclass(frozen=True)
class Row:
    case: str
    config: str
    device_pred: int
    device_meas_mib: float
    host_pred: int
    host_meas_mib: float

    def flags(self) -> str:
        out = []
        if self.device_pred < self.device_meas_mib * MIB * 0.99:
            out.append("UNDER device")
        if self.host_pred < self.host_meas_mib * MIB * 0.99:
            out.append("UNDER host")
        return ", ".join(out)

    def line(self) -> str:
        err = self.device_pred / MIB - self.device_meas_mib
        rel = err / self.device_meas_mib if self.device_meas_mib else 0.0
        return (
            f"| {self.case} | {self.config} | {self.device_pred / MIB:.2f} / {self.device_meas_mib:.2f} | "
            f"{err:+.2f} ({rel:+.1%}) | {self.host_pred / MIB:.2f} / {self.host_meas_mib:.2f} | {self.flags()} |"
        )


def sweep(cases: Sequence[Case], folder: Path, endpoint: str) -> list[Row]:
    rows = []
    binary = fit_params()
    for case in cases:
        path = folder / f"{case.name}.gguf"
        write_tiny_gguf(path, case.recipe, n_vocab=case.n_vocab, n_ctx_train=262144, dims=case.dims, sparse=True)
        spec = from_gguf(read_file(path))
        for label, cfg in CONFIGS:
            measured = dry_run(binary, path, cfg, rpc=endpoint)
            (device,) = [k for k in measured if k.startswith("RPC")]
            est = estimate(spec, replace(cfg, device="rpc", device_names=(device,)))
            rows.append(
                Row(case.name, label, est.devices[0].compute_bytes, measured[device], est.host.compute_bytes,
                    measured.get("CPU", 0.0))
            )  # fmt: skip
            print(rows[-1].line(), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    names = {n for n in args.only.split(",") if n}
    cases = [c for c in CASES if not names or c.name in names]
    print("| model | config | device pred / meas (MiB) | device error | host pred / meas (MiB) | |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, devices(rpc_server(), 1) as eps:
        rows = sweep(cases, Path(tmp), eps[0])
    under = [r for r in rows if r.flags()]
    worst = max((r.device_pred / MIB - r.device_meas_mib for r in rows), default=0.0)
    print(f"\n{len(rows)} runs; {len(under)} with a prediction more than 1 % under; largest device over {worst:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
