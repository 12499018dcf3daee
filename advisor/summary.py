"""The default text of a plan: the verdict, the settings to apply, then what it costs, why, and
where the figures come from, in about 25 lines. ``--verbose`` prints the whole estimate, every reason and
the options table (:func:`kvadvise.render.plan_text`); ``--json`` every figure and its provenance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvadvise.planner.offload import OVERFLOW_ON_CPU, offload_flags
from kvadvise.planner.policy import kv_name
from kvadvise.planner.speed import layer_shares
from kvadvise.render import fmt_bytes
from kvadvise.text import WIDTH, command_lines, wrapped
from kvadvise.text import lines as text_lines

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.planning import Plan
    from kvadvise.planner.recommender import Recommendation

VERBOSE_HINT = "(--verbose: every buffer per device, every reason, the options table; --json: every figure)"


def _kv(type_k: str, type_v: str) -> str:
    return f"K/V {type_k}" if type_k == type_v else f"K {type_k} / V {type_v}"


def _no_memory(plan: Plan) -> bool:
    """No K/V cache and no recurrent state: an encoder (bert, nomic-bert: embedding models) or a diffusion model,
    for which llama_model::create_memory makes no memory module; a cache type changes nothing there."""
    return not any(plan.spec.kv_layers) and not plan.spec.has_recurrent


def _a(size: str) -> str:
    """``a 24.00 GiB``, ``an 8.00 GiB``, ``an 11.00 GiB``: the article as the number is read aloud."""
    an = size[0] == "8" or (size[:2] in ("11", "18") and not size[2:3].isdigit())
    return ("an " if an else "a ") + size


def where_on(plan: Plan) -> str:
    """``NVIDIA GeForce RTX 4090``, ``2 x NVIDIA GeForce RTX 3090``, ``the CPU``; "" without hardware."""
    hw = plan.hardware
    if hw is None:
        return ""
    if not hw.gpus:
        return " on the CPU"
    if hw.source == "manual":  # --vram: budgets given by hand
        return " on " + " + ".join(f"{_a(fmt_bytes(g.total_bytes))} GPU" for g in hw.gpus) + " (--vram)"
    names = [g.name for g in hw.gpus]
    if len(set(names)) == 1:
        return f" on {names[0]}" if len(names) == 1 else f" on {len(names)} x {names[0]}"
    return " on " + " + ".join(names)


def headline(plan: Plan, requested_ctx: int | None = None) -> str:
    """``qwen3-coder:30b on NVIDIA GeForce RTX 4090: 65,536 tokens, K/V q8_0: fits 100% on the GPU``."""
    cfg = plan.config
    n_ctx = plan.estimate.layout.n_ctx  # what llama.cpp allocates: -c rounded up to 256 (llama_context ctor)
    n_par = max(1, cfg.n_parallel)
    what = _tokens(n_ctx, n_par, kv_unified=cfg.kv_unified)
    if requested_ctx and requested_ctx != n_ctx:
        what += f" (asked {requested_ctx:,}; llama.cpp pads to 256)"
    kv = "no K/V cache" if _no_memory(plan) else _kv(cfg.type_k.type_name, cfg.type_v.type_name)
    what += f", {kv}"  # flash attention is in the settings below (-fa, OLLAMA_FLASH_ATTENTION)
    off = plan.partial
    head = f"{plan.spec.name}{where_on(plan)}: "
    if plan.fits is None:
        return head + what + " (no hardware: an estimate only)"
    on_cpu = plan.budget is not None and plan.budget.device == "cpu"
    if off is not None:
        # off.n_ctx is per slot; its command's -c is that times the slots (runtime.llamaserver.plan_args)
        run = f"{_tokens(off.n_ctx * n_par, n_par, kv_unified=cfg.kv_unified)}, "
        run += _kv(off.type_k.type_name, off.type_v.type_name)
        if off.runnable:
            return head + f"{run}, part on the CPU"  # why 100% on the GPU does not fit: the "why" line
        return head + f"DOES NOT FIT, not even with part on the CPU ({run}: the RAM is short too)"
    if not plan.fits:
        return head + what + ": DOES NOT FIT" + ("" if on_cpu else " the GPU")
    if plan.ram is not None and not plan.ram.fits:
        return head + what + (": does NOT fit the system RAM" if on_cpu else ": fits the GPU, but NOT the system RAM")
    return head + what + (": fits in RAM" if on_cpu else ": fits 100% on the GPU")


def _tokens(n_ctx: int, n_par: int, *, kv_unified: bool) -> str:
    """``8,192 tokens x 4 slots`` for -c 32768 -np 4; ``32,768 tokens shared by 4 slots`` with -kvu."""
    if kv_unified and n_par > 1:  # -kvu: one cache of n_ctx cells the slots share (llama_context)
        return f"{n_ctx:,} tokens shared by {n_par} slots"
    return f"{n_ctx // n_par:,} tokens" + (f" x {n_par} slots" if n_par > 1 else "")


def _model(plan: Plan) -> str:
    """``model: qwen3moe, 48 layers, trained on 262,144 tokens; weights q4_K, 17.70 GiB``"""
    spec = plan.spec
    s = f"model: {spec.architecture}, {spec.n_layer} layers, trained on {spec.n_ctx_train:,} tokens"
    return s + f"; weights {spec.file_type}, {fmt_bytes(spec.weights_bytes)}"


def _memory(plan: Plan) -> list[str]:
    est, b = plan.estimate, plan.budget
    off = plan.partial
    if off is not None:
        flags = offload_flags(off.n_gpu_layers, off.n_cpu_moe)
        kept = f"the experts of {off.n_cpu_moe} layers" if off.n_cpu_moe else f"{off.n_cpu_layers} layers"
        if off.expert_overflow:  # the -ot's pattern is the command's (and --json's): named here by what it leaves
            n = off.n_cpu_moe - 1
            kept = f"the experts of {n} layers and block {n}'s " + " and ".join(OVERFLOW_ON_CPU[off.expert_overflow])
            flags = offload_flags(off.n_gpu_layers, n) + " -ot"
        if off.n_cpu_moe and off.n_cpu_layers:
            kept += f" and {off.n_cpu_layers} whole layers"
        where = f"GPU {fmt_bytes(off.device_bytes)}"
        if len(off.devices_bytes) > 1:
            where = ", ".join(
                f"{fmt_bytes(d)} of {fmt_bytes(x)}" for d, x in zip(off.devices_bytes, off.device_budgets, strict=True)
            )
        return [f"on the CPU: {kept} ({flags}); {where}, RAM {fmt_bytes(off.host_bytes)}"]
    parts = [f"weights {_gib(est.weights_bytes - est.host.weights_bytes)}"]
    if est.kv_bytes:
        parts.append(f"K/V {_gib(est.kv_bytes)}")
    if est.recurrent_bytes:
        parts.append(f"recurrent {_gib(est.recurrent_bytes)}")
    parts.append(f"compute {_gib(est.compute_bytes - est.host.compute_bytes)}")
    if est.overhead_bytes:
        parts.append(f"overhead {_gib(est.overhead_bytes)}")
    if b is None:
        return [f"memory: {fmt_bytes(est.device_bytes)} on the {est.layout.device.upper()}: " + ", ".join(parts)]
    if len(b.device_budgets) > 1 and len(est.devices) == len(b.device_budgets):
        used = ", ".join(
            f"{d.name} {fmt_bytes(d.total_bytes)} of {fmt_bytes(x)}"
            for d, x in zip(est.devices, b.device_budgets, strict=True)
        )
    else:
        left = b.budget_bytes - est.device_bytes
        used = f"{_gib(est.device_bytes)} of {_gib(b.budget_bytes)}"
        used += f" ({_gib(left)} spare)" if left >= 0 else f" ({_gib(-left)} short)"
    return [f"memory: {used}: " + ", ".join(parts)]


def _gib(n: int) -> str:
    """A part of the memory line: GiB with two decimals, or MiB below 1 GiB (``0.14 GiB`` reads worse)."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.0f} MiB"


def _speed(plan: Plan) -> list[str]:
    off = plan.partial
    rec = plan.recommendation
    decode = off.speed if off is not None else (rec.speed if rec is not None else plan.speed)
    out = []
    if decode is not None and _no_memory(plan) and plan.prefill is not None:  # an encoder reads, it does not decode
        out.append(f"speed (estimate): prompt {plan.prefill.at_sizes()}")
    elif decode is not None:
        s = f"decode (estimate): {decode.at_depths()}"
        b = plan.budget
        if b is not None and b.bandwidth_bytes_per_s:
            at = f"{b.bandwidth_bytes_per_s / 1e9:,.0f} GB/s"
            bws = b.device_bandwidths
            split = plan.config.tensor_split
            if len(split) == len(bws) > 1:  # -ts 0,1: a card given no layer reads nothing (llama.cpp's -ts rule)
                shares = layer_shares(plan.spec, split)
                bws = tuple(x for x, share in zip(bws, shares, strict=True) if share > 0)
            if len(set(bws)) > 1:  # each GPU reads its share of the layers at its own bandwidth
                at = " + ".join(f"{x / 1e9:,.0f}" for x in bws) + " GB/s"
            elif bws:
                at = f"{bws[0] / 1e9:,.0f} GB/s"
            if decode.ram_bandwidth_bytes_per_s:  # the CPU's share at the system memory's (measured once, cached)
                at = f"GPU {at.removesuffix(' GB/s')}, RAM {decode.ram_bandwidth_bytes_per_s / 1e9:,.0f} GB/s"
            s += f"; at {at}" if not decode.ram_bandwidth_bytes_per_s else f"; {at}"
        out.append(s)
        if plan.prefill is not None:
            out.append(f"prompt: {plan.prefill.at_sizes()}")  # an estimate, as the decode line says
    elif plan.budget is not None and plan.budget.source == "manual" and not plan.budget.bandwidth_bytes_per_s:
        out.append("speed: not estimated: no catalogue card has this size; --bandwidth GB/S or --gpu NAME gives one")
    ram = off.ram if off is not None else plan.ram
    if ram is not None:
        verdict = "fits" if ram.fits else "DOES NOT FIT"
        s = f"system RAM: {fmt_bytes(ram.total_bytes)} of {fmt_bytes(ram.ram_bytes)} ({ram.ram_source}): {verdict}"
        if ram.prompt_cache_bytes:
            s += f" (prompt cache ≤ {fmt_bytes(ram.prompt_cache_bytes)})"
        out.append(s)
    return out


def why(rec: Recommendation | None) -> list[str]:
    """The choice in one or two lines: what each cache type reaches against the target, then the caveats the
    recommender attached (its reasons that start with ``note:``)."""
    if rec is None:
        return []
    if not rec.fits:  # why 100 % GPU does not fit, and which cache type the plan that runs takes: one why
        said = [r for r in rec.reasons if r.startswith("does not fit")]  # "would fit with N more": --verbose
        out = [("why: " if i == 0 else "     ") + r for i, r in enumerate(said)]
        out += [
            f"     {r.removeprefix('partial offload: ')}"
            for r in rec.reasons
            if r.startswith("partial offload: ") and " would keep " in r
        ][:1]
        # a partial offload searched down from the target (offload.plan_offload's shrink): how far, and why
        out += [
            f"     {r.removeprefix('partial offload: ')}"
            for r in rec.reasons
            if r.startswith("partial offload: ") and " tokens per sequence do not fit " in r
        ][:1]
        return out + [r for r in rec.reasons if r.startswith("note:")]
    chosen = (rec.config.type_k, rec.config.type_v)
    target = rec.target_ctx
    # what `verify quality` measured on this model, as the recommender's reasons say it (planner/reasons.py)
    rejected = {r.split(" not chosen: ")[0] for r in rec.reasons if " not chosen: measured on this model" in r}
    measured_ok = any("measured on this model" in r and "within the threshold" in r for r in rec.reasons)
    no_kernel = any(r.startswith("a quantized cache is not chosen: ") for r in rec.reasons)
    steps: list[str] = []
    later: list[str] = []
    picked, best = False, 0
    for o in rec.options:
        name = _kv(o.type_k.type_name, o.type_v.type_name).removeprefix("K/V ")
        reach = f"{o.n_ctx_max:,}" if o.n_ctx_max else "nothing"
        if picked:
            if not o.allowed and o.n_ctx_max > best:  # only what would reach further than the choice
                measured = kv_name((o.type_k, o.type_v)) in rejected
                why_not = "measured on this model: worse than the threshold" if measured else "--allow-q4, less precise"
                later.append(f"{name} would reach {reach} ({why_not})")
            continue
        if (o.type_k, o.type_v) == chosen and o.allowed:
            picked, best = True, o.n_ctx_max
            if o.type_k.type_name == "f16" == o.type_v.type_name:
                if no_kernel and not o.reaches_target:
                    steps.append(
                        f"f16 reaches {reach} tokens of the {target:,} target: this llama.cpp's CUDA flash "
                        "attention has no kernel for a quantized cache at these heads (--verbose)"
                    )
                else:
                    steps.append(
                        f"f16 reaches {reach} tokens of the {target:,} target: an exact cache, no need to quantize"
                        if o.reaches_target or not rejected
                        else f"f16 reaches {reach} tokens of the {target:,} target: the quantized caches measured "
                        "worse than the threshold on this model (--verbose)"
                    )
            elif o.type_k.type_name == "q8_0" == o.type_v.type_name:
                verb = " " if steps else " reaches "  # "f16 reaches 43,520 of 65,536; q8_0 81,408: chosen"
                loss = (
                    "measured on this model: within the threshold"
                    if measured_ok
                    else "usually no noticeable loss, Ollama FAQ"
                )
                steps.append(f"{name}{verb}{reach}: chosen ({loss})")
            else:  # a 4-bit type, taken only when asked (--allow-q4) or given (-ctk/-ctv)
                steps.append(f"{name} reaches {reach}: chosen (smaller and less precise than q8_0)")
        elif o.allowed:
            steps.append(f"{name} reaches {reach} of {target:,}")
    out = ["why: " + "; ".join(steps)] if steps else []
    if later:
        out.append("     " + "; ".join(later))
    out += [r for r in rec.reasons if r.startswith("note:")]
    out += [f"why: {r}" for r in rec.reasons if r.startswith("layers per device")]  # the -ts of the command
    return out


def summary_text(
    plan: Plan,
    requested_ctx: int | None = None,
    *,
    settings_title: str = "Settings",
    settings: Sequence[str] = (),
    notes: Sequence[str] = (),
    sources: Sequence[str] = (),
) -> str:
    """The plan in about 25 lines: headline, settings, memory and speed, why, notes, sources."""
    lines = [headline(plan, requested_ctx if requested_ctx is not None else plan.n_ctx_requested)]
    if settings:
        lines.append(f"{settings_title}:")
        lines += [f"  {x}" for x in settings]
    said_settings = len(lines)
    lines += [f"  {x}" for x in (_model(plan), *_memory(plan), *_speed(plan))]
    if _no_memory(plan) and plan.recommendation is not None and plan.recommendation.fits:
        lines.append(
            "  why: no K/V cache (llama.cpp makes no memory module for this model): the cache type changes nothing"
        )
    else:
        lines += [f"  {x}" for x in why(plan.recommendation)]
    hw_notes = plan.hardware.notes if plan.hardware is not None else ()
    said: set[str] = set()
    for n in (*_generic(plan.spec), *hw_notes, *plan.notes, *notes):  # each once
        if n not in said:
            said.add(n)
            lines.append(f"  note: {n}")
    srcs = (*plan.spec.sources, *(plan.hardware.sources if plan.hardware is not None else ()), *sources)
    if srcs:
        lines.append(sources_line(srcs))
    # prose is wrapped to the terminal's ~100 columns; a setting is a command or a file line, copied whole
    out = wrapped(lines[0])
    for row in lines[1:said_settings]:
        prose = row.lstrip().startswith(("warning:", "note:", "runner:", "(")) or row.startswith("    ")  # a runner's
        out += wrapped(row) if prose else command_lines(row)
    for row in lines[said_settings:]:
        out += wrapped(row)
    return text_lines(out)


SOURCES_WIDTH = WIDTH


def sources_line(srcs: Sequence[str]) -> str:
    """Where the figures come from, in one line: each source up to its first detail (``--verbose`` and
    ``--json`` have them whole)."""
    short = []
    for x in srcs:
        head = x.split(" (", 1)[0].split(", ", 1)[0]
        if head not in short:
            short.append(head)
    line = "Sources: " + "; ".join(short)
    while len(line) > SOURCES_WIDTH and len(short) > 1:
        short.pop()
        line = "Sources: " + "; ".join(short) + "; ... (--verbose)"
    return line


def llama_flags(plan: Plan) -> str:
    """The llama.cpp flags of the plan (of the plan that runs when part stays on the CPU): llama-server's
    command without the binary and the model (kvadvise.runtime.llamaserver.plan_args, one definition)."""
    from kvadvise.runtime.llamaserver import ModelSource, args_text, plan_args

    # -ngl always, -ngl 0 for a plan on the CPU: llama.cpp's default is every layer on a GPU it finds (common/common.h
    # n_gpu_layers = -1, "auto"; llama_model::n_gpu_layers: n_layer_all + 1)
    return args_text(plan_args(ModelSource(()), plan, plan.partial), binary=None)


# the model's own notes that every figure of the plan hangs on, said in the default output too: an architecture
# planned by generic rules (a config.json kvadvise cannot map, kvadvise.model.hfconfig; one not verified against
# llama.cpp, .architecture), weights of unknown size counted as 0 (a server that lists no tensors,
# backends/ollama/api.py), and a config.json's weights counted at its checkpoint's type (backends/hf.py)
_GENERIC = (
    "is not mapped to a llama.cpp architecture",
    "generic rules applied",
    "counted as 0",
    "no safetensors index found",
)


def _generic(spec: ModelSpec) -> tuple[str, ...]:
    return tuple(n for n in spec.notes if any(g in n for g in _GENERIC))
