"""Split GGUF models (-00001-of-0000N.gguf): local and over HTTP, merged into one
header whose tensors are summed, with llama.cpp's checks; llama.cpp itself loads one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_fixtures import LoopbackServer, Route, write_split
from tinymodels import write_tiny_gguf

from kvadvise.backends.gguf_file import GGUFFileBackend, load_header, read_local
from kvadvise.errors import GGUFError, InputError
from kvadvise.model import splits
from kvadvise.model.gguf import read_file


@pytest.fixture
def split3(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A tiny gemma3 model and the same model in 3 parts."""
    whole = write_tiny_gguf(tmp_path / "whole.gguf", "gemma3")
    parts = write_split(whole, tmp_path / "tiny-gemma3.gguf", max_tensors=40)
    assert [p.name for p in parts] == [f"tiny-gemma3-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return whole, parts


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as s:
        yield s


def test_split_names() -> None:
    n = splits.parse_name("/m/Qwen3-Coder-30B-A3B-Q4_K_M-00002-of-00003.gguf")
    assert n == splits.SplitName("/m/Qwen3-Coder-30B-A3B-Q4_K_M", 2, 3)
    assert n.part(1) == "/m/Qwen3-Coder-30B-A3B-Q4_K_M-00001-of-00003.gguf"
    assert len(n.parts) == 3
    assert splits.parse_name("model.gguf") is None
    assert splits.parse_name("m-00004-of-00003.gguf") is None
    assert splits.parse_name("m-0001-of-0003.gguf") is None


def test_the_parts_are_what_gguf_split_writes(split3: tuple[Path, list[Path]]) -> None:
    whole, parts = split3
    headers = [read_file(p) for p in parts]
    n_tensors = len(read_file(whole).tensors)
    for i, h in enumerate(headers):
        assert (h.metadata["split.no"], h.metadata["split.count"], h.metadata["split.tensors.count"]) == (
            i,
            3,
            n_tensors,
        )
    assert set(read_file(whole).metadata) < set(headers[0].metadata)  # every key in the first part
    assert set(headers[1].metadata) == set(headers[2].metadata) == {"split.no", "split.count", "split.tensors.count"}


def test_local_split_merges_to_the_whole_model(split3: tuple[Path, list[Path]]) -> None:
    whole, parts = split3
    one = GGUFFileBackend().load_spec(str(whole))
    merged = GGUFFileBackend().load_spec(str(parts[0]))
    headers = [read_file(p) for p in parts]
    spans = sum(h.tensors[-1].offset + h.tensors[-1].n_bytes for h in headers)
    assert merged.weights_bytes == spans  # each part mapped from its first to its last tensor
    assert merged.notes[-1] == "split model: 3 parts, the tensors of all parts summed"
    differ = {
        k
        for k, v in dataclasses.asdict(one).items()
        if v != dataclasses.asdict(merged)[k] and k not in ("source", "notes", "weights_bytes")
    }
    assert differ == set()
    h = load_header(str(parts[0]))
    assert len(h.tensors) == len(read_file(whole).tensors)
    assert h.file_bytes == sum(p.stat().st_size for p in parts)
    assert h.extra["split_parts"] == tuple(str(p) for p in parts)
    assert read_local(parts[0]).tensors == h.tensors  # a pathlib.Path from a Python caller, as before


def test_a_later_part_is_refused_with_the_first_named(split3: tuple[Path, list[Path]]) -> None:
    _, parts = split3
    with pytest.raises(InputError, match="part 2 of 3") as e:
        load_header(str(parts[1]))
    assert e.value.hint is not None and "-00001-of-00003.gguf" in e.value.hint


def test_a_missing_part(split3: tuple[Path, list[Path]]) -> None:
    _, parts = split3
    parts[2].unlink()
    with pytest.raises(InputError, match="part 3 of 3 of the split model is missing"):
        load_header(str(parts[0]))


def test_a_renamed_first_part(split3: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, parts = split3
    renamed = parts[0].rename(tmp_path / "model.gguf")
    with pytest.raises(InputError, match=r"its name does not end in -00001-of-00003\.gguf"):
        load_header(str(renamed))


def test_merge_checks_numbers_counts_and_duplicates(split3: tuple[Path, list[Path]]) -> None:
    _, parts = split3
    h = [read_file(p) for p in parts]
    with pytest.raises(GGUFError, match=r"split\.no is 2, expected 1"):
        splits.merge([h[0], h[2], h[1]])
    with pytest.raises(InputError, match=r"split\.count is 3, 2 parts given"):
        splits.merge(h[:2])
    with pytest.raises(GGUFError, match="also in another part"):
        splits.merge([h[0], h[1], dataclasses.replace(h[2], tensors=h[1].tensors)])
    short = dataclasses.replace(h[2], tensors=h[2].tensors[:-1])
    with pytest.raises(GGUFError, match=r"split.tensors.count is \d+ but the 3 parts hold"):
        splits.merge([h[0], h[1], short])


def test_a_model_in_one_file_merges_to_itself(split3: tuple[Path, list[Path]]) -> None:
    whole = read_file(split3[0])
    assert splits.merge([whole]) is whole and splits.split_count(whole) == 0


def test_remote_split_reads_every_part(split3: tuple[Path, list[Path]], server: LoopbackServer) -> None:
    _, parts = split3
    for p in parts:
        server.add(f"/m/{p.name}", Route(file=p, etag=f'"{p.name}"'))
    url = server.url(f"/m/{parts[0].name}")
    spec = GGUFFileBackend().load_spec(url)
    assert spec.weights_bytes == GGUFFileBackend().load_spec(str(parts[0])).weights_bytes
    assert [r.path for r in server.requests()] == [f"/m/{p.name}" for p in parts]  # one request per small header
    assert server.body_bytes() <= sum(read_file(p).header_bytes for p in parts) + 3 * (1 << 20)
    server.reset()
    GGUFFileBackend().load_spec(url)
    assert [r.status for r in server.requests()] == [304, 304, 304]


def test_remote_split_with_a_missing_part(split3: tuple[Path, list[Path]], server: LoopbackServer) -> None:
    _, parts = split3
    for p in parts[:2]:
        server.add(f"/m/{p.name}", Route(file=p))
    with pytest.raises(InputError, match=r"00003-of-00003\.gguf: not found"):
        load_header(server.url(f"/m/{parts[0].name}"))


@pytest.mark.llama
def test_llama_cpp_maps_each_part_as_predicted(split3: tuple[Path, list[Path]]) -> None:
    from oracle import run_llama

    from kvadvise.model.ggml import cache_type
    from kvadvise.planner.memory import MIB, RunConfig

    _, parts = split3
    spec = GGUFFileBackend().load_spec(str(parts[0]))
    cfg = RunConfig(n_ctx=1024, type_k=cache_type("f16"), type_v=cache_type("f16"))
    (m,) = run_llama(parts[0], [cfg])
    mapped = [b for b in m.log.buffers if b.kind == "model"]
    assert len(mapped) == 3  # one CPU_Mapped buffer per part
    assert abs(sum(b.mib for b in mapped) - spec.weights_bytes / MIB) <= 3 * 0.005
