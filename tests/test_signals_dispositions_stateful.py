"""A hypothesis state machine: random sends (priorities, lanes that append, supersede or
coalesce, cache keys, a pending cap), hand-outs, acknowledgements, failures and pauses on one
thread of a real core, checked against a small reference model after every step.

Run on the memory core, on Redis (the Lua scripts), on SQLite and Postgres (``SQLCore``): the
implementations of the same rules (docs/dispositions.md).
"""

from __future__ import annotations

import tempfile
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from _signal_leases.sql.sqlite import SQLiteDatabase
from signals import InMemorySignalStore, RedisSignalStore, Signal
from signals.kit import Ack, Limits, RunRef, SignalCore, SQLCore

THREAD = "th"
RUN = RunRef("r/1", 1)
LANES = (None, "a", "b")


@dataclass
class Entry:
    sid: str
    prio: int
    lane: str | None
    merge: str
    seq: int
    state: str = "ready"  # or "held"


@dataclass
class Model:
    """The rules of docs/dispositions.md for one thread, with no time and one run."""

    cap: int
    overflow: str
    entries: dict[str, Entry] = field(default_factory=dict)
    receipts: dict[str, str] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    seq: int = 0
    paused: bool = False

    def order(self) -> list[Entry]:
        return sorted(self.entries.values(), key=lambda e: (-e.prio, e.seq))

    def accept(self, sid: str, prio: int, lane: str | None, merge: str,
               cache_key: str | None) -> tuple[str, list[str], list[str]]:
        if sid in self.receipts:
            return "duplicate", [], []
        if lane and cache_key is not None and self.cache.get(lane) == cache_key:
            return "unchanged", [], []
        victims = ([e for e in self.entries.values() if e.lane == lane and e.state == "ready"]
                   if lane and merge == "supersede" else [])
        dropped: list[str] = []
        if len(self.entries) - len(victims) >= self.cap:
            open_ = [e for e in self.entries.values() if e.state == "ready"]
            drop = (min(open_, key=lambda e: (e.prio, e.seq), default=None)
                    if self.overflow == "drop_oldest" else None)
            if drop is None or drop in victims:
                return "rejected", [], []
            self._remove(drop, "dropped")
            dropped = [drop.sid]
        for v in victims:
            self._remove(v, "superseded")
        if lane:
            if cache_key is not None:
                self.cache[lane] = cache_key
            else:
                self.cache.pop(lane, None)
        self.seq += 1
        self.entries[sid] = Entry(sid, prio, lane, merge, self.seq)
        self.receipts[sid] = "pending"
        return "fresh", sorted(v.sid for v in victims), dropped

    def _remove(self, e: Entry, status: str) -> None:
        del self.entries[e.sid]
        self.receipts[e.sid] = status

    def take(self) -> list[str]:
        if self.paused:
            return []
        ready = [e for e in self.order() if e.state == "ready"]
        if not ready:
            return []
        best = ready[0]
        group = [best]
        if best.lane is not None and best.merge == "coalesce":
            group = sorted((e for e in ready if e.lane == best.lane), key=lambda e: e.seq)
        for e in group:
            e.state = "held"
        return [e.sid for e in group]

    def held(self) -> list[str]:
        return [e.sid for e in self.entries.values() if e.state == "held"]

    def ack(self) -> None:
        for sid in self.held():
            self._remove(self.entries[sid], "processed")

    def fail(self) -> None:
        back = sorted(self.held(), key=lambda s: self.entries[s].seq)
        for sid in back:  # every one is ready again first; then each gives way or stays
            self.entries[sid].state = "ready"
        for sid in back:
            e = self.entries[sid]
            newer = [n for n in self.entries.values() if n.lane == e.lane and e.lane is not None
                     and n.seq > e.seq and n.state == "ready" and n.merge == "supersede"]
            if newer:
                self._remove(e, "superseded")


class DispositionMachine(RuleBasedStateMachine):
    CAP: ClassVar[int] = 4
    OVERFLOW: ClassVar[str] = "reject"

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(self.CAP, self.OVERFLOW)
        self.limits = Limits(self.CAP, self.OVERFLOW)  # type: ignore[arg-type]
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        self.core: SignalCore = self.portal.call(self.open)
        self.held: dict[str, str] = {}  # signal id -> entry id, of what the run holds

    async def open(self) -> SignalCore:
        raise NotImplementedError

    async def close(self) -> None:
        """Override to release what ``open`` made."""

    def teardown(self) -> None:
        try:
            self.portal.call(self.close)
        finally:
            self._portal_cm.__exit__(None, None, None)

    @rule(n=st.integers(0, 9), prio=st.integers(-1, 1), lane=st.sampled_from(LANES),
          merge=st.sampled_from(["append", "supersede", "coalesce"]),
          cache_key=st.sampled_from([None, None, "x", "y"]))
    def send(self, n: int, prio: int, lane: str | None, merge: str, cache_key: str | None
             ) -> None:
        if lane is None:
            merge, cache_key = "append", None
        signal = Signal({"n": n}, id=f"s{n}", priority=prio, lane=lane, merge=merge,  # type: ignore[arg-type]
                        cache_key=cache_key)
        got = self.portal.call(lambda: self.core.accept(THREAD, signal, "deliver",
                                                        limits=self.limits))
        outcome, superseded, dropped = self.model.accept(signal.id, prio, lane, merge, cache_key)
        assert got.outcome == outcome, (got, outcome)
        assert sorted(got.superseded) == superseded and list(got.dropped) == dropped, got

    @rule()
    def take(self) -> None:
        taken = self.portal.call(lambda: self.core.take(THREAD, RUN, max_attempts=100,
                                                        first=True))
        expected = self.model.take()
        assert [e.signal.id for e in taken.entries] == expected, (taken, expected)
        for e in taken.entries:
            self.held[e.signal.id] = e.entry_id

    @precondition(lambda self: bool(self.held))
    @rule()
    def ack(self) -> None:
        acks = [Ack(eid, sid, '{"ok":true}') for sid, eid in self.held.items()]
        assert self.portal.call(lambda: self.core.settle(THREAD, RUN, acks=acks))
        self.model.ack()
        self.held.clear()

    @precondition(lambda self: bool(self.held))
    @rule()
    def fail(self) -> None:
        failed = list(self.held)
        assert self.portal.call(lambda: self.core.settle(THREAD, RUN, failed=failed,
                                                         error="boom"))
        self.model.fail()
        self.held.clear()

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        was = self.portal.call(lambda: self.core.pause(THREAD, paused))
        assert was == self.model.paused
        self.model.paused = paused

    @invariant()
    def inbox_and_receipts_match(self) -> None:
        entries = self.portal.call(lambda: self.core.entries(THREAD, limit=100))
        assert [e.signal.id for e in entries] == [e.sid for e in self.model.order()]
        for sid, status in self.model.receipts.items():
            receipt = self.portal.call(self.core.receipt, THREAD, sid)
            assert receipt is not None and receipt.status == status, (sid, receipt, status)


class MemoryMachine(DispositionMachine):
    async def open(self) -> SignalCore:
        return InMemorySignalStore()


class RedisMachine(DispositionMachine):
    url: ClassVar[str] = ""

    async def open(self) -> SignalCore:
        self.store = RedisSignalStore(url=self.url, key_prefix=f"sm{uuid.uuid4().hex[:10]}")
        return self.store

    async def close(self) -> None:
        await self.store.withdraw(THREAD, None, held=True)
        await self.store.aclose()


class SQLiteMachine(DispositionMachine):
    async def open(self) -> SignalCore:
        self.dir = tempfile.TemporaryDirectory(prefix="sm-")
        self.database = SQLiteDatabase(Path(self.dir.name) / "sm.db")
        return SQLCore(self.database)

    async def close(self) -> None:
        await self.database.aclose()
        self.dir.cleanup()


class PostgresMachine(DispositionMachine):
    dsn: ClassVar[str] = ""

    async def open(self) -> SignalCore:
        from _signal_leases.sql.postgres import PostgresDatabase

        self.database = PostgresDatabase(self.dsn, schema=f"sm{uuid.uuid4().hex[:10]}")
        return SQLCore(self.database)

    async def close(self) -> None:
        await self.database.run(lambda tx: tx.execute(
            f'DROP SCHEMA "{self.database.schema}" CASCADE'), what="drop")
        await self.database.aclose()


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _machine(base: type[DispositionMachine], overflow: str, **extra: Any) -> Any:
    return type(f"{base.__name__}_{overflow}", (base,), {"OVERFLOW": overflow, **extra})


@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_memory_core_follows_the_model(overflow: str) -> None:
    run_state_machine_as_test(_machine(MemoryMachine, overflow), settings=SETTINGS)


@pytest.mark.redis
@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_redis_core_follows_the_model(overflow: str, redis_url: str) -> None:
    run_state_machine_as_test(_machine(RedisMachine, overflow, url=redis_url),
                              settings=SETTINGS)


@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_sqlite_core_follows_the_model(overflow: str) -> None:
    run_state_machine_as_test(_machine(SQLiteMachine, overflow),
                              settings=settings(SETTINGS, max_examples=25))


@pytest.mark.postgres
@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_postgres_core_follows_the_model(overflow: str, postgres_dsn: str) -> None:
    """The same core over Postgres: batched writes and one-round-trip reads keep the
    semantics of SQLite's."""
    run_state_machine_as_test(_machine(PostgresMachine, overflow, dsn=postgres_dsn),
                              settings=settings(SETTINGS, max_examples=15))
