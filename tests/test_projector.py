"""A vision projector (``--mmproj``) on real llama.cpp: tiny random-weight SigLIP / Gemma 3 projectors
(tests/tinymmproj.py) beside a tiny Gemma 3 text model, on an RPC device on loopback (the projector
goes to the first GPU-type device, as on a machine with a GPU) and on the CPU alone.

Measured: the projector's weights buffer on the device (the rpc-server's own allocation log,
GGML_RPC_DEBUG: the buffers a run with --mmproj allocates beyond the same run without it), and the
compute buffers mtmd prints (``reserve_compute_meta: ... compute buffer size``). kvadvise's weights are
exact; its compute figure is an estimate of the largest live set, which these configurations pin down.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from rpc_devices import devices, run_server
from tinymmproj import write_tiny_mmproj
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.model.gguf import read_file
from kvadvise.model.projector import projector_from_gguf
from kvadvise.planner.memory import RunConfig, estimate

pytestmark = pytest.mark.llama
MIB = 1 << 20
PRINTED = MIB // 200 + 1  # llama.cpp prints MiB with 2 decimals
# (image side, patch, n_embd, n_ff, n_head, pooling): from 64 to 4,096 patches
CONFIGS = {
    "p64": dict(image_size=64, patch_size=8, n_embd=64, n_ff=128, n_head=4, pool=2),
    "p256": dict(image_size=224, patch_size=14, n_embd=128, n_ff=512, n_head=4, pool=4),
    "p1024": dict(image_size=448, patch_size=14, n_embd=192, n_ff=768, n_head=6, pool=4),
    "p4096": dict(image_size=896, patch_size=14, n_embd=256, n_ff=1024, n_head=8, pool=4),
}
_CLIP_COMPUTE = re.compile(r"reserve_compute_meta:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_ALLOC = re.compile(r"\[alloc_buffer\] device: \d+, size: (\d+) ")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("projector")
    out = {"text": write_tiny_gguf(d / "gemma3.gguf", "gemma3", n_vocab=32000)}
    for name, c in CONFIGS.items():
        out[name] = write_tiny_mmproj(d / f"mmproj-{name}.gguf", n_embd_text=128, **c)
    return out


@pytest.fixture(scope="module")
def rpc_device(real_llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from llama_server_build import rpc_server

    logs = tmp_path_factory.mktemp("rpc-logs")
    with devices(rpc_server(), 1, debug_logs=logs) as eps:
        yield eps[0], logs / "rpc-0.log"


def _allocs(server: Path, model: Path, args: list[str], endpoint: str, log: Path) -> tuple[str, Counter[int]]:
    """The llama-server log, and the sizes of the buffers the rpc-server allocated for that run."""
    start = log.stat().st_size
    text = run_server(server, model, args, [endpoint])
    with open(log, "rb") as f:
        f.seek(start)
        sizes = Counter(int(m) for m in _ALLOC.findall(f.read().decode(errors="replace")))
    return text, sizes


@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_projector_on_a_device(
    name: str, fa: str, files: dict[str, Path], rpc_device: tuple[str, Path], real_llama_server: Path
) -> None:
    endpoint, log = rpc_device
    args = ["-c", "1024", "-np", "1", "-ngl", "99", "-fa", fa]
    _, without = _allocs(real_llama_server, files["text"], args, endpoint, log)
    text, with_mm = _allocs(real_llama_server, files["text"], [*args, "--mmproj", str(files[name])], endpoint, log)
    assert f"CLIP using RPC0[{endpoint}] backend" in text, text[-3000:]
    printed = dict(_CLIP_COMPUTE.findall(text))
    device_mib, host_mib = float(printed[f"RPC0[{endpoint}]"]), float(printed["CPU"])

    spec = kvadvise.load_model(str(files["text"]))
    proj = projector_from_gguf(read_file(files[name]))
    est = estimate(spec, RunConfig(n_ctx=1024, device="rpc", flash_attn=fa, mmproj=proj))
    p = est.projector
    assert p is not None
    # the device gets two more buffers: the projector's weights (exact) and its compute buffer
    extra = sorted((with_mm - without).elements())
    assert len(extra) == 2 and p.weights_bytes in extra, (name, fa, extra, p.weights_bytes)
    measured_compute = next(x for x in extra if x != p.weights_bytes) if extra[0] != extra[1] else extra[0]
    assert measured_compute / MIB == pytest.approx(device_mib, abs=0.01)
    assert abs(measured_compute - p.compute_bytes) <= max(PRINTED, 0.02 * measured_compute), (name, fa)
    assert abs(host_mib * MIB - p.host_compute_bytes) <= PRINTED, (name, fa, host_mib)
    assert est.devices[0].projector_bytes == p.weights_bytes + p.compute_bytes
    assert est.host.projector_bytes == p.host_compute_bytes
    print(
        f"{name} fa={fa}: device buffers {extra} B, weights predicted {p.weights_bytes:,} B, compute "
        f"{measured_compute / MIB:.2f} MiB / predicted {p.compute_bytes / MIB:.2f}, CPU {host_mib:.2f} / "
        f"{p.host_compute_bytes / MIB:.2f}"
    )


@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("name", ["p256", "p4096"])
def test_projector_on_the_cpu(name: str, fa: str, files: dict[str, Path], real_llama_server: Path) -> None:
    args = ["-c", "1024", "-np", "1", "-ngl", "0", "-fa", fa, "--mmproj", str(files[name])]
    text = run_server(real_llama_server, files["text"], args, [])
    assert "CLIP using CPU backend" in text, text[-3000:]
    printed = dict(_CLIP_COMPUTE.findall(text))
    spec = kvadvise.load_model(str(files["text"]))
    proj = projector_from_gguf(read_file(files[name]))
    est = estimate(spec, RunConfig(n_ctx=1024, device="cpu", flash_attn=fa, mmproj=proj, cpu_repack="none"))
    assert est.projector is not None and est.host.projector_bytes == 0
    measured = float(printed["CPU"]) * MIB
    assert abs(measured - est.projector.compute_bytes) <= max(PRINTED, 0.02 * measured), (name, fa)
    # clip_model_loader prints the sum of the tensors' sizes: the CPU buffer adds only 32-byte padding
    size = re.search(r"load_hparams: model size:\s+([\d.]+) MiB", text)
    assert size is not None and abs(float(size[1]) * MIB - est.projector.weights_bytes) <= PRINTED + 32 * len(
        proj.tensors
    )


def test_cli_command_with_a_projector_runs_as_planned(
    files: dict[str, Path], rpc_device: tuple[str, Path], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp MODEL --mmproj FILE --rpc HOST:PORT=SIZE`: the command loads the projector, and
    run over that rpc-server its buffers are the JSON's memory.projector, on the first device."""
    import json
    import shlex

    from kvadvise.cli import main

    endpoint, _ = rpc_device
    argv = ["llamacpp", str(files["text"]), "--mmproj", str(files["p1024"]), "--rpc", f"{endpoint}=2GiB"]
    assert main([*argv, "--ctx", "1024", "-fa", "on", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cmd = shlex.split(doc["llama_server"]["command"])
    assert cmd[cmd.index("--mmproj") + 1] == str(files["p1024"])
    assert doc["llama_server"]["env"]["LLAMA_ARG_MMPROJ"] == str(files["p1024"])
    args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
    printed = dict(_CLIP_COMPUTE.findall(run_server(real_llama_server, files["text"], args, [endpoint])))
    p, (dev,) = doc["memory"]["projector"], doc["memory"]["devices"]
    assert float(printed[dev["name"]]) == pytest.approx(p["compute_bytes"] / MIB, abs=0.01)
    assert float(printed["CPU"]) == pytest.approx(p["host_compute_bytes"] / MIB, abs=0.01)
    assert dev["projector_bytes"] == p["weights_bytes"] + p["compute_bytes"]
    assert "estimate" in p["compute_note"] and p["projector_type"] == "gemma3"
