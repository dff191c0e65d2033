"""``KitStore``: everything the runtime needs, derived from a core, the leases and a pub/sub.

One per runtime. The twelve methods of the :class:`~signals.kit.SignalCore` carry the
inbox; for the rest, each optional capability the core has (:mod:`signals.kit._capabilities`)
is used, and each one it lacks is derived (:mod:`signals.kit._derived`):

* routing a signal, claiming an ownerless thread and finishing a run: one fused call each
  when the core ``fuses_with`` the lease provider; otherwise the same steps from the core's
  calls and the lease provider's, in an order that never strands a signal (an accepted
  signal is always indexed, and a claimed thread stays indexed until its lease would expire,
  so whatever a crash leaves behind, recovery finds);
* notices on the core's channel, or over the pub/sub;
* the registry in the core, or presence leases;
* output streams in the core (lifecycle parts written in the same step), or over the pub/sub
  (the runtime then writes the lifecycle parts itself, after each step);
* ``abort``: fused, or a lease check and an ``abort`` notice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from _signal_leases.aio import loop_time, unix_now
from signals.kit._capabilities import (
    Claim,
    Follower,
    FusedRouting,
    Notice,
    PartIn,
    Routed,
    RuntimeInfo,
    acked_data,
    has,
    received_data,
)
from signals.kit._core import NO_LIMITS, Accepted, Limits, RunRef, Taken, run_runtime
from signals.kit._derived import LeaseRegistry, PubSubNotices, PubSubStreams

if TYPE_CHECKING:
    from leases import HeldLease, LeaseHeartbeat, LeaseProvider
    from pubsub import PubSub
    from signals._model import EntryMode, Signal
    from signals.kit._core import Ack, SignalCore

__all__ = ["KitStore"]

_STREAMS = ("emit", "stream_read", "stream_tail", "follower")
_NOTICES = ("notify", "listen")
_REGISTRY = ("register_runtime", "refresh_runtime", "unregister_runtime", "track_threads",
             "runtimes", "runtime_threads")
_FUSED = ("fuses_with", "route", "claim", "release_if_idle", "abort")
_INTERRUPT: dict[str, bool] = {"interrupt": True}  # passed to a fused route only when true
_PLAIN: dict[str, bool] = {}


class KitStore:
    """The runtime's view of its backend (see the module docstring)."""

    def __init__(
        self, core: SignalCore, leases: LeaseProvider, pubsub: PubSub, *, prefix: str,
        runtime_id: str, heartbeat: LeaseHeartbeat | None, new_run_id: Callable[[], str],
        on_later: Callable[[float], None] | None = None,
    ) -> None:
        self.core = core
        self.on_later = on_later  # a claimed thread's signals come due later, at this time
        self.leases = leases
        self.runtime_id = runtime_id
        self.heartbeat = heartbeat
        self.new_run_id = new_run_id
        c: Any = core
        self.fused: FusedRouting | None = (
            c if has(core, *_FUSED) and c.fuses_with(leases) else None
        )
        self.notices: Any = c if has(core, *_NOTICES) else PubSubNotices(pubsub, prefix)
        self.native_streams = has(core, *_STREAMS)
        self.streams: Any = c if self.native_streams else PubSubStreams(pubsub, prefix)
        self.registry: Any = c if has(core, *_REGISTRY) else LeaseRegistry(leases)
        # Settling a run's acks: the core's own call when its streams are native (the parts
        # are written in the same step: nothing to add, and one coroutine fewer per ack).
        self.settle: Callable[..., Awaitable[bool]] = (
            core.settle if self.native_streams else self._settle_and_emit)

    async def inbox_pending_count(self, thread_key: str) -> int:
        """Signals of ``thread_key`` accepted and not yet acknowledged (one ``describe``)."""
        return (await self.core.describe([thread_key]))[thread_key].pending

    # -- routing ----------------------------------------------------------------------------

    def _claim(self) -> Claim:
        assert self.heartbeat is not None
        return Claim(self.new_run_id(), self.heartbeat.ttl_ms, self.heartbeat.session,
                     self.runtime_id)

    def _adopt(self, key: str, claim: Claim, token: int | None, sent_at: float) -> HeldLease:
        assert self.heartbeat is not None
        return self.heartbeat.adopt(key, claim.owner, token, sent_at, session=claim.session)

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: bool,
        wake_workers: bool, limits: Limits = NO_LIMITS, interrupt: bool = False,
    ) -> tuple[Routed, HeldLease | None]:
        """Accept ``signal``; with ``claim``, take the thread if it is free and the signal
        ready; with ``interrupt``, abort a live owner instead of telling it (see
        :meth:`FusedRouting.route`)."""
        if self.fused is not None:
            request = self._claim() if claim else None
            sent_at = loop_time() if request is not None else 0.0  # when the claim was sent
            routed = await self.fused.route(
                thread_key, signal, mode, claim=request, sender=self.runtime_id,
                wake_workers=wake_workers, limits=limits,
                **(_INTERRUPT if interrupt else _PLAIN),  # (a fused route made before it)
            )
            if routed.claimed and request is not None:
                return routed, self._adopt(thread_key, request, routed.token, sent_at)
            return routed, None
        accepted = await self.core.accept(thread_key, signal, mode, limits=limits)
        if not accepted.fresh or accepted.due_at is not None:
            owner = (await self.leases.get_lease_owner(thread_key)
                     if accepted.outcome != "unchanged" else None)
            return Routed(accepted, owner), None
        await self._parts(thread_key, accepted)
        if claim:
            held = await self._claim_generic(thread_key)
            if held is not None:
                return Routed(accepted, held.owner, True, held.token), held
        owner = await self.leases.get_lease_owner(thread_key)
        if owner is not None and interrupt:
            await self.abort(thread_key, owner, reason="interrupt", clear=False)
        elif owner is not None:
            if run_runtime(owner) != self.runtime_id:
                await self.notices.notify(run_runtime(owner), Notice("signal", thread_key, owner))
        elif wake_workers:
            await self.notices.notify(None, Notice("work", thread_key))
        return Routed(accepted, owner), None

    async def _parts(self, thread_key: str, accepted: Accepted) -> None:
        """Without native streams: the parts of the entries a step took out of the inbox."""
        if self.native_streams:
            return
        parts = [PartIn("signal.superseded", "", s) for s in accepted.superseded]
        parts += [PartIn("signal.dropped", "", s) for s in accepted.dropped]
        if parts:
            await self.streams.emit(thread_key, parts)

    async def _claim_generic(self, thread_key: str) -> HeldLease | None:
        assert self.heartbeat is not None
        await self.registry.track_threads(self.runtime_id, add=[thread_key])
        held, _ = await self.heartbeat.acquire(thread_key, self.new_run_id())
        if held is None:
            await self.registry.track_threads(self.runtime_id, remove=[thread_key])
            return None
        # Stay indexed while owned: if this process dies, recovery looks again after a TTL.
        await self.core.look_at(thread_key, unix_now() + self.heartbeat.ttl_ms / 1000)
        return held

    async def claim(self, thread_key: str) -> HeldLease | None:
        """Take ``thread_key`` if it has work and no live owner (recovery, work notices). A
        live owner keeps it: the thread is looked at again when its lease would expire."""
        if self.fused is not None:
            request = self._claim()
            sent_at = loop_time()
            claimed = await self.fused.claim(thread_key, request)
            if claimed.claimed:
                return self._adopt(thread_key, request, claimed.token, sent_at)
            if claimed.next_due is not None and self.on_later is not None:
                self.on_later(claimed.next_due)
            return None
        assert self.heartbeat is not None
        state = (await self.core.describe([thread_key]))[thread_key]
        if state.pending == 0 or state.paused:
            await self.core.look_at(thread_key, unix_now())  # leaves the index
            return None
        owner = await self.leases.get_lease_owner(thread_key)
        if owner is not None:
            await self.core.look_at(thread_key, unix_now() + self.heartbeat.ttl_ms / 1000)
            if state.ready and run_runtime(owner) != self.runtime_id:
                await self.notices.notify(run_runtime(owner), Notice("signal", thread_key, owner))
            return None
        if not state.ready:  # only signals not due yet (a debounce may have moved them)
            if state.next_due is not None:
                await self.core.look_at(thread_key, state.next_due)
                if self.on_later is not None:
                    self.on_later(state.next_due)
            return None
        return await self._claim_generic(thread_key)

    async def finish(self, lease: HeldLease, *, more: bool) -> HeldLease | None:
        """After a run: release the thread when no work is ready (``None``), else hand the
        lease to a new run id and return the new lease (``None`` if the lease was lost).
        ``more``: the run's last take left ready work (or a queued signal)."""
        heartbeat = self.heartbeat
        assert heartbeat is not None
        if self.fused is not None:
            if await self.fused.release_if_idle(lease.key, lease.owner, self.runtime_id):
                heartbeat.forget(lease)
                return None
            return await heartbeat.transfer(lease, self.new_run_id())
        if more:
            return await heartbeat.transfer(lease, self.new_run_id())
        await heartbeat.release(lease)
        await self.registry.track_threads(self.runtime_id, remove=[lease.key])
        state = (await self.core.describe([lease.key]))[lease.key]
        if state.ready and not state.paused:
            # A sender appended just before the release (and indexed the thread): take it back.
            return await self.claim(lease.key)
        return None

    # -- runs -------------------------------------------------------------------------------

    async def take(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (), max_attempts: int,
        first: bool,
    ) -> Taken:
        taken = await self.core.take(thread_key, run, acks=acks, max_attempts=max_attempts,
                                     first=first)
        if not self.native_streams and not taken.fenced:
            parts = [PartIn("signal.acked", run.run_id, a.signal_id,
                            acked_data(a.result))
                     for a in acks]
            parts += [PartIn("signal.received", run.run_id, e.signal.id,
                             received_data(e.attempts)) for e in taken.entries]
            parts += [PartIn("signal.dead_lettered", run.run_id, s) for s in taken.dead]
            if parts:
                await self.streams.emit(thread_key, parts)
        return taken

    async def _settle_and_emit(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
        failed: Sequence[str] = (), returned: Sequence[str] = (), error: str | None = None,
    ) -> bool:
        """``settle`` without native streams: the core's, then the ``signal.acked`` parts."""
        ok = await self.core.settle(thread_key, run, acks=acks, failed=failed,
                                    returned=returned, error=error)
        if ok and acks:
            await self.streams.emit(thread_key, [
                PartIn("signal.acked", run.run_id, a.signal_id,
                       acked_data(a.result)) for a in acks
            ])
        return ok

    # -- control ----------------------------------------------------------------------------

    async def abort(self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
                    ) -> str | None:
        """Abort ``run_id`` (or the current run) if it holds the thread; the run aborted."""
        if self.fused is not None:
            return await self.fused.abort(thread_key, run_id, reason=reason, clear=clear)
        owner = await self.leases.get_lease_owner(thread_key)
        if owner is None or (run_id is not None and run_id != owner):
            return None
        if clear:
            await self.withdraw(thread_key, None, held=True)
        await self.notices.notify(run_runtime(owner), Notice("abort", thread_key, owner, reason))
        return owner

    async def withdraw(self, thread_key: str, signal_ids: Sequence[str] | None, *,
                       held: bool = False) -> list[str]:
        removed = await self.core.withdraw(thread_key, signal_ids, held=held)
        if removed and not self.native_streams:
            await self.streams.emit(thread_key, [PartIn("signal.cancelled", "", s)
                                                 for s in removed])
        return removed

    # -- the rest, as the capabilities or their derivations give it ---------------------------

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        await self.notices.notify(runtime_id, notice)

    def listen(self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
               ) -> AbstractAsyncContextManager[None]:
        listen: Callable[..., AbstractAsyncContextManager[None]] = self.notices.listen
        return listen(runtime_id, handler, worker=worker)

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        cursors: list[str] = await self.streams.emit(thread_key, parts)
        return cursors

    def follower(self) -> AbstractAsyncContextManager[Follower]:
        follower: Callable[[], AbstractAsyncContextManager[Follower]] = self.streams.follower
        return follower()

    async def register(self, info: RuntimeInfo, ttl_ms: int) -> None:
        await self.registry.register_runtime(info, ttl_ms)
