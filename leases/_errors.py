"""The flat error set shared by the lease, pub/sub and signal layers."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "LeaseError",
    "LeaseNotAcquiredError",
    "UnsupportedBackendError",
]


class LeaseError(Exception):
    """Base class of every error this library raises on purpose."""


class LeaseNotAcquiredError(LeaseError):
    """The lease is held by another owner.

    ``owner`` is the current holder when the backend could tell it.
    """

    def __init__(self, key: str, owner: str | None) -> None:
        super().__init__(f"lease {key!r} is held by {owner!r}")
        self.key = key
        self.owner = owner


class BackendUnavailableError(LeaseError, ConnectionError):
    """The backend (for example Redis) could not be reached or did not answer in time.

    A caller must never read this as "the lease is free" or "the owner is dead".
    """


class UnsupportedBackendError(LeaseError, RuntimeError):
    """The backend cannot run under the current async library (e.g. redis-py under trio)."""
