"""Speculative decoding with a model's own MTP/NextN head (``llama-server --spec-type draft-mtp``) on real
llama.cpp b11312: the NextN blocks load with the model, the target reserves a logits row per drafted token,
and a second context (common_speculative_init_result: "creating MTP draft context") holds KV for the NextN
layers only. kvadvise plans both contexts (kvadvise.planner.mtp); each buffer is checked against the one
llama-server prints, on the CPU and on an RPC device on loopback. The model: tests/tinymodels.py's glm4moe
(2 trunk layers + 1 NextN block, nextn_predict_layers 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rpc_devices import devices, run_server
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.errors import ConfigError
from kvadvise.model.ggml import cache_type
from kvadvise.planner import mtp
from kvadvise.planner.memory import MemoryEstimate, RunConfig, estimate
from kvadvise.runtime.llamalog import LoadLog, parse

MIB = 1 << 20
MARKER = "common_speculative_init_result: creating MTP draft context"


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("mtp") / "glm4moe.gguf", "glm4moe", n_vocab=32000)


def _mib(log: LoadLog, buft: str, kind: str) -> float:
    """One buffer type's printed size. The MTP context's scheduler is reserved twice (once when the context
    is made, again when the draft-mtp implementation is added: "sched_reserve: reserving ..."); the second
    reserve reallocates the same buffer, so a compute buffer is the largest of its lines, not their sum."""
    bufts = ("CPU_Mapped", "CPU_REPACK") if (buft, kind) == ("CPU", "model") else (buft,)
    sizes = [b.mib for b in log.buffers if b.buft in bufts and b.kind == kind]
    return max(sizes, default=0.0) if kind == "compute" else sum(sizes)


def _check(label: str, log: LoadLog, est: MemoryEstimate, names: list[str]) -> None:
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


@pytest.mark.llama
@pytest.mark.parametrize(
    ("n_dev", "args"),
    [
        (0, ("-c", "4096", "-np", "1", "-fa", "on", "--spec-draft-n-max", "4")),
        (0, ("-c", "3000", "-np", "2", "-fa", "off", "-ctkd", "q8_0")),
        (0, ("-c", "4096", "-np", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")),
        (1, ("-c", "8192", "-np", "2", "-fa", "on", "--spec-draft-n-max", "2", "-ub", "256")),
    ],
    ids=["cpu-n4", "cpu-np2-fa-off-q8kd", "cpu-q8-target", "rpc1-np2"],
)
def test_mtp_context_as_predicted(n_dev: int, args: tuple[str, ...], glm: Path, real_llama_server: Path) -> None:
    from llama_server_build import rpc_server

    ngl = "99" if n_dev else "0"
    with devices(rpc_server(), n_dev) as eps:
        text = run_server(real_llama_server, glm, [*args, "-ngl", ngl, "--spec-type", "draft-mtp"], eps)
    assert MARKER in text, text[-3000:]
    main_log, mtp_log = (parse(part.splitlines()) for part in text.split(MARKER, 1))
    flag = dict(zip(args[::2], args[1::2], strict=True))
    n_max = int(flag.get("--spec-draft-n-max", mtp.DEFAULT_N_MAX))
    cfg = RunConfig(
        n_ctx=int(flag["-c"]),
        n_parallel=int(flag["-np"]),
        flash_attn=flag["-fa"],
        n_ubatch=int(flag.get("-ub", 512)),
        type_k=cache_type(flag.get("-ctk", "f16")),
        type_v=cache_type(flag.get("-ctv", "f16")),
        device="rpc" if n_dev else "cpu",
        cpu_repack="none",  # f16 weights: nothing to repack
        type_k_draft=cache_type(flag.get("-ctkd", "f16")),
        mtp=True,
        spec_draft_n_max=n_max,
    )
    spec = kvadvise.load_model(str(glm))
    est = estimate(spec, cfg)
    assert est.draft is not None
    names = [next(b.buft for b in main_log.buffers if b.buft.endswith(f"[{ep}]")) for ep in eps] or ["CPU"]
    _check("target", main_log, est, names)
    _check("mtp", mtp_log, est.draft, names)
    # the target reserves a logits row per slot and drafted token; the MTP context one per slot
    assert main_log.cparams.get("n_ctx") == mtp_log.cparams.get("n_ctx") == str(est.layout.n_ctx)
    # the MTP context's cache: the NextN layer alone, of the draft's cache type (-ctkd), not the target's
    assert [k.layers for k in mtp_log.kv] == [spec.n_layer_nextn]
    assert mtp_log.kv[0].type_k == cfg.type_k_draft.type_name
    assert [k.layers for k in main_log.kv] == [spec.n_layer]
    # the NextN block's weights are loaded: the model buffer is larger than without MTP, by what the plan says
    plain = estimate(spec, RunConfig(n_ctx=cfg.n_ctx, flash_attn=cfg.flash_attn, device=cfg.device, cpu_repack="none"))
    assert est.weights_bytes - plain.weights_bytes == spec.nextn_span_bytes if not n_dev else True
    assert est.weights_bytes > plain.weights_bytes
    assert f"n_outputs_max         = {min(2048, cfg.n_parallel * (1 + n_max))}" in text.split(MARKER, 1)[0]


def test_mtp_on_a_model_without_nextn_layers_is_refused(tmp_path: Path) -> None:
    """llama_init_from_model returns no MTP context without NextN layers: the plan refuses, with a hint."""
    spec = kvadvise.load_model(str(write_tiny_gguf(tmp_path / "q.gguf", "qwen3", n_vocab=32000)))
    with pytest.raises(ConfigError, match="no MTP/NextN layers") as e:
        estimate(spec, RunConfig(n_ctx=4096, mtp=True))
    assert e.value.hint


def test_gain_text_cites_its_sources() -> None:
    text = mtp.gain_text()
    assert text.startswith("estimate")
    assert all(g.source in text for g in mtp.PUBLISHED_GAINS)


def test_plan_states_mtp_memory_gain_and_what_turning_it_off_buys(tmp_path: Path) -> None:
    """On a budget that bounds the context, the plan's MTP line gives the draft's memory, the published gain
    and the context the same search finds without MTP (larger: the MTP context's buffers go to KV)."""
    from kvadvise.entry import plan_for
    from kvadvise.request import PlanRequest

    path = write_tiny_gguf(tmp_path / "glm.gguf", "glm4moe", n_vocab=32000, n_ctx_train=1 << 20)
    spec = kvadvise.load_model(str(path))
    request = PlanRequest(spec_type="draft-mtp", spec_draft_n_max=4, vram_bytes=(420 * MIB,), margin_bytes=0)
    plan = plan_for(spec, request)
    assert plan.config.mtp and plan.config.spec_draft_n_max == 4
    assert plan.estimate.draft is not None
    note = next(n for n in plan.notes if n.startswith("MTP draft"))
    plain = plan_for(spec, PlanRequest(vram_bytes=(420 * MIB,), margin_bytes=0))
    assert plain.config.n_ctx > plan.config.n_ctx, (plain.config.n_ctx, plan.config.n_ctx)
    assert f"without MTP: {plain.config.n_ctx:,} tokens instead of {plan.config.n_ctx:,}" in note
    assert mtp.PUBLISHED_GAINS[0].source in note
    # the MTP context is on the device beside the target's buffers
    assert plan.estimate.devices[0].draft_bytes == plan.estimate.draft.devices[0].total_bytes > 0


def test_ollama_launches_mtp_where_appendDraftArgs_would(glm: Path, tmp_path: Path) -> None:
    """Ollama (llm/llama_server.go, fb30760) adds --spec-type draft-mtp --spec-draft-n-max N for a GGUF with
    nextn_predict_layers when the model's parameters set draft_num_predict; not otherwise."""
    from kvadvise.backends.ollama.model import OllamaModel
    from kvadvise.backends.ollama.runtime import OllamaRuntime
    from kvadvise.entry import plan_for
    from kvadvise.request import PlanRequest

    spec = kvadvise.load_model(str(glm))
    plain = kvadvise.load_model(str(write_tiny_gguf(tmp_path / "q.gguf", "qwen3", n_vocab=32000)))

    def plan(s: object, params: dict[str, object]) -> RunConfig:
        assert isinstance(s, type(spec))
        model = OllamaModel("m", "latest", s, params, 0, s.weights_bytes, "spec:test")
        rt = OllamaRuntime(model, live=False)
        return plan_for(s, PlanRequest(n_ctx=4096, device="cpu", no_hardware=True), rt).config

    on = plan(spec, {"draft_num_predict": 4})
    assert on.mtp and on.spec_draft_n_max == 4
    assert not plan(spec, {}).mtp  # modelOptions zeroes an unset draft_num_predict
    assert not plan(plain, {"draft_num_predict": 4}).mtp  # no NextN layers: hasMTPDraft is false
    # Ollama decides MTP itself: the flag is llama.cpp's only
    from kvadvise.errors import InputError

    rt = OllamaRuntime(OllamaModel("m", "latest", spec, {}, 0, spec.weights_bytes, "spec:test"), live=False)
    with pytest.raises(InputError, match="--spec-type"):
        plan_for(spec, PlanRequest(n_ctx=4096, device="cpu", no_hardware=True, spec_type="draft-mtp"), rt)


def test_api_run_config_with_mtp_plans_as_the_cli(glm: Path) -> None:
    """kvadvise.plan(path, RunConfig(mtp=True)) carries --spec-type through to the plan."""
    cfg = kvadvise.plan(str(glm), RunConfig(n_ctx=4096, device="cpu", mtp=True, spec_draft_n_max=2)).config
    assert cfg.mtp and cfg.spec_draft_n_max == 2


def test_cli_writes_the_spec_flags(glm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvadvise.cli import main

    argv = ["llamacpp", str(glm), "--spec-type", "draft-mtp", "--spec-draft-n-max", "4", "--ctx", "4096"]
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    draft = doc["memory"]["draft"]
    assert draft["kind"] == "mtp" and draft["n_max"] == 4
    assert draft["nextn_weights_bytes"] == sum(kvadvise.load_model(str(glm)).nextn_layer_bytes)
    assert "--spec-type draft-mtp --spec-draft-n-max 4" in doc["llama_server"]["command"]
    assert main(["llamacpp", str(glm), "--spec-type", "draft-mtp", "-md", str(glm), "--ctx", "4096"]) == 2
