"""``kvadvise llamacpp MODEL`` and ``kvadvise verify llamacpp MODEL``: the llama.cpp backend's
own commands, registered through the plugin interface (LlamaCppBackend.register_commands)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from kvadvise.request import KV_TYPES
from kvadvise.runtime.llamaserver import LlamaServer
from kvadvise.ui import output
from kvadvise.ui.flags import (
    MMPROJ_OPTION,
    TEXT,
    FiniteFloatRange,
    Flags,
    draft_options,
    measured_run_options,
    run_options,
    take,
)
from kvadvise.ui.show import answer, writer_options, writer_paths

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.planning import Plan
    from kvadvise.runtime.verification import Measurement


@click.command("llamacpp")
@click.argument("path", metavar="MODEL")
@run_options
@MMPROJ_OPTION
@draft_options
@writer_options(LlamaServer().writers())
def llamacpp_command(path: str, force: bool, **kwargs: object) -> None:
    """The llama-server command for a GGUF model (a file, URL or Hub name): recommended, or for the --ctx you give."""
    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.backends.llamacpp.runners import model_source
    from kvadvise.entry import plan_for
    from kvadvise.plugins import runtime as plugin_runtime

    backend = GGUFFileBackend()
    paths = writer_paths(kwargs, LlamaServer().writers())
    f = take(dict(kwargs), load=backend.load_spec)
    # --runtime llama-cli / library: the plan those programs run (kvadvise.plugins.runtime, as kvadvise.plan(...,
    # runtime=NAME) makes it), without a llama-server command to print
    runtime = LlamaServer(model_source(path)) if f.runtime == "llama-server" else plugin_runtime(f.runtime)
    plan = plan_for(backend.load_spec(path), f.request, runtime)
    answer(plan, f.view, runtime, requested_ctx=f.request.n_ctx, paths=paths, force=force)


@click.command("llamacpp")
@click.argument("path", metavar="MODEL")
@measured_run_options
@click.option(
    "--llama-server",
    "server",
    metavar="PATH",
    type=TEXT,
    default=None,
    help="The llama-server binary to run (default: llama-server on PATH, else llama-cpp-python).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(min=0.1, max=86400),
    default=600,
    show_default=True,
    help="Seconds before the run is stopped.",
)
@click.option(
    "--save-calibration", is_flag=True, help="Store what was measured on this machine; later plans for it use it."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Allocate nothing: run llama.cpp's own projection of the plan (llama-fit-params -fitp on) and print "
    "its figures per device beside kvadvise's, with the difference.",
)
@click.option(
    "--llama-fit-params",
    "fit_params",
    metavar="PATH",
    type=TEXT,
    default=None,
    help="The llama-fit-params binary for --dry-run (default: beside --llama-server, else on PATH).",
)
@click.option(
    "--log",
    "log_file",
    metavar="FILE",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Launch nothing: read the log of a llama-server you run (-lv 4 or more: b11312 prints the buffer sizes at 4), compare its last load with the "
    "plan and say whether a reload placed fewer layers (a server woken from idle re-runs --fit).",
)
@click.option(
    "--attach",
    metavar="HOST[:PORT]",
    default=None,
    help="Launch nothing: ask the llama-server running there (/props) for its context and slots and compare them "
    "with the plan; without a port, 8080 then 9931 (the default moves there, llama.cpp#26508).",
)
def verify_llamacpp_command(
    path: str,
    server: str | None,
    timeout_s: float,
    save_calibration: bool,
    dry_run: bool,
    fit_params: str | None,
    log_file: str | None = None,
    attach: str | None = None,
    **kwargs: object,
) -> None:
    """Launch llama.cpp with the recommended (or given) settings on this machine and compare with the prediction.

    It measures this machine's own hardware, so it takes no --gpu or --vram. With --dry-run it allocates
    nothing: llama.cpp projects the plan (llama-fit-params) and both projections are printed side by side.
    """
    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.backends.llamacpp.runners import measure
    from kvadvise.entry import plan_for
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner import builds
    from kvadvise.planner.memory import estimate
    from kvadvise.plugins import runtime as named
    from kvadvise.render import verification_dict, verification_text
    from kvadvise.runtime import llamabuild
    from kvadvise.runtime.verification import compare

    _one_mode(dry_run=dry_run, save_calibration=save_calibration, log_file=log_file, attach=attach)
    backend = GGUFFileBackend()
    o = take(dict(kwargs), load=backend.load_spec)
    spec = backend.load_spec(path)
    if dry_run:
        _dry_run(path, spec, o, server=server, fit_params=fit_params, timeout_s=timeout_s)
        return
    # the build is the run's own (its log names it; kvadvise.runtime.llamabuild.measured_build): planned for
    # b11312 until then, then predicted again for the build that ran (--llama-build given: that one)
    runtime = named(o.runtime)
    plan = plan_for(spec, o.request, runtime, found_build=llamabuild.BuildChoice(builds.REFERENCE, "the run's log"))
    if attach is not None and log_file is None:
        _attach(attach, path, plan)
        return
    if log_file is not None:
        measured = _from_log(log_file, path, plan)
    else:
        if plan.fits is False:
            output.note("the prediction says this config does not fit; running it anyway")
        measured = measure(path, plan.config, server=server, timeout_s=timeout_s, progress=output.note)
    ran = llamabuild.measured_build(measured.llama_cpp_build)
    if o.request.llama_build == "auto" and ran is not None and ran != plan.config.llama_build:
        cfg = replace(plan.config, llama_build=ran)
        plan = replace(plan, config=cfg, estimate=estimate(spec, cfg))
    if not measured.extra_bufts and plan.config.cpu_repack != "off":  # it ran as --no-repack does: compared so
        cfg = replace(plan.config, cpu_repack="off")
        why = (
            "llama.cpp crashed with the CPU's extra buffer types (AMX, CPU_REPACK; on a CPU with AMX, "
            "ggml-org/llama.cpp#20824): measured and predicted without them, as llama-server --no-repack runs"
        )
        plan = replace(plan, config=cfg, estimate=estimate(spec, cfg), notes=(*plan.notes, why))
    result = compare(plan, measured)
    if o.view.as_json:
        output.result_json(verification_dict(result))
    else:
        output.result(verification_text(result))
    if save_calibration:
        from kvadvise.runtime import calibration

        # the device that ran it: this machine's GPU when llama.cpp used one, else the CPU
        gpus = plan.hardware.gpus if plan.hardware is not None else ()
        device = gpus[0].name if gpus and measured.backend.upper() != "CPU" else "CPU"
        saved = calibration.save(calibration.from_verification(result, device))
        output.note(f"calibration for {device} saved to {saved}")
    if not result.fits:
        raise click.exceptions.Exit(EXIT_NO_FIT)


def _one_mode(*, dry_run: bool, save_calibration: bool, log_file: str | None, attach: str | None) -> None:
    """--dry-run and --attach compare without measuring; --log compares a log's measurements, which
    --save-calibration may store. Beside --dry-run or --attach the other options were dropped without a word
    (exit 0, nothing saved, the log or the server never read): refused, exit 2."""
    from kvadvise.errors import InputError

    others = [
        name
        for name, on in (
            ("--log", log_file is not None),
            ("--attach", attach is not None),
            ("--save-calibration", save_calibration),
        )
        if on
    ]
    for mode, on in (("--dry-run", dry_run), ("--attach", attach is not None)):
        clash = [o for o in others if o != mode]
        if on and clash:
            raise InputError(
                f"{mode} and {clash[0]} do not go together: {mode} measures nothing",
                hint="give one of --dry-run, --log, --attach; --save-calibration stores what a launch or --log measured",
            )


def _attach(address: str, path: str, plan: Plan) -> None:
    """``verify llamacpp --attach``: the running server's context and slots against the plan; exit 3 when
    they differ, 4 when no server answers (a backend unreachable, as `verify ollama` with no Ollama server)."""
    from kvadvise.errors import EXIT_NO_FIT, BackendUnreachable
    from kvadvise.runtime.serverport import DEFAULT_PORTS, attach_checks, find_server, parse_address

    host, port = parse_address(address)
    server = find_server(host, port)
    if server is None:
        where = f"{host}:{port}" if port is not None else " or ".join(f"{host}:{p}" for p in DEFAULT_PORTS)
        raise BackendUnreachable(
            f"--attach: no llama-server answered /props on {where}",
            hint="start llama-server, or give the HOST:PORT it listens on",
        )
    missing = [
        what
        for what, value in (("default_generation_settings.n_ctx", server.n_ctx), ("total_slots", server.n_slots))
        if value is None
    ]
    if missing:  # nothing to compare is no agreement (tools/server/server-context.cpp's /props has both)
        raise BackendUnreachable(
            f"--attach: the server at {server.url} answered /props without a usable {' or '.join(missing)}",
            hint="is it a llama-server? its /props gives its context per slot and its slots",
        )
    lay = plan.estimate.layout
    differs = attach_checks(server, lay.n_ctx_seq, lay.n_seq_max, path)
    sleeping = (
        "; it is sleeping: its next request loads the model again, and with --fit it may place fewer layers "
        "(llama.cpp#24684) unless -c and -ngl are given"
        if server.is_sleeping
        else ""
    )
    verdict = "differs from the plan: " + "; ".join(differs) if differs else "runs the plan's context and slots"
    output.result(f"llama-server at {server.url} ({server.build or 'build unknown'}) {verdict}{sleeping}")
    if differs:
        raise click.exceptions.Exit(EXIT_NO_FIT)


MAX_LOG_BYTES = 256 << 20  # a load's lines are a few hundred KB even at -lv 4; days of requests are not needed


def _read_log(log_file: str) -> str:
    """The log, read to its end and at most MAX_LOG_BYTES: a regular file, or a pipe (`--log <(journalctl ...)`)
    read until its writer closes it (a FIFO no one writes to is empty). `--log /dev/zero` read until the machine
    ran out of memory (killed); a device or a socket is refused as a GGUF path is, unread."""
    import stat

    from kvadvise.errors import InputError
    from kvadvise.files import open_regular

    try:
        fd = os.open(log_file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"--log {log_file}: {e.strerror or e}") from None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        try:
            fd = open_regular(log_file)
        except InputError as e:
            raise InputError(f"--log {e.message}", hint=e.hint) from None
    os.set_blocking(fd, True)
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except OSError as e:
        raise InputError(f"--log {log_file}: {e.strerror or e}") from None
    if len(data) > MAX_LOG_BYTES:
        raise InputError(
            f"--log {log_file}: more than {MAX_LOG_BYTES >> 20} MiB; not read",
            hint=f"give the part from the last load: tail -c 64M {shlex.quote(log_file)} > last.log",
        )
    return data.decode("utf-8", errors="replace")


# a load that did not complete: tools/server/server.cpp "exiting due to model loading error", src/llama-context.cpp
# "failed to initialize the context" (compute pp buffers, the KV cache), llama.cpp's "failed to load model"
_LOAD_FAILED = re.compile(
    r"exiting due to model loading error|failed to (?:initialize the context|create_?context|load model)"
)
_LOADED = re.compile(r"load_model: loading model '(?P<path>[^']*)'")


def _from_log(log_file: str, path: str, plan: Plan) -> Measurement:
    """A running llama-server's log: the buffers of its last load (after the last "load_model: loading model",
    which a wake from idle prints again), the placements of every load. A load that failed, or of another model
    or another context than the plan's, is no verification of it: exit 3 (as --attach), naming why."""
    from kvadvise.errors import DoesNotFit, InputError
    from kvadvise.runtime.llamalog import last_load, parse
    from kvadvise.runtime.verification import build_from_log, measurement_from_log

    text = _read_log(log_file)
    lines = text.splitlines()
    last = last_load(lines)
    failed = next((line.strip() for line in reversed(last) if _LOAD_FAILED.search(line)), None)
    if failed is not None:
        raise DoesNotFit(f"--log: that load failed: {failed}", hint="try a smaller context or a quantized cache")
    log = parse(last)
    if not log.buffers:
        raise InputError(
            f"--log {log_file}: no buffer sizes in it", hint="start llama-server with -lv 4 (or more) and keep its log"
        )
    everything = parse(lines)
    n_ctx = log.cparams.get("n_ctx")
    loaded = next((m["path"] for line in last if (m := _LOADED.search(line))), None)
    differs = []
    if loaded is not None and os.path.basename(loaded) != os.path.basename(path):
        differs.append(f"it loaded {loaded}, not {path}")
    planned = plan.estimate.layout.n_ctx
    if n_ctx and n_ctx.isdigit() and len(n_ctx) < 12 and int(n_ctx) != planned:
        differs.append(f"its context is {int(n_ctx):,} (llama_context n_ctx), the plan's {planned:,}")
    if differs:
        raise DoesNotFit(
            "--log: that llama-server differs from the plan: " + "; ".join(differs),
            hint="verify the model and -c it runs (--ctx is the total over its slots)",
        )
    return replace(
        measurement_from_log(
            log,
            runner="llama-server (its log)",
            build=build_from_log(text, "llama-server (build unknown)"),
            n_ctx=int(n_ctx) if n_ctx and n_ctx.isdigit() and len(n_ctx) < 12 else None,
            device_used_bytes=None,
            prompt_tokens_per_s=None,
            decode_tokens_per_s=None,
        ),
        placements=everything.placements,
    )


def _dry_run(
    path: str, spec: ModelSpec, o: Flags, *, server: str | None, fit_params: str | None, timeout_s: float
) -> None:
    """``verify llamacpp --dry-run``: the plan, llama.cpp's own projection of it, the two side by side; exit 3
    when a figure differs (compute beyond 16 MiB or 3 %, context or model beyond the MiB llama.cpp prints)."""
    from kvadvise.backends.llamacpp.dryrun import BINARY, find_binary, fit_params_args, project
    from kvadvise.entry import plan_for
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner.memory import estimate
    from kvadvise.plugins import runtime as named
    from kvadvise.runtime import dryrun, llamabuild

    binary = find_binary(fit_params, server)
    # llama-fit-params --version names its build
    plan = plan_for(spec, o.request, named(o.runtime), found_build=llamabuild.detect(binary))
    # llama-fit-params reserves the logits of the whole batch (no --n-outputs-max) and projects neither the
    # projector nor a draft model (nor an MTP context), nor takes -kvu (dryrun.REFUSED): a cache per slot, its
    # default; kvadvise's figures beside it are for the same
    cfg = replace(plan.config, n_outputs_max=0, mmproj=None, draft=None, mtp=False, kv_unified=False)
    est = estimate(spec, cfg)
    projected = project(binary, path, cfg, timeout_s=timeout_s)
    rows = dryrun.compare(spec, est, projected)
    note = dryrun.model_note(spec, est)
    if plan.config.kv_unified and plan.config.n_parallel > 1:
        unified = (
            "-kvu: llama-fit-params does not take it (common/arg.cpp registers it for llama-server only), so both "
            "sides are for a cache per slot; the plan's unified cache holds the same K/V in one stream"
        )
        note = f"{note}\n{unified}" if note else unified
    agree = all(r.ok for r in rows)
    command = shlex.join([BINARY, *fit_params_args(path, cfg)])  # as every printed command: a shell runs it
    if o.view.as_json:
        output.result_json(
            {
                "dry_run": {
                    "binary": binary,
                    "command": command,
                    "llama_build": cfg.llama_build,
                    "agree": agree,
                    "devices": [
                        {
                            "name": r.name,
                            "kvadvise_mib": {
                                "model": r.ours_model,
                                "context": r.ours_context,
                                "compute": r.ours_compute,
                            },
                            "llama_cpp_mib": {
                                "model": r.theirs.model_mib,
                                "context": r.theirs.context_mib,
                                "compute": r.theirs.compute_mib,
                            },
                            "compute_diff_mib": round(r.ours_compute - r.theirs.compute_mib, 2),
                            "in_table": r.theirs.in_table,
                            "ok": r.ok,
                            "differences": r.differences,
                        }
                        for r in rows
                    ],
                    "note": note,
                }
            }
        )
    else:
        output.result(f"llama.cpp's own projection (no allocation): {command}")
        output.result(dryrun.table_text(rows))
        if note:
            output.result(note)
        verdict = "agree" if agree else "differ (marked)"
        output.result(
            f"kvadvise and llama.cpp {verdict}: compute within {dryrun.COMPUTE_ABS_MIB:g} MiB or "
            f"{dryrun.COMPUTE_REL:.0%}, model and context to the MiB llama.cpp prints (both for the logits of "
            "the whole batch, what llama-fit-params reserves)"
        )
    if not agree:
        raise click.exceptions.Exit(EXIT_NO_FIT)


@click.command("quality")
@click.argument("path", metavar="MODEL")
@click.option(
    "--cache-type-k",
    "-ctk",
    "type_k",
    type=click.Choice(KV_TYPES),
    default=None,
    help="The K cache type to measure [default: each quantized type the recommendation may pick].",
)
@click.option(
    "--cache-type-v",
    "-ctv",
    "type_v",
    type=click.Choice(KV_TYPES),
    default=None,
    help="The V cache type to measure (a quantized V runs with flash attention on, as llama.cpp requires).",
)
@click.option(
    "--ctx",
    "-c",
    "n_ctx",
    type=click.IntRange(min=16, max=1 << 20),
    default=1024,
    show_default=True,
    help="Tokens per chunk: the second half of each chunk is scored, so this is the depth measured.",
)
@click.option(
    "--chunks",
    "n_chunks",
    type=click.IntRange(min=1, max=100_000),
    default=None,
    help="Chunks to score [default: all the text holds].",
)
@click.option(
    "--text",
    "text_path",
    metavar="FILE",
    type=TEXT,
    default=None,
    help="The text to measure on [default: a shipped public-domain text, about 4,000 tokens].",
)
@click.option("--threads", "-t", "n_threads", type=click.IntRange(min=1, max=4096), default=None, help="CPU threads.")
@click.option(
    "--llama-perplexity",
    "binary",
    metavar="PATH",
    type=TEXT,
    default=None,
    help="The llama-perplexity binary (default: beside --llama-server, else on PATH).",
)
@click.option(
    "--llama-server",
    "server",
    metavar="PATH",
    type=TEXT,
    default=None,
    help="A llama-server build: its llama-perplexity is the one beside it.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(min=0.1, max=86400),
    default=3600,
    show_default=True,
    help="Seconds for all the runs together; then they are stopped.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def verify_quality_command(
    path: str,
    type_k: str | None,
    type_v: str | None,
    n_ctx: int,
    n_chunks: int | None,
    text_path: str | None,
    n_threads: int | None,
    binary: str | None,
    server: str | None,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Measure what a quantized K/V cache costs on MODEL (a GGUF file, or a model of this machine's Ollama store):
    llama.cpp's KL divergence against an
    f16 cache (llama-perplexity), per cache type. Later plans for this model use the figures (docs/quality.md)."""
    from kvadvise.backends.llamacpp import perplexity
    from kvadvise.planner.quality import THRESHOLD_SOURCE
    from kvadvise.runtime import llamabuild, qualitycache

    q = perplexity.quality_run(
        path, type_k, type_v, n_ctx=n_ctx, n_chunks=n_chunks, text_path=text_path, n_threads=n_threads
    )
    exe = perplexity.find_binary(binary, server)
    build = llamabuild.detect(exe).build
    output.note(f"measuring {len(q.kvs)} cache type(s) against f16 on {q.text_path} ({n_ctx} tokens per chunk)")
    results = perplexity.measure(exe, q, timeout_s=timeout_s, build=build, progress=output.note)
    if not as_json:  # the figures first: they are shown even when the store cannot be written
        output.result(perplexity.report_text(results))
        r = results[0]
        output.result(
            f"against an f16 cache, flash attention on, {r.n_chunks} chunks of {r.n_ctx} tokens ({r.n_scored:,} "
            f"tokens scored, at depths {r.n_ctx // 2:,} to {r.n_ctx - 1:,}); threshold: {THRESHOLD_SOURCE}"
        )
    saved = qualitycache.save(
        q.model_path, qualitycache.model_key(q.model_path), results, qualitycache.model_key(q.text_path)
    )
    if as_json:
        output.result_json(
            {
                "quality": {
                    "model": q.model_path,
                    "binary": exe,
                    "llama_build": build,
                    "text": q.text_path,
                    "results": perplexity.report_dict(results),
                    "threshold": THRESHOLD_SOURCE,
                    "saved": str(saved),
                }
            }
        )
    else:
        output.result(f"saved to {saved}: later plans for this model use these figures")
