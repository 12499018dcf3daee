"""``kvadvise gguf DIR``: every GGUF model of a folder (and its subfolders), one line each, sized on
this GPU: headers only, through the header cache, one file after the other (a listing is mostly Python
work: threads only slowed it on 2 cores, benchmarks/bench_list.py). A split model is one line (its first
part); a file that cannot be read is a line with its error, never the end of the listing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kvadvise.cli.options import LIST_SORTS as SORTS
from kvadvise.errors import InputError, KvadviseError
from kvadvise.model import splits

if TYPE_CHECKING:  # the listing's module loads only for a folder: `kvadvise gguf FILE` starts without it
    from pathlib import Path

    from kvadvise.cli.listing import Listed

LONG_LISTING = 50  # a listing this long shows how far it is on a terminal's stderr


def model_files(folder: Path, skipped: list[str] | None = None) -> list[Path]:
    """The .gguf files of ``folder``, sorted; of a split model only its first part. A subfolder that cannot
    be read is added to ``skipped`` (kvadvise.files.files_below)."""
    from pathlib import Path

    from kvadvise.files import files_below

    found = files_below(folder, ".gguf")
    if skipped is not None:
        skipped.extend(found.skipped)
    out = []
    for p in found.files:
        name = splits.parse_name(p)
        if name is not None and name.number != 1:
            continue
        out.append(Path(p))
    return out


def _size(path: Path) -> int:
    name = splits.parse_name(str(path))
    parts = name.parts if name is not None else (str(path),)
    total = 0
    for p in parts:
        with contextlib.suppress(OSError):  # a missing part: the read says so
            total += os.stat(p).st_size
    return total


def _read(folder: Path, path: Path, load: Callable[[str], Any]) -> Listed:
    from kvadvise.cli.listing import Listed

    shown = str(path.relative_to(folder))
    try:
        spec = load(str(path))
    except KvadviseError as e:
        return Listed(name=shown, source=str(path), size_bytes=_size(path), spec=None, error=e.message)
    return Listed(name=shown, source=str(path), size_bytes=_size(path), spec=spec)


def read_folder(folder: Path, files: list[Path], load: Callable[[str], Any]) -> list[Listed]:
    from kvadvise.cli import output

    out = []
    for done, f in enumerate(files, 1):
        out.append(_read(folder, f, load))
        if len(files) >= LONG_LISTING:
            output.progress(done, len(files), "reading headers")
    return out


_NOT_WITH_DIR = {
    "use": "--use",
    "target_ctx": "--target-ctx",
    "min_ctx": "--min-ctx",
    "allow_cpu": "--allow-cpu",
    "chart": "--chart",
    "chart_file": "--chart-file",
    "mmproj": "--mmproj",
    "model_draft": "--model-draft",
}


def list_folder(folder: Path, kwargs: dict[str, Any], sort: str, load: Callable[[str], Any]) -> None:
    from kvadvise.cli.listing import show_listing, survey
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.inventory import RunSettings
    from kvadvise.planner.planning import HardwareRequest, hardware_for

    given = [flag for key, flag in _NOT_WITH_DIR.items() if kwargs.get(key)]
    if given:
        raise click.UsageError(f"a folder lists every model; {', '.join(given)} is for one model: give a file")
    if kwargs.get("gpu") and kwargs.get("vram_bytes") is not None:
        raise click.UsageError("give --gpu or --vram, not both")
    tk, tv = kwargs.get("type_k"), kwargs.get("type_v")
    if tk and tv and tk != tv:
        raise click.UsageError("a folder listing runs one cache type for K and V: give -ctk or -ctv")
    skipped: list[str] = []
    files = model_files(folder, skipped)
    if not files:
        raise InputError(
            f"{folder}: is a directory with no .gguf file in it or below it"
            + "".join(f"; skipped {s}" for s in skipped),
            hint="give a GGUF file, or a folder of GGUF models to list them",
        )
    n_parallel = int(kwargs.get("n_parallel") or 1)
    n_ctx = kwargs.get("n_ctx")
    settings = RunSettings(
        n_parallel=n_parallel,
        flash_attn=kwargs.get("flash_attn") != "off",
        cache_type=cache_type(tk or tv or "f16"),
        default_ctx=(n_ctx // n_parallel) if n_ctx else 0,
    )
    hw = hardware_for(
        HardwareRequest(gpu=kwargs.get("gpu"), vram_bytes=kwargs.get("vram_bytes"), probe=not kwargs.get("no_hardware"))
    )
    models = read_folder(folder, files, load)
    budget, rows = survey(
        models, settings, hw, int(kwargs.get("margin_bytes") or 0), headless=bool(kwargs.get("headless"))
    )
    show_listing(
        rows,
        budget,
        settings,
        sort=sort,
        as_json=bool(kwargs.get("as_json")),
        show_loaded=False,
        extra_json={"folder": str(folder)},
        notes=[*(f"skipped {s}" for s in skipped), *(hw.notes if hw is not None else ())],
    )


def with_folder_listing(cmd: click.Command, load: Callable[[str], Any]) -> click.Command:
    """``kvadvise gguf``'s command, which lists a folder when MODEL is one (``--sort`` added)."""
    params = [
        *cmd.params,
        click.Option(
            ["--sort"],
            type=click.Choice(SORTS),
            default=None,
            help="When MODEL is a folder: name (default), size (largest first) or context (longest f16 first).",
        ),
    ]
    inner: Callable[..., Any] = cmd.callback  # type: ignore[assignment]

    def callback(**kwargs: Any) -> Any:
        sort = kwargs.pop("sort")
        ref = kwargs.get("ref")
        if isinstance(ref, str) and os.path.isdir(os.path.expanduser(ref)):
            from pathlib import Path  # a folder only: pathlib stays off the start-up of `kvadvise gguf FILE`

            kwargs.pop("ref")
            return list_folder(Path(ref).expanduser(), kwargs, sort or "name", load)
        if sort:
            raise click.UsageError("--sort orders the listing of a folder: give a folder of GGUF files")
        return inner(**kwargs)

    help_text = (cmd.help or "") + (
        "\n\nMODEL may be a folder: every .gguf below it, one line each (--sort name|size|context, --json)."
    )
    return click.Command(
        cmd.name, params=params, callback=callback, help=help_text, context_settings=cmd.context_settings
    )
