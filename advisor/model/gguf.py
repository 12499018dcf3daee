"""Header-only GGUF reader.

Reads the metadata key/values and tensor infos of a GGUF file from any byte
source (a local file here; HTTP range reads plug in through ``ByteSource``),
in chunks, never the weights. Large arrays (a 262k-token vocabulary) are
skipped without decoding; their element type and length are kept.

The checks follow ggml/src/gguf.cpp ``gguf_init_from_file_impl`` (llama.cpp
0c1e570): a header llama.cpp would refuse is refused here too, with the file
name and what was wrong. Memory stays bounded whatever the header claims:
every count and length is checked against the bytes that remain before
anything is read or allocated.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kvadvise.errors import GGUFError
from kvadvise.model.ggml import BLOCK, GGMLType
from kvadvise.model.keys import General, Tokenizer

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # gguf.cpp refuses tensor names of this length or longer
MAX_ARRAY_DEPTH = 4
MAX_STRING_BYTES = 16 << 20  # a single metadata string; real ones are < 1 MiB
# Numeric arrays up to this length are decoded: the per-layer arrays llama.cpp reads (get_key_or_arr, at
# most LLAMA_MAX_LAYERS = 512 values, src/llama-hparams.h), 8x over. A vocabulary's scores and token types
# (32,000 for Llama 2) are kept as a length: decoded, they made each cached header hundreds of KB of JSON.
DECODE_NUMERIC_MAX = 1 << 12
DECODE_STRING_MAX = 64  # string arrays up to this length are decoded (tags, languages)
# Work done item by item, summed over all arrays of a header, is capped so that a header whose arrays
# claim the data section (zeros parse as empty strings and empty arrays) cannot take minutes or GBs.
# Real files: a 262k-token vocabulary and < 1M merges; per-layer arrays of a few hundred numbers;
# no nested arrays at all (llama.cpp refuses them).
MAX_STRINGS = 1 << 23  # strings in arrays, walked or decoded
MAX_NESTED_ARRAYS = 1 << 16  # arrays inside arrays
MAX_DECODED_NUMBERS = 1 << 20  # numbers decoded from numeric arrays
_ITEM_LIMITS = {"strings": MAX_STRINGS, "nested arrays": MAX_NESTED_ARRAYS, "decoded numbers": MAX_DECODED_NUMBERS}
_CHUNK = 1 << 20
MAX_READ_AHEAD = 32 << 20  # the most one read asks for on a guess of what the header still holds

# GGUF value types (gguf_type)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = range(8)
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = 8, 9, 10, 11, 12
_SCALAR_FMT = {
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
_SCALAR_SIZE = {t: struct.calcsize(f) for t, f in _SCALAR_FMT.items()}
TYPE_NAMES = {
    **{t: n for t, n in zip(range(8), ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool"), strict=True)},
    T_STRING: "string",
    T_ARRAY: "array",
    T_UINT64: "u64",
    T_INT64: "i64",
    T_FLOAT64: "f64",
}


@dataclass(frozen=True, slots=True)
class GGUFArray:
    """A metadata array. ``values`` is None when it was skipped undecoded."""

    item_type: int
    count: int
    values: tuple[Value, ...] | None = None


Value = int | float | bool | str | GGUFArray


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry in a GGUF header (gguf_get_tensor_*)."""

    name: str
    shape: tuple[int, ...]  # ne0 first, as stored in GGUF
    ggml_type: GGMLType
    offset: int  # relative to the data section
    n_bytes: int  # ggml_nbytes of the contiguous tensor


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """A GGUF file's header: key/value metadata and tensor infos, no tensor data."""

    source: str
    version: int
    byte_order: str  # "<" little endian, ">" big endian
    metadata: Mapping[str, Value]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    header_bytes: int  # where the tensor infos end
    data_offset: int  # start of the data section
    data_bytes: int  # size of the data section (tensors with their padding)
    file_bytes: int | None  # None when the source size is unknown
    extra: Mapping[str, object] = field(default_factory=dict)
    # each key's GGUF value type (T_UINT32...), as the file stores it: llama.cpp's loader refuses a key of another
    # type than the field it fills (kvadvise.model.architecture); empty for metadata kvadvise made itself
    value_types: Mapping[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get(General.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise GGUFError(f"{self.source}: general.architecture is missing")
        return arch


class ByteSource(Protocol):
    """Anything that can serve byte ranges: a local file, an HTTP range reader."""

    name: str

    def size(self) -> int | None: ...

    def read(self, offset: int, n: int) -> bytes: ...


class FileSource:
    """A local file as a ByteSource."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from kvadvise.files import open_regular

        self.name = str(path)
        # only a regular file: a FIFO would block the open or the read, /dev/zero never end
        self._f = os.fdopen(open_regular(path), "rb")
        self._size = os.fstat(self._f.fileno()).st_size

    def size(self) -> int | None:
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        self._f.seek(offset)
        return self._f.read(n)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_file(path: str | os.PathLike[str], *, decode_string_arrays: bool = False) -> GGUFHeader:
    """Read the header of a local GGUF file."""
    with FileSource(path) as src:
        return read_header(src, decode_string_arrays=decode_string_arrays)


def read_header(src: ByteSource, *, decode_string_arrays: bool = False) -> GGUFHeader:
    """Read and check a GGUF header from ``src``. Raises GGUFError."""
    return _Reader(src, decode_string_arrays).read()


class _Reader:
    def __init__(self, src: ByteSource, decode_string_arrays: bool) -> None:
        self.src = src
        self.name = src.name
        self.decode_strings = decode_string_arrays
        self.size = src.size()
        self.buf = b""
        self.buf_start = 0
        self.pos = 0
        self.chunk = _CHUNK
        self.spent = dict.fromkeys(_ITEM_LIMITS, 0)
        self.metadata: dict[str, Value] = {}
        self.value_types: dict[str, int] = {}
        self.n_tensors = 0

    # -- low level -------------------------------------------------------

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.name}: {what}")

    def remaining(self) -> int:
        return (self.size - self.pos) if self.size is not None else 1 << 62

    def truncated(self, what: str) -> GGUFError:
        have = f"; the file has {self.size:,} bytes" if self.size is not None else ""
        return GGUFError(
            f"{self.name}: file ends inside the header while reading {what} at byte {self.pos:,}{have}",
            hint="the file is truncated: a download cut short? download it again",
        )

    def ensure(self, n: int, what: str, ahead: int = 0) -> int:
        """Make bytes [pos, pos+n) available; return their index in buf. A read fetches at least
        ``ahead`` bytes (a guess of what the header still holds) and at least the next chunk."""
        i = self.pos - self.buf_start
        if i >= 0 and i + n <= len(self.buf):
            return i
        if n > self.remaining():
            raise self.truncated(what)
        want = max(n, self.chunk, min(ahead, MAX_READ_AHEAD, self.remaining()))
        self.chunk = min(self.chunk * 2, 16 << 20)  # long vocabularies: fewer, larger reads
        try:
            data = self.src.read(self.pos, want)
        except OSError as e:
            raise self.fail(f"read error at byte {self.pos:,}: {e}") from e
        if len(data) < n:
            raise self.truncated(what)
        self.buf = data
        self.buf_start = self.pos
        return 0

    def scalar(self, t: int, what: str) -> int | float | bool:
        s = self.structs[t]
        i = self.ensure(s.size, what)
        self.pos += s.size
        v: int | float | bool = s.unpack_from(self.buf, i)[0]
        return v

    def u32(self, what: str) -> int:
        i = self.ensure(4, what)
        self.pos += 4
        v: int = self.s_u32.unpack_from(self.buf, i)[0]
        return v

    def u64(self, what: str) -> int:
        i = self.ensure(8, what)
        self.pos += 8
        v: int = self.s_u64.unpack_from(self.buf, i)[0]
        return v

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        n = self.u64(f"{what} length")
        if n > self.remaining():
            raise self.fail(f"{what}: length {n:,} is larger than the {self.remaining():,} bytes that remain")
        if n > limit:
            raise self.fail(f"{what}: length {n:,} is over the {limit:,}-byte limit")
        i = self.ensure(n, what)
        self.pos += n
        try:
            return self.buf[i : i + n].decode("utf-8")
        except UnicodeDecodeError:
            return self.buf[i : i + n].decode("utf-8", errors="replace")

    def spend(self, what: str, n: int, key: str) -> None:
        """Count ``n`` array items of kind ``what`` against the per-header cap, before touching them."""
        limit = _ITEM_LIMITS[what]
        self.spent[what] += n
        if self.spent[what] > limit:
            raise self.fail(
                f"{key!r}: more than {limit:,} {what} in the header's arrays; real models hold far fewer "
                "(a corrupt or hostile file?)"
            )

    def skip(self, n: int, what: str) -> None:
        if n > self.remaining():
            raise self.truncated(what)
        self.pos += n

    def skip_strings(self, count: int, what: str, key: str) -> None:
        """Walk past ``count`` strings without decoding them (the hot loop)."""
        unpack = self.s_u64.unpack_from
        left = count
        start = self.pos
        while left:
            i = self.ensure(8, what, ahead=self.rest_of_header(key, count, left, self.pos - start))
            buf = self.buf
            lim = len(buf) - 8
            done = 0
            for done in range(1, left + 1):  # noqa: B007 - done is used after the loop
                i += 8 + unpack(buf, i)[0]
                if i > lim:
                    break
            else:
                done = left
            left -= done
            self.pos = self.buf_start + i
            if self.size is not None and self.pos > self.size:
                raise self.truncated(what)

    def rest_of_header(self, key: str, count: int, left: int, walked: int) -> int:
        """A guess of the bytes from here to the end of the header, made in the middle of a long string
        array from the counts already read, so that one more read reaches the end: a remote header
        (backends/remote/http_source.py) costs a request per read, and a 262k-token vocabulary took three.

        The rest of the array at the mean length walked so far, plus a quarter (tokens grow longer
        toward the end of a vocabulary: Gemma 3's first 65,664 strings average 15.95 bytes, all 262,144
        16.8); after the vocabulary, what llama.cpp's converter writes for each token
        (convert_hf_to_gguf.py ``_set_vocab_sentencepiece``: scores (f32) and types (i32);
        ``_set_vocab_gpt2``: types and about as many merges, each two tokens and a space); then the
        tensor infos (a name under 64 bytes, the dimensions, type and offset). A guess that falls short
        costs one more read, one too long reads a little past the header.
        """
        done = count - left
        if done < 1024:  # too few strings walked to know their mean length: the chunk size decides
            return 0
        mean = walked / done
        rest = left * mean * 5 / 4
        if key == Tokenizer.LIST:
            if self.metadata.get(Tokenizer.MODEL) == "gpt2":
                rest += count * 4 + count * (2 * mean - 7)
            else:
                rest += count * 8
        return int(rest) + self.n_tensors * 96

    # -- structure -------------------------------------------------------

    def read(self) -> GGUFHeader:
        i = self.ensure(8, "the magic and version")
        magic = self.buf[i : i + 4]
        if magic != MAGIC:
            raise self.fail(f"not a GGUF file (starts with {magic!r}, expected {MAGIC!r})")
        le, be = struct.unpack_from("<I", self.buf, i + 4)[0], struct.unpack_from(">I", self.buf, i + 4)[0]
        if le in SUPPORTED_VERSIONS:
            order, version = "<", le
        elif be in SUPPORTED_VERSIONS:
            order, version = ">", be
        elif le == 1:
            raise self.fail("GGUF version 1 is not supported (llama.cpp reads versions 2 and 3)")
        else:
            raise self.fail(f"unsupported GGUF version {le}")
        self.pos = 8
        self.structs = {t: struct.Struct(order + f) for t, f in _SCALAR_FMT.items()}
        self.s_u32 = self.structs[T_UINT32]
        self.s_u64 = self.structs[T_UINT64]

        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the key/value count")
        # smallest possible entries: kv = key length + type + 1 byte; tensor = name length + n_dims + type + offset
        if n_kv * 13 > self.remaining():
            raise self.fail(f"header claims {n_kv:,} metadata entries; the file is too small to hold them")
        if n_tensors * 24 > self.remaining():
            raise self.fail(f"header claims {n_tensors:,} tensors; the file is too small to hold them")

        self.n_tensors = n_tensors
        metadata = self.metadata
        for k in range(n_kv):
            key = self.string(f"metadata key #{k}", limit=1 << 16)
            if not key:
                raise self.fail(f"metadata key #{k} is empty")
            t = self.u32(f"the type of {key!r}")
            if key in metadata:
                raise self.fail(f"duplicate metadata key {key!r}")
            metadata[key] = self.value(t, key, depth=0)
            self.value_types[key] = t
            if key == General.ALIGNMENT and t != T_UINT32:
                raise self.fail(f"general.alignment must be of type u32, got {TYPE_NAMES[t]}")

        alignment = metadata.get(General.ALIGNMENT, DEFAULT_ALIGNMENT)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise self.fail(f"general.alignment must be a power of two, got {alignment!r}")

        tensors = self.tensor_infos(n_tensors, alignment)
        header_bytes = self.pos
        data_offset = -(-header_bytes // alignment) * alignment
        data_bytes = 0
        for ti in tensors:
            if ti.offset != data_bytes:
                raise self.fail(
                    f"tensor {ti.name!r} has offset {ti.offset:,}, expected {data_bytes:,} "
                    "(tensors must be packed in order)"
                )
            data_bytes += -(-ti.n_bytes // alignment) * alignment
        # llama.cpp only needs each tensor's own bytes inside the file (llama_tensor_weight), not the
        # padding after the last one; a file without tensors (vocab-only) has no data section at all
        need = data_offset + tensors[-1].offset + tensors[-1].n_bytes if tensors else header_bytes
        if self.size is not None and need > self.size:
            raise GGUFError(
                f"{self.name}: file is truncated: its tensors need {need:,} bytes but the file has {self.size:,}"
                f" ({need - self.size:,} missing)",
                hint="a download cut short? download it again",
            )
        return GGUFHeader(
            source=self.name,
            version=version,
            byte_order=order,
            metadata=metadata,
            tensors=tuple(tensors),
            alignment=alignment,
            header_bytes=header_bytes,
            data_offset=data_offset,
            data_bytes=data_bytes,
            file_bytes=self.size,
            value_types=self.value_types,
        )

    def value(self, t: int, key: str, depth: int) -> Value:
        if t in _SCALAR_SIZE:
            return self.scalar(t, repr(key))
        if t == T_STRING:
            return self.string(repr(key))
        if t != T_ARRAY:
            raise self.fail(f"{key!r} has unknown value type {t}")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{key!r}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        it = self.u32(f"the array type of {key!r}")
        count = self.u64(f"the array length of {key!r}")
        if it in _SCALAR_SIZE:
            nbytes = count * _SCALAR_SIZE[it]
            if nbytes > self.remaining():
                raise self.fail(
                    f"{key!r}: array of {count:,} {TYPE_NAMES[it]} needs {nbytes:,} bytes, "
                    f"only {self.remaining():,} remain"
                )
            if count > DECODE_NUMERIC_MAX:
                self.skip(nbytes, repr(key))
                return GGUFArray(it, count)
            self.spend("decoded numbers", count, key)
            i = self.ensure(nbytes, repr(key))
            self.pos += nbytes
            fmt = self.structs[T_UINT8].format[0] + f"{count}{_SCALAR_FMT[it]}"
            return GGUFArray(it, count, struct.unpack_from(fmt, self.buf, i))
        if it == T_STRING:
            if count * 8 > self.remaining():
                raise self.fail(f"{key!r}: array of {count:,} strings does not fit in the bytes that remain")
            self.spend("strings", count, key)
            if self.decode_strings or count <= DECODE_STRING_MAX:
                return GGUFArray(it, count, tuple(self.string(f"{key!r}[{j}]") for j in range(count)))
            self.skip_strings(count, repr(key), key)
            return GGUFArray(it, count)
        if it == T_ARRAY:
            if count * 12 > self.remaining():
                raise self.fail(f"{key!r}: array of {count:,} arrays does not fit in the bytes that remain")
            self.spend("nested arrays", count, key)
            items = tuple(self.value(T_ARRAY, key, depth + 1) for _ in range(count))
            return GGUFArray(it, count, items)
        raise self.fail(f"{key!r}: array has unknown element type {it}")

    def tensor_infos(self, n_tensors: int, alignment: int) -> list[TensorInfo]:
        tensors: list[TensorInfo] = []
        names: set[str] = set()
        for k in range(n_tensors):
            name = self.string(f"tensor #{k} name", limit=1 << 16)
            if (name_bytes := len(name.encode())) >= GGML_MAX_NAME:
                raise self.fail(
                    f"tensor #{k} name {name[:80]!r} is {name_bytes} bytes; llama.cpp allows < {GGML_MAX_NAME}"
                )
            if name in names:
                raise self.fail(f"duplicate tensor name {name!r}")
            names.add(name)
            n_dims = self.u32(f"tensor {name!r} n_dims")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise self.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {GGML_MAX_DIMS} allowed)")
            shape = tuple(self.u64(f"tensor {name!r} dims") for _ in range(n_dims))
            n_elems = 1
            for d in shape:
                if d == 0 or d >= 1 << 63:
                    raise self.fail(f"tensor {name!r} has an invalid dimension {d}")
                n_elems *= d
            if n_elems >= 1 << 63:
                raise self.fail(f"tensor {name!r} has too many elements ({shape})")
            raw_type = self.u32(f"tensor {name!r} type")
            try:
                gt = GGMLType(raw_type)
            except ValueError:
                raise self.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
            blck, tsize = BLOCK[gt]
            if shape[0] % blck:
                raise self.fail(
                    f"tensor {name!r}: row length {shape[0]} is not a multiple of the {gt.type_name} block size {blck}"
                )
            offset = self.u64(f"tensor {name!r} offset")
            if offset % alignment:
                raise self.fail(f"tensor {name!r} offset {offset:,} is not a multiple of the alignment {alignment}")
            n_bytes = n_elems // blck * tsize
            tensors.append(TensorInfo(name, shape, gt, offset, n_bytes))
        return tensors
