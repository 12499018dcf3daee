"""Users per card (issue 42.5): ``--users N``: do N sessions of a context fit, at most how many, one slot
each and with a unified cache (-kvu), their decode; the plan written for -np N (and -kvu where it holds
more), Ollama's OLLAMA_NUM_PARALLEL. The answer is checked against the plan's own test: M sessions planned
fit and M + 1 do not, each way; the two ways' buffers against real llama.cpp on the real Gemma 3 270M."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from oracle import check, run_llama

import kvadvise
from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.planner.memory import RunConfig, estimate
from kvadvise.planner.users import Sessions, UsersAnswer, users_config
from kvadvise.request import PlanRequest

GiB = 1 << 30
CARD = {"vram_bytes": (3 * GiB,), "bandwidth_gbs": 300.0}  # a 3 GiB GPU given by hand, 300 GB/s
RAM = 64 * GiB


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def plan_fits(path: Path, n_users: int, n_ctx_user: int, *, unified: bool, kv: str) -> bool:
    """The plan of N slots of n_ctx_user tokens (-np N -c N x C [-kvu] -ctk/-ctv kv), as `kvadvise llamacpp`
    makes it (the cache type fixed: left to the policy, a quantized cache would hold more)."""
    r = PlanRequest(
        n_ctx=n_users * n_ctx_user, n_parallel=n_users, kv_unified=unified, type_k=kv, type_v=kv, ram_bytes=RAM, **CARD
    )
    plan = kvadvise.plan(str(path), r)
    assert plan.fits is not None
    return plan.fits


@pytest.mark.parametrize(
    ("n_users", "n_ctx_user", "kv", "per_slot_max", "unified_max"),
    [
        (8, 32768, None, 12, 10),  # long contexts: -kvu's compute buffer spans the whole pool and costs more
        (130, 1024, "f16", 77, 121),  # short ones: the SWA layers' smaller unified cache wins
    ],
)
def test_the_answer_is_the_plans_own_m_fit_and_m_plus_one_do_not(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], n_users: int, n_ctx_user: int, kv: str | None,
    per_slot_max: int, unified_max: int,
) -> None:  # fmt: skip
    extra = ["-ctk", kv] if kv else []
    rc, out, _ = run(
        capsys, "llamacpp", str(gemma_path), "--vram", "3GiB", "--bandwidth", "300", "--ram", "64GiB",
        "--users", str(n_users), "--target-ctx", str(n_ctx_user), "--json", *extra,
    )  # fmt: skip
    assert rc == 0
    whole = json.loads(out)
    schema = json.loads((Path(__file__).parent.parent / "docs" / "schema" / "plan.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(whole)  # docs/schema/plan.schema.json: users included
    doc = whole["users"]
    assert (doc["per_slot"]["max_users"], doc["unified"]["max_users"]) == (per_slot_max, unified_max)
    assert doc["cache_type"] == "f16"
    for way, unified in (("per_slot", False), ("unified", True)):
        m = doc[way]["max_users"]
        assert plan_fits(gemma_path, m, n_ctx_user, unified=unified, kv="f16")
        assert not plan_fits(gemma_path, m + 1, n_ctx_user, unified=unified, kv="f16")
        assert doc[way]["fits"] == (n_users <= m)
    assert doc["max_users"] == max(per_slot_max, unified_max) and doc["kv_unified"] == (unified_max > per_slot_max)


def test_the_direct_answer_and_the_command_it_writes(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At llama.cpp b11312 (the suite's): 8 users at 32k on a 3 GiB card: yes, at most 12, one slot each
    (-np 8 -c 262144, no -kvu); 130 users at 1k: no, at most 121 with -kvu, and the plan (for 130 slots, a
    smaller context each) runs -kvu."""
    common = ("--vram", "3GiB", "--bandwidth", "300", "--ram", "64GiB")
    rc, out, _ = run(capsys, "llamacpp", str(gemma_path), *common, "--users", "8", "--target-ctx", "32768")
    assert rc == 0
    assert out.startswith("8 users at 32k each (K/V f16) on a 3.00 GiB GPU (--vram): yes; at most 12\n")
    prose = re.sub(r"\n +≈", " ≈", out)  # a row wrapped to ~100 columns, read whole
    assert "  one slot each: at most 12; 8 take 1.47 GiB (K/V 0.87 GiB); ≈ 70 t/s each, 562 t/s in all" in prose
    assert "  unified cache (-kvu, one pool): at most 10; 8 take 1.64 GiB (K/V 0.82 GiB)" in out
    command = out.strip().splitlines()[-1]
    assert " -c 262144 -np 8 " in command and "-kvu" not in command
    rc, out, _ = run(
        capsys, "llamacpp", str(gemma_path), *common, "--users", "130", "--target-ctx", "1024", "-ctk", "f16"
    )
    assert rc == 0 and out.startswith(
        "130 users at 1k each (K/V f16) on a 3.00 GiB GPU (--vram): no; at most 121 (with -kvu)\n"
    )
    command = out.strip().splitlines()[-1]
    assert " -np 130 " in command and " -kvu" in command


def test_concurrent_decode_reads_the_weights_once_per_step(gemma_path: Path) -> None:
    """N sessions decode together: each at 1 / t_step, the card at N / t_step, t_step reading the weights
    once and every session's K/V; with one user it is the plan's own single-sequence figure at that depth."""
    plan = kvadvise.plan(str(gemma_path), PlanRequest(n_ctx=32768, ram_bytes=RAM, **CARD))
    assert plan.speed is not None and plan.users is None
    one = kvadvise.plan(str(gemma_path), PlanRequest(n_ctx=32768, users=1, ram_bytes=RAM, **CARD)).users
    assert one is not None and one.per_slot.decode_user_tps == pytest.approx(plan.speed.points[-1][1])
    eight = kvadvise.plan(str(gemma_path), PlanRequest(target_ctx=32768, users=8, ram_bytes=RAM, **CARD)).users
    assert eight is not None and eight.per_slot.decode_user_tps is not None
    assert eight.per_slot.decode_user_tps < one.per_slot.decode_user_tps  # eight sessions' K/V read per step
    assert eight.per_slot.decode_total_tps == pytest.approx(8 * eight.per_slot.decode_user_tps)
    # the weights are read once for the eight: 3.25 x one session's speed in all on the card alone (this small
    # model's K/V at 32k, 111 MiB a session, is half its weights: the gain is that of the weights' share), but the
    # CPU samples each session's token in turn over 262,144 candidates (speed.sampling_seconds: 0.97 ms each,
    # llama-server's slots one after the other): 2.02 x
    assert eight.per_slot.decode_total_tps / one.per_slot.decode_user_tps == pytest.approx(2.0250, rel=1e-3)


def test_one_slot_each_and_unified_as_real_llama_cpp_allocates_them(gemma_path: Path) -> None:
    """The two ways of holding 4 sessions of 8k, planned and loaded by real llama.cpp (llama-cpp-python,
    b11312, on the CPU): the same cells, K/V and compute buffers (tests/oracle.py's bar). Unified keeps
    (4 - 1) x 512 fewer SWA cells (llama_kv_cache_iswa) but its compute buffer spans the whole pool."""
    spec = from_gguf(read_file(gemma_path))
    base = RunConfig(flash_attn="on", device="cpu")
    cfgs = [users_config(base, 4, 8192, kv_unified=u) for u in (False, True)]
    for cfg, m in zip(cfgs, run_llama(gemma_path, cfgs), strict=True):
        assert check("gemma-3-270m", spec, cfg, m) == []
    per_slot, unified = (estimate(spec, c) for c in cfgs)
    assert per_slot.layout.n_ctx_swa == 1024 and unified.layout.n_ctx_swa == 2560  # 4 x 1024 against 4 x 512 + 512
    assert unified.kv_bytes < per_slot.kv_bytes and unified.compute_bytes > per_slot.compute_bytes


def test_ollama_writes_num_parallel_and_has_no_unified_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ollama runs -c num_ctx x OLLAMA_NUM_PARALLEL -np OLLAMA_NUM_PARALLEL (llm/llama_server.go, ollama
    fb3076099687) and never -kvu: 8 users of gemma3:4b at 32k on a 4090 fit (at most 22: its vision tower is its own
    --mmproj, with the fit target raised by it, kvadvise.backends.ollama.towers; 23 before), the env file says
    OLLAMA_NUM_PARALLEL=8; 22 planned with --parallel fit, 23 do not."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL", "OLLAMA_KV_CACHE_TYPE"):
        monkeypatch.delenv(k, raising=False)
    env = tmp_path / "ollama.env"
    on = ("--gpu", "rtx-4090", "--ram", "64GiB")
    rc, out, _ = run(
        capsys, "ollama", "gemma3:4b", *on, "--users", "8", "--target-ctx", "32768", "--write-env", str(env)
    )
    assert rc == 0
    assert out.startswith("8 users at 32k each (K/V f16) on NVIDIA GeForce RTX 4090: yes; at most 22\n")
    assert "(no unified cache: the runtime does not pass -kvu)" in out
    assert "OLLAMA_NUM_PARALLEL=8" in env.read_text()
    for n, fits in ((22, True), (23, False)):  # --ctx is Ollama's num_ctx: per slot
        rc, out, _ = run(
            capsys, "ollama", "gemma3:4b", *on, "--parallel", str(n), "--ctx", "32768", "-ctk", "f16", "--json"
        )
        doc = json.loads(out)
        assert doc["fits"] is fits and doc["config"]["n_ctx"] == n * 32768, n


def test_users_is_refused_where_it_cannot_be_answered(
    gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the reason, never ignored: with another -np, without hardware, for a folder's listing,
    the store's listing or several models."""
    from ollama_fake import closed_port_url

    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--users", "4", "--parallel", "2", "--vram", "3GiB")
    assert rc == 2 and "--users 4 runs -np 4: drop --parallel 2" in err
    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--users", "4", "--no-hardware")
    assert rc == 2 and "--users asks how many sessions fit a card" in err
    rc, _, err = run(capsys, "gguf", str(gemma_path.parent), "--vram", "3GiB", "--users", "4")
    assert rc == 2 and "--users is for one model" in err
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    rc, _, err = run(capsys, "ollama", "gemma3:4b", "gemma3:12b", "--gpu", "rtx-4090", "--users", "4")
    assert rc == 2 and "--users: for one model" in err
    rc, _, err = run(capsys, "ollama", "--installed", "--users", "4")
    assert rc == 2 and "--users is for one model" in err


def test_the_choice_between_the_two_ways() -> None:
    """-kvu only where it holds more sessions, or the N asked only fit with it; else one slot each (every
    session sure of its context)."""

    def way(unified: bool, fits: bool, most: int) -> Sessions:
        return Sessions(unified, 4, 4096, fits, most, 0, 0, None, None)

    assert UsersAnswer(4, 4096, way(False, True, 6), way(True, True, 6), "x").chosen.kv_unified is False
    assert UsersAnswer(4, 4096, way(False, True, 6), way(True, True, 7), "x").chosen.kv_unified is True
    assert UsersAnswer(4, 4096, way(False, False, 3), None, "x").max_users == 3
    given = UsersAnswer(4, 4096, way(False, True, 6), way(True, True, 5), "x", unified_given=True)
    assert given.chosen.kv_unified is True and given.max_users == 5  # -kvu asked: the way the plan runs
