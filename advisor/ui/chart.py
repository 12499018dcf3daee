"""``--chart-file FILE.svg|FILE.png``: the memory-against-context chart as an image, drawn with matplotlib
(the optional extra ``kvadvise[chart]``). The same data as the terminal chart: one curve per cache type,
the budget as one line, the recommended point marked."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.text import one_line

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

    from kvadvise.files import NewFile
    from kvadvise.planner.curves import Curve

FORMATS = (".svg", ".png")
GIB = 1 << 30


def check_path(path: str) -> None:
    """Refuse a name matplotlib would not write (before any planning)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"--chart-file {path}: give a .svg or .png file name", hint="e.g. --chart-file chart.svg")
    try:
        parent = Path(path).expanduser().parent
    except RuntimeError:  # ~user of no such user
        raise InputError(f"--chart-file {path}: no such user's home folder", hint="give the folder itself") from None
    if not os.path.isdir(parent):  # never raises: a folder that cannot be searched is not one to write in
        raise InputError(f"--chart-file {path}: no such directory {parent}", hint=f"mkdir -p {parent}")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:  # said before any plan is printed, not after it
        raise InputError("--chart-file needs matplotlib, which is not installed", hint=INSTALL_HINT)


# kvadvise is installed from a checkout, not from PyPI: the extra is named by the checkout's path
INSTALL_HINT = "python3 -m pip install matplotlib (or, in the kvadvise checkout: pip install '.[chart]'); --chart draws in the terminal"


def render(
    curves: tuple[Curve, ...], budget_bytes: int, *, chosen: tuple[int, int] | None, title: str, suffix: str
) -> bytes:
    """The chart as SVG or PNG bytes (1000 x 600 pixels at 100 dpi)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError("--chart-file needs matplotlib, which is not installed", hint=INSTALL_HINT) from None
    import warnings

    import matplotlib

    # Every label is plain text: a model named `$\foo$` is a title, not a formula matplotlib cannot parse
    # (mathtext raised ValueError: an internal error); a glyph the font lacks is drawn as a box, silently.
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _draw(Figure, curves, budget_bytes, chosen=chosen, title=one_line(title), suffix=suffix)


def _draw(
    figure: type[Figure],
    curves: tuple[Curve, ...],
    budget_bytes: int,
    *,
    chosen: tuple[int, int] | None,
    title: str,
    suffix: str,
) -> bytes:
    from kvadvise.render import curve_label

    fig = figure(figsize=(10, 6), dpi=100)
    ax = fig.add_subplot()
    for c in curves:
        ax.plot([x for x, _ in c.points], [b / GIB for _, b in c.points], label=curve_label(c), linewidth=2)
    ax.axhline(
        budget_bytes / GIB, color="black", linestyle="--", linewidth=1.5, label=f"budget {budget_bytes / GIB:.2f} GiB"
    )
    if chosen is not None:
        ax.plot(
            [chosen[0]],
            [chosen[1] / GIB],
            marker="*",
            markersize=16,
            color="red",
            linestyle="none",
            label=f"recommended: {chosen[0]:,} tokens, {chosen[1] / GIB:.2f} GiB",
        )
    ax.set_xlabel("context per sequence (tokens)")
    ax.set_ylabel("memory on the device (GiB)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    buf = io.BytesIO()
    fig.savefig(buf, format=suffix.lstrip("."), metadata={"Date": None} if suffix == ".svg" else None)
    return buf.getvalue()


def write(path: str, data: bytes, inputs: Sequence[str] = ()) -> Path:
    """Write the image atomically (an existing chart of that name is replaced, never one of ``inputs``: the
    files the plan was read from); no temporary file is left."""
    from kvadvise.files import write_files

    return write_files([new_file(path, data)], force=False, inputs=inputs)[0]


def new_file(path: str, data: bytes) -> NewFile:
    """The chart as one of the files a command writes together (kvadvise.files.write_files)."""
    from kvadvise.files import NewFile

    return NewFile("--chart-file", path, data, replace=True)
