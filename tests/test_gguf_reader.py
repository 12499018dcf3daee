"""The header-only GGUF reader (advisor/gguf.py).

1. Files written by gguf-py's GGUFWriter read the same as gguf-py's GGUFReader
   reads them: every metadata value type, arrays, tensors of several ggml types,
   big-endian files, a custom alignment.
2. The real Gemma 3 270M GGUF against facts that do not come from our reader.
3. Hostile and broken headers, hand-built with struct: each refused with a
   GGUFError that names the file and the problem, and by the CLI with exit 2
   and one or two lines on stderr (the checks of ggml/src/gguf.cpp).
4. Bounded memory and time whatever the header claims.
5. Any ByteSource, read in a few chunks.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFEndian, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from kvadvise.cli import main
from kvadvise.errors import GGUFError
from kvadvise.model.ggml import BLOCK, GGMLType
from kvadvise.model.gguf import (
    DECODE_NUMERIC_MAX,
    DECODE_STRING_MAX,
    MAX_ARRAY_DEPTH,
    T_ARRAY,
    T_BOOL,
    T_FLOAT32,
    T_FLOAT64,
    T_INT8,
    T_INT16,
    T_INT32,
    T_INT64,
    T_STRING,
    T_UINT8,
    T_UINT16,
    T_UINT32,
    T_UINT64,
    GGUFArray,
    GGUFHeader,
    read_file,
    read_header,
)

# ---------------------------------------------------------------------------
# 1. against gguf-py's GGUFReader

SCALARS: list[tuple[str, V, Any]] = [
    ("s.u8", V.UINT8, 255),
    ("s.i8", V.INT8, -128),
    ("s.u16", V.UINT16, 65535),
    ("s.i16", V.INT16, -32768),
    ("s.u32", V.UINT32, 2**32 - 1),
    ("s.i32", V.INT32, -(2**31)),
    ("s.f32", V.FLOAT32, 0.1),  # not exact in f32: both readers must give the same rounded value
    ("s.bool_true", V.BOOL, True),
    ("s.bool_false", V.BOOL, False),
    ("s.string", V.STRING, "héllo ✓ 世界"),
    ("s.empty", V.STRING, ""),
    ("s.u64", V.UINT64, 2**64 - 1),
    ("s.i64", V.INT64, -(2**63)),
    ("s.f64", V.FLOAT64, -1.5e300),
]
ARRAYS: list[tuple[str, V, list[Any]]] = [
    ("a.u8", V.UINT8, [0, 1, 255]),
    ("a.i8", V.INT8, [-128, 127]),
    ("a.u16", V.UINT16, [1, 65535]),
    ("a.i16", V.INT16, [-3, 7]),
    ("a.u32", V.UINT32, list(range(40))),
    ("a.i32", V.INT32, [-(2**31), 2**31 - 1]),
    ("a.f32", V.FLOAT32, [0.5, -0.1, 3e38]),
    ("a.u64", V.UINT64, [2**64 - 1, 0]),
    ("a.i64", V.INT64, [-(2**63), 5]),
    ("a.f64", V.FLOAT64, [1e-300, -2.5]),
    ("a.bool", V.BOOL, [True, False, True]),
    ("a.strings", V.STRING, ["a", "", "ü✓"]),
    ("a.strings64", V.STRING, [f"s{i}" for i in range(DECODE_STRING_MAX)]),  # still decoded
    ("a.tokens", V.STRING, [f"tok{i}" * (i % 5) for i in range(300)]),  # skipped undecoded
    ("a.long_u8", V.UINT8, [i % 256 for i in range(DECODE_NUMERIC_MAX + 1)]),  # skipped undecoded
]
NESTED = [[1, 2], [3, 4, 5]]
# name, type, shape as GGUF stores it (ne0 first)
TENSORS: list[tuple[str, Q, tuple[int, ...]]] = [
    ("f32", Q.F32, (7,)),
    ("f16", Q.F16, (5, 3)),
    ("bf16", Q.BF16, (4, 2)),
    ("q8_0", Q.Q8_0, (64, 3)),
    ("q4_0", Q.Q4_0, (32, 2, 2)),
    ("q4_k", Q.Q4_K, (256, 3)),
    ("q6_k", Q.Q6_K, (512, 1, 1, 2)),
    ("q5_0", Q.Q5_0, (96,)),
    ("iq4_xs", Q.IQ4_XS, (256, 2)),
    ("i32", Q.I32, (3, 3)),
    ("blk.0.attn_q.weight", Q.Q5_K, (256, 4)),
]
PY_TYPE = {V.STRING: str, V.BOOL: bool, V.FLOAT32: float, V.FLOAT64: float}


def write_reference_file(
    path: Path,
    *,
    endianess: GGUFEndian = GGUFEndian.LITTLE,
    alignment: int | None = None,
    tensors: Sequence[tuple[str, Q, tuple[int, ...]]] = TENSORS,
) -> Path:
    w = GGUFWriter(path, "llama", endianess=endianess)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, vtype, value in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, vtype, values in ARRAYS:
        w.add_key_value(key, values, V.ARRAY, sub_type=vtype)
    w.add_key_value("a.nested", NESTED, V.ARRAY, sub_type=V.ARRAY)
    w.add_uint32("z.after_the_long_arrays", 1234)  # the skipped arrays must leave the reader in the right place
    rng = np.random.default_rng(0)
    for name, qtype, shape in tensors:
        np_shape = shape[::-1]
        if qtype in (Q.F32, Q.F16, Q.I32):
            dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.I32: np.int32}[qtype]
            w.add_tensor(name, rng.standard_normal(np_shape).astype(dtype))
        else:
            blck, tsize = GGML_QUANT_SIZES[qtype]
            byte_shape = (*np_shape[:-1], np_shape[-1] // blck * tsize)
            w.add_tensor(name, rng.integers(0, 256, byte_shape, dtype=np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _type_chain(v: GGUFArray) -> list[int]:
    chain = [T_ARRAY, v.item_type]
    while v.item_type == T_ARRAY:
        assert v.values
        v = v.values[0]
        assert isinstance(v, GGUFArray)
        chain.append(v.item_type)
    return chain


def _flat(v: GGUFArray) -> list[Any]:
    assert v.values is not None
    return [x for item in v.values for x in (_flat(item) if isinstance(item, GGUFArray) else [item])]


def assert_same_as_gguf_reader(path: Path, h: GGUFHeader) -> GGUFReader:
    ref = GGUFReader(path)
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(h.metadata) == list(fields)  # same keys, same order
    for key, f in fields.items():
        ours = h.metadata[key]
        if f.types[0] == V.ARRAY:
            assert isinstance(ours, GGUFArray), key
            assert _type_chain(ours) == [int(t) for t in f.types], key
            if ours.values is not None:
                assert _flat(ours) == f.contents(), key
            if ours.item_type != T_ARRAY:
                assert ours.count == len(f.data), key
        else:
            assert not isinstance(ours, GGUFArray), key
            assert ours == f.contents(), key
            assert type(ours) is PY_TYPE.get(f.types[0], int), key
    assert h.version == ref.fields["GGUF.version"].contents() == 3
    assert h.byte_order == {GGUFEndian.LITTLE: "<", GGUFEndian.BIG: ">"}[ref.endianess]
    assert h.alignment == ref.alignment
    assert h.data_offset == ref.data_offset
    assert [t.name for t in h.tensors] == [t.name for t in ref.tensors]
    for ours_t, t in zip(h.tensors, ref.tensors, strict=True):
        assert ours_t.shape == tuple(int(d) for d in t.shape), t.name
        assert int(ours_t.ggml_type) == int(t.tensor_type), t.name
        assert h.data_offset + ours_t.offset == t.data_offset, t.name
        assert ours_t.n_bytes == t.n_bytes, t.name
    return ref


@pytest.fixture(scope="module")
def ref_files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int | None], Path]:
    d = tmp_path_factory.mktemp("ref")
    return {
        (end.name, align): write_reference_file(d / f"{end.name}-{align}.gguf", endianess=end, alignment=align)
        for end in (GGUFEndian.LITTLE, GGUFEndian.BIG)
        for align in (None, 64)
    }


@pytest.mark.parametrize("alignment", [None, 64])
@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_matches_gguf_reader(ref_files: dict[tuple[str, int | None], Path], endian: str, alignment: int | None) -> None:
    path = ref_files[(endian, alignment)]
    h = read_file(path)
    assert_same_as_gguf_reader(path, h)
    assert h.byte_order == ("<" if endian == "LITTLE" else ">")
    assert h.alignment == (alignment or 32)
    assert h.metadata.get("general.alignment") == alignment
    assert h.data_offset % h.alignment == 0 and h.data_offset - h.alignment < h.header_bytes <= h.data_offset
    assert all(t.offset % h.alignment == 0 for t in h.tensors)
    assert h.file_bytes == path.stat().st_size == h.data_offset + h.data_bytes  # GGUFWriter pads the last tensor
    assert h.source == str(path) and h.architecture == "llama"
    # spot checks written by hand, not taken from either reader
    assert h.metadata["s.u64"] == 2**64 - 1 and h.metadata["s.i64"] == -(2**63)
    assert h.metadata["s.f32"] == struct.unpack("f", struct.pack("f", 0.1))[0] != 0.1
    assert h.metadata["s.string"] == "héllo ✓ 世界" and h.metadata["s.empty"] == ""
    assert h.metadata["s.bool_true"] is True and h.metadata["s.bool_false"] is False
    assert h.metadata["a.nested"] == GGUFArray(
        T_ARRAY, 2, (GGUFArray(T_INT32, 2, (1, 2)), GGUFArray(T_INT32, 3, (3, 4, 5)))
    )
    assert h.metadata["a.strings64"] == GGUFArray(T_STRING, 64, tuple(f"s{i}" for i in range(64)))
    assert h.metadata["a.tokens"] == GGUFArray(T_STRING, 300, None)  # > 64 strings: count kept, not decoded
    assert h.metadata["a.long_u8"] == GGUFArray(T_UINT8, DECODE_NUMERIC_MAX + 1, None)
    assert h.metadata["a.u32"] == GGUFArray(T_UINT32, 40, tuple(range(40)))
    assert h.metadata["z.after_the_long_arrays"] == 1234
    q4k = next(t for t in h.tensors if t.name == "q4_k")
    assert (q4k.shape, q4k.ggml_type, q4k.n_bytes) == ((256, 3), GGMLType.Q4_K, 3 * 144)
    q80 = next(t for t in h.tensors if t.name == "q8_0")
    assert (q80.shape, q80.ggml_type, q80.n_bytes) == ((64, 3), GGMLType.Q8_0, 3 * 2 * 34)


def test_decode_string_arrays(ref_files: dict[tuple[str, int | None], Path]) -> None:
    path = ref_files[("LITTLE", None)]
    h = read_file(path, decode_string_arrays=True)
    ref = assert_same_as_gguf_reader(path, h)
    tokens = h.metadata["a.tokens"]
    assert isinstance(tokens, GGUFArray) and tokens.values is not None
    assert list(tokens.values) == ref.fields["a.tokens"].contents() == [f"tok{i}" * (i % 5) for i in range(300)]
    # numeric arrays are not string arrays: the long one stays undecoded
    assert h.metadata["a.long_u8"] == GGUFArray(T_UINT8, DECODE_NUMERIC_MAX + 1, None)
    # everything else is the same as without decoding
    plain = read_file(path)
    assert {k: v for k, v in h.metadata.items() if k != "a.tokens"} == {
        k: v for k, v in plain.metadata.items() if k != "a.tokens"
    }


def test_block_sizes_match_gguf_py() -> None:
    """n_bytes rests on ggml.BLOCK: it must agree with gguf-py for every type both know, except q8_1,
    where gguf-py 0.19 says 40 bytes but ggml-common.h's block_q8_1 is two halves + 32 quants = 36."""
    common = [t for t in GGMLType if t.value in Q._value2member_map_]
    assert len(common) >= 30
    for t in common:
        if t is GGMLType.Q8_1:
            assert BLOCK[t] == (32, 2 + 2 + 32) and GGML_QUANT_SIZES[Q.Q8_1] == (32, 40)
        else:
            assert BLOCK[t] == GGML_QUANT_SIZES[Q(t.value)], t.name


# ---------------------------------------------------------------------------
# hand-built GGUF bytes

_FMT = {
    T_UINT8: "B",
    T_INT8: "b",
    T_UINT16: "H",
    T_INT16: "h",
    T_UINT32: "I",
    T_INT32: "i",
    T_FLOAT32: "f",
    T_BOOL: "?",
    T_UINT64: "Q",
    T_INT64: "q",
    T_FLOAT64: "d",
}
KV = tuple[str, int, Any] | bytes  # (key, type, value) or raw bytes
# (name, shape, ggml type) or (name, shape, ggml type, offset), or raw bytes
TENSOR = tuple[str, Sequence[int], int] | tuple[str, Sequence[int], int, int] | bytes


def enc(t: int, v: Any, o: str = "<") -> bytes:
    """A GGUF value of type t. Arrays: v = (item type, items)."""
    if t == T_STRING:
        b = v.encode() if isinstance(v, str) else v
        return struct.pack(o + "Q", len(b)) + b
    if t == T_ARRAY:
        it, items = v
        return struct.pack(o + "IQ", it, len(items)) + b"".join(enc(it, x, o) for x in items)
    return struct.pack(o + _FMT[t], v)


def kv_raw(key: str, t: int, raw: bytes) -> bytes:
    """A key/value whose value bytes are given as they are (lengths that lie)."""
    return enc(T_STRING, key) + struct.pack("<I", t) + raw


def tensor_nbytes(shape: Sequence[int], gt: int) -> int:
    if gt not in GGMLType._value2member_map_:
        return 0
    blck, tsize = BLOCK[GGMLType(gt)]
    n = 1
    for d in shape:
        n *= d
    return n // blck * tsize


def build(
    kvs: Sequence[KV] = (),
    tensors: Sequence[TENSOR] = (),
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    order: str = "<",
    n_kv: int | None = None,
    n_tensors: int | None = None,
    alignment: int = 32,
    data: bool = True,
) -> bytes:
    """GGUF bytes: header, key/values, tensor infos, then (data=True) padding and zeroed tensor data."""
    out = magic + struct.pack(order + "I", version)
    out += struct.pack(
        order + "QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    for kv in kvs:
        if isinstance(kv, bytes):
            out += kv
        else:
            key, t, v = kv
            out += enc(T_STRING, key, order) + struct.pack(order + "I", t) + enc(t, v, order)
    end = 0
    for ti in tensors:
        if isinstance(ti, bytes):
            out += ti
            continue
        name, shape, gt = ti[:3]
        offset = ti[3] if len(ti) == 4 else -(-end // alignment) * alignment
        out += enc(T_STRING, name, order) + struct.pack(order + "I", len(shape))
        out += struct.pack(order + f"{len(shape)}Q", *shape) + struct.pack(order + "IQ", gt, offset)
        end = max(end, offset + tensor_nbytes(shape, gt))
    if data and tensors:
        out += bytes(-len(out) % alignment) + bytes(-(-end // alignment) * alignment)
    return out


def nest(depth: int) -> tuple[int, Any]:
    """An array value nested `depth` arrays deep (the outermost counts), u8 at the bottom."""
    value: tuple[int, Any] = (T_UINT8, [7])
    for _ in range(depth - 1):
        value = (T_ARRAY, [value])
    return value


ARCH: KV = ("general.architecture", T_STRING, "llama")
F32 = int(GGMLType.F32)
Q4_0 = int(GGMLType.Q4_0)
Q4_K = int(GGMLType.Q4_K)

SMALL_VALID = build(
    [
        ARCH,
        ("llama.block_count", T_UINT32, 2),
        ("general.alignment", T_UINT32, 32),
        ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, ["<s>", "a", "bc"])),
        ("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, [0.0, -1.0, -2.0])),
        ("x.f64", T_FLOAT64, 2.5),
    ],
    [("token_embd.weight", (32, 3), Q4_0), ("blk.0.attn_norm.weight", (5,), F32), ("out", (256, 1), Q4_K)],
)


def test_builder_agrees_with_gguf_reader(tmp_path: Path) -> None:
    """The hand-built bytes are real GGUF: the hostile cases below differ from valid only where they mean to."""
    path = tmp_path / "small.gguf"
    path.write_bytes(SMALL_VALID)
    h = read_file(path)
    assert_same_as_gguf_reader(path, h)
    assert [(t.name, t.offset, t.n_bytes) for t in h.tensors] == [
        ("token_embd.weight", 0, 54),
        ("blk.0.attn_norm.weight", 64, 20),
        ("out", 96, 144),
    ]
    assert h.data_bytes == 256 and h.file_bytes == h.data_offset + 256 == len(SMALL_VALID)
    # big-endian, by hand
    be = tmp_path / "be.gguf"
    be.write_bytes(build([ARCH, ("n", T_ARRAY, (T_INT16, [-2, 3]))], [("t", (8, 2), F32)], order=">"))
    hb = read_file(be)
    assert_same_as_gguf_reader(be, hb)
    assert hb.byte_order == ">" and hb.metadata["n"] == GGUFArray(T_INT16, 2, (-2, 3))


def test_vocab_only_file_without_padding(tmp_path: Path) -> None:
    """llama.cpp's models/ggml-vocab-*.gguf: no tensors and no padding after the header. gguf.cpp only
    seeks to the aligned data section when there are tensors, so such a file is valid."""
    raw = build([ARCH, ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, ["a"] * 100)), ("x", T_UINT8, 1)])
    assert len(raw) % 32  # really unpadded
    path = tmp_path / "vocab.gguf"
    path.write_bytes(raw)
    h = read_file(path)
    assert h.tensors == () and h.data_bytes == 0 and h.header_bytes == h.file_bytes == len(raw)
    assert h.metadata["tokenizer.ggml.tokens"] == GGUFArray(T_STRING, 100, None) and h.metadata["x"] == 1


def test_last_tensor_needs_no_trailing_padding(tmp_path: Path) -> None:
    """llama_model_loader checks offs + ggml_nbytes(t) <= file size per tensor; padding after the last
    tensor is not required. One byte less is a truncated file."""
    h = read_file(_write(tmp_path, SMALL_VALID))
    last = h.tensors[-1]
    end = h.data_offset + last.offset + last.n_bytes
    assert end < len(SMALL_VALID)  # the file does have padding to cut
    assert read_file(_write(tmp_path, SMALL_VALID[:end], "nopad.gguf")).data_bytes == h.data_bytes
    with pytest.raises(GGUFError, match="truncated"):
        read_file(_write(tmp_path, SMALL_VALID[: end - 1], "short.gguf"))


# ---------------------------------------------------------------------------
# 3. hostile and broken headers

T = ("t", (32,), F32)  # one valid tensor
N64 = 1 << 63

HOSTILE: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", r"file ends inside the header while reading the magic and version"),
    "bad magic": (build([ARCH], magic=b"GGML"), r"not a GGUF file \(starts with b'GGML'"),
    "html page": (b"<!DOCTYPE html><html>" + bytes(100), r"not a GGUF file"),
    "version 0": (build([ARCH], version=0), r"unsupported GGUF version 0"),
    "version 1": (build([ARCH], version=1), r"GGUF version 1 is not supported"),
    "version 4": (build([ARCH], version=4), r"unsupported GGUF version 4"),
    "n_kv 2^40": (build([ARCH], n_kv=1 << 40), r"claims 1,099,511,627,776 metadata entries"),
    "n_kv 2^64-1": (build([ARCH], n_kv=2**64 - 1), r"claims 18,446,744,073,709,551,615 metadata entries"),
    "n_tensors 2^62": (build([ARCH], n_tensors=1 << 62), r"claims 4,611,686,018,427,387,904 tensors"),
    "key length 2^63": (
        build([struct.pack("<Q", N64) + b"general.architecture"], n_kv=1),
        r"metadata key #0: length 9,223,372,036,854,775,808 is larger than the \d+ bytes that remain",
    ),
    "string length 2^63": (
        build([kv_raw("general.name", T_STRING, struct.pack("<Q", N64) + b"abc")]),
        r"'general.name': length 9,223,372,036,854,775,808 is larger than",
    ),
    "string over limit": (
        build([kv_raw("general.name", T_STRING, struct.pack("<Q", 17 << 20))], [("t", (5 << 20,), F32)]),
        r"'general.name': length 17,825,792 is over the 16,777,216-byte limit",
    ),
    "empty key": (build([ARCH, ("", T_UINT8, 1)]), r"metadata key #1 is empty"),
    "duplicate key": (build([ARCH, ("k", T_UINT8, 1), ("k", T_UINT8, 2)]), r"duplicate metadata key 'k'"),
    "unknown value type 13": (build([kv_raw("k", 13, bytes(8))]), r"'k' has unknown value type 13"),
    "unknown value type 2^32-1": (build([kv_raw("k", 2**32 - 1, bytes(8))]), r"'k' has unknown value type 4294967295"),
    "unknown array element type": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", 13, 1) + bytes(8))]),
        r"'k': array has unknown element type 13",
    ),
    "u32 array longer than the file": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_UINT32, 1000) + bytes(8))]),
        r"'k': array of 1,000 u32 needs 4,000 bytes, only 8 remain",
    ),
    "u8 array of 2^62": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_UINT8, 1 << 62))]),
        r"'k': array of 4,611,686,018,427,387,904 u8 needs",
    ),
    "u64 array of 2^62 (bytes overflow 64 bits)": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_UINT64, 1 << 62))]),
        r"'k': array of 4,611,686,018,427,387,904 u64 needs 36,893,488,147,419,103,232 bytes",
    ),
    "string array of 2^62": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_STRING, 1 << 62))]),
        r"'k': array of 4,611,686,018,427,387,904 strings does not fit",
    ),
    "array of 2^62 arrays": (
        build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_ARRAY, 1 << 62))]),
        r"'k': array of 4,611,686,018,427,387,904 arrays does not fit",
    ),
    "short string array, a string runs past the end": (
        build(
            [
                kv_raw(
                    "k",
                    T_ARRAY,
                    struct.pack("<IQ", T_STRING, 3) + enc(T_STRING, "a") + struct.pack("<Q", 99) + bytes(10),
                )
            ]
        ),
        r"'k'\[1\]: length 99 is larger than the 10 bytes that remain",
    ),
    "long string array, a string runs past the end": (
        build([kv_raw("k", T_ARRAY, enc(T_ARRAY, (T_STRING, ["ab"] * 99))[:-10] + struct.pack("<Q", N64) + b"x")]),
        r"file ends inside the header while reading 'k'",
    ),
    f"arrays nested {MAX_ARRAY_DEPTH + 1} deep": (
        build([ARCH, ("k", T_ARRAY, nest(MAX_ARRAY_DEPTH + 1))]),
        rf"'k': arrays nested deeper than {MAX_ARRAY_DEPTH}",
    ),
    "alignment 48": (build([ARCH, ("general.alignment", T_UINT32, 48)]), r"alignment must be a power of two, got 48"),
    "alignment 0": (build([ARCH, ("general.alignment", T_UINT32, 0)]), r"alignment must be a power of two, got 0"),
    "alignment as string": (
        build([ARCH, ("general.alignment", T_STRING, "64")]),
        r"general.alignment must be of type u32, got string",
    ),
    "alignment as u64": (
        build([ARCH, ("general.alignment", T_UINT64, 64)]),
        r"general.alignment must be of type u32, got u64",
    ),
    "alignment as i32": (
        build([ARCH, ("general.alignment", T_INT32, 64)]),
        r"general.alignment must be of type u32, got i32",
    ),
    "duplicate tensor name": (build([ARCH], [T, T]), r"duplicate tensor name 't'"),
    "tensor name of 64 bytes": (build([ARCH], [("n" * 64, (32,), F32)]), r"is 64 bytes; llama.cpp allows < 64"),
    "tensor name of 64 UTF-8 bytes": (build([ARCH], [("é" * 32, (32,), F32)]), r"is 64 bytes; llama.cpp allows < 64"),
    "tensor name length 2^63": (
        build([ARCH], [struct.pack("<Q", N64) + b"t"], n_tensors=1, data=False),
        r"tensor #0 name: length 9,223,372,036,854,775,808 is larger than",
    ),
    # llama.cpp (gguf.cpp) accepts n_dims 0 (a scalar) and zero-sized dimensions; we refuse them: no real
    # model has such a tensor, and a zero-byte tensor would make every per-tensor estimate meaningless.
    "n_dims 0": (build([ARCH], [("t", (), F32)], data=False), r"tensor 't' has 0 dimensions \(1 to 4 allowed\)"),
    "n_dims 5": (build([ARCH], [("t", (32, 1, 1, 1, 1), F32)]), r"tensor 't' has 5 dimensions \(1 to 4 allowed\)"),
    "zero dimension": (build([ARCH], [("t", (32, 0), F32)]), r"tensor 't' has an invalid dimension 0"),
    "negative dimension": (build([ARCH], [("t", (32, N64), F32)], data=False), r"invalid dimension 922337203"),
    "2^64 elements": (build([ARCH], [("t", (1 << 32, 1 << 32), F32)], data=False), r"too many elements"),
    "ggml type 4 (removed Q4_2)": (build([ARCH], [("t", (32,), 4)]), r"tensor 't' has unknown ggml type 4"),
    "ggml type 31 (removed Q4_0_4_4)": (build([ARCH], [("t", (32,), 31)]), r"unknown ggml type 31"),
    "ggml type 99": (build([ARCH], [("t", (32,), 99)]), r"tensor 't' has unknown ggml type 99"),
    "ggml type 2^32-1": (build([ARCH], [("t", (32,), 2**32 - 1)]), r"unknown ggml type 4294967295"),
    "q4_0 row of 48": (
        build([ARCH], [("t", (48, 2), Q4_0)]),
        r"tensor 't': row length 48 is not a multiple of the q4_0 block size 32",
    ),
    "q4_k row of 128": (build([ARCH], [("t", (128,), Q4_K)]), r"row length 128 .* q4_k block size 256"),
    "offset not aligned": (
        build([ARCH], [("t", (32,), F32, 16)]),
        r"tensor 't' offset 16 is not a multiple of the alignment 32",
    ),
    "offset not aligned to custom alignment": (
        build([ARCH, ("general.alignment", T_UINT32, 64)], [("t", (32,), F32, 32)], alignment=64),
        r"tensor 't' offset 32 is not a multiple of the alignment 64",
    ),
    "tensors out of order": (
        build([ARCH], [("a", (8,), F32, 32), ("b", (8,), F32, 0)]),
        r"tensor 'a' has offset 32, expected 0 \(tensors must be packed in order\)",
    ),
    "tensors overlap": (
        build([ARCH], [("a", (16,), F32, 0), ("b", (8,), F32, 32)]),
        r"tensor 'b' has offset 32, expected 64",
    ),
    "gap between tensors": (
        build([ARCH], [("a", (8,), F32, 0), ("b", (8,), F32, 64)]),
        r"tensor 'b' has offset 64, expected 32",
    ),
    "tensor larger than the file": (
        build([ARCH], [("t", (1 << 40,), F32)], data=False),
        r"file is truncated: its tensors need 4,398,046,511,\d+ bytes but the file has",
    ),
    "data section cut short": (SMALL_VALID[:-200], r"file is truncated: .* \(\d+ missing\)"),
}


def _write(tmp_path: Path, raw: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def assert_cli_refuses(path: Path, capsys: pytest.CaptureFixture[str], pattern: str = "") -> list[str]:
    """kvadvise gguf PATH: exit 2, nothing on stdout, an error line naming the file, an optional hint."""
    capsys.readouterr()
    assert main(["gguf", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""
    assert 1 <= len(lines) <= 2, err
    assert lines[0].startswith(f"kvadvise: error: {path}: "), err
    assert re.search(pattern, lines[0]), err
    if len(lines) == 2:
        assert lines[1].startswith("kvadvise: hint: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_header(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw, pattern = HOSTILE[case]
    path = _write(tmp_path, raw)
    with pytest.raises(GGUFError) as ei:
        read_file(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: "), msg
    assert re.search(pattern, msg), msg
    assert ei.value.exit_code == 2
    lines = assert_cli_refuses(path, capsys, pattern)
    assert len(lines) == (2 if ei.value.hint else 1)
    if "truncated" in msg or "ends inside the header" in msg:
        assert "download" in (ei.value.hint or ""), msg


def test_arrays_at_the_depth_limit_are_read(tmp_path: Path) -> None:
    h = read_file(_write(tmp_path, build([ARCH, ("k", T_ARRAY, nest(MAX_ARRAY_DEPTH))])))
    v = h.metadata["k"]
    for _ in range(MAX_ARRAY_DEPTH - 1):
        assert isinstance(v, GGUFArray) and v.item_type == T_ARRAY and v.count == 1 and v.values
        v = v.values[0]
    assert v == GGUFArray(T_UINT8, 1, (7,))


def test_longest_tensor_name_is_accepted(tmp_path: Path) -> None:
    h = read_file(_write(tmp_path, build([ARCH], [("n" * 63, (32,), F32)])))
    assert h.tensors[0].name == "n" * 63


def test_truncated_at_every_header_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cut the small file at every byte of its header and its padding: always a GGUFError naming the file."""
    h = read_file(_write(tmp_path, SMALL_VALID, "full.gguf"))
    assert h.header_bytes < h.data_offset  # there is padding to cut into too
    path = tmp_path / "cut.gguf"
    for cut in range(h.data_offset):
        path.write_bytes(SMALL_VALID[:cut])
        with pytest.raises(GGUFError) as ei:
            read_file(path)
        assert str(ei.value).startswith(f"{path}: "), (cut, str(ei.value))
        if cut >= h.header_bytes:  # the header is whole: the data section is missing
            assert "file is truncated" in str(ei.value) and "download" in (ei.value.hint or ""), cut
        if cut % 5 == 0 or cut == h.data_offset - 1:
            assert_cli_refuses(path, capsys)


def test_truncated_inside_the_data_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = read_file(_write(tmp_path, SMALL_VALID, "full.gguf"))
    last = h.tensors[-1]
    end = h.data_offset + last.offset + last.n_bytes
    path = tmp_path / "cut.gguf"
    for cut in (h.data_offset, h.data_offset + 1, h.data_offset + 54, h.data_offset + 100, end - 1):
        path.write_bytes(SMALL_VALID[:cut])
        with pytest.raises(GGUFError) as ei:
            read_file(path)
        msg = str(ei.value)
        assert (
            msg
            == f"{path}: file is truncated: its tensors need {end:,} bytes but the file has {cut:,} ({end - cut:,} missing)"
        )
        assert ei.value.hint and "download" in ei.value.hint
        lines = assert_cli_refuses(path, capsys, "file is truncated")
        assert len(lines) == 2 and "download" in lines[1]


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_cli_refuses(tmp_path / "nope.gguf", capsys, "no such file")
    assert_cli_refuses(tmp_path, capsys, "is a directory")


# ---------------------------------------------------------------------------
# 4. bounded memory and time

LIARS = {
    "2^40 metadata entries": build([ARCH], n_kv=1 << 40),
    "2^62 tensors": build([ARCH], n_tensors=1 << 62),
    "2^62-element u8 array": build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_UINT8, 1 << 62) + bytes(64))]),
    "2^62-element string array": build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_STRING, 1 << 62) + bytes(64))]),
    "2^62 arrays": build([kv_raw("k", T_ARRAY, struct.pack("<IQ", T_ARRAY, 1 << 62) + bytes(64))]),
    "2^63-byte string": build([kv_raw("k", T_STRING, struct.pack("<Q", N64) + bytes(64))]),
    "2^63-byte key": build([struct.pack("<Q", N64) + bytes(64)], n_kv=1),
}


@pytest.mark.parametrize("pad_mib", [0, 64])
@pytest.mark.parametrize("case", list(LIARS))
def test_lying_counts_fail_fast_without_allocating(case: str, pad_mib: int, tmp_path: Path) -> None:
    """Also inside a 64 MiB file (sparse): the claims are checked against what remains, not just > file."""
    path = _write(tmp_path, LIARS[case])
    if pad_mib:
        with open(path, "r+b") as f:
            f.truncate(pad_mib << 20)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(GGUFError):
            read_file(path)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5, elapsed
    assert peak < 4 << 20, peak


# ---------------------------------------------------------------------------
# 5. any ByteSource


class CountingSource:
    """An in-memory ByteSource that records every read."""

    def __init__(self, data: bytes, name: str = "mem://model.gguf", *, size_known: bool = True) -> None:
        self.name = name
        self.data = data
        self.size_known = size_known
        self.reads: list[tuple[int, int]] = []
        self.bytes_served = 0

    def size(self) -> int | None:
        return len(self.data) if self.size_known else None

    def read(self, offset: int, n: int) -> bytes:
        self.reads.append((offset, n))
        out = self.data[offset : offset + n]
        self.bytes_served += len(out)
        return out


class FileRangeSource(CountingSource):
    """Like an HTTP range reader over a big file: serves reads from disk, records them."""

    def __init__(self, path: Path) -> None:
        super().__init__(b"", name=f"https://example.invalid/{path.name}")
        self.path = path
        self._size = path.stat().st_size

    def size(self) -> int | None:
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        self.reads.append((offset, n))
        with open(self.path, "rb") as f:
            f.seek(offset)
            out = f.read(n)
        self.bytes_served += len(out)
        return out


def test_in_memory_source_reads_the_same(ref_files: dict[tuple[str, int | None], Path]) -> None:
    for path in ref_files.values():
        src = CountingSource(path.read_bytes())
        h = read_header(src)
        assert h == dataclasses.replace(read_file(path), source=src.name)
        assert len(src.reads) == 1  # a small header: one chunk


def test_source_of_unknown_size(ref_files: dict[tuple[str, int | None], Path]) -> None:
    path = ref_files[("LITTLE", None)]
    raw = path.read_bytes()
    h = read_header(CountingSource(raw, size_known=False))
    assert h.file_bytes is None
    assert dataclasses.replace(h, file_bytes=len(raw), source=str(path)) == read_file(path)
    # a header cut short is still noticed from the short read
    with pytest.raises(GGUFError, match=r"^mem://model.gguf: file ends inside the header") as ei:
        read_header(CountingSource(raw[: h.header_bytes - 3], size_known=False))
    assert ei.value.hint and "download" in ei.value.hint


def test_read_error_becomes_gguf_error() -> None:
    class Broken(CountingSource):
        def read(self, offset: int, n: int) -> bytes:
            raise ConnectionResetError(104, "Connection reset by peer")

    with pytest.raises(GGUFError, match=r"^mem://model.gguf: read error at byte 0: .*Connection reset by peer"):
        read_header(Broken(SMALL_VALID))


# ---------------------------------------------------------------------------
# 2. the real Gemma 3 270M

GEMMA_FILE_BYTES = 253_113_024
GEMMA_HEADER_BYTES = 6_525_112
GEMMA_DATA_BYTES = 246_587_904


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> GGUFHeader:
    return read_file(gemma_path)


def test_gemma_header(gemma: GGUFHeader, gemma_path: Path) -> None:
    h = gemma
    assert gemma_path.stat().st_size == GEMMA_FILE_BYTES == h.file_bytes
    assert h.version == 3 and h.byte_order == "<" and h.alignment == 32
    assert h.header_bytes == GEMMA_HEADER_BYTES
    assert h.data_offset == 6_525_120  # header padded to 32
    assert h.data_bytes == GEMMA_DATA_BYTES == GEMMA_FILE_BYTES - h.data_offset
    assert h.architecture == "gemma3"
    md = h.metadata
    assert md["gemma3.block_count"] == 18
    assert md["gemma3.embedding_length"] == 640
    assert md["gemma3.feed_forward_length"] == 2048
    assert md["gemma3.attention.head_count"] == 4 and md["gemma3.attention.head_count_kv"] == 1
    assert md["gemma3.attention.key_length"] == md["gemma3.attention.value_length"] == 256
    assert md["gemma3.attention.sliding_window"] == 512
    assert md["gemma3.context_length"] == 32768
    assert md["tokenizer.ggml.tokens"] == GGUFArray(T_STRING, 262144, None)
    assert md["tokenizer.ggml.scores"] == GGUFArray(T_FLOAT32, 262144, None)
    assert md["tokenizer.ggml.token_type"] == GGUFArray(T_INT32, 262144, None)
    assert len(h.tensors) == 236
    assert len([t for t in h.tensors if t.name.startswith("blk.")]) == 18 * 13
    emb = next(t for t in h.tensors if t.name == "token_embd.weight")
    assert (emb.shape, emb.ggml_type, emb.n_bytes) == ((640, 262144), GGMLType.Q8_0, 640 * 262144 // 32 * 34)
    q = next(t for t in h.tensors if t.name == "blk.0.attn_q.weight")
    assert q.shape == (640, 4 * 256)
    k = next(t for t in h.tensors if t.name == "blk.0.attn_k.weight")
    assert k.shape == (640, 1 * 256)
    last = h.tensors[-1]
    assert h.data_offset + last.offset + last.n_bytes == GEMMA_FILE_BYTES  # the last tensor ends the file


def _parse_tensor_infos(raw: bytes, start: int, count: int) -> tuple[list[tuple[str, tuple[int, ...], int, int]], int]:
    """A dozen-line tensor-info parser, independent of kvadvise.model.gguf."""
    out = []
    pos = start
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8 : pos + 8 + n].decode()
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", raw, pos)
        shape = struct.unpack_from(f"<{n_dims}Q", raw, pos + 4)
        pos += 4 + 8 * n_dims
        gt, offset = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        out.append((name, shape, gt, offset))
    return out, pos


def test_gemma_tensor_infos_independently_parsed(gemma: GGUFHeader, gemma_path: Path) -> None:
    with open(gemma_path, "rb") as f:
        raw = f.read(GEMMA_HEADER_BYTES + 64)
    first = struct.pack("<Q", len("output_norm.weight")) + b"output_norm.weight"
    start = raw.find(first)
    assert start > 6_000_000  # after the 262k-token vocabulary
    infos, end = _parse_tensor_infos(raw, start, 236)
    assert end == GEMMA_HEADER_BYTES
    assert [(t.name, t.shape, int(t.ggml_type), t.offset) for t in gemma.tensors] == infos
    # n_bytes from the ggml block table, by hand for the types in this file
    blocks = {0: (1, 4), 6: (32, 22), 8: (32, 34), 12: (256, 144), 14: (256, 210)}
    for t, (_, shape, gt, _) in zip(gemma.tensors, infos, strict=True):
        blck, tsize = blocks[gt]
        assert t.n_bytes == int(np.prod(shape)) // blck * tsize, t.name
    # padded sizes sum to the data section, which runs to the end of the file
    assert sum(-(-t.n_bytes // 32) * 32 for t in gemma.tensors) == GEMMA_DATA_BYTES


def test_gemma_header_read_in_a_few_chunks(gemma: GGUFHeader, gemma_path: Path) -> None:
    src = FileRangeSource(gemma_path)
    h = read_header(src)
    assert dataclasses.replace(h, source=str(gemma_path)) == gemma
    assert 2 <= len(src.reads) <= 4, src.reads  # growing chunks: 1 + 2 + 4 MiB cover the 6.5 MB header
    assert all(offset < GEMMA_HEADER_BYTES for offset, _ in src.reads)  # never touches the weights' bytes
    assert max(n for _, n in src.reads) < 32 << 20 < GEMMA_FILE_BYTES
    assert src.bytes_served < 8 << 20  # header is 6.5 MB


def test_gemma_truncated_copy(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gemma-partial.gguf"
    with open(gemma_path, "rb") as f:
        path.write_bytes(f.read(GEMMA_HEADER_BYTES + 1_000_000))
    with pytest.raises(GGUFError) as ei:
        read_file(path)
    missing = GEMMA_FILE_BYTES - (GEMMA_HEADER_BYTES + 1_000_000)
    assert str(ei.value).endswith(f"the file has {GEMMA_HEADER_BYTES + 1_000_000:,} ({missing:,} missing)")
    lines = assert_cli_refuses(path, capsys, "file is truncated")
    assert "download" in lines[1]


def _patched_u32(src: Path, dst: Path, key: str, value: int) -> Path:
    """``src`` with the uint32 metadata value of ``key`` set to ``value`` (the header lies; the tensors do not)."""
    data = src.read_bytes()
    at = data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key)  # the key whole, not a prefix
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF_TYPE_UINT32
    dst.write_bytes(data[: at + 4] + struct.pack("<I", value) + data[at + 8 :])
    return dst


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ("llama.attention.head_count", "blk.0.attn_q.weight"),
        ("llama.attention.head_count_kv", "blk.0.attn_k.weight"),
        ("llama.embedding_length", "embedding_length is 0"),
    ],
)
def test_a_header_of_zero_heads_or_width_beside_attention_tensors_is_refused(
    key: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A llama GGUF whose header says 0 heads (or 0 KV heads, or a width of 0) while its layers hold attention
    tensors: llama.cpp refuses it (llama-fit-params b11312: "check_tensor_dims: tensor 'blk.0.attn_q.weight' has
    wrong shape; expected 128, 0"; "invalid n_rot: 32, expected 0"); kvadvise planned it (KV per token 0 B,
    exit 0). A file llama.cpp cannot load is exit 2."""
    from tinymodels import write_tiny_gguf

    base = write_tiny_gguf(tmp_path / "base.gguf", "llama")
    bad = _patched_u32(base, tmp_path / "bad.gguf", key, 0)
    rc = main(["gguf", str(bad), "--no-hardware"])
    err = capsys.readouterr().err
    assert rc == 2 and what in err and "internal error" not in err, err
    assert main(["gguf", str(base), "--no-hardware"]) == 0


# A count no real dimension has: the tiny llama has 4 heads (2 KV) of 32 over a width of 128, and FFN 256.
# llama-fit-params (b11312) refuses each ("invalid n_rot: 32, expected 0"; "check_tensor_dims: tensor
# 'blk.0.attn_k.weight' has wrong shape; expected 128, 4294967264"; "... 'blk.0.ffn_gate.weight' ... expected
# 128, 4294967295"); kvadvise planned each (exit 0, or 3 with a compute buffer of terabytes)
IMPOSSIBLE_COUNTS = [
    ("llama.attention.head_count", 2**32 - 1, "K rows are 0 x 2 heads"),  # n_embd / n_head: a head width of 0
    ("llama.attention.head_count", 1000, "K rows are 0 x 2 heads"),  # more heads than the width has columns
    ("llama.attention.head_count", 5, "K rows are 25 x 2 heads = 50 wide"),  # 128 / 5: not the tensors' 32
    ("llama.attention.head_count_kv", 2**32 - 1, "blk.0.attn_k.weight is 64 wide"),
    ("llama.attention.head_count_kv", 3, "K rows are 32 x 3 heads = 96 wide"),
    ("llama.embedding_length", 2**32 - 1, "embedding_length 4,294,967,295"),
    ("llama.feed_forward_length", 2**32 - 1, "feed_forward_length is 4,294,967,295"),
]


@pytest.mark.parametrize(("key", "value", "what"), IMPOSSIBLE_COUNTS)
def test_a_count_the_tensors_do_not_have_is_refused(
    key: str, value: int, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A head count, KV head count, width or FFN width the layers' tensors do not have is a file llama.cpp
    refuses (src/llama-model.cpp create_tensor_qkv, llama-model-loader.cpp check_tensor_dims): exit 2, the
    key named, with or without a card to plan for, never a plan."""
    from tinymodels import write_tiny_gguf

    base = write_tiny_gguf(tmp_path / "base.gguf", "llama")
    bad = _patched_u32(base, tmp_path / "bad.gguf", key, value)
    for extra in (["--no-hardware"], ["--gpu", "rtx-4090"], ["--gpu", "rtx-4090", "--json"]):
        rc = main(["gguf", str(bad), *extra])
        out, err = capsys.readouterr()
        assert rc == 2 and what in err and "bad.gguf" in err and "internal error" not in err and not out, err
        assert err.count("\n") == 2 and "llama.cpp refuses to load it" in err  # the error and its hint
    assert main(["gguf", str(base), "--no-hardware"]) == 0


@pytest.mark.parametrize(
    ("key", "value", "refused"), [(k, v, v == 2**32 - 1 or v == 1000) for k, v, _ in IMPOSSIBLE_COUNTS]
)
def test_an_unverified_architecture_is_refused_only_a_width_no_model_has(
    key: str, value: int, refused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where kvadvise's head widths are not verified against llama.cpp (an architecture outside VERIFIED), a rule
    it does not know could size the tensors: a width that differs is planned (as an estimate, said so), and only
    one no model has (0, past a million: a count of 4294967295, 1,000 heads over 128 columns) is refused."""
    from tinymodels import write_tiny_gguf

    from kvadvise.model import architecture
    from kvadvise.model.architecture import from_gguf

    monkeypatch.setattr(architecture, "VERIFIED", architecture.VERIFIED - {"llama"})
    base = write_tiny_gguf(tmp_path / "base.gguf", "llama")
    header = read_file(_patched_u32(base, tmp_path / "bad.gguf", key, value))
    if refused:
        with pytest.raises(GGUFError, match=" wide") as e:
            from_gguf(header)
        assert e.value.hint is not None and "llama.cpp refuses to load it" in e.value.hint
    else:
        assert not from_gguf(header).verified


@pytest.mark.llama
@pytest.mark.parametrize(("key", "value", "what"), IMPOSSIBLE_COUNTS)
def test_llama_cpp_refuses_what_kvadvise_refuses(
    key: str, value: int, what: str, tmp_path: Path, fit_params: Path
) -> None:
    """The files above, given to llama-fit-params of the tests' llama.cpp: it cannot load one (exit 1; its log,
    written by a thread never joined at exit, may not arrive, so the exit code is what is read)."""
    import subprocess

    from tinymodels import write_tiny_gguf

    base = write_tiny_gguf(tmp_path / "base.gguf", "llama")
    bad = _patched_u32(base, tmp_path / "bad.gguf", key, value)
    for path, rc in ((base, 0), (bad, 1)):
        run = subprocess.run(
            [str(fit_params), "-m", str(path), "-c", "512"], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == rc, (run.stdout + run.stderr)[-2000:]


def test_a_head_count_beside_an_explicit_key_length_is_checked_against_q(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    """Gemma 3 gives its head width (key_length 256), so head_count 4294967295 leaves K and V as they are: only Q
    (256 x 4 = 1024 wide) tells the count is wrong. llama.cpp refuses the file (create_tensor_qkv: Q of
    n_embd_head_k * n_head); kvadvise sized the attention's compute by 4294967295 heads (exit 3 on a card)."""
    bad = _patched_u32(gemma_path, tmp_path / "bad.gguf", "gemma3.attention.head_count", 2**32 - 1)
    rc = main(["gguf", str(bad), "--gpu", "rtx-4090"])
    err = capsys.readouterr().err
    assert rc == 2 and "layer 0's Q is 4,294,967,295 heads" in err and "attn_q.weight is 1,024 wide" in err, err


@pytest.mark.llama
def test_llama_cpp_refuses_gemma_with_a_head_count_q_does_not_have(
    gemma_path: Path, tmp_path: Path, fit_params: Path
) -> None:
    """llama-fit-params (b11312): "check_tensor_dims: tensor 'blk.0.attn_q.weight' has wrong shape; expected 640,
    1099511627520, got 640, 1024" (exit 1)."""
    import subprocess

    bad = _patched_u32(gemma_path, tmp_path / "bad.gguf", "gemma3.attention.head_count", 2**32 - 1)
    run = subprocess.run([str(fit_params), "-m", str(bad), "-c", "512"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, (run.stdout + run.stderr)[-2000:]


@pytest.mark.parametrize("n_ctx_train", [2**31, 2**32 - 1])
def test_a_training_context_past_what_c_takes_is_refused_with_its_key(
    n_ctx_train: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """context_length 4,294,967,295: the search for the model's maximum context reached RunConfig's int32 check
    and said "n_ctx must be a whole number from 0 to 2,147,483,647 ..., got 4294967040", naming neither the file
    nor its key, for a --ctx nobody gave. The key is refused where it is read (exit 2); a config.json's
    max_position_embeddings becomes the same key."""
    from tinymodels import write_tiny_gguf

    base = write_tiny_gguf(tmp_path / "base.gguf", "llama")
    bad = _patched_u32(base, tmp_path / "bad.gguf", "llama.context_length", n_ctx_train)
    for extra in ((), ("--use", "long"), ("-c", "4096")):
        rc = main(["gguf", str(bad), "--gpu", "rtx-4090", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and "llama.context_length" in err and "bad.gguf" in err, err
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000, '
        f'"max_position_embeddings": {n_ctx_train}}}'
    )
    rc = main(["hf", str(cfg), "--gpu", "rtx-4090"])
    err = capsys.readouterr().err
    assert rc == 2 and "context_length" in err and "n_ctx must be" not in err, err
