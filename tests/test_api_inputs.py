"""The Python API takes what the command line takes, and nothing else (issue 38, item 2): every field of
``PlanRequest`` given an odd value (empty, huge, negative, NaN, infinite, of the wrong type, a lone
surrogate, a duplicated list) either plans or raises a ``KvadviseError`` with a documented exit code (2, 3
or 4) and a one-line message; never a ``KeyError``, ``TypeError``, ``ValueError`` or an "internal error"
(exit 1). The command line's side is test_fuzz.py::test_no_option_value_ends_in_an_internal_error."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvadvise
from kvadvise.errors import KvadviseError
from kvadvise.request import PlanRequest

_ODD: list[object] = [
    None, "", " ", "\x00", "\udcff", "a\nb", "x" * 3000, "nan", "-1", "²", "٣",
    0, -1, 1, 2**31, 2**63, 10**400, -(2**70),
    0.0, -0.5, 1.5, math.nan, math.inf, -math.inf, 1e308,
    True, False, (), (math.nan,), (1.0, math.inf), (0,), (-1,), (1 << 30, 1 << 30), ("x",), (10**400, 1), [1, 2], {"a": 1},
]  # fmt: skip
_FIELDS = [f.name for f in fields(PlanRequest) if f.name not in ("draft", "mmproj")]  # objects: their own tests


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> kvadvise.ModelSpec:
    return kvadvise.load_model(str(gemma_path))


def test_every_field_has_odd_values_to_try() -> None:
    assert len(_FIELDS) >= 35 and "n_ctx" in _FIELDS and "rpc" in _FIELDS and "tensor_split" in _FIELDS


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(name=st.sampled_from(_FIELDS), value=st.sampled_from(_ODD))
def test_no_api_value_ends_in_an_internal_error(gemma: kvadvise.ModelSpec, name: str, value: object) -> None:
    request = PlanRequest(**{name: value, "ram_bytes": 16 << 30} if name != "ram_bytes" else {name: value})
    try:
        plan = kvadvise.plan(gemma, request, hardware=kvadvise.gpu_profile("rtx-4090"))
    except KvadviseError as e:
        assert e.exit_code in (2, 3, 4), (name, value, e.exit_code)
        assert "\n" not in e.message and e.message.strip(), (name, value, e.message)
    else:
        assert plan.estimate.device_bytes >= 0 and plan.estimate.layout.n_ctx > 0, (name, value)


@pytest.mark.parametrize("name", ["n_ctx", "n_parallel", "n_batch", "n_ubatch", "margin_bytes", "users"])
def test_numbers_past_what_llama_cpp_reads_are_refused(gemma: kvadvise.ModelSpec, name: str) -> None:
    """int32 fields of llama.cpp (common/arg.cpp std::stoi) and sizes: a number no llama.cpp takes is exit 2,
    the same number as the CLI refuses."""
    with pytest.raises(KvadviseError) as e:
        kvadvise.plan(gemma, PlanRequest(**{name: 2**63}), hardware=kvadvise.gpu_profile("rtx-4090"))
    assert e.value.exit_code == 2
    assert "x>=0" not in e.value.message  # 2**63 is >= 0: the bound said is the one it breaks


def test_a_vram_past_int64_bytes_is_refused_as_the_cli_refuses_it(gemma: kvadvise.ModelSpec) -> None:
    """`--vram 99999999999999999999999GiB` is refused (more than 8 EiB); vram_bytes=(10**30,) planned a card of
    that size: the request's bound is the command line's (kvadvise.units.MAX_SIZE_BYTES)."""
    from kvadvise.units import MAX_SIZE_BYTES

    for vram in ((10**30,), (MAX_SIZE_BYTES + 1, 1 << 30)):
        with pytest.raises(KvadviseError) as e:
            kvadvise.plan(gemma, PlanRequest(vram_bytes=vram))
        assert e.value.exit_code == 2 and "vram" in e.value.message, e.value.message
    assert kvadvise.plan(gemma, PlanRequest(vram_bytes=(MAX_SIZE_BYTES,))).fits


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("n_layer_all", 0, "n_layer_all is 0"),  # zip() ValueError (exit 1)
        ("n_head", (), "n_head has 0 values for 18 layers"),  # IndexError (exit 1)
        ("kv_layers", (True,), "kv_layers has 1 values"),  # IndexError (exit 1)
        ("n_embd", -5, "n_embd is -5"),  # planned, as if it were a model
        ("n_head_kv", (-1,) * 18, "n_head_kv holds -1"),  # planned
        ("n_head_kv", (2**40,) * 18, "past any model's"),  # planned (not fitting)
        ("name", None, "name is None"),
    ],
)
def test_a_model_spec_made_by_hand_is_checked(gemma: kvadvise.ModelSpec, field: str, value: object, what: str) -> None:
    """kvadvise.plan takes a ModelSpec; one changed by hand (dataclasses.replace) with a per-layer tuple of another
    length ended in IndexError or zip()'s ValueError (exit 1), and a negative width was planned: each is refused as
    an argument is (exit 2, one line), and load_model's own plans as before."""
    import dataclasses

    with pytest.raises(KvadviseError) as e:
        kvadvise.plan(dataclasses.replace(gemma, **{field: value}), hardware=kvadvise.gpu_profile("rtx-4090"))
    assert e.value.exit_code == 2 and what in e.value.message and "\n" not in e.value.message, e.value.message
    assert e.value.message.startswith("Invalid value for 'model': ModelSpec: ")
    assert kvadvise.plan(gemma, hardware=kvadvise.gpu_profile("rtx-4090")).fits


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"gpus": None}, "gpus is None"),  # TypeError (exit 1)
        ({"gpu": {"name": None}}, "name/backend is not text"),  # AttributeError (exit 1)
        ({"gpu": {"free_bytes": -1}}, "free_bytes is -1"),  # planned
        ({"gpu": {"free_bytes": 1 << 40, "total_bytes": 1}}, "bytes free of 1"),  # planned
        ({"ram_free_bytes": -1}, "ram_free_bytes is -1"),  # planned
        # the decode estimate divides by these: NaN t/s, a negative or an infinite clock took the fixed time per
        # layer below zero or to nothing (kvadvise.planner.speed.clock_factor), a text clock ended in TypeError
        ({"gpu": {"clock_hz": math.nan}}, "clock_hz is nan"),
        ({"gpu": {"clock_hz": math.inf}}, "clock_hz is inf"),
        ({"gpu": {"clock_hz": -2.5e9}}, "clock_hz is -2500000000.0"),
        ({"gpu": {"clock_hz": "2520"}}, "clock_hz is '2520'"),
        ({"gpu": {"bandwidth_bytes_per_s": math.nan}}, "bandwidth_bytes_per_s is nan"),
        ({"gpu": {"bandwidth_bytes_per_s": -1}}, "bandwidth_bytes_per_s is -1"),
        ({"gpu": {"flops_per_s": math.inf}}, "flops_per_s is inf"),
    ],
)
def test_a_hardware_made_by_hand_is_checked(gemma: kvadvise.ModelSpec, change: dict[str, object], what: str) -> None:
    """A Hardware changed by hand: gpus=None and a GPU named None ended in TypeError/AttributeError (exit 1); a
    negative free memory, or more free than the card has, was planned. Refused as an argument is (exit 2)."""
    import dataclasses

    hw = kvadvise.gpu_profile("rtx-4090")
    gpu_change = change.pop("gpu", None)
    if isinstance(gpu_change, dict):
        change = {"gpus": (dataclasses.replace(hw.gpus[0], **gpu_change),)}
    with pytest.raises(KvadviseError) as e:
        kvadvise.plan(gemma, hardware=dataclasses.replace(hw, **change))  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and what in e.value.message and "\n" not in e.value.message, e.value.message
    assert kvadvise.plan(gemma, hardware=hw).fits and kvadvise.plan(gemma, hardware=kvadvise.probe_hardware())
