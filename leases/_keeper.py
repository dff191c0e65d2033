"""``LeaseKeeper``: hold one lease, renew it, and cancel the guarded work when it is lost."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio import AsyncContextManagerMixin

from _signal_leases.aio import loop_time, owned_task_group
from _signal_leases.errors import LeaseNotAcquiredError
from _signal_leases.logs import get_logger
from leases._held import safety_margin_ms
from leases._validation import check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from _signal_leases.logs import Logger
    from leases._contract import LeaseProvider

__all__ = ["LeaseKeeper", "safety_margin_ms"]

logger = get_logger("leases")

#: Upper bound of the best-effort release at exit, in seconds.
RELEASE_TIMEOUT_S = 1.0


class LeaseKeeper(AsyncContextManagerMixin):
    """Hold the lease on ``key`` for ``owner`` while the ``async with`` body runs.

    On enter it acquires the lease (idempotent: entering with a lease the owner already holds
    keeps its token) or raises :class:`LeaseNotAcquiredError`. A heartbeat task renews every
    ``renew_interval_ms`` (default ``ttl_ms // 3``). The body runs in a cancel scope whose
    deadline is the *local* expiry estimate: the monotonic time the last successful acquire
    or renew was **sent**, plus ``ttl_ms``, minus :func:`safety_margin_ms`. So the body is
    cancelled before any other owner can be granted the lease.

    Loss: a renew returning ``False`` (reason ``"renew rejected"``), or the deadline passing
    while renews keep failing (reason ``"renew deadline passed"``). A renew that raises is
    logged as ``lease.renew_failed`` and retried every ``min(renew_interval, ttl/10)`` until
    the deadline; it is never read as loss before then. On loss the keeper sets ``lost`` and
    ``lost_reason``, logs ``lease.lost`` (warning) and cancels the body. That cancellation is
    swallowed at exit, so check ``keeper.lost`` after the block. Other exceptions propagate.

    At exit, unless the lease was lost or ``release_on_exit`` is false, the lease is released
    in a shielded scope bounded by :data:`RELEASE_TIMEOUT_S`; release errors are logged
    (``lease.release_failed``), not raised. A keeper is single-use.
    """

    def __init__(
        self,
        provider: LeaseProvider,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        renew_interval_ms: int | None = None,
        release_on_exit: bool = True,
    ) -> None:
        self.provider = provider
        self.key: str = check_key(key)
        self.owner: str = check_owner(owner)
        self.ttl_ms: int = check_ttl_ms(ttl_ms)
        if renew_interval_ms is None:
            renew_interval_ms = max(1, ttl_ms // 3)
        else:
            check_ttl_ms(renew_interval_ms)
            if renew_interval_ms >= ttl_ms:
                raise ValueError(
                    f"renew_interval_ms ({renew_interval_ms}) must be shorter than "
                    f"ttl_ms ({ttl_ms}), or the lease expires between renewals"
                )
        self.renew_interval_ms: int = renew_interval_ms
        self.release_on_exit = release_on_exit
        self.token: int | None = None
        self.lost: bool = False
        self.lost_reason: str | None = None
        self._margin_s = safety_margin_ms(ttl_ms) / 1000
        self._retry_s = max(0.001, min(renew_interval_ms, ttl_ms / 10) / 1000)
        self._log: Logger = logger.bind(key=key, owner=owner)
        self._scope: anyio.CancelScope | None = None
        self._entered = False
        self._body_active = False
        self._acquired_at = 0.0

    @property
    def deadline(self) -> float | None:
        """The local expiry estimate (``loop_time()`` scale), ``None`` when not held."""
        return None if self._scope is None else self._scope.deadline

    def _deadline_after(self, sent_at: float) -> float:
        return sent_at + self.ttl_ms / 1000 - self._margin_s

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[LeaseKeeper]:
        if self._entered:
            raise RuntimeError("a LeaseKeeper can be entered only once")
        self._entered = True
        sent_at = loop_time()
        result = await self.provider.acquire_lease(self.key, self.owner, self.ttl_ms)
        if not result.acquired:
            raise LeaseNotAcquiredError(self.key, result.owner)
        self.token = result.token
        self._acquired_at = sent_at
        self._log = self._log.bind(token=result.token)
        self._log.debug("lease.acquired", ttl_ms=self.ttl_ms)
        scope = self._scope = anyio.CancelScope(deadline=self._deadline_after(sent_at))
        try:
            async with owned_task_group() as tg:
                tg.start_soon(self._heartbeat, name=f"lease heartbeat {self.key!r}")
                with scope:  # swallows its own cancellation: the lease was lost
                    self._body_active = True
                    try:
                        yield self
                    finally:
                        self._body_active = False
        finally:
            if not self.lost and (scope.cancel_called or loop_time() >= scope.deadline):
                # The deadline fired, or the body ran past it without a checkpoint.
                self._mark_lost("renew deadline passed")
            if self.release_on_exit and not self.lost:
                await self._release()

    def _mark_lost(self, reason: str) -> None:
        if self.lost:
            return
        self.lost, self.lost_reason = True, reason
        self._log.warning("lease.lost", reason=reason)
        if self._scope is not None and self._body_active:
            self._scope.cancel(reason=f"lease {self.key!r} lost: {reason}")

    async def _heartbeat(self) -> None:
        scope = self._scope
        assert scope is not None
        next_at = self._acquired_at + self.renew_interval_ms / 1000
        while True:
            await anyio.sleep_until(min(next_at, scope.deadline))
            sent_at = loop_time()
            remaining = scope.deadline - sent_at
            if remaining <= 0:
                self._mark_lost("renew deadline passed")
                return
            ok: bool | None = None
            error: str = "timed out"
            try:
                with anyio.move_on_after(remaining):
                    ok = bool(await self.provider.renew_lease(self.key, self.owner, self.ttl_ms))
            except Exception as exc:  # a transient backend error: retry until the deadline
                error = repr(exc)
            if ok is None:
                self._log.warning(
                    "lease.renew_failed", error=error, remaining_ms=round(remaining * 1000)
                )
            if ok is True and scope.cancel_called:
                self._mark_lost("renew deadline passed")  # the body was already cancelled
                return
            if ok is True:
                scope.deadline = self._deadline_after(sent_at)
                next_at = sent_at + self.renew_interval_ms / 1000
            elif ok is False:
                self._mark_lost("renew rejected")
                return
            else:
                next_at = loop_time() + self._retry_s

    async def _release(self) -> None:
        with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True) as bound:
            try:
                await self.provider.release_lease(self.key, self.owner)
            except Exception as exc:
                self._log.warning("lease.release_failed", error=repr(exc))
                return
        if bound.cancelled_caught:
            self._log.warning("lease.release_failed", error="timed out")
        else:
            self._log.debug("lease.released")
