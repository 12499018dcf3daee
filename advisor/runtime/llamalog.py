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
    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<type_k>\w+)\):\s*(?P<k_mib>[\d.]+) MiB, "
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
class LoadLog:
    """What a llama.cpp load printed: buffers, caches and the context's parameters."""

    buffers: tuple[Buffer, ...]
    kv: tuple[KVSummary, ...]  # one per KV cache (two for iSWA: non-SWA first, as printed)
    rs: tuple[RSSummary, ...]
    cparams: dict[str, str]  # llama_context: n_ctx, n_ctx_seq, n_batch, n_ubatch, flash_attn, ...
    gpu_layers: int | None
    total_layers: int | None

    def mib(self, kind: str, *, host: bool | None = None) -> float:
        """Sum of the printed sizes of one kind; host=False keeps GPU buffers only."""
        return sum(b.mib for b in self.buffers if b.kind == kind and (host is None or is_host(b.buft) == host))


def is_host(buft: str) -> bool:
    """Ollama's !isGPUBuffer: CPU, BLAS, CPU_* and *_Host live in system memory."""
    return buft in ("CPU", "BLAS") or buft.startswith("CPU_") or buft.endswith("_Host")


def parse(lines: Iterable[str]) -> LoadLog:
    buffers: list[Buffer] = []
    kv: list[KVSummary] = []
    rs: list[RSSummary] = []
    cparams: dict[str, str] = {}
    gpu_layers = total_layers = None
    for line in lines:
        if m := _BUFFER.search(line):
            buffers.append(Buffer(m["func"], m["buft"], m["kind"], float(m["mib"])))
        elif m := _KV_SUMMARY.search(line):
            kv.append(
                KVSummary(
                    int(m["cells"]),
                    int(m["layers"]),
                    int(m["seqs"]),
                    int(m["streams"]),
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
        elif m := _OFFLOADED.search(line):
            gpu_layers, total_layers = int(m["gpu"]), int(m["total"])
    return LoadLog(tuple(buffers), tuple(kv), tuple(rs), cparams, gpu_layers, total_layers)
