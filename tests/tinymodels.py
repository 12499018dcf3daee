"""Tiny random-weight GGUF files that real llama.cpp loads and runs, one recipe per architecture.

Public interface::

    RECIPES: tuple[str, ...]
    RECIPE_ARCH: dict[str, str]          # recipe -> general.architecture
    write_tiny_gguf(path, recipe, *, n_vocab=512, n_ctx_train=8192, seed=0, dims=None, sparse=False) -> Path
        dims: a recipe's dimensions by name (real-size layers); sparse: the header only, the data a hole

Every recipe was loaded and evaluated with llama-cpp-python 0.3.36 (vendored llama.cpp commit 0c1e57098bba):
n_ctx 1000/2048/4096, n_ubatch 512/128/64, n_seq_max 1 and 4, kv_unified on/off, swa_full on/off,
flash attention on/off, K/V cache f16 and q8_0, n_vocab 512 and 32000 -- finite logits, identical with FA on/off.
Source references below are files/functions of that commit (``models/X.cpp`` = ``src/models/X.cpp``).

Common to all recipes
---------------------
* Vocab: SentencePiece ``tokenizer.ggml.model = "llama"``: ``<unk>`` ``<s>`` ``</s>``, the 256 byte-fallback
  tokens ``<0x00>``..``<0xFF>`` (llama_vocab::impl::load looks up ``<0x0A>`` for the newline token), filler
  pieces, and ``<|endoftext|>`` as the last id. ``llama_vocab_n_tokens`` == ``n_vocab`` exactly
  (>= MIN_VOCAB). ``<|endoftext|>`` is needed because llama_vocab::impl::load calls
  ``token_to_id.at("<|endoftext|>")`` whenever general.name contains "phi3" (else: "unordered_map::at").
* Weights: N(0, 0.02) f16 matrices; f32 norms (=1), biases, router weights, SSM A (=-1), D (=1) and conv
  kernels (ggml_ssm_conv only takes f32). "mixtral" stores token_embd + attention as q8_0 and experts as q4_0;
  on a CPU with repack support llama.cpp moves those into an extra ``CPU_REPACK model buffer`` line next to
  ``CPU_Mapped`` (make_cpu_buft_list in src/llama-model.cpp, use_extra_bufts).
* Tied output (no ``output.weight``; ``token_embd`` is created again with TENSOR_DUPLICATED and, on one
  buffer type, deduplicated in llama_model_loader::create_tensor): qwen2, qwen3, gemma2, gemma3, command-r,
  cohere2, granite, qwen35, mamba2, lfm2, granitehybrid. The others write ``output.weight``.
* KV cache (src/llama-kv-cache.cpp, llama_kv_cache ctor): per layer K = [n_embd_head_k(il)*n_head_kv(il),
  kv_size, n_stream], V likewise with n_embd_head_v; V rows are padded to n_embd_v_gqa_max when FA is off
  and V width varies by layer; no V tensor at all when hparams.is_mla(). n_stream = 1 if kv_unified else
  n_seq_max. llama_context ctor (src/llama-context.cpp) pads n_ctx to 256 and, when not unified,
  n_ctx_seq = PAD(n_ctx / n_seq_max, 256).
* SWA (src/llama-kv-cache-iswa.cpp): SWA cache cells = PAD(min(n_ctx_seq, n_swa*(unified ? n_seq_max : 1)
  + n_ubatch), 256), or n_ctx_seq when swa_full. llama_context_default_params() has swa_full = true, so
  both caches are full size unless swa_full=False is passed. Pattern: llama_model_base::load_swa_pattern
  (src/llama-model.cpp) reads ``attention.sliding_window_pattern`` as a per-layer bool array or a scalar
  n, else the arch default; llama_hparams::set_swa_pattern (src/llama-hparams.cpp) with dense_first=false
  gives is_swa(il) = il % n < n - 1 (the last layer of every group of n is full attention).
* Recurrent state (src/llama-memory-recurrent.cpp): rows = max(1, n_seq_max) * (1 + n_rs_seq), per
  recurrent layer R f32 [n_embd_r()], S f32 [n_embd_s()] (llama_hparams::n_embd_r / n_embd_s); mamba-style
  n_embd_r = (d_conv-1)*(d_inner + 2*n_group*d_state), n_embd_s = d_state*d_inner; LFM2
  n_embd_r = n_embd*(l_cache-1), n_embd_s = 0. Hybrid layer split: llama_model::create_memory.
* llama_init_from_model (src/llama-context.cpp) rejects a quantized V cache without FA, and type_k != type_v
  for MLA models.
* llama-cpp-python ``Llama()``: ``flash_attn: bool`` (mapped to flash_attn_type ENABLED/DISABLED),
  ``swa_full`` (None keeps the C default true), ``type_k``/``type_v``; no n_seq_max or kv_unified
  arguments -- use llama_context_default_params() + llama_init_from_model for those.

Recipes (arch; hparams; what llama.cpp does with them). Per-layer K/V widths are elements per cell.
------------------------------------------------------------------------------------------------
llama (llama): 2 layers, n_embd 128, n_head 4, n_head_kv 2, head 32, n_ff 256, rope dim 32, untied.
    GQA: K = V = 64 per layer. models/llama.cpp load_arch_hparams; load_hparams rejects n_rot != head_k.
mixtral (llama): as llama but n_ff 128 used per expert, expert_count 4, expert_used_count 2; q8_0/q4_0
    weights (see above). models/llama.cpp load_arch_tensors takes the MoE branch when n_expert > 0.
qwen2 (qwen2): 2 layers, n_embd 128, n_head 4, n_head_kv 2, head 32 (= n_embd/n_head, no key_length:
    models/qwen2.cpp sizes attn_q/attn_output with n_embd), q/k/v biases, n_ff 256, tied. K = V = 64.
qwen3 (qwen3): 2 layers, n_embd 128, n_head 4, n_head_kv 2, key/value_length 64 (q width 256 != n_embd),
    q/k norm, n_ff 256, tied. K = V = 128.
qwen3moe (qwen3moe): qwen3 dims + expert_count 8, expert_used_count 2, expert_feed_forward_length 64, untied.
gemma2 (gemma2): 4 layers, n_embd 128, n_head 4, n_head_kv 2, head 64, n_ff 256, sliding_window 256,
    soft-capping 50/30, tied. models/gemma2.cpp: swa_type STANDARD, load_swa_pattern(ml, 2) -> layers 0, 2
    SWA, 1, 3 full; n_swa defaults to 4096 when the key is absent. K = V = 128.
gemma3 (gemma3): 8 layers, n_embd 128, n_head 4, n_head_kv 1, head 64, n_ff 256, sliding_window 128,
    rope.freq_base 1e6 / freq_base_swa 1e4, q/k norm, tied. models/gemma3.cpp: SWA only if sliding_window
    is present and > 0; load_swa_pattern(ml, 6) -> layers 0-4, 6, 7 SWA, layer 5 full. K = V = 64.
gemma3n (gemma3n): 22 layers, n_embd 128, n_head 4, n_head_kv 1, head 64, n_ff 256, sliding_window 128, the
    default SWA pattern 5 (layers 4, 9, 14, 19 full); altup (4 streams: altup_proj/unembd_proj {n_embd, n_embd, 3},
    per-layer router, predict/correct coefficients), laurel (rank 64), per-layer embeddings 256 wide (all fixed
    in llama_hparams); n_layer_kv_from_start is fixed at 20, so layers 20, 21 read layer 18's cache. Tied.
    KV: 16 SWA layers and 4 full, K = V = 64. Written with 2,048 tokens (test_oracle: the 256 x n_layer
    table at 32,000 would be 360 MB).
gemma4 (gemma4): Gemma 4 E2B-style. 9 layers, n_embd 128, n_head 4, n_head_kv 1, key/value_length 64 (full)
    and key/value_length_swa 32 with rope.dimension_count_swa 32, sliding_window 128, a bool
    sliding_window_pattern (required by models/gemma4.cpp; layers 2, 5, 8 full), embedding_length_per_layer_input
    16 (per_layer_token_embd {16*9, n_vocab}, per_layer_model_proj, per-layer inp_gate/proj/post_norm),
    shared_kv_layers 3: n_layer_kv_from_start 6, layers 6-8 keep no K/V and read layer 4 (SWA) or 5 (full)
    (llama_model::create_memory's reuse: the full layer must sit just before the shared ones), one rope_freqs,
    tied. KV: 4 SWA layers K = V = 32, 2 full K = V = 64.
gemma4-moe (gemma4): Gemma 4 26B-A4B-style. 6 layers, the same attention with n_head_kv_full for the full
    layers, embedding_length_per_layer_input 0 (required), no shared caches, every layer a dense MLP (n_ff 256)
    beside 4 experts (2 used, ff 64) with the router's scale vector and pre/post norms 1 and 2.
gpt-oss (gpt-oss): 4 layers, n_embd 128, n_head 4, n_head_kv 2, key/value_length 64, sliding_window 128
    (required), attn_sinks, q/k/v/o biases, expert_count 4, used 2, expert_feed_forward_length 64 (required),
    untied (required). models/openai-moe.cpp: load_swa_pattern(ml, 2) -> layers 0, 2 SWA. K = V = 128.
phi3 (phi3): 2 layers, n_embd 128, n_head 4, n_head_kv 4 (MHA), head 32, n_ff 256, fused attn_qkv and
    gate+up ffn_up [n_embd, 2*n_ff], sliding_window 2047. models/phi3.cpp load_arch_hparams logs
    "Phi SWA is currently disabled" and sets swa_type NONE / set_swa_pattern(1): no SWA cache. K = V = 128.
command-r (command-r): 2 layers, n_embd 128, n_head 4, n_head_kv 2, head 32, n_ff 256, LayerNorm eps,
    logit_scale, parallel attn/ffn (no ffn_norm), output always tied. K = V = 64.
cohere2 (cohere2): command-r dims, 4 layers, sliding_window 64 (required), sliding_window_pattern 4 (also
    the default of models/cohere2.cpp), logit_scale (required) -> layers 0-2 SWA, layer 3 full. K = V = 64.
granite (granite): 2 layers, n_embd 128, n_head 4, n_head_kv 2, head 32, n_ff 256, logit_scale (required),
    residual/embedding/attention scales, tied. K = V = 64.
deepseek2-mla (deepseek2): new-style MLA GGUF. 2 layers, n_embd 128, n_head 4, head_count_kv 1,
    key_length 160 (= kv_lora_rank 128 + rope 32), value_length 128 (= kv_lora_rank),
    key_length_mla 96 (nope 64 + rope 32), value_length_mla 64, rope dim 32, q_lora_rank 64,
    leading_dense_block_count 1 (layer 0 dense n_ff 256, layer 1 MoE: 4 experts, 2 used, 1 shared, ff 64),
    attn_k_b / attn_v_b. models/deepseek2.cpp: the *_mla keys make hparams.is_mla() true; the KV cache holds
    only K (160 per layer, the compressed latent + rope part), no V (llama_kv_cache ctor, has_v = !is_mla);
    llama_init_from_model requires type_k == type_v.
deepseek2-legacy (deepseek2): same dims but an old non-MLA GGUF: no *_mla keys, head_count_kv 4 (= n_head),
    key_length 96, value_length 64, q_lora_rank 0 (plain attn_q), fused attn_kv_b. Not MLA: full MHA cache,
    K = 4*96 = 384, V = 4*64 = 256 per layer (key_length != value_length). q_lora_rank must be present (it is
    only optional for the "lite" layer counts 26/27/48 in models/deepseek2.cpp load_arch_hparams).
glm4moe (glm4moe): block_count 3 with nextn_predict_layers 1 -> hparams.n_layer() = 2 trunk layers + one MTP
    layer (blk.2 incl. nextn.eh_proj/enorm/hnorm/shared_head_norm). n_embd 128, n_head 4, n_head_kv 2, head 64,
    rope dim 32, q/k/v biases, q/k norm, leading_dense_block_count 1, 4 experts (2 used, 1 shared, ff 64,
    exp_probs_b), sigmoid gating. models/glm4-moe.cpp load_arch_tensors adds TENSOR_SKIP to the MTP layer
    unless the model is loaded with load_mtp (default false): its tensors are "unused" and excluded from the
    model buffer (llama_model_loader::create_tensor). llama_model::create_memory filters il < n_layer(),
    so the MTP layer gets no KV: 2 layers of K = V = 128.
qwen35 (qwen35): hybrid, 6 layers, full_attention_interval 3 -> models/qwen35.cpp load_arch_hparams marks
    is_recr(il) = (il + 1) % 3 != 0: layers 0, 1, 3, 4 gated-delta-net (recurrent), 2, 5 attention.
    Attention: n_head 4, n_head_kv 2, head 64, gated q (attn_q width 2*n_head*head), rope dim 32,
    rope.dimension_sections [6, 5, 5, 0] (required). GDN: ssm.conv_kernel 4, state_size 32 (head dim),
    group_count 2 (k heads), time_step_rank 4 (v heads), inner_size 128; n_ff 256 dense, tied.
    create_memory -> llama_memory_hybrid: KV for layers 2, 5 (K = V = 128), RS for 0, 1, 3, 4 with
    R = 3*(128 + 2*2*32) = 768 and S = 32*128 = 4096 f32 per layer.
qwen3next (qwen3next): hybrid MoE, 4 layers, full_attention_interval 4 -> layers 0-2 recurrent, 3 attention;
    same attention/GDN dims as qwen35 (fused ssm_ba), 4 experts (2 used, ff 64) + shared expert (ff 64, 1-D
    ffn_gate_inp_shexp), untied. KV: 1 layer K = V = 128; RS: 3 layers R 768, S 4096.
mamba2 (mamba2): 2 layers, n_embd 128, ssm conv_kernel 4, inner_size 256, state_size 32, time_step_rank 4
    (heads), group_count 1, head_count 0, tied. Pure recurrent (llm_arch_is_recurrent): no KV cache, RS only,
    R = 3*(256 + 2*32) = 960, S = 32*256 = 8192 f32 per layer.
lfm2 (lfm2): 6 layers, n_embd 128, n_head 4, head_count_kv per-layer array [0, 0, 2, 0, 0, 2], head 32,
    shortconv.l_cache 3, n_ff 256, tied (output norm tensor is "token_embd_norm"). models/lfm2.cpp:
    is_recr(il) = n_head_kv(il) == 0 -> layers 0, 1, 3, 4 shortconv, 2, 5 attention (K = V = 64);
    RS R = n_embd*(l_cache-1) = 256, S = 0 per conv layer (llama_hparams::n_embd_r).
granitehybrid (granitehybrid): 4 layers, n_embd 128, n_head 4, head_count_kv per-layer array [0, 0, 2, 0],
    head 32, mamba2 mixer: conv_kernel 4, inner_size 256 (must be 2*n_embd), state_size 64, time_step_rank 8,
    group_count 1; n_ff 256 dense; granite scales; tied. models/granite-hybrid.cpp: is_recr(il) =
    n_head_kv(il) == 0 -> layer 2 attention (K = V = 64), layers 0, 1, 3 recurrent with
    R = 3*(256 + 2*64) = 1152, S = 64*256 = 16384 f32 per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

__all__ = ["RECIPES", "RECIPE_ARCH", "write_tiny_gguf"]

F16 = GGMLQuantizationType.F16
F32 = GGMLQuantizationType.F32
Q8_0 = GGMLQuantizationType.Q8_0
Q4_0 = GGMLQuantizationType.Q4_0

# Standard deviation of the random matrices; small enough that no activation
# overflows f16 and no softmax / exp produces inf or NaN.
WEIGHT_STD = 0.02
# Norm epsilons written for every recipe.
RMS_EPS = 1e-6
LAYER_NORM_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0
GEMMA3_ROPE_FREQ_BASE = 1_000_000.0  # global layers; SWA layers use ROPE_FREQ_BASE

# SentencePiece ("llama") vocab layout: <unk>, <s>, </s>, 256 byte-fallback
# tokens <0x00>..<0xFF>, then filler pieces until n_vocab.
TOKEN_UNK = 0
TOKEN_BOS = 1
TOKEN_EOS = 2
N_SPECIAL_TOKENS = 3
N_BYTE_TOKENS = 256
# Last token of every vocab. llama-vocab.cpp (llama_vocab::impl::load, token
# attribute fix-ups) calls token_to_id.at("<|endoftext|>") whenever
# general.name contains "phi3", so the phi3 recipe would not load without it.
TRAILING_CONTROL_TOKENS = ("<|endoftext|>",)
MIN_VOCAB = N_SPECIAL_TOKENS + N_BYTE_TOKENS + 1 + len(TRAILING_CONTROL_TOKENS)
# llama_token_type values (include/llama.h)
TOKTYPE_NORMAL = 1
TOKTYPE_UNKNOWN = 2
TOKTYPE_CONTROL = 3
TOKTYPE_BYTE = 6
SPM_SPACE = "\u2581"

# expert gating functions (llama_expert_gating_func_type)
GATING_SOFTMAX = 1
GATING_SIGMOID = 2


class _TinyWriter:
    """Thin wrapper over GGUFWriter: arch-prefixed keys and random tensors.

    Tensor shapes are given in ggml order (ne0, ne1, ...), exactly as in the
    ``create_tensor`` calls of llama.cpp; they are reversed for numpy.
    """

    def __init__(
        self,
        path: Path,
        arch: str,
        name: str,
        n_vocab: int,
        n_ctx_train: int,
        seed: int,
        *,
        dims: Mapping[str, int] | None = None,
        sparse: bool = False,
        qtypes: Mapping[str, GGMLQuantizationType] | None = None,
    ) -> None:
        self.arch = arch
        self._qtypes = dict(qtypes or {})
        self.n_vocab = n_vocab
        self.rng = np.random.RandomState(seed)
        self.path = path
        self.gguf = GGUFWriter(str(path), arch)
        self._dims = dict(dims or {})
        self._dims_used: set[str] = set()
        self.sparse = sparse
        self._data_bytes = 0  # sparse: the data section's size (each tensor padded to the alignment)
        self.gguf.add_name(name)
        self.u32("context_length", n_ctx_train)
        self._write_vocab()

    def dims(self, **defaults: int) -> tuple[int, ...]:
        """The recipe's dimensions in the order given: ``defaults`` (the tiny model's), each replaced by
        the value of the same name ``write_tiny_gguf(dims=...)`` was given."""
        self._dims_used.update(defaults)
        return tuple(self._dims.get(k, v) for k, v in defaults.items())

    # --- metadata -------------------------------------------------------

    def _key(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def u32(self, key: str, value: int) -> None:
        self.gguf.add_uint32(self._key(key), value)

    def f32(self, key: str, value: float) -> None:
        self.gguf.add_float32(self._key(key), value)

    def flag(self, key: str, value: bool) -> None:
        self.gguf.add_bool(self._key(key), value)

    def ints(self, key: str, values: Sequence[int]) -> None:
        """Per-layer (or per-section) integer array, stored as INT32."""
        self.gguf.add_array(self._key(key), [int(v) for v in values])

    def _write_vocab(self) -> None:
        n_vocab = self.n_vocab
        if n_vocab < MIN_VOCAB:
            raise ValueError(f"n_vocab must be >= {MIN_VOCAB} (specials + 256 byte tokens + 1 piece), got {n_vocab}")
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
        types = [TOKTYPE_UNKNOWN, TOKTYPE_CONTROL, TOKTYPE_CONTROL] + [TOKTYPE_BYTE] * N_BYTE_TOKENS
        letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
        pieces = [SPM_SPACE, *letters, *(SPM_SPACE + c for c in letters)]
        n_filler = n_vocab - len(tokens) - len(TRAILING_CONTROL_TOKENS)
        fillers = pieces[:n_filler] + [f"{SPM_SPACE}t{i}" for i in range(max(0, n_filler - len(pieces)))]
        scores = [0.0] * len(tokens) + [-float(i) for i in range(len(fillers))]
        tokens += fillers + list(TRAILING_CONTROL_TOKENS)
        types += [TOKTYPE_NORMAL] * len(fillers) + [TOKTYPE_CONTROL] * len(TRAILING_CONTROL_TOKENS)
        scores += [0.0] * len(TRAILING_CONTROL_TOKENS)
        if not len(tokens) == len(set(tokens)) == len(types) == len(scores) == n_vocab:
            raise AssertionError("vocab construction bug")
        self.gguf.add_tokenizer_model("llama")
        self.gguf.add_token_list(tokens)
        self.gguf.add_token_scores(scores)
        self.gguf.add_token_types(types)
        self.gguf.add_unk_token_id(TOKEN_UNK)
        self.gguf.add_bos_token_id(TOKEN_BOS)
        self.gguf.add_eos_token_id(TOKEN_EOS)
        self.gguf.add_add_bos_token(True)
        self.gguf.add_add_eos_token(False)

    # --- tensors --------------------------------------------------------

    def _random(self, ne: Sequence[int], std: float) -> np.ndarray:
        return (self.rng.standard_normal(tuple(reversed(ne))) * std).astype(np.float32)

    def _info(self, name: str, ne: Sequence[int], qtype: GGMLQuantizationType) -> None:
        """Sparse: only the tensor's header entry; its bytes are a hole of the file (finish)."""
        block, size = GGML_QUANT_SIZES[qtype]
        if ne[0] % block:
            raise ValueError(f"{name}: ne0 {ne[0]} is not a multiple of {qtype.name}'s block {block}")
        n_bytes = int(np.prod(ne, dtype=np.int64)) // block * size
        self.gguf.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), n_bytes, raw_dtype=qtype)
        self._data_bytes += GGUFWriter.ggml_pad(n_bytes, self.gguf.data_alignment)

    def mat(self, name: str, *ne: int, qtype: GGMLQuantizationType = F16) -> None:
        """Random weight matrix, f16 or quantized (q8_0 / q4_0 need ne0 % 32 == 0)."""
        if self.sparse:  # a type given by the tensor's name without block and suffix ("ffn_down_exps")
            return self._info(name, ne, self._qtypes.get(name.split(".")[-2], qtype))
        data = self._random(ne, WEIGHT_STD)
        if qtype == F16:
            self.gguf.add_tensor(name, data.astype(np.float16))
        else:
            self.gguf.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def vec(self, name: str, *ne: int, std: float = WEIGHT_STD) -> None:
        """Random f32 tensor (biases, small f32 matrices like conv kernels)."""
        if self.sparse:
            return self._info(name, ne, F32)
        self.gguf.add_tensor(name, self._random(ne, std))

    def fill(self, name: str, value: float, *ne: int) -> None:
        """Constant f32 tensor (norm weights = 1, SSM A < 0, D = 1, ...)."""
        if self.sparse:
            return self._info(name, ne, F32)
        self.gguf.add_tensor(name, np.full(tuple(reversed(ne)), value, dtype=np.float32))

    def norm(self, name: str, *ne: int) -> None:
        self.fill(name, 1.0, *ne)

    def finish(self) -> None:
        unused = set(self._dims) - self._dims_used
        if unused:
            raise ValueError(f"{self.arch}: no dimension named {', '.join(sorted(unused))} in this recipe")
        self.gguf.write_header_to_file()
        self.gguf.write_kv_data_to_file()
        if not self.sparse:
            self.gguf.write_tensors_to_file()
        else:  # the data section as a hole: llama.cpp checks its bounds, a no-allocation load never reads it
            self.gguf.write_ti_data_to_file()
            assert self.gguf.fout is not None
            out = self.gguf.fout[0]
            self.gguf.write_padding(out, out.tell())
            out.truncate(out.tell() + self._data_bytes)
        self.gguf.close()


# --- shared building blocks ----------------------------------------------


def _hparams(
    t: _TinyWriter,
    *,
    n_layer: int,
    n_embd: int,
    n_head: int | Sequence[int],
    n_head_kv: int | Sequence[int] | None,
    n_ff: int,
    head_k: int | None = None,
    head_v: int | None = None,
    n_rot: int | None = None,
    rope_base: float = ROPE_FREQ_BASE,
    rms_norm: bool = True,
) -> None:
    t.u32("block_count", n_layer)
    t.u32("embedding_length", n_embd)
    t.u32("feed_forward_length", n_ff)
    if isinstance(n_head, int):
        t.u32("attention.head_count", n_head)
    else:
        t.ints("attention.head_count", n_head)
    if isinstance(n_head_kv, int):
        t.u32("attention.head_count_kv", n_head_kv)
    elif n_head_kv is not None:
        t.ints("attention.head_count_kv", n_head_kv)
    if head_k is not None:
        t.u32("attention.key_length", head_k)
    if head_v is not None:
        t.u32("attention.value_length", head_v)
    if n_rot is not None:
        t.u32("rope.dimension_count", n_rot)
    t.f32("rope.freq_base", rope_base)
    if rms_norm:
        t.f32("attention.layer_norm_rms_epsilon", RMS_EPS)
    else:
        t.f32("attention.layer_norm_epsilon", LAYER_NORM_EPS)


def _embeddings(
    t: _TinyWriter,
    n_embd: int,
    *,
    tied: bool,
    qtype: GGMLQuantizationType = F16,
    output_norm: str = "output_norm.weight",
) -> None:
    t.mat("token_embd.weight", n_embd, t.n_vocab, qtype=qtype)
    t.norm(output_norm, n_embd)
    if not tied:
        t.mat("output.weight", n_embd, t.n_vocab)


def _attention(
    t: _TinyWriter,
    il: int,
    n_embd: int,
    n_q: int,
    n_k: int,
    n_v: int,
    *,
    n_o: int | None = None,
    bias: bool = False,
    qtype: GGMLQuantizationType = F16,
) -> None:
    """Separate q/k/v/output projections (``create_tensor_qkv`` non-fused branch)."""
    p = f"blk.{il}"
    t.mat(f"{p}.attn_q.weight", n_embd, n_q, qtype=qtype)
    t.mat(f"{p}.attn_k.weight", n_embd, n_k, qtype=qtype)
    t.mat(f"{p}.attn_v.weight", n_embd, n_v, qtype=qtype)
    if bias:
        t.vec(f"{p}.attn_q.bias", n_q)
        t.vec(f"{p}.attn_k.bias", n_k)
        t.vec(f"{p}.attn_v.bias", n_v)
    t.mat(f"{p}.attn_output.weight", n_q if n_o is None else n_o, n_embd, qtype=qtype)


def _qk_norm(t: _TinyWriter, il: int, head_k: int) -> None:
    t.norm(f"blk.{il}.attn_q_norm.weight", head_k)
    t.norm(f"blk.{il}.attn_k_norm.weight", head_k)


def _ffn(t: _TinyWriter, il: int, n_embd: int, n_ff: int, *, qtype: GGMLQuantizationType = F16) -> None:
    p = f"blk.{il}"
    t.mat(f"{p}.ffn_gate.weight", n_embd, n_ff, qtype=qtype)
    t.mat(f"{p}.ffn_up.weight", n_embd, n_ff, qtype=qtype)
    t.mat(f"{p}.ffn_down.weight", n_ff, n_embd, qtype=qtype)


def _moe(
    t: _TinyWriter,
    il: int,
    n_embd: int,
    n_ff_exp: int,
    n_expert: int,
    *,
    qtype: GGMLQuantizationType = F16,
    probs_bias: bool = False,
) -> None:
    p = f"blk.{il}"
    t.vec(f"{p}.ffn_gate_inp.weight", n_embd, n_expert)
    if probs_bias:
        t.vec(f"{p}.exp_probs_b.bias", n_expert)
    t.mat(f"{p}.ffn_gate_exps.weight", n_embd, n_ff_exp, n_expert, qtype=qtype)
    t.mat(f"{p}.ffn_up_exps.weight", n_embd, n_ff_exp, n_expert, qtype=qtype)
    t.mat(f"{p}.ffn_down_exps.weight", n_ff_exp, n_embd, n_expert, qtype=qtype)


def _shared_expert(t: _TinyWriter, il: int, n_embd: int, n_ff_shexp: int) -> None:
    p = f"blk.{il}"
    t.mat(f"{p}.ffn_gate_shexp.weight", n_embd, n_ff_shexp)
    t.mat(f"{p}.ffn_up_shexp.weight", n_embd, n_ff_shexp)
    t.mat(f"{p}.ffn_down_shexp.weight", n_ff_shexp, n_embd)


def _experts_hparams(t: _TinyWriter, n_expert: int, n_expert_used: int, n_ff_exp: int | None = None) -> None:
    t.u32("expert_count", n_expert)
    t.u32("expert_used_count", n_expert_used)
    if n_ff_exp is not None:
        t.u32("expert_feed_forward_length", n_ff_exp)


def _ssm_hparams(t: _TinyWriter, *, d_conv: int, d_inner: int, d_state: int, dt_rank: int, n_group: int) -> None:
    t.u32("ssm.conv_kernel", d_conv)
    t.u32("ssm.inner_size", d_inner)
    t.u32("ssm.state_size", d_state)
    t.u32("ssm.time_step_rank", dt_rank)
    t.u32("ssm.group_count", n_group)


def _mamba2_mixer(
    t: _TinyWriter, il: int, n_embd: int, *, d_conv: int, d_inner: int, d_state: int, n_head: int, n_group: int
) -> None:
    """Mamba-2 mixer tensors (mamba2.cpp / granite-hybrid.cpp load_arch_tensors)."""
    p = f"blk.{il}"
    conv_dim = d_inner + 2 * n_group * d_state
    t.mat(f"{p}.ssm_in.weight", n_embd, d_inner + conv_dim + n_head)
    t.vec(f"{p}.ssm_conv1d.weight", d_conv, conv_dim)  # ggml_ssm_conv needs f32
    t.vec(f"{p}.ssm_conv1d.bias", conv_dim)
    t.vec(f"{p}.ssm_dt.bias", n_head)
    t.fill(f"{p}.ssm_a", -1.0, 1, n_head)  # A = -exp(A_log), must be negative
    t.norm(f"{p}.ssm_d", 1, n_head)
    t.norm(f"{p}.ssm_norm.weight", d_inner // n_group, n_group)
    t.mat(f"{p}.ssm_out.weight", d_inner, n_embd)


def _gated_delta_net(
    t: _TinyWriter, il: int, n_embd: int, *, d_conv: int, head_dim: int, n_k_heads: int, n_v_heads: int, fused_ba: bool
) -> None:
    """Qwen3-Next / Qwen3.5 linear-attention (gated delta net) layer tensors."""
    p = f"blk.{il}"
    key_dim = head_dim * n_k_heads
    value_dim = head_dim * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    t.mat(f"{p}.attn_qkv.weight", n_embd, conv_dim)
    t.mat(f"{p}.attn_gate.weight", n_embd, value_dim)
    t.vec(f"{p}.ssm_conv1d.weight", d_conv, conv_dim)  # ggml_ssm_conv needs f32
    t.vec(f"{p}.ssm_dt.bias", n_v_heads)
    t.fill(f"{p}.ssm_a", -1.0, n_v_heads)
    if fused_ba:
        t.mat(f"{p}.ssm_ba.weight", n_embd, 2 * n_v_heads)
    else:
        t.mat(f"{p}.ssm_beta.weight", n_embd, n_v_heads)
        t.mat(f"{p}.ssm_alpha.weight", n_embd, n_v_heads)
    t.norm(f"{p}.ssm_norm.weight", head_dim)
    t.mat(f"{p}.ssm_out.weight", value_dim, n_embd)


def _nextn(t: _TinyWriter, il: int, n_embd: int) -> None:
    p = f"blk.{il}.nextn"
    t.mat(f"{p}.eh_proj.weight", 2 * n_embd, n_embd)
    t.norm(f"{p}.enorm.weight", n_embd)
    t.norm(f"{p}.hnorm.weight", n_embd)
    t.norm(f"{p}.shared_head_norm.weight", n_embd)


# --- recipes -------------------------------------------------------------
# Each builder writes the arch hparams and all tensors its load_arch_tensors
# requires. Dimensions are module-level literals inside each builder so the
# docstring table above can be checked against them.


def _llama(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff = t.dims(
        n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head=32, n_ff=256
    )
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=head)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _ffn(t, il, n_embd, n_ff)


def _mixtral(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff = t.dims(
        n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head=32, n_ff=128
    )
    n_expert, n_expert_used = t.dims(n_expert=4, n_expert_used=2)
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=head)
    _experts_hparams(t, n_expert, n_expert_used)
    _embeddings(t, n_embd, tied=False, qtype=Q8_0)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head, qtype=Q8_0)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _moe(t, il, n_embd, n_ff, n_expert, qtype=Q4_0)


def _qwen2(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_embd, n_head_kv * head, n_head_kv * head, bias=True)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _ffn(t, il, n_embd, n_ff)


def _qwen3(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff = t.dims(
        n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head=64, n_ff=256
    )
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head_k=head, head_v=head)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head)
        _qk_norm(t, il, head)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _ffn(t, il, n_embd, n_ff)


def _qwen3moe(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff = t.dims(
        n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head=64, n_ff=256
    )
    n_expert, n_expert_used, n_ff_exp = t.dims(n_expert=8, n_expert_used=2, n_ff_exp=64)
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head_k=head, head_v=head)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head)
        _qk_norm(t, il, head)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _moe(t, il, n_embd, n_ff_exp, n_expert)


def _qwen2moe(t: _TinyWriter) -> None:
    """src/models/qwen2moe.cpp (0c1e570): qwen2's attention (q/k/v biases), routed experts and a shared expert with
    its sigmoid gate (ffn_gate_inp_shexp, one value per token)."""
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    n_expert, n_expert_used, n_ff_exp, n_ff_shexp = t.dims(n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=128)
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("expert_shared_feed_forward_length", n_ff_shexp)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_embd, n_head_kv * head, n_head_kv * head, bias=True)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _moe(t, il, n_embd, n_ff_exp, n_expert)
        t.vec(f"blk.{il}.ffn_gate_inp_shexp.weight", n_embd)
        _shared_expert(t, il, n_embd, n_ff_shexp)


def _gemma_block(t: _TinyWriter, il: int, n_embd: int, n_head: int, n_head_kv: int, head: int, n_ff: int) -> None:
    t.norm(f"blk.{il}.attn_norm.weight", n_embd)
    _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head)
    t.norm(f"blk.{il}.post_attention_norm.weight", n_embd)
    t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
    _ffn(t, il, n_embd, n_ff)
    t.norm(f"blk.{il}.post_ffw_norm.weight", n_embd)


def _gemma_hparams(
    t: _TinyWriter,
    *,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int | Sequence[int],
    n_ff: int,
    head: int,
    n_swa: int,
) -> None:
    """Gemma 3/3n/4: rope base 1e6 on full layers, 1e4 on sliding-window ones."""
    _hparams(
        t,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head,
        head_v=head,
        rope_base=GEMMA3_ROPE_FREQ_BASE,
    )
    t.u32("attention.sliding_window", n_swa)
    t.f32("rope.freq_base_swa", ROPE_FREQ_BASE)


def _per_layer_embeddings(t: _TinyWriter, n_embd: int, width: int, n_layer: int) -> None:
    """Gemma 3n/4's per-layer embedding table (an input tensor: on the CPU) and its projection."""
    t.mat("per_layer_token_embd.weight", width * n_layer, t.n_vocab)
    t.mat("per_layer_model_proj.weight", n_embd, width * n_layer)
    t.norm("per_layer_proj_norm.weight", width)


def _per_layer_input(t: _TinyWriter, il: int, n_embd: int, width: int) -> None:
    """A layer's gate into and projection out of its per-layer input (Gemma 3n/4)."""
    t.mat(f"blk.{il}.inp_gate.weight", n_embd, width)
    t.mat(f"blk.{il}.proj.weight", width, n_embd)
    t.norm(f"blk.{il}.post_norm.weight", n_embd)


def _gemma2(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff, n_swa = t.dims(
        n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head=64, n_ff=256, n_swa=256
    )
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head_k=head, head_v=head)
    t.u32("attention.sliding_window", n_swa)
    t.f32("attn_logit_softcapping", 50.0)
    t.f32("final_logit_softcapping", 30.0)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        _gemma_block(t, il, n_embd, n_head, n_head_kv, head, n_ff)


def _gemma3(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_ff, n_swa = t.dims(
        n_layer=8, n_embd=128, n_head=4, n_head_kv=1, head=64, n_ff=256, n_swa=128
    )
    _gemma_hparams(
        t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head=head, n_swa=n_swa
    )
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        _gemma_block(t, il, n_embd, n_head, n_head_kv, head, n_ff)
        _qk_norm(t, il, head)


def _gemma3n(t: _TinyWriter) -> None:
    """Gemma 3n (models/gemma3n.cpp): four residual streams (altup: n_altup 4, laurel rank 64 and
    n_embd_altup 256 are fixed in llama_hparams, not read from the file), per-layer embeddings of that fixed
    width, SWA by the default pattern 5 (layers 4, 9, ... full), n_layer_kv_from_start fixed at 20: layers
    20 and up keep no K/V (the SWA ones read layer 18, the full ones 19), activation sparsity on the first 10
    layers' gate, tied output."""
    n_layer, n_embd, n_head, n_head_kv, head, n_ff, n_swa = t.dims(
        n_layer=22, n_embd=128, n_head=4, n_head_kv=1, head=64, n_ff=256, n_swa=128
    )
    n_altup, laurel_rank, n_embd_altup = 4, 64, 256  # llama_hparams: n_altup, laurel_rank, n_embd_altup
    _gemma_hparams(
        t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head=head, n_swa=n_swa
    )
    t.u32("embedding_length_per_layer_input", n_embd_altup)  # as the converter writes it (llama.cpp: fixed)
    t.u32("attention.shared_kv_layers", max(0, n_layer - 20))
    _embeddings(t, n_embd, tied=True)
    t.mat("altup_proj.weight", n_embd, n_embd, n_altup - 1)
    t.mat("altup_unembd_proj.weight", n_embd, n_embd, n_altup - 1)
    _per_layer_embeddings(t, n_embd, n_embd_altup, n_layer)
    for il in range(n_layer):
        _gemma_block(t, il, n_embd, n_head, n_head_kv, head, n_ff)
        _qk_norm(t, il, head)
        _per_layer_input(t, il, n_embd, n_embd_altup)
        t.vec(f"blk.{il}.altup_correct_coef.weight", n_altup, n_altup)
        t.norm(f"blk.{il}.altup_correct_scale.weight", n_embd)
        t.vec(f"blk.{il}.altup_predict_coef.weight", n_altup, n_altup * n_altup)
        t.mat(f"blk.{il}.altup_router.weight", n_embd, n_altup)
        t.norm(f"blk.{il}.altup_router_norm.weight", n_embd)
        t.mat(f"blk.{il}.laurel_l.weight", n_embd, laurel_rank)
        t.mat(f"blk.{il}.laurel_r.weight", laurel_rank, n_embd)
        t.norm(f"blk.{il}.laurel_post_norm.weight", n_embd)


def _gemma4(t: _TinyWriter) -> None:
    """Gemma 4 E2B/E4B-style (models/gemma4.cpp): a per-layer bool SWA pattern (required), SWA layers with
    their own head size and rope width, per-layer embeddings (per_layer_token_embd in the CPU's buffer with
    token_embd, a projection into every layer), the last ``shared_kv`` layers reading an earlier layer's
    cache (n_layer_kv_from_start = n_layer - shared_kv_layers: no K/V of their own), tied output."""
    _gemma4_build(t, moe=False)


def _gemma4_moe(t: _TinyWriter) -> None:
    """Gemma 4 26B-A4B-style: no per-layer embeddings, no shared caches, every layer a dense MLP beside routed
    experts (its own router on the attention output with a scale vector, GELU experts, pre/post norms)."""
    _gemma4_build(t, moe=True)


def _gemma4_build(t: _TinyWriter, *, moe: bool) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_head_kv_full, head, head_swa, n_ff, n_swa = t.dims(
        n_layer=9 if not moe else 6, n_embd=128, n_head=4, n_head_kv=1, n_head_kv_full=1, head=64, head_swa=32,
        n_ff=256, n_swa=128,
    )  # fmt: skip
    if moe:
        n_embd_per_layer, shared_kv = 0, 0
        n_expert, n_expert_used, n_ff_exp = t.dims(n_expert=4, n_expert_used=2, n_ff_exp=64)
    else:
        n_embd_per_layer, shared_kv = t.dims(n_embd_per_layer=16, shared_kv=3)
    # every third layer full attention; a shared layer reads the last cache of its kind before the shared
    # ones (llama_model::create_memory's reuse: n_layer_kv_from_start - (is_swa ? 2 : 1)), so that layer
    # n_layer - shared_kv - 1 must be full and the one before it SWA, as in the real models
    swa = [il % 3 != 2 for il in range(n_layer)]
    kv_heads = [n_head_kv if x else n_head_kv_full for x in swa]  # 26B-A4B: 8 KV heads of 256, 2 of 512
    heads_kv = n_head_kv if n_head_kv == n_head_kv_full else kv_heads
    _gemma_hparams(
        t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=heads_kv, n_ff=n_ff, head=head, n_swa=n_swa
    )
    t.gguf.add_array(t._key("attention.sliding_window_pattern"), swa)
    t.u32("attention.key_length_swa", head_swa)
    t.u32("attention.value_length_swa", head_swa)
    t.u32("rope.dimension_count_swa", head_swa)  # n_rot_swa defaults to the full layers' head
    t.u32("attention.shared_kv_layers", shared_kv)
    t.u32("embedding_length_per_layer_input", n_embd_per_layer)  # required, 0 for none
    if moe:
        _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    _embeddings(t, n_embd, tied=True)
    if n_embd_per_layer:
        _per_layer_embeddings(t, n_embd, n_embd_per_layer, n_layer)
    t.norm("rope_freqs.weight", head // 2)  # the full-attention layers' proportional rope (one tensor)
    for il in range(n_layer):
        hd = head_swa if swa[il] else head
        has_kv = il < n_layer - shared_kv
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        t.mat(f"blk.{il}.attn_q.weight", n_embd, n_head * hd)
        if has_kv:
            t.mat(f"blk.{il}.attn_k.weight", n_embd, kv_heads[il] * hd)
            t.mat(f"blk.{il}.attn_v.weight", n_embd, kv_heads[il] * hd)
            t.norm(f"blk.{il}.attn_k_norm.weight", hd)
        t.mat(f"blk.{il}.attn_output.weight", n_head * hd, n_embd)
        t.norm(f"blk.{il}.attn_q_norm.weight", hd)
        t.norm(f"blk.{il}.post_attention_norm.weight", n_embd)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _ffn(t, il, n_embd, n_ff)
        t.norm(f"blk.{il}.post_ffw_norm.weight", n_embd)
        if moe:
            _moe(t, il, n_embd, n_ff_exp, n_expert)
            t.norm(f"blk.{il}.ffn_gate_inp.scale", n_embd)
            t.norm(f"blk.{il}.pre_ffw_norm_2.weight", n_embd)
            t.norm(f"blk.{il}.post_ffw_norm_1.weight", n_embd)
            t.norm(f"blk.{il}.post_ffw_norm_2.weight", n_embd)
        if n_embd_per_layer:
            _per_layer_input(t, il, n_embd, n_embd_per_layer)


def _gpt_oss(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_swa = t.dims(
        n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head=64, n_swa=128
    )
    n_expert, n_expert_used, n_ff_exp = t.dims(n_expert=4, n_expert_used=2, n_ff_exp=64)
    _hparams(
        t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff_exp, head_k=head, head_v=head
    )
    t.u32("attention.sliding_window", n_swa)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        t.norm(f"{p}.post_attention_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head, bias=True)
        t.vec(f"{p}.attn_output.bias", n_embd)
        t.vec(f"{p}.attn_sinks.weight", n_head)
        _moe(t, il, n_embd, n_ff_exp, n_expert)
        t.vec(f"{p}.ffn_gate_inp.bias", n_expert)
        t.vec(f"{p}.ffn_gate_exps.bias", n_ff_exp, n_expert)
        t.vec(f"{p}.ffn_up_exps.bias", n_ff_exp, n_expert)
        t.vec(f"{p}.ffn_down_exps.bias", n_embd, n_expert)


def _phi3(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff, n_swa = t.dims(
        n_layer=2, n_embd=128, n_head=4, n_head_kv=4, n_ff=256, n_swa=2047
    )
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=head)
    t.u32("attention.sliding_window", n_swa)  # present in Phi-3 GGUFs; llama.cpp ignores it
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        t.mat(f"{p}.attn_qkv.weight", n_embd, n_embd + 2 * n_head_kv * head)
        t.mat(f"{p}.attn_output.weight", n_embd, n_embd)
        t.norm(f"{p}.ffn_norm.weight", n_embd)
        t.mat(f"{p}.ffn_up.weight", n_embd, 2 * n_ff)
        t.mat(f"{p}.ffn_down.weight", n_ff, n_embd)


def _cohere_block(t: _TinyWriter, il: int, n_embd: int, n_head_kv: int, head: int, n_ff: int) -> None:
    t.norm(f"blk.{il}.attn_norm.weight", n_embd)
    _attention(t, il, n_embd, n_embd, n_head_kv * head, n_head_kv * head)
    _ffn(t, il, n_embd, n_ff)


def _command_r(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, rms_norm=False)
    t.f32("logit_scale", 0.0625)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        _cohere_block(t, il, n_embd, n_head_kv, head, n_ff)


def _cohere2(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff, n_swa, swa_pattern = t.dims(
        n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_swa=64, swa_pattern=4
    )
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, rms_norm=False)
    t.u32("attention.sliding_window", n_swa)
    t.u32("attention.sliding_window_pattern", swa_pattern)
    t.f32("logit_scale", 0.25)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        _cohere_block(t, il, n_embd, n_head_kv, head, n_ff)


def _granite_scales(t: _TinyWriter, attention_scale: float) -> None:
    t.f32("logit_scale", 8.0)
    t.f32("residual_scale", 0.22)
    t.f32("embedding_scale", 12.0)
    t.f32("attention.scale", attention_scale)


def _granite(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_rot=head)
    _granite_scales(t, 1.0 / head)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_embd, n_head_kv * head, n_head_kv * head)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        _ffn(t, il, n_embd, n_ff)


def _deepseek2(t: _TinyWriter, *, mla: bool) -> None:
    n_layer, n_embd, n_head, n_ff = t.dims(n_layer=2, n_embd=128, n_head=4, n_ff=256)
    qk_nope, qk_rope, v_head = t.dims(qk_nope=64, qk_rope=32, v_head=64)
    (kv_lora,) = t.dims(kv_lora=128)
    (q_lora,) = t.dims(q_lora=64 if mla else 0)  # 0 -> plain attn_q (DeepSeek-V2-Lite style)
    n_expert, n_expert_used, n_expert_shared, n_ff_exp, n_dense_lead = t.dims(
        n_expert=4, n_expert_used=2, n_expert_shared=1, n_ff_exp=64, n_dense_lead=1
    )
    if mla:
        # converted with MLA absorption: one latent "head" per token
        _hparams(
            t,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=1,
            n_ff=n_ff,
            head_k=kv_lora + qk_rope,
            head_v=kv_lora,
            n_rot=qk_rope,
        )
        t.u32("attention.key_length_mla", qk_nope + qk_rope)
        t.u32("attention.value_length_mla", v_head)
    else:
        _hparams(
            t,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head,
            n_ff=n_ff,
            head_k=qk_nope + qk_rope,
            head_v=v_head,
            n_rot=qk_rope,
        )
    t.u32("attention.q_lora_rank", q_lora)
    t.u32("attention.kv_lora_rank", kv_lora)
    t.u32("leading_dense_block_count", n_dense_lead)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("expert_shared_count", n_expert_shared)
    t.f32("expert_weights_scale", 1.0)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        if q_lora > 0:
            t.norm(f"{p}.attn_q_a_norm.weight", q_lora)
            t.mat(f"{p}.attn_q_a.weight", n_embd, q_lora)
            t.mat(f"{p}.attn_q_b.weight", q_lora, n_head * (qk_nope + qk_rope))
        else:
            t.mat(f"{p}.attn_q.weight", n_embd, n_head * (qk_nope + qk_rope))
        t.norm(f"{p}.attn_kv_a_norm.weight", kv_lora)
        t.mat(f"{p}.attn_kv_a_mqa.weight", n_embd, kv_lora + qk_rope)
        if mla:
            t.mat(f"{p}.attn_k_b.weight", qk_nope, kv_lora, n_head)
            t.mat(f"{p}.attn_v_b.weight", kv_lora, v_head, n_head)
        else:
            t.mat(f"{p}.attn_kv_b.weight", kv_lora, n_head * (qk_nope + v_head))
        t.mat(f"{p}.attn_output.weight", n_head * v_head, n_embd)
        t.norm(f"{p}.ffn_norm.weight", n_embd)
        if il < n_dense_lead:
            _ffn(t, il, n_embd, n_ff)
        else:
            _moe(t, il, n_embd, n_ff_exp, n_expert)
            _shared_expert(t, il, n_embd, n_ff_exp * n_expert_shared)


def _deepseek2_mla(t: _TinyWriter) -> None:
    _deepseek2(t, mla=True)


def _deepseek2_legacy(t: _TinyWriter) -> None:
    _deepseek2(t, mla=False)


def _glm4moe(t: _TinyWriter) -> None:
    n_layer_all, n_nextn, n_embd, n_head, n_head_kv, head, n_rot, n_ff = t.dims(
        n_layer_all=3, n_nextn=1, n_embd=128, n_head=4, n_head_kv=2, head=64, n_rot=32, n_ff=256
    )
    n_expert, n_expert_used, n_expert_shared, n_ff_exp, n_dense_lead = t.dims(
        n_expert=4, n_expert_used=2, n_expert_shared=1, n_ff_exp=64, n_dense_lead=1
    )
    _hparams(
        t,
        n_layer=n_layer_all,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head,
        head_v=head,
        n_rot=n_rot,
    )
    t.u32("nextn_predict_layers", n_nextn)
    t.u32("leading_dense_block_count", n_dense_lead)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("expert_shared_count", n_expert_shared)
    t.f32("expert_weights_scale", 1.0)
    t.flag("expert_weights_norm", True)
    t.u32("expert_gating_func", GATING_SIGMOID)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer_all):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head, bias=True)
        _qk_norm(t, il, head)
        t.norm(f"{p}.post_attention_norm.weight", n_embd)
        if il < n_dense_lead:
            _ffn(t, il, n_embd, n_ff)
        else:
            _moe(t, il, n_embd, n_ff_exp, n_expert, probs_bias=True)
            _shared_expert(t, il, n_embd, n_ff_exp * n_expert_shared)
        if il >= n_layer_all - n_nextn:
            _nextn(t, il, n_embd)


def _qwen35(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_rot, n_ff, interval = t.dims(
        n_layer=6, n_embd=128, n_head=4, n_head_kv=2, head=64, n_rot=32, n_ff=256, interval=3
    )
    d_conv, gdn_head, n_k_heads, n_v_heads = t.dims(d_conv=4, gdn_head=32, n_k_heads=2, n_v_heads=4)
    half, third = n_rot // 2, n_rot // 6
    rope_sections = (half - 2 * third, third, third, 0)  # imrope: sum == n_rot / 2 ((6, 5, 5, 0) at n_rot 32)
    _hparams(
        t,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head,
        head_v=head,
        n_rot=n_rot,
    )
    t.ints("rope.dimension_sections", rope_sections)
    t.u32("full_attention_interval", interval)
    _ssm_hparams(t, d_conv=d_conv, d_inner=gdn_head * n_v_heads, d_state=gdn_head, dt_rank=n_v_heads, n_group=n_k_heads)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        t.norm(f"{p}.post_attention_norm.weight", n_embd)
        if (il + 1) % interval == 0:
            _attention(t, il, n_embd, 2 * n_head * head, n_head_kv * head, n_head_kv * head, n_o=n_head * head)
            _qk_norm(t, il, head)
        else:
            _gated_delta_net(
                t,
                il,
                n_embd,
                d_conv=d_conv,
                head_dim=gdn_head,
                n_k_heads=n_k_heads,
                n_v_heads=n_v_heads,
                fused_ba=False,
            )
        _ffn(t, il, n_embd, n_ff)


def _qwen35moe(t: _TinyWriter) -> None:
    """src/models/qwen35moe.cpp (0c1e570): Qwen3.5's layers (imrope sections, separate ssm_beta / ssm_alpha) with
    Qwen3-Next's routed experts and sigmoid-gated shared expert (Qwen3.5/3.6-35B-A3B)."""
    n_layer, n_embd, n_head, n_head_kv, head, n_rot, interval = t.dims(
        n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head=64, n_rot=32, interval=4
    )
    half, third = n_rot // 2, n_rot // 6
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=0, head_k=head, head_v=head,
             n_rot=n_rot)  # fmt: skip
    t.ints("rope.dimension_sections", (half - 2 * third, third, third, 0))
    _hybrid_moe(t, n_layer, n_embd, n_head, n_head_kv, head, interval, fused_ba=False)


def _qwen3next(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, head, n_rot, n_ff = t.dims(
        n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head=64, n_rot=32, n_ff=256
    )
    (interval,) = t.dims(interval=4)  # qwen3next.cpp default when the key is absent; written anyway
    _hparams(
        t,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head,
        head_v=head,
        n_rot=n_rot,
    )
    _hybrid_moe(t, n_layer, n_embd, n_head, n_head_kv, head, interval, fused_ba=True)


def _hybrid_moe(
    t: _TinyWriter, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head: int, interval: int, *, fused_ba: bool
) -> None:
    """Qwen3-Next's and Qwen3.5-MoE's layers: every interval-th one gated-attention (q and its gate in one attn_q),
    the others gated delta net; routed experts and a sigmoid-gated shared expert (1-D ffn_gate_inp_shexp)."""
    n_expert, n_expert_used, n_ff_exp, n_ff_shexp = t.dims(n_expert=4, n_expert_used=2, n_ff_exp=64, n_ff_shexp=64)
    d_conv, gdn_head, n_k_heads, n_v_heads = t.dims(d_conv=4, gdn_head=32, n_k_heads=2, n_v_heads=4)
    t.u32("full_attention_interval", interval)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("expert_shared_feed_forward_length", n_ff_shexp)
    _ssm_hparams(t, d_conv=d_conv, d_inner=gdn_head * n_v_heads, d_state=gdn_head, dt_rank=n_v_heads, n_group=n_k_heads)
    _embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        t.norm(f"{p}.post_attention_norm.weight", n_embd)
        if (il + 1) % interval == 0:
            _attention(t, il, n_embd, 2 * n_head * head, n_head_kv * head, n_head_kv * head, n_o=n_head * head)
            _qk_norm(t, il, head)
        else:
            _gated_delta_net(t, il, n_embd, d_conv=d_conv, head_dim=gdn_head, n_k_heads=n_k_heads,
                             n_v_heads=n_v_heads, fused_ba=fused_ba)  # fmt: skip
        _moe(t, il, n_embd, n_ff_exp, n_expert)
        t.vec(f"{p}.ffn_gate_inp_shexp.weight", n_embd)
        _shared_expert(t, il, n_embd, n_ff_shexp)


def _mamba2(t: _TinyWriter) -> None:
    n_layer, n_embd, d_conv, d_inner, d_state, n_head, n_group = t.dims(
        n_layer=2, n_embd=128, d_conv=4, d_inner=256, d_state=32, n_head=4, n_group=1
    )
    t.u32("block_count", n_layer)
    t.u32("embedding_length", n_embd)
    t.u32("feed_forward_length", 0)
    t.u32("attention.head_count", 0)
    t.f32("attention.layer_norm_rms_epsilon", RMS_EPS)
    _ssm_hparams(t, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=n_head, n_group=n_group)
    _embeddings(t, n_embd, tied=True)
    for il in range(n_layer):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        _mamba2_mixer(t, il, n_embd, d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_head=n_head, n_group=n_group)


def _lfm2(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff, l_cache = t.dims(
        n_layer=6, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, l_cache=3
    )
    head_count_kv = _lfm2_hparams(t, n_layer, n_embd, n_head, n_head_kv, n_ff, l_cache)
    for il in _lfm2_mixers(t, head_count_kv, n_embd, n_head, l_cache):
        _ffn(t, il, n_embd, n_ff)


def _lfm2_hparams(
    t: _TinyWriter, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, l_cache: int
) -> tuple[int, ...]:
    """lfm2's and lfm2moe's keys: every third layer attention (head_count_kv > 0), the others short conv."""
    head_count_kv = tuple(n_head_kv if il % 3 == 2 else 0 for il in range(n_layer))  # 0 -> shortconv layer
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=head_count_kv, n_ff=n_ff)
    t.u32("shortconv.l_cache", l_cache)
    return head_count_kv


def _lfm2_mixers(
    t: _TinyWriter, head_count_kv: tuple[int, ...], n_embd: int, n_head: int, l_cache: int
) -> Iterator[int]:
    """The tied embeddings, then each layer's mixer (attention or short conv) and FFN norm; yields the layer so
    that the caller writes its feed-forward (lfm2: dense; lfm2moe: dense, then routed experts)."""
    head = n_embd // n_head
    _embeddings(t, n_embd, tied=True, output_norm="token_embd_norm.weight")
    for il, n_kv in enumerate(head_count_kv):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        if n_kv > 0:
            _attention(t, il, n_embd, n_embd, n_kv * head, n_kv * head)
            _qk_norm(t, il, head)
        else:
            t.vec(f"{p}.shortconv.conv.weight", l_cache, n_embd)  # ggml_ssm_conv needs f32
            t.mat(f"{p}.shortconv.in_proj.weight", n_embd, 3 * n_embd)
            t.mat(f"{p}.shortconv.out_proj.weight", n_embd, n_embd)
        t.norm(f"{p}.ffn_norm.weight", n_embd)
        yield il


def _granitehybrid(t: _TinyWriter) -> None:
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    head_count_kv = tuple(n_head_kv if il % 4 == 2 else 0 for il in range(n_layer))  # 0 -> mamba2 layer
    d_conv, d_state, n_ssm_head, n_group = t.dims(d_conv=4, d_state=64, n_ssm_head=8, n_group=1)
    d_inner = 2 * n_embd  # granite-hybrid.cpp: must be 2 * n_embd
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=head_count_kv, n_ff=n_ff, n_rot=head)
    _granite_scales(t, 1.0 / head)
    _ssm_hparams(t, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=n_ssm_head, n_group=n_group)
    ssm = {"d_conv": d_conv, "d_inner": d_inner, "d_state": d_state, "n_head": n_ssm_head, "n_group": n_group}
    for il in _granite_mixers(t, head_count_kv, n_embd, n_head, ssm):
        _ffn(t, il, n_embd, n_ff)


def _granite_mixers(
    t: _TinyWriter, head_count_kv: tuple[int, ...], n_embd: int, n_head: int, ssm: Mapping[str, int]
) -> Iterator[int]:
    """granitehybrid's tied embeddings, then each layer's mixer (attention, or Mamba-2 with ``ssm``'s dims) and FFN
    norm; yields the layer so that the caller writes its feed-forward (dense, or routed and shared experts)."""
    head = n_embd // n_head
    _embeddings(t, n_embd, tied=True)
    for il, n_kv in enumerate(head_count_kv):
        t.norm(f"blk.{il}.attn_norm.weight", n_embd)
        if n_kv > 0:
            _attention(t, il, n_embd, n_head * head, n_kv * head, n_kv * head)
        else:
            _mamba2_mixer(t, il, n_embd, **ssm)
        t.norm(f"blk.{il}.ffn_norm.weight", n_embd)
        yield il


def _granitehybrid_moe(t: _TinyWriter) -> None:
    """granite-4.0-h tiny/small-style: granitehybrid's layers with routed experts (feed_forward_length is the expert
    width, granite-hybrid.cpp load_arch_tensors n_expert > 0) and a shared expert in every layer."""
    n_layer, n_embd, n_head, n_head_kv, n_ff = t.dims(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=64)
    n_expert, n_expert_used, n_ff_shexp = t.dims(n_expert=4, n_expert_used=2, n_ff_shexp=128)
    head_count_kv = tuple(n_head_kv if il % 4 == 2 else 0 for il in range(n_layer))  # 0 -> mamba2 layer
    d_conv, d_state, n_ssm_head, n_group = t.dims(d_conv=4, d_state=64, n_ssm_head=8, n_group=1)
    d_inner = 2 * n_embd
    head = n_embd // n_head
    _hparams(t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=head_count_kv, n_ff=n_ff, n_rot=head)
    _granite_scales(t, 1.0 / head)
    _experts_hparams(t, n_expert, n_expert_used)
    t.u32("expert_shared_feed_forward_length", n_ff_shexp)
    _ssm_hparams(t, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=n_ssm_head, n_group=n_group)
    ssm = {"d_conv": d_conv, "d_inner": d_inner, "d_state": d_state, "n_head": n_ssm_head, "n_group": n_group}
    for il in _granite_mixers(t, head_count_kv, n_embd, n_head, ssm):
        _moe(t, il, n_embd, n_ff, n_expert)
        _shared_expert(t, il, n_embd, n_ff_shexp)


def _lfm2moe(t: _TinyWriter) -> None:
    """LFM2-8B-A1B-style (src/models/lfm2moe.cpp, 0c1e570): lfm2's short-conv and attention layers, after
    leading_dense_block_count dense FFNs routed experts with sigmoid gating (expert_gating_func 2) and the
    required exp_probs_b; the graph is lfm2's (models.h: llama_model_lfm2moe::graph = llama_model_lfm2::graph)."""
    n_layer, n_embd, n_head, n_head_kv, n_ff, l_cache = t.dims(
        n_layer=6, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, l_cache=3
    )
    n_expert, n_expert_used, n_ff_exp, n_dense = t.dims(n_expert=4, n_expert_used=2, n_ff_exp=64, n_dense=1)
    head_count_kv = _lfm2_hparams(t, n_layer, n_embd, n_head, n_head_kv, n_ff, l_cache)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("leading_dense_block_count", n_dense)
    t.u32("expert_gating_func", GATING_SIGMOID)
    for il in _lfm2_mixers(t, head_count_kv, n_embd, n_head, l_cache):
        if il < n_dense:
            _ffn(t, il, n_embd, n_ff)
        else:
            _moe(t, il, n_embd, n_ff_exp, n_expert, probs_bias=True)


def _nemotron_h_moe(t: _TinyWriter) -> None:
    """Nemotron-3-Nano-30B-A3B-style (src/models/nemotron-h.cpp, 0c1e570): one mixer per layer, the model's own
    hybrid_override_pattern repeated ("MEMEM*E": Mamba-2, MoE FFN, attention). load_arch_hparams: is_recr(il) when
    head_count_kv(il) == 0 and feed_forward_length(il) == 0; an attention layer has head_count_kv > 0 and n_ff 0 (no
    RoPE), a MoE layer n_ff > 0: routed experts (up and down only, relu^2) with exp_probs_b and a shared expert;
    sigmoid gating is fixed in the graph; expert_weights_norm and _scale as the HF config's norm_topk_prob (true) and
    routed_scaling_factor (2.5). attention.layer_norm_epsilon is required (the MTP head's norm)."""
    n_layer, n_embd, n_head, n_head_kv, head = t.dims(n_layer=7, n_embd=128, n_head=4, n_head_kv=2, head=32)
    n_expert, n_expert_used, n_ff_exp, n_ff_shexp = t.dims(n_expert=4, n_expert_used=2, n_ff_exp=64, n_ff_shexp=128)
    d_conv, d_state, n_ssm_head, n_group = t.dims(d_conv=4, d_state=32, n_ssm_head=8, n_group=2)
    d_inner = n_ssm_head * 32  # NemotronHModel: d_inner = mamba_num_heads * mamba_head_dim
    kinds = ["MEMEM*E"[il % 7] for il in range(n_layer)]
    t.u32("block_count", n_layer)
    t.u32("embedding_length", n_embd)
    t.ints("feed_forward_length", [n_ff_exp if k == "E" else 0 for k in kinds])
    t.u32("attention.head_count", n_head)
    t.ints("attention.head_count_kv", [n_head_kv if k == "*" else 0 for k in kinds])
    t.u32("attention.key_length", head)
    t.u32("attention.value_length", head)
    t.f32("attention.layer_norm_rms_epsilon", RMS_EPS)
    t.f32("attention.layer_norm_epsilon", LAYER_NORM_EPS)
    _experts_hparams(t, n_expert, n_expert_used, n_ff_exp)
    t.u32("expert_shared_feed_forward_length", n_ff_shexp)
    t.u32("expert_shared_count", 1)
    t.flag("expert_weights_norm", True)
    t.f32("expert_weights_scale", 2.5)
    _ssm_hparams(t, d_conv=d_conv, d_inner=d_inner, d_state=d_state, dt_rank=n_ssm_head, n_group=n_group)
    _embeddings(t, n_embd, tied=False)
    for il, k in enumerate(kinds):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        if k == "M":
            _mamba2_mixer(
                t, il, n_embd, d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_head=n_ssm_head, n_group=n_group
            )
        elif k == "*":
            _attention(t, il, n_embd, n_head * head, n_head_kv * head, n_head_kv * head)
        else:
            t.vec(f"{p}.ffn_gate_inp.weight", n_embd, n_expert)
            t.vec(f"{p}.exp_probs_b.bias", n_expert)
            t.mat(f"{p}.ffn_up_exps.weight", n_embd, n_ff_exp, n_expert)
            t.mat(f"{p}.ffn_down_exps.weight", n_ff_exp, n_embd, n_expert)
            t.mat(f"{p}.ffn_up_shexp.weight", n_embd, n_ff_shexp)
            t.mat(f"{p}.ffn_down_shexp.weight", n_ff_shexp, n_embd)


_Builder = Callable[[_TinyWriter], None]

_RECIPES: dict[str, tuple[str, _Builder]] = {
    "llama": ("llama", _llama),
    "mixtral": ("llama", _mixtral),
    "qwen2": ("qwen2", _qwen2),
    "qwen3": ("qwen3", _qwen3),
    "qwen3moe": ("qwen3moe", _qwen3moe),
    "gemma2": ("gemma2", _gemma2),
    "gemma3": ("gemma3", _gemma3),
    "gemma3n": ("gemma3n", _gemma3n),
    "gemma4": ("gemma4", _gemma4),
    "gemma4-moe": ("gemma4", _gemma4_moe),
    "gpt-oss": ("gpt-oss", _gpt_oss),
    "phi3": ("phi3", _phi3),
    "command-r": ("command-r", _command_r),
    "cohere2": ("cohere2", _cohere2),
    "granite": ("granite", _granite),
    "deepseek2-mla": ("deepseek2", _deepseek2_mla),
    "deepseek2-legacy": ("deepseek2", _deepseek2_legacy),
    "glm4moe": ("glm4moe", _glm4moe),
    "qwen35": ("qwen35", _qwen35),
    "qwen3next": ("qwen3next", _qwen3next),
    "mamba2": ("mamba2", _mamba2),
    "lfm2": ("lfm2", _lfm2),
    "granitehybrid": ("granitehybrid", _granitehybrid),
}

# Recipes written sparse only (real-size shapes for llama-fit-params' allocation pass; not loaded and evaluated with
# llama-cpp-python, so not in RECIPES, which every per-recipe test runs)
_SPARSE_RECIPES: dict[str, tuple[str, _Builder]] = {
    "qwen2moe": ("qwen2moe", _qwen2moe),
    # the hybrid MoE layouts whose decode kernels tests/test_speed.py counts (llama-fit-params only)
    "granitehybrid-moe": ("granitehybrid", _granitehybrid_moe),
    "lfm2moe": ("lfm2moe", _lfm2moe),
    "nemotron_h_moe": ("nemotron_h_moe", _nemotron_h_moe),
    "qwen35moe": ("qwen35moe", _qwen35moe),  # op offload's copies (benchmarks/bench_op_offload.py)
}

RECIPES: tuple[str, ...] = tuple(_RECIPES)
"""All recipe names accepted by :func:`write_tiny_gguf`."""

RECIPE_ARCH: dict[str, str] = {name: arch for name, (arch, _) in _RECIPES.items()}
"""general.architecture written for each recipe."""


def write_tiny_gguf(
    path: Path,
    recipe: str,
    *,
    n_vocab: int = 512,
    n_ctx_train: int = 8192,
    seed: int = 0,
    name: str | None = None,
    dims: Mapping[str, int] | None = None,
    sparse: bool = False,
    extra_u32: Mapping[str, int] | None = None,
    general_f32: Mapping[str, float] | None = None,
    qtypes: Mapping[str, GGMLQuantizationType] | None = None,
) -> Path:
    """Write a tiny random-weight GGUF for ``recipe`` to ``path`` and return ``path``.

    ``n_vocab`` is the exact number of tokens llama.cpp will report
    (``llama_vocab_n_tokens``); it must be at least ``MIN_VOCAB``.
    ``n_ctx_train`` is written as ``{arch}.context_length``; ``name`` as
    ``general.name`` (default ``tiny-RECIPE``). The same
    (recipe, n_vocab, n_ctx_train, seed) always produces identical bytes.

    ``dims`` replaces the recipe's dimensions by name (``n_embd``, ``n_layer``, ``n_ff``, ... as the
    builder names them; an unknown name is an error), so that a recipe can be written at a real model's
    size. ``sparse`` writes only the header: the data section is a hole of the right size (llama.cpp
    checks every tensor's bounds but a no-allocation load, ``llama-fit-params``, never reads it), so a
    model of many GB costs a few MB of disk and no time. ``extra_u32``: more uint32 keys under the
    architecture's name (``{"vision.block_count": 27}``: an Ollama engine-format blob's vision tower);
    ``general_f32``: float32 keys by their whole name (``{"general.sampling.penalty_repeat": 1.05}``).
    ``qtypes`` (sparse only): a weight matrix's type by its name without block and suffix
    (``{"ffn_down_exps": Q5_K}``: a quantized model's tensor sizes).
    """
    if qtypes and not sparse:
        raise ValueError("qtypes: only for a sparse GGUF (no data to quantize)")
    known = {**_RECIPES, **_SPARSE_RECIPES}
    if recipe not in known:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {tuple(known)}")
    arch, build = known[recipe]
    path = Path(path)
    label = name if name is not None else f"tiny-{recipe}"
    writer = _TinyWriter(path, arch, label, n_vocab, n_ctx_train, seed, dims=dims, sparse=sparse, qtypes=qtypes)
    build(writer)
    for key, value in (extra_u32 or {}).items():
        writer.u32(key, value)
    for key, value in (general_f32 or {}).items():
        writer.gguf.add_float32(key, value)
    writer.finish()
    return path


DROP = object()  # rewrite_gguf: leave the key out


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    change: Mapping[str, object] | None = None,
    extra: Mapping[str, list[object]] | None = None,
    big_endian: bool = False,
    arch: str | None = None,
    uints: Mapping[str, int] | None = None,
    zeros: Mapping[str, tuple[tuple[int, ...], Any]] | None = None,
) -> Path:
    """``src`` written again to ``dst`` with gguf-py's reader and writer: the keys of ``change`` replaced by
    ``(GGUFValueType, value)`` or ``(GGUFValueType.ARRAY, values, item type)`` (``DROP``: left out), the arrays of ``extra`` added, in big-endian order if asked;
    ``arch``: another architecture, its keys renamed; ``uints``: uint32 keys added; ``zeros``: zero tensors added
    (numpy shape, dtype); every other key and tensor as it was."""
    import gguf

    r = gguf.GGUFReader(src)
    old = bytes(r.fields["general.architecture"].parts[-1]).decode()
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(dst, arch or old, use_temp_file=False, endianess=endian)
    change = change or {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in change:
            new = change[name]
            if new is not DROP:
                assert isinstance(new, tuple)
                w.add_key_value(name, new[1], new[0], *new[2:])  # an array's item type third
            continue
        if arch and name.startswith(old + "."):
            name = arch + name[len(old) :]
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(f.parts[i]) for i in f.data])
            else:
                w.add_array(name, [f.parts[i].tolist()[0] for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], vt)
    for name, value in (extra or {}).items():
        w.add_array(name, value)
    for key, v in (uints or {}).items():
        w.add_uint32(key, v)
    for t in r.tensors:
        data = np.array(t.data)
        w.add_tensor(t.name, data.byteswap() if big_endian else data, raw_dtype=t.tensor_type)
    for tname, (shape, dt) in (zeros or {}).items():
        w.add_tensor(tname, np.zeros(shape, dtype=dt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
