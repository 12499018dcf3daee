"""Pure text builders: an estimate -> the JSON document or the human table.

The JSON keys are documented in README.md; other tools rely on them.
"""

from __future__ import annotations

from typing import Any

from advisor.memory import MemoryEstimate, RunConfig
from advisor.spec import ModelSpec

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
    }


def estimate_dict(spec: ModelSpec, cfg: RunConfig, est: MemoryEstimate) -> dict[str, Any]:
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
            "type_k": lay.type_k.type_name,
            "type_v": lay.type_v.type_name,
            "flash_attn": lay.flash_attn,
            "swa_full": lay.swa_full,
            "device": lay.device,
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
        f"device {lay.device}",
    ]
    if spec.has_swa:
        parts.append(f"SWA cache {lay.n_ctx_swa:,} cells" + (" (--swa-full)" if lay.swa_full else ""))
    cache_note = " + ".join(
        f"{c.n_layers} {'SWA' if c.kind == 'swa' else 'full'} layers × {c.cells:,}" for c in est.caches
    )
    rows = [
        ("weights", est.weights_bytes, spec.file_type),
        ("K cache", est.k_bytes, cache_note + (" cells" if cache_note else "")),
        ("V cache", est.v_bytes, "none: MLA keeps only K" if spec.is_mla else ""),
        ("recurrent", est.recurrent_bytes, f"{sum(spec.recurrent_layers)} layers" if spec.has_recurrent else ""),
        ("compute", est.compute_bytes, "estimate"),
        ("output", est.output_bytes, "logits"),
        ("overhead", est.overhead_bytes, lay.device),
        ("total", est.total_bytes, ""),
    ]
    lines = [head, "  " + " · ".join(parts)]
    for label, n, note in rows:
        lines.append(f"  {label:<10}{fmt_bytes(n):>13}" + (f"   {note}" if note else ""))
    lines.append(f"  KV per token of context: {est.kv_bytes_per_token:,} B")
    lines.extend(f"  note: {n}" for n in spec.notes)
    return "\n".join(lines)
