"""Several models on one Ollama server, shown: the plan first (each model's context, the server's settings,
how to apply them), then with ``--verbose`` every step of Ollama's scheduler at the settings asked and at
the plan's; or one JSON document. The plan is kvadvise.backends.ollama.together's."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvadvise.backends.ollama import scheduler as sched
from kvadvise.backends.ollama.together import GIB, Combinations, Settings, Together, stays
from kvadvise.text import wrapped


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


def env_lines(t: Together) -> list[tuple[str, str]]:
    """The server environment that keeps these models loaded together: only what differs from Ollama's
    defaults, and OLLAMA_KEEP_ALIVE=-1 so that an idle model is not unloaded after 5 minutes. Never a
    server-wide context the user did not give: each model that needs another has its own (a Modelfile)."""
    asked, s, n = t.settings, t.final_settings, len(t.models)
    env: list[tuple[str, str]] = []
    if asked.context_source != "Ollama's VRAM tier":
        env.append(("OLLAMA_CONTEXT_LENGTH", str(asked.context_length)))
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


def created_names(t: Together) -> dict[str, str]:
    """The name ``ollama create`` gives each model that needs its own context (qwen3-coder-16k); models whose names
    differ only by their namespace (alice/helper, bob/helper) keep it (alice-helper-4k), so that each gets a name, a
    Modelfile of its own, and one ``ollama create`` does not replace another's model."""
    from collections import Counter

    from kvadvise.backends.ollama.config import created_name

    by_ref = {m.ref: m for m in t.models}
    short = {ref: created_name(by_ref[ref], ctx) for ref, ctx in t.contexts}
    seen = Counter(short.values())
    return {
        ref: created_name(by_ref[ref], ctx, namespaced=True) if seen[short[ref]] > 1 else short[ref]
        for ref, ctx in t.contexts
    }


def _plan_rows(t: Together) -> list[str]:
    """One line per model: its context, where it is loaded and what it holds there."""
    res = t.final
    width = max(len(m.ref) for m in t.models)
    made = created_names(t)
    out = []
    for m in t.models:
        runner = next((r for r in res.resident if r.name == m.ref), None)
        ctx = runner.num_ctx if runner is not None and runner.num_ctx else t.final_settings.context_length
        held = "+".join(f"{b / GIB:.1f}" for b in runner.vram_bytes if b) if runner is not None else "0"
        where = _where([i for i, b in enumerate(runner.vram_bytes) if b]) if runner is not None else "-"
        how = f"its own: {made[m.ref]}" if m.ref in made else "as it loads now"
        if runner is not None and runner.spilled:
            how += "; partly on the CPU by --fit"
        out.append(f"  {m.ref:<{width}}  num_ctx {ctx:>7,}  {held:>5} GiB on {where}  ({how})")
    return out


def _asked_line(t: Together) -> str:
    """What goes wrong at the settings asked, in one line."""
    s = t.settings
    head = f"At the server's settings ({s.context_length:,} tokens, {s.kv_cache_type})"
    ev = next((st for st in t.asked.steps if st.action == "evict"), None)
    if ev is not None:
        return f"{head}: {ev.model} evicts {ev.evicted} ({ev.why})"
    spilled = next((st for st in t.asked.steps if st.spilled), None)
    if spilled is not None:
        return f"{head}: {spilled.model} does not fit beside the others (llama.cpp's --fit keeps layers on the CPU)"
    return f"{head}: they do not all stay loaded"


def together_text(t: Together, *, verbose: bool = False) -> str:
    s = t.settings
    names = [m.ref for m in t.models]
    lines = [
        f"{len(names)} model{'s' if len(names) != 1 else ''} on one Ollama server, requested in this order: "
        f"{', '.join(names)}",
        f"  {t.hardware_text}",
    ]
    if verbose:
        keep = _duration(s.keep_alive_s)
        lines += [
            f"  OLLAMA_MAX_LOADED_MODELS {t.asked.max_loaded} ({t.asked.max_loaded_source}); OLLAMA_NUM_PARALLEL "
            f"{s.num_parallel}; OLLAMA_KV_CACHE_TYPE {s.kv_cache_type}; keep-alive {keep}; context "
            f"{s.context_length:,} ({s.context_source}) unless the model sets num_ctx",
            "",
            f"Ollama's scheduler (server/sched.go) at context {s.context_length:,}:",
            *steps_text(t.asked),
            *residency_text(t.asked, names),
        ]
    if stays(t.asked, t.models) and s.keep_alive_s == 0:
        # envconfig.KeepAlive: zero is no keep-alive; sched.go unloads each runner once its request is done
        lines.append(
            "All fit together at the server's settings, but OLLAMA_KEEP_ALIVE=0 unloads each as soon as its "
            "request ends: the plan's OLLAMA_KEEP_ALIVE=-1 keeps them loaded."
        )
        if not verbose:
            lines += _plan_rows(t)
    elif stays(t.asked, t.models):
        lines.append("All stay loaded together at the server's settings.")
        if not verbose:
            lines += _plan_rows(t)
    elif t.recommended is not None:
        first = t.models[0].ref
        lines.append(_asked_line(t))
        lines.append(f"The plan that keeps them loaded ({first} gets the largest context that fits):")
        lines += _plan_rows(t)
        held = sum(sum(r.vram_bytes) for r in t.final.resident)
        total = sum(g.total_bytes for g in t.final.gpus)
        lines.append(f"  = {held / GIB:.1f} GiB of {total / GIB:.1f} GiB; Ollama's scheduler keeps them all loaded")
        lines += _why(t)
        if verbose:
            lines += ["", "Ollama's scheduler at the plan's settings:", *steps_text(t.recommended)]
    else:
        lines.append(_asked_line(t))
        lines.append(
            f"They do not all stay loaded together with {t.models[0].ref} at 8,192 tokens or more and the others at "
            "what their job needs (a smaller quantization of a model, fewer models, or more GPU memory would do):"
        )
        lines += [f"  {a}" for a in t.alternatives] or ["  (no smaller set or catalogue card found)"]
    lines += [f"note: {n}" for n in t.notes]
    if t.fits:
        lines += [
            "Server settings (--write-env FILE writes them):",
            "  " + "  ".join(f"{k}={v}" for k, v in env_lines(t)),
        ]
        made = created_names(t)
        if made:
            lines.append("Each model's own context (--write-modelfiles DIR writes a Modelfile each):")
            ctx = dict(t.contexts)
            for ref, name in made.items():
                lines.append(f'  ollama create {name} -f {name}.Modelfile  # or "options": {{"num_ctx": {ctx[ref]}}}')
            lines.append(f"  then ask for {', '.join(made.values())} by these names")
        lines.append("(--verbose: the scheduler step by step; --json; --write-preset FILE: llama-server's router)")
    # prose wrapped to ~100 columns; the settings and `ollama create` lines are commands, copied whole
    commands = ("ollama create ", "OLLAMA_")
    return "\n".join(r for row in lines for r in ([row] if row.lstrip().startswith(commands) else wrapped(row)))


def _why(t: Together) -> list[str]:
    """Why this cache type: what the first model reaches at each one tried."""
    if len(t.tried) < 2 and not (t.tried and t.tried[0][1] < t.target_ctx):
        return []
    first = t.models[0].ref
    said = "; ".join(f"{kv} {ctx:,}" if ctx else f"{kv} none" for kv, ctx in t.tried)
    return [f"  why: {first} beside the others, by cache type: {said} (target {t.target_ctx:,})"]


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
    fs: Settings = t.final_settings
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
        "target_ctx": t.target_ctx,
        "recommended_kv_cache_type": fs.kv_cache_type if t.recommended is not None else None,
        "recommended_contexts": dict(t.contexts),
        "modelfile_names": created_names(t),
        "recommended_max_loaded_models": t.recommended_max_loaded,
        "recommended": _residency_dict(t.recommended) if t.recommended is not None else None,
        "tried": [{"kv_cache_type": kv, "first_model_ctx": ctx} for kv, ctx in t.tried],
        "alternatives": list(t.alternatives),
        "fit_together": t.fits,
        "env": dict(env_lines(t)) if t.fits else {},
        "notes": list(t.notes),
        **({"router": _router_dict(t.combinations)} if t.combinations is not None else {}),
    }


def _router_dict(c: Combinations) -> dict[str, object]:
    """With --write-preset / --write-llama-swap: which combinations fit (kvadvise.backends.ollama.together_budget)."""
    return {
        "models_max": c.models_max,
        "not_together": [list(x) for x in c.over],
        "groups": [list(g) for g in c.groups],
        "largest": [list(x) for x in c.largest],
        "alone_short": list(c.alone_short),
    }
