"""``SignalCoreConformance``: one check per rule of :class:`~signals.kit.SignalCore`.

Over 400 lines on purpose: every rule of the twelve methods (dispositions and time included),
one check each, in one class a backend author reads from top to bottom.
"""

from __future__ import annotations

import math

import anyio
import pytest

from signals._model import Signal
from signals.kit._core import CORE_METHODS, Ack, Limits, RunRef, SignalCore, is_signal_core
from signals.testing._fixtures import ALL, Fixtures, ids, new_name

__all__ = ["SignalCoreConformance"]


@pytest.mark.anyio
class SignalCoreConformance(Fixtures):
    """The twelve methods of the core (see :class:`~signals.kit.SignalCore`)."""

    # -- accept and hand-out order ----------------------------------------------------------

    async def test_is_a_signal_core(self, core: SignalCore) -> None:
        assert is_signal_core(core), [m for m in CORE_METHODS if not hasattr(core, m)]

    async def test_an_unknown_thread_is_empty(self, core: SignalCore) -> None:
        thread = self.thread()
        assert await core.entries(thread) == []
        assert (await core.describe([thread]))[thread].pending == 0
        assert not (await self.take(core, thread, RunRef("r/1", 1))).entries
        assert await core.receipt(thread, "nope") is None

    async def test_a_signal_survives_the_trip(self, core: SignalCore) -> None:
        thread = self.thread()
        sent = Signal({"a": [1, "é", None]}, type="note", id="s1", priority=3, lane="l")
        accepted = await core.accept(thread, sent, "queue")
        assert accepted.fresh and accepted.entry_id and accepted.receipt is not None
        assert accepted.receipt.status == "pending"
        [entry] = await core.entries(thread)
        got = entry.signal
        assert (got.payload, got.type, got.id, got.priority, got.lane, entry.mode) == (
            sent.payload, "note", "s1", 3, "l", "queue")
        assert got.created_at == sent.created_at and entry.attempts == 0

    async def test_higher_priority_first_then_accept_order(self, core: SignalCore) -> None:
        thread = self.thread()
        for sid, prio in (("low", -1), ("n1", 0), ("high", 5), ("n2", 0), ("top", 5)):
            await core.accept(thread, Signal(id=sid, priority=prio), "deliver")
        assert ids(await core.entries(thread)) == ["high", "top", "n1", "n2", "low"]
        assert await self.drain(core, thread, RunRef("r/1", 1)) == [
            "high", "top", "n1", "n2", "low"]

    async def test_threads_are_separate(self, core: SignalCore) -> None:
        a, b = self.thread(), self.thread()
        await core.accept(a, Signal(id="x"), "deliver")
        assert (await core.accept(b, Signal(id="x"), "deliver")).fresh
        assert ids(await core.entries(a)) == ["x"] and ids(await core.entries(b)) == ["x"]

    # -- dedup and receipts -----------------------------------------------------------------

    async def test_a_duplicate_is_refused_with_the_original_receipt(
        self, core: SignalCore
    ) -> None:
        thread = self.thread()
        assert (await core.accept(thread, Signal(1, id="d"), "deliver")).fresh
        again = await core.accept(thread, Signal(2, id="d"), "deliver")
        assert again.outcome == "duplicate" and again.receipt is not None
        assert again.receipt.status == "pending" and len(await core.entries(thread)) == 1
        await self.drain(core, thread, RunRef("r/1", 1))
        after = await core.accept(thread, Signal(3, id="d"), "deliver")
        assert after.outcome == "duplicate" and after.receipt is not None
        assert after.receipt.status == "processed"

    async def test_dedup_comes_before_lanes_and_the_cap(self, core: SignalCore) -> None:
        thread, cap = self.thread(), Limits(1, "reject")
        state = {"lane": "state", "merge": "supersede", "cache_key": "v1"}
        assert (await core.accept(thread, Signal(id="s", **state), "deliver", limits=cap)).fresh  # type: ignore[arg-type]
        again = await core.accept(thread, Signal(id="s", **state), "deliver", limits=cap)  # type: ignore[arg-type]
        assert again.outcome == "duplicate" and not again.superseded
        assert ids(await core.entries(thread)) == ["s"]

    async def test_concurrent_accepts_of_one_id_store_it_once(self, core: SignalCore) -> None:
        thread = self.thread()
        outcomes: list[str] = []

        async def send() -> None:
            outcomes.append((await core.accept(thread, Signal(id="race"), "deliver")).outcome)

        async with anyio.create_task_group() as tg:
            for _ in range(self.racers):
                tg.start_soon(send)
        assert outcomes.count("fresh") == 1 and len(await core.entries(thread)) == 1

    async def test_an_id_is_accepted_again_after_retention(self, core: SignalCore) -> None:
        thread = self.thread()
        await core.accept(thread, Signal(id="old"), "deliver")
        await self.drain(core, thread, RunRef("r/1", 1))
        await self.expire_receipts(core)
        assert await core.receipt(thread, "old") is None
        assert (await core.accept(thread, Signal(id="old"), "deliver")).fresh

    async def test_ack_removes_and_records_the_result(self, core: SignalCore) -> None:
        thread, run = self.thread(), RunRef("r/1", 1)
        await core.accept(thread, Signal(id="s"), "deliver")
        [e] = (await self.take(core, thread, run)).entries
        assert e.attempts == 1 and e.signal.attempt == 1
        ack = Ack(e.entry_id, "s", '{"ok":true}')
        assert await core.settle(thread, run, acks=[ack])
        assert await core.entries(thread) == []
        receipt = await core.receipt(thread, "s")
        assert receipt is not None and receipt.status == "processed"
        assert receipt.result == {"ok": True} and receipt.run_id == "r/1"
        assert await core.settle(thread, run, acks=[ack])  # twice: a no-op
        assert (await core.receipt(thread, "s")) == receipt

    # -- attempts, fencing, dead letters ----------------------------------------------------

    async def test_a_failed_signal_is_ready_again_with_its_attempt_counted(
        self, core: SignalCore
    ) -> None:
        thread = self.thread()
        await core.accept(thread, Signal(id="s"), "deliver")
        assert ids((await self.take(core, thread, RunRef("r/1", 1))).entries) == ["s"]
        assert await core.settle(thread, RunRef("r/1", 1), failed=["s"], error="ValueError: x")
        [again] = (await self.take(core, thread, RunRef("r/2", 2))).entries
        assert again.signal.id == "s" and again.attempts == 2 and again.signal.attempt == 2

    async def test_a_newer_run_takes_over_and_a_stale_run_is_fenced(
        self, core: SignalCore
    ) -> None:
        thread = self.thread()
        await core.accept(thread, Signal(id="s"), "deliver")
        [held] = (await self.take(core, thread, RunRef("old/1", 1))).entries
        [again] = (await self.take(core, thread, RunRef("new/1", 2))).entries
        assert again.signal.id == "s" and again.attempts == 2  # the old run counted
        stale = await self.take(core, thread, RunRef("old/1", 1))
        assert stale.fenced and not stale.entries
        assert not await core.settle(thread, RunRef("old/1", 1),
                                     acks=[Ack(held.entry_id, "s")])
        assert ids(await core.entries(thread)) == ["s"]  # the stale ack changed nothing

    async def test_what_a_run_never_handed_out_is_given_back(self, core: SignalCore) -> None:
        thread, run = self.thread(), RunRef("r/1", 1)
        await core.accept(thread, Signal(id="s"), "deliver")
        (await self.take(core, thread, run)).entries  # noqa: B018
        assert await core.settle(thread, run, returned=["s"])
        [again] = (await self.take(core, thread, RunRef("r/2", 2))).entries
        assert again.attempts == 1

    async def test_too_many_attempts_dead_letter_the_signal(self, core: SignalCore) -> None:
        thread = self.thread()
        await self.accept_all(core, thread, [Signal(id="bad"), Signal(id="good")])
        for n in (1, 2):
            run = RunRef(f"r/{n}", n)
            [e] = (await self.take(core, thread, run, max_attempts=2)).entries
            assert e.signal.id == "bad"
            await core.settle(thread, run, failed=["bad"], error="ValueError: nope")
        taken = await self.take(core, thread, RunRef("r/3", 3), max_attempts=2)
        assert taken.dead == ("bad",) and ids(taken.entries) == ["good"]
        receipt = await core.receipt(thread, "bad")
        assert receipt is not None and receipt.status == "dead_lettered"
        assert receipt.error == "ValueError: nope"
        [dead] = await core.dead_letters(thread)
        assert dead.signal.id == "bad" and dead.attempts == 2 and dead.error == "ValueError: nope"

    async def test_dead_letters_can_be_revived_and_purged(self, core: SignalCore) -> None:
        thread = self.thread()
        await self.accept_all(core, thread, [Signal(id="a"), Signal(id="b")])
        run = RunRef("r/1", 1)
        for _ in range(2):
            taken = await self.take(core, thread, run, max_attempts=0)
            assert not taken.entries
        assert sorted(d.signal.id for d in await core.dead_letters(thread)) == ["a", "b"]
        assert await core.revive(thread, ["a", "zz"]) == ["a"]
        receipt = await core.receipt(thread, "a")
        assert receipt is not None and receipt.status == "pending"
        [e] = (await self.take(core, thread, RunRef("r/2", 2))).entries
        assert e.signal.id == "a" and e.attempts == 1
        assert await core.revive(thread, None, purge=True) == ["b"]
        assert await core.dead_letters(thread) == []

    async def test_a_queued_signal_waits_for_a_run_of_its_own(self, core: SignalCore) -> None:
        thread, run = self.thread(), RunRef("r/1", 1)
        await core.accept(thread, Signal(id="a"), "deliver")
        await core.accept(thread, Signal(id="q"), "queue")
        [a] = (await self.take(core, thread, run)).entries
        stopped = await self.take(core, thread, run, acks=[Ack(a.entry_id, "a")], first=False)
        assert stopped.stopped and not stopped.entries
        assert ids((await self.take(core, thread, RunRef("r/2", 2))).entries) == ["q"]

    # -- withdraw, index, pause, describe ---------------------------------------------------

    async def test_withdraw_spares_what_a_run_holds(self, core: SignalCore) -> None:
        thread = self.thread()
        await self.accept_all(core, thread, [Signal(id=s) for s in ("a", "b", "c")])
        (await self.take(core, thread, RunRef("r/1", 1))).entries  # noqa: B018 ("a" held)
        assert await core.withdraw(thread, ["a", "b", "nope"]) == ["b"]
        receipt = await core.receipt(thread, "b")
        assert receipt is not None and receipt.status == "cancelled"
        assert sorted(await core.withdraw(thread, None, held=True)) == ["a", "c"]
        assert await core.entries(thread) == []

    async def test_a_thread_is_indexed_until_its_inbox_empties(self, core: SignalCore) -> None:
        thread, run = self.thread(), RunRef("r/1", 1)
        await core.accept(thread, Signal(id="s"), "deliver")
        assert thread in (await core.due(limit=ALL)).threads
        await core.look_at(thread, 4_000_000_000.0)  # far away
        due = await core.due(limit=ALL)
        assert thread not in due.threads and due.next_at is not None
        assert thread in (await core.due(limit=ALL, until=math.inf)).threads
        await self.drain(core, thread, run)
        assert thread not in (await core.due(limit=ALL, until=math.inf)).threads

    async def test_a_paused_thread_accepts_and_hands_out_nothing(self, core: SignalCore) -> None:
        thread = self.thread()
        assert await core.pause(thread, True) is False
        await core.accept(thread, Signal(id="s"), "deliver")
        taken = await self.take(core, thread, RunRef("r/1", 1))
        assert taken.paused and not taken.entries
        state = (await core.describe([thread]))[thread]
        assert state.paused and state.pending == 1
        assert thread not in (await core.due(limit=ALL, until=math.inf)).threads
        assert await core.pause(thread, False) is True
        assert thread in (await core.due(limit=ALL)).threads
        assert ids((await self.take(core, thread, RunRef("r/2", 2))).entries) == ["s"]

    async def test_describe_tells_pending_and_activity(self, core: SignalCore) -> None:
        thread = self.thread()
        await self.accept_all(core, thread, [Signal(id="a"), Signal(id="b")])
        await self.take(core, thread, RunRef("r/1", 1))
        state = (await core.describe([thread, new_name("none")]))[thread]
        assert state.pending == 2 and state.ready and state.last is not None
        assert state.run == "r/1" and state.since is not None and not state.paused

    # -- lanes ------------------------------------------------------------------------------

    async def test_supersede_replaces_what_no_run_took(self, core: SignalCore) -> None:
        thread = self.thread()
        lane = {"lane": "page", "merge": "supersede"}
        await core.accept(thread, Signal(id="p0", **lane), "deliver")  # type: ignore[arg-type]
        [held] = (await self.take(core, thread, RunRef("r/1", 1))).entries
        for n in (1, 2):
            await core.accept(thread, Signal(id=f"p{n}", **lane), "deliver")  # type: ignore[arg-type]
        accepted = await core.accept(thread, Signal(id="p3", **lane), "deliver")  # type: ignore[arg-type]
        assert accepted.superseded == ("p2",)
        assert ids(await core.entries(thread)) == ["p0", "p3"]  # p0 is held: kept
        r1 = await core.receipt(thread, "p1")
        assert r1 is not None and r1.status == "superseded" and r1.superseded_by == "p2"
        assert held.signal.id == "p0"

    async def test_a_signal_back_from_a_run_gives_way_to_a_newer_supersede(
        self, core: SignalCore
    ) -> None:
        thread = self.thread()
        lane = {"lane": "page", "merge": "supersede"}
        for n in (0, 1):
            await core.accept(thread, Signal(id=f"f{n}", lane="l"), "deliver")
        await core.accept(thread, Signal(id="p0", priority=1, **lane), "deliver")  # type: ignore[arg-type]
        run = RunRef("r/1", 1)
        assert ids((await self.take(core, thread, run)).entries) == ["p0"]
        await core.accept(thread, Signal(id="p1", **lane), "deliver")  # type: ignore[arg-type]
        assert ids((await self.take(core, thread, run, first=False)).entries) == ["f0"]
        await core.settle(thread, run, failed=["p0"], returned=["f0"], error="interrupted")
        r0 = await core.receipt(thread, "p0")
        assert r0 is not None and r0.status == "superseded" and r0.superseded_by == "p1"
        assert ids(await core.entries(thread)) == ["f0", "f1", "p1"]  # an append lane: kept

    async def test_coalesce_hands_out_the_whole_lane_at_once(self, core: SignalCore) -> None:
        thread = self.thread()
        for n in range(3):
            await core.accept(thread, Signal(id=f"k{n}", lane="typing", merge="coalesce"),
                              "deliver")
        await core.accept(thread, Signal(id="other"), "deliver")
        taken = await self.take(core, thread, RunRef("r/1", 1))
        assert ids(taken.entries) == ["k0", "k1", "k2"] and taken.more

    async def test_an_unchanged_cache_key_stores_nothing(self, core: SignalCore) -> None:
        thread = self.thread()
        state = {"lane": "state", "merge": "supersede"}
        first = await core.accept(thread, Signal(id="u1", cache_key="v1", **state), "deliver")  # type: ignore[arg-type]
        same = await core.accept(thread, Signal(id="u2", cache_key="v1", **state), "deliver")  # type: ignore[arg-type]
        new = await core.accept(thread, Signal(id="u3", cache_key="v2", **state), "deliver")  # type: ignore[arg-type]
        assert (first.outcome, same.outcome, new.outcome) == ("fresh", "unchanged", "fresh")
        assert await core.receipt(thread, "u2") is None

    async def test_the_pending_cap_rejects_or_drops_the_oldest(self, core: SignalCore) -> None:
        thread = self.thread()
        cap = Limits(3, "reject")
        for sid, prio in (("a", 0), ("b", -1), ("c", -1)):
            assert (await core.accept(thread, Signal(id=sid, priority=prio), "deliver",
                                      limits=cap)).fresh
        refused = await core.accept(thread, Signal(id="d"), "deliver", limits=cap)
        assert refused.outcome == "rejected" and refused.reason
        assert await core.receipt(thread, "d") is None
        drop = await core.accept(thread, Signal(id="e"), "deliver",
                                 limits=Limits(3, "drop_oldest"))
        assert drop.fresh and drop.dropped == ("b",)  # the oldest of the lowest priority
        receipt = await core.receipt(thread, "b")
        assert receipt is not None and receipt.status == "dropped"
        assert sorted(ids(await core.entries(thread))) == ["a", "c", "e"]

    # -- time -------------------------------------------------------------------------------

    async def test_a_signal_is_not_handed_out_before_not_before(self, core: SignalCore) -> None:
        thread, tick = self.thread(), self.tick_ms / 1000
        now = self.now(core)
        accepted = await core.accept(thread, Signal(id="later", not_before=now + 2 * tick),
                                     "deliver")
        assert accepted.due_at is not None and accepted.receipt is not None
        assert accepted.receipt.status == "scheduled"
        taken = await self.take(core, thread, RunRef("r/1", 1))
        assert not taken.entries and taken.next_due is not None
        due = await core.due(limit=ALL)
        assert thread not in due.threads and due.next_at is not None
        await self.advance(core, 3 * self.tick_ms)
        assert thread in (await core.due(limit=ALL)).threads
        assert ids((await self.take(core, thread, RunRef("r/1", 1))).entries) == ["later"]

    async def test_the_last_hand_out_tells_when_the_next_signal_comes_due(
        self, core: SignalCore
    ) -> None:
        thread, tick = self.thread(), self.tick_ms / 1000
        now = self.now(core)
        await core.accept(thread, Signal(id="now"), "deliver")
        await core.accept(thread, Signal(id="later", not_before=now + 2 * tick), "deliver")
        taken = await self.take(core, thread, RunRef("r/1", 1))
        assert ids(taken.entries) == ["now"] and not taken.more
        assert taken.next_due is not None and taken.next_due > now

    async def test_an_expired_signal_is_never_handed_out(self, core: SignalCore) -> None:
        thread = self.thread()
        soon = self.now(core) + self.tick_ms / 1000
        await core.accept(thread, Signal(id="stale", expires_at=soon), "deliver")
        await core.accept(thread, Signal(id="fresh"), "deliver")
        await self.advance(core, 2 * self.tick_ms)
        assert ids((await self.take(core, thread, RunRef("r/1", 1))).entries) == ["fresh"]
        receipt = await core.receipt(thread, "stale")
        assert receipt is not None and receipt.status == "expired"

    async def test_a_debounced_lane_waits_for_quiet(self, core: SignalCore) -> None:
        thread = self.thread()
        lane = {"lane": "typing", "merge": "coalesce", "debounce_ms": 2 * self.tick_ms}
        for n in range(3):
            await core.accept(thread, Signal(id=f"k{n}", **lane), "deliver")  # type: ignore[arg-type]
            await self.advance(core, self.tick_ms)
            assert not (await self.take(core, thread, RunRef("r/1", 1))).entries
        await self.advance(core, 2 * self.tick_ms)
        assert ids((await self.take(core, thread, RunRef("r/1", 1))).entries) == [
            "k0", "k1", "k2"]

    async def test_max_wait_bounds_a_debounce(self, core: SignalCore) -> None:
        thread = self.thread()
        lane = {"lane": "typing", "merge": "coalesce", "debounce_ms": 3 * self.tick_ms,
                "max_wait_ms": 2 * self.tick_ms}
        await core.accept(thread, Signal(id="k0", **lane), "deliver")  # type: ignore[arg-type]
        await self.advance(core, self.tick_ms)
        await core.accept(thread, Signal(id="k1", **lane), "deliver")  # type: ignore[arg-type]
        await self.advance(core, int(1.5 * self.tick_ms))
        assert ids((await self.take(core, thread, RunRef("r/1", 1))).entries) == ["k0", "k1"]

