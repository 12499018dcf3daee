"""Hugging Face Hub names (hf://, USER/REPO:QUANT) and `kvadvise hf` weights, against a
recorded Hub on loopback servers (HF_ENDPOINT), never the network. The Hub redirects
LFS files to a CDN on another origin, as huggingface.co does."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from http_fixtures import HubRepo, LoopbackServer, write_split
from tinymodels import write_tiny_gguf

from kvadvise.backends.gguf_cache import cache_dir
from kvadvise.backends.gguf_file import GGUFFileBackend, load_header
from kvadvise.backends.hf import HFBackend
from kvadvise.backends.remote import hub
from kvadvise.cli import main
from kvadvise.errors import BackendUnreachable, InputError
from kvadvise.model.quants import QUANT_BPW, quant_bpw

MIB = 1 << 20
GEMMA_HEADER = 6_525_112
GEMMA_REPO = "unsloth/gemma-3-270m-it-GGUF"
GEMMA_FILE = "gemma-3-270m-it-Q4_K_M.gguf"
TOKEN = "hf_kvadviseTestTokenDoNotPrint0123456789"
DATA = Path(__file__).resolve().parent / "data" / "hf"


@dataclass
class Hub:
    api: LoopbackServer
    cdn: LoopbackServer

    def reset(self) -> None:
        self.api.reset()
        self.cdn.reset()


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Hub]:
    """HF_ENDPOINT on a loopback server; huggingface_hub online, with its cache and token files in tmp."""
    from huggingface_hub import constants

    with LoopbackServer() as api, LoopbackServer() as cdn:
        monkeypatch.setenv("HF_ENDPOINT", api.origin)
        # kvadvise's own caches in tmp too: a loopback port an earlier test used (and cached a resolution
        # under) can come back, and the resolution cache is keyed by the endpoint
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-token"))
        monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-tokens"))
        yield Hub(api, cdn)


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _gemma_repo(gemma_path: Path, **kw: object) -> HubRepo:
    return HubRepo(
        GEMMA_REPO,
        {GEMMA_FILE: gemma_path, "gemma-3-270m-it-Q8_0.gguf": gemma_path, "mmproj-F16.gguf": b"GGUF"},
        **kw,  # type: ignore[arg-type]
    )


# -- names ---------------------------------------------------------------------------


def test_names() -> None:
    p = hub.parse_ref
    assert p("hf://u/r/sub/m-Q4_K_M.gguf") == hub.HubRef("u/r", "main", "sub/m-Q4_K_M.gguf", None)
    assert p("hf://u/r@v1.0/m.gguf") == hub.HubRef("u/r", "v1.0", "m.gguf", None)
    assert p("hf://u/r.x") == hub.HubRef("u/r.x", "main", None, None)
    assert p("hf://u/r:q8_0") == hub.HubRef("u/r", "main", None, "q8_0")
    assert p("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M") == hub.HubRef(
        "bartowski/Llama-3.2-1B-Instruct-GGUF", "main", None, "Q4_K_M"
    )
    assert p("hf.co/u/r:latest") == hub.HubRef("u/r", "main", None, None)  # Ollama's default tag
    assert p("huggingface.co/u/r") == hub.HubRef("u/r", "main", None, None)
    assert p("https://huggingface.co/u/r/blob/main/a%20b.gguf") == hub.HubRef("u/r", "main", "a b.gguf", None)
    assert p("https://huggingface.co/u/r/resolve/abc123/m.gguf") == hub.HubRef("u/r", "abc123", "m.gguf", None)
    assert p("u/r") is None  # a relative path
    assert p("models/m.gguf") is None
    assert p("https://example.com/m.gguf") is None
    with pytest.raises(InputError, match="not a Hub name"):
        p("hf://nothing")
    with pytest.raises(InputError, match="a file or a quant, not both"):
        p("hf://u/r:Q4_K_M/m.gguf")


BARTOWSKI = [
    ".gitattributes",
    "Llama-3.2-1B-Instruct-IQ3_M.gguf",
    "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
    "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
    "Llama-3.2-1B-Instruct-Q8_0.gguf",
    "Llama-3.2-1B-Instruct-f16.gguf",
    "Llama-3.2-1B-Instruct.imatrix",
    "README.md",
]


def test_choosing_the_file_for_a_quant_as_llama_cpp_does() -> None:
    def pick(files: list[str], quant: str | None = None, filename: str | None = None) -> tuple[str, ...]:
        return hub.choose(files, hub.HubRef("u/r", "main", filename, quant))

    assert pick(BARTOWSKI) == ("Llama-3.2-1B-Instruct-Q4_K_M.gguf",)  # default: Q4_K_M, then Q8_0
    assert pick([f for f in BARTOWSKI if "Q4_K_M" not in f]) == ("Llama-3.2-1B-Instruct-Q8_0.gguf",)
    assert pick(BARTOWSKI, "q8_0") == ("Llama-3.2-1B-Instruct-Q8_0.gguf",)
    assert pick(BARTOWSKI, "F16") == ("Llama-3.2-1B-Instruct-f16.gguf",)
    assert pick(["mmproj-model-Q4_K_M.gguf", "x-Q4_K_M.gguf"]) == ("x-Q4_K_M.gguf",)  # projectors are skipped
    assert pick(["mmproj-f16.gguf", "model-BF16.gguf"]) == ("model-BF16.gguf",)  # else the first model file
    split = [
        "Q8_0/Big-Q8_0-00002-of-00002.gguf",
        "Q8_0/Big-Q8_0-00001-of-00002.gguf",
        "Q4_K_M/Big-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/Big-Q4_K_M-00002-of-00002.gguf",
    ]
    assert pick(split, "Q8_0") == ("Q8_0/Big-Q8_0-00001-of-00002.gguf", "Q8_0/Big-Q8_0-00002-of-00002.gguf")
    with pytest.raises(InputError, match="no GGUF file for Q5_K_M") as e:
        pick(BARTOWSKI, "Q5_K_M")
    assert e.value.hint is not None and "Llama-3.2-1B-Instruct-Q4_K_M.gguf" in e.value.hint
    assert "imatrix" not in e.value.hint
    with pytest.raises(InputError, match="lacks part"):
        pick(split[1:2], "Q8_0")
    with pytest.raises(InputError, match="part 2 of 2"):
        pick(split, filename="Q8_0/Big-Q8_0-00002-of-00002.gguf")
    with pytest.raises(InputError, match=r"no file 'nope\.gguf'"):
        pick(BARTOWSKI, filename="nope.gguf")
    with pytest.raises(InputError, match="has no GGUF model file"):
        pick(["README.md", "model.safetensors"])


# -- reading a header from the Hub ----------------------------------------------------------


def test_gemma_from_the_hub_by_quant(gemma_path: Path, fake_hub: Hub) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    spec = GGUFFileBackend().load_spec(f"{GEMMA_REPO}:Q4_K_M")
    assert (spec.architecture, spec.n_vocab, spec.weights_bytes) == ("gemma3", 262_144, 246_587_904)
    assert spec.source == f"hf://{GEMMA_REPO}/{GEMMA_FILE}"
    api = fake_hub.api.requests()
    assert [r.path for r in api] == [
        f"/api/models/{GEMMA_REPO}/revision/main",  # the listing, which pins the commit
        f"/{GEMMA_REPO}/resolve/{HubRepo.sha}/{GEMMA_FILE}",  # 302 to the CDN, once
    ]
    cdn = fake_hub.cdn.requests()
    assert len(cdn) <= 3 and all(r.status == 206 for r in cdn)
    assert fake_hub.cdn.body_bytes() <= GEMMA_HEADER + MIB


def test_second_plan_needs_only_the_listing_and_offline_none(
    gemma_path: Path, fake_hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    name = f"hf://{GEMMA_REPO}/{GEMMA_FILE}"
    first = load_header(name)
    fake_hub.reset()
    assert load_header(name).tensors == first.tensors
    assert [r.path for r in fake_hub.api.requests()] == [f"/api/models/{GEMMA_REPO}/revision/main"]
    assert fake_hub.cdn.requests() == []  # a header read at a commit never changes
    fake_hub.reset()
    _offline(monkeypatch)
    rc, out, err = run(capsys, "gguf", name, "--ctx", "4096", "--json", "--no-hardware")
    assert (rc, err) == (0, "") and json.loads(out)["model"]["n_vocab"] == 262_144
    assert fake_hub.api.requests() == [] and fake_hub.cdn.requests() == []
    rc, _, err = run(capsys, "gguf", f"{GEMMA_REPO}:Q8_0", "--no-hardware")  # never resolved here
    assert rc == 4 and "offline (HF_HUB_OFFLINE is set)" in err


def test_a_hub_that_cannot_be_reached_falls_back_to_the_cache(gemma_path: Path, fake_hub: Hub) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    first = load_header(f"{GEMMA_REPO}:Q4_K_M")
    fake_hub.api.close()
    assert load_header(f"{GEMMA_REPO}:Q4_K_M").tensors == first.tensors
    with pytest.raises(BackendUnreachable, match="cannot reach"):
        load_header(f"{GEMMA_REPO}:Q8_0")


def test_revision_and_browser_links(gemma_path: Path, fake_hub: Hub) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    h = load_header(f"hf://{GEMMA_REPO}@{HubRepo.sha}/{GEMMA_FILE}")
    assert fake_hub.api.requests()[0].path == f"/api/models/{GEMMA_REPO}/revision/{HubRepo.sha}"
    link = fake_hub.api.url(f"/{GEMMA_REPO}/blob/main/{GEMMA_FILE}")
    assert load_header(link).tensors == h.tensors


def test_gated_repo_without_and_with_a_token(
    gemma_path: Path, fake_hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _gemma_repo(gemma_path, token=TOKEN).register(fake_hub.api, fake_hub.cdn)
    rc, out, err = run(capsys, "gguf", f"{GEMMA_REPO}:Q4_K_M", "--no-hardware")
    assert rc == 2
    assert "the server needs credentials (HTTP 401)" in err
    assert "export HF_TOKEN=<your token>" in err
    monkeypatch.setenv("HF_TOKEN", "hf_wrongwrongwrong")
    rc, out, err = run(capsys, "gguf", f"{GEMMA_REPO}:Q4_K_M", "--no-hardware")
    assert rc == 2 and "refused access (HTTP 403)" in err and "has no access" in err
    assert "hf_wrongwrongwrong" not in out + err
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    fake_hub.reset()
    rc, out, err = run(capsys, "gguf", f"{GEMMA_REPO}:Q4_K_M", "--ctx", "4096", "--json", "--no-hardware")
    assert (rc, err) == (0, "")
    assert TOKEN not in out
    resolve = fake_hub.api.requests(f"/{GEMMA_REPO}/resolve/")
    assert resolve and all(r.authorization for r in resolve)
    assert not any(r.authorization for r in fake_hub.cdn.requests())  # never sent to the CDN's origin
    for f in cache_dir().parent.rglob("*"):
        if f.is_file():
            assert TOKEN not in f.read_text(errors="replace")


def test_unknown_repo_and_quant(gemma_path: Path, fake_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    rc, _, err = run(capsys, "gguf", "nobody/nothing:Q4_K_M", "--no-hardware")
    assert rc == 2 and "no such repository" in err
    rc, _, err = run(capsys, "gguf", f"{GEMMA_REPO}:IQ2_XS", "--no-hardware")
    assert rc == 2 and "no GGUF file for IQ2_XS" in err and GEMMA_FILE in err


def test_split_model_from_the_hub(tmp_path: Path, fake_hub: Hub) -> None:
    whole = write_tiny_gguf(tmp_path / "whole.gguf", "llama")
    parts = write_split(whole, tmp_path / "Tiny-Q8_0.gguf", max_tensors=8)
    files: dict[str, Path | bytes] = {f"Q8_0/{p.name}": p for p in parts}
    HubRepo("org/Tiny-GGUF", files).register(fake_hub.api, fake_hub.cdn)
    spec = GGUFFileBackend().load_spec("hf.co/org/Tiny-GGUF:Q8_0")
    local = GGUFFileBackend().load_spec(str(parts[0]))
    assert spec.weights_bytes == local.weights_bytes and spec.notes == local.notes
    assert len(fake_hub.api.requests("/api/")) == 1
    assert len(fake_hub.api.requests("/org/Tiny-GGUF/resolve/")) == len(parts)
    assert len(fake_hub.cdn.requests()) == len(parts)  # each part's header in one range request


# -- kvadvise hf: the weights -----------------------------------------------------------------


def test_quant_table() -> None:
    assert quant_bpw("q4_k_m") == ("Q4_K_M", QUANT_BPW["Q4_K_M"])
    # the file sizes of quantize.cpp's table, against the types' own widths (q8_0: 34 B per 32 values)
    assert QUANT_BPW["Q8_0"] == pytest.approx(8.5, abs=0.02)
    assert QUANT_BPW["Q6_K"] == pytest.approx(6.5625, abs=0.02)
    assert QUANT_BPW["Q4_K_M"] == pytest.approx(4.90, abs=0.01)
    with pytest.raises(InputError, match="unknown quant 'Q9'"):
        quant_bpw("Q9")


def _qwen3_repo(**files: bytes) -> HubRepo:
    config = (DATA / "qwen3-8b.json").read_bytes()
    return HubRepo("Qwen/Qwen3-8B", {"config.json": config, **files}, safetensors_total=8_190_735_360)


def _index(total: int) -> bytes:
    return json.dumps({"metadata": {"total_size": total}, "weight_map": {"lm_head.weight": "a.safetensors"}}).encode()


def test_hf_weights_from_the_safetensors_index(fake_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    _qwen3_repo(**{"model.safetensors.index.json": _index(16_381_470_720)}).register(fake_hub.api, fake_hub.cdn)
    rc, out, err = run(capsys, "hf", "Qwen/Qwen3-8B", "--ctx", "4096", "--json", "--no-hardware")
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert doc["memory"]["weights_bytes"] == 16_381_470_720
    assert doc["model"]["file_type"] == "bf16"
    assert "weights: 16,381,470,720 B from Qwen/Qwen3-8B/model.safetensors.index.json" in doc["model"]["notes"]


def test_hf_weights_for_a_quant(fake_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    _qwen3_repo(**{"model.safetensors.index.json": _index(16_381_470_720)}).register(fake_hub.api, fake_hub.cdn)
    rc, out, err = run(capsys, "hf", "Qwen/Qwen3-8B", "--quant", "Q4_K_M", "--ctx", "4096", "--json", "--no-hardware")
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    expected = math.ceil(8_190_735_360 * QUANT_BPW["Q4_K_M"] / 8)
    assert doc["memory"]["weights_bytes"] == expected
    assert 4.9e9 < expected < 5.1e9  # bartowski's Qwen3-8B-Q4_K_M.gguf is 5.03 GB
    assert doc["model"]["file_type"] == "Q4_K_M"
    note = doc["model"]["notes"][-1]
    assert note.startswith("weights: Q4_K_M at 4.90 bits per weight × 8,190,735,360 parameters")
    assert "the Hub's safetensors metadata" in note and "quantize.cpp" in note
    rc, _, err = run(capsys, "hf", "Qwen/Qwen3-8B", "--quant", "Q4_K_M", "--weights-bytes", "5")
    assert rc == 2 and "not both" in err
    rc, _, err = run(capsys, "hf", "Qwen/Qwen3-8B", "--quant", "Q3_K_XL", "--no-hardware")
    assert rc == 2 and "unknown quant" in err and "Q4_K_M" in err


def _safetensors(tensors: dict[str, tuple[list[int], int]]) -> bytes:
    """A safetensors file: u64 header length, JSON header, then the (zero) tensor bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (shape, width) in tensors.items():
        n = math.prod(shape) * width
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(off)


def test_hf_weights_of_a_single_safetensors_file(
    fake_hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    st = _safetensors({"a": ([64, 32], 2), "b": ([100], 2)})
    repo = _qwen3_repo(**{"model.safetensors": st})
    repo.safetensors_total = None
    repo.lfs_min = 0  # served through the CDN redirect like every LFS file
    repo.register(fake_hub.api, fake_hub.cdn)
    spec = HFBackend().load_spec("Qwen/Qwen3-8B", quant="Q8_0")
    assert spec.weights_bytes == math.ceil((64 * 32 + 100) * QUANT_BPW["Q8_0"] / 8)
    assert "the header of Qwen/Qwen3-8B/model.safetensors" in spec.notes[-1]
    spec = HFBackend().load_spec("Qwen/Qwen3-8B")
    assert spec.weights_bytes == (64 * 32 + 100) * 2
    # the same from a local folder
    (tmp_path / "config.json").write_bytes((DATA / "qwen3-8b.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes(st)
    assert HFBackend().load_spec(str(tmp_path)).weights_bytes == (64 * 32 + 100) * 2


def test_hf_local_folder_with_an_index_or_without(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((DATA / "qwen3-8b.json").read_bytes())
    spec = HFBackend().load_spec(str(tmp_path))
    # no index and no --quant: the checkpoint's bf16, counted from the config (never 0: round 10c)
    assert "no safetensors index found: the checkpoint's BF16" in spec.notes[-1]
    assert 7.9e9 * 2 < spec.weights_bytes < 8.3e9 * 2
    # no checkpoint to count: the config's parts are counted (issue 25: a MoE's experts, several GPUs)
    counted = HFBackend().load_spec(str(tmp_path), quant="Q4_K_M")
    assert "counted from config.json" in counted.notes[-1] and 7.9e9 * 4.8 / 8 < counted.weights_bytes < 8.3e9 * 5 / 8
    (tmp_path / "model.safetensors.index.json").write_bytes(_index(16_381_470_720))
    spec = HFBackend().load_spec(str(tmp_path / "config.json"))
    assert spec.weights_bytes == 16_381_470_720
    q = HFBackend().load_spec(str(tmp_path), quant="Q8_0")  # bf16: 2 bytes per parameter
    assert q.weights_bytes == math.ceil(16_381_470_720 // 2 * QUANT_BPW["Q8_0"] / 8)
    assert "16,381,470,720 B of bfloat16 weights / 2" in q.notes[-1]
    assert HFBackend().load_spec(str(tmp_path), find_weights=False).weights_bytes == 0


def test_hf_offline_keeps_working_from_the_hf_cache(
    fake_hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _qwen3_repo(**{"model.safetensors.index.json": _index(16_381_470_720)}).register(fake_hub.api, fake_hub.cdn)
    assert HFBackend().load_spec("Qwen/Qwen3-8B").weights_bytes == 16_381_470_720
    _offline(monkeypatch)
    fake_hub.reset()
    assert HFBackend().load_spec("Qwen/Qwen3-8B").weights_bytes == 16_381_470_720
    assert fake_hub.api.requests() == []


def test_llamacpp_command_lets_llama_server_download_hub_names(
    gemma_path: Path, fake_hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama-server cannot open hf:// or USER/REPO:QUANT with -m: the command says -hf / -hfr -hff / -mu."""
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    common = ("--ctx", "4096", "-fa", "on", "--no-hardware")
    rc, out, err = run(capsys, "llamacpp", f"{GEMMA_REPO}:Q4_K_M", *common)
    assert rc == 0, err
    assert out.splitlines()[-1] == (
        f"llama-server -hf {GEMMA_REPO}:Q4_K_M -c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 0"
    )
    rc, out, err = run(
        capsys, "llamacpp", f"hf://{GEMMA_REPO}/{GEMMA_FILE}", *common, "--write-env", str(tmp_path / "e")
    )
    assert rc == 0, err
    assert out.splitlines()[-1].startswith(f"llama-server -hfr {GEMMA_REPO} -hff {GEMMA_FILE} -c 4096 ")
    env = (tmp_path / "e").read_text().splitlines()
    assert f"LLAMA_ARG_HF_REPO={GEMMA_REPO}" in env and f"LLAMA_ARG_HF_FILE={GEMMA_FILE}" in env
    rc, out, err = run(capsys, "llamacpp", f"hf://{GEMMA_REPO}@{HubRepo.sha}/{GEMMA_FILE}", *common)
    assert rc == 0, err
    url = f"{fake_hub.api.origin}/{GEMMA_REPO}/resolve/{HubRepo.sha}/{GEMMA_FILE}"
    assert out.splitlines()[-1].startswith(f"llama-server -mu {url} -c 4096 ")
    rc, out, err = run(capsys, "llamacpp", f"hf://{GEMMA_REPO}@{HubRepo.sha}:Q4_K_M", *common)
    assert rc == 2 and "-hf cannot take a revision" in err


def test_verify_needs_a_local_file(gemma_path: Path, fake_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    _gemma_repo(gemma_path).register(fake_hub.api, fake_hub.cdn)
    rc, out, err = run(capsys, "verify", "llamacpp", f"{GEMMA_REPO}:Q4_K_M", "--ctx", "4096", "--no-hardware")
    assert (rc, out) == (2, "")
    assert "verify runs llama.cpp on a local GGUF file" in err and "Traceback" not in err
