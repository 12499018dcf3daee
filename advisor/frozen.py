"""``dataclass(frozen=True, slots=True)`` without compiling code at import time.

Python 3.11's ``@dataclass`` writes the source of ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` for each class and
``exec()``s it: 1 to 2 ms a class, 40 to 55 ms for the 29 classes that
``kvadvise gguf FILE`` imports, about a third of its start-up (issue 11). This
``dataclass`` collects the fields as the standard one does (without its
per-field regular expressions, 2 ms more), makes the slotted class as
``dataclasses._add_slots`` does, records ``__dataclass_fields__``,
``__dataclass_params__`` and ``__match_args__``, and gives it the methods
written once below and shared by every class. Checked on CPython 3.10 to 3.13
(tests/test_pythons.py). The result is a dataclass: ``fields()``,
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
    import inspect
    from collections.abc import Callable, Iterable
    from operator import attrgetter
    from types import MemberDescriptorType
    from typing import ClassVar, get_origin

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
        if not kwargs and len(args) == len(names):  # all by position, as the header reader makes its records
            for name, value in zip(names, args, strict=True):
                _set(self, name, value)
            if lay.rest or lay.post_init:
                _finish(self, lay)
            return
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
        _finish(self, lay)

    def _finish(self, lay):
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

    _FIELD, _CLASSVAR, _INITVAR = _dc._FIELD, _dc._FIELD_CLASSVAR, _dc._FIELD_INITVAR

    def _field_kind(annotation: object) -> object:
        """ClassVar, InitVar or a field, from an annotation (a string under ``from __future__ import annotations``)."""
        if isinstance(annotation, str):
            head = annotation.strip().split("[", 1)[0].strip()
            head = head.rsplit(".", 1)[-1] if head.startswith(("typing.", "t.", "dataclasses.")) else head
            return {"ClassVar": _CLASSVAR, "InitVar": _INITVAR}.get(head, _FIELD)
        if annotation is ClassVar or get_origin(annotation) is ClassVar:
            return _CLASSVAR
        return _INITVAR if annotation is _dc.InitVar or isinstance(annotation, _dc.InitVar) else _FIELD

    def _collect_fields(cls: type) -> dict[str, _dc.Field]:
        """The fields as ``dataclasses._process_class`` collects them, without its per-field regexes.

        Inherited fields first (dataclass bases, reversed MRO), then the class's own annotations in order.
        """
        fields: dict[str, _dc.Field] = {}
        for base in cls.__mro__[-1:0:-1]:
            for f in base.__dict__.get("__dataclass_fields__", {}).values():
                fields[f.name] = f
        annotations = inspect.get_annotations(cls)  # the class's own (3.14 makes them lazy); inspect: click has it
        for name, value in cls.__dict__.items():
            if isinstance(value, _dc.Field) and name not in annotations:
                raise TypeError(f"{name!r} is a field but has no type annotation")
        for name, annotation in annotations.items():
            default = getattr(cls, name, _MISSING)
            if isinstance(default, _dc.Field):
                f = default
            else:
                if isinstance(default, MemberDescriptorType):  # an inherited slot, not a default
                    default = _MISSING
                f = _dc.field(default=default)
            f.name, f.type, f._field_type = name, annotation, _field_kind(annotation)
            if f._field_type is _INITVAR:
                raise TypeError(f"{cls.__qualname__}: InitVar fields are not supported here")
            if f._field_type is _CLASSVAR:
                if f.default_factory is not _MISSING:
                    raise TypeError(f"field {name} cannot have a default factory")
            else:
                if f.kw_only is _MISSING:
                    f.kw_only = False
                if f.default is not _MISSING and f.default.__class__.__hash__ is None:
                    raise ValueError(
                        f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory"
                    )
            fields[name] = f
            if isinstance(cls.__dict__.get(name), _dc.Field):  # the class attribute becomes the plain default
                if f.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, f.default)
        return fields

    def _slots(cls: type) -> Iterable[str]:
        slots = cls.__dict__.get("__slots__")
        return () if slots is None else (slots,) if isinstance(slots, str) else slots

    def _params() -> object:
        """What the standard decorator records for frozen=True, slots=True; its fields differ by Python version
        (six in 3.10 and 3.11, ten since 3.12), so set by name."""
        params_type = _dc._DataclassParams
        params = params_type.__new__(params_type)
        values = {"init": True, "repr": True, "eq": True, "frozen": True, "match_args": True, "slots": True}
        for name in params_type.__slots__:
            object.__setattr__(params, name, values.get(name, False))
        return params

    def _frozen(cls):
        for name in _METHODS:
            if name in cls.__dict__:
                raise TypeError(f"{cls.__qualname__} defines {name}; use dataclasses.dataclass for it")
        if "__slots__" in cls.__dict__:
            raise TypeError(f"{cls.__name__} already specifies __slots__")
        fields = _collect_fields(cls)
        names = tuple(f.name for f in fields.values() if f._field_type is _FIELD)
        init_names = tuple(f.name for f in fields.values() if f._field_type is _FIELD and f.init)
        # a new class with __slots__, as dataclasses._add_slots makes it (slots cannot be added to a class)
        namespace = dict(cls.__dict__)
        inherited = {slot for base in cls.__mro__[1:-1] for slot in _slots(base)}
        namespace["__slots__"] = tuple(name for name in names if name not in inherited)
        for name in names:
            namespace.pop(name, None)
        namespace.pop("__dict__", None)
        namespace.pop("__weakref__", None)
        namespace["__dataclass_fields__"] = fields
        namespace["__dataclass_params__"] = _PARAMS
        namespace.setdefault("__match_args__", init_names)
        namespace.update(_METHODS)
        if not namespace.get("__doc__"):  # as the standard decorator does, without inspect.signature
            namespace["__doc__"] = f"{cls.__name__}({', '.join(init_names)})"
        qualname = cls.__qualname__
        cls = type(cls)(cls.__name__, cls.__bases__, namespace)
        cls.__qualname__ = qualname
        cls.__kvadvise_layout__ = _Layout(cls)
        return cls

    _PARAMS = _params()

    def dataclass(cls=None, /, **options):
        """``@dataclass(frozen=True, slots=True)`` built fast; any other options: the standard decorator."""
        if options != {"frozen": True, "slots": True}:
            return _dc.dataclass(cls, **options) if cls is not None else _dc.dataclass(**options)
        return _frozen if cls is None else _frozen(cls)
