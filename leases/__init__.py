"""Leases: exclusive, expiring, fenced ownership of string keys.

The contract is :class:`LeaseProvider` (five async methods), detected structurally with
:func:`is_lease_provider`. Backends: :class:`NoopLeaseProvider` (fallback),
:class:`InMemoryLeaseProvider`, :class:`RedisLeaseProvider`. :class:`LeaseKeeper` holds one
lease, renews it, and cancels the guarded work when the lease is lost.
"""

from ._contract import AcquireResult, LeaseProvider, is_lease_provider
from ._errors import (
    BackendUnavailableError,
    LeaseError,
    LeaseNotAcquiredError,
    UnsupportedBackendError,
)
from ._info import LeaseInfo
from ._keeper import LeaseKeeper
from ._memory import InMemoryLeaseProvider
from ._noop import NoopLeaseProvider, resolve_lease_provider
from ._redis import RedisLeaseProvider

__all__ = [
    "AcquireResult",
    "BackendUnavailableError",
    "InMemoryLeaseProvider",
    "LeaseError",
    "LeaseInfo",
    "LeaseKeeper",
    "LeaseNotAcquiredError",
    "LeaseProvider",
    "NoopLeaseProvider",
    "RedisLeaseProvider",
    "UnsupportedBackendError",
    "is_lease_provider",
    "resolve_lease_provider",
]
