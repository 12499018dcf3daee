"""The one llama.cpp source of the tests and of the GPU run: llama-cpp-python's sdist's
``vendor/llama.cpp``, pruned to what a build of llama-server, rpc-server, llama-bench and
llama-fit-params reads.

The test suite's CPU llama-server (tests/llama_server_build.py) is built from the very archive
``benchmarks/gpu_truth.sh --prepare`` carries to the GPU machine (same bytes: the archive is
written deterministically and its sha256 is recorded beside the binary), so every CI run proves
that the pruning keeps what CMake reads. The first device run was lost to a pruned
``tools/ui/ui.h.in`` (issue 24): ``tools/CMakeLists.txt`` adds ``tools/ui`` whenever the server is
built, and ``scripts/ui-assets.cmake`` ``emit_files`` hashes and configures ``ui.h.in`` and
``ui.cpp.in`` even with ``LLAMA_BUILD_UI=OFF``.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Read at import, before the tests' isolated environment replaces XDG_CACHE_HOME.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvadvise-tests"

# The llama.cpp llama-cpp-python 0.3.36 vendors: its sdist's .git records the gitlink; b11312 is the
# release tag of that commit (ghcr.io/ggml-org/llama.cpp:server images print "build 11312 (0c1e57098)").
# Passed to CMake so that `llama-server --version` names the build as a release binary does (the
# sdist has no llama.cpp history: cmake/build-info.cmake would print "0 (unknown)").
KNOWN_BUILDS = {"0c1e57098bba43ac29e6e3b677cdceebdd22334f": 11312}

# Top-level entries of llama.cpp none of the builds reads (LLAMA_BUILD_TESTS/EXAMPLES/APP off):
# documentation, test data, the vocab GGUFs in models/, the Python converters, CI.
_DROP_TOP = {
    ".github", ".devops", ".gemini", ".pi", "app", "benches", "ci", "conversion", "docs", "examples",
    "gguf-py", "grammars", "media", "models", "pocs", "requirements", "skills", "tests",
}  # fmt: skip
# ggml backends other than CPU, CUDA (and HIP/MUSA, which reuse CUDA's sources) and RPC: only
# add_subdirectory'd when their GGML_<NAME> option is on (ggml/src/CMakeLists.txt ggml_add_backend).
_DROP_BACKENDS = {
    "ggml-cann", "ggml-et", "ggml-hexagon", "ggml-metal", "ggml-opencl", "ggml-openvino", "ggml-sycl",
    "ggml-virtgpu", "ggml-vulkan", "ggml-webgpu", "ggml-zdnn", "ggml-zendnn",
}  # fmt: skip
_DROP_SUFFIX = (".gguf", ".mp3", ".mp4", ".wav", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".ico", ".pdf")

# CMake options both builds share: no web UI (neither built with npm nor downloaded: the GPU
# machine has no network), no network libraries, only the tools.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries that survive the build folder
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # tools/ui: an empty asset table, no npm, no download
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
)  # fmt: skip


def keep(rel: str) -> bool:
    """Whether ``rel`` (a path inside llama.cpp/) goes into the pruned archive."""
    parts = rel.split("/")
    if parts[0] in _DROP_TOP:
        return False
    if len(parts) == 1 and (parts[0].startswith("convert_") or parts[0].endswith((".sh", ".nix"))):
        return False
    if parts[:2] == ["ggml", "src"] and len(parts) > 2 and parts[2] in _DROP_BACKENDS:
        return False
    if parts[:2] == ["tools", "ui"]:
        # the web UI's sources (src/, static/, tests/, scripts/) are read only by its npm build; the files
        # beside its CMakeLists (ui.h.in, ui.cpp.in, sources.cmake) are read by every build of the server
        return len(parts) <= 3
    if parts[:2] == ["tools", "server"] and len(parts) > 2 and parts[2] in ("tests", "bench", "public_simplechat"):
        return False
    if len(parts) > 2 and parts[0] == "tools" and parts[2] == "tests":
        return False
    return not rel.lower().endswith(_DROP_SUFFIX)


def llama_cpp_python_version() -> str:
    """The llama-cpp-python this environment has, else the one pyproject.toml's verify extra pins."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        m = re.search(r'"llama-cpp-python==([^"]+)"', (ROOT / "pyproject.toml").read_text())
        if not m:
            raise RuntimeError("pyproject.toml pins no llama-cpp-python") from None
        return m[1]


class SourceUnavailable(Exception):
    """The sdist cannot be had here (no network and no pip cache)."""


def sdist(version: str, say: Callable[[str], None], explicit: Path | None = None) -> Path:
    """llama-cpp-python's sdist (``explicit``, else the tests' cache, else pip download)."""
    name = f"llama_cpp_python-{version}.tar.gz"
    into = CACHE / "sdist"
    for cand in ([explicit] if explicit else []) + [into / name]:
        if cand.is_file():
            return cand
    into.mkdir(parents=True, exist_ok=True)
    say(f"downloading the llama-cpp-python {version} sdist through pip ...")
    cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:"]
    p = subprocess.run([*cmd, "--no-deps", "-d", str(into), "-q"], capture_output=True, text=True)
    if p.returncode != 0 or not (into / name).is_file():
        raise SourceUnavailable(f"pip could not download the llama-cpp-python {version} sdist: {p.stderr[-500:]}")
    return into / name


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rules_sha() -> str:
    """A change of this file (the pruning rules) makes a new archive, and so a new build."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def submodule_commit(src: Path, prefix: str) -> str | None:
    """The llama.cpp commit: the gitlink of vendor/llama.cpp in the sdist's own .git (it ships one)."""
    if shutil.which("git") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(src) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + ".git/")]
        if not members:
            return None
        tar.extractall(tmp, members=members, filter="data")
        p = subprocess.run(
            ["git", "--git-dir", str(Path(tmp) / prefix / ".git"), "ls-tree", "HEAD", "vendor/llama.cpp"],
            capture_output=True,
            text=True,
        )
    m = re.match(r"160000 commit ([0-9a-f]{40})\s", p.stdout)
    return m[1] if m else None


def prune(src: Path, dest: Path) -> dict[str, Any]:
    """Write the pruned llama.cpp of sdist ``src`` to ``dest`` (entries under ``llama.cpp/``).

    The bytes depend only on the sdist and the rules: members in the sdist's order with its
    mtimes, owners cleared, and a gzip header without a timestamp or file name."""
    prefix = src.name.removesuffix(".tar.gz") + "/"
    vendor = prefix + "vendor/llama.cpp/"
    kept = dropped = kept_bytes = 0
    tmp = dest.with_name(dest.name + ".tmp")
    with (
        tarfile.open(src) as sd,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as out,
    ):
        for m in sd:
            if not m.name.startswith(vendor) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len(vendor) :]
            if not rel or rel == ".git" or not keep(rel):
                dropped += 1
                continue
            m.name = "llama.cpp/" + rel
            m.pax_headers = {}  # a pax "path" header would put the old name back on write
            m.uid = m.gid = 0
            m.uname = m.gname = ""
            if m.isfile():
                out.addfile(m, sd.extractfile(m))
                kept += 1
                kept_bytes += m.size
            else:
                out.addfile(m)
    os.replace(tmp, dest)
    commit = submodule_commit(src, prefix)
    return {
        "llama_cpp_commit": commit,
        "llama_cpp_build": KNOWN_BUILDS.get(commit or ""),
        "llama_cpp_python": src.name.removesuffix(".tar.gz").split("-", 1)[1],
        "sdist": src.name,
        "sdist_sha256": sha256_file(src),
        "archive_sha256": sha256_file(dest),
        "rules_sha256": _rules_sha(),
        "files": kept,
        "entries_dropped": dropped,
        "unpacked_bytes": kept_bytes,
        "archive_bytes": dest.stat().st_size,
    }


def pruned_archive(
    version: str, say: Callable[[str], None], explicit_sdist: Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """The pruned archive of llama-cpp-python ``version`` and its manifest, cached in the tests' cache
    (made again when the sdist or these rules change)."""
    home = CACHE / "llama.cpp-source"
    home.mkdir(parents=True, exist_ok=True)
    archive, manifest = home / f"llama.cpp-{version}.tar.gz", home / f"llama.cpp-{version}.json"
    src = sdist(version, say, explicit_sdist)
    if archive.is_file() and manifest.is_file():
        try:
            info = json.loads(manifest.read_text())
        except ValueError:
            info = {}
        if (
            info.get("rules_sha256") == _rules_sha()
            and info.get("sdist_sha256") == sha256_file(src)
            and info.get("archive_sha256") == sha256_file(archive)
        ):
            return archive, info
    say(f"pruning llama.cpp from {src.name} ...")
    info = prune(src, archive)
    manifest.write_text(json.dumps(info, indent=2) + "\n")
    return archive, info


# ggml-cpu's AMX path (the "AMX" extra buffer type, which takes a CPU weight before CPU_REPACK) faults in
# ggml_backend_amx_mul_mat on some Sapphire Rapids machines (ggml-org/llama.cpp#20824, open; seen on this project's
# 2-core CI machine: llama-server and llama-cpp-python both died at the first decode of the Gemma 3 270M). -march=native
# turns AMX on wherever the CPU has it; an explicit -mno-amx-* before it wins (GCC and Clang), so the tests' binaries
# are built without it on x86. Their folder is named for it, so a folder built with AMX is not reused.
NO_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")


def cpu_flags() -> tuple[list[str], str]:
    """CMake flags that keep AMX out of an x86 build, and the tag its cache folder carries ("", elsewhere)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [], ""
    flags = " ".join(NO_AMX)
    return [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"], "-noamx"


def version_flags(info: dict[str, Any]) -> list[str]:
    """-DLLAMA_BUILD_COMMIT/-DLLAMA_BUILD_NUMBER from the manifest, so that --version names the build."""
    flags = []
    if info.get("llama_cpp_commit"):
        flags.append(f"-DLLAMA_BUILD_COMMIT={info['llama_cpp_commit'][:7]}")
    if info.get("llama_cpp_build"):
        flags.append(f"-DLLAMA_BUILD_NUMBER={info['llama_cpp_build']}")
    return flags


def unpack(archive: Path, into: Path) -> Path:
    """The archive's llama.cpp/ under ``into`` (tarfile's data filter: no links out, no devices)."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "llama.cpp"
