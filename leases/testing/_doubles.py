"""Test doubles of ``leases.testing``: a manual clock and a recording lease provider (import
them from ``leases.testing``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leases._contract import AcquireResult, LeaseProvider

__all__ = ["ManualClock", "RecordingLeaseProvider"]


class ManualClock:
    """A clock for ``InMemoryLeaseProvider(clock=...)`` that moves only when told to.

    Calling it returns the current time in seconds; :meth:`advance` moves it forward.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self.now += seconds


class RecordingLeaseProvider:
    """A lease provider that records every call and forwards it to ``inner``.

    ``calls`` lists ``(method, key, *owners)`` tuples in order: count backend calls in your
    tests, or assert the order of acquire, transfer and release. The optional capabilities
    (``renew_leases``, the session methods) are offered exactly when ``inner`` offers them,
    and recorded too. ``get_lease_provider()`` is deliberately absent, so the recorder is
    what the runtime uses.
    """

    def __init__(self, inner: LeaseProvider) -> None:
        self.inner = inner
        self.calls: list[tuple[str, ...]] = []

    def count(self, method: str) -> int:
        """How many calls of ``method`` were recorded."""
        return sum(1 for call in self.calls if call[0] == method)

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int, **kw: Any) -> AcquireResult:
        self.calls.append(("acquire_lease", key, owner))
        return await self.inner.acquire_lease(key, owner, ttl_ms, **kw)

    async def get_lease_owner(self, key: str) -> str | None:
        self.calls.append(("get_lease_owner", key))
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        self.calls.append(("release_lease", key, owner))
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.calls.append(("renew_lease", key, owner))
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.calls.append(("transfer_lease", key, from_owner, to_owner))
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    def __getattr__(self, name: str) -> Any:
        if name not in _OPTIONAL:
            raise AttributeError(name)
        method = getattr(self.inner, name)  # AttributeError: the inner provider lacks it

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, *(a for a in args if isinstance(a, str))))
            return await method(*args, **kwargs)

        return recorded


_OPTIONAL = frozenset(
    {"renew_leases", "open_lease_session", "renew_lease_session", "close_lease_session",
     "lease_info"}
)
