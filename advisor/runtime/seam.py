"""The runtime seam: what a runtime changes about planning, as data and small methods.

A plan is for one program: llama-server (kvadvise.runtime.llamaserver), the library and its bindings
(kvadvise.runtime.library), or what a backend brings (Ollama: kvadvise.backends.ollama.runtime). One
planning entry (kvadvise.entry.plan_for) asks the runtime

- which flags it refuses (:attr:`Runtime.refused`: what it does not pass to llama.cpp),
- how it runs the request (:meth:`Runtime.shape`: Ollama's num_ctx per slot, its one cache type, its build),
- where it places the model (:meth:`Runtime.place`: Ollama's single GPU),
- what it adds to the plan (:meth:`Runtime.advise`: its settings and warnings),
- and which files it writes (:meth:`Runtime.writers`): one :class:`Writer` per file, so a new output
  file is one writer and one line in its runtime's ``writers()``.

A runtime is looked up by name with kvadvise.plugins.runtime (the built-in ones, then those of the
installed backends: kvadvise.plugins.RuntimeProvider).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, runtime_checkable

from kvadvise.errors import InputError
from kvadvise.request import FLAGS, PlanRequest

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from kvadvise.files import NewFile
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.planning import Plan
    from kvadvise.runtime.llamabuild import BuildChoice

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Shaped:
    """The request as a runtime runs it, and what that adds to the plan."""

    request: PlanRequest
    notes: tuple[str, ...] = ()  # said with the plan (Ollama: a num_ctx past the training context)
    extra_margin_bytes: int = 0  # kept free beyond the margin (Ollama: a projector's fit target)
    build: BuildChoice | None = None  # the llama.cpp build the runtime runs, when it pins one (Ollama's)
    weights_uncertain: bool = False  # the weights size is a published figure: keep 3 % of it free
    # the fewest tokens per slot the runtime runs, whatever it is asked (Ollama: a vision model's 2,048): a
    # recommended context is never below it (0: no floor)
    ctx_floor: int = 0
    # a partial plan may keep a MoE model's experts on the CPU (llama.cpp's --n-cpu-moe / --fit); False: the
    # runtime moves whole layers only (Ollama's runners before 0.30)
    expert_offload: bool = True
    # the output layer goes to the GPU first at a partial offload: None = as the build places it (llama.cpp before
    # builds.OUTPUT_FIRST: last); True = first whatever the build (Ollama's Go engine: its own layout)
    output_first: bool | None = None
    # the runtime's context keeps each output's embedding beside its logits (Ollama's llamarunner: params.embeddings)
    embeddings: bool = False
    # the last block whose experts stay on the CPU may keep its up and gate projections on the GPU: a command that
    # takes -ot (llama-server, llama-cli), or llama.cpp's --fit placing them itself (Ollama 0.30 on)
    expert_overflow: bool = False
    # the runtime picks -b = -ub itself from the whole context and the machine (Ollama >= 0.30's automatic num_batch):
    # the steps of RunConfig.auto_batch for the plan's hardware (None: the request's -b / -ub)
    auto_batch: Callable[[Hardware | None], tuple[tuple[int, int], ...]] | None = None
    # the model as the runtime loads it, where that is not the file as read (Ollama >= 0.30: a blob's own vision
    # tower loads as the projector, not as text weights); None: the file's
    spec: ModelSpec | None = None


def _no_hints(result: object, path: Path) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True, slots=True)
class Writer(Generic[R]):
    """One output file: the option that names its path, and its text from the result (a plan, or several
    models planned together). Written by kvadvise.files.write_files, with every other file of the command,
    all or none, never over a file without --force."""

    option: str  # the flag, "--write-env"
    help: str
    render: Callable[[R], str]
    hints: Callable[[R, Path], tuple[str, ...]] = _no_hints  # how to apply the file once written
    metavar: str = "PATH"

    @property
    def dest(self) -> str:
        """The click parameter name: ``--write-env`` -> ``write_env``."""
        return self.option.lstrip("-").replace("-", "_")


@runtime_checkable
class Runtime(Protocol):
    """What a runtime changes about planning."""

    name: str  # "llama-server", "llama-cli", "library", "ollama"

    @property
    def program(self) -> str:
        """Whose rules size the compute graph: "llama-server", "llama-cli" or "library" (RunConfig.runtime); a runtime
        may decide it by what it runs (Ollama: by its version)."""
        ...

    same_type_kv: bool  # one cache type for K and V (Ollama's OLLAMA_KV_CACHE_TYPE)
    refused: tuple[str, ...]  # PlanRequest fields it does not pass to llama.cpp
    refused_why: str  # said with a refusal: "Ollama does not pass it to llama-server"
    refused_hint: str  # what to do instead

    def shape(self, spec: ModelSpec, request: PlanRequest) -> Shaped: ...

    def place(self, plan: Plan, replan: Callable[[Hardware], Plan]) -> Plan: ...

    def advise(self, plan: Plan, request: PlanRequest) -> Plan: ...

    def writers(self) -> tuple[Writer[Plan], ...]: ...


class LlamaCppRuntime:
    """What the llama.cpp programs share: every flag is theirs, the request runs as given, placed as
    llama.cpp places it. A subclass names the program and brings its advice and files."""

    name = "llama-server"
    program = "llama-server"
    same_type_kv = False
    # optional (read with a default of True): its command states the layer split planned (-ts); Ollama's --fit
    # fills its own
    states_split = True
    # its command takes a tensor override (-ot): Shaped.expert_overflow
    takes_overrides = True
    refused: tuple[str, ...] = ()
    refused_why = ""
    refused_hint = ""

    def shape(self, spec: ModelSpec, request: PlanRequest) -> Shaped:
        # the file's default repeat penalty: llama-server and llama-cli sample with it (common.cpp); a CLI flag to
        # override it is not planned, so a file that sets one is planned with its cost
        if spec.sampling_penalty_repeat != 1.0 and not request.sampling_penalties:
            return Shaped(
                replace(request, sampling_penalties=True),
                expert_overflow=self.takes_overrides,
                notes=(
                    f"the file sets a repeat penalty of {spec.sampling_penalty_repeat:g} (general.sampling.penalty_repeat), "
                    "which llama.cpp samples with by default: a pass over the vocabulary on the CPU each token, counted "
                    "in the decode estimate (--repeat-penalty 1 avoids it)",
                ),
            )
        return Shaped(request, expert_overflow=self.takes_overrides)

    def place(self, plan: Plan, replan: Callable[[Hardware], Plan]) -> Plan:
        """Several GPUs and a plan that fits: on the card with the most free memory alone when the same
        context and cache types fit there (``-dev CUDA1``), as an expert runs it; llama.cpp would otherwise
        split the layers over every card it finds (llama_model::load_tensors, -sm layer), which decodes no faster for one
        sequence and holds memory on each. ``-ts`` asks for the split (kvadvise.entry: not placed then)."""
        hw = plan.hardware
        if hw is None or len(hw.gpus) < 2 or not plan.fits or plan.config.rpc_servers:
            return plan
        best = max(hw.gpus, key=lambda g: (g.free_bytes, -g.index))
        from kvadvise.planner.hardware import one_gpu

        alone = replan(one_gpu(hw, best))
        same = (alone.config.type_k, alone.config.type_v) == (plan.config.type_k, plan.config.type_v)
        if not alone.fits or alone.config.n_ctx < plan.config.n_ctx or not same:  # no less for one card
            return plan
        name = alone.estimate.devices[0].name  # as llama.cpp names the card (CUDA1, ROCm0): kvadvise.planner
        config = replace(alone.config, devices=(name,))
        note = (
            f"fits one GPU: -dev {name} keeps it on {best.name}, the other card(s) free "
            "(llama.cpp would split the layers over all of them; -ts splits it)"
        )
        return replace(alone, config=config, notes=(*alone.notes, note))

    def advise(self, plan: Plan, request: PlanRequest) -> Plan:
        return plan

    def writers(self) -> tuple[Writer[Plan], ...]:
        return ()


def refuse(runtime: Runtime, request: PlanRequest) -> None:
    """The flags ``runtime`` does not pass to llama.cpp, given anyway: refused, one message (exit 2)."""
    given = set(request.given())
    flags = ["/".join(reversed(FLAGS[f])) if f in FLAGS else f for f in runtime.refused if f in given]
    if flags:
        raise InputError(
            f"{', '.join(flags)}: llama.cpp only; {runtime.refused_why}", hint=runtime.refused_hint or None
        )


@dataclass(frozen=True, slots=True)
class Written:
    """A file kvadvise wrote, and how to apply it."""

    option: str  # the flag that named it ("--write-env"); "--chart-file" for the chart
    path: Path
    hints: tuple[str, ...]  # how to apply it


def write_outputs(
    result: R,
    writers: Sequence[Writer[R]],
    paths: Mapping[str, str | None],
    *,
    force: bool,
    extra: Sequence[NewFile] = (),
    inputs: Sequence[str] = (),
) -> tuple[Written, ...]:
    """The files of ``writers`` whose option has a path in ``paths`` (by option, ``--write-env``), and
    ``extra`` (the --chart-file image): all written or none, never over a file without ``force``, never over
    ``inputs`` (:func:`read_files`: the model and what came with it) at all (kvadvise.files.write_files, the
    one atomic write)."""
    from kvadvise.files import text_file, write_files

    chosen = [(w, paths[w.option]) for w in writers if paths.get(w.option) is not None]
    files = [*extra, *(text_file(w.option, str(p), w.render(result)) for w, p in chosen)]
    hints = {w.option: w.hints for w, _ in chosen}
    out = []
    for f, path in zip(files, write_files(files, force=force, inputs=inputs), strict=True):
        hint = hints.get(f.option)
        out.append(Written(f.option, path, hint(result, path) if hint is not None else ()))
    return tuple(out)


def read_files(plan: Plan) -> tuple[str, ...]:
    """The files a plan was read from, which no output may replace: the model (a GGUF path, an Ollama blob),
    its --mmproj projector and its -md draft model (a source that is no path names no file and is passed over)."""
    from kvadvise.model.splits import parse_name

    cfg = plan.config
    sources = [plan.spec.source]
    if cfg.mmproj is not None:
        sources.append(cfg.mmproj.source)
    if cfg.draft is not None:
        sources.append(cfg.draft.source)
    # a split GGUF is read from every part (llama_model_loader finds them by llama_split_path's names)
    out: list[str] = []
    for src in sources:
        split = parse_name(src)
        out += split.parts if split is not None else (src,)
    return tuple(out)
