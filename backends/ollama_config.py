"""Ollama settings and the texts that apply them: a Modelfile, an env file, a systemd drop-in.

What each setting does in Ollama >= 0.30 (memory-spec.md §6.a, §6.c, §6.g):
``num_ctx`` (Modelfile / ``OLLAMA_CONTEXT_LENGTH``) is the context *per slot*;
llama-server gets ``-c num_ctx*num_parallel -np num_parallel``;
``OLLAMA_KV_CACHE_TYPE`` is one type for K and V and is server-wide (every
model on that server gets it); ``OLLAMA_FLASH_ATTENTION`` becomes
``--flash-attn on|off``; ``num_batch`` becomes ``-b/-ub``;
``LLAMA_ARG_FIT_TARGET`` (MiB) is the margin llama.cpp's ``--fit`` keeps free.

The builders are pure text; :func:`write_text_file` writes atomically and
never overwrites without ``force``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import ConfigError
from advisor.files import write_text_file
from backends.ollama import OllamaModel
from backends.ollama_modelfile import modelfile_text, parse_modelfile

__all__ = [
    "KV_CACHE_TYPES",
    "SYSTEMD_DROPIN_DIR",
    "OllamaSettings",
    "apply_hint_env",
    "apply_hint_modelfile",
    "apply_hint_systemd",
    "created_name",
    "env_lines",
    "env_text",
    "modelfile_text",
    "parse_modelfile",
    "systemd_text",
    "write_text_file",
]

KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")  # what Ollama documents (docs/faq); one type for K and V
SYSTEMD_DROPIN_DIR = Path("/etc/systemd/system/ollama.service.d")
SYSTEMD_RELOAD = "sudo systemctl daemon-reload && sudo systemctl restart ollama"


@dataclass(frozen=True, slots=True)
class OllamaSettings:
    """What kvadvise advises an Ollama user to set."""

    num_ctx: int  # context per slot (Ollama's num_ctx)
    num_parallel: int  # OLLAMA_NUM_PARALLEL
    kv_cache_type: str  # OLLAMA_KV_CACHE_TYPE: f16 | q8_0 | q4_0, for K and V, server-wide
    flash_attention: bool  # OLLAMA_FLASH_ATTENTION
    num_batch: int | None = None  # PARAMETER num_batch, only when the advice changes it
    fit_target_mib: int | None = None  # LLAMA_ARG_FIT_TARGET

    def __post_init__(self) -> None:
        for field, v in (("num_ctx", self.num_ctx), ("num_parallel", self.num_parallel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{field} must be a positive whole number, got {v!r}")
        if self.num_batch is not None and (
            isinstance(self.num_batch, bool) or not isinstance(self.num_batch, int) or self.num_batch < 1
        ):
            raise ConfigError(f"num_batch must be a positive whole number, got {self.num_batch!r}")
        if self.fit_target_mib is not None and (
            isinstance(self.fit_target_mib, bool) or not isinstance(self.fit_target_mib, int) or self.fit_target_mib < 0
        ):
            raise ConfigError(f"fit_target_mib must be a whole number >= 0, got {self.fit_target_mib!r}")
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ConfigError(
                f"OLLAMA_KV_CACHE_TYPE {self.kv_cache_type!r} is not one Ollama supports",
                hint="one of " + ", ".join(KV_CACHE_TYPES),
            )
        if self.kv_cache_type != "f16" and not self.flash_attention:
            # Ollama passes the type as both -ctk and -ctv; llama.cpp refuses a quantized V without FA
            raise ConfigError(
                f"OLLAMA_KV_CACHE_TYPE={self.kv_cache_type} needs flash attention (a quantized V cache does)",
                hint="set OLLAMA_FLASH_ATTENTION=1 or use f16",
            )

    @property
    def kv_is_server_wide(self) -> bool:
        """A non-default KV cache type changes the cache of every model the server runs."""
        return self.kv_cache_type != "f16"


def env_lines(s: OllamaSettings) -> list[tuple[str, str]]:
    """The environment, as (name, value): flash attention and KV type always, the rest where set."""
    env = [
        ("OLLAMA_FLASH_ATTENTION", "1" if s.flash_attention else "0"),
        ("OLLAMA_KV_CACHE_TYPE", s.kv_cache_type),
        ("OLLAMA_CONTEXT_LENGTH", str(s.num_ctx)),
        ("OLLAMA_NUM_PARALLEL", str(s.num_parallel)),
    ]
    if s.fit_target_mib is not None:
        env.append(("LLAMA_ARG_FIT_TARGET", str(s.fit_target_mib)))
    return env


def env_text(s: OllamaSettings) -> str:
    """``KEY=VALUE`` lines for the server's environment (a shell can source it; systemd's EnvironmentFile reads it)."""
    head = "# Ollama server settings written by kvadvise. They apply to every model this server runs.\n"
    return head + "".join(f"{k}={v}\n" for k, v in env_lines(s))


def systemd_text(s: OllamaSettings) -> str:
    """A drop-in for /etc/systemd/system/ollama.service.d/: ``[Service]`` with ``Environment="K=V"`` lines."""
    head = "# Ollama server settings written by kvadvise. They apply to every model this server runs.\n"
    return head + "[Service]\n" + "".join(f'Environment="{k}={v}"\n' for k, v in env_lines(s))


def created_name(model: OllamaModel, num_ctx: int) -> str:
    """The name for ``ollama create``: the model part, its tag unless latest, the context (``qwen3-coder-30b-32k``)."""
    base = model.name.rsplit("/", 1)[-1]
    if model.tag.lower() != "latest":
        base = f"{base}-{model.tag}"
    ctx = f"{num_ctx // 1024}k" if num_ctx % 1024 == 0 else str(num_ctx)
    return f"{base}-{ctx}"


def apply_hint_modelfile(model: OllamaModel, s: OllamaSettings, path: str | Path) -> str:
    """``ollama create NAME-<ctx> -f PATH``."""
    return f"ollama create {created_name(model, s.num_ctx)} -f {shlex.quote(str(path))}"


def apply_hint_env(path: str | Path) -> tuple[str, ...]:
    """How to start a server with an env file."""
    p = shlex.quote(str(path))
    return (
        f"set -a && . {p} && set +a && ollama serve",
        f"(systemd: add EnvironmentFile={Path(path).expanduser().absolute()} to the [Service] of ollama.service)",
    )


def apply_hint_systemd(path: str | Path) -> tuple[str, ...]:
    """Install the drop-in (unless it was written in place) and restart Ollama."""
    p = Path(path).expanduser().absolute()
    if p.parent == SYSTEMD_DROPIN_DIR:
        return (SYSTEMD_RELOAD,)
    name = p.name if p.name.endswith(".conf") else "kvadvise.conf"  # systemd reads only *.conf drop-ins
    return (
        f"sudo mkdir -p {SYSTEMD_DROPIN_DIR} && sudo cp {shlex.quote(str(p))} {SYSTEMD_DROPIN_DIR / name}",
        SYSTEMD_RELOAD,
    )
