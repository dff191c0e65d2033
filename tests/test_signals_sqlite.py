"""The SQL core on SQLite runs every ``signals.testing`` kit (asyncio and trio), fused with the
lease tables of the same file; and the same core without the leases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from _signal_leases.sql.sqlite import SQLiteDatabase
from leases import SQLiteLeaseProvider
from pubsub import InMemoryPubSub, SQLitePubSub
from signals import Run, SignalRuntime
from signals.kit import SQLCore
from signals.testing import SignalBackendConformance

pytestmark = pytest.mark.anyio


class TestSQLiteCore(SignalBackendConformance):
    """Fused with the leases, notices written in the same transaction (``SQLitePubSub``)."""

    @pytest.fixture
    async def pubsub(self, tmp_path: Path) -> AsyncIterator[SQLitePubSub]:
        async with SQLitePubSub(tmp_path / "signals.db") as pubsub:
            yield pubsub

    @pytest.fixture
    def leases(self, pubsub: SQLitePubSub) -> Any:
        return pubsub.get_lease_provider()

    @pytest.fixture
    def core(self, pubsub: SQLitePubSub, leases: Any) -> SQLCore:
        return SQLCore(pubsub.sql_database, leases=leases, pubsub=pubsub)

    @pytest.fixture
    def small_core(self, pubsub: SQLitePubSub) -> SQLCore:
        return SQLCore(pubsub.sql_database, stream_max_parts=5)


class TestSQLiteCoreNoticesApart(SignalBackendConformance):
    """Fused, with notices over a pub/sub in another place (published after the commit)."""

    @pytest.fixture
    async def database(self, tmp_path: Path) -> AsyncIterator[SQLiteDatabase]:
        db = SQLiteDatabase(tmp_path / "signals.db")
        yield db
        await db.aclose()

    @pytest.fixture
    def leases(self, database: SQLiteDatabase) -> SQLiteLeaseProvider:
        return SQLiteLeaseProvider(database=database)

    @pytest.fixture
    async def core(self, database: SQLiteDatabase, leases: SQLiteLeaseProvider
                   ) -> AsyncIterator[SQLCore]:
        async with InMemoryPubSub() as pubsub:
            yield SQLCore(database, leases=leases, pubsub=pubsub)


class TestSQLiteCoreUnfused(SignalBackendConformance):
    @pytest.fixture
    async def core(self, tmp_path: Path) -> AsyncIterator[Any]:
        db = SQLiteDatabase(tmp_path / "signals.db")
        yield SQLCore(db)
        await db.aclose()


def test_leases_without_a_notice_channel_are_refused(tmp_path: Path) -> None:
    db = SQLiteDatabase(tmp_path / "signals.db")
    with pytest.raises(TypeError, match="leases= needs pubsub="):
        SQLCore(db, leases=SQLiteLeaseProvider(database=db))
    core = SQLCore(db)  # neither: no fused calls, no notice channel (the runtime derives them)
    assert not hasattr(core, "notify") and not hasattr(core, "listen")


def _count_transactions(pubsub: SQLitePubSub) -> list[str]:
    """The transactions ``pubsub``'s connections begin from now on (``BEGIN`` or ``BEGIN
    IMMEDIATE``), recorded by SQLite's trace callback."""
    seen: list[str] = []
    database = pubsub.sql_database
    connect = database.connect

    def counting() -> Any:
        conn = connect()
        conn.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("BEGIN") else None)
        return conn

    database.connect = counting  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_routed_signal_costs_one_write_on_each_side(anyio_backend: str,
                                                            tmp_path: Path) -> None:
    """Two processes' worth of backends on one file (two pub/subs): a signal routed to a run
    that waits costs the sender one write transaction (the inbox, the carry and the notice
    together) and the owner one read (the notice) and one write (the acknowledgement)."""
    first_done, acked = anyio.Event(), anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)
            (first_done if signal.payload == "first" else acked).set()

    path = tmp_path / "one.db"
    quiet: dict[str, Any] = {"idle_wait_ms": 60_000, "recover_interval_ms": 60_000,
                             "lease_ttl_ms": 60_000, "shutdown_timeout_ms": 0}
    owner_ps, sender_ps = SQLitePubSub(path, poll_ms=60_000), SQLitePubSub(path, poll_ms=60_000)
    owner_tx, sender_tx = _count_transactions(owner_ps), _count_transactions(sender_ps)
    async with owner_ps, sender_ps, SignalRuntime(pubsub=owner_ps, agent=agent, **quiet
                                                  ) as owner, \
            SignalRuntime(pubsub=sender_ps, agent=None, **quiet) as sender:
        await owner.send("t", "first")
        with anyio.fail_after(5):
            await first_done.wait()
        await anyio.sleep(0.2)  # the run now waits for its next signal
        await sender.receipt("t", "none")  # the sender's first core call checks the schema
        owner_tx.clear()
        sender_tx.clear()
        assert (await sender.send("t", "routed")).outcome == "deliver"
        with anyio.fail_after(5):
            await acked.wait()
        await anyio.sleep(0.2)
        assert owner.active_run("t") is not None  # the same run: no handoff, no claim
        # Besides, the doorbell reads who listens at most once a second (not per signal).
        assert sender_tx.count("BEGIN IMMEDIATE") == 1 and len(sender_tx) <= 2, sender_tx
        assert sorted(owner_tx) == ["BEGIN", "BEGIN IMMEDIATE"], owner_tx
