"""The GPU catalogue: the cards of profiles/gpus.json, and finding one by a name a person or a
driver gives (``--gpu 4090``, NVML's "NVIDIA GeForce RTX 4090", an AMD PCI id).

The hardware a plan is for (kvadvise.planner.hardware) is built from these entries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kvadvise.errors import InputError

GIB = 1 << 30

# Apple silicon: how much of the unified memory the GPU may wire by default
# (Metal's MTLDevice.recommendedMaxWorkingSetSize, with ``sysctl
# iogpu.wired_limit_mb`` left at 0). The rule is the one Ollama used before it
# read the value from Metal: <= 36 GiB of RAM -> 2/3, above -> 3/4
# (https://github.com/ollama/ollama/blob/08f1e18965c15648504fc5ec367134898e92ec6d/gpu/gpu_darwin.go).
# llama.cpp logs agree: 16 GB -> 10922.67 MB, 32 GB -> 21845.34 MB (2/3),
# 96 GB -> 73728 MB (3/4). It is conservative: a 36 GB M3 Pro was seen at
# 28991 MB (ollama#2370), and newer macOS allows more on 128 GB machines.
# profiles/gpus.json ("apple_gpu_share") keeps the sources and caveats.
APPLE_SHARE_THRESHOLD_BYTES = 36 * GIB
APPLE_SHARE_SMALL = (2, 3)
APPLE_SHARE_LARGE = (3, 4)
# What macOS itself holds of a Mac's memory, which a plan for a Mac of the card list leaves it (its RAM is the
# installed memory, not what is free, as MemAvailable is on Linux): about 4 GB at idle (jundot/omlx#1533: a
# headless 64 GB M2 Max; 3.5-3.6 GB wired on a 24 GB Mac mini, john-rocky/apple-silicon-llm-bench#7); a desktop
# with other programs open holds more (--ram SIZE says what is free)
MACOS_BYTES = 4 * GIB
# The llama-server process beside its buffers (code, libraries, the CUDA runtime's host side, the HTTP
# server): about 450 MB measured in a container (ggml-org/llama.cpp#27725); kept in every plan's RAM (hostram)
PROCESS_BYTES = 512 << 20


def apple_gpu_share_bytes(ram_bytes: int) -> int:
    """Bytes of unified memory the GPU of an Apple silicon Mac may use by default."""
    num, den = APPLE_SHARE_SMALL if ram_bytes <= APPLE_SHARE_THRESHOLD_BYTES else APPLE_SHARE_LARGE
    return ram_bytes * num // den


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One entry of profiles/gpus.json."""

    id: str
    name: str
    vendor: str
    aliases: tuple[str, ...]
    nvml_names: tuple[str, ...]
    memory_bytes: int  # the published size (Apple: the whole unified RAM)
    nvml_total_bytes: int | None  # what NVML reports as total, when known
    bandwidth_bytes_per_s: int
    unified_memory: bool
    source: str
    backend: str = "cuda"  # cuda (NVIDIA), metal (Apple), rocm (AMD), vulkan, sycl (Intel)
    pci_ids: tuple[str, ...] = ()  # AMD cards: the PCI device ids the driver reports (amdgpu sysfs)
    integrated: bool = False  # an APU: its VRAM is a carve-out of system RAM, of any size
    fp16_tflops: float | None = None  # FP16 tensor peak, dense (prompt processing); fp16_tflops_basis: where from
    fp16_tflops_basis: str | None = None
    # the card's decode class where its architecture reads a different share of its bandwidth than its backend's
    # default (kvadvise.planner.speed.EFFICIENCY["rocm-gcn"]: "gcn" for gfx906); None: the backend's default
    speed_class: str | None = None
    # an NVIDIA card's published boost clock (MHz; boost_clock_source: where from): the decode estimate's fixed time
    # per layer scales with it (kvadvise.planner.speed.CLOCK_REFERENCE_HZ); None: not known
    boost_clock_mhz: int | None = None

    @property
    def clock_hz(self) -> float:
        """The boost clock in Hz (0: not known), as kvadvise.planner.speed.Device takes it."""
        return (self.boost_clock_mhz or 0) * 1e6

    @property
    def usable_bytes(self) -> int:
        """What a plan may use: NVML's total when known, Apple's GPU share, else the published size."""
        if self.unified_memory:
            return apple_gpu_share_bytes(self.memory_bytes)
        return self.nvml_total_bytes if self.nvml_total_bytes is not None else self.memory_bytes


def _profile_from_json(entry: dict[str, Any]) -> GpuProfile:
    nvml_total = entry.get("nvml_total_bytes")
    return GpuProfile(
        id=str(entry["id"]),
        name=str(entry["name"]),
        vendor=str(entry["vendor"]),
        aliases=tuple(str(a) for a in entry.get("aliases", ())),
        nvml_names=tuple(str(n) for n in entry.get("nvml_names", ())),
        memory_bytes=int(entry["memory_bytes"]),
        nvml_total_bytes=None if nvml_total is None else int(nvml_total),
        bandwidth_bytes_per_s=int(entry["bandwidth_bytes_per_s"]),
        unified_memory=bool(entry.get("unified_memory", False)),
        source=str(entry["source"]),
        backend=str(entry.get("backend") or ("metal" if entry["vendor"] == "apple" else "cuda")),
        pci_ids=tuple(str(i).lower() for i in entry.get("pci_ids", ())),
        integrated=bool(entry.get("integrated", False)),
        fp16_tflops=float(entry["fp16_tflops"]) if entry.get("fp16_tflops") else None,
        fp16_tflops_basis=str(entry["fp16_tflops_basis"]) if entry.get("fp16_tflops_basis") else None,
        speed_class=str(entry["speed_class"]) if entry.get("speed_class") else None,
        boost_clock_mhz=int(entry["boost_clock_mhz"]) if entry.get("boost_clock_mhz") else None,
    )


@lru_cache(maxsize=1)
def load_profiles() -> tuple[GpuProfile, ...]:
    """Every GPU of profiles/gpus.json, in file order (read once)."""
    from kvadvise.profiles import read_text

    text = read_text("gpus.json")
    data = json.loads(text)
    return tuple(_profile_from_json(e) for e in data["gpus"])


def list_profiles() -> list[tuple[str, str]]:
    """(id, display name) of every GPU profile, in file order."""
    return [(p.id, p.name) for p in load_profiles()]


# Name matching works on tokens: lower case, split on anything not a letter or
# digit and between letters and digits ("RTX4090" -> rtx 4090, "a100-80gb" ->
# a 100 80 gb). Vendor words carry no information.
_STOPWORDS = frozenset({"nvidia", "geforce", "tesla", "apple", "gpu"})
_TOKEN_ALIASES = {"gib": "gb"}
# A profile with one of these tokens is a different card from the one without
# it (RTX 4060 vs 4060 Ti, M3 vs M3 Pro): it only matches a query that says so.
_VARIANT_TOKENS = frozenset({"ti", "super", "pro", "max", "ultra"})


_WORD_RUN = re.compile(r"[a-z0-9]+")
_LETTERS_OR_DIGITS = re.compile(r"[a-z]+|[0-9]+")


def _tokens(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for run in _WORD_RUN.findall(text.lower()):
        for tok in _LETTERS_OR_DIGITS.findall(run):
            tok = _TOKEN_ALIASES.get(tok, tok)
            if tok not in _STOPWORDS:
                out.append(tok)
    return tuple(out)


@lru_cache(maxsize=1)
def _all_spellings() -> tuple[tuple[GpuProfile, tuple[tuple[str, ...], ...]], ...]:
    """Each profile with the tokens of its id, name and aliases, worked out once per process: a
    lookup then compares tuples instead of tokenizing all 77 cards again (compare looks up many)."""
    return tuple((p, (_tokens(p.id), _tokens(p.name), *(_tokens(a) for a in p.aliases))) for p in load_profiles())


def _match_profiles(query: str) -> tuple[list[GpuProfile], list[GpuProfile]]:
    """(matches, loose candidates): exact spelling first, then token subsets."""
    q = _tokens(query)
    if not q:
        return [], []
    spelled = _all_spellings()
    exact = [p for p, spellings in spelled if q in spellings]
    if exact:
        return exact, exact
    qs = set(q)
    loose = [(p, spellings) for p, spellings in spelled if any(qs <= set(s) for s in spellings)]
    strict = [p for p, spellings in loose if not ((set(spellings[0]) & _VARIANT_TOKENS) - qs)]  # [0]: the id's
    return strict, [p for p, _ in loose]


def _close_names(query: str, loose: Sequence[GpuProfile]) -> list[str]:
    if loose:  # every query token is there, a variant word is missing (4060 -> 4060 Ti)
        return [p.id for p in loose][:8]
    from difflib import get_close_matches

    ids = [p.id for p in load_profiles()]
    return get_close_matches(query.lower().strip(), ids, n=5, cutoff=0.6)


def find_profile(name: str) -> GpuProfile:
    """The one profile ``name`` designates (forgiving), or InputError."""
    matches, loose = _match_profiles(name)
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        ids = ", ".join(p.id for p in matches)
        raise InputError(
            f"GPU profile {name!r} is ambiguous: it matches {ids}",
            hint="pass one of those ids, e.g. --gpu " + matches[0].id,
        )
    close = _close_names(name, loose)
    shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name):,} characters)"
    msg = f"unknown GPU profile {shown!r}"
    if close:
        msg += f"; did you mean {', '.join(close)}?"
    raise InputError(
        msg,
        hint="`kvadvise gpus` lists the known cards; or pass --vram SIZE",
    )


def match_nvml_name(nvml_name: str, total_bytes: int | None = None) -> GpuProfile | None:
    """The profile of a GPU as NVML names it, or None when unsure.

    Safe rather than clever: the name's tokens must equal those of the
    profile's name or one of its NVML names ("NVIDIA GeForce RTX 4090" ->
    rtx-4090, but "RTX 4090 D" or "RTX 4090 Laptop GPU" match nothing), and
    when both totals are known they must agree within 5% (the 8 GB RTX 3060
    has NVML's name of the 12 GB one and another bandwidth).
    """
    q = _tokens(nvml_name)
    if not q:
        return None
    found: list[GpuProfile] = []
    for p in load_profiles():
        if p.unified_memory:
            continue
        spellings = [_tokens(p.name), *(_tokens(n) for n in p.nvml_names)]
        if not any(set(s) == set(q) for s in spellings):
            continue
        if total_bytes is not None:
            ref = p.nvml_total_bytes if p.nvml_total_bytes is not None else p.memory_bytes
            if abs(total_bytes - ref) > ref * 0.05:
                continue
        found.append(p)
    if not found:
        return None
    if len({p.bandwidth_bytes_per_s for p in found}) == 1:
        return found[0]
    return None


def match_amd(pci_id: str, vram_bytes: int) -> GpuProfile | None:
    """The profile of an AMD card by its PCI id and, for a discrete card, its VRAM within 5 % (one id can
    stand for cards of several sizes: the RX 7900 XTX, XT and GRE are all 0x744c); None when unsure."""
    found = {
        p.id: p
        for p in load_profiles()
        if p.vendor == "amd"
        and pci_id.lower() in p.pci_ids
        and (p.integrated or abs(vram_bytes - p.memory_bytes) <= 0.05 * p.memory_bytes)
    }
    return next(iter(found.values())) if len(found) == 1 else None
