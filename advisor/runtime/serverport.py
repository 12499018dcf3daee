"""Where a llama-server listens when no --port is given, and finding a running one there.

llama-server's default port is 8080 through b11312 (common/common.h, ``common_params::port = 8080``); the
server prints "notice: server default port will be changed to :9931 in a future release" since
ggml-org/llama.cpp#26508 (merged 2026-08-03, a notice only; the move is planned in #26116, "llama-server as a
daemon"). A server started without --port is therefore on 8080 or, on a build after the move, on 9931:
kvadvise looks on both, the old one first. What kvadvise writes names --port explicitly.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

LEGACY_PORT = 8080  # common/common.h (b11312)
NEW_PORT = 9931  # ggml-org/llama.cpp#26508 / #26116
DEFAULT_PORTS = (LEGACY_PORT, NEW_PORT)
MAX_PROPS_BYTES = 1 << 20  # /props is a few KiB; a larger answer is not a llama-server's


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A llama-server that answered /props: what it says of its model and context."""

    url: str
    model_path: str
    n_ctx: int | None  # default_generation_settings.n_ctx: the context of one slot
    n_slots: int | None  # total_slots: -np
    is_sleeping: bool | None  # tools/server: unloaded after --sleep-idle-seconds, loads again on a request
    build: str | None


def find_server(host: str = "127.0.0.1", port: int | None = None, *, timeout_s: float = 2.0) -> RunningServer | None:
    """The llama-server on ``host:port``, or, without a port, on the first default port that answers /props."""
    ports = (port,) if port is not None else DEFAULT_PORTS
    where = f"[{host}]" if ":" in host else host  # an IPv6 host in brackets: a URL one can paste
    for p in ports:
        found = _props(f"http://{where}:{p}", timeout_s)
        if found is not None:
            return found
    return None


def _props(url: str, timeout_s: float) -> RunningServer | None:
    """GET /props (tools/server/server-context.cpp: model_path, default_generation_settings.n_ctx, is_sleeping;
    /props does not wake a sleeping server)."""
    try:
        with urllib.request.urlopen(f"{url}/props", timeout=timeout_s) as r:
            raw = r.read(MAX_PROPS_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if len(raw) > MAX_PROPS_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_path"), str):
        return None
    settings = doc.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    sleeping = doc.get("is_sleeping")
    build = doc.get("build_info")
    slots = doc.get("total_slots")
    return RunningServer(
        url=url,
        model_path=doc["model_path"],
        n_ctx=n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and 0 <= n_ctx < 2**31 else None,
        n_slots=slots if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots < 2**31 else None,
        is_sleeping=sleeping if isinstance(sleeping, bool) else None,
        build=build if isinstance(build, str) else None,
    )


def parse_address(text: str) -> tuple[str, int | None]:
    """HOST or HOST:PORT (an IPv6 host in brackets): the host and the port, None when not given."""
    from kvadvise.errors import InputError
    from kvadvise.units import port_number

    text = text.strip().removeprefix("http://").rstrip("/")
    host, port = text, None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):  # "[::1" or "[::1]junk": the rest was dropped
            raise InputError(f"--attach {text!r}: an IPv6 address is [ADDRESS] or [ADDRESS]:PORT, e.g. [::1]:8080")
        port_text = rest.removeprefix(":") if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        port_text = None
    if port_text is not None:
        # leading zeros are decimal, as llama-server reads its own --port (common/arg.cpp std::stoi): 08080 is
        # the server started with --port 08080
        port = port_number(port_text)
        if port is None or not 0 < port < 65536:
            raise InputError(f"--attach {text}: the port must be a number from 1 to 65535")
    # a name or an address: no blank, control character, slash or bracket (urllib refused "a b" with
    # http.client.InvalidURL, an internal error)
    if not host or not all(c.isascii() and (c.isalnum() or c in "-._:%") for c in host) or _not_ipv6(host):
        raise InputError(
            f"--attach {text!r}: give HOST or HOST:PORT, e.g. 127.0.0.1 or 127.0.0.1:8080",
            hint="a host name or an IPv4 address, or an IPv6 one in brackets ([::1]:8080)",
        )
    return host, port


def attach_checks(server: RunningServer, n_ctx_seq: int, n_parallel: int, model_path: str) -> tuple[str, ...]:
    """How the running server differs from the plan (empty: it runs the plan's context and slots)."""
    import os

    out = []
    if os.path.basename(server.model_path) != os.path.basename(model_path):
        out.append(f"it serves {server.model_path}, not {model_path}")
    if server.n_ctx is not None and server.n_ctx != n_ctx_seq:
        out.append(f"its context per slot is {server.n_ctx:,}, the plan's {n_ctx_seq:,}")
    if server.n_slots is not None and server.n_slots != n_parallel:
        out.append(f"it has {server.n_slots} slots, the plan {n_parallel}")
    return tuple(out)


def _not_ipv6(host: str) -> bool:
    """A host with colons that is no IPv6 address ("garbage::::"): a name has none (``%`` a zone, as in fe80::1%eth0)."""
    import ipaddress

    if ":" not in host:
        return False
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return True
    return False
