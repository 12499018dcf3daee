"""Op offload's weight copies in the first device's compute buffer (issue 37, published row 033): kvadvise's plan
against llama.cpp's own allocation pass of the real graph, with the device op-offloading as CUDA does.

A loopback rpc-server stands for the GPU, as in the rest of the suite; but ggml-rpc has no ``offload_op``
(ggml-rpc.cpp ggml_backend_rpc_device_i: NULL), so a partial plan's CPU-resident weights are never copied in
there. This benchmark builds llama-fit-params once more from the tests' pruned llama.cpp (b11312) with one change,
behind an environment variable: the RPC device answers ``offload_op`` with CUDA's rule (ggml-cuda.cu
ggml_backend_cuda_device_offload_op: get_op_batch_size(op) >= 32; MUL_MAT_ID's batch is ne[2]). Nothing else
moves: ggml_backend_sched_split_graph then assigns each matmul on a host weight to the device (cause "1.off"),
starts a split at each such weight and allocates its copy at the start of the split (ggml-alloc, the device's
compute buffer), as it does on CUDA. What CUDA's own graph_optimize adds (its fusions' allocation dependencies) is
not in this pass.

    python benchmarks/bench_op_offload.py [--only NAME,...]

One row per (model, placement, n_ctx): the device's compute buffer at full offload and with the placement, as
llama.cpp allocates it and as kvadvise plans it (the growth: compute.op_offload_growth), MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import oracle  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from llama_cpp_source import CACHE, CMAKE_FLAGS, cpu_flags  # noqa: E402
from oracle import REAL_SIZES  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.architecture import from_gguf  # noqa: E402
from kvadvise.model.ggml import GGMLType  # noqa: E402
from kvadvise.model.gguf import read_file  # noqa: E402
from kvadvise.model.spec import ModelSpec  # noqa: E402
from kvadvise.planner.compute import op_offload_growth  # noqa: E402
from kvadvise.planner.memory import MIB, RunConfig, cpu_layers_attention_bytes, estimate, resolve  # noqa: E402
from kvadvise.planner.offload import op_offload_bytes  # noqa: E402

ENV = "KVADVISE_RPC_OFFLOAD_OP"
# ggml-cuda.cu (0c1e570) get_op_batch_size and ggml_backend_cuda_device_offload_op, given to the RPC device when
# KVADVISE_RPC_OFFLOAD_OP is set (GGML_OP_OFFLOAD_MIN_BATCH's default, 32)
PATCH_FN = """
static bool ggml_backend_rpc_device_offload_op(ggml_backend_dev_t dev, const ggml_tensor * op) {
    GGML_UNUSED(dev);
    if (getenv("KVADVISE_RPC_OFFLOAD_OP") == nullptr) {
        return false;
    }
    int64_t n;
    switch (op->op) {
        case GGML_OP_GET_ROWS: n = 0; break;
        case GGML_OP_MUL_MAT: n = op->ne[1]; break;
        case GGML_OP_MUL_MAT_ID: case GGML_OP_ROPE: case GGML_OP_ROPE_BACK: n = op->ne[2]; break;
        default: n = ggml_nrows(op);
    }
    return n >= 32;
}

static const struct ggml_backend_device_i ggml_backend_rpc_device_i = {"""
ANCHOR = "\nstatic const struct ggml_backend_device_i ggml_backend_rpc_device_i = {"
SLOT = "/* .offload_op           = */ NULL,"


def _home(archive: Path) -> Path:
    return CACHE / f"op-offload-{hashlib.sha256(archive.read_bytes() + PATCH_FN.encode()).hexdigest()[:12]}"


def cached_fit_params() -> Path | None:
    """:func:`patched_fit_params` where it is already built (or named by KVADVISE_OFFLOAD_FIT_PARAMS), else None:
    for tests that should not spend minutes building it."""
    override = os.environ.get("KVADVISE_OFFLOAD_FIT_PARAMS")
    if override:
        return Path(override)
    archives = sorted((CACHE / "llama.cpp-source").glob("llama.cpp-*.tar.gz"))
    binary = _home(archives[-1]) / "llama-fit-params" if archives else None
    return binary if binary is not None and binary.exists() else None


def patched_fit_params() -> Path:
    """llama-fit-params of the tests' llama.cpp with the RPC device op-offloading as CUDA does (once, cached)."""
    built = cached_fit_params()
    if built is not None:
        return built
    archives = sorted((CACHE / "llama.cpp-source").glob("llama.cpp-*.tar.gz"))
    if not archives:
        from llama_server_build import llama_server

        llama_server()  # writes the pruned archive
        archives = sorted((CACHE / "llama.cpp-source").glob("llama.cpp-*.tar.gz"))
    archive = archives[-1]
    home = _home(archive)
    binary = home / "llama-fit-params"
    if binary.exists():
        return binary
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (src,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        rpc = src / "ggml" / "src" / "ggml-rpc" / "ggml-rpc.cpp"
        text = rpc.read_text()
        if text.count(ANCHOR) != 1 or text.count(SLOT) != 1:
            raise RuntimeError(f"{rpc}: the device interface moved; the patch does not apply")
        rpc.write_text(
            text.replace(ANCHOR, PATCH_FN, 1).replace(SLOT, SLOT.replace("NULL", "ggml_backend_rpc_device_offload_op"))
        )
        build = Path(tmp) / "build"
        cmds = (
            ["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS, *cpu_flags()[0], "-DGGML_RPC=ON"],
            ["cmake", "--build", str(build), "--target", "llama-fit-params", "-j", str(os.cpu_count() or 2)],
        )
        with open(home / "build.log", "w") as log:
            for cmd in cmds:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
        shutil.copy2(build / "bin" / "llama-fit-params", binary)
    return binary


def dry_run(binary: Path, model: Path, cfg: RunConfig, rpc: str, extra: tuple[str, ...]) -> float:
    """The RPC device's compute buffer (MiB) of llama-fit-params' allocation pass, the device op-offloading."""
    found = oracle.dry_run(binary, model, cfg, rpc=rpc, extra=extra, env={**os.environ, ENV: "1"})
    (mib,) = [v for name, v in found.items() if name.startswith("RPC")]
    return mib


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str
    dims: dict[str, int]
    qtypes: dict[str, Q]
    cpu_blocks: tuple[int, ...]  # the blocks whose routed experts (MoE) or whole layer (dense) stay in host memory
    experts: bool  # the experts only (-ot ...exps=CPU) or whole layers (-ngl)


Q4_K_M_MOE = {"ffn_gate_exps": Q.Q4_K, "ffn_up_exps": Q.Q4_K, "ffn_down_exps": Q.Q5_K}  # 033's blk.6 (UD-Q4_K_M)
Q4_K_M_DENSE = {n: Q.Q4_K for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")} | {
    "ffn_down": Q.Q6_K
}
MXFP4_MOE = {n: Q.MXFP4 for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}  # gpt-oss as released
QWEN36_A3B = dict(
    n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head=256, n_rot=64, interval=4, n_expert=256, n_expert_used=8,
    n_ff_exp=512, n_ff_shexp=512, d_conv=4, gdn_head=128, n_k_heads=16, n_v_heads=32,
)  # fmt: skip
CASES = (
    Case("qwen3.6-35b-a3b exps 6-39", "qwen35moe", QWEN36_A3B, Q4_K_M_MOE, tuple(range(6, 40)), True),
    Case("qwen3.6-35b-a3b exps 0-19", "qwen35moe", QWEN36_A3B, Q4_K_M_MOE, tuple(range(20)), True),
    Case("qwen3-30b-a3b exps 0-23", "qwen3moe", REAL_SIZES["qwen3moe"], Q4_K_M_MOE, tuple(range(24)), True),
    Case("qwen3-30b-a3b exps f16 0-23", "qwen3moe", REAL_SIZES["qwen3moe"], {}, tuple(range(24)), True),
    Case("gpt-oss-20b exps 0-11", "gpt-oss", REAL_SIZES["gpt-oss"], MXFP4_MOE, tuple(range(12)), True),
    Case("llama-3.1-8b -ngl 16", "llama", REAL_SIZES["llama"], Q4_K_M_DENSE, tuple(range(16)), False),
    Case("qwen2.5-7b -ngl 14", "qwen2", REAL_SIZES["qwen2"], Q4_K_M_DENSE, tuple(range(14)), False),
    Case("qwen3-0.6b -ngl 14", "qwen3", REAL_SIZES["qwen3"], Q4_K_M_DENSE, tuple(range(14)), False),
    Case("gemma-3-12b -ngl 24", "gemma3", REAL_SIZES["gemma3"], Q4_K_M_DENSE, tuple(range(24)), False),
    # one layer on the CPU: whether a copy lands above does not wait for a second layer
    Case("qwen3-0.6b -ngl 27", "qwen3", REAL_SIZES["qwen3"], Q4_K_M_DENSE, (0,), False),
    Case("llama-3.1-8b -ngl 31", "llama", REAL_SIZES["llama"], Q4_K_M_DENSE, (0,), False),
    # and across architectures (the CPU layers up to the first full-attention one): Qwen2/3, Phi-3, Command-R and
    # Granite land a copy above, Llama, Gemma 2/3 and Cohere2 do not; never more than one
    *(
        Case(f"{r} layers 0-{n} on the CPU", r, REAL_SIZES[r], Q4_K_M_DENSE, tuple(range(n + 1)), False)
        for r, n in (("qwen2", 0), ("gemma2", 1), ("phi3", 0), ("command-r", 0), ("cohere2", 3), ("granite", 0))
    ),
)
ARCH_SWEEP = {c.name for c in CASES[-6:]}
N_CTX = (8192, 65536)
# (flash attention, cache type) of each row; the dense models' CPU layers also with a q8_0 cache and without flash
# attention (the scores, not the copies, are their peak there)
RUNS = (("on", "f16"),)
DENSE_RUNS = (("on", "f16"), ("on", "q8_0"), ("off", "f16"))


def model(case: Case, folder: Path) -> Path:
    """The case's sparse GGUF (header only: the allocation pass reads no weights)."""
    path = folder / f"{case.name.replace(' ', '_')}.gguf"
    if not path.exists():
        write_tiny_gguf(path, case.recipe, n_vocab=1024, n_ctx_train=262144, dims=case.dims, sparse=True,
                        qtypes=case.qtypes)  # fmt: skip
    return path


def config(fa: str, cache: str, n_ctx: int) -> RunConfig:
    kv_type = GGMLType[cache.upper()]
    return RunConfig(n_ctx=n_ctx, flash_attn=fa, runtime="library", device="rpc", type_k=kv_type, type_v=kv_type)


def planned(case: Case, spec: ModelSpec, cfg: RunConfig) -> tuple[int, int]:
    """kvadvise's device compute at full offload and with the case's placement, as
    kvadvise.planner.offload.partial_offload plans it: the weights' copies in a layer's live set
    (offload.op_offload_bytes, compute.op_offload_growth) or, for whole layers on the CPU, their attention with copies
    of their K and V (memory.cpu_layers_attention_bytes), whichever is higher; those rules are CUDA's (alignment 128)."""
    full = estimate(spec, cfg).devices[0].compute_bytes
    copy = op_offload_bytes(spec, case.cpu_blocks, "cuda", cfg.n_ubatch) or 0
    plan = full + op_offload_growth(spec, resolve(spec, cfg), copy)
    if not case.experts:
        cuda = resolve(spec, replace(cfg, device="cuda"))
        plan = max(plan, cpu_layers_attention_bytes(spec, cuda, range(len(case.cpu_blocks))))
    return full, plan


def grid(case: Case) -> list[tuple[str, str, int]]:
    if case.name in ARCH_SWEEP:
        return [("on", "f16", 65536)]
    contexts = (*N_CTX, 262144) if case.recipe == "qwen35moe" else N_CTX
    runs = RUNS if case.experts else DENSE_RUNS
    # without flash attention the scores of 64k cells: seconds of allocation pass, nothing new
    return [(fa, cache, n) for (fa, cache), n in product(runs, contexts) if fa == "on" or n <= 8192]


def placement_args(case: Case, spec: ModelSpec) -> tuple[str, ...]:
    if case.experts:
        blocks = "|".join(str(b) for b in case.cpu_blocks)
        extra: tuple[str, ...] = ("-ot", rf"blk\.({blocks})\.ffn_(up|gate|down)_exps=CPU")
    else:
        extra = ("-ngl", str(spec.n_layer - len(case.cpu_blocks)))
    # with a CUDA device the weights left in host memory go to its pinned host buffer (CUDA_Host: the first entry of
    # src/llama-model.cpp make_cpu_buft_list), never to CPU_REPACK, whose weights are not op-offloaded
    # (ggml_backend_sched_backend_id_from_cur: ggml_backend_buffer_is_host); ggml-rpc has no host buffer type, so
    # --no-repack stands for it
    return (*extra, "--no-repack")


def rows(only: set[str] | None, workdir: Path) -> list[dict[str, object]]:
    from llama_server_build import rpc_server
    from rpc_devices import devices

    binary = patched_fit_params()
    out: list[dict[str, object]] = []
    with devices(rpc_server(), 1) as (endpoint,):
        for case in CASES:
            if only and case.name not in only:
                continue
            path = model(case, workdir)
            spec = from_gguf(read_file(path))
            for fa, cache, n_ctx in grid(case):
                cfg = config(fa, cache, n_ctx)
                full = dry_run(binary, path, cfg, endpoint, ("--no-repack",))
                grown = dry_run(binary, path, cfg, endpoint, placement_args(case, spec))
                plan_full, plan = planned(case, spec, cfg)
                print(
                    f"| {case.name} | {fa} | {cache} | {n_ctx} | {full:.2f} / {plan_full / MIB:.2f} | "
                    f"{grown:.2f} / {plan / MIB:.2f} | {100 * (plan / MIB - grown) / grown:+.1f} % |",
                    flush=True,
                )
                out.append(dict(case=case.name, flash_attn=fa, cache=cache, n_ctx=n_ctx, full_mib=full,
                                placed_mib=grown))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="case names, comma-separated")
    ap.add_argument(
        "--json", type=Path, help="write the measured rows here (tests/data/measured/op_offload_b11312.json)"
    )
    args = ap.parse_args()
    print("| model, placement | flash attention | cache | n_ctx | full offload: llama.cpp / kvadvise | placed: llama.cpp / "
          "kvadvise | error |\n|---|---|---|---|---|---|---|")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        measured = rows(set(args.only.split(",")) if args.only else None, Path(tmp))
    if args.json:
        source = (
            "benchmarks/bench_op_offload.py: llama-fit-params b11312 (0c1e570), the RPC device op-offloading as CUDA"
        )
        args.json.write_text(json.dumps({"source": source, "rows": measured}, indent=1) + "\n")


if __name__ == "__main__":
    main()
