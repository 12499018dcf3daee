"""Round 22b: Ollama's own layer placement and memory decision, by version, against published server logs.

Each case replays a published Ollama load (tests/data/published/ollama-layout/r22b-*.json, the log lines and where
they come from) through ``kvadvise ollama NAME --ollama-version X --vram FREE --json`` with a built-in profile, and
compares ``ollama.decision`` (the layers and the BackendMemory.Log lines of llm/server.go createLayout, replayed by
backends/ollama/layout.py) with what Ollama printed. No Ollama server answers (a closed port); the registry is off.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_internal_error, no_server, run  # noqa: F401  (no_server: autouse)

LAYOUT = Path(__file__).resolve().parent / "data" / "published" / "ollama-layout"
GIB, MIB = 1024**3, 1024**2

_ENV = ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION",
        "OLLAMA_GPU_OVERHEAD", "OLLAMA_NEW_ENGINE", "OLLAMA_NEW_ESTIMATES", "OLLAMA_SCHED_SPREAD")  # fmt: skip


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((LAYOUT / name).read_text())
    return doc


def _plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str,
          env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``kvadvise ollama ARGS --json`` with only the OLLAMA_* settings of ``env``."""
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    rc, out, err = run(capsys, "ollama", *args, "--json")
    assert rc in (0, 3), (rc, err)
    return json.loads(out)


def _memory(log_line: str) -> dict[tuple[str, str], str]:
    """The BackendMemory.Log lines of a decision's log_line: {(kind, device): size}; ("total memory", "")."""
    out = {(k, d): s for k, d, s in re.findall(r'msg="(model weights|kv cache|compute graph)" device=(\S+) size="([^"]+)"',
                                                log_line)}  # fmt: skip
    m = re.search(r'msg="total memory" size="([^"]+)"', log_line)
    if m:
        out[("total memory", "")] = m.group(1)
    return out


# --- (1) llama3.1:8b, partial, q8_0 cache, OLLAMA_GPU_OVERHEAD, on an 8 GB laptop card (0.18.2 - 0.24.0) ----------


@pytest.mark.parametrize("version", ["0.18.2", "0.20.3", "0.24.0"])
@pytest.mark.parametrize("free", ["4.25GiB", "4.27GiB", "4.295GiB"])
def test_r22b_llama31_8b_rtx5070_laptop_8_of_33_q8_cache_gpu_overhead(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str, free: str
) -> None:
    """Regression guard (passes). Harvis diagnosis (2026-08-05; data file r22b-harvis-...-llama31-8b-partial.json):
    Ollama 0.18.2-0.24.0 (source lines), RTX 5070 Laptop, free="4.3 GiB" available="3.3 GiB", OLLAMA_GPU_OVERHEAD
    512 MiB, OLLAMA_CONTEXT_LENGTH=24576, OLLAMA_FLASH_ATTENTION=1, OLLAMA_KV_CACHE_TYPE=q8_0, llama3.1:8b.

    Command: ``OLLAMA_GPU_OVERHEAD=536870912 OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 kvadvise ollama
    llama3.1:8b --ollama-version V --vram FREE --ctx 24576 -fa on -ctk q8_0 -ctv q8_0 --json``.
    Published: "offloaded 8/33 layers", model weights CPU "3.3 GiB", kv cache CPU "1.1 GiB" (GraphSize's q8_0 at one
    byte per element). kvadvise: 8 of 33, CPU weights 3.3 GiB, CPU kv 1.1 GiB at every free in the printed window.
    """
    pub = _doc("r22b-harvis-ollama-0.18-0.24-rtx5070laptop-llama31-8b-partial.json")["published"]
    env = {"OLLAMA_GPU_OVERHEAD": str(pub["gpu_overhead_bytes"]), "OLLAMA_FLASH_ATTENTION": "1",
           "OLLAMA_KV_CACHE_TYPE": "q8_0"}  # fmt: skip
    plan = _plan(capsys, monkeypatch, "llama3.1:8b", "--ollama-version", version, "--vram", free, "--ctx",
                 str(pub["num_ctx"]), "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--ram", "32GiB", env=env)  # fmt: skip
    dec = plan["ollama"]["decision"]
    assert dec is not None, plan["ollama"]["release"]
    assert (dec["layers_offload"], dec["layers_model"]) == (pub["layers_offload"], pub["model_layers"]), dec["log_line"]
    mem = _memory(dec["log_line"])
    assert mem[("model weights", "CPU")] == pub["model_weights"]["CPU"], dec["log_line"]
    assert mem[("kv cache", "CPU")] == pub["kv_cache"]["CPU"], dec["log_line"]
    # "gpu memory" available: free - 457 MiB - 512 MiB, printed 3.3 GiB
    assert f"{dec['available_bytes'] / GIB:.1f} GiB" == pub["available"], dec["available_bytes"]


# --- (2) qwen2.5-coder:7b at 32k on an RTX 3060 12 GB (0.18.3 - 0.20.3), all 29 layers ----------------------------


def _qwen_coder(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    pub = _doc("r22b-lz-ollama-0.18.3-0.20.3-rtx3060-qwen25coder7b-32k.json")["published"]
    plan = _plan(capsys, monkeypatch, "qwen2.5-coder:7b", "--ollama-version", version, "--vram",
                 f"{pub['free_bytes_nvml'] // MIB}MiB", "--ctx", str(pub["num_ctx"]), "--ram", "13GiB")  # fmt: skip
    dec = plan["ollama"]["decision"]
    assert dec is not None, plan["ollama"]["release"]
    return pub, dec


@pytest.mark.parametrize("version", ["0.18.3", "0.20.3"])
def test_r22b_qwen25_coder_7b_rtx3060_32k_layers_kv_graph(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Regression guard (passes). Published (2026-05-05, RTX 3060, free 10.7 GiB, qwen2.5-coder:7b, KvSize 32768,
    FlashAttention:Auto, f16): "model layers"=29, GPULayers:29(0..28), kv cache CUDA0 "1.8 GiB", compute graph CUDA0
    "1.8 GiB", model weights CUDA0 "4.1 GiB". Command: ``kvadvise ollama qwen2.5-coder:7b --ollama-version V --vram
    10958MiB --ctx 32768 --json``: the same."""
    pub, dec = _qwen_coder(capsys, monkeypatch, version)
    assert (dec["layers_offload"], dec["layers_model"]) == (29, pub["model_layers"]), dec["log_line"]
    assert f"GPULayers:{pub['gpu_layers']}" in dec["log_line"]
    mem = _memory(dec["log_line"])
    for kind, key in (("kv cache", "kv_cache"), ("compute graph", "compute_graph"), ("model weights", "model_weights")):
        assert mem[(kind, "CUDA0")] == pub[key]["CUDA0"], (kind, dec["log_line"])


@pytest.mark.parametrize("version", ["0.18.3", "0.20.3"])
def test_r22b_qwen25_coder_7b_rtx3060_32k_total_memory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """FINDING (weights, OVER). Same load as above.

    Command: ``kvadvise ollama qwen2.5-coder:7b --ollama-version 0.20.3 --vram 10958MiB --ctx 32768 --json``.
    kvadvise: msg="total memory" size="7.7 GiB" (CUDA0 weights 4.0917 GiB = 4189.9 MiB + kv 1.75 GiB + graph
    1.8262 GiB = 7.668 GiB). True (the published log): "7.6 GiB". The blocks and the output layer that Ollama sums
    (fs/ggml Layer.Size, every tensor but token_embd at 29/29) are the tensors llama.cpp put in its CUDA0 model
    buffer in the same log: 4168.09 MiB (token_embd on the CPU: 292.36 MiB), so Ollama's "model weights" is at most
    4.0704 GiB and the total at most 7.647 GiB, "7.6". kvadvise's profile is >= 21.8 MiB (0.52 %) over on the
    weights of qwen2.5-coder:7b. Missing rule: the profile's weights are its ``download.bytes``, 4,700,000,000 B,
    the library page's rounded "4.7 GB" (profiles/ollama_models.json), spread over the tensors; the blob's
    tensors are about 4168.09 + 292.36 MiB = 4,677,118,000 B (the log's own buffers): weights should come from
    the tensor types (169 q4_K + 29 q6_K, llama.cpp's Q4_K_M mix), not from a rounded display size.
    """
    pub, dec = _qwen_coder(capsys, monkeypatch, version)
    assert _memory(dec["log_line"])[("total memory", "")] == pub["total_memory"], dec["log_line"]


def test_r22b_qwen25_coder_7b_profile_weights_match_the_logged_buffer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINDING (weights, OVER, +0.52 %). The plan's own weights on the GPU for qwen2.5-coder:7b at 29/29 under Ollama
    0.20.3 (the llamarunner: llama.cpp ec98e2002 as a library). Command: ``kvadvise ollama qwen2.5-coder:7b
    --ollama-version 0.20.3 --vram 10958MiB --ctx 32768 --json``, estimate.devices[GPU].weights. True: llama.cpp's
    "CUDA0 model buffer size = 4168.09 MiB" and "CPU_Mapped model buffer size = 292.36 MiB" in the same published
    log (2026-05-05). Tolerance 0.1 % (the blob's exact bytes). Missing rule: as above (profile weights from the
    recipe, not the library blob)."""
    pub = _doc("r22b-lz-ollama-0.18.3-0.20.3-rtx3060-qwen25coder7b-32k.json")["published"]
    plan = _plan(capsys, monkeypatch, "qwen2.5-coder:7b", "--ollama-version", "0.20.3", "--vram",
                 f"{pub['free_bytes_nvml'] // MIB}MiB", "--ctx", str(pub["num_ctx"]), "--ram", "13GiB")  # fmt: skip
    gpu_weights = _gpu_weights_bytes(plan)
    assert gpu_weights is not None, list(plan)
    assert abs(gpu_weights / (pub["llama_cpp_cuda0_model_buffer_mib"] * MIB) - 1) < 0.001, gpu_weights / MIB


def _gpu_weights_bytes(plan: dict[str, Any]) -> int | None:
    """The plan's model weights on the GPU (--json memory.devices, CUDA0)."""
    for dev in plan["memory"]["devices"]:
        if dev["name"] == "CUDA0":
            return int(dev["weights_bytes"])
    return None


@pytest.mark.xfail(
    strict=True,
    reason="held: over, the safe side (7 MiB, 2.3 %): on a b6302-b9409 GPU kvadvise takes the larger of ggml-alloc's "
    "replay (304.00, as printed) and the analytic phases (311.00), because its 'cuda' plans Vulkan too, whose "
    "graph_optimize reorders the graph; the plan does not carry which backend the card runs",
)
def test_r22b_qwen25_coder_7b_rtx3060_4k_llama_cpp_buffers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINDING (compute, OVER, +2.3 %). The first load of the same published log (KvSize 4096, FlashAttention:Auto,
    f16, 29/29 layers, the llamarunner of Ollama 0.18.3 - 0.20.3 on llama.cpp ec98e2002): llama.cpp printed
    "CUDA0 KV buffer size = 224.00 MiB", "Flash Attention was auto, set to enabled", "CUDA0 compute buffer size =
    304.00 MiB", "CUDA_Host compute buffer size = 15.01 MiB".

    Command: ``kvadvise ollama qwen2.5-coder:7b --ollama-version 0.20.3 --vram 10958MiB --ctx 4096 --json``
    (memory.devices[CUDA0], memory.host; config.runtime "library", flash_attn true). kvadvise: KV 224.00 MiB and
    host compute 15.01 MiB (right), CUDA0 compute 311.00 MiB (326,107,136 B). True: 304.00 MiB: kvadvise is 7.00 MiB
    (7,340,032 B = 512 x 3584 x 4, one f32 [n_embd, n_ubatch] tensor) over. Best guess at the missing rule: at the
    vendored commit (2025-12-16, planned at rules_build 7699) the library's CUDA graph with the whole batch's logits
    reuses one more n_embd x n_ubatch activation than kvadvise's model of it (e.g. the output norm / the final
    residual aliasing the logits' input in the allocator).
    """
    plan = _plan(capsys, monkeypatch, "qwen2.5-coder:7b", "--ollama-version", "0.20.3", "--vram", "10958MiB",
                 "--ctx", "4096", "--ram", "13GiB")  # fmt: skip
    assert plan["config"]["runtime"] == "library" and plan["config"]["flash_attn"] is True, plan["config"]
    cuda0 = next(d for d in plan["memory"]["devices"] if d["name"] == "CUDA0")
    assert cuda0["kv_bytes"] == 224 * MIB
    assert f"{plan['memory']['host']['compute_bytes'] / MIB:.2f}" == "15.01"
    assert f"{cuda0['compute_bytes'] / MIB:.2f}" == "304.00", cuda0["compute_bytes"] / MIB


# --- (3) versions kvadvise does not model (before 0.11): no decision claimed, a clear line, a documented exit ------


@pytest.mark.parametrize("version", ["0.10.1", "0.9.6", "0.6.5", "0.5.0", "0.1.0", "v0.9.6", "0.10.99"])
def test_r22b_before_0_11_no_decision_is_claimed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Regression guard (passes). Command: ``kvadvise ollama llama3.1:8b --ollama-version V --vram 8GiB --ctx 8192``.
    Ollama before 0.11 is not modelled (docs/ollama-versions.md): no ollama.decision, claims_layers false, the text
    says 'older than 0.11.0', exit 0 (a plan from llama.cpp's library, documented), never 1 nor a traceback."""
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    args = ("ollama", "llama3.1:8b", "--ollama-version", version, "--vram", "8GiB", "--ctx", "8192", "--ram", "32GiB")
    rc, out, err = run(capsys, *args, "--json")
    no_internal_error(rc, err)
    assert rc in (0, 3), (rc, err)
    o = json.loads(out)["ollama"]
    assert o["decision"] is None and o["release"]["claims_layers"] is False, o["release"]
    assert "older than 0.11.0" in o["release"]["claims"], o["release"]["claims"]
    rc, out, err = run(capsys, *args)
    no_internal_error(rc, err)
    assert "older than 0.11.0" in out, out


@pytest.mark.parametrize("version", ["0.10", "abc", "-1", "0.9"])
def test_r22b_malformed_version_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Regression guard (passes): a version that is not MAJOR.MINOR.PATCH is refused: exit 2, one line."""
    from attack_helpers import one_line_input_error

    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    rc, _out, err = run(capsys, "ollama", "llama3.1:8b", f"--ollama-version={version}", "--vram", "8GiB")
    one_line_input_error(rc, err)


# --- (4) gemma2:2b on an RX 6600 (ROCm), 2 slots, num_batch 256, OLLAMA_GPU_OVERHEAD 800 MiB (Ollama 0.18.2) ---------

G2 = "r22b-spacewitch-ollama-0.18.2-rocm-rx6600-gemma2-2b-np2.json"


@pytest.fixture(scope="module")
def gemma2_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ollama store holding gemma2:2b's logged header (every shape printed by llama.cpp in the log; q4_0 weights
    and a q6_K token_embd: 288 tensors, 105 f32 / 182 q4_0 / 1 q6_K as logged); a sparse GGUF (no data)."""
    import hashlib

    import gguf
    from ollama_fake import build_store
    from tinymodels import write_tiny_gguf

    q = gguf.GGMLQuantizationType
    qtypes = {n: q.Q4_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    qtypes["token_embd"] = q.Q6_K
    root = tmp_path_factory.mktemp("g2")
    g = write_tiny_gguf(root / "g2.gguf", "gemma2", n_vocab=256000, n_ctx_train=8192, sparse=True, qtypes=qtypes,
                        dims={"n_layer": 26, "n_embd": 2304, "n_head": 8, "n_head_kv": 4, "head": 256, "n_ff": 9216,
                              "n_swa": 4096})  # fmt: skip
    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(g).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    assert counts == {"F32": 105, "Q4_0": 182, "Q6_K": 1}, counts
    build_store(root / "store", g, hashlib.sha256(b"r22b-gemma2-2b").hexdigest(), model="gemma2", tag="2b")
    return root / "store"


def _gemma2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, store: Path) -> dict[str, Any]:
    pub = _doc(G2)["published"]
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    env = {"OLLAMA_GPU_OVERHEAD": str(pub["gpu_overhead_bytes"]), "OLLAMA_NUM_PARALLEL": str(pub["parallel"]),
           "OLLAMA_FLASH_ATTENTION": "1"}  # fmt: skip
    return _plan(capsys, monkeypatch, "gemma2:2b", "--ollama-version", "0.18.2", "--device", "rocm", "--vram",
                 pub["free"].replace(" ", ""), "--ctx", str(pub["num_ctx"]), "-np", str(pub["parallel"]), "--batch",
                 str(pub["batch"]), "-fa", "on", "--ram", "7GiB", env=env)  # fmt: skip


def test_r22b_gemma2_2b_rx6600_layers_weights_kv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gemma2_store: Path
) -> None:
    """Regression guard (passes). Published (Ollama 0.18.2, RX 6600, free 7.3 GiB, overhead 800 MiB, gemma2:2b,
    Parallel:2, BatchSize:256, KvSize 16384): "model layers"=27, GPULayers:27(0..26), model weights ROCm0 "1.5 GiB",
    kv cache ROCm0 "1.6 GiB"; llama.cpp: ROCm0 model buffer 1548.29 MiB, CPU_Mapped 461.43 MiB.
    Command: ``OLLAMA_GPU_OVERHEAD=838860800 OLLAMA_NUM_PARALLEL=2 kvadvise ollama gemma2:2b --ollama-version 0.18.2
    --device rocm --vram 7.3GiB --ctx 8192 -np 2 --batch 256 -fa on --json`` (the store's header): the same."""
    pub = _doc(G2)["published"]
    plan = _gemma2(capsys, monkeypatch, gemma2_store)
    dec = plan["ollama"]["decision"]
    assert dec is not None, plan["ollama"]["release"]
    assert (dec["layers_offload"], dec["layers_model"]) == (27, pub["model_layers"]), dec["log_line"]
    assert f"GPULayers:{pub['gpu_layers']}" in dec["log_line"]
    mem = _memory(dec["log_line"])
    assert mem[("model weights", "ROCm0")] == pub["model_weights"]["ROCm0"], dec["log_line"]
    assert mem[("kv cache", "ROCm0")] == pub["kv_cache"]["ROCm0"], dec["log_line"]
    m = plan["memory"]
    assert f"{m['devices'][0]['weights_bytes'] / MIB:.2f}" == f"{pub['llama_cpp_mib']['ROCm0_model']:.2f}"
    assert f"{m['host']['weights_bytes'] / MIB:.2f}" == f"{pub['llama_cpp_mib']['CPU_Mapped']:.2f}"


def test_r22b_gemma2_2b_rx6600_decision_graph_at_num_batch_256(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gemma2_store: Path
) -> None:
    """FINDING (graph and required/total, OVER 2x). Same load. Command as above (``--batch 256``: Ollama's
    num_batch; the plan itself takes it: config n_batch 512 = 256 x 2 slots, n_ubatch 256, as llama.cpp printed).
    kvadvise's decision: msg="compute graph" device=ROCm0 size="504.5 MiB", msg="total memory" size="3.6 GiB".
    True (the log): "252.2 MiB" and "3.4 GiB": fs/ggml GraphSize (v0.18.2, gemma2 branch) at batch 256:
    max(4 x 256 x (2304 + 256000), ...) = 264,503,296 B; kvadvise's 529,006,592 B is the same formula at batch 512.
    Missing rule: decision.py passes ``settings.num_batch or NUM_BATCH_DEFAULT`` to layout.llama_server_load, and
    the settings it is given carry advice.py's ``num_batch=cfg.n_batch`` = 512 (llama.cpp's -b: num_batch x 2
    slots), not Ollama's num_batch 256 (runtime.py replaces it only afterwards, for the in-process runners): the
    decision must take Ollama's num_batch (the plan's n_ubatch), not the library's n_batch. Here the layout is the same (27/27),
    but a graph twice too large keeps layers off the GPU on a tighter card (UNDER-offload: slower, not OOM)."""
    pub = _doc(G2)["published"]
    dec = _gemma2(capsys, monkeypatch, gemma2_store)["ollama"]["decision"]
    mem = _memory(dec["log_line"])
    assert mem[("compute graph", "ROCm0")] == pub["compute_graph"]["ROCm0"], dec["log_line"]
    assert mem[("total memory", "")] == pub["total_memory"], dec["log_line"]


def test_r22b_gemma2_2b_rx6600_llama_cpp_kv_is_full_size_swa(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gemma2_store: Path
) -> None:
    """FINDING (KV, UNDER 23.4 %: dangerous). Same load: the llamarunner creates its context with
    llama_context_default_params() (v0.18.2:llama/llama.go NewContextParams sets n_ctx, n_batch, n_ubatch,
    n_seq_max, flash_attn_type, type_k/v and embeddings, never swa_full), whose swa_full is true; llama.cpp printed
    "using full-size SWA cache" and two KV buffers of 832.00 MiB (8192 cells x 2 seqs x 13 layers each): 1664.00 MiB.

    Command as above; kvadvise (memory.devices[ROCm0].kv_bytes, config.swa_full false, n_ctx_swa 4352): 1274.00
    MiB. kvadvise is 390 MiB (23.4 %) UNDER on the GPU for every sliding-window model the llamarunner loads
    (gemma2 here; any iSWA architecture not on the Go engine). Missing rule: config.runtime "library" (the
    llamarunner, Ollama 0.11 - 0.24) must plan swa_full = true, as llama_context_default_params sets it."""
    pub = _doc(G2)["published"]
    plan = _gemma2(capsys, monkeypatch, gemma2_store)
    assert plan["config"]["flash_attn"] is False  # FlashAttention:Disabled, as Ollama refused it for gemma2
    kv = plan["memory"]["devices"][0]["kv_bytes"] / MIB
    assert f"{kv:.2f}" == f"{pub['llama_cpp_mib']['ROCm0_kv']:.2f}", (kv, plan["config"])


def test_r22b_gemma2_2b_rx6600_llama_cpp_output_and_host_compute(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gemma2_store: Path
) -> None:
    """FINDING (host buffers, UNDER). Same load; llama.cpp printed "ROCm_Host output buffer size = 1.97 MiB" and
    "ROCm_Host compute buffer size = 22.26 MiB" (the ROCm0 compute buffer, 252.25 MiB, kvadvise has at 254.50 MiB:
    +0.9 %, within its tolerance, not asserted). kvadvise: output 2,048,000 B = 1.95 MiB (logits only) and host
    compute 18.50 MiB. True output: (256000 + 2304) x 2 outputs x 4 B = 2,066,432 B = 1.97 MiB: the llamarunner sets
    params.embeddings = true (v0.18.2:llama/llama.go NewContextParams), so llama.cpp reserves an embeddings row
    beside the logits for each output (also qwen2.5-coder:7b in the r22b-lz log, a 1-slot load: CUDA_Host output
    0.59 MiB = (152064 + 3584) x 4 B, kvadvise 0.58). Host compute: 3.76 MiB (17 %) under; best guess: the full-size SWA
    cache (above) enlarges the CPU-side mask/KQ inputs of the 13 SWA layers (n_kv 8192 instead of 4352)."""
    pub = _doc(G2)["published"]
    m = _gemma2(capsys, monkeypatch, gemma2_store)["memory"]
    assert f"{m['host']['output_bytes'] / MIB:.2f}" == f"{pub['llama_cpp_mib']['ROCm_Host_output']:.2f}"
    # fixed (swa_full as the llamarunner runs it): 22.253 MiB planned (the f32 masks of 16,384 cells, a row, the V
    # cache's row indices, the ids) for the 22.26 printed: within the print's rounding and a few KiB of small inputs
    assert abs(m["host"]["compute_bytes"] / MIB - pub["llama_cpp_mib"]["ROCm_Host_compute"]) <= 0.01


# --- (5) llama3.1:8b with no GPU, Ollama 0.18.2: the exact bytes verifyLayout requires ------------------------------

KA0S = "r22b-ka0s-ollama-0.18.2-cpu-llama31-8b-required.json"


def _llama31_layout(num_ctx: int) -> Any:
    from kvadvise.backends.ollama import decision, layout
    from kvadvise.backends.ollama.resolve import resolve

    model = resolve("llama3.1:8b", use_api=False, use_registry=False, roots=[])
    legacy = decision._legacy_model(model)
    assert legacy is not None
    return layout.llama_server_load(legacy, [], version="0.18.2", num_ctx=num_ctx, flash_attention="off")


def test_r22b_llama31_8b_cpu_required_bytes_match_ollama(monkeypatch: pytest.MonkeyPatch) -> None:
    """FINDING (weights, OVER +0.14 %). Published (2026-03-25, Ollama 0.18.2, no GPU, llama3.1:8b): verifyLayout's
    "model requires more system memory ... required=5691138048 free=4897046528", then "Load failed ... (5.3 GiB)".

    API: ``layout.llama_server_load(decision._legacy_model(resolve("llama3.1:8b")), [], version="0.18.2",
    num_ctx=8192)`` (the replay kvadvise's ``ollama.decision`` runs; the CLI gives no decision without a GPU).
    kvadvise: total 5,698,978,944 B (CPU weights 4,625,237,120 + KV 1,073,741,824). True: 5,691,138,048 B, i.e.
    Ollama's weights of the library blob are 4,617,396,224 B: kvadvise is 7,840,896 B (0.14 %) over, about 245 KB
    per block. Recomputed from llama.cpp's Q4_K_M rule (attn_v and ffn_down q6_K where use_more_bits: blocks 0-3,
    6, 9, ..., 27, 28-31, 16 blocks of 138,936,320 B; 16 of 122,716,160 B all q4_K but the norms) the blocks are
    4,186,439,680 B, + output_norm 16,384 + output (q6_K) 430,940,160 = 4,617,396,224 B: exactly the log's
    required less the KV at num_ctx 8192 (which confirms the inferred context). kvadvise's blocks: 4,194,296,960.
    Missing rule: the profile's weights are its ``download.bytes`` 4,920,738,944 B, the whole blob, spread over
    the tensors: the blob's tensors are 4,912,898,304 B (token_embd + blocks + output_norm + output + rope_freqs),
    the other 7,840,640 B are the GGUF header (128,256 tokens and 280,147 merges of tokenizer metadata), which
    Ollama's Layer.Size and llama.cpp's buffers never count. Subtract the header (or size the tensors from their
    types: 33 q6_K = output + 16 attn_v + 16 ffn_down, the rest q4_K)."""
    pub = _doc(KA0S)["published"]
    lay = _llama31_layout(8192)
    assert lay.total_layers == pub["model_layers"]
    assert lay.total_bytes == pub["required_bytes"], (lay.total_bytes, lay.cpu)


def test_r22b_llama31_8b_cpu_refused_as_ollama_refuses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). The same load: Ollama refuses it (required 5.3 GiB, 4.8 GiB free, no swap).
    Command: ``kvadvise ollama llama3.1:8b --ollama-version 0.18.2 --device cpu --ctx 8192 --ram 4.8GiB``: exit 3
    (does not fit), no traceback; and the layout replay raises LayoutLoadRefused at the logged free memory."""
    from kvadvise.backends.ollama import decision, layout
    from kvadvise.backends.ollama.resolve import resolve

    pub = _doc(KA0S)["published"]
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    rc, _out, err = run(capsys, "ollama", "llama3.1:8b", "--ollama-version", "0.18.2", "--device", "cpu", "--ctx",
                        "8192", "--ram", "4.8GiB")  # fmt: skip
    no_internal_error(rc, err)
    assert rc == 3, rc
    legacy = decision._legacy_model(resolve("llama3.1:8b", use_api=False, use_registry=False, roots=[]))
    assert legacy is not None
    with pytest.raises(layout.LayoutLoadRefused):
        layout.llama_server_load(legacy, [], version="0.18.2", num_ctx=8192, flash_attention="off",
                                 system_free_bytes=pub["system_free_bytes"], system_swap_bytes=0,
                                 system_total_bytes=10 * GIB)  # fmt: skip


# --- (6) tinyllama with no GPU on a 1 GB EC2, Ollama 0.18.2: the context clamp and verifyLayout's refusal ------------


def test_r22b_tinyllama_ec2_refused_as_logged(tmp_path: Path) -> None:
    """Regression guard (passes). Published (2026-03-21, Ollama 0.18.2, t3.micro, no GPU, tinyllama): num_ctx 4096
    clamped to 2048 ("requested context size too large for model"), "model layers"=23, "model request too large for
    system" requested="615.4 MiB", "Load failed ... model requires more system memory (615.4 MiB) than is available
    (415.9 MiB)". API: ``layout.llama_server_load(legacy_model(header), [], version="0.18.2", num_ctx=4096,
    system_free_bytes=415.9 MiB, system_swap_bytes=0)`` over the logged shapes (Q4_0, q6_K output): the same
    clamp, 23 layers, 615.4 MiB and the same refusal text."""
    import gguf
    from tinymodels import write_tiny_gguf

    from kvadvise.backends.gguf_cache import read as read_header
    from kvadvise.backends.ollama import layout
    from kvadvise.backends.ollama.estimate_legacy import legacy_model

    pub = _doc("r22b-guolixin-ollama-0.18.2-ec2-cpu-tinyllama-refused.json")["published"]
    q = gguf.GGMLQuantizationType
    qtypes = {n: q.Q4_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                  "token_embd")}  # fmt: skip
    qtypes["output"] = q.Q6_K
    p = write_tiny_gguf(tmp_path / "tl.gguf", "llama", n_vocab=32000, n_ctx_train=2048, sparse=True, qtypes=qtypes,
                        dims={"n_layer": 22, "n_embd": 2048, "n_head": 32, "n_head_kv": 4, "head": 64, "n_ff": 5632})  # fmt: skip
    model = legacy_model(read_header(p))
    lay = layout.llama_server_load(model, [], version="0.18.2", num_ctx=pub["num_ctx_requested"], flash_attention="off")
    assert lay.num_ctx == pub["n_ctx_train"] and lay.total_layers == pub["model_layers"], lay.notes
    assert layout.human_bytes2(lay.total_bytes) == pub["requested"], lay.total_bytes
    with pytest.raises(layout.LayoutLoadRefused) as refused:
        layout.llama_server_load(model, [], version="0.18.2", num_ctx=pub["num_ctx_requested"], flash_attention="off",
                                 system_free_bytes=round(415.9 * MIB), system_swap_bytes=0,
                                 system_total_bytes=round(916.8 * MIB))  # fmt: skip
    assert pub["error"] in str(refused.value), str(refused.value)


# --- (7) llama3.2:3b under Ollama 0.30+ (llama-server): the GPU's model buffer Ollama parses -------------------------


def test_r22b_llama32_3b_gpu_model_buffer_as_ollama_parses_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINDING (weights, UNDER 0.57 %). Ollama 0.30+ takes a runner's VRAM from llama-server's buffer lines
    (v0.32.15:llm/llama_server.go memoryParsingWriter, VRAMByGPU); its own comment there quotes llama3.2:3b's:
    "MTL0_Mapped model buffer size = 1918.35 MiB", "ROCm0 model buffer size = 1918.35 MiB", "CPU_Mapped model buffer
    size = 308.23 MiB" (308.23 MiB is llama3.2:3b's q6_K token_embd, 128256 x 3072). Recomputed from llama.cpp's
    Q4_K_M rule (28 blocks; attn_v and ffn_down q6_K on 14 of them: 14 x 56,647,680 + 14 x 63,946,752 B) + the tied
    output (token_embd duplicated on the GPU, 323,205,120 B) + output_norm + rope_freqs = 2,011,539,712 B =
    1918.35 MiB: the same figure.

    Command: ``kvadvise ollama llama3.2:3b --ollama-version 0.32.15 --gpu m4-16gb --ctx 4096 --json``
    (memory.devices[0].weights_bytes). kvadvise: 2,000,000,000 B = 1907.35 MiB, 11.0 MiB under (host 308.23 MiB
    right). Missing rule: the profile's weights are ``download.bytes`` 2,000,000,000, the library page's rounded
    "2.0 GB", less the host's token_embd; the blob's tensors are 2,011,539,712 B (and the GPU holds the output
    copy besides): size the weights from the tensor types, not from the displayed size."""
    plan = _plan(capsys, monkeypatch, "llama3.2:3b", "--ollama-version", "0.32.15", "--gpu", "m4-16gb", "--ctx",
                 "4096", "--ram", "16GiB")  # fmt: skip
    m = plan["memory"]
    assert f"{m['host']['weights_bytes'] / MIB:.2f}" == "308.23"
    assert f"{m['devices'][0]['weights_bytes'] / MIB:.2f}" == "1918.35", m["devices"][0]["weights_bytes"]


@pytest.mark.parametrize("version", ["0.16.3", "0.17.4"])
def test_r22b_tinyllama_cpu_memory_lines(tmp_path: Path, version: str) -> None:
    """Regression guard (passes). A second published load of the same tinyllama blob (2026-03-27, Ollama 0.16.3 -
    0.17.4 by its source lines, no GPU, 23.8 GiB free, num_ctx 4096 clamped to 2048): "model weights" device=CPU
    "571.4 MiB", "kv cache" device=CPU "44.0 MiB", "total memory" "615.4 MiB". API as above: the same three lines."""
    import gguf
    from tinymodels import write_tiny_gguf

    from kvadvise.backends.gguf_cache import read as read_header
    from kvadvise.backends.ollama import layout
    from kvadvise.backends.ollama.estimate_legacy import legacy_model

    pub = _doc("r22b-guolixin-ollama-0.18.2-ec2-cpu-tinyllama-refused.json")["second_log"]["published"]
    q = gguf.GGMLQuantizationType
    qtypes = {n: q.Q4_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                  "token_embd")}  # fmt: skip
    qtypes["output"] = q.Q6_K
    p = write_tiny_gguf(tmp_path / "tl.gguf", "llama", n_vocab=32000, n_ctx_train=2048, sparse=True, qtypes=qtypes,
                        dims={"n_layer": 22, "n_embd": 2048, "n_head": 32, "n_head_kv": 4, "head": 64, "n_ff": 5632})  # fmt: skip
    lay = layout.llama_server_load(legacy_model(read_header(p)), [], version=version,
                                   num_ctx=pub["num_ctx_requested"], flash_attention="off")  # fmt: skip
    lines = lay.memory_lines()
    assert f'msg="model weights" device=CPU size="{pub["model_weights"]["CPU"]}"' in lines, lines
    assert f'msg="kv cache" device=CPU size="{pub["kv_cache"]["CPU"]}"' in lines, lines
    assert f'msg="total memory" size="{pub["total_memory"]}"' in lines, lines


# --- (8) gpt-oss:120b under llm/memory.go: three GPUs (0.11.5, ollama#11982) and a 64 GiB Strix Halo (0.11.10) -----

LEGACY = Path(__file__).resolve().parent / "data" / "published" / "ollama-legacy"
_GUARDED = ("layers.model", "layers.offload", "memory.available", "memory.gpu_overhead", "memory.required.kv",
            "memory.required.allocations", "memory.weights.nonrepeating", "memory.graph.full", "memory.graph.partial")  # fmt: skip
_WEIGHTS = ("memory.weights.repeating", "memory.weights.total", "memory.required.full", "memory.required.partial")


def _offload_fields(line: str) -> dict[str, str]:
    """A msg=offload line's key=value pairs (quoted values unquoted)."""
    return {k: v.strip('"') for k, v in re.findall(r'([a-z_.]+)=("[^"]*"|\S+)', line)}


def _legacy_pub(name: str) -> dict[str, Any]:
    pub: dict[str, Any] = json.loads((LEGACY / name).read_text())["published"]
    return pub


def _gpt_oss_120b_3gpu(free_gib: tuple[float, float, float]) -> dict[str, str]:
    from kvadvise.backends.ollama import decision
    from kvadvise.backends.ollama.estimate_legacy import LegacyGpu, estimate_gpu_layers
    from kvadvise.backends.ollama.resolve import resolve

    pub = _legacy_pub("r22b-ollama-11982-gptoss120b-3gpu-0.11.5.json")
    legacy = decision._legacy_model(resolve("gpt-oss:120b", use_api=False, use_registry=False, roots=[]))
    assert legacy is not None
    gpus = [LegacyGpu(free_bytes=round(f * GIB), total_bytes=(32 if f > 30 else 24) * GIB) for f in free_gib]
    e = estimate_gpu_layers(legacy, gpus, num_ctx=pub["num_ctx"], num_parallel=pub["num_parallel"], kv_cache_type="",
                            flash_attention=True, version=pub["version"], num_gpu=pub["num_gpu"])  # fmt: skip
    return _offload_fields(e.log_line())


_FREE_3GPU = [(23.1, 23.1, 31.4), (23.06, 23.06, 31.36), (23.14, 23.14, 31.44)]


@pytest.mark.parametrize("free_gib", _FREE_3GPU)
def test_r22b_gpt_oss_120b_three_gpus_layers_and_allocations(free_gib: tuple[float, float, float]) -> None:
    """Regression guard (passes). ollama#11982 (ka-admin, 2025-08-22, Ollama 0.11.5, three CUDA GPUs with 23.1,
    23.1 and 31.4 GiB available, gpt-oss:120b, num_ctx 75000, num_gpu 38, flash attention): 17 of 37 layers,
    4 + 4 + 9, allocations [22.6 22.6 31.2] GiB, kv 2.7 GiB, graph 13.7 GiB. API: ``estimate_gpu_layers(
    legacy gpt-oss:120b profile, 3 GPUs, num_ctx=75000, num_gpu=38, flash_attention=True, version="0.11.5")``:
    the same layers, split counts, allocations, kv and graph at every free memory the line can stand for."""
    pub = _offload_fields(_legacy_pub("r22b-ollama-11982-gptoss120b-3gpu-0.11.5.json")["line"])
    got = _gpt_oss_120b_3gpu(free_gib)
    for k in _GUARDED:
        assert got[k] == pub[k], (k, got[k], pub[k])
    assert re.findall(r"\d+", got["layers.split"]) == re.findall(r"\d+", pub["layers.split"]) == ["4", "4", "9"]


def test_r22b_gpt_oss_120b_offload_line_split_is_a_go_slice_from_0_11_5() -> None:
    """FINDING (the offload line's layers.split, format). ollama#11982 (0.11.5) prints layers.split="[4 4 9]" and the
    0.11.10 Strix Halo log layers.split=[37]: from v0.11.5 llm/memory.go MemoryEstimate.TensorSplit is ``[]int``
    (v0.11.4: ``string``, "" for one GPU, "11,11,11,11" for several), and slog prints the slice as Go does, "[4 4 9]"
    (quoted: it has spaces), "[37]" for one GPU. kvadvise (estimate_legacy LegacyEstimate.log_line) prints
    layers.split="4,4,9" and layers.split="" at every version. Missing rule: from 0.11.5 format the split as
    ``"[" + " ".join(counts) + "]"`` (one entry per GPU the estimate used), quoted only when it has a space."""
    pub_line = _legacy_pub("r22b-ollama-11982-gptoss120b-3gpu-0.11.5.json")["line"]
    got = _gpt_oss_120b_3gpu((23.1, 23.1, 31.4))
    assert got["layers.split"] == _offload_fields(pub_line)["layers.split"] == "[4 4 9]", got["layers.split"]


@pytest.mark.parametrize("field", _WEIGHTS)
def test_r22b_gpt_oss_120b_three_gpus_weights(field: str) -> None:
    """FINDING (weights, UNDER about 0.1 GiB, 0.2 %). The same line: memory.weights.repeating "58.6 GiB", total
    "59.7 GiB", required.full "109.9 GiB", required.partial "76.5 GiB". kvadvise (same API call): "58.5 GiB",
    "59.6 GiB", "109.8 GiB", "76.4 GiB": its gpt-oss:120b blocks are at least 0.05 GiB short, and every total that
    sums them too (the layer count is not changed here). The 0.11.10 log below prints the same 58.6 / 59.7 GiB.
    Missing rule: as for gpt-oss:20b (tests/test_attack_round20b.py, held there): Ollama's gpt-oss blobs keep the
    experts' biases (and other small tensors) in f32 where the profile counts them at BF16 (round 20b's note cites
    ollama#16416: the gpt-oss:120b blob has 433 f32 tensors, 12 per block + output_norm; not re-checked here)."""
    pub = _offload_fields(_legacy_pub("r22b-ollama-11982-gptoss120b-3gpu-0.11.5.json")["line"])
    got = _gpt_oss_120b_3gpu((23.1, 23.1, 31.4))
    assert got[field] == pub[field], (field, got[field], pub[field])


def _strix(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, free: str) -> dict[str, str]:
    pub = _legacy_pub("r22b-strixhalo-gptoss120b-rocm-0.11.10.json")
    plan = _plan(capsys, monkeypatch, "gpt-oss:120b", "--ollama-version", pub["version"], "--device", "rocm",
                 "--vram", free, "--ctx", str(pub["num_ctx"]), "--ram", "59GiB")  # fmt: skip
    dec = plan["ollama"]["decision"]
    assert dec is not None, plan["ollama"]["release"]
    return _offload_fields(dec["log_line"])


@pytest.mark.parametrize("free", ["63.76GiB", "63.8GiB", "63.84GiB"])
def test_r22b_gpt_oss_120b_strix_halo_0_11_10_layers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, free: str
) -> None:
    """Regression guard (passes). Ollama 0.11.10 on a Strix Halo (ROCm gfx1151, 63.8 GiB available), gpt-oss:120b,
    OLLAMA_CONTEXT_LENGTH=4096 (run at 8192), flash attention (the model wants it): 37 of 37 layers, kv 450.0 MiB,
    graph 122.0 MiB, nonrepeating 1.1 GiB. Command: ``kvadvise ollama gpt-oss:120b --ollama-version 0.11.10
    --device rocm --vram 63.8GiB --ctx 4096 --json``: the same fields."""
    pub = _offload_fields(_legacy_pub("r22b-strixhalo-gptoss120b-rocm-0.11.10.json")["line"])
    got = _strix(capsys, monkeypatch, free)
    for k in _GUARDED:
        if k != "memory.required.allocations":
            assert got[k] == pub[k], (k, got[k], pub[k])


@pytest.mark.xfail(
    strict=True,
    reason="held: 0.1 GiB under on required (62.3 vs 62.4 GiB) where the three-GPU log of 0.11.5 is matched: the "
    "experts' biases at BF16 (Ollama's conversion) fit #11982's blob; this later load's blob holds about 0.1 GiB more "
    "(test_attack_round20b's gpt-oss lines alike)",
)
def test_r22b_gpt_oss_120b_strix_halo_0_11_10_weights_and_split(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINDING (weights UNDER 0.1 GiB; split format). Same load. kvadvise's line: layers.split="",
    memory.required.full="62.3 GiB", memory.required.allocations="[62.3 GiB]", memory.weights.total="59.6 GiB",
    repeating "58.5 GiB". True: layers.split=[37], "62.4 GiB", "[62.4 GiB]", "59.7 GiB", "58.6 GiB". Missing rules:
    the two above (f32 tensors of Ollama's gpt-oss blob; TensorSplit printed as a Go []int from 0.11.5)."""
    pub = _offload_fields(_legacy_pub("r22b-strixhalo-gptoss120b-rocm-0.11.10.json")["line"])
    got = _strix(capsys, monkeypatch, "63.8GiB")
    bad = {k: (got[k], pub[k]) for k in (*_WEIGHTS, "memory.required.allocations", "layers.split") if got[k] != pub[k]}
    assert not bad, bad
