"""``kvadvise llamacpp MODEL`` and ``kvadvise verify llamacpp MODEL``: the llama.cpp backend's
own commands, registered through the plugin interface (LlamaCppBackend.register_commands)."""

from __future__ import annotations

from dataclasses import replace

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
from kvadvise.planner.planning import Plan
from kvadvise.runtime.llamaserver import ModelSource


def _commands(model: ModelSource, plan: Plan) -> list[tuple[str, str]]:
    from kvadvise.runtime.llamaserver import command_text

    # --n-cpu-moe N as given: the command keeps it (kvadvise.planner.offload.cpu_moe_placement planned it)
    ncmoe = plan.cpu_moe.n_cpu_moe if plan.cpu_moe is not None else 0
    out = [("command", command_text(model, plan.config, n_cpu_moe=ncmoe))]
    off = plan.offload
    if off is not None:
        cfg = replace(plan.config, n_ctx=off.n_ctx * plan.config.n_parallel, type_k=off.type_k, type_v=off.type_v)
        out.append(
            ("offload_command", command_text(model, cfg, n_gpu_layers=off.n_gpu_layers, n_cpu_moe=off.n_cpu_moe))
        )
    return out


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
    from kvadvise.runtime.llamaserver import env_text, server_env

    o = PlanOptions.take(dict(kwargs))
    model = model_source(path)
    backend = GGUFFileBackend()
    draft = backend.load_spec(o.model_draft) if o.model_draft else None
    plan = build_plan(backend.load_spec(path), o, draft=draft)

    def as_json(p: Plan) -> dict[str, object]:
        cmds = dict(_commands(model, p))
        env = server_env(model, p.config, n_cpu_moe=p.cpu_moe.n_cpu_moe if p.cpu_moe else 0)
        return {
            "llama_server": {"command": cmds["command"], "env": env, "offload_command": cmds.get("offload_command")}
        }

    def as_text(p: Plan) -> str:
        lines = [""]
        for ep in p.config.rpc_servers:  # llama.cpp's RPC backend: one rpc-server per host (tools/rpc)
            lines.append(f"# on {ep.rpartition(':')[0]}: rpc-server -H 0.0.0.0 -p {ep.rpartition(':')[2]}")
        for kind, text in _commands(model, p):
            if kind == "offload_command":
                lines.append("# with part of the model on the CPU (--allow-cpu):")
            lines.append(text)
        return "\n".join(lines)

    chart = show_plan(plan, o, requested_ctx=o.n_ctx, extra_json=as_json, extra_text=as_text, write_chart=False)
    files = [chart] if chart is not None else []
    if write_env is not None:
        refuse_to_write_what_does_not_fit(plan, write_env, chart=chart)
        files.append(
            text_file(
                "--write-env",
                write_env,
                env_text(model, plan.config, n_cpu_moe=plan.cpu_moe.n_cpu_moe if plan.cpu_moe else 0),
            )
        )
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
def verify_llamacpp_command(
    path: str, server: str | None, timeout_s: float, save_calibration: bool, **kwargs: object
) -> None:
    """Launch llama.cpp with the recommended (or given) settings on this machine and compare with the prediction.

    It measures this machine's own hardware, so it takes no --gpu or --vram.
    """
    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.backends.llamacpp.runners import measure
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.render import verification_dict, verification_text
    from kvadvise.runtime.verification import compare

    o = PlanOptions.take(dict(kwargs))
    plan = build_plan(GGUFFileBackend().load_spec(path), o)
    if plan.fits is False:
        output.note("the prediction says this config does not fit; running it anyway")
    measured = measure(path, plan.config, server=server, timeout_s=timeout_s, progress=output.note)
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
