"""Which llama.cpp build a plan is for, and the memory rules that changed between builds.

llama.cpp numbers its builds bNNNN (``llama-server --version`` prints ``version: 9410 (031ddb2e0)``). The
memory model follows b11312 (0c1e570, the llama.cpp llama-cpp-python 0.3.36 vendors and the tests build);
these rules moved before it, each from the build named (the first build known to carry the change; where
the exact build is not known, the earliest it can be, so that an older build is never planned smaller):

- SWA_PAD_256 (ggml-org/llama.cpp#17046, merged 2025-11-06): the sliding-window cache is padded to 256
  cells like the full one (llama_kv_cache_iswa); before, it held min(n_ctx, n_swa + n_ubatch) cells (a
  b6182 log prints 640 cells for gpt-oss at n_ubatch 512, not 768).
- SET_ROWS (the KV cache written with ggml_set_rows, llama_kv_cache::cpy_v, with the row indices as graph inputs,
  build_input_k_idxs / build_input_v_idxs: ggml-org/llama.cpp#14285, 2025-06, behind LLAMA_SET_ROWS; the default
  from #14959, the ggml_cpy path removed by #15505, 2025-08-22; the log of b6000-era builds says "LLAMA_SET_ROWS=0,
  using old ggml_cpy() method"): without flash attention the host holds the V cache's row indices, i64
  [n_embd_v_gqa * n_ubatch] per cache, and each device of a split copies in its own
  (kvadvise.planner.sizes.v_idxs_bytes), and K's, i64 [n_ubatch] per cache (sizes.k_idxs_bytes). The exact build is not known here: from b6200 on it is planned (a b6209
  log and later show it; 2024 and early 2025 logs do not).
- MLA_CACHE (ggml-org/llama.cpp#12801, "DeepSeek V2/V3 MLA implementation", merged 2025-04-15): an MLA model
  (deepseek2 and its kin) caches the compressed latent, K of kv_lora_rank + the rope width in one head; before,
  K and V decompressed per head (n_head x (qk_nope + qk_rope) and n_head x v_head_dim: 19,200 MiB for
  DeepSeek-V2 at 4,096 cells, a b5030-era Vulkan log, tests/data/published 009). A GGUF converted since has the
  MLA keys and no attn_kv_b, which those builds cannot load: a config.json planned for them is the older
  conversion (kvadvise.planner.memory.mla_as_built). The exact build is not known here: planned from b5274 (a
  build of early May 2025) on, so that a build between is planned for the larger cache.
- ATTN_ROT (ggml-org/llama.cpp#21038, "llama : rotate activations for better quantization", commit 744c0c73,
  merged 2026-04-01, shipped in b8607 of that day): with a quantized cache whose head is a multiple of 64,
  llama_kv_cache makes Hadamard matrices (graph inputs "attn_inp_k_rot", "attn_inp_v_rot") and build_attn
  multiplies Q, K and V by them before the cache and the attention's output after it (llama_mul_mat_hadamard):
  four more matmuls in every attention, their outputs in the compute buffer.
- MLA_V_LESS (#19067, merged 2026-01-24/25; b7813 of 2026-01-23 lacks it): MLA models keep no V tensor
  (llama_kv_cache ctor: has_v = !is_mla); before, V (kv_lora_rank wide) was allocated beside K.
- FUSED_GLU (ggml-org/llama.cpp#14158, merged 2025-06-29: ggml_swiglu, and ggml_swiglu_split for a separate gate
  and up): a feed-forward whose up projection holds gate and up (phi3, chatglm, glm4: build_ffn LLM_FFN_SWIGLU
  without a gate tensor) runs one ggml_swiglu; before, it copied both halves of the up projection with ggml_cont
  and multiplied silu(x0) by x1 (llama-graph.cpp, e1e8e09 as Ollama 0.6.8 vendors it): four [n_ff, n_ubatch]
  tensors alive, not three. A separate gate and up (llama's LLM_FFN_PAR) ran silu and mul in place on the gate; the
  not-in-place ggml_swiglu_split moves where ggml-alloc leaves its holes, and that graph can be the larger: b5781
  (ba3ef86c5, 2025-07-01) has it, a Vulkan load of Llama 3.1 8B at 16k cells, -ub 1024, flash attention printing
  613.01 MiB, ggml-alloc's figure over the swiglu graph to the 0.01 MiB, where the graph before it gives 517.00
  (the logits landing above the masks' 96 MiB; tests/data/published 117). Planned from b5781, the first build known
  to carry it (b5274, tests/data/published 034, lacks it); the builds between are planned without it.
- F16_MASK_FA (#23764, commit 031ddb2e0 = b9410): with flash attention the KQ mask is created f16
  (llm_graph_context::build_attn_inp_kq_mask); before, it was an f32 graph input on the host that the
  device copied and cast to f16, both alive at the first attention ("the f32 mask still uses the compute
  buffer even though it is not used", the PR). (The host's second [n_embd, n_ubatch] row is EMBD_SELECT's, not
  this change's: b8816 holds it beside the f32 mask, tests/data/published 035.)
- GRAPH_OPTIMIZE (ggml-org/llama.cpp#15850, "vulkan: sort graph to allow more parallel execution", merged
  2025-09-08: its ggml sync commit b14a96b6 keeps that date; b6431 shipped by 2025-09-09): ggml_backend_sched
  hands each split to the backend's graph_optimize before ggml-alloc sees it (Vulkan's reorders it; Metal's
  from #15929, CUDA's from #16991, behind GGML_CUDA_GRAPH_OPT until later). Before, every backend allocated
  the graph as llama.cpp built it, so kvadvise.planner.galloc over that graph is exact on any device (a
  GLM-Z1-32B CUDA log of b5274). The exact build is not known here: planned from b6302 on (b6301, da54f9f1 of
  2025-08-27, issue #15618's log, is older), so that the exact plan is used only where the graph certainly
  reached ggml-alloc as built.
- FA_VALUE (ggml-org/llama.cpp#15434, "flash_attn_type", merged 2025-08-30; b6327 has it: llama.node's sync to b6327
  of 08-31 "introduce flash_attn_type (auto|on|off)"; the first build with it is not known here): -fa/--flash-attn
  takes on|off|auto, and auto (the new default) enables it where the backend can. Before, -fa was a switch without a
  value (common/arg.cpp: params.flash_attn = true) and flash attention was off unless given: a plan for such a build
  writes `-fa` alone, or nothing, and plans auto as off (on for a quantized V cache, which needs it).
- SERVER_OUTPUT_LIMITS (#23861, commit de6f727aa, merged 2026-06-01; b9442 of 2026-05-31 lacks it, b9467 of
  2026-06-02 has it): llama-server reserves the logits of one row per slot (server_output_limits); before,
  of the whole batch, as the library does (RunConfig.runtime "llama-cli").
- EMBD_SELECT (ggml-org/llama.cpp#18898, "graph : utilize ggml_build_forward_select()", opened 2026-01-17, reviewed
  01-18): build_inp_embd keeps both inputs in the graph, the token ids' get_rows and an f32 inp_embd [n_embd,
  n_tokens] graph input, so the host's compute buffer holds two such rows where it held one (b7847 = a5bb8ba4, the
  llama.cpp Ollama ef00199fb vendored, has it; ec98e2002 of 2025-12-16 lacks it). The exact build is not known here:
  planned from b7700 on (about 2026-01-15 at the 14 builds a day between b7108 of 2025-12-03 and b7813 of 01-23).
- RESERVE_ROUNDS_OUTPUTS: llama_context::graph_reserve rounds the worst-case batch up to a multiple of the sequences
  and, in a5bb8ba4 (b7847), the outputs with it ("n_outputs = std::max(n_outputs, n_tokens)"; ec98e2002 took the
  min, 0c1e570 leaves them as given): LLamaSharp 0.27.0's b8816 (3f7c29d) with SeqMax 40 reserves 520 rows of
  logits for a 512-token batch (its published CUDA0 284.90 MiB, tests/data/published 035). Planned from b7847 until
  b11312, which lacks it; where it ended between is not known here, so the builds between get the larger logits.
  From GRAPH_OPTIMIZE (b6302) to b9410 the reserve graph is the one kvadvise.planner.llama_graph builds with the f32
  flash-attention mask (LlamaShape.f32_fa_mask), and CUDA's graph_optimize reorders nothing (none before #16991,
  then only with GGML_CUDA_GRAPH_OPT=1: a5bb8ba4's ggml-cuda.cu): ggml-alloc's own figure is planned there
  (kvadvise.planner.compute._exact_device_compute; Ollama 0.20.2 on ec98e2002, tests/data/published 045).
- OUTPUT_FIRST (ggml-org/llama.cpp#18148, "llama: offload output layer to GPU first", opened 2025-12-17;
  ec98e2002 of 2025-12-16, the llama.cpp Ollama 0.13.5-0.24 vendor, lacks it): llama_model::load_tensors starts the
  GPU layers at ``n_layer + 1 - n_gpu_layers``, so ``-ngl N`` offloads the output layer and the last N - 1 blocks;
  before, at ``n_layer - n_gpu_layers``: the last N blocks, and the output layer only at N = n_layer + 1. A partial
  offload then keeps output.weight in host memory, and for a prompt batch of at least 32 output rows the GPU
  op-offloads its matmul with a copy of it in the compute buffer beside the logits (kvadvise.planner.memory
  RunConfig.output_on_host: tests/data/published 020, 021 and 032 to the 0.01 MiB). The exact build is not known
  here: planned from b7700 on (as EMBD_SELECT), so that a build between keeps the old placement, whose device
  compute buffer is the larger at the prompt batches these builds reserve.
- FA_QUANT_ANY_HEAD (ggml-org/llama.cpp#16208, "CUDA: refactor and deduplicate vector FA kernels", merged
  2025-09-27: "This enables the use of KV cache quantization for head sizes 64 and 256, previously only head size
  128 was properly supported"): before it CUDA's flash attention took a quantized K or V cache at head size 128
  only (ggml-cuda.cu supports_op, then fattn.cu ggml_cuda_get_best_fattn_kernel from #15454: ``K->ne[0] != 128``
  -> no kernel), so the op ran on the CPU; e54d41bef of 2025-08-14 (Ollama 0.11.5-0.12.3) has the old rule,
  364a7a6d4 = b6646 (Ollama 0.12.4) the new one. The exact build is not known here: planned from b6646 on.
  Before #15454 (2025-08-20) supports_op also took an MLA cache (K 576, V 512) of any type on Turing and newer,
  and at head size 128 a K type other than V's, which then aborted in the vector kernel rather than fall back;
  those builds (before SUPPORTED_FROM) are planned by the rule above.
- FA_KV_ANY_PAIR (after ggml-org/llama.cpp#28079, merged about 2026-09-10; b10819 of 2026-09-05 lacks it, and an
  issue of that day says "by default on CUDA only symmetric q4_0 and q8_0 kv quantizations ... are supported"):
  before it a default CUDA build (GGML_CUDA_FA_ALL_QUANTS off) had flash attention only for one type in K and V
  and only f16/q4_0/q8_0 among the cache types (fattn.cu: ``K->type != V->type`` -> no kernel; q4_1, q5_0, q5_1
  too), so ``-ctk q8_0 -ctv q4_0`` ran every attention on the CPU (#27150: pp512 11,250 -> 358 t/s). b11312
  (0c1e570) takes any pairing (a pair the vector kernels lack runs converted to f16). The exact build is not
  known here: planned from b11312 on, so that a build between is planned on the CPU, the safe side.
- FA_F32 (#16546, "CUDA: enable FA for FP32 KV cache", 2025-10-14: absent from Ollama 0.12.6's 7049736b2, present
  in b6840, Ollama 0.12.11's) and FA_BF16 (#20525, "native bf16 flash attention for vec kernel", 2026-03-22;
  b8816 = 3f7c29d, LLamaSharp's of 2026-04-17, has it; ec98e2002 lacks it): an f32 or bf16 cache had no CUDA
  flash-attention kernel before them. The exact builds are not known here: planned from b6840 and b8816 on.

- RPC_EVENTS and VULKAN_EVENTS: llama_context enables pipeline parallelism (GGML_SCHED_MAX_COPIES copies of
  each split's inputs, "pipeline parallelism enabled") only where every device that is not the CPU reports async
  compute and events (src/llama-context.cpp, ggml_backend_dev_props caps). ggml-rpc reported neither until
  d0132a680 ("rpc : implement event and async backend APIs", ggml-org/llama.cpp#18626, merged 2026-08-26; the
  vendored llama.cpp of llama-cpp-python 0.3.35, 4df29be4f = b10454 of 2026-08-15, has ``.events = false``,
  0c1e570's true): planned from b10455 on. ggml-vulkan reported neither until December 2025 (ec98e2002 of
  2025-12-16, the Ollama 0.13.5-0.24 vendor, has ``.events = false``; ggml-org/llama.cpp#18302 of 2025-12-22 fixes
  its event_wait): the exact build is not known here, planned from b7700 on as EMBD_SELECT, the first build
  kvadvise places after ec98e2002 (a build between is planned with one copy, 1-4 rows of inputs less a device).
  Before them a split over RPC or Vulkan devices keeps one copy (tests/data/published 023: two RPC hosts at
  b6209, 588.01 MiB each).

- SPEC_DRAFT_ARGS (ggml-org/llama.cpp#22964, "spec : update CLI arguments for better consistency", merged
  2026-05-12): the speculative types (``--spec-type draft-simple``, ``draft-mtp``) and ``--spec-draft-n-max``; before
  it ``-md`` alone drafts (no type to name) and ``--draft-max N`` sets the tokens drafted (env LLAMA_ARG_MODEL_DRAFT,
  LLAMA_ARG_DRAFT_MAX, LLAMA_ARG_CACHE_TYPE_K_DRAFT ...: common/arg.cpp of that era); b11312 refuses ``--draft-max``
  ("the argument has been removed") and the older builds ``--spec-type``. Ollama's first llama-server (9db4bdbad,
  2026-05-29, b9409) passes the new flags; a public setup note gives draft-mtp in ``--help`` from b9235. The exact
  build is not known here: the new flags from b9235 on (a build of the two days between gets the old ones).

- SWA_CACHE (ggml-org/llama.cpp#13194, merged 2025-05-20): the sliding-window layers' own cache of n_swa + n_ubatch
  cells (llama-kv-cache-unified-iswa.cpp); before it one unified cache held every layer for the whole context
  (Ollama v0.7.0's de4c07f93: llama-model.cpp creates one llama_kv_cache_unified of cparams.n_ctx cells), as
  --swa-full does now: Gemma 3 270M at 32k 576 MiB of K/V, not 111. The exact build is not known here: planned
  from b5924 on (ollama#11244 names it in July 2025), so a build between gets the larger, full cache.

An unknown build is planned by the newest rules (REFERENCE's): a machine without a llama-server to ask is
most likely to run a recent one, and planning every older build's largest figure (the f32 mask of builds
before b9410: +52 % device, +87 % host compute on a published Qwen3.6 run) gave away context on small cards.
The plan's note says what an older build takes besides; an older build is planned by its own rules when
named (--llama-build, or the llama-server on PATH).
"""

from __future__ import annotations

import re

from kvadvise.errors import InputError

REFERENCE = 11312  # 0c1e570: the rules of kvadvise.planner.memory
SWA_PAD_256 = 6900
SET_ROWS = 6200
FUSED_GLU = 5781
MLA_V_LESS = 7830
ATTN_ROT = 8607
MLA_CACHE = 5274
F16_MASK_FA = 9410
SERVER_OUTPUT_LIMITS = 9467
EMBD_SELECT = 7700
RESERVE_ROUNDS_OUTPUTS = 7847
OUTPUT_FIRST = 7700
GRAPH_OPTIMIZE = 6302
FA_QUANT_ANY_HEAD = 6646
FA_VALUE = 6327
FA_KV_ANY_PAIR = 11312
FA_F32 = 6840
FA_BF16 = 8816
RPC_EVENTS = 10455
SPEC_DRAFT_ARGS = 9235
SWA_CACHE = 5924
VULKAN_EVENTS = 7700
SUPPORTED_FROM = MLA_V_LESS  # the builds whose rules are modelled whole (older ones in part)

# The first build that knows an architecture (src/llama-arch.cpp LLM_ARCH_NAMES): an older one stops with
# "unknown model architecture: '%s'" (llm_arch_from_string). Only builds with a public witness; an architecture
# not listed is not checked (the history of llama.cpp is too large for the tools here):
# - command-r: b2440 = 12247f4, #6033 (ollama/ollama#3190: "update llama.cpp submodule to 12247f4 (release tag:
#   b2440) - Adding support for Command-R model");
# - gemma3: b4875 = 7841fc72, #12343 (ggml-org/llama.cpp#12345: "I just tested b4875 (7841fc72 / #12343) ... it
#   seems to be working, now");
# - glm4moe: b6085 = ef0144c0, #14939 (oobabooga/textgen#7177: "Support for GLM 4.5 has been added to llama.cpp in
#   b6085 - commit ef0144c0");
# - gemma4: #21309, after b8635 (unslothai/unsloth#4790: "latest release (b8635) does not include Gemma 4
#   support"; #4796: b8637 has it): the first build is b8636 or b8637, b8636 planned (never a false refusal).
ARCH_FIRST_BUILD: dict[str, tuple[int, str]] = {
    "command-r": (2440, "ggml-org/llama.cpp#6033"),
    "gemma3": (4875, "ggml-org/llama.cpp#12343"),
    "glm4moe": (6085, "ggml-org/llama.cpp#14939"),
    "gemma4": (8636, "ggml-org/llama.cpp#21309"),
}


# Architectures whose first build is not known here, with a build known to lack them: one dated before the model
# existed or was asked for (b4875 is 2025-03-12, gemma3's first, ggml-org/llama.cpp#12343). A build at or below it is
# refused; the builds between it and the real first one are not.
_B4875 = (4875, "2025-03-12")
ARCH_LACKING_BUILD: dict[str, tuple[tuple[int, str], str]] = {
    "llama4": (_B4875, "Llama 4 was released on 2025-04-05"),
    "falcon-h1": (_B4875, "asked for in ggml-org/llama.cpp#13681 on 2025-05-21"),
    "ernie4_5-moe": (_B4875, "asked for in ggml-org/llama.cpp#14465 on 2025-06-30"),
}


def check_architecture(architecture: str, build: int | None) -> None:
    """Refuse a plan for a build (--llama-build, the llama-server on PATH) that does not know ``architecture``
    (ARCH_FIRST_BUILD, ARCH_LACKING_BUILD)."""
    lacking = ARCH_LACKING_BUILD.get(architecture)
    if lacking is not None and build is not None and build <= lacking[0][0]:
        (bound, dated), why = lacking
        raise InputError(
            f'llama.cpp b{build} does not know the {architecture} architecture: it stops with "unknown model '
            f"architecture: '{architecture}'\" (b{bound} is of {dated}; {why})",
            hint="a llama.cpp of the model's time or later; --llama-build bNNNN names the build you will run",
        )
    first = ARCH_FIRST_BUILD.get(architecture)
    if first is None or not older_than(build, first[0]):
        return
    raise InputError(
        f'llama.cpp b{build} does not know the {architecture} architecture: it stops with "unknown '
        f"model architecture: '{architecture}'\" (added in b{first[0]}, {first[1]})",
        hint=f"a llama.cpp from b{first[0]} on; --llama-build bNNNN names the build you will run",
    )


_BUILD = re.compile(r"^\s*(?:b|build\s*|version:?\s*)?(\d{3,6})(?:\s*\(([0-9a-f]{6,40})\))?\s*$", re.IGNORECASE)
# llama-server --version: "version: 9410 (031ddb2e0)", or since 2026 "version: 0.5.0-dev (build 11312, commit
# 0c1e570)" (common/build-info); a log's "build: 9410 (031ddb2e0) with ..."
_VERSION_LINE = re.compile(
    r"(?:version:\s*|\bbuild:?\s+)(\d{3,6})\s*\(([0-9a-f]{6,40})\)|\(build (\d{3,6}), commit ([0-9a-f]{6,40})\)"
)


def parse(text: str) -> int:
    """A llama.cpp build from what a user or a program says: ``b9410``, ``9410``, ``version: 9410 (031ddb2e0)``
    (``llama-server --version``), or that output whole."""
    m = _BUILD.match(text)
    build = int(m.group(1)) if m else version_build(text)
    if build is None:
        raise InputError(
            f"not a llama.cpp build: {text.strip()[:80]!r}",
            hint="give it as bNNNN (llama-server --version prints 'version: NNNN (commit)')",
        )
    return build


def version_build(output: str) -> int | None:
    """The build in ``llama-server --version`` output or a log's build line, None if it has none."""
    m = _VERSION_LINE.search(output)
    return int(m.group(1) or m.group(3)) if m else None


def label(build: int | None) -> str:
    return f"b{build}" if build is not None else "unknown"


def older_than(build: int | None, rule: int) -> bool:
    """Whether a plan for ``build`` follows the rule before ``rule``; an unknown build follows the newest rules."""
    return build is not None and build < rule
