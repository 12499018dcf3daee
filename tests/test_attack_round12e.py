"""Round 12e of the red team (a reviewer in its own worktree): "one question, one answer" — the Python API
(kvadvise.plan with ``hardware=`` or a RunConfig) against the command line for the same question. Each test
reproduces one defect of the code at d41cffd, where it fails; its docstring gives both calls, what each said, which
is right and why."""

from __future__ import annotations

from pathlib import Path

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (no_server: an autouse fixture)

import kvadvise
from kvadvise.errors import KvadviseError
from kvadvise.planner.hardware import RpcHost


def _api_refused(call) -> KvadviseError:  # type: ignore[no-untyped-def]
    with pytest.raises(KvadviseError) as info:
        call()
    assert info.value.exit_code == 2, info.value
    return info.value


# --- 1. a RunConfig pins the reference build: KVADVISE_LLAMA_BUILD (and the llama-server on PATH) ignored -------


def test_runconfig_plan_reads_the_llama_build_as_the_command_line_does(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KVADVISE_LLAMA_BUILD=b9000 in the environment:

    - `kvadvise gguf gemma-3-270m-q4_k_m.gguf --gpu rtx-3060 --ctx 0 --json`: device_bytes 1,248,538,496 (b9000's
      rules: an f32 mask and the whole batch's logits), note "planned for llama.cpp b9000 (KVADVISE_LLAMA_BUILD)".
    - `kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=0), hardware=kvadvise.gpu_profile("rtx-3060"))`:
      device_bytes 760,164,224 (b11312's rules), no note. (`kvadvise.plan(spec, hardware=...)` without a config
      gives 1,248,538,496, as the CLI.)

    api._config_request turns RunConfig.llama_build, whose default is builds.REFERENCE (11312), into
    `llama_build="b11312"`: an explicit build, so entry._llama_build never reads KVADVISE_LLAMA_BUILD (its comment:
    "as --llama-build's default reads it: the API alike") nor probes the llama-server on PATH, and the "build
    unknown" note is gone too. docs/python-api.md: "`n_ctx=0` is the model's training context, exactly as
    `--ctx 0`"; the same function treats RunConfig's default f16 cache types as "not given" for this very reason.
    Right: the CLI's answer — a RunConfig that did not name a build asks what `--llama-build auto` asks."""
    monkeypatch.setenv("KVADVISE_LLAMA_BUILD", "b9000")
    rc, out, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-3060", "--ctx", "0", "--json")
    assert rc == 0, err
    import json

    cli = json.loads(out)
    spec = kvadvise.load_model(str(gemma_path))
    api = kvadvise.to_json(kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=0), hardware=kvadvise.gpu_profile("rtx-3060")))
    assert api["config"]["n_ctx"] == cli["config"]["n_ctx"]
    assert api["memory"]["device_bytes"] == cli["memory"]["device_bytes"], (
        api["memory"]["device_bytes"],
        cli["memory"]["device_bytes"],
    )
    assert api["notes"] == cli["notes"]


# --- 2. hardware= beside device="cpu": a CPU plan against the GPU's budget ----------------------------------------


def test_api_cpu_device_beside_a_card_is_refused_as_the_command_line_refuses_it(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """- `kvadvise gguf gemma-3-270m-q4_k_m.gguf --gpu rtx-3060 --device cpu --ctx 4096`: exit 2, "--device cpu plans
      without a GPU: drop --gpu/--vram, or name the GPU's backend" (request._check_together).
    - `kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096, device="cpu"), hardware=kvadvise.gpu_profile("rtx-3060"))`
      (and the same with `RunConfig(n_ctx=4096, device="cpu")`): a plan, fits true, whose config.device is "cpu"
      while its budget is the RTX 3060's (budget.device "cuda", source profile:rtx-3060-12gb) and whose reason says
      "the GPU has 10.50 GiB": CPU buffers measured against a GPU that the CPU plan never uses, and the system RAM
      it does use never checked as the budget (`--device cpu` alone plans against RAM, budget.source "ram").

    `hardware=` is the API's `--gpu` (docs/python-api.md: "kvadvise.gpu_profile("4090"), a card you do not own"), but
    the check that refuses --gpu with --device cpu looks only at the request's gpu/vram_bytes/rpc. Right: refused,
    an InputError with exit 2, as the command line refuses it."""
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-3060", "--device", "cpu", "--ctx", "4096")
    one_line_input_error(rc, err)
    spec = kvadvise.load_model(str(gemma_path))
    hw = kvadvise.gpu_profile("rtx-3060")
    _api_refused(lambda: kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096, device="cpu"), hardware=hw))
    _api_refused(lambda: kvadvise.plan(spec, kvadvise.RunConfig(n_ctx=4096, device="cpu"), hardware=hw))


# --- 3. hardware= beside rpc= or no_hardware=True: the request's hardware silently dropped ----------------------


@pytest.mark.parametrize("which", ["rpc", "no_hardware"])
def test_api_hardware_beside_rpc_or_no_hardware_is_refused_not_dropped(
    which: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """- `kvadvise gguf gemma-3-270m-q4_k_m.gguf --gpu rtx-3060 --rpc 10.0.0.2:50052=8GiB --ctx 4096`: exit 2,
      "--rpc plans the RPC hosts as the devices: give it without --gpu/--vram"; `... --gpu rtx-3060 --no-hardware`:
      exit 2, "--no-hardware plans without a GPU: drop --gpu/--vram/--rpc, or --no-hardware".
    - `kvadvise.plan(spec, kvadvise.PlanRequest(n_ctx=4096, rpc=(RpcHost("10.0.0.2:50052", 8 GiB),)),
      hardware=kvadvise.gpu_profile("rtx-3060"))`: a plan on the RTX 3060 (budget source profile:rtx-3060-12gb,
      device cuda, 642,723,712 bytes), the RPC host gone without a word (alone, the same request plans device "rpc",
      296,657,408 bytes on the 8 GiB host). With `PlanRequest(n_ctx=4096, no_hardware=True)` and the same hardware=:
      a plan on the RTX 3060, no_hardware gone (api.request: `if r.no_hardware and hardware is not None: r =
      replace(r, no_hardware=False)`, meant for the RunConfig path, also rewrites a PlanRequest given as it is).

    docs/python-api.md: hardware= "Given beside a PlanRequest that names cards (gpu=, vram_bytes=) it is refused
    (exit 2): one of them would be dropped" — the check in api.plan covers gpu and vram_bytes only. Right: refused
    (InputError, exit 2), as the command line refuses the same two flags together."""
    spec = kvadvise.load_model(str(gemma_path))
    hw = kvadvise.gpu_profile("rtx-3060")
    if which == "rpc":
        flags = ("--rpc", "10.0.0.2:50052=8GiB")
        req = kvadvise.PlanRequest(n_ctx=4096, rpc=(RpcHost("10.0.0.2:50052", 8 << 30),))
    else:
        flags = ("--no-hardware",)
        req = kvadvise.PlanRequest(n_ctx=4096, no_hardware=True)
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx-3060", *flags, "--ctx", "4096")
    one_line_input_error(rc, err)
    _api_refused(lambda: kvadvise.plan(spec, req, hardware=hw))
