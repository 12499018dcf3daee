"""What every size of the memory model reads: the context as llama.cpp resolves it (:class:`ContextLayout`,
made by kvadvise.planner.memory.resolve) and the shapes of the model's layers (:class:`LayerShapes`).

Below kvadvise.planner.memory, kvadvise.planner.sizes and kvadvise.planner.split, which all read both.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.model.ggml import GGMLType
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds


@dataclass(frozen=True, slots=True)
class ContextLayout:
    """The context as llama.cpp resolves it (printed by llama_context:)."""

    n_ctx: int  # cells, padded to 256 (and to n_seq_max streams)
    n_ctx_seq: int  # cells per stream
    n_stream: int  # 1 when unified, else n_seq_max
    n_seq_max: int
    n_batch: int
    n_ubatch: int
    n_outputs_max: int  # cparams.n_outputs_max: logits rows per ubatch the graph is reserved for
    n_ctx_swa: int  # cells per stream of the SWA cache (0 without SWA)
    flash_attn: bool
    kv_unified: bool
    swa_full: bool
    type_k: GGMLType
    type_v: GGMLType
    device: str
    llama_build: int | None = builds.REFERENCE  # the build whose rules apply (None: the largest of them)
    # V stored transposed: flash attention off when the cache is made (llama_model::create_memory: !cparams.flash_attn,
    # which -fa auto leaves on until llama_context::resolve_fused_ops turns it off after the cache exists)
    v_trans: bool = False


@dataclass(frozen=True, slots=True)
class LayerShapes:
    """What sizing the caches reads of a model's layers: the same for every card, context and cache type,
    so it is worked out once per model (``compare`` plans each model on dozens of cards)."""

    v_max: int  # n_embd_v_gqa_max(): the width of every V row when V is transposed (flash attention off)
    # per layer: (sliding-window, n_embd_k_gqa, n_embd_v_gqa), None for a layer without KV cells
    keys: tuple[tuple[bool, int, int] | None, ...]
    counts: tuple[tuple[tuple[bool, int, int], int], ...]  # each distinct key and how many layers have it
    kv_group: tuple[int, ...]  # the layers of the non-SWA cache (all KV layers without SWA)
    swa_group: tuple[int, ...]  # the layers of the SWA cache
    kv_counts: tuple[tuple[tuple[bool, int, int], int], ...]  # :attr:`counts` of the non-SWA cache's layers
    swa_counts: tuple[tuple[tuple[bool, int, int], int], ...]  # and of the SWA cache's
    has_full: bool  # some KV layer attends to the whole context
    has_swa_layer: bool  # some KV layer is sliding-window
    heads: frozenset[tuple[int, int]]  # the (K, V) head sizes of the trunk's layers, for flash attention's check


_SHAPES: dict[int, tuple[ModelSpec, LayerShapes]] = {}  # id(spec) -> (spec, shapes); the spec is kept to pin its id
_SHAPES_MAX = 256


def layer_shapes(spec: ModelSpec) -> LayerShapes:
    """The model's :class:`LayerShapes`, computed on first use and kept for the last few hundred models."""
    hit = _SHAPES.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    has_swa = spec.has_swa
    keys = tuple(
        (bool(spec.swa_layers[il]), spec.n_embd_k_gqa(il), spec.n_embd_v_gqa(il)) if spec.kv_layers[il] else None
        for il in range(spec.n_layer_all)
    )
    counts: dict[tuple[bool, int, int], int] = {}
    for key in keys:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    kv_layers = [il for il, key in enumerate(keys) if key is not None]
    kv_group = tuple(il for il in kv_layers if not has_swa or not spec.swa_layers[il])
    swa_group = tuple(il for il in kv_layers if has_swa and spec.swa_layers[il]) if has_swa else ()

    def count(group: tuple[int, ...]) -> tuple[tuple[tuple[bool, int, int], int], ...]:
        c: dict[tuple[bool, int, int], int] = {}
        for il in group:
            key = keys[il]
            assert key is not None
            c[key] = c.get(key, 0) + 1
        return tuple(c.items())

    shapes = LayerShapes(
        v_max=spec.n_embd_v_gqa_max(),
        keys=keys,
        counts=tuple(counts.items()),
        kv_group=kv_group,
        swa_group=swa_group,
        kv_counts=count(kv_group),
        swa_counts=count(swa_group),
        has_full=any(kv and not swa for kv, swa in zip(spec.kv_layers, spec.swa_layers, strict=True)),
        has_swa_layer=any(kv and swa for kv, swa in zip(spec.kv_layers, spec.swa_layers, strict=True)),
        heads=frozenset(
            (spec.n_embd_head_k_swa, spec.n_embd_head_v_swa)
            if spec.swa_layers[il]
            else (spec.n_embd_head_k, spec.n_embd_head_v)
            for il in range(spec.n_layer)
        ),
    )
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[id(spec)] = (spec, shapes)
    return shapes
