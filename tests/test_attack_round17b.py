"""Round 17b of the red team (a reviewer in its own worktree): "one question, one answer" — the Python API
(kvadvise.plan / recommend / llama_server_command / to_json) against the command line's ``--json`` for the same
request, at 4558b29. A matrix of requests through ``kvadvise.plan(..., PlanRequest(...))`` (GGUFs: the real Gemma 3
270M, tiny MoE and hybrid models; hf configs; built-in Ollama profiles; cards incl. several GPUs and Apple chips,
--vram, --rpc, --device cpu, --ctx/--target-ctx/--min-ctx/--use, -ctk/-ctv, -np, --users, --n-cpu-moe, --allow-cpu,
--gpu-only, --margin, --ram, --ram-bandwidth, --llama-build, --runtime, -md, --mmproj, --ollama-version) agreed
field for field with the CLI (fields ignored: the RAM free this moment, tests/live_state.without_live_ram). Each
test below is a request where a face of the API the docs promise as "the same question" answers differently; each
fails at 4558b29, and its docstring gives both calls, what each said, which is right and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)
from live_state import without_live_ram

import kvadvise
from kvadvise.errors import InputError, KvadviseError

GIB = 1 << 30
MIB = 1 << 20


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc, out, err = run(capsys, *args, "--json")
    assert rc in (0, 3), err
    return rc, without_live_ram(json.loads(out))


# --- 1. hardware= drops the request's --ram (and a Mac's refusal of a --ram past its memory) -------------------


def test_hardware_beside_a_request_keeps_its_ram(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """- `kvadvise gguf gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ram 8GiB --json`: hardware.ram_total_bytes
      8,589,934,592, ram.ram_source "given with --ram", ram.prompt_cache_bytes 7,516,192,768 (cache_ram_mib 7,168).
    - `kvadvise.plan(spec, kvadvise.PlanRequest(ram_bytes=8 GiB), hardware=kvadvise.gpu_profile("rtx-4090"))`:
      hardware.ram_total_bytes = this machine's RAM, ram_source "this machine's, free now", no cache_ram_mib:
      the 8 GiB asked for are gone without a word (api.plan and entry.plan_for use `hardware` as given;
      hardware_of(), which applies ram_bytes through hardware.with_ram, is only called without it).
    - And on a Mac: `kvadvise gguf ... --gpu m4-max-64gb --ram 128GiB`: exit 2, "--ram 128.00 GiB is more than the
      64 GiB of unified memory this Mac has in all" (round 16b); `kvadvise.plan(spec, PlanRequest(ram_bytes=128
      GiB), hardware=kvadvise.gpu_profile("m4-max-64gb"))`: a plan, no error.

    docs/python-api.md: `hardware=` is `--gpu` for "a card you do not own", and what the request names beside it is
    refused or kept, "never dropped" (api.plan's comment). ram_bytes is not refused beside hardware= (only gpu,
    vram_bytes, rpc, no_hardware and device='cpu' are), so it must be kept. Right: the CLI's answer — apply
    `with_ram(hardware, ram_bytes)` (which also refuses the Mac's 128 GiB) when hardware= is given."""
    spec = kvadvise.load_model(str(gemma_path))
    wrong: list[str] = []
    _rc, cli = _cli_json(capsys, "gguf", str(gemma_path), "--gpu", "rtx-4090", "--ram", "8GiB")
    api = without_live_ram(
        kvadvise.to_json(
            kvadvise.plan(spec, kvadvise.PlanRequest(ram_bytes=8 * GIB), hardware=kvadvise.gpu_profile("rtx-4090"))
        )
    )
    for key in ("hardware", "ram"):
        if api[key] != cli[key]:
            wrong.append(f"{key}: api {api[key]} != cli {cli[key]}")
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "m4-max-64gb", "--ram", "128GiB", "--json")
    one_line_input_error(rc, err)
    try:
        kvadvise.plan(spec, kvadvise.PlanRequest(ram_bytes=128 * GIB), hardware=kvadvise.gpu_profile("m4-max-64gb"))
        wrong.append("m4-max-64gb with ram_bytes=128 GiB: a plan; the CLI exits 2")
    except InputError as e:
        assert "unified memory" in e.message
    assert not wrong, "\n".join(wrong)


# --- 2. Ollama: the API plans with a --llama-build the command refuses -----------------------------------------


def test_ollama_refuses_a_llama_build_in_the_api_as_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    """- `kvadvise ollama qwen3-coder --gpu rtx-4090 --ram 64GiB --llama-build b5000 --json`: exit 2, "--llama-build:
      Ollama runs the llama.cpp its release carries; --ollama-version X.Y.Z names the release"
      (backends/ollama/commands.ollama_flags).
    - `kvadvise.plan("qwen3-coder", kvadvise.PlanRequest(gpu="rtx-4090", ram_bytes=64 GiB, llama_build="b5000"),
      runtime="ollama")`: a plan for Ollama made with llama.cpp b5000's memory rules: config.llama_build 5000,
      memory.device_bytes 22,917,316,096 (22,749,281,792 without it), note "planned for llama.cpp b5000
      (--llama-build)" — an answer no Ollama release gives (the build is the release's, shaped.build).

    The refusal lives in the click command only; OllamaRuntime.refused (LLAMACPP_ONLY) does not name llama_build,
    and entry._llama_build lets an explicit build win over the release's pin (`found ... if option == "auto"`).
    docs/python-api.md: "A flag the runtime does not pass to llama.cpp is refused as the command refuses it".
    Right: the command's refusal (InputError, exit 2), from the runtime, for the API and every command alike."""
    rc, _, err = run(
        capsys, "ollama", "qwen3-coder", "--gpu", "rtx-4090", "--ram", "64GiB", "--llama-build", "b5000", "--json"
    )
    one_line_input_error(rc, err)
    with pytest.raises(KvadviseError) as info:
        plan = kvadvise.plan(
            "qwen3-coder",
            kvadvise.PlanRequest(gpu="rtx-4090", ram_bytes=64 * GIB, llama_build="b5000"),
            runtime="ollama",
        )
        pytest.fail(f"planned Ollama with llama.cpp b{plan.config.llama_build}: {plan.estimate.device_bytes:,} bytes")
    assert info.value.exit_code == 2 and "--llama-build" in str(info.value.message)


# --- 3. recommend(): a margin of the whole card is not refused ---------------------------------------------------


def test_recommend_refuses_a_margin_of_the_whole_card(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """- `kvadvise gguf gemma-3-270m-q4_k_m.gguf --gpu rtx-3060 --margin 12GiB --json`: exit 2, "--margin 12,288 MiB is
      the whole card (12,... MiB): nothing is left for the model" (entry.check_margin); `kvadvise.plan(spec,
      hardware=kvadvise.gpu_profile("rtx-3060"), margin_bytes="12GiB")` raises the same InputError.
    - `kvadvise.recommend(spec, kvadvise.gpu_profile("rtx-3060"), margin_bytes="12GiB")`: a Recommendation, budget
      0 bytes, fits False, n_ctx 4,096 — "does not fit" (exit 3's answer) for what the CLI and plan() call a mistyped
      unit (exit 2). 100 GiB alike.

    api.recommend calls plan_budget directly and never check_margin (round 16a put it in api.plan only). The docs
    list recommend() among the functions that answer "the same questions as the CLI" with "Arguments ... checked as
    the CLI checks its flags, with the same messages". Right: InputError from check_margin(margin, hardware.gpus)."""
    spec = kvadvise.load_model(str(gemma_path))
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-3060", "--margin", "12GiB", "--json")
    one_line_input_error(rc, err)
    cli_message = err.splitlines()[0].removeprefix("kvadvise: error: ")
    with pytest.raises(InputError) as plan_info:
        kvadvise.plan(spec, hardware=kvadvise.gpu_profile("rtx-3060"), margin_bytes="12GiB")
    assert plan_info.value.message == cli_message
    with pytest.raises(InputError) as info:
        rec = kvadvise.recommend(spec, kvadvise.gpu_profile("rtx-3060"), margin_bytes="12GiB")  # type: ignore[arg-type]
        pytest.fail(f"a Recommendation: budget {rec.budget.budget_bytes}, fits {rec.fits}, n_ctx {rec.config.n_ctx}")
    assert info.value.message == cli_message


# --- 4. llama_server_command(url, plan): -m URL where --json's run_command says -mu URL ----------------------------


def test_llama_server_command_points_at_the_model_as_run_command_does(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Gemma GGUF served over HTTP (tests/http_fixtures.LoopbackServer), URL U:

    - `kvadvise llamacpp U --gpu rtx-3060 --ram 64GiB --json`: llama_server.run_command
      "llama-server -mu U -c 32768 -np 1 -fa on -ctk f16 -ctv f16 -ngl 999"; `kvadvise.to_json(kvadvise.plan(U,
      request))["llama_server"]["run_command"]`: the same.
    - `kvadvise.llama_server_command(U, plan)`: "llama-server -m U -c 32768 ..." — `-m` takes a local path
      (common/arg.cpp: llama-server fails to open "http://..." as a file); a Hub name ("USER/REPO:Q4_K_M", which
      plan() also takes) becomes `-m USER/REPO:Q4_K_M` in place of `-hf USER/REPO:Q4_K_M`.

    docs/python-api.md: llama_server_command(model_path, plan) is "the llama-server command that runs a plan (...
    as --json's run_command)"; api.llama_server_command builds ModelSource.path(path) whatever the reference is.
    Right: `--json`'s run_command — point llama-server at the model as the llamacpp command does
    (backends.llamacpp.runners.model_source: -mu for a URL, -hf/-hfr for a Hub name, -m for a file)."""
    from http_fixtures import LoopbackServer, Route

    with LoopbackServer() as server:
        url = server.add("/gemma-3-270m-q4_k_m.gguf", Route(file=gemma_path, etag='"gemma-r17b"'))
        _rc, cli = _cli_json(capsys, "llamacpp", url, "--gpu", "rtx-3060", "--ram", "64GiB")
        plan = kvadvise.plan(url, kvadvise.PlanRequest(gpu="rtx-3060", ram_bytes=64 * GIB))
    run_command = cli["llama_server"]["run_command"]
    assert run_command.startswith(f"llama-server -mu {url} ")
    assert kvadvise.to_json(plan)["llama_server"]["run_command"] == run_command
    assert kvadvise.llama_server_command(url, plan) == run_command


# --- 5. hardware=probe_hardware() is not "this machine" as the command plans it -----------------------------------


def _this_machine(monkeypatch: pytest.MonkeyPatch, gpus: tuple[Any, ...]) -> None:
    """This machine's probe (NVML), made to find ``gpus`` and 64 GiB of RAM: for the command (entry.hardware_of ->
    planning.hardware_for -> hardware.probe) and for kvadvise.probe_hardware() alike."""
    from kvadvise.planner import hardware

    found = hardware.Hardware(gpus, 64 * GIB, 60 * GIB, "nvml" if gpus else "none",
                              notes=() if gpus else ("no NVIDIA GPU found (NVML)",))  # fmt: skip
    monkeypatch.setattr(hardware, "probe", lambda: found)


# (fixed: a Hardware whose source is a probe's is this machine: hardware.PROBED_SOURCES)
def test_probe_hardware_given_as_hardware_plans_this_machine_as_the_command_does(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine has an RTX 4090 with a calibration `kvadvise verify llamacpp --save-calibration` stored for it
    (overhead 400 MiB, kvadvise.runtime.calibration):

    - `kvadvise gguf gemma-3-270m-q4_k_m.gguf --ctx 4096 --json` (this machine's GPU, probed): overhead_bytes
      419,430,400, note "overhead from the calibration measured on NVIDIA GeForce RTX 4090 ...".
    - `kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096), hardware=kvadvise.probe_hardware())`: the default CUDA
      overhead, no note: the calibration is never read. entry.plan_for sets `probed = hardware is None and ...`, so a
      Hardware given to the API is never this machine, even when it is exactly what the probe returned.

    The same flag decides `--device cuda` on a machine whose probe finds no GPU: the command estimates for CUDA
    without a budget and says why (entry.without_gpu: "--device cuda: no GPU found here ..."; fits null); the API
    with hardware=kvadvise.probe_hardware() checks a CUDA0 device of 612.95 MiB against the system RAM (budget
    source "ram", reason "fits: needs 612.95 MiB; system RAM has 59.00 GiB"), fits True — the very answer
    without_gpu was written to stop ("The system RAM was taken as the GPU's budget ('-ngl 999 ... FITS')").

    docs/python-api.md: "`kvadvise.probe_hardware()`, this machine" is how the API names the machine the command
    probes. Right: the command's answer — a Hardware whose source is a probe ("nvml", "amdgpu", "none") is this
    machine: read its calibration and apply without_gpu to it as for a probe made by plan_for."""
    from kvadvise.planner.hardware import Gpu
    from kvadvise.runtime import calibration

    gpu = Gpu(0, "NVIDIA GeForce RTX 4090", 24564 * MIB, 24000 * MIB, 0, 1_008_000_000_000, "nvml")
    _this_machine(monkeypatch, (gpu,))
    calibration.save(
        calibration.Calibration(
            device=gpu.name,
            llama_cpp_build="b11312",
            runner="llama-server",
            overhead_bytes=400 * MIB,
            compute_ratio=1.0,
            model="Gemma 3 270m",
            config="-c 4096",
            measured_at="2026-01-01T00:00:00Z",
        )
    )
    spec = kvadvise.load_model(str(gemma_path))
    wrong: list[str] = []
    _rc, cli = _cli_json(capsys, "gguf", str(gemma_path), "--ctx", "4096")
    assert cli["memory"]["overhead_bytes"] == 400 * MIB, cli["memory"]  # the calibration, as the command plans it
    api = without_live_ram(
        kvadvise.to_json(kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096), hardware=kvadvise.probe_hardware()))
    )
    if api["memory"] != cli["memory"] or api["notes"] != cli["notes"]:
        wrong.append(
            f"calibrated RTX 4090: api overhead {api['memory']['overhead_bytes']:,}, notes {api['notes']}; "
            f"cli overhead {cli['memory']['overhead_bytes']:,}, notes {cli['notes']}"
        )
    _this_machine(monkeypatch, ())
    _rc, cli = _cli_json(capsys, "gguf", str(gemma_path), "--ctx", "4096", "--device", "cuda")
    api = without_live_ram(
        kvadvise.to_json(
            kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096, device="cuda"), hardware=kvadvise.probe_hardware())
        )
    )
    if api != cli:
        wrong.append(
            f"no GPU, --device cuda: api device {api['config']['device']}, fits {api.get('fits')}; "
            f"cli device {cli['config']['device']}, fits {cli.get('fits')}, notes {cli['notes'][-1:]}"
        )
    assert not wrong, "\n".join(wrong)
