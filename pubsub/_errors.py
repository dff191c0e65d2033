"""The pub/sub layer's part of the library's error tree (defined in ``_signal_leases.errors``).

``PubSubClosedError`` is the same class as :class:`ClosedError`: the name is kept from earlier
releases, so ``except PubSubClosedError`` and ``except ClosedError`` catch the same errors.
"""

from __future__ import annotations

from _signal_leases.errors import (
    BackendError,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    PubSubError,
    SignalsError,
    UnsupportedBackendError,
)

__all__ = [
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "ClosedError",
    "PubSubClosedError",
    "PubSubError",
    "SignalsError",
    "UnsupportedBackendError",
]

PubSubClosedError = ClosedError
