"""Pure text builders: an estimate -> the JSON document or the human table.

The JSON keys are documented in docs/json.md and docs/schema/ (a test holds each document to its schema); other tools rely on them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvadvise.model.spec import ModelSpec
from kvadvise.planner.budget import Budget
from kvadvise.planner.memory import MemoryEstimate, RunConfig
from kvadvise.planner.offload import offload_flags
from kvadvise.planner.planning import Plan
from kvadvise.planner.policy import Option, needs_opt_in
from kvadvise.planner.recommender import Recommendation
from kvadvise.text import lines as text_lines

if TYPE_CHECKING:  # only verification output needs it; a plan renders without loading the log parser
    from kvadvise.planner.curves import Curve
    from kvadvise.planner.hostram import HostRam
    from kvadvise.planner.offload import Offload
    from kvadvise.planner.prefill import PrefillEstimate
    from kvadvise.planner.speed import SpeedEstimate
    from kvadvise.planner.users import Sessions, UsersAnswer
    from kvadvise.runtime.verification import Verification

LLAMA_CPP_BUILD = "llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36)"


def fmt_bytes(n: int) -> str:
    """Binary units, as llama.cpp prints them (MiB with two decimals)."""
    if n == 0:
        return "0"
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if abs(n) >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if abs(n) >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n} B"


def _per_layer(values: tuple[int, ...]) -> int | list[int]:
    return values[0] if len(set(values)) == 1 else list(values)


def model_dict(spec: ModelSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "architecture": spec.architecture,
        "source": spec.source,
        "n_layer": spec.n_layer_all,
        "n_layer_nextn": spec.n_layer_nextn,
        "n_ctx_train": spec.n_ctx_train,
        "n_vocab": spec.n_vocab,
        "n_embd": spec.n_embd,
        "n_head": _per_layer(spec.n_head),
        "n_head_kv": _per_layer(spec.n_head_kv),
        "n_embd_head_k": spec.n_embd_head_k,
        "n_embd_head_v": spec.n_embd_head_v,
        "n_swa": spec.n_swa,
        "swa_type": spec.swa_type,
        "n_layer_swa": sum(spec.swa_layers),
        "n_layer_kv": sum(spec.kv_layers),
        "n_layer_recurrent": sum(spec.recurrent_layers),
        "is_mla": spec.is_mla,
        "n_expert": spec.n_expert,
        "n_expert_used": spec.n_expert_used,
        "file_type": spec.file_type,
        "verified": spec.verified,
        "notes": list(spec.notes),
        "sources": list(spec.sources),
    }


def estimate_dict(
    spec: ModelSpec, cfg: RunConfig, est: MemoryEstimate, device_budgets: tuple[int, ...] = ()
) -> dict[str, Any]:
    lay = est.layout
    return {
        "model": model_dict(spec),
        "config": {
            "n_ctx": lay.n_ctx,
            "n_ctx_requested": cfg.n_ctx or spec.n_ctx_train,
            "n_ctx_seq": lay.n_ctx_seq,
            "n_ctx_swa": lay.n_ctx_swa,
            "n_parallel": lay.n_seq_max,
            "kv_unified": lay.kv_unified,
            "n_batch": lay.n_batch,
            "n_ubatch": lay.n_ubatch,
            "n_outputs_max": lay.n_outputs_max,
            "runtime": cfg.runtime,
            "type_k": lay.type_k.type_name,
            "type_v": lay.type_v.type_name,
            "flash_attn": lay.flash_attn,
            "swa_full": lay.swa_full,
            "device": lay.device,
            "cpu_repack": cfg.cpu_repack,
        },
        "memory": {
            "k_bytes": est.k_bytes,
            "v_bytes": est.v_bytes,
            "kv_bytes": est.kv_bytes,
            "recurrent_bytes": est.recurrent_bytes,
            "kv_bytes_per_token": est.kv_bytes_per_token,
            "weights_bytes": est.weights_bytes,
            "compute_bytes": est.compute_bytes,
            "output_bytes": est.output_bytes,
            "overhead_bytes": est.overhead_bytes,
            "total_bytes": est.total_bytes,
            "device_bytes": est.device_bytes,
            "host_bytes": est.host_bytes,
            "repack_bytes": est.repack_bytes,
            "amx_bytes": est.amx_bytes,
            "devices": [
                {
                    "name": d.name,
                    "n_layers": d.n_layers,
                    "weights_bytes": d.weights_bytes,
                    "kv_bytes": d.kv_bytes,
                    "recurrent_bytes": d.recurrent_bytes,
                    "compute_bytes": d.compute_bytes,
                    "overhead_bytes": d.overhead_bytes,
                    "total_bytes": d.total_bytes,
                    "projector_bytes": d.projector_bytes,
                    "draft_bytes": d.draft_bytes,
                    "budget_bytes": device_budgets[i] if i < len(device_budgets) else None,
                }
                for i, d in enumerate(est.devices)
            ],
            "host": {
                "weights_bytes": est.host.weights_bytes,
                "compute_bytes": est.host.compute_bytes,
                "output_bytes": est.host.output_bytes,
                "total_bytes": est.host.total_bytes,
                "projector_bytes": est.host.projector_bytes,
                "draft_bytes": est.host.draft_bytes,
            },
            "draft": None
            if est.draft is None or (cfg.draft is None and not cfg.mtp)
            else {
                # -md: a draft model; --spec-type draft-mtp: the model's own MTP head (kvadvise.planner.mtp)
                "kind": "model" if cfg.draft is not None else "mtp",
                "model": cfg.draft.name if cfg.draft is not None else f"{spec.name} MTP head",
                "source": cfg.draft.source if cfg.draft is not None else spec.source,
                "n_max": cfg.spec_draft_n_max,
                "nextn_weights_bytes": sum(spec.nextn_layer_bytes) if cfg.mtp else 0,
                "n_ctx": est.draft.layout.n_ctx,
                "type_k": est.draft.layout.type_k.type_name,
                "type_v": est.draft.layout.type_v.type_name,
                "flash_attn": est.draft.layout.flash_attn,
                "weights_bytes": est.draft.weights_bytes,
                "kv_bytes": est.draft.kv_bytes,
                "recurrent_bytes": est.draft.recurrent_bytes,
                "compute_bytes": est.draft.compute_bytes,
                "output_bytes": est.draft.output_bytes,
                "total_bytes": est.draft.total_bytes,
            },
            "projector": None
            if est.projector is None or cfg.mmproj is None
            else {
                "source": cfg.mmproj.source,
                "projector_type": cfg.mmproj.projector_type,
                "weights_bytes": est.projector.weights_bytes,
                "compute_bytes": est.projector.compute_bytes,
                "host_compute_bytes": est.projector.host_compute_bytes,
                "compute_note": est.projector.compute_note,
            },
            "caches": [
                {"kind": c.kind, "cells": c.cells, "n_layer": c.n_layers, "k_bytes": c.k_bytes, "v_bytes": c.v_bytes}
                for c in est.caches
            ],
        },
        "budget": None,
        "fits": None,
        "reasons": [],
        "rules": LLAMA_CPP_BUILD,
    }


def _device_label(cfg: RunConfig, device: str) -> str:
    """``cuda``, or the backend a non-NVIDIA card runs CUDA's rules under: ``cuda (ROCm)``."""
    names = cfg.device_names
    if device == "cuda" and names and not names[0].startswith("CUDA"):
        return f"cuda ({names[0].rstrip('0123456789')})"
    return device


def estimate_text(spec: ModelSpec, cfg: RunConfig, est: MemoryEstimate) -> str:
    lay = est.layout
    asked = cfg.n_ctx or spec.n_ctx_train
    head = (
        f"{spec.name}  ({spec.architecture}, {spec.n_layer_all} layers, {spec.n_vocab:,} vocab, "
        f"trained on {spec.n_ctx_train:,} tokens)"
    )
    ctx = f"n_ctx {lay.n_ctx:,}" + (f" (asked {asked:,}; llama.cpp pads to 256)" if lay.n_ctx != asked else "")
    seqs = f"{lay.n_seq_max} sequence" + ("s" if lay.n_seq_max > 1 else "")
    if lay.n_seq_max > 1:
        seqs += ", unified cache" if lay.kv_unified else f", {lay.n_ctx_seq:,} cells each"
    parts = [
        ctx,
        seqs,
        f"K {lay.type_k.type_name} / V {lay.type_v.type_name}",
        f"flash attention {'on' if lay.flash_attn else 'off'}",
        f"batch {lay.n_batch}/{lay.n_ubatch}",
        f"device {_device_label(cfg, lay.device)}",
    ]
    if spec.has_swa:
        parts.append(f"SWA cache {lay.n_ctx_swa:,} cells" + (" (--swa-full)" if lay.swa_full else ""))
    cache_note = " + ".join(
        f"{c.n_layers} {'SWA' if c.kind == 'swa' else 'full'} layers × {c.cells:,}" for c in est.caches
    )
    host = est.host
    devs = est.devices if lay.device != "cpu" else ()
    # (label, total, per device, in system RAM, note); the device and host columns only for a GPU run
    rows: list[tuple[str, int, list[int | None], int, str] | None] = [
        ("weights", est.weights_bytes, [d.weights_bytes for d in devs], host.weights_bytes, spec.file_type + (
            f", of which {_extra_buffers(est)} ({cfg.cpu_repack} layouts)" if est.repack_bytes else "")),
        ("K cache", est.k_bytes, [est.k_bytes if len(devs) == 1 else None for _ in devs], 0,
         cache_note + (" cells" if cache_note else "")),
        ("V cache", est.v_bytes, [est.v_bytes if len(devs) == 1 else None for _ in devs], 0,
         "none: MLA keeps only K" if spec.is_mla else ""),
        ("K+V", est.kv_bytes, [d.kv_bytes for d in devs], 0, "per device") if len(devs) > 1 else None,
        ("recurrent", est.recurrent_bytes, [d.recurrent_bytes for d in devs], 0,
         f"{sum(spec.recurrent_layers)} layers" if spec.has_recurrent else ""),
        ("compute", est.compute_bytes, [d.compute_bytes for d in devs], host.compute_bytes, "estimate"),
        ("output", est.output_bytes, [0 for _ in devs], host.output_bytes, "logits"),
        ("projector", sum(d.projector_bytes for d in est.devices) + host.projector_bytes,
         [d.projector_bytes for d in devs], host.projector_bytes,
         f"--mmproj {cfg.mmproj.projector_type}: weights {fmt_bytes(est.projector.weights_bytes)} + compute "
         f"{fmt_bytes(est.projector.compute_bytes + est.projector.host_compute_bytes)} (estimate)")
        if est.projector is not None and cfg.mmproj is not None else None,
        ("draft", est.draft.total_bytes, [d.draft_bytes for d in devs], host.draft_bytes,
         f"-md {cfg.draft.name}: weights {fmt_bytes(est.draft.weights_bytes)}, KV {fmt_bytes(est.draft.kv_bytes)} "
         f"({cfg.type_k_draft.type_name}/{cfg.type_v_draft.type_name}), compute {fmt_bytes(est.draft.compute_bytes)}, "
         f"output {fmt_bytes(est.draft.output_bytes)}")
        if est.draft is not None and cfg.draft is not None else None,
        ("MTP", est.draft.total_bytes, [d.draft_bytes for d in devs], host.draft_bytes,
         f"--spec-type draft-mtp: KV {fmt_bytes(est.draft.kv_bytes)} ({cfg.type_k_draft.type_name}/"
         f"{cfg.type_v_draft.type_name}, {spec.n_layer_nextn} NextN layers), compute {fmt_bytes(est.draft.compute_bytes)}, "
         f"output {fmt_bytes(est.draft.output_bytes)}; NextN weights {fmt_bytes(sum(spec.nextn_layer_bytes))} in weights")
        if est.draft is not None and cfg.mtp else None,
        ("overhead", est.overhead_bytes, [d.overhead_bytes for d in devs], 0, _device_label(cfg, lay.device)),
        ("total", est.total_bytes, [d.total_bytes for d in devs], est.host_bytes, ""),
        ("layers", 0, [d.n_layers for d in devs], 0, "") if len(devs) > 1 else None,
    ]  # fmt: skip
    lines = [head, "  " + " · ".join(parts)]
    if devs:
        lines.append(f"  {'':<10}{'total':>13}" + "".join(f"{d.name[:12]:>13}" for d in devs) + f"{'host RAM':>13}")
    for row in rows:
        if row is None:
            continue
        label, n, per_dev, in_ram, note = row
        if label == "layers":
            lines.append(f"  {label:<10}{'':>13}" + "".join(f"{x:>13}" for x in per_dev))
            continue
        cols = "".join(f"{'' if x is None else fmt_bytes(x):>13}" for x in per_dev) + (
            f"{fmt_bytes(in_ram):>13}" if devs else ""
        )
        lines.append(f"  {label:<10}{fmt_bytes(n):>13}{cols}" + (f"   {note}" if note else ""))
    lines.append(f"  KV per token of context: {est.kv_bytes_per_token:,} B")
    lines.extend(f"  note: {n}" for n in spec.notes)
    lines.extend(f"  source: {n}" for n in spec.sources)
    return text_lines(lines)  # a name, a note: one line each, whatever they hold


def budget_dict(b: Budget) -> dict[str, Any]:
    return {
        "device": b.device,
        "n_gpu": b.n_gpu,
        "total_bytes": b.total_bytes,
        "free_bytes": b.free_bytes,
        "margin_bytes": b.margin_bytes,
        "budget_bytes": b.budget_bytes,
        "source": b.source,
        "bandwidth_bytes_per_s": b.bandwidth_bytes_per_s,
        "bandwidth_source": b.bandwidth_source,
        "headroom_bytes": b.headroom_bytes,
        "headroom_notes": list(b.headroom_notes),
        "device_budgets_bytes": list(b.device_budgets),
        "backend": b.backend,
    }


def speed_dict(sp: SpeedEstimate | None) -> dict[str, Any] | None:
    if sp is None:
        return None
    return {
        "tokens_per_s": sp.tokens_per_s,
        "low": sp.low,
        "high": sp.high,
        "at_context": [{"n_ctx": c, "tokens_per_s": t, "extrapolated": sp.extrapolated(c)} for c, t in sp.points],
        "measured_depth": sp.measured_depth,  # the deepest context of the measurements it is calibrated on
        "measured_what": sp.measured_what,
        "ram_bandwidth_bytes_per_s": sp.ram_bandwidth_bytes_per_s,  # the system memory's, for the CPU's share
        "ram_bandwidth_source": sp.ram_bandwidth_source,
        "text": sp.text(),
        "note": sp.note,
    }


def prefill_dict(pf: PrefillEstimate | None) -> dict[str, Any] | None:
    """The ``prefill`` key: prompt processing of one sequence from an empty context."""
    if pf is None:
        return None
    return {
        "tokens_per_s": pf.tokens_per_s,
        "seconds": pf.seconds,
        "n_prompt": pf.points[0][0],
        "low": pf.low,
        "high": pf.high,
        "at_prompt": [
            {"n_prompt": n, "tokens_per_s": t, "seconds": sec, "extrapolated": pf.extrapolated(n)}
            for n, t, sec in pf.points
        ],
        "measured_tokens": pf.measured_tokens,  # the longest prompt of the measurements it is calibrated on
        "measured_what": pf.measured_what,
        "text": pf.text(),
        "note": pf.note,
    }


def plan_dict(plan: Plan, requested_ctx: int | None = None) -> dict[str, Any]:
    requested_ctx = requested_ctx if requested_ctx is not None else plan.n_ctx_requested
    cfg = replace(plan.config, n_ctx=requested_ctx) if requested_ctx is not None else plan.config
    b = plan.budget
    budgets = (b.device_budgets or (b.budget_bytes,)) if b is not None else ()
    doc = estimate_dict(plan.spec, cfg, plan.estimate, budgets)
    if plan.hardware is not None:
        doc["hardware"] = {
            "source": plan.hardware.source,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "total_bytes": g.total_bytes,
                    "free_bytes": g.free_bytes,
                    "used_by_others_bytes": g.used_by_others_bytes,
                }
                for g in plan.hardware.gpus
            ],
            "ram_total_bytes": plan.hardware.ram_total_bytes,
            "ram_free_bytes": plan.hardware.ram_free_bytes,
            "notes": list(plan.hardware.notes),
            "sources": list(plan.hardware.sources),
        }
    if plan.budget is not None:
        doc["budget"] = budget_dict(plan.budget)
        doc["fits"] = plan.fits
        doc["decode_estimate"] = speed_dict(plan.speed)
        doc["prefill"] = prefill_dict(plan.prefill)
    doc["notes"] = list(plan.notes)
    if plan.budget is not None:
        doc["offload"] = offload_dict(plan.offload)
        doc["runnable"] = plan.runnable
        doc["ram"] = ram_dict(plan.ram)
    rec = plan.recommendation
    if rec is not None:
        doc["reasons"] = list(rec.reasons)
        doc["target_ctx"] = rec.target_ctx
        doc["options"] = [
            {
                "type_k": o.type_k.type_name,
                "type_v": o.type_v.type_name,
                "flash_attn": o.flash_attn,
                "n_ctx_max": o.n_ctx_max,
                "device_bytes_at_max": o.device_bytes_at_max,
                "reaches_target": o.reaches_target,
                "fits": o.n_ctx_max > 0,
                "allowed": o.allowed,
            }
            for o in rec.options
        ]
        doc["decode_tokens_per_s"] = rec.decode_tokens_per_s
        doc["speed_note"] = rec.speed_note
    elif plan.budget is not None:
        where = "the GPU" if plan.budget.device != "cpu" else "system RAM"
        verdict = "fits" if plan.fits else "does not fit"
        doc["reasons"] = [
            f"{verdict}: needs {fmt_bytes(plan.estimate.device_bytes)}; {where} has "
            f"{fmt_bytes(plan.budget.budget_bytes)} after a {plan.budget.margin_bytes / (1 << 20):,.0f} MiB margin"
            + "".join(f", minus {n}" for n in plan.budget.headroom_notes)
        ]
    doc["runtime"] = plan.runtime
    if plan.users is not None:  # --users N (kvadvise.planner.users)
        doc["users"] = users_dict(plan.users)
    if plan.advice is not None:  # the runtime's part: its settings, command, warnings (kvadvise.runtime.seam)
        doc[plan.advice.key] = plan.advice.json_doc()
    return doc


def users_dict(a: UsersAnswer) -> dict[str, Any]:
    def way(s: Sessions | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {
            "kv_unified": s.kv_unified,
            "fits": s.fits,
            "max_users": s.max_users,
            "device_bytes": s.device_bytes,
            "kv_bytes": s.kv_bytes,
            "decode_user_tokens_per_s": s.decode_user_tps,
            "decode_total_tokens_per_s": s.decode_total_tps,
        }

    return {
        "n_users": a.n_users,
        "n_ctx_user": a.n_ctx_user,
        "fits": a.fits,
        "max_users": a.max_users,
        "kv_unified": a.chosen.kv_unified,
        "cache_type": a.cache_type,
        "per_slot": way(a.per_slot),
        "unified": way(a.unified),
    }


def offload_dict(off: Offload | None) -> dict[str, Any] | None:
    if off is None:
        return None
    return {
        "n_ctx": off.n_ctx,
        "type_k": off.type_k.type_name,
        "type_v": off.type_v.type_name,
        "n_gpu_layers": off.n_gpu_layers,
        "n_cpu_layers": off.n_cpu_layers,
        "n_cpu_moe": off.n_cpu_moe,
        "expert_overflow": off.expert_overflow,
        "output_on_host": off.output_on_host,
        "device_bytes": off.device_bytes,
        "op_offload_bytes": off.op_offload_bytes,
        "host_bytes": off.host_bytes,
        "decode_tokens_per_s": off.decode_tokens_per_s,
        "decode_estimate": speed_dict(off.speed),
        "note": off.note,
        "devices_bytes": list(off.devices_bytes),
        "device_budgets_bytes": list(off.device_budgets),
        "tensor_split": list(off.tensor_split),
        "ram": ram_dict(off.ram),
        "runnable": off.runnable,
    }


def ram_dict(r: HostRam | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "total_bytes": r.total_bytes,
        "ram_bytes": r.ram_bytes,
        "ram_source": r.ram_source,
        "kept_bytes": r.kept_bytes,
        "fits": r.fits,
        "mapped_bytes": r.mapped_bytes,
        "buffers_bytes": r.buffers_bytes,
        "gpu_shared_bytes": r.gpu_shared_bytes,
        "prompt_cache_bytes": r.prompt_cache_bytes,
        "checkpoints_bytes": r.checkpoints_bytes,
        "checkpoint_bytes": r.checkpoint_bytes,
        "cache_ram_mib": r.cache_ram_mib,
        "ctx_checkpoints": r.ctx_checkpoints,
        "container_limit_bytes": r.container_limit_bytes,
    }


def ram_line(r: HostRam) -> str:
    """``system RAM: 9.86 GiB of 24.00 GiB (given (--ram)): 1.2 GiB weights the CPU reads (mapped) + ...
    -> FITS; in a container: --memory 11g``"""
    parts = [f"{fmt_bytes(r.mapped_bytes)} weights read by the CPU (mmap, page cache)"]
    parts.append(f"{fmt_bytes(r.buffers_bytes)} buffers")
    if r.gpu_shared_bytes:
        parts.append(f"{fmt_bytes(r.gpu_shared_bytes)} the GPU's (unified memory)")
    if r.prompt_cache_bytes or r.cache_ram_mib is not None:
        cache = "--cache-ram " + (f"{r.cache_ram_mib}" if r.cache_ram_mib is not None else "default 8192")
        parts.append(f"{fmt_bytes(r.prompt_cache_bytes)} prompt cache at most ({cache})")
    if r.checkpoint_bytes:
        n = "default 32" if r.ctx_checkpoints is None else str(r.ctx_checkpoints)
        parts.append(f"{fmt_bytes(r.checkpoints_bytes)} context checkpoints at most (--ctx-checkpoints {n} per slot)")
    verdict = "FITS" if r.fits else "DOES NOT FIT"
    s = f"system RAM: {fmt_bytes(r.total_bytes)} of {fmt_bytes(r.ram_bytes)} ({r.ram_source}): " + " + ".join(parts)
    s += f" -> {verdict}"
    if r.fits:
        s += f"; in a container give it at least {r.container_limit_bytes >> 30} GiB (docker run --memory={r.container_limit_bytes >> 30}g)"
    return s


def offload_line(off: Offload, *, fits_gpu: bool | None) -> str:
    """``the plan that runs, part on the CPU: 65,536 tokens, K q8_0 / V q8_0, -ngl 49 --n-cpu-moe 21, 13.88 GiB
    on the GPU; decode (estimate) ≈ 38 t/s at 4k, ≈ 23 t/s at 64k``"""
    flags = offload_flags(off.n_gpu_layers, off.n_cpu_moe, off.expert_overflow)
    if fits_gpu is False:
        label = (
            "PLAN THAT RUNS (100% GPU does not fit), part on the CPU"
            if off.runnable
            else ("part on the CPU (does not fit the RAM either)")
        )
    else:
        label = "at the target with part on the CPU (--allow-cpu)"
    where = f"{fmt_bytes(off.device_bytes)} on the GPU"
    if len(off.devices_bytes) > 1:
        where = "on the GPUs " + ", ".join(
            f"{fmt_bytes(d)} of {fmt_bytes(b)}" for d, b in zip(off.devices_bytes, off.device_budgets, strict=True)
        )
    s = f"{label}: {off.n_ctx:,} tokens, K {off.type_k.type_name} / V {off.type_v.type_name}, {flags}, {where}"
    if off.speed is not None:
        s += f"; decode (estimate) {off.speed.at_depths()}"
    return s


def plan_text(plan: Plan, requested_ctx: int | None = None) -> str:
    requested_ctx = requested_ctx if requested_ctx is not None else plan.n_ctx_requested
    cfg = replace(plan.config, n_ctx=requested_ctx) if requested_ctx is not None else plan.config
    head = estimate_text(plan.spec, cfg, plan.estimate)
    lines: list[str] = []
    if plan.hardware is not None:
        lines.extend(f"  note: {n}" for n in plan.hardware.notes)
        lines.extend(f"  source: {n}" for n in plan.hardware.sources)
    lines.extend(f"  note: {n}" for n in plan.notes)
    b = plan.budget
    if b is not None and len(b.device_budgets) > 1 and len(plan.estimate.devices) == len(b.device_budgets):
        each = ", ".join(
            f"{d.name} {fmt_bytes(d.total_bytes)} of {fmt_bytes(x)}"
            for d, x in zip(plan.estimate.devices, b.device_budgets, strict=True)
        )
        lines.append(
            f"  each device within its own budget: {each} ({b.source}) -> {'FITS' if plan.fits else 'DOES NOT FIT'}"
        )
    elif b is not None:
        lines.append(
            f"  device total {fmt_bytes(plan.estimate.device_bytes)} of a {fmt_bytes(b.budget_bytes)} budget"
            f" ({b.source}) -> {'FITS' if plan.fits else 'DOES NOT FIT'}"
        )
    rec = plan.recommendation
    if rec is not None:
        lines.append("")
        lines.append("Recommendation: " + _config_line(rec))
        for r in rec.reasons:
            lines.append(f"  - {r}")
        lines.append("")
        lines.append(f"  {'K/V cache':<20}{'FA':<5}{'max context':>12}{'memory at max':>16}  target")
        for o in rec.options:
            kv = o.type_k.type_name if o.type_k == o.type_v else f"{o.type_k.type_name}/{o.type_v.type_name}"
            mem = fmt_bytes(o.device_bytes_at_max) if o.n_ctx_max else "-"
            lines.append(
                f"  {kv:<20}{'on' if o.flash_attn else 'off':<5}{o.n_ctx_max:>12,}{mem:>16}  "
                f"{'yes' if o.reaches_target else 'no'}" + ("" if o.allowed else f"   ({_why_not_allowed(o)})")
            )
        if rec.speed is not None:
            lines.append(f"  decode: {rec.speed.text()}")
            lines.append(f"    ({rec.speed.note})")
    elif plan.speed is not None:
        lines.append(f"  decode: {plan.speed.text()}")
        lines.append(f"    ({plan.speed.note})")
    elif plan.budget is not None and not plan.fits and plan.offload is None:
        lines.append("  hint: drop --ctx to let kvadvise recommend a context and cache type that fit")
    if plan.ram is not None:
        lines.append("  " + ram_line(plan.ram))
    if plan.offload is not None:
        lines.append("  " + offload_line(plan.offload, fits_gpu=plan.fits))
        if plan.offload.ram is not None:
            lines.append("    " + ram_line(plan.offload.ram))
    if plan.prefill is not None:
        lines.append(f"  prompt: {plan.prefill.text()}")
        lines.append(f"    ({plan.prefill.note})")
    return head + ("\n" + text_lines(lines) if lines else "")


def _config_line(rec: Recommendation) -> str:
    c = rec.config
    per_seq = c.n_ctx // c.n_parallel
    s = f"{per_seq:,} tokens" + (f" × {c.n_parallel} sequences" if c.n_parallel > 1 else "")
    s += f", K {c.type_k.type_name} / V {c.type_v.type_name}, flash attention {c.flash_attn}"
    if not rec.fits:
        s += "  (100% GPU: DOES NOT FIT" + ("; the plan that runs is below)" if rec.offload is not None else ")")
    return s


CHART_MARKS = "f8m4abcdefgh"
CHART_CHOSEN = "*"


def curve_label(c: Curve) -> str:
    kv = c.type_k.type_name if c.type_k == c.type_v else f"{c.type_k.type_name} K / {c.type_v.type_name} V"
    return kv + ("" if c.flash_attn else " (flash attention off)")


def _ctx_tick(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def chart_text(
    curves: tuple[Curve, ...], budget_bytes: int, height: int = 16, chosen: tuple[int, int] | None = None
) -> str:
    """Memory on the device against the context per sequence, one curve per cache type (its letter), the
    budget as one line of '=' (labelled with its size), and the recommended point as '*'.

    ``chosen``: (context per sequence, device bytes) of the recommendation.
    """
    if not curves or not curves[0].points:
        return ""
    xs = [x for x, _ in curves[0].points]
    values = [b for c in curves for _, b in c.points] + [budget_bytes]
    span = max(values) - min(values) or max(values) or 1
    lo = max(0.0, min(values) - span * 0.05)  # the axis covers the data, not 0..max: the curves stay apart
    hi = max(values) + span * 0.05
    rows = [[" "] * len(xs) for _ in range(height)]

    def row_of(b: float) -> int:
        return max(0, min(height - 1, int((b - lo) / (hi - lo) * height)))

    def value_of(i: int) -> float:
        return lo + (hi - lo) * (i + 0.5) / height

    budget_row = row_of(budget_bytes)
    for j in range(len(xs)):
        rows[budget_row][j] = "="
    for mark, c in zip(CHART_MARKS, curves, strict=False):
        for j, (_, b) in enumerate(c.points):
            rows[row_of(b)][j] = mark
    if chosen is not None:
        j = min(range(len(xs)), key=lambda k: abs(xs[k] - chosen[0]))
        rows[row_of(chosen[1])][j] = CHART_CHOSEN
    lines = ["memory on the device (GiB)"]
    for i in range(height - 1, -1, -1):
        if i == budget_row:
            label = f"{budget_bytes / (1 << 30):8.2f} ="
        elif i in (height - 1, 0) or (i % 4 == 3 and abs(i - budget_row) > 1):
            label = f"{value_of(i) / (1 << 30):8.2f} |"
        else:
            label = " " * 9 + "|"
        lines.append(label + "".join(rows[i]) + (" budget" if i == budget_row else ""))
    lines.append(" " * 9 + "+" + "-" * len(xs))
    ticks = [" "] * (len(xs) + 12)
    for j in (0, len(xs) // 2, len(xs) - 1):
        text = _ctx_tick(xs[j])
        at = max(0, min(j - len(text) // 2, len(xs) + 6 - len(text))) if j else 0
        ticks[at : at + len(text)] = text
    lines.append(" " * 10 + "".join(ticks).rstrip())
    lines.append(" " * 10 + "context per sequence (tokens)")
    legend = [f"{mark} = {curve_label(c)}" for mark, c in zip(CHART_MARKS, curves, strict=False)]
    legend.append("= budget")
    if chosen is not None:
        legend.append(f"* = recommended ({chosen[0]:,} tokens, {chosen[1] / (1 << 30):.2f} GiB)")
    lines.append(" " * 10 + "   ".join(legend))
    return "\n".join(lines)


def verification_dict(v: Verification) -> dict[str, Any]:
    doc = plan_dict(v.plan)
    m = v.measured
    doc["measured"] = {
        "k_bytes": m.k_bytes,
        "v_bytes": m.v_bytes,
        "kv_bytes": m.kv_bytes,
        "recurrent_bytes": m.recurrent_bytes,
        "weights_bytes": m.weights_bytes,
        "compute_bytes": m.compute_bytes,
        "output_bytes": m.output_bytes,
        "device_used_bytes": m.device_used_bytes,
        "prompt_tokens_per_s": m.prompt_tokens_per_s,
        "prompt_tokens": m.prompt_tokens,
        "decode_tokens_per_s": m.decode_tokens_per_s,
        "n_ctx": m.n_ctx,
        "gpu_layers": m.gpu_layers,
        "total_layers": m.total_layers,
        "runner": m.runner,
        "backend": m.backend,
        "llama_cpp_build": m.llama_cpp_build,
    }
    e = v.error
    doc["error"] = {
        "k_bytes": e.k_bytes,
        "v_bytes": e.v_bytes,
        "kv_bytes": e.kv_bytes,
        "recurrent_bytes": e.recurrent_bytes,
        "weights_bytes": e.weights_bytes,
        "compute_bytes": e.compute_bytes,
        "output_bytes": e.output_bytes,
    }
    doc["prompt_estimate_tokens_per_s"] = v.prompt_estimate_tokens_per_s
    doc["decode_estimate_tokens_per_s"] = v.decode_estimate_tokens_per_s
    doc["fits"] = v.fits
    doc["verdict"] = v.verdict
    doc["reasons"] = list(doc.get("reasons", [])) + list(v.reasons)
    return doc


def verification_text(v: Verification) -> str:
    est, m = v.plan.estimate, v.measured
    rows = [
        ("K cache", est.k_bytes, m.k_bytes),
        ("V cache", est.v_bytes, m.v_bytes),
        ("KV buffers", est.kv_bytes, m.kv_bytes),
        ("recurrent", est.recurrent_bytes, m.recurrent_bytes),
        ("weights", est.weights_bytes, m.weights_bytes),
        ("compute", est.compute_bytes, m.compute_bytes),
        ("output", est.output_bytes, m.output_bytes),
    ]
    lines = [
        f"{v.plan.spec.name}: measured with {m.runner} ({m.llama_cpp_build}, backend {m.backend})",
        f"  {'':<12}{'predicted':>14}{'measured':>14}{'difference':>14}",
    ]
    for label, p, q in rows:
        lines.append(f"  {label:<12}{fmt_bytes(p):>14}{fmt_bytes(q):>14}{fmt_bytes(q - p) if q != p else '0':>14}")
    if m.device_used_bytes is not None:
        lines.append(f"  device memory used (NVML): {fmt_bytes(m.device_used_bytes)}")
    if m.gpu_layers is not None:
        lines.append(f"  layers on the GPU: {m.gpu_layers}/{m.total_layers}")
    if m.prompt_tokens_per_s is not None:
        beside = ""
        if v.prompt_estimate_tokens_per_s:  # the prefill estimate for the same prompt, and measured / estimate
            beside = (
                f"   (estimated ≈ {v.prompt_estimate_tokens_per_s:,.0f} for {m.prompt_tokens:,} tokens; "
                f"measured / estimated = {m.prompt_tokens_per_s / v.prompt_estimate_tokens_per_s:.2f})"
            )
        lines.append(f"  prompt: {m.prompt_tokens_per_s:,.1f} tokens/s{beside}")
    sp = v.plan.speed
    if m.decode_tokens_per_s is not None:
        beside = ""
        if est_tps := v.decode_estimate_tokens_per_s:  # the plan's estimate as the runner times it
            beside = f"   (estimated ≈ {est_tps:,.0f}; measured / estimated = {m.decode_tokens_per_s / est_tps:.2f})"
        lines.append(f"  decode: {m.decode_tokens_per_s:,.1f} tokens/s{beside}")
    elif sp is not None:
        lines.append(f"  decode estimated: {sp.text()}")
    lines.extend(f"  - {r}" for r in v.reasons)
    lines.append(v.verdict)
    return text_lines(lines)


def _why_not_allowed(o: Option) -> str:
    """An option the recommendation may not pick: q4_0 without the opt-in, else measured worse than the
    threshold on this model (kvadvise verify quality; the reasons cite the figure)."""
    return "only with --allow-q4" if needs_opt_in((o.type_k, o.type_v)) else "measured: worse than the threshold"


def mtp_note(spec: ModelSpec, cfg: RunConfig, est: MemoryEstimate, plain_n_ctx: int | None) -> str:
    """The plan's line on MTP: its memory, the published decode gain, and the context it costs (``plain_n_ctx``:
    the context the same search finds without MTP; None when the context was given)."""
    from kvadvise.planner.mtp import gain_text

    d = est.draft
    ctx = d.total_bytes if d is not None else 0
    nextn = sum(spec.nextn_layer_bytes)
    text = (
        f"MTP draft (--spec-type draft-mtp --spec-draft-n-max {cfg.spec_draft_n_max}): "
        f"{fmt_bytes(ctx + nextn)} more: NextN weights {fmt_bytes(nextn)}, "
        f"its context {fmt_bytes(ctx)} (KV of {spec.n_layer_nextn} layer(s) {fmt_bytes(d.kv_bytes if d else 0)}, "
        f"compute {fmt_bytes(d.compute_bytes if d else 0)}); decode gain: {gain_text()}"
    )
    if plain_n_ctx is not None and plain_n_ctx > cfg.n_ctx:
        text += f"; without MTP: {plain_n_ctx:,} tokens instead of {cfg.n_ctx:,}"
    return text


def _extra_buffers(est: MemoryEstimate) -> str:
    """The CPU's extra buffers a CPU plan allocates: "1.2 GiB CPU_REPACK", "213.9 MiB AMX + 12 MiB CPU_REPACK"."""
    return " + ".join(f"{fmt_bytes(b)} {name}" for name, b in est.extra_buffers if b)
