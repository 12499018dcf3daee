"""Measure what a quantized K/V cache costs on a model: llama.cpp's own KL-divergence run.

``llama-perplexity`` (tools/perplexity/perplexity.cpp, b11312) first runs the text with an f16 cache and
``--kl-divergence-base FILE`` (it writes the reference log-probabilities), then once per cache type with
``--kl-divergence-base FILE --kl-divergence -ctk T -ctv T``, which prints the mean KL divergence, its
percentiles and "Same top p". Every run has ``-fa on``: llama.cpp refuses a quantized V cache without
flash attention (llama_init_from_model), and the reference takes the same path, so that the cache type
is the only difference. The text is cut into chunks of ``n_ctx`` tokens and the second half of each
chunk is scored (perplexity.cpp perplexity/kl_divergence: ``first = n_ctx/2``), so ``n_ctx`` is the
depth measured. The reference file holds n_vocab x 2 bytes per scored token (Gemma 3: 0.5 MiB) and is
removed with its folder on every path. llama-perplexity exits 0 after most of its own errors (a text
too short, an unreadable file), so a run counts only when its statistics are printed.
"""

from __future__ import annotations

import math
import re
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvadvise.backends.llamacpp.childproc import find_tool, run
from kvadvise.deadline import Deadline
from kvadvise.errors import BackendUnreachable, DoesNotFit, InputError
from kvadvise.model.ggml import GGMLType
from kvadvise.planner.policy import kv_name
from kvadvise.planner.quality import CacheQuality

BINARY = "llama-perplexity"
F16 = GGMLType.F16

# the lines kl_divergence prints (LOG: no prefix; a log with timestamps prefixes them, so unanchored)
_MEAN_KLD = re.compile(r"Mean\s+KLD:\s*(-?[\d.]+(?:e[-+]?\d+)?)", re.I)
_P99_KLD = re.compile(r"99\.0%\s+KLD:\s*(-?[\d.]+(?:e[-+]?\d+)?)", re.I)
_SAME_TOP = re.compile(r"Same top p:\s*([\d.]+)\s*±")
_CHUNKS = re.compile(r"computing over (\d+) chunks, n_ctx=(\d+)")
_REFERENCE_DONE = re.compile(r"Final estimate: PPL")  # perplexity(): the reference's logits are written
_TOO_SHORT = re.compile(r"you need at least (\d+) tokens.*?tokenizes to only (\d+) tokens", re.S)
# what the parser and the failure messages need of the child's output (the rest: a bounded tail)
NEEDED = re.compile(
    r"KLD|Same top p|computing over|Final estimate|you need at least|tokenizes to only|error|fail|abort", re.I
)


@dataclass(frozen=True, slots=True)
class QualityRun:
    """What to measure: the model, the text, the chunk size and the cache types."""

    model_path: str
    text_path: str
    n_ctx: int
    kvs: tuple[tuple[GGMLType, GGMLType], ...]
    n_chunks: int | None = None  # None: every chunk of the text
    n_threads: int | None = None  # None: llama.cpp's default
    n_gpu_layers: int | None = None  # None: llama.cpp's default (all that fit, -fit)


def find_binary(given: str | None, server: str | None) -> str:
    """--llama-perplexity, else beside --llama-server, else on PATH; BackendUnreachable (exit 4) when none."""
    hint = f"pass --llama-perplexity PATH, or put {BINARY} on PATH (llama.cpp builds it with llama-server)"
    if given:
        if not Path(given).is_file():
            raise BackendUnreachable(f"no {BINARY} at {given}", hint=hint)
        return given
    found = find_tool(BINARY, server)
    if found:
        return found
    raise BackendUnreachable(
        f"no {BINARY}: verify quality runs llama.cpp's own KL-divergence measurement (tools/perplexity)", hint=hint
    )


def args(q: QualityRun, base_file: str, kv: tuple[GGMLType, GGMLType] | None) -> list[str]:
    """The command line: the reference run (``kv`` None: f16, writes ``base_file``) or a cache type's."""
    # -b: one chunk per batch: llama-perplexity runs n_batch / n_ctx chunks at once (its default batch is 2048)
    # and holds the logits of the whole batch, n_batch x n_vocab x 4 bytes (Gemma 3: 2 GiB at 2048)
    words = ["-m", q.model_path, "-f", q.text_path, "-c", str(q.n_ctx), "-b", str(min(q.n_ctx, 2048)), "-fa", "on"]
    words += ["--kl-divergence-base", base_file]
    if q.n_chunks is not None:
        words += ["--chunks", str(q.n_chunks)]
    if q.n_threads is not None:
        words += ["-t", str(q.n_threads)]
    if q.n_gpu_layers is not None:
        words += ["-ngl", str(q.n_gpu_layers)]
    k, v = kv if kv is not None else (F16, F16)
    words += ["-ctk", k.type_name, "-ctv", v.type_name]
    return [*words, "--kl-divergence"] if kv is not None else words


def parse(text: str, kv: tuple[GGMLType, GGMLType], seconds: float, build: int | None) -> CacheQuality | None:
    """The figures of one ``--kl-divergence`` run, or None when it printed no statistics."""
    mean, p99, top, chunks = (r.search(text) for r in (_MEAN_KLD, _P99_KLD, _SAME_TOP, _CHUNKS))
    if not (mean and p99 and top and chunks):
        return None
    figures = [_finite(x[1]) for x in (mean, p99, top)]
    if any(f is None for f in figures):  # "." or "1.2.3" (the pattern's digits and dots), "1e999": no figure
        return None
    mean_kld, p99_kld, same_top = (f for f in figures if f is not None)
    return CacheQuality(
        type_k=kv[0],
        type_v=kv[1],
        n_ctx=int(chunks[2]),
        n_chunks=int(chunks[1]),
        mean_kld=mean_kld,
        p99_kld=p99_kld,
        same_top_pct=same_top,
        seconds=seconds,
        llama_build=build,
    )


def _finite(text: str) -> float | None:
    """A figure llama-perplexity printed (printf's %f / %g), or None for what is no finite number."""
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _failed(what: str, code: int, out: str, err: str) -> DoesNotFit | InputError:
    both = err + out
    short = _TOO_SHORT.search(both)
    if short:
        return InputError(
            f"the text is {int(short[2]):,} tokens for this model; --ctx needs twice the chunk ({int(short[1]):,})",
            hint="give a smaller --ctx, or a longer text with --text FILE",
        )
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return DoesNotFit(f"{what} was killed ({name})", hint="out of memory? try a smaller --ctx or --chunks")
    lines = [ln.strip() for ln in (err or out).strip().splitlines() if ln.strip()]
    tail = " | ".join(lines[-3:])
    return DoesNotFit(f"{what} failed (exit {code}): {tail[:400]}", hint="run it by hand with the flags shown")


def measure(
    binary: str,
    q: QualityRun,
    *,
    timeout_s: float,
    build: int | None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[CacheQuality, ...]:
    """Each cache type of ``q`` against the f16 reference, within ``timeout_s`` seconds in all."""
    deadline = Deadline(timeout_s)
    results: list[CacheQuality] = []
    with tempfile.TemporaryDirectory(prefix="kvadvise-kld-") as tmp:
        base_file = str(Path(tmp) / "f16.kld")
        steps: Sequence[tuple[GGMLType, GGMLType] | None] = (None, *q.kvs)
        for i, kv in enumerate(steps, 1):
            name = "f16 K/V reference" if kv is None else kv_name(kv)
            progress(f"[{i}/{len(steps)}] {name}: {BINARY} {' '.join(args(q, base_file, kv))}")
            started = time.monotonic()
            what = f"{BINARY} ({name})"
            try:
                code, out, err = run(
                    [binary, *args(q, base_file, kv)],
                    timeout_s=max(0.1, deadline.remaining()),
                    what=what,
                    needed=NEEDED,
                )
            except DoesNotFit:  # the one deadline of all the runs, said as the user gave it
                raise DoesNotFit(
                    f"{what} did not finish within the --timeout of {timeout_s:g} s for all the runs; it was stopped",
                    hint="raise --timeout, or measure fewer tokens (--chunks, a smaller --ctx)",
                ) from None
            seconds = time.monotonic() - started
            if kv is None:
                if code != 0 or not _REFERENCE_DONE.search(err + out) or _TOO_SHORT.search(err + out):
                    raise _failed(what, code, out, err)
                progress(f"[{i}/{len(steps)}] reference written in {seconds:.1f} s")
                continue
            got = parse(err + out, kv, seconds, build)
            if code != 0 or got is None:
                raise _failed(what, code, out, err)
            progress(f"[{i}/{len(steps)}] {name}: {got.text()} in {seconds:.1f} s")
            results.append(got)
    return tuple(results)


def report_text(results: tuple[CacheQuality, ...]) -> str:
    """One row per cache type: mean KLD, its 99th percentile, same top token, time; a mark past the threshold."""
    rows = [("cache", "mean KLD", "99% KLD", "same top", "time", "")]
    for r in results:
        mark = "<- worse than the threshold: not chosen by default" if r.too_lossy() else ""
        rows.append(
            (
                kv_name((r.type_k, r.type_v)),
                f"{r.mean_kld:.6f}",
                f"{r.p99_kld:.6f}",
                f"{r.same_top_pct:.2f} %",
                f"{r.seconds:.1f} s",
                mark,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row[:5], widths, strict=True))
        ).rstrip()
        + (f"  {row[5]}" if row[5] else "")
        for row in rows
    )


def report_dict(results: tuple[CacheQuality, ...]) -> list[dict[str, object]]:
    return [
        {
            "type_k": r.type_k.type_name,
            "type_v": r.type_v.type_name,
            "n_ctx": r.n_ctx,
            "n_chunks": r.n_chunks,
            "n_scored": r.n_scored,
            "mean_kld": r.mean_kld,
            "p99_kld": r.p99_kld,
            "same_top_pct": r.same_top_pct,
            "seconds": round(r.seconds, 2),
            "llama_build": r.llama_build,
            "too_lossy": r.too_lossy(),
        }
        for r in results
    ]


def quality_run(
    model_path: str,
    type_k: str | None,
    type_v: str | None,
    *,
    n_ctx: int,
    n_chunks: int | None,
    text_path: str | None,
    n_threads: int | None,
) -> QualityRun:
    """What ``verify quality`` measures: a local GGUF llama.cpp can load (InputError, exit 2, otherwise), the
    cache types given, else each quantized one the recommendation may pick for this model (q4_0 included)."""
    from dataclasses import replace

    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.memory import RunConfig
    from kvadvise.planner.policy import Policy, choices
    from kvadvise.profiles import KLD_TEXT, path

    if not Path(model_path).is_file():
        model_path = _ollama_blob(model_path)
    spec = GGUFFileBackend().load_spec(model_path)  # a header llama.cpp cannot load is refused here (exit 2)
    text = text_path or str(path(KLD_TEXT))
    if not Path(text).is_file():
        raise InputError(f"--text {text}: no such file", hint="give a UTF-8 text file")
    if type_k or type_v:
        kvs: tuple[tuple[GGMLType, GGMLType], ...] = ((cache_type(type_k or "f16"), cache_type(type_v or "f16")),)
    else:
        base = replace(RunConfig(), flash_attn="on")
        kvs = tuple(kv for kv, _fa, _ok in choices(spec, base, Policy(allow_q4=True)) if kv != (F16, F16))
    return QualityRun(model_path, text, n_ctx, kvs, n_chunks=n_chunks, n_threads=n_threads)


def _ollama_blob(ref: str) -> str:
    """An Ollama model of this machine's store (``qwen3:8b``): its model blob, whose name is its digest
    (backends/ollama/store.py, as Ollama's server/manifest.go reads a manifest); InputError otherwise."""
    from kvadvise.backends.ollama.name import parse_name
    from kvadvise.backends.ollama.store import find

    try:
        entry = find(parse_name(ref))
    except InputError:
        entry = None
    if entry is None:
        raise InputError(
            f"{ref}: neither a local file nor a model in this machine's Ollama store; verify quality runs "
            "llama-perplexity on a GGUF file",
            hint="give the path of the .gguf, or the name of a model `ollama pull` fetched here",
        )
    return str(entry.model_blob)
