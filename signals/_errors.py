"""Errors of the signal runtime (under the shared ``LeaseError`` base)."""

from __future__ import annotations

from leases._errors import LeaseError

__all__ = ["ConfigurationError", "RuntimeClosedError", "SignalsError"]


class SignalsError(LeaseError):
    """Base class of signal-runtime errors."""


class ConfigurationError(SignalsError, ValueError):
    """The runtime was given parts that cannot work together (say, shared leases and a
    process-local inbox, which would lose signals across processes)."""


class RuntimeClosedError(SignalsError, RuntimeError):
    """The runtime was used before ``async with`` entered it, or after it exited."""
