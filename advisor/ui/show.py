"""A plan on the screen and its files: what every planning command does once the core has answered
(kvadvise.entry.plan_for), built-in or brought by a backend. Commands only parse, call :func:`answer`
(or its parts) and exit with :func:`exit_if_no_fit`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from kvadvise.errors import EXIT_NO_FIT, InputError
from kvadvise.text import wrapped
from kvadvise.ui import output
from kvadvise.ui.flags import TEXT, View, one_path, take

if TYPE_CHECKING:
    from kvadvise.files import NewFile
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.planning import Plan
    from kvadvise.runtime.seam import Runtime, Writer, Written

JSONDoc = dict[str, object]


def show_plan(plan: Plan, view: View, *, requested_ctx: int | None, write_chart: bool = True) -> NewFile | None:
    """The plan as text (and its chart) or as one JSON document (the runtime's advice under its own key).
    The text is the summary (kvadvise.summary: the settings first: the runtime's, else llama.cpp's flags), or
    with ``--verbose`` the whole estimate and the runtime's advice. ``write_chart=False``: the ``--chart-file``
    image is returned, for the command to write it with its other files in one
    :func:`kvadvise.files.write_files`."""
    from kvadvise.render import plan_dict, plan_text

    if view.as_json:
        output.result_json(plan_dict(plan, requested_ctx))
        return show_chart(plan, view, terminal=False, write=write_chart)
    if plan.users is not None:  # --users N: the question asked, answered first
        from kvadvise.planner.users import answer_lines
        from kvadvise.summary import where_on

        answer = answer_lines(plan.users, where=where_on(plan).removeprefix(" on ") or "this card")
        output.result("\n".join(r for row in answer for r in wrapped(row)))
    if view.verbose:
        output.result(plan_text(plan, requested_ctx))
        chart = show_chart(plan, view, write=write_chart)
        if plan.advice is not None:
            output.result(plan.advice.text())
        return chart
    from kvadvise.summary import llama_flags, summary_text

    if plan.advice is not None:
        s = plan.advice.summary()
        text = summary_text(
            plan, requested_ctx, settings_title=s.title, settings=s.settings, notes=s.notes, sources=s.sources
        )
    else:
        flags = llama_flags(plan) if plan.runnable is not False else "no settings to apply: this plan does not fit"
        text = summary_text(plan, requested_ctx, settings_title="Settings (llama.cpp)", settings=[flags])
    output.result(text)
    return show_chart(plan, view, write=write_chart)


def show_tail(plan: Plan, view: View, paths: Sequence[tuple[str, str]] = ()) -> None:
    """The short answer's last lines: how to apply it (the runtime's steps, given the files asked for as
    (option, path)), the --verbose hint, and the program's command line last (``| tail -1`` takes it)."""
    if view.as_json or view.verbose:
        return
    from kvadvise.summary import VERBOSE_HINT

    command = None
    if plan.advice is not None:
        title, steps = plan.advice.next_steps(paths)
        if steps:
            output.result(title)
            for x in steps:
                output.line(f"  {x}")
        command = plan.advice.summary().command
    output.line(VERBOSE_HINT)
    if command is not None:
        if plan.runnable is not False:
            output.line("Command:")
        output.line(command)


def show_chart(plan: Plan, view: View, *, terminal: bool = True, write: bool = True) -> NewFile | None:
    """``--chart``: the chart in the terminal; ``--chart-file``: the same chart as an SVG or PNG image,
    written here, or returned (``write=False``) to be written with the command's other files."""
    if not (view.chart and terminal) and not view.chart_file:
        return None
    if plan.recommendation is None or plan.budget is None:
        output.note(
            "no chart: it needs a budget (a GPU found here, --gpu or --vram; not --no-hardware) and a "
            "recommendation (no --ctx)"
        )
        return None
    from kvadvise.planner.curves import curves
    from kvadvise.render import chart_text

    lines = curves(plan.spec, replace(plan.config, n_ctx=0), plan.budget, plan.recommendation.options)
    chosen = None
    if plan.fits:
        chosen = (plan.config.n_ctx // plan.config.n_parallel, plan.estimate.device_bytes)
    elif plan.offload is not None and plan.offload.runnable:  # the plan that runs: its GPU share, below the curves
        chosen = (plan.offload.n_ctx, plan.offload.device_bytes)
    if view.chart and terminal:
        output.result("")
        output.result(chart_text(lines, plan.budget.budget_bytes, chosen=chosen))
    if not view.chart_file:
        return None
    from pathlib import Path

    from kvadvise.ui import chart

    title = f"{plan.spec.name or plan.spec.architecture}: memory against context ({plan.budget.source})"
    data = chart.render(
        lines, plan.budget.budget_bytes, chosen=chosen, title=title, suffix=Path(view.chart_file).suffix.lower()
    )
    if not write:
        return chart.new_file(view.chart_file, data)
    from kvadvise.runtime.seam import read_files

    output.note(f"wrote {chart.write(view.chart_file, data, read_files(plan))}")
    return None


def refuse_to_write_what_does_not_fit(plan: Plan, *paths: str | None, chart: NewFile | None = None) -> None:
    """Never write a config that does not run (the policy): say so, exit 3, leave the files as they are. A
    plan that does not fit the GPU but whose partial offload runs is written (as that offload). The
    ``chart`` (which shows why) is still written."""
    if plan.runnable is False and any(paths):
        if chart is not None:
            from kvadvise.files import write_files
            from kvadvise.runtime.seam import read_files

            output.note(f"wrote {write_files([chart], force=False, inputs=read_files(plan))[0]}")
        names = ", ".join(p for p in paths if p)
        why = "it does not fit the RAM" if plan.fits or plan.offload is not None else "this config does not fit"
        output.note(f"not written ({names}): {why} (see above)")
        raise click.exceptions.Exit(EXIT_NO_FIT)


def write_plan_files(
    plan: Plan,
    writers: Sequence[Writer[Plan]],
    paths: Mapping[str, str | None],
    *,
    force: bool,
    chart: NewFile | None,
    hints: bool = True,
) -> tuple[Written, ...]:
    """The files the runtime writes (its writers, by option) and the chart: all or none, nothing for a plan
    that does not run (exit 3); each written file is named with how to apply it (``hints=False``: only
    named, where the answer's "Next" block says how, once)."""
    from kvadvise.runtime.seam import read_files, write_outputs

    offered = {w.option for w in writers}
    unwritten = [o for o, p in paths.items() if p is not None and o not in offered]
    if unwritten:  # asked for a file this runtime has none of: never exit 0 as if it were written
        raise InputError(
            f"{', '.join(unwritten)}: the {plan.config.runtime} runtime writes no such file",
            hint="llama-server's LLAMA_ARG_* env file: --runtime llama-server",
        )
    refuse_to_write_what_does_not_fit(plan, *paths.values(), chart=chart)
    extra = (chart,) if chart is not None else ()
    written = write_outputs(plan, writers, paths, force=force, extra=extra, inputs=read_files(plan))
    for w in written:
        if not hints:  # a warning among the hints (a conflicting override) is said all the same
            output.note(f"wrote {w.path}")
            for h in (h for h in w.hints if h.startswith("warning:")):
                output.note_line(f"  {h}")
            continue
        output.note(
            f"wrote {w.path}" + ("; apply it with:" if len(w.hints) > 1 else f": {w.hints[0]}" if w.hints else "")
        )
        if len(w.hints) > 1:
            for h in w.hints:
                output.note_line(f"  {h}")
    return written


def answer(
    plan: Plan,
    view: View,
    runtime: Runtime,
    *,
    requested_ctx: int | None,
    paths: Mapping[str, str | None] | None = None,
    force: bool = False,
) -> None:
    """The whole answer of a planning command: the plan, its files (the runtime's writers named in
    ``paths`` by option, and the chart), how to apply it, and exit 3 when no plan that runs was printed."""
    chart = show_plan(plan, view, requested_ctx=requested_ctx, write_chart=False)
    asked = {k: v for k, v in (paths or {}).items() if v is not None}  # an empty path is refused by name
    if asked or chart is not None:
        # the "Next" block below says how to apply the files, once: the notes then only name them
        steps = plan.advice.next_steps(())[1] if plan.advice is not None else ()  # the paths are not checked yet
        quiet = bool(steps) and not view.as_json and not view.verbose
        write_plan_files(plan, runtime.writers(), asked, force=force, chart=chart, hints=not quiet)
    show_tail(plan, view, tuple(asked.items()))
    exit_if_no_fit(plan)


def exit_if_no_fit(plan: Plan) -> None:
    """Exit 3 when no plan that runs was printed: it fits neither the GPU (with --gpu-only, or no partial
    offload fits) nor, for what does, the RAM. 0 = a runnable plan, on the GPU or partly on the CPU
    (``fits`` says which)."""
    if plan.runnable is False:
        raise click.exceptions.Exit(EXIT_NO_FIT)  # the output says why; the exit code says "does not fit"


def writer_options(writers: Sequence[Writer[Plan]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A runtime's writers as options (``--write-env PATH``...) and ``--force``, for its command."""

    def decorate(f: Callable[..., None]) -> Callable[..., None]:
        f = click.option(
            "--force",
            is_flag=True,
            help="Overwrite files that exist: all are replaced, or none; no copy of the old ones is kept.",
        )(f)
        for w in reversed(writers):  # the path is checked with the others before any is written (kvadvise.files)
            f = click.option(
                w.option, w.dest, metavar=w.metavar, type=TEXT, multiple=True, callback=one_path, help=w.help
            )(f)
        return f

    return decorate


def writer_paths(kwargs: dict[str, object], writers: Sequence[Writer[Plan]]) -> dict[str, str | None]:
    """Pop the writers' options out of click's ``kwargs``: their paths by option (``--write-env``)."""
    out: dict[str, str | None] = {}
    for w in writers:
        value = kwargs.pop(w.dest, None)
        out[w.option] = value if isinstance(value, str) else None
    return out


def plan_command(
    name: str,
    help_text: str,
    load: Callable[[str], ModelSpec],
    *,
    options: tuple[Callable[[Callable[..., None]], Callable[..., None]], ...] = (),
) -> click.Command:
    """``kvadvise NAME MODEL [flags]``: plan a model a backend resolves. The generic command of every
    backend that brings none of its own (a third-party plugin gets exactly this). ``options``: more
    shared options the command takes (kvadvise.ui.flags.MMPROJ_OPTION, DRAFT_OPTIONS: a draft
    model is loaded with ``load`` too)."""
    from kvadvise.ui.flags import run_options

    @click.command(name=name, help=help_text)
    @click.argument("ref", metavar="MODEL")
    @run_options
    def command(ref: str, **kwargs: object) -> None:
        from kvadvise.entry import plan_for
        from kvadvise.plugins import runtime as named

        f = take(kwargs, load=load)
        runtime = named(f.runtime)
        plan = plan_for(load(ref), f.request, runtime)
        answer(plan, f.view, runtime, requested_ctx=f.request.n_ctx)

    for option in options:
        command = option(command)  # type: ignore[assignment]
    return command
