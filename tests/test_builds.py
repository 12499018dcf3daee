"""Which llama.cpp build a plan is for, and the rules that moved between builds (issue 25); the architecture
rules of the same issue (an architecture llama.cpp does not know, Falcon-H1, Nemotron-H) and CUDA's
flash-attention kernels. The figures of each build are checked against published logs of that build in
tests/test_published_logs.py (b6168, b6182, b7406 and older) and against b11312 by the oracle tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import tinymodels
from tinymodels import write_tiny_gguf

from kvadvise.cli import main
from kvadvise.errors import GGUFError, InputError
from kvadvise.model.architecture import LLAMA_ARCHITECTURES, from_gguf
from kvadvise.model.ggml import GGMLType
from kvadvise.model.gguf import T_INT32, GGUFArray, GGUFHeader, read_file
from kvadvise.planner import builds
from kvadvise.planner.memory import MIB, RunConfig, estimate, flash_attn_note, resolve
from kvadvise.runtime import llamabuild

F16, Q8, IQ4 = GGMLType.F16, GGMLType.Q8_0, GGMLType.IQ4_NL


@pytest.mark.parametrize(
    ("text", "build"),
    [
        ("b9410", 9410),
        ("9410", 9410),
        ("B11312", 11312),
        ("version: 9410 (031ddb2e0)", 9410),
        ("ggml_cuda_init: found 1 CUDA devices\nversion: 6168 (092fd845)\nbuilt with clang 19\n", 6168),
    ],
)
def test_a_build_is_read_as_llama_cpp_prints_it(text: str, build: int) -> None:
    assert builds.parse(text) == build


@pytest.mark.parametrize("text", ["", "latest", "b", "v0.3.36", "b12x"])
def test_what_is_not_a_build_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError, match=r"not a llama\.cpp build"):
        builds.parse(text)


def test_the_installed_llama_server_says_its_build(tmp_path: Path) -> None:
    """--llama-build auto: `llama-server --version` (common/build-info: 'version: N (commit)'); unknown when it
    does not answer or says nothing of it, never an error."""
    good = tmp_path / "good" / "llama-server"
    good.parent.mkdir()
    good.write_text("#!/bin/sh\necho 'version: 9410 (031ddb2e0)' >&2\necho 'built with cc 13' >&2\n")
    good.chmod(0o755)
    assert llamabuild.detect(str(good)) == llamabuild.BuildChoice(9410, f"{good} --version")
    mute = tmp_path / "mute"
    mute.write_text("#!/bin/sh\necho hello\n")
    mute.chmod(0o755)
    assert llamabuild.detect(str(mute)).build is None
    assert llamabuild.detect(str(tmp_path / "absent")).build is None
    assert llamabuild.choose("unknown").build is None and llamabuild.choose("b7000").build == 7000


def test_an_unknown_build_is_planned_by_the_newest_rules(gemma_path: Path) -> None:
    """Builds before ggml-org/llama.cpp#23764 held the f32 mask with flash attention, and before #18898 one row of
    the token embeddings on the host: a named older build gets its figure; an unknown one the newest rules (the
    note says what an older one takes besides)."""
    spec = from_gguf(read_file(gemma_path))
    base = RunConfig(n_ctx=32768, flash_attn="on", device="cuda", n_outputs_max=1)  # the layers are the peak
    new, old, unknown = (estimate(spec, replace(base, llama_build=b)) for b in (11312, 9000, None))
    assert (
        old.host.compute_bytes > new.host.compute_bytes and old.devices[0].compute_bytes > new.devices[0].compute_bytes
    )
    assert unknown.host.compute_bytes == new.host.compute_bytes
    assert unknown.devices[0].compute_bytes == new.devices[0].compute_bytes
    # the f32 mask: 32768 cells + the SWA cache's 1024, 512 rows, 4 bytes, not 2
    cells = 32768 + 1024
    assert old.host.compute_bytes - new.host.compute_bytes == pytest.approx(cells * 512 * 2, abs=128)
    # before #18898 (builds.EMBD_SELECT) the host held one [n_embd, n_ubatch] row, not two (b8816 holds two beside
    # its f32 mask: tests/data/published 035; Ollama 0.24's ec98e2002 one: 020, 021)
    early = estimate(spec, replace(base, llama_build=7600))
    assert old.host.compute_bytes - early.host.compute_bytes == 4 * 512 * 640


def test_older_builds_rules(gemma_path: Path, tmp_path: Path) -> None:
    """llama-server's logits for the whole batch before b9467 (#23861); the SWA cache unpadded before #17046;
    the MLA V tensor before #19067."""
    spec = from_gguf(read_file(gemma_path))
    server = RunConfig(n_ctx=4096, device="cuda", runtime="llama-server")
    assert resolve(spec, server).n_outputs_max == 1
    assert resolve(spec, replace(server, llama_build=9000)).n_outputs_max == 2048  # 0: the batch
    assert resolve(spec, replace(server, llama_build=None)).n_outputs_max == 1  # the runtime says it: notes warn
    assert (
        resolve(spec, server).n_ctx_swa == 1024 and resolve(spec, replace(server, llama_build=6182)).n_ctx_swa == 1024
    )
    assert resolve(spec, replace(server, n_ubatch=300)).n_ctx_swa == 1024  # n_swa 512 + 300, padded to 256
    # before #17046 both caches were padded to 256 with flash attention (auto counts: cparams.flash_attn is "not
    # disabled" when the cache is made), to 32 without (llama_kv_cache::get_padding, b6840)
    assert resolve(spec, replace(server, n_ubatch=300, llama_build=6182, flash_attn="off")).n_ctx_swa == 832
    assert resolve(spec, replace(server, n_ubatch=300, llama_build=6699, flash_attn="auto")).n_ctx_swa == 1024
    assert resolve(spec, replace(server, n_ctx=4000, llama_build=6182, flash_attn="off")).n_ctx == 4000
    assert resolve(spec, replace(server, n_ctx=4000, llama_build=6699, flash_attn="on")).n_ctx == 4096
    assert resolve(spec, replace(server, n_ctx=4000, flash_attn="off")).n_ctx == 4096
    # several sequences: old builds pad ceil(n_ctx / n_seq_max), #17046 pads GGML_PAD(n_ctx, 256) / n_seq_max
    two = replace(server, n_ctx=4000, n_parallel=3, kv_unified=False, flash_attn="off")
    assert resolve(spec, replace(two, llama_build=6182)).n_ctx_seq == 1344  # ceil(4000 / 3) = 1334 -> 1344
    assert resolve(spec, two).n_ctx_seq == 1536  # 4096 // 3 = 1365 -> 1536
    mla = from_gguf(read_file(write_tiny_gguf(tmp_path / "mla.gguf", "deepseek2-mla", n_vocab=600)))
    cfg = RunConfig(n_ctx=4096)
    k_only, with_v = estimate(mla, cfg), estimate(mla, replace(cfg, llama_build=7000))
    assert k_only.v_bytes == 0 and with_v.k_bytes == k_only.k_bytes
    assert with_v.v_bytes == 2 * 128 * 4096 * 2  # 2 layers x kv_lora_rank 128 x 4096 cells x f16


def test_no_v_row_indices_before_set_rows_on_the_host_or_any_device(gemma_path: Path) -> None:
    """Without flash attention the V cache's row indices (i64 [n_embd_v_gqa_max * n_ubatch] per cache kind) are graph
    inputs only from ggml-org/llama.cpp#14285 (the cache written with ggml_set_rows, builds.SET_ROWS) on: the host
    holds them and, split over several devices, each device copies in those of its layers' kinds, in
    GGML_SCHED_MAX_COPIES copies. Before, neither has them (one definition: kvadvise.planner.sizes.v_idxs_bytes).
    Nor has a device the K cache's row indices (sizes.k_idxs_bytes, i64 [n_ubatch] per kind) and V's as many again."""
    spec = from_gguf(read_file(gemma_path))
    # two GPUs: RPC devices of these builds had no events, so no pipeline parallelism (builds.RPC_EVENTS)
    cfg = RunConfig(n_ctx=4096, device="cuda", tensor_split=(1.0, 1.0), flash_attn="off", llama_build=builds.SET_ROWS)
    new, old = estimate(spec, cfg), estimate(spec, replace(cfg, llama_build=builds.SET_ROWS - 1))
    # Gemma 3 270M: V 256 wide (1 KV head of 256), both devices hold SWA and full layers: 2 kinds, n_ubatch 512
    v_rows = 4 * 8 * 512 * 256 * 2  # 4 copies x i64 x n_ubatch x n_embd_v_gqa_max x kinds = 8 MiB
    kv_rows = 4 * 2 * 8 * 512 * 2  # 4 copies x (K and V) x i64 x n_ubatch x kinds = 64 KiB
    assert [n.compute_bytes - o.compute_bytes for n, o in zip(new.devices, old.devices, strict=True)] == [
        v_rows + kv_rows,
        v_rows + kv_rows,
    ]
    assert new.host.compute_bytes - old.host.compute_bytes == v_rows == 8 * MIB  # the host's, in its 4 copies
    one = replace(cfg, tensor_split=())  # one device copies nothing: the host's alone, once
    host_one = (
        estimate(spec, one).host.compute_bytes
        - estimate(spec, replace(one, llama_build=builds.SET_ROWS - 1)).host.compute_bytes
    )
    assert host_one == 8 * 512 * 256 * 2
    # with flash attention V is not transposed: no V rows of n_embd_v_gqa on the host or a device in either build,
    # but from set_rows on each device copies in K's and V's [n_ubatch] row indices (before: 64 KiB too many)
    fa = replace(cfg, flash_attn="on")
    fa_new, fa_old = estimate(spec, fa), estimate(spec, replace(fa, llama_build=builds.SET_ROWS - 1))
    assert [n.compute_bytes - o.compute_bytes for n, o in zip(fa_new.devices, fa_old.devices, strict=True)] == [
        kv_rows,
        kv_rows,
    ]
    assert fa_new.host == fa_old.host


def test_the_plan_says_which_build_it_is_for(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["gguf", str(gemma_path), "--ctx", "4096", "--no-hardware", "--json"]
    assert main([*args, "--llama-build", "unknown"]) == 0
    notes = " ".join(json.loads(capsys.readouterr().out)["notes"])
    assert "llama.cpp build unknown" in notes and "b11312's rules" in notes and "older than b9410 takes more" in notes
    assert "b9467" in notes and "MiB more)" in notes
    assert main([*args, "--llama-build", "b9000"]) == 0
    notes = " ".join(json.loads(capsys.readouterr().out)["notes"])
    assert "planned for llama.cpp b9000 (--llama-build)" in notes
    assert main([*args, "--llama-build", "b11312"]) == 0
    assert not any("build" in n for n in json.loads(capsys.readouterr().out)["notes"])
    assert main([*args, "--llama-build", "latest"]) == 2
    assert "not a llama.cpp build" in capsys.readouterr().err


def test_an_architecture_llama_cpp_does_not_know_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: a GGUF llama.cpp cannot load (src/llama-arch.cpp has no such name) is not planned as fitting:
    exit 2 and one line saying why."""
    path = tmp_path / "foo.gguf"
    t = tinymodels._TinyWriter(path, "foo-net", "foo", 600, 8192, 0)
    tinymodels._llama(t)
    t.finish()
    assert "foo-net" not in LLAMA_ARCHITECTURES and "llama" in LLAMA_ARCHITECTURES
    with pytest.raises(GGUFError, match="does not know the architecture 'foo-net'"):
        from_gguf(read_file(path))
    assert main(["gguf", str(path), "--ctx", "4096", "--no-hardware"]) == 2
    err = capsys.readouterr().err
    assert "unknown model architecture" in err and "Traceback" not in err


def _header(arch: str, md: dict[str, object]) -> GGUFHeader:
    meta = {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in md.items()}}
    return GGUFHeader("synthetic", 3, "<", meta, (), 32, 0, 0, 0, None)  # type: ignore[arg-type]


def test_falcon_h1_layers_hold_kv_and_recurrent_state() -> None:
    """falcon-h1.cpp: is_recr_impl all true; llama_model::create_memory's filter_attn passes every layer: each
    layer holds its attention cache and a Mamba-2 state (issue 25: Falcon-H1 got no state)."""
    md = {
        "block_count": 4, "embedding_length": 1024, "attention.head_count": 8, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64, "context_length": 8192, "feed_forward_length": 2048,
        "ssm.conv_kernel": 4, "ssm.inner_size": 2048, "ssm.state_size": 128, "ssm.group_count": 1,
        "ssm.time_step_rank": 32,
    }  # fmt: skip
    spec = from_gguf(_header("falcon-h1", md))
    assert spec.recurrent_layers == (True,) * 4 and spec.kv_layers == (True,) * 4
    est = estimate(spec, RunConfig(n_ctx=4096, n_parallel=2))
    r, s = 3 * (2048 + 2 * 128), 128 * 2048  # (d_conv - 1)(d_inner + 2 n_group d_state), d_state d_inner
    assert est.recurrent_bytes == 4 * 2 * (r + s) * 4 and est.kv_bytes == 4 * 2 * 128 * 4096 * 2


def test_nemotron_h_mlp_blocks_hold_neither() -> None:
    """nemotron-h.cpp: recurrent = head_count_kv 0 and feed_forward_length 0; attention = !recurrent and
    feed_forward_length 0; the MLP blocks (feed_forward_length > 0) hold neither."""
    kv = GGUFArray(T_INT32, 4, (0, 0, 2, 0))
    ff = GGUFArray(T_INT32, 4, (0, 2048, 0, 2048))
    md = {
        "block_count": 4, "embedding_length": 1024, "attention.head_count": 8, "attention.head_count_kv": kv,
        "feed_forward_length": ff, "context_length": 8192, "ssm.conv_kernel": 4, "ssm.inner_size": 2048,
        "ssm.state_size": 128, "ssm.group_count": 8, "ssm.time_step_rank": 32,
    }  # fmt: skip
    spec = from_gguf(_header("nemotron_h", md))
    assert spec.recurrent_layers == (True, False, False, False)
    assert spec.kv_layers == (False, False, True, False)


def test_cuda_flash_attention_kernels(tmp_path: Path) -> None:
    """ggml-cuda fattn.cu: no kernel for K head 96 / V head 64 at a GQA ratio of 1 (a pre-MLA DeepSeek GGUF) or an
    iq4_nl cache: auto resolves to off (the plan says so); on runs attention on the CPU (said); a quantized V forces it
    (llama_init_from_model), so an iq4_nl V runs it on the CPU: planned, and said. The CPU has kernels for all."""
    legacy = from_gguf(read_file(write_tiny_gguf(tmp_path / "legacy.gguf", "deepseek2-legacy", n_vocab=600)))
    cuda = RunConfig(n_ctx=4096, device="cuda")
    assert resolve(legacy, cuda).flash_attn is False
    note = flash_attn_note(legacy, cuda)
    assert note is not None and "K head 96 / V head 64 at a GQA ratio of 1" in note
    on = replace(cuda, flash_attn="on")  # asked for: llama.cpp runs attention on the CPU; planned and said
    assert resolve(legacy, on).flash_attn is True
    assert "runs every attention on the CPU" in (flash_attn_note(legacy, on) or "")
    assert resolve(legacy, replace(cuda, device="cpu")).flash_attn is True
    llama = from_gguf(read_file(write_tiny_gguf(tmp_path / "qwen3.gguf", "qwen3", n_vocab=600)))  # heads of 64
    assert resolve(llama, cuda).flash_attn is True and flash_attn_note(llama, cuda) is None
    tiny = from_gguf(read_file(write_tiny_gguf(tmp_path / "llama.gguf", "llama", n_vocab=600)))
    assert resolve(tiny, cuda).flash_attn is False  # heads of 32: no CUDA kernel either
    assert resolve(llama, replace(cuda, type_k=IQ4)).flash_attn is False  # K only: auto resolves off
    iq4 = replace(cuda, type_k=IQ4, type_v=IQ4)  # a quantized V forces flash attention on: no kernel
    assert resolve(llama, iq4).flash_attn is True and "iq4_nl K cache" in (flash_attn_note(llama, iq4) or "")
    assert resolve(llama, replace(cuda, type_k=Q8, type_v=Q8)).flash_attn is True
    assert (
        estimate(legacy, cuda).devices[0].compute_bytes
        > estimate(legacy, replace(cuda, device="cpu")).compute_bytes / 2
    )
    assert MIB  # the module's unit, imported for the figures above


@pytest.mark.parametrize("body", ["exec yes 'version: 1'", "exec sleep 30"], ids=["chatty", "silent"])
def test_a_program_that_is_not_llama_server_costs_nothing(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--llama-build auto runs `llama-server --version`: a program that ignores it is read to 64 KiB at most,
    killed with its group after the timeout, and leaves the build unknown."""
    import time

    import psutil

    monkeypatch.setattr(llamabuild, "VERSION_TIMEOUT_S", 1)
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    t0 = time.monotonic()
    assert llamabuild.detect(str(fake)).build is None
    assert time.monotonic() - t0 < 8
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if str(fake) in " ".join(p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.parametrize("value", [" ", "0", "-1", "huge", "99999999999"])
def test_a_build_from_the_environment_that_is_none_names_the_variable(
    value: str, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVADVISE_LLAMA_BUILD=0 (no --llama-build on the command line) said "not a llama.cpp build: '0'" or "Invalid
    value for '--llama-build'": a flag the user never gave. The error names the variable (exit 2); the flag given
    wins over it; `kvadvise ollama`, which leaves the variable to the llama.cpp commands, still ignores it."""
    monkeypatch.setenv("KVADVISE_LLAMA_BUILD", value)
    rc = main(["llamacpp", str(gemma_path), "--gpu", "rtx-4090"])
    err = capsys.readouterr().err
    assert rc == 2 and "KVADVISE_LLAMA_BUILD" in err and len(err.strip().splitlines()) <= 2, err
    assert main(["llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--llama-build", "b6699"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("OLLAMA_MODELS", str(gemma_path.parent / "no-such-store"))
    assert main(["ollama", "qwen3:8b", "--gpu", "rtx-4090"]) == 0


@pytest.mark.parametrize("value", [" ", "0", "huge"])
def test_the_api_refuses_a_build_from_the_environment_as_the_command_does(
    value: str, gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvadvise

    monkeypatch.setenv("KVADVISE_LLAMA_BUILD", value)
    assert main(["llamacpp", str(gemma_path), "--gpu", "rtx-4090"]) == 2
    cli_error = capsys.readouterr().err.splitlines()[0].removeprefix("kvadvise: error: ")
    with pytest.raises(InputError) as e:
        kvadvise.plan(str(gemma_path), kvadvise.PlanRequest(gpu="rtx-4090"))
    assert e.value.message == cli_error and e.value.exit_code == 2


def test_an_mla_model_before_the_compressed_cache_caches_k_and_v_per_head() -> None:
    """builds.MLA_CACHE (ggml-org/llama.cpp#12801, April 2025): DeepSeek-V2's config (tests/data/published 009, a
    Vulkan log of about b5030) at 4,096 cells caches K and V per head, 60 layers x 4,096 cells x 128 heads x
    (192 + 128) x 2 bytes = 19,200 MiB as that build printed (510 planned before: the compressed latent and its
    V of the builds before MLA_V_LESS); from MLA_CACHE on the latent. Speed reads the same cache as memory plans."""
    from kvadvise.model.hfconfig import from_config
    from kvadvise.planner.memory import mla_as_built

    doc = json.loads((Path(__file__).parent / "data" / "published" / "009-vulkan-deepseekv2-fa-off.json").read_text())
    spec = from_config(doc["hf_config"], source="009")
    cfg = RunConfig(n_ctx=4096, flash_attn="off", device="cuda", runtime="library")
    old = estimate(spec, replace(cfg, llama_build=5030))
    assert old.kv_bytes == 19200 * (1 << 20) and old.k_bytes == 11520 * (1 << 20)  # K (f16) 11520, V 7680 printed
    assert mla_as_built(spec, 5030).n_embd_head_k == 192 and not mla_as_built(spec, 5030).is_mla
    assert estimate(spec, replace(cfg, llama_build=builds.MLA_CACHE)).kv_bytes < old.kv_bytes / 30
    assert mla_as_built(spec, builds.MLA_CACHE) is spec and mla_as_built(spec, None) is spec
