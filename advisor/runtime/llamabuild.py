"""Which llama.cpp build a plan is for: given (``--llama-build bNNNN``), read from the installed
``llama-server --version`` ("version: 9410 (031ddb2e0)", common/build-info), or unknown.

An unknown build is planned by kvadvise.planner.builds's newest rules; the notes say so, and what an
older build would take besides.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.planner import builds

if TYPE_CHECKING:
    import subprocess

# llama-cpp-python's version -> the llama.cpp build it vendors (its vendor/llama.cpp submodule): the one
# kvadvise's tests build and run (0c1e570 = b11312, tests/llama_cpp_source.py)
LLAMA_CPP_PYTHON_BUILDS = {"0.3.36": 11312}
VERSION_TIMEOUT_S = 10
VERSION_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class BuildChoice:
    """The build a plan follows, and how it was found (for the plan's notes)."""

    build: int | None  # None: unknown
    source: str  # "--llama-build", the binary that said it, or why it is unknown
    # how the plan names it when not bNNNN: a commit whose build number is not known, planned by the rules
    # of ``build`` (a vendored llama.cpp, kvadvise.backends.ollama.versions)
    label: str | None = None


# An Ollama whose version is not known (nor newer than kvadvise read): planned as the newest release, >= 0.30,
# which builds llama-server from the llama.cpp tag of its LLAMA_CPP_VERSION (b9452 at 0.30.0, ... b10488 at
# 0.32.15): from 0.30.1 (b9479) all after the last rule kvadvise.planner.builds knows of, so b11312's rules.
# A known version is planned at its own pin (kvadvise.backends.ollama.versions).
OLLAMA_BUILD = BuildChoice(builds.REFERENCE, "Ollama >= 0.30.1 runs llama.cpp b9479 or later: b11312's rules")


def detect(binary: str | None = None) -> BuildChoice:
    """The build of ``binary`` (a llama-server), or of the llama-server on PATH; unknown when there is
    none or it does not say. Never raises: a plan goes on for an unknown build. The binary runs in its own
    session, its output is read up to VERSION_MAX_BYTES, and the whole group is killed after
    VERSION_TIMEOUT_S (a program that is not llama-server may ignore --version)."""
    # the process machinery only when a binary is probed: an Ollama plan never needs it (start-up)
    import shutil
    import signal
    import subprocess
    import threading

    path = binary or shutil.which("llama-server")
    if not path:
        return BuildChoice(None, "no llama-server on PATH")
    try:
        p = subprocess.Popen(
            [path, "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        return BuildChoice(None, f"{path} --version failed ({e.__class__.__name__})")
    out_box: list[bytes] = []
    try:
        reader = threading.Thread(target=_read_some, args=(p, out_box), daemon=True)
        reader.start()
        reader.join(VERSION_TIMEOUT_S)
        out = b"".join(out_box)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    build = builds.version_build(out.decode("utf-8", errors="replace"))
    if build is None:
        return BuildChoice(None, f"{path} --version names no build")
    return BuildChoice(build, f"{path} --version")


def _read_some(p: subprocess.Popen[bytes], box: list[bytes]) -> None:
    """At most VERSION_MAX_BYTES of the child's output (a version is one line; a chatty program is cut)."""
    assert p.stdout is not None
    stream = p.stdout
    got = 0
    while got < VERSION_MAX_BYTES:
        chunk = os.read(stream.fileno(), VERSION_MAX_BYTES - got)  # what is there, without waiting for more
        if not chunk:
            return
        box.append(chunk)
        got += len(chunk)


def measured_build(runner_build: str) -> int | None:
    """The build a verify run names (kvadvise.runtime.verification: "b11312 (0c1e570)" from llama-server's
    log, "llama-cpp-python 0.3.36"), None when it does not."""
    if runner_build.startswith("llama-cpp-python "):
        return LLAMA_CPP_PYTHON_BUILDS.get(runner_build.split()[1])
    return builds.version_build(f"build: {runner_build.removeprefix('b')}")


def library_build() -> BuildChoice:
    """The build llama-cpp-python vendors, where kvadvise knows it (``verify`` without a llama-server)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        v = version("llama_cpp_python")
    except PackageNotFoundError:
        return BuildChoice(None, "llama-cpp-python is not installed")
    build = LLAMA_CPP_PYTHON_BUILDS.get(v)
    return BuildChoice(build, f"llama-cpp-python {v}" if build else f"llama-cpp-python {v} (build not known)")


ENV = "KVADVISE_LLAMA_BUILD"  # --llama-build's default, from the environment (the CLI's option and the API alike)


def check_env(text: str) -> None:
    """A KVADVISE_LLAMA_BUILD that names no build is refused naming the variable: "not a llama.cpp build: '0'"
    (or "Invalid value for '--llama-build'") named a flag the user never gave."""
    if text.strip().lower() in ("auto", "unknown"):
        return
    try:
        if not text.strip():
            raise InputError("the value is empty")
        builds.parse(text)
    except InputError as e:
        raise InputError(
            f"{ENV}={text[:40]!r} (in the environment): {e.message}",
            hint="unset it, or give --llama-build bNNNN|auto|unknown (the flag wins over the variable)",
        ) from None


def choose(option: str, *, binary: str | None = None, source: str = "--llama-build") -> BuildChoice:
    """``--llama-build`` (or ``source``: KVADVISE_LLAMA_BUILD): bNNNN (or a version line), ``unknown``, or ``auto``
    (the llama-server given or on PATH)."""
    text = option.strip()
    if text.lower() == "unknown":
        return BuildChoice(None, f"{source} unknown" if source.startswith("--") else f"{source}=unknown")
    if text.lower() == "auto":
        return detect(binary)
    return BuildChoice(builds.parse(text), source)


def notes(choice: BuildChoice, *, runtime: str, older_server_mib: float | None = None) -> tuple[str, ...]:
    """What a plan says about the build it is for, in one note. ``older_server_mib``: how much more the logits
    of a llama-server older than b9467 would take (an unknown build)."""
    if choice.build is not None:
        if choice.build == builds.REFERENCE:
            return ()
        name = choice.label or f"b{choice.build}"
        out = f"planned for llama.cpp {name} ({choice.source}): the memory rules of that build"
        if choice.build > builds.REFERENCE:
            out += f"; kvadvise checked its rules up to b{builds.REFERENCE}: later changes are not known"
        if choice.build < builds.SUPPORTED_FROM:
            out += f"; rules before b{builds.SUPPORTED_FROM} are modelled in part (kvadvise.planner.builds)"
        return (out,)
    out = (
        f"llama.cpp build unknown ({choice.source}): planned for b{builds.REFERENCE}'s rules; --llama-build bNNNN "
        f"names it; a build older than b{builds.F16_MASK_FA} takes more compute memory (an f32 mask)"
    )
    if runtime in ("llama-server", "llama-cli"):
        # before b9467 (ggml-org/llama.cpp#23861) llama-server (and the llama-cli on its context) reserved the logits
        # of the whole batch
        more = f" ({older_server_mib:,.0f} MiB more)" if older_server_mib else ""
        out += f"; a {runtime} older than b{builds.SERVER_OUTPUT_LIMITS} takes the whole batch's logits{more}"
    return (out,)
