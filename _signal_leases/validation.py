"""Argument checks for every layer: one function per kind of value, one rule for each.

The rules, everywhere:

* A wrong *type* is a ``TypeError``; a value of the right type out of bounds is a
  ``ValueError``. Both name the argument.
* ``bool`` is never accepted where a number is expected (``True`` is not ``1`` ms).
* Integer bounds are inclusive and explicit (``minimum=1`` unless a zero means something,
  such as "disabled", and then the caller says so).
* Identifiers (thread keys, lease keys and owners, signal ids, topics) are non-empty ``str``
  that encode to UTF-8 (no lone surrogates) and carry no control characters, so they
  round-trip through Redis, logs, HTTP paths and JSON unchanged; at most
  :data:`MAX_IDENTIFIER_LENGTH` characters.

Validate once, at the public entry point; code below it trusts its caller.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection
from typing import TypeVar

__all__ = [
    "MAX_IDENTIFIER_LENGTH",
    "check_choice",
    "check_identifier",
    "check_int",
    "check_optional_int",
    "check_seconds",
    "check_str",
]

#: The longest thread key, lease key, owner or signal id accepted, in characters.
MAX_IDENTIFIER_LENGTH = 1024

T = TypeVar("T")


def check_str(name: str, value: object, *, empty_ok: bool = False) -> str:
    """Return ``value`` if it is a ``str`` (non-empty unless ``empty_ok``)."""
    if type(value) is str and value:
        return value  # (the common case first: every signal checks two)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value and not empty_ok:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def check_identifier(name: str, value: object) -> str:
    """Return ``value`` if it is a valid identifier (see the module rules), else raise."""
    if type(value) is str and 0 < len(value) <= MAX_IDENTIFIER_LENGTH and value.isprintable():
        return value  # (the common case first: every send checks two)
    check_str(name, value)
    assert isinstance(value, str)
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise ValueError(f"{name} is {len(value)} characters long, over {MAX_IDENTIFIER_LENGTH}")
    if not value.isprintable():
        # isprintable() is False for control characters, lone surrogates and other
        # non-printables (a no-break space, say); only the first two are refused.
        for c in value:
            category = unicodedata.category(c)
            if category == "Cs":
                raise ValueError(f"{name} contains a lone surrogate ({c!r}): not valid UTF-8")
            if category == "Cc":
                raise ValueError(f"{name} contains a control character ({c!r})")
    return value


def check_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) with ``minimum <= value <= maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        bound = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_optional_int(
    name: str, value: object, *, minimum: int = 1, maximum: int | None = None
) -> int | None:
    """Like :func:`check_int`, but ``None`` passes through (meaning "no limit" or "default")."""
    if value is None:
        return None
    return check_int(name, value, minimum=minimum, maximum=maximum)


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """Return ``value`` as a finite ``float`` of seconds (``>= 0``, or ``> 0`` if ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "positive" if positive else "non-negative"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return seconds


#: The latest Unix time a signal may name (9999-12-31T23:59:59Z): later ones are no time
#: at all to the stores (Redis keeps milliseconds in 64 bits, Python's datetime ends there).
MAX_UNIX_TIME = 253_402_300_799.0


def check_unix_time(name: str, value: object) -> float:
    """Return ``value`` as Unix time in seconds (``>= 0`` and at most :data:`MAX_UNIX_TIME`)."""
    seconds = check_seconds(name, value)
    if seconds > MAX_UNIX_TIME:
        raise ValueError(f"{name} must be Unix time in seconds up to {MAX_UNIX_TIME:.0f} "
                         f"(the year 9999), got {value}")
    return seconds


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """Return ``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)!r}, got {value!r}")
    return value
