"""A `--margin` the size of the card is refused (exit 2, docs/exit-codes.md): a mistyped unit, not a plan that does
not fit (exit 3). compare refuses it only when it is the largest card's size: a smaller card then does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (an autouse fixture)


def test_a_margin_of_the_whole_card_is_refused(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx3060-12gb", "--margin", "12GiB")
    one_line_input_error(rc, err)
    assert "--margin 12,288 MiB is the whole card (12,288 MiB)" in err and not out
    # a margin below the card is a plan (the small model fits beside 10 GiB kept free)
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx3060-12gb", "--margin", "10GiB", "--json")
    assert rc == 0 and json.loads(out)["fits"] is True, (rc, err)


def test_compare_refuses_only_a_margin_past_its_largest_card(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("compare", str(gemma_path), "--gpu", "rtx3060-12gb", "--gpu", "rtx4090", "--json")
    rc, out, err = run(capsys, *args, "--margin", "16GiB")
    assert rc == 0, err
    fits = {e["card"]: e["fits"] for e in json.loads(out)["entries"]}
    assert fits == {"rtx3060-12gb": False, "rtx4090": True}, fits
    rc, out, err = run(capsys, *args, "--margin", "24GiB")
    one_line_input_error(rc, err)
    assert "is the whole card (24,564 MiB)" in err
