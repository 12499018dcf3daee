"""The options every planning command shares, in llama.cpp's flag vocabulary, and the
frozen :class:`PlanOptions` they become before anything else runs."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvadvise.errors import InputError
from kvadvise.model.ggml import KV_CACHE_TYPES
from kvadvise.planner.memory import RUNTIMES
from kvadvise.units import parse_memory_size, parse_size

if TYPE_CHECKING:
    from kvadvise.planner.hardware import RpcHost

F = TypeVar("F", bound=Callable[..., Any])
KV_TYPES = tuple(t.type_name for t in KV_CACHE_TYPES)  # the one list: kvadvise.model.ggml
USES = ("chat", "code", "agent", "long")
LIST_SORTS = ("name", "size", "context")  # how a listing of models is ordered (ollama --installed, gguf DIR)


# --- --rpc HOST:PORT=SIZE, as llama.cpp reads an endpoint (issue 28, class 4) -------------------------
def parse_rpc_host(text: str) -> RpcHost:
    """``HOST:PORT=SIZE`` (``--rpc``): a host of llama.cpp's RPC backend and the memory free on it.

    What llama-server would refuse is refused here (llama.cpp 0c1e570): its ``--rpc`` splits its value at
    commas (common/arg.cpp ``add_rpc_devices``), so one endpoint per ``--rpc``; an endpoint's host is what
    comes before the first ``:`` (ggml/src/ggml-rpc/ggml-rpc.cpp ``parse_endpoint``) and is resolved as
    IPv4 (ggml-rpc/transport.cpp: ``gethostbyname``, ``AF_INET``), so an IPv6 address cannot be given."""
    from kvadvise.planner.hardware import RpcHost

    hint = "e.g. --rpc 192.168.1.20:50052=24GiB, one host per --rpc"
    endpoint, sep, size = text.partition("=")
    endpoint = endpoint.strip()
    if "," in endpoint:
        raise InputError(
            f"--rpc {text!r}: one HOST:PORT per --rpc (llama-server splits its --rpc at commas)", hint=hint
        )
    if endpoint.startswith("[") or endpoint.count(":") > 1:
        raise InputError(
            f"--rpc {text!r}: an IPv6 address; llama.cpp's RPC client takes the host up to the first ':' and "
            "connects over IPv4 (ggml-rpc parse_endpoint, gethostbyname)",
            hint="give the host's IPv4 address or a name that resolves to it",
        )
    host, colon, port = endpoint.partition(":")
    if (
        not sep
        or not colon
        or not host
        or any(c.isspace() for c in host)
        or not port.isdigit()
        or not 0 < int(port) <= 65535
    ):
        raise InputError(f"--rpc {text!r}: not HOST:PORT=SIZE", hint=hint)
    return RpcHost(f"{host}:{int(port)}", parse_memory_size(size, "--rpc ...="))


class SizeType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """A memory size (``24GiB``, ``24GB``, ``512M``) → bytes; ``allow_zero`` for margins; ``memory``: the
    memory a card or machine has, in binary units only (:func:`parse_memory_size`)."""

    name = "size"

    def __init__(self, *, allow_zero: bool = False, memory: str | None = None) -> None:
        self.allow_zero = allow_zero
        self.memory = memory

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            if self.memory is not None:
                return parse_memory_size(str(value), self.memory)
            return parse_size(str(value), allow_zero=self.allow_zero)
        except InputError as e:
            self.fail(e.message + (f" ({e.hint})" if e.hint else ""), param, ctx)


SIZE = SizeType()
SIZE_OR_ZERO = SizeType(allow_zero=True)
VRAM_SIZE = SizeType(memory="--vram")
RAM_SIZE = SizeType(memory="--ram")


class RpcHostType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """``HOST:PORT=SIZE`` -> :class:`kvadvise.planner.hardware.RpcHost`."""

    name = "rpc"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> RpcHost:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]  # already converted (a default)
        try:
            return parse_rpc_host(value)
        except InputError as e:
            self.fail(e.message + (f" ({e.hint})" if e.hint else ""), param, ctx)


class TextType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """A name or a path that says something: ``--gpu ""`` (an unset shell variable) was taken as no --gpu
    at all and planned this machine instead; a NUL byte (no file or host has one) ended in an internal
    error. Both are refused, exit 2."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = value if isinstance(value, str) else str(value)
        if not text.strip():
            self.fail("the value is empty", param, ctx)
        if "\x00" in text:
            self.fail(f"{text!a} holds a NUL byte", param, ctx)
        return text


TEXT = TextType()


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` without ``nan`` and ``inf``: nan passes its bounds (every comparison with it is
    false) and reached the planner as an internal error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class SizeListType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """Sizes separated by commas, one per GPU (``24GiB,16GiB``) -> a tuple of bytes (a card's memory:
    binary units only)."""

    name = "sizes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(VRAM_SIZE.convert(part, param, ctx) for part in str(value).split(","))


# float32's smallest normal number: std::stof throws out_of_range below it (strtof's ERANGE on underflow)
_FLT_MIN = 1.17549435e-38
_MAX_SHARES = 15  # common/arg.cpp -ts: "got %zu input configs, but system only has %zu devices" from 16


class SplitType(click.ParamType):  # type: ignore[type-arg]
    """llama.cpp's -ts: shares separated by commas or slashes (``3,1``) -> a tuple of floats.

    Only what llama-server takes (common/arg.cpp ``-ts``, 0c1e570): it splits at ``[,/]+``, refuses as many
    shares as llama_max_devices() (16), and reads each with ``std::stof``, which throws on a number float32
    cannot hold (``1e-45``: below its smallest normal number; ``1e39``). A share is printed back as ``%g``,
    so what is checked is that printed form."""

    name = "split"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        parts = re.split(r"[,/]+", str(value).strip())
        try:
            shares = tuple(float(x) for x in parts)
        except ValueError:
            self.fail(f"{value!r}: shares separated by commas, e.g. 3,1", param, ctx)
        if any(not math.isfinite(s) or not 0 <= s < 1e9 for s in shares) or not any(shares):
            self.fail(f"{value!r}: shares >= 0, not all 0, e.g. 3,1", param, ctx)
        tiny = [x for x in shares if x and float(f"{x:g}") < _FLT_MIN]
        if tiny:
            self.fail(
                f"{value!r}: llama-server reads each share as a float (std::stof) and refuses {tiny[0]:g}, "
                "below float32's smallest normal number; give shares such as 1,3",
                param,
                ctx,
            )
        if len(shares) > _MAX_SHARES:
            self.fail(f"{value!r}: {len(shares)} shares; llama-server takes at most {_MAX_SHARES}", param, ctx)
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
    rpc: tuple[RpcHost, ...] = ()
    no_repack: bool = False
    mmproj: str | None = None
    model_draft: str | None = None
    type_k_draft: str = "f16"
    type_v_draft: str = "f16"
    prompt_tokens: int | None = None
    n_cpu_moe: int = 0
    ram_bandwidth_gbs: float | None = None
    gpu_only: bool = False  # --gpu-only: 100 % on the GPU or nothing (no partial offload)
    ram_bytes: int | None = None  # --ram SIZE: the system RAM the plan may use
    llama_build: str = "auto"
    verbose: bool = False  # --verbose: the whole estimate, every reason, the options table (else the summary)

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
    type=TEXT,
    help="A multimodal projector (mmproj GGUF) llama-server loads beside the model (llama.cpp --mmproj): "
    "its weights and compute buffer on the first device.",
)


DRAFT_OPTIONS = (
    click.option(
        "--model-draft",
        "-md",
        "model_draft",
        metavar="MODEL",
        type=TEXT,
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
            type=TEXT,
            default=None,
            help="Write the same chart as an image (needs matplotlib: pip install 'kvadvise[chart]').",
        ),
        click.option(
            "--allow-cpu",
            is_flag=True,
            help="When the GPU alone reaches less than the target: also plan the target with part of the model "
            "on the CPU (a plan that does not fit the GPU at all gets one anyway).",
        ),
        click.option(
            "--gpu-only",
            is_flag=True,
            help="100% on the GPU or nothing: no partial offload; a plan that does not fit exits 3 and writes nothing.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in README.md)."),
        click.option(
            "--verbose",
            "-v",
            "verbose",
            is_flag=True,
            help="Print the whole estimate (every buffer per device), every reason and the options table.",
        ),
        click.option(
            "--ram-bandwidth",
            "ram_bandwidth_gbs",
            type=FiniteFloatRange(min=1, min_open=False),
            metavar="GB/S",
            default=None,
            help="System memory bandwidth for the speed of what runs on the CPU (experts or layers kept in RAM, a "
            "CPU plan) [default: measured once on this machine and cached].",
        ),
        LLAMA_BUILD_OPTION,
    ]
    if planned_hardware:
        opts += [
            click.option(
                "--prompt-tokens",
                "prompt_tokens",
                type=click.IntRange(min=1, max=2**31 - 1),
                default=None,
                help="Time a prompt of this many tokens (the prefill estimate) [default: 4096 and the whole context].",
            ),
            click.option(
                "--n-cpu-moe",
                "-ncmoe",
                "n_cpu_moe",
                type=click.IntRange(min=0, max=4096),
                default=0,
                help="Keep the routed experts of the first N layers on the CPU, as llama.cpp's --n-cpu-moe: plan the "
                "GPUs' memory and the speed for that placement.",
            ),
        ]
    return opts


def _gpu_list(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """``--gpu`` given more than once is a list, as ``--gpu A,B`` (issue 27: the last one silently won)."""
    if not value:
        return None
    if any(not v.strip() for v in value):
        raise click.BadParameter("an empty card name (see `kvadvise gpus`)", ctx=ctx, param=param)
    return ",".join(v.strip() for v in value)


def _vram_list(
    ctx: click.Context, param: click.Parameter, value: tuple[tuple[int, ...], ...]
) -> tuple[int, ...] | None:
    """``--vram`` given more than once is a list of budgets, as ``--vram 24GiB,16GiB``."""
    return tuple(n for sizes in value for n in sizes) if value else None


def _hardware_options(planned: bool) -> list[Callable[[F], F]]:
    if not planned:
        return []
    return [
        click.option(
            "--gpu",
            "gpu",
            metavar="NAME",
            type=TEXT,  # an empty name or a NUL byte: exit 2
            multiple=True,
            callback=_gpu_list,
            help="Plan for cards of the built-in list (`kvadvise gpus`): 4090; several: 4090,3090, rtx-3090x2 "
            "or --gpu 4090 --gpu 3090.",
        ),
        click.option(
            "--vram",
            "vram_bytes",
            type=SizeListType(),
            metavar="SIZE[,SIZE...]",
            multiple=True,
            callback=_vram_list,
            help="Plan for memory budgets given by hand, one per GPU: 24GiB, 24000MiB; 24GiB,16GiB (binary units).",
        ),
        click.option(
            "--ram",
            "ram_bytes",
            type=RAM_SIZE,
            metavar="SIZE",
            default=None,
            help="The system RAM the plan may use (64GiB) [default: what is free here now].",
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
            type=RpcHostType(),  # refuses an empty value and a NUL byte as TEXT does (not HOST:PORT=SIZE)
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
