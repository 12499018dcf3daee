"""A new K/V cache type touches two files: kvadvise.model.ggml (the types llama.cpp's -ctk/-ctv accept,
their block layout) and kvadvise.planner.policy (which of them the recommendation considers, in what
order, and which need an opt-in). Every other list of cache types derives from those two."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvadvise.model.ggml import KV_CACHE_TYPES, GGMLType
from kvadvise.planner import policy
from kvadvise.ui.flags import KV_TYPES

ROOT = Path(__file__).resolve().parent.parent
NAMES = {t.type_name for t in KV_CACHE_TYPES}
MEMBERS = {t.name for t in KV_CACHE_TYPES}  # GGMLType.Q8_0 -> "Q8_0"
ALL_NAMES = {t.type_name for t in GGMLType}
ALL_MEMBERS = {t.name for t in GGMLType}
# the two places a cache type is listed; and one runtime's own fact: the types Ollama's
# OLLAMA_KV_CACHE_TYPE accepts (llama/llama.go kvCacheTypeFromStr: q8_0, q4_0, else f16)
OWNERS = {"advisor/model/ggml.py", "advisor/planner/policy.py"}
RUNTIME_FACTS = {("backends/ollama/rules.py", "KV_CACHE_TYPES")}


def _ggml_type(node: ast.expr) -> str | None:
    """The ggml type a literal names: "q8_0", GGMLType.Q8_0, or policy's alias Q8_0."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALL_NAMES:
        return node.value
    if isinstance(node, ast.Attribute) and node.attr in ALL_MEMBERS:
        return node.attr.lower()
    if isinstance(node, ast.Name) and node.id in ALL_MEMBERS:
        return node.id.lower()
    return None


def _lists_of_cache_types() -> list[str]:
    """Every tuple, list or set literal of the package that names two or more cache types, by file and target."""
    found = []
    for folder in ("advisor", "backends"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in OWNERS:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            targets = {
                id(n.value): n.targets[0].id
                for n in ast.walk(tree)
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
            }
            for node in ast.walk(tree):
                if not isinstance(node, ast.Tuple | ast.List | ast.Set):
                    continue
                types = {t for e in node.elts if (t := _ggml_type(e)) is not None}
                if not types <= NAMES:  # a list of weight types (q4_K, mxfp4...): not the cache's
                    continue
                if len(types) >= 2 and (rel, targets.get(id(node), "")) not in RUNTIME_FACTS:
                    found.append(f"{rel}:{node.lineno} {sorted(types)}")
    return found


def test_no_list_of_cache_types_outside_ggml_and_policy() -> None:
    assert _lists_of_cache_types() == []


def test_the_guard_sees_a_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan finds what it looks for: a module that lists cache types of its own is reported."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "advisor").mkdir()
    (tmp_path / "backends").mkdir()
    (tmp_path / "advisor" / "x.py").write_text(
        'A = ("f16", "q8_0")\nB = (GGMLType.F16, GGMLType.Q4_0)\nC = ("f16", "f16")\n'
    )
    assert _lists_of_cache_types() == ["advisor/x.py:1 ['f16', 'q8_0']", "advisor/x.py:2 ['f16', 'q4_0']"]


def test_every_list_derives_from_ggml_and_policy() -> None:
    assert tuple(t.type_name for t in KV_CACHE_TYPES) == KV_TYPES  # -ctk/-ctv/-ctkd/-ctvd choices
    tables = [*policy.CACHE_CHOICES, *policy.FA_OFF_CHOICES, *policy.F16_K_CHOICES]
    assert {t for kv in tables for t in kv} | set(policy.LISTED_CACHE_TYPES) | policy.OPT_IN_TYPES <= set(
        KV_CACHE_TYPES
    )
    assert tuple(kv for kv in policy.CACHE_CHOICES if kv[0] == kv[1]) == policy.SAME_TYPE_CHOICES
    from kvadvise.backends.ollama.rules import KV_CACHE_TYPES as OLLAMA_TYPES

    assert set(OLLAMA_TYPES) <= NAMES  # Ollama's own set: each a type llama.cpp accepts


def test_a_listing_column_per_listed_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a type to policy.LISTED_CACHE_TYPES adds its column to listings (kvadvise ollama --installed,
    gguf DIR), with no other edit."""
    from kvadvise.model.hfconfig import from_config
    from kvadvise.planner.hardware import manual
    from kvadvise.planner.inventory import RunSettings
    from kvadvise.ui.listing import Listed, listing_text, survey

    monkeypatch.setattr(policy, "LISTED_CACHE_TYPES", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0))
    spec = from_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "intermediate_size": 1024,
            "vocab_size": 1000,
            "max_position_embeddings": 1 << 20,
        },
        source="test",
        weights_bytes=10 << 20,
    )
    budget, rows = survey([Listed("m", "test", 10 << 20, spec)], RunSettings(), manual(1 << 30), 0)
    _head, cols, line = listing_text(budget, RunSettings(), rows, show_loaded=False)
    assert cols.split()[3:9] == ["F16", "CTX", "Q8_0", "CTX", "Q4_0", "CTX"]
    reach = rows[0].fit.max_ctx if rows[0].fit is not None else {}
    assert list(reach) == ["f16", "q8_0", "q4_0"]
    f16, q8, q4 = (int(reach[t] or 0) for t in reach)
    assert 0 < f16 < q8 < q4
    assert line.split()[4:7] == [f"{n:,}" if n % 1024 else f"{n // 1024}k" for n in (f16, q8, q4)]
