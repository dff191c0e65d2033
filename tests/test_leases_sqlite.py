"""SQLiteLeaseProvider on real SQLite files: the conformance suite plus what SQLite adds (one
file shared by processes, the host clock, the path errors, the SQL core's statements).

The Hypothesis state machines for SQLite are in ``tests/test_leases_stateful.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest

from _signal_leases.sql.sqlite import SQLiteDatabase
from leases import (
    AcquireResult,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    LeaseProvider,
    SQLiteLeaseProvider,
    supports_batch_renewal,
    supports_lease_sessions,
)
from leases.testing import LeaseProviderConformance

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("lease_race_worker.py")
ROOT = WORKER.parent.parent


class ManualClockDatabase(SQLiteDatabase):
    """A real SQLite database whose lease clock (``tx.now_ms``) moves only when told to."""

    ms = 1_000_000

    def now_ms(self) -> int:
        return self.ms


class TestSQLiteConformance(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[LeaseProvider]:
        async with SQLiteLeaseProvider(tmp_path / "leases.db") as provider:
            yield provider


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[SQLiteLeaseProvider]:
    async with SQLiteLeaseProvider(tmp_path / "leases.db") as p:
        yield p


async def test_it_offers_sessions_and_batched_renewal(provider: SQLiteLeaseProvider) -> None:
    # so the suite's session and batch checks run instead of skipping
    assert supports_lease_sessions(provider) and supports_batch_renewal(provider)
    assert await provider.open_lease_session(1000) is not None


async def test_tokens_are_one_counter_for_all_keys(provider: SQLiteLeaseProvider) -> None:
    tokens = [(await provider.acquire_lease(k, "a", 60_000)).token for k in ("x", "y", "z")]
    assert tokens == [1, 2, 3]
    assert await provider.transfer_lease("x", "a", "b", 60_000)
    info = await provider.lease_info("x")
    assert info is not None and (info.owner, info.token) == ("b", 4)


async def test_lease_info_reports_the_session_time_left(provider: SQLiteLeaseProvider) -> None:
    assert await provider.lease_info("k") is None
    await provider.acquire_lease("k", "a", 5000)
    info = await provider.lease_info("k")
    assert info is not None and (info.key, info.owner, info.token) == ("k", "a", 1)
    assert info.ttl_ms_remaining is not None and 4000 < info.ttl_ms_remaining <= 5000
    session = await provider.open_lease_session(60_000)
    assert session is not None
    assert (await provider.acquire_lease("s", "a", 10, session=session)).acquired
    in_session = await provider.lease_info("s")
    assert in_session is not None and in_session.ttl_ms_remaining is not None
    assert 59_000 < in_session.ttl_ms_remaining <= 60_000


async def test_a_closed_session_is_gone_with_its_rows(provider: SQLiteLeaseProvider) -> None:
    session = await provider.open_lease_session(60_000)
    other = await provider.open_lease_session(60_000)
    assert session is not None and other is not None
    for key in ("a", "b"):
        assert (await provider.acquire_lease(key, "o", 1, session=session)).acquired
    assert (await provider.acquire_lease("c", "o", 1, session=other)).acquired
    await provider.close_lease_session(session)
    assert not await provider.renew_lease_session(session, 60_000)
    late = await provider.acquire_lease("d", "o", 1000, session=session)
    assert late == AcquireResult(False, None, None)
    assert await provider.get_lease_owner("c") == "o"  # another session is untouched
    with sqlite3.connect(provider.path) as conn:
        rows = conn.execute("SELECT key FROM leases ORDER BY key").fetchall()
    conn.close()
    assert rows == [("c",)]


async def test_replayed_calls_are_idempotent(provider: SQLiteLeaseProvider) -> None:
    first = await provider.acquire_lease("k", "a", 5000)
    assert await provider.acquire_lease("k", "a", 5000) == first
    assert await provider.transfer_lease("k", "a", "b", 5000)
    assert await provider.transfer_lease("k", "a", "b", 5000)  # b holds it: True, same token
    info = await provider.lease_info("k")
    assert info is not None and info.owner == "b" and info.token == 2


async def test_batched_renewal_of_more_leases_than_one_statement_takes(
    provider: SQLiteLeaseProvider,
) -> None:
    keys = [f"k{i}" for i in range(1234)]  # three statements of at most 500 pairs
    for key in keys:
        await provider.acquire_lease(key, "a", 60_000)
    await provider.transfer_lease("k700", "a", "b", 60_000)
    items = [(key, "a") for key in keys] + [("nobody-has-it", "a")]
    assert await provider.renew_leases(items, 60_000) == set(keys) - {"k700"}
    assert await provider.renew_leases([], 60_000) == set()


async def test_expiry_is_exact_to_the_millisecond(tmp_path: Path) -> None:
    db = ManualClockDatabase(tmp_path / "leases.db")
    try:
        provider = SQLiteLeaseProvider(database=db)
        await provider.acquire_lease("k", "a", 5)
        session = await provider.open_lease_session(5)
        assert session is not None
        await provider.acquire_lease("s", "a", 1, session=session)
        db.ms += 4
        assert await provider.get_lease_owner("k") == "a"
        assert await provider.get_lease_owner("s") == "a"
        assert (await provider.lease_info("k"), await provider.lease_info("s")) != (None, None)
        db.ms += 1  # now == expiry: gone
        assert await provider.get_lease_owner("k") is None
        assert await provider.get_lease_owner("s") is None
        assert not await provider.renew_lease("k", "a", 1000)
        assert not await provider.renew_lease_session(session, 1000)
    finally:
        await db.aclose()


async def test_a_shared_database_stays_open_and_a_path_is_closed(tmp_path: Path) -> None:
    db = SQLiteDatabase(tmp_path / "shared.db")
    try:
        async with SQLiteLeaseProvider(database=db) as one:
            other = SQLiteLeaseProvider(database=db)
            await one.acquire_lease("k", "a", 60_000)
            assert await other.get_lease_owner("k") == "a"
        assert await other.get_lease_owner("k") == "a"  # `one` left the shared database open
        assert one.path == str(tmp_path / "shared.db")
    finally:
        await db.aclose()
    owning = SQLiteLeaseProvider(tmp_path / "own.db")
    await owning.acquire_lease("k", "a", 1000)
    await owning.aclose()
    await owning.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await owning.get_lease_owner("k")


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, TypeError),
        (("a.db",), {"database": SQLiteDatabase("b.db")}, TypeError),
        ((), {"database": "b.db"}, TypeError),
        ((), {"database": SQLiteDatabase("b.db"), "busy_timeout_ms": 5}, TypeError),
        ((b"a.db",), {}, TypeError),
        (("",), {}, ValueError),
        (("a.db",), {"busy_timeout_ms": -1}, ValueError),
        (("a.db",), {"max_connections": 0}, ValueError),
        (("a.db",), {"max_connections": True}, TypeError),
    ],
)
def test_constructor_arguments(args: Any, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        SQLiteLeaseProvider(*args, **kwargs)


async def test_bad_input_fails_before_any_io(tmp_path: Path) -> None:
    provider = SQLiteLeaseProvider(tmp_path / "missing" / "leases.db")  # unusable if touched
    with pytest.raises(ValueError, match="lease key"):
        await provider.acquire_lease("", "a", 1000)
    with pytest.raises(TypeError, match="ttl_ms"):
        await provider.renew_leases([("k", "a")], 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease owner"):
        await provider.renew_leases([("k", "")], 1000)
    with pytest.raises(ValueError, match="lease session"):
        await provider.acquire_lease("k", "a", 1000, session="")


# -- path errors ---------------------------------------------------------------------------


async def _fails_naming(path: Path) -> None:
    """Both ways in (``async with`` and a first call) raise a permanent error naming ``path``."""
    with pytest.raises(BackendPermanentError) as entering:
        async with SQLiteLeaseProvider(path):
            pass
    assert str(path) in str(entering.value)
    provider = SQLiteLeaseProvider(path)
    try:
        with pytest.raises(BackendPermanentError) as calling:
            await provider.acquire_lease("k", "a", 1000)
        assert str(path) in str(calling.value)
    finally:
        await provider.aclose()


async def test_a_missing_directory_is_a_permanent_error(tmp_path: Path) -> None:
    await _fails_naming(tmp_path / "no-such-dir" / "leases.db")


async def test_a_file_that_is_not_sqlite_is_a_permanent_error(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("these are notes, not a database\n" * 100)
    await _fails_naming(junk)
    assert junk.read_text().startswith("these are notes")  # left alone


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
async def test_a_read_only_directory_is_a_permanent_error(tmp_path: Path) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        await _fails_naming(folder / "leases.db")
    finally:
        folder.chmod(0o700)


async def test_a_write_lock_held_too_long_is_unavailable_not_an_answer(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    async with SQLiteLeaseProvider(path, busy_timeout_ms=100) as provider:
        await provider.acquire_lease("k", "a", 60_000)
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another process's long write transaction
            with pytest.raises(BackendUnavailableError, match="busy"):
                await provider.acquire_lease("k", "b", 60_000)
            with pytest.raises(BackendUnavailableError):
                await provider.renew_lease("k", "a", 60_000)
            assert await provider.get_lease_owner("k") == "a"  # WAL: reads go on
            blocker.execute("ROLLBACK")
            assert await provider.renew_lease("k", "a", 60_000)
        finally:
            blocker.close()


async def test_a_schema_of_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    async with SQLiteLeaseProvider(path) as provider:
        await provider.acquire_lease("k", "a", 1000)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_versions SET version = 2 WHERE component = 'leases'")
    conn.close()
    with pytest.raises(BackendPermanentError, match="schema version 2"):
        async with SQLiteLeaseProvider(path):
            pass


# -- the statements ------------------------------------------------------------------------


class TracedDatabase(SQLiteDatabase):
    """A real SQLite database that records every statement its connections run."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.statements: list[str] = []

    def connect(self) -> Any:
        conn = super().connect()
        conn.set_trace_callback(self.statements.append)
        return conn


async def test_no_lease_operation_scans_the_leases_table(tmp_path: Path) -> None:
    db = TracedDatabase(tmp_path / "leases.db")
    try:
        provider = SQLiteLeaseProvider(database=db)
        session = await provider.open_lease_session(60_000)
        assert session is not None
        db.statements.clear()
        await provider.acquire_lease("k", "a", 1000)
        await provider.acquire_lease("k", "a", 1000)
        await provider.acquire_lease("k", "b", 1000)
        await provider.acquire_lease("s", "a", 1000, session=session)
        await provider.get_lease_owner("k")
        await provider.lease_info("k")
        await provider.renew_lease("k", "a", 1000)
        await provider.renew_leases([("k", "a"), ("s", "a")], 1000)
        await provider.transfer_lease("k", "a", "b", 1000)
        await provider.release_lease("k", "b")
        await provider.renew_lease_session(session, 1000)
        await provider.close_lease_session(session)
        queries = [s for s in db.statements if s.split()[0] in {"SELECT", "UPDATE", "INSERT",
                                                                "DELETE"}]
        assert len(queries) > 12
        with sqlite3.connect(db.path) as conn:
            for query in queries:
                plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}")]
                scans = [step for step in plan if step.startswith("SCAN") and "CONSTANT" not in step
                         and not step.startswith("SCAN v")]
                assert not scans, (query, plan)
        conn.close()
    finally:
        await db.aclose()


# -- processes -----------------------------------------------------------------------------


class Child:
    """A SQLiteLeaseProvider in another process (``lease_race_worker.py --sqlite-serve``)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--sqlite-serve", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )

    def _call(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the child process died (exit code {self.proc.wait()})"
        return json.loads(answer)

    async def __call__(self, method: str, *args: object) -> Any:
        return await anyio.to_thread.run_sync(self._call, json.dumps([method, *args]))

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            assert self.proc.wait(timeout=30) == 0
        finally:
            self.proc.stdout.close()


async def test_two_processes_share_leases_tokens_and_the_clock(
    provider: SQLiteLeaseProvider,
) -> None:
    child = Child(Path(provider.path))
    try:
        t1 = (await provider.acquire_lease("k", "parent", 60_000)).token
        assert await child("acquire_lease", "k", "child", 60_000) == [False, "parent", None]
        held, _, t2 = await child("acquire_lease", "c", "child", 60_000)
        assert held and t1 is not None and t2 > t1  # one counter for both processes
        info = await provider.lease_info("c")
        assert info is not None and (info.owner, info.token) == ("child", t2)

        await provider.release_lease("k", "parent")
        held, _, t3 = await child("acquire_lease", "k", "child", 150)  # expires by itself
        assert held and t3 > t2
        assert await provider.acquire_lease("k", "parent", 60_000) == AcquireResult(
            False, "child", None
        )
        await anyio.sleep(0.2)  # past the child's expiry, on the parent's reading of the clock
        assert await provider.get_lease_owner("k") is None
        t4 = (await provider.acquire_lease("k", "parent", 60_000)).token
        assert t4 is not None and t4 > t3
        assert await child("get_lease_owner", "k") == "parent"
        assert not await child("renew_lease", "k", "child", 60_000)

        session = await child("open_lease_session", 60_000)
        assert await child("acquire_lease", "s", "child", 1, {"session": session})
        assert await provider.get_lease_owner("s") == "child"
        await child("close_lease_session", session)
        assert await provider.get_lease_owner("s") is None
        assert await child("renew_leases", [["c", "child"], ["k", "child"]], 1000) == ["c"]
    finally:
        child.close()


@pytest.mark.slow
def test_many_processes_race_for_one_key_one_winner(tmp_path: Path) -> None:
    contenders = 40
    db, folder = tmp_path / "leases.db", tmp_path / "barrier"
    folder.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "--sqlite", str(db), str(folder), "thread-1", f"p{i}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        )
        for i in range(contenders)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(folder.glob("ready-*"))) < contenders:
            assert time.monotonic() < deadline, "contenders did not all start"
            assert all(p.poll() is None for p in procs), "a contender died at start"
            time.sleep(0.02)
        (folder / "go").touch()  # every contender polls for it each millisecond
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [err.decode() for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    winners = [r["owner"] for r in results if r["acquired"]]
    assert len(winners) == 1, winners
    (winner,) = winners
    assert all(r["reported_owner"] == winner for r in results)
    assert [r["token"] for r in results if r["acquired"]] == [1]
    assert {r["owner"] for r in results} == {f"p{i}" for i in range(contenders)}


_PEEK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
print(conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0])
conn.close()  # the last connection on the file, if nobody else holds a lock on it
"""


def _peek(path: Path) -> int:
    """What a new process reads of ``notes``, opening and closing the file (its close
    checkpoints and deletes the WAL when it finds no other process holding the file)."""
    found = subprocess.run([sys.executable, "-c", _PEEK, str(path)], capture_output=True,
                           text=True, check=True, timeout=30)
    return int(found.stdout)


async def test_opening_more_connections_keeps_the_file_locked_for_other_processes(
    tmp_path: Path,
) -> None:
    """Each new connection of the pool once read the file's header with ``open()``; its
    ``close()`` dropped every POSIX lock this process held on the file (SQLite's own locks
    included). Another process closing its last connection then took the file for its own,
    checkpointed and deleted the WAL and its index under this process's connections: later
    writes went to a deleted WAL that new processes never saw, and the file could end up
    malformed (the rare failure of test_owners_killed_twice_lose_nothing[sqlite])."""
    path = tmp_path / "shared.db"
    db = SQLiteDatabase(path)
    try:
        await db.run(lambda tx: tx.execute("CREATE TABLE notes (n INTEGER)"))
        # A second connection opened while the first one is open (and in a transaction).
        await db.run(lambda tx: db.run_sync(lambda inner: inner.execute(
            "INSERT INTO notes (n) VALUES (1)")), write=False)
        assert db.connections == 2
        assert await anyio.to_thread.run_sync(_peek, path) == 1
        await db.run(lambda tx: tx.execute("INSERT INTO notes (n) VALUES (2)"))
        assert await anyio.to_thread.run_sync(_peek, path) == 2  # not lost in a deleted WAL
        assert (tmp_path / "shared.db-wal").exists()  # the WAL is still where it was
    finally:
        await db.aclose()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert check.execute("SELECT COUNT(*) FROM notes").fetchone() == (2,)
    check.close()
