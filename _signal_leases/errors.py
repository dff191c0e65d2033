"""The error tree of the whole library: one neutral root, one branch per layer.

::

    SignalsError                      root: every error the library raises on purpose
    ├── ClosedError (RuntimeError)    used before ``async with`` entered it, or after close
    ├── BackendError                  the backend failed
    │   ├── BackendUnavailableError (ConnectionError)   connection refused/lost, timeout:
    │   │                                               may work if retried later
    │   ├── BackendPermanentError     auth, ACL, wrong database, script error: retrying
    │   │                             will not help; fix the configuration
    │   └── UnsupportedBackendError (RuntimeError)      wrong async library for the backend
    ├── LeaseError                    the lease layer
    │   └── LeaseNotAcquiredError     held by another owner
    ├── PubSubError                   the pub/sub layer
    └── SignalError                   the signal runtime
        ├── ConfigurationError (ValueError)   parts that cannot work together
        ├── SignalTooLargeError (ValueError)  over the encoded size limit
        ├── UnknownSignalError (LookupError)  no receipt for that signal id
        └── CursorExpiredError (LookupError)  a stream cursor older than retention

``leases``, ``pubsub`` and ``signals`` each export the root, ``ClosedError``, the backend
errors and their own branch.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "ClosedError",
    "ConfigurationError",
    "CursorExpiredError",
    "LeaseError",
    "LeaseNotAcquiredError",
    "PubSubError",
    "SignalError",
    "SignalTooLargeError",
    "SignalsError",
    "UnknownSignalError",
    "UnsupportedBackendError",
]


class SignalsError(Exception):
    """Root of every error this library raises on purpose."""


class ClosedError(SignalsError, RuntimeError):
    """An object was used before ``async with`` entered it, or after it was closed."""


class BackendError(SignalsError):
    """The backend (for example Redis) failed."""


class BackendUnavailableError(BackendError, ConnectionError):
    """The backend could not be reached or did not answer in time.

    Transient: the same call may work later. Never read this as "the lease is free" or "the
    owner is dead".
    """


class BackendPermanentError(BackendError):
    """The backend refused the call for a reason retrying will not fix.

    A wrong password, a missing ACL permission, a wrong database number, a script error. Fix
    the configuration; the library does not retry these.
    """


class UnsupportedBackendError(BackendError, RuntimeError):
    """The backend cannot run under the current async library (redis-py under trio, say)."""


class LeaseError(SignalsError):
    """Base class of the lease layer's errors."""


class LeaseNotAcquiredError(LeaseError):
    """The lease is held by another owner (``owner``, when the backend could tell)."""

    def __init__(self, key: str, owner: str | None) -> None:
        super().__init__(f"lease {key!r} is held by {owner!r}")
        self.key = key
        self.owner = owner


class PubSubError(SignalsError):
    """Base class of the pub/sub layer's errors."""


class SignalError(SignalsError):
    """Base class of the signal runtime's errors."""


class ConfigurationError(SignalError, ValueError):
    """Parts that cannot work together (say, shared leases with a process-local inbox, which
    would lose signals across processes)."""


class SignalTooLargeError(SignalError, ValueError):
    """A signal, result or stream part is larger than the configured limit once encoded.

    Raised before anything is written. ``size`` and ``limit`` are in bytes.
    """

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes encoded, over the limit of {limit} bytes "
            f"(raise max_signal_bytes= if this is intended)"
        )
        self.size = size
        self.limit = limit


class UnknownSignalError(SignalError, LookupError):
    """No receipt is known for that signal id on that thread (never sent, or past retention)."""


class CursorExpiredError(SignalError, LookupError):
    """A stream cursor points before what the stream still retains: parts after it were
    trimmed, so resuming there would silently skip them. Restart from ``after=None``."""
