"""Turn a plan into advice for an Ollama user: the settings Ollama takes, what
the server holds now, and the warnings that matter (memory-spec §6).

Ollama (>= 0.30) runs llama-server with ``-c num_ctx×num_parallel -np
num_parallel``, one OLLAMA_KV_CACHE_TYPE for K and V, server-wide, and
``--fit`` keeping LLAMA_ARG_FIT_TARGET MiB free (1024 by default; a vision
projector raises it to projector + 1 GiB).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
from kvadvise.text import lines as text_lines

if TYPE_CHECKING:  # an offload is planned only with --allow-cpu
    from kvadvise.files import NewFile
    from kvadvise.planner.offload import Offload


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
    platform: str = "linux"  # how the apply hints are written: linux | macos | windows | docker

    @property
    def fits(self) -> bool:
        """False: nothing to apply (the plan does not fit)."""
        return self.plan.fits is not False

    @property
    def created_name(self) -> str:
        from kvadvise.backends.ollama.config import created_name

        return created_name(self.model, self.settings.num_ctx)

    @property
    def planned_for(self) -> str:
        p, s = self.plan, self.settings
        what = f"{s.num_ctx:,} tokens per slot"
        if s.num_parallel > 1:
            what += f" × {s.num_parallel} slots"
        if p.budget is not None and p.hardware is not None:
            dev = p.hardware.gpus[0].name if len(p.hardware.gpus) == 1 else p.hardware.source
            if not p.hardware.gpus:
                dev = "the CPU"
            what += f" on {dev} ({p.budget.budget_bytes / GIB:.2f} GiB budget)"
        return what


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


def advise(
    model: OllamaModel,
    plan: Plan,
    live: LiveState,
    *,
    server_default: bool = False,
    repeatable: bool = False,
    platform: str = "linux",
) -> OllamaAdvice:
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
        server_default=server_default,
        repeatable=repeatable,
        full_offload=cfg.device != "cpu",
    )
    from kvadvise.backends.ollama.config import env_effects

    warnings: list[str] = env_effects(settings) if plan.fits is not False else []
    if v := ollama_api.version_warning(live.version):
        warnings.append(v)
    if plan.budget is not None and plan.budget.device != "cpu" and plan.fits is not False:
        tier = default_num_ctx(plan.budget.total_bytes)
        if tier != num_ctx and model.default_num_ctx is None:
            warnings.append(
                f"without these settings Ollama would run {tier:,} tokens on this card (its VRAM tier default)"
            )
    if cfg.n_parallel > 1 and model.spec.architecture in SINGLE_SLOT_ARCHS:
        warnings.append(f"Ollama forces num_parallel = 1 for {model.spec.architecture}")
    if repeatable:
        warnings.append(
            "--repeatable: an f16 cache, seed and temperature 0 in the Modelfile, and one slot "
            "(OLLAMA_NUM_PARALLEL=1); API calls that send their own options override the Modelfile's"
        )
    return OllamaAdvice(model, plan, settings, live, tuple(warnings), platform)


def advice_dict(a: OllamaAdvice) -> dict[str, object]:
    from dataclasses import asdict

    from kvadvise.backends.ollama.config import env_lines, verify_command

    provenance = None
    if a.model.source.startswith("profile:"):
        from kvadvise.backends.ollama.profiles import profiles

        provenance = profiles()[a.model.source.removeprefix("profile:").lower()].provenance()
    return {
        "model": a.model.ref,
        "source": a.model.source,
        "provenance": provenance,
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
        "platform": a.platform,
        "apply": list(apply_steps(a)),
        "verify_command": verify_command(a.created_name, a.settings) if a.fits else None,
    }


def apply_steps(
    a: OllamaAdvice, *, modelfile: str | None = None, env: str | None = None, systemd: str | None = None
) -> tuple[str, ...]:
    """What to run, in order, to apply the plan on ``a.platform``: the server settings (if any), the
    Modelfile, and the verify command. Nothing for a plan that does not fit."""
    from kvadvise.backends.ollama import config as oc

    if not a.fits:
        return ()
    steps = list(oc.apply_hints_server(a.settings, a.platform, env_path=env, dropin_path=systemd))
    mf = modelfile or "Modelfile"
    steps.append(
        f"ollama create {a.created_name} -f {shlex.quote(mf)}" + ("" if modelfile else "  (--write-modelfile)")
    )
    steps.append(oc.verify_command(a.created_name, a.settings))
    return tuple(steps)


def advice_text(a: OllamaAdvice) -> str:
    from kvadvise.backends.ollama.config import env_lines, modelfile_header

    s = a.settings
    lines = ["", f"Ollama: {a.model.ref} ({a.model.source})"]
    lines += [f"  note: {n}" for n in a.model.notes]
    if a.fits:
        lines.append("  " + modelfile_header(s, a.planned_for).strip())
        lines.append(
            f"  PARAMETER num_ctx {s.num_ctx}" + (f"   PARAMETER num_batch {s.num_batch}" if s.num_batch else "")
        )
        lines += [f"  {k}={v}" for k, v in env_lines(s)]
    elif (off := a.plan.offload) is not None:
        lines.append("  " + offload_text(off, a.plan.spec.n_layer))
    else:
        lines.append("  no settings to apply: this plan does not fit (see above)")
    if a.live.reachable:
        lines.append(f"  server {a.live.url}" + (f" (version {a.live.version})" if a.live.version else ""))
        for r in a.live.running:
            lines.append(f"    loaded: {r.name}  {r.size / 1e9:.1f} GB  {r.processor}  ctx {r.context_length}")
    lines += [f"  note: {n}" for n in a.live.notes]
    lines += [f"  warning: {w}" for w in a.warnings]
    return text_lines(lines)  # a name, a note: one line each, whatever they hold


def offload_text(off: Offload, n_layer: int) -> str:
    """What Ollama does with a model that does not fit its GPU: since 0.30 it runs llama-server
    with --fit on and never passes -ngl unless num_gpu is set (memory-spec.md §6, server/llama_server.go),
    so llama.cpp's fit moves experts (MoE) or whole layers to the CPU by itself (common/fit.cpp)."""
    kv = off.type_k.type_name
    what = f"the experts of about {off.n_cpu_moe} layers" if off.n_cpu_moe else f"about {off.n_cpu_layers} layers"
    if off.n_cpu_moe and off.n_cpu_layers:
        what = f"the experts of all {n_layer} layers and about {off.n_cpu_layers} layers whole"
    s = (
        f"with part on the CPU (--allow-cpu), by hand: PARAMETER num_ctx {off.n_ctx}"
        + (f", OLLAMA_KV_CACHE_TYPE={kv}, OLLAMA_FLASH_ATTENTION=1" if kv != "f16" else "")
        + f"; Ollama (>= 0.30) then keeps {what} on the CPU by itself (llama.cpp's --fit; leave num_gpu unset)"
    )
    if off.speed is not None:
        s += f", decode {off.speed.at_depths()}"
    return s + "; nothing is written for a plan that does not fit the GPU"


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    hints: tuple[str, ...]  # how to apply it


def write_files(
    a: OllamaAdvice,
    *,
    modelfile: str | None,
    env: str | None,
    systemd: str | None,
    force: bool,
    extra: Sequence[NewFile] = (),
) -> tuple[Written, ...]:
    """Write what was asked for (and ``extra``: the --chart-file image), all or none; never overwrite
    without ``force`` (kvadvise.files.write_files)."""
    from kvadvise.backends.ollama import config as oc
    from kvadvise.files import text_file
    from kvadvise.files import write_files as write_all

    s = a.settings
    files = list(extra)
    if modelfile is not None:
        text = oc.modelfile_text(a.model, s, oc.modelfile_header(s, a.planned_for))
        files.append(text_file("--write-modelfile", modelfile, text))
    if env is not None:
        files.append(text_file("--write-env", env, oc.env_text(s)))
    if systemd is not None:
        files.append(text_file("--write-systemd", systemd, oc.systemd_text(s)))
    out = []
    for f, p in zip(files, write_all(files, force=force), strict=True):
        if f.option == "--write-modelfile":
            out.append(Written(p, (oc.apply_hint_modelfile(a.model, s, p),)))
        elif f.option == "--write-env":
            hints = oc.apply_hints_server(s, a.platform, env_path=p) if a.platform in ("docker", "linux") else ()
            out.append(Written(p, hints or oc.apply_hint_env(p)))
        elif f.option == "--write-systemd":
            name = p.name if p.parent == oc.SYSTEMD_DROPIN_DIR else oc.dropin_name(p)
            conflicts = tuple(f"warning: {c}" for c in oc.override_conflicts(s, name))
            out.append(Written(p, oc.apply_hint_systemd(p) + conflicts))
        else:
            out.append(Written(p, ()))
    return tuple(out)
