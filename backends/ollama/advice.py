"""Turn a plan into advice for an Ollama user: the settings Ollama takes, what
the server holds now, and the warnings that matter (memory-spec §6).

Ollama (>= 0.30) runs llama-server with ``-c num_ctx×num_parallel -np
num_parallel``, one OLLAMA_KV_CACHE_TYPE for K and V, server-wide, and
``--fit`` keeping LLAMA_ARG_FIT_TARGET MiB free (1024 by default; a vision
projector raises it to projector + 1 GiB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.rules import (
    DEFAULT_FIT_TARGET_MIB,
    GIB,
    MIB,
    SINGLE_SLOT_ARCHS,
    OllamaSettings,
    default_num_ctx,
    num_ctx_per_slot,
)
from kvadvise.errors import BackendUnreachable
from kvadvise.planner.planning import Plan


@dataclass(frozen=True, slots=True)
class LiveState:
    reachable: bool
    url: str
    version: str | None
    running: tuple[ollama_api.RunningModel, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OllamaAdvice:
    model: OllamaModel
    plan: Plan
    settings: OllamaSettings
    live: LiveState
    warnings: tuple[str, ...]


def live_state(host: str | None, timeout: float = ollama_api.DEFAULT_TIMEOUT) -> LiveState:
    url = ollama_api.server_url(host)
    try:
        running = ollama_api.running_models(url, timeout=timeout)
        version = ollama_api.server_version(url, timeout=timeout)
    except BackendUnreachable as e:
        return LiveState(
            False, url, None, (), (f"no Ollama server answered at {url} ({e.message}); live state not read",)
        )
    notes = []
    if running:
        held = sum(r.size_vram for r in running)
        notes.append(
            f"{len(running)} model(s) already loaded hold {held / GIB:.2f} GiB of GPU memory "
            "(free memory already excludes it; unloading them frees it)"
        )
    return LiveState(True, url, version, running, tuple(notes))


def advise(model: OllamaModel, plan: Plan, live: LiveState) -> OllamaAdvice:
    cfg = plan.config
    num_ctx = num_ctx_per_slot(cfg.n_ctx, cfg.n_parallel)
    fit_target = None
    margin = plan.budget.margin_bytes // max(1, plan.budget.n_gpu) if plan.budget else DEFAULT_FIT_TARGET_MIB * MIB
    if margin != DEFAULT_FIT_TARGET_MIB * MIB:
        fit_target = math.ceil(margin / MIB)
    settings = OllamaSettings(
        num_ctx=num_ctx,
        num_parallel=cfg.n_parallel,
        kv_cache_type=cfg.type_k.type_name,
        flash_attention=cfg.flash_attn != "off",
        num_batch=cfg.n_batch if cfg.n_batch != 2048 else None,
        fit_target_mib=fit_target,
        full_offload=cfg.device == "cuda",
    )
    warnings: list[str] = []
    if settings.kv_is_server_wide:
        warnings.append(
            f"OLLAMA_KV_CACHE_TYPE={settings.kv_cache_type} is server-wide: every model this server runs gets a "
            f"{settings.kv_cache_type} cache"
        )
    if v := ollama_api.version_warning(live.version):
        warnings.append(v)
    if plan.budget is not None and plan.budget.device == "cuda":
        tier = default_num_ctx(plan.budget.total_bytes)
        if tier != num_ctx and model.default_num_ctx is None:
            warnings.append(
                f"without these settings Ollama would run {tier:,} tokens on this card (its VRAM tier default)"
            )
    if cfg.n_parallel > 1 and model.spec.architecture in SINGLE_SLOT_ARCHS:
        warnings.append(f"Ollama forces num_parallel = 1 for {model.spec.architecture}")
    return OllamaAdvice(model, plan, settings, live, tuple(warnings))


def advice_dict(a: OllamaAdvice) -> dict[str, object]:
    from dataclasses import asdict

    from kvadvise.backends.ollama.config import env_lines

    return {
        "model": a.model.ref,
        "source": a.model.source,
        "notes": list(a.model.notes),
        "settings": asdict(a.settings),
        "env": dict(env_lines(a.settings)),
        "modelfile_parameters": {"num_ctx": a.settings.num_ctx}
        | ({"num_batch": a.settings.num_batch} if a.settings.num_batch else {}),
        "server": {
            "url": a.live.url,
            "reachable": a.live.reachable,
            "version": a.live.version,
            "running": [
                {
                    "name": r.name,
                    "size": r.size,
                    "size_vram": r.size_vram,
                    "processor": r.processor,
                    "context_length": r.context_length,
                }
                for r in a.live.running
            ],
            "notes": list(a.live.notes),
        },
        "warnings": list(a.warnings),
    }


def advice_text(a: OllamaAdvice) -> str:
    from kvadvise.backends.ollama.config import env_lines

    s = a.settings
    lines = ["", f"Ollama: {a.model.ref} ({a.model.source})"]
    lines += [f"  note: {n}" for n in a.model.notes]
    lines.append(f"  PARAMETER num_ctx {s.num_ctx}" + (f"   PARAMETER num_batch {s.num_batch}" if s.num_batch else ""))
    lines += [f"  {k}={v}" for k, v in env_lines(s)]
    if a.live.reachable:
        lines.append(f"  server {a.live.url}" + (f" (version {a.live.version})" if a.live.version else ""))
        for r in a.live.running:
            lines.append(f"    loaded: {r.name}  {r.size / 1e9:.1f} GB  {r.processor}  ctx {r.context_length}")
    lines += [f"  note: {n}" for n in a.live.notes]
    lines += [f"  warning: {w}" for w in a.warnings]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    hints: tuple[str, ...]  # how to apply it


def write_files(
    a: OllamaAdvice, *, modelfile: str | None, env: str | None, systemd: str | None, force: bool
) -> tuple[Written, ...]:
    """Write what was asked for; never overwrite without ``force`` (kvadvise.files)."""
    from kvadvise.backends.ollama import config as oc
    from kvadvise.files import write_text_file

    s, out = a.settings, []
    if modelfile:
        p = write_text_file(modelfile, oc.modelfile_text(a.model, s), force=force)
        out.append(Written(p, (oc.apply_hint_modelfile(a.model, s, p),)))
    if env:
        p = write_text_file(env, oc.env_text(s), force=force)
        out.append(Written(p, oc.apply_hint_env(p)))
    if systemd:
        p = write_text_file(systemd, oc.systemd_text(s), force=force)
        out.append(Written(p, oc.apply_hint_systemd(p)))
    return tuple(out)
