"""llama-server as a runtime: its command line (and LLAMA_ARG_* environment) for a config and a plan.

Flag and variable names follow common/arg.cpp (llama.cpp 0c1e570). Every flag
that changes memory is stated explicitly, because llama-server's defaults
differ from the library's: without -np it runs 4 slots in one unified cache.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.model.ggml import GGMLType, is_quantized
from kvadvise.planner import builds
from kvadvise.planner.memory import RunConfig
from kvadvise.planner.offload import cpu_moe_flags
from kvadvise.planner.planning import AdviceSummary, Plan
from kvadvise.request import PlanRequest
from kvadvise.runtime.seam import LlamaCppRuntime, Writer

if TYPE_CHECKING:
    from kvadvise.planner.hostram import HostRam
    from kvadvise.planner.offload import Offload

ALL_LAYERS = 999  # -ngl 999: every layer and the output layer on the GPU (works on every build)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where llama-server finds the model: ``-m PATH``, ``-mu URL``, or ``-hf USER/REPO[:QUANT]`` /
    ``-hfr USER/REPO -hff FILE`` (it downloads those itself; common/arg.cpp)."""

    args: tuple[tuple[str, str, str], ...]  # (flag, LLAMA_ARG_ variable, value)

    @classmethod
    def path(cls, model_path: str) -> ModelSource:
        return cls((("-m", "LLAMA_ARG_MODEL", model_path),))

    @classmethod
    def url(cls, url: str) -> ModelSource:
        return cls((("-mu", "LLAMA_ARG_MODEL_URL", url),))

    @classmethod
    def hub(cls, repo_id: str, *, quant: str | None = None, filename: str | None = None) -> ModelSource:
        if filename is not None:
            return cls((("-hfr", "LLAMA_ARG_HF_REPO", repo_id), ("-hff", "LLAMA_ARG_HF_FILE", filename)))
        return cls((("-hf", "LLAMA_ARG_HF_REPO", f"{repo_id}:{quant}" if quant else repo_id),))


def no_repack(cfg: RunConfig) -> bool:
    """Whether llama-server runs ``cfg`` with --no-repack (common/arg.cpp, params.no_extra_bufts): a CPU plan
    without the CPU's extra buffer types (AMX, CPU_REPACK)."""
    return cfg.cpu_repack == "off" and cfg.device == "cpu"


def _flash_attn_args(cfg: RunConfig) -> list[tuple[str, str, str | None]]:
    """-fa on|off|auto; for a build before builds.FA_VALUE a switch without a value, given only where flash
    attention is on (asked for, or a quantized V cache, which needs it): that build reads `-fa on` as two
    arguments and stops ("invalid argument: on")."""
    if not builds.older_than(cfg.llama_build, builds.FA_VALUE):
        return [("-fa", "LLAMA_ARG_FLASH_ATTN", cfg.flash_attn)]
    on = cfg.flash_attn == "on" or (cfg.flash_attn == "auto" and is_quantized(cfg.type_v))
    return [("-fa", "LLAMA_ARG_FLASH_ATTN", None)] if on else []


def server_args(
    model: str | ModelSource,
    cfg: RunConfig,
    *,
    n_gpu_layers: int | None = None,
    n_cpu_moe: int = 0,
    expert_overflow: str = "",
) -> list[tuple[str, str, str | None]]:
    """(flag, LLAMA_ARG_ variable, value) triples; value None = a switch. A str ``model`` is a local path.
    ``expert_overflow``: block ``n_cpu_moe - 1`` keeps part of its experts on the GPU (Offload.expert_overflow):
    ``--n-cpu-moe N - 1`` and an -ot of what of that block stays on the CPU."""
    ngl = n_gpu_layers if n_gpu_layers is not None else ALL_LAYERS if cfg.device not in ("cpu", "auto") else 0
    source = model if isinstance(model, ModelSource) else ModelSource.path(model)
    out: list[tuple[str, str, str | None]] = [
        *source.args,
        ("-c", "LLAMA_ARG_CTX_SIZE", str(cfg.n_ctx)),
        ("-np", "LLAMA_ARG_N_PARALLEL", str(cfg.n_parallel)),
        *_flash_attn_args(cfg),
        ("-ctk", "LLAMA_ARG_CACHE_TYPE_K", cfg.type_k.type_name),
        ("-ctv", "LLAMA_ARG_CACHE_TYPE_V", cfg.type_v.type_name),
        ("-ngl", "LLAMA_ARG_N_GPU_LAYERS", str(ngl)),
    ]
    n_cpu_moe, override = cpu_moe_flags(n_cpu_moe, expert_overflow)
    if n_cpu_moe:
        out.append(("--n-cpu-moe", "LLAMA_ARG_N_CPU_MOE", str(n_cpu_moe)))
    if override:  # common/arg.cpp -ot: pattern=buffer type, after --n-cpu-moe's own overrides (other blocks)
        out.append(("-ot", "LLAMA_ARG_OVERRIDE_TENSOR", override))
    if cfg.devices:  # common/arg.cpp -dev: only these devices (a model that fits one card stays on it)
        out.append(("-dev", "LLAMA_ARG_DEVICE", ",".join(cfg.devices)))
    if cfg.rpc_servers:  # the hosts of llama.cpp's RPC backend, each running rpc-server (tools/rpc)
        out.append(("--rpc", "LLAMA_ARG_RPC", ",".join(cfg.rpc_servers)))
    if len(cfg.tensor_split) > 1:  # -sm layer's shares, as planned (llama_model::load_tensors)
        out.append(("-ts", "LLAMA_ARG_TENSOR_SPLIT", ",".join(f"{x:g}" for x in cfg.tensor_split)))
    if cfg.mmproj is not None:  # common/arg.cpp -mm/--mmproj: the projector loads on the first device
        out.append(("--mmproj", "LLAMA_ARG_MMPROJ", cfg.mmproj.source))
        if cfg.device == "cpu":  # mtmd offloads the projector to a GPU whatever -ngl says (mmproj_use_gpu = true)
            out.append(("--no-mmproj-offload", "LLAMA_ARG_NO_MMPROJ_OFFLOAD", None))
    if cfg.draft is not None:  # common/arg.cpp -md, -ngld, -ctkd, -ctvd: the draft's own context
        if builds.older_than(cfg.llama_build, builds.SPEC_DRAFT_ARGS):
            # before the speculative types (builds.SPEC_DRAFT_ARGS) -md alone drafts, --draft-max N tokens a step
            out.append(("-md", "LLAMA_ARG_MODEL_DRAFT", cfg.draft.source))
            out.append(("--draft-max", "LLAMA_ARG_DRAFT_MAX", str(cfg.spec_draft_n_max)))
            env_k, env_v = "LLAMA_ARG_CACHE_TYPE_K_DRAFT", "LLAMA_ARG_CACHE_TYPE_V_DRAFT"
        else:
            out.append(("-md", "LLAMA_ARG_SPEC_DRAFT_MODEL", cfg.draft.source))
            # b11312's speculative types default to none (common/common.h) and -md does not change it: without a
            # type common_speculative_init makes no drafter and llama-server frees the draft model at start-up
            out.append(("--spec-type", "LLAMA_ARG_SPEC_TYPE", "draft-simple"))
            out.append(("--spec-draft-n-max", "LLAMA_ARG_SPEC_DRAFT_N_MAX", str(cfg.spec_draft_n_max)))
            env_k, env_v = "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"
        out.append(
            ("-ngld", "LLAMA_ARG_N_GPU_LAYERS_DRAFT", str(ALL_LAYERS if cfg.device not in ("cpu", "auto") else 0))
        )
        if cfg.type_k_draft != GGMLType.F16:
            out.append(("-ctkd", env_k, cfg.type_k_draft.type_name))
        if cfg.type_v_draft != GGMLType.F16:
            out.append(("-ctvd", env_v, cfg.type_v_draft.type_name))
    if cfg.mtp:  # common/arg.cpp --spec-type, --spec-draft-n-max: the MTP context (kvadvise.planner.mtp)
        out.append(("--spec-type", "LLAMA_ARG_SPEC_TYPE", "draft-mtp"))
        out.append(("--spec-draft-n-max", "LLAMA_ARG_SPEC_DRAFT_N_MAX", str(cfg.spec_draft_n_max)))
        if cfg.type_k_draft != GGMLType.F16:
            out.append(("-ctkd", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", cfg.type_k_draft.type_name))
        if cfg.type_v_draft != GGMLType.F16:
            out.append(("-ctvd", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", cfg.type_v_draft.type_name))
    if no_repack(cfg):
        out.append(("--no-repack", "LLAMA_ARG_NO_REPACK", None))  # LLAMA_ARG_NO_*: the negative form
    if cfg.kv_unified:
        out.append(("-kvu", "LLAMA_ARG_KV_UNIFIED", None))
    if cfg.swa_full:
        out.append(("--swa-full", "LLAMA_ARG_SWA_FULL", None))
    if cfg.n_batch != 2048:
        out.append(("-b", "LLAMA_ARG_BATCH", str(cfg.n_batch)))
    if cfg.n_ubatch != 512:
        out.append(("-ub", "LLAMA_ARG_UBATCH", str(cfg.n_ubatch)))
    return out


def command_text(
    model: str | ModelSource,
    cfg: RunConfig,
    binary: str = "llama-server",
    *,
    n_gpu_layers: int | None = None,
    n_cpu_moe: int = 0,
) -> str:
    return args_text(server_args(model, cfg, n_gpu_layers=n_gpu_layers, n_cpu_moe=n_cpu_moe), binary)


# --- the plan that runs: 100 % on the GPU, or its partial offload, and the RAM's flags --------------------


def _ram_args(ram: HostRam | None) -> list[tuple[str, str, str | None]]:
    """--cache-ram / --ctx-checkpoints where the RAM needs less than llama.cpp's defaults (common/arg.cpp
    -cram, LLAMA_ARG_CACHE_RAM; -ctxcp, LLAMA_ARG_CTX_CHECKPOINTS)."""
    out: list[tuple[str, str, str | None]] = []
    if ram is not None and ram.ctx_checkpoints is not None:
        out.append(("--ctx-checkpoints", "LLAMA_ARG_CTX_CHECKPOINTS", str(ram.ctx_checkpoints)))
    if ram is not None and ram.cache_ram_mib is not None:
        out.append(("--cache-ram", "LLAMA_ARG_CACHE_RAM", str(ram.cache_ram_mib)))
    return out


def plan_args(model: ModelSource, plan: Plan, off: Offload | None) -> list[tuple[str, str, str | None]]:
    """llama-server's (flag, variable, value) for the plan's config, or for its partial offload ``off``."""
    if off is None:
        # --n-cpu-moe N as given: the command keeps it (kvadvise.planner.offload.cpu_moe_placement planned it)
        ncmoe = plan.cpu_moe.n_cpu_moe if plan.cpu_moe is not None else 0
        cfg = plan.config
        if cfg.n_ctx == 0:
            # -c 0 as resolved (n_ctx_train): llama-server's --fit, on by default, turns an unset context into
            # n_ctx_train x n_seq_max (common/fit.cpp common_params_fit_impl), not the n_ctx_train planned
            cfg = replace(cfg, n_ctx=plan.estimate.layout.n_ctx)
        return server_args(model, cfg, n_cpu_moe=ncmoe) + _ram_args(plan.ram)
    cfg = replace(plan.config, n_ctx=off.n_ctx * plan.config.n_parallel, type_k=off.type_k, type_v=off.type_v)
    if off.tensor_split:  # the layers per device the partial plan dealt (--fit's fill)
        cfg = replace(cfg, tensor_split=off.tensor_split)
    if (
        cfg.flash_attn == "auto"
        and plan.estimate.layout.flash_attn
        and any(plan.spec.recurrent_layers)
        and not builds.older_than(cfg.llama_build, builds.FA_VALUE)
    ):
        # -fa on, as planned: at a partial -ngl of a hybrid, llama_context::resolve_fused_ops (src/llama-context.cpp)
        # finds the last CPU layer's attention taken by the device when the first device layer is recurrent
        # (ggml_backend_sched expands the device up over weightless ops) and turns auto off for the whole context:
        # LFM2 at -ngl 3, -ub 2048, printed 596 MiB of compute (the 8 x 8192 x 2048 f32 KQ) where 112 were planned
        cfg = replace(cfg, flash_attn="on")
    args = server_args(
        model, cfg, n_gpu_layers=off.n_gpu_layers, n_cpu_moe=off.n_cpu_moe, expert_overflow=off.expert_overflow
    )
    return args + _ram_args(off.ram)


def args_text(args: list[tuple[str, str, str | None]], binary: str | None = "llama-server") -> str:
    """The command line of ``args``, shell-quoted (``binary`` None: the flags alone)."""
    words = [] if binary is None else [binary]
    for flag, _, value in args:
        words += [flag] if value is None else [flag, value]
    return shlex.join(words)


@dataclass(frozen=True, slots=True)
class ServerAdvice:
    """llama-server's part of a plan: the command that runs it (and, when the GPU alone does not fit, the
    command of the plan that runs with part on the CPU), and its LLAMA_ARG_* environment."""

    command: str  # the plan's own config
    offload_command: str | None  # its partial offload, when one was planned
    run_command: str | None  # what to run: the command, or the offload's; None when nothing runs
    env: tuple[tuple[str, str], ...]  # the run command as LLAMA_ARG_* variables
    rpc_servers: tuple[str, ...]  # one rpc-server to start per host (tools/rpc)
    partial: bool  # the run command keeps part of the model on the CPU
    fits: bool | None  # the plan's own config fits the GPUs
    key: str = "llama_server"

    def json_doc(self) -> dict[str, object]:
        return {
            "command": self.command,
            "env": dict(self.env),
            "offload_command": self.offload_command,
            # what to run: the command, or the offload's when the GPU alone does not fit; null when nothing runs
            "run_command": self.run_command,
        }

    def summary(self) -> AdviceSummary:
        return AdviceSummary(
            "Settings (llama.cpp)", (), command=self.run_command or "no command: this plan does not fit"
        )

    def text(self) -> str:
        lines = [""]
        for ep in self.rpc_servers:  # llama.cpp's RPC backend: one rpc-server per host (tools/rpc)
            lines.append(f"# on {ep.rpartition(':')[0]}: rpc-server -H 0.0.0.0 -p {ep.rpartition(':')[2]}")
        if self.rpc_servers:  # tools/rpc/README.md: never run the RPC server on an open network
            lines.append("# rpc-server has no authentication: bind it to a trusted network only, never an open one")
        if self.partial and self.run_command:  # the plan that runs: part on the CPU
            lines.append("# 100% on the GPU does not fit; the plan that runs keeps part of the model on the CPU:")
            lines.append(self.run_command)
            return "\n".join(lines)
        # a plan that runs nowhere prints its commands commented out: the last line is what `| tail -1` takes
        quiet = "" if self.run_command is not None else "# "
        if quiet:
            lines.append("# no command: this plan does not fit; for reference, what it would run:")
        lines.append(quiet + self.command)
        if self.offload_command is not None:
            lines.append(
                "# at the target with part of the model on the CPU (--allow-cpu):"
                if self.fits
                else "# with part of the model on the CPU (does not fit the RAM either):"
            )
            lines.append(quiet + self.offload_command)
        return "\n".join(lines)

    def next_steps(self, written: Sequence[tuple[str, str]]) -> tuple[str, tuple[str, ...]]:
        return "", ()


def server_advice(model: ModelSource, plan: Plan) -> ServerAdvice:
    run = plan.offload_to_run
    run_args = plan_args(model, plan, run)
    return ServerAdvice(
        command=args_text(plan_args(model, plan, None)),
        offload_command=args_text(plan_args(model, plan, plan.offload)) if plan.offload is not None else None,
        run_command=args_text(run_args) if plan.runnable is not False else None,
        env=tuple((var, value if value is not None else "true") for _, var, value in run_args),
        rpc_servers=plan.config.rpc_servers,
        partial=run is not None,
        fits=plan.fits,
    )


def plan_env_text(plan: Plan) -> str:
    """The plan that runs as LLAMA_ARG_* variables (an env file llama-server reads): the ``--write-env`` file."""
    assert isinstance(plan.advice, ServerAdvice), "a llama-server env file needs the plan's command line"
    lines = [
        "# llama-server settings written by kvadvise; llama.cpp reads LLAMA_ARG_* for flags not on its command line"
    ]
    lines += [f"{var}={shlex.quote(value)}" for var, value in plan.advice.env]
    return "\n".join(lines) + "\n"


def _env_hints(plan: Plan, path: Path) -> tuple[str, ...]:
    # `. ./file`: a bare `. file` searches PATH in dash, zsh and bash --posix; quoted, as a line to paste:
    # `--write-env '$(touch x).env'` printed a command that ran `touch x`, and a name with a space broke it
    shown = shlex.quote(str(path) if path.is_absolute() else f"./{path}")
    return (f"load it with `set -a; . {shown}; set +a` before starting llama-server",)


class LlamaServer(LlamaCppRuntime):
    """llama-server: logits for one row per slot (tools/server/server-context.cpp server_output_limits).
    With ``source`` (how llama-server finds the model: -m, -mu, -hf) the plan carries its command line and
    the runtime writes it as an env file (``--write-env``)."""

    name = "llama-server"
    program = "llama-server"

    def __init__(self, source: ModelSource | None = None) -> None:
        self.source = source

    def advise(self, plan: Plan, request: PlanRequest) -> Plan:
        if self.source is None:
            return plan
        return replace(plan, advice=server_advice(self.source, plan))

    def writers(self) -> tuple[Writer[Plan], ...]:
        return WRITERS


WRITERS: tuple[Writer[Plan], ...] = (
    Writer(
        "--write-env",
        "Also write the settings as LLAMA_ARG_* variables (an env file llama-server reads).",
        plan_env_text,
        _env_hints,
    ),
)
