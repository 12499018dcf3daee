"""Round 26b: Ollama's own decision and memory lines, by version, against published server logs not seen before.

Each ``tests/data/published/ollama-legacy/r26b-*.json`` holds one published ``msg=offload`` line of llm/memory.go
(v0.7.0 to v0.12.3 here), the versions its source lines allow, the model's shapes (from the log's print_info lines
or the kvadvise profile named) and the load's setup; the replay runs kvadvise's port (``estimate_gpu_layers``) at
each of those versions and compares every field of the line. ``ollama-layout/r26b-*.json`` holds a llamarunner
load of v0.16-v0.17 (BackendMemory's lines, replayed by ``layout.llama_server_load``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvadvise.backends.ollama import decision, layout
from kvadvise.backends.ollama.estimate_legacy import (
    GIB,
    MIB,
    LegacyEstimate,
    LegacyGpu,
    LegacyModel,
    LegacyTensor,
    LegacyVersionNotModelled,
    estimate_gpu_layers,
)
from kvadvise.backends.ollama.resolve import resolve

PUBLISHED = Path(__file__).resolve().parent / "data" / "published"
LEGACY = PUBLISHED / "ollama-legacy"
F32, Q4_0, Q4_K, Q6_K = 0, 2, 12, 14


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((PUBLISHED / name).read_text())
    return doc


def _fields(line: str) -> dict[str, str]:
    """A msg=offload line's key=value pairs (quoted values unquoted)."""
    return {k: v.strip('"') for k, v in re.findall(r'([a-z_.]+)=("[^"]*"|\S+)', line)}


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the blocks whose attn_v / ffn_down Q4_K_M keeps at q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _header(spec: dict[str, Any]) -> LegacyModel:
    """The blob's tensors from the shapes a log printed: llama Q4_0 (q6_K output) or qwen2 Q4_K_M (tied, q6_K
    token_embd), as the logs' type counts say (e.g. 65 f32 / 225 q4_0 / 1 q6_K; 181 f32 / 216 q4_K / 37 q6_K)."""
    n, e, heads, kv, hd, ff, vocab = (spec[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "head", "n_ff",
                                                         "n_vocab"))  # fmt: skip
    q4k_m = spec["mix"] == "Q4_K_M"
    ts = [LegacyTensor("token_embd.weight", (e, vocab), Q6_K if q4k_m else Q4_0),
          LegacyTensor("output_norm.weight", (e,), F32)]  # fmt: skip
    if not spec.get("tied"):
        ts.append(LegacyTensor("output.weight", (e, vocab), Q6_K))
    for i in range(n):
        p, hi = f"blk.{i}", Q6_K if q4k_m and _more_bits(i, n) else (Q4_K if q4k_m else Q4_0)
        lo = Q4_K if q4k_m else Q4_0
        ts += [LegacyTensor(f"{p}.attn_norm.weight", (e,), F32), LegacyTensor(f"{p}.ffn_norm.weight", (e,), F32),
               LegacyTensor(f"{p}.attn_q.weight", (e, heads * hd), lo), LegacyTensor(f"{p}.attn_k.weight", (e, kv * hd), lo),
               LegacyTensor(f"{p}.attn_v.weight", (e, kv * hd), hi), LegacyTensor(f"{p}.attn_output.weight", (heads * hd, e), lo),
               LegacyTensor(f"{p}.ffn_gate.weight", (e, ff), lo), LegacyTensor(f"{p}.ffn_up.weight", (e, ff), lo),
               LegacyTensor(f"{p}.ffn_down.weight", (ff, e), hi)]  # fmt: skip
        if spec["arch"] == "qwen2":  # q/k/v biases
            ts += [
                LegacyTensor(f"{p}.attn_{x}.bias", (d,), F32)
                for x, d in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd))
            ]
    return LegacyModel(
        architecture=spec["arch"],
        block_count=n,
        embedding_length=e,
        head_count=(heads,),
        head_count_kv=(kv,),
        key_length=None,
        value_length=None,
        n_vocab=vocab,
        context_length=spec["n_ctx_train"],
        tensors=tuple(ts),
    )


def _model(replay: dict[str, Any]) -> LegacyModel:
    if "profile" in replay:
        legacy = decision._legacy_model(resolve(replay["profile"], use_api=False, use_registry=False, roots=[]))
        assert legacy is not None
        return legacy
    return _header(replay["header"])


def _gpus(replay: dict[str, Any]) -> list[LegacyGpu]:
    out = []
    for g in replay["gpus"]:
        free = g["free_bytes"] if "free_bytes" in g else round(g["free_gib"] * GIB)
        out.append(LegacyGpu(free_bytes=free, total_bytes=round(g.get("total_gib", 0) * GIB), library=g["library"]))
    return out


def _replay(doc: dict[str, Any], version: str) -> LegacyEstimate:
    r = doc["replay"]
    return estimate_gpu_layers(_model(r), _gpus(r), num_ctx=r["num_ctx"], num_parallel=r["num_parallel"],
                               kv_cache_type=r["kv_cache_type"], flash_attention=r["flash_attention"], version=version)  # fmt: skip


# --- (1) published offload lines the port prints field for field, at every version the source lines allow ---------

_WHOLE_LINE = (
    [("ollama-legacy/r26b-gemma-host-ollama-0.12.0-0.12.3-cpu-llama32-3b.json", v) for v in ("0.12.0", "0.12.3")]
    + [
        ("ollama-legacy/r26b-codexinfinity-ollama-0.7-0.9.2-cpu-tinyllama-np2.json", v)
        for v in ("0.7.1", "0.8.0", "0.9.0", "0.9.2")
    ]
    + [
        ("ollama-legacy/r26b-gbstudio-ollama-0.9.6-cpu-llama3-8b-np2.json", "0.9.6"),
        ("ollama-legacy/r26b-ru-logparser-ollama-0.9.3-0.9.6-cuda-qwen25-1.5b-np2.json", "0.9.3"),
        ("ollama-legacy/r26b-ru-logparser-ollama-0.9.3-0.9.6-cuda-qwen25-1.5b-np2.json", "0.9.6"),
        # v0.7.0 itself is refused (below); v0.7.1's memory.go differs from it only in the projector and layerSize
        ("ollama-legacy/r26b-yuji-ollama-0.7.0-metal-m2pro-llama2-7b-np2.json", "0.7.1"),
    ]
)


@pytest.mark.parametrize(("name", "version"), _WHOLE_LINE)
def test_r26b_offload_line_field_for_field(name: str, version: str) -> None:
    """Regression guard (passes; the three CPU loads since the fix of round 26b). API: ``estimate_gpu_layers(
    model, gpus, num_ctx, num_parallel=0 (OLLAMA_NUM_PARALLEL unset), version=V)`` over the logged shapes (or the
    kvadvise profile named in the file): every field of the published ``msg=offload`` line, layers.split's quoting
    included. Published (verbatim in each file): llama3.2:3b on a CPU, 0.12.x, "2.6 GiB" required, kv "448.0 MiB";
    tinyllama on a 3.8 GiB droplet, 0.7-0.9.2, 2 slots, kv "176.0 MiB", graph "544.0 MiB"; llama3:8b in Docker,
    0.9.6, 2 slots, "5.8 GiB", kv "1.0 GiB"; a qwen2.5 1.5B Q4_K_M on a 3.1 GiB CUDA card, 0.9.3-0.9.6, 29/29,
    2 slots, kv "224.0 MiB"; llama2:7b on an M2 Pro, 0.7.0, 33/33, kv "4.0 GiB".

    Before round 26b the three CPU loads were UNDER: kvadvise planned one slot (num_ctx 4096) where v0.7.1..v0.9.6's
    sched.go loads a lone CPU with defaultParallel 2 at once ("simplifying assumption of defaultParallel when in
    CPU mode"): llama3:8b "5.0 GiB" required and kv "512.0 MiB" for "5.8 GiB" and "1.0 GiB" published."""
    doc = _doc(name)
    e = _replay(doc, version)
    pub_line = doc["published"]["line"]
    got, pub = _fields(e.log_line()), _fields(pub_line)
    assert {k: got.get(k) for k in pub} == pub, e.log_line()
    assert f"layers.split={pub_line.split('layers.split=')[1].split(' ')[0]}" in e.log_line()  # slog's quoting
    if "num_parallel" in doc["published"]:
        assert (e.num_parallel, e.num_ctx) == (doc["published"]["num_parallel"], doc["published"]["total_ctx"])


def test_r26b_cpu_mode_parallel_by_version() -> None:
    """Regression guard (passes). The CPU branch of sched.go processPending by tag: defaultParallel 2 from v0.7.1 to
    v0.9.6 and 1 in v0.10.0-v0.11.4 (server/sched.go ``var defaultParallel``), an explicit OLLAMA_NUM_PARALLEL kept,
    and from v0.11.5 (the branch gone) one slot. Same llama3:8b header on 6.5 GiB of RAM as the 0.9.6 log."""
    doc = _doc("ollama-legacy/r26b-gbstudio-ollama-0.9.6-cpu-llama3-8b-np2.json")
    r = doc["replay"]
    model, gpus = _model(r), _gpus(r)
    for version, parallel, slots in (("0.9.6", 0, 2), ("0.10.0", 0, 1), ("0.11.4", 0, 1), ("0.9.6", 3, 3),
                                     ("0.11.5", 0, 1), ("0.12.3", 0, 1)):  # fmt: skip
        e = estimate_gpu_layers(model, gpus, num_ctx=4096, num_parallel=parallel, kv_cache_type="",
                                flash_attention=False, version=version)  # fmt: skip
        assert (e.num_parallel, e.layers_offload) == (slots, 0), version
        assert e.required_kv_bytes == slots * 512 * MIB, version


def test_r26b_ollama_0_7_0_is_refused_and_its_text_line_is_0_7_1s() -> None:
    """Regression guard (passes). The llama2:7b log is Ollama 0.7.0 ("Listening on ... (version 0.7.0)"); the port
    starts at v0.7.1 and refuses 0.7.0 with its range in the message. The same load at 0.7.1 prints the 0.7.0 line
    (the test above): between the two tags llm/memory.go moved the engine's projector from GPU 0's overhead to the
    output layer and took layerSize from blk.0 instead of the largest layer, neither of which a text model sees."""
    doc = _doc("ollama-legacy/r26b-yuji-ollama-0.7.0-metal-m2pro-llama2-7b-np2.json")
    with pytest.raises(LegacyVersionNotModelled, match=r"v0\.7\.1 to v0\.12\.10"):
        _replay(doc, "0.7.0")


# --- (2) gemma3:4b at 0.7.0 (ollama#10765): why 0.7.0 stays refused, and the profile's vocabulary ------------------


def _gemma3_4b() -> tuple[dict[str, str], dict[str, str]]:
    doc = _doc("ollama-legacy/r26b-ollama-10765-gemma3-4b-0.7.0-zero-layers.json")
    return _fields(_replay(doc, "0.7.1").log_line()), _fields(doc["published"]["line"])


def test_r26b_gemma3_4b_0_7_0_vision_placement_differs_from_0_7_1() -> None:
    """Regression guard (passes). ollama#10765 (rick-github quoting the reporter's 0.7.0 log, 2025-05-19): gemma3:4b,
    3.2 GiB available, layers.offload=0, because v0.7.0 counts projector.weights + projector.graph (795.9 MiB +
    1.0 GiB) in GPU 0's overhead. v0.7.1's rules (the projector with the output layer) put 28 layers there: so
    kvadvise is right not to replay 0.7.0 with 0.7.1's port. The text fields both tags compute alike agree:
    kv "254.0 MiB" at num_ctx 4096, weights "2.3 GiB" / "1.8 GiB", graph.partial "1.0 GiB", projector lines."""
    got, pub = _gemma3_4b()
    assert (pub["layers.offload"], got["layers.offload"]) == ("0", "28")
    for k in ("layers.model", "memory.required.kv", "memory.weights.total", "memory.weights.repeating",
              "memory.graph.partial", "projector.weights", "projector.graph"):  # fmt: skip
        assert got[k] == pub[k], (k, got[k], pub[k])


def test_r26b_gemma3_4b_output_layer_and_full_graph() -> None:
    """Fixed (was OVER 0.13 MiB): profiles/ollama_models.json's gemma3 profiles take the blob's 262,144 rows. Same replay. kvadvise: memory.weights.nonrepeating
    "525.1 MiB", memory.graph.full "517.1 MiB"; published "525.0 MiB", "517.0 MiB". Rule: the output layer is
    token_embd (tied), 2560 x vocab at q6_K (210/256 B a value): 262,144 rows give 550,502,400 B = 525.0 MiB, the
    profile's 262,208 rows 525.13 MiB; GraphSize's logits term 4 x batch x vocab moves graph.full by the same 64
    rows. Fix: the gemma3 profiles' vocab as Ollama's converter writes it (the tokenizer's 262,144 tokens)."""
    got, pub = _gemma3_4b()
    assert (got["memory.weights.nonrepeating"], got["memory.graph.full"]) == (
        pub["memory.weights.nonrepeating"],
        pub["memory.graph.full"],
    )


# --- (3) the llamarunner's memory lines and llama.cpp's buffers -----------------------------------------------------


@pytest.mark.parametrize("version", ["0.16.0", "0.17.4"])
def test_r26b_qwen25_3b_cpu_llamarunner_memory_lines(version: str) -> None:
    """Regression guard (passes). A Spanish EU AI Act RAG report (2026-03-02, Ollama 0.16.0-0.17.4 by its source
    lines, CPU only, qwen2.5:3b Q4_K_M, KvSize 4096, FlashAttention:Auto): "model layers"=37, model weights CPU
    "1.8 GiB", kv cache CPU "144.0 MiB", total memory "1.9 GiB". API: ``layout.llama_server_load(header, [],
    version=V, num_ctx=4096, flash_attention="auto").memory_lines()`` over the logged shapes: the same three."""
    doc = _doc("ollama-layout/r26b-euaiact-ollama-0.16-0.17-cpu-qwen25-3b.json")
    pub, r = doc["published"], doc["replay"]
    lay = layout.llama_server_load(_header(r["header"]), [], version=version, num_ctx=r["num_ctx"],
                                   flash_attention=r["flash_attention"])  # fmt: skip
    lines = lay.memory_lines()
    assert lay.total_layers == pub["model_layers"]
    assert f'msg="model weights" device=CPU size="{pub["model_weights"]["CPU"]}"' in lines, lines
    assert f'msg="kv cache" device=CPU size="{pub["kv_cache"]["CPU"]}"' in lines, lines
    assert f'msg="total memory" size="{pub["total_memory"]}"' in lines, lines


def test_r26b_qwen25_3b_header_is_the_logged_blob() -> None:
    """Regression guard (passes): the hand-built Q4_K_M header holds the logged 434 tensors, 181 f32 / 216 q4_K /
    37 q6_K, and llama.cpp's "CPU model buffer size = 1834.82 MiB" (the tensors' bytes at CPU alignment)."""
    doc = _doc("ollama-layout/r26b-euaiact-ollama-0.16-0.17-cpu-qwen25-3b.json")
    from kvadvise.backends.ollama.estimate_legacy import _tensor_bytes

    model = _header(doc["replay"]["header"])
    counts: dict[int, int] = {}
    for t in model.tensors:
        counts[t.type_id] = counts.get(t.type_id, 0) + 1
    assert counts == {F32: 181, Q4_K: 216, Q6_K: 37}
    total = sum(_tensor_bytes(t, (0, 17, 4)) for t in model.tensors)
    assert f"{total / MIB:.2f}" == f"{doc['published']['llama_cpp_mib']['CPU_model']:.2f}"


def test_r26b_llama32_3b_cpu_llama_cpp_buffers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). The 0.12.x llama3.2:3b CPU load's llama.cpp lines: CPU model 1918.35, KV 448.00,
    compute 256.50 MiB (flash_attn 0). Command: ``kvadvise ollama llama3.2:3b --ollama-version 0.12.3 --device cpu
    --ctx 4096 --ram 27GiB --json``: memory.devices[CPU] the same to the printed 0.01 MiB."""
    from attack_helpers import run

    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION"):
        monkeypatch.delenv(k, raising=False)
    rc, out, err = run(capsys, "ollama", "llama3.2:3b", "--ollama-version", "0.12.3", "--device", "cpu", "--ctx",
                       "4096", "--ram", "27GiB", "--json")  # fmt: skip
    assert rc == 0, err
    plan = json.loads(out)
    pub = _doc("ollama-legacy/r26b-gemma-host-ollama-0.12.0-0.12.3-cpu-llama32-3b.json")["published"]["llama_cpp_mib"]
    cpu = next(d for d in plan["memory"]["devices"] if d["name"] == "CPU")
    assert plan["config"]["flash_attn"] is False
    got = {k: f"{cpu[f] / MIB:.2f}" for k, f in (("CPU_model", "weights_bytes"), ("CPU_KV", "kv_bytes"),
                                                  ("CPU_compute", "compute_bytes"))}  # fmt: skip
    assert got == {k: f"{pub[k]:.2f}" for k in got}


# --- (4) Ollama 0.33.2 on llama-server, CPU only: the launch it decided ---------------------------------------------


def test_r26b_ollama_0_33_2_cpu_launch_shape(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). Published 130 (Ollama 0.33.2, no usable GPU): "vram-based default context"
    total_vram="0 B" default_num_ctx=4096, OLLAMA_NUM_PARALLEL:2, and the launch ``-c 8192 -np 2 ... -b 1024 -ub 1024
    --flash-attn auto`` (llama.cpp: n_ctx 8192, n_ctx_seq 4096, kv_unified false, FA enabled). kvadvise:
    rules.default_num_ctx(0) is 4096, and ``OLLAMA_NUM_PARALLEL=2 kvadvise ollama llama3.2:3b --ollama-version
    0.33.2 --device cpu --ctx 4096 -np 2 --batch 1024 --json`` (a profile model of the same runner: the launch's
    shape, not ministral-3's buffers, which 130 compares) plans n_ctx 8192, 2 slots, -b/-ub 1024, not unified, FA."""
    from attack_helpers import run

    from kvadvise.backends.ollama import rules

    assert rules.default_num_ctx(0) == 4096
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "2")
    rc, out, err = run(capsys, "ollama", "llama3.2:3b", "--ollama-version", "0.33.2", "--device", "cpu", "--ctx", "4096",
                       "-np", "2", "--batch", "1024", "-fa", "auto", "--ram", "6GiB", "--json")  # fmt: skip
    assert rc == 0, err
    c = json.loads(out)["config"]
    got = (c["n_ctx"], c["n_parallel"], c["n_batch"], c["n_ubatch"], c["kv_unified"], c["flash_attn"], c["runtime"])
    assert got == (8192, 2, 1024, 1024, False, True, "llama-server")
