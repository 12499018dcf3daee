"""The reserve graph of a dense llama-family model (llama, phi3, qwen2, qwen3) with every layer on one device, node by node, as
ggml_backend_sched hands it to ggml-alloc (kvadvise.planner.galloc), llama.cpp b11312 (0c1e570).

Followed: src/models/llama.cpp (llama_model_llama::graph), src/models/phi3.cpp (its SWA is disabled by
llama.cpp: graph<false>), src/models/qwen2.cpp and qwen3.cpp (src/models/granite.cpp is llama's graph with scales that run in place), llm_graph_context::build_norm, build_qkv,
build_attn / build_attn_mha (src/llama-graph.cpp), build_ffn (LLM_FFN_SILU, LLM_FFN_PAR: ggml_swiglu_split),
llama_kv_cache::cpy_k / cpy_v (src/llama-kv-cache.cpp), in the order ggml_build_forward_expand visits them
(sources depth first; build_attn expands Q, then V, then K). ggml_backend_sched_split_graph
(ggml/src/ggml-backend.cpp): the token embeddings' get_rows stays on the CPU (token_embd is a CPU weight), so
the graph is two splits; the device's split starts with a copy of each of its inputs (the embeddings, the
positions, the K and V row indices, the KQ mask, the output ids, in the order the split's nodes first read
them), each after a view of its source (op NONE) that keeps the source alive. Checked against
GGML_SCHED_DEBUG=2 dumps of llama-fit-params and its printed compute buffers (benchmarks/bench_galloc.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.planner.galloc import Graph, Tensor

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


class _Builder:
    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.nodes: list[int] = []
        self.leafs: list[int] = []

    def add(self, t: Tensor, *, node: bool = True) -> int:
        self.tensors.append(t)
        i = len(self.tensors) - 1
        (self.nodes if node else self.leafs).append(i)
        return i

    def weight(self, name: str) -> int:
        return self.add(Tensor(name, "NONE", 0, DEVICE, (), external=True), node=False)

    def op(self, name: str, op: str, shape: tuple[int, ...], srcs: tuple[int, ...], *, elt: int = 4,
           buffer: int = DEVICE) -> int:  # fmt: skip
        n = elt
        for d in shape:
            n *= d
        return self.add(Tensor(name, op, n, buffer, (elt, *shape), srcs))

    def view(self, name: str, src: int, op: str = "VIEW") -> int:
        s = self.tensors[src]
        base = s.view_src if s.view_src is not None else src
        return self.add(Tensor(name, op, s.nbytes, s.buffer, ("view", name), (src,), view_src=base))


def build(s: LlamaShape) -> Graph:
    """The sched's graph for ``s`` (one device, the CPU beside it)."""
    b = _Builder()
    ub, E = s.n_ubatch, s.n_embd
    q_dim, kv_dim = s.n_head * s.n_embd_head, s.n_head_kv * s.n_embd_head
    mask_elt = 2 if s.flash_attn else 4

    def host_input(name: str, nbytes: int) -> int:
        return b.add(Tensor(name, "NONE", nbytes, HOST, (name,), is_input=True), node=False)

    tokens = host_input("inp_tokens", 4 * ub)
    tok_embd = b.add(Tensor("token_embd.weight", "NONE", 0, HOST, (), external=True), node=False)
    pos = host_input("inp_pos", 4 * ub)
    k_idxs = host_input("attn_inp_k_idxs", 8 * ub)
    v_idxs = host_input("attn_inp_v_idxs", 8 * (ub if s.flash_attn else ub * kv_dim))
    mask = host_input("attn_inp_kq_mask", mask_elt * s.n_kv * ub)
    out_ids = host_input("out_ids", 4 * s.n_outputs)
    # split 0 (CPU): the embeddings' get_rows
    embd = b.op("embd", "GET_ROWS", (E, ub), (tok_embd, tokens), buffer=HOST)
    # split 1 (device): a copy of each input, in the order the split first reads them
    copies = {}
    for src in (embd, pos, k_idxs, v_idxs, mask, out_ids):
        t = b.tensors[src]
        b.add(Tensor(t.name + " (view)", "NONE", t.nbytes, HOST, ("dep",), (src,), view_src=src))
        copies[src] = b.add(Tensor(t.name + "#RPC", "NONE", t.nbytes, DEVICE, t.layout, is_input=True))
    x = copies[embd]

    def proj(name: str, weight: int, inp: int, n_head: int, *, normed: bool = True) -> int:
        """build_qkv's separate projection: matmul, bias (in place), the per-head reshape (a view), qk norm."""
        t = b.op(name, "MUL_MAT", (s.n_embd_head * n_head, ub), (weight, inp))
        if s.qkv_bias:
            t = b.op(f"{name} (bias)", "ADD", (s.n_embd_head * n_head, ub), (t, b.weight(f"{name}.bias")))
        t = b.view(f"{name} (reshaped)", t, "RESHAPE")
        if s.qk_norm and normed:
            t = b.op(f"{name} (norm)", "RMS_NORM", (s.n_embd_head, n_head, ub), (t,))
            t = b.op(f"{name} (normed)", "MUL", (s.n_embd_head, n_head, ub), (t, b.weight(f"{name}.norm")))
        return t

    for il in range(s.n_layer):
        last = il == s.n_layer - 1
        w = {k: b.weight(f"blk.{il}.{k}") for k in ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")}
        cache_k, cache_v = b.weight(f"cache_k_l{il}"), b.weight(f"cache_v_l{il}")
        inp_sa = x
        norm = b.op(f"norm-{il}", "RMS_NORM", (E, ub), (x,))
        cur = b.op(f"attn_norm-{il}", "MUL", (E, ub), (norm, w["attn_norm"]))
        if s.phi3:  # build_qkv with wqkv: 3-D views of one matmul (not contiguous: V is not reshaped in cpy_v)
            qkv = b.op(f"wqkv-{il}", "MUL_MAT", (q_dim + 2 * kv_dim, ub), (w["q"], cur))
            q = b.view(f"Qcur-{il}", qkv)
            q = b.op(f"Qcur-{il} (rope)", "ROPE", (s.n_embd_head, s.n_head, ub), (q, copies[pos]))
            q = b.op(f"Qcur-{il} (scaled)", "SCALE", (s.n_embd_head, s.n_head, ub), (q,))
            v = b.view(f"Vcur-{il}", qkv)
            k = b.view(f"Kcur-{il}", qkv)
        else:
            q = proj(f"Qcur-{il}", w["q"], cur, s.n_head)
            q = b.op(f"Qcur-{il} (rope)", "ROPE", (s.n_embd_head, s.n_head, ub), (q, copies[pos]))
            v = proj(f"Vcur-{il}", w["v"], cur, s.n_head_kv, normed=False)
            k = proj(f"Kcur-{il}", w["k"], cur, s.n_head_kv)
        k = b.op(f"Kcur-{il} (rope)", "ROPE", (s.n_embd_head, s.n_head_kv, ub), (k, copies[pos]))
        # cpy_k: a 2-D view of K, set_rows into the cache (a view of the cache: no memory here)
        kv = b.view(f"Kcur-{il} (view)", k)
        b.add(Tensor(f"cache_k_l{il} (view)", "SET_ROWS", 0, DEVICE, (), (kv, copies[k_idxs], cache_k),
                     view_src=cache_k))  # fmt: skip
        if s.flash_attn:
            vv = b.view(f"Vcur-{il} (view)", v)
        else:  # the transposed V cache: V as [n_embd_v_gqa, n_tokens] (a copy where it is a strided view), one
            # element per row
            if s.phi3:
                vv = b.op(f"Vcur-{il} (cont)", "CONT", (kv_dim, ub), (v,))
            else:
                vv = b.view(f"Vcur-{il} (reshaped 2d)", v, "RESHAPE")
            vv = b.view(f"Vcur-{il} (reshaped 1)", vv, "RESHAPE")
        b.add(Tensor(f"cache_v_l{il} (view)", "SET_ROWS", 0, DEVICE, (), (vv, copies[v_idxs], cache_v),
                     view_src=cache_v))  # fmt: skip
        # build_attn_mha: Q viewed per stream and permuted; K and V: views of the cache
        qp = b.view(f"Qcur-{il} (view) (permuted)", b.view(f"Qcur-{il} (view)", q), "PERMUTE")
        kc = b.view(f"cache_k_l{il} (view) (permuted)", b.view(f"cache_k_l{il} (view 4d)", cache_k), "PERMUTE")
        vc = b.view(f"cache_v_l{il} (view) (permuted)", b.view(f"cache_v_l{il} (view 4d)", cache_v), "PERMUTE")
        if s.flash_attn:
            fa = b.op(f"fattn-{il}", "FLASH_ATTN_EXT", (s.n_embd_head, s.n_head, ub), (qp, kc, vc, copies[mask]))
            kqv_out = b.view(f"kqv_out-{il}", fa, "RESHAPE")
        else:
            kq = b.op(f"kq-{il}", "MUL_MAT", (s.n_kv, ub, s.n_head), (kc, qp))
            kq = b.op(f"kq_soft_max-{il}", "SOFT_MAX", (s.n_kv, ub, s.n_head), (kq, copies[mask]))
            kqv = b.op(f"kqv-{il}", "MUL_MAT", (s.n_embd_head, ub, s.n_head), (vc, kq))
            kqv = b.view(f"kqv-{il} (permuted)", kqv, "PERMUTE")
            kqv_out = b.op(f"kqv_out-{il}", "CONT", (q_dim, ub), (kqv,))
        cur = b.op(f"attn_out-{il}", "MUL_MAT", (E, ub), (w["o"], kqv_out))
        rows = ub
        if last:  # the rows whose outputs are kept (inp_out_ids), of the attention's output and the residual
            rows = s.n_outputs
            cur = b.op(f"attn_out-{il} (rows)", "GET_ROWS", (E, rows), (cur, copies[out_ids]))
            inp_sa = b.op(f"l_in-{il} (rows)", "GET_ROWS", (E, rows), (inp_sa, copies[out_ids]))
        ffn_inp = b.op(f"ffn_inp-{il}", "ADD", (E, rows), (cur, inp_sa))
        norm = b.op(f"norm-{il}", "RMS_NORM", (E, rows), (ffn_inp,))
        cur = b.op(f"ffn_norm-{il}", "MUL", (E, rows), (norm, w["ffn_norm"]))
        if s.phi3:
            up = b.op(f"ffn_up-{il}", "MUL_MAT", (2 * s.n_ff, rows), (w["up"], cur))
            cur = b.op(f"ffn_swiglu-{il}", "GLU", (s.n_ff, rows), (up,))
        else:
            gate = b.op(f"ffn_gate-{il}", "MUL_MAT", (s.n_ff, rows), (w["gate"], cur))
            up = b.op(f"ffn_up-{il}", "MUL_MAT", (s.n_ff, rows), (w["up"], cur))
            cur = b.op(f"ffn_swiglu-{il}", "GLU", (s.n_ff, rows), (gate, up))
        cur = b.op(f"ffn_out-{il}", "MUL_MAT", (E, rows), (w["down"], cur))
        srcs = (ffn_inp, cur) if s.phi3 else (cur, ffn_inp)
        x = b.op(f"l_out-{il}", "ADD", (E, rows), srcs)
    rows = s.n_outputs
    norm = b.op("norm", "RMS_NORM", (E, rows), (x,))
    cur = b.op("result_norm", "MUL", (E, rows), (norm, b.weight("output_norm.weight")))
    _set_output(b, cur)  # res->t_embd and res->t_logits: llm_graph_result::set_outputs
    logits = b.op("result_output", "MUL_MAT", (s.n_vocab, rows), (b.weight("output.weight"), cur))
    _set_output(b, logits)
    return Graph(tuple(b.tensors), tuple(b.nodes), tuple(b.leafs))


def _set_output(b: _Builder, i: int) -> None:
    t = b.tensors[i]
    b.tensors[i] = Tensor(t.name, t.op, t.nbytes, t.buffer, t.layout, t.srcs, t.view_src, t.is_input, True)
