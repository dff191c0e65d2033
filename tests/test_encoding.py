"""The shared encoding helpers (``_signal_leases.encoding``) against the standard library."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from _signal_leases.encoding import compact_json, json_scalar, random_id
from signals import Signal

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_compact_json_is_json_dumps_compact_and_ascii(value: Any) -> None:
    assert compact_json(value) == json.dumps(value, allow_nan=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [math.nan, math.inf, [-math.inf], {"a": math.nan}])
def test_compact_json_refuses_nan_and_infinity(value: Any) -> None:
    with pytest.raises(ValueError):
        compact_json(value)


@pytest.mark.parametrize("value", [object(), {1j: 1}, [b"bytes"], {"a": {1, 2}}])
def test_compact_json_refuses_what_is_not_json_as_json_dumps_does(value: Any) -> None:
    with pytest.raises(TypeError) as ours:
        compact_json(value)
    with pytest.raises(TypeError) as theirs:
        json.dumps(value)
    assert str(ours.value) == str(theirs.value)


def test_compact_json_refuses_a_circular_value() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        compact_json(loop)


class _Number(enum.IntEnum):
    ONE = 1


class _Text(str):
    pass


_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text()
            | st.sampled_from([_Number.ONE, _Text("x"), object(), b"b", 1 << 14000]))
_ANY = _SCALARS | _JSON


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "text", encode(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@given(_ANY)
@example(True)
@example(False)
@example(None)
@example(-0.0)
@example(math.nan)
@example(-math.inf)
def test_json_scalar_is_compact_json(value: Any) -> None:
    """The same text, or the same error, for any value: scalars of the exact types written
    directly, the rest (subclasses, containers, what is not JSON) through the encoder."""
    assert _outcome(json_scalar, value) == _outcome(compact_json, value)


@given(payload=_ANY, kind=st.text(min_size=1), sid=st.text(min_size=1, max_size=40),
       created_at=st.floats(allow_nan=False, allow_infinity=False) | st.integers())
def test_a_plain_signals_text_is_its_dict_encoded(payload: Any, kind: str, sid: str,
                                                   created_at: float) -> None:
    """A plain signal's text is written field by field: the encoder's text of its dict, and
    the same error for a payload that is not JSON."""
    try:
        signal = Signal(payload, type=kind, id=sid, created_at=created_at)
    except ValueError as exc:
        assert "signal id" in str(exc) or "signal payload" in str(exc)  # (an id or payload
        return  # refused before: a control character, a float that is not finite)
    except TypeError as exc:
        assert "signal payload" in str(exc)
        with pytest.raises((TypeError, ValueError)):
            compact_json(payload)
        return
    assert signal.encode() == compact_json(signal.to_dict())
    assert json.loads(signal.encode()) == json.loads(compact_json(
        {"id": sid, "type": kind, "payload": payload, "created_at": created_at}))


_EVERY_OPTION: dict[str, Any] = {
    "lane": "chat", "merge": "coalesce", "cache_key": "c", "not_before": 2e9,
    "expires_at": 2e9 + 10, "debounce_ms": 5, "max_wait_ms": 50,
    "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
}


@given(payload=_JSON, priority=st.integers(-3, 3), lane=st.none() | st.just("chat"),
       every=st.booleans(), attempt=st.integers(1, 5), mode=st.sampled_from(["deliver", "queue"]))
def test_a_signal_decodes_to_itself(payload: Any, priority: int, lane: str | None, every: bool,
                                    attempt: int, mode: Any) -> None:
    """``Signal.from_dict`` of a signal's stored text gives the same signal, field by field
    (its arguments are positional: each lands in its own field), with the delivery fields it
    was given."""
    options = _EVERY_OPTION if every else {"lane": lane}
    signal = Signal(payload, type="t", priority=priority, **options)
    text = signal.encode()
    back = Signal.from_dict(json.loads(text), attempt=attempt, mode=mode, encoded=text)
    want = signal.evolve(attempt=attempt, mode=mode)
    for f in dataclasses.fields(Signal):
        assert getattr(back, f.name) == getattr(want, f.name), f.name
    assert back.encode() is text


def test_random_id_is_a_uuid4_hex_and_never_repeats() -> None:
    ids = [random_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:200]:
        parsed = uuid.UUID(hex=value)
        assert (parsed.hex, parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)
