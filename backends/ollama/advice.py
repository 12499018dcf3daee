"""Turn a plan into advice for an Ollama user: the settings Ollama takes, what
the server holds now, and the warnings that matter (memory-spec §6).

Ollama (>= 0.30) runs llama-server with ``-c num_ctx×num_parallel -np
num_parallel``, one OLLAMA_KV_CACHE_TYPE for K and V, server-wide, and
``--fit`` keeping LLAMA_ARG_FIT_TARGET MiB free (1024 by default; a vision
projector raises it to projector + 1 GiB).
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import api as ollama_api
from kvadvise.backends.ollama import envconfig
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.rules import (
    DEFAULT_FIT_TARGET_MIB,
    GIB,
    MIB,
    OllamaSettings,
    capped_num_ctx,
    default_num_ctx,
    num_ctx_per_slot,
    single_slot_archs,
)
from kvadvise.backends.ollama.versions import DEFAULT_NUM_CTX_BY_VRAM_FROM, OLD_DEFAULT_NUM_CTX
from kvadvise.errors import BackendUnreachable
from kvadvise.planner.planning import AdviceSummary, Plan
from kvadvise.text import lines as text_lines

if TYPE_CHECKING:  # an offload is planned only with --allow-cpu
    from kvadvise.backends.ollama.decision import OllamaDecision
    from kvadvise.backends.ollama.mlx import RunnerPlan
    from kvadvise.backends.ollama.versions import OllamaRelease
    from kvadvise.planner.offload import Offload


@dataclass(frozen=True, slots=True)
class LiveState:
    """What the Ollama server says now: its version and the models it holds (/api/ps)."""

    reachable: bool
    url: str
    version: str | None
    running: tuple[ollama_api.RunningModel, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OllamaAdvice:
    """A plan for one Ollama model, the settings that apply it, and the server's state."""

    model: OllamaModel
    plan: Plan
    settings: OllamaSettings
    live: LiveState
    warnings: tuple[str, ...]
    platform: str = "linux"  # how the apply hints are written: linux | macos | windows | docker
    runner: RunnerPlan | None = None  # on Apple Silicon: the runner that loads it (kvadvise.backends.ollama.mlx)
    # the Ollama release it is planned for: its runner, its llama.cpp, what kvadvise claims about it
    release: OllamaRelease | None = None
    # the release's own layer decision where kvadvise replays it (Ollama 0.7.1 - 0.24's llamarunner:
    # kvadvise.backends.ollama.decision)
    decision: OllamaDecision | None = None
    key = "ollama"  # its part of the plan's JSON document (kvadvise.planner.planning.RuntimeAdvice)

    def json_doc(self) -> dict[str, object]:
        return advice_dict(self)

    def summary(self) -> AdviceSummary:
        settings, notes, sources = advice_summary(self)
        return AdviceSummary("Settings (Ollama)", tuple(settings), tuple(notes), tuple(sources))

    def text(self) -> str:
        return advice_text(self)

    def next_steps(self, written: Sequence[tuple[str, str]]) -> tuple[str, tuple[str, ...]]:
        """What to run to apply it on its platform, given the files asked for as (option, path)."""
        paths = dict(written)
        steps = apply_steps(
            self,
            modelfile=paths.get("--write-modelfile"),
            env=paths.get("--write-env"),
            systemd=paths.get("--write-systemd"),
        )
        return f"Next ({self.platform}; --platform to choose):", steps

    @property
    def fits(self) -> bool:
        """False: nothing to apply (no plan that runs: it fits neither the GPU nor, partly on the CPU, the RAM)."""
        return self.plan.runnable is not False

    @property
    def offload(self) -> Offload | None:
        """The partial offload the settings are for (the plan does not fit the GPU alone), else None."""
        return self.plan.offload_to_run

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
        if (off := self.offload) is not None:
            what += f", part on the CPU ({_kept_text(off, p.spec.n_layer)})"
        return what


def live_state(host: str | None, timeout: float = ollama_api.DEFAULT_TIMEOUT) -> LiveState:
    url = ollama_api.server_url(host)
    try:
        running = ollama_api.running_models(url, timeout=timeout)
        version = ollama_api.server_version(url, timeout=timeout)
    except BackendUnreachable as e:
        said = e.message if url in e.message else f"no Ollama server answered at {url} ({e.message})"
        return LiveState(False, url, None, (), (f"{said}: live state not read",))
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
    release: OllamaRelease | None = None,
    server_vram_bytes: int | None = None,
    runner_num_batch: int = 0,
    fit_raise_bytes: int = 0,
) -> OllamaAdvice:
    """The settings for ``plan`` and the warnings that go with them, for Ollama ``release`` (None: the newest).
    ``server_vram_bytes``: the VRAM of every GPU the server sees (the plan may be on one of them).
    ``runner_num_batch``: the num_batch a runner inside Ollama's binary was planned with (its -ub, and its -b per
    slot from 0.13.3: not the plan's n_batch); 0: the plan's. ``fit_raise_bytes``: what Ollama raises its fit
    target by for the model's projector (kvadvise.backends.ollama.rules.projector_margin_bytes)."""
    cfg = plan.config
    off = plan.offload_to_run
    if off is not None:  # the plan that runs: part on the CPU, placed by Ollama's --fit
        num_ctx, kv_type, ram = off.n_ctx, off.type_k.type_name, off.ram
    else:
        # -c 0 is the training context, which Ollama runs when num_ctx is past it
        n_ctx = cfg.n_ctx or model.spec.n_ctx_train
        num_ctx, kv_type, ram = num_ctx_per_slot(n_ctx, cfg.n_parallel), cfg.type_k.type_name, plan.ram
    fit_target = None
    # the margin asked for: what Ollama adds to the fit target itself for a projector (``fit_raise_bytes``, the plan's
    # budget keeps it free) is not the user's to set, and LLAMA_ARG_FIT_TARGET on the server would override it for
    # every model (llm/llama_server.go extraEnvsForStart keeps an inherited value)
    margin = (
        plan.budget.margin_bytes // max(1, plan.budget.n_gpu) - fit_raise_bytes
        if plan.budget
        else DEFAULT_FIT_TARGET_MIB * MIB
    )
    if margin != DEFAULT_FIT_TARGET_MIB * MIB:
        fit_target = math.ceil(margin / MIB)
    settings = OllamaSettings(
        num_ctx=num_ctx,
        num_parallel=cfg.n_parallel,
        kv_cache_type=kv_type,
        # a partial offload keeps the plan's flash attention; a model Ollama refuses it to (in-process runners) is
        # left with it on: OLLAMA_FLASH_ATTENTION=0 would turn it off for every other model of the server
        flash_attention=cfg.flash_attn != "off"
        or (release is not None and release.refuses_flash_attention(model.spec)),
        # Ollama's own automatic num_batch (RunConfig.auto_batch) is not written: a num_batch would fix it
        num_batch=runner_num_batch or (cfg.n_batch if cfg.n_batch != 2048 and not cfg.auto_batch else None),
        fit_target_mib=fit_target,
        server_default=server_default,
        repeatable=repeatable,
        # a GPU plan, full or partial, is placed by llama.cpp's fit: a model's num_gpu would override it
        full_offload=cfg.device != "cpu",
        partial=off is not None,
        cache_ram_mib=ram.cache_ram_mib if ram is not None else None,
        ctx_checkpoints=ram.ctx_checkpoints if ram is not None else None,
        # an encoder (an embedding model) keeps no K/V cache: OLLAMA_KV_CACHE_TYPE is left to the server
        kv_cache=any(model.spec.kv_layers) or model.spec.has_recurrent,
    )
    from kvadvise.backends.ollama.config import env_effects

    runnable = plan.runnable is not False
    decision = None
    if release is not None and release.in_process and runnable:  # Ollama <= 0.12's own layer decision, replayed
        from kvadvise.backends.ollama.decision import decide

        decision = decide(model, plan, release, settings)
        if decision is not None and decision.num_gpu is not None:
            settings = replace(settings, num_gpu=decision.num_gpu)
    warnings: list[str] = env_effects(settings) if runnable else []
    if v := ollama_api.version_warning(live.version):
        warnings.append(v)
    if plan.budget is not None and plan.budget.device != "cpu" and runnable:
        # the VRAM of every GPU the server sees (server/routes.go), not only of the one the plan was placed on
        vram = server_vram_bytes or (sum(g.total_bytes for g in plan.hardware.gpus) if plan.hardware else 0)
        # less OLLAMA_GPU_OVERHEAD on each of them (server/routes.go Serve)
        n_gpus = len(plan.hardware.gpus) if plan.hardware and plan.hardware.gpus else 1
        vram = max(0, (vram or plan.budget.total_bytes) - n_gpus * envconfig.gpu_overhead_bytes())
        tier = default_num_ctx(vram, model.spec.n_ctx_train)
        if release is not None and release.v is not None and release.v < DEFAULT_NUM_CTX_BY_VRAM_FROM:
            tier = capped_num_ctx(OLD_DEFAULT_NUM_CTX, model.spec.n_ctx_train)
        if tier != num_ctx and model.default_num_ctx is None:
            warnings.append(
                # server/routes.go: the default num_ctx by the GPUs' total memory, capped at the training context
                f"without these settings Ollama runs {tier:,} tokens here (its default for this VRAM)"
            )
    # a LLAMA_ARG_CACHE_RAM the plan sets is said once, by env_effects (its server-wide warning)
    if decision is not None and decision.differs:
        warnings.append(f"Ollama's split: {decision.text()}")
    elif runnable and off is not None and release is not None and release.in_process and decision is None:
        warnings.append(
            f"part runs on the CPU: Ollama {release.version} picks how many layers itself ({release.layers_by}), "
            "which kvadvise does not model; `ollama ps` shows its split"
        )
    elif runnable and off is not None and release is not None and release.in_process and decision is not None:
        # no --fit before 0.30: the release's own estimate places the layers, here as the plan does
        warnings.append(
            f"part runs on the CPU: Ollama {release.version} puts {decision.layers_offload} of "
            f"{decision.layers_model} layers on the GPU itself ({release.layers_by}), as planned; leave num_gpu "
            "unset; `ollama ps` shows its split"
        )
    elif runnable and off is not None:
        warnings.append("part runs on the CPU: leave num_gpu unset (--fit places it; `ollama ps` shows the split)")
    single = single_slot_archs(release.v if release is not None else None)
    if cfg.n_parallel > 1 and model.spec.architecture in single:
        warnings.append(f"Ollama forces num_parallel = 1 for {model.spec.architecture}")
    if repeatable:
        warnings.append(
            "--repeatable: an f16 cache, seed and temperature 0 in the Modelfile, and one slot "
            "(OLLAMA_NUM_PARALLEL=1); API calls that send their own options override the Modelfile's"
        )
    return OllamaAdvice(model, plan, settings, live, tuple(warnings), platform, release=release, decision=decision)


def advice_dict(a: OllamaAdvice) -> dict[str, object]:
    from dataclasses import asdict

    from kvadvise.backends.ollama.config import env_lines, verify_command

    provenance = None
    if a.model.source.startswith("profile:"):
        from kvadvise.backends.ollama.profiles import profiles

        provenance = profiles()[a.model.source.removeprefix("profile:").lower()].provenance()
    doc: dict[str, object] = {
        "model": a.model.ref,
        "source": a.model.source,
        "provenance": provenance,
        "notes": list(a.model.notes),
        "settings": asdict(a.settings),
        "env": dict(env_lines(a.settings)),
        "modelfile_parameters": {"num_ctx": a.settings.num_ctx}
        | ({"num_batch": a.settings.num_batch} if a.settings.num_batch else {})
        | ({"num_gpu": a.settings.num_gpu} if a.settings.num_gpu is not None else {}),
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
        "verify_command": verify_command(a.created_name, a.settings) if a.fits and not _cpu_or_partial(a) else None,
    }
    if a.runner is not None:  # a Mac plan only: the other cards' documents are unchanged
        doc["runner"] = a.runner.json_doc()
    doc["release"] = a.release.json_doc() if a.release is not None else None
    if a.decision is not None:  # Ollama's own layer decision, replayed: claimed after all
        doc["release"] = (
            {**a.release.json_doc(), "claims_layers": True, "claims": a.release.claims(layers_replayed=True)}
            if a.release is not None
            else None
        )
    doc["decision"] = a.decision.json_doc() if a.decision is not None else None
    return doc


def apply_steps(
    a: OllamaAdvice, *, modelfile: str | None = None, env: str | None = None, systemd: str | None = None
) -> tuple[str, ...]:
    """What to run, in order, to apply the plan on ``a.platform``: the server settings (if any), the
    Modelfile, and the verify command. Nothing for a plan that does not fit."""
    from kvadvise.backends.ollama import config as oc

    if not a.fits:
        return ()
    steps = list(
        oc.apply_hints_server(a.settings, a.platform, env_path=env, dropin_path=systemd, gpu=oc.docker_gpu(a.plan))
    )
    mf = os.path.expanduser(modelfile) if modelfile else "Modelfile"  # the file written: a quoted ~ stays ~
    later = "" if modelfile else "  # --write-modelfile Modelfile writes it"  # as printed, the line runs
    if a.platform == "docker":  # the Modelfile is on the host, ollama in the container
        # docker cp reads NAME:PATH as a container's path: a local one with a ':' is given as ./NAME (its reference)
        local = mf if "/" in mf.split(":", 1)[0] or ":" not in mf else f"./{mf}"
        steps.append(f"docker cp {shlex.quote(local)} ollama:/tmp/Modelfile{later}")
        steps.append(f"docker exec ollama ollama create {a.created_name} -f /tmp/Modelfile")
    else:
        steps.append(f"ollama create {a.created_name} -f {shlex.quote(mf)}{later}")
    steps += oc.call_hints(a.created_name, a.settings)
    if _cpu_or_partial(a):  # `kvadvise verify ollama` checks a 100 % GPU plan
        where = "100% CPU" if not a.settings.partial else "a CPU/GPU split"
        steps.append(f"ollama run {a.created_name} '' && ollama ps  # PROCESSOR: {where}, as planned")
    else:
        steps.append(oc.verify_command(a.created_name, a.settings))
    return tuple(steps)


def _cpu_or_partial(a: OllamaAdvice) -> bool:
    """A plan that keeps part or all of the model on the CPU: `kvadvise verify ollama` checks a 100 % GPU plan."""
    return a.settings.partial or (a.plan.budget is not None and a.plan.budget.device == "cpu")


def advice_text(a: OllamaAdvice) -> str:
    from kvadvise.backends.ollama.config import env_lines, modelfile_header

    s = a.settings
    lines = ["", f"Ollama: {a.model.ref} ({a.model.source})"]
    lines += [f"  note: {n}" for n in a.model.notes]
    if a.fits:
        if (off := a.offload) is not None:
            fit = a.release is None or not a.release.in_process
            lines.append("  " + offload_text(off, a.plan.spec.n_layer, fit=fit))
        lines.append("  " + modelfile_header(s, a.planned_for).strip())
        lines.append(f"  {parameters_text(s)}")
        lines += [f"  {k}={v}" for k, v in env_lines(s)]
    elif a.plan.offload is not None:
        lines.append("  no settings to apply: the plan with part on the CPU does not fit the RAM either (see above)")
    else:
        lines.append("  no settings to apply: this plan does not fit (see above)")
    if a.live.reachable:
        lines.append(f"  server {a.live.url}" + (f" (version {a.live.version})" if a.live.version else ""))
        for r in a.live.running:
            lines.append(f"    loaded: {r.name}  {r.size / 1e9:.1f} GB  {r.processor}  ctx {r.context_length}")
    lines += [f"  note: {n}" for n in a.live.notes]
    lines += [f"  warning: {w}" for w in a.warnings]
    if a.decision is not None and not a.decision.differs:  # else a warning
        lines.append(f"  note: Ollama's split: {a.decision.text()}")
    if a.release is not None:
        lines.append(f"  planned for: {a.release.claims(layers_replayed=a.decision is not None)}")
    if a.runner is not None:
        lines += [f"  {line}" for line in a.runner.lines()]
    return text_lines(lines)  # a name, a note: one line each, whatever they hold


def advice_summary(a: OllamaAdvice) -> tuple[list[str], list[str], list[str]]:
    """The summary's parts (kvadvise.summary): the settings to apply (the Modelfile's, the server's, the
    warnings that go with them), the notes, and where the model was found."""
    from kvadvise.backends.ollama.config import env_lines

    s = a.settings
    settings: list[str] = []
    if a.fits:
        settings.append(f"Modelfile: {parameters_text(s)}")
        settings.append("server:    " + "  ".join(f"{k}={v}" for k, v in env_lines(s)))
        settings += [f"warning: {w}" for w in a.warnings]
    elif a.plan.offload is not None:
        settings.append("no settings to apply: the plan with part on the CPU does not fit the RAM either")
    else:
        settings.append("no settings to apply: this plan does not fit")
    notes = list(a.model.notes)
    if a.live.reachable:
        server = f"server {a.live.url}" + (f" (version {a.live.version})" if a.live.version else "")
        loaded = "; ".join(f"{r.name} {r.size / 1e9:.1f} GB {r.processor}" for r in a.live.running)
        notes.append(server + (f": loaded {loaded}" if loaded else ": nothing loaded"))
        notes += list(a.live.notes)
    else:  # one line for a server that did not answer (resolve and the live state both say so)
        notes = [n for n in notes if not n.startswith("the Ollama server could not be asked")]
        notes += list(a.live.notes)
    # a built-in profile names itself among the model's sources; a model found in a store or on a server here
    sources = [] if a.model.source.startswith("profile:") else [f"model: {a.model.ref} ({a.model.source})"]
    if a.decision is not None and not a.decision.differs:
        notes.append(f"Ollama's split: {a.decision.text()}")
    if a.release is not None and a.release.version:  # an unknown version: the newest, as the settings say
        notes.append(f"planned for: {a.release.claims(layers_replayed=a.decision is not None)}")
    if a.runner is not None:
        settings += a.runner.lines()
    return settings, notes, sources


def parameters_text(s: OllamaSettings) -> str:
    """The Modelfile's PARAMETER lines kvadvise sets, on one line."""
    said = [f"PARAMETER num_ctx {s.num_ctx}"]
    said += [f"PARAMETER num_batch {s.num_batch}"] if s.num_batch else []
    said += [f"PARAMETER num_gpu {s.num_gpu}"] if s.num_gpu is not None else []
    return "   ".join(said)


def _kept_text(off: Offload, n_layer: int) -> str:
    what = f"the experts of about {off.n_cpu_moe} layers" if off.n_cpu_moe else f"about {off.n_cpu_layers} layers"
    if off.n_cpu_moe and off.n_cpu_layers:
        what = f"the experts of all {n_layer} layers and about {off.n_cpu_layers} layers whole"
    return what


def offload_text(off: Offload, n_layer: int, *, fit: bool = True) -> str:
    """What Ollama does with a model that does not fit its GPU: since 0.30 it runs llama-server
    with --fit on and never passes -ngl unless num_gpu is set (memory-spec.md §6, server/llama_server.go),
    so llama.cpp's fit moves experts (MoE) or whole layers to the CPU by itself (common/fit.cpp). ``fit``
    False: an Ollama that runs the model in its own binary (0.11 to 0.24), whose estimate picks the split."""
    s = (
        f"the plan that runs keeps part of the model on the CPU: with these settings Ollama (>= 0.30) keeps "
        f"{_kept_text(off, n_layer)} on the CPU by itself (llama.cpp's --fit; leave num_gpu unset)"
    )
    if not fit:  # 0.11 to 0.24: Ollama's own estimate picks the layers (kvadvise.backends.ollama.versions)
        s = (
            f"the plan that runs keeps part of the model on the CPU (llama.cpp's fit: {_kept_text(off, n_layer)}); "
            "this Ollama picks its own split, which kvadvise does not model"
        )
    if off.speed is not None:
        s += f"; decode (estimate) {off.speed.at_depths()}"
    return s
