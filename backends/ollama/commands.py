"""``kvadvise ollama NAME`` and ``kvadvise verify ollama NAME``: the Ollama backend's own
commands, registered through the plugin interface (OllamaBackend.register_commands)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import click

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import rules
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.runtime import LLAMA_BUILD_REFUSED, LLAMACPP_ONLY, MLX_QUANTS, PLATFORMS, RUNNERS, WRITERS
from kvadvise.model.spec import ModelSpec
from kvadvise.planner.memory import RunConfig
from kvadvise.request import PlanRequest
from kvadvise.ui import output
from kvadvise.ui.flags import LIST_SORTS, TEXT, Flags, one_path, run_options, take
from kvadvise.ui.show import answer, writer_options, writer_paths

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
@writer_options(WRITERS)
@click.option(
    "--server-default",
    is_flag=True,
    help="Also set OLLAMA_CONTEXT_LENGTH: every model without its own num_ctx then loads at this context.",
)
@click.option(
    "--platform",
    type=click.Choice(PLATFORMS),
    default="auto",
    show_default=True,
    help="How to apply the server settings: systemd/env file, launchctl, user variables, docker --env-file.",
)
@click.option(
    "--runner",
    type=click.Choice(RUNNERS),
    default="auto",
    show_default=True,
    help="On a Mac: the runner Ollama loads the model with (auto: by --ollama-version and the architecture; "
    "mlx: a safetensors tag such as -mlx/-nvfp4). See docs/ollama-mlx.md.",
)
@click.option(
    "--ollama-version",
    default=None,
    metavar="X.Y.Z",
    type=TEXT,
    help="The Ollama the plan is for (default: the server's /api/version, else the newest): its runner "
    "(llama-server from 0.30, a built-in runner 0.11-0.24) and llama.cpp. See docs/ollama-versions.md.",
)
@click.option(
    "--mlx-quant",
    type=click.Choice(MLX_QUANTS),
    default="nvfp4",
    show_default=True,
    help="The MLX type of the tag the MLX runner loads (Ollama's -mlx tags: nvfp4).",
)
def ollama_command(
    name: str,
    host: str | None,
    force: bool,
    server_default: bool,
    platform: str,
    runner: str,
    ollama_version: str | None,
    mlx_quant: str,
    **kwargs: object,
) -> None:
    """Advice for an Ollama model (NAME[:TAG]): found in the model store, on the server, or in the built-in profiles.

    For Ollama, --ctx is num_ctx: the context of each slot (Ollama runs llama-server with -c num_ctx × slots).
    """
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.backends.ollama.runtime import OllamaRuntime
    from kvadvise.entry import plan_for

    paths = writer_paths(kwargs, WRITERS)
    f = ollama_flags(kwargs)
    with ollama_api.session():
        model = resolve(name, host=host)
        runtime = OllamaRuntime(
            model,
            host=host,
            platform=platform,
            server_default=server_default,
            runner=runner,
            ollama_version=ollama_version,
            mlx_quant=mlx_quant,
        )
        plan = plan_for(model.spec, f.request, runtime)
    answer(plan, f.view, runtime, requested_ctx=None, paths=paths, force=force)


def ollama_flags(kwargs: dict[str, Any]) -> Flags:
    """The shared flags of an Ollama command: --runtime is llama-server's (Ollama >= 0.30 runs every GGUF
    model with it); the rest is the request, whose llama.cpp-only flags the Ollama runtime refuses."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("llama_build") == click.core.ParameterSource.ENVIRONMENT:
        kwargs["llama_build"] = "auto"  # KVADVISE_LLAMA_BUILD is left to the llama.cpp commands (below)
    f = take(kwargs)
    if f.runtime != "llama-server":
        raise click.UsageError(
            "--runtime: Ollama (>= 0.30) runs every GGUF model with llama-server; an older one's runner "
            "follows --ollama-version"
        )
    # the llama.cpp build is the one this Ollama carries (kvadvise.backends.ollama.versions), not
    # --llama-build's (hidden here) nor KVADVISE_LLAMA_BUILD's, which name a llama-server of the user's: the
    # variable is left to the llama.cpp commands, the flag given here is refused
    if ctx is not None and ctx.get_parameter_source("llama_build") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(LLAMA_BUILD_REFUSED)
    return replace(f, request=replace(f.request, llama_build="auto"))


# what `kvadvise ollama --help` leaves out: llama.cpp's own knobs (refused with why, when given anyway)
for _param in ollama_command.params:
    if _param.name == "n_ctx" and isinstance(_param, click.Option):
        _param.help = (
            "num_ctx: the context of each slot (Ollama runs -c num_ctx × slots; 64k = 65,536). Without it, recommended."
        )
    if isinstance(_param, click.Option) and _param.name in (*LLAMACPP_ONLY, "runtime", "no_repack", "llama_build"):
        _param.hidden = True


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
    type=click.Choice(rules.SERVER_KV_CACHE_TYPES),
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
    from kvadvise.backends.ollama.name import parse_name
    from kvadvise.backends.ollama.resolve import library_names
    from kvadvise.backends.ollama.verify import verify
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.planner.memory import estimate

    parse_name(name)  # a name that is none ("", "a b") is refused before the server is asked (exit 2, not 4)
    kv, kv_source = server_kv_cache_type(kv_cache_type, env_file)
    with ollama_api.session():
        _server_up(host)  # verify reads the server: a server that is down is said first (exit 4), not "not found"
        model = _created(name, host)
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


def _created(name: str, host: str | None) -> OllamaModel:
    """The model to verify; one named as `kvadvise ollama` names what it plans (qwen3-coder-64k) that the
    server does not have yet was not created: say how, rather than to pull it."""
    import re

    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.errors import InputError

    try:
        return resolve(name, host=host)
    except InputError as e:
        m = re.fullmatch(r"(?i)(.+?)-(\d+)k(?::latest)?", name.strip())
        if m is None:
            raise
        raise InputError(
            f"{name}: not on the server yet: the plan's model is made by `ollama create`",
            hint=f"ollama create {m[0].split(':')[0]} -f Modelfile (kvadvise ollama {m[1]} --write-modelfile "
            "Modelfile writes it), then verify",
        ) from e


def _server_up(host: str | None) -> None:
    """BackendUnreachable (exit 4) with how to start the server, when none answers at ``host``."""
    from kvadvise.errors import BackendUnreachable

    url = ollama_api.server_url(host)
    try:
        ollama_api.server_version(url)
    except BackendUnreachable as e:
        raise BackendUnreachable(
            e.message, hint="start it (ollama serve, or systemctl start ollama), or name another with --host URL"
        ) from None


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
    from kvadvise.planner.prefill import plan_prefill

    hw = hardware.probe()
    if not hw.gpus:
        return None
    est = plan_prefill(spec, cfg, plan_budget(hw, spec=spec), prompt_tokens=prompt_tokens)
    return est.tokens_per_s if est is not None else None


SEVERAL_MODEL_FILES = ("--write-env", "--write-preset", "--write-llama-swap", "--write-modelfiles")


def _single_model_options(kwargs: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """Pop the options of `kvadvise ollama NAME` that are not the request: the server, and those given that
    only one model can take (a listing or several models refuse them by flag)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    host = kwargs.pop("host")
    single = [w.option for w in WRITERS if kwargs.pop(w.dest, None)]
    kwargs.pop("force", None)
    if kwargs.pop("server_default", False):
        single.append("--server-default")
    # the scheduler's replay and the listing plan no release, runner or MLX type: given, they were dropped
    for dest, option in (
        ("platform", "--platform"),
        ("ollama_version", "--ollama-version"),
        ("runner", "--runner"),
        ("mlx_quant", "--mlx-quant"),
    ):
        kwargs.pop(dest, None)
        if ctx.get_parameter_source(dest) not in (None, ParameterSource.DEFAULT):
            single.append(option)
    return host, tuple(single)


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
            multiple=True,
            callback=one_path,  # given twice: exit 2, not the last one silently
            help="With several models: also write them as a llama-server router preset (--models-preset).",
        ),
        click.Option(
            ["--write-llama-swap"],
            metavar="PATH",
            type=TEXT,  # an empty path or a NUL byte: exit 2
            multiple=True,
            callback=one_path,  # given twice: exit 2, not the last one silently
            help="With several models: also write them as a llama-swap config (a cmd each, groups that fit "
            "together; written also when they do not all fit at once).",
        ),
        click.Option(
            ["--write-modelfiles"],
            metavar="DIR",
            type=TEXT,  # an empty path or a NUL byte: exit 2
            multiple=True,
            callback=one_path,  # given twice: exit 2, not the last one silently
            help="With several models: a Modelfile for each model that needs its own context, in DIR.",
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
            if any([kwargs.pop(o, None) is not None for o in ("write_preset", "write_modelfiles", "write_llama_swap")]):
                raise click.UsageError(
                    "--installed lists every model; --write-preset, --write-llama-swap and --write-modelfiles are "
                    "for several models"
                )
            from kvadvise.backends.ollama.installed import list_installed  # the store listing: only when asked

            host, single = _single_model_options(kwargs)
            return list_installed(ollama_flags(kwargs), host=host, sort=sort or "name", single_model=single)
        if sort:
            raise click.UsageError("--sort orders the --installed listing")
        if not names:
            raise click.UsageError("give a model NAME[:TAG], or --installed to list the models of the store")
        if len(names) > 1:  # several models on one server: Ollama's scheduler (backends/ollama/together.py)
            paths = {o: kwargs.pop(o.lstrip("-").replace("-", "_")) for o in SEVERAL_MODEL_FILES}
            force = kwargs["force"]
            host, single = _single_model_options(kwargs)
            f = ollama_flags(kwargs)
            return run_together(names, f, host=host, paths=paths, force=force, single_model=single)
        if any([kwargs.pop(o, None) is not None for o in ("write_preset", "write_modelfiles", "write_llama_swap")]):
            raise click.UsageError(
                "--write-preset, --write-llama-swap and --write-modelfiles are for several models (a router preset, "
                "a llama-swap config, a Modelfile each)"
            )
        return inner(name=names[0], **kwargs)

    help_text = (cmd.help or "") + (
        "\n\nkvadvise ollama --installed [--sort name|size|context] [--json]: every model of the store, one line each."
        "\n\nkvadvise ollama NAME NAME... [--write-env FILE] [--write-preset FILE] [--write-llama-swap FILE]: several "
        "models on one server, "
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


def run_together(
    names: Sequence[str],
    f: Flags,
    *,
    host: str | None,
    paths: dict[str, str | None],
    force: bool,
    single_model: tuple[str, ...] = (),
) -> None:
    """``kvadvise ollama A B C``: resolve, replay, plan (kvadvise.backends.ollama.together), print, write."""
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.backends.ollama.together import (
        SINGLE_MODEL_ONLY,
        hardware,
        loaded_now,
        one_each,
        plan_together,
        settings,
    )
    from kvadvise.backends.ollama.together_budget import plan_combinations
    from kvadvise.backends.ollama.together_files import SWAPPING_OPTIONS, budget_lines, check_names, write
    from kvadvise.backends.ollama.together_show import together_dict, together_text
    from kvadvise.errors import EXIT_NO_FIT
    from kvadvise.ui.flags import given_flags, typed

    r = f.request
    given = [*given_flags(f, SINGLE_MODEL_ONLY), *single_model]
    if given:
        raise click.UsageError(f"{', '.join(given)}: for one model; with several, give each its own run")
    from kvadvise.backends.ollama import envconfig

    kv = rules.one_cache_type(r.type_k, r.type_v) or envconfig.var("OLLAMA_KV_CACHE_TYPE").lower() or "f16"
    if kv not in rules.SERVER_KV_CACHE_TYPES:  # several models: planned for the newest release (llama-server)
        raise click.UsageError(
            f"OLLAMA_KV_CACHE_TYPE {kv!r}: Ollama's llama-server takes one of {', '.join(rules.SERVER_KV_CACHE_TYPES)}"
        )
    hw = hardware(r)
    from kvadvise.entry import check_margin
    from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES

    check_margin(r.margin_bytes, hw.gpus)  # a margin of the whole card: refused as for one model
    if r.margin_bytes != DEFAULT_MARGIN_BYTES:
        # the replay keeps what llama-server's --fit keeps free for each model (1,024 MiB, LLAMA_ARG_FIT_TARGET)
        raise click.UsageError(
            "--margin: for one model; several models are replayed at llama.cpp's --fit margin (1 GiB each)"
        )
    with ollama_api.session():
        models, same, aliases = one_each(tuple(resolve(n, host=host) for n in names))
        loaded, live_note = loaded_now(host, hw, r)
    t = plan_together(
        models,
        hw,
        settings(r, hw, kv, typed=typed(("n_parallel", "flash_attn"))),
        loaded=loaded,
        headless=r.headless,
        target_ctx=_target(r),
        kv_fixed=bool(r.type_k or r.type_v),
        allow_q4=r.allow_q4,
    )
    if same:
        t = replace(t, notes=(*t.notes, *same), aliases=aliases)
    if live_note:
        t = replace(t, notes=(*t.notes, live_note))
    asked = {k: v for k, v in paths.items() if v is not None}
    swapping = {k: v for k, v in asked.items() if k in SWAPPING_OPTIONS}
    check_names(t, swapping)
    if swapping:  # the router's limit and llama-swap's groups: which combinations fit (together_budget)
        t = replace(t, combinations=plan_combinations(t, hw, headless=r.headless))
    if f.view.as_json:
        output.result_json(together_dict(t))
    else:
        output.result(together_text(t, verbose=f.view.verbose))
    if t.combinations is not None:
        for line in budget_lines(t.combinations):
            output.note(line)
    if not t.fits:
        c = t.combinations
        if c is not None and c.models_max and swapping:  # they swap: the router and llama-swap can still serve them
            if len(swapping) < len(asked):
                output.note(
                    f"not written ({', '.join(k for k in asked if k not in swapping)}): these models do not "
                    "stay loaded together"
                )
            write(t, swapping, force=force)
        elif asked:
            why = f" ({', '.join(c.alone_short)} does not fit even alone)" if c is not None and c.alone_short else ""
            output.note(f"nothing written: these models do not stay loaded together{why}")
        raise click.exceptions.Exit(EXIT_NO_FIT)
    write(t, asked, force=force)


def _target(r: PlanRequest) -> int:
    """The first model's target: --target-ctx, --use's, else the policy's default for the card (0 here)."""
    from kvadvise.planner.policy import load_use_cases

    if r.use == "long":
        return 1 << 30  # capped at the model's training context
    return r.target_ctx or (load_use_cases()[r.use] if r.use else 0)
