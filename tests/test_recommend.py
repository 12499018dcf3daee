"""The recommender: the seed case, the policy, and that every answer fits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvadvise.errors import DoesNotFit
from kvadvise.model.ggml import GGMLType
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec, with_weights
from kvadvise.planner.budget import budget_for
from kvadvise.planner.hardware import Gpu, Hardware
from kvadvise.planner.memory import CTX_PAD, RunConfig, estimate
from kvadvise.planner.policy import Policy
from kvadvise.planner.recommender import max_context, recommend

MIB, GIB = 1 << 20, 1 << 30
F16, Q8, Q4 = GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0
DATA = Path(__file__).parent / "data" / "hf"
# An RTX 4090 as NVML reports it: 24,564 MiB total (a "24 GB" card), nothing else running.
RTX_4090 = Hardware(
    (Gpu(0, "NVIDIA GeForce RTX 4090", 24564 * MIB, 24564 * MIB, 0, None, None),), 64 * GIB, 60 * GIB, "test"
)
# qwen3-coder:30b on the Ollama library: Q4_K_M, 19 GB download (the brief's "19 GB model")
QWEN3_CODER_WEIGHTS = 19_000_000_000


def hf_spec(name: str, weights: int) -> ModelSpec:
    cfg = json.loads((DATA / f"{name}.json").read_text())
    cfg.pop("_source", None)
    return with_weights(from_config(cfg, source=name), weights)


@pytest.fixture(scope="module")
def qwen3_coder() -> ModelSpec:
    return hf_spec("qwen3-coder-30b", QWEN3_CODER_WEIGHTS)


def test_seed_case_f16_does_not_fit_64k_but_q8_0_does(qwen3_coder: ModelSpec) -> None:
    budget = budget_for(RTX_4090)
    assert budget.budget_bytes == (24564 - 1024) * MIB  # llama.cpp's fit margin: 1024 MiB
    at_64k = {
        kv: estimate(qwen3_coder, RunConfig(n_ctx=65536, type_k=kv, type_v=kv, flash_attn="on", device="cuda"))
        for kv in (F16, Q8)
    }
    assert at_64k[F16].kv_bytes == 48 * 4 * 128 * 2 * 2 * 65536  # 6 GiB
    assert at_64k[F16].device_bytes > budget.budget_bytes  # about 25 GB: spills
    assert at_64k[Q8].device_bytes <= budget.budget_bytes
    rec = recommend(qwen3_coder, RunConfig(), budget, Policy(target_ctx=65536))
    assert (rec.config.type_k, rec.config.type_v, rec.config.flash_attn) == (Q8, Q8, "on")
    assert rec.config.n_ctx == 65536 and rec.fits
    assert any("f16 K/V at 65,536 tokens needs" in r for r in rec.reasons)


def test_seed_case_repeatable_gives_f16_at_the_largest_context(qwen3_coder: ModelSpec) -> None:
    budget = budget_for(RTX_4090)
    rec = recommend(qwen3_coder, RunConfig(), budget, Policy(target_ctx=65536, repeatable=True))
    assert (rec.config.type_k, rec.config.type_v) == (F16, F16)
    n = rec.config.n_ctx
    assert n % 1024 == 0 and 32768 < n < 65536  # the policy rounds the context down to a multiple of 1,024
    assert rec.estimate.device_bytes <= budget.budget_bytes
    bigger = estimate(qwen3_coder, replace(rec.config, n_ctx=n + 1024))
    assert bigger.device_bytes > budget.budget_bytes  # the largest multiple of 1,024 that fits
    assert rec.options[0].n_ctx_max - n < 1024  # the option still says the exact maximum
    assert [(o.type_k, o.type_v) for o in rec.options] == [(F16, F16)]


def test_prefers_f16_when_it_reaches_the_target(qwen3_coder: ModelSpec) -> None:
    rec = recommend(qwen3_coder, RunConfig(), budget_for(RTX_4090), Policy(target_ctx=8192))
    assert (rec.config.type_k, rec.config.n_ctx) == (F16, 8192)
    assert any("reproduces tokens exactly" in r for r in rec.reasons)


def test_min_ctx_fails_with_what_would_fit(qwen3_coder: ModelSpec) -> None:
    small = Hardware((Gpu(0, "small", 20 * GIB, 20 * GIB, 0, None, None),), 64 * GIB, 60 * GIB, "test")
    with pytest.raises(DoesNotFit) as e:
        recommend(qwen3_coder, RunConfig(n_parallel=2), budget_for(small), Policy(min_ctx=131072))
    assert e.value.exit_code == 3
    assert e.value.hint and "more memory" in e.value.hint and "fewer parallel slots" in e.value.hint


def test_weights_alone_too_big_is_reported_not_hidden(qwen3_coder: ModelSpec) -> None:
    tiny = Hardware((Gpu(0, "tiny", 8 * GIB, 8 * GIB, 0, None, None),), 64 * GIB, 60 * GIB, "test")
    rec = recommend(qwen3_coder, RunConfig(), budget_for(tiny), Policy())
    assert not rec.fits
    assert any("does not fit" in r for r in rec.reasons)


def test_two_gpus_and_memory_held_by_others() -> None:
    hw = Hardware(
        (
            Gpu(0, "a", 24 * GIB, 20 * GIB, 4 * GIB, None, None),
            Gpu(1, "b", 24 * GIB, 24 * GIB, 0, None, None),
        ),
        64 * GIB,
        60 * GIB,
        "nvml",
    )
    b = budget_for(hw, margin_bytes=512 * MIB)
    assert (b.free_bytes, b.margin_bytes, b.budget_bytes, b.n_gpu) == (44 * GIB, 1 * GIB, 43 * GIB, 2)


def test_no_gpu_plans_for_system_ram() -> None:
    b = budget_for(Hardware((), 32 * GIB, 30 * GIB, "none"))
    assert (b.device, b.budget_bytes) == ("cpu", 30 * GIB - 1024 * MIB)


def test_same_type_kv_for_ollama_and_mla(qwen3_coder: ModelSpec) -> None:
    rec = recommend(qwen3_coder, RunConfig(), budget_for(RTX_4090), Policy(same_type_kv=True))
    assert all(o.type_k == o.type_v for o in rec.options)
    mla = hf_spec("deepseek-coder-v2-16b", 10_000_000_000)
    rec = recommend(mla, RunConfig(), budget_for(RTX_4090), Policy())
    assert all(o.type_k == o.type_v for o in rec.options)  # llama.cpp refuses different K and V types for MLA


configs = st.fixed_dictionaries(
    {
        "num_hidden_layers": st.integers(1, 96),
        "num_attention_heads": st.sampled_from([8, 16, 32, 64]),
        "kv_div": st.sampled_from([1, 2, 4, 8]),
        "head_dim": st.sampled_from([64, 128, 256]),
        "vocab_size": st.integers(1000, 260_000),
        "max_position_embeddings": st.sampled_from([4096, 32768, 131072, 262144]),
        "intermediate_size": st.integers(256, 30000),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=configs,
    weights_gib=st.floats(0.1, 60),
    vram_gib=st.floats(2, 160),
    n_parallel=st.integers(1, 4),
    target=st.sampled_from([0, 4096, 65536]),
    repeatable=st.booleans(),
)
def test_property_every_recommendation_fits_and_is_the_largest(
    cfg: dict[str, int], weights_gib: float, vram_gib: float, n_parallel: int, target: int, repeatable: bool
) -> None:
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg["num_attention_heads"] * cfg["head_dim"],
        "num_key_value_heads": max(1, cfg["num_attention_heads"] // cfg["kv_div"]),
        **{k: v for k, v in cfg.items() if k != "kv_div"},
    }
    spec = with_weights(from_config(hf, source="random"), int(weights_gib * GIB))
    hw = Hardware((Gpu(0, "g", int(vram_gib * GIB), int(vram_gib * GIB), 0, None, None),), 64 * GIB, 60 * GIB, "t")
    budget = budget_for(hw)
    rec = recommend(spec, RunConfig(n_parallel=n_parallel), budget, Policy(target_ctx=target, repeatable=repeatable))
    if rec.fits:
        assert rec.estimate.device_bytes <= budget.budget_bytes
    for o in rec.options:
        base = RunConfig(n_parallel=n_parallel)
        if o.n_ctx_max == 0:
            continue
        cfg_at = RunConfig(
            n_ctx=o.n_ctx_max * n_parallel,
            n_parallel=n_parallel,
            type_k=o.type_k,
            type_v=o.type_v,
            flash_attn="on" if o.flash_attn else "off",
            device="cuda",
        )
        assert estimate(spec, cfg_at).device_bytes <= budget.budget_bytes
        if o.n_ctx_max + CTX_PAD <= spec.n_ctx_train:
            over = replace(cfg_at, n_ctx=(o.n_ctx_max + CTX_PAD) * n_parallel)
            assert estimate(spec, over).device_bytes > budget.budget_bytes
        assert o.n_ctx_max == max_context(spec, base, (o.type_k, o.type_v), o.flash_attn, budget)
    if repeatable:
        assert (rec.config.type_k, rec.config.type_v) == (F16, F16)


def _hw(budget_bytes: int) -> Hardware:
    total = budget_bytes + 1024 * MIB  # the default margin is taken back off
    return Hardware((Gpu(0, "g", total, total, 0, 1_000_000_000_000, "test"),), 64 * GIB, 60 * GIB, "test")


def test_allow_cpu_moves_dense_layers(gemma_path: Path) -> None:
    from kvadvise.backends.gguf_cache import read
    from kvadvise.model.architecture import from_gguf
    from kvadvise.planner.memory import layer_kv_bytes, resolve

    spec = from_gguf(read(gemma_path))
    cfg = RunConfig(n_ctx=32768, flash_attn="on", device="cuda")
    full = estimate(spec, cfg)
    budget = budget_for(_hw(full.device_bytes - 10 * MIB))
    rec = recommend(spec, RunConfig(), budget, Policy(target_ctx=32768, repeatable=True, allow_cpu=True))
    off = rec.offload
    assert off is not None and off.n_cpu_moe == 0 and off.n_cpu_layers > 0
    kv = layer_kv_bytes(spec, resolve(spec, cfg))
    moved = sum(spec.layer_bytes[il] + kv[il][0] + kv[il][1] for il in range(off.n_cpu_layers))
    pad = sum(spec.layer_cuda_pad_bytes[: off.n_cpu_layers])  # a CUDA buffer's row padding leaves with the layer
    # op offload: the GPU compute buffer holds a copy of the largest weight of the CPU's blocks
    copy = max(spec.layer_largest_tensor_bytes[: off.n_cpu_layers])
    assert off.op_offload_bytes == copy > 0
    last = spec.layer_bytes[off.n_cpu_layers - 1] + sum(kv[off.n_cpu_layers - 1])
    assert moved >= 10 * MIB + copy and moved - last < 10 * MIB + max(
        spec.layer_largest_tensor_bytes[: off.n_cpu_layers - 1] or [0]
    )
    assert off.device_bytes == full.device_bytes - moved - pad + copy <= budget.budget_bytes
    assert off.n_gpu_layers == spec.n_layer + 1 - off.n_cpu_layers  # -ngl counts the output layer
    assert any(r.startswith("partial offload:") for r in rec.reasons)
    assert recommend(spec, RunConfig(), budget, Policy(target_ctx=32768, repeatable=True)).offload is None


def test_allow_cpu_moves_moe_experts_first(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_tiny_gguf

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file

    spec = from_gguf(read_file(write_tiny_gguf(tmp_path / "m.gguf", "mixtral")))
    assert spec.n_expert and spec.expert_bytes
    full = estimate(spec, RunConfig(n_ctx=4096, flash_attn="on", device="cuda"))
    per_layer = spec.expert_bytes // spec.n_layer
    rec = recommend(
        spec,
        RunConfig(),
        budget_for(_hw(full.device_bytes - per_layer // 2)),
        Policy(target_ctx=4096, repeatable=True, allow_cpu=True),
    )
    assert rec.offload is not None
    assert (rec.offload.n_cpu_moe, rec.offload.n_cpu_layers) == (1, 0)
    # plus op offload's copy of the largest CPU-resident weight (block 0's largest tensor: an expert tensor)
    assert rec.offload.op_offload_bytes == spec.layer_largest_tensor_bytes[0] > 0
    assert rec.offload.device_bytes == full.device_bytes - per_layer + spec.layer_largest_tensor_bytes[0]


def test_allow_cpu_moe_keeps_all_experts_on_the_cpu_before_whole_layers(tmp_path: Path) -> None:
    """When the experts of every layer are not enough, they all stay on the CPU (--n-cpu-moe N_LAYER, as
    llama.cpp's --fit goes dense-only first) and whole layers then go from the front, each counting only
    what is left of it (attention, router, its KV): not whole layers with their experts counted twice."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_tiny_gguf

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file
    from kvadvise.planner.memory import cpu_layers_attention_bytes, layer_kv_bytes, resolve
    from kvadvise.planner.offload import partial_offload

    spec = from_gguf(read_file(write_tiny_gguf(tmp_path / "m.gguf", "mixtral")))
    cfg = RunConfig(n_ctx=4096, flash_attn="on", device="cuda")
    full = estimate(spec, cfg)
    per_layer = spec.expert_bytes // spec.n_layer
    kv = layer_kv_bytes(spec, resolve(spec, cfg))
    rest0 = spec.layer_bytes[0] - per_layer + sum(kv[0])
    budget = budget_for(_hw(full.device_bytes - spec.expert_bytes - rest0 // 2))
    off = partial_offload(spec, RunConfig(), budget, 4096, (cfg.type_k, cfg.type_v))
    assert off is not None and off.n_cpu_moe == spec.n_layer and off.n_cpu_layers == 1
    # op offload: the largest weight's copy, or the whole CPU layer's attention with copies of its K and V, whichever
    # peak is higher (memory.cpu_layers_attention_bytes)
    base = full.devices[0].compute_bytes
    attention = cpu_layers_attention_bytes(spec, resolve(spec, cfg), range(1))
    copy = max(base + max(spec.layer_largest_tensor_bytes), attention) - base
    pad0 = spec.layer_cuda_pad_bytes[0]  # a CUDA buffer's row padding of block 0 leaves with it
    assert off.device_bytes == full.device_bytes - spec.expert_bytes - rest0 - pad0 + copy <= budget.budget_bytes
    assert off.n_gpu_layers == spec.n_layer  # -ngl: the output layer and every block but the first
    assert "the experts of all" in off.note and "and the first layer whole" in off.note


def _bisect_reference(spec: ModelSpec, base: RunConfig, kv: tuple[GGMLType, GGMLType], fa: bool, budget) -> int:  # type: ignore[no-untyped-def]
    """The plain bisection max_context used before it learned to interpolate: the answer to match."""
    from kvadvise.planner.policy import config_at as _cfg

    cap = max(CTX_PAD, spec.n_ctx_train // CTX_PAD * CTX_PAD) if spec.n_ctx_train else 1 << 20

    def fits(n: int) -> bool:
        return budget.fits(estimate(spec, _cfg(base, n, kv, fa, budget.device)))

    lo, hi = 0, cap // CTX_PAD
    if not fits(CTX_PAD):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CTX_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


@pytest.mark.parametrize(
    "name", ["qwen3-coder-30b", "gemma3-27b", "gpt-oss-20b", "qwen3.5-35b-a3b", "deepseek-v3", "mistral-7b"]
)
def test_max_context_search_equals_bisection_on_every_budget(name: str) -> None:
    """The interpolating search finds exactly what bisection finds: over budgets from "nothing fits"
    to "everything fits", FA on and off (FA off: the scores grow with the context, not linear), with
    one and four slots and two GPUs."""
    spec = hf_spec(name, 12 * GIB)
    checked = set()
    for free_mib in range(12 * 1024, 96 * 1024, 1531):  # odd steps: budgets fall between multiples of 256
        for n_gpu in (1, 2):
            each = free_mib * MIB // n_gpu
            hw = Hardware(
                tuple(Gpu(i, "NVIDIA RTX A6000", each, each, 0, None, None) for i in range(n_gpu)),
                64 * GIB,
                60 * GIB,
                "t",
            )
            budget = budget_for(hw)
            kvs = ((True, (Q8, Q8), 1), (False, (F16, F16), 4)) + (() if spec.is_mla else ((True, (F16, Q4), 1),))
            for fa, kv, n_par in kvs:
                base = RunConfig(flash_attn="on" if fa else "off", device="cuda", n_parallel=n_par)
                got = max_context(spec, base, kv, fa, budget)
                assert got == _bisect_reference(spec, base, kv, fa, budget), (free_mib, n_gpu, fa, kv, n_par)
                checked.add(got)
    assert 0 in checked and len(checked) > 20  # the sweep spans "nothing fits" to long contexts


def test_a_fixed_ctx_offloads_as_the_recommendation_does(tmp_path: Path) -> None:
    """One plan_offload for both: `--ctx N --allow-cpu` and a recommendation aiming at N plan the same
    offload with the same notes, from the policy's cache types (--repeatable: f16 only)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_tiny_gguf

    from kvadvise.model.architecture import from_gguf
    from kvadvise.model.gguf import read_file
    from kvadvise.planner.memory import layer_kv_bytes, resolve
    from kvadvise.planner.planning import make_plan

    spec = from_gguf(read_file(write_tiny_gguf(tmp_path / "m.gguf", "mixtral")))
    cfg = RunConfig(n_ctx=4096, flash_attn="on", device="cuda")
    full = estimate(spec, cfg)
    kv = layer_kv_bytes(spec, resolve(spec, cfg))
    rest0 = spec.layer_bytes[0] - spec.expert_bytes // spec.n_layer + sum(kv[0])
    hw = _hw(full.device_bytes - spec.expert_bytes - rest0 // 2)  # f16: every expert and one whole layer
    rec = recommend(spec, RunConfig(), budget_for(hw), Policy(target_ctx=4096, repeatable=True, allow_cpu=True))
    plan = make_plan(
        spec, cfg, recommend_ctx=False, hw=hw, policy=Policy(repeatable=True, allow_cpu=True, headless=True)
    )
    assert plan.budget == budget_for(hw)  # headless: no display allowance; a file's weights: no 3 %
    assert rec.offload is not None and plan.offload == rec.offload
    assert [n for n in plan.notes if "partial offload" in n] == [
        r for r in rec.reasons if r.startswith("partial offload")
    ]
    off = rec.offload
    assert (off.type_k, off.type_v, off.n_cpu_moe, off.n_cpu_layers) == (GGMLType.F16, GGMLType.F16, spec.n_layer, 1)


@pytest.mark.parametrize("flags", [("-np", "3000"), ("--users", "3000"), ("-np", "3000", "--use", "long")])
def test_the_context_search_stays_within_what_c_takes_over_all_slots(
    flags: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """mistral-nemo:12b (1,024,000 tokens trained) with 3,000 slots: the search for the largest context per slot
    began at the training context, 3,072,000,000 tokens over all slots, past llama.cpp's int32 -c, and the
    answer was exit 2 'n_ctx must be a whole number from 0 to 2,147,483,647 ..., got 3072000000' for a --ctx
    nobody gave. The search starts at the most -c can hold over the slots."""
    from ollama_fake import closed_port_url

    from kvadvise.cli import main

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    rc = main(["ollama", "mistral-nemo:12b", "--gpu", "rtx-4090", "--ram", "64GiB", *flags, "--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 3) and "n_ctx must be" not in err, err
    doc = json.loads(out)
    assert 0 < doc["config"]["n_ctx"] <= 2**31 - 1
