"""PostgreSQL runs every conformance kit: the pub/sub (and its own leases), the lease provider,
and the SQL core fused with the leases of the same database, its notices written in the
transaction of their change. Each test gets a schema of its own on the session's server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from leases import PostgresLeaseProvider
from leases.testing import LeaseProviderConformance
from pubsub import PostgresPubSub
from pubsub.testing import PubSubConformance
from signals.kit import SQLCore
from signals.testing import SignalBackendConformance

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


class TestPostgresPubSub(PubSubConformance):
    max_delivery_attempts = 3

    @pytest.fixture
    async def pubsub(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema,
                                  max_delivery_attempts=self.max_delivery_attempts) as backend:
            yield backend


class TestPostgresLeases(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, postgres_dsn: str, pg_schema: str
                       ) -> AsyncIterator[PostgresLeaseProvider]:
        provider = PostgresLeaseProvider(postgres_dsn, schema=pg_schema)
        yield provider
        await provider.aclose()


class TestPostgresPubSubAsLeases(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema) as backend:
            yield backend


class TestPostgresCore(SignalBackendConformance):
    @pytest.fixture
    async def pubsub(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema) as backend:
            yield backend

    @pytest.fixture
    def leases(self, pubsub: PostgresPubSub) -> Any:
        return pubsub.get_lease_provider()

    @pytest.fixture
    async def core(self, pubsub: PostgresPubSub, leases: Any) -> AsyncIterator[SQLCore]:
        core = SQLCore(pubsub.sql_database, leases=leases, pubsub=pubsub)
        yield core
        left = await core.due(limit=1000, until=float("inf"))
        assert left.threads == [], f"the check left pending work on {left.threads}"

    @pytest.fixture
    def small_core(self, pubsub: PostgresPubSub) -> SQLCore:
        return SQLCore(pubsub.sql_database, stream_max_parts=5)


async def test_a_routed_signal_waits_for_few_round_trips(
        postgres_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A regression guard on round trips and statements (not time): every time a call waits
    for the server (a read, a row count, the clock when no read brought it along, and the
    commit at the end, which carries every pipelined write and COMMIT), summed over both
    sides of routed signals in one process, and every statement sent. BEGIN, the clock's
    query and pipelined writes go out without waiting (docs/postgres.md)."""
    import anyio

    from _signal_leases import sql
    from signals import Run, Signal, SignalRuntime

    waits = statements = 0
    read: set[int] = set()  # the transactions (by id) whose first read has been answered
    alive: list[Any] = []  # ... kept, so that no id is used twice

    def counting(name: str, wait: bool) -> None:
        original = getattr(sql.Tx, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal waits, statements
            statements += len(args[0]) if name == "read_many" else 1
            if wait:
                waits += 1
                read.add(id(self))
                alive.append(self)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(sql.Tx, name, wrapper)

    for name in ("execute", "one", "all", "read_many"):  # value() goes through one()
        counting(name, wait=True)
    counting("write", wait=False)  # (many() is one statement per row: none on this path)
    original_clock = sql.Tx._read_clock

    def clock(self: Any) -> Any:
        nonlocal waits
        if id(self) not in read and self._now is None:
            waits += 1  # asked for before any read: a round trip of its own
        return original_clock(self)
    monkeypatch.setattr(sql.Tx, "_read_clock", clock)
    original_call = sql.Database._call

    def call(self: Any, fn: Any, write: bool, what: str) -> Any:
        nonlocal waits
        waits += 1 if write else 0  # the commit (a read-only call runs without a transaction)
        return original_call(self, fn, write, what)
    monkeypatch.setattr(sql.Database, "_call", call)

    n = 20
    acked: list[str] = []
    changed = [anyio.Event()]

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)
            acked.append(signal.id)
            changed[0].set()
            changed[0] = anyio.Event()

    async def until(count: int) -> None:
        with anyio.fail_after(20):
            while len(acked) < count:
                await changed[0].wait()

    async with PostgresPubSub(postgres_dsn, schema=pg_schema) as ps, SignalRuntime(
            pubsub=ps, agent=agent, idle_wait_ms=60_000) as worker, SignalRuntime(
            pubsub=ps, agent=None) as sender:
        await worker.send("t", Signal("first"))
        await until(1)
        await anyio.sleep(0.3)  # the worker's background calls settle
        waits = statements = 0
        for i in range(n):
            await sender.send("t", Signal(i))
            await until(i + 2)
        per_signal = waits / n
        statements_per_signal = statements / n
    # Measured at 5.55 to 5.6 (the background calls of the window included): the reads of
    # each call go out together (SQLTables.preload), with BEGIN and the clock, and read-only
    # calls run without a transaction; 21 to 22.4 with a round trip per read, BEGIN and
    # COMMIT; 39 with every statement waiting (no pipeline).
    assert per_signal <= 7, per_signal
    # And statements (each costs the client and the server CPU whether it waits or not):
    # 21.6 over both sides (BEGIN, the clock and COMMIT aside), 25.5 before the entry was
    # inserted carried and the counts on the thread's row were written with its save.
    assert statements_per_signal <= 23, statements_per_signal


async def test_parts_emitted_beside_routed_signals_keep_distinct_numbers(
        postgres_dsn: str, pg_schema: str) -> None:
    """A call that read its thread ahead numbers its part from what it read; a run's emits
    on the same thread at the same time must not take that number (they wait for the
    thread's lock: without it, a duplicate key fails the acknowledgement)."""
    import anyio

    from signals import Run, Signal, SignalRuntime

    n, acked = 40, set()
    done = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            async with anyio.create_task_group() as tg:
                for k in range(3):
                    tg.start_soon(run.emit, {"k": k})
            await run.ack(signal)
            acked.add(signal.id)
            if len(acked) == n:
                done.set()

    async with PostgresPubSub(postgres_dsn, schema=pg_schema) as ps, SignalRuntime(
            pubsub=ps, agent=agent, idle_wait_ms=60_000), PostgresPubSub(
            postgres_dsn, schema=pg_schema) as other, SignalRuntime(
            pubsub=other, agent=None) as sender:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(sender.send, "t", Signal(i, id=f"s{i}"))
        with anyio.fail_after(30):
            await done.wait()
        parts = [p async for p in sender.stream("t", follow=False)]
    assert sum(p.kind == "part" for p in parts) == 3 * n
