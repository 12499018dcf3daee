"""The kvadvise command line. Commands only parse, call and render;
``main()`` is the only place that turns errors into messages and exit codes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from advisor.errors import EXIT_BUG, EXIT_INPUT, EXIT_NO_FIT, KvadviseError

F = TypeVar("F", bound=Callable[..., Any])
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def run_options(f: F) -> F:
    """llama.cpp's own flag names for the run configuration."""
    opts = [
        click.option(
            "--ctx",
            "-c",
            "n_ctx",
            type=click.IntRange(min=0),
            default=None,
            help="Context in tokens, total over all sequences (llama.cpp -c); 0 = n_ctx_train. "
            "Without it, kvadvise recommends one.",
        ),
        click.option(
            "--cache-type-k",
            "-ctk",
            "type_k",
            type=click.Choice(KV_TYPES),
            default=None,
            help="K cache type [default: f16, or recommended when --ctx is not given].",
        ),
        click.option(
            "--cache-type-v",
            "-ctv",
            "type_v",
            type=click.Choice(KV_TYPES),
            default=None,
            help="V cache type; quantized V needs flash attention [default: f16, or recommended].",
        ),
        click.option(
            "--flash-attn",
            "-fa",
            "flash_attn",
            type=click.Choice(["on", "off", "auto"]),
            default="auto",
            show_default=True,
            help="Flash attention.",
        ),
        click.option(
            "--parallel",
            "-np",
            "n_parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Parallel sequences (slots).",
        ),
        click.option("--kv-unified", "-kvu", is_flag=True, help="One KV buffer shared by all sequences."),
        click.option(
            "--batch",
            "-b",
            "n_batch",
            type=click.IntRange(min=1),
            default=2048,
            show_default=True,
            help="Logical batch size.",
        ),
        click.option(
            "--ubatch",
            "-ub",
            "n_ubatch",
            type=click.IntRange(min=1),
            default=512,
            show_default=True,
            help="Physical batch size.",
        ),
        click.option("--swa-full", is_flag=True, help="Full-size cache for sliding-window layers."),
        click.option(
            "--device",
            type=click.Choice(["auto", "cpu", "cuda"]),
            default="auto",
            show_default=True,
            help="Where the layers go: auto = the GPU when there is one (or --gpu/--vram), else the CPU.",
        ),
        click.option(
            "--gpu",
            "gpu",
            metavar="NAME",
            help="Plan for a card from profiles/gpus.json (e.g. 4090, 'A100 80GB').",
            default=None,
        ),
        click.option(
            "--vram",
            "vram",
            metavar="SIZE",
            help="Plan for a memory budget given by hand: 24GiB, 24GB, 24000MiB.",
            default=None,
        ),
        click.option(
            "--margin",
            metavar="SIZE",
            default="1024MiB",
            show_default=True,
            help="Memory kept free per GPU (llama.cpp --fit keeps 1024 MiB).",
        ),
        click.option(
            "--target-ctx",
            type=click.IntRange(min=0),
            default=0,
            help="Context per sequence to aim for (default: the model's maximum).",
        ),
        click.option(
            "--use",
            "use",
            type=click.Choice(["chat", "code", "agent", "long"]),
            default=None,
            help="Aim for a use case: chat 8k, code 32k, agent 64k, long = the model's maximum.",
        ),
        click.option(
            "--min-ctx",
            type=click.IntRange(min=0),
            default=0,
            help="Fail (exit 3) if less than this fits per sequence.",
        ),
        click.option(
            "--repeatable", is_flag=True, help="f16 cache only: quantized caches do not reproduce tokens exactly."
        ),
        click.option("--no-hardware", is_flag=True, help="Do not look at this machine's GPUs: estimate only."),
        click.option("--chart", is_flag=True, help="Draw memory against context for each cache type, with the budget."),
        click.option(
            "--allow-cpu",
            is_flag=True,
            help="Also say how many layers or experts must stay on the CPU to reach the target.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in README.md)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _plan_and_print(
    spec: Any,
    opts: dict[str, Any],
    *,
    same_type_kv: bool = False,
    quiet_exit: bool = False,
    extra_json: Callable[[Any], dict[str, Any]] | None = None,
) -> Any:
    from advisor.render import plan_dict, plan_text

    plan = _make_plan(spec, opts, same_type_kv=same_type_kv)
    requested = opts["n_ctx"]
    if opts["as_json"]:
        doc = plan_dict(plan, requested) | (extra_json(plan) if extra_json else {})
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(plan_text(plan, requested))
        _chart(spec, plan, opts)
    if plan.fits is False and not quiet_exit:
        raise click.exceptions.Exit(EXIT_NO_FIT)  # the output says why; the exit code says "does not fit"
    return plan


def _chart(spec: Any, plan: Any, opts: dict[str, Any]) -> None:
    if not opts["chart"]:
        return
    if plan.recommendation is None or plan.budget is None:
        click.echo(
            "kvadvise: no chart: it needs a budget (not --no-hardware) and a recommendation (no --ctx)", err=True
        )
        return
    from advisor.recommender import curves
    from advisor.render import chart_text

    lines = curves(spec, replace(plan.config, n_ctx=0), plan.budget, plan.recommendation.options)
    click.echo("")
    click.echo(chart_text(lines, plan.budget.budget_bytes))


def _make_plan(spec: Any, opts: dict[str, Any], *, same_type_kv: bool = False, extra_margin_bytes: int = 0) -> Any:
    from advisor.ggml import cache_type
    from advisor.hardware import parse_size
    from advisor.memory import RunConfig
    from advisor.planning import HardwareRequest, hardware_for, make_plan
    from advisor.recommender import Policy, load_use_cases

    o = dict(opts)
    o.pop("as_json")
    o.pop("chart")
    n_ctx = o.pop("n_ctx")
    use = o.pop("use")
    target = o.pop("target_ctx") or (load_use_cases()[use] if use else 0)
    tk, tv = o.pop("type_k"), o.pop("type_v")
    fixed = (cache_type(tk or "f16"), cache_type(tv or "f16")) if (tk or tv) else None
    policy = Policy(
        fixed_kv=fixed,
        target_ctx=target,
        min_ctx=o.pop("min_ctx"),
        repeatable=o.pop("repeatable"),
        allow_cpu=o.pop("allow_cpu"),
        same_type_kv=same_type_kv,
        use=use,
    )
    hw_req = HardwareRequest(
        gpu=o.pop("gpu"),
        vram_bytes=parse_size(v) if (v := o.pop("vram")) else None,
        probe=not o.pop("no_hardware"),
    )
    margin = parse_size(o.pop("margin")) + extra_margin_bytes
    kv = fixed or (cache_type("f16"), cache_type("f16"))
    base = RunConfig(n_ctx=n_ctx or 0, type_k=kv[0], type_v=kv[1], **o)
    return make_plan(
        spec, base, recommend_ctx=n_ctx is None, hw=hardware_for(hw_req), policy=policy, margin_bytes=margin
    )


def _backend(name: str) -> Any:
    from advisor.plugins import discover

    return discover().get(name)


class PluginGroup(click.Group):
    """Built-in commands, plus `kvadvise <backend> REF` for every installed plugin backend without one.

    Plugins are looked up only when a name is not a built-in command (or for
    --help), so they never slow down or break the built-in commands.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        from advisor.plugins import discover

        return sorted(set(super().list_commands(ctx)) | set(discover().targets))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        from advisor.plugins import discover

        if name not in discover().targets:
            return None
        return _plugin_command(name)


def _plugin_command(name: str) -> click.Command:
    @click.command(name=name, help=f"Memory for a model from the {name!r} backend (a plugin).")
    @click.argument("ref")
    @run_options
    def command(ref: str, **opts: Any) -> None:
        _plan_and_print(_backend(name).load_spec(ref), opts)

    return command


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvadvise")
@click.option("--debug", is_flag=True, envvar="KVADVISE_DEBUG", help="Show tracebacks (also KVADVISE_DEBUG=1).")
def cli(debug: bool) -> None:
    """Memory advisor for llama.cpp and Ollama: KV cache, weights and buffers, exactly as llama.cpp allocates them."""


@cli.command()
@click.argument("path", metavar="MODEL")
@run_options
def gguf(path: str, **opts: Any) -> None:
    """Memory for a GGUF model: a file, an https:// URL, hf://USER/REPO/FILE.gguf or USER/REPO:QUANT (header only)."""
    _plan_and_print(_backend("gguf").load_spec(path), opts)


@cli.command()
@click.argument("config")
@click.option(
    "--weights-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Size of the weights you will load [default: from the safetensors index, or --quant].",
)
@click.option(
    "--quant",
    metavar="QUANT",
    default=None,
    help="Weights as a GGUF of this llama.cpp quant (e.g. Q4_K_M): bits per weight × parameters.",
)
@run_options
def hf(config: str, weights_bytes: int | None, quant: str | None, **opts: Any) -> None:
    """Memory for a Hugging Face model: a config.json file or folder, or a repo id."""
    from advisor.spec import with_weights

    if quant is not None and weights_bytes is not None:
        raise click.UsageError("give --quant or --weights-bytes, not both")
    spec = _backend("hf").load_spec(config, quant=quant, find_weights=weights_bytes is None)
    if weights_bytes is not None:
        spec = with_weights(spec, weights_bytes, source="--weights-bytes")
    _plan_and_print(spec, opts)


@cli.command()
@click.argument("path", metavar="MODEL")
@run_options
@click.option(
    "--write-env",
    "write_env",
    metavar="PATH",
    default=None,
    help="Also write the settings as LLAMA_ARG_* variables (an env file llama-server reads).",
)
@click.option("--force", is_flag=True, help="Overwrite the --write-env file if it exists.")
def llamacpp(path: str, write_env: str | None, force: bool, **opts: Any) -> None:
    """The llama-server command for a GGUF model (a file, URL or Hub name): recommended, or for the --ctx you give."""
    from advisor.files import write_text_file
    from advisor.llamaserver import command_text, env_text, server_env

    backend = _backend("llamacpp")
    model = backend.model_source(path)

    def commands(plan: Any) -> list[tuple[str, str]]:
        out = [("command", command_text(model, plan.config))]
        off = plan.recommendation.offload if plan.recommendation is not None else None
        if off is not None:
            cfg = replace(plan.config, n_ctx=off.n_ctx * plan.config.n_parallel, type_k=off.type_k, type_v=off.type_v)
            out.append(
                ("offload_command", command_text(model, cfg, n_gpu_layers=off.n_gpu_layers, n_cpu_moe=off.n_cpu_moe))
            )
        return out

    def as_json(plan: Any) -> dict[str, Any]:
        cmds = dict(commands(plan))
        env = server_env(model, plan.config)
        return {
            "llama_server": {"command": cmds["command"], "env": env, "offload_command": cmds.get("offload_command")}
        }

    plan = _plan_and_print(backend.load_spec(path), opts, quiet_exit=True, extra_json=as_json)
    if not opts["as_json"]:
        click.echo("")
        for kind, text in commands(plan):
            if kind == "offload_command":
                click.echo("# with part of the model on the CPU (--allow-cpu):")
            click.echo(text)
    if write_env:
        _refuse_to_write_what_does_not_fit(plan, write_env)
        written = write_text_file(write_env, env_text(model, plan.config), force=force)
        click.echo(
            f"wrote {written}: load it with `set -a; . {written}; set +a` before starting llama-server", err=True
        )
    if plan.fits is False:
        raise click.exceptions.Exit(EXIT_NO_FIT)


def _refuse_to_write_what_does_not_fit(plan: Any, *paths: str | None) -> None:
    """Never write a config that does not fit (the policy): say so, exit 3, leave the files as they are."""
    if plan.fits is False and any(paths):
        names = ", ".join(p for p in paths if p)
        click.echo(f"kvadvise: not written ({names}): this config does not fit (see above)", err=True)
        raise click.exceptions.Exit(EXIT_NO_FIT)


def _host_option(f: F) -> F:
    return click.option(
        "--host", default=None, metavar="URL", help="The Ollama server (default: $OLLAMA_HOST, else 127.0.0.1:11434)."
    )(f)


@cli.command()
@click.argument("name")
@run_options
@_host_option
@click.option("--write-modelfile", metavar="PATH", default=None, help="Write a Modelfile (FROM NAME:TAG + num_ctx).")
@click.option("--write-env", metavar="PATH", default=None, help="Write OLLAMA_* server settings as an env file.")
@click.option("--write-systemd", metavar="PATH", default=None, help="Write a systemd drop-in for ollama.service.")
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def ollama(
    name: str,
    host: str | None,
    write_modelfile: str | None,
    write_env: str | None,
    write_systemd: str | None,
    force: bool,
    **opts: Any,
) -> None:
    """Advice for an Ollama model (NAME[:TAG]): found in the model store, on the server, or in the built-in profiles.

    For Ollama, --ctx is num_ctx: the context of each slot (Ollama runs llama-server with -c num_ctx × slots).
    """
    from advisor.render import plan_dict, plan_text

    tk, tv = opts["type_k"], opts["type_v"]
    if tk and tv and tk != tv:
        raise click.UsageError(
            "Ollama takes one OLLAMA_KV_CACHE_TYPE for K and V: give one type (-ctk or -ctv), or the same for both"
        )
    opts = {**opts, "type_k": tk or tv, "type_v": tk or tv}
    backend = _backend("ollama")
    model = backend.resolve(name, host=host)
    if opts["n_ctx"]:
        opts = {**opts, "n_ctx": opts["n_ctx"] * opts["n_parallel"]}
    plan = _make_plan(model.spec, opts, same_type_kv=True, extra_margin_bytes=backend.projector_margin_bytes(model))
    advice = backend.advise(model, plan, backend.running_models(host))
    if opts["as_json"]:
        click.echo(json.dumps(plan_dict(plan) | {"ollama": backend.advice_dict(advice)}, indent=2))
    else:
        click.echo(plan_text(plan))
        _chart(model.spec, plan, opts)
        click.echo(backend.advice_text(advice))
    _refuse_to_write_what_does_not_fit(plan, write_modelfile, write_env, write_systemd)
    written = backend.write_config(advice, modelfile=write_modelfile, env=write_env, systemd=write_systemd, force=force)
    for w in written:
        click.echo(f"kvadvise: wrote {w.path}; apply it with:", err=True)
        for h in w.hints:
            click.echo(f"  {h}", err=True)
    if plan.fits is False:
        raise click.exceptions.Exit(EXIT_NO_FIT)


for _param in ollama.params:
    if _param.name == "n_ctx" and isinstance(_param, click.Option):
        _param.help = "num_ctx: the context of each slot (Ollama runs -c num_ctx × slots). Without it, recommended."


@cli.group()
def verify() -> None:
    """Prove a config on the real runtime: did it fit, what did it take, how fast was it."""


@verify.command("llamacpp")
@click.argument("path")
@run_options
@click.option(
    "--llama-server",
    "server",
    metavar="PATH",
    default=None,
    help="The llama-server binary to run (default: llama-server on PATH, else llama-cpp-python).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=600,
    show_default=True,
    help="Seconds before the run is stopped.",
)
@click.option("--save-calibration", is_flag=True, help="Store what was measured; later plans for this device use it.")
def verify_llamacpp(path: str, server: str | None, timeout_s: float, save_calibration: bool, **opts: Any) -> None:
    """Launch llama.cpp with the recommended (or given) settings and compare with the prediction."""
    from advisor.render import verification_dict, verification_text
    from advisor.verification import compare

    backend = _backend("llamacpp")
    as_json = opts["as_json"]
    plan = _make_plan(backend.load_spec(path), opts)
    if plan.fits is False:
        click.echo("kvadvise: the prediction says this config does not fit; running it anyway", err=True)
    measured = backend.measure(
        path,
        plan.config,
        server=server,
        timeout_s=timeout_s,
        progress=lambda msg: click.echo(f"kvadvise: {msg}", err=True),
    )
    result = compare(plan, measured)
    click.echo(json.dumps(verification_dict(result), indent=2) if as_json else verification_text(result))
    if save_calibration:
        from advisor import calibration

        device = plan.hardware.gpus[0].name if plan.hardware is not None and plan.hardware.gpus else "CPU"
        saved = calibration.save(calibration.from_verification(result, device))
        click.echo(f"kvadvise: calibration for {device} saved to {saved}", err=True)
    if not result.fits:
        raise click.exceptions.Exit(EXIT_NO_FIT)


@verify.command("ollama")
@click.argument("name")
@_host_option
@click.option("--load", is_flag=True, help="Load the model first (POST /api/generate with --num-ctx, if given).")
@click.option(
    "--num-ctx",
    type=click.IntRange(min=1),
    default=None,
    help="The context per slot to load and expect [default: the model's num_ctx parameter].",
)
@click.option(
    "--kv-cache-type",
    type=click.Choice(["f16", "q8_0", "q4_0"]),
    default="f16",
    show_default=True,
    help="The server's OLLAMA_KV_CACHE_TYPE, for the predicted size.",
)
@click.option(
    "--num-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The server's OLLAMA_NUM_PARALLEL, for the predicted size.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify_ollama(
    name: str, host: str | None, load: bool, num_ctx: int | None, kv_cache_type: str, num_parallel: int, as_json: bool
) -> None:
    """After `ollama run`: read /api/ps; size_vram must equal size (100% GPU) and the context must be as asked."""
    from dataclasses import asdict

    from advisor.ggml import cache_type
    from advisor.memory import RunConfig, estimate

    backend = _backend("ollama")
    model = backend.resolve(name, host=host)
    ctx = num_ctx or model.default_num_ctx
    predicted = None
    if ctx:  # as Ollama runs it: -c num_ctx x slots, one cache type for K and V, flash attention on
        kv = cache_type(kv_cache_type)
        cfg = RunConfig(
            n_ctx=ctx * num_parallel, n_parallel=num_parallel, type_k=kv, type_v=kv, flash_attn="on", device="cuda"
        )
        predicted = estimate(model.spec, cfg).total_bytes
    v = backend.verify_running(name, host=host, load=load, num_ctx=ctx, predicted_total_bytes=predicted)
    if as_json:
        click.echo(json.dumps(asdict(v), indent=2))
    else:
        click.echo(
            f"{v.name}: {v.processor or 'not loaded'}"
            + (f", {v.size / 1e9:.1f} GB, context {v.context_length}" if v.loaded else "")
        )
        if v.predicted_total_bytes is not None and v.difference_bytes is not None:
            click.echo(
                f"  predicted {v.predicted_total_bytes / 1e9:.2f} GB; reported - predicted = {v.difference_bytes / 1e6:+,.0f} MB"
            )
        for r in v.reasons:
            click.echo(f"  - {r}")
        click.echo("fits: 100% GPU" if v.fits else "does not fit as asked")
    if not v.fits:
        raise click.exceptions.Exit(EXIT_NO_FIT)


@cli.group("calibration")
def calibration_group() -> None:
    """What `verify --save-calibration` stored for this machine."""


@calibration_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibration_show(as_json: bool) -> None:
    """List the stored calibrations."""
    from dataclasses import asdict

    from advisor import calibration

    entries = calibration.load()
    if as_json:
        click.echo(json.dumps({"path": str(calibration.path()), "entries": [asdict(e) for e in entries]}, indent=2))
        return
    if not entries:
        click.echo(f"no calibration stored ({calibration.path()})")
    for e in entries:
        overhead = f"{e.overhead_bytes / (1 << 20):,.0f} MiB" if e.overhead_bytes is not None else "n/a (CPU)"
        click.echo(
            f"{e.device}: overhead {overhead}, compute x{e.compute_ratio:.3f} ({e.llama_cpp_build}, {e.model}, "
            f"{e.config}, {e.measured_at})"
        )


@calibration_group.command("clear")
def calibration_clear() -> None:
    """Forget every stored calibration."""
    from advisor import calibration

    click.echo(f"removed {calibration.clear()} calibration entries")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins(as_json: bool) -> None:
    """List the installed backends, and any that failed to load."""
    from advisor.plugins import capabilities, discover

    backends, broken = discover().load_all()
    if as_json:
        doc = {
            "backends": [
                {"name": n, "summary": b.summary, "capabilities": list(capabilities(b))}
                for n, b in sorted(backends.items())
            ],
            "broken": [{"name": b.name, "target": b.target, "error": b.error} for b in broken],
        }
        click.echo(json.dumps(doc, indent=2))
        return
    from advisor.plugins import capabilities

    for name, b in sorted(backends.items()):
        click.echo(f"{name:<10} {b.summary}  [{', '.join(capabilities(b))}]")
    for br in broken:
        click.echo(f"{br.name:<10} BROKEN ({br.target}): {br.error}")


def _debug(argv: list[str] | None) -> bool:
    return "--debug" in (sys.argv[1:] if argv is None else argv) or os.environ.get("KVADVISE_DEBUG", "") not in (
        "",
        "0",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error becomes one line on stderr and a documented exit code."""
    try:
        rc = cli.main(args=argv, prog_name="kvadvise", standalone_mode=False)
    except KvadviseError as e:
        if _debug(argv):
            raise
        click.echo(f"kvadvise: error: {e.message}", err=True)
        if e.hint:
            click.echo(f"kvadvise: hint: {e.hint}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("kvadvise: aborted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"kvadvise: error: {e.format_message()}", err=True)
        return EXIT_INPUT
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except BrokenPipeError:
        return 0
    except Exception as e:
        if _debug(argv):
            raise
        click.echo(
            f"kvadvise: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True
        )
        return EXIT_BUG
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
