"""In-process lease backend: a pure synchronous core (:class:`LeaseTable`) and an anyio shell.

The core holds every state transition and takes the current time as an argument, so tests
(including the Hypothesis state machine) can drive it directly and fast. The async shell
(:class:`InMemoryLeaseProvider`) validates input, reads its clock and adds a checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from _signal_leases.aio import checkpoint, loop_time
from leases._contract import AcquireResult
from leases._info import LeaseInfo
from leases._validation import check_acquire, check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["InMemoryLeaseProvider", "LeaseTable"]


@dataclass(slots=True)
class _Entry:
    owner: str
    expires_at: float  # per-key expiry; ignored for a session lease
    token: int
    session: str | None = None


class LeaseTable:
    """The lease state machine, synchronous and clock-free.

    State: ``key -> (owner, expires_at, token)`` plus a per-key fencing counter that survives
    expiry and release. ``now`` is monotonic seconds; an entry is live while
    ``now < expires_at``. Expired entries count as absent: they never renew or transfer.
    Arguments are not validated here (the async shell does that).
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._fence: dict[str, int] = {}
        self._sessions: dict[str, float] = {}  # session -> expires_at
        self._session_seq = 0

    def _session_live(self, session: str, now: float) -> bool:
        expires_at = self._sessions.get(session)
        if expires_at is not None and now >= expires_at:
            del self._sessions[session]
            return False
        return expires_at is not None

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        alive = (
            self._session_live(entry.session, now)
            if entry.session is not None
            else now < entry.expires_at
        )
        if not alive:
            del self._entries[key]
            return None
        return entry

    def _refresh(self, entry: _Entry, ttl_ms: int, now: float) -> None:
        if entry.session is None:
            entry.expires_at = now + ttl_ms / 1000

    def _grant(
        self, key: str, owner: str, ttl_ms: int, now: float, session: str | None = None
    ) -> int:
        token = self._fence.get(key, 0) + 1
        self._fence[key] = token
        self._entries[key] = _Entry(owner, now + ttl_ms / 1000, token, session)
        return token

    def acquire(
        self, key: str, owner: str, ttl_ms: int, now: float, session: str | None = None
    ) -> AcquireResult:
        """Grant when free (new token), refresh for the same owner (same token), else deny.

        With ``session``, a new grant lives as long as that session; an expired session gets
        ``acquired=False`` with no owner.
        """
        entry = self._live(key, now)
        if entry is None:
            if session is not None and not self._session_live(session, now):
                return AcquireResult(False, None, None)
            return AcquireResult(True, owner, self._grant(key, owner, ttl_ms, now, session))
        if entry.owner == owner:
            self._refresh(entry, ttl_ms, now)
            return AcquireResult(True, owner, entry.token)
        return AcquireResult(False, entry.owner, None)

    def open_session(self, ttl_ms: int, now: float) -> str:
        """A new session alive for ``ttl_ms``."""
        self._session_seq += 1
        session = f"s{self._session_seq}"
        self._sessions[session] = now + ttl_ms / 1000
        return session

    def renew_session(self, session: str, ttl_ms: int, now: float) -> bool:
        """Extend a live session; ``False`` once it has expired (never resurrects it)."""
        if not self._session_live(session, now):
            return False
        self._sessions[session] = now + ttl_ms / 1000
        return True

    def close_session(self, session: str) -> None:
        """End a session: its leases read as free from now on."""
        self._sessions.pop(session, None)

    def owner(self, key: str, now: float) -> str | None:
        """The live owner, or ``None``."""
        entry = self._live(key, now)
        return None if entry is None else entry.owner

    def release(self, key: str, owner: str, now: float) -> bool:
        """Delete the lease if ``owner`` holds it; ``True`` when something was released."""
        entry = self._live(key, now)
        if entry is None or entry.owner != owner:
            return False
        del self._entries[key]
        return True

    def renew(self, key: str, owner: str, ttl_ms: int, now: float) -> bool:
        """Reset the TTL if ``owner`` holds a live lease; never resurrects an expired one."""
        entry = self._live(key, now)
        if entry is None or entry.owner != owner:
            return False
        self._refresh(entry, ttl_ms, now)
        return True

    def transfer(self, key: str, from_owner: str, to_owner: str, ttl_ms: int, now: float) -> bool:
        """Hand a live lease from ``from_owner`` to ``to_owner`` with a fresh TTL and new token.

        When ``to_owner`` already holds it (a replayed transfer, or ``from_owner == to_owner``)
        the TTL is refreshed, the token kept, and the result is ``True``: the same rule as the
        Redis backend, whose scripts must be idempotent under replay.
        """
        entry = self._live(key, now)
        if entry is None:
            return False
        if entry.owner == to_owner:
            self._refresh(entry, ttl_ms, now)
            return True
        if entry.owner != from_owner:
            return False
        self._grant(key, to_owner, ttl_ms, now, entry.session)
        return True

    def info(self, key: str, now: float) -> LeaseInfo | None:
        """A snapshot of the live lease, or ``None``."""
        entry = self._live(key, now)
        if entry is None:
            return None
        expires_at = self._sessions[entry.session] if entry.session else entry.expires_at
        remaining = max(1, math.ceil((expires_at - now) * 1000))
        return LeaseInfo(key, entry.owner, remaining, entry.token)

    def holder(self, key: str, now: float) -> tuple[str, int] | None:
        """``(owner, token)`` of the live lease, or ``None`` (:meth:`info` without the
        snapshot: what the signal store asks on every routed signal)."""
        entry = self._live(key, now)
        return None if entry is None else (entry.owner, entry.token)

    def last_token(self, key: str) -> int:
        """The highest token ever granted for ``key`` (0 when never granted)."""
        return self._fence.get(key, 0)

    def keys(self, now: float) -> list[str]:
        """Keys with a live lease, sorted."""
        return sorted(k for k in list(self._entries) if self._live(k, now) is not None)


class InMemoryLeaseProvider:
    """A ``LeaseProvider`` for one process, pure anyio (asyncio and trio).

    ``clock`` returns monotonic seconds and defaults to the event loop's clock (the value of
    :func:`anyio.current_time`, so a trio ``MockClock`` moves lease time too); pass your own to
    drive expiry in tests.
    Each call is atomic: the state change happens after one checkpoint, with no await
    inside it. Leases are local to this object; use it from one event loop (not thread-safe).
    """

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._clock: Callable[[], float] = clock if clock is not None else loop_time
        self.table = LeaseTable()

    @property
    def clock(self) -> Callable[[], float]:
        """The clock lease times are read from."""
        return self._clock

    def _now(self) -> float:
        return self._clock()

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, session: str | None = None
    ) -> AcquireResult:
        check_acquire(key, owner, ttl_ms, session)
        await checkpoint()
        return self.table.acquire(key, owner, ttl_ms, self._now(), session)

    async def get_lease_owner(self, key: str) -> str | None:
        check_key(key)
        await checkpoint()
        return self.table.owner(key, self._now())

    async def release_lease(self, key: str, owner: str) -> None:
        check_key(key), check_owner(owner)
        await checkpoint()
        self.table.release(key, owner, self._now())

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        await checkpoint()
        return self.table.renew(key, owner, ttl_ms, self._now())

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(from_owner, "from_owner")
        check_owner(to_owner, "to_owner"), check_ttl_ms(ttl_ms)
        await checkpoint()
        return self.table.transfer(key, from_owner, to_owner, ttl_ms, self._now())

    async def renew_leases(self, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]:
        """Renew many leases at once; returns the keys still held (see ``BatchRenewer``)."""
        check_ttl_ms(ttl_ms)
        items = [(check_key(k), check_owner(o)) for k, o in items]
        await checkpoint()
        now = self._now()
        return {k for k, o in items if self.table.renew(k, o, ttl_ms, now)}

    async def open_lease_session(self, ttl_ms: int) -> str | None:
        """Open a lease session alive for ``ttl_ms`` (see ``LeaseSessionProvider``)."""
        check_ttl_ms(ttl_ms)
        await checkpoint()
        return self.table.open_session(ttl_ms, self._now())

    async def renew_lease_session(self, session: str, ttl_ms: int) -> bool:
        """Keep ``session`` and its leases alive for ``ttl_ms`` more; ``False`` once expired."""
        check_owner(session, "session"), check_ttl_ms(ttl_ms)
        await checkpoint()
        return self.table.renew_session(session, ttl_ms, self._now())

    async def close_lease_session(self, session: str) -> None:
        """End ``session``: its leases are free at once."""
        check_owner(session, "session")
        await checkpoint()
        self.table.close_session(session)

    async def lease_info(self, key: str) -> LeaseInfo | None:
        """Owner, remaining TTL and token of the live lease on ``key``, or ``None``."""
        check_key(key)
        await checkpoint()
        return self.table.info(key, self._now())

    async def aclose(self) -> None:
        """Nothing to close; present so every provider can be used the same way."""

    async def __aenter__(self) -> InMemoryLeaseProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
