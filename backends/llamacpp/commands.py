"""``kvadvise llamacpp MODEL`` and ``kvadvise verify llamacpp MODEL``: the llama.cpp backend's
own commands, registered through the plugin interface (LlamaCppBackend.register_commands)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from kvadvise.cli import output
from kvadvise.cli.options import (
    MMPROJ_OPTION,
    TEXT,
    FiniteFloatRange,
    PlanOptions,
    draft_options,
    measured_run_options,
    run_options,
)
from kvadvise.cli.plan import build_plan, exit_if_no_fit, refuse_to_write_what_does_not_fit, show_plan
from kvadvise.planner.memory import RunConfig
from kvadvise.planner.planning import Plan
from kvadvise.runtime.llamaserver import ModelSource

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hostram import HostRam
    from kvadvise.planner.offload import Offload


# --- the settings of the plan that runs (issue 27): 100 % GPU, or its partial offload, and the RAM's flags ---


def _ram_args(ram: HostRam | None) -> list[tuple[str, str, str | None]]:
    """--cache-ram / --ctx-checkpoints where the RAM needs less than llama.cpp's defaults (common/arg.cpp
    -cram, LLAMA_ARG_CACHE_RAM; -ctxcp, LLAMA_ARG_CTX_CHECKPOINTS)."""
    out: list[tuple[str, str, str | None]] = []
    if ram is not None and ram.ctx_checkpoints is not None:
        out.append(("--ctx-checkpoints", "LLAMA_ARG_CTX_CHECKPOINTS", str(ram.ctx_checkpoints)))
    if ram is not None and ram.cache_ram_mib is not None:
        out.append(("--cache-ram", "LLAMA_ARG_CACHE_RAM", str(ram.cache_ram_mib)))
    return out


def _offload_config(plan: Plan, off: Offload) -> RunConfig:
    return replace(plan.config, n_ctx=off.n_ctx * plan.config.n_parallel, type_k=off.type_k, type_v=off.type_v)


def _args(model: ModelSource, plan: Plan, off: Offload | None) -> list[tuple[str, str, str | None]]:
    """llama-server's (flag, variable, value) for the plan's config, or for its partial offload ``off``."""
    from kvadvise.runtime.llamaserver import server_args

    if off is None:
        # --n-cpu-moe N as given: the command keeps it (kvadvise.planner.offload.cpu_moe_placement planned it)
        ncmoe = plan.cpu_moe.n_cpu_moe if plan.cpu_moe is not None else 0
        return server_args(model, plan.config, n_cpu_moe=ncmoe) + _ram_args(plan.ram)
    args = server_args(model, _offload_config(plan, off), n_gpu_layers=off.n_gpu_layers, n_cpu_moe=off.n_cpu_moe)
    return args + _ram_args(off.ram)


def _text(args: list[tuple[str, str, str | None]]) -> str:
    words = ["llama-server"]
    for flag, _, value in args:
        words += [flag] if value is None else [flag, value]
    return shlex.join(words)


def _to_run(plan: Plan) -> Offload | None:
    """The partial offload to run when the plan does not fit the GPU alone (None: the plan's own config)."""
    off = plan.offload
    return off if plan.fits is False and off is not None and off.runnable else None


def _commands(model: ModelSource, plan: Plan) -> list[tuple[str, str]]:
    out = [("command", _text(_args(model, plan, None)))]
    if plan.offload is not None:
        out.append(("offload_command", _text(_args(model, plan, plan.offload))))
    return out


def _env_text(model: ModelSource, plan: Plan) -> str:
    """The plan that runs as LLAMA_ARG_* variables (kvadvise.runtime.llamaserver.env_text's format)."""
    args = _args(model, plan, _to_run(plan))
    lines = [
        "# llama-server settings written by kvadvise; llama.cpp reads LLAMA_ARG_* for flags not on its command line"
    ]
    lines += [f"{var}={shlex.quote(value if value is not None else 'true')}" for _, var, value in args]
    return "\n".join(lines) + "\n"


@click.command("llamacpp")
@click.argument("path", metavar="MODEL")
@run_options
@MMPROJ_OPTION
@draft_options
@click.option(
    "--write-env",
    "write_env",
    metavar="PATH",
    default=None,
    help="Also write the settings as LLAMA_ARG_* variables (an env file llama-server reads).",
)
@click.option("--force", is_flag=True, help="Overwrite the --write-env file if it exists.")
def llamacpp_command(path: str, write_env: str | None, force: bool, **kwargs: object) -> None:
    """The llama-server command for a GGUF model (a file, URL or Hub name): recommended, or for the --ctx you give."""
    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.backends.llamacpp.runners import model_source
    from kvadvise.files import text_file, write_files

    o = PlanOptions.take(dict(kwargs))
    model = model_source(path)
    backend = GGUFFileBackend()
    draft = backend.load_spec(o.model_draft) if o.model_draft else None
    plan = build_plan(backend.load_spec(path), o, draft=draft)

    def as_json(p: Plan) -> dict[str, object]:
        cmds = dict(_commands(model, p))
        run = _args(model, p, _to_run(p))
        env = {var: value if value is not None else "true" for _, var, value in run}
        return {
            "llama_server": {
                "command": cmds["command"],
                "env": env,
                "offload_command": cmds.get("offload_command"),
                # what to run: the command, or the offload's when the GPU alone does not fit; null when nothing runs
                "run_command": _text(run) if p.runnable is not False else None,
            }
        }

    def as_text(p: Plan) -> str:
        lines = [""]
        for ep in p.config.rpc_servers:  # llama.cpp's RPC backend: one rpc-server per host (tools/rpc)
            lines.append(f"# on {ep.rpartition(':')[0]}: rpc-server -H 0.0.0.0 -p {ep.rpartition(':')[2]}")
        if _to_run(p) is not None:  # the plan that runs: part on the CPU
            lines.append("# 100% on the GPU does not fit; the plan that runs keeps part of the model on the CPU:")
            lines.append(_text(_args(model, p, _to_run(p))))
            return "\n".join(lines)
        for kind, text in _commands(model, p):
            if kind == "offload_command":
                lines.append(
                    "# at the target with part of the model on the CPU (--allow-cpu):"
                    if p.fits
                    else "# with part of the model on the CPU (does not fit the RAM either):"
                )
            lines.append(text)
        return "\n".join(lines)

    def command(p: Plan) -> str | None:  # the summary's last line: the command of the plan that runs
        return _text(_args(model, p, _to_run(p))) if p.runnable is not False else None

    chart = show_plan(
        plan,
        o,
        requested_ctx=o.n_ctx,
        extra_json=as_json,
        extra_text=as_text,
        command=command,
        write_chart=False,
    )
    files = [chart] if chart is not None else []
    if write_env is not None:
        refuse_to_write_what_does_not_fit(plan, write_env, chart=chart)
        files.append(text_file("--write-env", write_env, _env_text(model, plan)))
    for f, written in zip(files, write_files(files, force=force), strict=True):  # all or none
        if f.option != "--write-env":
            output.note(f"wrote {written}")
            continue
        # `. ./file`: a bare `. file` searches PATH in dash, zsh and bash --posix
        shown = written if written.is_absolute() else f"./{written}"
        output.note(f"wrote {written}: load it with `set -a; . {shown}; set +a` before starting llama-server")
    exit_if_no_fit(plan)


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
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner import builds
    from kvadvise.planner.memory import estimate
    from kvadvise.render import verification_dict, verification_text
    from kvadvise.runtime import llamabuild
    from kvadvise.runtime.verification import compare

    o = PlanOptions.take(dict(kwargs))
    spec = GGUFFileBackend().load_spec(path)
    if dry_run:
        _dry_run(path, spec, o, server=server, fit_params=fit_params, timeout_s=timeout_s)
        return
    # the build is the run's own (its log names it; kvadvise.runtime.llamabuild.measured_build): planned for
    # b11312 until then, then predicted again for the build that ran (--llama-build given: that one)
    plan = build_plan(spec, o, llama_build=llamabuild.BuildChoice(builds.REFERENCE, "the run's log"))
    if plan.fits is False:
        output.note("the prediction says this config does not fit; running it anyway")
    measured = measure(path, plan.config, server=server, timeout_s=timeout_s, progress=output.note)
    ran = llamabuild.measured_build(measured.llama_cpp_build)
    if o.llama_build == "auto" and ran is not None and ran != plan.config.llama_build:
        cfg = replace(plan.config, llama_build=ran)
        plan = replace(plan, config=cfg, estimate=estimate(spec, cfg))
    result = compare(plan, measured)
    if o.as_json:
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
    path: str, spec: ModelSpec, o: PlanOptions, *, server: str | None, fit_params: str | None, timeout_s: float
) -> None:
    """``verify llamacpp --dry-run``: the plan, llama.cpp's own projection of it, the two side by side; exit 3
    when a figure differs (compute beyond 16 MiB or 3 %, context or model beyond the MiB llama.cpp prints)."""
    from kvadvise.backends.llamacpp.dryrun import BINARY, find_binary, fit_params_args, project
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner.memory import estimate
    from kvadvise.runtime import dryrun, llamabuild

    binary = find_binary(fit_params, server)
    plan = build_plan(spec, o, llama_build=llamabuild.detect(binary))  # llama-fit-params --version names it
    # llama-fit-params reserves the logits of the whole batch (no --n-outputs-max) and projects neither the
    # projector nor a draft model: kvadvise's figures beside it are for the same
    cfg = replace(plan.config, n_outputs_max=0, mmproj=None, draft=None)
    est = estimate(spec, cfg)
    projected = project(binary, path, cfg, timeout_s=timeout_s)
    rows = dryrun.compare(est, projected)
    agree = all(r.ok for r in rows)
    command = " ".join([BINARY, *fit_params_args(path, cfg)])
    if o.as_json:
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
                            "ok": r.ok,
                        }
                        for r in rows
                    ],
                }
            }
        )
    else:
        output.result(f"llama.cpp's own projection (no allocation): {command}")
        output.result(dryrun.table_text(rows))
        verdict = "agree" if agree else "differ (marked)"
        output.result(
            f"kvadvise and llama.cpp {verdict}: compute within {dryrun.COMPUTE_ABS_MIB:g} MiB or "
            f"{dryrun.COMPUTE_REL:.0%}, model and context to the MiB llama.cpp prints (both for the logits of "
            "the whole batch, what llama-fit-params reserves)"
        )
    if not agree:
        raise click.exceptions.Exit(EXIT_NO_FIT)
