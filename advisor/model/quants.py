"""llama.cpp's file types and quant sizes: ``general.file_type`` (``llama_ftype``) and the bits
per weight of each quant, for the weights of a model not yet downloaded."""

from __future__ import annotations

from enum import IntEnum

from kvadvise.errors import InputError


class LlamaFileType(IntEnum):
    """``enum llama_ftype`` (include/llama.h, llama.cpp 0c1e570; gguf-py ``LlamaFileType``):
    the value of ``general.file_type``, the quant mix a file was made with."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38

    @property
    def label(self) -> str:
        """The name llama.cpp prints (llama_model_ftype_name): "Q4_K - Medium" is shown as Q4_K_M here,
        as quantize's QUANT_OPTIONS and the Hub's file names spell it."""
        return self.name.removeprefix("MOSTLY_").removeprefix("ALL_")


def file_type_label(value: object) -> str | None:
    """The label of a ``general.file_type`` value, or None when it is absent or not one llama.cpp knows."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        return LlamaFileType(value).label
    except ValueError:
        return None


# Bits per weight of a GGUF by llama.cpp quant type, for the weights of a model not yet downloaded.
# Source: llama.cpp 0c1e570 tools/quantize/quantize.cpp QUANT_OPTIONS. Where it gives a file size
# for Llama-3-8B ("4.58G, +0.1754 ppl @ Llama-3-8B"; G = GiB, 8,030,261,248 parameters) the bits per
# weight are that size × 2^33 / parameters: the whole-file average, with the embedding and output
# tensors at the types llama.cpp's mixes give them. Where it gives bits per weight
# ("2.06 bpw quantization") those are used as they are. F16/BF16/F32: the type's width.
_LLAMA3_8B_PARAMS = 8_030_261_248
_GIB_AT_LLAMA3_8B = {
    "Q2_K": 2.96,
    "Q2_K_S": 2.96,
    "Q3_K_S": 3.41,
    "Q3_K_M": 3.74,
    "Q3_K_L": 4.03,
    "Q4_0": 4.34,
    "Q4_1": 4.78,
    "Q4_K_S": 4.37,
    "Q4_K_M": 4.58,
    "Q5_0": 5.21,
    "Q5_1": 5.65,
    "Q5_K_S": 5.21,
    "Q5_K_M": 5.33,
    "Q6_K": 6.14,
    "Q8_0": 7.96,
}
_NOMINAL_BPW = {
    "Q1_0": 1.125,
    "Q2_0": 2.25,
    "IQ1_S": 1.56,
    "IQ1_M": 1.75,
    "TQ1_0": 1.69,
    "TQ2_0": 2.06,
    "IQ2_XXS": 2.06,
    "IQ2_XS": 2.31,
    "IQ2_S": 2.5,
    "IQ2_M": 2.7,
    "IQ3_XXS": 3.06,
    "IQ3_XS": 3.3,
    "IQ3_S": 3.44,
    "IQ3_M": 3.66,
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "MXFP4_MOE": 4.25,  # "MXFP4 MoE": the experts in MXFP4 (a block of 32 in 17 bytes), the default type's width
    "F16": 16.0,
    "BF16": 16.0,
    "F32": 32.0,
}
QUANT_BPW: dict[str, float] = {
    **{q: gib * (1 << 33) / _LLAMA3_8B_PARAMS for q, gib in _GIB_AT_LLAMA3_8B.items()},
    **_NOMINAL_BPW,
}


# quantize.cpp QUANT_OPTIONS' aliases: "Q3_K: alias for Q3_K_M" and so on
QUANT_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def quant_bpw(quant: str) -> tuple[str, float]:
    """The canonical name and bits per weight of ``quant`` (case-insensitive; an alias as its quant)."""
    q = quant.strip().upper()
    q = QUANT_ALIASES.get(q, q)
    if q not in QUANT_BPW:
        raise InputError(
            f"unknown quant {quant!r}",
            hint="one of: " + ", ".join(sorted(QUANT_BPW)),
        )
    return q, QUANT_BPW[q]


# A file type's default tensor type: the type most of its weights (the FFN and attention matrices) are
# quantized to; src/llama-quant.cpp llama_ftype_get_default_type (llama.cpp 0c1e570). MXFP4_MOE's default
# is MXFP4 (the experts). F32/F16/BF16 files keep their type.
_DEFAULT_TYPE: dict[str, str] = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "MXFP4_MOE": "MXFP4",
    "MXFP4": "MXFP4",
    "Q2_K": "Q2_K",
    "Q2_K_S": "Q2_K",
    "Q3_K_S": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
    "TQ1_0": "TQ1_0",
    "TQ2_0": "TQ2_0",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_XS",
    "IQ2_M": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ3_XS": "IQ3_S",
    "IQ3_S": "IQ3_S",
    "IQ3_M": "IQ3_S",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
}


def default_type(file_type: str) -> str | None:
    """The tensor type (ggml's name, upper case: "Q3_K") most weights of a ``file_type`` have ("Q3_K_M", as
    general.file_type names it; a dominant tensor type such as "q3_K" is itself). None: not one llama.cpp makes."""
    ft = file_type.strip().upper()
    if ft in _DEFAULT_TYPE:
        return _DEFAULT_TYPE[ft]
    return ft if ft in _DEFAULT_TYPE.values() else None
