"""From the shared flags to a plan on the screen: what every planning command does,
built-in or brought by a backend. Commands only parse, call this and render."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from kvadvise.cli import output
from kvadvise.cli.options import PlanOptions
from kvadvise.errors import EXIT_NO_FIT

if TYPE_CHECKING:
    from kvadvise.files import NewFile
    from kvadvise.model.projector import ProjectorSpec
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.planning import MeasuredOverhead, Plan
    from kvadvise.runtime.llamabuild import BuildChoice

JSONDoc = dict[str, object]


def check_flags(o: PlanOptions) -> None:
    """Flags that contradict each other: refused (exit 2) rather than one silently winning."""
    if o.rpc and (o.gpu or o.vram_bytes is not None):
        raise click.UsageError("--rpc plans the RPC hosts as the devices: give it without --gpu/--vram")
    if o.gpu and o.vram_bytes is not None:
        raise click.UsageError("give --gpu or --vram, not both")
    if o.bandwidth_gbs is not None and o.vram_bytes is None:
        raise click.UsageError("--bandwidth goes with --vram (a --gpu card has its own)")
    if (o.gpu or o.vram_bytes is not None) and o.device == "cpu":
        raise click.UsageError("--device cpu plans without a GPU: drop --gpu/--vram, or use --device cuda")
    if o.n_cpu_moe and o.allow_cpu:
        raise click.UsageError("--n-cpu-moe places the experts as given; --allow-cpu finds a placement: give one")
    if o.n_cpu_moe and o.device == "cpu":
        raise click.UsageError("--n-cpu-moe keeps experts on the CPU beside a GPU: drop it with --device cpu")
    if o.n_ctx is not None and (o.use or o.target_ctx):
        raise click.UsageError("--ctx fixes the context; --use and --target-ctx aim for one: give one of them")
    if o.gpu_only and o.allow_cpu:
        raise click.UsageError("--gpu-only keeps the whole model on the GPU; --allow-cpu plans part on the CPU")
    if o.chart_file:
        from kvadvise.cli.chart import check_path

        check_path(o.chart_file)


def build_plan(
    spec: ModelSpec,
    o: PlanOptions,
    *,
    same_type_kv: bool = False,
    extra_margin_bytes: int = 0,
    weights_uncertain: bool = False,
    hardware: Hardware | None = None,
    draft: ModelSpec | None = None,
    llama_build: BuildChoice | None = None,
) -> Plan:
    """The plan for ``spec`` under the flags ``o``; a calibration of this machine's GPU is read here
    and passed in, so planning itself stays pure. ``weights_uncertain``: the weights size is a
    published figure (a built-in profile), so the recommender keeps 3 % of it free. ``draft``: the
    draft model of ``--model-draft``, loaded by the command's backend. ``llama_build``: the build the
    command found itself (verify: the llama-server or library it runs) where --llama-build is auto."""
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.memory import RunConfig, flash_attn_note
    from kvadvise.planner.planning import HardwareRequest, hardware_for, make_plan
    from kvadvise.planner.policy import Policy, load_use_cases, needs_opt_in

    check_flags(o)
    target = o.target_ctx or (load_use_cases()[o.use] if o.use else 0)
    fixed = (cache_type(o.type_k or "f16"), cache_type(o.type_v or "f16")) if (o.type_k or o.type_v) else None
    policy = Policy(
        fixed_kv=fixed,
        target_ctx=target,
        min_ctx=o.min_ctx,
        repeatable=o.repeatable,
        allow_cpu=o.allow_cpu,
        same_type_kv=same_type_kv,
        use=o.use,
        allow_q4=o.allow_q4 or (fixed is not None and needs_opt_in(fixed)),
        weights_uncertain=weights_uncertain,
        headless=o.headless,
        gpu_only=o.gpu_only,
    )
    probed = not o.gpu and o.vram_bytes is None and not o.rpc and not o.no_hardware
    hw = hardware or hardware_for(
        HardwareRequest(
            gpu=o.gpu,
            vram_bytes=o.vram_bytes,
            rpc=tuple(o.rpc or ()),
            probe=not o.no_hardware,
            bandwidth_bytes_per_s=None if o.bandwidth_gbs is None else int(o.bandwidth_gbs * 1e9),
            ram_bandwidth_bytes_per_s=None if o.ram_bandwidth_gbs is None else int(o.ram_bandwidth_gbs * 1e9),
            ram_bytes=o.ram_bytes,
        )
    )
    if hardware is not None and hw is not None and o.ram_bandwidth_gbs is not None:
        hw = replace(hw, ram_bandwidth_bytes_per_s=int(o.ram_bandwidth_gbs * 1e9))
    measured, notes = _calibration(hw.gpus[0].name if probed and hw is not None and hw.gpus else None)
    build, build_notes = _llama_build(spec, o, llama_build)
    notes = (*notes, *build_notes)
    kv = fixed or (cache_type("f16"), cache_type("f16"))
    base = RunConfig(
        n_ctx=o.n_ctx or 0,
        n_parallel=o.n_parallel,
        kv_unified=o.kv_unified,
        n_batch=o.n_batch,
        n_ubatch=o.n_ubatch,
        type_k=kv[0],
        type_v=kv[1],
        flash_attn=o.flash_attn,
        swa_full=o.swa_full,
        device=o.device,
        runtime=o.runtime,
        n_outputs_max=o.n_outputs_max,
        tensor_split=o.tensor_split or (),
        cpu_repack=_cpu_repack(o),
        mmproj=_projector(o.mmproj),
        draft=draft,
        type_k_draft=cache_type(o.type_k_draft),
        type_v_draft=cache_type(o.type_v_draft),
        llama_build=build,
    )
    plan = make_plan(
        spec,
        base,
        recommend_ctx=o.n_ctx is None,
        hw=hw,
        policy=policy,
        margin_bytes=o.margin_bytes + extra_margin_bytes,
        measured_overhead=measured,
        notes=notes,
        prompt_tokens=o.prompt_tokens,
        n_cpu_moe=o.n_cpu_moe,
    )
    fa_note = flash_attn_note(spec, plan.config)
    return replace(plan, notes=(*plan.notes, fa_note)) if fa_note else plan


def _llama_build(spec: ModelSpec, o: PlanOptions, found: BuildChoice | None) -> tuple[int | None, tuple[str, ...]]:
    """--llama-build: the build the plan follows (kvadvise.runtime.llamabuild) and what the plan says about it;
    for an unknown build and llama-server, how much more an older server's logits would take."""
    from kvadvise.runtime import llamabuild

    choice = found if found is not None and o.llama_build == "auto" else llamabuild.choose(o.llama_build)
    notes = list(llamabuild.notes(choice, runtime=o.runtime))
    if choice.build is None and o.runtime == "llama-server" and o.n_outputs_max is None:
        rows = min(o.n_ubatch, o.n_batch) - o.n_parallel
        if rows > 0:
            notes[-1] += f" ({4 * rows * spec.n_vocab / (1 << 20):,.0f} MiB more here)"
    return choice.build, tuple(notes)


def _projector(path: str | None) -> ProjectorSpec | None:
    """--mmproj FILE: the projector's header (a local file, as llama-server's --mmproj takes it)."""
    if path is None:
        return None
    from kvadvise.model.gguf import read_file
    from kvadvise.model.projector import projector_from_gguf

    return projector_from_gguf(read_file(path))


def _cpu_repack(o: PlanOptions) -> str:
    """The CPU_REPACK rule of a CPU plan: this machine's CPU (kvadvise.planner.repack; --no-hardware
    leaves the GPUs alone, not the CPU a CPU plan runs on), "off" with --no-repack."""
    if o.no_repack:
        return "off"
    from kvadvise.planner.repack import cpu_isa

    return cpu_isa()


def _calibration(gpu_name: str | None) -> tuple[MeasuredOverhead | None, tuple[str, ...]]:
    """The overhead ``verify --save-calibration`` measured on this machine's GPU, if any."""
    if gpu_name is None:
        return None, ()
    from kvadvise.runtime.calibration import measured_overhead

    return measured_overhead(gpu_name)


def show_plan(
    plan: Plan,
    o: PlanOptions,
    *,
    requested_ctx: int | None,
    extra_json: Callable[[Plan], JSONDoc] | None = None,
    extra_text: Callable[[Plan], str] | None = None,
    settings: Callable[[Plan], Sequence[str]] | None = None,
    settings_title: str = "Settings (llama.cpp)",
    command: Callable[[Plan], str | None] | None = None,
    write_chart: bool = True,
) -> NewFile | None:
    """The plan as text (and its chart) or as one JSON document with the command's own keys. The text is
        the summary (kvadvise.summary: the settings first, ``settings``; by default llama.cpp's flags), or with
        ``--verbose`` the whole estimate and ``extra_text``; ``command``, the program's command line, is the summary's last
    line (``| tail -1`` takes it, as it takes the verbose text's). ``write_chart=False``: the ``--chart-file`` image is
        returned, for the command to write it with its other files in one :func:`kvadvise.files.write_files`."""
    from kvadvise.render import plan_dict, plan_text

    if o.as_json:
        output.result_json(plan_dict(plan, requested_ctx) | (extra_json(plan) if extra_json else {}))
        return show_chart(plan, o, terminal=False, write=write_chart)
    if o.verbose:
        output.result(plan_text(plan, requested_ctx))
    else:
        from kvadvise.summary import VERBOSE_HINT, llama_flags, summary_text

        if command is not None:
            lines: Sequence[str] = ()
        elif settings is not None:
            lines = settings(plan)
        else:
            lines = [
                llama_flags(plan) if plan.runnable is not False else "no settings to apply: this plan does not fit"
            ]
        output.result(summary_text(plan, requested_ctx, settings_title=settings_title, settings=lines))
        output.line(VERBOSE_HINT)
        run = command(plan) if command is not None else None
        if run:
            output.line("Command:")
            output.line(run)
        elif command is not None:
            output.line("no command: this plan does not fit")
    chart = show_chart(plan, o, write=write_chart)
    if o.verbose and extra_text is not None:
        output.result(extra_text(plan))
    return chart


def show_chart(plan: Plan, o: PlanOptions, *, terminal: bool = True, write: bool = True) -> NewFile | None:
    """``--chart``: the chart in the terminal; ``--chart-file``: the same chart as an SVG or PNG image,
    written here, or returned (``write=False``) to be written with the command's other files."""
    if not (o.chart and terminal) and not o.chart_file:
        return None
    if plan.recommendation is None or plan.budget is None:
        output.note("no chart: it needs a budget (not --no-hardware) and a recommendation (no --ctx)")
        return None
    from kvadvise.planner.curves import curves
    from kvadvise.render import chart_text

    lines = curves(plan.spec, replace(plan.config, n_ctx=0), plan.budget, plan.recommendation.options)
    chosen = None
    if plan.fits:
        chosen = (plan.config.n_ctx // plan.config.n_parallel, plan.estimate.device_bytes)
    if o.chart and terminal:
        output.result("")
        output.result(chart_text(lines, plan.budget.budget_bytes, chosen=chosen))
    if not o.chart_file:
        return None
    from pathlib import Path

    from kvadvise.cli import chart

    title = f"{plan.spec.name or plan.spec.architecture}: memory against context ({plan.budget.source})"
    data = chart.render(
        lines, plan.budget.budget_bytes, chosen=chosen, title=title, suffix=Path(o.chart_file).suffix.lower()
    )
    if not write:
        return chart.new_file(o.chart_file, data)
    output.note(f"wrote {chart.write(o.chart_file, data)}")
    return None


def refuse_to_write_what_does_not_fit(plan: Plan, *paths: str | None, chart: NewFile | None = None) -> None:
    """Never write a config that does not run (the policy): say so, exit 3, leave the files as they are. A
    plan that does not fit the GPU but whose partial offload runs is written (as that offload). The
    ``chart`` (which shows why) is still written."""
    if plan.runnable is False and any(paths):
        if chart is not None:
            from kvadvise.files import write_files

            output.note(f"wrote {write_files([chart], force=False)[0]}")
        names = ", ".join(p for p in paths if p)
        why = "it does not fit the RAM" if plan.fits or plan.offload is not None else "this config does not fit"
        output.note(f"not written ({names}): {why} (see above)")
        raise click.exceptions.Exit(EXIT_NO_FIT)


def exit_if_no_fit(plan: Plan) -> None:
    """Exit 3 when no plan that runs was printed: it fits neither the GPU (with --gpu-only, or no partial
    offload fits) nor, for what does, the RAM. 0 = a runnable plan, on the GPU or partly on the CPU
    (``fits`` says which)."""
    if plan.runnable is False:
        raise click.exceptions.Exit(EXIT_NO_FIT)  # the output says why; the exit code says "does not fit"


def plan_command(
    name: str,
    help_text: str,
    load: Callable[[str], ModelSpec],
    *,
    options: tuple[Callable[[Callable[..., None]], Callable[..., None]], ...] = (),
) -> click.Command:
    """``kvadvise NAME MODEL [flags]``: plan a model a backend resolves. The generic command of every
    backend that brings none of its own (a third-party plugin gets exactly this). ``options``: more
    shared options the command takes (kvadvise.cli.options.MMPROJ_OPTION, DRAFT_OPTIONS: a draft
    model is loaded with ``load`` too)."""
    from kvadvise.cli.options import run_options

    @click.command(name=name, help=help_text)
    @click.argument("ref", metavar="MODEL")
    @run_options
    def command(ref: str, **kwargs: object) -> None:
        o = PlanOptions.take(kwargs)
        plan = build_plan(load(ref), o, draft=load(o.model_draft) if o.model_draft else None)
        show_plan(plan, o, requested_ctx=o.n_ctx)
        exit_if_no_fit(plan)

    for option in options:
        command = option(command)  # type: ignore[assignment]
    return command
