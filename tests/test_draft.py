"""A draft model for speculative decoding (``-md``) on real llama.cpp: llama-server creates a second
context for it (common/speculative.cpp, common_speculative_init_result), and kvadvise predicts its
buffers device by device as that second context (kvadvise.planner.memory.draft_config): weights, KV
and output exact, compute within the suite's bar. Tiny random-weight models with the same vocabulary
(tests/tinymodels.py: a Gemma 3 target, a llama draft), on the CPU and over RPC devices on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rpc_devices import devices, run_server
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.model.ggml import cache_type
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate
from kvadvise.planner.repack import cpu_isa
from kvadvise.runtime.llamalog import LoadLog, parse

pytestmark = pytest.mark.llama
MIB = 1 << 20
MARKER = "common_speculative_init_result: loading draft model"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("draft")
    return (
        write_tiny_gguf(d / "target.gguf", "gemma3", n_vocab=32000),
        write_tiny_gguf(d / "draft.gguf", "llama", n_vocab=32000, seed=1),
    )


def _mib(log: LoadLog, buft: str, kind: str) -> float:
    """One buffer type's printed size; on the CPU alone the weights are CPU_Mapped (and CPU_REPACK)."""
    bufts = ("CPU_Mapped", "CPU_REPACK") if (buft, kind) == ("CPU", "model") else (buft,)
    return sum(b.mib for b in log.buffers if b.buft in bufts and b.kind == kind)


def _check(label: str, log: LoadLog, est: MemoryEstimate, names: list[str]) -> None:
    """Each device's model, KV and compute buffers, and the host's, against one context's estimate."""
    for name, d in zip(names, est.devices, strict=True):
        assert _mib(log, name, "model") == pytest.approx(d.weights_bytes / MIB, abs=0.01), (label, name)
        assert _mib(log, name, "KV") == pytest.approx(d.kv_bytes / MIB, abs=0.01), (label, name)
        got = _mib(log, name, "compute")
        assert abs(got - d.compute_bytes / MIB) <= max(8.0, 0.05 * got), (label, name, got, d.compute_bytes / MIB)
        print(
            f"{label} {name.split('[')[0]}: model {_mib(log, name, 'model'):.2f}/{d.weights_bytes / MIB:.2f} "
            f"KV {_mib(log, name, 'KV'):.2f}/{d.kv_bytes / MIB:.2f} compute {got:.2f}/{d.compute_bytes / MIB:.2f}"
        )
    assert _mib(log, "CPU", "output") == pytest.approx(est.output_bytes / MIB, abs=0.01), label
    if est.layout.device != "cpu":
        assert _mib(log, "CPU_Mapped", "model") == pytest.approx(est.host.weights_bytes / MIB, abs=0.01), label
        host = _mib(log, "CPU", "compute")
        assert abs(host - est.host.compute_bytes / MIB) <= max(8.0, 0.05 * host), (label, host)


@pytest.mark.parametrize(
    ("n_dev", "args"),
    [
        (0, ("-c", "3000", "-np", "1", "-fa", "on")),
        (0, ("-c", "4096", "-np", "2", "-fa", "off", "-ctkd", "q8_0")),
        (1, ("-c", "3000", "-np", "2", "-fa", "on")),
        (1, ("-c", "8192", "-np", "1", "-fa", "on", "-ctkd", "q8_0", "-ctvd", "q8_0", "-ub", "256")),
        (2, ("-c", "4096", "-np", "1", "-fa", "off", "-ts", "3,1")),
    ],
    ids=["cpu", "cpu-np2-fa-off-q8k", "rpc1-np2", "rpc1-q8-ub256", "rpc2-ts31"],
)
def test_draft_context_as_predicted(
    n_dev: int, args: tuple[str, ...], models: tuple[Path, Path], real_llama_server: Path
) -> None:
    from llama_server_build import rpc_server

    target, draft = models
    ngl = "99" if n_dev else "0"
    with devices(rpc_server(), n_dev) as eps:
        text = run_server(real_llama_server, target, [*args, "-ngl", ngl, "-md", str(draft), "-ngld", ngl], eps)
    assert MARKER in text, text[-3000:]
    main_log, draft_log = (parse(part.splitlines()) for part in text.split(MARKER, 1))

    flag = dict(zip(args[::2], args[1::2], strict=True))
    ts = tuple(float(x) for x in flag["-ts"].split(",")) if "-ts" in flag else ()
    cfg = RunConfig(
        n_ctx=int(flag["-c"]),
        n_parallel=int(flag["-np"]),
        flash_attn=flag["-fa"],
        n_ubatch=int(flag.get("-ub", 512)),
        device="rpc" if n_dev else "cpu",
        tensor_split=ts if n_dev > 1 else (),
        cpu_repack=cpu_isa(),
        draft=kvadvise.load_model(str(draft)),
        type_k_draft=cache_type(flag.get("-ctkd", "f16")),
        type_v_draft=cache_type(flag.get("-ctvd", "f16")),
    )
    est = estimate(kvadvise.load_model(str(target)), cfg)
    assert est.draft is not None
    # a device is named after its endpoint (RPC<n>[host:port]), as llama.cpp prints it
    names = [next(b.buft for b in main_log.buffers if b.buft.endswith(f"[{ep}]")) for ep in eps] or ["CPU"]
    _check("target", main_log, est, names)
    _check("draft", draft_log, est.draft, names)
    # the draft context has the target's resolved size and slots
    assert draft_log.cparams["n_ctx"] == main_log.cparams["n_ctx"] == str(est.draft.layout.n_ctx)
    assert draft_log.cparams["n_seq_max"] == flag["-np"]
    # each device's plan holds both contexts
    for d, x in zip(est.devices, est.draft.devices, strict=True):
        assert d.draft_bytes == x.total_bytes
    assert est.device_bytes == sum(d.total_bytes for d in est.devices)


def test_cli_command_with_a_draft_allocates_what_the_plan_says(
    models: tuple[Path, Path], real_llama_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp TARGET -md DRAFT -ctkd q8_0 --rpc HOST:PORT=SIZE`: the command states the draft
    (-md, -ngld, -ctkd), and run over that rpc-server the draft's second context allocates, on the
    device, the memory.devices[].draft_bytes of the JSON."""
    import json
    import shlex

    from llama_server_build import rpc_server

    from kvadvise.cli import main

    target, draft = models
    with devices(rpc_server(), 1) as eps:
        argv = ["llamacpp", str(target), "-md", str(draft), "-ctkd", "q8_0", "--rpc", f"{eps[0]}=2GiB"]
        assert main([*argv, "--ctx", "3000", "-np", "2", "-fa", "on", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        cmd = shlex.split(doc["llama_server"]["command"])
        assert cmd[cmd.index("-md") + 1] == str(draft) and cmd[cmd.index("-ngld") + 1] == "999"
        assert cmd[cmd.index("-ctkd") + 1] == "q8_0" and "-ctvd" not in cmd
        args = [x for i, x in enumerate(cmd[1:], 1) if cmd[i - 1] not in ("-m", "--rpc") and x not in ("-m", "--rpc")]
        text = run_server(real_llama_server, target, args, eps)
    draft_log = parse(text.split(MARKER, 1)[1].splitlines())
    (dev,) = doc["memory"]["devices"]
    got = sum(b.mib for b in draft_log.buffers if b.buft == dev["name"] and b.kind in ("model", "KV", "compute"))
    assert abs(got - dev["draft_bytes"] / MIB) <= max(1.0, 0.05 * got), (got, dev["draft_bytes"] / MIB)
    assert doc["memory"]["draft"]["type_k"] == "q8_0" and doc["memory"]["draft"]["n_ctx"] == 3072
