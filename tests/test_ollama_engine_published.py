"""Ollama's Go engine (kvadvise.backends.ollama.engine_layout) against a published server log: Ollama 0.16.1 on a
Raspberry Pi 5 with no GPU loading Qwen3-Coder-30B-A3B (qwen3moe) at 16384 and at 4096 tokens, every line of the
decision and of the memory it prints (tests/data/published/ollama-engine-layout, with its source)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.gguf_cache import read as read_header
from kvadvise.backends.ollama import engine_layout as el
from kvadvise.backends.ollama import layout
from kvadvise.backends.ollama.estimate_legacy import legacy_model

MIB, GIB = 1024**2, 1024**3
DATA = Path(__file__).resolve().parent / "data" / "published" / "ollama-engine-layout"


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / "josheeg-ollama-0.16.1-rpi5-qwen3moe.json").read_text())
    assert all(load["source"].startswith("https://github.com/josheeg/Game-Note-/blob/") for load in doc["loads"])
    return doc


@pytest.fixture(scope="module")
def coder_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logged model's header at its config.json's shapes (the data file's "header"; its tensor types are the
    recipe's, not the byteshape mix's: only the shapes are replayed)."""
    from tinymodels import write_tiny_gguf

    h = _doc()["header"]
    dims = {
        "n_layer": h["block_count"], "n_embd": h["embedding_length"], "n_head": h["head_count"],
        "n_head_kv": h["head_count_kv"], "head": h["head_dim"], "n_expert": h["expert_count"],
        "n_expert_used": h["expert_used_count"], "n_ff_exp": h["expert_feed_forward_length"],
    }  # fmt: skip
    return write_tiny_gguf(
        tmp_path_factory.mktemp("coder") / "q.gguf", "qwen3moe", n_vocab=h["n_vocab"],
        n_ctx_train=h["context_length"], dims=dims, sparse=True,
    )  # fmt: skip


def _msg(line: str) -> str:
    """A log line without its time, level and source (what BackendMemory.Log and sched.go print after them)."""
    return re.sub(r"^time=\S+ level=\S+ source=\S+ ", "", line)


def _request(line: str) -> dict[str, str]:
    """The fields of a runner.go 'load request' line ({Operation:fit ... GPULayers:[] ...})."""
    body = line.split('request="{', 1)[1].rsplit('}"', 1)[0]
    return dict(re.findall(r"(\w+):(\[[^\]]*\]|\S*)", body))


def _window(text: str) -> tuple[float, float]:
    """The bytes format.HumanBytes2's '%.1f GiB' / '%.1f MiB' can have printed as ``text``."""
    value, unit = text.split()
    scale = {"GiB": GIB, "MiB": MIB}[unit]
    return (float(value) - 0.05) * scale, (float(value) + 0.05) * scale


def test_the_header_is_the_logged_model(coder_path: Path) -> None:
    """The replayed header has the log's architecture and tensor count (3 + 48 x 12 = 579)."""
    doc = _doc()
    header = read_header(coder_path)
    line = next(x for x in doc["loads"][0]["log"] if "architecture=" in x)
    assert f"architecture={header.architecture} " in line
    assert f"num_tensors={len(header.tensors)} " in line and len(header.tensors) == doc["header"]["n_tensors"]


def _replay(coder_path: Path, pub: dict[str, Any]) -> el.EngineLayout:
    import kvadvise.api as api

    fa = pub["flash_attention"] == "Enabled"  # NewLlamaServer's "enabling flash attention"
    graph = el.graph_stand_in(
        api.load_model(str(coder_path)), num_ctx=pub["num_ctx"], num_parallel=pub["parallel"], batch=pub["batch"],
        flash_attention=fa, kv_cache_type=pub["kv_cache_type"],
    )  # fmt: skip
    return el.ollama_server_load(
        legacy_model(read_header(coder_path)), [], version=pub["version"], num_ctx=pub["num_ctx"],
        graph_bytes=graph, num_parallel=pub["parallel"], num_batch=pub["batch"], flash_attention=fa,
        kv_cache_type=pub["kv_cache_type"],
    )  # fmt: skip


@pytest.mark.parametrize("index", [0, 1])
def test_ollama_0_16_1_qwen3moe_on_a_raspberry_pi(coder_path: Path, index: int) -> None:
    """The decision line for line: 49 layers requested -1, three trial loads (fit, alloc, commit) of GPULayers:[]
    with KvSize num_ctx x 1, BatchSize 512, FlashAttention:Enabled, an f16 cache; "offloaded 0/49"; the CPU's
    kv cache exactly (48 layers x num_ctx cells x K and V of 4 x 128 f16: 1.5 GiB at 16384, 384.0 MiB at 4096,
    kvcache/causal.go Causal.Init, 256-cell padding). The CPU's graph: the stand-in (kvadvise's llama.cpp
    compute buffer with one output row) vs the Go runner's reserveWorstCaseGraph on the CPU backend: 100.5 MiB
    vs the logged 96.0 MiB at 16384 (+4.7 %), 88.5 MiB vs 88.0 MiB at 4096 (+0.6 %)."""
    load = _doc()["loads"][index]
    pub = load["published"]
    msgs = [_msg(x) for x in load["log"]]
    requests = [_request(x) for x in load["log"] if "msg=load request" in x]
    lay = _replay(coder_path, pub)

    assert f'msg="loading model" "model layers"={lay.total_layers} requested={lay.requested}' in msgs
    assert (lay.total_layers, lay.requested) == (pub["model_layers"], pub["requested"])
    assert [r["Operation"] for r in requests] == pub["load_requests"] and lay.loads == len(requests)
    for r in requests:
        assert r["GPULayers"] == layout.layers_text(lay.gpu_layers) == pub["gpu_layers"]
        assert int(r["KvSize"]) == lay.num_ctx * lay.num_parallel and int(r["Parallel"]) == lay.num_parallel
        assert int(r["BatchSize"]) == lay.batch_size and r["FlashAttention"] == "Enabled" and lay.flash_attention
        assert r["KvCacheType"] == "" and lay.kv_cache_type == "f16"
    assert f'msg="offloaded {lay.layers_offload}/{lay.total_layers} layers to GPU"' in msgs

    assert lay.cache_cells == (pub["num_ctx"],) * 48
    assert lay.cpu.cache_bytes == 48 * pub["num_ctx"] * 2 * (4 * 128 * 2)
    kv_line = f'msg="kv cache" device=CPU size="{pub["kv_cache"]["CPU"]}"'
    assert kv_line in msgs and kv_line in lay.memory_lines()

    # with no GPU the whole graph is the CPU's (ggml.go Context.Reserve), printed as its own line
    assert lay.cpu.graph_bytes == lay.graph_bytes
    assert f'msg="compute graph" device=CPU size="{layout.human_bytes2(lay.graph_bytes)}"' in lay.memory_lines()
    lo, hi = _window(pub["compute_graph"]["CPU"])
    logged = (lo + hi) / 2
    assert abs(lay.graph_bytes / logged - 1) < 0.05  # an approximation: the Go engine builds its own graph


def test_the_logged_weights_and_the_replayed_cache_add_up(coder_path: Path) -> None:
    """BackendMemory.Log's total is weights + cache + graph: with the replayed cache (exact), each load's printed
    total and graph bound the CPU weights, and both loads agree with their printed 10.1 GiB: [10.056, 10.089)
    GiB, the same file at both contexts."""
    lo, hi = 0.0, float("inf")
    for load in _doc()["loads"]:
        pub = load["published"]
        kv = _replay(coder_path, pub).cpu.cache_bytes
        w_lo, w_hi = _window(pub["model_weights"]["CPU"])
        t_lo, t_hi = _window(pub["total_memory"])
        g_lo, g_hi = _window(pub["compute_graph"]["CPU"])
        lo, hi = max(lo, w_lo, t_lo - kv - g_hi), min(hi, w_hi, t_hi - kv - g_lo)
    assert (round(lo / GIB, 3), round(hi / GIB, 3)) == (10.056, 10.089)
