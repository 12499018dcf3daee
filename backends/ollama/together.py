"""``kvadvise ollama A B C``: several models on one Ollama server. Each is resolved as ``kvadvise ollama NAME``
resolves it, given the context Ollama loads it at, and the requests are replayed through Ollama's scheduler
(:mod:`kvadvise.backends.ollama.scheduler`): where each goes, which stay loaded together, which evicts
which. When they do not all stay loaded at Ollama's default context, the largest server-wide
``OLLAMA_CONTEXT_LENGTH`` at which they do is searched for. The settings that keep them loaded are printed
(and written with ``--write-env``), and the same set as a llama-server router preset (``--write-preset``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import click

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import rules
from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.errors import EXIT_NO_FIT, ConfigError
from kvadvise.ui import output

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvadvise.planner.hardware import Hardware
    from kvadvise.request import PlanRequest
    from kvadvise.ui.flags import Flags

GIB = rules.GIB
NAME_KEY = "name:"  # the model key of a model whose file is not known here (sched.go keys by the blob path)
MIN_CTX = 2048  # the smallest server-wide context the search offers (a vision model needs 2048 anyway)
# what `kvadvise ollama NAME` takes that has no meaning for several models at once (request fields)
SINGLE_MODEL_ONLY = (
    "use",
    "target_ctx",
    "min_ctx",
    "allow_cpu",
    "allow_q4",
    "repeatable",
    "no_hardware",
    "mmproj",
    "draft",
    "rpc",
)


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
    """Several models on one server: the replay at the settings asked, and at the context recommended."""

    models: tuple[OllamaModel, ...]
    settings: Settings
    asked: sched.Residency
    recommended_ctx: int | None  # the server-wide context at which all stay loaded, when the asked one fails
    recommended_max_loaded: int | None  # OLLAMA_MAX_LOADED_MODELS that keeps them, when the limit evicts one
    recommended: sched.Residency | None
    hardware_text: str
    notes: tuple[str, ...]

    @property
    def final(self) -> sched.Residency:
        return self.recommended if self.recommended is not None else self.asked

    @property
    def fits(self) -> bool:
        return self.final.together([m.ref for m in self.models])


def run(
    names: Sequence[str],
    f: Flags,
    *,
    host: str | None,
    write_env: str | None,
    write_preset: str | None,
    force: bool,
    single_model: tuple[str, ...] = (),
) -> None:
    """The command: resolve, replay, print, write."""
    from kvadvise.backends.ollama.resolve import resolve
    from kvadvise.ui.flags import given_flags

    r = f.request
    given = [*given_flags(r, SINGLE_MODEL_ONLY), *single_model]
    if f.view.chart or f.view.chart_file:
        given.append("--chart" if f.view.chart else "--chart-file")
    if given:
        raise click.UsageError(f"{', '.join(given)}: for one model; with several, give each its own run")
    kv = rules.one_cache_type(r.type_k, r.type_v) or os.environ.get("OLLAMA_KV_CACHE_TYPE", "").strip().lower() or "f16"
    if kv not in rules.KV_CACHE_TYPES:
        raise click.UsageError(f"OLLAMA_KV_CACHE_TYPE {kv!r}: Ollama takes one of {', '.join(rules.KV_CACHE_TYPES)}")
    hw = _hardware(r)
    with ollama_api.session():
        models = tuple(resolve(n, host=host) for n in names)
        loaded, live_note = _loaded_now(host, hw, r)
    t = plan_together(models, hw, settings(r, hw, kv), loaded=loaded, headless=r.headless)
    if live_note:
        t = replace(t, notes=(*t.notes, live_note))
    if f.view.as_json:
        output.result_json(together_dict(t))
    else:
        output.result(together_text(t))
    if not t.fits:
        if write_env or write_preset:
            output.note("nothing written: these models do not stay loaded together")
        raise click.exceptions.Exit(EXIT_NO_FIT)
    _write(t, write_env, write_preset, force)


def _hardware(r: PlanRequest) -> Hardware:
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


def settings(o: PlanRequest, hw: Hardware, kv: str) -> Settings:
    """The server's settings: the flags, else this shell's OLLAMA_* (as the server reads them when started
    here, envconfig/config.go), else Ollama's defaults."""
    env = os.environ
    if o.n_ctx:
        ctx, src = o.n_ctx, "--ctx"
    elif (v := env.get("OLLAMA_CONTEXT_LENGTH", "").strip()).isdigit() and int(v) > 0:
        ctx, src = int(v), "OLLAMA_CONTEXT_LENGTH"
    else:  # server/routes.go Serve: a tier by the GPUs' total memory
        ctx, src = rules.default_num_ctx(sum(g.total_bytes for g in hw.gpus)), "Ollama's VRAM tier"
    max_loaded = env.get("OLLAMA_MAX_LOADED_MODELS", "").strip()
    parallel = env.get("OLLAMA_NUM_PARALLEL", "").strip()
    n_parallel = o.n_parallel if o.n_parallel != 1 or not parallel.isdigit() else max(1, int(parallel))
    fa = env.get("OLLAMA_FLASH_ATTENTION", "").strip().lower() not in ("0", "false", "no", "off")
    if o.flash_attn == "off":
        fa = False
    return Settings(
        context_length=ctx,
        context_source=src,
        num_parallel=n_parallel,
        kv_cache_type=kv,
        flash_attention=fa,
        max_loaded=int(max_loaded) if max_loaded.isdigit() else 0,
        keep_alive_s=keep_alive_seconds(env.get("OLLAMA_KEEP_ALIVE", "")),
        spread=rules.sched_spread(),
    )


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(text: str) -> float:
    """envconfig.KeepAlive: a Go duration ("5m", "1h30m") or whole seconds; negative = forever; unset or
    unreadable = 5 minutes."""
    s = text.strip()
    if not s:
        return sched.DEFAULT_KEEP_ALIVE_S
    body = s.lstrip("+-")
    if body.isdigit():
        value = float(body)
    else:
        parts = _DURATION.findall(body)
        if not parts or "".join(n + u for n, u in parts) != body:
            return sched.DEFAULT_KEEP_ALIVE_S
        value = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if s.startswith("-"):
        value = -value
    return sched.FOREVER_S if value < 0 else value


def _loaded_now(host: str | None, hw: Hardware, o: PlanRequest) -> tuple[tuple[sched.Runner, ...], str | None]:
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


def request(m: OllamaModel, s: Settings, device: str, context_length: int) -> sched.Request:
    """``m`` as the scheduler gets it: its own num_ctx or the server's, the slots Ollama gives it."""
    from kvadvise.planner.memory import estimate

    spec = m.spec
    embedding = spec.architecture in sched.EMBEDDING_ARCHS
    num_ctx = max(4, m.default_num_ctx or context_length)  # getRunner: at least 4
    if m.projector_bytes or _vision_profile(m):
        num_ctx = max(num_ctx, 2048)  # a vision model needs 2048
    if spec.n_ctx_train and num_ctx > spec.n_ctx_train:
        num_ctx = spec.n_ctx_train  # effectiveContext: the runner holds at most the training context
    n_parallel = 1 if embedding or spec.architecture in rules.SINGLE_SLOT_ARCHS else s.num_parallel
    fit_target = rules.projector_margin_bytes(m) or rules.DEFAULT_FIT_TARGET_MIB * rules.MIB
    extra = m.projector_bytes  # Ollama passes the projector (--mmproj): it loads on the first device

    def footprint(n_ctx: int, batch: int, frees: tuple[int, ...]) -> tuple[int, ...]:
        cfg = rules.run_config(n_ctx, n_parallel, s.kv_cache_type, flash_attention=s.flash_attention)
        split = tuple(round(f / GIB, 2) or 0.01 for f in frees) if len(frees) > 1 else ()
        cfg = replace(cfg, n_batch=batch, n_ubatch=batch, device=device, tensor_split=split)  # -b = -ub
        devs = [d.total_bytes for d in estimate(spec, cfg).devices]
        devs[0] += extra
        return tuple(devs)

    model_key = spec.source if m.source.startswith("store:") else f"{NAME_KEY}{m.ref}"
    return sched.Request(
        name=m.ref,
        model_key=model_key,
        file_bytes=m.model_bytes or spec.weights_bytes,
        n_layer=spec.n_layer_all,
        n_embd=spec.n_embd,
        n_head_max=max(spec.n_head, default=0),
        n_head_kv_min=min(spec.n_head_kv, default=0),
        num_ctx=num_ctx,
        num_parallel=n_parallel,
        completion=not embedding,
        keep_alive_s=s.keep_alive_s,
        fit_target_bytes=fit_target,
        footprint=footprint,
        flash_attention=s.flash_attention,
        digest=m.digest,
    )


def _vision_profile(m: OllamaModel) -> bool:
    from kvadvise.backends.ollama.name import parse_name
    from kvadvise.backends.ollama.profiles import find_profile

    if not m.source.startswith("profile:"):
        return False
    p = find_profile(parse_name(m.ref))
    return p is not None and p.projector_bytes > 0


def scheduler_gpus(hw: Hardware, *, headless: bool) -> tuple[sched.Gpu, ...]:
    """The GPUs as the scheduler sees them: what each reports free, less what the plan keeps for a
    display (kvadvise.planner.budget: the one budget rule; the fit margin is the scheduler's own here)."""
    from kvadvise.planner.budget import plan_budget

    b = plan_budget(hw, 0, headless=headless)
    frees = b.device_budgets if len(b.device_budgets) == len(hw.gpus) else (b.budget_bytes,)
    return tuple(
        sched.Gpu(g.index, g.name, g.total_bytes, max(0, f), integrated=g.unified_memory, cuda=g.backend == "cuda")
        for g, f in zip(hw.gpus, frees, strict=True)
    )


def plan_together(
    models: Sequence[OllamaModel],
    hw: Hardware,
    s: Settings,
    *,
    loaded: Sequence[sched.Runner] = (),
    headless: bool = False,
) -> Together:
    """Replay the models' requests at the settings ``s``; when they do not all stay loaded and the context
    is Ollama's default (not --ctx), the largest server-wide context (a power of two) at which they do."""
    gpus = scheduler_gpus(hw, headless=headless)
    device = "metal" if hw.gpus[0].backend == "metal" else "cuda"

    def replay(ctx: int, max_loaded: int) -> sched.Residency:
        reqs = [request(m, s, device, ctx) for m in models]
        return sched.schedule(reqs, gpus, max_loaded=max_loaded, spread=s.spread, loaded=loaded)

    names = [m.ref for m in models]
    asked = replay(s.context_length, s.max_loaded)
    rec_ctx: int | None = None
    rec_max: int | None = None
    rec: sched.Residency | None = None
    if not asked.together(names):
        # the limit on loaded models evicted one of them: as many as the requests and what stays loaded now
        needed = len(names) + sum(1 for r in loaded if r.name not in names)
        if any(st.cause == "count" for st in asked.steps) and needed > asked.max_loaded:
            rec_max = needed
            r = replay(s.context_length, rec_max)
            rec = r if r.together(names) else None
        if rec is None and s.context_source != "--ctx" and any(m.default_num_ctx is None for m in models):
            ctx = 1 << (s.context_length - 1).bit_length() - 1 if s.context_length > MIN_CTX else 0
            while ctx >= MIN_CTX:
                r = replay(ctx, rec_max or s.max_loaded)
                if r.together(names):
                    rec_ctx, rec = ctx, r
                    break
                ctx //= 2
        if rec is None:
            rec_max = None
    notes = []
    own = [m.ref for m in models if m.default_num_ctx]
    if own:
        notes.append(f"{', '.join(own)}: the model's own num_ctx (its Modelfile), whatever the server's default")
    gpu_text = "; ".join(
        f"GPU {g.index} {g.name}: {g.total_bytes / GIB:.1f} GiB, {g.free_bytes / GIB:.1f} GiB free" for g in gpus
    )
    evicted = any(st.by_key for st in asked.steps)
    unknown_keys = any(r.model_key.startswith(NAME_KEY) for r in loaded) or any(
        not m.source.startswith("store:") for m in models
    )
    if evicted and unknown_keys:
        notes.append(
            "among runners with the same keep-alive Ollama evicts by the model file's path (blobs/sha256-...); "
            "for a model not in this machine's store that order is not known here, so the name stands in"
        )
    return Together(tuple(models), s, asked, rec_ctx, rec_max, rec, f"{gpu_text} ({hw.source})", tuple(notes))


# --- what to set ------------------------------------------------------------------------------------------


def env_lines(t: Together) -> list[tuple[str, str]]:
    """The server environment that keeps these models loaded together: only what differs from Ollama's
    defaults, and OLLAMA_KEEP_ALIVE=-1 so that an idle model is not unloaded after 5 minutes."""
    s, n = t.settings, len(t.models)
    env: list[tuple[str, str]] = []
    ctx = t.recommended_ctx or (s.context_length if s.context_source != "Ollama's VRAM tier" else None)
    if ctx:
        env.append(("OLLAMA_CONTEXT_LENGTH", str(ctx)))
    n_gpu = len(t.final.gpus)
    if t.recommended_max_loaded:
        env.append(("OLLAMA_MAX_LOADED_MODELS", str(t.recommended_max_loaded)))
    elif n > sched.default_max_loaded(n_gpu) or (s.max_loaded and s.max_loaded < n):
        env.append(("OLLAMA_MAX_LOADED_MODELS", str(n)))
    elif s.max_loaded:
        env.append(("OLLAMA_MAX_LOADED_MODELS", str(s.max_loaded)))
    env.append(("OLLAMA_KEEP_ALIVE", "-1"))
    if s.num_parallel > 1:
        env.append(("OLLAMA_NUM_PARALLEL", str(s.num_parallel)))
    if s.kv_cache_type != "f16":
        env += [("OLLAMA_FLASH_ATTENTION", "1"), ("OLLAMA_KV_CACHE_TYPE", s.kv_cache_type)]
    elif not s.flash_attention:
        env.append(("OLLAMA_FLASH_ATTENTION", "0"))
    if s.spread:
        env.append(("OLLAMA_SCHED_SPREAD", "1"))
    return env


def env_text(t: Together) -> str:
    head = (
        "# Ollama server settings written by kvadvise: "
        + ", ".join(m.ref for m in t.models)
        + " stay loaded together.\n"
    )
    return head + "".join(f"{k}={v}\n" for k, v in env_lines(t))


def routed(t: Together) -> list[Any]:
    """The same models for llama-server's router: the context, slots, cache type and batch of the plan, each
    pinned to the GPU the scheduler put it on (when one of several)."""
    from kvadvise.runtime.router import RoutedModel

    res = t.final
    out = []
    for m in t.models:
        step = next(st for st in reversed(res.steps) if st.model == m.ref and st.action in ("load", "reuse"))
        runner = next((r for r in res.resident if r.name == m.ref), None)
        num_ctx = runner.num_ctx if runner is not None and runner.num_ctx else t.settings.context_length
        embedding = m.spec.architecture in sched.EMBEDDING_ARCHS
        n_par = 1 if embedding or m.spec.architecture in rules.SINGLE_SLOT_ARCHS else t.settings.num_parallel
        cfg = rules.run_config(num_ctx, n_par, t.settings.kv_cache_type, flash_attention=t.settings.flash_attention)
        if step.num_batch:
            cfg = replace(cfg, n_batch=step.num_batch, n_ubatch=step.num_batch)
        device = f"CUDA{step.gpus[0]}" if len(res.gpus) > 1 and len(step.gpus) == 1 else None
        path = m.spec.source if m.source.startswith("store:") else None
        out.append(RoutedModel(m.ref, path, cfg, device, embedding))
    return out


def _write(t: Together, env_path: str | None, preset_path: str | None, force: bool) -> None:
    from kvadvise.backends.ollama import config as oc
    from kvadvise.files import check_targets, write_text_file
    from kvadvise.runtime.router import preset_text, router_command

    check_targets({"--write-env": env_path, "--write-preset": preset_path}, force=force)
    if env_path:
        p = write_text_file(env_path, env_text(t), force=force)
        output.note(f"wrote {p}; apply it with:")
        for h in oc.apply_hint_env(p):
            click.echo(output.safe(f"  {h}"), err=True)
    if preset_path:
        header = f"llama-server router preset written by kvadvise: {', '.join(m.ref for m in t.models)} loaded together"
        p = write_text_file(preset_path, preset_text(routed(t), header=header), force=force)
        output.note(f"wrote {p}; run it with:")
        click.echo(output.safe(f"  {router_command(str(p), len(t.models))}"), err=True)


# --- rendering ----------------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "forever"
    for unit, n in (("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds / n:g}{unit}"
    return f"{seconds:g}s"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _where(gpus: Sequence[int]) -> str:
    return "GPU " + "+".join(str(i) for i in gpus) if gpus else "the CPU"


def steps_text(res: sched.Residency) -> list[str]:
    out = []
    for i, st in enumerate(res.steps, 1):
        if st.action == "reuse":
            out.append(f"  {i}. {st.model}: {st.why}")
        elif st.action == "evict":
            out.append(f"  {i}. {st.model}: evicts {st.evicted} ({st.why})")
        else:
            plan = "+".join(f"{b / GIB:.1f}" for b in st.footprint_bytes)
            line = (
                f"  {i}. {st.model}: loads on {_where(st.gpus)} (num_batch {st.num_batch}); Ollama predicts "
                f"{_gib(st.predicted_bytes)}, kvadvise plans {plan} GiB; {st.why}"
            )
            if st.spilled:
                line += "; more than the GPU holds: llama-server's --fit keeps layers on the CPU"
            out.append(line)
    return out


def residency_text(res: sched.Residency, names: Sequence[str]) -> list[str]:
    loaded = [r for r in res.resident if r.name in names or r.preloaded]
    gone = [n for n in names if n not in {r.name for r in res.resident}]
    out = []
    for g in res.gpus:
        on = [r for r in loaded if g.index < len(r.vram_bytes) and r.vram_bytes[g.index]]
        held = sum(r.vram_bytes[g.index] for r in on)
        if on:
            out.append(
                f"  GPU {g.index} ({g.name}): "
                + ", ".join(
                    f"{r.name} {_gib(r.vram_bytes[g.index])}" + (" (part on the CPU)" if r.spilled else "") for r in on
                )
                + f" = {_gib(held)} of {_gib(g.total_bytes)}"
            )
    by = {a: b for a, b in res.evictions}
    for n in gone:
        out.append(f"  not loaded at the end: {n}" + (f" (evicted when {by[n]} loaded)" if n in by else ""))
    return out


def together_text(t: Together) -> str:
    s = t.settings
    names = [m.ref for m in t.models]
    keep = _duration(s.keep_alive_s)
    lines = [
        f"{len(names)} models on one Ollama server, requested in this order: {', '.join(names)}",
        f"  {t.hardware_text}",
        f"  OLLAMA_MAX_LOADED_MODELS {t.asked.max_loaded} ({t.asked.max_loaded_source}); OLLAMA_NUM_PARALLEL "
        f"{s.num_parallel}; OLLAMA_KV_CACHE_TYPE {s.kv_cache_type}; keep-alive {keep}; context {s.context_length:,} "
        f"({s.context_source}) unless the model sets num_ctx",
        "",
        f"Ollama's scheduler (server/sched.go) at context {s.context_length:,}:",
        *steps_text(t.asked),
        *residency_text(t.asked, names),
    ]
    if t.asked.together(names):
        lines.append("All stay loaded together.")
    elif t.recommended is not None:
        what = []
        if t.recommended_max_loaded:
            what.append(f"OLLAMA_MAX_LOADED_MODELS={t.recommended_max_loaded}")
        if t.recommended_ctx:
            what.append(
                f"OLLAMA_CONTEXT_LENGTH={t.recommended_ctx} (the largest power of two that works; models with "
                "their own num_ctx keep it)"
            )
        lines += [
            "",
            f"With {' and '.join(what)}:",
            *steps_text(t.recommended),
            *residency_text(t.recommended, names),
            "All stay loaded together.",
        ]
    else:
        lines.append(
            f"They do not all stay loaded together, even at {MIN_CTX:,} tokens: fewer models, a smaller quantization, "
            "-ctk q8_0 (OLLAMA_KV_CACHE_TYPE), or more GPU memory"
        )
    lines += [f"note: {n}" for n in t.notes]
    if t.fits:
        lines += ["", "Server settings (--write-env FILE writes them):", *(f"  {k}={v}" for k, v in env_lines(t))]
        lines.append(
            "  (keep-alive -1: an idle model is never unloaded; a request's own keep_alive overrides it. "
            "--write-preset FILE writes the same set as a llama-server router preset.)"
        )
    return "\n".join(lines)


def _residency_dict(res: sched.Residency) -> dict[str, object]:
    return {
        "max_loaded": res.max_loaded,
        "max_loaded_source": res.max_loaded_source,
        "steps": [
            {
                "model": st.model,
                "action": st.action,
                "gpus": list(st.gpus),
                "predicted_bytes": st.predicted_bytes,
                "available_bytes": st.available_bytes,
                "footprint_bytes": list(st.footprint_bytes),
                "num_batch": st.num_batch,
                "spilled": st.spilled,
                "evicted": st.evicted,
                "cause": st.cause or None,
                "why": st.why,
            }
            for st in res.steps
        ],
        "resident": [
            {
                "model": r.name,
                "vram_bytes": list(r.vram_bytes),
                "num_ctx": r.num_ctx,
                "spilled": r.spilled,
                "loaded_before": r.preloaded,
            }
            for r in res.resident
        ],
        "evictions": [list(e) for e in res.evictions],
    }


def together_dict(t: Together) -> dict[str, object]:
    s = t.settings
    return {
        "models": [
            {
                "model": m.ref,
                "source": m.source,
                "architecture": m.spec.architecture,
                "num_ctx_param": m.default_num_ctx,
            }
            for m in t.models
        ],
        "gpus": [
            {"index": g.index, "name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes}
            for g in t.final.gpus
        ],
        "settings": {
            "context_length": s.context_length,
            "context_source": s.context_source,
            "num_parallel": s.num_parallel,
            "kv_cache_type": s.kv_cache_type,
            "flash_attention": s.flash_attention,
            "max_loaded_models": s.max_loaded,
            "keep_alive_s": None if math.isinf(s.keep_alive_s) else s.keep_alive_s,
            "sched_spread": s.spread,
        },
        "asked": _residency_dict(t.asked),
        "recommended_context_length": t.recommended_ctx,
        "recommended_max_loaded_models": t.recommended_max_loaded,
        "recommended": _residency_dict(t.recommended) if t.recommended is not None else None,
        "fit_together": t.fits,
        "env": dict(env_lines(t)) if t.fits else {},
        "notes": list(t.notes),
    }
