"""Errors of the pub/sub layer (a small tree under the shared ``LeaseError`` base)."""

from __future__ import annotations

from leases._errors import BackendUnavailableError, LeaseError, UnsupportedBackendError

__all__ = [
    "BackendUnavailableError",
    "PubSubClosedError",
    "PubSubError",
    "UnsupportedBackendError",
]


class PubSubError(LeaseError):
    """Base class of pub/sub errors."""


class PubSubClosedError(PubSubError):
    """The pub/sub was used before ``async with`` entered it, or after it was closed."""
