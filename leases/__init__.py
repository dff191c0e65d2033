"""Leases: exclusive, expiring, fenced ownership of string keys.

The contract is :class:`LeaseProvider` (five async methods), detected structurally with
:func:`is_lease_provider`; optional capabilities are lease sessions
(:class:`LeaseSessionProvider`) and batched renewal (:class:`BatchRenewer`). Backends:
:class:`NoopLeaseProvider` (fallback), :class:`InMemoryLeaseProvider`,
:class:`RedisLeaseProvider`, :class:`SQLiteLeaseProvider`. :class:`LeaseKeeper` holds one lease
and cancels the guarded work when it is lost; :class:`LeaseHeartbeat` does the same for any
number of leases of one process with one renewal per interval. The errors are the library's one
tree (``_signal_leases.errors``), re-exported here.
"""

from typing import TYPE_CHECKING

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
from _signal_leases.lazy import lazy_exports
from leases._contract import (
    AcquireResult,
    BatchRenewer,
    LeaseProvider,
    LeaseSessionProvider,
    is_lease_provider,
    supports_batch_renewal,
    supports_lease_sessions,
)
from leases._heartbeat import HeldLease, LeaseHeartbeat, safety_margin_ms
from leases._info import LeaseInfo
from leases._keeper import LeaseKeeper
from leases._noop import NoopLeaseProvider, resolve_lease_provider

if TYPE_CHECKING:
    from leases._backends.memory import InMemoryLeaseProvider
    from leases._backends.postgres import PostgresLeaseProvider
    from leases._backends.redis.provider import RedisLeaseProvider
    from leases._backends.sql import SQLLeaseProvider
    from leases._backends.sqlite import SQLiteLeaseProvider

# The backends are imported on first use (docs/performance.md: a sender's start-up).
__getattr__, __dir__ = lazy_exports(__name__, {
    "InMemoryLeaseProvider": "leases._backends.memory",
    "PostgresLeaseProvider": "leases._backends.postgres",
    "RedisLeaseProvider": "leases._backends.redis.provider",
    "SQLLeaseProvider": "leases._backends.sql",
    "SQLiteLeaseProvider": "leases._backends.sqlite",
})

__all__ = [
    "AcquireResult",
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "BatchRenewer",
    "ClosedError",
    "HeldLease",
    "InMemoryLeaseProvider",
    "LeaseError",
    "LeaseHeartbeat",
    "LeaseInfo",
    "LeaseKeeper",
    "LeaseNotAcquiredError",
    "LeaseProvider",
    "LeaseSessionProvider",
    "NoopLeaseProvider",
    "PostgresLeaseProvider",
    "RedisLeaseProvider",
    "SQLLeaseProvider",
    "SQLiteLeaseProvider",
    "SignalsError",
    "UnsupportedBackendError",
    "is_lease_provider",
    "resolve_lease_provider",
    "safety_margin_ms",
    "supports_batch_renewal",
    "supports_lease_sessions",
]
