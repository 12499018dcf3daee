"""Round 18a of the red team (a reviewer in its own worktree): a plan for an OLDER llama.cpp build (--llama-build
bNNNN) against b11312's. Ground truth: older llama.cpp as others vendored it -- Ollama's llama/llama.cpp at a tag
(``git --git-dir=/work/.mirror/ollama+ollama/repo show TAG:llama/llama.cpp/...``, Makefile.sync names the commit) and
llama-cpp-python's sdists (vendor/llama.cpp, CHANGELOG names the commit). Each test fails on 15fb236; its docstring
gives the command, what kvadvise printed or planned, the older source that refutes it, and the rule.

The build numbers used are those kvadvise's own planner/builds.py dates or names: b4875 = 7841fc72 of 2025-03-12
(gemma3's first build), b5274 "a build of early May 2025", b6646 = 364a7a6d4 (Ollama 0.12.4's vendor), b6000 (after
2025-06-29, FUSED_GLU); b5000 lies between b4875 and b5274 (about 2025-03-21 at the ~14 builds a day builds.py
counts)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from tinymodels import write_tiny_gguf

MIB = 1 << 20

# the reason the tests below are held (strict xfails)
_UNKNOWN_FIRST_BUILD = (
    "held: a flag or rule of a build whose first build is not known here (the exact build numbers of #16391 "
    "--cache-ram, #12898 llama-server's --mmproj, the --no-repack/-kvu/--swa-full switches are not known; "
    "--n-cpu-moe's b6089 is, but that era's --override-tensor has no LLAMA_ARG_* variable for the env file): builds "
    "before them are older than any published log kvadvise is checked on"
)


def _doc(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def _words(doc: dict[str, object]) -> list[str]:
    server = doc["llama_server"]
    assert isinstance(server, dict) and server["run_command"], server
    return shlex.split(str(server["run_command"]))


# --- 1. the sliding-window cache of a build before llama.cpp had one ------------------------------------------


def test_a_build_before_the_sliding_window_cache_sizes_every_layer_for_the_whole_context(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 32768 --llama-build b5000` plans
    ``memory.kv_bytes`` 116,391,936 (111 MiB): the 3 full-attention layers at 32,768 cells and the 15 sliding-window
    layers at 1,024 (n_swa 512 + n_ubatch 512) -- exactly b11312's figure. memory.py context_layout sizes the SWA cache
    for every build (builds.SWA_PAD_256 changes only its padding); no rule says when that cache began.

    It began with ggml-org/llama.cpp#13194 ("kv-cache : add SWA support", which also adds --swa-full: common.h
    ``swa_full ... (https://github.com/ggml-org/llama.cpp/pull/13194#...)``), merged 2025-05-20; ggml-org/llama.cpp#12637
    of 2025-03-29 asks for it ("gemma 3 has an extremely high KV cache usage ... there seems to be no code to reduce
    KV cache usage"). Before it every layer caches all n_ctx cells: Ollama v0.7.0's vendor (de4c07f93, vendored
    2025-05-12, used through v0.11.4) has no llama-kv-cache-unified-iswa.cpp (v0.11.5's e54d41bef has), its
    src/llama-model.cpp:13102 create_memory makes one ``new llama_kv_cache_unified(..., cparams.n_ctx, padding)`` for
    every model, and src/llama-kv-cache.cpp:103 allocates ``ggml_new_tensor_1d(ctx, type_k, n_embd_k_gqa*kv_size)``
    per layer, SWA or not (llama-cpp-python 0.3.9's 8733e0cf6 the same). So b5000 (gemma3 is known from b4875,
    builds.ARCH_FIRST_BUILD) holds 18 x 32,768 cells x 1,024 B = 576 MiB of K/V: the plan is 465 MiB UNDER, 5.2x, for
    a 270M model; for Gemma 3 27B at 32k (62 layers, 52 of them SWA at 1,024) some 13 GiB under. Expected: a build
    before #13194 (an SWA_CACHE rule: de4c07f93 lacks it, so from a build after it, b5274 at the earliest -- planned
    where it is certainly there) plans a full-context cache for the sliding-window layers too (as --swa-full)."""
    doc = _doc(capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "32768", "--llama-build", "b5000")
    model, mem = doc["model"], doc["memory"]
    assert isinstance(model, dict) and isinstance(mem, dict)
    assert model["n_layer_kv"] == 18 and doc["config"]["n_ctx"] == 32768  # type: ignore[index]
    full = 18 * 32768 * 2 * 256 * 2  # every layer, K and V, one KV head of 256, f16
    assert mem["kv_bytes"] >= full, f"planned {mem['kv_bytes'] / MIB:.2f} MiB of K/V, b5000 allocates {full / MIB:.2f}"


# --- 2. the RAM flags of a build before the prompt cache and the context checkpoints ---------------------------


@pytest.mark.xfail(strict=True, reason=_UNKNOWN_FIRST_BUILD)
def test_the_ram_flags_for_an_older_build_are_flags_that_build_knows(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma-3-270m-q4_k_m.gguf --gpu rtx-4090 --ctx 32768 -np 4 --ram 1GiB --llama-build b6646`
    prints ``llama-server ... -fa on -ctk f16 -ctv f16 -ngl 999 --ctx-checkpoints 10 --cache-ram 0`` (and the env
    LLAMA_ARG_CTX_CHECKPOINTS / LLAMA_ARG_CACHE_RAM): runtime/llamaserver.py _ram_args writes both for every build,
    and planner/hostram.py plans b11312's 8,192 MiB prompt cache and 32 checkpoints a slot for every build.

    b6646 is 364a7a6d4 (builds.FA_QUANT_ANY_HEAD: Ollama 0.12.4's vendor). Its common/common.h (`git show
    v0.12.4:llama/llama.cpp/common/common.h`, line 427) has ``int32_t n_swa_checkpoints = 3; // max number of SWA
    checkpoints per slot`` and no ``cache_ram_mib``: the prompt cache (ggml-org/llama.cpp#16391, "-cram, --cache-ram")
    and the name ``--ctx-checkpoints`` come later (v0.12.6's 7049736b2, line 428-429: ``n_ctx_checkpoints = 8``,
    ``cache_ram_mib = 8192``). llama-cpp-python 0.3.16's llama.cpp (4227c9be4), of that era, spells the flag
    ``{"--swa-checkpoints"}`` with ``set_env("LLAMA_ARG_SWA_CHECKPOINTS")`` (common/arg.cpp:1511-1517) and has no
    --cache-ram; an argument not in arg_to_options stops the parser ("error: invalid argument: --ctx-checkpoints").
    So the command printed for b6646 never starts. (b11312 still takes ``--swa-checkpoints`` as an alias,
    common/arg.cpp:1698.) Expected: for a build before #16391 no --cache-ram (and no prompt cache in the RAM plan:
    that build keeps none), and the checkpoints as ``--swa-checkpoints N`` (LLAMA_ARG_SWA_CHECKPOINTS) where the build
    has them, against that build's default of 3."""
    doc = _doc(
        capsys, "llamacpp", str(gemma_path), "--gpu", "rtx-4090", "--ctx", "32768", "-np", "4", "--ram", "1GiB",
        "--llama-build", "b6646",
    )  # fmt: skip
    words = _words(doc)
    env = doc["llama_server"]["env"]  # type: ignore[index]
    assert "--cache-ram" not in words and "-cram" not in words, shlex.join(words)
    assert "--ctx-checkpoints" not in words and "-ctxcp" not in words, shlex.join(words)
    assert "LLAMA_ARG_CACHE_RAM" not in env and "LLAMA_ARG_CTX_CHECKPOINTS" not in env, env


# --- 3. a projector for a llama-server that had no multimodal support --------------------------------------------


@pytest.mark.xfail(strict=True, reason=_UNKNOWN_FIRST_BUILD)
def test_a_projector_is_not_planned_for_a_llama_server_without_multimodal_support(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp gemma3.gguf --mmproj mmproj.gguf --gpu rtx-4090 --ctx 1024 --llama-build b5000` plans the
    projector (``memory.projector``: its weights and compute on the GPU) and prints ``llama-server -m gemma3.gguf -c
    1024 -np 1 -fa -ctk f16 -ctv f16 -ngl 999 --mmproj mmproj.gguf`` (with ``--device cpu``: ``... --mmproj
    mmproj.gguf --no-mmproj-offload``). runtime/llamaserver.py server_args writes --mmproj for every build.

    llama-server had no multimodal input from ggml-org/llama.cpp#5882 (March 2024, "Multimodal has been removed",
    ggml-org/llama.cpp#8010) until ggml-org/llama.cpp#12898 ("server : vision support via libmtmd", still under
    review on 2025-05-06). llama-cpp-python 0.3.9's llama.cpp (8733e0cf6, already on tools/) has, common/arg.cpp:41-44,
    ``mmproj_examples = { LLAMA_EXAMPLE_LLAVA, // TODO: add LLAMA_EXAMPLE_SERVER when it's ready }`` and gives
    ``--mmproj``, ``--mmproj-url`` and ``--no-mmproj-offload`` ``.set_examples(mmproj_examples)`` (lines 2213-2239):
    llama-server's parser does not know them and stops ("error: invalid argument: --mmproj"). b5000 (about
    2025-03-21) is before that. Expected: a projector refused for a build before #12898 (an input error naming the
    build, as builds.check_architecture does for an architecture), or at least no --mmproj in its command and no
    projector in its plan."""
    from tinymmproj import write_tiny_mmproj

    text = write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3", n_vocab=32000)
    proj = write_tiny_mmproj(
        tmp_path / "mmproj.gguf", n_embd_text=128, image_size=224, patch_size=14, n_embd=128, n_ff=512, n_head=4, pool=4
    )
    rc, out, err = run(
        capsys, "llamacpp", str(text), "--mmproj", str(proj), "--gpu", "rtx-4090", "--ctx", "1024",
        "--llama-build", "b5000", "--json",
    )  # fmt: skip
    if rc == 0:
        doc = json.loads(out)
        words = _words(doc)
        assert "--mmproj" not in words and "--no-mmproj-offload" not in words, shlex.join(words)
        assert doc["memory"]["projector"] is None, doc["memory"]["projector"]
    else:
        assert "b5000" in err and "Traceback" not in err, err


# --- 4. --n-cpu-moe for a build before it ---------------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason=_UNKNOWN_FIRST_BUILD)
def test_the_experts_on_the_cpu_are_kept_there_with_a_flag_the_build_knows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp qwen3moe.gguf --gpu rtx-4090 --ctx 4096 -ncmoe 2 --llama-build b6000` plans the routed
    experts of the first 2 layers on the CPU and prints ``llama-server ... -ngl 999 --n-cpu-moe 2``
    (LLAMA_ARG_N_CPU_MOE=2). runtime/llamaserver.py server_args writes --n-cpu-moe for every build (and the offload
    search may choose one itself).

    --n-cpu-moe is ggml-org/llama.cpp#15077 ("llama : add --n-cpu-moe option", opened 2025-08-04: "These options
    work by adding the necessary tensor overrides"), first in b6089 (oobabooga/textgen#7178: "This option was added
    in llama.cpp version b6089"); llama-cpp-python 0.3.14's llama.cpp (79e0b68c1) has no "--n-cpu-moe" in
    common/arg.cpp, 0.3.16's (4227c9be4) has. b6000 (after 2025-06-29, builds.FUSED_GLU) stops at "error: invalid
    argument: --n-cpu-moe". Expected: for a build before b6089 the same placement as the tensor override that
    option adds, ``-ot 'blk\\.(0|1)\\.ffn_(up|down|gate)_exps=CPU'`` (--override-tensor, common/arg.cpp of that era:
    0.3.14 has it), never --n-cpu-moe."""
    model = write_tiny_gguf(tmp_path / "moe.gguf", "qwen3moe")
    doc = _doc(
        capsys, "llamacpp", str(model), "--gpu", "rtx-4090", "--ctx", "4096", "-ncmoe", "2", "--llama-build", "b6000"
    )
    words = _words(doc)
    assert "--n-cpu-moe" not in words and "-ncmoe" not in words, shlex.join(words)
    assert "LLAMA_ARG_N_CPU_MOE" not in doc["llama_server"]["env"], doc["llama_server"]["env"]  # type: ignore[index]


# --- 5. switches of 2025's KV cache and CPU buffers for a build before them ----------------------------------------


@pytest.mark.parametrize(
    ("flags", "switch"),
    [
        (("--device", "cpu", "-nr"), "--no-repack"),
        (("--gpu", "rtx-4090", "-np", "4", "-kvu"), "-kvu"),
        (("--gpu", "rtx-4090", "--swa-full"), "--swa-full"),
    ],
)
@pytest.mark.xfail(strict=True, reason=_UNKNOWN_FIRST_BUILD)
def test_a_switch_the_build_does_not_know_is_not_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], switch: str
) -> None:
    """`kvadvise llamacpp gemma3.gguf --ctx 4096 FLAGS --llama-build b5000` with ``--device cpu -nr``, ``-np 4 -kvu``
    or ``--swa-full`` prints ``llama-server ... --no-repack`` / ``-kvu`` / ``--swa-full``: runtime/llamaserver.py
    server_args writes each switch for every build.

    None is in a build of early 2025. Ollama v0.7.0's vendor (de4c07f93, vendored 2025-05-12: `git show
    v0.7.0:llama/llama.cpp/common/common.h`) has none of the fields those flags set -- ``no_extra_bufts``
    ("-nr, --no-repack"), ``kv_unified`` ("-kvu, --kv-unified", ggml-org/llama.cpp#14363), ``swa_full`` ("--swa-full",
    #13194); v0.11.5's e54d41bef has all three (common.h:352-364). llama-cpp-python 0.3.9's common/arg.cpp (8733e0cf6)
    has none of the three options, 0.3.14's (79e0b68c1) --swa-full only, 0.3.16's all. b5000 (about 2025-03-21,
    before de4c07f93) stops at "error: invalid argument: ...". (Before #14363 every build kept one cache for all
    sequences, as -kvu does now; before #13194 every layer held the whole context, as --swa-full does now; before the
    extra buffer types option there was no switch to drop the repack: the switch is the behaviour or is absent.)
    Expected: for a build that does not know a switch, the command leaves it out (the plan as that build runs it),
    or the plan is refused; never a command that build refuses."""
    model = write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3")
    doc = _doc(capsys, "llamacpp", str(model), "--ctx", "4096", *flags, "--llama-build", "b5000")
    words = _words(doc)
    assert switch not in words, shlex.join(words)
