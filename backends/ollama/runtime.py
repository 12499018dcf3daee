"""Ollama as a runtime (kvadvise.runtime.seam): what Ollama changes about a plan.

Which Ollama (``--ollama-version``, else the server's /api/version, else the newest) decides the runner and
the llama.cpp it carries (kvadvise.backends.ollama.versions): from 0.30 llama-server, as below; 0.11 to 0.24
a runner inside Ollama's binary, planned as the llama.cpp library at the vendored commit's rules (the
logits of the whole batch, num_batch as its -b/-ub, its flash-attention default). For Ollama >= 0.30:

- ``num_ctx`` is the context of one slot: llama-server gets ``-c num_ctx × num_parallel``, at most the
  training context (llm/llama_server.go, llm/server.go);
- one ``OLLAMA_KV_CACHE_TYPE`` for K and V, server-wide: any type llama-server takes from 0.30 (passed through), f16,
  q8_0 and q4_0 before;
- llama.cpp's own knobs it does not pass (``-kvu``, ``--swa-full``, ``-ub`` apart from ``num_batch``,
  ``-ts``, ``--rpc``, ``--n-cpu-moe``, a projector or draft of the user's) are refused;
- the llama.cpp build it vendors (kvadvise.runtime.llamabuild.OLLAMA_BUILD), not the one on PATH;
- a store model's projector (an mmproj GGUF) planned on the first GPU, and its fit target kept free;
- on several GPUs, the best single GPU when the model fits in 80 % of its free memory
  (server/sched.go selectLlamaServerPlacement);
- its advice (kvadvise.backends.ollama.advice) and its files: a Modelfile, an env file, a systemd drop-in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import rules, scheduler, towers
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.versions import blob_architecture
from kvadvise.errors import ConfigError, InputError
from kvadvise.request import PlanRequest
from kvadvise.runtime.seam import Shaped, Writer

if TYPE_CHECKING:
    from kvadvise.backends.ollama.advice import OllamaAdvice
    from kvadvise.backends.ollama.mlx import RunnerPlan
    from kvadvise.backends.ollama.versions import OllamaRelease
    from kvadvise.model.projector import ProjectorSpec
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware
    from kvadvise.planner.planning import Plan
    from kvadvise.runtime.llamabuild import BuildChoice

# llama.cpp knobs Ollama does not pass to llama-server (memory-spec §6.a): a plan with them would not be
# what Ollama runs. --batch is Ollama's num_batch (-b and -ub equal), so only -ub apart from it is refused.
LLAMACPP_ONLY: tuple[str, ...] = (
    "kv_unified",
    "swa_full",
    "n_ubatch",
    "n_outputs_max",
    "tensor_split",
    "rpc",
    "n_cpu_moe",  # Ollama places the experts itself (its own fit), with no such setting
    "mmproj",  # Ollama passes the projector of the model's own store entry
    "draft",
    "type_k_draft",
    "type_v_draft",
    # Ollama turns MTP on itself, from the model's draft_num_predict (OllamaRuntime.shape, appendDraftArgs)
    "spec_type",
    "spec_draft_n_max",
)


# the choices of `kvadvise ollama`'s options (backends/ollama/commands.py), and the API's OllamaRuntime's
PLATFORMS = ("auto", "linux", "macos", "windows", "docker")
RUNNERS = ("auto", "llamacpp", "mlx")
MLX_QUANTS = ("nvfp4", "mxfp4", "int4", "mxfp8", "int8", "bf16")


def _check_options(host: object, platform: object, runner: object, ollama_version: object, mlx_quant: object) -> None:
    """The API's options refused as click refuses the command's flags (one line, exit 2): OllamaRuntime(host=5)
    and ollama_version=11 ended in AttributeError (exit 1), runner="bogus" in a word about Apple Silicon."""
    from kvadvise.errors import InputError

    for flag, value, choices in (("--platform", platform, PLATFORMS), ("--runner", runner, RUNNERS),
                                 ("--mlx-quant", mlx_quant, MLX_QUANTS)):  # fmt: skip
        if value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            raise InputError(f"Invalid value for '{flag}': {str(value)[:60]!r} is not one of {listed}.")
    for flag, value in (("--host", host), ("--ollama-version", ollama_version)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"Invalid value for '{flag}': expected a str, got {type(value).__name__} {value!r:.60}")


# Ollama plans the llama.cpp build its release carries (kvadvise.backends.ollama.versions), never one named by hand
LLAMA_BUILD_REFUSED = (
    "--llama-build: Ollama runs the llama.cpp its release carries; --ollama-version X.Y.Z names the release"
)


class OllamaRuntime:
    """Ollama, for one model (``model``: its projector, its own num_ctx, where it was found) or for a bare
    spec (the API given a ModelSpec). ``host``: the server whose state (/api/ps, its version) the advice
    reads; ``platform``: how the apply steps are written (auto: this machine's); ``server_default``: also
    set OLLAMA_CONTEXT_LENGTH; ``live``: ask the server at all. On Apple Silicon (a Metal plan) the advice
    names the runner that loads the model (kvadvise.backends.ollama.mlx): ``runner`` (auto | llamacpp | mlx)
    forces one, ``mlx_quant`` the MLX type of the tag. ``ollama_version``: the Ollama the plan is for (else
    the server's /api/version when ``live``, else the newest): its runner and llama.cpp
    (kvadvise.backends.ollama.versions)."""

    name = "ollama"
    same_type_kv = True
    states_split = False  # llama-server's --fit splits the layers itself (llm/llama_server.go passes no -ts)
    refused = LLAMACPP_ONLY
    refused_why = "Ollama does not pass it to llama-server"
    refused_hint = "use `kvadvise llamacpp` for a llama-server plan; Ollama's num_batch is --batch"

    def __init__(
        self,
        model: OllamaModel | None = None,
        *,
        host: str | None = None,
        platform: str = "auto",
        server_default: bool = False,
        live: bool = True,
        runner: str = "auto",
        ollama_version: str | None = None,
        mlx_quant: str = "nvfp4",
    ) -> None:
        _check_options(host, platform, runner, ollama_version, mlx_quant)
        self.model = model
        self.host = host
        self.platform = platform
        self.server_default = server_default
        self.live = live
        self.runner = runner
        self.ollama_version = ollama_version
        self.mlx_quant = mlx_quant
        self._release: OllamaRelease | None = None  # the release shape() planned for
        # the VRAM of every GPU the server sees (place(): before the plan is put on one of them), by which Ollama
        # picks its default context (server/routes.go)
        self._server_vram_bytes: int | None = None
        self._server_version: tuple[str | None] | None = None  # /api/version, read once
        self._num_batch = 0  # the num_batch an in-process runner was planned with
        self._fit_raise_bytes = 0  # what Ollama itself adds to LLAMA_ARG_FIT_TARGET for a projector (shape())

    def for_model(self, ref: str) -> tuple[ModelSpec, OllamaRuntime]:
        """``ref`` resolved as `kvadvise ollama REF` resolves it (on ``host``), and this runtime's options bound to
        that model (kvadvise.plugins.BindsModel): the API's way to ask with --ollama-version, --runner, ..."""
        from kvadvise.backends.ollama import api
        from kvadvise.backends.ollama.resolve import resolve

        with api.session():
            model = resolve(ref, host=self.host)
        return model.spec, OllamaRuntime(
            model,
            host=self.host,
            platform=self.platform,
            server_default=self.server_default,
            live=self.live,
            runner=self.runner,
            ollama_version=self.ollama_version,
            mlx_quant=self.mlx_quant,
        )

    @property
    def program(self) -> str:
        """Whose rules size the compute graph (RunConfig.runtime): llama-server for Ollama >= 0.30, the
        library's (whole-batch logits) for the runners inside Ollama's binary (0.11 to 0.24)."""
        return self._release.program if self._release is not None else "llama-server"

    def release(self, architecture: str) -> OllamaRelease:
        """The Ollama release the plan is for: --ollama-version, else the server's /api/version (when it
        answers), else unknown (the newest)."""
        from kvadvise.backends.ollama import versions
        from kvadvise.backends.ollama.api import parse_version

        if self.ollama_version:
            return versions.release(self.ollama_version, architecture, found_by="--ollama-version")
        version = self.server_version()
        if version is not None and parse_version(version) is None:  # a server's odd version: not known
            version = None
        return versions.release(version, architecture, found_by="/api/version")

    def server_version(self) -> str | None:
        """The server's /api/version, asked once (None: not live, no answer, or no version)."""
        if self._server_version is None:
            self._server_version = (None,)
            if self.live:
                from kvadvise.backends.ollama import api as ollama_api
                from kvadvise.errors import BackendUnreachable

                try:
                    with ollama_api.session():
                        self._server_version = (ollama_api.server_version(self.host),)
                except BackendUnreachable:
                    pass
        return self._server_version[0]

    def _model(self, spec: ModelSpec) -> OllamaModel:
        if self.model is not None:
            return self.model
        name, _, tag = (spec.name or spec.architecture).partition(":")
        return OllamaModel(name, tag or "latest", spec, {}, 0, spec.weights_bytes, f"spec:{spec.source}")

    def shape(self, spec: ModelSpec, request: PlanRequest) -> Shaped:
        if request.llama_build != "auto":  # the command refuses --llama-build too (commands.py), the API here
            raise InputError(
                LLAMA_BUILD_REFUSED, hint="leave llama_build out (or 'auto') for Ollama; give ollama_version"
            )
        model = self._model(spec)
        rel = self._release = self.release(blob_architecture(spec.architecture, model.source))
        kv = rules.one_cache_type(request.type_k, request.type_v)
        if kv and rel.in_process and kv not in rules.KV_CACHE_TYPES:
            # v0.20.0:llm/server.go: "unsupported OLLAMA_KV_CACHE_TYPE" (GGML.SupportsKVCacheType), and f16 runs
            raise ConfigError(
                f'Ollama {rel.version} does not take OLLAMA_KV_CACHE_TYPE={kv}: it warns "unsupported '
                'OLLAMA_KV_CACHE_TYPE" and runs an f16 cache',
                hint="f16, q8_0 or q4_0 (any llama-server type from Ollama 0.30)",
            )
        r = replace(request, type_k=kv, type_v=kv)
        notes: tuple[str, ...] = ()
        auto_batch: Callable[[Hardware | None], tuple[tuple[int, int], ...]] | None = None
        # getRunner's floors (rules.run_num_ctx): 4 tokens in every release kvadvise knows (v0.11.0 has it), 2,048
        # for a vision model from 0.11.5
        vision = rules.is_vision(model) and (rel.v is None or rel.v >= rules.VISION_MIN_FROM)
        # a recommended num_ctx is never below what getRunner runs (per slot: llama_n_ctx multiplies by the slots)
        ctx_floor = rules.run_num_ctx(0, vision=vision)
        if r.n_ctx:  # num_ctx per slot; past the training context Ollama runs the training context (llm/server.go)
            num_ctx = rules.run_num_ctx(r.n_ctx, vision=vision)
            warning = rules.too_large_warning(num_ctx, spec.n_ctx_train)
            notes = (warning,) if warning else ()
            if num_ctx != r.n_ctx:
                runs = "a vision model with" if vision else "a model with"
                notes = (
                    *notes,
                    f"num_ctx {r.n_ctx:,}: Ollama runs {runs} at least {num_ctx:,} tokens (server/sched.go "
                    f"getRunner), so {num_ctx:,} are planned",
                )
            r = replace(r, n_ctx=rules.llama_n_ctx(rules.capped_num_ctx(num_ctx, spec.n_ctx_train), r.n_parallel))
        if rel.in_process:
            r, self._num_batch, said = in_process_request(spec, r, rel)
            notes = (*notes, *said)
        else:  # llm/llama_server.go appendBatchArgs: num_batch as -b N -ub N (--batch, else the model's own)
            own = model.params.get("num_batch")
            if "n_batch" in r.given():
                r = replace(r, n_ubatch=r.n_batch)
            elif isinstance(own, int) and not isinstance(own, bool) and own > 0:
                r = replace(r, n_batch=own, n_ubatch=own)
                notes = (*notes, f"the model's own num_batch {own}: Ollama runs it as -b {own} -ub {own}")
            elif r.n_ctx and scheduler.is_embedding(spec):
                # server/routes.go shouldApplyEmbeddingBatchDefault -> DefaultEmbeddingNumBatchForContext, and
                # llm/llama_server.go appendBatchArgs(embedding): -b = -ub = min(2048, the whole context), any device
                batch = scheduler.embedding_batch(r.n_ctx)
                r = replace(r, n_batch=batch, n_ubatch=batch)
            elif not scheduler.is_embedding(spec):
                # server/sched.go automaticGenerationBatch (0.30 and later; routes.go usesAutomaticNumBatch: no
                # num_batch given): the batch follows the whole context (1,024 past 4k tokens, 2,048 past 32k), lowered
                # where Ollama's own prediction of the model leaves too little of the GPU's free memory; without a GPU
                # its checks pass. appendBatchArgs passes it as -b N -ub N, 512 too. Planned at every context the
                # search tries (RunConfig.auto_batch): a published CPU-only load of qwen2.5-coder 14B at 16k under
                # 0.33.1 printed 274.02 MiB of compute at -ub 1024, 137 planned at 512 before
                auto_batch = _auto_batch(model, r)
        if not rel.in_process:
            n_max = rules.mtp_draft_n_max(model)
            r = replace(r, spec_type="draft-mtp", spec_draft_n_max=n_max) if n_max else r
        if rel.sampling_penalties(model.params):
            # llama-sampling.cpp's penalties sampler visits every candidate (kvadvise.planner.speed)
            from kvadvise.planner.speed import sampler_penalty_seconds

            r = replace(r, sampling_penalties=True)
            ms = sampler_penalty_seconds(spec) * 1e3
            notes = (
                *notes,
                f"Ollama{f' {rel.version}' if rel.version else ''} applies a repeat or presence penalty here (its default repeat_penalty 1.1 "
                f"before 0.32.10, or the model's parameters): its sampler visits all {spec.n_vocab:,} candidates on "
                f"the CPU each token, about {ms:.1f} ms a token (PARAMETER repeat_penalty 1 and presence_penalty 0 in "
                "a Modelfile avoid it)",
            )
        projector = readable_projector(model)  # read here, once: the plan and a replan take the header
        if projector is not None:
            r = replace(r, mmproj=projector)
        margin = rules.projector_margin_bytes(model, planned=projector is not None)
        text_spec = None
        if not rel.in_process and (tower := rules.own_tower(model)) is not None:
            # llm/llama_server.go NewLlamaServer: the blob itself as --mmproj (kvadvise.backends.ollama.towers)
            text_spec = towers.text_model(spec, tower)
            r = replace(r, mmproj=tower.projector) if tower.projector is not None else r
            margin = rules.fit_target_raise_bytes(tower.file_bytes, planned=tower.projector is not None)
            notes = (*notes, towers.tower_note(tower, rel.version))
        self._fit_raise_bytes = margin
        return Shaped(
            r,
            notes,
            spec=text_spec,
            extra_margin_bytes=margin,
            build=release_build(rel),  # the llama.cpp Ollama carries, not the one on PATH
            weights_uncertain=model.source.startswith("profile:"),
            ctx_floor=ctx_floor,
            # the runners inside Ollama's binary (0.11 - 0.24) place whole layers (llm/server.go assignLayers and
            # llm/memory.go): no expert override; llama-server's --fit (0.30 on) keeps experts on the CPU first
            expert_offload=not rel.in_process,
            expert_overflow=not rel.in_process,  # --fit's LAYER_FRACTION_UP / _GATE (common/fit.cpp)
            # the Go engine lays the output layer out as Ollama's createLayout does (first, from the end); the
            # llamarunner passes a layer count to the vendored llama.cpp, which places it (before
            # builds.OUTPUT_FIRST: last)
            output_first=True if rel.runner == "ollamarunner" else None,
            # the llamarunner's context keeps each output's embedding (llama/llama.go NewContextParams: embeddings)
            embeddings=rel.runner == "llamarunner",
            auto_batch=auto_batch,
        )

    def place(self, plan: Plan, replan: Callable[[Hardware], Plan]) -> Plan:
        """Several GPUs: Ollama puts the model on its best single GPU when it fits there in 80 % of the free
        memory (``--split-mode none``), and spreads it over all of them only otherwise or with
        OLLAMA_SCHED_SPREAD (server/sched.go selectLlamaServerPlacement)."""
        hw = plan.hardware
        if hw is not None:
            self._server_vram_bytes = sum(g.total_bytes for g in hw.gpus)
        if hw is None or len(hw.gpus) < 2:
            return plan
        if rules.sched_spread():
            note = "OLLAMA_SCHED_SPREAD is set: Ollama spreads the model over all the GPUs"
            return replace(plan, notes=(*plan.notes, note))
        from kvadvise.planner.hardware import one_gpu

        best = rules.single_gpu(hw.gpus)
        alone = replan(one_gpu(hw, best))
        rel = self._release
        if rel is not None and rel.in_process:
            # the runners inside Ollama's binary (before 0.30) lay the layers out themselves: "pack things into as few
            # GPUs as possible" (v0.20.0:llm/server.go assignLayers), one GPU whenever the model fits there, with no
            # 80 % share (selectLlamaServerPlacement is 0.30's)
            # (for the num_ctx asked: one GPU whose plan reaches less context than all of them is not what it packs)
            if alone.fits and (not plan.fits or alone.config.n_ctx >= plan.config.n_ctx):
                note = (
                    f"Ollama {rel.version} runs it on one GPU ({best.name}): its layout packs the layers into as few "
                    "GPUs as possible; OLLAMA_SCHED_SPREAD=1 on the server would spread it over all of them"
                )
                return replace(alone, notes=(*alone.notes, note))
            note = f"Ollama {rel.version} spreads it over the {len(hw.gpus)} GPUs: one does not hold it at this num_ctx"
            return replace(plan, notes=(*plan.notes, note))
        if alone.fits and alone.estimate.device_bytes <= rules.SINGLE_GPU_SHARE * best.free_bytes:
            note = (
                f"Ollama runs it on one GPU ({best.name}, --split-mode none): it fits in 80 % of that GPU's free "
                "memory; OLLAMA_SCHED_SPREAD=1 on the server would spread it over all of them"
            )
            return replace(alone, notes=(*alone.notes, note))
        note = f"Ollama spreads it over the {len(hw.gpus)} GPUs: it does not fit in 80 % of one GPU's free memory"
        return replace(plan, notes=(*plan.notes, note))

    def advise(self, plan: Plan, request: PlanRequest) -> Plan:
        from kvadvise.backends.ollama import api as ollama_api
        from kvadvise.backends.ollama.advice import LiveState, advise, live_state
        from kvadvise.backends.ollama.config import current_platform

        model = self._model(plan.spec)
        if self.live:
            with ollama_api.session():
                live = live_state(self.host)
        else:
            live = LiveState(False, ollama_api.server_url(self.host), None, (), ())
        where = current_platform() if self.platform == "auto" else self.platform
        if self.platform == "auto" and plan.hardware is not None and any(g.unified_memory for g in plan.hardware.gpus):
            where = "macos"  # a plan for an Apple chip is applied on that Mac, wherever it was planned
        rel = self._release or self.release(blob_architecture(plan.spec.architecture, model.source))
        advice = advise(
            model,
            plan,
            live,
            server_default=self.server_default,
            repeatable=request.repeatable,
            platform=where,
            release=rel,
            server_vram_bytes=self._server_vram_bytes,
            # the decision's graph is sized at Ollama's num_batch (gemma2:2b, --batch 256 over 2 slots on 0.18.2:
            # "compute graph" 252.2 MiB logged, 504.5 replayed at the plan's -b 512 before)
            runner_num_batch=self._num_batch if rel.in_process else 0,
            fit_raise_bytes=self._fit_raise_bytes,
        )
        if rel.in_process:  # num_batch is the runner's -ub (and -b per slot), not llama-server's -b
            from kvadvise.backends.ollama.versions import NUM_BATCH_DEFAULT

            nb = self._num_batch if self._num_batch not in (0, NUM_BATCH_DEFAULT) else None
            advice = replace(advice, settings=replace(advice.settings, num_batch=nb))
        elif "n_batch" in request.given():  # --batch 2048 typed: Ollama's num_batch, though it is -b's default
            advice = replace(advice, settings=replace(advice.settings, num_batch=request.n_batch))
        runner = self._runner(plan, advice.settings.num_ctx, live.version)
        if runner is not None:
            advice = replace(advice, runner=runner)
        if runner is not None and runner.memory is not None and not runner.memory.fits:
            # the MLX runner loads it, not llama.cpp (server/sched.go: a safetensors tag goes to mlxrunner): its
            # memory is the verdict (docs/ollama-mlx.md), and no llama.cpp partial offload is what runs
            m = runner.memory
            note = (
                f"Ollama's MLX runner holds {m.total_bytes / (1 << 30):.2f} GiB (weights, K/V, prefix cache), past "
                f"the GPU's share {m.wired_limit_bytes / (1 << 30):.2f} GiB: macOS swaps (ollama#18131)"
            )
            return replace(plan, advice=advice, fits=False, offload=None, notes=(*plan.notes, note))
        cfg = plan.config
        if cfg.auto_batch and cfg.n_ubatch != scheduler.BATCH_DEFAULT:
            note = (
                f"Ollama runs -b {cfg.n_batch} -ub {cfg.n_ubatch} here, its automatic num_batch for {cfg.n_ctx:,} "
                "tokens in all (server/sched.go automaticGenerationBatch), and so it is planned"
            )
            return replace(plan, advice=advice, notes=(*plan.notes, note))
        return replace(plan, advice=advice)

    def _runner(self, plan: Plan, num_ctx: int, server_version: str | None) -> RunnerPlan | None:
        """On a Mac (a Metal GPU): the runner Ollama loads the model with, and the MLX runner's memory when
        it is MLX. None elsewhere: a plan for another card is unchanged; --runner there is an error."""
        from kvadvise.backends.ollama import mlx
        from kvadvise.errors import InputError

        apple = plan.hardware is not None and any(g.backend == "metal" for g in plan.hardware.gpus)
        if not apple:
            if self.runner != "auto" or self.mlx_quant != "nvfp4":
                raise InputError(
                    "--runner/--mlx-quant: Ollama's MLX runner runs on Apple Silicon only",
                    hint="plan for a Mac with --gpu (e.g. --gpu m4-max-64gb)",
                )
            return None
        version = self.ollama_version or server_version
        choice = mlx.choose_runner(plan.spec.architecture, version, self.runner)
        if choice.runner != "mlx":
            return mlx.RunnerPlan(choice, None)
        assert plan.hardware is not None
        memory = mlx.mlx_memory(
            plan.spec,
            num_ctx=num_ctx,
            ram_bytes=plan.hardware.ram_total_bytes,
            quant=self.mlx_quant,
            enforced=mlx.num_ctx_enforced(version),
        )
        return mlx.RunnerPlan(choice, memory)

    def writers(self) -> tuple[Writer[Plan], ...]:
        return WRITERS


def release_build(rel: OllamaRelease) -> BuildChoice:
    """The llama.cpp build the plan follows for ``rel``: the tag Ollama >= 0.30 builds llama-server from, the
    commit an older one vendors (by the rules of a build on the same side of each of kvadvise's build rules
    when its number is not known), the newest rules for an unknown or newer version."""
    from kvadvise.runtime.llamabuild import OLLAMA_BUILD, BuildChoice

    p, named = rel.pin, f"Ollama {rel.version}"
    if rel.runner == "not modelled":
        return BuildChoice(None, f"{named} is not modelled: its llama.cpp is not known here")
    if p is None and rel.rules_pin is not None:
        r = rel.rules_pin
        why = (
            f"{named} is a pre-release, whose llama.cpp is not known here: planned as the release before it ({r.label})"
        )
        return BuildChoice(r.rules_build or r.build, why, label=r.commit[:9])
    if p is None:
        return OLLAMA_BUILD
    if p.since >= (0, 30, 0):
        return BuildChoice(p.build, f"{named} builds llama-server from {p.commit}: its LLAMA_CPP_VERSION")
    if p.build is not None:
        return BuildChoice(p.build, f"{named} vendors it, Makefile.sync {p.commit[:9]}")
    why = f"{named} vendors it (Makefile.sync, pinned {p.pinned_on}); its build number is not known here"
    return BuildChoice(p.rules_build, f"{why}: planned by the rules of b{p.rules_build}", label=p.commit[:9])


def _auto_batch(model: OllamaModel, r: PlanRequest) -> Callable[[Hardware | None], tuple[tuple[int, int], ...]]:
    """Ollama's automatic num_batch for ``model`` loaded alone, by the whole context, on the plan's hardware
    (scheduler.batch_steps: server/sched.go load -> applyAutomaticGenerationBatch with predictedCtx = num_ctx x slots,
    PredictServerVRAM of the blob and the free memory of the GPUs selectLlamaServerPlacement picks); ``--device
    cpu``: no GPU (its memory checks pass). Flash attention off on a CUDA GPU keeps 512 (256 past 4k on 8 GiB or
    less: constrainedCUDAWithoutFlashAttention)."""
    spec = model.spec
    n_layer, n_embd, n_head_max, n_head_kv_min = scheduler.prediction_shape(spec)
    alone = scheduler.Request(
        name=model.ref, model_key=model.ref, file_bytes=model.model_bytes or spec.weights_bytes,
        n_layer=n_layer, n_embd=n_embd, n_head_max=n_head_max, n_head_kv_min=n_head_kv_min,
        num_ctx=0, num_parallel=1, completion=True, keep_alive_s=scheduler.DEFAULT_KEEP_ALIVE_S, fit_target_bytes=0,
        footprint=lambda n_ctx, batch, frees: (), flash_attention=r.flash_attn != "off",
    )  # fmt: skip
    # the whole context Ollama runs: num_ctx per slot at most the training context (effectiveLlamaServerContext)
    upto = spec.n_ctx_train * max(1, r.n_parallel) if spec.n_ctx_train else (r.n_ctx or 0) or 1 << 30

    def steps(hw: Hardware | None) -> tuple[tuple[int, int], ...]:
        if hw is None or not hw.gpus or r.device == "cpu":  # no GPU to check the batch on
            return scheduler.batch_steps(alone, (), upto=upto)
        gpus = scheduler.scheduler_gpus(hw, headless=r.headless)
        return scheduler.batch_steps(alone, gpus, upto=upto, spread=rules.sched_spread())

    return steps


def in_process_request(spec: ModelSpec, r: PlanRequest, rel: OllamaRelease) -> tuple[PlanRequest, int, tuple[str, ...]]:
    """The request as a runner inside Ollama's binary (0.11 to 0.24) runs it: num_batch (512 unless --batch)
    as its -b/-ub (llama/llama.go NewContextParams), the flash attention it gets (llm/server.go: the model's
    default, OLLAMA_FLASH_ATTENTION as --flash-attn on/off (on with a quantized cache asked for), else
    llama.cpp's auto from 0.13.4), and an f16 K/V cache unless flash attention is on: llm/server.go drops a
    quantized OLLAMA_KV_CACHE_TYPE ("must be enabled to use a quantized OLLAMA_KV_CACHE_TYPE"), and the
    recommender picks none unless it is."""
    from kvadvise.backends.ollama.layout import runner_batch
    from kvadvise.backends.ollama.versions import NUM_BATCH_DEFAULT

    given = set(r.given())
    asked = r.flash_attn if "flash_attn" in given and r.flash_attn in ("on", "off") else None
    if asked is None and r.type_k and r.type_k != "f16":
        asked = "on"  # a quantized cache asked for: the advice sets OLLAMA_FLASH_ATTENTION=1 with it
    fa = rel.flash_attn(spec, asked)
    if fa == "auto" and rel.refuses_flash_attention(spec):
        # the advice sets OLLAMA_FLASH_ATTENTION (a value left in the service would win otherwise), and once it is set
        # Ollama turns flash attention away for this model: off, whatever llama.cpp's auto would choose
        fa = "off"
    num_batch = r.n_batch if "n_batch" in given else NUM_BATCH_DEFAULT
    num_ctx = r.n_ctx // max(1, r.n_parallel) if r.n_ctx else 0
    if rel.runner == "llamarunner" and rel.v is not None:  # "embedding model detected, setting batch size to ..."
        num_batch = runner_batch(rel.v, scheduler.is_embedding(spec), num_batch, num_ctx)
    n_batch, n_ubatch = rel.n_batch(num_batch, num_ctx, r.n_parallel)
    notes: list[str] = []
    kv = r.type_k
    if fa != "on":
        if kv and kv != "f16":
            notes.append(
                f"Ollama {rel.version} keeps an f16 K/V cache with flash attention {fa}: OLLAMA_KV_CACHE_TYPE={kv} "
                "takes effect only with OLLAMA_FLASH_ATTENTION=1 on a model that supports it (llm/server.go); "
                "planned f16"
            )
        kv = "f16"
    # the llamarunner makes its context from llama_context_default_params() and never sets swa_full, whose default is
    # true (v0.18.2:llama/llama.go NewContextParams; src/llama-context.cpp llama_context_default_params): a
    # sliding-window cache as large as the context ("using full-size SWA cache": gemma2:2b on 0.18.2 printed 2 x
    # 832.00 MiB for 8,192 cells x 2 slots, 1,274 planned before)
    swa_full = rel.runner == "llamarunner"
    out = replace(r, n_batch=n_batch, n_ubatch=n_ubatch, flash_attn=fa, type_k=kv, type_v=kv, swa_full=swa_full)
    return out, num_batch, tuple(notes)


def readable_projector(model: OllamaModel) -> ProjectorSpec | None:
    """The header of a store model's projector blob when it reads as an mmproj GGUF (Ollama passes it to
    llama-server as --mmproj): planned on the first GPU as llama.cpp loads it. None otherwise (a model
    from the API or a profile, an unreadable blob): the fit-target rule stands in for it."""
    if model.projector is not None:  # read from the registry's blob with the model's header
        return model.projector
    if model.projector_path is None:
        return None
    from kvadvise.errors import KvadviseError
    from kvadvise.model.gguf import read_file
    from kvadvise.model.projector import projector_from_gguf

    try:
        return projector_from_gguf(read_file(model.projector_path))
    except KvadviseError:
        return None


# --- the files: each one writer ------------------------------------------------------------------------


def _advice(plan: Plan) -> OllamaAdvice:
    from kvadvise.backends.ollama.advice import OllamaAdvice

    assert isinstance(plan.advice, OllamaAdvice), "an Ollama writer renders an Ollama plan"
    return plan.advice


def _modelfile(plan: Plan) -> str:
    from kvadvise.backends.ollama import config as oc

    a = _advice(plan)
    return oc.modelfile_text(a.model, a.settings, oc.modelfile_header(a.settings, a.planned_for))


def _modelfile_hints(plan: Plan, path: Path) -> tuple[str, ...]:
    from kvadvise.backends.ollama import config as oc

    a = _advice(plan)
    return (oc.apply_hint_modelfile(a.model, a.settings, path), *oc.call_hints(a.created_name, a.settings))


def _env(plan: Plan) -> str:
    from kvadvise.backends.ollama import config as oc

    return oc.env_text(_advice(plan).settings)


def _env_hints(plan: Plan, path: Path) -> tuple[str, ...]:
    from kvadvise.backends.ollama import config as oc

    a = _advice(plan)
    hints = (
        oc.apply_hints_server(a.settings, a.platform, env_path=path, gpu=oc.docker_gpu(plan))
        if a.platform in ("docker", "linux")
        else ()
    )
    return tuple(hints) or oc.apply_hint_env(path)


def _systemd(plan: Plan) -> str:
    from kvadvise.backends.ollama import config as oc

    return oc.systemd_text(_advice(plan).settings)


def _systemd_hints(plan: Plan, path: Path) -> tuple[str, ...]:
    from kvadvise.backends.ollama import config as oc

    a = _advice(plan)
    name = path.name if path.parent == oc.SYSTEMD_DROPIN_DIR else oc.dropin_name(path)
    conflicts = tuple(f"warning: {c}" for c in oc.override_conflicts(a.settings, name))
    return oc.apply_hint_systemd(path) + conflicts


WRITERS: tuple[Writer[Plan], ...] = (
    Writer("--write-modelfile", "Write a Modelfile (FROM NAME:TAG + num_ctx).", _modelfile, _modelfile_hints),
    Writer("--write-env", "Write OLLAMA_* server settings as an env file.", _env, _env_hints),
    Writer("--write-systemd", "Write a systemd drop-in for ollama.service.", _systemd, _systemd_hints),
)
