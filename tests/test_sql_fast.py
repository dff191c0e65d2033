"""The one-statement paths of ``SQLCore`` on Postgres (``signals.kit._sql.fast``) leave the
rows the engine leaves: random calls on one thread of two cores, one with the paths and one
without, each fused with the leases of its own schema, and after every step their tables
are compared (times only as present or not)."""

from __future__ import annotations

import json
import uuid
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from pubsub import PostgresPubSub
from signals import Signal
from signals.kit import Ack, Limits, RunRef, SQLCore

pytestmark = pytest.mark.postgres

THREAD = "th"
RUNS = (RunRef("a/1", 1), RunRef("b/2", 2), RunRef("c/3", None), RunRef("b/2", 1))  # (last: stale)
_TABLES = {  # table -> its columns, a time column as "present or not"
    "sig_threads": "key, seq, pending, paused, token, run, since IS NULL, last IS NULL, "
                   "look IS NULL, abort, lanes, pseq, ptrim, receipts",
    "sig_entries": "thread, seq, sid, body, mode, prio, lane, merge, state, due IS NULL, "
                   "nb, expires, holder, attempts, error",
    "sig_receipts": "thread, sid, status, at IS NULL, run, result, error, by_sid, body, "
                    "mode, attempts",
    "sig_parts": "thread, n, kind, run, sid, data",
}


async def _drop(pubsub: PostgresPubSub) -> None:
    """Drop the pub/sub's schema and close its connections."""
    database = pubsub.database
    await database.run(lambda tx: tx.execute(f'DROP SCHEMA "{database.schema}" CASCADE'),
                       what="drop")
    await database.aclose()


def _notice(body: str) -> Any:
    """An event's JSON without what differs between two publishes (its id and time)."""
    event = json.loads(body)
    return {k: v for k, v in event.items() if k not in ("id", "created_at")}


def _timeless(lanes: str | None) -> Any:
    """A thread's lane states with their times as present or not."""
    if lanes is None:
        return None
    return {lane: {k: v if k == "c" else v is None for k, v in state.items()}
            for lane, state in json.loads(lanes).items()}


class FastMachine(RuleBasedStateMachine):
    dsn: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        self.pubsubs: list[PostgresPubSub] = []
        self.cores: list[SQLCore] = [self.portal.call(self.open, fast) for fast in (True, False)]
        self.handed: dict[str, str] = {}  # signal id -> entry id, of what any run was handed
        self.taker = RUNS[0]  # the run that took last

    async def open(self, fast: bool) -> SQLCore:
        pubsub = PostgresPubSub(self.dsn, schema=f"f{uuid.uuid4().hex[:12]}")  # (not entered:
        self.pubsubs.append(pubsub)  # these calls send no notices)
        core = SQLCore(pubsub.sql_database, leases=pubsub.get_lease_provider(), pubsub=pubsub,
                       stream_max_parts=4, max_receipts=5)
        core.fast_paths = fast
        await core.describe([THREAD])  # the tables
        await pubsub._schema()  # (its own: entering it would create them)
        return core

    def teardown(self) -> None:
        async def close() -> None:
            for pubsub in self.pubsubs:
                await _drop(pubsub)
        try:
            self.portal.call(close)
        finally:
            self._portal_cm.__exit__(None, None, None)

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

        async def accept(core: SQLCore) -> Any:
            return (await core.accept(THREAD, signal, "deliver")).outcome
        self.both(accept)

    @rule(n=st.integers(0, 40), prio=st.integers(-1, 1), big=st.booleans(),
          mode=st.sampled_from(["deliver", "deliver", "queue"]),
          sender=st.sampled_from([None, "a", "b", "z"]), cap=st.sampled_from([None, None, 3]),
          own=st.booleans())
    def route(self, n: int, prio: int, big: bool, mode: str, sender: str | None,
              cap: int | None, own: bool) -> None:
        """A signal routed from a sender (its runtime id; the owner's own, another one);
        ``own``: run a/1 takes the lease first."""
        if own:
            self.lease(RUNS[0], True)
        payload = {"n": n, "pad": "x" * (17_000 if big else 0)}  # past CARRY_LIMIT: not carried
        signal = Signal(payload, id=f"s{n % 8}" if n > 35 else f"r{n}", priority=prio)

        async def route(core: SQLCore) -> Any:
            routed = await core.route(THREAD, signal, mode, claim=None,  # type: ignore[arg-type]
                                      sender=sender, wake_workers=True, limits=Limits(cap))
            a = routed.accepted
            return (a.outcome, a.entry_id, a.receipt and a.receipt.status, a.superseded,
                    a.dropped, routed.owner, routed.claimed, routed.carried)
        self.both(route)

    @rule(run=st.sampled_from(RUNS), first=st.booleans())
    def take(self, run: RunRef, first: bool) -> None:
        async def take(core: SQLCore) -> Any:
            taken = await core.take(THREAD, run, max_attempts=3, first=first)
            return [(e.signal.id, e.entry_id) for e in taken.entries], taken.fenced
        entries, fenced = self.both(take)
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

        async def settle(core: SQLCore) -> Any:
            return await core.settle(THREAD, run, acks=[ack])
        self.both(settle)
        if data.draw(st.sampled_from([True, True, False])):
            del self.handed[sid]  # (else it may be acknowledged again)

    @rule(run=st.sampled_from([RUNS[0], RUNS[0], *RUNS]),
          result=st.sampled_from([None, '{"ok":1}']))
    def take_and_ack(self, run: RunRef, result: str | None) -> None:
        """The common case: a run takes its next signal and acknowledges it."""
        async def take_ack(core: SQLCore) -> Any:
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
        async def lease(core: SQLCore) -> Any:
            leases: Any = core.leases
            for other in RUNS[:2]:
                await leases.release_lease(THREAD, other.run_id)
            if hold:
                return (await leases.acquire_lease(THREAD, run.run_id, 60_000)).acquired
            return None
        self.both(lease)

    @invariant()
    def same_rows(self) -> None:
        async def rows(core: SQLCore) -> Any:
            def read(tx: Any) -> Any:
                found = {table: sorted(tx.all(f"SELECT {cols} FROM {table}"), key=repr)
                         for table, cols in _TABLES.items()}
                found["sig_threads"] = [(*r[:10], _timeless(r[10]), *r[11:])
                                        for r in found["sig_threads"]]
                found["ps_events"] = [(topic, _notice(body)) for topic, body in tx.all(
                    "SELECT topic, body FROM ps_events ORDER BY id")]
                return found
            return await core.database.run(read, write=False, what="dump")
        self.both(rows)


def test_the_fast_paths_leave_the_rows_the_engine_leaves(
        postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import signals.kit._sql as sql_core
    from signals.kit._sql.fast import route_one, settle_one
    used = {"settle": 0, "route": 0}

    def counting(name: str, fn: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            done = await fn(*args, **kwargs)
            used[name] += bool(done)
            return done
        return wrapper
    monkeypatch.setattr(sql_core, "settle_one", counting("settle", settle_one))
    monkeypatch.setattr(sql_core, "route_one", counting("route", route_one))
    machine = type("FastMachineHere", (FastMachine,), {"dsn": postgres_dsn})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=50, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    assert min(used.values()) >= 20, f"the fast paths ran {used}: the test proves nothing"


@pytest.mark.anyio
async def test_a_fast_settle_trims_the_stream_by_age(postgres_dsn: str) -> None:
    """Parts older than ``stream_retention_ms`` go at the next ack, as the engine trims."""
    pubsubs = [PostgresPubSub(postgres_dsn, schema=f"f{uuid.uuid4().hex[:12]}")
               for _ in range(2)]
    cores = [SQLCore(p.sql_database, stream_retention_ms=300) for p in pubsubs]
    cores[1].fast_paths = False
    found = []
    for core in cores:
        run = RunRef("a/1", 1)
        await core.accept(THREAD, Signal(1, id="old"), "deliver")
        await core.accept(THREAD, Signal(2, id="new"), "deliver")
        taken = await core.take(THREAD, run, max_attempts=3, first=True)
        await anyio.sleep(0.4)  # past the retention
        entry = taken.entries[0]
        assert await core.settle(THREAD, run, acks=[Ack(entry.entry_id, entry.signal.id)])

        def read(tx: Any) -> Any:
            return (tx.all("SELECT n, kind FROM sig_parts ORDER BY n"),
                    tx.all("SELECT ptrim, pseq, pending FROM sig_threads"))
        found.append(await core.database.run(read, write=False, what="dump"))
    assert found[0] == found[1]
    parts, [(ptrim, pseq, pending)] = found[0]
    assert [kind for _, kind in parts] == ["signal.acked"] and ptrim == pseq - 1 and pending == 1
    for p in pubsubs:
        await _drop(p)


@pytest.mark.anyio
async def test_a_fenced_ack_changes_nothing_on_either_path(postgres_dsn: str) -> None:
    """An older token of the same run, and a run whose thread another run's live lease
    holds, are refused on the one-statement path as by the engine; an entry id that is not
    the entry's number as the engine writes it acknowledges nothing."""
    for fast in (True, False):
        pubsub = PostgresPubSub(postgres_dsn, schema=f"f{uuid.uuid4().hex[:12]}")
        core = SQLCore(pubsub.sql_database, leases=pubsub.get_lease_provider(), pubsub=pubsub)
        core.fast_paths = fast
        for n in range(2):
            await core.accept(THREAD, Signal(n, id=f"s{n}"), "deliver")
        taken = await core.take(THREAD, RunRef("r/1", 5), max_attempts=3, first=True)
        e = taken.entries[0]
        ack = [Ack(e.entry_id, e.signal.id)]
        assert not await core.settle(THREAD, RunRef("r/1", 4), acks=ack), fast
        leases: Any = core.leases
        assert (await leases.acquire_lease(THREAD, "other/1", 60_000)).acquired
        assert not await core.settle(THREAD, RunRef("r/1", 5), acks=ack), fast
        assert [x.signal.id for x in await core.entries(THREAD)] == ["s0", "s1"], fast
        await leases.release_lease(THREAD, "other/1")
        for other in ("0" + e.entry_id, "\uff11", "99999999999999999999"):  # not its id
            assert await core.settle(THREAD, RunRef("r/1", 5), acks=[Ack(other, "s0")]), fast
        assert [x.signal.id for x in await core.entries(THREAD)] == ["s0", "s1"], fast
        assert await core.settle(THREAD, RunRef("r/1", 5), acks=ack), fast
        assert [x.signal.id for x in await core.entries(THREAD)] == ["s1"], fast
        await _drop(pubsub)


@pytest.mark.anyio
async def test_the_signal_tables_are_analyzed_once_early(postgres_dsn: str) -> None:
    """A statement prepared while the tables were empty keeps a plan for empty tables until
    their statistics change: the core refreshes them after its first write calls."""
    pubsub = PostgresPubSub(postgres_dsn, schema=f"f{uuid.uuid4().hex[:12]}")
    core = SQLCore(pubsub.database)
    core.analyze_after = (3,)

    async def analyzed() -> int:
        return int(await pubsub.database.run(lambda tx: tx.value(
            "SELECT COALESCE(SUM(analyze_count), 0) FROM pg_stat_user_tables WHERE "
            "schemaname = ? AND relname IN ('sig_threads', 'sig_entries', 'sig_receipts', "
            "'sig_parts')", (pubsub.database.schema,)), write=False, what="stats"))
    for n in range(2):
        await core.accept(THREAD, Signal(n, id=f"s{n}"), "deliver")
    assert await analyzed() == 0
    for n in range(2, 6):
        await core.accept(THREAD, Signal(n, id=f"s{n}"), "deliver")
    with anyio.fail_after(10):  # (the statistics' counters are flushed by the server)
        while await analyzed() < 4:  # noqa: ASYNC110 (a server's counter)
            await anyio.sleep(0.1)
    await _drop(pubsub)
