"""``quick_init`` (``_signal_leases.frozen``): a frozen dataclass with the quicker
``__init__`` is built as the dataclass's own would build it, and stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import typing
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import leases
import pubsub
import signals
import signals.kit
from _signal_leases import frozen
from _signal_leases.frozen import quick_init

_IDS = itertools.count()


def _twins() -> tuple[type[Any], type[Any], list[Any]]:
    calls: list[Any] = []

    def make() -> type[Any]:
        @dataclass(frozen=True, slots=True)
        class Value:
            a: int
            b: str = "b"
            c: list[int] = field(default_factory=lambda: [next(_IDS)])
            d: tuple[int, ...] = ()

            def __post_init__(self) -> None:
                calls.append((self.a, self.b))
                if self.a < 0:
                    raise ValueError("a must not be negative")
        return Value
    return make(), quick_init(make()), calls


@given(a=st.integers(-2, 5), b=st.none() | st.text(max_size=3),
       c=st.none() | st.lists(st.integers(), max_size=2),
       d=st.none() | st.tuples(st.integers()), keywords=st.booleans())
def test_a_quick_init_builds_what_the_dataclass_builds(
        a: int, b: str | None, c: list[int] | None, d: tuple[int, ...] | None,
        keywords: bool) -> None:
    plain, quick, calls = _twins()
    passed = {k: v for k, v in {"b": b, "c": c, "d": d}.items() if v is not None}
    if not keywords:  # positionally: up to the first one not passed
        passed = {k: passed[k] for k in itertools.takewhile(passed.__contains__, "bcd")}
    outcomes: list[Any] = []
    for _ in range(frozen._WARM + 1):  # (past the instances made with the dataclass's own)
        quick(0)
    calls.clear()
    for cls in (plain, quick):
        try:
            value = cls(a=a, **passed) if keywords else cls(a, *passed.values())
        except ValueError as exc:
            outcomes.append(str(exc))
            continue
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if "c" not in passed and isinstance(fields["c"], list) and len(fields["c"]) == 1:
            fields["c"] = "factory"  # the factory's: a new list each time
        outcomes.append(fields)
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.a = 1
    assert outcomes[0] == outcomes[1]
    assert calls[::2] == calls[1::2]  # __post_init__ ran once for each, with the fields set
    assert inspect.signature(quick) == inspect.signature(plain)
    assert typing.get_type_hints(quick.__init__) == typing.get_type_hints(plain.__init__)
    assert "__qi_set0" in quick.__dict__["__init__"].__globals__  # (the quicker one ran)


def test_the_type_hints_of_init_are_the_dataclass_s_before_and_after_the_warm_up() -> None:
    """``typing.get_type_hints`` of the ``__init__`` (what documentation tools and checkers
    read) names the fields' types, whichever ``__init__`` is in place."""
    plain, quick, _ = _twins()
    before = typing.get_type_hints(quick.__init__)
    for n in range(frozen._WARM + 1):
        quick(n)
    assert before == typing.get_type_hints(quick.__init__) == typing.get_type_hints(
        plain.__init__)
    assert typing.get_type_hints(leases.LeaseInfo.__init__)["ttl_ms_remaining"] == int | None


def test_quick_init_refuses_what_it_does_not_fit() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: InitVar[int] = 0

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    for cls in (Mutable, KeywordOnly, WithInitVar, NoSlots):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


def test_the_library_s_frozen_values_have_it() -> None:
    """Every frozen, slotted dataclass the packages export is made with the quicker
    ``__init__`` (the ones made per signal would cost a third more without it)."""
    found = []
    for module in (leases, pubsub, signals, signals.kit):
        for name in module.__all__:
            cls = getattr(module, name)
            params = getattr(cls, "__dataclass_params__", None)
            if isinstance(cls, type) and params is not None and params.frozen \
                    and "__slots__" in cls.__dict__:
                found.append(cls)
                init: Any = cls.__dict__["__init__"]
                assert init.__module__ == cls.__module__
                assert hasattr(init, "__wrapped__"), cls  # (the dataclass's own, wrapped)
    assert {"Signal", "Delivery", "Receipt", "Notice", "InboxEntry", "Routed"} <= {
        c.__name__ for c in found}
