"""Where the output layer goes at a partial offload, by llama.cpp build (kvadvise.planner.builds.OUTPUT_FIRST).

Before ggml-org/llama.cpp#18148 ``llama_model::load_tensors`` started the GPU layers at ``n_layer - n_gpu_layers``:
``-ngl N`` offloaded the last N blocks and the output layer only with every block (N = n_layer + 1). At a partial
offload output.weight stays in host memory, and for a prompt batch of 32 rows or more the first device op-offloads
its matmul with a copy of it in the compute buffer, beside the logits and the normed hidden state. Six published
logs print that buffer to the 0.01 MiB (tests/data/published 020, 021, 032, 036, 037, 038: CUDA under Ollama's
llamarunner, Vulkan, ROCm). Since #18148 the output layer is offloaded first (b11312: ``n_layer_all + 1 -
n_gpu_layers``), which is what the tests' llama-server does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ollama_fake import closed_port_url
from published_logs import LOGS, compare
from tinymodels import write_tiny_gguf

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import read_file
from kvadvise.planner import builds
from kvadvise.planner.memory import RunConfig, estimate

MIB = 1 << 20
# qwen2.5-coder:7b's shape (coder_gguf, tied embeddings: llama.cpp loads token_embd a second time as output.weight):
# f16 of 152,064 x 3,584; 512 rows of logits; one row of n_embd
OUTPUT_F16 = 152064 * 3584 * 2
LOGITS_512 = 4 * 512 * 152064
ROW_512 = 4 * 512 * 3584


@pytest.fixture(scope="module")
def coder_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """qwen2.5-coder:7b's shape (as conftest's coder_files, without the Ollama store, whose blob digest reads the
    14 GB sparse file into memory)."""
    dims = {"n_layer": 28, "n_embd": 3584, "n_head": 28, "n_head_kv": 4, "n_ff": 18944}
    path = tmp_path_factory.mktemp("coder") / "coder.gguf"
    return write_tiny_gguf(path, "qwen2", n_vocab=152064, n_ctx_train=32768, dims=dims, sparse=True)


def _offload(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    """The plan JSON's partial offload for a command (no Ollama server: a closed port)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OLLAMA_HOST", closed_port_url())
        rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    off = json.loads(out).get("offload") if rc == 0 and out else None
    assert isinstance(off, dict), err
    return off


@pytest.mark.parametrize("log", [log for log in LOGS if log.run.output_on_host], ids=lambda log: log.id)
def test_the_published_device_buffers_of_a_host_output_layer(log: object) -> None:
    """Every published log with the output layer in host memory: its device compute buffer as printed."""
    rows = [r for r in compare(log) if r.kind == "compute" and not r.buffer.endswith(("_Host", "CPU"))]  # type: ignore[arg-type]
    assert rows and all(r.ok for r in rows), [(r.buffer, r.published_mib, round(r.predicted_mib, 2)) for r in rows]


def test_the_copy_sits_beside_the_logits_not_in_a_layer(coder_gguf: Path) -> None:
    """qwen2.5-coder:7b's shape at 8k, q8_0, flash attention, b7000: the first device's compute buffer is the copy of
    output.weight + 512 rows of logits + one row of n_embd (the layer phase is far smaller); the output layer's
    weights leave the device for the host; an RPC device does not op-offload, so its buffer keeps the full offload's."""
    gguf = coder_gguf
    spec = from_gguf(read_file(gguf))
    assert spec.output_bytes == 0 and spec.tok_embd_bytes == OUTPUT_F16
    cfg = RunConfig(
        n_ctx=8192, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0, flash_attn="on", device="cuda", llama_build=7000
    )
    full, out = estimate(spec, cfg), estimate(spec, RunConfig(**{**_fields(cfg), "output_on_host": True}))
    assert out.devices[0].compute_bytes == OUTPUT_F16 + LOGITS_512 + ROW_512  # 1,343.5 MiB, a multiple of 128
    assert full.devices[0].compute_bytes < out.devices[0].compute_bytes // 4
    assert full.devices[0].weights_bytes - out.devices[0].weights_bytes >= OUTPUT_F16
    assert 0 < out.host.weights_bytes - full.host.weights_bytes < MIB  # tied: token_embd itself (and output_norm)
    assert out.devices[0].n_layers == full.devices[0].n_layers - 1
    rpc = RunConfig(**{**_fields(cfg), "device": "rpc"})
    rpc_out = estimate(spec, RunConfig(**{**_fields(rpc), "output_on_host": True}))
    assert rpc_out.devices[0].compute_bytes == estimate(spec, rpc).devices[0].compute_bytes


def _fields(cfg: RunConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def test_a_partial_plan_for_an_older_build_keeps_the_output_layer_on_the_cpu(
    coder_gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same partial plan (8 GiB, 32k) at b11312 and at b7000: -ngl counts the output layer in the first and
    blocks only in the second, where output.weight is in RAM and its copy in the GPU's compute buffer."""
    gguf = coder_gguf
    args = ("gguf", str(gguf), "--vram", "8GiB", "-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "--ram", "64GiB")
    new = _offload(capsys, *args, "--llama-build", f"b{builds.REFERENCE}")
    old = _offload(capsys, *args, "--llama-build", "b7000")
    assert new["n_gpu_layers"] == 29 - new["n_cpu_layers"]
    assert old["n_gpu_layers"] == 28 - old["n_cpu_layers"]
    # 1,343.5 MiB at the output layer against the full offload's 382 (ggml-alloc's replay of b7000's graph, which
    # no backend reordered on CUDA: the logits above the f32 mask's hole, as published 045 printed it at 32k): the
    # copy, the logits, one row
    assert old["op_offload_bytes"] == OUTPUT_F16 + LOGITS_512 + ROW_512 - 400_568_320  # 382.01 MiB
    assert "offloads the output layer last" in str(old["note"]) and "output layer last" not in str(new["note"])
    assert "reads the tied token_embd" in str(old["note"])  # the output matmul reads token_embd, already in RAM


def test_ollama_llamarunner_places_the_output_layer_last_its_go_engine_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ollama 0.13.5 vendors ec98e2002 (before #18148): a qwen2 model runs on the llamarunner, which passes a layer
    count to that llama.cpp; Ollama 0.30 runs llama-server b9452 (after it). qwen2.5:7b's output.weight is Q6_K
    (the profile's), so the copy grows the compute buffer to 730.36 MiB, as the published 020 printed it: 348.35 above
    the full offload's 382.01 (ggml-alloc's replay of ec98e2002's graph, which CUDA did not reorder)."""
    args = ("ollama", "qwen2.5-coder:7b", "--vram", "5GiB", "--ram", "64GiB", "-c", "32768")
    old = _offload(capsys, *args, "--ollama-version", "0.13.5")
    new = _offload(capsys, *args, "--ollama-version", "0.30.0")
    assert old["n_gpu_layers"] == 28 - old["n_cpu_layers"] and new["n_gpu_layers"] == 29 - new["n_cpu_layers"]
    assert round(int(old["op_offload_bytes"]) / MIB, 2) == 348.35  # type: ignore[call-overload]


def test_a_tied_output_layer_on_the_host_is_token_embd_itself(
    coder_gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tied model's output layer is token_embd loaded again (TENSOR_DUPLICATED); on the buffer type that already
    holds token_embd, llama_model::load_tensors's create_tensor returns that tensor (llama-model.cpp: "if duplicated,
    check if the original tensor was allocated in the same buffer type context"), so an output layer left on the CPU
    adds output_norm to host memory, not a second token_embd; the GPU still drops its copy."""
    gguf = coder_gguf
    spec = from_gguf(read_file(gguf))
    cfg = RunConfig(n_ctx=8192, device="cuda", llama_build=7000)
    full, out = estimate(spec, cfg), estimate(spec, RunConfig(**{**_fields(cfg), "output_on_host": True}))
    assert 0 < out.host.weights_bytes - full.host.weights_bytes < MIB  # output_norm
    assert full.devices[0].weights_bytes - out.devices[0].weights_bytes >= OUTPUT_F16
    # the same partial plan at b11312 and b7000 keeps 17 blocks on the CPU: the same weights in RAM
    args = ("gguf", str(gguf), "--vram", "8GiB", "-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "--ram", "64GiB")
    new = _offload(capsys, *args, "--llama-build", f"b{builds.REFERENCE}")
    old = _offload(capsys, *args, "--llama-build", "b7000")
    assert new["n_cpu_layers"] == old["n_cpu_layers"] == 17
    # the same blocks and output_norm (the builds' host compute buffers differ by tens of MiB): no second token_embd
    assert abs(int(old["host_bytes"]) - int(new["host_bytes"])) < 64 * MIB  # type: ignore[call-overload]
