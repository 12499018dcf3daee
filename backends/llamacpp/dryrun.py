"""Run llama.cpp's own no-allocation projection (``llama-fit-params -fitp on``) of a plan's config.

The binary is the one given (``--llama-fit-params``), the one beside the given ``--llama-server``, or
``llama-fit-params`` on PATH. It gets the flags llama-server would (kvadvise.runtime.llamaserver
server_args, common/arg.cpp: the same parser), less the projector and draft model it does not
project; ``-v`` makes its log print each compute buffer to 0.01 MiB. It allocates nothing: it runs on a
machine without the memory the plan needs, in about a second.
"""

from __future__ import annotations

from kvadvise.backends.llamacpp.childproc import find_tool, run
from kvadvise.errors import BackendUnreachable, DoesNotFit
from kvadvise.planner.memory import RunConfig
from kvadvise.runtime import dryrun
from kvadvise.runtime.llamaserver import server_args

BINARY = "llama-fit-params"
_NOT_PROJECTED = ("--mmproj", "-md", "-ngld", "-ctkd", "-ctvd")
# llama-server's flags llama-fit-params does not take (common/arg.cpp registers them for LLAMA_EXAMPLE_SERVER and
# not LLAMA_EXAMPLE_FIT_PARAMS, b11312: "error: invalid argument"); the caller plans the projection without them
REFUSED = ("-kvu", "--spec-type", "--spec-draft-n-max")


def find_binary(given: str | None, server: str | None) -> str:
    """--llama-fit-params, else beside --llama-server, else on PATH; BackendUnreachable (exit 4) when none."""
    if given:
        return given
    found = find_tool(BINARY, server)
    if found:
        return found
    raise BackendUnreachable(
        f"no {BINARY}: the dry run needs llama.cpp's tools/fit-params (built with llama-server)",
        hint=f"pass --llama-fit-params PATH, or put {BINARY} on PATH",
    )


def fit_params_args(model_path: str, cfg: RunConfig) -> list[str]:
    """llama-fit-params' command line for ``cfg``: llama-server's flags (one parser), projected, not fitted."""
    words: list[str] = []
    for flag, _, value in server_args(model_path, cfg):
        if flag in _NOT_PROJECTED or flag in REFUSED:
            continue
        words.append(flag)
        if value is not None:
            words.append(value)
    return [*words, "-fitp", "on", "-v"]


def project(binary: str, model_path: str, cfg: RunConfig, *, timeout_s: float) -> tuple[dryrun.Projected, ...]:
    """llama.cpp's projection of ``cfg`` per device and for the host; DoesNotFit (exit 3) when it fails."""
    code, out, err = run([binary, *fit_params_args(model_path, cfg)], timeout_s=timeout_s, what=BINARY)
    projected = dryrun.parse(out, err + out)
    if code != 0 or not projected:
        tail = " | ".join(line.strip() for line in (err or out).strip().splitlines()[-3:])
        said = f"(exit {code}): {tail[:400]}" if tail else f"(exit {code}, no output)"
        raise DoesNotFit(f"{BINARY} failed {said}", hint="run it by hand with the flags shown")
    return projected
