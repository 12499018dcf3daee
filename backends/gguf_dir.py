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

from kvadvise.errors import InputError, KvadviseError
from kvadvise.model import splits
from kvadvise.ui.flags import LIST_SORTS as SORTS

if TYPE_CHECKING:  # the listing's module loads only for a folder: `kvadvise gguf FILE` starts without it
    from pathlib import Path

    from kvadvise.model.spec import ModelSpec
    from kvadvise.ui.listing import Listed

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


def _read(folder: Path, path: Path, load: Callable[[str], ModelSpec]) -> Listed:
    from kvadvise.ui.listing import Listed

    shown = str(path.relative_to(folder))
    try:
        spec = load(str(path))
    except KvadviseError as e:
        return Listed(name=shown, source=str(path), size_bytes=_size(path), spec=None, error=e.message)
    return Listed(name=shown, source=str(path), size_bytes=_size(path), spec=spec)


def read_folder(folder: Path, files: list[Path], load: Callable[[str], ModelSpec]) -> list[Listed]:
    from kvadvise.ui import output

    out = []
    for done, f in enumerate(files, 1):
        out.append(_read(folder, f, load))
        if len(files) >= LONG_LISTING:
            output.progress(done, len(files), "reading headers")
    return out


# what only one model can take: a listing of a folder refuses it
_NOT_WITH_DIR = ("use", "target_ctx", "min_ctx", "allow_cpu", "mmproj", "draft", "users")


def list_folder(folder: Path, kwargs: dict[str, Any], sort: str, load: Callable[[str], ModelSpec]) -> None:
    from kvadvise.entry import hardware_of
    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.inventory import RunSettings
    from kvadvise.request import check
    from kvadvise.ui.flags import given_flags, take
    from kvadvise.ui.listing import show_listing, survey

    draft = kwargs.pop("model_draft", None)  # refused below, not read
    f = take(kwargs)
    r = f.request
    given = [*given_flags(f, _NOT_WITH_DIR), *(["--model-draft"] if draft else [])]
    if given:
        raise click.UsageError(f"a folder lists every model; {', '.join(given)} is for one model: give a file")
    check(r)
    if r.type_k and r.type_v and r.type_k != r.type_v:
        raise click.UsageError("a folder listing runs one cache type for K and V: give -ctk or -ctv")
    skipped: list[str] = []
    files = model_files(folder, skipped)
    if not files:
        raise InputError(
            f"{folder}: is a directory with no .gguf file in it or below it"
            + "".join(f"; skipped {s}" for s in skipped),
            hint="give a GGUF file, or a folder of GGUF models to list them",
        )
    settings = RunSettings(
        n_parallel=r.n_parallel,
        flash_attn=r.flash_attn != "off",
        cache_type=cache_type(r.type_k or r.type_v or "f16"),
        default_ctx=(r.n_ctx // r.n_parallel) if r.n_ctx else 0,
    )
    hw = hardware_of(r)
    models = read_folder(folder, files, load)
    budget, rows = survey(models, settings, hw, r.margin_bytes, headless=r.headless)
    show_listing(
        rows,
        budget,
        settings,
        sort=sort,
        as_json=f.view.as_json,
        show_loaded=False,
        extra_json={"folder": str(folder)},
        notes=[*(f"skipped {s}" for s in skipped), *(hw.notes if hw is not None else ())],
    )


def with_folder_listing(cmd: click.Command, load: Callable[[str], ModelSpec]) -> click.Command:
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
            if isinstance(ref, str) and not os.path.exists(os.path.expanduser(ref)):
                # the folder the user meant is missing: say so, as the same path without --sort does
                raise InputError(
                    f"{os.path.expanduser(ref)}: no such file or folder", hint="give a folder of GGUF files"
                )
            raise click.UsageError("--sort orders the listing of a folder: give a folder of GGUF files")
        return inner(**kwargs)

    help_text = (cmd.help or "") + (
        "\n\nMODEL may be a folder: every .gguf below it, one line each (--sort name|size|context, --json)."
    )
    return click.Command(
        cmd.name, params=params, callback=callback, help=help_text, context_settings=cmd.context_settings
    )
