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
- AMX (ggml/src/ggml-cpu/amx/amx.cpp, a build with AMX_INT8 on a CPU whose kernel grants the tile state,
  ggml_amx_init): the first of the extra buffer types. It takes a MUL_MAT's 2-D weight (never MUL_MAT_ID's
  experts) of q4_0, q4_1, q8_0 (rows a multiple of 32 values), q4_K, q5_K, q6_K, iq4_xs (256) or f16 (16), whose
  row count ne[1] is a multiple of 32 (``op->ne[0] % (TILE_N * 2)``), and packs it to VNNI with its own row size
  (amx/mmq.cpp get_row_size: q8_0 4 bytes more per block of 32, the compensation; q4_K and q5_K 4 more per 256;
  iq4_xs 2 more; f16 and the others as they are). CPU_REPACK then takes what fits its layouts of the rest.
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

import os
import platform
from dataclasses import dataclass

from kvadvise.errors import InputError
from kvadvise.model.ggml import pad
from kvadvise.model.spec import MatmulWeight, ModelSpec

TENSOR_ALIGNMENT = 32  # ggml/src/ggml-cpu: ggml_backend_cpu_repack_buffer_type_get_alignment
# the extra buffer types' names, as load logs and llama-fit-params' breakdown print them
AMX_BUFFER = "AMX"
REPACK_BUFFER = "CPU_REPACK"
EXTRA_BUFFERS = (AMX_BUFFER, REPACK_BUFFER)

# The layouts ggml_repack_get_optimal_repack_type picks: type -> the multiple of ne[1] it needs.
# x86: AVX2 (ggml_cpu_has_avx2) repacks q4_0, q4_K, iq4_nl, mxfp4 in 8-row interleaves; AVX-512F
# adds q2_K. Arm with the dot-product extension (ggml_cpu_has_dotprod; i8mm picks another layout of
# the same size) repacks these and q5_K, q6_K, q8_0, q1_0. RISC-V (zvfh, 256-bit) is not modelled.
_AVX2 = {"q4_0": 8, "q4_k": 8, "iq4_nl": 8, "mxfp4": 8}
_AVX512 = {**_AVX2, "q2_k": 8}
RULES: dict[str, dict[str, int]] = {
    "auto": {},  # this machine's CPU: kvadvise.plan and the CLI resolve it (cpu_isa); estimate() alone: none
    "none": {},  # no repacked layout on this CPU (or not known)
    "off": {},  # llama-server --no-repack
    "avx2": _AVX2,
    "avx512": _AVX512,
    "amx": _AVX512,  # an AVX-512 CPU with AMX: what AMX does not take (AMX_TYPES) goes by AVX-512's
    "arm-dotprod": {"q1_0": 4, "q4_0": 4, "q4_k": 8, "q5_k": 8, "q6_k": 8, "iq4_nl": 4, "mxfp4": 4, "q8_0": 4},
}
# amx.cpp supports_op: the types AMX takes, the multiple of ne[0] each needs, and the bytes its packed rows add per
# block (mmq.cpp get_row_size; the block of 32 values or, for the K-quants and iq4_xs, QK_K = 256)
AMX_TYPES: dict[str, tuple[int, int]] = {
    "q4_0": (32, 0), "q4_1": (32, 0), "q8_0": (32, 4), "q4_k": (256, 4), "q5_k": (256, 4), "q6_k": (256, 0),
    "iq4_xs": (256, 2), "f16": (16, 0),
}  # fmt: skip
AMX_ROWS = 32  # TILE_N * 2: the multiple of ne[1] AMX's kernels need


@dataclass(frozen=True, slots=True)
class CpuRepack:
    """What CPU_REPACK does to a model's weights on one CPU."""

    isa: str  # a key of RULES
    repack_bytes: int  # the extra buffers: the CPU_REPACK model buffer and the AMX one
    mapped_bytes: int  # the mapped CPU model buffer (CPU_Mapped) beside it
    n_tensors: int  # tensors repacked
    amx_bytes: int = 0  # of repack_bytes: the AMX model buffer
    # the moved tensors' own bytes, which leave the CPU buffer type (a tied output's copy leaves nothing: token_embd
    # stays for its get_rows): what the CPU buffer's tensors come to less (kvadvise.runtime.dryrun)
    moved_bytes: int = 0


def plan_repack(spec: ModelSpec, isa: str) -> CpuRepack:
    """The CPU_REPACK buffer and the mapped buffer left beside it, for the CPU layers of a run on ``isa``
    (every layer and the output layer: a CPU plan)."""
    rule = RULES[isa]
    amx = [isa == "amx" and amx_takes(w) for w in spec.matmul_weights]
    moves = [
        a or (w.type_name in rule and w.ne1 % rule[w.type_name] == 0)
        for w, a in zip(spec.matmul_weights, amx, strict=True)
    ]
    if not any(moves):
        return CpuRepack(isa, 0, spec.weights_bytes, 0)
    # split by position, not by a set of records: hashing ~400 records for each of a plan's ~13 estimates
    moved = [w for w, m in zip(spec.matmul_weights, moves, strict=True) if m]
    kept = [w for w, m in zip(spec.matmul_weights, moves, strict=True) if not m]
    # weights_bytes is the span of every loaded tensor; what the repack trims at its ends leaves the mapping
    mapped = spec.weights_bytes - (_span(spec, spec.matmul_weights) - _span(spec, kept))
    packed = sum(pad(amx_bytes(w), TENSOR_ALIGNMENT) for w, a in zip(spec.matmul_weights, amx, strict=True) if a)
    repacked = sum(
        pad(w.n_bytes, TENSOR_ALIGNMENT) for w, m, a in zip(spec.matmul_weights, moves, amx, strict=True) if m and not a
    )
    own = sum(w.n_bytes for w in moved if not w.tied)
    return CpuRepack(isa, repacked + packed, mapped, len(moved), packed, own)


def amx_takes(w: MatmulWeight) -> bool:
    """Whether AMX's buffer type takes this weight (amx.cpp supports_op, llama.cpp 0c1e570)."""
    t = AMX_TYPES.get(w.type_name)
    return t is not None and not w.experts and w.ne1 % AMX_ROWS == 0 and w.ne0 > 0 and w.ne0 % t[0] == 0


def amx_bytes(w: MatmulWeight) -> int:
    """The weight packed for AMX (mmq.cpp ggml_backend_amx_get_alloc_size: rows x get_row_size)."""
    block, extra = AMX_TYPES[w.type_name]
    if not extra:
        return w.n_bytes
    return w.n_bytes + w.ne1 * (w.ne0 // block) * extra


def _span(spec: ModelSpec, weights: list[MatmulWeight] | tuple[MatmulWeight, ...]) -> int:
    """The file span of ``weights`` and of every tensor that is never repacked."""
    spans = [(w.offset, w.offset + w.n_bytes) for w in weights]
    if spec.fixed_span != (0, 0):
        spans.append(spec.fixed_span)
    return max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0


CPU_ENV = "KVADVISE_CPU"  # a rule of RULES that overrides the one read from this machine's CPU


def cpu_isa() -> str:
    """The repack rule of this machine's CPU, as a build for it (-march=native, or the CPU variant
    ggml loads) sees it; "none" where the features cannot be read. ``KVADVISE_CPU`` names one instead: "avx512"
    on an AMX CPU whose llama.cpp was built without AMX."""
    forced = os.environ.get(CPU_ENV, "").strip().lower()
    if forced:
        if forced not in RULES or forced in ("auto", "off"):
            known = ", ".join(k for k in RULES if k not in ("auto", "off"))
            raise InputError(f"{CPU_ENV}={forced[:40]!r} is not a CPU kvadvise knows", hint=f"one of {known}")
        return forced
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
            # ggml-cpu registers AMX where the build has AMX_INT8 and AVX512_VNNI (the sapphirerapids variant, or
            # -march=native on such a CPU) and the CPU has the tiles (Linux: amx_tile, amx_int8 in its flags)
            return "amx" if {"amx_tile", "amx_int8", "avx512_vnni"} <= flags else "avx512"
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
