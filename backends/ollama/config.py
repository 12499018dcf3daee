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
from pathlib import Path

from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.modelfile import modelfile_text, parse_modelfile
from kvadvise.backends.ollama.rules import KV_CACHE_TYPES, OllamaSettings
from kvadvise.files import write_text_file

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

SYSTEMD_DROPIN_DIR = Path("/etc/systemd/system/ollama.service.d")
SYSTEMD_RELOAD = "sudo systemctl daemon-reload && sudo systemctl restart ollama"


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
