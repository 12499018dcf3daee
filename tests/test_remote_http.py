"""Remote GGUF headers over HTTP range requests: the real Gemma 3 270M on a loopback
server, request and byte counts, the remote header cache, and the errors users hit."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_fixtures import LoopbackServer, Route

from kvadvise.backends.gguf_file import GGUFFileBackend, load_header
from kvadvise.backends.remote.cache import remote_dir
from kvadvise.backends.remote.http_source import HTTPSource, display_url
from kvadvise.cli import main
from kvadvise.errors import BackendUnreachable, GGUFError, InputError
from kvadvise.model.gguf import read_file, read_header

MIB = 1 << 20
GEMMA_HEADER = 6_525_112  # bytes up to the end of the tensor infos (262,144-token vocabulary)
ETAG = '"gemma-270m-q4km-v1"'


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as s:
        yield s


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _same_header(a: object, b: object) -> None:
    from kvadvise.model.gguf import GGUFHeader

    assert isinstance(a, GGUFHeader) and isinstance(b, GGUFHeader)
    assert a.metadata == b.metadata
    assert a.tensors == b.tensors
    assert (a.header_bytes, a.data_offset, a.data_bytes, a.file_bytes) == (
        b.header_bytes,
        b.data_offset,
        b.data_bytes,
        b.file_bytes,
    )


# -- the goal: 2 requests, <= header + 1 MiB ------------------------------------


def test_gemma_header_in_two_requests(gemma_path: Path, server: LoopbackServer) -> None:
    """The first request reads 1 MiB, in the middle of the 262,144 tokens; the second is sized from
    the counts read by then (kvadvise.model.gguf ``rest_of_header``) and reaches the end of the header."""
    url = server.add("/models/gemma-3-270m-it-Q4_K_M.gguf", Route(file=gemma_path, etag=ETAG))
    with HTTPSource(url) as src:
        header = read_header(src)
        requests, received = src.requests, src.bytes_received
    local = read_file(gemma_path)
    _same_header(header, local)
    assert local.header_bytes == GEMMA_HEADER
    assert header.source == url
    log = server.requests()
    assert len(log) == requests == 2
    assert all(r.status == 206 and r.range for r in log)
    sent = server.body_bytes()
    assert sent == received <= GEMMA_HEADER + MIB, (requests, received)
    assert header.file_bytes == gemma_path.stat().st_size  # from Content-Range: the truncation check runs


def test_gemma_plan_by_url_matches_the_local_plan(
    gemma_path: Path, server: LoopbackServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    args = ("--ctx", "8192", "--json", "--no-hardware")
    rc, out, err = run(capsys, "gguf", url, *args)
    assert (rc, err) == (0, "")
    _, out2, _ = run(capsys, "gguf", str(gemma_path), *args)
    remote, local = json.loads(out), json.loads(out2)
    assert remote["model"].pop("source") == url
    local["model"].pop("source")
    assert remote == local
    # the file's tensor data (and, on a CPU plan, the CPU_REPACK copies this machine's CPU makes)
    assert remote["memory"]["weights_bytes"] - remote["memory"]["repack_bytes"] == 246_587_904


# -- the cache -----------------------------------------------------------------------


def test_second_plan_revalidates_with_one_bodiless_request(gemma_path: Path, server: LoopbackServer) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    first = load_header(url)
    server.reset()
    second = load_header(url)
    _same_header(first, second)
    log = server.requests()
    assert len(log) == 1 and log[0].status == 304 and log[0].if_none_match == ETAG
    assert server.body_bytes() == 0


def test_a_changed_file_is_read_again(gemma_path: Path, tmp_path: Path, server: LoopbackServer) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_tiny_gguf

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    server.add("/m.gguf", Route(file=gemma_path, etag='"v1"'))
    assert load_header(server.url("/m.gguf")).architecture == "gemma3"
    server.add("/m.gguf", Route(file=tiny, etag='"v2"'))
    server.reset()
    assert load_header(server.url("/m.gguf")).architecture == "llama"
    assert server.requests()[0].if_none_match == '"v1"' and server.requests()[0].status == 206


def test_cached_header_is_used_when_the_server_is_gone(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LoopbackServer() as s:
        url = s.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
        first = load_header(url)
    _same_header(load_header(url), first)  # connection refused: the cached header stands
    rc, out, _ = run(capsys, "gguf", url, "--ctx", "4096", "--json", "--no-hardware")
    assert rc == 0 and json.loads(out)["model"]["n_vocab"] == 262_144


def test_a_server_without_etag_is_cached_by_size_and_date(gemma_path: Path, server: LoopbackServer) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path, headers={"Last-Modified": "Tue, 12 Aug 2025 10:00:00 GMT"}))
    load_header(url)
    server.reset()
    load_header(url)
    assert len(server.requests()) == 1  # the first range matched size and date: the rest is cached


def test_no_cache_means_no_cache(gemma_path: Path, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVADVISE_NO_CACHE", "1")
    url = server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    load_header(url)
    server.reset()
    load_header(url)
    assert len(server.requests()) == 2 and not remote_dir().exists()


# -- servers without range support, redirects -------------------------------------------


def test_server_without_range_support_streams_only_the_header(gemma_path: Path, server: LoopbackServer) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path, ranges=False))
    with HTTPSource(url) as src:
        header = read_header(src)
        assert not src.ranges
        received = src.bytes_received
    _same_header(header, read_file(gemma_path))
    log = server.requests()
    assert len(log) == 1 and log[0].status == 200
    assert GEMMA_HEADER <= received <= GEMMA_HEADER + MIB
    # the connection was closed long before the 253 MB body: only socket buffers' worth went out
    assert server.body_bytes() < gemma_path.stat().st_size // 4


def test_redirects_are_followed_and_later_reads_go_to_the_target(gemma_path: Path, server: LoopbackServer) -> None:
    server.add("/blob/gemma.gguf", Route(file=gemma_path))
    server.add("/b", Route(redirect="/blob/gemma.gguf"))
    url = server.add("/a", Route(redirect=server.url("/b")))
    with HTTPSource(url) as src:
        read_header(src)
        assert src.requests == 2 + 2 and src.url == server.url("/blob/gemma.gguf")
    assert [r.path for r in server.requests()[:3]] == ["/a", "/b", "/blob/gemma.gguf"]
    assert len(server.requests("/a")) == 1  # not redirected again for each range


def test_authorization_is_not_sent_to_another_origin(gemma_path: Path, server: LoopbackServer) -> None:
    with LoopbackServer() as cdn:
        signed = cdn.add("/x", Route(file=gemma_path)) + "?X-Amz-Signature=abc"
        url = server.add("/file.gguf", Route(redirect=signed, token="sekret"))
        with HTTPSource(url, headers={"Authorization": "Bearer sekret"}) as src:
            header = read_header(src)
        assert header.source == url
        assert server.requests()[0].authorization
        assert cdn.requests() and not any(r.authorization for r in cdn.requests())


def test_redirect_loop_is_named(server: LoopbackServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.add("/a", Route(redirect="/b"))
    server.add("/b", Route(redirect="/a"))
    with pytest.raises(InputError, match=r"redirect loop \(.*/a -> .*/b -> .*/a\)"):
        load_header(server.url("/a"))
    rc, _, err = run(capsys, "gguf", server.url("/a"), "--no-hardware")
    assert rc == 2 and "redirect loop" in err and "Traceback" not in err


def test_too_many_redirects(server: LoopbackServer) -> None:
    for i in range(12):
        server.add(f"/r{i}", Route(redirect=f"/r{i + 1}"))
    with pytest.raises(InputError, match="more than 10 redirects"):
        load_header(server.url("/r0"))
    assert len(server.requests()) == 11


def test_redirect_to_a_file_url_is_refused(server: LoopbackServer) -> None:
    server.add("/evil", Route(redirect="file:///etc/passwd"))
    with pytest.raises(InputError, match="non-HTTP URL"):
        load_header(server.url("/evil"))


# -- errors ---------------------------------------------------------------------------


def test_not_found(server: LoopbackServer, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "gguf", server.url("/nope.gguf"), "--no-hardware")
    assert rc == 2
    assert err.splitlines()[0] == f"kvadvise: error: {server.url('/nope.gguf')}: not found (HTTP 404)"


def test_unauthorized_and_forbidden(server: LoopbackServer) -> None:
    url = server.add("/private.gguf", Route(data=b"GGUF", token="t0k"))
    with pytest.raises(InputError, match="needs credentials \\(HTTP 401\\)"):
        load_header(url)
    with (
        HTTPSource(url, headers={"Authorization": "Bearer wrong"}, denied_hint="set HF_TOKEN") as src,
        pytest.raises(InputError, match="refused access \\(HTTP 403\\)") as e,
    ):
        src.size()
    assert e.value.hint == "set HF_TOKEN"


def test_slow_server_times_out(server: LoopbackServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = server.add("/slow.gguf", Route(data=b"GGUF", delay_s=2.0))
    with (
        HTTPSource(url, timeout_s=0.3) as src,
        pytest.raises(BackendUnreachable, match=r"no complete answer within 0.3 s"),
    ):
        src.size()


def test_connection_refused_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, _, err = run(capsys, "gguf", f"http://127.0.0.1:{port}/m.gguf", "--no-hardware")
    assert rc == 4 and "cannot connect (connection refused)" in err


def test_server_errors_are_unreachable(server: LoopbackServer) -> None:
    url = server.add("/m.gguf", Route(status=503))
    with pytest.raises(BackendUnreachable, match="HTTP 503"):
        load_header(url)


def test_not_a_gguf(server: LoopbackServer) -> None:
    url = server.add("/index.html", Route(data=b"<!doctype html><html>hello</html>"))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_header(url)


def test_empty_file(server: LoopbackServer) -> None:
    url = server.add("/empty.gguf", Route(data=b""))
    with pytest.raises(GGUFError, match="file ends inside the header"):
        load_header(url)
    assert server.requests()[0].status == 416


def test_truncated_remote_file(gemma_path: Path, server: LoopbackServer) -> None:
    url = server.add("/cut.gguf", Route(file=gemma_path, size_override=100 * MIB))
    with pytest.raises(GGUFError, match="file is truncated"):
        load_header(url)


def test_names_and_cache_never_hold_the_query_or_credentials(gemma_path: Path, server: LoopbackServer) -> None:
    server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    url = server.url("/gemma.gguf") + "?token=SECRET123"
    header = load_header(url.replace("http://", "http://user:pw@"))
    assert header.source == server.url("/gemma.gguf")
    assert display_url("https://u:p@example.com:8443/a/b.gguf?sig=1#x") == "https://example.com:8443/a/b.gguf"
    for f in remote_dir().iterdir():
        text = f.read_text()
        assert "SECRET123" not in text and "pw@" not in text


def test_backend_summary_and_spec(gemma_path: Path, server: LoopbackServer) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path))
    spec = GGUFFileBackend().load_spec(url)
    assert (spec.architecture, spec.n_vocab, spec.source) == ("gemma3", 262_144, url)


def test_only_http_urls() -> None:
    with pytest.raises(InputError, match="only http:// and https://"):
        HTTPSource("ftp://127.0.0.1/x.gguf")


@pytest.mark.parametrize("url", ["https://", "https:///x.gguf", "http://:8080/x.gguf", "https://user@/x.gguf"])
def test_a_url_without_a_host_is_bad_input(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gguf https:///x.gguf` said "cannot connect (str)" with exit 4, as if a server were down: a URL
    that names no host is the user's input to fix (exit 2), said before any connection is tried."""
    from kvadvise.cli import main

    with pytest.raises(InputError, match="the URL names no host"):
        HTTPSource(url)
    assert main(["gguf", url, "--no-hardware"]) == 2
    assert "the URL names no host" in capsys.readouterr().err


def test_reads_behind_the_kept_bytes_fetch_again(server: LoopbackServer) -> None:
    data = bytes(range(256)) * 64
    url = server.add("/blob", Route(data=data))
    with HTTPSource(url, first_read=1024) as src:
        assert src.read(4000, 100) == data[4000:4100]
        assert src.read(10, 5) == data[10:15]
        assert src.read(16300, 1000) == data[16300:]  # clipped at the end of the file
        assert src.requests == 4


def test_llamacpp_command_for_a_url_uses_model_url(
    gemma_path: Path, server: LoopbackServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    rc, out, err = run(capsys, "llamacpp", url, "--ctx", "4096", "--no-hardware")
    assert rc == 0, err
    assert out.splitlines()[-1].startswith(f"llama-server -mu {url} -c 4096 -np 1 ")


def test_a_server_on_this_machine_is_never_reached_through_a_proxy(
    gemma_path: Path, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one transport's rule (backends/remote/transport.py), for the range reader as for the Ollama API."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", dead)
    url = server.add("/gemma.gguf", Route(file=gemma_path, etag=ETAG))
    with HTTPSource(url) as src:
        assert read_header(src).header_bytes == GEMMA_HEADER
    with HTTPSource("http://files.example/m.gguf", timeout_s=5) as src, pytest.raises(BackendUnreachable) as e:
        src.size()  # anywhere else: through the proxy, which is not there
    assert "connection refused" in e.value.message
