"""The ``LeaseProvider`` contract, its result type, and structural detection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from _signal_leases.frozen import quick_init

__all__ = [
    "LEASE_METHODS",
    "AcquireResult",
    "BatchRenewer",
    "LeaseProvider",
    "LeaseSessionProvider",
    "is_lease_provider",
    "supports_batch_renewal",
    "supports_lease_sessions",
]

LEASE_METHODS: tuple[str, ...] = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


@quick_init
@dataclass(frozen=True, slots=True)
class AcquireResult:
    """Outcome of :meth:`LeaseProvider.acquire_lease`.

    ``acquired``: the caller holds the lease now.
    ``owner``: the holder (the caller when acquired, else the current holder if known).
    ``token``: the fencing token of the caller's grant; strictly greater than every earlier
    grant's token for the same key. ``None`` when not acquired or when the backend does not
    fence (the no-op provider).
    """

    acquired: bool
    owner: str | None
    token: int | None = None


class LeaseProvider(Protocol):
    """Exclusive, expiring ownership of string keys.

    Semantics every implementation follows:

    * ``acquire_lease`` is atomic. The same owner re-acquiring refreshes the TTL and keeps
      its token (idempotent, so a retried call is harmless).
    * ``release_lease`` by a non-owner does nothing; the owner check and the delete are atomic.
    * ``renew_lease`` returns ``False`` once the lease is lost and never resurrects it.
    * ``transfer_lease`` hands the lease to ``to_owner`` with a fresh TTL and a new token in one
      atomic step (the key is never free); ``False`` when ``from_owner`` no longer holds it.
    * Every new grant (acquire by a new owner, each transfer) gets a token strictly greater than
      all earlier tokens for that key, across expiry and release.
    * Bad input (empty key or owner, ``ttl_ms`` not a positive ``int``) raises
      ``ValueError``/``TypeError``.

    Detect it with :func:`is_lease_provider` (structural: no base class or registration).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult: ...

    async def get_lease_owner(self, key: str) -> str | None: ...

    async def release_lease(self, key: str, owner: str) -> None: ...

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...

    async def transfer_lease(
        self, key: str, from_owner: str, to_owner: str, ttl_ms: int
    ) -> bool: ...


def is_lease_provider(obj: object) -> bool:
    """True when ``obj`` has all five lease methods and each is callable.

    Structural on purpose: it works across duplicated installs and for backends that never
    heard of this package.
    """
    return all(callable(getattr(obj, name, None)) for name in LEASE_METHODS)


class BatchRenewer(Protocol):
    """Optional capability: renew many leases in one round trip.

    ``renew_leases`` renews each ``(key, owner)`` pair as :meth:`LeaseProvider.renew_lease`
    would and returns the keys still held (renewed). A provider without it is renewed one
    lease at a time, with bounded concurrency.
    """

    async def renew_leases(self, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]: ...


class LeaseSessionProvider(LeaseProvider, Protocol):
    """Optional capability: leases that live as long as a *session* (etcd's model).

    A session is opened with a TTL and kept alive by :meth:`renew_lease_session`; every lease
    acquired with ``session=`` lives exactly as long as its session, so one renewal keeps
    any number of leases. When the session expires or is closed, all its leases are free at
    once. ``open_lease_session`` returns ``None`` when the backend cannot offer sessions in its
    current configuration (a Redis Cluster, say); the caller then renews leases per key.

    ``acquire_lease`` takes ``session=``; a transfer keeps the lease in its session.
    ``acquire_lease`` under an expired session returns ``acquired=False`` with
    ``owner=None``. Session ids come from the provider.
    """

    async def open_lease_session(self, ttl_ms: int) -> str | None: ...

    async def renew_lease_session(self, session: str, ttl_ms: int) -> bool: ...

    async def close_lease_session(self, session: str) -> None: ...

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, session: str | None = None
    ) -> AcquireResult: ...


def supports_batch_renewal(obj: object) -> bool:
    """True when ``obj`` has a callable ``renew_leases`` (see :class:`BatchRenewer`)."""
    return callable(getattr(obj, "renew_leases", None))


def supports_lease_sessions(obj: object) -> bool:
    """True when ``obj`` has the three session methods (see :class:`LeaseSessionProvider`)."""
    return all(
        callable(getattr(obj, name, None))
        for name in ("open_lease_session", "renew_lease_session", "close_lease_session")
    )
