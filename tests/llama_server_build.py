"""A real ``llama-server``, ``rpc-server``, ``llama-fit-params`` and ``llama-perplexity`` for the tests, built once from
the pruned llama.cpp of llama-cpp-python's sdist (tests/llama_cpp_source.py): the very archive
``benchmarks/gpu_truth.sh --prepare`` carries to the GPU machine, so every run of the suite proves
that archive builds. The RPC backend is on, so that a split over several devices can run on
loopback (two ``rpc-server`` processes are two more devices).

The verifier's first runner is the user's own llama-server; the tests run the
same llama.cpp build that llama-cpp-python (the oracle) was built from, so
both runners are checked against one llama.cpp. The first run downloads the
sdist through pip (its cache makes that cheap) and builds the targets with
cmake (~20-30 min on 2 cores); the binaries are kept in
``~/.cache/kvadvise-tests/llama-server-<llama-cpp-python version>-<archive sha256>/``
with ``source.json`` (the archive's manifest) and reused by later runs on the same machine.

``llama-perplexity`` came later: a cache folder built before it gets it added (that target alone, in a
build folder of its own under the same cached folder; nothing there is rebuilt or removed).

``KVADVISE_TEST_LLAMA_SERVER=/path/to/llama-server`` uses a binary you have
instead (it must be the same llama.cpp build for the byte-exact checks),
``KVADVISE_TEST_RPC_SERVER`` and ``KVADVISE_TEST_FIT_PARAMS`` the rpc-server and
llama-fit-params of that build (default: beside it), ``KVADVISE_TEST_PERPLEXITY`` its llama-perplexity.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import llama_cpp_source as source

# Read when the test session starts, before the tests' isolated environment replaces XDG_CACHE_HOME.
CACHE = source.CACHE
OVERRIDE = os.environ.get("KVADVISE_TEST_LLAMA_SERVER")
RPC_OVERRIDE = os.environ.get("KVADVISE_TEST_RPC_SERVER")
FIT_OVERRIDE = os.environ.get("KVADVISE_TEST_FIT_PARAMS")
# installed name: CMake target (tools/rpc/CMakeLists.txt names its target ggml-rpc-server)
TARGETS = {
    "llama-server": "llama-server", "rpc-server": "ggml-rpc-server", "llama-fit-params": "llama-fit-params",
    "llama-perplexity": "llama-perplexity",  # verify quality's KL divergence (tools/perplexity)
}  # fmt: skip
PERPLEXITY_OVERRIDE = os.environ.get("KVADVISE_TEST_PERPLEXITY")


class BuildUnavailable(Exception):
    """No way to build here (no cmake or C++ compiler): the test is skipped, saying why."""


def _say(msg: str) -> None:
    print(f"[llama-server build] {msg}", file=sys.stderr, flush=True)


def llama_server(say: Callable[[str], None] = _say) -> Path:
    """The path of a working llama-server binary, building it the first time."""
    if OVERRIDE:
        return Path(OVERRIDE)
    return _built(say) / "llama-server"


def rpc_server(say: Callable[[str], None] = _say) -> Path:
    """The rpc-server built with llama_server() (the same llama.cpp)."""
    if RPC_OVERRIDE:
        return Path(RPC_OVERRIDE)
    return llama_server(say).with_name("rpc-server")


def fit_params(say: Callable[[str], None] = _say) -> Path:
    """llama.cpp's own no-allocation fit (tools/fit-params), built with llama_server()."""
    if FIT_OVERRIDE:
        return Path(FIT_OVERRIDE)
    if OVERRIDE:
        return Path(OVERRIDE).with_name("llama-fit-params")
    return _built(say) / "llama-fit-params"


def perplexity(say: Callable[[str], None] = _say) -> Path:
    """llama.cpp's llama-perplexity (tools/perplexity), built with llama_server(): into the same
    cached folder, once, beside the binaries a cache made before it was a target (nothing rebuilt)."""
    if PERPLEXITY_OVERRIDE:
        return Path(PERPLEXITY_OVERRIDE)
    if OVERRIDE:
        return Path(OVERRIDE).with_name("llama-perplexity")
    home = _built(say)
    binary = home / "llama-perplexity"
    if _works(binary):
        return binary
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _works(binary):
            version = source.llama_cpp_python_version()
            try:
                archive, info = source.pruned_archive(version, say)
            except source.SourceUnavailable as e:
                raise BuildUnavailable(str(e)) from None
            _build(version, archive, info, home, say, {"llama-perplexity": TARGETS["llama-perplexity"]})
    return binary


def built_from(say: Callable[[str], None] = _say) -> dict[str, object]:
    """The manifest of the pruned archive the binaries were built from (tests/llama_cpp_source.py)."""
    return json.loads((_built(say) / "source.json").read_text())


def _built(say: Callable[[str], None]) -> Path:
    """The folder of the binaries built from the pruned archive of llama-cpp-python's llama.cpp."""
    version = source.llama_cpp_python_version()
    try:
        archive, info = source.pruned_archive(version, say)
    except source.SourceUnavailable as e:
        raise BuildUnavailable(str(e)) from None
    home = CACHE / f"llama-server-{version}-{info['archive_sha256'][:12]}{source.cpu_flags()[1]}"
    if _works(home / "llama-server"):
        return home
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:  # two test sessions at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _works(home / "llama-server"):
            _build(version, archive, info, home, say)
    return home


def _works(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "version:" in (p.stdout + p.stderr)


def _build(
    version: str,
    archive: Path,
    info: dict[str, object],
    home: Path,
    say: Callable[[str], None],
    targets: dict[str, str] = TARGETS,
) -> None:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildUnavailable(f"no {tool} on PATH: cannot build llama-server from source here")
    # a later target built alone logs apart: build.log stays the log of the first build
    log = home / ("build.log" if targets is TARGETS else f"build-{'-'.join(targets)}.log")
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        src = source.unpack(archive, Path(tmp))
        build = Path(tmp) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(src), "-B", str(build), *generator, *source.CMAKE_FLAGS]
        configure += [*source.version_flags(info), *source.cpu_flags()[0], "-DGGML_RPC=ON"]  # rpc-server: more devices
        jobs = str(os.cpu_count() or 2)
        names = ", ".join(targets)
        say(f"building {names} from the pruned llama.cpp of llama-cpp-python {version} (once; log: {log}) ...")
        with open(log, "w") as out:
            flags = [a for t in targets.values() for a in ("--target", t)]
            for cmd in (configure, ["cmake", "--build", str(build), *flags, "-j", jobs]):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
                    raise RuntimeError(f"building {names} failed ({' '.join(cmd[:3])} ...):\n{tail}")
        (home / "source.json").write_text(json.dumps(info, indent=2) + "\n")
        # llama-server last: its presence means all are there
        for name, built in sorted(targets.items(), key=lambda kv: kv[0] == "llama-server"):
            shutil.copy2(build / "bin" / built, home / f"{name}.tmp")
            os.replace(home / f"{name}.tmp", home / name)
    say(f"built {names} in {home}")


if __name__ == "__main__":  # build (or find) it by hand: python tests/llama_server_build.py
    print(llama_server())
