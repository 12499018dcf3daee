"""kvadvise.frozen.dataclass: the frozen dataclasses of the package, built without exec, behave as the
standard ``@dataclass(frozen=True, slots=True)`` does (issue 11: 29 such classes cost 40-55 ms of
``kvadvise gguf FILE``'s start-up when Python 3.11 compiled their methods)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError, InitVar, field
from typing import ClassVar

import pytest

from kvadvise.frozen import dataclass as fast


@fast(frozen=True, slots=True)
class FastPoint:
    """A point, made fast."""

    x: int
    y: tuple[int, ...] = ()
    tags: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    n: int = field(default=0, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "y", tuple(self.y))


@dataclasses.dataclass(frozen=True, slots=True)
class StdPoint:
    """The same point, made by the standard decorator."""

    x: int
    y: tuple[int, ...] = ()
    tags: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    n: int = field(default=0, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "y", tuple(self.y))


def _pair() -> tuple[type, type]:
    return FastPoint, StdPoint


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, [2, 3]), {}), ((), {"x": 4, "y": (5,)}), ((7,), {"n": 2, "tags": {"a": 1}})],
)
def test_same_behaviour_as_the_standard_decorator(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    Fast, Std = _pair()
    a, b = Fast(*args, **kwargs), Std(*args, **kwargs)
    assert repr(a).split("(", 1)[1] == repr(b).split("(", 1)[1]
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert [f.name for f in dataclasses.fields(a)] == [f.name for f in dataclasses.fields(b)]
    assert dataclasses.is_dataclass(a) and Fast.__match_args__ == Std.__match_args__
    assert a == Fast(*args, **kwargs) and a != b  # equal within a class, never across classes
    assert hash(a) == hash(Fast(*args, **kwargs))
    assert a == dataclasses.replace(a, tags={"other": 1})  # tags are not compared
    assert a != dataclasses.replace(a, x=99) and dataclasses.replace(a, x=99).x == 99
    assert hash(a) == hash(dataclasses.replace(a, n=5))  # n is compared but not hashed
    assert copy.deepcopy(a) == a and pickle.loads(pickle.dumps(a)) == a
    assert not hasattr(a, "__dict__")  # slots


def test_frozen_and_argument_errors_match() -> None:
    Fast, Std = _pair()
    for cls in (Fast, Std):
        p = cls(1)
        with pytest.raises(FrozenInstanceError):
            p.x = 2
        with pytest.raises(FrozenInstanceError):
            del p.x
    for call in (
        lambda c: c(),
        lambda c: c(1, (), {}, 0, 5),
        lambda c: c(1, z=2),
        lambda c: c(1, x=2),
    ):
        with pytest.raises(TypeError) as fast_err:
            call(Fast)
        with pytest.raises(TypeError) as std_err:
            call(Std)
        # the same complaint, about the same argument
        assert str(fast_err.value).split("()", 1)[1] == str(std_err.value).split("()", 1)[1]


def test_default_factory_gives_each_instance_its_own() -> None:
    Fast, _ = _pair()
    a, b = Fast(1), Fast(1)
    assert a.tags == {} and a.tags is not b.tags


def test_inherited_fields_and_order_rules() -> None:
    @fast(frozen=True, slots=True)
    class Base:
        a: int
        b: str = "s"

    @fast(frozen=True, slots=True)
    class Child(Base):
        c: float = 0.5

    assert Child(1, "t", 2.0) == Child(a=1, b="t", c=2.0)
    assert repr(Child(1)) == f"{Child.__qualname__}(a=1, b='s', c=0.5)"
    assert dataclasses.replace(Child(1), c=3.0).c == 3.0
    with pytest.raises(TypeError, match="non-default argument 'c' follows default argument"):

        @fast(frozen=True, slots=True)
        class Bad(Base):
            c: float


def test_other_options_use_the_standard_decorator() -> None:
    @fast(frozen=True)
    class Plain:
        a: int

    assert Plain(1) == Plain(1) and hasattr(Plain(1), "__dict__")


def test_every_package_dataclass_is_frozen() -> None:
    """Every dataclass the planning path imports refuses assignment."""
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.memory import RunConfig

    cfg = RunConfig()
    with pytest.raises(FrozenInstanceError):
        cfg.n_ctx = 1  # type: ignore[misc]
    assert "__kvadvise_layout__" in vars(ModelSpec) and "__kvadvise_layout__" in vars(RunConfig)


def test_params_doc_initvar_and_plain_subclasses() -> None:
    """What a review found: the recorded parameters are those of frozen=True (a stdlib frozen dataclass may
    inherit from a record), an undocumented class gets the standard "Name(fields)" doc, InitVar is refused at
    decoration, and a plain subclass shows its own name."""
    params = FastPoint.__dataclass_params__  # type: ignore[attr-defined]
    assert (params.init, params.repr, params.eq, params.frozen) == (True, True, True, True)

    @dataclasses.dataclass(frozen=True)
    class Child(FastPoint):
        z: int = 0

    assert Child(1).z == 0 and Child(1, z=2).x == 1

    @fast(frozen=True, slots=True)
    class Bare:
        a: int
        b: int = 0

    assert Bare.__doc__ == "Bare(a, b)" and FastPoint.__doc__ == "A point, made fast."
    with pytest.raises(TypeError, match="InitVar"):

        @fast(frozen=True, slots=True)
        class WithInitVar:
            a: int
            s: InitVar[int] = 1

    class Plain(Bare):
        pass

    assert repr(Plain(1)).startswith(f"{Plain.__qualname__}(a=1")


def test_fields_are_collected_as_the_standard_decorator_does() -> None:
    """The fields are collected without dataclasses._process_class (its per-field regexes cost ~2 ms of
    start-up): ClassVars stay class attributes, a mutable default, a field() without an annotation and
    an own __slots__ are refused as the standard decorator refuses them, and the recorded parameters
    are built by name (Python 3.12 added four: the positional form failed to import there)."""
    for make in (fast, dataclasses.dataclass):

        @make(frozen=True, slots=True)
        class WithClassVar:
            registry: ClassVar[dict[str, int]] = {}
            a: int
            b: tuple[int, ...] = field(default=(1,))

        assert [f.name for f in dataclasses.fields(WithClassVar)] == ["a", "b"]
        assert WithClassVar.registry == {} and WithClassVar(1).b == (1,) and WithClassVar.__slots__ == ("a", "b")
        assert WithClassVar.__match_args__ == ("a", "b")
        with pytest.raises(ValueError, match="mutable default"):

            @make(frozen=True, slots=True)
            class MutableDefault:
                a: list[int] = []  # noqa: RUF012

        with pytest.raises(TypeError, match="is a field but has no type annotation"):

            @make(frozen=True, slots=True)
            class Unannotated:
                a: int
                b = field(default=1)

        with pytest.raises(TypeError, match="already specifies __slots__"):

            @make(frozen=True, slots=True)
            class OwnSlots:
                __slots__ = ("a",)
                a: int

    fast_params = FastPoint.__dataclass_params__  # type: ignore[attr-defined]
    std_params = StdPoint.__dataclass_params__  # type: ignore[attr-defined]
    assert {n: getattr(fast_params, n) for n in type(std_params).__slots__} == {
        n: getattr(std_params, n) for n in type(std_params).__slots__
    }
