"""The fallback provider: every acquire wins, nothing is coordinated."""

from __future__ import annotations

from leases._contract import AcquireResult, LeaseProvider, is_lease_provider
from leases._validation import check_key, check_owner, check_ttl_ms

__all__ = ["NoopLeaseProvider", "resolve_lease_provider"]


class NoopLeaseProvider:
    """A ``LeaseProvider`` that coordinates nothing.

    Every acquire wins (``owner`` and ``token`` are ``None``), release is inert, renew and
    transfer return ``True``, ``get_lease_owner`` returns ``None``. It keeps single-process
    behaviour when a backend offers no leases. Arguments are still validated, so a program
    that passes bad input fails the same way with every provider.
    """

    is_fallback: bool = True

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        return AcquireResult(acquired=True, owner=None, token=None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_key(key)
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        check_key(key), check_owner(owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(from_owner, "from_owner")
        check_owner(to_owner, "to_owner"), check_ttl_ms(ttl_ms)
        return True


def resolve_lease_provider(obj: object) -> LeaseProvider:
    """Return ``obj`` when it is a lease provider (structurally), else a new ``NoopLeaseProvider``.

    An object may also offer ``get_lease_provider()`` to hand out the provider it wraps
    (a caching or instrumenting wrapper, say); that is consulted first.
    """
    unwrap = getattr(obj, "get_lease_provider", None)
    if callable(unwrap):
        inner = unwrap()
        if is_lease_provider(inner):
            return inner  # type: ignore[no-any-return]
    if is_lease_provider(obj):
        return obj  # type: ignore[return-value]
    return NoopLeaseProvider()
