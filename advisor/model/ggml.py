"""ggml tensor types and exact block arithmetic.

Block sizes and type sizes follow ggml/src/ggml.c ``type_traits[]`` and the
static_asserts in ggml/src/ggml-common.h (llama.cpp 0c1e570, vendored by
llama-cpp-python 0.3.36). No bytes-per-element approximations: q8_0 is 34
bytes per 32 values.
"""

from __future__ import annotations

from enum import IntEnum

from kvadvise.errors import ConfigError


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42

    @property
    def type_name(self) -> str:
        """ggml_type_name(): lower-case, as llama.cpp prints and parses it."""
        return self.name.lower()


_QK_K = 256

# type -> (values per block, bytes per block)
BLOCK: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (_QK_K, 84),
    GGMLType.Q3_K: (_QK_K, 110),
    GGMLType.Q4_K: (_QK_K, 144),
    GGMLType.Q5_K: (_QK_K, 176),
    GGMLType.Q6_K: (_QK_K, 210),
    GGMLType.Q8_K: (_QK_K, 292),
    GGMLType.IQ2_XXS: (_QK_K, 66),
    GGMLType.IQ2_XS: (_QK_K, 74),
    GGMLType.IQ3_XXS: (_QK_K, 98),
    GGMLType.IQ1_S: (_QK_K, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (_QK_K, 110),
    GGMLType.IQ2_S: (_QK_K, 82),
    GGMLType.IQ4_XS: (_QK_K, 136),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (_QK_K, 56),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (_QK_K, 54),
    GGMLType.TQ2_0: (_QK_K, 66),
    GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
    GGMLType.Q2_0: (64, 18),  # ggml-common.h block_q2_0: f16 scale + 64 x 2 bits
}

# common/arg.cpp kv_cache_types: the only types -ctk/-ctv accept.
KV_CACHE_TYPES: tuple[GGMLType, ...] = (
    GGMLType.F32,
    GGMLType.F16,
    GGMLType.BF16,
    GGMLType.Q8_0,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.IQ4_NL,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
)

_QUANTIZED_BLOCK_MIN = 2


def is_quantized(t: GGMLType) -> bool:
    """ggml_is_quantized(): block types (everything but f32/f16/bf16/ints)."""
    return BLOCK[t][0] >= _QUANTIZED_BLOCK_MIN


def row_bytes(t: GGMLType, n: int) -> int:
    """ggml_row_size(type, n): bytes of n values; n must fill whole blocks."""
    blck, size = BLOCK[t]
    if n % blck:
        raise ConfigError(f"{t.type_name} stores values in blocks of {blck}; {n} is not a multiple")
    return n // blck * size


# The cache types CUDA's flash attention has a kernel for, K and V in any pairing (ggml/src/ggml-cuda/fattn.cu
# ggml_cuda_fattn_kv_type_supported, 0c1e570: a quantized pair the vector kernels lack runs on the MMA path,
# converted to f16); any other type (iq4_nl) makes ggml_cuda_get_best_fattn_kernel return NONE.
CUDA_FA_CACHE_TYPES = frozenset(
    {
        GGMLType.F32,
        GGMLType.F16,
        GGMLType.BF16,
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q5_0,
        GGMLType.Q5_1,
        GGMLType.Q8_0,
    }
)

# Before kvadvise.planner.builds.FA_KV_ANY_PAIR a default CUDA build (GGML_CUDA_FA_ALL_QUANTS off) compiled these
# cache types only, and one type for K and V (fattn.cu ggml_cuda_get_best_fattn_kernel, ggml-org/llama.cpp#15454)
CUDA_FA_OLD_DEFAULT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q8_0})


def cache_type(name: str) -> GGMLType:
    """kv_cache_type_from_str(): parse a -ctk/-ctv value."""
    for t in KV_CACHE_TYPES:
        if t.type_name == name.strip().lower():
            return t
    allowed = ", ".join(t.type_name for t in KV_CACHE_TYPES)
    raise ConfigError(f"unsupported cache type: {name!r}", hint=f"use one of {allowed}")


# buffer alignment per backend (ggml_backend_buft_get_alignment); an RPC device has its server's (CPU here)
ALIGNMENT = {"cpu": 32, "cuda": 128, "metal": 32, "rpc": 32}
CUDA_MATRIX_ROW_PADDING = 512  # ggml-cuda: quantized tensors get padded to a multiple of 512 values


def pad(x: int, n: int) -> int:
    """GGML_PAD(x, n)."""
    return -(-x // n) * n


def cuda_alloc_bytes(t: GGMLType, ne0: int, n_bytes: int) -> int:
    """ggml_backend_cuda_buffer_type_get_alloc_size: quantized rows padded to 512 values, 128-byte aligned."""
    if is_quantized(t) and ne0 % CUDA_MATRIX_ROW_PADDING:
        blck, size = BLOCK[t]
        # ggml_row_size without the whole-block assert: type_size * n / block_size
        n_bytes += size * (CUDA_MATRIX_ROW_PADDING - ne0 % CUDA_MATRIX_ROW_PADDING) // blck
    return pad(n_bytes, ALIGNMENT["cuda"])
