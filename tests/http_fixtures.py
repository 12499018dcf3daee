"""A loopback HTTP server for the remote-GGUF tests, and a recorded Hugging Face Hub.

``LoopbackServer`` listens on 127.0.0.1 only (port 0: the OS picks one) in a
thread and serves routes: files with or without Range support, redirects,
errors, a token check (401 without a token, 403 with a wrong one), delays,
ETags with 304 Not Modified. Every request is logged with the body bytes the
server wrote, so tests assert how many requests and bytes a plan costs.

``HubRepo`` registers on such a server what the Hub answers for a model repo,
as recorded from huggingface.co (response shapes of 2025): the model info
JSON of ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``,
``GET/HEAD /{repo}/resolve/{rev}/{file}`` (small files answered directly with
``X-Repo-Commit`` and ``ETag``; LFS files redirected with ``X-Linked-Size`` /
``X-Linked-Etag`` to a CDN URL with a signed query string, which may be
another loopback server: another origin).

Also ``write_split``: a tiny GGUF split into parts the way llama.cpp's
gguf-split lays them out (gguf-py's GGUFWriter with ``split_max_tensors``:
the first part holds every metadata key, each part split.no / split.count /
split.tensors.count).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 1 << 16


@dataclass
class Route:
    file: Path | None = None
    data: bytes | None = None
    json: Any = None
    status: int = 200
    ranges: bool = True  # False: ignore Range and send the whole body with 200
    redirect: str | None = None  # Location of a redirect (relative or absolute)
    redirect_status: int = 302  # 307: what a registry answers for a blob (to its blob store)
    delay_s: float = 0.0  # before the status line
    token: str | None = None  # a required bearer token
    etag: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    size_override: int | None = None  # claim another total size in Content-Range (a truncated file)


@dataclass(frozen=True)
class Logged:
    method: str
    path: str  # with the query string
    range: str | None
    if_none_match: str | None
    authorization: bool  # an Authorization header was sent (its value is never kept)
    status: int
    body_bytes: int
    accept: str | None = None  # the Accept header (a registry's manifest request names the manifest type)


class LoopbackServer:
    """An HTTP server on 127.0.0.1 in a thread; ``with LoopbackServer() as s: s.add(...); s.url(...)``."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.log: list[Logged | None] = []  # in the order requests arrived (a slot is kept until served)
        self._lock = threading.Lock()
        self._active = 0  # requests being served: measurements wait for them
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                owner._serve(self, head=False)

            def do_HEAD(self) -> None:
                owner._serve(self, head=True)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- set-up ------------------------------------------------------------

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.origin + path

    def add(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.url(path)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- measurements --------------------------------------------------------

    def requests(self, prefix: str = "") -> list[Logged]:
        """The requests served so far (after the ones in flight have finished)."""
        deadline = time.monotonic() + 5
        while self._active and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            return [r for r in self.log if r is not None and r.path.startswith(prefix)]

    def body_bytes(self, prefix: str = "") -> int:
        return sum(r.body_bytes for r in self.requests(prefix))

    def reset(self) -> None:
        self.requests()
        with self._lock:
            self.log.clear()

    # -- serving -------------------------------------------------------------

    def _serve(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        with self._lock:  # the request's place in the log is when it arrived, not when its answer was sent
            self._active += 1
            slot = len(self.log)
            self.log.append(None)
        path = h.path
        route = self.routes.get(path) or self.routes.get(path.split("?", 1)[0])
        rng = h.headers.get("Range")
        inm = h.headers.get("If-None-Match")
        auth = h.headers.get("Authorization")
        sent = 0
        status = 404
        try:
            if route is None:
                status = 404
                if path.startswith("/api/"):  # what the Hub answers for a repo it does not have
                    body, code = b'{"error":"Repository not found"}', "RepoNotFound"
                else:
                    body, code = b'{"error":"Entry not found"}', "EntryNotFound"
                sent = self._send(h, 404, body, {"X-Error-Code": code, "Content-Type": "application/json"}, head)
                return
            if route.delay_s:
                time.sleep(route.delay_s)
            if route.token is not None and auth != f"Bearer {route.token}":
                status = 401 if auth is None else 403
                msg = b'{"error":"Access to model is restricted. You must have access to it and be authenticated."}'
                sent = self._send(h, status, msg, {"X-Error-Code": "GatedRepo"}, head)
                return
            if route.redirect is not None:
                status = route.redirect_status
                sent = self._send(h, status, b"Found.", {"Location": route.redirect, **route.headers}, head)
                return
            if route.status != 200:
                status = route.status
                sent = self._send(h, status, b"error", route.headers, head)
                return
            extra = dict(route.headers)
            if route.etag is not None:
                extra["ETag"] = route.etag
                if inm == route.etag:
                    status = 304
                    sent = self._send(h, 304, b"", extra, True)
                    return
            if route.json is not None:
                status = 200
                body = json.dumps(route.json).encode()
                sent = self._send(h, 200, body, {"Content-Type": "application/json", **extra}, head)
                return
            status, sent = self._send_file(h, route, rng, extra, head)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            h.close_connection = True
            with self._lock:
                self.log[slot] = Logged(
                    h.command, path, rng, inm, auth is not None, status, sent, h.headers.get("Accept")
                )
                self._active -= 1

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], head: bool) -> int:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if status != 304:
            h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        if head or status == 304:
            return 0
        h.wfile.write(body)
        return len(body)

    def _send_file(
        self, h: BaseHTTPRequestHandler, route: Route, rng: str | None, extra: dict[str, str], head: bool
    ) -> tuple[int, int]:
        size = route.file.stat().st_size if route.file is not None else len(route.data or b"")
        total = route.size_override if route.size_override is not None else size
        start, end = 0, size
        status = 200
        m = _RANGE.match(rng or "")
        if route.ranges and m:
            start = int(m[1])
            if start >= total:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{total}")
                h.send_header("Content-Length", "0")
                h.send_header("Connection", "close")
                h.end_headers()
                return 416, 0
            end = min(int(m[2]) + 1 if m[2] else size, size, total)
            status = 206
        h.send_response(status)
        for k, v in extra.items():
            h.send_header(k, v)
        if route.ranges:
            h.send_header("Accept-Ranges", "bytes")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
        h.send_header("Content-Length", str(end - start))
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        if head:
            return status, 0
        sent = 0
        if route.file is not None:
            with open(route.file, "rb") as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    chunk = f.read(min(_CHUNK, left))
                    if not chunk:
                        break
                    try:
                        h.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        return status, sent
                    sent += len(chunk)
                    left -= len(chunk)
        else:
            body = (route.data or b"")[start:end]
            h.wfile.write(body)
            sent = len(body)
        return status, sent


# -- a recorded Hub --------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class HubRepo:
    """A model repo as the Hub serves it. ``files``: path in the repo -> a local file or bytes."""

    repo_id: str
    files: dict[str, Path | bytes]
    sha: str = "4f1bb3b1a0c5f2e3d4c5b6a79810f1e2d3c4b5a6"
    token: str | None = None  # gated: the resolve URLs need this bearer token
    safetensors_total: int | None = None
    lfs_min: int = 10 << 20  # files this big (or Path files) go through the CDN redirect

    def model_info(self) -> dict[str, Any]:
        """GET /api/models/{repo}[/revision/{rev}] as huggingface.co answers it (fields kvadvise may read)."""
        author = self.repo_id.split("/")[0]
        doc: dict[str, Any] = {
            "_id": "66f1c2d3e4b5a69788796a5b",
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": author,
            "sha": self.sha,
            "lastModified": "2025-08-14T16:12:03.000Z",
            "private": False,
            "disabled": False,
            "gated": "manual" if self.token else False,
            "downloads": 48213,
            "likes": 127,
            "library_name": "transformers",
            "tags": ["gguf", "text-generation", "endpoints_compatible", "region:us"],
            "pipeline_tag": "text-generation",
            "createdAt": "2025-08-14T15:50:41.000Z",
            "siblings": [{"rfilename": name} for name in [".gitattributes", "README.md", *self.files]],
            "spaces": [],
            "usedStorage": sum(self._size(v) for v in self.files.values()),
        }
        if self.safetensors_total is not None:
            doc["safetensors"] = {"parameters": {"BF16": self.safetensors_total}, "total": self.safetensors_total}
        return doc

    @staticmethod
    def _size(v: Path | bytes) -> int:
        return v.stat().st_size if isinstance(v, Path) else len(v)

    def register(self, hub: LoopbackServer, cdn: LoopbackServer | None = None) -> None:
        """Serve the repo from ``hub``; LFS files redirect to ``cdn`` (default: ``hub`` itself)."""
        cdn = cdn or hub
        info = self.model_info()
        hub.add(f"/api/models/{self.repo_id}", Route(json=info))
        for rev in ("main", self.sha):
            hub.add(f"/api/models/{self.repo_id}/revision/{rev}", Route(json=info))
        for name, content in self.files.items():
            size = self._size(content)
            digest = _sha256(content if isinstance(content, bytes) else name.encode())
            lfs = isinstance(content, Path) or size >= self.lfs_min
            for rev in ("main", self.sha):
                path = f"/{self.repo_id}/resolve/{rev}/{name}"
                common = {"X-Repo-Commit": self.sha, "Access-Control-Expose-Headers": "X-Repo-Commit,ETag"}
                if lfs:
                    signed = f"/repos/{digest[:2]}/{digest}?X-Amz-Expires=3600&X-Amz-Signature=5f2a9c{digest[:20]}"
                    hub.add(
                        path,
                        Route(
                            redirect=cdn.url(signed),
                            token=self.token,
                            headers={**common, "X-Linked-Size": str(size), "X-Linked-Etag": f'"{digest}"'},
                        ),
                    )
                    cdn.add(
                        f"/repos/{digest[:2]}/{digest}",
                        Route(
                            file=content if isinstance(content, Path) else None,
                            data=content if isinstance(content, bytes) else None,
                            etag=f'"{digest}"',
                        ),
                    )
                else:
                    data = content if isinstance(content, bytes) else content.read_bytes()
                    hub.add(path, Route(data=data, token=self.token, etag=f'"{digest[:40]}"', headers=common))


# -- split models ----------------------------------------------------------------


def write_split(src: Path, out: Path, max_tensors: int) -> list[Path]:
    """Split the GGUF ``src`` into parts named ``out``-0000k-of-0000n.gguf, as gguf-split does.

    gguf-py's GGUFWriter with ``split_max_tensors`` writes what llama.cpp's
    tools/gguf-split/gguf-split.cpp writes: all metadata in the first part,
    split.no (u16), split.count (u16) and split.tensors.count (i32) in every part.
    """
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch, split_max_tensors=max_tensors)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    n = len(writer.tensors)
    return [out.with_name(f"{out.stem}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
