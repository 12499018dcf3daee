"""CPU_REPACK: the CPU backend's repacked copies of some quantized matmul weights.

llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36):
- src/llama-model.cpp, make_cpu_buft_list: a weight that stays on the CPU tries, in order, a GPU's
  pinned host buffer type (when a GPU backend has one: CUDA, Metal, Vulkan, ...; not RPC), the CPU's
  extra buffer types (AMX, KleidiAI, then CPU_REPACK: ggml/src/ggml-cpu/ggml-cpu.cpp
  ggml_backend_cpu_get_extra_buffer_types), then the plain CPU buffer; src/llama-model-loader.cpp
  select_weight_buft takes the first that supports the tensor's op. A host buffer type takes every
  weight, so with a GPU the CPU layers are not repacked (unless ``--no-host``); with mmap that host
  type is then replaced by the plain CPU buffer (the mapped file).
- ggml/src/ggml-cpu/repack.cpp, extra_buffer_type::supports_op and
  ggml_repack_get_optimal_repack_type: a MUL_MAT on a 2-D weight or a MUL_MAT_ID on 3-D experts,
  whose type has a layout for this CPU (the table below) and whose row count ne[1] is a multiple of
  the layout's interleave.
- The CPU_REPACK buffer is a plain allocation (ggml_backend_cpu_repack_buffer_type_alloc_buffer),
  each tensor its ggml_nbytes padded to TENSOR_ALIGNMENT (32). The repacked tensors leave the mapped
  CPU buffer, which is the file span [first, last) of the tensors still mapped
  (llama_model_loader::get_mapping_range); repacked tensors between mapped ones stay inside that
  span. ``llama-server --no-repack`` (common/arg.cpp, params.no_extra_bufts) turns it off.

Memory: the repacked copy is anonymous memory, counted in RSS for as long as the model is loaded.
The mapped span is file-backed: its pages that were read (all of them, once, at load: the repack
reads its source from the mapping) count in RSS too, but the kernel may drop them under pressure
as they are clean. kvadvise counts both, as llama.cpp prints both.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from kvadvise.model.ggml import pad
from kvadvise.model.spec import MatmulWeight, ModelSpec

TENSOR_ALIGNMENT = 32  # ggml/src/ggml-cpu: ggml_backend_cpu_repack_buffer_type_get_alignment

# The layouts ggml_repack_get_optimal_repack_type picks: type -> the multiple of ne[1] it needs.
# x86: AVX2 (ggml_cpu_has_avx2) repacks q4_0, q4_K, iq4_nl, mxfp4 in 8-row interleaves; AVX-512F
# adds q2_K. Arm with the dot-product extension (ggml_cpu_has_dotprod; i8mm picks another layout of
# the same size) repacks these and q5_K, q6_K, q8_0, q1_0. RISC-V (zvfh, 256-bit) is not modelled.
_AVX2 = {"q4_0": 8, "q4_k": 8, "iq4_nl": 8, "mxfp4": 8}
RULES: dict[str, dict[str, int]] = {
    "auto": {},  # this machine's CPU: kvadvise.plan and the CLI resolve it (cpu_isa); estimate() alone: none
    "none": {},  # no repacked layout on this CPU (or not known)
    "off": {},  # llama-server --no-repack
    "avx2": _AVX2,
    "avx512": {**_AVX2, "q2_k": 8},
    "arm-dotprod": {"q1_0": 4, "q4_0": 4, "q4_k": 8, "q5_k": 8, "q6_k": 8, "iq4_nl": 4, "mxfp4": 4, "q8_0": 4},
}


@dataclass(frozen=True, slots=True)
class CpuRepack:
    """What CPU_REPACK does to a model's weights on one CPU."""

    isa: str  # a key of RULES
    repack_bytes: int  # the CPU_REPACK model buffer
    mapped_bytes: int  # the mapped CPU model buffer (CPU_Mapped) beside it
    n_tensors: int  # tensors repacked


def plan_repack(spec: ModelSpec, isa: str) -> CpuRepack:
    """The CPU_REPACK buffer and the mapped buffer left beside it, for the CPU layers of a run on ``isa``
    (every layer and the output layer: a CPU plan)."""
    rule = RULES[isa]
    moves = [w.type_name in rule and w.ne1 % rule[w.type_name] == 0 for w in spec.matmul_weights]
    if not any(moves):
        return CpuRepack(isa, 0, spec.weights_bytes, 0)
    # split by position, not by a set of records: hashing ~400 records for each of a plan's ~13 estimates
    moved = [w for w, m in zip(spec.matmul_weights, moves, strict=True) if m]
    kept = [w for w, m in zip(spec.matmul_weights, moves, strict=True) if not m]
    # weights_bytes is the span of every loaded tensor; what the repack trims at its ends leaves the mapping
    mapped = spec.weights_bytes - (_span(spec, spec.matmul_weights) - _span(spec, kept))
    repacked = sum(pad(w.n_bytes, TENSOR_ALIGNMENT) for w in moved)
    return CpuRepack(isa, repacked, mapped, len(moved))


def _span(spec: ModelSpec, weights: list[MatmulWeight] | tuple[MatmulWeight, ...]) -> int:
    """The file span of ``weights`` and of every tensor that is never repacked."""
    spans = [(w.offset, w.offset + w.n_bytes) for w in weights]
    if spec.fixed_span != (0, 0):
        spans.append(spec.fixed_span)
    return max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0


def cpu_isa() -> str:
    """The repack rule of this machine's CPU, as a build for it (-march=native, or the CPU variant
    ggml loads) sees it; "none" where the features cannot be read."""
    machine = platform.machine().lower()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            flags |= set(value.split())
    if machine in ("x86_64", "amd64", "i686", "i386"):
        if "avx512f" in flags and "avx2" in flags:
            return "avx512"
        return "avx2" if "avx2" in flags else "none"
    if machine in ("aarch64", "arm64"):
        if "asimddp" in flags:
            return "arm-dotprod"
        if platform.system() == "Darwin":  # Apple M-series: FEAT_DotProd on every one
            return "arm-dotprod" if _sysctl("hw.optional.arm.FEAT_DotProd") == "1" else "none"
    return "none"


def _sysctl(name: str) -> str:
    import subprocess  # macOS only: not on every start

    try:
        p = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout.strip()
