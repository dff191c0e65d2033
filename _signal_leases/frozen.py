"""A quicker ``__init__`` for frozen, slotted dataclasses: the value types made on every
signal (``Notice``, ``Delivery``, ``Receipt`` and the rest).

A frozen dataclass's own ``__init__`` sets each field with ``object.__setattr__(self, name,
value)``, which looks the name up in the class's dict again for every field: on CPython 3.11
a five-field value costs three times what an unfrozen one does. :func:`quick_init` replaces
it with one that calls each field's slot descriptor directly: the same instance, as frozen as
before (assigning a field still raises ``FrozenInstanceError``), the same parameters and
defaults (``inspect.signature`` shows the dataclass's), default factories and
``__post_init__`` called as the dataclass would.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")

_MISSING = object()
_WARM = 32  # instances made before the quicker __init__ is compiled


def quick_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` the quicker ``__init__`` (see the module
    docstring). A ``TypeError`` for a class it does not fit (not frozen or not slotted, an
    ``InitVar``, a keyword-only field or one left out of ``__init__``).

    The new ``__init__`` is compiled (about 70 µs a class) once the class has made
    ``_WARM`` instances with the dataclass's own, never at import: a process that sends one
    signal and exits makes a few of each type, and pays nothing for it."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init needs a frozen dataclass with slots, got {cls!r}")
    fields: Any = dataclasses.fields  # (cls is a dataclass: checked above)
    for f in fields(cls):
        if not f.init or f.kw_only:
            raise TypeError(f"quick_init: field {f.name!r} of {cls.__name__} is "
                            f"{'keyword-only' if f.kw_only else 'not in __init__'}")
    original: Any = cls.__init__
    if original.__code__.co_argcount != len(fields(cls)) + 1:  # (the dataclass's: InitVars too)
        raise TypeError(f"quick_init: {cls.__name__} has an InitVar")

    made = [0]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # the first instances'
        made[0] += 1
        if made[0] == _WARM:
            _build(cls, original)
        original(self, *args, **kwargs)

    _describe(__init__, cls, original)
    type.__setattr__(cls, "__init__", __init__)
    return cls


def _describe(init: Any, cls: type[Any], original: Any) -> None:
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = original.__doc__
    init.__annotations__ = dict(original.__annotations__)  # (typing.get_type_hints)
    init.__wrapped__ = original  # inspect.signature reads the dataclass's (when asked)


def _build(cls: type[Any], original: Any) -> Any:
    """Compile the quicker ``__init__`` of ``cls`` and put it in place; it."""
    names: dict[str, Any] = {"__qi_missing": _MISSING}
    args: list[str] = []
    body: list[str] = []
    fields: Any = dataclasses.fields
    for i, f in enumerate(fields(cls)):
        slot = next(c.__dict__[f.name] for c in cls.__mro__ if f.name in c.__dict__)
        names[f"__qi_set{i}"] = slot.__set__  # (a subclass's inherited field: its base's)
        if f.default is not dataclasses.MISSING:
            names[f"__qi_default{i}"] = f.default
            args.append(f"{f.name}=__qi_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            names[f"__qi_factory{i}"] = f.default_factory
            args.append(f"{f.name}=__qi_missing")
            body.append(f"    if {f.name} is __qi_missing: {f.name} = __qi_factory{i}()")
        else:
            args.append(f.name)
        body.append(f"    __qi_set{i}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
    exec(source, names)  # our own text, as dataclasses makes its __init__
    init = names["__init__"]
    _describe(init, cls, original)
    type.__setattr__(cls, "__init__", init)
    return init
