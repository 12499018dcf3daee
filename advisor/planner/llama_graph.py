"""The reserve graph of a llama-family model (llama, phi3, qwen2, qwen3, qwen3moe's routed experts; glm4 as spring
2025 built it) with every layer on one device, node by node, as ggml_backend_sched hands it to ggml-alloc
(kvadvise.planner.galloc), llama.cpp b11312 (0c1e570).

Followed: src/models/llama.cpp (llama_model_llama::graph), src/models/qwen3moe.cpp (qwen3's attention, then
build_moe_ffn), src/models/phi3.cpp (its SWA is disabled by llama.cpp: graph<false>), src/models/qwen2.cpp and qwen3.cpp (src/models/granite.cpp is llama's graph with scales that run in place), llm_graph_context::build_norm, build_qkv,
build_attn / build_attn_mha (src/llama-graph.cpp), build_ffn (LLM_FFN_SILU, LLM_FFN_PAR: ggml_swiglu_split),
llama_kv_cache::cpy_k / cpy_v (src/llama-kv-cache.cpp), in the order ggml_build_forward_expand visits them
(sources depth first; build_attn expands Q, then V, then K). ggml_backend_sched_split_graph
(ggml/src/ggml-backend.cpp): the token embeddings' get_rows stays on the CPU (token_embd is a CPU weight), so
the graph is two splits; the device's split starts with a copy of each of its inputs (the embeddings, the
positions, the K and V row indices, the KQ mask, the output ids, in the order the split's nodes first read
them), each after a view of its source (op NONE) that keeps the source alive. Checked against
GGML_SCHED_DEBUG=2 dumps of llama-fit-params and its printed compute buffers (benchmarks/bench_galloc.py).

``legacy``: the graph as builds of spring 2025 made it, read at e1e8e09 (the llama.cpp Ollama 0.6.8 vendors,
b5270s): llm_build_llama / _qwen2 / _qwen3 / _glm4 (src/llama-model.cpp), build_attn expanding Q, K,
then V and storing K and V with ggml_cpy into views of the cache (a view: no memory), the KQ mask an f32
graph input on the host with its rows padded to GGML_KQ_MASK_PAD (64), cast to f16 on the device at the first
attention with flash attention (build_attn_inp_kv_unified), no tensor flagged as a graph output (no
llm_graph_result::set_outputs yet). Not phi3's (its Q, K and V were copied out of the fused QKV then).
``swiglu`` False: before ggml_swiglu (#14158) build_ffn ran silu and mul in place on the gate (LLM_FFN_PAR),
and a fused up projection (LLM_FFN_SWIGLU: phi3, glm4) was copied half by half (ggml_cont) first.
``f32_fa_mask``: builds from b7847 (a5bb8ba4, as Ollama ef00199fb vendors it) to before #23764 (b9410): today's
graph but with flash attention the KQ mask an f32 input, its rows unpadded, cast to f16 at the first attention.
``glm4``: llm_build_glm4, llama's layer with RMS norms after the attention and after the feed-forward
(post_attention_norm, post_ffw_norm) and a fused up projection; its partial rope keeps the tensor's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvadvise.planner.galloc import Graph, GraphBuilder

DEVICE, HOST = 0, 1  # buffer ids: the device's compute buffer, the CPU's


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """What the graph's tensor sizes depend on."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_embd_head: int
    n_ff: int
    n_vocab: int
    n_kv: int  # cells the reserve graph attends to (the whole cache)
    n_ubatch: int
    n_outputs: int  # logits rows reserved (min(n_ubatch, n_outputs_max))
    flash_attn: bool
    # src/models/phi3.cpp: one fused QKV matmul (Q, K and V are views of it), Q scaled after its rope, the
    # feed-forward's gate and up fused (ffn_up [n_embd, 2 n_ff], ggml_swiglu), l_out = residual + ffn_out
    phi3: bool = False
    qkv_bias: bool = False  # src/models/qwen2.cpp: Q, K and V biases (ggml_add, in place, before the reshapes)
    qk_norm: bool = False  # src/models/qwen3.cpp: Q and K RMS-normed per head (build_norm) before their rope
    glm4: bool = False  # llm_build_glm4 (e1e8e09): post-attention and post-ffw norms, ffn_up of 2 x n_ff
    legacy: bool = False  # the e1e8e09 graph (module docstring)
    swiglu: bool = True  # ggml_swiglu / ggml_swiglu_split (#14158); False: silu, mul (and a fused up's halves copied)
    set_rows: bool = True  # the cache written with ggml_set_rows (its row indices graph inputs); False: ggml_cpy
    # the CPU runs every layer: one backend, one split, one buffer (the inputs and the embeddings' get_rows in it,
    # no copies); the graph's inputs are leafs, allocated first in the order the graph first reads them
    cpu_only: bool = False
    # builds.EMBD_SELECT on: build_inp_embd's f32 "inp_embd" input beside the tokens, which
    # ggml_build_forward_select leaves unread at the reserve (a graph input: in the host's buffer beside a device,
    # in the one buffer of a CPU that runs every layer)
    embd_select: bool = False
    # builds.ATTN_ROT on, with a quantized cache (llama_kv_cache: attn_rot_k where type_k is quantized and the head
    # a multiple of 64, attn_rot_v alike): the Hadamard matrices' sizes (nrot; 0: no rotation). Q and K (k_rot),
    # V and the attention's output (v_rot) each go through llama_mul_mat_hadamard (src/llama-impl.h): a matmul of
    # the rotation and a 2-D reshape of the tensor (a ggml_cont first where it is not contiguous)
    k_rot: int = 0
    v_rot: int = 0
    # builds from b7847 to before ggml-org/llama.cpp#23764 (b9410): with flash attention the KQ mask is an f32 input,
    # its rows unpadded (GGML_KQ_MASK_PAD gone by ec98e2002), cast to f16 on the device at the first attention
    # (build_attn_inp_kv: ggml_cast(ctx0, inp->self_kq_mask, GGML_TYPE_F16), a5bb8ba4 as Ollama ef00199fb vendors it)
    f32_fa_mask: bool = False
    # src/models/qwen3moe.cpp: every block's feed-forward is llm_graph_context::build_moe_ffn (src/llama-graph.cpp)
    # with a softmax router, normalized top-k weights and SwiGLU experts of n_ff_exp (0: build_ffn, dense)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    # --n-cpu-moe: the first host_experts blocks' routed experts sit in host memory and a device that does not
    # op-offload (ggml-rpc) runs their gate, up and down in CPU splits (ggml_backend_sched_split_graph, b11312)
    host_experts: int = 0

    @property
    def fused_up(self) -> bool:
        """ffn_up holds gate and up (build_ffn LLM_FFN_SWIGLU with no gate tensor)."""
        return self.phi3 or self.glm4


def build(s: LlamaShape) -> Graph:
    """The sched's graph for ``s`` (one device, the CPU beside it)."""
    b = GraphBuilder()
    ub, E = s.n_ubatch, s.n_embd
    q_dim, kv_dim = s.n_head * s.n_embd_head, s.n_head_kv * s.n_embd_head
    # the mask's rows: GGML_PAD(n_tokens, GGML_KQ_MASK_PAD) in the e1e8e09 graph; an f32 input there, cast to f16
    # for flash attention on the device
    mask_rows = -(-ub // 64) * 64 if s.legacy else ub
    f32_mask = s.legacy or s.f32_fa_mask
    mask_elt = 2 if s.flash_attn and not f32_mask else 4

    host = DEVICE if s.cpu_only else HOST

    def host_input(name: str, nbytes: int) -> int:
        return b.input(name, nbytes, buffer=host)

    tokens = host_input("inp_tokens", 4 * ub)
    if s.embd_select:
        host_input("inp_embd", 4 * E * ub)
    tok_embd = b.weight("token_embd.weight", buffer=host)
    pos = host_input("inp_pos", 4 * ub)
    idxs: tuple[int, ...] = ()
    if s.set_rows:
        k_idxs = host_input("attn_inp_k_idxs", 8 * ub)
        v_idxs = host_input("attn_inp_v_idxs", 8 * (ub if s.flash_attn else ub * kv_dim))
        idxs = (k_idxs, v_idxs)
    mask = host_input("attn_inp_kq_mask", mask_elt * s.n_kv * mask_rows)
    # build_attn_inp_kv_impl: the rotations after the mask (mctx_cur->build_input_k_rot / _v_rot)
    rots = tuple(host_input(f"attn_inp_{kv}_rot", 4 * n * n) for kv, n in (("k", s.k_rot), ("v", s.v_rot)) if n)
    k_rot = rots[0] if s.k_rot else None
    v_rot = rots[-1] if s.v_rot else None
    out_ids = host_input("out_ids", 4 * s.n_outputs)
    # split 0 (CPU): the embeddings' get_rows
    embd = b.op("embd", "GET_ROWS", (E, ub), (tok_embd, tokens), buffer=host)
    # split 1 (device): a copy of each input, in the order the split first reads them
    # the output ids are copied into the split that first reads them, the last block's attention's: after the CPU
    # split of the last block before it whose experts are in host memory, if any (the MLA replay's late_ids)
    late_ids = min(s.host_experts, s.n_layer - 1) - 1 if s.host_experts and not s.cpu_only else -1

    def late_copy() -> int:  # an ordinary node of that split (one copy: not flagged a graph input)
        return b.op("out_ids#RPC", "NONE", (s.n_outputs,), (), dtype="i32")

    copies = {src: src for src in (embd, pos, *rots, *idxs, mask, out_ids)}
    for src in () if s.cpu_only else tuple(copies):
        if src == out_ids and late_ids >= 0:
            continue
        b.dep(src)
        copies[src] = b.input_copy(src, buffer=DEVICE, name=b.tensors[src].name + "#RPC")
    x = copies[embd]
    kq_mask = copies[mask]  # the f16 cast of the e1e8e09 graph replaces it at the first attention

    def proj(name: str, weight: int, inp: int, n_head: int, *, normed: bool = True) -> int:
        """build_qkv's separate projection: matmul, bias (in place), the per-head reshape (a view), qk norm."""
        t = b.op(name, "MUL_MAT", (s.n_embd_head * n_head, ub), (weight, inp))
        if s.qkv_bias:
            t = b.op(f"{name} (bias)", "ADD", (s.n_embd_head * n_head, ub), (t, b.weight(f"{name}.bias")))
        t = b.view(t, "RESHAPE", name=f"{name} (reshaped)")
        if s.qk_norm and normed:
            t = b.op(f"{name} (norm)", "RMS_NORM", (s.n_embd_head, n_head, ub), (t,))
            t = b.op(f"{name} (normed)", "MUL", (s.n_embd_head, n_head, ub), (t, b.weight(f"{name}.norm")))
        return t

    def rope(name: str, t: int, n_head: int) -> int:
        return b.op(f"{name} (rope)", "ROPE", (s.n_embd_head, n_head, ub), (t, copies[pos]))

    def hadamard(name: str, t: int, rot: int | None, n: int, width: int, *, contiguous: bool = True) -> int:
        """llama_mul_mat_hadamard of ``t`` ([width, n_ubatch] f32): ggml_cont_2d where it is not contiguous, else
        ggml_reshape_2d; the matmul by the rotation; ggml_reshape_4d."""
        if rot is None:
            return t
        rows = width * ub // n
        t = b.op(f"{name} (cont)", "CONT", (n, rows), (t,)) if not contiguous else b.view(t, "RESHAPE")
        t = b.op(f"{name} (rotated)", "MUL_MAT", (n, rows), (copies[rot], t))
        return b.view(t, "RESHAPE")

    def norm(name: str, t: int, rows: int, weight: int) -> int:
        t = b.op(f"norm-{name}", "RMS_NORM", (E, rows), (t,))
        return b.op(name, "MUL", (E, rows), (t, weight))

    for il in range(s.n_layer):
        last = il == s.n_layer - 1
        w = {k: b.weight(f"blk.{il}.{k}") for k in ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")}
        cache_k, cache_v = b.weight(f"cache_k_l{il}"), b.weight(f"cache_v_l{il}")
        inp_sa = x
        cur = norm(f"attn_norm-{il}", x, ub, w["attn_norm"])
        if s.phi3:  # build_qkv with wqkv: 3-D views of one matmul (not contiguous: V is not reshaped in cpy_v)
            qkv = b.op(f"wqkv-{il}", "MUL_MAT", (q_dim + 2 * kv_dim, ub), (w["q"], cur))
            q = b.view(qkv, name=f"Qcur-{il}")
            q = rope(f"Qcur-{il}", q, s.n_head)
            q = b.op(f"Qcur-{il} (scaled)", "SCALE", (s.n_embd_head, s.n_head, ub), (q,))
            q = hadamard(f"Qcur-{il}", q, k_rot, s.k_rot, q_dim)
            v = hadamard(f"Vcur-{il}", b.view(qkv, name=f"Vcur-{il}"), v_rot, s.v_rot, kv_dim, contiguous=False)
            k = b.view(qkv, name=f"Kcur-{il}")
        elif s.legacy:  # build_attn (e1e8e09) expands Q, then K, then V
            q = rope(f"Qcur-{il}", proj(f"Qcur-{il}", w["q"], cur, s.n_head), s.n_head)
            k = rope(f"Kcur-{il}", proj(f"Kcur-{il}", w["k"], cur, s.n_head_kv), s.n_head_kv)
            v = proj(f"Vcur-{il}", w["v"], cur, s.n_head_kv, normed=False)
        else:
            # build_attn expands Q, V and K in that order, each with its rotation (none before builds.ATTN_ROT)
            q = proj(f"Qcur-{il}", w["q"], cur, s.n_head)
            q = hadamard(f"Qcur-{il}", rope(f"Qcur-{il}", q, s.n_head), k_rot, s.k_rot, q_dim)
            v = proj(f"Vcur-{il}", w["v"], cur, s.n_head_kv, normed=False)
            v = hadamard(f"Vcur-{il}", v, v_rot, s.v_rot, kv_dim)
            k = rope(f"Kcur-{il}", proj(f"Kcur-{il}", w["k"], cur, s.n_head_kv), s.n_head_kv)
            k = hadamard(f"Kcur-{il}", k, k_rot, s.k_rot, kv_dim)
        if s.phi3:
            k = hadamard(f"Kcur-{il}", rope(f"Kcur-{il}", k, s.n_head_kv), k_rot, s.k_rot, kv_dim)
        _store(b, s, il, k, v, cache_k, cache_v, copies, idxs)
        # build_attn_mha: Q viewed per stream and permuted; K and V: views of the cache
        if s.legacy:  # ggml_permute of Q, ggml_view_3d of each cache
            qp = b.view(q, "PERMUTE", name=f"Qcur-{il} (permuted)")
            kc = b.view(cache_k, name=f"cache_k_l{il} (view 3d)")
            vc = b.view(cache_v, name=f"cache_v_l{il} (view 3d)")
        else:
            qp = b.view(b.view(q, name=f"Qcur-{il} (view)"), "PERMUTE", name=f"Qcur-{il} (view) (permuted)")
            kc = b.view(
                b.view(cache_k, name=f"cache_k_l{il} (view 4d)"), "PERMUTE", name=f"cache_k_l{il} (view) (permuted)"
            )
            vc = b.view(
                b.view(cache_v, name=f"cache_v_l{il} (view 4d)"), "PERMUTE", name=f"cache_v_l{il} (view) (permuted)"
            )
        if f32_mask and s.flash_attn and il == 0:  # kq_mask_cnv: ggml_cast (a CPY into a new f16 tensor)
            kq_mask = b.op("attn_inp_kq_mask (f16)", "CPY", (s.n_kv, mask_rows), (kq_mask,), dtype="f16")
        if s.flash_attn:
            fa = b.op(f"fattn-{il}", "FLASH_ATTN_EXT", (s.n_embd_head, s.n_head, ub), (qp, kc, vc, kq_mask))
            kqv_out = b.view(fa, "RESHAPE", name=f"kqv_out-{il}")
        else:
            kq = b.op(f"kq-{il}", "MUL_MAT", (s.n_kv, ub, s.n_head), (kc, qp))
            kq = b.op(f"kq_soft_max-{il}", "SOFT_MAX", (s.n_kv, ub, s.n_head), (kq, kq_mask))
            kqv = b.op(f"kqv-{il}", "MUL_MAT", (s.n_embd_head, ub, s.n_head), (vc, kq))
            kqv = b.view(kqv, "PERMUTE", name=f"kqv-{il} (permuted)")
            kqv_out = b.op(f"kqv_out-{il}", "CONT", (q_dim, ub), (kqv,))
        kqv_out = hadamard(f"kqv_out-{il}", kqv_out, v_rot, s.v_rot, q_dim)  # V's rotation undone
        cur = b.op(f"attn_out-{il}", "MUL_MAT", (E, ub), (w["o"], kqv_out))
        rows = ub
        if last:  # the rows whose outputs are kept (inp_out_ids), of the attention's output and the residual
            rows = s.n_outputs
            cur = b.op(f"attn_out-{il} (rows)", "GET_ROWS", (E, rows), (cur, copies[out_ids]))
            if s.glm4:  # the post-attention norm is visited before the residual's rows (add's src[0] first)
                cur = norm(f"post_attn_norm-{il}", cur, rows, b.weight(f"blk.{il}.post_attention_norm"))
            inp_sa = b.op(f"l_in-{il} (rows)", "GET_ROWS", (E, rows), (inp_sa, copies[out_ids]))
        elif s.glm4:
            cur = norm(f"post_attn_norm-{il}", cur, rows, b.weight(f"blk.{il}.post_attention_norm"))
        ffn_inp = b.op(f"ffn_inp-{il}", "ADD", (E, rows), (cur, inp_sa))
        cur = norm(f"ffn_norm-{il}", ffn_inp, rows, w["ffn_norm"])
        if not s.n_expert:
            cur = _ffn(b, s, il, cur, rows, w)
        elif il == late_ids:  # the ids are copied in right after the experts' output, at the start of the same split
            cur = _moe_ffn(b, s, il, cur, rows, also_copied=lambda: copies.update({out_ids: late_copy()}))
        else:
            cur = _moe_ffn(b, s, il, cur, rows)
        if s.glm4:
            cur = norm(f"post_ffw_norm-{il}", cur, rows, b.weight(f"blk.{il}.post_ffw_norm"))
        srcs = (ffn_inp, cur) if s.phi3 else (cur, ffn_inp)
        x = b.op(f"l_out-{il}", "ADD", (E, rows), srcs)
    cur = norm("result_norm", x, s.n_outputs, b.weight("output_norm.weight"))
    if not s.legacy:
        b.set_output(cur)  # res->t_embd and res->t_logits: llm_graph_result::set_outputs
    logits = b.op("result_output", "MUL_MAT", (s.n_vocab, s.n_outputs), (b.weight("output.weight"), cur))
    if not s.legacy:
        b.set_output(logits)
    return b.graph()


def _store(
    b: GraphBuilder, s: LlamaShape, il: int, k: int, v: int, cache_k: int, cache_v: int, copies: dict[int, int],
    idxs: tuple[int, ...],
) -> None:  # fmt: skip
    """K and V into the cache: ggml_set_rows with the row indices (llama_kv_cache::cpy_k / cpy_v), or before it
    ggml_cpy into a view of the cache (build_attn, e1e8e09); either result is a view of the cache (no memory).
    The transposed V cache (flash attention off) takes V as [n_embd_v_gqa, n_tokens]: a copy where V is a
    strided view."""
    kv_dim = s.n_head_kv * s.n_embd_head
    kv = b.view(k, name=f"Kcur-{il} (view)") if s.set_rows else k  # ggml_cpy takes K as it is
    if s.flash_attn:
        vv = b.view(v, name=f"Vcur-{il} (view)")
    else:
        if s.phi3:
            vv = b.op(f"Vcur-{il} (cont)", "CONT", (kv_dim, s.n_ubatch), (v,))
        else:
            vv = b.view(v, "RESHAPE", name=f"Vcur-{il} (reshaped 2d)")
        vv = b.view(vv, "RESHAPE" if s.set_rows else "TRANSPOSE", name=f"Vcur-{il} (reshaped 1)")
    for name, t, cache, j in ((f"cache_k_l{il}", kv, cache_k, 0), (f"cache_v_l{il}", vv, cache_v, 1)):
        if s.set_rows:
            b.view(cache, "SET_ROWS", name=f"{name} (view)", srcs=(t, copies[idxs[j]], cache))
        else:
            dst = b.view(cache, name=f"{name} (view)")
            b.view(dst, "CPY", name=f"{name} (copy of)", srcs=(t, dst))


def _ffn(b: GraphBuilder, s: LlamaShape, il: int, cur: int, rows: int, w: dict[str, int]) -> int:
    """build_ffn: SwiGLU of a gate and an up projection (llama: LLM_FFN_SILU, LLM_FFN_PAR) or of one fused up
    projection (phi3, glm4: LLM_FFN_SWIGLU), then the down projection."""
    ff = s.n_ff
    if s.fused_up:
        up = b.op(f"ffn_up-{il}", "MUL_MAT", (2 * ff, rows), (w["up"], cur))
        if s.swiglu:
            cur = b.op(f"ffn_swiglu-{il}", "GLU", (ff, rows), (up,))
        else:  # x0 = cont(view), x1 = cont(view); silu(x0) * x1, visited src[0] first
            x0 = b.op(f"ffn_x0-{il}", "CONT", (ff, rows), (b.view(up, name=f"ffn_up-{il} (x0)"),))
            x0 = b.op(f"ffn_silu-{il}", "UNARY", (ff, rows), (x0,))
            x1 = b.op(f"ffn_x1-{il}", "CONT", (ff, rows), (b.view(up, name=f"ffn_up-{il} (x1)"),))
            cur = b.op(f"ffn_mul-{il}", "MUL", (ff, rows), (x0, x1))
    elif s.swiglu:
        gate = b.op(f"ffn_gate-{il}", "MUL_MAT", (ff, rows), (w["gate"], cur))
        up = b.op(f"ffn_up-{il}", "MUL_MAT", (ff, rows), (w["up"], cur))
        cur = b.op(f"ffn_swiglu-{il}", "GLU", (ff, rows), (gate, up))
    else:  # silu(gate) in place, then * up in place (the mul's src[0] chain first: gate, silu, up)
        gate = b.op(f"ffn_gate-{il}", "MUL_MAT", (ff, rows), (w["gate"], cur))
        gate = b.op(f"ffn_silu-{il}", "UNARY", (ff, rows), (gate,))
        up = b.op(f"ffn_up-{il}", "MUL_MAT", (ff, rows), (w["up"], cur))
        cur = b.op(f"ffn_gate_par-{il}", "MUL", (ff, rows), (gate, up))
    return b.op(f"ffn_out-{il}", "MUL_MAT", (s.n_embd, rows), (w["down"], cur))


def _moe_ffn(
    b: GraphBuilder, s: LlamaShape, il: int, cur: int, rows: int, also_copied: Callable[[], object] | None = None
) -> int:
    """build_moe_ffn as qwen3moe calls it (LLM_FFN_SILU, norm_w, no weight scale, softmax gating), in the order
    ggml_build_forward_expand visits it: the router's logits, their softmax in place, ggml_argsort_top_k (an ARGSORT
    of every expert and a view of the first n_expert_used), the selected probabilities (get_rows), normalized by
    their clamped sum (sum_rows, clamp in place, div), expanded first ("call early so that topk-moe can be used");
    then gate and up (MUL_MAT_ID, gate first: the SwiGLU's src[0]), their product, the down projection, weighted in
    place, and its per-expert views ("order the views before the adds") summed, the first add a new tensor (a view
    is never taken over), the rest in place."""
    n_exp, used, ff, E = s.n_expert, s.n_expert_used, s.n_ff_exp, s.n_embd
    logits = b.op(f"ffn_moe_logits-{il}", "MUL_MAT", (n_exp, rows), (b.weight(f"blk.{il}.ffn_gate_inp"), cur))
    probs = b.op(f"ffn_moe_probs-{il}", "SOFT_MAX", (n_exp, rows), (logits,))
    probs_3d = b.view(probs, "RESHAPE", name=f"ffn_moe_probs-{il} (reshaped)")
    argsort = b.op(f"ffn_moe_argsort-{il}", "ARGSORT", (n_exp, rows), (probs,), dtype="i32")
    top_k = b.view(argsort, name=f"ffn_moe_topk-{il}")
    weights = b.op(f"ffn_moe_weights-{il}", "GET_ROWS", (1, used, rows), (probs_3d, top_k))
    weights_2d = b.view(weights, "RESHAPE", name=f"ffn_moe_weights-{il} (reshaped)")
    total = b.op(f"ffn_moe_weights_sum-{il}", "SUM_ROWS", (1, rows), (weights_2d,))
    total = b.op(f"ffn_moe_weights_sum_clamped-{il}", "CLAMP", (1, rows), (total,))
    weights = b.op(f"ffn_moe_weights_norm-{il}", "DIV", (used, rows), (weights_2d, total))
    weights = b.view(weights, "RESHAPE", name=f"ffn_moe_weights_norm-{il} (reshaped)")
    cur_3d = b.view(cur, "RESHAPE", name=f"ffn_norm-{il} (reshaped)")
    if il < s.host_experts:
        # the CPU split copies the normed input and the ids out (its input_dep views keep them to its start), runs
        # gate, up, SwiGLU and down there, and the device's next split starts with the copy of the down projection's
        # output (ggml_backend_sched_split_graph: "allocated at the start of the split"; one copy: an ordinary node)
        b.dep(cur_3d)
        b.dep(top_k)
        experts = b.op(f"ffn_moe_down-{il}#RPC", "NONE", (E, used, rows), ())
        if also_copied is not None:  # another input the device's next split is the first to read
            also_copied()
        return _moe_sum(b, s, il, experts, weights, rows)
    gate = b.op(
        f"ffn_moe_gate-{il}", "MUL_MAT_ID", (ff, used, rows), (b.weight(f"blk.{il}.ffn_gate_exps"), cur_3d, top_k)
    )
    up = b.op(f"ffn_moe_up-{il}", "MUL_MAT_ID", (ff, used, rows), (b.weight(f"blk.{il}.ffn_up_exps"), cur_3d, top_k))
    cur = b.op(f"ffn_moe_swiglu-{il}", "GLU", (ff, used, rows), (gate, up))
    down_w = b.weight(f"blk.{il}.ffn_down_exps")
    experts = b.op(f"ffn_moe_down-{il}", "MUL_MAT_ID", (E, used, rows), (down_w, cur, top_k))
    return _moe_sum(b, s, il, experts, weights, rows)


def _moe_sum(b: GraphBuilder, s: LlamaShape, il: int, experts: int, weights: int, rows: int) -> int:
    """build_moe_ffn's end: the down projection's output weighted in place, its per-expert views summed."""
    used, E = s.n_expert_used, s.n_embd
    experts = b.op(f"ffn_moe_weighted-{il}", "MUL", (E, used, rows), (experts, weights))
    views = [b.view(experts, name=f"ffn_moe_weighted-{il} (view {i})") for i in range(used)]
    out = views[0]
    for i, v in enumerate(views[1:], 1):
        out = b.op(f"ffn_moe_out-{il} ({i})", "ADD", (E, rows), (out, v))
    if used == 1:  # "avoid returning a non-contiguous tensor"
        out = b.op(f"ffn_moe_out-{il}", "CONT", (E, rows), (out,))
    return out
