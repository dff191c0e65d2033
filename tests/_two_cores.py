"""A Hypothesis state machine that makes the same random calls on one thread of two signal
cores, one with its shortcut paths and one without, and compares every answer: the tests of
the SQL core's one-statement paths and of the in-memory store's quick paths subclass it and
add the comparison of what each leaves behind."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from signals import Signal
from signals.kit import Ack, Limits, RunRef

__all__ = ["RUNS", "THREAD", "TwoCoresMachine"]

THREAD = "th"
RUNS = (RunRef("a/1", 1), RunRef("b/2", 2), RunRef("c/3", None), RunRef("b/2", 1))  # (last: stale)


class TwoCoresMachine(RuleBasedStateMachine):
    """``cores``: the one with the shortcuts first, each fused with its own leases (a
    subclass fills it in ``__init__``, with the portal's help)."""

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        self.cores: list[Any] = []
        self.handed: dict[str, str] = {}  # signal id -> entry id, of what any run was handed
        self.taker = RUNS[0]  # the run that took last

    def close(self) -> None:
        """Before the portal closes (a subclass drops what it made)."""

    def teardown(self) -> None:
        try:
            self.close()
        finally:
            self._portal_cm.__exit__(None, None, None)

    def now(self) -> float:
        """The cores' Unix time."""
        return time.time()

    def both(self, call: Any) -> Any:
        fast, slow = (self.portal.call(call, core) for core in self.cores)
        assert fast == slow, (fast, slow)
        return fast

    @rule(n=st.integers(0, 7), prio=st.integers(-1, 1),
          lane=st.sampled_from([None, None, None, "a"]),
          merge=st.sampled_from(["append", "supersede", "coalesce"]))
    def send(self, n: int, prio: int, lane: str | None, merge: str) -> None:
        signal = Signal({"n": n}, id=f"s{n}", priority=prio, lane=lane,
                        merge=merge if lane else "append")  # type: ignore[arg-type]

        async def accept(core: Any) -> Any:
            return (await core.accept(THREAD, signal, "deliver")).outcome
        self.both(accept)

    @rule(n=st.integers(0, 40), prio=st.integers(-1, 1), big=st.booleans(),
          mode=st.sampled_from(["deliver", "deliver", "queue"]),
          sender=st.sampled_from([None, "a", "b", "z"]), cap=st.sampled_from([None, None, 3]),
          own=st.booleans(), interrupt=st.sampled_from([False, False, False, True]),
          later=st.sampled_from([None, None, None, "not_before", "expires_at", "lane"]))
    def route(self, n: int, prio: int, big: bool, mode: str, sender: str | None,
              cap: int | None, own: bool, interrupt: bool, later: str | None) -> None:
        """A signal routed from a sender (its runtime id; the owner's own, another one);
        ``own``: run a/1 takes the lease first; ``later``: a signal the shortcuts leave to
        the engine."""
        if own:
            self.lease(RUNS[0], True)
        payload = {"n": n, "pad": "x" * (17_000 if big else 0)}  # past CARRY_LIMIT: not carried
        extras: dict[str | None, dict[str, Any]] = {
            None: {}, "not_before": {"not_before": self.now() + 5},
            "expires_at": {"expires_at": self.now() + 5}, "lane": {"lane": "a"}}
        signal = Signal(payload, id=f"s{n % 8}" if n > 35 else f"r{n}", priority=prio,
                        **extras[later])

        async def route(core: Any) -> Any:
            routed = await core.route(THREAD, signal, mode, claim=None, sender=sender,
                                      wake_workers=True, limits=Limits(cap),
                                      interrupt=interrupt)
            a = routed.accepted
            return (a.outcome, a.entry_id, a.receipt and a.receipt.status, a.superseded,
                    a.dropped, routed.owner, routed.claimed, routed.carried)
        self.both(route)

    @rule(n=st.integers(0, 40))
    def route_plain(self, n: int) -> None:
        """The common case: a plain signal for the thread of run a/1, from another runtime."""
        self.route(n, 0, False, "deliver", "z", None, True, False, None)

    @rule(run=st.sampled_from(RUNS), first=st.booleans())
    def take(self, run: RunRef, first: bool) -> None:
        async def take(core: Any) -> Any:
            taken = await core.take(THREAD, run, max_attempts=3, first=first)
            return ([(e.signal.id, e.entry_id) for e in taken.entries], taken.fenced,
                    taken.dead, taken.more, taken.pending)
        entries, fenced, *_ = self.both(take)
        self.handed.update(entries)
        if not fenced:
            self.taker = run

    @rule(run=st.sampled_from([None, None, *RUNS]), data=st.data(),
          result=st.sampled_from([None, '{"ok":1}']),
          wrong_entry=st.sampled_from([False, False, False, True]))
    def ack(self, run: RunRef | None, data: st.DataObject, result: str | None,
            wrong_entry: bool) -> None:
        """An ack by the run that took last (``None``), or by any run."""
        if not self.handed:
            return
        run = run or self.taker
        sid = data.draw(st.sampled_from(sorted(self.handed)))
        entry = str(int(self.handed[sid]) + 1) if wrong_entry and sid != "s0" else \
            self.handed[sid]
        ack = Ack(entry, sid, result)

        async def settle(core: Any) -> Any:
            return await core.settle(THREAD, run, acks=[ack])
        self.both(settle)
        if data.draw(st.sampled_from([True, True, False])):
            del self.handed[sid]  # (else it may be acknowledged again)

    @rule(run=st.sampled_from([RUNS[0], RUNS[0], *RUNS]),
          result=st.sampled_from([None, '{"ok":1}']))
    def take_and_ack(self, run: RunRef, result: str | None) -> None:
        """The common case: a run takes its next signal and acknowledges it."""
        async def take_ack(core: Any) -> Any:
            taken = await core.take(THREAD, run, max_attempts=3, first=True)
            if taken.fenced or len(taken.entries) != 1:
                return [(e.signal.id, e.entry_id) for e in taken.entries], None
            e = taken.entries[0]
            acked = await core.settle(THREAD, run, acks=[Ack(e.entry_id, e.signal.id, result)])
            return [], acked
        entries, _ = self.both(take_ack)
        self.handed.update(entries)

    @rule(run=st.sampled_from(RUNS[:2]), hold=st.sampled_from([True, True, False]))
    def lease(self, run: RunRef, hold: bool) -> None:
        """Another process's lease: a run that does not hold it is fenced (fused calls)."""
        async def lease(core: Any) -> Any:
            leases: Any = core.leases
            for other in RUNS[:2]:
                await leases.release_lease(THREAD, other.run_id)
            if hold:
                return (await leases.acquire_lease(THREAD, run.run_id, 60_000)).acquired
            return None
        self.both(lease)

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        async def pause(core: Any) -> Any:
            return await core.pause(THREAD, paused)
        self.both(pause)
