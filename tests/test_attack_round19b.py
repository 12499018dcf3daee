"""Round 19b: Ollama's own layer decision, by Ollama version, against published Ollama server logs.

Each case replays a published ``msg=offload`` line (Ollama's llm/memory.go estimate, server.go:175 in
v0.9.3 - v0.11.4) or checks what kvadvise claims for a version it does not model. The logs are kept in
tests/data/published/ollama-legacy/r19b-*.json (the existing tests there are per-file, so the cases are
written here). Every command runs offline: no Ollama server (a closed port), an empty store, no registry,
so the model comes from kvadvise's built-in profiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: autouse)
from ollama_fake import FakeOllama, running_fake

DATA = Path(__file__).resolve().parent / "data" / "published" / "ollama-legacy"


def _published(name: str) -> dict[str, Any]:
    data = json.loads((DATA / name).read_text())
    assert str(data["source"]).startswith("https://github.com/ollama/ollama/")
    return data["published"]


def _plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION",
              "OLLAMA_GPU_OVERHEAD", "OLLAMA_NEW_ENGINE", "OLLAMA_NEW_ESTIMATES", "OLLAMA_SCHED_SPREAD"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    rc, out, err = run(capsys, "ollama", *args, "--json")
    assert rc in (0, 3), (rc, err)
    return json.loads(out)


def _human_bytes2(b: int) -> str:
    """Ollama's format.HumanBytes2 (binary units, one decimal), as the offload line prints."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"


# --------------------------------------------------------------------------------------------------------------
# gemma3:12b (vision tower in the blob) on one CUDA card, Ollama 0.11.x: the offload line prints projector.weights
# and projector.graph, and Ollama keeps the output layer (+ projector) on the CPU.


@pytest.mark.parametrize("version", ["0.11.0", "0.11.3", "0.11.4"])
def test_r19b_ollama_12000_gemma3_12b_48_of_49_with_projector(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """ollama/ollama#12000 (comment by abcbarryn, 2025-08-22), gemma3:12b (blob sha256-e8ad13ef..., Q4_K_M),
    num_ctx 8192, 1 slot, one CUDA GPU with memory.available=[11.1 GiB]:

        source=server.go:175 msg=offload library=cuda layers.requested=-1 layers.model=49 layers.offload=48
        memory.available="[11.1 GiB]" memory.required.full="11.4 GiB" memory.required.partial="8.9 GiB"
        memory.required.kv="992.0 MiB" memory.weights.total="6.8 GiB" ... memory.graph.partial="1.3 GiB"
        projector.weights="795.9 MiB" projector.graph="1.0 GiB"   (runner --ctx-size 8192 --n-gpu-layers 48)

    server.go:175 (offload) / :135 (system memory) / :438 (starting llama server) are the line numbers of
    llm/server.go in v0.9.3 - v0.11.4 only (v0.11.5: 531/665/488), so the build is v0.11.0 - v0.11.4 code.

    Command: ``kvadvise ollama gemma3:12b --ollama-version 0.11.4 --vram 11.1GiB --ctx 8192 --json``.
    kvadvise: ``ollama.decision`` 49 of 49 layers, memory.required.full "8.8 GiB", with release.claims_layers
    true ("its layer decision is replayed"). True: 48 of 49, required.full 11.4 GiB (+2.6 GiB, 30 % UNDER:
    kvadvise says the whole model fits where Ollama itself keeps a layer on the CPU).
    Missing rule: llm/memory.go estimateGPULayers (v0.11.4, line 120) takes ``f.VisionGraphSize()``
    (fs/ggml/ggml.go:685: the ``v.*`` tensors' bytes and, for gemma3/mistral3, 4 x (image_size^2 x channels
    + embd x patch + patches^2 x heads)) and (lines 268-285) places it with the output layer as one last
    layer, ``memoryLastLayer = memoryLayerOutput + projector weights + projector graph``: 787.5 MiB + 795.9
    MiB + 1.0 GiB does not fit beside 48 blocks, so the 49th layer stays on the CPU. The built-in profile has the projector (``projector.bytes`` 834 MB in
    profiles/ollama_models.json) but decision.py ``_legacy_model`` builds the LegacyModel with
    has_vision=False, so the port's own vision refusal (estimate_legacy.check_modelled) never fires and the
    projector is left out. Either add VisionGraphSize or refuse to claim the decision for a vision profile.
    """
    pub = _published("r19b-ollama-12000-gemma3-12b-0.11-48of49.json")
    plan = _plan(capsys, monkeypatch, "gemma3:12b", "--ollama-version", version, "--vram", "11.1GiB",
                 "--ctx", str(pub["num_ctx"]), "--ram", "56GiB")  # fmt: skip
    dec = plan["ollama"]["decision"]
    release = plan["ollama"]["release"]
    if dec is None or not release["claims_layers"]:
        return  # not claimed: acceptable
    assert _human_bytes2(dec["available_bytes"]) == pub["available"]
    assert (dec["layers_model"], dec["layers_offload"]) == (pub["layers_model"], pub["layers_offload"]), dec["log_line"]
    assert _human_bytes2(dec["required_full_bytes"]) == pub["required_full"], dec["log_line"]


@pytest.mark.parametrize("version", ["0.11.3", "0.11.4"])
def test_r19b_ollama_11819_gemma3_12b_2048_48_of_49(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """ollama/ollama#11819 "Incorrect offloading after Ollama update" (comment by Jakaboii, 2025-08-08; 0.11.4 was
    tagged 2025-08-07, server.go:175 = v0.9.3 - v0.11.4), the same gemma3:12b blob (sha256-e8ad13ef...),
    --ctx-size 2048, 1 slot, ``layers.requested=49`` (num_gpu 49, above the 49 layers: no cap), one CUDA GPU:

        layers.model=49 layers.offload=48 memory.available="[10.9 GiB]" memory.required.full="11.0 GiB"
        memory.required.partial="8.5 GiB" memory.required.kv="608.0 MiB" memory.weights.total="6.8 GiB"
        memory.graph.full="519.5 MiB" memory.graph.partial="1.3 GiB" projector.weights="795.9 MiB"
        projector.graph="1.0 GiB"

    Command: ``kvadvise ollama gemma3:12b --ollama-version 0.11.4 --vram 10.9GiB --ctx 2048 --json``.
    kvadvise: 49 of 49, required.full "8.5 GiB" (the log's *partial* figure: everything but the projector).
    True: 48 of 49, 11.0 GiB (+2.5 GiB, 29 % UNDER). Same missing rule as #12000: VisionGraphSize
    (llm/memory.go estimateGPULayers, v0.11.4) not added for a built-in vision profile.
    """
    pub = _published("r19b-ollama-11819-gemma3-12b-0.11-2048.json")
    plan = _plan(capsys, monkeypatch, "gemma3:12b", "--ollama-version", version, "--vram", "10.9GiB",
                 "--ctx", str(pub["num_ctx"]), "--ram", "25GiB")  # fmt: skip
    dec = plan["ollama"]["decision"]
    if dec is None or not plan["ollama"]["release"]["claims_layers"]:
        return
    assert (dec["layers_model"], dec["layers_offload"]) == (pub["layers_model"], pub["layers_offload"]), dec["log_line"]
    assert _human_bytes2(dec["required_full_bytes"]) == pub["required_full"], dec["log_line"]


@pytest.mark.parametrize(
    ("name", "vram", "fields"),
    [
        (
            "r19b-ollama-12000-gemma3-12b-0.11-48of49.json",
            "11.1GiB",
            ('memory.required.kv="992.0 MiB"', 'memory.weights.total="6.8 GiB"', 'memory.weights.repeating="6.0 GiB"',
             'memory.graph.partial="1.3 GiB"'),
        ),
        (
            "r19b-ollama-11819-gemma3-12b-0.11-2048.json",
            "10.9GiB",
            ('memory.required.kv="608.0 MiB"', 'memory.weights.total="6.8 GiB"', 'memory.weights.repeating="6.0 GiB"',
             'memory.graph.partial="1.3 GiB"'),
        ),
    ],
)  # fmt: skip
def test_r19b_gemma3_text_figures_match_the_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, vram: str, fields: tuple[str, ...]
) -> None:
    """Regression guard (passes): the text part of the same two offload lines, replayed at 0.11.4, prints
    the kv (gemma3's sliding window: 992.0 MiB at 8192, 608.0 MiB at 2048), weights and partial graph exactly
    as the logs do; only the projector is missing (the two tests above)."""
    pub = _published(name)
    for field in fields:
        assert field in pub["line"]
    plan = _plan(capsys, monkeypatch, "gemma3:12b", "--ollama-version", "0.11.4", "--vram", vram,
                 "--ctx", str(pub["num_ctx"]), "--ram", "25GiB")  # fmt: skip
    line = plan["ollama"]["decision"]["log_line"]
    for field in fields:
        assert field in line, (field, line)


# --------------------------------------------------------------------------------------------------------------
# versions kvadvise does not model: it must not claim Ollama's decision


@pytest.mark.parametrize(
    ("name", "model", "version", "vram"),
    [
        ("r19b-ollama-10341-gemma3-12b-0.6.5.json", "gemma3:12b", "0.6.5", "11.5GiB"),
        ("r19b-ollama-11162-gemma3-27b-fp16-0.9.2.json", "gemma3:27b", "0.9.2", "30.9GiB,30.8GiB"),
    ],
)
def test_r19b_old_versions_not_claimed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, model: str, version: str,
    vram: str,
) -> None:  # fmt: skip
    """Regression guard (passes): published logs of versions before 0.11 (ollama/ollama#10341, Ollama 0.6.5,
    gemma3:12b 49/49 on 11.5 GiB; ollama/ollama#11162, 0.9.2, gemma3:27b-it-fp16 62/63 split 31,31 on two
    RTX 5090). ``kvadvise ollama MODEL --ollama-version V`` prints no ``ollama.decision`` and says
    ``claims_layers: false`` ("older than 0.11.0: kvadvise does not model it"), the explicit caveat."""
    pub = _published(name)
    assert pub["version"] == version
    plan = _plan(capsys, monkeypatch, model, "--ollama-version", version, "--vram", vram, "--ctx", "8192",
                 "--ram", "64GiB")  # fmt: skip
    release = plan["ollama"]["release"]
    assert plan["ollama"]["decision"] is None
    assert release["claims_layers"] is False and release["layers_by"] == "not modelled"
    assert "not model" in release["claims"]


@pytest.mark.parametrize("version", ["0.3.14", "0.5.7"])
def test_r19b_unmodelled_versions_are_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Regression guard (passes): the 2024 releases whose logs are most often published (0.3.x ``offload to
    cuda`` from memory.go:309, 0.5.x from memory.go:356) are refused with the caveat, for a text model too."""
    plan = _plan(capsys, monkeypatch, "llama3.1:8b", "--ollama-version", version, "--vram", "8GiB",
                 "--ctx", "8192", "--ram", "25GiB")  # fmt: skip
    assert plan["ollama"]["decision"] is None
    assert plan["ollama"]["release"]["claims_layers"] is False


def test_r19b_reads_api_version_from_the_loopback_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes): with no --ollama-version, the version comes from the server's /api/version
    (tests/ollama_fake.py): 0.6.5 there is refused like --ollama-version 0.6.5, and 0.11.4 is replayed with
    llm/memory.go (found_by "/api/version")."""
    for version, claims in (("0.6.5", False), ("0.11.4", True)):
        with running_fake(FakeOllama(version=version)) as fake:
            monkeypatch.setenv("OLLAMA_HOST", fake.url)
            plan = _plan(capsys, monkeypatch, "llama3.1:8b", "--vram", "8GiB", "--ctx", "8192", "--ram", "25GiB")
            assert any(r[1] == "/api/version" for r in fake.requests)
        release = plan["ollama"]["release"]
        assert (release["version"], release["found_by"], release["claims_layers"]) == (version, "/api/version", claims)
        if claims:
            assert plan["ollama"]["decision"]["layers_by"] == "llm/memory.go"


# --------------------------------------------------------------------------------------------------------------
# gpt-oss:20b from the built-in profile vs Ollama's own gptoss blob


def test_r19b_ollama_11711_gpt_oss_profile_line_matches_the_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ollama/ollama#11711 (crahzee, 2025-08-06): RTX 4060 Ti, before.free 15.6 GiB, gpt-oss:20b, num_ctx < 8192,
    OLLAMA_FLASH_ATTENTION=1, OLLAMA_KV_CACHE_TYPE=q4_0, Ollama v0.11.2 (inferred: server.go:175, partial graph
    = 2 x full, gptoss refused flash attention):

        layers.offload=23 memory.required.full="16.9 GiB" memory.required.partial="15.4 GiB"
        memory.required.kv="300.0 MiB" memory.weights.total="11.7 GiB" memory.weights.nonrepeating="1.1 GiB"

    Command: ``OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q4_0 kvadvise ollama gpt-oss:20b --ollama-version
    0.11.2 --vram 15.6GiB --ctx 4096 --json``. kvadvise (built-in profile): 23 layers (right), but
    weights.total "11.9 GiB", nonrepeating "1.2 GiB", required.full "17.1 GiB", required.partial "15.5 GiB".
    The port itself is right: tests/test_ollama_estimate_legacy.py's hand-built gptoss tensors print this line
    to the digit. The profile route (decision.py ``_legacy_model``) gives token_embd/output 1,239,677,002 B
    each (Ollama's BF16 2880 x 201088 = 1,158,266,880 B: +7 %) and 10.73 GiB of blocks (blob: 10.66 GiB), so
    its figures are 0.2 GiB (1.2 %) OVER Ollama's, and at 15,773-15,849 MiB free (the bottom of the band
    where Ollama loads 23 layers, kvadvise issue 37) it replays 22. Missing rule: the profile's tensor bytes
    are not those of Ollama's converted blob (convert/convert_gptoss.go: embeddings and output BF16).
    """
    pub = _published("r19b-ollama-11711-gptoss20b-4060ti-0.11.2.json")
    monkeypatch.setenv("OLLAMA_FLASH_ATTENTION", "1")
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q4_0")
    rc, out, err = run(capsys, "ollama", "gpt-oss:20b", "--ollama-version", "0.11.2", "--vram", "15.6GiB",
                       "--ctx", str(pub["num_ctx"]), "--ram", "25GiB", "--json")  # fmt: skip
    assert rc in (0, 3), err
    dec = json.loads(out)["ollama"]["decision"]
    assert (dec["layers_model"], dec["layers_offload"]) == (pub["layers_model"], pub["layers_offload"])
    line = dec["log_line"]
    for field in ("memory.required.kv", "memory.graph.full", "memory.graph.partial", "memory.weights.total",
                  "memory.weights.nonrepeating", "memory.required.full", "memory.required.partial"):  # fmt: skip
        want = pub["line"].split(field + "=")[1].split('"')[1]
        got = line.split(field + "=")[1].split('"')[1]
        assert got == want, (field, got, want)


@pytest.mark.parametrize("free_mib", [15_773, 15_800])
def test_r19b_gpt_oss_profile_band_bottom(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, free_mib: int
) -> None:
    """The same setup at the bottom of Ollama v0.11.2's 23-layer band (15,773 MiB free: the band
    tests/test_ollama_estimate_legacy.py derives from Ollama's own tensor sizes, 15,773-16,236 MiB).
    kvadvise (profile): 22 layers; Ollama: 23 (the layer it keeps on the CPU is one too many: OVER, costs speed).
    Same cause as test_r19b_ollama_11711_gpt_oss_profile_line_matches_the_log."""
    monkeypatch.setenv("OLLAMA_FLASH_ATTENTION", "1")
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q4_0")
    rc, out, err = run(capsys, "ollama", "gpt-oss:20b", "--ollama-version", "0.11.2", "--vram", f"{free_mib}MiB",
                       "--ctx", "4096", "--ram", "25GiB", "--json")  # fmt: skip
    assert rc in (0, 3), err
    dec = json.loads(out)["ollama"]["decision"]
    assert dec["layers_offload"] == 23, dec["log_line"]


def test_r19b_ollama_15749_gemma4_go_engine_not_claimed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes): ollama/ollama#15749 (2026-04-22), Ollama 0.21.0, gemma4:e4b on an RX 6600 XT
    (available 7.5 GiB): Ollama loads 42/43 layers, 2.8 GiB of weights on ROCm0 and 6.6 GiB on the CPU.
    ``kvadvise ollama gemma4:e4b --ollama-version 0.21.0 --vram 7.5GiB`` gives no ``ollama.decision`` and
    claims_layers false (gemma4 is not among the Go-engine architectures it replays), as it should: the
    headline "fits 100% on the GPU" is llama.cpp's library, which the notes say."""
    pub = _published("r19b-ollama-15749-gemma4-e4b-0.21.0-rocm.json")
    plan = _plan(capsys, monkeypatch, "gemma4:e4b", "--ollama-version", pub["version"], "--vram", "7.5GiB",
                 "--ram", "25GiB")  # fmt: skip
    assert plan["ollama"]["decision"] is None
    assert plan["ollama"]["release"]["claims_layers"] is False
