"""Ollama by version (kvadvise.backends.ollama.versions): the runner, the llama.cpp and the layer decision of
each release, the table against the ollama/ollama tags, and plans for 0.20.2's built-in runner (the library:
the logits of the whole batch) against llama-server's, on a qwen2.5-coder:7b-shaped GGUF."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from json_contract import schema_errors
from ollama_fake import FakeOllama, running_fake

from kvadvise.backends.ollama import versions
from kvadvise.backends.ollama.versions import release
from kvadvise.cli import main
from kvadvise.errors import InputError
from kvadvise.planner import builds

MIRROR = Path("/work/.mirror/ollama+ollama/repo")  # a bare clone with every tag (skipped where absent)
N_VOCAB = 152064  # qwen2.5-coder:7b (conftest.coder_files)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.20.2", (0, 20, 2)),
        ("v0.32.13", (0, 32, 13)),
        ("0.30.0-rc1", (0, 30, 0)),
        (" 0.11.0\n", (0, 11, 0)),
        ("0.12.3-4-gabc1234", (0, 12, 3)),  # a source build's /api/version (git describe)
    ],
)
def test_version_parsing(text: str, version: versions.Version) -> None:
    assert versions.parse(text) == version


@pytest.mark.parametrize("text", ["", "latest", "0.20", "x0.20.2", "0.12.3x", "0.12.3\\n", "0.12.3 0.13.0", "0.12.3-"])
def test_a_version_that_is_not_one_is_refused(text: str) -> None:
    """The whole text is a version or it is refused: a prefix that reads as one (0.12.3x) is not taken for it, by
    versions.parse and by Ollama's legacy estimator alike (one grammar, api.parse_version)."""
    from kvadvise.backends.ollama.estimate_legacy import parse_version

    with pytest.raises(InputError, match=r"MAJOR\.MINOR\.PATCH"):
        versions.parse(text)
    with pytest.raises(InputError, match="not an Ollama version"):
        parse_version(text)


def test_the_release_prints_the_version_as_given_without_its_blanks() -> None:
    assert versions.release(" 0.12.3\n", "qwen3").version == "0.12.3"


@pytest.mark.parametrize(
    ("version", "arch", "runner", "llama_cpp", "program", "layers_by"),
    [
        # the held-out load: qwen2 is not in 0.20.2's OllamaEngineRequired, so the cgo llamarunner runs it
        ("0.20.2", "qwen2", "llamarunner", "ec98e2002", "library", "GraphSize"),
        ("0.20.2", "deepseek2", "ollamarunner", "ec98e2002", "library", "trial allocations"),
        ("0.12.10", "deepseek2", "llamarunner", "7049736b2", "library", "memory.go"),  # Go engine from 0.13.0
        ("0.12.10", "gptoss", "ollamarunner", "7049736b2", "library", "trial allocations"),
        ("0.11.4", "gptoss", "ollamarunner", "de4c07f93", "library", "memory.go"),
        # 0.11.5-0.11.10: the trial layout only with OLLAMA_NEW_ESTIMATES=1 (NewLlamaServer's newEstimates)
        ("0.11.10", "gptoss", "ollamarunner", "e54d41bef", "library", "memory.go"),
        ("0.11.11", "gptoss", "ollamarunner", "e54d41bef", "library", "trial allocations"),
        ("0.13.0", "qwen2", "llamarunner", "b6840", "library", "GraphSize"),
        ("0.30.0", "qwen2", "llama-server", "b9452", "llama-server", "--fit"),
        ("0.32.13", "deepseek2", "llama-server", "b10380", "llama-server", "--fit"),
    ],
)
def test_each_release_runs_the_runner_and_llama_cpp_of_its_tag(
    version: str, arch: str, runner: str, llama_cpp: str, program: str, layers_by: str
) -> None:
    rel = release(version, arch)
    assert rel.pin is not None
    assert (rel.runner, rel.pin.label, rel.program) == (runner, llama_cpp, program)
    assert layers_by in rel.layers_by
    assert rel.claims_allocation is (runner != "ollamarunner")
    assert rel.claims_layers is (runner == "llama-server")


def test_unknown_newer_and_older_releases() -> None:
    unknown, dev, newer, old = (
        release(None, "qwen2"),
        release("0.0.0", "qwen2"),
        release("0.40.0", "qwen2"),
        release("0.5.0", "qwen2"),
    )
    assert unknown.runner == dev.runner == newer.runner == "llama-server"
    assert unknown.pin is None and dev.pin is None and newer.pin is None  # the newest rules (b11312)
    assert unknown.found_by == "unknown" and dev.version is None
    assert "kvadvise read Ollama up to 0.32.15" in newer.claims()
    assert (old.runner, old.pin, old.claims_allocation) == ("not modelled", None, False)
    assert "does not model it" in old.claims()


def test_num_batch_is_the_runners_batch() -> None:
    # llama/llama.go NewContextParams: n_batch = num_batch × slots and n_ubatch = num_batch from 0.13.3;
    # before, n_batch = num_batch and the library's n_ubatch 512; num_batch capped at num_ctx (llm/server.go)
    assert release("0.20.2", "qwen2").n_batch(512, 8192, 4) == (2048, 512)
    assert release("0.20.2", "qwen2").n_batch(512, 256, 1) == (256, 256)
    assert release("0.12.0", "qwen2").n_batch(1024, 8192, 4) == (1024, 512)


# --- the table against the tags ------------------------------------------------------------------------------


def _show(tag: str, path: str) -> str | None:
    p = subprocess.run(["git", "-C", str(MIRROR), "show", f"{tag}:{path}"], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def _tags() -> list[tuple[str, versions.Version]]:
    out = subprocess.run(["git", "-C", str(MIRROR), "tag"], capture_output=True, text=True, check=True).stdout
    tags = []
    for t in out.split():
        m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", t)
        if m:
            v = (int(m[1]), int(m[2]), int(m[3]))
            if versions.MODELLED_FROM <= v <= versions.NEWEST_KNOWN:
                tags.append((t, v))
    return sorted(tags, key=lambda tv: tv[1])


def _go_list(source: str, func: str) -> frozenset[str]:
    body = source[source.index(func) :]
    return frozenset(re.findall(r'"([a-z0-9_-]+)"', body[: body.index("\n}\n")]))  # not "general.architecture"


mirror = pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no ollama/ollama mirror here")


@mirror
def test_the_table_is_what_each_tag_holds() -> None:
    for tag, v in _tags():
        rel = release(".".join(map(str, v)), "qwen2")
        assert rel.pin is not None
        has_memory_go = _show(tag, "llm/memory.go") is not None
        assert has_memory_go is (v < versions.LAYOUT_FROM), tag
        if v >= versions.LLAMA_SERVER_FROM:
            assert (_show(tag, "LLAMA_CPP_VERSION") or "").strip() == rel.pin.commit, tag
            assert _show(tag, "llm/llama_server.go") is not None, tag
            continue
        fetch = re.search(r"^FETCH_HEAD=(\w+)", _show(tag, "Makefile.sync") or "", re.MULTILINE)
        assert fetch is not None and rel.pin.commit.startswith(fetch[1]), tag
        ggml = _show(tag, "fs/ggml/ggml.go") or ""
        assert _go_list(ggml, "func (kv KV) OllamaEngineRequired") == versions._since(versions.ENGINE_REQUIRED, v), tag
        wants = _go_list(ggml, "func (f GGML) FlashAttention()") if "func (f GGML) FlashAttention()" in ggml else set()
        assert wants == versions._since(versions.MODEL_FLASH_ATTENTION, v), tag
        assert "NumBatch:  512" in (_show(tag, "api/types.go") or ""), tag
        llama_go = _show(tag, "llama/llama.go") or ""
        assert ("params.n_ubatch = C.uint(batchSize)" in llama_go) is (v >= versions.UBATCH_FROM), tag
        assert ("FlashAttentionAuto" in (_show(tag, "llm/server.go") or "")) is (v >= versions.FA_AUTO_FROM), tag


@mirror
def test_each_vendored_llama_cpp_follows_the_rules_of_its_rules_build() -> None:
    """The vendored source of each pin (llama/llama.cpp/src at its first tag) has exactly the memory rules
    kvadvise.planner.builds gives its rules_build: the KV cache written with ggml_set_rows, the SWA cache
    padded to 256, no V tensor for MLA, the token embeddings' two inputs (ggml_build_forward_select), the KQ
    mask cast from f32 under flash attention, the backends' graph_optimize hook (ggml-backend.cpp), the output layer
    offloaded last at a partial -ngl (llama-model.cpp)."""
    for p in versions.PINS:
        if p.since >= versions.LLAMA_SERVER_FROM:
            continue
        tag = "v" + ".".join(map(str, p.since))
        src = "llama/llama.cpp/src"
        names = subprocess.run(
            ["git", "-C", str(MIRROR), "ls-tree", "--name-only", f"{tag}:{src}"], capture_output=True, text=True
        ).stdout.split()
        code = "".join(_show(tag, f"{src}/{n}") or "" for n in names if "kv-cache" in n or n == "llama-graph.cpp")
        assert ("ggml_set_rows" in code) is (p.rules_build >= builds.SET_ROWS), tag
        padded = re.search(r"size_swa = GGML_PAD\(std::min\(size_base, hparams\.n_swa.*, 256\)", code)
        assert (padded is not None) is (p.rules_build >= builds.SWA_PAD_256), tag
        assert ("has_v" in code) is (p.rules_build >= builds.MLA_V_LESS), tag
        graph = _show(tag, f"{src}/llama-graph.cpp") or ""
        assert ("ggml_build_forward_select(gf, inps" in graph) is (p.rules_build >= builds.EMBD_SELECT), tag
        assert re.search(r"ggml_cast\(ctx0, inp->(self_)?kq_mask, GGML_TYPE_F16\)", code) is not None, tag
        assert p.rules_build < builds.F16_MASK_FA
        backend = _show(tag, "ml/backend/ggml/ggml/src/ggml-backend.cpp") or ""
        assert ("graph_optimize" in backend) is (p.rules_build >= builds.GRAPH_OPTIMIZE), tag
        # llama_model::load_tensors: the output layer offloaded last (before ggml-org/llama.cpp#18148) or first
        model = _show(tag, f"{src}/llama-model.cpp") or ""
        last = "i_gpu_start = std::max((int) hparams.n_layer - n_gpu_layers, (int) 0)" in model
        assert last is (p.rules_build < builds.OUTPUT_FIRST) and (last or "+ 1 - n_gpu_layers" in model), tag
        # the devices' events, which pipeline parallelism needs (ggml_backend_dev_props caps): Vulkan's (and RPC's)
        for folder, rule in (
            ("ggml-vulkan/ggml-vulkan.cpp", builds.VULKAN_EVENTS),
            ("ggml-rpc/ggml-rpc.cpp", builds.RPC_EVENTS),
        ):
            dev = _show(tag, f"ml/backend/ggml/ggml/src/{folder}")
            if dev is None:  # Ollama vendors no ggml-rpc, and ggml-vulkan only from v0.12.6
                continue
            events = re.search(r"/\* \.events\s+= \*/ (\w+)", dev)
            assert events is not None and (events.group(1) == "true") is (p.rules_build >= rule), (tag, folder)


# --- plans: 0.20.2's built-in runner against llama-server, on a qwen2.5-coder:7b-shaped GGUF ----------------


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc = main([*args, "--gpu", "rtx-4090", "--ctx", "8192", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_0_20_2_plans_the_library_at_its_vendored_commit(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.20.2")
    new = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.32.13")
    # the same load as the library: -b 512 -ub 512, by the rules of a build before #18898's second
    # embeddings input on the host (and so before the V-less MLA)
    lib = _plan(capsys, "gguf", str(coder_store), "--runtime", "library", "-b", "512", "-ub", "512",
                "--llama-build", f"b{builds.EMBD_SELECT - 1}")  # fmt: skip
    assert schema_errors("plan.schema.json", old) == []
    rel = old["ollama"]["release"]
    assert (rel["runner"], rel["program"], rel["found_by"]) == ("llamarunner", "library", "--ollama-version")
    assert rel["llama_cpp"]["commit"].startswith("ec98e2002") and rel["llama_cpp"]["build"] is None
    # its layers: Ollama's own createLayout (llm/server.go), replayed (tests/test_ollama_layout.py)
    assert rel["claims_layers"] and "createLayout over fs/ggml GraphSize" in rel["claims"]
    assert "replayed: Ollama's split" in rel["claims"] and old["ollama"]["decision"]["layers_model"] == 29
    assert (old["config"]["n_batch"], old["config"]["n_ubatch"], old["config"]["n_outputs_max"]) == (512, 512, 512)
    # ... but for the embeddings row per output the llamarunner's context keeps (llama/llama.go NewContextParams:
    # embeddings = true; a published 0.18.3-0.20.3 load of this model: CUDA_Host output 0.59 MiB = (152,064 + 3,584) x
    # 4 B): the host's output buffer and the totals one [n_embd] f32 larger
    row = 4 * 3584
    assert old["memory"]["host"]["output_bytes"] == lib["memory"]["host"]["output_bytes"] + row
    assert old["memory"]["total_bytes"] == lib["memory"]["total_bytes"] + row
    assert old["memory"]["devices"] == lib["memory"]["devices"]
    assert old["memory"]["host"]["compute_bytes"] == lib["memory"]["host"]["compute_bytes"]
    # llama-server (0.32.13, b10380) reserves one logits row per slot: the library the whole batch's 512
    assert (new["config"]["runtime"], new["config"]["n_outputs_max"]) == ("llama-server", 1)
    assert new["ollama"]["release"]["llama_cpp"]["build"] == 10380
    assert old["memory"]["compute_bytes"] > new["memory"]["compute_bytes"]
    assert old["memory"]["compute_bytes"] - new["memory"]["compute_bytes"] <= 4 * (512 - 1) * N_VOCAB  # the rows
    assert old["memory"]["weights_bytes"] == new["memory"]["weights_bytes"]


def test_0_30_0_is_llama_server_before_its_output_limits(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # LLAMA_CPP_VERSION b9452 at v0.30.0: before ggml-org/llama.cpp#23861 (b9467) llama-server reserved the batch
    # (the batch is Ollama's automatic num_batch for the context, sched.go automaticGenerationBatch: -b = -ub)
    doc = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.30.0")
    assert doc["config"]["runtime"] == "llama-server"
    assert doc["config"]["n_outputs_max"] == doc["config"]["n_batch"] == doc["config"]["n_ubatch"] > 512
    assert any("b9452" in n for n in doc["notes"])


def test_the_servers_version_is_read_unless_given(coder_store: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    with running_fake(FakeOllama(version="0.20.2")) as fake:  # the loopback stand-in answers /api/version
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        live = _plan(capsys, "ollama", "qwen2.5-coder:7b")
        given = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.32.13")
        asked = [p for _m, p, _b in fake.requests].count("/api/version")
    assert (live["ollama"]["release"]["version"], live["ollama"]["release"]["found_by"]) == ("0.20.2", "/api/version")
    assert live["config"]["runtime"] == "library"
    assert given["ollama"]["release"]["found_by"] == "--ollama-version" and given["config"]["runtime"] == "llama-server"
    assert asked >= 2
    down = _plan(capsys, "ollama", "qwen2.5-coder:7b")  # no server: unknown, the newest release
    assert down["ollama"]["release"]["found_by"] == "unknown" and down["config"]["runtime"] == "llama-server"


def test_text_says_what_is_claimed(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["ollama", "qwen2.5-coder:7b", "--gpu", "rtx-4090", "--ctx", "8192", "--ollama-version", "0.20.2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "planned for: Ollama 0.20.2 runs qwen2 in its built-in llamarunner on llama.cpp ec98e2002" in out
    assert "Ollama's decision" in out


def test_a_quantized_cache_needs_flash_attention_set(coder_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # llm/server.go (v0.20.2): the llamarunner keeps OLLAMA_KV_CACHE_TYPE only with OLLAMA_FLASH_ATTENTION set on
    dropped = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.20.2", "-ctk", "q8_0", "-fa", "off")
    kept = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.20.2", "-ctk", "q8_0")
    assert dropped["config"]["type_k"] == "f16" and any("keeps an f16 K/V cache" in n for n in dropped["notes"])
    # asked for with the cache, flash attention is set on (OLLAMA_FLASH_ATTENTION=1 in the advice): q8_0 holds
    assert (kept["config"]["type_k"], kept["config"]["flash_attn"]) == ("q8_0", True)
    assert kept["ollama"]["env"]["OLLAMA_FLASH_ATTENTION"] == "1"
    # recommended, not asked: 0.20.2 leaves flash attention to llama.cpp (auto), so the cache stays f16
    auto = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.20.2")
    assert auto["config"]["type_k"] == "f16"


def test_a_model_that_wants_flash_attention_keeps_it_before_0_12_4(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm/server.go NewLlamaServer, v0.11.8 - v0.12.3: "fa := envconfig.FlashAttention(); if f.FlashAttention()
    { fa = true }": OLLAMA_FLASH_ATTENTION=0 does not turn it off for gpt-oss; v0.12.4's
    envconfig.FlashAttention(f.FlashAttention()) does (versions.FA_OVERRIDE_FROM; the tags: below)."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    fa = {}
    for version in ("0.11.7", "0.11.10", "0.12.3", "0.12.4"):
        rc = main(["ollama", "gpt-oss:20b", "--ctx", "8192", "--vram", "15.6GiB", "-fa", "off", "--ollama-version",
                   version, "--json"])  # fmt: skip
        assert rc == 0
        fa[version] = json.loads(capsys.readouterr().out)["config"]["flash_attn"]
    assert fa == {"0.11.7": False, "0.11.10": True, "0.12.3": True, "0.12.4": False}  # 0.11.7: no model wish yet


@mirror
def test_flash_attention_override_at_its_tag() -> None:
    for tag, v in _tags():
        if v >= versions.LLAMA_SERVER_FROM:
            break
        server = _show(tag, "llm/server.go") or ""
        assert ("fa := envconfig.FlashAttention(f.FlashAttention())" in server) is (v >= versions.FA_OVERRIDE_FROM), tag


def test_the_default_context_and_the_split_are_the_releases(
    coder_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # server/routes.go: the VRAM tiers from 0.15.5 (32,768 on 24 GB); before, OLLAMA_CONTEXT_LENGTH's 4096
    old = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.12.0", "--ctx", "16384")
    new = _plan(capsys, "ollama", "qwen2.5-coder:7b", "--ollama-version", "0.20.2", "--ctx", "16384")
    assert any("Ollama runs 4,096 tokens here" in w for w in old["ollama"]["warnings"])
    assert any("Ollama runs 32,768 tokens here" in w for w in new["ollama"]["warnings"])
    # part on the CPU: the layers are Ollama's own choice before 0.30 (0.20.2's llamarunner: createLayout,
    # replayed, tests/test_ollama_layout.py), not llama.cpp's --fit
    rc = main(["ollama", "qwen2.5-coder:7b", "--gpu", "rtx-4060", "--ctx", "8192", "--allow-cpu",
               "--ollama-version", "0.20.2", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["ollama"]["settings"]["partial"]
    assert doc["ollama"]["decision"]["layers_by"] == "llm/server.go createLayout over fs/ggml GraphSize"
    assert not any("--fit places it" in w for w in doc["ollama"]["warnings"])


def test_a_version_given_must_be_one_a_server_version_need_not(
    coder_store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = main(["ollama", "qwen2.5-coder:7b", "--gpu", "rtx-4090", "--ollama-version", "latest"])
    assert rc == 2 and "MAJOR.MINOR.PATCH" in capsys.readouterr().err
    with running_fake(FakeOllama(version="main-dev")) as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url)
        doc = _plan(capsys, "ollama", "qwen2.5-coder:7b")
    assert doc["ollama"]["release"]["found_by"] == "unknown" and doc["config"]["runtime"] == "llama-server"


def test_a_vision_model_runs_at_least_2048_tokens_from_0_11_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """server/sched.go getRunner (v0.11.5 .. v0.33.0-rc2): "multimodal models require at least 2048 context",
    opts.NumCtx = max(opts.NumCtx, 2048) for a model with CapabilityVision; v0.11.4's getRunner has no such line
    (its 2048 was llm/memory.go's estimate). gemma3:4b (a vision tower in its blob, the built-in profile) asked
    for num_ctx 1024 was planned, and its Modelfile written, at 1,024 tokens: Ollama runs 2,048."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))

    def plan(model: str, version: str, *more: str) -> dict[str, Any]:
        args = ["ollama", model, "--vram", "24G", "--ctx", "1024", "--ollama-version", version, "--json", *more]
        assert main(args) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        return doc

    for version in ("0.11.5", "0.20.0", "0.30.0"):
        doc = plan("gemma3:4b", version)
        assert doc["config"]["n_ctx"] == 2048, version
        assert doc["ollama"]["modelfile_parameters"]["num_ctx"] == 2048
        assert any("at least 2,048 tokens" in n for n in doc["notes"])
    assert plan("gemma3:4b", "0.20.0", "--parallel", "2")["config"]["n_ctx"] == 2 * 2048  # num_ctx is per slot
    old = plan("gemma3:4b", "0.11.4")
    assert old["config"]["n_ctx"] == 1024 and not any("at least 2,048" in n for n in old["notes"])
    assert plan("qwen3:8b", "0.20.0")["config"]["n_ctx"] == 1024  # no vision: as asked


def test_a_num_ctx_below_4_is_run_at_4_and_not_called_a_vision_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """server/sched.go getRunner: "if opts.NumCtx < 4 { opts.NumCtx = 4 }" for every model, in v0.11.0 and v0.11.4
    as in v0.14.0; only the 2,048 is a vision model's (from 0.11.5). qwen3:8b (no vision) --ctx 2 said "Ollama
    runs a vision model with at least 4 tokens", and under 0.11.4 wrote PARAMETER num_ctx 2 unraised."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    for version in ("0.11.4", "0.20.0"):
        args = ["ollama", "qwen3:8b", "--no-hardware", "--ctx", "2", "--ollama-version", version, "--json"]
        assert main(args) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert doc["ollama"]["modelfile_parameters"]["num_ctx"] == 4, version
        said = [n for n in doc["notes"] if n.startswith("num_ctx 2:")]
        assert said == [
            "num_ctx 2: Ollama runs a model with at least 4 tokens (server/sched.go getRunner), so 4 are planned"
        ]


def test_a_recommended_context_is_never_below_what_ollama_runs_a_vision_model_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """getRunner's 2,048-token floor for a vision model (rules.run_num_ctx) bounds the recommendation too: on a
    5.0 GB card the GPU alone holds gemma3:4b with 256 tokens, and kvadvise used to plan (and write
    PARAMETER num_ctx) 256, "100% on the GPU", where Ollama runs 2,048 tokens and spills. It now plans the
    model at 2,048 or more: the best partial plan, or with --gpu-only a plan that does not fit (exit 3)."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))

    def plan(model: str, *more: str, vram: str = "5.0G") -> tuple[int, dict[str, Any]]:
        rc = main(["ollama", model, "--vram", vram, "--ollama-version", "0.30.0", "--json", *more])
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        return rc, doc

    rc, doc = plan("gemma3:4b")
    assert rc == 0 and max(o["n_ctx_max"] for o in doc["options"]) < 2048  # the GPU alone: fewer than Ollama runs
    assert doc["config"]["n_ctx"] >= 2048 and not doc["fits"]
    assert doc["offload"]["runnable"] and doc["offload"]["n_ctx"] >= 2048
    assert doc["ollama"]["modelfile_parameters"]["num_ctx"] >= 2048
    assert any(r.startswith("2,048 tokens per slot: the fewest the runtime runs") for r in doc["reasons"])
    rc, doc = plan("gemma3:4b", "--target-ctx", "1024")
    assert doc["config"]["n_ctx"] == 2048 and doc["offload"]["n_ctx"] == 2048  # the target, raised to the floor
    rc, doc = plan("gemma3:4b", "--gpu-only")
    assert rc == 3 and doc["config"]["n_ctx"] == 2048 and not doc["fits"]
    # no vision: no runtime floor; the GPU alone holds 256 tokens, below llama.cpp's --fit-ctx (4,096): the plan that
    # runs keeps part of the model on the CPU at the target (recommender.FIT_MIN_CTX; test_attack_round14d)
    rc, doc = plan("llama3.2:3b", vram="3.5G")
    assert rc == 0 and not doc["fits"] and doc["offload"]["runnable"] and doc["offload"]["n_ctx"] >= 4096
    assert not any("the fewest the runtime runs" in r for r in doc["reasons"])
    assert any("--fit-ctx 4,096" in r for r in doc["reasons"])


def test_a_store_blob_with_its_own_vision_tower_is_a_vision_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ollama's library gemma3 carries its vision tower inside the model blob (no projector layer):
    server/images.go Capabilities says vision from ``f.KeyValue("vision.block_count")`` (gemma3.vision.block_count),
    so getRunner's 2,048-token floor applies to it; the same blob without the key gets none."""
    import hashlib

    from ollama_fake import build_store, closed_port_url
    from tinymodels import write_tiny_gguf

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    for tag, extra, want in (("vision", {"vision.block_count": 27}, 2048), ("text", None, 1024)):
        gguf = write_tiny_gguf(tmp_path / f"{tag}.gguf", "gemma3", n_ctx_train=32768, sparse=True, extra_u32=extra)
        store = tmp_path / tag
        build_store(store, gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), model="g3", tag=tag)
        monkeypatch.setenv("OLLAMA_MODELS", str(store))
        args = ["ollama", f"g3:{tag}", "--vram", "24G", "--ctx", "1024", "--ollama-version", "0.20.0", "--json"]
        assert main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["config"]["n_ctx"] == want, tag
        assert doc["ollama"]["modelfile_parameters"]["num_ctx"] == want, tag


def test_the_runners_inside_ollama_move_whole_layers_not_experts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before 0.30 Ollama places whole layers (llm/server.go assignLayers, llm/memory.go): no --n-cpu-moe, no
    --fit. gpt-oss:20b at 8k on 12 GB under 0.13.0 was planned as "the experts of 6 layers (-ngl 25 --n-cpu-moe
    6)", a split that release cannot make; it is planned with whole layers on the CPU now, and said as Ollama's.
    From 0.30 llama-server's --fit keeps experts on the CPU first, as before."""
    from ollama_fake import closed_port_url

    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))

    def offload(version: str) -> dict[str, Any]:
        args = ["ollama", "gpt-oss:20b", "--vram", "12G", "--ctx", "8192", "--ollama-version", version, "--json"]
        assert main(args) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert not doc["fits"] and doc["offload"]["runnable"], version
        off: dict[str, Any] = doc["offload"]
        return off

    for version in ("0.11.0", "0.13.0", "0.24.0"):
        off = offload(version)
        assert off["n_cpu_moe"] == 0 and off["n_cpu_layers"] > 0, (version, off)
        assert "experts" not in off["note"]
    off = offload("0.30.0")
    assert off["n_cpu_moe"] > 0 and off["n_cpu_layers"] == 0
