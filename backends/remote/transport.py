"""The one HTTP transport of kvadvise's backends: the Ollama API (backends/ollama/api.py) and remote
GGUF headers (http_source.py). The Hub goes through huggingface_hub's own calls.

The standard library's client, no session state: ``http.client`` alone for a server on this machine
(the socket connected first, so that no server costs no import: start-up is most of a plan's time),
``urllib.request`` for the rest (the environment's proxies, https).

- every status comes back as an answer (no exception for a 4xx/5xx): the caller words it;
- redirects followed here, at most ``max_redirects``, a loop named as such, only to http(s);
  ``credentials`` (an ``Authorization`` header) go only to the first URL's origin, so a CDN's signed
  URL never receives a token (as httpx and the browsers do); 303, and 301/302 after a POST, continue
  as a GET without a body, 307/308 keep the method and body (RFC 9110 §15.4);
- the environment's proxies (``http_proxy``, ``https_proxy``, ``no_proxy``), except for this machine's
  own addresses: a server on loopback is never reached through a proxy (as kvadvise ran the
  ``ollama`` client: ``trust_env=False`` for loopback);
- failures to get an answer are :class:`NoAnswer`, with a reason short enough for one line.

The caller bounds the whole exchange with :func:`kvadvise.deadline.within` (a socket timeout bounds
one read only: a server dripping a byte at a time never trips it).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import http.client
    import urllib.request

MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)
_READ_CHUNK = 1 << 16


class NoAnswer(Exception):
    """No HTTP answer: ``reason`` says why in a few words ("connection refused", "timed out", ...).
    ``connecting``: it failed before a connection stood (refused, unknown host, connect timeout)."""

    def __init__(self, reason: str, *, refused: bool = False, timed_out: bool = False, connecting: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.refused = refused
        self.timed_out = timed_out
        self.connecting = connecting


class BadRedirect(Exception):
    """A redirect that is not followed: a loop, too many, or to something other than http(s)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class TooLarge(Exception):
    """A body over the cap: ``declared`` when its Content-Length said so before any of it was read."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(f"more than {limit:,} bytes" if declared is None else f"{declared:,} bytes")
        self.declared = declared


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer of the last URL of a request's redirect chain, and how many requests it took."""

    url: str  # the URL that answered (the first one when there was no redirect)
    response: http.client.HTTPResponse  # open: the caller reads and closes it
    requests: int  # requests sent, redirects included


def split_url(url: str) -> urllib.parse.SplitResult:
    """``urllib.parse.urlsplit`` that also checks the port now (urllib checks it only when it is read).
    ValueError for a bracketed host that does not close or a port that is not a number in 1-65535."""
    p = urllib.parse.urlsplit(url)
    p.port  # noqa: B018 - read for its check
    return p


def origin(url: str) -> tuple[str, str, int | None]:
    p = split_url(url)
    return p.scheme.lower(), (p.hostname or "").lower(), p.port


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _opener(proxied: bool) -> urllib.request.OpenerDirector:
    """urllib's opener with the environment's proxies (``proxied``) or none, no redirect handler and no
    HTTPErrorProcessor: every answer comes back as it is (redirects are followed by :func:`send`, errors
    worded by the caller)."""
    import urllib.request

    proxies = urllib.request.ProxyHandler() if proxied else urllib.request.ProxyHandler({})
    opener = urllib.request.OpenerDirector()
    for handler in (proxies, urllib.request.HTTPHandler(), urllib.request.HTTPSHandler()):
        opener.add_handler(handler)
    return opener


def send(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    credentials: Mapping[str, str] | None = None,
    timeout_s: float,
    max_redirects: int = MAX_REDIRECTS,
) -> Answer:
    """One request, redirects followed. ``headers`` go to every URL, ``credentials`` only to ``url``'s origin.

    NoAnswer when no answer came, BadRedirect for a redirect that is not followed.
    """
    first_origin = origin(url)
    visited = [url]
    for sent in range(1, max_redirects + 2):
        hop_headers = dict(headers or {})
        if credentials and origin(url) == first_origin:
            hop_headers.update(credentials)
        p = split_url(url)
        if p.scheme.lower() == "http" and is_loopback(p.hostname or ""):
            resp = _send_here(p, method, body, hop_headers, timeout_s)
        else:
            resp = _send_by_urllib(url, method, body, hop_headers, timeout_s, proxied=not is_loopback(p.hostname or ""))
        location = resp.headers.get("Location")
        if resp.status not in REDIRECTS or not location:
            return Answer(url, resp, sent)
        resp.close()
        url = _redirect_target(url, location, visited)
        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
            method, body = "GET", None
    shown = " -> ".join(display_url(u) for u in visited[:3])
    raise BadRedirect(
        f"more than {max_redirects} redirects ({shown} -> …)",
        hint="the URL does not lead to a file; check it in a browser",
    )


def _send_here(
    p: urllib.parse.SplitResult, method: str, body: bytes | None, headers: dict[str, str], timeout_s: float
) -> http.client.HTTPResponse:
    """A request to a server on this machine: never through a proxy, and http.client is imported only
    once a server accepted the connection."""
    host, port = p.hostname or "127.0.0.1", p.port or 80
    try:
        # an ASCII name goes as bytes: a str makes getaddrinfo import the IDNA codec (1.5 ms of every start)
        sock = socket.create_connection((host.encode("ascii") if host.isascii() else host, port), timeout_s)  # type: ignore[arg-type]
    except TimeoutError:
        raise NoAnswer("timed out", timed_out=True, connecting=True) from None
    except OSError as e:
        refused = isinstance(e, ConnectionRefusedError)
        raise NoAnswer(_reason(e), refused=refused, connecting=True) from None
    import http.client

    class Connected(http.client.HTTPConnection):
        def connect(self) -> None:  # the documented hook: the socket is already connected
            self.sock = sock

    conn = Connected(host, port, timeout=timeout_s)
    target = urllib.parse.urlunsplit(("", "", p.path or "/", p.query, ""))
    try:
        conn.request(method, target, body=body, headers={**headers, "Connection": "close"})
        return conn.getresponse()  # its body keeps the socket open until it is closed
    except TimeoutError:
        raise NoAnswer("timed out", timed_out=True) from None
    except (http.client.HTTPException, OSError) as e:  # reset, cut, not HTTP at all
        sock.close()
        raise NoAnswer(_failure(e)) from None


def _send_by_urllib(
    url: str, method: str, body: bytes | None, headers: dict[str, str], timeout_s: float, *, proxied: bool
) -> http.client.HTTPResponse:
    import http.client
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:  # a new opener each time: ProxyHandler reads the environment when it is made
        resp: http.client.HTTPResponse = _opener(proxied).open(req, timeout=timeout_s)
    except urllib.error.URLError as e:  # raised before an answer: the connection (or the proxy) failed
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise NoAnswer("timed out", timed_out=True, connecting=True) from None
        raise NoAnswer(_reason(reason), refused=isinstance(reason, ConnectionRefusedError), connecting=True) from None
    except TimeoutError:
        raise NoAnswer("timed out", timed_out=True) from None
    except (http.client.HTTPException, OSError, ValueError) as e:  # reset, cut, not HTTP at all
        raise NoAnswer(_failure(e)) from None
    return resp


def read_capped(resp: http.client.HTTPResponse, limit: int) -> bytes:
    """The whole body, refused past ``limit`` bytes (at once when Content-Length says so), never held whole.

    NoAnswer when the connection breaks or the body is shorter than its Content-Length.
    """
    import http.client

    declared = resp.headers.get("Content-Length", "")
    length = int(declared) if declared.isdigit() else None
    if length is not None and length > limit:
        raise TooLarge(limit, length)
    data = bytearray()
    try:
        while chunk := resp.read(_READ_CHUNK):
            data += chunk
            if len(data) > limit:
                raise TooLarge(limit, None)
    except TimeoutError:
        raise NoAnswer("timed out", timed_out=True) from None
    except (http.client.HTTPException, OSError) as e:
        raise NoAnswer(_failure(e)) from None
    if length is not None and len(data) < length:  # http.client's read(n) does not check it
        raise NoAnswer(f"the answer was cut short ({len(data):,} of {length:,} bytes)")
    return bytes(data)


def display_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to show and to use as a cache key."""
    p = split_url(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if p.port is None else f"{host}:{p.port}"
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, "", ""))


def _redirect_target(url: str, location: str, visited: list[str]) -> str:
    target = urllib.parse.urljoin(url, location)
    try:
        scheme = split_url(target).scheme.lower()
    except ValueError:
        raise BadRedirect(f"redirected to a URL that cannot be used ({display_url(url)} -> …)") from None
    if scheme not in ("http", "https"):
        raise BadRedirect(f"redirected to a non-HTTP URL ({display_url(target)})")
    if target in visited:
        loop = [display_url(u) for u in visited[visited.index(target) :]] + [display_url(target)]
        raise BadRedirect(
            f"redirect loop ({' -> '.join(loop)})",
            hint="the server sends the request round in circles; check the URL",
        )
    visited.append(target)
    return target


def _reason(reason: object) -> str:
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return type(reason).__name__


def _failure(e: BaseException) -> str:
    """A broken exchange in a few words: "connection reset", "no HTTP answer (BadStatusLine)"."""
    import http.client

    if isinstance(e, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(e, ConnectionResetError):
        return "connection reset"
    if isinstance(e, http.client.IncompleteRead):
        return "the answer was cut short"
    if isinstance(e, (http.client.BadStatusLine, http.client.LineTooLong)):
        return f"not an HTTP answer ({type(e).__name__})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return type(e).__name__
