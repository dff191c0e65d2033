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
from signals import CursorExpiredError, Run, SignalRuntime
from signals.kit import PartIn, SQLCore
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


async def test_a_stream_drops_parts_past_its_age_when_the_next_one_comes(tmp_path: Path
                                                                         ) -> None:
    """The age limit holds although a part is trimmed only when the stream's oldest part is
    past a limit (the check costs no statement of its own)."""
    db = SQLiteDatabase(tmp_path / "signals.db")
    core = SQLCore(db, stream_retention_ms=100)
    old = await core.emit("t", [PartIn("part", "r/1", None, str(n)) for n in range(3)])
    assert [p.data for p in await core.stream_read("t")] == [0, 1, 2]
    await anyio.sleep(0.2)
    await core.emit("t", [PartIn("part", "r/1", None, "3")])
    assert [p.data for p in await core.stream_read("t")] == [3]
    with pytest.raises(CursorExpiredError):
        await core.stream_read("t", after=old[0])
    await db.aclose()


def _count_statements(pubsub: SQLitePubSub) -> list[str]:
    """The statements ``pubsub``'s connections run from now on, recorded by SQLite's trace
    callback."""
    seen: list[str] = []
    database = pubsub.sql_database
    connect = database.connect

    def counting() -> Any:
        conn = connect()
        conn.set_trace_callback(seen.append)
        return conn

    database.connect = counting  # type: ignore[method-assign]
    return seen


def _begins(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("BEGIN")]


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
    owner_sql, sender_sql = _count_statements(owner_ps), _count_statements(sender_ps)
    async with owner_ps, sender_ps, SignalRuntime(pubsub=owner_ps, agent=agent, **quiet
                                                  ) as owner, \
            SignalRuntime(pubsub=sender_ps, agent=None, **quiet) as sender:
        await owner.send("t", "first")
        with anyio.fail_after(5):
            await first_done.wait()
        await anyio.sleep(0.2)  # the run now waits for its next signal
        await sender.receipt("t", "none")  # the sender's first core call checks the schema
        owner_sql.clear()
        sender_sql.clear()
        assert (await sender.send("t", "routed")).outcome == "deliver"
        with anyio.fail_after(5):
            await acked.wait()
        await anyio.sleep(0.2)
        assert owner.active_run("t") is not None  # the same run: no handoff, no claim
        # Besides, the doorbell reads who listens at most once a second (not per signal).
        sender_tx, owner_tx = _begins(sender_sql), _begins(owner_sql)
        assert sender_tx.count("BEGIN IMMEDIATE") == 1 and len(sender_tx) <= 2, sender_tx
        assert sorted(owner_tx) == ["BEGIN", "BEGIN IMMEDIATE"], owner_tx
        # And few statements: the sender's route is 13 with BEGIN and COMMIT (one of them
        # looks for the id among the entries waiting, whose receipt may have been trimmed;
        # 12 before that, 14 before the entry was inserted carried and the receipt counted
        # with the part's number, 18 before the thread's row was written once, the inserted
        # entry reused and a stream trimmed only when it has parts past its limits), the
        # owner's notice read and acknowledgement 14.
        assert len(sender_sql) - 3 * (len(sender_tx) - 1) <= 13, sender_sql
        assert len(owner_sql) <= 14, owner_sql


async def test_a_follower_of_many_threads_sees_another_process_write_to_any(
    tmp_path: Path,
) -> None:
    """One follower waits on 1,200 threads (more than one poll's query covers); a part written
    by another core on the same file (another process) to any of them reaches its waiter."""
    path = tmp_path / "signals.db"
    db, other_db = SQLiteDatabase(path), SQLiteDatabase(path)
    core, other = SQLCore(db, follow_poll_ms=20), SQLCore(other_db)
    threads = [f"t{n}" for n in range(1200)]
    got: dict[str, Any] = {}
    try:
        async with core.follower() as follower:

            three = anyio.Event()

            async def wait(thread: str) -> None:
                got[thread] = [p.data for p in await follower.wait(thread, None)]
                if len(got) == 3:
                    three.set()

            async with anyio.create_task_group() as tg:
                for thread in threads:
                    tg.start_soon(wait, thread)
                await anyio.sleep(0.5)  # every waiter waits
                for thread in (threads[0], threads[700], threads[-1]):
                    await other.emit(thread, [PartIn("part", "r/1", None, '"x"')])
                with anyio.fail_after(5):
                    await three.wait()
                assert got == {threads[0]: ["x"], threads[700]: ["x"], threads[-1]: ["x"]}
                tg.cancel_scope.cancel()
    finally:
        await db.aclose()
        await other_db.aclose()


async def test_a_second_reader_of_a_thread_misses_no_part_written_during_its_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two readers follow one thread in one process. While the second one's read is on its way
    (it finds nothing), another process writes a part and a poll sees it: the second reader
    gets the part too, not only the first (it waits from before it reads)."""
    path = tmp_path / "signals.db"
    db, other_db = SQLiteDatabase(path), SQLiteDatabase(path)
    core, other = SQLCore(db, follow_poll_ms=10), SQLCore(other_db)
    start = (await core.emit("t", [PartIn("part", "r/1", None, "0")]))[0]
    got: dict[str, list[Any]] = {}
    try:
        async with core.follower() as follower:
            read = core.stream_read
            slowed: list[None] = []

            async def read_then_write(thread_key: str, **kwargs: Any) -> Any:
                parts = await read(thread_key, **kwargs)
                if len(follower.waiting.get("t", ())) and not slowed and "second" in got:
                    slowed.append(None)
                    await other.emit("t", [PartIn("part", "r/1", None, "1")])
                    await anyio.sleep(0.1)  # polls see it and ring the waiters
                return parts

            monkeypatch.setattr(core, "stream_read", read_then_write)

            async def reader(name: str) -> None:
                got[name] = []
                got[name] = [p.data for p in await follower.wait("t", start)]

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reader, "first")
                    await anyio.sleep(0.1)  # it waits
                    tg.start_soon(reader, "second")
            assert got == {"first": [1], "second": [1]}
    finally:
        await db.aclose()
        await other_db.aclose()
