"""A remote file as a ByteSource: HTTP range reads, for reading GGUF headers
without downloading the weights.

Requests go through :mod:`kvadvise.backends.remote.transport` (the standard library's client,
the environment's proxies; redirects, credentials and failures as it says). What it does:

- ``Range`` requests for exactly the bytes the header reader asks for and
  does not already hold (the reader's reads overlap and never go back, so
  only the bytes from the last read offset on are kept);
- redirects followed (by the transport), at most ``max_redirects``; the
  ``headers`` given (a Hub token) go only to the first URL's origin; later
  reads go straight to the final URL;
- a server that ignores ``Range`` (answers 200 with the whole file): the body
  is streamed and read only as far as the reader needs, then the connection
  is closed;
- a conditional first request (``If-None-Match``) so a cached header can be
  revalidated with one request and no body;
- errors: a timeout or a refused connection is BackendUnreachable (exit 4),
  404/410 and 401/403 are InputError (exit 2) with a hint.

The name shown to the user (``name``) never holds a query string or user
info: signed URLs and tokens stay out of messages, caches and logs. The
headers given (an ``Authorization: Bearer`` token) are never echoed.
"""

from __future__ import annotations

import http.client
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from kvadvise.backends.remote import transport
from kvadvise.deadline import within
from kvadvise.errors import BackendUnreachable, InputError

DEFAULT_TIMEOUT_S = 30.0  # a total deadline per request, body included (not per read: a drip cannot stretch it)
# What one header read may transfer, in all. The largest real headers are a few MB (Gemma 3's
# 262k-token vocabulary: 6.5 MB; Qwen3's vocabulary and merges: ~8 MB); 64 MiB is ~8x that. A
# header with strings that go on and on is refused past it instead of downloaded without end.
MAX_TRANSFER_BYTES = 64 << 20
MAX_REDIRECTS = transport.MAX_REDIRECTS
# The header reader's first read (kvadvise.model.gguf: 1 MiB) is fetched by the first request; the reader
# sizes the next from the counts read by then (its rest_of_header), so a 262k-token vocabulary (Gemma 3: a
# 6.5 MB header) takes 2 requests: 1 MiB, then 5.8 MiB.
FIRST_READ = 1 << 20
USER_AGENT = "kvadvise (GGUF header reader)"
_CONTENT_RANGE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$", re.IGNORECASE)
_STREAM_CHUNK = 1 << 16


def split_url(url: str, *, what: str = "URL") -> urllib.parse.SplitResult:
    """``urllib.parse.urlsplit`` that checks what it defers: a bracketed host that does not
    close, a port that is not a number in 1-65535. InputError (never ValueError) for those."""
    try:
        return transport.split_url(url)
    except ValueError as e:
        raise InputError(f"not a usable {what}: {e}", hint="check the host and port") from None


def display_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to show and to use as a cache key."""
    split_url(url)
    return transport.display_url(url)


def cache_key(url: str) -> str:
    """A key for what ``url`` names: the shown URL and, when it has one, a digest of its query.

    ``?f=small`` and ``?f=big`` are two files; the query itself (a signed URL's
    signature, a token) is never stored, only its sha256.
    """
    import hashlib

    query = split_url(url).query
    shown = display_url(url)
    return f"{shown}?sha256={hashlib.sha256(query.encode('utf-8', 'surrogateescape')).hexdigest()}" if query else shown


class HTTPSource:
    """A file on an HTTP(S) server as a ByteSource (``name``, ``size()``, ``read(offset, n)``).

    ``headers`` are sent with every request to the first URL's origin (e.g. a
    Hub token). ``denied_hint`` is the hint of the error for 401/403. After
    use, ``requests`` is the number of HTTP requests sent (redirects
    included) and ``bytes_received`` the body bytes read.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_redirects: int = MAX_REDIRECTS,
        first_read: int = FIRST_READ,
        name: str | None = None,
        denied_hint: str | None = None,
    ) -> None:
        parts = split_url(url)
        if parts.scheme.lower() not in ("http", "https"):
            raise InputError(f"{display_url(url)}: only http:// and https:// URLs can be read")
        if not parts.hostname:  # `https://` or `https:///x.gguf`: "cannot connect (str)", exit 4 as if unreachable
            raise InputError(f"{display_url(url)}: the URL names no host", hint="e.g. https://host/path/model.gguf")
        self.name = name or display_url(url)
        self._headers = dict(headers or {})
        url, basic = _without_userinfo(url)
        if basic and "Authorization" not in self._headers:
            self._headers["Authorization"] = basic
        self.url = url
        self._auth_origin = transport.origin(url)
        self._timeout = timeout_s
        self._max_redirects = max_redirects
        self._first_read = max(1, first_read)
        self._denied_hint = denied_hint
        self.requests = 0
        self.bytes_received = 0
        self.max_transfer = MAX_TRANSFER_BYTES
        self.etag: str | None = None
        self.last_modified: str | None = None
        self.ranges = True  # False once the server answered a Range request with the whole body
        self._size: int | None = None
        self._opened = False
        self._buf = bytearray()
        self._buf_start = 0
        self._stream: Any = None  # the open 200 response of a server without range support
        self._stream_pos = 0

    # -- ByteSource ------------------------------------------------------

    def size(self) -> int | None:
        if not self._opened:
            self.open()
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        if not self._opened:
            self.open()
        end = offset + n if self._size is None else min(offset + n, self._size)
        buf_end = self._buf_start + len(self._buf)
        if offset < self._buf_start:  # behind the bytes kept (the header reader never does this)
            if not self.ranges:
                raise InputError(f"{self.name}: the server cannot send byte {offset:,} again (no range support)")
            self._buf, self._buf_start = bytearray(), offset
            buf_end = offset
        if end > buf_end:
            start = max(offset, buf_end)
            data = self._fetch(start, end) if self.ranges else self._stream_to(start, end)
            if start > buf_end:  # a gap: bytes skipped by the reader are never fetched
                self._buf = bytearray()
                self._buf_start = start
            self._buf += data
        # the reader never reads before its last offset again: keep only [offset, ...)
        cut = offset - self._buf_start
        if cut > 0:
            del self._buf[:cut]
            self._buf_start = offset
        return bytes(self._buf[: max(0, end - offset)])

    # -- requests --------------------------------------------------------

    def open(self, if_none_match: str | None = None) -> bool:
        """Send the first request (the first ``first_read`` bytes).

        With ``if_none_match`` (an ETag from a cache), returns True when the
        server answers 304 Not Modified: nothing was read and the cached
        header stands. Otherwise returns False and the bytes are kept.
        """
        self._opened = True
        extra = {"If-None-Match": if_none_match} if if_none_match else {}

        def first() -> bool:
            resp = self._request(0, self._first_read, extra)
            if resp is None:
                return True
            try:
                self._take_first(resp)
            except BaseException:
                resp.close()
                raise
            return False

        return within(self._timeout, first, self._timeout_error)

    def _take_first(self, resp: Any) -> None:
        self.etag = resp.headers.get("ETag")
        self.last_modified = resp.headers.get("Last-Modified")
        status = resp.status
        if status == 206:
            start, _, total = self._content_range(resp)
            if start != 0:
                raise self._protocol(f"asked for bytes from 0, got a range from {start:,}")
            self._size = total
            self._buf = bytearray(self._body(resp, min(self._first_read, total or self._first_read)))
            resp.close()
            return
        if status == 416:  # a Range the file cannot satisfy: an empty file
            resp.close()
            cr = resp.headers.get("Content-Range") or ""
            m = re.match(r"^bytes\s+\*/(\d+)$", cr.strip(), re.IGNORECASE)
            self._size = int(m[1]) if m else 0
            return
        # 200: the server ignores Range. Stream the body, read only as far as needed.
        self.ranges = False
        length = resp.headers.get("Content-Length")
        self._size = int(length) if length and length.isdigit() else None
        self._stream = resp
        self._stream_pos = 0
        self._buf = bytearray(self._stream_read(self._first_read))

    def _fetch(self, start: int, end: int) -> bytes:
        self._check_transfer(end - start)
        return within(self._timeout, lambda: self._fetch_now(start, end), self._timeout_error)

    def _fetch_now(self, start: int, end: int) -> bytes:
        # If-Range: a server whose file changed since the first request sends all of it (200), not the range
        validator = self.etag if self.etag and not self.etag.startswith("W/") else self.last_modified
        resp = self._request(start, end - start, {"If-Range": validator} if validator else {})
        if resp is None:  # 304 without If-None-Match: not HTTP
            raise self._protocol("answered 304 Not Modified to a plain request")
        try:
            if resp.status == 200 and validator:
                raise self._changed("it no longer matches If-Range")
            if resp.status != 206:
                raise self._protocol(f"answered a range request with HTTP {resp.status} after honouring one")
            got_start, _, total = self._content_range(resp)
            if got_start != start:
                raise self._protocol(f"asked for bytes from {start:,}, got a range from {got_start:,}")
            etag, modified = resp.headers.get("ETag"), resp.headers.get("Last-Modified")
            if (self.etag and etag and etag != self.etag) or (
                not self.etag and modified and modified != self.last_modified
            ):
                raise self._changed("its ETag or Last-Modified changed")
            if total is not None and self._size is not None and total != self._size:
                raise self._changed(f"its size changed from {self._size:,} to {total:,} bytes")
            return self._body(resp, end - start)
        finally:
            resp.close()

    def _check_transfer(self, n: int) -> None:
        if self.bytes_received + n > self.max_transfer:
            raise InputError(
                f"{self.name}: the header needs more than {self.max_transfer >> 20} MiB; "
                "no real model's header is this large, so it is not read further",
                hint="a GGUF header with strings or arrays that go on and on: check the file",
            )

    def _changed(self, why: str) -> BackendUnreachable:
        return BackendUnreachable(
            f"{self.name}: the file changed on the server while its header was read ({why})",
            hint="run the command again: it reads the new version from the start",
        )

    def _stream_to(self, start: int, end: int) -> bytes:
        """Read the streamed body up to ``end``; bytes before ``start`` are skipped."""
        self._check_transfer(end - self._stream_pos)

        def read() -> bytes:
            if start > self._stream_pos:
                self._stream_read(start - self._stream_pos, keep=False)
            return self._stream_read(end - start)

        return within(self._timeout, read, self._timeout_error)

    def _stream_read(self, n: int, *, keep: bool = True) -> bytes:
        if self._stream is None:
            return b""
        out = bytearray()
        left = n
        while left > 0:
            try:
                chunk = self._stream.read(min(left, _STREAM_CHUNK) if not keep else left)
            except http.client.IncompleteRead as e:
                chunk = e.partial
                self._close_stream()
            except TimeoutError:
                raise self._timeout_error() from None
            except OSError as e:
                raise BackendUnreachable(f"{self.name}: connection lost while reading ({type(e).__name__})") from None
            if not chunk:
                self._close_stream()
                break
            self.bytes_received += len(chunk)
            self._stream_pos += len(chunk)
            left -= len(chunk)
            if keep:
                out += chunk
            if self._stream is None:
                break
        return bytes(out)

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _body(self, resp: Any, expected: int) -> bytes:
        """The ``expected`` bytes of a 206 body; never more, whatever Content-Length claims."""
        try:
            data: bytes = resp.read(expected)
        except http.client.IncompleteRead as e:
            data = e.partial
        except TimeoutError:
            raise self._timeout_error() from None
        except OSError as e:
            raise BackendUnreachable(f"{self.name}: connection lost while reading ({type(e).__name__})") from None
        self.bytes_received += len(data)
        if len(data) < expected:
            raise BackendUnreachable(
                f"{self.name}: the server sent {len(data):,} of the {expected:,} bytes asked for",
                hint="the connection was cut; try again",
            )
        return data

    def _content_range(self, resp: Any) -> tuple[int, int, int | None]:
        cr = resp.headers.get("Content-Range", "")
        m = _CONTENT_RANGE.match(cr.strip())
        if not m:
            raise self._protocol(f"206 Partial Content without a usable Content-Range ({cr[:60]!r})")
        total = None if m[3] == "*" else int(m[3])
        return int(m[1]), int(m[2]), total

    def _request(self, start: int, n: int, extra: Mapping[str, str]) -> Any:
        """GET bytes [start, start+n), following redirects. None on 304 Not Modified."""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **extra}
        headers["Range"] = f"bytes={start}-{start + n - 1}"
        try:
            answer = transport.send(
                self.url,
                headers=headers,
                # to the first URL's origin only: a Hub token never reaches a CDN, on a redirect or after it
                credentials=self._headers if transport.origin(self.url) == self._auth_origin else None,
                timeout_s=self._timeout,
                max_redirects=self._max_redirects,
            )
        except transport.NoAnswer as e:
            if e.timed_out:
                raise self._timeout_error() from None
            if e.connecting:
                raise BackendUnreachable(
                    f"{self.name}: cannot connect ({e.reason})", hint="check the URL and the network"
                ) from None
            raise BackendUnreachable(f"{self.name}: the connection failed ({e.reason})") from None
        except transport.BadRedirect as e:
            raise InputError(f"{self.name}: {e.message}", hint=e.hint) from None
        self.requests += answer.requests
        resp = answer.response
        if resp.status == 304:
            resp.close()
            return None
        if resp.status not in (200, 206, 416):
            resp.close()
            raise self._http_error(resp.status)
        self.url = answer.url  # later reads go straight to the final URL
        return resp

    # -- errors ----------------------------------------------------------

    def _timeout_error(self) -> BackendUnreachable:
        return BackendUnreachable(
            f"{self.name}: no complete answer within {self._timeout:g} s",
            hint="the server is slow or unreachable; try again later",
        )

    def _protocol(self, what: str) -> BackendUnreachable:
        return BackendUnreachable(f"{self.name}: the server {what}")

    def _http_error(self, code: int) -> InputError | BackendUnreachable:
        if code in (404, 410):
            return InputError(f"{self.name}: not found (HTTP {code})", hint="check the URL (and the file name in it)")
        if code in (401, 403):
            word = "needs credentials" if code == 401 else "refused access"
            return InputError(
                f"{self.name}: the server {word} (HTTP {code})",
                hint=self._denied_hint or "the file is not public; kvadvise reads only files it can reach",
            )
        if code == 429 or code >= 500:
            return BackendUnreachable(f"{self.name}: the server answered HTTP {code}", hint="try again later")
        return InputError(f"{self.name}: the server answered HTTP {code}")

    # -- lifetime --------------------------------------------------------

    def close(self) -> None:
        self._close_stream()
        self._buf = bytearray()

    def __enter__(self) -> HTTPSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _without_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic Authorization header they stood for."""
    p = split_url(url)
    if p.username is None:
        return url, None
    import base64

    user = urllib.parse.unquote(p.username)
    password = urllib.parse.unquote(p.password or "")
    netloc = p.netloc.rsplit("@", 1)[1]
    basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment)), basic
