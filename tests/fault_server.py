"""A loopback HTTP server that fails on purpose, for tests/test_faults.py.

Each request is answered by ``route(method, path) -> Answer``: a status and a
body, or a fault: the connection reset (RST, nothing sent), a body shorter
than its Content-Length, an answer after a delay, a body sent many times over
(100 MB without holding it), chunked transfer without a length. Every request
is recorded with its headers, so a test can check what a client sent (an
Authorization header) without the server ever printing it. It listens on
127.0.0.1, port 0 (the system picks a free one).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    fault: str = ""  # "" | "reset" | "chunked"
    delay_s: float = 0.0  # before the status line
    declared: int | None = None  # a Content-Length that lies (a truncated body)
    repeat: int = 1  # the body is sent this many times
    tail: bytes = b""  # sent once after the repeats

    @property
    def length(self) -> int:
        return len(self.body) * self.repeat + len(self.tail)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]


Route = Callable[[str, str], Answer]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a slow answer must not hold the test up at shutdown

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (the point of most tests here)


class FaultServer:
    def __init__(self, route: Route) -> None:
        self.route = route
        self.requests: list[Request] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner._serve(self, "GET")

            def do_HEAD(self) -> None:
                owner._serve(self, "HEAD")

            def do_POST(self) -> None:
                owner._serve(self, "POST")

        self._httpd = _Server(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        if n:
            h.rfile.read(n)
        self.requests.append(Request(method, h.path, {k.lower(): v for k, v in h.headers.items()}))
        a = self.route(method, h.path)
        h.close_connection = True
        try:
            if a.delay_s:
                time.sleep(a.delay_s)
            if a.fault == "reset":  # RST: close with SO_LINGER 0, every reference to the socket
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                h.rfile.close()
                h.wfile.close()
                h.connection.close()
                return
            h.send_response(a.status)
            for k, v in a.headers.items():
                h.send_header(k, v)
            if a.fault == "chunked":
                h.send_header("Transfer-Encoding", "chunked")
            else:
                h.send_header("Content-Length", str(a.declared if a.declared is not None else a.length))
            h.send_header("Connection", "close")
            h.end_headers()
            if method == "HEAD":
                return
            for chunk in _then((a.body for _ in range(a.repeat)), a.tail):
                if not chunk:
                    continue
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if a.fault == "chunked" else chunk)
            if a.fault == "chunked":
                h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:  # the client hung up: what a capped reader does
            pass

    def start(self) -> None:
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _then(chunks: Iterator[bytes], tail: bytes) -> Iterator[bytes]:
    yield from chunks
    yield tail


@contextmanager
def serving(route: Route) -> Iterator[FaultServer]:
    s = FaultServer(route)
    s.start()
    try:
        yield s
    finally:
        s.close()
