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

import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from kvadvise.backends.ollama import envconfig
from kvadvise.backends.ollama.model import OllamaModel
from kvadvise.backends.ollama.modelfile import modelfile_text, parse_modelfile
from kvadvise.backends.ollama.rules import KV_CACHE_TYPES, SERVER_KV_CACHE_TYPES, OllamaSettings
from kvadvise.files import write_text_file

if TYPE_CHECKING:
    from kvadvise.planner.planning import Plan

__all__ = [
    "KV_CACHE_TYPES",
    "SERVER_KV_CACHE_TYPES",
    "SYSTEMD_DROPIN_DIR",
    "OllamaSettings",
    "apply_hint_env",
    "apply_hint_modelfile",
    "apply_hint_systemd",
    "apply_hints_server",
    "call_hints",
    "created_name",
    "dropin_name",
    "env_effects",
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
    """The server environment this plan needs, as (name, value).

    - ``OLLAMA_FLASH_ATTENTION`` and ``OLLAMA_KV_CACHE_TYPE`` always (the cache type not for a model that keeps
      no K/V cache: an embedding model's encoder), f16 and flash attention on included:
      the plan was sized for them, and a value left in the service from before (``q4_0``, ``0``) would
      otherwise win (llm/llama_server.go passes both to llama-server: ``--cache-type-k/-v``, ``--flash-attn``);
    - ``OLLAMA_NUM_PARALLEL`` for more than one slot, or 1 for a repeatable plan or where this shell sets another;
    - ``OLLAMA_CONTEXT_LENGTH`` only for a server default (it loads every other model at that context);
    - ``LLAMA_ARG_FIT_TARGET`` when the margin is not llama.cpp's 1024 MiB;
    - ``LLAMA_ARG_CACHE_RAM`` / ``LLAMA_ARG_CTX_CHECKPOINTS`` when the RAM needs a smaller prompt cache or
      fewer context checkpoints than llama.cpp's defaults (the runner inherits the server's environment).
    """
    env = [("OLLAMA_FLASH_ATTENTION", "1" if s.flash_attention else "0")]
    if s.kv_cache:  # a model without a K/V cache (an encoder) leaves the server's cache type as it is
        env.append(("OLLAMA_KV_CACHE_TYPE", s.kv_cache_type))
    if s.server_default:
        env.append(("OLLAMA_CONTEXT_LENGTH", str(s.num_ctx)))
    # the slots: stated for more than one, for a repeatable plan, and where this shell sets another count (the
    # server started from it, or given a file beside an earlier value, would run -np that many: llm/llama_server.go)
    shell_slots = envconfig.uint("OLLAMA_NUM_PARALLEL", 1)
    if s.num_parallel > 1 or s.repeatable or shell_slots != s.num_parallel:
        env.append(("OLLAMA_NUM_PARALLEL", str(s.num_parallel)))
    if s.fit_target_mib is not None:
        env.append(("LLAMA_ARG_FIT_TARGET", str(s.fit_target_mib)))
    if s.cache_ram_mib is not None:
        env.append(("LLAMA_ARG_CACHE_RAM", str(s.cache_ram_mib)))
    if s.ctx_checkpoints is not None:
        env.append(("LLAMA_ARG_CTX_CHECKPOINTS", str(s.ctx_checkpoints)))
    return env


def env_effects(s: OllamaSettings) -> list[str]:
    """One warning per server-wide variable: what it does to the other models of the server."""
    out = []
    for k, v in env_lines(s):
        if k == "OLLAMA_KV_CACHE_TYPE" and v != "f16":
            out.append(f"{k}={v} is server-wide: every model this server runs gets a {v} cache")
        elif k == "OLLAMA_FLASH_ATTENTION" and v == "0":
            out.append(f"{k}={v} is server-wide: it turns flash attention off for every model")
        elif k == "LLAMA_ARG_CACHE_RAM":
            # llama.cpp's default is 8192 MiB per runner (common.h cache_ram_mib)
            kept = f"≤ {int(v):,} MiB of prompt cache" if int(v) else "no prompt cache in RAM"
            out.append(f"{k}={v} is server-wide: each runner keeps {kept}")
        elif k == "LLAMA_ARG_CTX_CHECKPOINTS":
            out.append(f"{k}={v} is server-wide: every runner keeps at most {v} context checkpoints per slot")
        elif k == "OLLAMA_CONTEXT_LENGTH":
            out.append(f"{k}={v} is server-wide: every model without its own num_ctx loads at {int(v):,} tokens")
        elif k == "OLLAMA_NUM_PARALLEL":
            out.append(f"{k}={v} is server-wide: every model gets {v} slot(s), each with its own num_ctx of cache")
    return out


_HEAD = (
    "# Ollama server settings written by kvadvise. They apply to every model this server runs.\n"
    "# The cache type and flash attention are stated even where they are Ollama's defaults: the plan was\n"
    "# sized for them, and a value set earlier would otherwise win.\n"
)


def env_text(s: OllamaSettings) -> str:
    """``KEY=VALUE`` lines for the server's environment: ``set -a; . ./file`` in a POSIX shell, systemd's
    EnvironmentFile=, ``docker run --env-file``."""
    return _HEAD + "".join(f"{k}={v}\n" for k, v in env_lines(s))


def systemd_text(s: OllamaSettings) -> str:
    """A drop-in for /etc/systemd/system/ollama.service.d/: ``[Service]`` with ``Environment="K=V"`` lines."""
    return _HEAD + "[Service]\n" + "".join(f'Environment="{k}={v}"\n' for k, v in env_lines(s))


def modelfile_header(s: OllamaSettings, planned_for: str) -> str:
    """The Modelfile's first comment lines: the server settings it needs and what it was planned for."""
    env = env_lines(s)
    needs = " and ".join(f"{k}={v}" for k, v in env) if env else "no server settings (Ollama's defaults)"
    return f"# needs {needs} on the server; planned by kvadvise for {planned_for}\n"


MODEL_PART_MAX_BYTES = 80  # types/model/name.go isValidLen (a model part; a host may be 350)


def created_name(model: OllamaModel, num_ctx: int, *, namespaced: bool = False) -> str:
    """The name for ``ollama create``: the model part, its tag unless latest, the context (``qwen3-coder-30b-32k``);
    ``namespaced``: the whole name, its slashes and dots as dashes (``alice-helper-4k``, ``hf-co-u-r-8k``), for
    models whose model parts are alike."""
    base = re.sub(r"[/.]", "-", model.name) if namespaced else model.name.rsplit("/", 1)[-1]
    if model.tag.lower() != "latest":
        base = f"{base}-{model.tag}"
    ctx = f"{num_ctx // 1024}k" if num_ctx % 1024 == 0 else str(num_ctx)
    # types/model/name.go isValidLen: a model part is 1 to 80 bytes; the context stays, the name is cut before it
    room = MODEL_PART_MAX_BYTES - len(ctx) - 1
    return f"{base.encode()[:room].decode(errors='ignore').rstrip('-._')}-{ctx}"


def apply_hint_modelfile(model: OllamaModel, s: OllamaSettings, path: str | Path) -> str:
    """``ollama create NAME-<ctx> -f PATH``."""
    return f"ollama create {created_name(model, s.num_ctx)} -f {shlex.quote(os.path.expanduser(path))}"


def call_hints(name: str, s: OllamaSettings) -> tuple[str, ...]:
    """How to call the model ``ollama create`` made, and what overrides its num_ctx: a request's own
    ``options.num_ctx`` wins over the Modelfile's PARAMETER (server/routes.go usesAutomaticNumCtx: the
    request's options first, then the model's)."""
    return (f"ollama run {name}  # a request's own options.num_ctx overrides the Modelfile's {s.num_ctx:,}",)


def _dot_path(path: str | Path) -> str:
    """``. ./file``: a bare ``. file`` searches PATH in dash, zsh and ``bash --posix``."""
    p = os.path.expanduser(path)  # the file written: a quoted "~/..." is not expanded by the shell
    if "/" not in p:
        p = "./" + p
    return shlex.quote(p)


def desktop_env_steps(env: list[tuple[str, str]], platform: str) -> tuple[str, ...] | None:
    """The settings as the Ollama app takes them on macOS and Windows (Ollama's FAQ: launchctl setenv, or the
    user's environment variables, then restart the app); None elsewhere (a service or a shell)."""
    if platform == "macos":
        return (*(f"launchctl setenv {k} {shlex.quote(v)}" for k, v in env), "then quit and reopen the Ollama app")
    if platform == "windows":
        return (*(f"setx {k} {v}" for k, v in env), "then quit Ollama (taskbar icon) and start it again")
    return None


def apply_hint_env(path: str | Path) -> tuple[str, ...]:
    """How to start a server with an env file."""
    return (
        f"set -a && . {_dot_path(path)} && set +a && ollama serve",
        # systemd.unit(5): specifiers are expanded in EnvironmentFile=, so a '%' of the path is written '%%'
        f"(systemd: add EnvironmentFile={str(Path(path).expanduser().absolute()).replace('%', '%%')} to the "
        "[Service] of ollama.service)",
    )


def dropin_name(path: str | Path) -> str:
    """The name the drop-in gets in ollama.service.d/: systemd reads drop-ins in lexical order and the
    last value wins, so it must sort after ``override.conf`` (what ``systemctl edit`` writes)."""
    name = Path(path).name
    if not name.endswith(".conf"):
        name = "kvadvise.conf"  # systemd reads only *.conf drop-ins
    return name if name > "override.conf" else f"zz-{name}"


def docker_gpu(plan: Plan) -> str:
    """The plan's GPUs as Docker passes them to Ollama's container (_DOCKER_GPUS)."""
    gpus = plan.hardware.gpus if plan.hardware is not None else ()
    backend = gpus[0].backend if gpus else "cpu"
    return backend if backend in _DOCKER_GPUS else "cpu"


def apply_hint_systemd(path: str | Path) -> tuple[str, ...]:
    """Install the drop-in (unless it was written in place, then under a name systemd reads) and restart Ollama."""
    p = Path(path).expanduser().absolute()
    if p.parent == SYSTEMD_DROPIN_DIR:
        if not p.name.endswith(".conf"):  # systemd.unit(5): only *.conf drop-ins are read
            return (
                f"sudo mv {shlex.quote(str(p))} {shlex.quote(str(SYSTEMD_DROPIN_DIR / dropin_name(p)))}",
                SYSTEMD_RELOAD,
            )
        return (SYSTEMD_RELOAD,)
    return (
        # every path quoted: a name with a space, ; or $(...) is a name, never code in the user's shell
        f"sudo mkdir -p {SYSTEMD_DROPIN_DIR}",
        f"sudo cp {shlex.quote(str(p))} {shlex.quote(str(SYSTEMD_DROPIN_DIR / dropin_name(p)))}",
        SYSTEMD_RELOAD,
    )


def override_conflicts(s: OllamaSettings, installed_name: str, dropin_dir: Path = SYSTEMD_DROPIN_DIR) -> list[str]:
    """Variables this plan sets that a drop-in read after ours (``override.conf`` when ours sorts first) also
    sets: systemd keeps the last value, so theirs would win."""
    mine = [k for k, _ in env_lines(s)]
    out = []
    try:
        later = sorted(f for f in dropin_dir.glob("*.conf") if f.name > installed_name)
    except OSError:
        return []
    for f in later:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out += [
            f"{f} also sets {k} and is read after {installed_name}: its value wins" for k in mine if f"{k}=" in text
        ]
    return out


PLATFORMS = ("linux", "macos", "windows", "docker")


def current_platform() -> str:
    import sys

    return {"darwin": "macos", "win32": "windows", "cygwin": "windows"}.get(sys.platform, "linux")


# docs/docker.mdx (ollama fb30760): the container's GPUs by kind, and the image that runs on them
_DOCKER_GPUS = {
    "cuda": ("--gpus=all ", "ollama/ollama"),
    "rocm": ("--device /dev/kfd --device /dev/dri ", "ollama/ollama:rocm"),
    "vulkan": ("--device /dev/kfd --device /dev/dri ", "ollama/ollama"),
    "cpu": ("", "ollama/ollama"),  # an Apple GPU too: Docker on macOS runs no Metal
}


def apply_hints_server(
    s: OllamaSettings,
    platform: str,
    *,
    env_path: str | Path | None = None,
    dropin_path: str | Path | None = None,
    gpu: str = "cuda",
) -> tuple[str, ...]:
    """How to give the server these settings on ``platform`` (linux|macos|windows|docker), as printed commands;
    ``gpu``: the plan's GPUs as Docker passes them (cuda, rocm, vulkan, cpu)."""
    env = env_lines(s)
    if not env:
        return ()
    desktop = desktop_env_steps(env, platform)
    if desktop is not None:
        return desktop
    if platform == "docker":  # a container's environment is set when it is created: re-create it
        src = f"--env-file {_dot_path(env_path)}" if env_path else " ".join(f"-e {k}={v}" for k, v in env)
        devices, image = _DOCKER_GPUS.get(gpu, _DOCKER_GPUS["cpu"])
        return (
            "docker rm -f ollama  # new -e settings need a new container; the ollama volume keeps the models",
            f"docker run -d {devices}{src} \\",  # one command on two lines: each fits a terminal
            f"  -v ollama:/root/.ollama -p 11434:11434 --name ollama {image}",
        )
    if dropin_path is not None:
        return apply_hint_systemd(dropin_path)
    if env_path is not None:
        return apply_hint_env(env_path)
    return (  # a line per setting: what the editor gets, and short enough to read (and copy) on a terminal
        "sudo systemctl edit ollama.service  # then add under [Service]:",
        *(f'  Environment="{k}={v}"' for k, v in env),
        SYSTEMD_RELOAD,
        _serve_without_systemd(env),
    )


def _serve_without_systemd(env: list[tuple[str, str]]) -> str:
    """The server started by hand with the settings, when it fits a terminal line; else where they are."""
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env) + " ollama serve  # without systemd"
    return line if len(line) <= 96 else "(without systemd: the server settings above, then ollama serve)"


def verify_command(name: str, s: OllamaSettings) -> str:
    """The exact ``kvadvise verify ollama`` to run once the settings are applied."""
    kv = f" --kv-cache-type {s.kv_cache_type}" if s.kv_cache else ""  # no K/V cache: its type changes nothing
    cmd = f"kvadvise verify ollama {shlex.quote(name)} --load{kv} --num-ctx {s.num_ctx}"
    if s.num_parallel > 1:
        cmd += f" --num-parallel {s.num_parallel}"
    return cmd


def _kv_in(text: str) -> str | None:
    """OLLAMA_KV_CACHE_TYPE as an env file (``K=V``) or a drop-in (``Environment="K=V"``) sets it; the last wins."""
    import re

    # a commented-out line (# in an env file or a drop-in) is not a setting; quotes around the value are
    # trimmed as envconfig.Var trims them
    live = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("#", ";")))
    found = re.findall(r"OLLAMA_KV_CACHE_TYPE=[\"']?([A-Za-z0-9_]+)", live)
    return found[-1].lower() if found else None


def server_kv_cache_type(
    flag: str | None, env_file: str | Path | None, dropin_dir: Path = SYSTEMD_DROPIN_DIR
) -> tuple[str, str]:
    """The cache type the server really uses, and where it was read: the flag; the env file kvadvise wrote;
    the ollama.service drop-ins (the last in systemd's order wins); $OLLAMA_KV_CACHE_TYPE; else f16."""

    if flag:
        return flag, "--kv-cache-type"
    if env_file:
        from kvadvise.files import read_regular_bytes  # a regular file: a FIFO, a device, a NUL byte are refused

        v = _kv_in(read_regular_bytes(env_file, max_bytes=1 << 20).decode("utf-8", errors="replace"))
        return (v, f"from {env_file}") if v in SERVER_KV_CACHE_TYPES else ("f16", f"{env_file} sets none: f16")
    try:
        dropins = sorted(dropin_dir.glob("*.conf"))
    except OSError:
        dropins = []
    found = None
    for f in dropins:
        try:
            v = _kv_in(f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if v in SERVER_KV_CACHE_TYPES:
            found = (v, f"from {f}")
    if found:
        return found
    from kvadvise.backends.ollama import envconfig

    v = envconfig.var("OLLAMA_KV_CACHE_TYPE").lower()
    if v in SERVER_KV_CACHE_TYPES:
        return v, "from $OLLAMA_KV_CACHE_TYPE"
    return "f16", "Ollama's default; --kv-cache-type or --env-file if the server sets another"
