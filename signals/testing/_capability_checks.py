"""The conformance kits of the optional capabilities: each skips when the core lacks it."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from _signal_leases.errors import CursorExpiredError
from signals._model import Signal
from signals.kit._capabilities import Claim, Notice, PartIn, RuntimeInfo, has
from signals.kit._core import Ack, RunRef
from signals.testing._fixtures import ALL, Fixtures, ids, new_name

__all__ = [
    "FusedRoutingConformance",
    "NoticeChannelConformance",
    "OutputStreamsConformance",
    "RuntimeRegistryConformance",
]

_STREAMS = ("emit", "stream_read", "stream_tail", "follower")
_FUSED = ("fuses_with", "route", "claim", "release_if_idle", "abort")


@pytest.mark.anyio
class OutputStreamsConformance(Fixtures):
    """:class:`~signals.kit.OutputStreams`: parts in order, exact cursors, lifecycle parts."""

    async def test_parts_come_back_in_order_and_resume_from_every_cursor(self, core: Any
                                                                        ) -> None:
        self.need(core, *_STREAMS)
        thread = self.thread()
        cursors = await core.emit(thread, [PartIn("part", "r/1", None, str(n)) for n in range(5)])
        parts = await core.stream_read(thread)
        assert [p.data for p in parts] == [0, 1, 2, 3, 4]
        assert [p.cursor for p in parts] == cursors
        assert await core.stream_tail(thread) == cursors[-1]
        for n, cursor in enumerate(cursors):
            assert [p.data for p in await core.stream_read(thread, after=cursor)] == list(
                range(n + 1, 5))
        assert [p.data for p in await core.stream_read(thread, limit=2)] == [0, 1]

    async def test_the_inbox_writes_lifecycle_parts(self, core: Any) -> None:
        self.need(core, *_STREAMS)
        thread, run = self.thread(), RunRef("r/1", 1)
        await self.accept_all(core, thread, [Signal(id="a"), Signal(id="b"), Signal(id="c")])
        [a] = (await self.take(core, thread, run)).entries
        await core.settle(thread, run, acks=[Ack(a.entry_id, "a", '{"n":1}')])
        await core.withdraw(thread, ["b"])
        kinds = [(p.kind, p.signal_id) for p in await core.stream_read(thread, limit=ALL)]
        assert kinds[:3] == [("signal.received", "a"), ("signal.acked", "a"),
                             ("signal.cancelled", "b")]

    async def test_a_trimmed_cursor_is_refused_not_skipped(self, small_core: Any) -> None:
        self.need(small_core, *_STREAMS)
        thread = new_name("t")
        cursors = await small_core.emit(thread, [PartIn("part", "r/1", None, str(n))
                                                 for n in range(8)])
        with pytest.raises(CursorExpiredError):
            await small_core.stream_read(thread, after=cursors[0])
        assert [p.data for p in await small_core.stream_read(thread)] == [3, 4, 5, 6, 7]

    async def test_the_follower_hands_new_parts_to_waiters(self, core: Any) -> None:
        self.need(core, *_STREAMS)
        thread = self.thread()
        [first] = await core.emit(thread, [PartIn("part", "r/1", None, "1")])
        got: list[list[Any]] = []
        async with core.follower() as follower:

            async def wait(after: str | None) -> None:
                got.append([p.data for p in await follower.wait(thread, after)])

            assert [p.data for p in await follower.wait(thread, None)] == [1]
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(wait, first)
                await anyio.sleep(0.05)
                await core.emit(thread, [PartIn("part", "r/1", None, "2")])
        assert got == [[2], [2], [2]]


@pytest.mark.anyio
class NoticeChannelConformance(Fixtures):
    """:class:`~signals.kit.NoticeChannel`: to one runtime, to every worker, resync first."""

    async def test_notices_reach_their_runtime_and_the_workers(self, core: Any) -> None:
        self.need(core, "notify", "listen")
        me, other = new_name("rt"), new_name("rt")
        mine: list[Notice] = []
        theirs: list[Notice] = []
        async with core.listen(me, mine.append, worker=True), \
                core.listen(other, theirs.append, worker=False):
            await core.notify(me, Notice("signal", "t", f"{me}/1"))
            await core.notify(None, Notice("work", "w"))
            with anyio.fail_after(5):
                while len(mine) < 3:  # noqa: ASYNC110 (a list another task fills)
                    await anyio.sleep(0.01)
        # resync first; the two notices go over two topics: no order between them
        assert mine[0].kind == "resync"
        assert sorted(n.kind for n in mine[1:]) == ["signal", "work"]
        signal = next(n for n in mine if n.kind == "signal")
        assert signal.thread_key == "t" and signal.run_id == f"{me}/1"
        assert [n.kind for n in theirs] == ["resync"]  # not a worker: no work notices


@pytest.mark.anyio
class RuntimeRegistryConformance(Fixtures):
    """:class:`~signals.kit.RuntimeRegistry`: presence with a TTL, and the threads owned."""

    async def test_a_runtime_is_alive_while_refreshed(self, core: Any) -> None:
        self.need(core, "register_runtime", "refresh_runtime", "unregister_runtime",
                  "runtimes", "track_threads", "runtime_threads")
        rid = new_name("rt")
        await core.register_runtime(RuntimeInfo(rid, "host", 42, 1.0, True),
                                    self.presence_ttl_ms)
        [info] = [r for r in await core.runtimes() if r.runtime_id == rid]
        assert (info.host, info.pid, info.worker, info.alive) == ("host", 42, True, True)
        assert await core.refresh_runtime(rid, self.presence_ttl_ms)
        await self.advance(core, 3 * self.presence_ttl_ms)
        assert not await core.refresh_runtime(rid, self.presence_ttl_ms)
        await core.unregister_runtime(rid)
        assert rid not in [r.runtime_id for r in await core.runtimes() if r.alive]


@pytest.mark.anyio
class FusedRoutingConformance(Fixtures):
    """:class:`~signals.kit.FusedRouting` with the ``leases`` it fuses with."""

    def fused(self, core: Any, leases: Any) -> None:
        if leases is None or not has(core, *_FUSED) or not core.fuses_with(leases):
            pytest.skip("this core offers no fused calls with these leases")

    @staticmethod
    def claim(runtime: str = "rt") -> Claim:
        return Claim(f"{runtime}/{new_name('run')}", 10_000, None, runtime)

    async def test_route_claims_a_free_thread(self, core: Any, leases: Any) -> None:
        self.fused(core, leases)
        thread, claim = self.thread(), self.claim()
        routed = await core.route(thread, Signal(id="s"), "deliver", claim=claim,
                                  sender="rt", wake_workers=True)
        assert routed.accepted.fresh and routed.claimed and routed.token is not None
        assert await leases.get_lease_owner(thread) == claim.owner
        again = await core.route(thread, Signal(id="s"), "deliver", claim=self.claim(),
                                 sender="rt", wake_workers=True)
        assert again.accepted.outcome == "duplicate" and not again.claimed
        await leases.release_lease(thread, claim.owner)

    async def route_to_owner(self, core: Any, signal_id: str, kind: str, **extra: Any
                             ) -> tuple[str, Claim, Any, list[Notice]]:
        """A thread owned by a run of ``owner-rt`` (its first signal ``first``), then
        ``signal_id`` routed to it from another runtime, until ``owner-rt`` hears a ``kind``
        notice: ``(thread, owner's claim, routed, the notices heard)``."""
        self.need(core, "listen")
        thread, owner = self.thread(), self.claim("owner-rt")
        await core.route(thread, Signal(id="first"), "deliver", claim=owner, sender="x",
                         wake_workers=False)
        notices: list[Notice] = []
        async with core.listen("owner-rt", notices.append, worker=False):
            routed = await core.route(thread, Signal(id=signal_id), "deliver", claim=None,
                                      sender="other-rt", wake_workers=True, **extra)
            with anyio.fail_after(5):
                while not any(n.kind == kind for n in notices):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
        return thread, owner, routed, notices

    async def test_route_carries_to_the_owner_and_notifies_it(self, core: Any,
                                                               leases: Any) -> None:
        self.fused(core, leases)
        thread, owner, routed, notices = await self.route_to_owner(core, "next", "signal")
        assert routed.owner == owner.owner and routed.carried and not routed.claimed
        [notice] = [n for n in notices if n.kind == "signal"]
        assert notice.entry is not None and notice.entry.signal.id == "next"
        await leases.release_lease(thread, owner.owner)

    async def test_an_interrupt_aborts_the_owner_and_carries_nothing(self, core: Any,
                                                                     leases: Any) -> None:
        """``route(..., interrupt=True)`` with a live owner: in the same step the owner is
        marked aborted (``describe``) and its runtime gets an ``abort`` notice (reason
        ``interrupt``); the signal is neither carried nor announced to it, and the next run
        takes it after the signals before it."""
        self.fused(core, leases)
        thread, owner, routed, notices = await self.route_to_owner(core, "stop", "abort",
                                                                   interrupt=True)
        assert routed.accepted.fresh and routed.owner == owner.owner
        assert not routed.carried and not routed.claimed
        told = [(n.kind, n.run_id, n.reason) for n in notices if n.kind != "resync"]
        assert told == [("abort", owner.owner, "interrupt")], told
        assert (await core.describe([thread]))[thread].abort == owner.owner
        await leases.release_lease(thread, owner.owner)
        successor = self.claim("owner-rt")
        claimed = await core.claim(thread, successor)
        assert claimed.claimed
        assert await self.drain(core, thread, RunRef(successor.owner, claimed.token)) == [
            "first", "stop"]
        await leases.release_lease(thread, successor.owner)

    async def test_a_signal_carried_to_an_owner_that_dies_is_found_again(
            self, core: Any, leases: Any) -> None:
        """The owner had emptied the inbox, then a signal was carried to it and it died: the
        pending index still holds the thread (hidden while the lease lives)."""
        self.fused(core, leases)
        rid = new_name("doomed-rt")
        registry = has(core, "register_runtime", "track_threads", "unregister_runtime")
        if registry:  # a core with a runtime registry may index a dead runtime's threads
            await core.register_runtime(RuntimeInfo(rid, "host", 1, 1.0, True), 60_000)
        thread, owner = self.thread(), self.claim(rid)
        await core.route(thread, Signal(id="first"), "deliver", claim=owner, sender="x",
                         wake_workers=False)
        if registry:
            await core.track_threads(rid, add=[thread])
        assert await self.drain(core, thread, RunRef(owner.owner, None)) == ["first"]
        routed = await core.route(thread, Signal(id="next"), "deliver", claim=None,
                                  sender="x", wake_workers=False)
        assert routed.carried and routed.owner == owner.owner
        await leases.release_lease(thread, owner.owner)  # the owner's lease is gone
        if registry:
            await core.unregister_runtime(rid)  # and so is its runtime
        found = await core.due(limit=1000, until=self.now(core) + 1)
        assert thread in found.threads

    async def test_a_signal_not_due_yet_claims_nothing(self, core: Any, leases: Any) -> None:
        self.fused(core, leases)
        thread = self.thread()
        later = Signal(id="s", not_before=self.now(core) + 60)
        routed = await core.route(thread, later, "deliver", claim=self.claim(), sender="rt",
                                  wake_workers=False)
        assert routed.accepted.due_at is not None and not routed.claimed
        assert await leases.get_lease_owner(thread) is None

    async def test_release_if_idle_keeps_a_thread_with_ready_work(self, core: Any,
                                                                  leases: Any) -> None:
        self.fused(core, leases)
        thread, claim = self.thread(), self.claim()
        await core.route(thread, Signal(id="a"), "deliver", claim=claim, sender="rt",
                         wake_workers=False)
        assert not await core.release_if_idle(thread, claim.owner, "rt")
        run = RunRef(claim.owner, None)
        assert await self.drain(core, thread, run) == ["a"]
        assert await core.release_if_idle(thread, claim.owner, "rt")
        assert await leases.get_lease_owner(thread) is None

    async def test_claim_takes_only_ownerless_ready_work(self, core: Any, leases: Any) -> None:
        self.fused(core, leases)
        thread = self.thread()
        assert (await core.claim(thread, self.claim())).empty
        await core.accept(thread, Signal(id="s"), "deliver")
        holder = self.claim()
        got = await core.claim(thread, holder)
        assert got.claimed and got.token is not None
        busy = await core.claim(thread, self.claim())
        assert not busy.claimed and busy.owner == holder.owner
        await leases.release_lease(thread, holder.owner)

    async def test_a_run_without_the_lease_is_fenced(self, core: Any, leases: Any) -> None:
        self.fused(core, leases)
        thread = self.thread()
        await core.accept(thread, Signal(id="s"), "deliver")
        holder = self.claim()
        assert (await core.claim(thread, holder)).claimed
        stale = await self.take(core, thread, RunRef("someone/else", None))
        assert stale.fenced
        assert ids((await self.take(core, thread, RunRef(holder.owner, None))).entries) == ["s"]
        await leases.release_lease(thread, holder.owner)

    async def test_abort_checks_the_lease_and_can_clear(self, core: Any, leases: Any) -> None:
        self.fused(core, leases)
        thread, holder = self.thread(), self.claim()
        await core.route(thread, Signal(id="a"), "deliver", claim=holder, sender="rt",
                         wake_workers=False)
        await core.accept(thread, Signal(id="b"), "deliver")
        assert await core.abort(thread, "not/the-owner", reason="x", clear=True) is None
        assert await core.abort(thread, None, reason="stop", clear=True) == holder.owner
        assert await core.entries(thread) == []
        receipt = await core.receipt(thread, "b")
        assert receipt is not None and receipt.status == "cancelled"
        await leases.release_lease(thread, holder.owner)


def _data(raw: str | None) -> Any:
    return None if raw is None else json.loads(raw)
