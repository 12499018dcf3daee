"""Fuzzing the GGUF header reader (benchmarks/fuzz_gguf.py) in the suite, and the crashes it found.

- A deterministic run of 600 mutated headers (Gemma 3 270M and tiny models)
  in a fresh process: 0 exceptions other than GGUFError, none over 10 s (a
  hang guard, not a speed goal: the suite may share the machine), RSS under
  200 MB. The full 10,000-case run is `python benchmarks/fuzz_gguf.py`.
- Regression tests, inputs inline: the reader (fixed in advisor/gguf.py), and
  the crashes `--pipeline` found in advisor/architecture.py (fixed in _Keys).
"""

from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from go_modelfile import parse_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvadvise.cli import main
from kvadvise.errors import GGUFError
from kvadvise.model.gguf import MAX_NESTED_ARRAYS, MAX_STRINGS, GGUFArray, read_file, read_header

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fuzz_gguf.py"


def _load_fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_gguf", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_gguf"] = mod
    spec.loader.exec_module(mod)
    return mod


fuzz = _load_fuzz()


# ---------------------------------------------------------------- the run


def test_fuzz_600_cases_in_a_fresh_process(gemma_path: Path, tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--cases",
            "600",
            "--seed",
            "1",
            "--gemma-share",
            "0.2",
            "--gemma",
            str(gemma_path),
            "--max-seconds",
            "10",
            "--max-rss-mb",
            "200",
            "--save-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^cases\s+600$", p.stdout, re.M), p.stdout
    assert re.search(r"^failures\s+0$", p.stdout, re.M), p.stdout
    assert "refused" in p.stdout and "ok" in p.stdout  # both outcomes were reached
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def seeds(gemma_path: Path) -> list[Any]:
    return list(fuzz.default_seeds(gemma_path, recipes=("llama", "qwen3next")))


def test_cases_are_reproducible_one_by_one(seeds: list[Any]) -> None:
    for i in (0, 17, 599):
        a, b = fuzz.make_case(seeds, 5, i, 0.5), fuzz.make_case(seeds, 5, i, 0.5)
        assert (a.data, a.size, a.steps) == (b.data, b.size, b.steps)
    assert fuzz.make_case(seeds, 5, 1, 0.5).data != fuzz.make_case(seeds, 6, 1, 0.5).data


def test_the_walker_agrees_with_the_reader(seeds: list[Any]) -> None:
    """The mutations aim at fields found by the script's own walk: it must see the structure the reader sees."""
    for s in seeds:
        h = read_header(fuzz.MemSource(s.name, s.header, s.file_size))
        assert s.layout.header_end == h.header_bytes
        assert len(s.layout.kvs) == len(h.metadata) and len(s.layout.tensors) == len(h.tensors)


def test_a_failure_is_reported_saved_and_exits_1(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(src: object) -> object:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(fuzz, "read_header", broken)
    assert fuzz.main(["--cases", "3", "--gemma", str(gemma_path), "--save-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^failures\s+3$", out, re.M) and "ZeroDivisionError: boom" in out
    assert len(list(tmp_path.glob("case-*.gguf"))) == 3 and len(list(tmp_path.glob("case-*.json"))) == 3


# ---------------------------------------------------------------- regressions: the reader


def _kv(key: str, t: int, raw: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + raw


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _header(*kvs: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


ARCH = _kv("general.architecture", 8, _str("llama"))
FILE_SIZE = 253_113_024  # the Gemma 3 270M file: its data section reads as zeros here


def _array_over_the_data(item_type: int, count: int) -> bytes:
    """Found by the fuzzer (cases 114, 375 of seed 0 on the Gemma header): the last key/value is an array
    whose items run into the data section, where zeros parse as empty arrays / empty strings."""
    return _header(ARCH, _kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", item_type, count)))


@pytest.mark.parametrize(
    ("item_type", "count", "message"),
    [
        (9, (1 << 23) + 1, f"more than {MAX_NESTED_ARRAYS:,} nested arrays"),  # took 20+ s and GBs before
        (9, FILE_SIZE // 12 - 100, f"more than {MAX_NESTED_ARRAYS:,} nested arrays"),  # 565 s, 1.3 GB before
        (8, FILE_SIZE // 8 - 100, f"more than {MAX_STRINGS:,} strings"),  # 4 s before
    ],
)
def test_arrays_claiming_the_data_section_are_refused_fast(item_type: int, count: int, message: str) -> None:
    raw = _array_over_the_data(item_type, count)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(GGUFError, match=message):
            read_header(fuzz.MemSource("fuzz.gguf", raw, FILE_SIZE))
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 40 << 20, (elapsed, peak)  # one 16 MiB read of the (sparse) data


def test_array_over_the_data_section_of_a_real_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same through `kvadvise gguf` on a sparse 253 MB file: exit 2, one line, at once."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_array_over_the_data(9, (1 << 23) + 1))
    with open(path, "r+b") as f:
        f.truncate(FILE_SIZE)
    t0 = time.perf_counter()
    assert main(["gguf", str(path), "--no-hardware", "--ctx", "512"]) == 2
    assert time.perf_counter() - t0 < 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvadvise: error: {path}: ") and len(err.strip().splitlines()) == 1, err


def test_nested_array_cap_is_exact(tmp_path: Path) -> None:
    """MAX_NESTED_ARRAYS empty arrays inside arrays are read; one more is refused."""
    for n, ok in ((MAX_NESTED_ARRAYS, True), (MAX_NESTED_ARRAYS + 1, False)):
        items = struct.pack("<IQ", 0, 0) * n
        path = tmp_path / f"nested-{n}.gguf"
        path.write_bytes(_header(ARCH, _kv("k", 9, struct.pack("<IQ", 9, n) + items)))
        if ok:
            v = read_file(path).metadata["k"]
            assert isinstance(v, GGUFArray) and v.count == n
        else:
            with pytest.raises(GGUFError, match="nested arrays"):
                read_file(path)


# ---------------------------------------------------------------- regressions: header -> spec

LLAMA = (
    ARCH,
    _kv("llama.block_count", 4, struct.pack("<I", 2)),
    _kv("llama.context_length", 4, struct.pack("<I", 64)),
    _kv("llama.embedding_length", 4, struct.pack("<I", 64)),
    _kv("llama.attention.head_count", 4, struct.pack("<I", 2)),
)
NESTED = struct.pack("<IQ", 9, 2) + (struct.pack("<IQ", 4, 1) + struct.pack("<I", 3)) * 2
STRINGS = struct.pack("<IQ", 8, 2) + _str("a") + _str("b")


def _replace(key: str, t: int, raw: bytes) -> bytes:
    return _header(*(kv for kv in LLAMA if f"{key}".encode() not in kv), _kv(key, t, raw))


@pytest.mark.parametrize(
    "raw",
    [
        _replace("llama.block_count", 9, NESTED),  # fuzz case 2441 (mamba2.feed_forward_length)
        _replace("llama.attention.head_count_kv", 9, NESTED),  # fuzz case 414 (mamba2.ssm.conv_kernel)
        _replace("llama.attention.head_count_kv", 9, STRINGS),
        _replace("llama.block_count", 6, struct.pack("<f", float("nan"))),
    ],
    ids=["nested-scalar", "nested-per-layer", "strings-per-layer", "nan-count"],
)
def test_header_values_of_the_wrong_kind_are_input_errors(
    raw: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "odd.gguf"
    path.write_bytes(raw)
    read_file(path)  # the reader accepts it: these are well-formed GGUF values
    assert main(["gguf", str(path), "--no-hardware", "--ctx", "512"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvadvise: error: ") and "internal error" not in err


# ---------------------------------------------------------------- Modelfile parameters (issue 28, class 1)

# Characters that end a value, close a quote, start a comment or an instruction, and the code points
# whose printability differs between Unicode versions (Go 1.21-1.26: 15.0; Python 3.10: 13.0, 3.11: 14.0,
# 3.13: 15.1), drawn more often than chance would; any other code point too.
_MODELFILE_SPECIAL = [*'"#\n\r \t', "\u2ffc", "\u2ffb", "\U0001f6dc", "\u31ef", "\U0002ebf0", "\u0cf3"]
_MODELFILE_SPECIAL += ["\u2028", "\x85", "\ufeff", "\xa0", "\xad", "\ud800", '"""', "FROM x", "SYSTEM y"]


@pytest.fixture(scope="module")
def go_isprint() -> Any:
    """The oracle: Go's unicode.IsPrint from Unicode 15.0.0's categories (a CPython 3.12's unicodedata, in
    its own process), else the shipped table (which test_injection_stores_and_writes.py compares with it where it can)."""
    from test_injection_stores_and_writes import PY15

    from kvadvise.backends.ollama.goprint import is_print

    if PY15 is None:
        return is_print
    bits = subprocess.run(
        [
            PY15,
            "-c",
            "import unicodedata as u\n"
            "print(''.join('1' if r == 32 or u.category(chr(r))[0] in 'LMNPS' else '0' for r in range(0x110000)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    assert len(bits) == 0x110000
    return lambda ch: bits[ord(ch)] == "1"


_VALUE = st.lists(st.sampled_from(_MODELFILE_SPECIAL) | st.characters(), max_size=12).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stops=st.lists(_VALUE, min_size=1, max_size=4), temperature=_VALUE)
def test_modelfile_parameters_read_back_under_go_isprint(stops: list[str], temperature: str, go_isprint: Any) -> None:
    """Whatever a model's parameters hold, the Modelfile read as Ollama reads it (tests/go_modelfile.py,
    with Go's IsPrint) has one FROM and one num_ctx,
    and every value Ollama would read back as itself, and only those, each as itself: nothing dropped,
    nothing added, no second instruction. Each value is made only of what Go's parser keeps (IsPrint, or a
    tab, space or line break inside the value)."""
    from types import SimpleNamespace

    from kvadvise.backends.ollama.modelfile import modelfile_text, quote
    from kvadvise.backends.ollama.rules import OllamaSettings

    def reads_back(name: str, value: str) -> bool:
        try:
            return parse_file(f"FROM x\nPARAMETER {name} {quote(value)}\n", go_isprint)[1:] == [(name, value)]
        except ValueError:
            return False

    model = SimpleNamespace(ref="m:latest", params={"stop": stops, "temperature": temperature})
    text = modelfile_text(model, OllamaSettings(4096, 1, "f16", True))  # type: ignore[arg-type]
    cmds = parse_file(text, go_isprint)
    assert cmds[:2] == [("model", "m:latest"), ("num_ctx", "4096")]
    expected = [("stop", s) for s in stops if reads_back("stop", s)]
    expected += [("temperature", temperature)] if reads_back("temperature", temperature) else []
    assert cmds[2:] == expected
    for _, value in cmds[2:]:
        assert all(ch in "\t\n\r " or go_isprint(ch) for ch in value), ascii(value)


# ---------------------------------------------------------------- every command's options (issue 28, class 7)

_ODD = ["", " ", "nan", "inf", "-inf", "-1", "0", "1e999", "9" * 30, "\x00", "a\nb", "$\\foo$", "x" * 3000]
_ODD += ["~no-such-user-kvadvise/x.svg", "/proc/x.svg", "-", ",", "1e-45,1", "\udcff", "a\u2028b", "0x10", "1_000"]
_COMMANDS = {  # the command, and arguments that plan (or answer) when the fuzzed option is left alone
    "gguf": ["gguf", "{gemma}", "--gpu", "rtx-4090"],
    "hf": ["hf", str(ROOT / "tests" / "data" / "hf" / "glm4-9b.json"), "--gpu", "rtx-4060"],
    "llamacpp": ["llamacpp", "{gemma}", "--gpu", "rtx-4090"],
    "ollama": ["ollama", "qwen3:8b", "--gpu", "rtx-4090"],
    "compare": ["compare", "qwen3:8b", "gemma3:4b", "--vram", "24GiB"],
    "gpus": ["gpus", "--no-hardware"],
    "verify-ollama": ["verify", "ollama", "qwen3:8b"],
    "verify-quality": ["verify", "quality", "{gemma}"],  # no llama-perplexity on PATH: checked, then exit 4
    "calibration": ["calibration", "show"],
}


def _valued_options(path: list[str]) -> list[str]:
    import click

    from kvadvise.cli import cli

    cmd: click.Command = cli
    for part in path:
        assert isinstance(cmd, click.Group)
        found = cmd.get_command(click.Context(cmd), part)
        assert found is not None
        cmd = found
    return [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not p.is_flag and p.name != "help"]


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_no_option_value_ends_in_an_internal_error(
    command: str, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Odd strings, empty strings, huge numbers, NaN, NUL bytes, line breaks and lone surrogates in any option
    of any command: exit 0, 2, 3 or 4 with one-line messages, never 1 (an internal error) or a traceback; an
    empty value is refused (exit 2), not taken as no value (`--gpu ''` planned this machine)."""
    import contextlib
    import io

    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)  # a --write-env VALUE is written here
    base = [a.replace("{gemma}", str(gemma_path)) for a in _COMMANDS[command]]
    path = base[:2] if base[0] in ("verify", "calibration") else base[:1]
    options = _valued_options(path)
    assert options or command in ("gpus", "calibration")
    if not options:
        return

    @settings(max_examples=30, deadline=None, derandomize=True)
    @given(option=st.sampled_from(options), value=st.sampled_from(_ODD) | st.text(max_size=40))
    def one(option: str, value: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([*base, option, value])
        shown = err.getvalue()
        assert rc in (0, 2, 3, 4) and "internal error" not in shown and "Traceback" not in shown, (option, value, shown)
        if not value.strip():
            assert rc == 2 and len(shown.splitlines()) <= 2, (option, shown)

    one()
    for option in options:  # every option at least once with the empty value
        one.hypothesis.inner_test(option, "")  # type: ignore[attr-defined]
