"""The shared encoding helpers (``_signal_leases.encoding``) against the standard library."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _signal_leases.encoding import compact_json, random_id

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


def test_random_id_is_a_uuid4_hex_and_never_repeats() -> None:
    ids = [random_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:200]:
        parsed = uuid.UUID(hex=value)
        assert (parsed.hex, parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)
