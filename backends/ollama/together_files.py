"""The files of several models on one server, each one writer (kvadvise.runtime.seam.Writer): the server's
env file (``--write-env``), the same set as a llama-server router preset (``--write-preset``), and a
Modelfile for each model that needs its own context (``--write-modelfiles DIR``). All are written by
kvadvise.runtime.seam.write_outputs: all or none, never over a file without --force."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.together import Together, routed
from kvadvise.errors import InputError
from kvadvise.runtime.seam import Writer
from kvadvise.ui import output

if TYPE_CHECKING:
    from kvadvise.backends.ollama.together import Combinations
    from kvadvise.files import NewFile


def env_text(t: Together) -> str:
    from kvadvise.backends.ollama.together_show import env_lines

    head = (
        "# Ollama server settings written by kvadvise: "
        + ", ".join(m.ref for m in t.models)
        + " stay loaded together.\n"
    )
    return head + "".join(f"{k}={v}\n" for k, v in env_lines(t))


def _env_hints(t: Together, path: Path) -> tuple[str, ...]:
    """How to start the server with the file on this machine: the app's steps on macOS and Windows (no shell
    sources the file there, and no systemd reads it), else the shell's and systemd's."""
    from kvadvise.backends.ollama import config as oc
    from kvadvise.backends.ollama.together_show import env_lines

    return oc.desktop_env_steps(env_lines(t), oc.current_platform()) or oc.apply_hint_env(path)


def _combinations(t: Together) -> Combinations:
    if t.combinations is None:  # kvadvise.backends.ollama.together_budget.plan_combinations, before writing
        raise ValueError("the router preset and the llama-swap config need the plan's combinations")
    return t.combinations


def budget_lines(c: Combinations) -> list[str]:
    """What the router's count and llama-swap's groups allow, in words: said in the output and written as
    comments of both files."""
    from kvadvise.backends.ollama.together_budget import names

    n = c.models_max
    if n == len(c.refs):
        out = [f"--models-max {n}: all {n} models fit in memory together"]
    elif n == 1:
        out = ["--models-max 1: each of these models fits alone, not every two together"]
    else:
        out = [f"--models-max {n}: any {n} of these models fit in memory together"]
    if c.over:
        out.append(
            f"not {n + 1}: the router counts models, not bytes, and "
            + "; ".join(names(x) for x in c.over)
            + " would not fit together"
        )
    if kept := c.kept_out():
        out.append(f"{'; '.join(names(x) for x in kept)} would fit together, but not under a count of {n}")
    if len(c.groups) > 1:
        out.append(
            "llama-swap groups (each loaded alone, its members together): " + "; ".join(names(g) for g in c.groups)
        )
    return out


_SWAPPING_FILES = {"--write-preset": "router preset", "--write-llama-swap": "llama-swap config"}


def check_names(t: Together, options: Iterable[str]) -> None:
    """Before anything is planned or printed: every model of the router preset or llama-swap config asked for
    (``options``) has a name of its own there (:func:`_one_section_each`)."""
    for option in options:
        if option in _SWAPPING_FILES:
            _one_section_each(t, _SWAPPING_FILES[option])


def _one_section_each(t: Together, what: str) -> None:
    """Refuse a file in which two models would answer to one name: the router's and llama-swap's name drops
    ``:latest`` and joins another tag with ``-`` (router.section_name), so qwen3:8b and qwen3-8b:latest are both
    qwen3-8b, and in the router's INI file the second section's keys would land on the first."""
    from kvadvise.runtime.router import section_name

    named: dict[str, str] = {}
    for m in t.models:
        other = named.setdefault(section_name(m.ref), m.ref)
        if other != m.ref:
            raise InputError(
                f"{other} and {m.ref} would both be {section_name(m.ref)} in the {what}",
                hint=f"give one of them another name first, e.g. ollama cp {m.ref} {section_name(m.ref)}-2",
            )


def preset_text(t: Together) -> str:
    from kvadvise.runtime.router import preset_text as text

    _one_section_each(t, "router preset")
    c = _combinations(t)
    together = "loaded together" if c.models_max == len(t.models) else "swapped by the router"
    header = "\n".join(
        [
            f"llama-server router preset written by kvadvise: {', '.join(m.ref for m in t.models)} {together}",
            *budget_lines(c),
        ]
    )
    # loaded at start: the first group's first models, as many as --models-max (more would be evicted at once)
    first = set(c.groups[0][: c.models_max]) if c.groups else set()
    return text([replace(r, load_on_startup=r.name in first) for r in routed(t)], header=header)


def _preset_hints(t: Together, path: Path) -> tuple[str, ...]:
    from kvadvise.runtime.router import router_command

    return (f"run it with: {router_command(str(path), _combinations(t).models_max)}",)


def llama_swap_text(t: Together) -> str:
    """llama-swap's config (kvadvise.runtime.llamaswap): each model's llama-server command as planned (its
    context, slots, cache type, batch, GPU), never unloaded for being idle, in groups that fit."""
    from kvadvise.runtime.llamaserver import server_args
    from kvadvise.runtime.llamaswap import FOREVER_TTL_S, SwapGroup, SwapModel, config_text
    from kvadvise.runtime.router import alias_names, section_name

    _one_section_each(t, "llama-swap config")
    c = _combinations(t)
    # never unloaded when idle, as the env file's OLLAMA_KEEP_ALIVE=-1 keeps the set loaded (together_show
    # env_lines); llama-swap still unloads a group when a model of another is asked for (exclusive)
    ttl = FOREVER_TTL_S
    models = []
    rs = routed(t)
    names = [r.name for r in rs]
    for r in rs:
        args: list[str] = ["llama-server"]
        comments: tuple[str, ...] = ()
        for flag, _var, value in server_args(r.path or f"/path/to/{section_name(r.name)}.gguf", r.config):
            args += [flag] if value is None else [flag, value]
        if r.path is None:
            comments = (f"no GGUF file of {r.name} on this machine: set the path of -m",)
        if r.device:
            args += ["-dev", r.device]
        if r.embedding:
            args.append("--embedding")
        models.append(SwapModel(section_name(r.name), tuple(args), ttl, comments, alias_names(r.aliases, names)))
    groups = [SwapGroup(f"together-{i + 1}", tuple(section_name(x) for x in g)) for i, g in enumerate(c.groups)]
    header = [
        f"llama-swap config written by kvadvise: {', '.join(m.ref for m in t.models)}",
        *budget_lines(c),
        "run it with: llama-swap --config THIS_FILE",
    ]
    return config_text(models, groups, header=header)


def _swap_hints(t: Together, path: Path) -> tuple[str, ...]:

    return (f"run it with: {shlex.join(['llama-swap', '--config', str(path)])}",)


WRITERS: tuple[Writer[Together], ...] = (
    Writer("--write-env", "Write the server's OLLAMA_* settings as an env file.", env_text, _env_hints),
    Writer(
        "--write-preset",
        "With several models: also write them as a llama-server router preset (--models-preset).",
        preset_text,
        _preset_hints,
    ),
    Writer(
        "--write-llama-swap",
        "With several models: also write them as a llama-swap config (a cmd each, groups that fit together).",
        llama_swap_text,
        _swap_hints,
    ),
)
SWAPPING_OPTIONS = tuple(_SWAPPING_FILES)  # files for models that need not all stay loaded
MODELFILES_OPTION = "--write-modelfiles"


def modelfiles(t: Together, folder: str) -> list[NewFile]:
    """A Modelfile for each model that needs its own context, named as ``ollama create`` names it."""
    from kvadvise.backends.ollama.config import modelfile_header
    from kvadvise.backends.ollama.modelfile import modelfile_text
    from kvadvise.backends.ollama.rules import OllamaSettings
    from kvadvise.backends.ollama.together_show import created_names
    from kvadvise.files import text_file

    s = t.final_settings
    by_ref = {m.ref: m for m in t.models}
    out = []
    for ref, name in created_names(t).items():
        m = by_ref[ref]
        n_par = sched.slots(m.spec, s.num_parallel)
        st = OllamaSettings(
            num_ctx=dict(t.contexts)[ref],
            num_parallel=n_par,
            kv_cache_type=s.kv_cache_type,
            flash_attention=s.flash_attention,
            full_offload=True,
            kv_cache=any(m.spec.kv_layers) or m.spec.has_recurrent,
        )
        header = modelfile_header(st, f"{ref} beside {', '.join(x for x in by_ref if x != ref)}")
        out.append(text_file(MODELFILES_OPTION, str(Path(folder) / f"{name}.Modelfile"), modelfile_text(m, st, header)))
    return out


def _make_folder(folder: Path) -> bool:
    """The --write-modelfiles folder, made when its parent exists (a typo deep in a path is not built); True when
    it was made here."""
    if folder.is_dir():
        return False
    if folder.parent.is_dir() and not folder.exists():
        try:
            folder.mkdir()
        except OSError:
            return False  # kvadvise.files.write_files says why, by name
        return True
    return False


def write(t: Together, paths: dict[str, str], *, force: bool) -> None:
    """Write what was asked for, all or none, and say how to apply each file."""
    from kvadvise.runtime.seam import write_outputs

    folder = paths.pop(MODELFILES_OPTION, None)
    extra = modelfiles(t, folder) if folder is not None else []
    made = extra and folder is not None and _make_folder(Path(folder).expanduser())
    if folder is not None and not extra:
        output.note(f"{MODELFILES_OPTION}: no model needs a context of its own: nothing to write there")
    inputs = tuple(m.spec.source for m in t.models)  # the models' blobs: never written over
    try:
        written = write_outputs(t, WRITERS, paths, force=force, extra=extra, inputs=inputs)
    except BaseException:
        if made and folder is not None:  # all or none: the folder made for files that were not written goes too
            with contextlib.suppress(OSError):
                Path(folder).expanduser().rmdir()
        raise
    for w in written:
        if w.option == MODELFILES_OPTION:
            name = w.path.name.removesuffix(".Modelfile")
            output.note(f"wrote {w.path}: ollama create {shlex.quote(name)} -f {shlex.quote(str(w.path))}")
            continue
        output.note(f"wrote {w.path}; apply it with:" if len(w.hints) > 1 else f"wrote {w.path}: " + "".join(w.hints))
        if len(w.hints) > 1:
            for h in w.hints:
                output.note_line(f"  {h}")
