"""``kvadvise ollama A B C``: several models on one Ollama server, planned as an expert would.

Each model is resolved as ``kvadvise ollama NAME`` resolves it and the requests are replayed, in the order
given, through Ollama's scheduler (:mod:`kvadvise.backends.ollama.scheduler`: where each goes, which stay
loaded together, which evicts which). When they do not all stay loaded at the server's settings, the plan
gives each model its own context (a Modelfile's num_ctx, or the request's options.num_ctx) rather than
shrinking every model's: the first model named is the one the user cares most about and keeps the largest
useful context (its target, else the largest that fits with the others), the helpers get what their job
needs (an embedding model its batch, a small chat model 8k, else 4k), and the server-wide cache type is
quantized (q8_0) where that buys the first model context. Each candidate is checked by replaying it
through the scheduler: Ollama's own prediction and its 80 % rule decide, not only kvadvise's plan. No model
is given less than 8k (unless --ctx says so); when the models cannot stay together at that, the answer
says which model to leave out or which card would hold them. Rendering: kvadvise.backends.ollama.together_show;
files: kvadvise.backends.ollama.together_files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import rules
from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kvadvise.planner.hardware import Hardware
    from kvadvise.request import PlanRequest
    from kvadvise.runtime.router import RoutedModel

GIB = rules.GIB
MIB = rules.MIB
NAME_KEY = "name:"  # the model key of a model whose file is not known here (sched.go keys by the blob path)
USEFUL_CTX = 8192  # no model of the plan gets less (unless --ctx asks for it): a chat model needs that much
HELPER_CTXS = (8192, 4096)  # a small chat model beside the first one: 8k, else 4k
HELPER_GROWTH = (65536, 32768, 16384)  # and more where the GPUs still have room once the first has its context
EMBEDDING_CTX = 2048  # an embedding model: its batch (llm/llama_server.go embeddingBatchSize, at most 2048)
# the first model's contexts, largest first: a multiple of 4k from its target down to USEFUL_CTX
CTX_STEP = 4096
# what `kvadvise ollama NAME` takes that has no meaning for several models at once (request fields)
SINGLE_MODEL_ONLY = ("min_ctx", "allow_cpu", "repeatable", "no_hardware", "mmproj", "draft", "rpc", "users")


@dataclass(frozen=True, slots=True)
class Settings:
    """The server settings the requests are replayed under (this shell's OLLAMA_* unless flags say)."""

    context_length: int  # OLLAMA_CONTEXT_LENGTH, or Ollama's VRAM tier when unset
    context_source: str  # "--ctx" | "OLLAMA_CONTEXT_LENGTH" | "Ollama's VRAM tier"
    num_parallel: int
    kv_cache_type: str
    flash_attention: bool
    max_loaded: int  # 0: Ollama's default (3 per GPU)
    keep_alive_s: float
    spread: bool


@dataclass(frozen=True, slots=True)
class Together:
    """Several models on one server: the replay at the settings asked, and the plan that keeps them loaded."""

    models: tuple[OllamaModel, ...]
    settings: Settings
    asked: sched.Residency
    recommended: sched.Residency | None  # the replay of the plan, when the asked settings do not keep them
    plan_settings: Settings | None  # the server settings of the plan (its cache type, its limit)
    contexts: tuple[tuple[str, int], ...]  # the plan's num_ctx for each model that needs its own
    recommended_max_loaded: int | None  # OLLAMA_MAX_LOADED_MODELS that keeps them, when the limit evicts one
    target_ctx: int  # what the first model aims for (its use case's target, capped at its training context)
    alternatives: tuple[str, ...]  # when nothing keeps them together at useful contexts: what would
    tried: tuple[tuple[str, int], ...]  # each server-wide cache type tried and the first model's best context at it
    hardware_text: str
    notes: tuple[str, ...]
    # which combinations fit, for the router preset and llama-swap (together_budget.plan_combinations)
    combinations: Combinations | None = None
    # the other names a model was asked by (two tags of one blob, planned once: one_each): the router's and
    # llama-swap's aliases, so that a client asking by either name is served
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def final(self) -> sched.Residency:
        return self.recommended if self.recommended is not None else self.asked

    @property
    def final_settings(self) -> Settings:
        return self.plan_settings if self.plan_settings is not None else self.settings

    @property
    def fits(self) -> bool:
        return stays(self.final, self.models)

    def own_ctx(self, ref: str) -> int | None:
        return dict(self.contexts).get(ref)


def one_each(
    models: Sequence[OllamaModel],
) -> tuple[tuple[OllamaModel, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """One model named twice, or under two names (two tags of one blob, a name and its alias): Ollama serves
    both from one runner (sched.go: the same model key), so it is planned once; the note says which. Also each
    other name and the model it is (Together.aliases)."""
    out: list[OllamaModel] = []
    notes = []
    aliases: list[tuple[str, str]] = []
    for m in models:
        twin = next((o for o in out if _same_model(o, m)), None)
        if twin is None:
            out.append(m)
        elif m.ref != twin.ref:
            notes.append(f"{m.ref} is {twin.ref}: one runner serves both, planned once")
            aliases.append((twin.ref, m.ref))
        else:
            notes.append(f"{m.ref} named twice: planned once")
    return tuple(out), tuple(notes), tuple(aliases)


# api.Runner's options: a runner loaded with others is reloaded for a request (server/sched.go needsReload:
# reflect.DeepEqual of the options), so two names of one blob whose Modelfiles set them apart are two runners
_RUNNER_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread")


def _same_model(a: OllamaModel, b: OllamaModel) -> bool:
    if a.ref == b.ref:
        return True
    if any(a.params.get(k) != b.params.get(k) for k in _RUNNER_OPTIONS):
        return False
    if a.digest and b.digest:
        return a.digest == b.digest or (a.spec.source == b.spec.source and a.source.startswith("store:"))
    return a.source == b.source and a.source.startswith("profile:")


def hardware(r: PlanRequest) -> Hardware:
    from kvadvise.backends.ollama.runtime import OllamaRuntime
    from kvadvise.entry import hardware_of
    from kvadvise.request import check
    from kvadvise.runtime.seam import refuse

    check(r)
    refuse(OllamaRuntime(), r)
    hw = hardware_of(r)
    assert hw is not None
    if not hw.gpus:
        raise ConfigError(
            "no GPU to place the models on: Ollama's scheduler places models on GPUs",
            hint="plan for a card (--gpu NAME, --vram SIZE)",
        )
    return hw


def settings(o: PlanRequest, hw: Hardware, kv: str, *, typed: frozenset[str] = frozenset()) -> Settings:
    """The server's settings: the flags, else this shell's OLLAMA_* (as the server reads them when started
    here, envconfig/config.go), else Ollama's defaults. ``typed``: the request's fields given on the command
    line, which win even at their default value (-np 1, -fa on)."""
    from kvadvise.backends.ollama import envconfig

    if o.n_ctx:
        ctx, src = o.n_ctx, "--ctx"
    elif (v := min(envconfig.uint("OLLAMA_CONTEXT_LENGTH", 0), 2**31 - 1)) > 0:
        ctx, src = v, "OLLAMA_CONTEXT_LENGTH"
    else:  # server/routes.go Serve: a tier by the GPUs' total memory
        tier = rules.tier_vram_bytes((g.total_bytes for g in hw.gpus), envconfig.gpu_overhead_bytes())
        ctx, src = rules.default_num_ctx(tier), "Ollama's VRAM tier"
    parallel = min(envconfig.uint("OLLAMA_NUM_PARALLEL", 0), 4096)
    n_parallel = o.n_parallel if o.n_parallel != 1 or not parallel or "n_parallel" in typed else max(1, parallel)
    fa = envconfig.boolean("OLLAMA_FLASH_ATTENTION", True)
    if o.flash_attn == "off":
        fa = False
    elif o.flash_attn == "on" and "flash_attn" in typed:
        fa = True
    return Settings(
        context_length=ctx,
        context_source=src,
        num_parallel=n_parallel,
        kv_cache_type=kv,
        flash_attention=fa,
        max_loaded=min(envconfig.uint("OLLAMA_MAX_LOADED_MODELS", 0), 1 << 16),
        keep_alive_s=keep_alive_seconds(envconfig.var("OLLAMA_KEEP_ALIVE")),
        spread=rules.sched_spread(),
    )


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")  # ASCII digits, as Go's
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(text: str) -> float:
    """envconfig.KeepAlive: a Go duration ("5m", "1h30m") or whole seconds; negative = forever; unset or
    unreadable = 5 minutes."""
    s = text.strip()
    if not s:
        return sched.DEFAULT_KEEP_ALIVE_S
    negative = s.startswith("-")
    body = s[1:] if s[:1] in ("+", "-") else s  # one sign at most (time.ParseDuration, strconv.ParseInt)
    if not body or len(body) > 30:  # no duration is that long: Go's ParseDuration and ParseInt refuse it
        return sched.DEFAULT_KEEP_ALIVE_S
    if body.isascii() and body.isdigit():  # strconv.ParseInt(s, 10, 64), then time.Duration(n) * time.Second
        n = -int(body) if negative else int(body)
        if not -(1 << 63) <= n < 1 << 63:
            return sched.DEFAULT_KEEP_ALIVE_S
        ns = (n * 1_000_000_000 + (1 << 63)) % (1 << 64) - (1 << 63)  # Go's int64 product wraps
        return sched.FOREVER_S if ns < 0 else ns / 1e9
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        return sched.DEFAULT_KEEP_ALIVE_S
    value = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if value * 1e9 > (1 << 63) - 1:  # time.ParseDuration: "invalid duration" past int64 nanoseconds
        return sched.DEFAULT_KEEP_ALIVE_S
    return sched.FOREVER_S if negative and value > 0 else value


def loaded_now(host: str | None, hw: Hardware, o: PlanRequest) -> tuple[tuple[sched.Runner, ...], str | None]:
    """The models the server holds now (/api/ps): they take GPU memory and count against the limit. Only for
    this machine's GPUs (a card planned for is empty)."""
    if o.gpu or o.vram_bytes is not None:
        return (), None
    try:
        running = ollama_api.running_models(ollama_api.server_url(host))
    except Exception as e:
        from kvadvise.errors import BackendUnreachable

        if not isinstance(e, BackendUnreachable):
            raise
        return (), f"no Ollama server answered ({e.message}): nothing counted as loaded now"
    out = []
    for m in running:
        # /api/ps does not say which GPU holds a model: the first, where Ollama puts what fits on one
        vram = (m.size_vram, *(0,) * (len(hw.gpus) - 1))
        out.append(
            sched.Runner(
                m.name,
                f"{NAME_KEY}{m.name}",
                vram,
                sched.DEFAULT_KEEP_ALIVE_S,
                m.context_length,
                preloaded=True,
                digest=m.digest or None,
            )
        )
    note = None
    if out:
        note = f"{len(out)} model(s) loaded now ({', '.join(r.name for r in out)}) are counted as the server holds them"
    return tuple(out), note


def fit_target_bytes(m: OllamaModel) -> int:
    """What llama-server's --fit keeps free for ``m`` (LLAMA_ARG_FIT_TARGET): 1 GiB, or with a projector Ollama's
    raise of it (a blob's own tower is passed as --mmproj too: kvadvise.backends.ollama.towers; its bytes are in the
    spec here, so the raise's other GiB stands for its compute)."""
    return rules.fit_target_raise_bytes(rules.mmproj_bytes(m), planned=False) or rules.DEFAULT_FIT_TARGET_MIB * MIB


def request(m: OllamaModel, s: Settings, device: str, context_length: int, own_ctx: int | None = None) -> sched.Request:
    """``m`` as the scheduler gets it: its own num_ctx (``own_ctx``: the plan's, by a Modelfile or the
    request's options.num_ctx; else the model's parameter) or the server's, the slots Ollama gives it."""
    from kvadvise.planner.memory import estimate

    spec = m.spec
    embedding = sched.is_embedding(spec)
    num_ctx = rules.run_num_ctx(own_ctx or m.default_num_ctx or context_length, vision=rules.is_vision(m))
    if spec.n_ctx_train and num_ctx > spec.n_ctx_train:
        num_ctx = spec.n_ctx_train  # effectiveContext: the runner holds at most the training context
    n_parallel = sched.slots(spec, s.num_parallel)
    fit_target = fit_target_bytes(m)
    extra = m.projector_bytes  # Ollama passes the projector (--mmproj): it loads on the first device

    def footprint(n_ctx: int, batch: int, frees: tuple[int, ...]) -> tuple[int, ...]:
        cfg = rules.run_config(n_ctx, n_parallel, s.kv_cache_type, flash_attention=s.flash_attention)
        cfg = rules.with_mtp_draft(cfg, m)  # a draft is launched beside other models as alone
        split = tuple(round(f / GIB, 2) or 0.01 for f in frees) if len(frees) > 1 else ()
        cfg = replace(cfg, n_batch=batch, n_ubatch=batch, device=device, tensor_split=split)  # -b = -ub
        devs = [d.total_bytes for d in estimate(spec, cfg).devices]
        devs[0] += extra
        return tuple(devs)

    model_key = spec.source if m.source.startswith("store:") else f"{NAME_KEY}{m.ref}"
    n_layer, n_embd, n_head_max, n_head_kv_min = sched.prediction_shape(spec)
    return sched.Request(
        name=m.ref,
        model_key=model_key,
        file_bytes=m.model_bytes or spec.weights_bytes,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head_max=n_head_max,
        n_head_kv_min=n_head_kv_min,
        num_ctx=num_ctx,
        num_parallel=n_parallel,
        completion=not embedding,
        keep_alive_s=s.keep_alive_s,
        fit_target_bytes=fit_target,
        footprint=footprint,
        flash_attention=s.flash_attention,
        digest=m.digest,
    )


def plan_together(
    models: Sequence[OllamaModel],
    hw: Hardware,
    s: Settings,
    *,
    loaded: Sequence[sched.Runner] = (),
    headless: bool = False,
    target_ctx: int = 0,
    kv_fixed: bool = False,
    allow_q4: bool = False,
    explain: bool = True,
) -> Together:
    """Replay the models' requests at the settings ``s``; when they do not all stay loaded, the plan an
    expert would make (see the module doc): per-model contexts, the cache type, the limit on loaded models."""
    from kvadvise.planner.budget import plan_budget
    from kvadvise.planner.policy import default_target_ctx

    gpus = sched.scheduler_gpus(hw, headless=headless)
    names = [m.ref for m in models]
    replay = _replayer(models, hw, gpus, loaded)
    primary = models[0]
    n_train = primary.spec.n_ctx_train or (1 << 20)
    want = target_ctx or default_target_ctx(plan_budget(hw, 0, headless=headless))[0]
    target = min(want, n_train)
    asked = replay(s, {})
    notes: list[str] = []
    own = [m.ref for m in models if m.default_num_ctx]
    if own:
        notes.append(f"{', '.join(own)}: the model's own num_ctx (its Modelfile), whatever the server's default")
    gpu_text = "; ".join(
        f"GPU {g.index} {g.name}: {g.total_bytes / GIB:.1f} GiB, {g.free_bytes / GIB:.1f} GiB free" for g in gpus
    )
    hardware_text = f"{gpu_text} ({hw.source})"
    if stays(asked, models):
        return Together(tuple(models), s, asked, None, None, (), None, target, (), (), hardware_text, tuple(notes))
    # the limit on loaded models evicted one of them: as many as the requests and what stays loaded now
    rec_max = None
    needed = len(names) + sum(1 for r in loaded if r.name not in names)
    if any(st.cause == "count" for st in asked.steps) and needed > asked.max_loaded:
        rec_max = needed
    base = replace(s, max_loaded=rec_max or s.max_loaded)
    if rec_max and stays(res := replay(base, {}), models):  # the limit alone was in the way
        return Together(tuple(models), s, asked, res, base, (), rec_max, target, (), (), hardware_text, tuple(notes))
    tried: list[tuple[str, int]] = []
    found = _search(
        models,
        base,
        replay,
        target,
        fixed_ctx=s.context_source == "--ctx",
        kv_fixed=kv_fixed,
        allow_q4=allow_q4,
        tried=tried,
    )
    if found is not None:
        st, ctxs, res = found
        return Together(
            tuple(models), s, asked, res, st, tuple(ctxs.items()), rec_max, target, (), tuple(tried), hardware_text,
            tuple(notes),
        )  # fmt: skip
    alternatives = _alternatives(models, base, hw, headless, target, loaded) if explain else ()
    return Together(
        tuple(models), s, asked, None, None, (), None, target, alternatives, tuple(tried), hardware_text, tuple(notes)
    )


def stays(res: sched.Residency, models: Sequence[OllamaModel]) -> bool:
    """Every model stays loaded, on the GPU: an embedding model beside the first may have part of its few
    layers on the CPU (llama.cpp's --fit keeps them there: it reads little per request, the chat models keep
    the GPU)."""
    helpers = [m.ref for m in models[1:] if sched.is_embedding(m.spec)]
    return res.together([m.ref for m in models], may_spill=helpers)


def _replayer(
    models: Sequence[OllamaModel], hw: Hardware, gpus: Sequence[sched.Gpu], loaded: Sequence[sched.Runner]
) -> Callable[[Settings, dict[str, int]], sched.Residency]:
    """Replay the models' requests on ``gpus`` at the settings and per-model contexts given."""
    device = "metal" if hw.gpus[0].backend == "metal" else "cuda"

    def replay(st: Settings, ctxs: dict[str, int]) -> sched.Residency:
        reqs = [request(m, st, device, st.context_length, ctxs.get(m.ref)) for m in models]
        return sched.schedule(reqs, gpus, max_loaded=st.max_loaded, spread=st.spread, loaded=loaded)

    return replay


def _kv_order(s: Settings, kv_fixed: bool, allow_q4: bool) -> list[str]:
    """The server-wide cache types to try, least quantized first: the server's own, then q8_0 (q4_0 when
    allowed); only the one given with -ctk/-ctv; a quantized cache needs flash attention."""
    if kv_fixed or not s.flash_attention:
        return [s.kv_cache_type]
    order = [t for t in rules.KV_CACHE_TYPES if t != "q4_0" or allow_q4]
    return order[order.index(s.kv_cache_type) :] if s.kv_cache_type in order else [s.kv_cache_type]


def helper_contexts(m: OllamaModel) -> tuple[int, ...]:
    """What a helper's job needs, largest first: an embedding model its batch, a chat model 8k else 4k (a
    model that sets its own num_ctx keeps it when that is smaller); at most its training context."""
    cap = m.spec.n_ctx_train or (1 << 20)
    if sched.is_embedding(m.spec):
        return (min(m.default_num_ctx or EMBEDDING_CTX, EMBEDDING_CTX, cap),)
    own = m.default_num_ctx
    picks = [min(c, cap) for c in HELPER_CTXS if own is None or c <= own] or [min(own or HELPER_CTXS[-1], cap)]
    return tuple(dict.fromkeys(picks))


def primary_contexts(m: OllamaModel, target: int) -> list[int]:
    """The first model's contexts to try, largest first: its target, then multiples of 4k down to 8k."""
    top = min(target, m.spec.n_ctx_train or target)
    out = [top, *range(top // CTX_STEP * CTX_STEP, USEFUL_CTX - 1, -CTX_STEP)]
    return sorted({c for c in out if c >= min(USEFUL_CTX, top)}, reverse=True)


def _search(
    models: Sequence[OllamaModel],
    s: Settings,
    replay: Callable[[Settings, dict[str, int]], sched.Residency],
    target: int,
    *,
    fixed_ctx: bool,
    kv_fixed: bool,
    allow_q4: bool,
    tried: list[tuple[str, int]],
) -> tuple[Settings, dict[str, int], sched.Residency] | None:
    """The plan: for each cache type (least quantized first) and each helper context (largest first), the
    largest context of the first model at which the scheduler keeps them all loaded. The first cache type
    whose plan reaches the target wins; else the plan with the largest first context (the less quantized
    cache and the larger helpers among equals). ``fixed_ctx``: --ctx fixed the server's context, only the
    cache type and the limit are searched. ``tried``: each cache type and the first model's best context."""
    primary, helpers = models[0], models[1:]
    best: tuple[int, Settings, dict[str, int], sched.Residency] | None = None
    levels = max((len(helper_contexts(h)) for h in helpers), default=1)
    for kv in _kv_order(s, kv_fixed, allow_q4):
        st = replace(s, kv_cache_type=kv)
        if fixed_ctx:
            res = replay(st, {})
            if stays(res, models):
                return st, {}, res
            continue
        reach = 0
        for level in range(levels):
            ctxs = {h.ref: helper_contexts(h)[min(level, len(helper_contexts(h)) - 1)] for h in helpers}
            for c in primary_contexts(primary, target):
                res = replay(st, {**ctxs, primary.ref: c})
                if stays(res, models):
                    reach = max(reach, c)
                    if best is None or c > best[0]:
                        best = (c, st, {primary.ref: c, **ctxs}, res)
                    break
            if reach >= target:
                break
        tried.append((kv, reach))
        if best is not None and best[1] is st and best[0] >= target:
            break
    if best is None:
        return None
    _, st, ctxs, res = best
    for h in helpers:  # room left once the first model has its context: the chat helpers get more
        if sched.is_embedding(h.spec):
            continue
        cap = min(h.default_num_ctx or st.context_length, h.spec.n_ctx_train or st.context_length)
        for c in (c for c in HELPER_GROWTH if ctxs[h.ref] < c <= cap):
            more = replay(st, {**ctxs, h.ref: c})
            if stays(more, models):
                ctxs, res = {**ctxs, h.ref: c}, more
                break
    return st, _needs_own(models, st, ctxs), res


def _needs_own(models: Sequence[OllamaModel], s: Settings, ctxs: dict[str, int]) -> dict[str, int]:
    """The contexts a model must be given (a Modelfile's num_ctx): those that differ from what it gets now."""
    out = {}
    for m in models:
        c = ctxs.get(m.ref)
        if c is None:
            continue
        now = m.default_num_ctx or s.context_length
        cap = m.spec.n_ctx_train or now
        if min(now, cap) != c:
            out[m.ref] = c
    return out


def _alternatives(
    models: Sequence[OllamaModel],
    s: Settings,
    hw: Hardware,
    headless: bool,
    target: int,
    loaded: Sequence[sched.Runner],
) -> tuple[str, ...]:
    """When no plan keeps them together at useful contexts: which model to leave out (the first one's context
    without it), and the smallest card of the catalogue that holds them all with the first at its target."""
    out = [_closest(models, s, hw, headless, target, loaded)]
    primary = models[0]
    for drop in models[1:]:
        rest = [m for m in models if m is not drop]
        t = plan_together(rest, hw, s, loaded=loaded, headless=headless, target_ctx=target, explain=False)
        if t.fits:
            ctx = t.own_ctx(primary.ref) or _loaded_ctx(t.final, primary.ref)
            out.append(f"without {drop.ref}: {primary.ref} at {ctx:,} tokens" if ctx else f"without {drop.ref}")
    card = _card_that_holds(models, s, hw, target)
    if card:
        out.append(card)
    return tuple(out)


def _closest(
    models: Sequence[OllamaModel],
    s: Settings,
    hw: Hardware,
    headless: bool,
    target: int,
    loaded: Sequence[sched.Runner],
) -> str:
    """What goes wrong in the smallest plan (the first model at 8k, the helpers at the least their job needs,
    the most quantized cache the server may take), with the numbers: what Ollama predicts against what is
    free, or what --fit would have to keep on the CPU."""
    kv = _kv_order(s, False, False)[-1]
    st = replace(s, kv_cache_type=kv)
    primary = models[0]
    ctxs = {h.ref: helper_contexts(h)[-1] for h in models[1:]}
    ctxs[primary.ref] = min(USEFUL_CTX, primary.spec.n_ctx_train or USEFUL_CTX)
    res = _replayer(models, hw, sched.scheduler_gpus(hw, headless=headless), loaded)(st, ctxs)
    at = ", ".join(f"{ref} {c:,}" for ref, c in ctxs.items())
    for step in res.steps:
        if step.action == "evict":
            return f"at the least ({at}; cache {kv}): {step.model} evicts {step.evicted}: {step.why}"
        if step.spilled:
            room = step.available_bytes / GIB
            need = sum(step.footprint_bytes) / GIB
            kept = next(
                (fit_target_bytes(m) for m in models if m.ref == step.model), rules.DEFAULT_FIT_TARGET_MIB * MIB
            )
            return (
                f"at the least ({at}; cache {kv}): {step.model} needs {need:.2f} GiB where {room:.2f} GiB is free "
                f"and llama-server's --fit keeps {kept // MIB:,} MiB of it free: part would run on the CPU"
            )
    return f"at the least ({at}; cache {kv}): they do not all stay loaded"


def _loaded_ctx(res: sched.Residency, ref: str) -> int | None:
    return next((r.num_ctx for r in res.resident if r.name == ref), None)


def _card_that_holds(models: Sequence[OllamaModel], s: Settings, hw: Hardware, target: int) -> str | None:
    """The smallest catalogue card (Apple's if this is one, else a discrete card) on which one replay keeps
    every model loaded, the first at its target, the helpers at the least their job needs, q8_0 where the
    server may quantize: the card to buy for this set."""
    from kvadvise.planner.gpus import load_profiles
    from kvadvise.planner.hardware import from_profile

    apple = any(g.unified_memory for g in hw.gpus)
    now = sum(g.total_bytes for g in hw.gpus)
    cards = sorted(
        (p for p in load_profiles() if p.unified_memory == apple and p.memory_bytes > now and not p.integrated),
        key=lambda p: (p.memory_bytes, p.bandwidth_bytes_per_s, p.id),
    )
    primary = models[0]
    ctx = min(target, primary.spec.n_ctx_train or target)
    ctxs = {h.ref: helper_contexts(h)[-1] for h in models[1:]} | {primary.ref: ctx}
    kv = "q8_0" if s.flash_attention else s.kv_cache_type
    from kvadvise.backends.ollama import envconfig

    overhead = envconfig.gpu_overhead_bytes()
    for p in cards:
        bigger = from_profile(p.id)
        st = replace(
            s,
            kv_cache_type=kv,
            context_length=rules.default_num_ctx(rules.tier_vram_bytes((bigger.gpus[0].total_bytes,), overhead)),
        )
        if stays(_replayer(models, bigger, sched.scheduler_gpus(bigger, headless=False), ())(st, ctxs), models):
            return f"a card of {p.memory_bytes / GIB:.0f} GiB ({p.id}) holds them all, {primary.ref} at {ctx:,} tokens"
    return None


@dataclass(frozen=True, slots=True)
class Combinations:
    """Which of the models fit in memory together, at the contexts they are written with."""

    refs: tuple[str, ...]  # the models, in the order named
    largest: tuple[tuple[str, ...], ...]  # the combinations that fit and are part of no larger one that does
    models_max: int  # the most models the router may hold such that every combination of that many fits
    over: tuple[tuple[str, ...], ...]  # combinations of models_max + 1 that do not fit: why it is not higher
    groups: tuple[tuple[str, ...], ...]  # the models cut into groups that each fit, in the order named
    alone_short: tuple[str, ...]  # models that do not fit even alone

    def fits(self, refs: Sequence[str]) -> bool:
        """``refs`` fit together: they are part of one of the largest combinations that fit."""
        return bool(refs) and any(set(refs) <= set(c) for c in self.largest)

    def kept_out(self) -> tuple[tuple[str, ...], ...]:
        """The largest combinations that fit but hold more models than the router's count allows."""
        return tuple(c for c in self.largest if len(c) > self.models_max)


def num_ctxs(t: Together) -> dict[str, int]:
    """Each model's num_ctx (per slot) as the plan runs it: the scheduler's runner, else the server's."""
    res, s = t.final, t.final_settings
    out = {}
    for m in t.models:
        runner = next((r for r in res.resident if r.name == m.ref), None)
        out[m.ref] = runner.num_ctx if runner is not None and runner.num_ctx else s.context_length
    return out


def routed(t: Together) -> list[RoutedModel]:
    """The same models for llama-server's router: the context, slots, cache type and batch of the plan, each
    pinned to the GPU the scheduler put it on (when one of several)."""
    from kvadvise.backends.ollama.runtime import readable_projector
    from kvadvise.runtime.router import RoutedModel

    res, s = t.final, t.final_settings
    ctxs = num_ctxs(t)
    out = []
    for m in t.models:
        step = next(st for st in reversed(res.steps) if st.model == m.ref and st.action in ("load", "reuse"))
        num_ctx = ctxs[m.ref]
        embedding = sched.is_embedding(m.spec)
        n_par = sched.slots(m.spec, s.num_parallel)
        cfg = rules.with_mtp_draft(
            rules.run_config(num_ctx, n_par, s.kv_cache_type, flash_attention=s.flash_attention), m
        )
        if step.num_batch:
            cfg = replace(cfg, n_batch=step.num_batch, n_ubatch=step.num_batch)
        device = sched.device_name(res.gpus, step.gpus[0]) if len(res.gpus) > 1 and len(step.gpus) == 1 else None
        path = m.spec.source if m.source.startswith("store:") else None
        projector = readable_projector(m) if path is not None else None
        if projector is not None:  # llm/llama_server.go passes a vision model's projector blob as --mmproj
            cfg = replace(cfg, mmproj=projector)
        also = tuple(other for ref, other in t.aliases if ref == m.ref)
        out.append(RoutedModel(m.ref, path, cfg, device, embedding, aliases=also))
    return out
