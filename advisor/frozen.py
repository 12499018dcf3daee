"""``dataclass(frozen=True, slots=True)`` without compiling code at import time.

Python 3.11's ``@dataclass`` writes the source of ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` for each class and
``exec()``s it: 1 to 2 ms a class, 40 to 55 ms for the 29 classes that
``kvadvise gguf FILE`` imports, about a third of its start-up (issue 11). This
``dataclass`` asks the standard one for the class alone (its fields, slots and
``__match_args__``; no generated methods) and gives it the methods written once
below and shared by every class. The result is a dataclass: ``fields()``,
``replace()``, ``asdict()`` and ``is_dataclass()`` work; assigning or deleting
an attribute raises ``FrozenInstanceError``; instances are equal and hashable by
their compared fields, as the generated code makes them. Type checkers see the
standard decorator. Any other set of options goes to the standard decorator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:
    import dataclasses as _dc
    from collections.abc import Callable, Iterable
    from operator import attrgetter

    class _Layout:
        """What the shared methods need of one class, worked out once when it is made."""

        __slots__ = (
            "compare",
            "defaulted",
            "defaults",
            "factories",
            "hash",
            "index",
            "init",
            "name",
            "post_init",
            "repr",
            "rest",
            "unset",
        )

        def __init__(self, cls: type) -> None:
            fields = _dc.fields(cls)
            init = [f for f in fields if f.init]
            seen_default = False
            for f in init:
                if f.kw_only:
                    raise TypeError(f"{cls.__qualname__}.{f.name}: kw_only fields are not supported here")
                has_default = f.default is not _dc.MISSING or f.default_factory is not _dc.MISSING
                if seen_default and not has_default:
                    raise TypeError(f"non-default argument {f.name!r} follows default argument")
                seen_default = seen_default or has_default
            self.name = cls.__qualname__
            self.init = tuple(f.name for f in init)
            self.defaults = tuple(f.default for f in init)
            self.factories = tuple(f.default_factory for f in init)
            self.index = {name: i for i, name in enumerate(self.init)}
            self.unset = tuple(i for i, f in enumerate(init) if f.default is _dc.MISSING)
            self.defaulted = tuple(
                f.name for f in init if f.default is not _dc.MISSING or f.default_factory is not _dc.MISSING
            )
            # fields outside __init__: their default or factory, set as the generated __init__ does
            self.rest = tuple((f.name, f.default, f.default_factory) for f in fields if not f.init)
            # attrgetter of several names returns their tuple, at C speed (specs are hashed for caches)
            self.compare = _values(f.name for f in fields if f.compare)
            self.hash = _values(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            self.repr = tuple(f.name for f in fields if f.repr)
            self.post_init = hasattr(cls, "__post_init__")

    def _values(names: Iterable[str]) -> Callable[[object], tuple[object, ...]]:
        """The tuple of ``names``' values of an instance."""
        names = tuple(names)
        if not names:
            return lambda _: ()
        get = attrgetter(*names)
        return get if len(names) > 1 else lambda obj: (get(obj),)

    _set = object.__setattr__
    _MISSING = _dc.MISSING

    def _init(self, *args, **kwargs):
        lay = type(self).__kvadvise_layout__
        names = lay.init
        if len(args) > len(names):
            n_min, n_max = len(names) - len(lay.defaulted) + 1, len(names) + 1
            takes = f"from {n_min} to {n_max}" if n_min < n_max else str(n_max)
            raise TypeError(f"{lay.name}.__init__() takes {takes} positional arguments but {len(args) + 1} were given")
        values = [*args, *lay.defaults[len(args) :]]
        for key, value in kwargs.items():
            i = lay.index.get(key)
            if i is None:
                raise TypeError(f"{lay.name}.__init__() got an unexpected keyword argument {key!r}")
            if i < len(args):
                raise TypeError(f"{lay.name}.__init__() got multiple values for argument {key!r}")
            values[i] = value
        for i in lay.unset:  # no default: a factory's value, or a missing argument
            if values[i] is _MISSING:
                factory = lay.factories[i]
                if factory is _MISSING:
                    raise TypeError(f"{lay.name}.__init__() missing 1 required positional argument: {names[i]!r}")
                values[i] = factory()
        for name, value in zip(names, values, strict=True):
            _set(self, name, value)
        for name, default, factory in lay.rest:
            if default is not _MISSING:
                _set(self, name, default)
            elif factory is not _MISSING:
                _set(self, name, factory())
        if lay.post_init:
            self.__post_init__()

    def _repr(self):
        names = type(self).__kvadvise_layout__.repr
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def _eq(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        values = type(self).__kvadvise_layout__.compare
        return values(self) == values(other)

    def _hash(self):
        return hash(type(self).__kvadvise_layout__.hash(self))

    def _setattr(self, name, value):
        raise _dc.FrozenInstanceError(f"cannot assign to field {name!r}")

    def _delattr(self, name):
        raise _dc.FrozenInstanceError(f"cannot delete field {name!r}")

    def _getstate(self):  # pickling and copying slots without __dict__
        return [getattr(self, f.name) for f in _dc.fields(self)]

    def _setstate(self, state):
        for f, value in zip(_dc.fields(self), state, strict=True):
            _set(self, f.name, value)

    _METHODS = {
        "__init__": _init,
        "__repr__": _repr,
        "__eq__": _eq,
        "__hash__": _hash,
        "__setattr__": _setattr,
        "__delattr__": _delattr,
        "__getstate__": _getstate,
        "__setstate__": _setstate,
    }

    def _frozen(cls):
        for name in _METHODS:
            if name in cls.__dict__:
                raise TypeError(f"{cls.__qualname__} defines {name}; use dataclasses.dataclass for it")
        documented = bool(cls.__dict__.get("__doc__"))
        # frozen=False spares the exec of __setattr__/__delattr__, but dataclasses refuses it under a frozen
        # base (a record subclassing a record): there only, the standard frozen flag (methods replaced below)
        frozen_base = any(getattr(getattr(b, "__dataclass_params__", None), "frozen", False) for b in cls.__mro__[1:])
        cls = _dc.dataclass(cls, init=False, repr=False, eq=False, frozen=frozen_base, slots=True)
        fields = cls.__dataclass_fields__.values()
        if any(f._field_type is not _dc._FIELD for f in fields if f._field_type is not _dc._FIELD_CLASSVAR):
            raise TypeError(f"{cls.__qualname__}: InitVar fields are not supported here")
        for name, fn in _METHODS.items():
            setattr(cls, name, fn)
        # what the standard decorator records for frozen=True (a stdlib dataclass may then inherit from it)
        params = type(cls.__dataclass_params__)
        cls.__dataclass_params__ = params(True, True, True, False, False, True)  # init repr eq order hash frozen
        if not documented:  # as the standard decorator does, without inspect.signature
            cls.__doc__ = f"{cls.__name__}({', '.join(f.name for f in _dc.fields(cls) if f.init)})"
        cls.__kvadvise_layout__ = _Layout(cls)
        return cls

    def dataclass(cls=None, /, **options):
        """``@dataclass(frozen=True, slots=True)`` built fast; any other options: the standard decorator."""
        if options != {"frozen": True, "slots": True}:
            return _dc.dataclass(cls, **options) if cls is not None else _dc.dataclass(**options)
        return _frozen if cls is None else _frozen(cls)
