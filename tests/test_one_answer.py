"""One question, one answer: the Python API and the command line plan through one entry
(kvadvise.entry.plan_for) from one checked request (kvadvise.request.PlanRequest), so the same question
gets the same document, whichever face asks it, for every runtime.

Each case is written once, as flags and as the request's fields; the API's ``to_json(plan)`` must equal
the command's ``--json`` (less what is read live: the RAM free this moment)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from live_state import without_live_ram

import kvadvise
from kvadvise.cli import main
from kvadvise.errors import KvadviseError

# (flags, the same as PlanRequest fields); the hardware is a card of the built-in list
CASES: list[tuple[list[str], dict[str, Any]]] = [
    ([], {}),
    (["--ctx", "0"], {"n_ctx": 0}),
    (["--ctx", "8192"], {"n_ctx": 8192}),
    (["--ctx", "64k"], {"n_ctx": 65536}),
    (["-ctk", "q8_0", "-ctv", "q8_0"], {"type_k": "q8_0", "type_v": "q8_0"}),
    (["--ctx", "16384", "-ctk", "q8_0"], {"n_ctx": 16384, "type_k": "q8_0"}),
    (["--use", "code"], {"use": "code"}),
    (["--target-ctx", "128k", "--allow-q4"], {"target_ctx": 131072, "allow_q4": True}),
    (["-np", "2", "--margin", "512MiB"], {"n_parallel": 2, "margin_bytes": 512 << 20}),
    (["--gpu-only", "--headless"], {"gpu_only": True, "headless": True}),
]
# the RAM stated on both faces: free RAM read live moments apart would let a partial plan's prompt cache differ
RAM = 64 << 30
CARDS = ("rtx-4090", "rtx-3060-12gb", "rtx-4060", "m4-max-64gb")
OLLAMA_MODELS = ("qwen3-coder", "gemma3:4b", "llama3.1:8b", "gpt-oss:20b", "qwen3:32b", "deepseek-r1:8b")


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc = main([*args, "--json"])
    out = capsys.readouterr().out
    return rc, without_live_ram(json.loads(out))


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize(("flags", "fields"), CASES, ids=[" ".join(c[0]) or "default" for c in CASES])
def test_ollama_the_api_and_the_cli_agree(
    card: str, flags: list[str], fields: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    if "-ctk" in flags and fields.get("type_k") and not fields.get("type_v"):
        fields = {**fields, "type_v": fields["type_k"]}  # Ollama: -ctk alone is the one cache type
    for model in OLLAMA_MODELS[:3] if card != "rtx-4090" else OLLAMA_MODELS:
        rc, cli_doc = _cli(capsys, "ollama", model, "--gpu", card, "--ram", "64GiB", *flags)
        plan = kvadvise.plan(model, kvadvise.PlanRequest(gpu=card, ram_bytes=RAM, **fields), runtime="ollama")
        assert rc == (3 if plan.runnable is False else 0), (model, card, flags)
        assert without_live_ram(kvadvise.to_json(plan)) == cli_doc, (model, card, flags)
        assert cli_doc["runtime"] == "ollama" and "ollama" in cli_doc


@pytest.mark.parametrize(("flags", "fields"), CASES, ids=[" ".join(c[0]) or "default" for c in CASES])
def test_llama_server_the_api_and_the_cli_agree(
    flags: list[str], fields: dict[str, Any], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise gguf` (llama-server, no command line) and `kvadvise llamacpp` (with it) against the API given a
    ModelSpec and a model reference."""
    spec = kvadvise.load_model(str(gemma_path))
    request = kvadvise.PlanRequest(vram_bytes=(640 << 20,), ram_bytes=RAM, **fields)
    _, cli_doc = _cli(capsys, "gguf", str(gemma_path), "--vram", "640MiB", "--ram", "64GiB", *flags)
    assert without_live_ram(kvadvise.to_json(kvadvise.plan(spec, request))) == cli_doc, flags
    _rc, cli_doc = _cli(capsys, "llamacpp", str(gemma_path), "--vram", "640MiB", "--ram", "64GiB", *flags)
    doc = without_live_ram(kvadvise.to_json(kvadvise.plan(str(gemma_path), request)))
    assert doc == cli_doc and doc["llama_server"]["command"].startswith("llama-server -m "), flags


@pytest.mark.parametrize(("device", "prefix"), [("rocm", "ROCm"), ("vulkan", "Vulkan"), ("cuda", "CUDA")])
def test_the_backend_of_a_card_given_by_size(
    device: str, prefix: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--vram --bandwidth --device rocm|vulkan`: the API's PlanRequest(device=...) answers as the command does,
    the buffers are named after the backend (llama.cpp's ROCm0, Vulkan0) and the speed uses its factors."""
    from kvadvise.planner import speed

    flags = ["--vram", "2GiB", "--bandwidth", "1024", "--ram", "64GiB", "--device", device]
    request = kvadvise.PlanRequest(vram_bytes=(2 << 30,), bandwidth_gbs=1024, ram_bytes=RAM, device=device)
    _rc, cli_doc = _cli(capsys, "llamacpp", str(gemma_path), *flags)
    doc = without_live_ram(kvadvise.to_json(kvadvise.plan(str(gemma_path), request)))
    assert doc == cli_doc
    assert [d["name"] for d in doc["memory"]["devices"] if d["name"] != "CPU"] == [f"{prefix}0"]
    assert f"({device})" in doc["speed_note"] or f"({device}, its default class assumed" in doc["speed_note"]
    # the same card on CUDA reads at CUDA's efficiency: the figures differ as the backends' factors do
    cuda = kvadvise.to_json(kvadvise.plan(str(gemma_path), replace(request, device="cuda")))
    assert (doc["decode_tokens_per_s"] == cuda["decode_tokens_per_s"]) == (
        speed.EFFICIENCY[device] == speed.EFFICIENCY["cuda"]
        and speed.LAYER_OVERHEAD_S[device] == speed.LAYER_OVERHEAD_S["cuda"]
    )


def test_a_card_given_by_size_takes_the_class_of_the_catalogue_cards_it_matches(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """32 GiB at 1,024 GB/s on ROCm is what the catalogue's MI50 32GB is (gfx906, the GCN decode class): planned
    as `--gpu mi50-32gb` decodes, by the API as by the command; a size and bandwidth no classed card has (an RX
    7900 XTX's 24 GiB at 960 GB/s) keeps ROCm's default class, and so does CUDA (no classed CUDA card)."""
    rocm = kvadvise.PlanRequest(vram_bytes=(32 << 30,), bandwidth_gbs=1024, ram_bytes=RAM, device="rocm")
    _rc, cli_doc = _cli(capsys, "llamacpp", str(gemma_path), "--vram", "32GiB", "--bandwidth", "1024", "--ram",
                        "64GiB", "--device", "rocm")  # fmt: skip
    doc = without_live_ram(kvadvise.to_json(kvadvise.plan(str(gemma_path), rocm)))
    assert doc == cli_doc
    mi50 = kvadvise.to_json(kvadvise.plan(str(gemma_path), kvadvise.PlanRequest(gpu="mi50-32gb", ram_bytes=RAM)))
    assert doc["decode_tokens_per_s"] == mi50["decode_tokens_per_s"] and "GCN class" in doc["speed_note"]
    default = kvadvise.to_json(kvadvise.plan(str(gemma_path), replace(rocm, vram_bytes=(24 << 30,), bandwidth_gbs=960)))
    assert "(rocm, its default class assumed" in default["speed_note"]
    cuda = kvadvise.to_json(kvadvise.plan(str(gemma_path), replace(rocm, device="cuda")))
    assert cuda["decode_tokens_per_s"] != doc["decode_tokens_per_s"]


def test_ctx_zero_means_the_training_context_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """`--ctx 0` and `n_ctx=0` (a PlanRequest, or a RunConfig as before) plan the model's training context;
    the API recommended 64k for RunConfig(n_ctx=0) while the command line planned 262,144 tokens."""
    spec = kvadvise.load_model("qwen3-coder", backend="ollama")
    hw = kvadvise.gpu_profile("rtx-4090")
    _rc, cli_doc = _cli(capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--ctx", "0")
    for plan in (
        kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=0), hardware=hw, runtime="ollama"),
        kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(n_ctx=0, gpu="rtx-4090"), runtime="ollama"),
    ):
        assert plan.recommendation is None and plan.config.n_ctx == 0
        assert plan.estimate.kv_bytes == cli_doc["memory"]["kv_bytes"]
        assert cli_doc["config"]["n_ctx_seq"] == spec.n_ctx_train == 262144


def test_the_api_plans_only_what_ollama_runs() -> None:
    """Ollama runs one cache type for K and V: its plan never lists q8_0 K / q4_0 V, and it carries the
    Ollama advice (settings, env, apply steps) the command prints."""
    plan = kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(gpu="rtx-4090", allow_q4=True), runtime="ollama")
    assert plan.recommendation is not None
    assert all(o.type_k == o.type_v for o in plan.recommendation.options)
    doc = kvadvise.to_json(plan)
    assert doc["ollama"]["env"]["OLLAMA_KV_CACHE_TYPE"] == plan.config.type_k.type_name
    with pytest.raises(KvadviseError, match="Ollama takes one OLLAMA_KV_CACHE_TYPE"):
        kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(type_k="q8_0", type_v="q4_0"), runtime="ollama")
    with pytest.raises(KvadviseError, match=r"llama\.cpp only; Ollama does not pass it"):
        kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(kv_unified=True), runtime="ollama")


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        (["--ctx", "-5"], {"n_ctx": -5}),
        (["-ctk", "q9"], {"type_k": "q9"}),
        (["--use", "nosuch"], {"use": "nosuch"}),
        (["-np", "0"], {"n_parallel": 0}),
        (["-fa", "maybe"], {"flash_attn": "maybe"}),
        (["--ctx", "4096", "--use", "code"], {"n_ctx": 4096, "use": "code"}),
        (["--gpu", "rtx-4090", "--vram", "8GiB"], {"gpu": "rtx-4090", "vram_bytes": (8 << 30,)}),
        (["--n-cpu-moe", "2", "--allow-cpu"], {"n_cpu_moe": 2, "allow_cpu": True}),
        (["--gpu-only", "--allow-cpu"], {"gpu_only": True, "allow_cpu": True}),
        (["--gpu", "rtx-4090", "--device", "metal"], {"gpu": "rtx-4090", "device": "metal"}),
        (["--gpu", "m4-max-64gb", "--device", "cuda"], {"gpu": "m4-max-64gb", "device": "cuda"}),
        (["--gpu", "rtx-4090", "--device", "rocm"], {"gpu": "rtx-4090", "device": "rocm"}),
        (["--gpu", "mi50-32gb", "--device", "cuda"], {"gpu": "mi50-32gb", "device": "cuda"}),
        (["--gpu", "arc-b580", "--device", "cuda"], {"gpu": "arc-b580", "device": "cuda"}),
        (["--gpu", "m4-max-64gb", "--device", "vulkan"], {"gpu": "m4-max-64gb", "device": "vulkan"}),
        (["--device", "sycl"], {"device": "sycl"}),
    ],
)
def test_the_api_refuses_with_the_cli_message(
    flags: list[str], fields: dict[str, Any], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["gguf", str(gemma_path), *flags])
    err = capsys.readouterr().err
    assert rc == 2, err
    cli_message = err.splitlines()[0].removeprefix("kvadvise: error: ")
    with pytest.raises(KvadviseError) as e:
        kvadvise.plan(kvadvise.load_model(str(gemma_path)), kvadvise.PlanRequest(**fields))
    assert e.value.exit_code == 2
    ours = e.value.message
    if ours.startswith("Invalid value for"):  # click names the flag with its spellings; the reason is the same
        assert ours.split("': ", 1)[1] == cli_message.split("': ", 1)[1], (ours, cli_message)
    else:
        assert ours == cli_message


def test_bad_api_values_raise_domain_errors() -> None:
    """Values the command line cannot even spell, refused by the one check rather than deep inside."""
    spec = kvadvise.load_model("qwen3-coder", backend="ollama")
    hw = kvadvise.gpu_profile("rtx-4090")
    cases = [
        lambda: kvadvise.plan(spec, hardware=hw, policy=kvadvise.Policy(fixed_kv=("q9", "q8_0"))),
        lambda: kvadvise.plan(spec, kvadvise.RunConfig(overhead_bytes=-100 << 30), hardware=hw),
        lambda: kvadvise.plan(spec, kvadvise.PlanRequest(tensor_split=(float("nan"), 1.0), gpu="rtx-3090x2")),
        lambda: kvadvise.estimate(spec, kvadvise.RunConfig(n_ctx=4096, tensor_split=(float("nan"), 1.0))),
        lambda: kvadvise.plan(spec, kvadvise.PlanRequest(vram_bytes=(0,))),
        lambda: kvadvise.plan(spec, kvadvise.PlanRequest(bandwidth_gbs=float("inf"), vram_bytes=(8 << 30,))),
        lambda: kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=True)),  # type: ignore[arg-type]
        lambda: kvadvise.plan(spec, runtime="lmstudio"),
    ]
    for i, call in enumerate(cases):
        with pytest.raises(KvadviseError) as e:
            call()
        assert e.value.exit_code == 2, i
    # a fixed cache type given by name, as -ctk takes it: planned, not a KeyError
    plan = kvadvise.plan(spec, hardware=hw, policy=kvadvise.Policy(fixed_kv=("q8_0", "q8_0")))
    assert plan.config.type_k.type_name == "q8_0"


@pytest.mark.parametrize(
    ("card", "flags", "options"),
    [
        ("rtx-4060-ti-16gb", ["--ollama-version", "0.12.3"], {"ollama_version": "0.12.3"}),
        ("rtx-4060-ti-16gb", ["--ollama-version", "0.11.0", "--ctx", "8192"], {"ollama_version": "0.11.0"}),
        ("rtx-4060-ti-16gb", ["--ollama-version", "0.20.2"], {"ollama_version": "0.20.2"}),
        ("rtx-3060-12gb", ["--ollama-version", "0.13.0", "--platform", "macos"],
         {"ollama_version": "0.13.0", "platform": "macos"}),
        ("m4-max-64gb", ["--runner", "llamacpp", "--ollama-version", "0.32.13"],
         {"runner": "llamacpp", "ollama_version": "0.32.13"}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("model", ["gpt-oss:20b", "qwen2.5-coder:7b", "llama3.1:8b"])
def test_ollamas_own_options_through_the_api(
    model: str,
    card: str,
    flags: list[str],
    options: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kvadvise ollama MODEL --ollama-version X` (and --runner, --platform) asked through the API: a runtime object
    with those options (kvadvise.plugins.BindsModel) plans the same document, Ollama's replayed decision and all."""
    from kvadvise.backends.ollama.runtime import OllamaRuntime

    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:9")  # no server: the release is the one given
    ctx = int(flags[flags.index("--ctx") + 1]) if "--ctx" in flags else None
    rc, cli_doc = _cli(capsys, "ollama", model, "--gpu", card, "--ram", "64GiB", *flags)
    request = kvadvise.PlanRequest(gpu=card, ram_bytes=RAM, n_ctx=ctx)
    plan = kvadvise.plan(model, request, runtime=OllamaRuntime(**options))
    assert rc == (3 if plan.runnable is False else 0)
    assert without_live_ram(kvadvise.to_json(plan)) == cli_doc, (model, flags)


def test_a_bad_ollama_version_through_the_api_is_refused_as_the_command_refuses_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvadvise.backends.ollama.runtime import OllamaRuntime

    rc = main(["ollama", "qwen3:8b", "--gpu", "rtx-4090", "--ollama-version", "0.12.3x"])
    cli_message = capsys.readouterr().err.splitlines()[0].removeprefix("kvadvise: error: ")
    with pytest.raises(KvadviseError) as e:
        kvadvise.plan("qwen3:8b", kvadvise.PlanRequest(gpu="rtx-4090"), runtime=OllamaRuntime(ollama_version="0.12.3x"))
    assert rc == e.value.exit_code == 2 and e.value.message == cli_message


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"runner": "bogus"}, "--runner"),
        ({"platform": ""}, "--platform"),
        ({"mlx_quant": "q4"}, "--mlx-quant"),
        ({"host": 5}, "--host"),
        ({"ollama_version": 11}, "--ollama-version"),
    ],
)
def test_a_bad_ollama_runtime_option_is_refused_as_its_flag(options: dict[str, object], flag: str) -> None:
    """OllamaRuntime(host=5) and ollama_version=11 ended in AttributeError (exit 1), runner="bogus" in "Ollama's MLX
    runner runs on Apple Silicon only", platform="" planned: each is refused as click refuses its flag (exit 2)."""
    from kvadvise.backends.ollama.runtime import OllamaRuntime

    with pytest.raises(KvadviseError) as e:
        OllamaRuntime(**options)  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and e.value.message.startswith(f"Invalid value for '{flag}'"), e.value.message


def test_a_runtime_object_without_options_for_a_model_reference_is_refused() -> None:
    from kvadvise.runtime.llamaserver import LlamaServer

    with pytest.raises(KvadviseError, match="takes a ModelSpec, or give it by name"):
        kvadvise.plan("whatever.gguf", kvadvise.PlanRequest(), runtime=LlamaServer())
