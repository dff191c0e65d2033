"""``LeaseHeartbeat``: one keeper per process renews every lease the process holds.

The cost of keeping K leases does not grow with K where the provider allows it:

* **Sessions** (``open_lease_session``, see ``LeaseSessionProvider``): every lease is taken in
  one session and the heartbeat renews only the session: one call per interval for any K.
* **Batched renewal** (``renew_leases``): one call per interval renews all K (the provider
  chunks it, by slot on a Cluster).
* Otherwise: ``renew_lease`` per lease, at most ``concurrency`` at a time, still from this one
  task.

Loss is decided locally, by deadline: a lease is good until the monotonic time its last
successful acquire or renewal was *sent*, plus the TTL, minus :func:`safety_margin_ms`. When
that passes (renewals failing, Redis slow or gone) or a renewal is refused, the lease is marked
lost and the work it guards is cancelled: before the server could grant it to anyone else. A
renewal that fails (connection error, busy pool, timeout) is retried until the deadline and
is never read as a loss before it.

One timer serves all leases: the heartbeat task sleeps until the next renewal or the earliest
deadline, whichever comes first. A guarded body is a plain cancel scope (no task, no timer of
its own), so holding a lease costs a few hundred bytes.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio import AsyncContextManagerMixin

from _signal_leases.aio import loop_time, owned_task_group
from _signal_leases.errors import ClosedError
from _signal_leases.logs import get_logger
from _signal_leases.validation import check_int
from leases._contract import AcquireResult, supports_batch_renewal, supports_lease_sessions
from leases._held import HeldLease, LeaseBook, safety_margin_ms
from leases._validation import check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from _signal_leases.logs import Logger
    from leases._contract import LeaseProvider

__all__ = ["HeldLease", "LeaseHeartbeat", "safety_margin_ms"]

logger = get_logger("leases")

#: Upper bound of the best-effort release or session close at exit, in seconds.
RELEASE_TIMEOUT_S = 1.0


class LeaseHeartbeat(AsyncContextManagerMixin):
    """Hold any number of leases of ``provider`` for this process and keep them alive.

    Use as ``async with LeaseHeartbeat(provider, ttl_ms) as heartbeat``. Then
    :meth:`acquire` (or :meth:`adopt` for a lease acquired elsewhere, e.g. inside a script
    that also appended a signal), :meth:`release` and :meth:`transfer`. ``sessions=False``
    renews per key even when the provider offers sessions.

    ``on_lost(lease)`` is called (synchronously) when a lease is lost, after its guards were
    cancelled. At exit the session is closed (every lease in it freed at once) or, without a
    session, every held lease is released; both best-effort and bounded by one second.
    """

    def __init__(
        self,
        provider: LeaseProvider,
        ttl_ms: int,
        *,
        renew_interval_ms: int | None = None,
        concurrency: int = 32,
        sessions: bool = True,
        on_lost: Callable[[HeldLease], None] | None = None,
    ) -> None:
        self.provider = provider
        self.ttl_ms = check_ttl_ms(ttl_ms)
        if renew_interval_ms is None:
            renew_interval_ms = max(1, ttl_ms // 3)
        check_int("renew_interval_ms", renew_interval_ms, maximum=ttl_ms - 1 if ttl_ms > 1 else 1)
        self.renew_interval_ms = renew_interval_ms
        self.concurrency = check_int("concurrency", concurrency)
        self._use_sessions = bool(sessions) and supports_lease_sessions(provider)
        self._batch = supports_batch_renewal(provider)
        self._on_lost = on_lost
        self.session: str | None = None
        self._book = LeaseBook()
        self._held = self._book.held
        self._margin_s = safety_margin_ms(ttl_ms) / 1000
        self._retry_s = max(0.001, min(renew_interval_ms, ttl_ms / 10) / 1000)
        self._next_renew = 0.0
        self._wakeup = anyio.Event()
        self._open = False
        self._log: Logger = logger.bind()

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[LeaseHeartbeat]:
        if self._use_sessions:
            await self._open_session()
        self._next_renew = loop_time() + self.renew_interval_ms / 1000
        self._open = True
        try:
            async with owned_task_group() as tg:
                tg.start_soon(self._loop, name="lease heartbeat")
                yield self
        finally:
            self._open = False
            await self._give_up_all()

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: str) -> HeldLease | None:
        """The lease on ``key`` this heartbeat holds, or ``None``."""
        return self._held.get(key)

    @property
    def session_deadline(self) -> float:
        """The local expiry estimate of the session (``-inf`` without one)."""
        return self._book.session_deadline

    @property
    def mode(self) -> str:
        """How leases are renewed: ``"session"``, ``"batch"`` or ``"per-lease"``."""
        if self.session is not None:
            return "session"
        return "batch" if self._batch else "per-lease"

    # -- holding ---------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._open:
            raise ClosedError("enter the heartbeat first: `async with LeaseHeartbeat(...)`")

    def _deadline_after(self, sent_at: float) -> float:
        return sent_at + self.ttl_ms / 1000 - self._margin_s

    async def acquire(self, key: str, owner: str) -> tuple[HeldLease | None, AcquireResult]:
        """Acquire ``key`` for ``owner`` (in the session, if any) and keep it alive.

        Returns the held lease (``None`` when another owner holds it) and the provider's
        result. Re-acquiring a lease this heartbeat holds returns the same :class:`HeldLease`.
        """
        check_key(key), check_owner(owner)
        self._require_open()
        for _ in range(2):
            session = self.session
            sent_at = loop_time()
            if session is not None:
                result = await self.provider.acquire_lease(  # type: ignore[call-arg]
                    key, owner, self.ttl_ms, session=session
                )
                if not result.acquired and result.owner is None and session == self.session:
                    self._session_lost("session expired")  # the server says so: believe it
                    await self._open_session()
                    continue
            else:
                result = await self.provider.acquire_lease(key, owner, self.ttl_ms)
            if not result.acquired:
                return None, result
            return self.adopt(key, owner, result.token, sent_at, session=session), result
        return None, AcquireResult(False, None, None)

    def adopt(
        self,
        key: str,
        owner: str,
        token: int | None,
        sent_at: float,
        *,
        session: str | None = None,
    ) -> HeldLease:
        """Keep alive a lease acquired elsewhere (sent at ``sent_at``, in ``session`` if any)."""
        self._require_open()
        current = self._held.get(key)
        if current is not None and current.owner == owner and not current.lost:
            return current
        if session is not None and session != self.session:
            deadline = -math.inf  # a session that was lost meanwhile: the lease is gone
        elif session is not None:
            deadline = self._book.session_deadline
        else:
            deadline = self._deadline_after(sent_at)
        lease = HeldLease(self._book, key, owner, token, deadline, in_session=session is not None)
        self._held[key] = lease
        if deadline == -math.inf:
            self._lose(lease, "session expired")
        self._wakeup.set()
        return lease

    def forget(self, lease: HeldLease) -> None:
        """Stop renewing ``lease`` without touching the backend (it was released elsewhere)."""
        if self._held.get(lease.key) is lease:
            del self._held[lease.key]

    async def release(self, lease: HeldLease) -> None:
        """Stop renewing ``lease`` and release it."""
        self.forget(lease)
        if not lease.lost:
            await self.provider.release_lease(lease.key, lease.owner)

    async def transfer(self, lease: HeldLease, to_owner: str) -> HeldLease | None:
        """Hand ``lease`` to ``to_owner`` (same process, new token) without a gap.

        Returns the new lease, or ``None`` when ``lease`` was no longer held (the old lease is
        then marked lost).
        """
        check_owner(to_owner, "to_owner")
        sent_at = loop_time()
        ok = await self.provider.transfer_lease(lease.key, lease.owner, to_owner, self.ttl_ms)
        self.forget(lease)
        if not ok:
            self._lose(lease, "transfer refused")
            return None
        session = self.session
        if session is not None:
            result = await self.provider.acquire_lease(  # type: ignore[call-arg]
                lease.key, to_owner, self.ttl_ms, session=session
            )
        else:
            result = await self.provider.acquire_lease(lease.key, to_owner, self.ttl_ms)
        if not result.acquired:
            return None
        return self.adopt(lease.key, to_owner, result.token, sent_at, session=session)

    # -- renewing --------------------------------------------------------------------------

    def lose(self, lease: HeldLease, reason: str) -> None:
        """Mark ``lease`` lost (found taken over by other means) and cancel what it guards."""
        self._lose(lease, reason)

    def _lose(self, lease: HeldLease, reason: str) -> None:
        self.forget(lease)
        if lease.lost:
            return
        self._log.warning("lease.lost", key=lease.key, owner=lease.owner, token=lease.token,
                          reason=reason)
        lease._mark_lost(reason)
        if self._on_lost is not None:
            self._on_lost(lease)

    def _session_lost(self, reason: str) -> None:
        self.session = None
        self._book.session_deadline = -math.inf
        for lease in list(self._held.values()):
            self._lose(lease, reason)

    async def _open_session(self) -> None:
        sent_at = loop_time()
        session = await self.provider.open_lease_session(self.ttl_ms)  # type: ignore[attr-defined]
        if session is None:  # not available in this configuration: renew per key
            self._use_sessions = False
            return
        self.session = session
        self._book.session_deadline = self._deadline_after(sent_at)

    def _earliest_deadline(self) -> float:
        if self.session is not None:
            return self._book.session_deadline
        return min((lease.deadline for lease in self._held.values()), default=math.inf)

    def _expire_overdue(self, now: float) -> None:
        if self.session is not None:
            if now >= self._book.session_deadline:
                self._session_lost("renew deadline passed")
            return
        for lease in [lease for lease in self._held.values() if now >= lease.deadline]:
            self._lose(lease, "renew deadline passed")

    async def _loop(self) -> None:
        while True:
            wake_at = min(self._next_renew, self._earliest_deadline())
            self._wakeup = anyio.Event()
            with anyio.move_on_at(wake_at):
                await self._wakeup.wait()
            now = loop_time()
            self._expire_overdue(now)
            if now < self._next_renew:
                continue
            ok = await self._renew_all()
            now = loop_time()
            self._next_renew = now + (self.renew_interval_ms / 1000 if ok else self._retry_s)

    async def _renew_all(self) -> bool:
        """One renewal round; ``False`` when it failed and should be retried soon."""
        if self._use_sessions and self.session is None:
            try:
                await self._open_session()
            except Exception as exc:
                self._log.warning("lease.session_open_failed", error=repr(exc))
                return False
            return True
        if self.session is not None:
            return await self._renew_session(self.session)
        if not self._held:
            return True
        if self._batch:
            return await self._renew_batch(list(self._held.values()))
        return await self._renew_each(list(self._held.values()))

    async def _renew_session(self, session: str) -> bool:
        sent_at = loop_time()
        ok: bool | None = None
        with anyio.move_on_at(self._book.session_deadline):
            try:
                ok = await self.provider.renew_lease_session(  # type: ignore[attr-defined]
                    session, self.ttl_ms
                )
            except Exception as exc:
                self._log.warning("lease.renew_failed", session=session, error=repr(exc))
                return False
        if session != self.session:
            return True
        if ok is None:
            self._expire_overdue(loop_time())
            return False
        if not ok:
            self._session_lost("session expired")
            return False
        self._book.session_deadline = self._deadline_after(sent_at)
        return True

    async def _renew_batch(self, leases: list[HeldLease]) -> bool:
        sent_at = loop_time()
        kept: set[str] | None = None
        with anyio.move_on_at(min(lease.deadline for lease in leases)):
            try:
                kept = await self.provider.renew_leases(  # type: ignore[attr-defined]
                    [(lease.key, lease.owner) for lease in leases], self.ttl_ms
                )
            except Exception as exc:
                self._log.warning("lease.renew_failed", leases=len(leases), error=repr(exc))
        if kept is None:
            return False
        deadline = self._deadline_after(sent_at)
        for lease in leases:
            if self._held.get(lease.key) is not lease:
                continue  # released or transferred meanwhile
            if lease.key in kept:
                lease.deadline = max(lease.deadline, deadline)
            else:
                self._lose(lease, "renew rejected")
        return True

    async def _renew_each(self, leases: list[HeldLease]) -> bool:
        limiter = anyio.Semaphore(self.concurrency)
        failed = False

        async def renew(lease: HeldLease) -> None:
            nonlocal failed
            async with limiter:
                if self._held.get(lease.key) is not lease:
                    return
                sent_at = loop_time()
                ok: bool | None = None
                with anyio.move_on_at(lease.deadline):
                    try:
                        ok = await self.provider.renew_lease(lease.key, lease.owner, self.ttl_ms)
                    except Exception as exc:
                        self._log.warning("lease.renew_failed", key=lease.key, error=repr(exc))
            if self._held.get(lease.key) is not lease:
                return
            if ok is True:
                lease.deadline = max(lease.deadline, self._deadline_after(sent_at))
            elif ok is False:
                self._lose(lease, "renew rejected")
            else:
                failed = True

        async with anyio.create_task_group() as tg:
            for lease in leases:
                tg.start_soon(renew, lease)
        return not failed

    async def _give_up_all(self) -> None:
        held = list(self._held.values())
        self._held.clear()
        with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
            try:
                if self.session is not None:
                    session, self.session = self.session, None
                    await self.provider.close_lease_session(session)  # type: ignore[attr-defined]
                    return
                for lease in held:
                    if not lease.lost:
                        await self.provider.release_lease(lease.key, lease.owner)
            except Exception as exc:
                self._log.warning("lease.release_failed", error=repr(exc))
