"""The options every planning command shares, in llama.cpp's flag vocabulary, and what they become
before anything else runs: a :class:`kvadvise.request.PlanRequest` (the question, checked by the core
with the same messages the API gets) and a :class:`View` (how the answer is shown)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvadvise.errors import InputError
from kvadvise.planner.memory import RUNTIMES
from kvadvise.request import (
    DEVICES,
    FLASH_ATTN,
    INT_RANGES,
    KV_TYPES,
    MAX_GBS,
    SPEC_TYPES,
    USES,
    PlanRequest,
    check_split,
)
from kvadvise.units import parse_memory_size, parse_size, parse_tokens, port_number

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import RpcHost

F = TypeVar("F", bound=Callable[..., Any])
LIST_SORTS = ("name", "size", "context")  # how a listing of models is ordered (ollama --installed, gguf DIR)


# --- --rpc HOST:PORT=SIZE, as llama.cpp reads an endpoint -------------------------
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
    if not sep or not colon or not host or any(c.isspace() for c in host):
        raise InputError(f"--rpc {text!r}: not HOST:PORT=SIZE", hint=hint)
    _check_rpc_port(text, port, hint)
    # the endpoint as given: llama.cpp names the device by its text (RPC0[HOST:PORT], ggml-rpc.cpp
    # ggml_backend_rpc_buffer_type) and keys its connections by it, so 050052 is not rewritten to 50052
    return RpcHost(endpoint, parse_memory_size(size, "--rpc ...="))


def _check_rpc_port(text: str, port: str, hint: str) -> None:
    """The PORT of an ``--rpc`` endpoint as llama.cpp reads it (ggml-rpc.cpp ``parse_endpoint``: ``std::stoi``,
    base 10, so leading zeros are decimal and a ``+`` is a sign; then ``htons(port)`` in transport.cpp
    ``socket_t::connect``). Refused: no digits (llama.cpp aborts, "Failed to parse endpoint"), and what it
    would read as some other port without a word: text after the digits (stoi stops at it), a negative
    port or one past 65535 (htons keeps the low 16 bits), and 0 (nothing listens there)."""
    digits = port[1:] if port[:1] in ("+", "-") else port
    if not digits or not digits.isascii() or not digits[0].isdigit():
        raise InputError(f"--rpc {text!r}: not HOST:PORT=SIZE (the port is not a number)", hint=hint)
    lead = len(digits) - len(digits.lstrip("0123456789"))
    if lead < len(digits):
        raise InputError(
            f"--rpc {text!r}: the port has {digits[lead:]!r} after its digits; llama.cpp would read "
            f"{digits[:lead]} and ignore the rest (std::stoi)",
            hint=hint,
        )
    number = port_number(digits)  # None: more than 5 digits after the zeros, past 65535 all the same
    if port.startswith("-") or number is None or not 0 < number <= 65535:
        raise InputError(
            f"--rpc {text!r}: the port is not 1-65535 (llama.cpp would connect to another port: htons keeps 16 bits)",
            hint=hint,
        )


def parse_rpc_hosts(text: str) -> tuple[RpcHost, ...]:
    """``HOST:PORT=SIZE[,HOST:PORT=SIZE...]``: llama-server's ``--rpc`` takes a comma-separated list
    (common/arg.cpp ``add_rpc_devices``), so kvadvise's does too, each endpoint with the memory free on it."""
    parts = text.split(",")
    if len(parts) > 1 and not all("=" in p for p in parts):
        raise InputError(
            f"--rpc {text!r}: each HOST:PORT needs its own =SIZE",
            hint="e.g. --rpc 192.168.1.20:50052=24GiB,192.168.1.21:50052=16GiB",
        )
    return tuple(parse_rpc_host(p) for p in parts)


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
    """``HOST:PORT=SIZE[,...]`` -> :class:`kvadvise.planner.hardware.RpcHost` s (flattened by :func:`take`)."""

    name = "rpc"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[RpcHost, ...]:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]  # already converted (a default)
        try:
            return parse_rpc_hosts(value)
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


def one_path(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """A file option (``--write-env PATH``) given twice is refused: click keeps the last, and the first file
    asked for would silently not be written. Declared with ``multiple=True`` so the repeat can be seen."""
    if len(value) > 1:
        raise click.BadParameter(f"given {len(value)} times ({', '.join(value)}): one path, once", ctx, param)
    return value[0] if value else None


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` without ``nan`` and ``inf``: nan passes its bounds (every comparison with it is
    false) and reached the planner as an internal error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            finite = math.isfinite(float(value))
        except (TypeError, ValueError, OverflowError):
            finite = True  # not a number at all: FloatRange says so
        if not finite:
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(value, param, ctx)


class SizeListType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """Sizes separated by commas, one per GPU (``24GiB,16GiB``) -> a tuple of bytes (a card's memory:
    binary units only)."""

    name = "sizes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(VRAM_SIZE.convert(part, param, ctx) for part in str(value).split(","))


class SplitType(click.ParamType):  # type: ignore[type-arg]
    """llama.cpp's -ts: shares separated by commas or slashes (``3,1``) -> a tuple of floats, as llama-server
    splits them (common/arg.cpp ``-ts``: at ``[,/]+``); what it refuses is refused by the core
    (kvadvise.request.check_split), for the API too."""

    name = "split"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        parts = re.split(r"[,/]+", str(value).strip())
        if len(parts) > 1 and not parts[-1]:
            # `-ts 3,1,`: std::sregex_token_iterator gives no empty last part, so llama-server reads 3,1 (b11312);
            # an empty first part is read by std::stof and refused ("error while handling argument -ts: stof")
            parts.pop()
        try:
            shares = tuple(float(x) for x in parts)
        except ValueError:
            self.fail(f"{value!r}: shares separated by commas, e.g. 3,1 (each read as std::stof reads it)", param, ctx)
        try:
            check_split(shares)
        except InputError as e:
            self.fail(e.message.partition(": ")[2].replace(repr(shares), repr(value), 1), param, ctx)
        return shares


class TokensType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2 only
    """A token count as llama.cpp users write it: ``65536``, ``64k``, ``128K``, ``1m`` (k = 1,024 tokens),
    in the bounds of its request field (kvadvise.request.INT_RANGES)."""

    name = "tokens"

    def __init__(self, field: str) -> None:
        self.lo, self.hi = INT_RANGES[field]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        elif re.fullmatch(r"\s*-[0-9]{1,30}\s*", str(value)):  # a negative count: said as click's IntRange says it
            n = int(str(value))
        else:
            try:
                n = parse_tokens(str(value))
            except InputError as e:
                self.fail(e.message + (f" ({e.hint})" if e.hint else ""), param, ctx)
        if not self.lo <= n <= self.hi:
            self.fail(f"{n} is not in the range {self.lo}<=x<={self.hi}.", param, ctx)
        return n

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N|64k"


@dataclass(frozen=True, slots=True)
class View:
    """How an answer is shown: presentation, not part of the question."""

    as_json: bool = False  # --json: one JSON document
    verbose: bool = False  # --verbose: the whole estimate, every reason, the options table
    chart: bool = False  # --chart: memory against context, in the terminal
    chart_file: str | None = None  # --chart-file: the same chart as an image


@dataclass(frozen=True, slots=True)
class Flags:
    """The shared flags of one command line, parsed: the question, how to show the answer, the runtime."""

    request: PlanRequest
    view: View
    runtime: str = "llama-server"  # --runtime: llama-server or llama-cli (the library and the bindings)


_VIEW = ("as_json", "verbose", "chart", "chart_file")


def typed(names: Sequence[str]) -> frozenset[str]:
    """The parameters among ``names`` given on the command line (not left at their default nor read from the
    environment): a flag typed at its default value still overrides a runtime's own variable."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return frozenset()
    return frozenset(n for n in names if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE)


def given_flags(f: Flags, names: Sequence[str]) -> list[str]:
    """The flags among ``names`` (request fields) the user gave, as typed (``--ctx``), and a chart asked for:
    what a command that plans no single model refuses (a listing of many models, several models at once)."""
    from kvadvise.request import FLAGS

    given = set(f.request.given())
    out = [FLAGS[n][0] for n in names if n in given]
    if f.view.chart or f.view.chart_file:
        out.append("--chart" if f.view.chart else "--chart-file")
    return out


def take(kwargs: dict[str, Any], *, load: Callable[[str], ModelSpec] | None = None) -> Flags:
    """Pop the shared flags out of click's ``kwargs`` (what is left belongs to the command) and make the
    request. ``load``: the command's backend, which reads a --model-draft."""
    view = View(**{k: kwargs.pop(k) for k in _VIEW if k in kwargs})
    if view.chart_file:
        from kvadvise.ui.chart import check_path

        check_path(view.chart_file)
    runtime = kwargs.pop("runtime", "llama-server")
    no_repack = kwargs.pop("no_repack", False)
    model_draft = kwargs.pop("model_draft", None)
    values: dict[str, Any] = {f.name: kwargs.pop(f.name) for f in fields(PlanRequest) if f.name in kwargs}
    values["typed"] = typed(list(values))  # a flag typed at its default value is still asked for
    if values.get("tensor_split") is None:
        values.pop("tensor_split", None)
    if "rpc" in values:
        values["rpc"] = tuple(h for hosts in values["rpc"] or () for h in hosts)  # each --rpc: a list
    if no_repack:
        values["cpu_repack"] = "off"
    if model_draft:
        if load is None:
            raise InputError("--model-draft: this command cannot read a draft model")
        values["draft"] = load(model_draft)
    if "llama_build" in values and _check_env_build(values["llama_build"]):
        values["llama_build"] = "auto"  # entry reads KVADVISE_LLAMA_BUILD itself, as for the API, and says so
    return Flags(PlanRequest(**values), view, runtime)


def _check_env_build(value: object) -> bool:
    """KVADVISE_LLAMA_BUILD given through the option's envvar: checked naming the variable (as entry reads it
    for the API: kvadvise.runtime.llamabuild.check_env); True when the value came from it."""
    from click.core import ParameterSource

    from kvadvise.runtime.llamabuild import check_env

    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("llama_build") == ParameterSource.ENVIRONMENT:
        check_env(str(value))
        return True
    return False


def _int(field: str) -> click.IntRange:
    """A whole-number flag in the bounds of its request field (kvadvise.request.INT_RANGES)."""
    lo, hi = INT_RANGES[field]
    return click.IntRange(min=lo, max=hi)


# Options other commands share as they are (kvadvise compare)
PARALLEL_OPTION = click.option(
    "--parallel",
    "-np",
    "n_parallel",
    type=_int("n_parallel"),
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
    click.option(
        "--spec-type",
        "spec_type",
        type=click.Choice(SPEC_TYPES),
        default="none",
        show_default=True,
        help="draft-mtp: the model's own MTP/NextN head drafts (llama.cpp --spec-type draft-mtp): its layers load "
        "with the model and a second context holds their KV.",
    ),
    click.option(
        "--spec-draft-n-max",
        "spec_draft_n_max",
        type=_int("spec_draft_n_max"),
        default=3,
        show_default=True,
        help="Tokens drafted per step (llama.cpp --spec-draft-n-max): the target reserves logits for each.",
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


# --llama-build: the llama.cpp build a plan is for; kvadvise.runtime.llamabuild resolves it
LLAMA_BUILD_OPTION = click.option(
    "--llama-build",
    "llama_build",
    metavar="bNNNN|auto|unknown",
    default="auto",
    show_default=True,
    envvar="KVADVISE_LLAMA_BUILD",
    help="The llama.cpp build the plan is for (its memory rules): bNNNN, or what `llama-server --version` "
    "prints; auto = the llama-server on PATH (verify: the one it runs); unknown = the newest rules kvadvise "
    "models (b11312). Env: KVADVISE_LLAMA_BUILD.",
)


def _options(*, planned_hardware: bool) -> list[Callable[[F], F]]:
    opts = [
        click.option(
            "--ctx",
            "-c",
            "n_ctx",
            type=TokensType("n_ctx"),
            default=None,
            help="Context in tokens, total over all sequences (llama.cpp -c; 64k = 65,536: k is 1,024 tokens); "
            "0 = n_ctx_train. Without it, kvadvise recommends one, cache type and flash attention too.",
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
            type=click.Choice(FLASH_ATTN),
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
            type=_int("n_batch"),
            default=2048,
            show_default=True,
            help="Logical batch size.",
        ),
        click.option(
            "--ubatch",
            "-ub",
            "n_ubatch",
            type=_int("n_ubatch"),
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
            "slot (a build before b9467 the whole batch); llama-cli runs llama-server's context and reserves the "
            "same; library (llama-completion, llama-bench, llama-cpp-python, LM Studio) reserves them for the "
            "whole batch.",
        ),
        click.option(
            "--n-outputs-max",
            type=_int("n_outputs_max"),
            default=None,
            help="Logits rows the compute graph is reserved for (llama_context_params.n_outputs_max; 0 = the "
            "batch) [default: what --runtime gives].",
        ),
        click.option(
            "--device",
            type=click.Choice(list(DEVICES)),
            default="auto",
            show_default=True,
            help="Where the layers go: auto = the GPU when there is one (or --gpu/--vram), else the CPU; "
            "rocm, vulkan: the GPU's llama.cpp backend (buffers ROCm0/Vulkan0, that backend's speed factors), "
            "for a card given by --vram/--bandwidth or run through Vulkan.",
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
            type=TokensType("target_ctx"),
            default=0,
            help="Context per sequence to aim for (default: the model's maximum).",
        ),
        USE_OPTION,
        click.option(
            "--min-ctx",
            type=TokensType("min_ctx"),
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
            "--sampler-penalty",
            "sampling_penalties",
            is_flag=True,
            help="Your requests sample with a repeat, presence or frequency penalty (llama-server "
            "--repeat-penalty/--presence-penalty/--frequency-penalty, or Ollama's options): one more pass over "
            "the vocabulary on the CPU each token, counted in the decode estimate.",
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
            help="Write the same chart as an image (needs matplotlib: python3 -m pip install matplotlib).",
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
        click.option(
            "--json", "as_json", is_flag=True, help="Print one JSON object (keys: docs/json.md, schema: docs/schema/)."
        ),
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
            type=FiniteFloatRange(min=1, max=MAX_GBS),
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
                type=TokensType("prompt_tokens"),
                default=None,
                help="Time a prompt of this many tokens (the prefill estimate) [default: 4096 and the whole context].",
            ),
            click.option(
                "--users",
                "users",
                type=_int("users"),
                default=0,
                metavar="N",
                help="N concurrent sessions, each of the context per sequence (--target-ctx, --use, or --ctx per slot as "
                "the runtime reads it: llama-server's -c over all N, Ollama's num_ctx each): "
                "do they fit, at most how many would, with one slot each and with a unified cache (-kvu), and "
                "their decode; the plan is for -np N (and -kvu where it holds more) [default: not asked].",
            ),
            click.option(
                "--n-cpu-moe",
                "-ncmoe",
                "n_cpu_moe",
                type=_int("n_cpu_moe"),
                default=0,
                help="Keep the routed experts of the first N layers on the CPU, as llama.cpp's --n-cpu-moe: plan the "
                "GPUs' memory and the speed for that placement.",
            ),
        ]
    return opts


def gpu_list(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """``--gpu`` given more than once is a list, as ``--gpu A,B`` (else the last one would silently win)."""
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
            callback=gpu_list,
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
            metavar="HOST:PORT=SIZE[,...]",
            help="Plan over hosts of llama.cpp's RPC backend (rpc-server on each), SIZE free on each; a list "
            "or repeated.",
        ),
        click.option(
            "--bandwidth",
            "bandwidth_gbs",
            type=FiniteFloatRange(min=1, max=MAX_GBS),
            metavar="GB/S",
            help="With --vram: the card's memory bandwidth in GB/s, for the decode-speed estimate (e.g. 448).",
            default=None,
        ),
    ]
