"""Split GGUF models (``NAME-00001-of-00003.gguf``): names and merged headers.

llama.cpp's ``gguf-split`` (tools/gguf-split/gguf-split.cpp, ``split_strategy``)
and ``llama-quantize`` write the first part with every metadata key and each
part with three more: ``split.no`` (u16, 0-based), ``split.count`` (u16) and
``split.tensors.count`` (i32, tensors over all parts). Part names follow
``llama_split_path`` (src/llama.cpp): ``"%s-%05d-of-%05d.gguf"`` with a
1-based number. ``llama_model_loader`` (src/llama-model-loader.cpp) must be
given the first part, finds the others by that name, checks each part's
``split.no`` and the total tensor count, and maps every part on its own:
the weights buffer of each part spans its first to its last tensor
(``get_mapping_range``), so the weights are the sum of the parts' spans.

A merged header keeps the first part's metadata and every part's tensors,
laid end to end: part k's tensor offsets follow part k-1's last tensor, so
"last end - first offset" over all tensors is the sum of the parts' spans.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvadvise.errors import GGUFError, InputError
from kvadvise.model.gguf import GGUFHeader, TensorInfo
from kvadvise.model.keys import Split

KEY_NO = Split.NO
KEY_COUNT = Split.COUNT
KEY_TENSORS = Split.TENSORS_COUNT
MAX_PARTS = 9999  # five digits in the name; more would not be a llama.cpp split

_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SplitName:
    """A part's file name taken apart: ``prefix-{number:05d}-of-{count:05d}.gguf``."""

    prefix: str  # everything before "-00001-of-00003.gguf" (a path or URL prefix)
    number: int  # 1-based, as in the name
    count: int

    def part(self, number: int) -> str:
        """The name of part ``number`` (1-based), as llama_split_path writes it."""
        return f"{self.prefix}-{number:05d}-of-{self.count:05d}.gguf"

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.part(i) for i in range(1, self.count + 1))


def parse_name(name: str) -> SplitName | None:
    """The split name of ``name`` (a path, URL or repo file), or None when it is not one."""
    m = _NAME.match(name)
    if not m:
        return None
    number, count = int(m["no"]), int(m["count"])
    if not 1 <= number <= count <= MAX_PARTS:
        return None
    return SplitName(m["prefix"], number, count)


def _int_key(h: GGUFHeader, key: str) -> int | None:
    v = h.metadata.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise GGUFError(f"{h.source}: {key} should be an integer, got {type(v).__name__}")
    return v


def split_count(header: GGUFHeader) -> int:
    """``split.count`` of a header: 0 or 1 when the model is in one file."""
    n = _int_key(header, KEY_COUNT)
    return n if n is not None and n > 0 else 0


def check_first(header: GGUFHeader) -> int:
    """The number of parts of a model whose header is ``header``; refuses a part other than the first."""
    n = split_count(header)
    if n <= 1:
        return 1
    no = _int_key(header, KEY_NO) or 0
    if no != 0:
        raise InputError(
            f"{header.source}: this is part {no + 1} of {n} of a split model; llama.cpp loads the first part",
            hint=f"give the file (or URL) ending in -00001-of-{n:05d}.gguf",
        )
    if n > MAX_PARTS:
        raise GGUFError(f"{header.source}: split.count {n} is over {MAX_PARTS}")
    return n


def merge(parts: Sequence[GGUFHeader]) -> GGUFHeader:
    """One header for a split model: the first part's metadata, all parts' tensors.

    Checks what llama_model_loader checks: the part numbers, the count, no
    tensor in two parts, and the total tensor count.
    """
    if not parts:
        raise InputError("a split model needs at least one part")
    first = parts[0]
    n = check_first(first)
    if len(parts) != n:
        raise InputError(f"{first.source}: split.count is {n}, {len(parts)} parts given")
    if n == 1:
        return first
    for i, h in enumerate(parts):
        no = _int_key(h, KEY_NO)
        if no is None:
            raise GGUFError(f"{h.source}: {KEY_NO} is missing: not a part of a split model")
        if no != i:
            raise GGUFError(f"{h.source}: {KEY_NO} is {no}, expected {i} (part {i + 1} of {n})")
        count = _int_key(h, KEY_COUNT)
        if count != n:
            raise GGUFError(f"{h.source}: {KEY_COUNT} is {count}, the first part says {n}")
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    base = 0
    for h in parts:
        for t in h.tensors:
            if t.name in names:
                raise GGUFError(f"{h.source}: tensor {t.name!r} is also in another part")
            names.add(t.name)
        if h.tensors:
            start = h.tensors[0].offset
            tensors.extend(replace(t, offset=base + t.offset - start) for t in h.tensors)
            base += h.tensors[-1].offset + h.tensors[-1].n_bytes - start
    expected = _int_key(first, KEY_TENSORS)
    if expected is not None and expected != len(tensors):
        raise GGUFError(
            f"{first.source}: {KEY_TENSORS} is {expected} but the {n} parts hold {len(tensors)} tensors",
            hint="a part is missing or from another download; download the parts again",
        )
    sizes = [h.file_bytes for h in parts]
    return replace(
        first,
        tensors=tuple(tensors),
        header_bytes=sum(h.header_bytes for h in parts),
        data_bytes=sum(h.data_bytes for h in parts),
        file_bytes=None if any(s is None for s in sizes) else sum(s or 0 for s in sizes),
        extra={**first.extra, "split_parts": tuple(h.source for h in parts)},
    )
