"""The ``LeaseProvider`` contract, its result type, and structural detection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["LEASE_METHODS", "AcquireResult", "LeaseProvider", "is_lease_provider"]

LEASE_METHODS: tuple[str, ...] = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


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


@runtime_checkable
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

    Do not test for this with ``isinstance`` in library code: use :func:`is_lease_provider`.
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
