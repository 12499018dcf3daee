"""The options every planning command shares, in llama.cpp's flag vocabulary, and the
frozen :class:`PlanOptions` they become before anything else runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from kvadvise.errors import InputError
from kvadvise.model.ggml import KV_CACHE_TYPES
from kvadvise.planner.memory import RUNTIMES

F = TypeVar("F", bound=Callable[..., Any])
KV_TYPES = tuple(t.type_name for t in KV_CACHE_TYPES)  # the one list: kvadvise.model.ggml
USES = ("chat", "code", "agent", "long")
LIST_SORTS = ("name", "size", "context")  # how a listing of models is ordered (ollama --installed, gguf DIR)


class SizeType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """A memory size (``24GiB``, ``24GB``, ``512M``) → bytes; ``allow_zero`` for margins."""

    name = "size"

    def __init__(self, *, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from kvadvise.planner.hardware import parse_size

        try:
            return parse_size(str(value), allow_zero=self.allow_zero)
        except InputError as e:
            self.fail(e.message + (f" ({e.hint})" if e.hint else ""), param, ctx)


SIZE = SizeType()
SIZE_OR_ZERO = SizeType(allow_zero=True)


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` without ``nan`` and ``inf``: nan passes its bounds (every comparison with it is
    false) and reached the planner as an internal error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class SizeListType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """Sizes separated by commas, one per GPU (``24GiB,16GiB``) -> a tuple of bytes."""

    name = "sizes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(SIZE.convert(part, param, ctx) for part in str(value).split(","))


class SplitType(click.ParamType):  # type: ignore[type-arg]
    """llama.cpp's -ts: shares separated by commas (``3,1``) -> a tuple of floats."""

    name = "split"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        try:
            shares = tuple(float(x) for x in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r}: shares separated by commas, e.g. 3,1", param, ctx)
        if any(not 0 <= s < 1e9 for s in shares) or not any(shares):
            self.fail(f"{value!r}: shares >= 0, not all 0, e.g. 3,1", param, ctx)
        return shares


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What the shared planning flags say, typed; built once from click's keyword arguments."""

    n_ctx: int | None
    type_k: str | None
    type_v: str | None
    flash_attn: str
    n_parallel: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    swa_full: bool
    device: str
    gpu: str | None
    vram_bytes: tuple[int, ...] | None
    bandwidth_gbs: float | None
    margin_bytes: int
    target_ctx: int
    use: str | None
    min_ctx: int
    repeatable: bool
    no_hardware: bool
    chart: bool
    chart_file: str | None
    allow_cpu: bool
    as_json: bool
    runtime: str = "llama-server"
    n_outputs_max: int | None = None
    allow_q4: bool = False
    headless: bool = False
    tensor_split: tuple[float, ...] = ()
    rpc: tuple[str, ...] = ()
    no_repack: bool = False
    mmproj: str | None = None
    model_draft: str | None = None
    type_k_draft: str = "f16"
    type_v_draft: str = "f16"
    llama_build: str = "auto"

    @classmethod
    def take(cls, kwargs: dict[str, Any]) -> PlanOptions:
        """Pop this class's fields out of ``kwargs`` (what is left belongs to the command).
        A command without --gpu/--vram (verify: it measures this machine) gets None for them."""
        from dataclasses import MISSING, fields

        absent: dict[str, Any] = {"gpu": None, "vram_bytes": None, "bandwidth_gbs": None}  # and defaults
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in kwargs:
                values[f.name] = kwargs.pop(f.name)
            elif f.default is MISSING:
                values[f.name] = absent[f.name]
        return cls(**values)


# Options other commands share as they are (kvadvise compare)
PARALLEL_OPTION = click.option(
    "--parallel",
    "-np",
    "n_parallel",
    type=click.IntRange(min=1, max=4096),
    default=1,
    show_default=True,
    help="Parallel sequences (slots).",
)
MARGIN_OPTION = click.option(
    "--margin",
    "margin_bytes",
    type=SIZE_OR_ZERO,
    metavar="SIZE",
    default="1024MiB",
    show_default=True,
    help="Memory kept free per GPU (llama.cpp --fit keeps 1024 MiB; 0 is allowed, as -fitt 0).",
)
USE_OPTION = click.option(
    "--use",
    "use",
    type=click.Choice(USES),
    default=None,
    help="Aim for a use case: chat 8k, code 32k, agent 64k, long = the model's maximum.",
)


MMPROJ_OPTION = click.option(
    "--mmproj",
    "mmproj",
    metavar="FILE",
    default=None,
    help="A multimodal projector (mmproj GGUF) llama-server loads beside the model (llama.cpp --mmproj): "
    "its weights and compute buffer on the first device.",
)


DRAFT_OPTIONS = (
    click.option(
        "--model-draft",
        "-md",
        "model_draft",
        metavar="MODEL",
        default=None,
        help="A draft model for speculative decoding (llama.cpp -md): its own context, as large as the model's, "
        "on the same devices.",
    ),
    click.option(
        "--cache-type-k-draft",
        "-ctkd",
        "type_k_draft",
        type=click.Choice(KV_TYPES),
        default="f16",
        show_default=True,
        help="The draft model's K cache type (llama.cpp -ctkd).",
    ),
    click.option(
        "--cache-type-v-draft",
        "-ctvd",
        "type_v_draft",
        type=click.Choice(KV_TYPES),
        default="f16",
        show_default=True,
        help="The draft model's V cache type (llama.cpp -ctvd).",
    ),
)


def draft_options(f: F) -> F:
    """-md, -ctkd, -ctvd: a draft model for speculative decoding."""
    for opt in reversed(DRAFT_OPTIONS):
        f = opt(f)
    return f


def run_options(f: F) -> F:
    """llama.cpp's own flag names for the run configuration."""
    for opt in reversed(_options(planned_hardware=True)):
        f = opt(f)
    return f


def measured_run_options(f: F) -> F:
    """As :func:`run_options` without --gpu and --vram: a run is measured on this machine's
    own hardware, so a card planned for cannot be measured (nor calibrated)."""
    for opt in reversed(_options(planned_hardware=False)):
        f = opt(f)
    return f


# --llama-build (issue 25): the llama.cpp build a plan is for; kvadvise.runtime.llamabuild resolves it
LLAMA_BUILD_OPTION = click.option(
    "--llama-build",
    "llama_build",
    metavar="bNNNN|auto|unknown",
    default="auto",
    show_default=True,
    envvar="KVADVISE_LLAMA_BUILD",
    help="The llama.cpp build the plan is for (its memory rules): bNNNN, or what `llama-server --version` "
    "prints; auto = the llama-server on PATH (verify: the one it runs); unknown = the largest figure of the "
    "builds kvadvise models. Env: KVADVISE_LLAMA_BUILD.",
)


def _options(*, planned_hardware: bool) -> list[Callable[[F], F]]:
    opts = [
        click.option(
            "--ctx",
            "-c",
            "n_ctx",
            type=click.IntRange(min=0, max=2**31 - 1),
            default=None,
            help="Context in tokens, total over all sequences (llama.cpp -c); 0 = n_ctx_train. "
            "Without it, kvadvise recommends one.",
        ),
        click.option(
            "--cache-type-k",
            "-ctk",
            "type_k",
            type=click.Choice(KV_TYPES),
            default=None,
            help="K cache type [default: f16, or recommended when --ctx is not given].",
        ),
        click.option(
            "--cache-type-v",
            "-ctv",
            "type_v",
            type=click.Choice(KV_TYPES),
            default=None,
            help="V cache type; quantized V needs flash attention [default: f16, or recommended].",
        ),
        click.option(
            "--flash-attn",
            "-fa",
            "flash_attn",
            type=click.Choice(["on", "off", "auto"]),
            default="auto",
            show_default=True,
            help="Flash attention.",
        ),
        PARALLEL_OPTION,
        click.option("--kv-unified", "-kvu", is_flag=True, help="One KV buffer shared by all sequences."),
        click.option(
            "--batch",
            "-b",
            "n_batch",
            type=click.IntRange(min=1, max=2**31 - 1),
            default=2048,
            show_default=True,
            help="Logical batch size.",
        ),
        click.option(
            "--ubatch",
            "-ub",
            "n_ubatch",
            type=click.IntRange(min=1, max=2**31 - 1),
            default=512,
            show_default=True,
            help="Physical batch size.",
        ),
        click.option("--swa-full", is_flag=True, help="Full-size cache for sliding-window layers."),
        click.option(
            "--runtime",
            type=click.Choice(RUNTIMES),
            default="llama-server",
            show_default=True,
            help="The program that runs the model: llama-server (and Ollama) reserves logits for one row per "
            "slot; llama-cli also stands for llama-bench, the library and its bindings (llama-cpp-python, "
            "LM Studio) and llama-servers built before mid-2026, which reserve them for the whole batch.",
        ),
        click.option(
            "--n-outputs-max",
            type=click.IntRange(min=0, max=2**31 - 1),
            default=None,
            help="Logits rows the compute graph is reserved for (llama_context_params.n_outputs_max; 0 = the "
            "batch) [default: what --runtime gives].",
        ),
        click.option(
            "--device",
            type=click.Choice(["auto", "cpu", "cuda", "metal"]),
            default="auto",
            show_default=True,
            help="Where the layers go: auto = the GPU when there is one (or --gpu/--vram), else the CPU.",
        ),
        click.option(
            "--no-repack",
            "-nr",
            "no_repack",
            is_flag=True,
            help="The CPU's weights are not repacked (llama.cpp -nr): no CPU_REPACK copies on a CPU plan.",
        ),
        *_hardware_options(planned_hardware),
        MARGIN_OPTION,
        click.option(
            "--target-ctx",
            type=click.IntRange(min=0, max=2**31 - 1),
            default=0,
            help="Context per sequence to aim for (default: the model's maximum).",
        ),
        USE_OPTION,
        click.option(
            "--min-ctx",
            type=click.IntRange(min=0, max=2**31 - 1),
            default=0,
            help="Fail (exit 3) if less than this fits per sequence.",
        ),
        click.option(
            "--repeatable",
            is_flag=True,
            help="Runs that repeat: an f16 cache only (quantized caches do not reproduce tokens exactly), and for "
            "Ollama also seed, temperature 0 and one slot in the Modelfile.",
        ),
        click.option(
            "--allow-q4",
            is_flag=True,
            help="Let the recommendation pick a q4_0 cache (a small-medium loss in precision; shown as an option "
            "either way).",
        ),
        click.option(
            "--headless",
            is_flag=True,
            help="No display on the GPU: keep no display allowance free on a single desktop card.",
        ),
        click.option("--no-hardware", is_flag=True, help="Do not look at this machine's GPUs: estimate only."),
        click.option(
            "--chart", is_flag=True, help="Draw memory against context for each cache type, with the budget, here."
        ),
        click.option(
            "--chart-file",
            "chart_file",
            metavar="FILE.svg|FILE.png",
            default=None,
            help="Write the same chart as an image (needs matplotlib: pip install 'kvadvise[chart]').",
        ),
        click.option(
            "--allow-cpu",
            is_flag=True,
            help="Also say how many layers or experts must stay on the CPU to reach the target.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in README.md)."),
        LLAMA_BUILD_OPTION,
    ]
    return opts


def _hardware_options(planned: bool) -> list[Callable[[F], F]]:
    if not planned:
        return []
    return [
        click.option(
            "--gpu",
            "gpu",
            metavar="NAME",
            help="Plan for cards of the built-in list (`kvadvise gpus`): 4090; several: 4090,3090 or rtx-3090x2.",
            default=None,
        ),
        click.option(
            "--vram",
            "vram_bytes",
            type=SizeListType(),
            metavar="SIZE[,SIZE...]",
            help="Plan for memory budgets given by hand, one per GPU: 24GiB, 24GB, 24000MiB; 24GiB,16GiB.",
            default=None,
        ),
        click.option(
            "--tensor-split",
            "-ts",
            "tensor_split",
            type=SplitType(),
            metavar="N,N,...",
            default=None,
            help="With several GPUs, each one's share of the layers (llama.cpp -ts) [default: by free memory].",
        ),
        click.option(
            "--rpc",
            "rpc",
            multiple=True,
            metavar="HOST:PORT=SIZE",
            help="Plan over hosts of llama.cpp's RPC backend (rpc-server on each), SIZE free on each; repeatable.",
        ),
        click.option(
            "--bandwidth",
            "bandwidth_gbs",
            type=FiniteFloatRange(min=1, min_open=False),
            metavar="GB/S",
            help="With --vram: the card's memory bandwidth in GB/s, for the decode-speed estimate (e.g. 448).",
            default=None,
        ),
    ]
