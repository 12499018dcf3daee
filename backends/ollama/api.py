"""A running Ollama server, through its HTTP API (kvadvise's one HTTP transport, the standard library's).

- ``POST /api/show`` with ``verbose`` (so arrays are not cut to ``[]``): the
  GGUF key/values (``model_info``), the tensor list and the default
  parameters; turned into a :class:`kvadvise.model.gguf.GGUFHeader` so that
  :func:`kvadvise.model.architecture.from_gguf` applies the same rules as to a file.
- ``GET /api/ps``: the loaded models, their ``size`` / ``size_vram`` /
  ``context_length``; :func:`processor` prints them as ``ollama ps`` does.
- ``GET /api/version``.

Payload shapes: Ollama ``api/types.go`` (memory-spec.md §6.d). Every failure
to talk to the server (refused, timed out, 5xx, an answer that is not JSON)
is a :class:`BackendUnreachable` naming the host, in one line.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kvadvise.deadline import within
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.files import load_json
from kvadvise.model.ggml import BLOCK, GGMLType
from kvadvise.model.gguf import (
    DECODE_NUMERIC_MAX,
    DECODE_STRING_MAX,
    DEFAULT_ALIGNMENT,
    T_ARRAY,
    T_BOOL,
    T_FLOAT32,
    T_INT32,
    T_INT64,
    T_STRING,
    GGUFArray,
    GGUFHeader,
    TensorInfo,
    Value,
)
from kvadvise.model.keys import General
from kvadvise.units import port_number

DEFAULT_HOST = "http://127.0.0.1:11434"
DEFAULT_PORT = 11434
DEFAULT_TIMEOUT = 10.0

# Ollama < 0.30 (before 2026-05-29, commit 9db4bdbad "runner: Remove CGO engines, use
# llama-server exclusively for GGML models", ollama#16031) ran its own engines, which
# silently dropped a quantized OLLAMA_KV_CACHE_TYPE to f16 unless OLLAMA_FLASH_ATTENTION
# was explicitly on (memory-spec.md §6.0 and §6.c OLLAMA_KV_CACHE_TYPE; peers.md §3).
# From 0.30 the type is passed verbatim to llama-server, with no fallback.
KV_FALLBACK_FIXED_IN = (0, 30, 0)


# --- the host -----------------------------------------------------------------


def normalize_host(raw: str | None = None, *, what: str = "OLLAMA_HOST") -> str:
    """``OLLAMA_HOST`` as a URL, the way Ollama's envconfig.Host() reads it.

    ``None``/empty: ``http://127.0.0.1:11434``; ``host``, ``host:port``,
    ``:port``, ``http(s)://host[:port][/path]`` are accepted (no scheme: http,
    port 11434; http: 80; https: 443). ``0.0.0.0`` / ``::`` (what a server
    *binds*) mean this machine: 127.0.0.1 / ::1. As envconfig.Host keeps only
    scheme, host, port and path, credentials (``user:pass@``), a query
    (``?token=``) and a fragment are dropped, and never printed: an error
    names the value as :func:`redact_host` shows it, and ``what`` gave it (``--host`` or the variable).
    """
    s = (raw or "").strip()
    if not s:
        return DEFAULT_HOST
    shown = redact_host(s)
    scheme, sep, hostport = s.partition("://")
    default_port = DEFAULT_PORT
    if not sep:
        scheme, hostport = "http", s
    elif scheme.lower() == "http":
        scheme, default_port = "http", 80
    elif scheme.lower() == "https":
        scheme, default_port = "https", 443
    else:
        raise InputError(f"{what} {shown!r}: unknown scheme (http or https)")
    hostport = hostport.split("#", 1)[0].split("?", 1)[0]
    hostport, _, path = hostport.partition("/")
    hostport = hostport.rpartition("@")[2]  # user:pass@ is dropped
    host, port_s = _split_host_port(hostport, shown, what)
    if port_s:
        # envconfig.Host: strconv.ParseInt(port, 10, 32), so 011434 is port 11434 (Go's dialer reads it so too);
        # a port it cannot use makes Ollama warn and fall back to the default, which kvadvise refuses instead: a
        # port given is the one meant
        number = port_number(port_s)
        if number is None or not 0 < number <= 65535:
            raise InputError(f"{what} {shown!r}: invalid port")
        port = number
    else:
        port = default_port
    host = host or "127.0.0.1"
    if any(c.isspace() or c in '\\<>"{}|^`' or ord(c) < 32 for c in host + path):
        raise InputError(f"{what} {shown!r}: not a host name")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is None and ":" in host:  # colons only in an IPv6 address (Go's net.SplitHostPort refuses the rest)
        raise InputError(f"{what} {shown!r}: not a host name", hint="HOST[:PORT]; an IPv6 address is [::1]:11434")
    try:  # what the HTTP client does with them: a label over 63 characters, a lone surrogate
        (host if ip is not None else host.encode("idna").decode("ascii")).encode("ascii")
        path.encode("utf-8")
    except UnicodeError:
        raise InputError(f"{what} {shown!r}: not a host name") from None
    if ip is not None and ip.is_unspecified:
        host = "::1" if ip.version == 6 else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    url = f"{scheme}://{host}:{port}"
    return f"{url}/{path.strip('/')}" if path.strip("/") else url


def redact_host(raw: str) -> str:
    """``raw`` without what must never be printed: credentials, query string and fragment."""
    s = raw.strip().split("#", 1)[0].split("?", 1)[0]
    scheme, sep, rest = s.partition("://")
    if not sep:
        scheme, rest = "", s
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def server_url(host: str | None = None) -> str:
    """The server to talk to: ``host`` when given, else ``$OLLAMA_HOST``, normalized."""

    from kvadvise.backends.ollama import envconfig

    if host is None:
        return normalize_host(envconfig.var("OLLAMA_HOST") or None)
    return normalize_host(host, what="--host")


def _split_host_port(hostport: str, shown: str, what: str = "OLLAMA_HOST") -> tuple[str, str]:
    if hostport.startswith("["):  # [v6]:port
        end = hostport.find("]")
        if end < 0:
            raise InputError(f"{what} {shown!r}: unbalanced brackets")
        host, rest = hostport[1:end], hostport[end + 1 :]
        return host, rest[1:] if rest.startswith(":") else ""
    if hostport.count(":") > 1:  # a bare IPv6 address
        return hostport, ""
    host, _, port = hostport.partition(":")
    return host, port


# --- talking to the server ----------------------------------------------------


class ClientError(Exception):
    """A 4xx answer: its ``error`` (the ``{"error": ...}`` of the body, else the body) and ``status_code``,
    as the official client's ``ollama.ResponseError`` reports them."""

    def __init__(self, error: str, status_code: int) -> None:
        super().__init__(error)
        self.error = error
        self.status_code = status_code


class ServerError(BackendUnreachable):
    """The server answered with a 5xx: it is there, but failed (e.g. a model that could not load)."""

    def __init__(self, message: str, *, status: int, error: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.error = error


MAX_ANSWER_BYTES = 64 << 20  # a verbose /api/show of a 262k-token model (vocabulary, merges) is ~20 MB


_DOWN: ContextVar[dict[str, BackendUnreachable] | None] = ContextVar("kvadvise_ollama_down", default=None)


@contextmanager
def session() -> Iterator[None]:
    """One command's dealings with Ollama servers: a server that did not answer once is
    not asked again (a hung server costs one timeout per command, not one per request)."""
    if _DOWN.get() is not None:  # inside a command's session already: one session, one memory
        yield
        return
    token = _DOWN.set({})
    try:
        yield
    finally:
        _DOWN.reset(token)


def _remember_down(url: str, e: BackendUnreachable) -> BackendUnreachable:
    down = _DOWN.get()
    if down is not None:
        down[url] = e
    return e


def call(
    host: str, method: str, path: str, *, body: Mapping[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT
) -> Any:
    """One request to the Ollama API; the decoded JSON answer. ClientError for 4xx.

    The answer is read in chunks and refused past MAX_ANSWER_BYTES (a server that
    sends 100 MB is not held in memory whole). Inside a :func:`session`, a server
    that failed to answer is not asked again.
    """
    url = normalize_host(host)
    down = _DOWN.get()
    if down is not None and url in down:
        raise down[url]
    try:
        return _call(url, method, path, body=body, timeout=timeout)
    except ServerError:
        raise
    except BackendUnreachable as e:
        raise _remember_down(url, e) from None


def _headers(body: Mapping[str, Any] | None) -> tuple[dict[str, str], dict[str, str]]:
    """The headers of a request, and its credentials: ``OLLAMA_API_KEY`` as a bearer token, as the
    official client sends it (ollama-python ``_client.py`` BaseClient); never shown anywhere."""
    import os

    headers = {"Accept": "application/json", "User-Agent": "kvadvise"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    key = os.environ.get("OLLAMA_API_KEY")
    return headers, ({"Authorization": f"Bearer {key}"} if key else {})


def _call(url: str, method: str, path: str, *, body: Mapping[str, Any] | None, timeout: float) -> Any:
    import json

    from kvadvise.backends.remote import transport

    headers, credentials = _headers(body)
    data = json.dumps(body).encode() if body is not None else None

    def exchange() -> tuple[int, bytes]:
        answer = transport.send(
            url + path, method=method, body=data, headers=headers, credentials=credentials, timeout_s=timeout
        )
        with answer.response as r:
            return r.status, transport.read_capped(r, MAX_ANSWER_BYTES)

    def too_slow() -> BackendUnreachable:
        return BackendUnreachable(f"Ollama at {url} did not answer {path} within {timeout:g} s (in all)")

    try:
        # the timeout is a total deadline: a server that drips a byte per second never trips a per-read one
        status, content = within(timeout, exchange, too_slow)
    except transport.NoAnswer as e:
        if e.refused:
            raise _refused(url) from None
        if e.timed_out and e.connecting:
            raise BackendUnreachable(f"Ollama at {url} did not accept a connection within {timeout:g} s") from None
        if e.timed_out:
            raise BackendUnreachable(f"Ollama at {url} did not answer {path} within {timeout:g} s") from None
        if e.connecting:
            raise BackendUnreachable(f"Ollama at {url}: cannot connect ({e.reason})") from None
        raise BackendUnreachable(f"Ollama at {url}: {e.reason} on {path}") from None
    except transport.TooLarge as e:
        raise _too_big(url, path, str(e)) from None
    except transport.BadRedirect as e:
        raise BackendUnreachable(f"Ollama at {url}: {e.message} on {path}", hint="check OLLAMA_HOST") from None
    if status >= 400:
        error = _error_text(content)
        if status >= 500:
            raise ServerError(
                f"Ollama at {url} failed: HTTP {status} on {path}: {one_line(error)}",
                status=status,
                error=error,
                hint="look at the server's log (journalctl -u ollama)",
            )
        raise ClientError(error, status)
    try:
        return load_json(content)
    except ValueError:
        raise BackendUnreachable(
            f"{url} answered {path} with something that is not JSON: is it an Ollama server?",
            hint="check OLLAMA_HOST",
        ) from None


def _error_text(content: bytes) -> str:
    """What a failed answer says: its ``{"error": "..."}``, else its text (as ollama.ResponseError reads it)."""
    text = content.decode("utf-8", errors="replace")
    try:
        doc = load_json(content)
    except ValueError:
        return text
    error = doc.get("error") if isinstance(doc, dict) else None
    return error if isinstance(error, str) else text


def _too_big(url: str, path: str, size: str) -> BackendUnreachable:
    return BackendUnreachable(
        f"Ollama at {url} answered {path} with {size}; kvadvise reads at most {MAX_ANSWER_BYTES >> 20} MiB: "
        "is it an Ollama server?",
        hint="check OLLAMA_HOST",
    )


def _refused(url: str) -> BackendUnreachable:
    return BackendUnreachable(
        f"no Ollama server at {url} (connection refused)",
        hint="start it with `ollama serve` (or `systemctl start ollama`), or set OLLAMA_HOST",
    )


def one_line(s: object) -> str:
    text = " ".join(str(s).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _unexpected(url: str, path: str, what: str) -> BackendUnreachable:
    return BackendUnreachable(f"{normalize_host(url)} answered {path} with an unexpected payload: {what}")


def _int(v: object) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    if isinstance(v, float) and not v.is_integer():
        return None
    return int(v)


# --- /api/show ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShownModel:
    """What ``/api/show`` says about a model, in kvadvise's terms."""

    header: GGUFHeader  # model_info + tensors, as a GGUF header
    params: dict[str, Any]  # the default parameters
    projector: bool  # projector_info is not empty (a vision model)
    details: dict[str, Any]
    capabilities: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def show_model(host: str | None, name: str, *, timeout: float = DEFAULT_TIMEOUT) -> ShownModel | None:
    """``POST /api/show`` (verbose). None when the server does not have the model (404)."""
    url = server_url(host)
    try:
        doc = call(url, "POST", "/api/show", body={"model": name, "verbose": True}, timeout=timeout)
    except ClientError as e:
        if e.status_code == 404:
            return None
        raise InputError(f"Ollama at {url} refused to show {name}: {one_line(e.error)}") from None
    if not isinstance(doc, dict):
        raise _unexpected(url, "/api/show", "not a JSON object")
    info = doc.get("model_info")
    if not isinstance(info, dict) or not info:
        raise InputError(
            f"Ollama at {url} has no GGUF metadata for {name}: a cloud/remote or safetensors model?",
            hint="kvadvise plans GGUF models that run on this machine",
        )
    notes: list[str] = []
    source = f"ollama:{url}/{name}"
    header = header_from_show(info, doc.get("tensors"), source=source, name=name, notes=notes)
    projector = isinstance(doc.get("projector_info"), dict) and bool(doc.get("projector_info"))
    if projector:
        notes.append("has a vision projector; the API does not report its size, so it is not counted")
    details = doc.get("details") if isinstance(doc.get("details"), dict) else {}
    caps = doc.get("capabilities")
    return ShownModel(
        header=header,
        params=parse_parameters(doc.get("parameters")),
        projector=projector,
        details=dict(details or {}),
        capabilities=tuple(c for c in caps if isinstance(c, str)) if isinstance(caps, list) else (),
        notes=tuple(notes),
    )


def _array(values: Sequence[Any]) -> GGUFArray | None:
    """A JSON list from model_info as a GGUF array (element type inferred); None for an empty one."""
    if not values:
        return None  # a non-verbose /api/show cuts long arrays to []: treat as absent
    if all(isinstance(v, bool) for v in values):
        it = T_BOOL
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        it = T_INT64 if any(abs(v) >= 1 << 31 for v in values) else T_INT32
    elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        it = T_FLOAT32
    elif all(isinstance(v, str) for v in values):
        it = T_STRING
    else:
        return GGUFArray(T_ARRAY, len(values))
    limit = DECODE_STRING_MAX if it == T_STRING else DECODE_NUMERIC_MAX
    if len(values) > limit:
        return GGUFArray(it, len(values))  # as the file reader keeps it: length only
    return GGUFArray(it, len(values), tuple(values))


def header_from_show(
    info: Mapping[str, Any], tensors: object, *, source: str, name: str, notes: list[str]
) -> GGUFHeader:
    """``model_info`` and ``tensors`` of /api/show as a GGUF header (weights from the tensor list)."""
    metadata: dict[str, Value] = {}
    for k, v in info.items():
        if not isinstance(k, str):
            continue
        if isinstance(v, (bool, int, float, str)):
            metadata[k] = v
        elif isinstance(v, list):
            arr = _array(v)
            if arr is not None:
                metadata[k] = arr
    metadata.setdefault(General.NAME, name)  # /api/show leaves general.name out
    align = metadata.get(General.ALIGNMENT, DEFAULT_ALIGNMENT)
    alignment = align if isinstance(align, int) and not isinstance(align, bool) and align > 0 else DEFAULT_ALIGNMENT
    infos: list[TensorInfo] = []
    offset = 0
    skipped: list[str] = []
    for t in tensors if isinstance(tensors, list) else ():
        ti = _tensor(t, offset)
        if ti is None:
            skipped.append(str(t.get("name", "?")) if isinstance(t, dict) else "?")
            continue
        infos.append(ti)
        offset += -(-ti.n_bytes // alignment) * alignment
    if not infos:
        notes.append("the server listed no tensors: weights unknown (counted as 0)")
    elif skipped:
        notes.append(f"{len(skipped)} tensors of an unknown type were left out of the weights (e.g. {skipped[0]})")
    return GGUFHeader(
        source=source,
        version=3,
        byte_order="<",
        metadata=metadata,
        tensors=tuple(infos),
        alignment=alignment,
        header_bytes=0,
        data_offset=0,
        data_bytes=offset,
        file_bytes=None,
    )


def _tensor(t: object, offset: int) -> TensorInfo | None:
    """One ``{name, type, shape}``: type as Ollama prints it ("Q4_K", "F32", "MXFP4"), shape ne0 first."""
    if not isinstance(t, dict):
        return None
    name, type_name, shape = t.get("name"), t.get("type"), t.get("shape")
    if not isinstance(name, str) or not isinstance(type_name, str) or not isinstance(shape, list) or not shape:
        return None
    dims = [_int(d) for d in shape]
    if any(d is None or d <= 0 for d in dims):
        return None
    if math.prod(d for d in dims if d is not None) >= 1 << 63:  # gguf.cpp: the element count fits an int64
        raise InputError(f"/api/show lists tensor {name!r} of shape {shape}: more elements than a GGUF tensor holds")
    try:
        gt = GGMLType[type_name.upper()]
    except KeyError:
        return None
    blck, tsize = BLOCK[gt]
    ne = tuple(d for d in dims if d is not None)
    if ne[0] % blck:
        return None
    return TensorInfo(name, ne, gt, offset, math.prod(ne) // blck * tsize)


_PARAM_LINE = re.compile(r"^(\S+)\s+(.*)$")


def parse_parameters(text: object) -> dict[str, Any]:
    """The ``parameters`` of /api/show: lines of ``fmt.Sprintf("%-30s %#v", key, value)``.

    Go's %#v quotes strings; numbers and booleans are bare. ``stop`` (and any
    key that repeats) becomes a list.
    """
    out: dict[str, Any] = {}
    if not isinstance(text, str):
        return out
    for line in text.splitlines():
        m = _PARAM_LINE.match(line.strip())
        if not m:
            continue
        key, raw = m[1], m[2].strip()
        value: Any
        if raw.startswith('"'):
            try:
                value = load_json(raw)
            except ValueError:
                value = raw.strip('"')
        elif raw in ("true", "false"):
            value = raw == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        if key == "stop" or key in out:
            prev = out.get(key)
            out[key] = [*(prev if isinstance(prev, list) else [] if prev is None else [prev]), value]
        else:
            out[key] = value
    return out


# --- /api/ps ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningModel:
    """One entry of ``/api/ps`` (ProcessModelResponse)."""

    name: str
    model: str
    size: int  # bytes: MemorySize().total
    size_vram: int  # bytes on GPUs
    context_length: int | None  # num_ctx per slot, after the clamp to n_ctx_train
    digest: str
    expires_at: str
    details: dict[str, Any]

    @property
    def processor(self) -> str:
        return processor(self.size, self.size_vram)

    @property
    def size_cpu(self) -> int:
        return max(self.size - self.size_vram, 0)


def running_models(host: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> tuple[RunningModel, ...]:
    """``GET /api/ps``: the models the server holds in memory now."""
    url = server_url(host)
    try:
        doc = call(url, "GET", "/api/ps", timeout=timeout)
    except ClientError as e:
        raise BackendUnreachable(f"Ollama at {url} refused /api/ps: HTTP {e.status_code} {one_line(e.error)}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if models is None and isinstance(doc, dict):
        models = []  # Go marshals an empty slice as [] but a nil one as null
    if not isinstance(models, list):
        raise _unexpected(url, "/api/ps", "no list of models")
    out = []
    for m in models:
        if not isinstance(m, dict):
            raise _unexpected(url, "/api/ps", "a model entry is not an object")
        size, vram = _int(m.get("size")), _int(m.get("size_vram"))
        name = m.get("name") if isinstance(m.get("name"), str) else m.get("model")
        if not isinstance(name, str) or size is None or vram is None:
            raise _unexpected(url, "/api/ps", "a model entry without name, size or size_vram")
        for what, n in (("size", size), ("size_vram", vram)):  # api.ProcessModelResponse: int64 byte counts
            if not 0 <= n < 1 << 63:
                raise _unexpected(url, "/api/ps", f"a {what} of {n:.3g} bytes")
        details = m.get("details")
        context_length = _int(m.get("context_length"))
        if context_length is not None and not 0 <= context_length <= 2**31 - 1:  # num_ctx is a Go int a runner's
            raise _unexpected(url, "/api/ps", f"a context_length of {context_length:.3g}")  # int32 n_ctx holds
        out.append(
            RunningModel(
                name=name,
                model=m["model"] if isinstance(m.get("model"), str) else name,
                size=size,
                size_vram=vram,
                context_length=context_length,
                digest=m["digest"] if isinstance(m.get("digest"), str) else "",
                expires_at=m["expires_at"] if isinstance(m.get("expires_at"), str) else "",
                details=dict(details) if isinstance(details, dict) else {},
            )
        )
    return tuple(out)


def _go_round(x: float) -> int:
    """Go's math.Round: half away from zero (Python's round() is half to even)."""
    t = math.trunc(x)
    if abs(x - t) >= 0.5:
        t += 1 if x > 0 else -1
    return int(t)


def processor(size: int, size_vram: int) -> str:
    """The PROCESSOR column of ``ollama ps`` (cmd/cmd.go ListRunningHandler), exactly."""
    if size_vram == 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = _go_round((size - size_vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


# --- /api/version ---------------------------------------------------------------


def server_version(host: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """``GET /api/version``; None when the server answers without a version. BackendUnreachable if none answers."""
    try:
        doc = call(server_url(host), "GET", "/api/version", timeout=timeout)
    except ClientError:
        return None
    v = doc.get("version") if isinstance(doc, dict) else None
    return v.strip() if isinstance(v, str) and v.strip() else None


# ASCII, bounded (never a 5,000-digit int()), whole: a release (0.20.2, v0.20.2), a candidate (0.30.0-rc1) or a
# source build's describe (0.12.3-4-gabc1234, +dirty); an rc or a build counts as its release for its rules, but a pre-release's llama.cpp pin is not claimed (versions.release)
_VERSION = re.compile(r"v?([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(?:[-+][0-9A-Za-z.+-]{1,64})?")


def parse_version(version: str) -> tuple[int, int, int] | None:
    """An Ollama version as --ollama-version or /api/version gives it, the one grammar every caller reads."""
    m = _VERSION.fullmatch(version.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def version_warning(version: str | None) -> str | None:
    """A warning for Ollama versions that silently use an f16 KV cache unless flash attention is explicitly on.

    Ollama < 0.30 (its own engines, before llama-server; see KV_FALLBACK_FIXED_IN)
    dropped a quantized OLLAMA_KV_CACHE_TYPE to f16, with only a log line,
    unless OLLAMA_FLASH_ATTENTION=1 was set. Development builds report 0.0.0
    and unparseable versions are not judged.
    """
    if not version:
        return None
    v = parse_version(version)
    if v is None or v == (0, 0, 0) or v >= KV_FALLBACK_FIXED_IN:
        return None
    fixed = ".".join(map(str, KV_FALLBACK_FIXED_IN[:2]))
    return (
        f"Ollama {version} is older than {fixed}: it silently keeps an f16 KV cache unless "
        "OLLAMA_FLASH_ATTENTION=1 is set explicitly, so a quantized OLLAMA_KV_CACHE_TYPE alone does nothing "
        f"(set both, or upgrade to Ollama >= {fixed})"
    )
