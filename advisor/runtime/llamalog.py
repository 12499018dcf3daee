"""Parse the buffer sizes llama.cpp prints while it loads a model.

Formats (llama.cpp 0c1e570; the same regex Ollama uses in
``llm/llama_server.go`` bufferSizeRegex):
    load_tensors:   CPU_Mapped model buffer size =   241.45 MiB
    llama_kv_cache:        CPU KV buffer size =    18.00 MiB
    llama_kv_cache: size =   18.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    9.00 MiB, V (f16):    9.00 MiB
    llama_memory_recurrent:        CPU RS buffer size =     0.14 MiB
    llama_context:        CPU  output buffer size =     1.00 MiB
    sched_reserve:        CPU compute buffer size =   519.51 MiB
Values are printed as ``%8.2f`` MiB, so parsed bytes are exact to 0.005 MiB.

The memory breakdown table and ``--fit``'s lines, in every spelling published builds print (whole MiB):
    llama_print_memory_breakdown:   - CUDA0 (RTX 4090):  24080 = 9436 + (14193 = 13169 + 38 + 985) + 451
        (its first form, ggml-org/llama.cpp#15860, 2025-09)
    llama_memory_breakdown_print: |   - CUDA0 (GTX 1080 Ti) | 11165 = 8702 + (10001 = 9814 + 134 + 51) + 17592186036877 |
        (b7xxx-b9xxx: size_t arithmetic, so a negative "unaccounted" wraps: llama.cpp#19437)
    common_memory_breakdown_print: |   - CUDA0 (RTX 5090)   | 32111 = 31605 + (18058 = 16386 + 1024 + 648) + -17552 |
    common_memory_breakdown_print: |   - Host               |                   1234 =   682 +       0 +     552 |
        (moved to common/ with --fit, llama.cpp#22171; signed: llama.cpp#25465, ollama#17482)
    llama_params_fit_impl: / common_params_fit_impl: projected to use 9226 MiB of device memory vs. 11312 MiB ...
    srv    load_model: [spec] estimated memory usage of MTP context is 581.77 MiB
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1 << 20

_BUFFER = re.compile(
    r"(?P<func>[A-Za-z_]\w*):\s+(?P<buft>\S+)\s+(?P<kind>model|KV|RS|compute|output)\s+buffer size\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)
_KV_SUMMARY = re.compile(
    r"size\s*=\s*(?P<mib>[\d.]+) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers,\s*"
    r"(?P<seqs>\d+)(?:/(?P<streams>\d+))? seqs\), K \((?P<type_k>\w+)\):\s*(?P<k_mib>[\d.]+) MiB, "
    r"V \((?P<type_v>\w+)\):\s*(?P<v_mib>[\d.]+) MiB"
)
_RS_SUMMARY = re.compile(
    r"size\s*=\s*(?P<mib>[\d.]+) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers,\s*(?P<seqs>\d+) seqs\), "
    r"R \((?P<type_r>\w+)\):\s*(?P<r_mib>[\d.]+) MiB, S \((?P<type_s>\w+)\):\s*(?P<s_mib>[\d.]+) MiB"
)
_CPARAM = re.compile(
    r"llama_context:\s+(?P<key>n_ctx|n_ctx_seq|n_batch|n_ubatch|flash_attn|n_seq_max)\s+=\s+(?P<val>\S+)"
)
_OFFLOADED = re.compile(r"offloaded (?P<gpu>\d+)/(?P<total>\d+) layers to GPU")
# tools/server (b11312): the draft model of -md loads after the model, inside the same start
# (common_speculative_init_result: "loading draft model"); a new start prints "load_model: loading model" again
_DRAFT_LOAD = "loading draft model"
_MODEL_LOAD = "load_model: loading model"
# a device row: "- NAME: total = free + (self = model + context + compute) [+ unaccounted]", in a table
# ("| ... |") or not; the host row has no free (and, in the first form, a total before self)
_NUM = r"(-?[0-9]{1,20})"  # bounded: never a 5,000-digit int()
_BREAKDOWN = re.compile(
    r"(?P<func>\w*memory_breakdown\w*):\s*\|?\s*-\s+(?P<dev>[^|:]+?)\s*[|:]\s*"
    rf"(?:{_NUM}\s*=\s*{_NUM}\s*\+\s*\(\s*{_NUM}\s*=\s*{_NUM}\s*\+\s*{_NUM}\s*\+\s*{_NUM}\s*\)(?:\s*\+\s*{_NUM})?"
    rf"|(?:{_NUM}\s+)?{_NUM}\s*=\s*{_NUM}\s*\+\s*{_NUM}\s*\+\s*{_NUM})\s*\|?\s*$"
)
_FIT = re.compile(r"\b(?:llama|common)_params_fit_impl:\s*(?P<msg>.*?)\s*$")
_FIT_PROJECTED = re.compile(r"projected to use (?P<use>\d+) MiB of (?P<what>device|host) memory vs\. (?P<have>\d+) MiB")
_FIT_CTX = re.compile(r"context size reduced from (?P<old>\d+) to (?P<new>\d+)")
_MTP_ESTIMATE = re.compile(r"\[spec\] estimated (?:fixed )?memory usage of MTP context is (?P<mib>[\d.]+) MiB")
# the longest line read: llama.cpp's own (a buffer line, the memory breakdown's rows, --fit's) are under 300
# characters with a timestamp and a device's name; a longer one is something else, and the patterns above would take
# time quadratic in its length (a 50 MB line: minutes)
MAX_LINE_CHARS = 4096
# size_t MiB arithmetic in builds before the table moved to common/: a negative figure printed as 2**64 / 2**20 - x
_WRAP = 1 << 44


@dataclass(frozen=True, slots=True)
class Buffer:
    """One buffer size line of a llama.cpp log."""

    func: str  # the printing function: load_tensors, llama_kv_cache, sched_reserve, ...
    buft: str  # buffer type name: CPU, CPU_Mapped, CUDA0, CUDA_Host, ...
    kind: str  # model | KV | RS | compute | output
    mib: float  # as printed (%.2f)


@dataclass(frozen=True, slots=True)
class KVSummary:
    """llama_kv_cache's summary line: cells, layers, sequences and the K/V sizes."""

    cells: int
    layers: int
    n_seq_max: int
    n_stream: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


@dataclass(frozen=True, slots=True)
class RSSummary:
    """llama_memory_recurrent's summary line: cells and the R/S state sizes."""

    cells: int
    r_mib: float
    s_mib: float


@dataclass(frozen=True, slots=True)
class BreakdownRow:
    """One row of llama.cpp's memory breakdown table, in MiB as printed (whole MiB)."""

    func: str  # llama_print_memory_breakdown | llama_memory_breakdown_print | common_memory_breakdown_print
    device: str  # "CUDA0 (RTX 5090)", "Host", "CPU (EPYC 7742)"
    total_mib: int | None  # None on the host row of the table
    free_mib: int | None
    self_mib: int
    model_mib: int
    context_mib: int
    compute_mib: int
    unaccounted_mib: int | None  # total - (free + self); negative when other processes' memory is counted free

    @property
    def name(self) -> str:
        """The device as its buffers name it: "CUDA0", "Host"."""
        return self.device.split(" (", 1)[0]


@dataclass(frozen=True, slots=True)
class FitReport:
    """What ``--fit`` printed (llama_params_fit_impl, renamed common_params_fit_impl when it moved to common/)."""

    lines: tuple[str, ...]  # its messages, without the function name
    projected_mib: int | None  # "projected to use N MiB of device memory" (the first such line)
    free_mib: int | None  # "... vs. N MiB of free device memory"
    n_ctx_from: int | None  # "context size reduced from A to B"
    n_ctx_to: int | None


@dataclass(frozen=True, slots=True)
class LoadLog:
    """What a llama.cpp load printed: buffers, caches and the context's parameters."""

    buffers: tuple[Buffer, ...]
    kv: tuple[KVSummary, ...]  # one per KV cache (two for iSWA: non-SWA first, as printed)
    rs: tuple[RSSummary, ...]
    cparams: dict[str, str]  # llama_context: n_ctx, n_ctx_seq, n_batch, n_ubatch, flash_attn, ...
    gpu_layers: int | None
    total_layers: int | None
    breakdown: tuple[BreakdownRow, ...] = ()  # every table row printed, in order (--fit prints several)
    fit: FitReport | None = None
    # every "offloaded N/M layers to GPU" of the log, in order: a server woken from idle (--sleep-idle-seconds)
    # loads again and, with --fit, may place fewer layers (llama.cpp#24684): verify compares them
    placements: tuple[tuple[int, int], ...] = ()
    mtp_context_mib: float | None = None  # llama-server's own estimate of its MTP context (--fit's reservation)

    def mib(self, kind: str, *, host: bool | None = None) -> float:
        """Sum of the printed sizes of one kind; host=False keeps GPU buffers only."""
        return sum(b.mib for b in self.buffers if b.kind == kind and (host is None or is_host(b.buft) == host))


def is_host(buft: str) -> bool:
    """Ollama's !isGPUBuffer: CPU, BLAS, CPU_* and *_Host live in system memory, and so does "AMX", the CPU backend's
    extra buffer type on a CPU with AMX (ggml-cpu/amx/amx.cpp ggml_backend_amx_buffer_type: it takes a quantized
    CPU weight before CPU_REPACK does; "AMX model buffer size" in a load log)."""
    return buft in ("CPU", "BLAS", "AMX") or buft.startswith("CPU_") or buft.endswith("_Host")


def parse(lines: Iterable[str]) -> LoadLog:
    buffers: list[Buffer] = []
    kv: list[KVSummary] = []
    rs: list[RSSummary] = []
    cparams: dict[str, str] = {}
    gpu_layers = total_layers = None
    rows: list[BreakdownRow] = []
    fit: list[str] = []
    placements: list[tuple[int, int]] = []
    mtp_mib = None
    draft = False  # after "loading draft model" (-md): its load_tensors lines are the draft's, not the model's
    for line in lines:
        if len(line) > MAX_LINE_CHARS:  # no line llama.cpp prints is that long: its patterns would backtrack over it
            continue
        if _DRAFT_LOAD in line:
            draft = True
        elif _MODEL_LOAD in line:
            draft = False
        if m := _BREAKDOWN.search(line):
            rows.append(_row(m))
        elif m := _FIT.search(line):
            fit.append(m["msg"])
        elif m := _MTP_ESTIMATE.search(line):
            mtp_mib = float(m["mib"])
        elif m := _BUFFER.search(line):
            buffers.append(Buffer(m["func"], m["buft"], m["kind"], float(m["mib"])))
        elif m := _KV_SUMMARY.search(line):
            kv.append(
                KVSummary(
                    int(m["cells"]),
                    int(m["layers"]),
                    int(m["seqs"]),
                    int(m["streams"] or 1),  # "%2u seqs" before the KV streams (b5898's llama_kv_cache_unified)
                    m["type_k"],
                    float(m["k_mib"]),
                    m["type_v"],
                    float(m["v_mib"]),
                )
            )
        elif m := _RS_SUMMARY.search(line):
            rs.append(RSSummary(int(m["cells"]), float(m["r_mib"]), float(m["s_mib"])))
        elif m := _CPARAM.search(line):
            cparams[m["key"]] = m["val"]
        elif (m := _OFFLOADED.search(line)) and not draft:
            gpu_layers, total_layers = int(m["gpu"]), int(m["total"])
            placements.append((gpu_layers, total_layers))
    return LoadLog(
        tuple(buffers),
        tuple(kv),
        tuple(rs),
        cparams,
        gpu_layers,
        total_layers,
        breakdown=tuple(rows),
        fit=_fit(fit) if fit else None,
        placements=tuple(placements),
        mtp_context_mib=mtp_mib,
    )


def _unwrap(v: int) -> int:
    return v - _WRAP if v > _WRAP // 2 else v


def _row(m: re.Match[str]) -> BreakdownRow:
    g = [None if x is None else int(x) for x in m.groups()[2:]]
    func, dev = m["func"], m["dev"].strip()
    if g[0] is not None:  # a device: total = free + (self = model + context + compute) [+ unaccounted]
        total, free, self_, model, context, compute, unacc = g[:7]
        assert total is not None and free is not None and self_ is not None
        assert model is not None and context is not None and compute is not None
        return BreakdownRow(
            func, dev, total, free, self_, model, context, compute, None if unacc is None else _unwrap(unacc)
        )
    total, self_, model, context, compute = g[7:]
    assert self_ is not None and model is not None and context is not None and compute is not None
    return BreakdownRow(func, dev, total, None, self_, model, context, compute, None)


def _fit(lines: list[str]) -> FitReport:
    projected = free = old = new = None
    for msg in lines:
        if projected is None and (m := _FIT_PROJECTED.search(msg)):
            projected, free = int(m["use"]), int(m["have"])
        if m := _FIT_CTX.search(msg):
            old, new = int(m["old"]), int(m["new"])
    return FitReport(tuple(lines), projected, free, old, new)


# llama-server's server_context::load_model prints it at every load, a wake from idle's too
# (tools/server/server-context.cpp, b11312: SRV_INF("loading model '%s'"))
LOAD_MARKER = "load_model: loading model"


def last_load(lines: list[str]) -> list[str]:
    """The lines of the last load of a llama-server log (all of them when it has no load marker)."""
    starts = [i for i, line in enumerate(lines) if LOAD_MARKER in line]
    return lines[starts[-1] :] if starts else lines
