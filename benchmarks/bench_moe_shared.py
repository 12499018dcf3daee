"""Device and host compute buffers of MoE models, with and without shared experts, at full offload (issue 37):
kvadvise's plan against llama.cpp's own allocation pass (llama-fit-params b11312, no allocation) on a loopback
RPC device, over sparse real-size GGUFs (tests/tinymodels.py).

    python benchmarks/bench_moe_shared.py [--quick] [--only NAME,...]

Prints one markdown row per (model, n_ubatch, flash attention, n_ctx, vocabulary): planned / measured MiB for the
device and the host, and the device's error. A 1,024-token vocabulary shows the layers' peak (what a llama-server
plan reserves: one output row per sequence; llama-fit-params cannot limit the outputs, so the small vocabulary
stands for it); the real vocabulary with the whole batch's logits is the library's reservation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from oracle import REAL_SIZES, dry_run  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.planner.memory import MIB, RunConfig, estimate  # noqa: E402

# (name, recipe, dims, real vocabulary): shared-expert MoE shapes and, as controls, MoE shapes without one
QWEN3NEXT_SMALL = {"n_layer": 8, "n_embd": 512, "n_expert": 16, "n_ff_exp": 256, "n_ff_shexp": 256}
QWEN35_A3B = dict(  # Qwen3.5/3.6-35B-A3B's config.json as a qwen3next (tests/data/hf/qwen3.5-35b-a3b.json)
    n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head=256, n_rot=64, n_ff=5120, n_expert=256, n_expert_used=8,
    n_ff_exp=512, n_ff_shexp=512, d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32,
)  # fmt: skip
MODELS: tuple[tuple[str, str, dict[str, int], int], ...] = (
    ("qwen3next-small", "qwen3next", QWEN3NEXT_SMALL, 0),
    ("qwen3next-small-shexp1024", "qwen3next", {**QWEN3NEXT_SMALL, "n_ff_shexp": 1024}, 0),
    ("qwen3next-small-shexp2048-used2", "qwen3next", {**QWEN3NEXT_SMALL, "n_ff_shexp": 2048}, 0),
    ("qwen3next-80b-a3b", "qwen3next", REAL_SIZES["qwen3next"], 151936),
    ("qwen3.5-35b-a3b", "qwen3next", QWEN35_A3B, 248320),
    ("deepseek-v2-lite", "deepseek2-mla", REAL_SIZES["deepseek2-mla"], 102400),
    ("deepseek-v2-lite-legacy", "deepseek2-legacy", REAL_SIZES["deepseek2-legacy"], 102400),
    ("glm-4.5-air", "glm4moe", REAL_SIZES["glm4moe"], 151552),
    ("qwen2-57b-a14b", "qwen2moe", dict(n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944, n_expert=64,
                                        n_expert_used=8, n_ff_exp=2560, n_ff_shexp=20480), 152064),
    ("qwen1.5-moe-a2.7b", "qwen2moe", dict(n_layer=24, n_embd=2048, n_head=16, n_head_kv=16, n_ff=5632, n_expert=60,
                                           n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632), 151936),
    ("qwen3-30b-a3b", "qwen3moe", REAL_SIZES["qwen3moe"], 151936),
    ("gpt-oss-20b", "gpt-oss", REAL_SIZES["gpt-oss"], 201088),
    ("mixtral-8x7b", "mixtral", REAL_SIZES["mixtral"], 32000),
)


def rows(models: list[str] | None, quick: bool, workdir: Path) -> list[tuple[str, float, float, float, float]]:
    from llama_server_build import fit_params, rpc_server
    from rpc_devices import devices

    binary = fit_params()
    out = []
    with devices(rpc_server(), 1) as eps:
        for name, recipe, dims, vocab in MODELS:
            if models and name not in models:
                continue
            for n_vocab in (1024, vocab) if vocab and not quick else (1024,):
                path = workdir / f"{name}-{n_vocab}.gguf"
                if not path.exists():
                    write_tiny_gguf(path, recipe, n_vocab=n_vocab, n_ctx_train=262144, dims=dims, sparse=True)
                spec = from_gguf(read_file(path))
                for ub in (512, 2048):
                    for fa in ("on", "off"):
                        for n_ctx in (4096,) if quick else (4096, 32768):
                            cfg = RunConfig(n_ctx=n_ctx, n_ubatch=ub, n_batch=max(2048, ub), flash_attn=fa,
                                            runtime="library")  # fmt: skip
                            measured = dry_run(binary, path, cfg, rpc=eps[0])
                            (device,) = [k for k in measured if k.startswith("RPC")]
                            est = estimate(spec, replace(cfg, device="rpc", device_names=(device,)))
                            label = f"{name} v{n_vocab} ub{ub} fa={fa} c{n_ctx}"
                            out.append((label, est.devices[0].compute_bytes / MIB, measured[device],
                                        est.host.compute_bytes / MIB, measured.get("CPU", 0.0)))  # fmt: skip
                            print(_row(out[-1]), flush=True)
    return out


def _row(r: tuple[str, float, float, float, float]) -> str:
    label, dp, dm, hp, hm = r
    err = dp - dm
    return f"| {label} | {dp:.2f} / {dm:.2f} | {err:+.2f} ({err / dm:+.1%}) | {hp:.2f} / {hm:.2f} | {hp - hm:+.2f} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="n_ctx 4096 and the 1,024-token vocabulary only")
    ap.add_argument("--only", default="", help="comma-separated model names")
    a = ap.parse_args()
    print("| run | device planned / measured MiB | device error | host planned / measured MiB | host error |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        rows([m for m in a.only.split(",") if m] or None, a.quick, Path(d))


if __name__ == "__main__":
    main()
