"""``kvadvise llamacpp MODEL`` and ``kvadvise verify llamacpp MODEL``: the llama.cpp backend's
own commands, registered through the plugin interface (LlamaCppBackend.register_commands)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import click

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

    backend = GGUFFileBackend()
    paths = writer_paths(kwargs, LlamaServer().writers())
    f = take(dict(kwargs), load=backend.load_spec)
    runtime = LlamaServer(model_source(path), program=f.runtime)
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
    default=None,
    help="The llama-fit-params binary for --dry-run (default: beside --llama-server, else on PATH).",
)
def verify_llamacpp_command(
    path: str,
    server: str | None,
    timeout_s: float,
    save_calibration: bool,
    dry_run: bool,
    fit_params: str | None,
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
    if plan.fits is False:
        output.note("the prediction says this config does not fit; running it anyway")
    measured = measure(path, plan.config, server=server, timeout_s=timeout_s, progress=output.note)
    ran = llamabuild.measured_build(measured.llama_cpp_build)
    if o.request.llama_build == "auto" and ran is not None and ran != plan.config.llama_build:
        cfg = replace(plan.config, llama_build=ran)
        plan = replace(plan, config=cfg, estimate=estimate(spec, cfg))
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
    # projector nor a draft model: kvadvise's figures beside it are for the same
    cfg = replace(plan.config, n_outputs_max=0, mmproj=None, draft=None)
    est = estimate(spec, cfg)
    projected = project(binary, path, cfg, timeout_s=timeout_s)
    rows = dryrun.compare(spec, est, projected)
    note = dryrun.model_note(spec, est)
    agree = all(r.ok for r in rows)
    command = " ".join([BINARY, *fit_params_args(path, cfg)])
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
