"""Sizes as people write them: ``24GiB``, ``24000MiB``, ``23.5GiB``, ``24GB`` -> bytes.

Used by the command line (``--vram``, ``--margin``, ``--rpc HOST:PORT=SIZE``) and by the Python API, which
takes a size as the command line does.
"""

from __future__ import annotations

import re

from kvadvise.errors import InputError

_SIZE_RE = r"(?ia)^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$"  # compiled by re on first use
_UNITS: dict[str, int] = {
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    # a bare letter is binary, as in docker --memory 512m or llama.cpp's 24G cards
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
}
# the largest size taken: int64 bytes, what the JSON's readers (and llama.cpp's own int64_t sizes) hold
MAX_SIZE_BYTES = 2**63 - 1
_MAX_SIZE_DIGITS = 40  # a number longer than this is no size (8 EiB in bytes has 19 digits)
_SIZE_HINT = "write a number and a unit, e.g. 24GiB, 24000MiB, 23.5GiB or 24GB (GiB/MiB/KiB binary, GB/MB/KB decimal)"


def parse_size(text: str, *, allow_zero: bool = False) -> int:
    """A memory size given by a person -> bytes.

    - ``KiB MiB GiB TiB`` are binary (1024-based), ``KB MB GB TB`` decimal
      (1000-based), as the IEC/SI prefixes say; ``24GB`` is therefore 24e9
      bytes, a little under a 24 GiB card: the safe side.
    - a bare letter ``K M G T`` is binary (``512M`` = 512 MiB), like docker and
      most command-line tools; ``B`` is bytes.
    - units are case-insensitive; a space before the unit is allowed;
      decimals are allowed (``23.5GiB``) and rounded to the nearest byte.
    - a bare number is refused: ``--vram 24`` would be 24 bytes or 24 GB
      depending on who reads it. Write ``24GiB`` (or ``25769803776B``).
    - the size must be positive (``allow_zero``: or 0, e.g. a margin, as llama.cpp's ``-fitt 0``).

    Bad input raises InputError with a one-line message and a hint.
    """
    m = re.match(_SIZE_RE, text)
    if m is not None and len(m.group(1)) > _MAX_SIZE_DIGITS:
        # shown cut short, and never given to int(), whose digit limit (4,300) is a ValueError, not an answer
        raise InputError(f"not a size: {text.strip()[:20]!r}... ({len(text.strip()):,} characters)", hint=_SIZE_HINT)
    if m is None:
        raise InputError(f"not a size: {text!r}", hint=_SIZE_HINT)
    number, unit = m.group(1), m.group(2).lower()
    if not unit and allow_zero and float(number) == 0:
        return 0  # zero needs no unit
    if not unit:
        raise InputError(f"size {text.strip()!r} has no unit", hint=_SIZE_HINT)
    if unit not in _UNITS:
        raise InputError(f"unknown size unit {m.group(2)!r} in {text.strip()!r}", hint=_SIZE_HINT)
    if number.isdigit():  # the common case; decimal is imported only for a fraction
        n = int(number) * _UNITS[unit]
    else:
        from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

        try:
            value = Decimal(number) * _UNITS[unit]
        except InvalidOperation as err:  # pragma: no cover - the regex only lets digits through
            raise InputError(f"not a size: {text!r}", hint=_SIZE_HINT) from err
        n = int(value.to_integral_value(rounding=ROUND_HALF_UP))
    if n < 0 or (n == 0 and not allow_zero):
        raise InputError(f"size {text.strip()!r} must be more than 0 bytes", hint=_SIZE_HINT)
    if n > MAX_SIZE_BYTES:
        raise InputError(
            f"size {text.strip()!r} is more than 8 EiB ({MAX_SIZE_BYTES:,} bytes): no memory is that large",
            hint=_SIZE_HINT,
        )
    return n


# --- sizes of memory a device or a machine has: binary units only ----------------------------
_DECIMAL_UNITS = frozenset({"kb", "mb", "gb", "tb"})


def parse_memory_size(text: str, flag: str) -> int:
    """The memory a card or a machine has (``--vram``, ``--ram``, ``--rpc``'s SIZE): :func:`parse_size`, but a
    decimal unit is refused. Memory is sold in binary units (a "24 GB" card has 24 GiB, a "32 GB" kit 32
    GiB), so ``24GB`` (22.35 GiB) is rarely what was meant, and it moves the plan: Ollama's VRAM tier
    (server/routes.go: 32k from 23 GiB) flips below 23 GiB."""
    m = re.match(_SIZE_RE, text)
    if m is not None and m.group(2).lower() in _DECIMAL_UNITS:
        n = parse_size(text)
        number = m.group(1)
        binary = m.group(2)[0].upper() + "iB"
        raise InputError(
            f"{flag} {text.strip()}: {m.group(2)} is decimal ({n / (1 << 30):,.2f} GiB); memory is sold in binary "
            f"units (a 24 GB card has 24 GiB)",
            hint=f"write {flag} {number}{binary} for memory of that size, or {n / (1 << 30):.2f}GiB for {n:,} bytes",
        )
    try:
        return parse_size(text)
    except InputError as err:  # the same error, with the hint of the units this flag takes
        raise InputError(str(err), hint=_MEMORY_SIZE_HINT) from None


_MEMORY_SIZE_HINT = "write a number and a binary unit, e.g. 24GiB, 24000MiB or 23.5GiB (GiB/MiB/KiB)"

# a + as llama.cpp's -c reads one (common/arg.cpp std::stoi); compiled by re on first use
_TOKENS_RE = r"(?ia)^\s*\+?([0-9]+(?:\.[0-9]+)?)\s*([km]?)\s*$"
_TOKEN_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}  # as llama.cpp users write a context: 64k = 65,536
_TOKENS_HINT = "a whole number of tokens, or with k (1,024 tokens) or m (1,048,576): 8192, 64k, 128K, 1m"


def parse_tokens(text: str) -> int:
    """A token count given by a person -> tokens: ``65536``, ``64k``, ``128K``, ``1.5k``, ``1m``. A context
    is a power of two of 1,024 tokens so often (Ollama's 4k/32k/256k, llama.cpp's -c 64k in guides) that k
    is 1,024 here, not 1,000; the result must be a whole number of tokens."""
    if len(text) > 40:  # a number that long is no context (and Python's int() refuses 4,300 digits)
        raise InputError(f"not a token count: {text[:20]!r}... ({len(text)} characters)", hint=_TOKENS_HINT)
    m = re.match(_TOKENS_RE, text)
    if m is None:
        raise InputError(f"not a token count: {text!r}", hint=_TOKENS_HINT)
    number, unit = m.group(1), m.group(2).lower()
    if "." in number and not unit:
        raise InputError(f"not a whole number of tokens: {text.strip()!r}", hint=_TOKENS_HINT)
    whole, _, frac = number.partition(".")
    scale = _TOKEN_UNITS[unit]
    n = int(whole) * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)
    if frac and int(frac) * scale % 10 ** len(frac):
        raise InputError(f"{text.strip()!r} is not a whole number of tokens", hint=_TOKENS_HINT)
    return n


def port_number(text: str) -> int | None:
    """A port's decimal digits -> its number, as llama.cpp's ``std::stoi`` and Go's ``strconv.ParseInt(.., 10, ..)``
    read them: leading zeros are decimal (``050052`` is 50052). None for text that is not ASCII digits, or whose
    number has more than 5 digits (thousands of them never reach int(), whose digit limit raises); the caller
    says which range it takes (1-65535, or 0 too)."""
    significant = text.lstrip("0")
    if not (text.isascii() and text.isdigit()) or len(significant) > 5:
        return None
    return int(significant or "0")
