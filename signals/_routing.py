"""The runtime's three backend steps, fused in one store call when the store allows it.

``route`` (accept a signal, then claim the thread or notify its owner), ``finish`` (release
the thread when its inbox is empty, else hand the lease to the next run) and ``claim`` (take an
ownerless thread that has pending work). With a :class:`~signals._store.FusedSignalStore`
that ``fuses_with`` the lease provider, each is one atomic call; otherwise the same steps are
made from separate store and lease calls, in an order that never strands a signal: the
generic ``accept`` always indexes the thread, so whatever a race leaves behind, recovery finds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from signals._store import Claim, Notice, Routed, run_runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from leases import HeldLease, LeaseHeartbeat, LeaseProvider
    from signals._model import EntryMode, Signal
    from signals._store import FusedSignalStore, SignalStore

__all__ = ["Backend"]


class Backend:
    """The store and the lease provider of one runtime, and how to combine them."""

    def __init__(
        self,
        store: SignalStore,
        leases: LeaseProvider,
        heartbeat: LeaseHeartbeat | None,
        runtime_id: str,
        new_run_id: Callable[[], str],
    ) -> None:
        self.store = store
        self.leases = leases
        self.heartbeat = heartbeat
        self.runtime_id = runtime_id
        self.new_run_id = new_run_id
        fuses = getattr(store, "fuses_with", None)
        self.fused: FusedSignalStore | None = (
            store if callable(fuses) and fuses(leases) else None  # type: ignore[assignment]
        )

    def _claim(self) -> Claim:
        assert self.heartbeat is not None
        return Claim(
            self.new_run_id(), self.heartbeat.ttl_ms, self.heartbeat.session, self.runtime_id
        )

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: bool, wake_workers: bool
    ) -> tuple[Routed, HeldLease | None]:
        """Accept ``signal``; with ``claim``, take the thread if it is free."""
        if self.fused is not None:
            request = self._claim() if claim else None
            sent_at = anyio.current_time()
            routed = await self.fused.route(
                thread_key, signal, mode, claim=request, sender=self.runtime_id,
                wake_workers=wake_workers,
            )
            if routed.claimed and request is not None:
                return routed, self._adopt(thread_key, request, routed.token, sent_at)
            return routed, None
        accepted = await self.store.accept(thread_key, signal, mode)
        if not accepted.fresh:
            owner = await self.leases.get_lease_owner(thread_key)
            return Routed(False, None, accepted.receipt, owner), None
        if claim:
            held = await self._generic_claim(thread_key)
            if held is not None:
                return Routed(True, accepted.entry_id, None, held.owner, True, held.token), held
        owner = await self.leases.get_lease_owner(thread_key)
        if owner is not None:
            if run_runtime(owner) != self.runtime_id:
                await self.store.notify(run_runtime(owner), Notice("signal", thread_key, owner))
        elif wake_workers:
            await self.store.notify(None, Notice("work", thread_key))
        return Routed(True, accepted.entry_id, None, owner), None

    def _adopt(
        self, thread_key: str, claim: Claim, token: int | None, sent_at: float
    ) -> HeldLease:
        assert self.heartbeat is not None
        return self.heartbeat.adopt(thread_key, claim.owner, token, sent_at, session=claim.session)

    async def _generic_claim(self, thread_key: str) -> HeldLease | None:
        assert self.heartbeat is not None
        # Track first: if this process dies holding the thread, recovery finds it there.
        await self.store.track_threads(self.runtime_id, add=[thread_key])
        held, _ = await self.heartbeat.acquire(thread_key, self.new_run_id())
        if held is None:
            await self.store.track_threads(self.runtime_id, remove=[thread_key])
            return None
        await self.store.unindex(thread_key)
        return held

    async def claim(self, thread_key: str) -> HeldLease | None:
        """Take ``thread_key`` if it has pending work and no live owner (recovery, work
        notices). A thread with no work leaves the pending index; one with a live owner is
        deferred there for a lease TTL (its owner may be dead without anyone else knowing)."""
        if self.fused is not None:
            request = self._claim()
            sent_at = anyio.current_time()
            routed = await self.fused.claim_pending(thread_key, request)
            if routed.claimed:
                return self._adopt(thread_key, request, routed.token, sent_at)
            return None
        if await self.store.pending_count(thread_key) == 0:
            await self.store.unindex(thread_key)
            return None
        if await self.leases.get_lease_owner(thread_key) is not None:
            defer = getattr(self.store, "defer", None)
            if callable(defer):
                assert self.heartbeat is not None
                await defer(thread_key, self.heartbeat.ttl_ms)
            return None
        return await self._generic_claim(thread_key)

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        """Abort ``run_id`` (or the current run) if it holds the thread; the run aborted."""
        if self.fused is None:
            owner = await self.leases.get_lease_owner(thread_key)
            if owner is None or (run_id is not None and run_id != owner):
                return None
            run_id = owner
        return await self.store.abort(thread_key, run_id, reason=reason, clear=clear)

    async def cancel(self, thread_key: str, signal_ids: list[str]) -> list[str]:
        """Withdraw pending signals no live run holds."""
        if self.fused is not None:
            return await self.store.cancel(thread_key, signal_ids)
        owner = await self.leases.get_lease_owner(thread_key)
        return await self.store.cancel(thread_key, signal_ids, in_flight_run=owner)

    async def finish(self, lease: HeldLease) -> HeldLease | None:
        """After a run: release the thread if its inbox is empty (``None``), else hand the
        lease to a new run id and return the new lease (``None`` if the lease was lost)."""
        heartbeat = self.heartbeat
        assert heartbeat is not None
        if self.fused is not None:
            if await self.fused.release_if_idle(lease.key, lease.owner, self.runtime_id):
                heartbeat.forget(lease)
                return None
            return await heartbeat.transfer(lease, self.new_run_id())
        if await self.store.pending_count(lease.key) > 0:
            return await heartbeat.transfer(lease, self.new_run_id())
        await heartbeat.release(lease)
        await self.store.track_threads(self.runtime_id, remove=[lease.key])
        if await self.store.pending_count(lease.key) > 0:
            # A sender appended just before the release (and indexed the thread): take it back.
            return await self.claim(lease.key)
        return None
