"""The llama-server command line (and LLAMA_ARG_* environment) for a config.

Flag and variable names follow common/arg.cpp (llama.cpp 0c1e570). Every flag
that changes memory is stated explicitly, because llama-server's defaults
differ from the library's: without -np it runs 4 slots in one unified cache.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kvadvise.model.ggml import GGMLType
from kvadvise.planner.memory import RunConfig

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


def server_args(
    model: str | ModelSource, cfg: RunConfig, *, n_gpu_layers: int | None = None, n_cpu_moe: int = 0
) -> list[tuple[str, str, str | None]]:
    """(flag, LLAMA_ARG_ variable, value) triples; value None = a switch. A str ``model`` is a local path."""
    ngl = n_gpu_layers if n_gpu_layers is not None else ALL_LAYERS if cfg.device not in ("cpu", "auto") else 0
    source = model if isinstance(model, ModelSource) else ModelSource.path(model)
    out: list[tuple[str, str, str | None]] = [
        *source.args,
        ("-c", "LLAMA_ARG_CTX_SIZE", str(cfg.n_ctx)),
        ("-np", "LLAMA_ARG_N_PARALLEL", str(cfg.n_parallel)),
        ("-fa", "LLAMA_ARG_FLASH_ATTN", cfg.flash_attn),
        ("-ctk", "LLAMA_ARG_CACHE_TYPE_K", cfg.type_k.type_name),
        ("-ctv", "LLAMA_ARG_CACHE_TYPE_V", cfg.type_v.type_name),
        ("-ngl", "LLAMA_ARG_N_GPU_LAYERS", str(ngl)),
    ]
    if n_cpu_moe:
        out.append(("--n-cpu-moe", "LLAMA_ARG_N_CPU_MOE", str(n_cpu_moe)))
    if cfg.rpc_servers:  # the hosts of llama.cpp's RPC backend, each running rpc-server (tools/rpc)
        out.append(("--rpc", "LLAMA_ARG_RPC", ",".join(cfg.rpc_servers)))
    if len(cfg.tensor_split) > 1:  # -sm layer's shares, as planned (llama_model::load_tensors)
        out.append(("-ts", "LLAMA_ARG_TENSOR_SPLIT", ",".join(f"{x:g}" for x in cfg.tensor_split)))
    if cfg.mmproj is not None:  # common/arg.cpp -mm/--mmproj: the projector loads on the first device
        out.append(("--mmproj", "LLAMA_ARG_MMPROJ", cfg.mmproj.source))
    if cfg.draft is not None:  # common/arg.cpp -md, -ngld, -ctkd, -ctvd: the draft's own context
        out.append(("-md", "LLAMA_ARG_SPEC_DRAFT_MODEL", cfg.draft.source))
        out.append(
            ("-ngld", "LLAMA_ARG_N_GPU_LAYERS_DRAFT", str(ALL_LAYERS if cfg.device not in ("cpu", "auto") else 0))
        )
        if cfg.type_k_draft != GGMLType.F16:
            out.append(("-ctkd", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", cfg.type_k_draft.type_name))
        if cfg.type_v_draft != GGMLType.F16:
            out.append(("-ctvd", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", cfg.type_v_draft.type_name))
    if cfg.cpu_repack == "off" and cfg.device == "cpu":  # common/arg.cpp --no-repack (params.no_extra_bufts)
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
    words = [binary]
    for flag, _, value in server_args(model, cfg, n_gpu_layers=n_gpu_layers, n_cpu_moe=n_cpu_moe):
        words.append(flag)
        if value is not None:
            words.append(value)
    return shlex.join(words)


def server_env(model: str | ModelSource, cfg: RunConfig, *, n_cpu_moe: int = 0) -> dict[str, str]:
    """The same settings as LLAMA_ARG_* variables (a switch is "true")."""
    return {
        var: value if value is not None else "true" for _, var, value in server_args(model, cfg, n_cpu_moe=n_cpu_moe)
    }


def env_text(model: str | ModelSource, cfg: RunConfig, *, n_cpu_moe: int = 0) -> str:
    lines = [
        "# llama-server settings written by kvadvise; llama.cpp reads LLAMA_ARG_* for flags not on its command line"
    ]
    lines += [f"{var}={shlex.quote(value)}" for var, value in server_env(model, cfg, n_cpu_moe=n_cpu_moe).items()]
    return "\n".join(lines) + "\n"
