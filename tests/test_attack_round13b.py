"""Round 13b of the red team (a reviewer in its own worktree): the README's quick start and docs/, run as a newcomer
copies them, with the typos and odd inputs a newcomer makes. Each test reproduces one defect of the current code,
where it fails; its docstring gives the command, what it said, and what a user expected (with the doc line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)

# --- 1. a card name kvadvise does not know is misread as NAMExN: "read as 1,080 cards of 'GT'" -------------------


@pytest.mark.parametrize("card", ["GTX 1080", "RX 6800", "RTX 4900", "RTX4900"])
def test_unknown_card_with_an_x_is_called_unknown_not_thousands_of_cards(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], card: str
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu "GTX 1080"` (a real card that is not in the list) says

        kvadvise: error: --gpu 'GTX 1080': read as 1,080 cards of 'GT'; NAMExN takes 1 to 15 cards, the count last
        kvadvise: hint: 1 to 15, e.g. rtx-3090x2

    and so do `--gpu "RX 6800"` ("6,800 cards of 'R'") and the typo `--gpu "RTX 4900"` ("4,900 cards of 'RT'"):
    the 'X' of GTX/RTX/RX followed by the model number is taken for the count of NAMExN. The same typo written
    `--gpu rtx-4900` gets the right answer: "unknown GPU profile 'rtx-4900'; did you mean rtx-4090, ...? hint:
    `kvadvise gpus` lists the known cards; or pass --vram SIZE". README: "The card is yours (NVML) or one you name
    with `--gpu` (`kvadvise gpus` lists them)"; the user typed one card, and the hint tells them to write a count
    instead of telling them the card is unknown and that `--vram 8GiB` plans it."""
    rc, _out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", card)
    one_line_input_error(rc, err)
    assert "cards of" not in err and "unknown GPU" in err, err


# --- 2. `gguf DIR --sort size` with a folder that does not exist: told to give a folder ----------------------------


def test_sort_on_a_missing_folder_says_the_folder_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/commands.md quotes `kvadvise gguf ~/models --gpu rtx-4060-ti --sort size`. A newcomer copies it where
    ~/models does not exist (or mistypes the folder): `kvadvise gguf /tmp/x/models --gpu rtx-4060-ti --sort size`
    says

        kvadvise: error: --sort orders the listing of a folder: give a folder of GGUF files

    exit 2: they did give a folder, and nothing says that it is missing. Without --sort the same path gets
    "/tmp/x/models: no such file". Expected: the missing path named (as without --sort; docs/exit-codes.md: exit 2
    for "a missing ... file"), not a complaint about --sort."""
    missing = tmp_path / "models"
    rc, _out, err = run(capsys, "gguf", str(missing), "--gpu", "rtx-4060-ti", "--sort", "size")
    one_line_input_error(rc, err)
    assert "no such" in err and str(missing) in err, err
