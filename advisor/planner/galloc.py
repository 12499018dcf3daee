"""ggml-alloc's graph allocator (ggml/src/ggml-alloc.c at b11312 = 0c1e570), ported: the size of the buffer a
graph's reserve pass asks of each buffer type, computed from the node sequence alone (no llama.cpp at plan time).

What is followed, function by function:
- ggml_gallocr_alloc_graph_impl: leafs first, then a pass that counts each tensor's children and views and
  allocates the graph inputs (flag INPUT) in the order they are first met, then the nodes in order: a node's
  parents, the node, and every parent whose last child (and last view) it was is freed;
- ggml_gallocr_allocate_node: views and tensors with data of their own (weights, the KV cache) take nothing; an op
  of ggml_op_can_inplace takes over a parent with the same layout, allocated here, not an output, with one
  child and no views (a view parent: when its view_src has that one view and no children), and frees what the
  parent had beyond its own size (ggml_gallocr_free_extra_space);
- ggml_gallocr_free_node: graph outputs are never freed;
- ggml_dyn_tallocr_alloc / _free_bytes: sizes padded to the buffer type's alignment; the best fit (smallest
  block that fits, the last such on ties) among the free blocks but the last, else the last block (the top of
  the buffer, which grows it); a freed range merges with its neighbours, else is inserted in address order.
  One chunk: the buffer types planned here have no maximum size (max_chunk_size is SIZE_MAX/2).

The reserve pass runs with no tensor data set (llama-fit-params, no_alloc; a first reserve), so a view parent's
``view_src->data == parent->data`` is always true there.

The replays (kvadvise.planner.llama_graph, sizes' MLA blocks, host_experts' host split of routed experts) build their
graphs with :class:`GraphBuilder`, which makes each tensor's layout key and a view's source one way for all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# ggml.c ggml_op_can_inplace (ggml-alloc.c): the ops whose result may take its parent's memory
INPLACE_OPS = frozenset(
    {
        "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR",
        "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "CLAMP", "SOFT_MAX",
        "SOFT_MAX_BACK",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor of a graph: a node (an op), a leaf, or a graph input.

    ``srcs`` and ``view_src`` are indices of earlier tensors of the same graph; ``buffer`` the buffer type that
    holds it (an index into the allocator's alignments); ``layout`` stands for ggml_are_same_layout (type, ne
    and nb); ``external``: data of its own (weights, the KV cache: never allocated here)."""

    name: str
    op: str
    nbytes: int
    buffer: int
    layout: tuple[object, ...]
    srcs: tuple[int, ...] = ()
    view_src: int | None = None
    is_input: bool = False
    is_output: bool = False
    external: bool = False


@dataclass(frozen=True, slots=True)
class Graph:
    """A graph as ggml_gallocr_reserve_n receives it: the tensors, then the order of its nodes and leafs (indices
    into ``tensors``); a node's buffer is its tensor's ``buffer`` (ggml_backend_sched's node_backend_ids)."""

    tensors: tuple[Tensor, ...]
    nodes: tuple[int, ...]
    leafs: tuple[int, ...] = ()


Layout = tuple[object, ...]
# the element types the replays name (ggml_type_size): the type is part of ggml_are_same_layout
ELT_BYTES = {"f32": 4, "f16": 2, "i32": 4}


def dense_layout(shape: tuple[int, ...], dtype: str = "f32") -> Layout:
    """The layout key of a contiguous tensor (ggml_are_same_layout, ggml-impl.h b11312: type, ne and nb; nb follows
    from the type and ne): what an op may take over in place."""
    return (dtype, *shape)


def flat(nbytes: int, dtype: str = "f32") -> tuple[int, ...]:
    """One row of ``nbytes`` (a multiple of the type's size), for a replay that tracks bytes, not shapes: two such
    tensors of one type have the same layout when they are as large (a replay of f32 rows does not tell [a, b] from
    [b, a])."""
    return (nbytes // ELT_BYTES[dtype],)


class GraphBuilder:
    """A graph for :func:`reserve_sizes`, tensor by tensor in the order ggml_backend_sched hands them to ggml-alloc:
    each call appends one tensor (a node, or a leaf for weights and graph inputs) and returns its index.

    The layout key decides in-place reuse (ggml_gallocr_allocate_node, ggml-alloc.c b11312: an op of
    ggml_op_can_inplace takes over a parent of the same layout): an op's is :func:`dense_layout` of its element type
    and shape; an input's its own (no op takes it over) unless the replay gives one; a copy's is its source's
    (ggml_dup_tensor). A view has none: it is never allocated, so it is never its own (ggml_gallocr_is_own) and
    never taken over; it keeps its source alive (view_src: the first tensor with data of its own, a view of a view
    resolved), and with op NONE it is a dependency only (ggml_backend_sched's input_dep: not counted as a view)."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.nodes: list[int] = []
        self.leafs: list[int] = []

    def _add(self, t: Tensor, *, node: bool = True) -> int:
        self.tensors.append(t)
        i = len(self.tensors) - 1
        (self.nodes if node else self.leafs).append(i)
        return i

    def weight(self, name: str, *, buffer: int = 0) -> int:
        """A tensor with data of its own (a weight, the KV cache): a leaf ggml-alloc never allocates."""
        return self._add(Tensor(name, "NONE", 0, buffer, (), external=True), node=False)

    def input(self, name: str, nbytes: int, *, buffer: int = 0, layout: Layout | None = None,
              output: bool = False) -> int:  # fmt: skip
        """A graph input (flag INPUT), a leaf: allocated before every node; ``output``: never freed either (pipeline
        parallelism's copies). ``layout`` None: its own, which no op shares."""
        own = ("input", len(self.tensors))
        t = Tensor(name, "NONE", nbytes, buffer, own if layout is None else layout, is_input=True, is_output=output)
        return self._add(t, node=False)

    def input_copy(self, src: int, *, buffer: int, name: str | None = None) -> int:
        """The copy of ``src`` a split starts with (ggml_backend_sched_split_graph, ggml-backend.cpp b11312): a node
        flagged INPUT in ``buffer``, as large and laid out as ``src``."""
        s = self.tensors[src]
        return self._add(Tensor(name or f"{s.name}#copy", "NONE", s.nbytes, buffer, s.layout, is_input=True))

    def op(self, name: str, op: str, shape: tuple[int, ...], srcs: tuple[int, ...], *, dtype: str = "f32",
           buffer: int = 0) -> int:  # fmt: skip
        """A node with memory of its own: ``shape``'s elements of ``dtype``, laid out densely."""
        n = ELT_BYTES[dtype]
        for d in shape:
            n *= d
        return self._add(Tensor(name, op, n, buffer, dense_layout(shape, dtype), srcs))

    def view(self, src: int, op: str = "VIEW", *, name: str | None = None, srcs: tuple[int, ...] | None = None) -> int:
        """A view of ``src`` (VIEW, RESHAPE, PERMUTE, TRANSPOSE; or an op whose result is a view of its destination:
        SET_ROWS, CPY into a view of the cache), reading ``srcs`` (``src`` alone unless given)."""
        s = self.tensors[src]
        base = s.view_src if s.view_src is not None else src
        t = Tensor(name or f"{s.name} ({op})", op, s.nbytes, s.buffer, (), srcs or (src,), view_src=base)
        return self._add(t)

    def dep(self, src: int, *, name: str | None = None) -> int:
        """A view of op NONE: keeps ``src`` alive to here, not counted among its views (ggml-alloc.c b11312,
        ggml_gallocr_alloc_graph_impl: "GGML_OP_NONE ... is used by ggml-backend to add dependencies")."""
        return self.view(src, "NONE", name=name or f"{self.tensors[src].name} (dep)")

    def set_output(self, i: int) -> None:
        """Flag ``i`` a graph output (llm_graph_result::set_outputs): never freed nor taken over in place."""
        self.tensors[i] = replace(self.tensors[i], is_output=True)

    def graph(self) -> Graph:
        return Graph(tuple(self.tensors), tuple(self.nodes), tuple(self.leafs))


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class _DynAllocator:
    """ggml_dyn_tallocr, one chunk: free blocks [offset, size] in address order, the last one endless."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = _pad(size, self.alignment)
        best, best_size = -1, None
        for i in range(len(self.blocks) - 1):  # besides the last block
            block_size = self.blocks[i][1]
            if block_size >= size and (best_size is None or block_size <= best_size):
                best, best_size = i, block_size
        if best == -1:
            best = len(self.blocks) - 1  # the last block (one chunk, endless: it always fits)
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = _pad(size, self.alignment)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # at the end of a block
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:  # at the beginning of a block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


@dataclass(slots=True)
class _HashNode:
    n_children: int = 0
    n_views: int = 0
    buffer: int = -1
    offset: int = 0
    allocated: bool = False


def reserve_sizes(graph: Graph, alignments: tuple[int, ...]) -> tuple[int, ...]:
    """The bytes each buffer type's buffer needs for ``graph`` (ggml_gallocr_reserve_n_size)."""
    allocs = [_DynAllocator(a) for a in alignments]
    ts = graph.tensors
    hn = [_HashNode() for _ in ts]

    def is_view(i: int) -> bool:
        return ts[i].view_src is not None

    def allocate(i: int, buffer: int) -> None:
        t, h = ts[i], hn[i]
        if t.external or h.allocated or is_view(i):
            return
        h.allocated = True
        if t.op in INPLACE_OPS:
            for p in t.srcs:
                if not hn[p].allocated:  # not own: external or not allocated here
                    continue
                vs = ts[p].view_src
                if ts[p].is_output or (vs is not None and ts[vs].is_output):
                    continue
                if ts[p].layout != t.layout:
                    continue
                ph = hn[p]
                if ph.n_children == 1 and ph.n_views == 0:
                    if vs is not None:
                        vh = hn[vs]
                        if vh.n_views == 1 and vh.n_children == 0:
                            h.buffer, h.offset = ph.buffer, ph.offset
                            ph.allocated = False
                            vh.allocated = False
                            _free_extra(i, vs)
                            return
                    else:
                        h.buffer, h.offset = ph.buffer, ph.offset
                        ph.allocated = False
                        _free_extra(i, p)
                        return
        h.buffer = buffer
        h.offset = allocs[buffer].alloc(t.nbytes)

    def _free_extra(i: int, parent: int) -> None:
        a = allocs[hn[parent].buffer]
        p_size, n_size = _pad(ts[parent].nbytes, a.alignment), _pad(ts[i].nbytes, a.alignment)
        if p_size > n_size:
            a.free(hn[parent].offset + n_size, p_size - n_size)

    def free(i: int) -> None:
        if ts[i].is_output:
            return
        h = hn[i]
        allocs[h.buffer].free(h.offset, ts[i].nbytes)
        h.allocated = False

    for i in graph.leafs:
        allocate(i, ts[i].buffer)
    for i in graph.nodes:
        t = ts[i]
        if t.view_src is not None and t.op != "NONE":
            hn[t.view_src].n_views += 1
        if t.is_input:
            allocate(i, t.buffer)
        for s in t.srcs:
            hn[s].n_children += 1
            if ts[s].is_input:
                allocate(s, t.buffer)
    for i in graph.nodes:
        t = ts[i]
        for p in t.srcs:
            allocate(p, t.buffer)
        allocate(i, t.buffer)
        for p in t.srcs:
            ph = hn[p]
            ph.n_children -= 1
            if ph.n_children == 0 and ph.n_views == 0:
                vs = ts[p].view_src
                if vs is not None:
                    vh = hn[vs]
                    vh.n_views -= 1
                    if vh.n_views == 0 and vh.n_children == 0 and vh.allocated:
                        free(vs)
                elif ph.allocated:
                    free(p)
    return tuple(a.max_size for a in allocs)
