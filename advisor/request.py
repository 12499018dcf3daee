"""The planning question, asked once: what to run for this model, on this hardware, with these wishes.

The command line builds a :class:`PlanRequest` from its flags (kvadvise.ui.flags), the Python API from
its arguments (kvadvise.api); :func:`check` refuses a bad one for both, with the messages the command
line prints (``Invalid value for '--ctx' / '-c': ...``), before anything is planned. What a runtime
changes about the question (Ollama's num_ctx per slot, its one cache type) is the runtime's
(kvadvise.runtimes); the request itself is runtime-neutral, in llama.cpp's vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.model.ggml import KV_CACHE_TYPES
from kvadvise.planner.budget import DEFAULT_MARGIN_BYTES
from kvadvise.planner.hardware import RpcHost
from kvadvise.planner.mtp import SPEC_TYPES as SPEC_TYPES
from kvadvise.units import MAX_SIZE_BYTES

if TYPE_CHECKING:
    from kvadvise.model.projector import ProjectorSpec
    from kvadvise.model.spec import ModelSpec

INT32_MAX = 2**31 - 1  # llama.cpp reads -c, -np, -b, -ub as int32 (common/arg.cpp std::stoi)
KV_TYPES = tuple(t.type_name for t in KV_CACHE_TYPES)  # the one list: kvadvise.model.ggml
USES = ("chat", "code", "agent", "long")  # --use: profiles/usecases.json
FLASH_ATTN = ("on", "off", "auto")
# rocm | vulkan: a discrete GPU run by that ggml backend (llama.cpp -dev ROCm0 / Vulkan0): its buffers are
# named so and its speed uses that backend's factors (kvadvise.planner.speed); cuda: an NVIDIA card
DEVICES = ("auto", "cpu", "cuda", "metal", "rocm", "vulkan")
CPU_REPACK = ("auto", "off", "none", "avx2", "avx512", "amx", "arm-dotprod")  # kvadvise.planner.repack.RULES


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """One planning question. Every field has the default of the flag it comes from, so a request states
    only what the user asked for; ``None`` where kvadvise chooses (the context, the cache types)."""

    # --- the run, in llama.cpp's flags
    n_ctx: int | None = None  # -c, over all slots; None: recommend one; 0: the model's training context
    type_k: str | None = None  # -ctk; None: chosen by the policy (f16, then q8_0, q4_0 when allowed)
    type_v: str | None = None  # -ctv
    flash_attn: str = "auto"  # -fa on|off|auto
    n_parallel: int = 1  # -np
    kv_unified: bool = False  # -kvu
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    swa_full: bool = False  # --swa-full
    device: str = "auto"  # where the layers go: auto | cpu | cuda | metal | rocm | vulkan
    n_outputs_max: int | None = None  # llama_context_params.n_outputs_max; None: what the runtime gives
    tensor_split: tuple[float, ...] = ()  # -ts
    n_cpu_moe: int = 0  # --n-cpu-moe
    cpu_repack: str = "auto"  # the CPU's repack rule: auto = this machine's CPU, off = -nr
    mmproj: str | ProjectorSpec | None = None  # --mmproj FILE (the API may give the header it read)
    draft: ModelSpec | None = None  # -md: the draft model, loaded by the command's backend
    type_k_draft: str = "f16"  # -ctkd
    type_v_draft: str = "f16"  # -ctvd
    spec_type: str = "none"  # --spec-type: none | draft-mtp (the model's own MTP/NextN head drafts)
    spec_draft_n_max: int = 3  # --spec-draft-n-max: tokens drafted per step (llama.cpp's default 3)
    # a repeat, presence or frequency penalty in the sampler (--sampler-penalty; Ollama also: its default or the
    # model's parameters; llama.cpp also: the GGUF's general.sampling.penalty_repeat)
    sampling_penalties: bool = False
    llama_build: str = "auto"  # --llama-build bNNNN | auto | unknown
    overhead_bytes: int | None = None  # per-device fixed cost; None: the device's (or a calibration)
    # --- the hardware
    gpu: str | None = None  # cards of profiles/gpus.json, "4090,3090" or "rtx-3090x2"
    vram_bytes: tuple[int, ...] | None = None  # budgets given by hand, one per GPU
    bandwidth_gbs: float | None = None  # --bandwidth, with --vram
    ram_bytes: int | None = None  # --ram
    ram_bandwidth_gbs: float | None = None  # --ram-bandwidth
    rpc: tuple[RpcHost, ...] = ()  # --rpc HOST:PORT=SIZE
    no_hardware: bool = False  # estimate only
    headless: bool = False  # no display allowance
    margin_bytes: int = DEFAULT_MARGIN_BYTES  # kept free per GPU (llama.cpp's -fitt)
    # --- the wishes
    target_ctx: int = 0  # per slot; 0: the policy's default
    use: str | None = None  # chat | code | agent | long
    min_ctx: int = 0  # per slot: below it, the plan does not fit
    repeatable: bool = False  # an f16 cache only
    allow_cpu: bool = False  # also plan the target with part of the model on the CPU
    allow_q4: bool = False  # a q4_0 cache may be chosen
    gpu_only: bool = False  # 100 % on the GPU or nothing
    prompt_tokens: int | None = None  # the prompt the prefill estimate times
    users: int = 0  # --users N: N sessions of the context per slot (-np N); 0: not asked (kvadvise.planner.users)
    # the fields the user typed although their value is the default's (`kvadvise ollama M --batch 2048`: Ollama's
    # num_batch 2048, where the default leaves Ollama's own 512); the command line fills it (kvadvise.ui.flags.take)
    typed: frozenset[str] = frozenset()

    def given(self) -> tuple[str, ...]:
        """The fields that differ from their default, and those typed: what the user asked for."""
        out = []
        typed = self.typed if isinstance(self.typed, frozenset) else frozenset()  # checked by check()
        for f in fields(self):
            if f.name != "typed" and (getattr(self, f.name) != f.default or f.name in typed):
                out.append(f.name)
        return tuple(out)


# Each field as the command line names it in its messages (click: ``Invalid value for '--ctx' / '-c'``)
FLAGS = {
    "n_ctx": ("--ctx", "-c"),
    "type_k": ("--cache-type-k", "-ctk"),
    "type_v": ("--cache-type-v", "-ctv"),
    "flash_attn": ("--flash-attn", "-fa"),
    "n_parallel": ("--parallel", "-np"),
    "kv_unified": ("--kv-unified", "-kvu"),
    "n_batch": ("--batch", "-b"),
    "n_ubatch": ("--ubatch", "-ub"),
    "swa_full": ("--swa-full",),
    "device": ("--device",),
    "n_outputs_max": ("--n-outputs-max",),
    "tensor_split": ("--tensor-split", "-ts"),
    "n_cpu_moe": ("--n-cpu-moe", "-ncmoe"),
    "cpu_repack": ("--no-repack", "-nr"),
    "mmproj": ("--mmproj",),
    "draft": ("--model-draft", "-md"),
    "type_k_draft": ("--cache-type-k-draft", "-ctkd"),
    "type_v_draft": ("--cache-type-v-draft", "-ctvd"),
    "spec_type": ("--spec-type",),
    "spec_draft_n_max": ("--spec-draft-n-max",),
    "sampling_penalties": ("--sampler-penalty",),
    "llama_build": ("--llama-build",),
    "overhead_bytes": ("overhead_bytes",),
    "gpu": ("--gpu",),
    "vram_bytes": ("--vram",),
    "bandwidth_gbs": ("--bandwidth",),
    "ram_bytes": ("--ram",),
    "ram_bandwidth_gbs": ("--ram-bandwidth",),
    "rpc": ("--rpc",),
    "no_hardware": ("--no-hardware",),
    "headless": ("--headless",),
    "margin_bytes": ("--margin",),
    "target_ctx": ("--target-ctx",),
    "use": ("--use",),
    "min_ctx": ("--min-ctx",),
    "repeatable": ("--repeatable",),
    "allow_cpu": ("--allow-cpu",),
    "allow_q4": ("--allow-q4",),
    "gpu_only": ("--gpu-only",),
    "prompt_tokens": ("--prompt-tokens",),
    "users": ("--users",),
}
# Whole numbers and their bounds: the click options of kvadvise.ui.flags take theirs from here
INT_RANGES: dict[str, tuple[int, int]] = {
    "n_ctx": (0, INT32_MAX),
    "n_parallel": (1, 4096),
    "n_batch": (1, INT32_MAX),
    "n_ubatch": (1, INT32_MAX),
    "n_outputs_max": (0, INT32_MAX),
    "n_cpu_moe": (0, 4096),
    "spec_draft_n_max": (0, 1024),
    "overhead_bytes": (0, MAX_SIZE_BYTES),
    "ram_bytes": (1, MAX_SIZE_BYTES),
    "margin_bytes": (0, MAX_SIZE_BYTES),
    "target_ctx": (0, INT32_MAX),
    "min_ctx": (0, INT32_MAX),
    "prompt_tokens": (1, INT32_MAX),
    "users": (0, 4096),  # -np's bound
}
CHOICES: dict[str, tuple[str, ...]] = {
    "type_k": KV_TYPES,
    "type_v": KV_TYPES,
    "type_k_draft": KV_TYPES,
    "type_v_draft": KV_TYPES,
    "flash_attn": FLASH_ATTN,
    "device": DEVICES,
    "use": USES,
    "cpu_repack": CPU_REPACK,
    "spec_type": SPEC_TYPES,
}
BOOLS = (
    "kv_unified",
    "swa_full",
    "no_hardware",
    "headless",
    "repeatable",
    "allow_cpu",
    "allow_q4",
    "gpu_only",
    "sampling_penalties",
)
TEXTS = ("llama_build", "gpu")
GBS = ("bandwidth_gbs", "ram_bandwidth_gbs")  # GB/s, a finite number from 1 to MAX_GBS
MAX_GBS = 100_000.0  # 100 TB/s: above any memory's bandwidth (an H200 has 4.8), below what overflows bytes/s
MAX_SHARES = 15  # -ts: common/arg.cpp, "got %zu input configs, but system only has %zu devices" from 16
_FLT_MIN = 1.17549435e-38  # -ts reads each share with std::stof, which refuses what float32 cannot hold


def invalid(field: str, message: str, hint: str | None = None) -> InputError:
    """The message click gives for a bad flag value, for a field of the request."""
    names = " / ".join(f"'{n}'" for n in FLAGS.get(field, (field,)))
    return InputError(f"Invalid value for {names}: {message}", hint=hint)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_values(r: PlanRequest) -> None:
    """Each value on its own: its type, its range, its choices (as click's types check a flag)."""
    names = {f.name for f in fields(PlanRequest)}
    if not isinstance(r.typed, frozenset) or not all(isinstance(n, str) and n in names for n in r.typed):
        raise InputError(f"typed: a frozenset of PlanRequest field names, got {_shown(r.typed)}")
    for name, (lo, hi) in INT_RANGES.items():
        v = getattr(r, name)
        if v is None and name in ("n_ctx", "n_outputs_max", "overhead_bytes", "ram_bytes", "prompt_tokens"):
            continue
        if not _is_int(v):
            raise invalid(name, f"{_shown(v)} is not a valid integer.")
        if not lo <= v <= hi:
            raise invalid(name, f"{v} is not in the range {lo}<=x<={hi}.")
    for name, choices in CHOICES.items():
        v = getattr(r, name)
        if v is None and name in ("type_k", "type_v", "use"):
            continue
        if v not in choices:
            listed = ", ".join(f"{c!r}" for c in choices)
            raise invalid(name, f"{_shown(v)} is not one of {listed}.")
    for name in BOOLS:
        if not isinstance(getattr(r, name), bool):
            raise invalid(name, f"{_shown(getattr(r, name))} is not a valid boolean.")
    for name in TEXTS:
        v = getattr(r, name)
        if v is None and name == "gpu":  # no card named; llama_build has its "auto"
            continue
        if not isinstance(v, str):
            raise invalid(name, f"{_shown(v)} is not a string.")
        if not v.strip():
            raise invalid(name, "the value is empty")
        if "\x00" in v:
            raise invalid(name, f"{v!a} holds a NUL byte")
    for name in GBS:
        v = getattr(r, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise invalid(name, f"{_shown(v)} is not a valid float.")
        if isinstance(v, float) and not math.isfinite(v):  # an int is finite (and may be past a float's range)
            raise invalid(name, f"{str(v)!r} is not a finite number")
        if not 1 <= v <= MAX_GBS:
            raise invalid(name, f"{v} is not in the range 1<=x<={MAX_GBS:g}.")
    if r.mmproj is not None and not isinstance(r.mmproj, str):
        from kvadvise.model.projector import ProjectorSpec

        if not isinstance(r.mmproj, ProjectorSpec):
            raise invalid("mmproj", f"expected a path or a ProjectorSpec, got {type(r.mmproj).__name__}")
    elif isinstance(r.mmproj, str) and (not r.mmproj.strip() or "\x00" in r.mmproj):
        raise invalid("mmproj", "the value is empty" if not r.mmproj.strip() else f"{r.mmproj!a} holds a NUL byte")
    _check_sizes(r)
    check_split(r.tensor_split)
    if r.draft is not None:
        from kvadvise.model.spec import ModelSpec

        if not isinstance(r.draft, ModelSpec):
            raise invalid("draft", f"expected a ModelSpec (kvadvise.load_model), got {type(r.draft).__name__}")


def _check_sizes(r: PlanRequest) -> None:
    if r.vram_bytes is not None:
        if not isinstance(r.vram_bytes, tuple) or not r.vram_bytes:
            raise invalid("vram_bytes", f"{_shown(r.vram_bytes)}: one size in bytes per GPU (a tuple)")
        for v in r.vram_bytes:
            if not _is_int(v) or v <= 0:
                raise invalid("vram_bytes", f"{_shown(v)} is not a size in bytes above 0")
            if v > MAX_SIZE_BYTES:  # as parse_size refuses `--vram 99999999999999999999999GiB`
                raise invalid("vram_bytes", f"{_shown(v)} bytes is more than 8 EiB: no memory is that large")
    if not isinstance(r.rpc, tuple) or any(not isinstance(h, RpcHost) for h in r.rpc):
        raise invalid("rpc", f"{_shown(r.rpc)}: a tuple of RpcHost (kvadvise.ui.flags.parse_rpc_host)")


def check_split(shares: object) -> None:
    """llama.cpp's -ts as llama-server takes it (common/arg.cpp ``-ts``): finite shares >= 0, not all 0, at
    most 15, each one a float32 can hold (``std::stof``)."""
    if shares == ():
        return
    if not isinstance(shares, tuple) or any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in shares):
        raise invalid("tensor_split", f"{_shown(shares)}: shares as a tuple of numbers, e.g. (3, 1)")
    if any(not 0 <= s < 1e9 for s in shares) or not any(shares):  # NaN and infinities fail the range too
        raise invalid("tensor_split", f"{_shown(shares)}: shares >= 0, not all 0, e.g. 3,1")
    tiny = [x for x in shares if x and float(f"{x:g}") < _FLT_MIN]
    if tiny:
        raise invalid(
            "tensor_split",
            f"{_shown(shares)}: llama-server reads each share as a float (std::stof) and refuses {tiny[0]:g}, "
            "below float32's smallest normal number; give shares such as 1,3",
        )
    if len(shares) > MAX_SHARES:
        raise invalid(
            "tensor_split", f"{_shown(shares)}: {len(shares)} shares; llama-server takes at most {MAX_SHARES}"
        )


def _check_together(r: PlanRequest) -> None:
    """Values that contradict each other: refused (exit 2) rather than one silently winning."""
    if r.rpc and (r.gpu or r.vram_bytes is not None):
        raise InputError("--rpc plans the RPC hosts as the devices: give it without --gpu/--vram")
    if r.gpu and r.vram_bytes is not None:
        raise InputError("give --gpu or --vram, not both")
    if r.bandwidth_gbs is not None and r.vram_bytes is None:
        raise InputError("--bandwidth goes with --vram (a --gpu card has its own)")
    if (r.gpu or r.vram_bytes is not None or r.rpc) and r.device == "cpu":
        raise InputError(
            "--device cpu plans without a GPU: drop --gpu/--vram, or name the GPU's backend (--device cuda|rocm|vulkan)"
        )
    if r.n_cpu_moe and r.allow_cpu:
        raise InputError("--n-cpu-moe places the experts as given; --allow-cpu finds a placement: give one")
    if r.n_cpu_moe and r.gpu_only:
        raise InputError("--n-cpu-moe keeps experts on the CPU; --gpu-only keeps the whole model on the GPU: give one")
    if r.n_cpu_moe and r.device == "cpu":
        raise InputError("--n-cpu-moe keeps experts on the CPU beside a GPU: drop it with --device cpu")
    if r.n_ctx is not None and (r.use or r.target_ctx):
        raise InputError("--ctx fixes the context; --use and --target-ctx aim for one: give one of them")
    if r.use and r.target_ctx:
        raise InputError("give --use or --target-ctx, not both")
    if r.min_ctx:  # a floor above what is asked for: one of the two would be dropped
        per_slot = r.n_ctx // max(1, r.n_parallel) if r.n_ctx else 0
        if per_slot and per_slot < r.min_ctx:
            raise InputError(
                f"--ctx {r.n_ctx:,} gives {per_slot:,} tokens a slot, below --min-ctx {r.min_ctx:,}: give one of them"
            )
        if r.target_ctx and r.target_ctx < r.min_ctx:
            raise InputError(f"--target-ctx {r.target_ctx:,} is below --min-ctx {r.min_ctx:,}: give one of them")
        if r.use:
            from kvadvise.planner.policy import load_use_cases

            aim = load_use_cases().get(r.use, 0)
            if aim and aim < r.min_ctx:
                raise InputError(
                    f"--use {r.use} aims for {aim:,} tokens, below --min-ctx {r.min_ctx:,}: give one of them"
                )
    if r.gpu_only and r.allow_cpu:
        raise InputError("--gpu-only keeps the whole model on the GPU; --allow-cpu plans part on the CPU")
    if r.users and r.n_parallel not in (1, r.users):
        raise InputError(f"--users {r.users} runs -np {r.users}: drop --parallel {r.n_parallel}")
    if r.users and r.no_hardware:
        raise InputError("--users asks how many sessions fit a card: drop --no-hardware, or name one (--gpu, --vram)")
    if r.no_hardware and (r.gpu or r.vram_bytes is not None or r.rpc):
        raise InputError("--no-hardware plans without a GPU: drop --gpu/--vram/--rpc, or --no-hardware")
    if r.draft is not None and r.spec_type == "draft-mtp":
        # common_speculative_init_result (b11312): with -md the draft model's context is made, not the MTP one
        raise InputError("--spec-type draft-mtp drafts with the model's own MTP head: drop --model-draft, or it")


def check(r: PlanRequest) -> PlanRequest:
    """Refuse a bad request with the message the command line gives (InputError, exit 2); return it."""
    if not isinstance(r, PlanRequest):
        raise InputError(f"expected a PlanRequest, got {type(r).__name__}")
    _check_values(r)
    _check_together(r)
    return r
