"""``kvadvise ollama NAME`` and ``kvadvise verify ollama NAME``: the Ollama backend's own
commands, registered through the plugin interface (OllamaBackend.register_commands)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import rules
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.cli import output
from kvadvise.cli.options import LIST_SORTS, TEXT, PlanOptions, run_options
from kvadvise.cli.plan import build_plan, exit_if_no_fit, refuse_to_write_what_does_not_fit, show_chart
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.hardware import Hardware
from kvadvise.planner.memory import RunConfig
from kvadvise.planner.planning import Plan

F = TypeVar("F", bound=Callable[..., Any])


def _host_option(f: F) -> F:
    return click.option(
        "--host",
        default=None,
        metavar="URL",
        type=TEXT,
        help="The Ollama server (default: $OLLAMA_HOST, else 127.0.0.1:11434).",
    )(f)


@click.command("ollama")
@click.argument("name")
@run_options
@_host_option
@click.option("--write-modelfile", metavar="PATH", default=None, help="Write a Modelfile (FROM NAME:TAG + num_ctx).")
@click.option("--write-env", metavar="PATH", default=None, help="Write OLLAMA_* server settings as an env file.")
@click.option("--write-systemd", metavar="PATH", default=None, help="Write a systemd drop-in for ollama.service.")
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
@click.option(
    "--server-default",
    is_flag=True,
    help="Also set OLLAMA_CONTEXT_LENGTH: every model without its own num_ctx then loads at this context.",
)
@click.option(
    "--platform",
    type=click.Choice(["auto", "linux", "macos", "windows", "docker"]),
    default="auto",
    show_default=True,
    help="How to apply the server settings: systemd/env file, launchctl, user variables, docker --env-file.",
)
def ollama_command(
    name: str,
    host: str | None,
    write_modelfile: str | None,
    write_env: str | None,
    write_systemd: str | None,
    force: bool,
    server_default: bool,
    platform: str,
    **kwargs: object,
) -> None:
    """Advice for an Ollama model (NAME[:TAG]): found in the model store, on the server, or in the built-in profiles.

    For Ollama, --ctx is num_ctx: the context of each slot (Ollama runs llama-server with -c num_ctx × slots).
    """
    from kvadvise.backends.ollama.advice import (
        advice_dict,
        advice_summary,
        advice_text,
        advise,
        apply_steps,
        live_state,
        write_files,
    )
    from kvadvise.backends.ollama.config import current_platform
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.render import plan_dict, plan_text

    _refuse_llamacpp_only(click.get_current_context())
    o = PlanOptions.take(dict(kwargs))
    kv = rules.one_cache_type(o.type_k, o.type_v)
    o = replace(o, type_k=kv, type_v=kv)
    with ollama_api.session():
        model = resolve(name, host=host)
        # num_ctx past the training context: Ollama runs the training context (llm/server.go), so that is planned
        too_large = rules.too_large_warning(o.n_ctx, model.spec.n_ctx_train) if o.n_ctx else None
        if o.n_ctx:
            num_ctx = rules.capped_num_ctx(o.n_ctx, model.spec.n_ctx_train)
            o = replace(o, n_ctx=rules.llama_n_ctx(num_ctx, o.n_parallel))
        plan = _placed_as_ollama_does(model, o, _plan(model, o))
        if too_large:
            plan = replace(plan, notes=(*plan.notes, too_large))
        where = current_platform() if platform == "auto" else platform
        advice = advise(
            model, plan, live_state(host), server_default=server_default, repeatable=o.repeatable, platform=where
        )
    if o.as_json:
        output.result_json(plan_dict(plan) | {"ollama": advice_dict(advice)})
        chart = show_chart(plan, o, terminal=False, write=False)  # --chart-file writes the image with --json too
    elif o.verbose:
        output.result(plan_text(plan))
        chart = show_chart(plan, o, write=False)
        output.result(advice_text(advice))
    else:
        from kvadvise.summary import summary_text

        settings, notes, sources = advice_summary(advice)
        output.result(
            summary_text(plan, settings_title="Settings (Ollama)", settings=settings, notes=notes, sources=sources)
        )
        chart = show_chart(plan, o, write=False)
    refuse_to_write_what_does_not_fit(plan, write_modelfile, write_env, write_systemd, chart=chart)
    written = write_files(
        advice,
        modelfile=write_modelfile,
        env=write_env,
        systemd=write_systemd,
        force=force,
        extra=(chart,) if chart is not None else (),
    )  # the chart and the configs: all written, or none
    for w in written:
        output.note(f"wrote {w.path}" + ("; apply it with:" if w.hints else ""))
        for h in w.hints:
            output.note_line(f"  {h}")
    steps = apply_steps(advice, modelfile=write_modelfile, env=write_env, systemd=write_systemd)
    if steps and not o.as_json:
        output.result(f"Next ({advice.platform}; --platform to choose):")
        for x in steps:
            output.line(f"  {x}")
    if not o.as_json and not o.verbose:
        from kvadvise.summary import VERBOSE_HINT

        output.line(VERBOSE_HINT)
    exit_if_no_fit(plan)


# llama.cpp knobs Ollama does not pass to llama-server (memory-spec §6.a): a plan with them would not be
# what Ollama runs. --batch is Ollama's num_batch (-b and -ub equal), so only -ub apart from it is refused.
_LLAMACPP_ONLY = {
    "kv_unified": "-kvu/--kv-unified",
    "swa_full": "--swa-full",
    "n_ubatch": "-ub/--ubatch",
    "n_outputs_max": "--n-outputs-max",
    "tensor_split": "-ts/--tensor-split",
    "rpc": "--rpc",
    "n_cpu_moe": "--n-cpu-moe",  # Ollama places the experts itself (its own fit), with no such setting
}


def _refuse_llamacpp_only(ctx: click.Context) -> None:
    from click.core import ParameterSource

    given = [
        flag
        for param, flag in _LLAMACPP_ONLY.items()
        if ctx.get_parameter_source(param) not in (None, ParameterSource.DEFAULT)
    ]
    if ctx.params.get("runtime", "llama-server") != "llama-server":
        raise click.UsageError("--runtime: Ollama (>= 0.30) runs every GGUF model with llama-server")
    if given:
        raise click.UsageError(
            f"{', '.join(given)}: llama.cpp only; Ollama does not pass it to llama-server "
            "(use `kvadvise llamacpp` for a llama-server plan; Ollama's num_batch is --batch)"
        )


for _param in ollama_command.params:
    if _param.name == "n_ctx" and isinstance(_param, click.Option):
        _param.help = "num_ctx: the context of each slot (Ollama runs -c num_ctx × slots). Without it, recommended."


@click.command("ollama")
@click.argument("name")
@_host_option
@click.option("--load", is_flag=True, help="Load the model first (POST /api/generate with --num-ctx, if given).")
@click.option(
    "--num-ctx",
    type=click.IntRange(min=1, max=2**31 - 1),
    default=None,
    help="The context per slot to load and expect [default: the model's num_ctx parameter].",
)
@click.option(
    "--kv-cache-type",
    type=click.Choice(rules.KV_CACHE_TYPES),
    default=None,
    help="The server's OLLAMA_KV_CACHE_TYPE, for the predicted size [default: from --env-file, else the "
    "ollama.service drop-ins, else $OLLAMA_KV_CACHE_TYPE, else f16].",
)
@click.option(
    "--env-file",
    metavar="PATH",
    type=TEXT,
    default=None,
    help="The env file the server runs with (what `kvadvise ollama --write-env` wrote): its OLLAMA_KV_CACHE_TYPE.",
)
@click.option(
    "--num-parallel",
    type=click.IntRange(min=1, max=4096),
    default=1,
    show_default=True,
    help="The server's OLLAMA_NUM_PARALLEL, for the predicted size.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify_ollama_command(
    name: str,
    host: str | None,
    load: bool,
    num_ctx: int | None,
    kv_cache_type: str | None,
    env_file: str | None,
    num_parallel: int,
    as_json: bool,
) -> None:
    """After `ollama run`: read /api/ps; size_vram must equal size (100% GPU) and the context must be as asked.

    With --load it also runs one short generate (64 tokens) and prints prompt and decode tokens/s from
    Ollama's own counters. A model is matched by name, else by digest (qwen3-coder:latest is qwen3-coder:30b).
    """
    from dataclasses import asdict

    from kvadvise.backends.ollama.config import server_kv_cache_type
    from kvadvise.backends.ollama.resolve import library_names, resolve
    from kvadvise.backends.ollama.verify import verify
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner.memory import estimate

    kv, kv_source = server_kv_cache_type(kv_cache_type, env_file)
    with ollama_api.session():
        model = resolve(name, host=host)
        ctx = num_ctx or model.default_num_ctx
        if ctx:  # Ollama runs at most the training context (llm/server.go): that is what loads and is checked
            ctx = rules.capped_num_ctx(ctx, model.spec.n_ctx_train)

        def predict(n_ctx: int) -> int:  # as Ollama runs it: -c num_ctx x slots, one cache type, flash attention
            return estimate(model.spec, rules.run_config(n_ctx, num_parallel, kv)).total_bytes

        v = verify(
            host,
            name,
            load=load,
            num_ctx=ctx,
            predicted_total_bytes=predict(ctx) if ctx else None,
            digest=model.digest,
            model_path=model.spec.source if model.source.startswith("store:") else None,
            aliases=library_names(name),
            predict_at=predict,
            measure_speed=load,
        )
    v = replace(v, kv_cache_type=kv, kv_cache_type_source=kv_source)
    run_ctx = v.context_length or ctx
    if v.decode_tokens_per_s is not None and run_ctx:
        v = replace(
            v, decode_estimate_tokens_per_s=_decode_estimate(model.spec, rules.run_config(run_ctx, num_parallel, kv))
        )
    if v.prompt_tokens_per_s is not None and v.prompt_tokens and ctx:
        v = replace(
            v,
            prompt_estimate_tokens_per_s=_prompt_estimate(
                model.spec, rules.run_config(ctx, num_parallel, kv), v.prompt_tokens
            ),
        )
    if as_json:
        output.result_json(asdict(v))
    else:
        output.line(
            f"{v.name}: {v.processor or 'not loaded'}"
            + (f", {v.size / 1e9:.1f} GB, context {v.context_length}" if v.loaded else "")
        )
        if v.predicted_total_bytes is not None and v.difference_bytes is not None:
            at = f" at context {v.predicted_ctx:,}" if v.predicted_ctx else ""
            output.line(
                f"  predicted {v.predicted_total_bytes / 1e9:.2f} GB{at}; "
                f"reported - predicted = {v.difference_bytes / 1e6:+,.0f} MB"
            )
        output.line(f"  K/V cache {kv} ({kv_source})")
        if v.prompt_tokens_per_s is not None or v.decode_tokens_per_s is not None:
            output.line(
                f"  measured (Ollama's counters, {64} tokens): prompt {v.prompt_tokens_per_s or 0:,.1f} tokens/s, "
                f"decode {v.decode_tokens_per_s or 0:,.1f} tokens/s"
            )
        if v.prompt_estimate_tokens_per_s and v.prompt_tokens_per_s:
            ratio = v.prompt_tokens_per_s / v.prompt_estimate_tokens_per_s
            output.result(
                f"  prompt estimated ≈ {v.prompt_estimate_tokens_per_s:,.0f} tokens/s for {v.prompt_tokens} tokens on "
                f"this GPU; measured / estimated = {ratio:.2f}"
            )
        if v.decode_estimate_tokens_per_s and v.decode_tokens_per_s:
            ratio = v.decode_tokens_per_s / v.decode_estimate_tokens_per_s
            output.line(
                f"  decode estimated ≈ {v.decode_estimate_tokens_per_s:,.0f} tokens/s on this GPU; "
                f"measured / estimated = {ratio:.2f}"
            )
        for r in v.reasons:
            output.line(f"  - {r}")
        output.line("fits: 100% GPU" if v.fits else "does not fit as asked")
    if not v.fits:
        raise click.exceptions.Exit(EXIT_NO_FIT)


def _decode_estimate(spec: ModelSpec, cfg: RunConfig) -> float | None:
    """kvadvise's decode estimate for ``cfg`` on this machine's GPUs (NVML and the card list's bandwidth);
    None without a GPU of known bandwidth."""
    from kvadvise.planner import hardware
    from kvadvise.planner.budget import plan_budget
    from kvadvise.planner.recommender import decode_speed

    hw = hardware.probe()
    if not hw.gpus:
        return None
    return decode_speed(spec, cfg, plan_budget(hw, spec=spec))[0]


def _prompt_estimate(spec: ModelSpec, cfg: RunConfig, prompt_tokens: int) -> float | None:
    """kvadvise's prefill estimate for a prompt of ``prompt_tokens`` on this machine's GPUs (the card list's
    FP16 peak); None without a GPU of known compute."""
    from kvadvise.planner import hardware
    from kvadvise.planner.budget import plan_budget
    from kvadvise.planner.speed import plan_prefill

    hw = hardware.probe()
    if not hw.gpus:
        return None
    est = plan_prefill(spec, cfg, plan_budget(hw, spec=spec), prompt_tokens=prompt_tokens)
    return est.tokens_per_s if est is not None else None


def _plan(model: OllamaModel, o: PlanOptions, hardware: Hardware | None = None) -> Plan:
    """The plan as Ollama runs the model: one cache type, its projector's fit target, a profile's
    uncertain weights."""
    from kvadvise.backends.ollama.rules import projector_margin_bytes
    from kvadvise.runtime.llamabuild import OLLAMA_BUILD

    mmproj = _readable_projector(model)
    return build_plan(
        model.spec,
        replace(o, mmproj=mmproj) if mmproj else o,
        same_type_kv=True,
        extra_margin_bytes=projector_margin_bytes(model, planned=mmproj is not None),
        weights_uncertain=model.source.startswith("profile:"),
        hardware=hardware,
        llama_build=OLLAMA_BUILD,  # issue 25: Ollama's llama-server, not the one on PATH
    )


def _readable_projector(model: OllamaModel) -> str | None:
    """The projector blob of a store model when its header reads as an mmproj GGUF (Ollama passes it to
    llama-server as --mmproj): planned on the first GPU as llama.cpp loads it. None otherwise (a model
    from the API or a profile, an unreadable blob): the fit-target rule stands in for it."""
    if model.projector_path is None:
        return None
    from kvadvise.errors import KvadviseError
    from kvadvise.model.gguf import read_file
    from kvadvise.model.projector import projector_from_gguf

    try:
        projector_from_gguf(read_file(model.projector_path))
    except KvadviseError:
        return None
    return model.projector_path


def _placed_as_ollama_does(model: OllamaModel, o: PlanOptions, plan: Plan) -> Plan:
    """Several GPUs: Ollama puts the model on its best single GPU when it fits there in 80 % of the free
    memory (``--split-mode none``), and spreads it over all of them only otherwise or with
    OLLAMA_SCHED_SPREAD (server/sched.go selectLlamaServerPlacement). Plan what it will do."""
    hw = plan.hardware
    if hw is None or len(hw.gpus) < 2:
        return plan
    if rules.sched_spread():
        note = "OLLAMA_SCHED_SPREAD is set: Ollama spreads the model over all the GPUs"
        return replace(plan, notes=(*plan.notes, note))
    best = rules.single_gpu(hw.gpus)
    alone = _plan(model, replace(o, tensor_split=()), replace(hw, gpus=(best,)))
    if alone.fits and alone.estimate.device_bytes <= rules.SINGLE_GPU_SHARE * best.free_bytes:
        note = (
            f"Ollama runs it on one GPU ({best.name}, --split-mode none): it fits in 80 % of that GPU's free "
            "memory; OLLAMA_SCHED_SPREAD=1 on the server would spread it over all of them"
        )
        return replace(alone, notes=(*alone.notes, note))
    note = f"Ollama spreads it over the {len(hw.gpus)} GPUs: it does not fit in 80 % of one GPU's free memory"
    return replace(plan, notes=(*plan.notes, note))


def with_installed(cmd: click.Command) -> click.Command:
    """``kvadvise ollama``'s command with NAME optional and ``--installed`` / ``--sort`` added: with
    ``--installed`` it lists the store; with NAME it is the command as it was."""
    params: list[click.Parameter] = []
    for p in cmd.params:
        if isinstance(p, click.Argument) and p.name == "name":
            p = click.Argument(["name"], required=False, nargs=-1)  # several: planned together
        params.append(p)
    params += [
        click.Option(
            ["--write-preset"],
            metavar="PATH",
            type=TEXT,  # an empty path or a NUL byte: exit 2
            default=None,
            help="With several models: also write them as a llama-server router preset (--models-preset).",
        ),
        click.Option(
            ["--installed"],
            is_flag=True,
            help="List every model of the local store (and the server's): size, architecture, the largest "
            "context per slot at f16 and q8_0 on this GPU, loaded now, what it needs.",
        ),
        click.Option(
            ["--sort"],
            type=click.Choice(LIST_SORTS),
            default=None,
            help="With --installed: name (default), size (largest first) or context (longest f16 context first).",
        ),
    ]
    inner: Callable[..., Any] = cmd.callback  # type: ignore[assignment]

    def callback(**kwargs: Any) -> Any:
        listing = kwargs.pop("installed")
        sort = kwargs.pop("sort")
        names: tuple[str, ...] = kwargs.pop("name") or ()
        if listing:
            if names:
                raise click.UsageError("--installed lists every model: drop NAME (or drop --installed)")
            if kwargs.pop("write_preset"):
                raise click.UsageError("--installed lists every model; --write-preset is for several models: name them")
            from kvadvise.backends.ollama.installed import list_installed  # the store listing: only when asked

            return list_installed(kwargs | {"name": None}, sort or "name")
        if sort:
            raise click.UsageError("--sort orders the --installed listing")
        if not names:
            raise click.UsageError("give a model NAME[:TAG], or --installed to list the models of the store")
        if len(names) > 1:  # several models on one server: Ollama's scheduler (backends/ollama/together.py)
            from kvadvise.backends.ollama.together import run

            return run(names, kwargs)
        if kwargs.pop("write_preset"):
            raise click.UsageError("--write-preset writes several models as a llama-server router preset")
        return inner(name=names[0], **kwargs)

    help_text = (cmd.help or "") + (
        "\n\nkvadvise ollama --installed [--sort name|size|context] [--json]: every model of the store, one line each."
        "\n\nkvadvise ollama NAME NAME... [--write-env FILE] [--write-preset FILE]: several models on one server, "
        "as Ollama's scheduler places them: which stay loaded together on which GPU, which evicts which, and the "
        "settings that keep them loaded."
    )
    return click.Command(
        cmd.name,
        params=params,
        callback=callback,
        help=help_text,
        context_settings=cmd.context_settings,
        short_help=cmd.short_help,
    )
