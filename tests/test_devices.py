"""Several devices, proved on real llama.cpp: rpc-server processes on loopback are devices that
llama-server splits layers over as over several GPUs (same scheduler, same buffers). Per device
the weights and KV must equal kvadvise's prediction, the compute buffers within 5 % or 8 MiB, and
the host's compute buffer too. One device tells the device/host split of a GPU run apart.

The table of every run is printed at the end of the session by tests/conftest.py (and written to
build/devices-report.md).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rpc_devices import REPORT, devices, run_server
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner import builds
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate
from kvadvise.runtime.llamalog import parse

pytestmark = pytest.mark.llama
MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def rpc_server(real_llama_server: Path) -> Path:
    from llama_server_build import rpc_server as built

    path = built()
    if not path.exists():
        pytest.skip(f"no rpc-server beside {real_llama_server}")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("device-models")
    out = {r: write_tiny_gguf(d / f"{r}.gguf", r, n_vocab=32000) for r in ("llama", "qwen3moe", "gemma3")}
    out["gemma-3-270m"] = gemma_path
    return out


@pytest.fixture(scope="module")
def three(rpc_server: Path) -> Iterator[list[str]]:
    with devices(rpc_server, 3) as eps:
        yield eps


def _check(label: str, model: Path, cfg: RunConfig, log: str, endpoints: list[str]) -> None:
    got = parse(log.splitlines())
    assert "compute buffer size" in log, log[-3000:]
    spec = kvadvise.load_model(str(model))
    est: MemoryEstimate = estimate(spec, cfg)

    def mib(buft: str, kind: str) -> float:
        return sum(b.mib for b in got.buffers if b.buft == buft and b.kind == kind)

    # a device is named after its endpoint (RPC<n>[host:port], n its index on that server), in the order
    # --rpc lists them;
    # a device that gets no layer prints no buffer, and is predicted empty
    names = [next((b.buft for b in got.buffers if b.buft.endswith(f"[{ep}]")), f"RPC[{ep}]") for ep in endpoints]
    for name, d in zip(names, est.devices, strict=True):
        assert mib(name, "model") == pytest.approx(d.weights_bytes / MIB, abs=0.01), (label, name)
        assert mib(name, "KV") == pytest.approx(d.kv_bytes / MIB, abs=0.01), (label, name)
        compute = mib(name, "compute")
        assert abs(compute - d.compute_bytes / MIB) <= max(8.0, 0.05 * compute), (label, name, compute)
        REPORT.append(
            f"| {label} | {name.replace('127.0.0.1', '')} | {mib(name, 'model'):.2f} / {d.weights_bytes / MIB:.2f} "
            f"| {mib(name, 'KV'):.2f} / {d.kv_bytes / MIB:.2f} | {compute:.2f} / {d.compute_bytes / MIB:.2f} |"
        )
    host = mib("CPU", "compute")
    assert abs(host - est.host.compute_bytes / MIB) <= max(8.0, 0.05 * host), (label, host)
    assert mib("CPU_Mapped", "model") == pytest.approx(est.host.weights_bytes / MIB, abs=0.01)
    REPORT.append(f"| {label} | host | | | {host:.2f} / {est.host.compute_bytes / MIB:.2f} |")


CASES = [  # (model, n_devices, -ts, -fa, -np)
    ("gemma-3-270m", 1, "", "on", 1),
    ("gemma-3-270m", 1, "", "off", 1),
    ("llama", 1, "", "off", 4),
    ("gemma-3-270m", 2, "1,1", "on", 1),
    ("gemma-3-270m", 2, "3,1", "off", 4),
    ("gemma3", 2, "1,1", "on", 1),
    ("gemma3", 2, "3,1", "off", 1),
    ("qwen3moe", 2, "1,1", "on", 4),
    ("llama", 2, "1,3", "off", 1),
    ("gemma-3-270m", 3, "1,1,1", "on", 4),
    ("gemma3", 3, "1,2,1", "off", 1),
    ("qwen3moe", 3, "2,1,1", "off", 1),
]


@pytest.mark.parametrize(("model", "n_dev", "ts", "fa", "np_"), CASES)
def test_split_over_devices_as_predicted(
    model: str,
    n_dev: int,
    ts: str,
    fa: str,
    np_: int,
    three: list[str],
    models: dict[str, Path],
    real_llama_server: Path,
) -> None:
    n_ctx = 8192
    args = ["-c", str(n_ctx), "-fa", fa, "-np", str(np_), "-ngl", "99"] + (["-ts", ts] if ts else [])
    log = run_server(real_llama_server, models[model], args, three[:n_dev])
    split = tuple(float(x) for x in ts.split(",")) if ts else ()
    cfg = RunConfig(n_ctx=n_ctx, n_parallel=np_, flash_attn=fa, device="rpc", tensor_split=split)
    _check(f"{model} {n_dev} dev -ts {ts or '-'} -fa {fa} -np {np_}", models[model], cfg, log, three[:n_dev])
    if n_dev > 1:
        assert re.search(r"pipeline parallelism enabled", log)  # the copies the model counts


NO_PIPELINE_CASES = [  # (model, n_devices, -ts, -fa)
    ("llama", 2, "1,1", "off"),
    ("llama", 3, "1,1,1", "on"),
    ("gemma3", 2, "3,1", "on"),
    ("qwen3moe", 3, "2,1,1", "off"),
]


@pytest.mark.parametrize(("model", "n_dev", "ts", "fa"), NO_PIPELINE_CASES)
def test_split_without_pipeline_parallelism_as_predicted(
    model: str, n_dev: int, ts: str, fa: str, three: list[str], models: dict[str, Path], real_llama_server: Path
) -> None:
    """A tensor override turns pipeline parallelism off (llama_context: has_tensor_overrides), as an RPC device
    without events did before builds.RPC_EVENTS: the plan for b10454 (the same rules for RPC devices but that one)
    is what b11312 allocates with an override that matches no tensor."""
    n_ctx = 8192
    args = ["-c", str(n_ctx), "-fa", fa, "-np", "1", "-ngl", "99", "-ts", ts, "-ot", r"no_such_tensor\.weight=CPU"]
    log = run_server(real_llama_server, models[model], args, three[:n_dev])
    assert "pipeline parallelism enabled" not in log
    split = tuple(float(x) for x in ts.split(","))
    cfg = RunConfig(n_ctx=n_ctx, flash_attn=fa, device="rpc", tensor_split=split, llama_build=builds.RPC_EVENTS - 1)
    _check(f"{model} {n_dev} dev -ts {ts} -fa {fa} no pipeline", models[model], cfg, log, three[:n_dev])
    # and with pipeline parallelism the same split keeps four copies of its inputs: more on every device
    with_pp = estimate(kvadvise.load_model(str(models[model])), replace(cfg, llama_build=builds.REFERENCE))
    without = estimate(kvadvise.load_model(str(models[model])), cfg)
    assert all(a.compute_bytes >= b.compute_bytes for a, b in zip(with_pp.devices, without.devices, strict=True))


@pytest.mark.parametrize(
    ("first", "split"),
    [
        ("2GiB", "2,6"),  # by free memory
        # 36 MiB left after the margin: by free memory its 3 layers (39 MiB) would not fit, so the layers are
        # filled back to front as llama.cpp's --fit fills them: all 19 on the second host (planner/fitsplit.py)
        ("1060MiB", "0,19"),
    ],
)
def test_cli_plan_over_rpc_hosts_is_what_llama_server_allocates(
    first: str,
    split: str,
    three: list[str],
    models: dict[str, Path],
    real_llama_server: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvadvise llamacpp MODEL --rpc HOST:PORT=SIZE ...` plans the hosts as llama.cpp's devices; its
    llama-server command, run over those rpc-servers, allocates what the JSON says, device by device."""
    import json
    import shlex

    from kvadvise.cli import main

    a, b = three[:2]
    argv = ["llamacpp", str(models["gemma-3-270m"]), "--rpc", f"{a}={first}", "--rpc", f"{b}=6GiB", "--ctx", "8192"]
    assert main([*argv, "-fa", "on", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cmd = shlex.split(doc["llama_server"]["command"])
    assert cmd[cmd.index("--rpc") + 1] == f"{a},{b}" and cmd[cmd.index("-ts") + 1] == split
    args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
    got = parse(run_server(real_llama_server, models["gemma-3-270m"], args, [a, b]).splitlines())
    for d in doc["memory"]["devices"]:
        mib = {k: sum(x.mib for x in got.buffers if x.buft == d["name"] and x.kind == k) for k in ("model", "KV")}
        assert mib["model"] == pytest.approx(d["weights_bytes"] / MIB, abs=0.01), d["name"]
        assert mib["KV"] == pytest.approx(d["kv_bytes"] / MIB, abs=0.01), d["name"]
        compute = sum(x.mib for x in got.buffers if x.buft == d["name"] and x.kind == "compute")
        assert abs(compute - d["compute_bytes"] / MIB) <= max(8.0, 0.05 * compute), d["name"]


# benchmarks/bench_split.py, a few cases: real-size shapes (sparse GGUFs: the header only), each device's compute
# buffer against llama.cpp's no-allocation reserve over loopback rpc-servers (llama-fit-params: the whole batch's
# logits; llama-server's -fit pass: one row). Each was under the bar before the split was planned by the
# single-device rules on each device's layers (kvadvise.planner.split.split_compute): by how much, in MiB; the
# host's compute buffer (the graph inputs in 4 copies) within the same bar.
SPARSE_CASES = [  # (bench_split model, -ts, -fa, n_ctx, outputs)
    ("qwen3-0.6b", "1,1,1", "off", 4096, "batch"),  # V row indices and two hidden-state rows copied in: 22 under
    ("deepseek-v2-lite", "1,1,1", "on", 4096, "batch"),  # MLA: 24.5 under (36 over with the single device's holes)
    ("gpt-oss-20b", "1,1,1", "on", 4096, "batch"),  # MoE, SWA beside full attention: 22.3 under
    ("gemma-3-12b", "1,1,1", "off", 4096, "batch"),  # SWA, f32 masks, two V row indices: 86.5 under, the host 32
    ("qwen1.5-moe-a2.7b", "1,1", "off", 4096, "1 row"),  # a shared expert as wide as the routed ones: 56 under
    ("granite-4.0-h-tiny", "1,1", "on", 4096, "1 row"),  # two Mamba-2 layers at the boundary: 57 under
    ("qwen3.5-35b-a3b", "1,1,1", "off", 4096, "batch"),  # gated delta net, MoE with a shared expert: 32 under
]


@pytest.mark.parametrize(("name", "ts", "fa", "n_ctx", "outputs"), SPARSE_CASES)
def test_real_size_split_within_the_bar(
    name: str, ts: str, fa: str, n_ctx: int, outputs: str, three: list[str], tmp_path: Path
) -> None:
    from bench_split import MODELS, OUTPUTS, fit_params_pass, server_fit_pass

    (recipe, dims, vocab) = next((r, d, v) for n, r, d, v in MODELS if n == name)
    path = write_tiny_gguf(tmp_path / f"{name}.gguf", recipe, n_vocab=vocab, n_ctx_train=262144, dims=dims, sparse=True)
    split = tuple(float(x) for x in ts.split(","))
    cfg = RunConfig(n_ctx=n_ctx, flash_attn=fa, runtime=OUTPUTS[outputs], tensor_split=split)
    if outputs == "batch":
        measured = fit_params_pass(path, cfg, three[: len(split)])
    else:
        measured = server_fit_pass(path, cfg, len(split))
    est = estimate(from_gguf(read_file(path)), replace(cfg, device="rpc"))
    for d, dev in enumerate(est.devices):
        planned = dev.compute_bytes / MIB
        assert abs(planned - measured[d]) <= max(8.0, 0.05 * measured[d]), (name, ts, d, planned, measured[d])
        REPORT.append(f"| {name} -ts {ts} -fa {fa} {outputs} (sparse) | {d} | | | {measured[d]:.2f} / {planned:.2f} |")
    host = est.host.compute_bytes / MIB  # the graph inputs' copies (the last figure llama.cpp prints: CPU)
    assert abs(host - measured[-1]) <= max(8.0, 0.05 * measured[-1]), (name, ts, "host", host, measured[-1])


def test_rpc_port_with_leading_zeros_is_the_device_llama_server_names(
    three: list[str], models: dict[str, Path], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp reads an --rpc port with std::stoi (ggml-rpc.cpp parse_endpoint): 0PORT is PORT, and the
    device is named by the endpoint's text. kvadvise plans it, keeps the text in its command, and the
    buffers llama-server allocates over that endpoint carry the device name the plan gives."""
    import json
    import shlex

    from kvadvise.cli import main

    host, port = three[0].split(":")
    endpoint = f"{host}:0{port}"
    assert main(["llamacpp", str(models["gemma-3-270m"]), "--rpc", f"{endpoint}=4GiB", "--ctx", "4096", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cmd = shlex.split(doc["llama_server"]["command"])
    assert cmd[cmd.index("--rpc") + 1] == endpoint
    assert [d["name"] for d in doc["memory"]["devices"]] == [f"RPC0[{endpoint}]"]
    args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
    got = parse(run_server(real_llama_server, models["gemma-3-270m"], args, [endpoint]).splitlines())
    device = doc["memory"]["devices"][0]
    model_mib = sum(x.mib for x in got.buffers if x.buft == f"RPC0[{endpoint}]" and x.kind == "model")
    assert model_mib == pytest.approx(device["weights_bytes"] / MIB, abs=0.01)
