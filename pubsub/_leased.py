"""``LeasedPubSub``: a pub/sub that is also its own :class:`~leases.LeaseProvider`.

Every first-party pub/sub inherits it: the five lease methods (and, where the provider has
them, batched renewal and lease sessions) go to the provider ``get_lease_provider()`` returns,
so ``pubsub.acquire_lease(...)`` works as the design card shows and
``leases.is_lease_provider(pubsub)`` is true. The runtime (and
:func:`leases.resolve_lease_provider`) still unwraps it with ``get_lease_provider()``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from leases import AcquireResult, LeaseProvider

__all__ = ["LeasedPubSub"]


class LeasedPubSub:
    """The lease half of a first-party pub/sub (see the module docstring)."""

    @abstractmethod
    def get_lease_provider(self) -> LeaseProvider:
        """The lease provider this pub/sub is (and delegates to)."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        return await self.get_lease_provider().acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.get_lease_provider().get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.get_lease_provider().release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.get_lease_provider().renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int
                             ) -> bool:
        return await self.get_lease_provider().transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def renew_leases(self, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]:
        """Batched renewal, when the provider has it (else one renewal per lease)."""
        provider: Any = self.get_lease_provider()
        batch = getattr(provider, "renew_leases", None)
        if batch is not None:
            kept: set[str] = await batch(items, ttl_ms)
            return kept
        return {key for key, owner in items if await provider.renew_lease(key, owner, ttl_ms)}
