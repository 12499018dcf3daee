"""Round 7 of the red team (a reviewer in its own worktree): the Python API against the command line, `kvadvise
hf`'s config.json fields, `--runtime`, and flags that contradict each other (--min-ctx, --users, --n-cpu-moe,
--gpu-only). Each test reproduces one defect of the code at 42b47c6, where it fails; its docstring gives the command,
what happened and what should happen."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from attack_helpers import one_line_input_error as _one_line_input_error
from live_state import without_live_ram
from tinymodels import write_tiny_gguf

import kvadvise
from kvadvise.errors import KvadviseError

GiB = 1 << 30
HF = Path(__file__).resolve().parent / "data" / "hf"


def _config(
    tmp_path: Path, source: str, *, drop: tuple[str, ...] = (), changes: dict[str, object] | None = None
) -> Path:
    """A copy of tests/data/hf/SOURCE (without its _source note), keys dropped or changed."""
    config = json.loads((HF / source).read_text())
    config.pop("_source", None)
    for key in drop:
        config.pop(key)
    config.update(changes or {})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


MOE_DIMS = dict(n_layer=8, n_embd=2048, n_head=32, n_head_kv=4, head=128, n_ff=6144, n_expert=128, n_expert_used=8)


# --- 1. and 2. --runtime library|llama-cli ------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["library", "llama-cli"])
def test_llamacpp_runtime_is_the_one_the_json_names_and_the_api_gives(
    runtime: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-3060 --ctx 8192 --runtime library --json`: the document
    says `"runtime": "llama-server"` (its compute_bytes are the library's 526 MiB: the whole batch's logits) and
    carries a `llama_server` command; `kvadvise.to_json(kvadvise.plan(path, PlanRequest(...), runtime="library"))`
    says `"runtime": "library"` and has no `llama_server`. backends/llamacpp/commands.py makes
    `LlamaServer(program=f.runtime)`, whose name stays "llama-server" (advisor/runtime/llamaserver.py), while the API
    and `kvadvise gguf --runtime library` use kvadvise.runtime.library's runtimes. docs/json.md: `runtime` is "the
    runtime the plan is for (llama-server, llama-cli, library...)"; docs/python-api.md: to_json(plan) "is exactly
    the document --json prints for the same request, for every runtime". Expected: one document, naming the
    runtime asked for."""
    args = ["llamacpp", str(gemma_path), "--gpu", "rtx-3060", "--ctx", "8192", "--ram", "32GiB", "--runtime", runtime]
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    cli_doc = without_live_ram(json.loads(out))
    request = kvadvise.PlanRequest(gpu="rtx-3060", n_ctx=8192, ram_bytes=32 * GiB)
    api_doc = without_live_ram(kvadvise.to_json(kvadvise.plan(str(gemma_path), request, runtime=runtime)))
    assert cli_doc["runtime"] == runtime, f"--runtime {runtime} printed runtime {cli_doc['runtime']!r}"
    assert cli_doc == api_doc


def test_the_runtime_help_does_not_say_llama_cli_reserves_the_whole_batch() -> None:
    """`kvadvise llamacpp --help` (every plan command): "--runtime [llama-server|llama-cli|library] ... llama-cli
    also stands for llama-bench, the library and its bindings (llama-cpp-python, LM Studio) and llama-servers built
    before mid-2026, which reserve them for the whole batch". That is the old meaning: llama-cli is now planned as
    llama-server (its context since ggml-org/llama.cpp#17824), and `library` is the runtime of llama-bench and the
    bindings (docs/commands.md --runtime; advisor/runtime/library.py). A llama-cpp-python user who follows the help
    picks llama-cli and is planned 500 MiB short (gemma 3 270M at 8k: compute 36 MiB with llama-cli, 526 MiB with
    library). advisor/ui/flags.py, the --runtime option's help. Expected: the help says what the code does."""
    from kvadvise.cli import cli

    command = cli.commands["llamacpp"]
    option = next(p for p in command.params if p.name == "runtime")
    text = " ".join((getattr(option, "help", "") or "").split())
    assert not re.search(r"llama-cli[^.;]*whole batch", text), text


# --- 3. to 5. the Python API: recommend, plan with hardware, plan with a RunConfig -----------------------------


@pytest.mark.parametrize(
    ("policy", "margin"),
    [
        (kvadvise.Policy(fixed_kv=("q8_0", "q8_0")), None),  # AttributeError: 'str' object has no attribute ...
        (kvadvise.Policy(quality="x"), None),  # AttributeError: ... 'rejects'
        (None, 10**30),  # accepted: a margin of 10^30 bytes, "0.00 GiB" budget, fits False
    ],
    ids=["fixed_kv-names", "quality-str", "margin-1e30"],
)
def test_recommend_checks_its_arguments_as_plan_does(gemma_path: Path, policy: Any, margin: Any) -> None:
    """`kvadvise.recommend(spec, kvadvise.gpu_profile("4090"), kvadvise.Policy(fixed_kv=("q8_0", "q8_0")))`: an
    AttributeError ("'str' object has no attribute 'type_name'"), where `kvadvise.plan(spec, hardware=hw,
    policy=...)` takes the same Policy (docs/python-api.md: "a cache type a GGMLType or its name"); with
    `Policy(quality="x")` another AttributeError ('rejects'); with `margin_bytes=10**30` a Recommendation (fits
    False, "a 953,674,316,406,250,018,963,456 MiB margin") where plan() refuses it ("Invalid value for '--margin':
    ... not in the range 0<=x<=9223372036854775807"). advisor/api.py recommend: _policy checks only what
    _policy_request copies (not fixed_kv's names for the recommender, nor quality), _margin no upper bound.
    docs/python-api.md: a wrong argument raises kvadvise.errors.InputError, "never an AttributeError from inside".
    Expected: the Policy planned as plan() plans it, or a KvadviseError (exit 2) naming the field."""
    spec = kvadvise.load_model(str(gemma_path))
    hw = kvadvise.gpu_profile("4090")
    kwargs: dict[str, Any] = {} if margin is None else {"margin_bytes": margin}
    try:
        kvadvise.recommend(spec, hw, policy, **kwargs)
    except KvadviseError as e:
        assert e.exit_code == 2, e.message
        return
    except Exception as e:  # the defect: an exception from inside
        pytest.fail(f"{type(e).__name__}: {e}")
    if margin is not None:
        with pytest.raises(KvadviseError):  # what plan() says of the same margin
            kvadvise.plan(spec, hardware=hw, margin_bytes=margin)
        pytest.fail(f"recommend() took margin_bytes={margin}, which plan() refuses")


@pytest.mark.parametrize(
    "request_fields",
    [{"gpu": "rtx-3090"}, {"vram_bytes": (8 * GiB,)}],
    ids=["gpu", "vram_bytes"],
)
def test_plan_never_drops_the_card_a_request_names(gemma_path: Path, request_fields: dict[str, Any]) -> None:
    """`kvadvise.plan(spec, kvadvise.PlanRequest(gpu="rtx-3090"), hardware=kvadvise.gpu_profile("4090"))`: a plan
    for the RTX 4090, without a word about the 3090 the request names (likewise `vram_bytes=(8 GiB,)`: planned on
    the 4090's 24 GiB). advisor/api.py plan passes ``hardware`` to entry.plan_for, which takes it over the
    request's own cards. The request's check refuses every other pair of hardware that contradict each other
    ("give --gpu or --vram, not both", "--rpc ... without --gpu/--vram"): advisor/request.py _check_together,
    "refused (exit 2) rather than one silently winning". Expected: a KvadviseError (exit 2), or the card the
    request names."""
    spec = kvadvise.load_model(str(gemma_path))
    try:
        plan = kvadvise.plan(spec, kvadvise.PlanRequest(**request_fields), hardware=kvadvise.gpu_profile("4090"))
    except KvadviseError as e:
        assert e.exit_code == 2, e.message
        return
    assert plan.hardware is not None
    names = [g.name for g in plan.hardware.gpus]
    budgets = [g.free_bytes for g in plan.hardware.gpus]
    assert "NVIDIA GeForce RTX 4090" not in names or budgets == [8 * GiB], (names, budgets)


@pytest.mark.parametrize(
    "field",
    [{"runtime": "library"}, {"sampling_penalties": True}],
    ids=["runtime", "sampling_penalties"],
)
def test_plan_with_a_run_config_keeps_its_fields(gemma_path: Path, field: dict[str, Any]) -> None:
    """`kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=8192, runtime="library"), hardware=kvadvise.gpu_profile("4090"))`:
    compute 36 MiB and `plan.config.runtime == "llama-server"`, where `kvadvise.estimate(spec, RunConfig(n_ctx=8192,
    device="cuda", runtime="library"))` of the very RunConfig gives 526 MiB; `RunConfig(sampling_penalties=True)`
    decodes at 409 t/s, where `PlanRequest(n_ctx=8192, sampling_penalties=True)` decodes at 171 t/s.
    advisor/api.py _config_request copies a RunConfig into a PlanRequest field by field and leaves out `runtime`
    and `sampling_penalties` (among others) without a word. docs/python-api.md: "or a RunConfig, whose context is
    fixed"; nothing says some of its fields are ignored. Expected: the field planned, or a KvadviseError naming it
    (e.g. "give runtime= to plan()")."""
    spec = kvadvise.load_model(str(gemma_path))
    hw = kvadvise.gpu_profile("4090")
    try:
        plan = kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=8192, **field), hardware=hw)
    except KvadviseError as e:
        assert e.exit_code == 2 and next(iter(field)) in e.message, e.message
        return
    if "runtime" in field:
        direct = kvadvise.estimate(spec, kvadvise.RunConfig(n_ctx=8192, device="cuda", runtime="library"))
        assert plan.estimate.compute_bytes == direct.compute_bytes, (plan.config.runtime, plan.estimate.compute_bytes)
    else:
        asked = kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=8192, sampling_penalties=True), hardware=hw)
        ours = kvadvise.to_json(plan)["decode_estimate"]["tokens_per_s"]
        assert ours == kvadvise.to_json(asked)["decode_estimate"]["tokens_per_s"], ours


# --- 6. and 7. --min-ctx --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--target-ctx", "8k", "--min-ctx", "16k"],
        ["--use", "chat", "--min-ctx", "16k"],
        ["--ctx", "8k", "--min-ctx", "16k"],
    ],
    ids=["target-below-min", "use-below-min", "ctx-below-min"],
)
def test_min_ctx_that_contradicts_the_context_asked_for(
    flags: list[str], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --target-ctx 8k --min-ctx 16k` (or `--use chat`,
    8k): exit 3, "nothing reaches --min-ctx 16,384: the best is f16/f16 at 32,768 tokens" (which does reach it) and
    the hint "would fit with a larger memory budget" (the model fits with 21 GiB spare); planner/recommender.py
    compares the min with the target-capped context and blames memory. With `--ctx 8k --min-ctx 16k` it is the other
    way round: exit 0, 8,192 tokens, --min-ctx dropped without a word (docs/commands.md: "--min-ctx: Fail (exit 3)
    if less than this fits per sequence"). advisor/request.py _check_together refuses every other such pair
    (--ctx with --use/--target-ctx, --use with --target-ctx). Expected: refused as contradictory flags (exit 2,
    one line), or a plan that honours both (reaching --min-ctx, exit 0)."""
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ram", "32GiB", *flags, "--json")
    if rc == 2:
        _one_line_input_error(rc, err)
        return
    assert rc == 0, (rc, err)
    assert json.loads(out)["config"]["n_ctx_seq"] >= 16384, "a plan below --min-ctx, exit 0"


def test_min_ctx_counts_the_plan_that_runs_part_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama llama3.1:70b --gpu rtx-4090 --ram 128GiB --allow-cpu --min-ctx 8k`: exit 3, "nothing reaches
    --min-ctx 8,192: the best is f16/f16 at 0 tokens", hint "would fit with 20.08 GiB more memory". The same command
    without --min-ctx plans 65,536 tokens with part of the model on the CPU (exit 0), which reaches 8,192 eight
    times over; --allow-cpu asks for exactly such a plan. planner/recommender.py raises DoesNotFit for --min-ctx on
    the GPU-only figure before plan_offload is ever tried. (Also without --allow-cpu: a plan that does not fit the
    GPU at all gets the partial offload anyway, docs/policy.md, yet --min-ctx fails it.) Expected: the partial plan
    at >= 8,192 tokens (exit 0), as the command without --min-ctx gives."""
    base = ["ollama", "llama3.1:70b", "--gpu", "rtx-4090", "--ram", "128GiB", "--allow-cpu", "--json"]
    rc, out, err = run(capsys, *base)
    assert rc == 0 and json.loads(out)["offload"] is not None, err  # it runs, part on the CPU
    rc, out, err = run(capsys, *base, "--min-ctx", "8k")
    assert rc == 0, err
    assert json.loads(out)["offload"]["n_ctx"] >= 8192  # the plan that runs: part of the model on the CPU


# --- 8. and 9. --n-cpu-moe beside --users and --gpu-only ----------------------------------------------------------


def test_users_answer_is_for_the_experts_n_cpu_moe_keeps_in_ram(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp moe.gguf --gpu rtx-4060 --users 4 --n-cpu-moe 8 --target-ctx 8k` (a 128-expert Qwen3-MoE
    of 8 layers, f16: 9.29 GiB, 9.00 GiB of them routed experts): "4 users at 8k each ... : no; at most 0; 4 take
    10.58 GiB", and right below, the plan for those very 4 slots: "8,192 tokens x 4 slots ... fits 100% on the
    GPU; memory: 1.58 GiB of 6.50 GiB" (--json: users.fits false, fits true). kvadvise.planner.users sizes the
    sessions with estimate() of plan.config, without the experts --n-cpu-moe keeps in RAM (entry._plan_users), and
    also gives 137 t/s each where the plan decodes at 18. docs/several-models.md: "At most M is the plan's own test".
    Expected: the users' answer for the placement the plan runs (4 fit)."""
    moe = write_tiny_gguf(tmp_path / "moe.gguf", "qwen3moe", dims={**MOE_DIMS, "n_ff_exp": 768}, sparse=True)
    args = ["llamacpp", str(moe), "--gpu", "rtx-4060", "--ram", "64GiB", "--users", "4", "--n-cpu-moe", "8"]
    rc, out, err = run(capsys, *args, "--target-ctx", "8k", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fits"] is True and doc["config"]["n_parallel"] == 4
    assert doc["users"]["fits"] is True and doc["users"]["max_users"] >= 4, doc["users"]


def test_gpu_only_is_not_planned_with_experts_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise llamacpp moe.gguf --gpu rtx-4090 --ctx 8k --n-cpu-moe 4 --gpu-only`: exit 0, "fits 100% on the
    GPU", and the command `... -ngl 999 --n-cpu-moe 4`, which keeps the routed experts of 4 layers (4.5 GiB) in RAM
    (the plan's own note says so). docs/commands.md: "--gpu-only: 100% on the GPU or nothing: no partial offload";
    advisor/request.py _check_together refuses --n-cpu-moe beside --allow-cpu and --device cpu, but not beside
    --gpu-only, and the verdict line counts the plan as 100% on the GPU. Expected: the two refused together (exit 2),
    or a plan that is not called 100% on the GPU."""
    moe = write_tiny_gguf(tmp_path / "moe.gguf", "qwen3moe", dims={**MOE_DIMS, "n_ff_exp": 768}, sparse=True)
    args = ["llamacpp", str(moe), "--gpu", "rtx-4090", "--ram", "64GiB", "--ctx", "8k", "--n-cpu-moe", "4"]
    rc, out, err = run(capsys, *args, "--gpu-only")
    if rc == 2:
        _one_line_input_error(rc, err)
        return
    verdict = out.strip().splitlines()[0]
    assert not (rc == 0 and "100% on the GPU" in verdict), verdict


# --- 10. to 14. kvadvise hf ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [{"num_experts": 0}, {"num_experts_per_tok": 0}], ids=["experts-0", "used-0"])
def test_a_moe_config_with_no_experts_is_refused(
    change: dict[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf config.json --quant Q4_K_M --gpu rtx-4090` with Qwen3-Coder-30B-A3B's config and
    `"num_experts": 0`: exit 0, "fits 100% on the GPU", weights 1.88 GiB (a 30B model planned as a dense 3B); with
    `"num_experts_per_tok": 0` likewise (exit 0, a MoE whose decode reads no expert). llama.cpp refuses both
    (src/models/qwen3moe.cpp: "n_expert must be > 0 for QWEN3MOE", "n_expert_used must be > 0 for QWEN3MOE").
    advisor/model/hfconfig.py _check refuses num_key_value_heads 0 and head_dim 0 for that reason, not these.
    Expected: exit 2, one line naming the field."""
    path = _config(tmp_path, "qwen3-coder-30b.json", changes=dict(change))
    rc, _, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "--gpu", "rtx-4090", "--ram", "64GiB")
    _one_line_input_error(rc, err)
    assert next(iter(change)) in err, err


def test_moe_expert_width_defaults_as_llama_cpp_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf config.json --quant Q4_K_M --gpu rtx-4090` with Qwen3-Coder-30B-A3B's config less its
    `moe_intermediate_size` (convert_hf_to_gguf.py then writes no expert_feed_forward_length): 208,101,965,824
    parameters, weights 130.46 GiB, "does not fit" (the full config: 30.5 billion, 17.41 GiB). kvadvise sizes each
    expert at intermediate_size (6144; advisor/model/architecture.py: "expert_feed_forward_length, else
    feed_forward_length"; conversion/qwen.py writes the key only when the config has it), but llama.cpp's qwen3moe takes `n_ff_exp = hparams.n_ff_exp() ? ... : n_ff /
    n_expert_used` (src/models/qwen3moe.cpp), 6144 / 8 = 768, the very width the full config gives. Expected: the
    same weights with and without the key (here)."""
    full = _config(tmp_path, "qwen3-coder-30b.json")
    rc, out, err = run(capsys, "hf", str(full), "--quant", "Q4_K_M", "--no-hardware", "--ctx", "4096", "--json")
    assert rc == 0, err
    expected = json.loads(out)["memory"]["weights_bytes"]
    path = _config(tmp_path, "qwen3-coder-30b.json", drop=("moe_intermediate_size",))
    rc, out, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "--no-hardware", "--ctx", "4096", "--json")
    if rc == 2:  # refused: llama.cpp's fallback (intermediate_size 5472 / 8 = 684) is not the checkpoint's 768
        _one_line_input_error(rc, err)
        assert "moe_intermediate_size" in err, err
        return
    assert rc == 0, err
    got = json.loads(out)["memory"]["weights_bytes"]
    assert abs(got - expected) <= expected // 100, f"{got / GiB:.2f} GiB vs {expected / GiB:.2f} GiB"


@pytest.mark.parametrize("vocab", [0, None], ids=["vocab_size-0", "vocab_size-missing"])
def test_a_config_without_a_vocabulary_is_not_planned_without_embeddings(
    vocab: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf config.json --quant Q4_K_M --gpu rtx-4090` with Qwen3-8B's config and `"vocab_size": 0` (or no
    vocab_size): exit 0, "fits 100% on the GPU", weights 3.96 GiB (4.67 with its 151,936 tokens), JSON
    `model.n_vocab: 0`, `verified: true`: no token embedding, no output matrix, no logits, without a word.
    convert_hf_to_gguf.py never makes that file (conversion/base.py get_vocab_base: vocab_size from the config,
    else the tokenizer's count, then `assert max(tokenizer.vocab.values()) < vocab_size`: a 0 fails, a missing key
    is the tokenizer's vocabulary).
    advisor/model/hfconfig.py _vocab writes nothing for a missing key and _check lets 0 through (it refuses a 0 in
    num_key_value_heads and head_dim for this very reason). Expected: exit 2 naming vocab_size, or a vocabulary
    planned."""
    drop = ("vocab_size",) if vocab is None else ()
    changes: dict[str, object] = {} if vocab is None else {"vocab_size": vocab}
    path = _config(tmp_path, "qwen3-8b.json", drop=drop, changes=changes)
    rc, out, err = run(capsys, "hf", str(path), "--quant", "Q4_K_M", "--gpu", "rtx-4090", "--ram", "64GiB", "--json")
    if rc == 2:
        _one_line_input_error(rc, err)
        assert "vocab" in err, err
        return
    assert rc == 0, err
    assert json.loads(out)["model"]["n_vocab"] > 0, "planned with no vocabulary"


def test_a_config_without_weights_does_not_silently_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise hf config.json --gpu rtx-4090` with gpt-oss-20b's config.json alone (no safetensors index beside it,
    no --quant, no --weights-bytes): exit 0, "config.json on NVIDIA GeForce RTX 4090: 65,536 tokens, K/V f16: fits
    100% on the GPU", "memory: 1.99 GiB of 22.49 GiB (20.50 GiB spare): weights 0 MiB" for a 13 GB model. The
    reason (backends/hf.py: "weights unknown (no safetensors index found): counted as 0; pass --weights-bytes or
    --quant") is in JSON model.notes only: the default output never prints it, where `kvadvise ollama` prints its
    own ("the server listed no tensors: weights unknown (counted as 0)"). Expected: refused (exit 2, "pass --quant or
    --weights-bytes"), or at least the default output telling that the weights were counted as 0."""
    path = _config(tmp_path, "gpt-oss-20b.json")
    rc, out, err = run(capsys, "hf", str(path), "--gpu", "rtx-4090", "--ram", "64GiB")
    if rc == 2:
        _one_line_input_error(rc, err)
        return
    assert "--weights-bytes" in out + err or "counted as 0" in out + err, out


@pytest.mark.parametrize("quant", ["MXFP4_MOE", "Q4_K", "Q5_K", "Q3_K"])
def test_hf_quant_takes_every_name_llama_quantize_takes(
    quant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise hf gpt-oss-20b.json --quant MXFP4_MOE --gpu rtx-4090`: exit 2, "unknown quant 'MXFP4_MOE'"; `--quant
    Q4_K` (Q5_K, Q3_K) likewise. tools/quantize/quantize.cpp QUANT_OPTIONS (llama.cpp 0c1e570) lists MXFP4_MOE (the
    quant gpt-oss is published in) and Q3_K, Q4_K, Q5_K ("alias for Q4_K_M"...); docs/commands.md: "--quant Q4_K_M
    (any llama.cpp quant: Q2_K ... Q8_0, IQ*, F16, BF16)". advisor/model/quants.py QUANT_BPW has neither (yet its
    _DEFAULT_TYPE knows MXFP4_MOE). Expected: planned (the aliases as their _M quant)."""
    path = _config(tmp_path, "gpt-oss-20b.json")
    args = ["hf", str(path), "--no-hardware", "--ctx", "4096", "--json", "--quant"]
    rc, out, err = run(capsys, *args, quant)
    assert rc == 0, err
    weights = json.loads(out)["memory"]["weights_bytes"]
    if quant == "MXFP4_MOE":
        assert weights > 9 * GiB, weights  # gpt-oss-20b's experts at MXFP4's 4.25 bits alone are 9.4 GiB
        return
    rc, out, err = run(capsys, *args, f"{quant}_M")  # "alias for Q4_K_M"
    assert rc == 0, err
    assert weights == json.loads(out)["memory"]["weights_bytes"]


# --- 15. where the build came from ----------------------------------------------------------------------------------


def test_a_build_from_the_environment_is_not_credited_to_the_flag(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`KVADVISE_LLAMA_BUILD=b9000 kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-3060` (no --llama-build on
    the command line): "note: planned for llama.cpp b9000 (--llama-build): the memory rules of that build"; the
    Python API says the same. A user who never typed --llama-build is told they did, and not where b9000 came from
    (a shell profile, a CI setting): click fills the option from the variable (advisor/ui/flags.py), entry's
    _llama_build reads it for the API, and runtime/llamabuild.choose labels every bNNNN "--llama-build". The
    variable's own errors already name it ("KVADVISE_LLAMA_BUILD='0' (in the environment): ..."). Expected: the note
    names KVADVISE_LLAMA_BUILD."""
    monkeypatch.setenv("KVADVISE_LLAMA_BUILD", "b9000")
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-3060", "--ram", "32GiB")
    assert rc == 0, err
    note = next(ln for ln in out.splitlines() if "planned for llama.cpp b9000" in ln)
    assert "KVADVISE_LLAMA_BUILD" in note and "(--llama-build)" not in note, note


def test_a_card_count_in_other_scripts_digits_is_no_count(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise gguf MODEL --gpu rtx-4090x١` (an Arabic-Indic one): planned as one RTX 4090, since the NAMExN
    pattern's \\d matched any Unicode digit and int() read it (the round's reviewer, "confirmed but not filed").
    A count is ASCII digits, as every other number kvadvise reads: now an unknown card, exit 2."""
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-4090x\u0661")
    _one_line_input_error(rc, err)
