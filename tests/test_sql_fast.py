"""The one-statement paths of ``SQLCore`` on Postgres (``signals.kit._sql.fast``) leave the
rows the engine leaves: random calls on one thread of two cores, one with the paths and one
without, each fused with the leases of its own schema, and after every step their tables
are compared (times only as present or not)."""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from pubsub import PostgresPubSub
from signals import Signal
from signals.kit import Ack, RunRef, SQLCore
from tests._two_cores import THREAD, TwoCoresMachine

pytestmark = pytest.mark.postgres

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


class FastMachine(TwoCoresMachine):
    dsn: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.pubsubs: list[PostgresPubSub] = []
        self.cores = [self.portal.call(self.open, fast) for fast in (True, False)]

    async def open(self, fast: bool) -> SQLCore:
        pubsub = PostgresPubSub(self.dsn, schema=f"f{uuid.uuid4().hex[:12]}")  # (not entered:
        self.pubsubs.append(pubsub)  # these calls send no notices)
        core = SQLCore(pubsub.sql_database, leases=pubsub.get_lease_provider(), pubsub=pubsub,
                       stream_max_parts=4, max_receipts=5)
        core.fast_paths = fast
        await core.describe([THREAD])  # the tables
        await pubsub._schema()  # (its own: entering it would create them)
        return core

    def close(self) -> None:
        async def close() -> None:
            for pubsub in self.pubsubs:
                await _drop(pubsub)
        self.portal.call(close)

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
        max_examples=80, stateful_step_count=30, deadline=None,
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
