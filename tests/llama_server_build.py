"""A real ``llama-server`` and ``rpc-server`` for the tests, built once from the llama.cpp inside
llama-cpp-python's sdist (with the RPC backend, so that a split over several devices can run on
loopback: two ``rpc-server`` processes are two more devices).

The verifier's first runner is the user's own llama-server; the tests run the
same llama.cpp build that llama-cpp-python (the oracle) was built from, so
both runners are checked against one llama.cpp. The first run downloads the
sdist through pip (its cache makes that cheap) and builds the ``llama-server``
target with cmake (~20-30 min on 2 cores); the binary is kept in
``~/.cache/kvadvise-tests/llama-server-<llama-cpp-python version>/`` and
reused by later runs on the same machine.

``KVADVISE_TEST_LLAMA_SERVER=/path/to/llama-server`` uses a binary you have
instead (it must be the same llama.cpp build for the byte-exact checks), and
``KVADVISE_TEST_RPC_SERVER`` the rpc-server of that build (default: beside it).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

# Read when the test session starts, before the tests' isolated environment replaces XDG_CACHE_HOME.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvadvise-tests"
OVERRIDE = os.environ.get("KVADVISE_TEST_LLAMA_SERVER")
RPC_OVERRIDE = os.environ.get("KVADVISE_TEST_RPC_SERVER")


class BuildUnavailable(Exception):
    """No way to build here (no cmake or C++ compiler): the test is skipped, saying why."""


def _say(msg: str) -> None:
    print(f"[llama-server build] {msg}", file=sys.stderr, flush=True)


def llama_server(say: Callable[[str], None] = _say) -> Path:
    """The path of a working llama-server binary, building it the first time."""
    if OVERRIDE:
        return Path(OVERRIDE)
    version = importlib.metadata.version("llama-cpp-python")
    home = CACHE / f"llama-server-{version}-rpc"
    binary = home / "llama-server"
    if _works(binary):
        return binary
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:  # two test sessions at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _works(binary):
            _build(version, home, binary, say)
    return binary


def rpc_server(say: Callable[[str], None] = _say) -> Path:
    """The rpc-server built with llama_server() (the same llama.cpp)."""
    if RPC_OVERRIDE:
        return Path(RPC_OVERRIDE)
    server = llama_server(say)
    return server.with_name("rpc-server")


def _works(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "version:" in (p.stdout + p.stderr)


def _build(version: str, home: Path, binary: Path, say: Callable[[str], None]) -> None:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildUnavailable(f"no {tool} on PATH: cannot build llama-server from source here")
    sdist = _sdist(version, CACHE / "sdist", say)
    log = home / "build.log"
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        src = _unpack_llama_cpp(sdist, Path(tmp))
        build = Path(tmp) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = [
            "cmake", "-S", str(src), "-B", str(build), *generator,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary that survives the temp dir
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # no web UI download
            "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
            "-DGGML_RPC=ON",  # rpc-server: more devices on loopback (tools/rpc)
        ]  # fmt: skip
        jobs = str(os.cpu_count() or 2)
        say(f"building llama-server from llama-cpp-python {version}'s llama.cpp (once; log: {log}) ...")
        with open(log, "w") as out:
            targets = ["--target", "llama-server", "--target", "ggml-rpc-server"]  # tools/rpc/CMakeLists.txt
            for cmd in (configure, ["cmake", "--build", str(build), *targets, "-j", jobs]):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
                    raise RuntimeError(f"building llama-server failed ({' '.join(cmd[:3])} ...):\n{tail}")
        # llama-server last: its presence means both are there
        for built, name in (("ggml-rpc-server", "rpc-server"), ("llama-server", "llama-server")):
            shutil.copy2(build / "bin" / built, home / f"{name}.tmp")
            os.replace(home / f"{name}.tmp", home / name)
    say(f"built {binary}")


def _sdist(version: str, into: Path, say: Callable[[str], None]) -> Path:
    name = f"llama_cpp_python-{version}.tar.gz"
    path = into / name
    if path.is_file():
        return path
    into.mkdir(parents=True, exist_ok=True)
    say(f"downloading the llama-cpp-python {version} sdist through pip ...")
    cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:"]
    cmd += ["--no-deps", "-d", str(into), "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not path.is_file():  # no network or no index: nothing to build from
        raise BuildUnavailable(f"pip could not download the llama-cpp-python {version} sdist: {p.stderr[-500:]}")
    return path


def _unpack_llama_cpp(sdist: Path, into: Path) -> Path:
    """Only vendor/llama.cpp/ of the sdist, with tarfile's data filter (no links out, no devices)."""
    prefix = sdist.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise RuntimeError(f"{sdist} has no {prefix}")
        tar.extractall(into, members=members, filter="data")
    return into / prefix.rstrip("/")


if __name__ == "__main__":  # build (or find) it by hand: python tests/llama_server_build.py
    print(llama_server())
