"""The lease layer's part of the library's error tree (defined in ``_signal_leases.errors``)."""

from __future__ import annotations

from _signal_leases.errors import (
    BackendError,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    LeaseError,
    LeaseNotAcquiredError,
    SignalsError,
    UnsupportedBackendError,
)

__all__ = [
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "ClosedError",
    "LeaseError",
    "LeaseNotAcquiredError",
    "SignalsError",
    "UnsupportedBackendError",
]
