"""Ollama's settings as its server reads them from the environment (envconfig/config.go, ollama/ollama
fb3076099687): ``Var`` trims spaces and then quotes (``OLLAMA_NUM_PARALLEL="2"`` is 2); ``Uint`` reads base-10
ASCII digits (``strconv.ParseUint``) and falls back to the default, with a warning in the server's log, on
anything else; ``Bool`` is ``strconv.ParseBool``. kvadvise reads this shell's variables the same way, so
that a plan is for the settings the server will run with."""

from __future__ import annotations

import os

UINT64_DIGITS = 20  # strconv.ParseUint(s, 10, 64): at most 18,446,744,073,709,551,615
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # strconv.ParseBool
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def var(key: str) -> str:
    """envconfig.Var: the value without leading and trailing spaces, then without quotes."""
    return os.environ.get(key, "").strip().strip("\"'")


def uint(key: str, default: int) -> int:
    """envconfig.Uint: a whole number of ASCII digits (``²`` and ``٣`` are not), else the default."""
    s = var(key)
    if not s or not (s.isascii() and s.isdigit()) or len(s) > UINT64_DIGITS or int(s) >= 1 << 64:
        return default
    return int(s)


def gpu_overhead_bytes() -> int:
    """envconfig.GpuOverhead: OLLAMA_GPU_OVERHEAD, bytes Ollama keeps free on each GPU (server/sched.go takes them
    off each GPU's free memory, server/routes.go off each GPU's total before the default context's tier); 0 unset."""
    return uint("OLLAMA_GPU_OVERHEAD", 0)


def boolean(key: str, default: bool) -> bool:
    """envconfig.BoolWithDefault: strconv.ParseBool of the value; unset or empty: ``default``; set to what ParseBool
    cannot read ("yes", "on"): true (envconfig/config.go: "if err != nil { return true }")."""
    s = var(key)
    if not s:
        return default
    return s not in _FALSE
