"""Two small things every signal and event needs, made cheap: compact JSON text and a random id.

* :func:`compact_json` is ``json.dumps(value, allow_nan=False, separators=(",", ":"))``
  (ASCII). ``json.dumps`` with non-default arguments builds a new encoder at every call; this
  one is built once (1.3 µs instead of 2.9 for a signal here). It raises what ``json.dumps``
  raises: ``TypeError`` for a value that is not JSON, ``ValueError`` for NaN or infinity and
  for a circular reference. The C encoder keeps no state between calls, so threads may share
  it (the SQL cores encode in worker threads).
* :func:`random_id` is ``uuid.uuid4().hex`` (32 hex digits, version 4, RFC 4122 variant)
  without building a ``UUID`` object: 0.6 µs instead of 2.
"""

from __future__ import annotations

import json
import json.encoder
import os
from typing import Any

__all__ = ["compact_json", "random_id"]


def _refuse(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # (not in typeshed)
_ENCODE = (
    None if _C_ENCODER is None else
    _C_ENCODER(None, _refuse, json.encoder.encode_basestring_ascii, None, ":", ",", False,
               False, False)
)


def compact_json(value: object) -> str:
    """``value`` as compact ASCII JSON (see the module docstring)."""
    if _ENCODE is None:  # no C accelerator (another Python implementation)
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    try:
        return "".join(_ENCODE(value, 0))
    except RecursionError:  # (no marker table: a circular value recurses until it fails)
        raise ValueError("Circular reference detected") from None


def random_id() -> str:
    """A random UUID (version 4) as 32 lowercase hex digits, like ``uuid.uuid4().hex``."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()
