"""Every built-in profile's download size against the weights its config gives at its quantization.

The weights are recounted from the config (kvadvise.model.breakdown: embeddings, attention, FFN,
experts) at llama.cpp's bits per weight for the quant; a stated size more than 5 % away means a
wrong size, a wrong quant or a wrong config.
"""

from __future__ import annotations

import pytest

from kvadvise.backends.ollama.profiles import profile_ids, profiles
from kvadvise.model.breakdown import params, sized
from kvadvise.model.hfconfig import from_config

TOLERANCE = 0.05


def _recount(pid: str) -> tuple[int, int]:
    p = profiles()[pid]
    bd = params(from_config(p.config, source=pid), p.config)
    assert bd is not None, pid
    assert p.quantization and p.download_bytes
    return sized(bd, p.quantization).total + p.projector_bytes, p.download_bytes


@pytest.mark.parametrize("pid", profile_ids())
def test_stated_size_is_within_5_percent_of_the_recount(pid: str) -> None:
    counted, stated = _recount(pid)
    assert abs(stated - counted) / counted <= TOLERANCE, (
        f"{pid}: stated {stated / 1e9:.2f} GB, counted {counted / 1e9:.2f}"
    )


@pytest.mark.parametrize("pid", profile_ids())
def test_every_size_has_a_source_and_a_date(pid: str) -> None:
    p = profiles()[pid]
    assert p.download_source and p.download_date and p.download_kind and p.quantization


@pytest.mark.parametrize(
    ("pid", "size"),
    # Ollama's library (issue 14): the sizes the old profiles had wrong, and the exact /api/tags totals
    [("qwen3-coder:30b", 19e9), ("llama3.1:8b", 4_920_738_944), ("llama3.1:70b", 43e9),
     ("deepseek-r1:70b", 42_520_397_704), ("llama3.3:70b", 42_520_413_916), ("mistral:7b", 4.4e9)],
)  # fmt: skip
def test_corrected_sizes(pid: str, size: float) -> None:
    assert profiles()[pid].download_bytes == size


def test_parameter_counts_of_moe_models() -> None:
    """The published totals: Qwen3-Coder-30B-A3B 30.5 B (3.3 B active), gpt-oss-20b 20.9 B (3.6 B active),
    gpt-oss-120b 116.8 B (5.1 B active), Mixtral 8x7B 46.7 B."""
    for pid, total, active in [
        ("qwen3-coder:30b", 30.5e9, 3.3e9),
        ("gpt-oss:20b", 20.9e9, 3.6e9),
        ("gpt-oss:120b", 116.8e9, 5.1e9),
        ("mixtral:8x7b", 46.7e9, 12.9e9),
    ]:
        p = profiles()[pid]
        bd = params(from_config(p.config, source=pid), p.config)
        assert bd is not None
        assert abs(bd.total - total) / total < 0.01, (pid, bd.total)
        # read per token; model cards count the token embedding in "active" or not (OpenAI does not)
        assert min(abs(bd.active - active), abs(bd.active + bd.tok_embd - active)) / active < 0.03, (pid, bd.active)


def test_profile_parts_add_up_for_partial_offload() -> None:
    spec = profiles()["qwen3-coder:30b"].spec()
    assert spec.expert_bytes > 0.9 * spec.weights_bytes - spec.tok_embd_bytes - spec.output_bytes
    assert sum(spec.layer_bytes) + spec.tok_embd_bytes + spec.output_bytes == pytest.approx(spec.weights_bytes, abs=64)
    assert len(spec.layer_bytes) == spec.n_layer_all
