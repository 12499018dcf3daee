"""Several models on one Ollama server: where its scheduler puts each, which stay loaded together, which
evicts which. The rules of Ollama's ``server/sched.go`` (ollama/ollama fb3076099687, 2026-08-21; the
scheduler of Ollama >= 0.30, which runs every GGUF model as its own llama-server), function by function:

- ``processPending``: requests are scheduled one at a time, in order; a model already loaded with the
  same settings is reused (``needsReload``). With as many runners loaded as ``OLLAMA_MAX_LOADED_MODELS``
  (0, the default: ``defaultModelsPerGPU`` = 3 per GPU, at least 3), one is evicted before anything else.
- ``updateFreeSpace``: a GPU's free memory is the smaller of what it reports and its total less what the
  loaded runners hold on it (``VRAMByGPU``: the buffers llama-server printed; here, kvadvise's plan).
- ``load`` with nothing loaded: the model loads whatever its size (llama-server's ``--fit`` may then keep
  layers on the CPU). With other models loaded (``requireFull``): Ollama predicts the model's size,
  ``llm.PredictServerVRAM`` (llm/llama_server.go: the GGUF file plus an f16 K/V of 2 x block_count x
  min(head_count_kv) x (embedding_length / max(head_count)) x context x 2 bytes, the context
  min(num_ctx, n_ctx_train) x num_parallel), adds the batch surcharge of a completion model
  (``generationBatchSurcharge``: 2 GiB for num_batch 2048, 768 MiB for 1024, the batch chosen by
  ``automaticGenerationBatch``) and evicts one runner when that is over 80 % of the free memory of the
  GPU(s) it would use; else it loads the model beside the others.
- ``selectLlamaServerPlacement``: with several GPUs and no ``OLLAMA_SCHED_SPREAD``, the best single GPU
  (discrete before integrated, then the most free memory) whose free memory's 80 % holds the prediction
  (``--split-mode none``); else all of them.
- ``findRunnerToUnload``: the runner with the shortest keep-alive (``sessionDuration``), ties broken by the
  model key (the GGUF blob's path, blobs/sha256-<digest>), an idle one first. The sequence here leaves
  every runner idle between requests.
- ``load``: ``numParallel`` is ``OLLAMA_NUM_PARALLEL`` but 1 for an embedding model and for the
  architectures of :data:`kvadvise.backends.ollama.rules.SINGLE_SLOT_ARCHS`; ``getRunner``: num_ctx at
  least 4, at least 2048 for a vision model, clamped to the training context. An embedding model runs
  with -b = -ub = min(2048, num_ctx x slots) (llm/llama_server.go DefaultEmbeddingNumBatchForContext,
  embeddingBatchSize).

Pure: the caller resolves the models, reads the hardware and the server; :func:`schedule` replays the
requests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.backends.ollama.rules import GIB, MIB
from kvadvise.model.architecture import ENCODER_ARCHS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.hardware import Hardware

DEFAULT_MODELS_PER_GPU = 3  # sched.go defaultModelsPerGPU
PLACEMENT_SHARE = (80, 100)  # sched.go: a prediction must be at most 80 % of the free memory
DEFAULT_KEEP_ALIVE_S = 300.0  # envconfig.KeepAlive: 5 minutes
FOREVER_S = float("inf")  # a negative OLLAMA_KEEP_ALIVE: never unloaded
# sched.go automaticGenerationBatch / generationBatchSurcharge / generationBatchHasHeadroom
BATCH_DEFAULT, BATCH_MEDIUM, BATCH_LARGE = 512, 1024, 2048
BATCH_SURCHARGE = {BATCH_LARGE: 2 * GIB, BATCH_MEDIUM: 768 * MIB, BATCH_DEFAULT: 0}
BATCH_HEADROOM = {BATCH_LARGE: (60, 100), BATCH_MEDIUM: (75, 100)}
# Ollama loads a model without the completion capability (an embedding model: its GGUF has a pooling type,
# llm/llama_server.go) with one slot and no batch surcharge; llama.cpp's encoder architectures are what
# embedding models use (nomic-embed-text is nomic-bert, bge-m3 and mxbai-embed-large are bert)
EMBEDDING_ARCHS = ENCODER_ARCHS


def is_embedding(spec: ModelSpec) -> bool:
    """An embedding model as Ollama sees it: its GGUF has {arch}.pooling_type (server/images.go Capabilities: ``if
    f.KeyValue("pooling_type").Valid() { CapabilityEmbedding }``), a decoder's too (Qwen3-Embedding); a built-in
    profile, which has no GGUF keys, by its encoder architecture."""
    return spec.pooling or spec.architecture in EMBEDDING_ARCHS


def slots(spec: ModelSpec, num_parallel: int) -> int:
    """The slots Ollama (the newest release) loads the model with: one for an embedding model (no completion) and the
    architectures sched.go forces to one (rules.SINGLE_SLOT_ARCHS), else OLLAMA_NUM_PARALLEL's ``num_parallel``."""
    from kvadvise.backends.ollama.rules import SINGLE_SLOT_ARCHS

    return 1 if is_embedding(spec) or spec.architecture in SINGLE_SLOT_ARCHS else num_parallel


def device_name(gpus: Sequence[Gpu], index: int) -> str:
    """llama.cpp's name (-dev) of the GPU of scheduler index ``index`` among ``gpus``."""
    return next((g.device_name for g in gpus if g.index == index), f"CUDA{index}")


@dataclass(frozen=True, slots=True)
class Request:
    """One model asked of the server, as the scheduler sees it."""

    name: str  # as the user named it
    model_key: str  # schedulerModelKey: the GGUF blob's path when known, else "name:<name>"
    file_bytes: int  # the GGUF file: Ollama's prediction starts from its size
    n_layer: int  # block_count
    n_embd: int  # embedding_length
    n_head_max: int  # max(head_count)
    n_head_kv_min: int  # min(head_count_kv) over the layers (0 for a recurrent layer)
    num_ctx: int  # per slot, as the runner will hold it (after the clamp to n_ctx_train)
    num_parallel: int  # slots, after the per-model rules
    completion: bool  # False: an embedding model (no batch surcharge, one slot)
    keep_alive_s: float  # sessionDuration
    fit_target_bytes: int  # what llama-server's --fit keeps free on each device (LLAMA_ARG_FIT_TARGET)
    # kvadvise's plan of the memory the model takes on each GPU it is placed on: (num_ctx, num_batch, the
    # free memory of each of those GPUs) -> bytes per GPU
    footprint: Callable[[int, int, tuple[int, ...]], tuple[int, ...]]
    flash_attention: bool = True  # OLLAMA_FLASH_ATTENTION not 0
    digest: str | None = None  # the manifest's, to recognise it among the loaded models


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as the scheduler sees it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int  # what it reports now (other processes and loaded runners already taken out)
    integrated: bool = False  # an integrated GPU comes after any discrete one
    cuda: bool = True  # automaticGenerationBatch's rule for CUDA without flash attention
    name_key: str = ""
    # llama.cpp's name of the device (-dev): CUDA0, ROCm1 (ggml-cuda.h GGML_CUDA_NAME under HIP), Vulkan0, ...
    device: str = ""

    @property
    def device_name(self) -> str:
        return self.device or f"CUDA{self.index}"


@dataclass(frozen=True, slots=True)
class Runner:
    """A loaded model: where, how much, for how long."""

    name: str
    model_key: str
    vram_bytes: tuple[int, ...]  # per GPU (0 where it holds nothing)
    keep_alive_s: float
    num_ctx: int | None = None  # as /api/ps reports it, for a model loaded before
    preloaded: bool = False  # loaded before kvadvise looked (from /api/ps)
    spilled: bool = False  # --fit kept layers on the CPU
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One thing the scheduler does."""

    model: str
    action: str  # "load" | "reuse" | "evict"
    gpus: tuple[int, ...] = ()  # where the model is loaded
    predicted_bytes: int = 0  # Ollama's prediction with the batch surcharge
    available_bytes: int = 0  # the free memory of those GPUs, as the scheduler computes it
    footprint_bytes: tuple[int, ...] = ()  # kvadvise's plan, per GPU loaded on
    num_batch: int = 0
    spilled: bool = False  # more than the GPU(s) hold: --fit keeps layers on the CPU
    evicted: str | None = None  # action "evict": the runner unloaded
    why: str = ""
    cause: str = ""  # action "evict": "count" (OLLAMA_MAX_LOADED_MODELS), "memory" or "reload"
    by_key: bool = False  # action "evict": others had the same keep-alive, the model key decided


@dataclass(frozen=True, slots=True)
class Residency:
    """What the scheduler did with the requests, and what stays loaded."""

    steps: tuple[Step, ...]
    resident: tuple[Runner, ...]  # loaded at the end
    max_loaded: int
    max_loaded_source: str  # "OLLAMA_MAX_LOADED_MODELS" | "default: 3 per GPU"
    gpus: tuple[Gpu, ...]

    @property
    def evictions(self) -> tuple[tuple[str, str], ...]:
        """(unloaded, to make room for) pairs, in order."""
        return tuple((s.evicted, s.model) for s in self.steps if s.action == "evict" and s.evicted)

    def together(self, names: Sequence[str], may_spill: Sequence[str] = ()) -> bool:
        """Every one of ``names`` is loaded at the end, none with layers on the CPU but those of ``may_spill``."""
        here = {r.name for r in self.resident if not r.spilled or r.name in may_spill}
        return all(n in here for n in names)


def scheduler_gpus(hw: Hardware, *, headless: bool) -> tuple[Gpu, ...]:
    """The GPUs as the scheduler sees them: what each reports free, less what the plan keeps for a
    display (kvadvise.planner.budget: the one budget rule; the fit margin is the scheduler's own here)."""
    from kvadvise.planner.budget import plan_budget
    from kvadvise.planner.planning import BACKEND_PREFIX

    b = plan_budget(hw, 0, headless=headless)
    frees = b.device_budgets if len(b.device_budgets) == len(hw.gpus) else (b.budget_bytes,)
    # OLLAMA_GPU_OVERHEAD is not taken off here: from 0.30 server/sched.go reads it for a log line only ("gpu memory
    # ... overhead"), placement, the 80 % rule and the batch read gpu.FreeMemory (it sizes the context tier:
    # routes.go, rules.tier_vram_bytes)
    return tuple(
        Gpu(
            g.index, g.name, g.total_bytes, f, integrated=g.unified_memory, cuda=g.backend == "cuda",
            device=f"{BACKEND_PREFIX.get(g.backend, 'CUDA')}{g.index}",
        )
        for g, f in zip(hw.gpus, frees, strict=True)
    )  # fmt: skip


def prediction_shape(spec: ModelSpec) -> tuple[int, int, int, int]:
    """What llm.PredictServerVRAM reads of the GGUF besides its size: (block_count, embedding_length,
    max(head_count), HeadCountKVMin) (fs/ggml/ggml.go HeadCountKVMin: UintOrMinArrayValue("attention.head_count_kv",
    1): 1 where the file does not say it)."""
    kv_min = min(spec.n_head_kv, default=0) if spec.head_count_kv_in_file else 1
    return spec.n_layer_all, spec.n_embd, max(spec.n_head, default=0), kv_min


def predict_server_vram(r: Request) -> int:
    """llm.PredictServerVRAM (llm/llama_server.go): the file plus an f16 K/V at the context x slots,
    with Ollama's head size embedding_length / max(head_count) (it ignores key_length, sliding windows,
    recurrent layers and the cache type)."""
    kv_heads = r.n_head_kv_min or 1
    head_dim = r.n_embd // r.n_head_max if r.n_head_max else 0
    ctx = r.num_ctx * max(r.num_parallel, 1)  # effectiveLlamaServerContext
    return r.file_bytes + 2 * r.n_layer * kv_heads * head_dim * ctx * 2


def automatic_batch(r: Request, predicted: int, available: int, gpus: Sequence[Gpu]) -> int:
    """sched.go automaticGenerationBatch: the num_batch (-b and -ub) Ollama gives a completion model."""
    ctx = r.num_ctx * max(r.num_parallel, 1)
    if not r.flash_attention and any(g.cuda for g in gpus):
        # constrainedCUDAWithoutFlashAttention: past 4k on a CUDA GPU of 8 GiB or less
        small = any(g.cuda and 0 < min(g.free_bytes or g.total_bytes, g.total_bytes) <= 8 * GIB for g in gpus)
        return 256 if ctx > 4096 and small else BATCH_DEFAULT
    batch = batch_for_context(ctx)
    while batch > BATCH_DEFAULT and not _batch_fits(batch, predicted, available):
        batch = BATCH_MEDIUM if batch > BATCH_MEDIUM else BATCH_DEFAULT
    return batch


def batch_steps(r: Request, gpus: Sequence[Gpu], *, upto: int, spread: bool = False) -> tuple[tuple[int, int], ...]:
    """automaticGenerationBatch for ``r`` loaded alone (server/sched.go load: nothing else loaded, so each GPU's free
    memory as it reports it) at every whole context (num_ctx x slots) up to ``upto``, as steps (the largest context,
    the batch), ascending: memory.RunConfig.auto_batch. The batch moves only where generationBatchForContext's tiers
    begin (past 4,096 and 32,768 tokens) and where Ollama's prediction of the model (PredictServerVRAM, the file plus
    a K/V linear in the context) crosses a limit of generationBatchFits (80 % of the free memory, the tiers'
    headroom, the surcharge under 80 %) or a GPU's 80 % share (selectLlamaServerPlacement), so the function is worked
    out at those contexts only. Without a GPU the memory checks pass: generationBatchForContext alone."""
    free = [g.free_bytes for g in gpus]

    def at(ctx: int) -> int:
        q = replace(r, num_ctx=ctx, num_parallel=1)
        predicted = predict_server_vram(q)
        where = _placement(free, gpus, predicted, spread) if gpus else ()
        return automatic_batch(q, predicted, sum(free[i] for i in where), [gpus[i] for i in where])

    base = predict_server_vram(replace(r, num_ctx=0, num_parallel=1))
    per_token = predict_server_vram(replace(r, num_ctx=1, num_parallel=1)) - base
    limits: set[int] = set()
    for avail in {*free, sum(free)} if gpus else set():
        share = avail * PLACEMENT_SHARE[0] // PLACEMENT_SHARE[1]
        limits |= {share, *(avail * n // d for n, d in BATCH_HEADROOM.values())}
        limits |= {share - b for b in BATCH_SURCHARGE.values() if b}
    edges = {4096, 32768, upto}
    if per_token > 0:  # predicted > limit from the context (limit - base) // per_token + 1 on
        edges |= {(lim - base) // per_token for lim in limits if lim >= base}
    steps: list[tuple[int, int]] = []
    for edge in sorted(e for e in edges if 0 < e <= upto):
        batch = at(edge)  # the batch of every context from the edge before, exclusive, to this one
        if steps and steps[-1][1] == batch:
            steps[-1] = (edge, batch)
        else:
            steps.append((edge, batch))
    return tuple(steps)


def batch_for_context(ctx: int) -> int:
    """sched.go generationBatchForContext: the automatic num_batch before the memory checks, by the runner's whole
    context (num_ctx x slots). Without a GPU the checks always pass (generationBatchFits: no available memory), so a
    CPU-only load runs it as it is."""
    return BATCH_LARGE if ctx > 32768 else BATCH_MEDIUM if ctx > 4096 else BATCH_DEFAULT


def embedding_batch(ctx: int) -> int:
    """An embedding model's num_batch (-b and -ub) by its whole context: server/routes.go
    DefaultEmbeddingNumBatchForContext, llm/llama_server.go embeddingBatchSize: min(2048, the context)."""
    return min(BATCH_LARGE, ctx)


def _batch_fits(batch: int, predicted: int, available: int) -> bool:
    """sched.go generationBatchFits (integer arithmetic, as Go's uint64)."""
    if predicted == 0 or available == 0:
        return True
    threshold = available * PLACEMENT_SHARE[0] // PLACEMENT_SHARE[1]
    if predicted > threshold:
        return False
    num, den = BATCH_HEADROOM.get(batch, (1, 1))
    if predicted > available * num // den:
        return False
    return BATCH_SURCHARGE[batch] <= threshold - predicted


def default_max_loaded(n_gpu: int) -> int:
    """OLLAMA_MAX_LOADED_MODELS when unset: 3 per GPU (processPending), at least 3."""
    return DEFAULT_MODELS_PER_GPU * max(n_gpu, 1)


def _placement(free: Sequence[int], gpus: Sequence[Gpu], predicted: int, spread: bool) -> tuple[int, ...]:
    """selectLlamaServerPlacement: one GPU when its free memory's 80 % holds the prediction, else all."""
    if len(gpus) <= 1:
        return tuple(range(len(gpus)))
    if not spread and predicted > 0:
        fits = [i for i in range(len(gpus)) if predicted <= free[i] * PLACEMENT_SHARE[0] // PLACEMENT_SHARE[1]]
        if fits:  # betterPlacementGPU: discrete first, then the most free memory (the first of equals)
            best = fits[0]
            for i in fits[1:]:
                if (gpus[i].integrated, -free[i]) < (gpus[best].integrated, -free[best]):
                    best = i
            return (best,)
    return tuple(range(len(gpus)))


def _victim(loaded: Sequence[Runner]) -> Runner:
    """findRunnerToUnload: the shortest keep-alive, then the model key (ByDurationAndName)."""
    return min(loaded, key=lambda r: (r.keep_alive_s, r.model_key))


def _is(r: Runner, q: Request) -> bool:
    return r.model_key == q.model_key or (r.digest is not None and r.digest == q.digest) or r.name == q.name


def schedule(
    requests: Sequence[Request],
    gpus: Sequence[Gpu],
    *,
    max_loaded: int = 0,
    spread: bool = False,
    loaded: Sequence[Runner] = (),
) -> Residency:
    """Replay ``requests`` in order on a server that holds ``loaded`` now, as server/sched.go does."""
    n = len(gpus)
    limit = max_loaded or default_max_loaded(n)
    source = "OLLAMA_MAX_LOADED_MODELS" if max_loaded else f"default: {DEFAULT_MODELS_PER_GPU} per GPU"
    runners = list(loaded)
    reported = [g.free_bytes for g in gpus]  # what the GPUs report: changes as runners come and go
    steps: list[Step] = []

    def free_now() -> list[int]:  # updateFreeSpace
        held = [sum(r.vram_bytes[i] for r in runners if i < len(r.vram_bytes)) for i in range(n)]
        return [max(0, min(reported[i], gpus[i].total_bytes - held[i])) for i in range(n)]

    def evict(victim: Runner, why: str, by: str, cause: str) -> None:
        tie = cause != "reload" and sum(1 for r in runners if r.keep_alive_s == victim.keep_alive_s) > 1
        runners.remove(victim)
        for i in range(n):
            reported[i] += victim.vram_bytes[i] if i < len(victim.vram_bytes) else 0
        steps.append(Step(by, "evict", evicted=victim.name, why=why, cause=cause, by_key=tie))

    for q in requests:
        same = next((r for r in runners if _is(r, q)), None)
        if same is not None and (same.num_ctx is None or same.num_ctx == q.num_ctx):
            steps.append(Step(q.name, "reuse", why=f"already loaded as {same.name}"))
            continue
        if same is not None:  # needsReload: another context; the runner is replaced
            evict(same, f"loaded at context {same.num_ctx:,}, asked {q.num_ctx:,}: reloaded", q.name, "reload")
        for _attempt in range(len(runners) + 2):
            if len(runners) >= limit:
                evict(_victim(runners), f"{len(runners)} models loaded, the most the server keeps", q.name, "count")
                continue
            free = free_now()
            predicted = predict_server_vram(q)
            where = _placement(free, gpus, predicted, spread) if n else ()
            available = sum(free[i] for i in where)
            if q.completion:
                batch = automatic_batch(q, predicted, available, [gpus[i] for i in where])
            else:  # llm/llama_server.go DefaultEmbeddingNumBatchForContext, embeddingBatchSize
                batch = embedding_batch(q.num_ctx * max(q.num_parallel, 1))
            with_batch = predicted + (BATCH_SURCHARGE.get(batch, 0) if q.completion else 0)
            limit_bytes = available * PLACEMENT_SHARE[0] // PLACEMENT_SHARE[1]
            if runners and where and with_batch > limit_bytes:
                evict(
                    _victim(runners),
                    f"Ollama predicts {with_batch / GIB:.1f} GiB for {q.name}, over 80 % of the "
                    f"{available / GIB:.1f} GiB free",
                    q.name,
                    "memory",
                )
                continue
            plan = q.footprint(q.num_ctx, batch, tuple(free[i] for i in where)) if where else ()
            room = [max(0, free[i] - q.fit_target_bytes) for i in where]
            spilled = any(p > r for p, r in zip(plan, room, strict=True))
            held = tuple(min(p, r) for p, r in zip(plan, room, strict=True)) if spilled else plan
            vram = [0] * n
            for i, b in zip(where, held, strict=True):
                vram[i] = b
                reported[i] -= b
            why = (
                "nothing else loaded"
                if not runners
                else f"{with_batch / GIB:.1f} GiB ≤ 80 % of {available / GIB:.1f} GiB"
            )
            runners.append(
                Runner(q.name, q.model_key, tuple(vram), q.keep_alive_s, q.num_ctx, spilled=spilled, digest=q.digest)
            )
            steps.append(Step(q.name, "load", where, with_batch, available, plan, batch, spilled, why=why))
            break
    return Residency(tuple(steps), tuple(runners), limit, source, tuple(gpus))


def with_context(r: Request, num_ctx: int) -> Request:
    """``r`` at another num_ctx (already clamped)."""
    return replace(r, num_ctx=num_ctx)
