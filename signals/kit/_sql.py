"""``SQLCore``: the reference engine over a SQL database (SQLite, Postgres, or yours).

Every core call is one transaction run whole in a worker thread
(:class:`~_signal_leases.sql.Database`); the engine's rules (``_engine``) run inside it over
:class:`SQLTables`, whose every method is one indexed statement: no table scan on a hot path
(each query names the thread, or reads an index by its first column). On Postgres every call
that changes a thread first takes a transaction-scoped advisory lock on the thread key, so
calls on one thread are serial (calls on different threads are not); on SQLite the write
transaction holds the database.

With the lease tables of the same database (``fused=True``: the lease provider of the same
pub/sub) it also offers the fused calls, reading and granting the thread's lease in the same
transaction as the inbox change. Notices go through ``notices`` (the pub/sub's, normally).
Output streams are a table of parts; one follower per process watches the threads someone
waits on, waking local readers at once and polling for other processes' parts every
``follow_poll_ms`` while anyone waits (nothing when nobody does).

Over 400 lines on purpose: the table driver (one short method per statement) and the core's
async entry points, which only call the engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

import _signal_leases.sql.leases as sql_leases
from _signal_leases.errors import CursorExpiredError
from _signal_leases.sql import Database, Tx
from _signal_leases.validation import check_int
from signals._model import EntryMode, Receipt, Signal, StreamPart
from signals.kit._capabilities import Claim, Claimed, Notice, PartIn, Routed
from signals.kit._core import (
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    Due,
    InboxEntry,
    Limits,
    RunRef,
    Taken,
    ThreadState,
)
from signals.kit._derived import LocalNotices
from signals.kit._engine import Engine, Outbox
from signals.kit._tables import EntryRow, LeaseAccess, ReceiptRow, ThreadRow

if TYPE_CHECKING:
    from leases import LeaseProvider

__all__ = ["SQLCore", "SQLTables", "ddl"]

T = TypeVar("T")
COMPONENT, VERSION = "signals", 1
DAY_MS = 86_400_000

_E = ("thread, seq, sid, body, mode, prio, lane, merge, state, due, nb, expires, holder, "
      "attempts, error")
_R = "thread, sid, status, accepted, at, run, result, error, by_sid, body, mode, attempts"
_T = "key, seq, pending, paused, token, run, since, last, look, abort, lanes"


def ddl(dialect: str) -> list[str]:
    """The signal tables in ``dialect`` (``sqlite`` or ``postgres``)."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    real = "DOUBLE PRECISION" if dialect == "postgres" else "REAL"
    return [
        f"CREATE TABLE sig_threads (key TEXT PRIMARY KEY, seq {big} NOT NULL, pending {big} "
        f"NOT NULL, paused INTEGER NOT NULL, token {big}, run TEXT, since {real}, last {real}, "
        f"look {real}, abort TEXT, lanes TEXT, pseq {big} NOT NULL DEFAULT 0, ptrim {big} "
        f"NOT NULL DEFAULT 0, receipts {big} NOT NULL DEFAULT 0)",
        "CREATE INDEX sig_threads_look ON sig_threads (look) WHERE look IS NOT NULL",
        f"CREATE TABLE sig_entries (thread TEXT NOT NULL, seq {big} NOT NULL, sid TEXT NOT "
        f"NULL, body TEXT NOT NULL, mode TEXT NOT NULL, prio INTEGER NOT NULL, lane TEXT, "
        f"merge TEXT NOT NULL, state TEXT NOT NULL, due {real}, nb {real}, expires {real}, "
        f"holder TEXT, attempts INTEGER NOT NULL, error TEXT, PRIMARY KEY (thread, seq))",
        "CREATE UNIQUE INDEX sig_entries_sid ON sig_entries (thread, sid)",
        "CREATE INDEX sig_entries_ready ON sig_entries (thread, state, prio DESC, seq)",
        "CREATE INDEX sig_entries_due ON sig_entries (thread, due) WHERE state = 'later'",
        "CREATE INDEX sig_entries_expires ON sig_entries (thread, expires) "
        "WHERE expires IS NOT NULL",
        "CREATE INDEX sig_entries_lane ON sig_entries (thread, lane, seq) WHERE lane IS NOT NULL",
        f"CREATE TABLE sig_receipts (thread TEXT NOT NULL, sid TEXT NOT NULL, status TEXT NOT "
        f"NULL, accepted {real} NOT NULL, at {real}, run TEXT, result TEXT, error TEXT, by_sid "
        f"TEXT, body TEXT, mode TEXT, attempts INTEGER NOT NULL, PRIMARY KEY (thread, sid))",
        "CREATE INDEX sig_receipts_accepted ON sig_receipts (thread, accepted)",
        "CREATE INDEX sig_receipts_dead ON sig_receipts (thread, at) "
        "WHERE status = 'dead_lettered' AND body IS NOT NULL",
        f"CREATE TABLE sig_parts (thread TEXT NOT NULL, n {big} NOT NULL, kind TEXT NOT NULL, "
        f"run TEXT, sid TEXT, data TEXT, at {real} NOT NULL, PRIMARY KEY (thread, n))",
    ]


class _Leases:
    """The engine's view of the lease tables of the same database (``_signal_leases.sql``)."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    def live(self, key: str) -> tuple[str, int | None, str | None] | None:
        found = sql_leases.live(self._tx, key)
        return None if found is None else (found.owner, found.token, found.session)

    def grant(self, key: str, owner: str, ttl_ms: int, session: str | None) -> int | None:
        sql_leases.lock(self._tx, key)
        if sql_leases.live(self._tx, key) is not None:
            return None
        if session is not None and not sql_leases.session_live(self._tx, session):
            return None
        return sql_leases.grant(self._tx, key, owner, ttl_ms, session)

    def release(self, key: str, owner: str) -> None:
        sql_leases.release(self._tx, key, owner)

    def left_ms(self, key: str) -> int | None:
        found = sql_leases.info(self._tx, key)
        return None if found is None else found[2]


def _thread(row: tuple[Any, ...]) -> ThreadRow:
    key, seq, pending, paused, token, run, since, last, look, abort, lanes = row
    return ThreadRow(key, int(seq), int(pending), bool(paused), token, run, since, last, look,
                     abort, json.loads(lanes) if lanes else {})


def _entry(r: tuple[Any, ...]) -> EntryRow:
    return EntryRow(r[0], int(r[1]), r[2], r[3], r[4], int(r[5]), r[6], r[7], r[8], r[9], r[10],
                    r[11], r[12], int(r[13]), r[14])


def _receipt(r: tuple[Any, ...]) -> ReceiptRow:
    return ReceiptRow(r[0], r[1], r[2], float(r[3]), r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                      int(r[11]))


class SQLTables:
    """The engine's driver over SQL (see the module docstring), inside one transaction."""

    def __init__(self, tx: Tx, *, fused: bool, stream_max_parts: int,
                 stream_retention_s: float) -> None:
        self._tx = tx
        self.now = tx.wall
        self.streams = True
        self.leases: LeaseAccess | None = _Leases(tx) if fused else None
        self._max_parts = stream_max_parts
        self._retention_s = stream_retention_s
        self._locked: set[str] = set()

    def _lock(self, key: str) -> None:
        if self._tx.dialect == "postgres" and key not in self._locked:
            self._tx.execute("SELECT pg_advisory_xact_lock(1397311815, hashtext(?))", (key,))
            self._locked.add(key)

    # -- threads ----------------------------------------------------------------------------

    def thread(self, key: str) -> ThreadRow | None:
        self._lock(key)
        row = self._tx.one(f"SELECT {_T} FROM sig_threads WHERE key = ?", (key,))
        return None if row is None else _thread(row)

    def save_thread(self, r: ThreadRow) -> None:
        self._tx.execute(
            f"INSERT INTO sig_threads ({_T}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, pending = excluded.pending, "
            "paused = excluded.paused, token = excluded.token, run = excluded.run, "
            "since = excluded.since, last = excluded.last, look = excluded.look, "
            "abort = excluded.abort, lanes = excluded.lanes",
            (r.key, r.seq, r.pending, int(r.paused), r.token, r.run, r.since, r.last, r.look,
             r.abort, r.lanes_json() or None),
        )

    # -- entries ----------------------------------------------------------------------------

    def insert(self, e: EntryRow) -> None:
        self._tx.execute(
            f"INSERT INTO sig_entries ({_E}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (e.thread, e.seq, e.sid, e.body, e.mode, e.prio, e.lane, e.merge, e.state, e.due,
             e.nb, e.expires, e.holder, e.attempts, e.error),
        )

    def update(self, e: EntryRow) -> None:
        self._tx.execute(
            "UPDATE sig_entries SET state = ?, due = ?, holder = ?, attempts = ?, error = ? "
            "WHERE thread = ? AND seq = ?",
            (e.state, e.due, e.holder, e.attempts, e.error, e.thread, e.seq),
        )

    def delete(self, key: str, seqs: Sequence[int]) -> None:
        self._tx.many("DELETE FROM sig_entries WHERE thread = ? AND seq = ?",
                      [(key, s) for s in seqs])

    def _rows(self, where: str, params: Sequence[Any], tail: str = "") -> list[EntryRow]:
        return [_entry(r) for r in self._tx.all(
            f"SELECT {_E} FROM sig_entries WHERE thread = ? AND {where} {tail}", params)]

    def by_signal(self, key: str, sid: str) -> EntryRow | None:
        rows = self._rows("sid = ?", (key, sid))
        return rows[0] if rows else None

    def best(self, key: str, run: str | None) -> EntryRow | None:
        rows = self._rows("state = 'ready'", (key,), "ORDER BY prio DESC, seq LIMIT 1")
        if run is not None:
            rows += self._rows("state = 'carried' AND holder = ?", (key, run),
                               "ORDER BY prio DESC, seq LIMIT 1")
        return min(rows, key=lambda e: (-e.prio, e.seq), default=None)

    def lane(self, key: str, lane: str) -> list[EntryRow]:
        return self._rows("lane = ?", (key, lane), "ORDER BY seq")

    def ripe(self, key: str, until: float) -> list[EntryRow]:
        return self._rows("state = 'later' AND due <= ?", (key, until))

    def expired(self, key: str, now: float) -> list[EntryRow]:
        return self._rows("expires IS NOT NULL AND expires <= ? AND state <> 'held'", (key, now))

    def held_by_others(self, key: str, run: str) -> list[EntryRow]:
        return self._rows("state IN ('held', 'carried') AND holder <> ?", (key, run))

    def rows(self, key: str, limit: int, offset: int) -> list[EntryRow]:
        return self._rows("1 = 1", (key, limit, offset), "ORDER BY prio DESC, seq LIMIT ? OFFSET ?")

    def droppable(self, key: str) -> EntryRow | None:
        rows = self._rows("state IN ('ready', 'later')", (key,), "ORDER BY prio, seq LIMIT 1")
        return rows[0] if rows else None

    def next_due(self, key: str) -> float | None:
        found = self._tx.value(
            "SELECT due FROM sig_entries WHERE thread = ? AND state = 'later' ORDER BY due "
            "LIMIT 1", (key,))
        return None if found is None else float(found)

    # -- receipts ---------------------------------------------------------------------------

    def receipt(self, key: str, sid: str) -> ReceiptRow | None:
        row = self._tx.one(f"SELECT {_R} FROM sig_receipts WHERE thread = ? AND sid = ?",
                           (key, sid))
        return None if row is None else _receipt(row)

    def put_receipt(self, r: ReceiptRow) -> None:
        added = self._tx.execute(
            f"INSERT INTO sig_receipts ({_R}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (thread, sid) DO NOTHING",
            (r.thread, r.sid, r.status, r.accepted, r.at, r.run, r.result, r.error, r.by,
             r.body, r.mode, r.attempts),
        )
        if added:
            self._tx.execute("UPDATE sig_threads SET receipts = receipts + 1 WHERE key = ?",
                             (r.thread,))
            return
        self._tx.execute(
            "UPDATE sig_receipts SET status = ?, at = ?, run = ?, result = ?, error = ?, "
            "by_sid = ?, body = ?, mode = ?, attempts = ? WHERE thread = ? AND sid = ?",
            (r.status, r.at, r.run, r.result, r.error, r.by, r.body, r.mode, r.attempts,
             r.thread, r.sid),
        )

    def trim_receipts(self, key: str, before: float, keep: int) -> None:
        count = self._tx.value("SELECT receipts FROM sig_threads WHERE key = ?", (key,))
        old = self._tx.all(
            "SELECT sid FROM sig_receipts WHERE thread = ? AND accepted < ? ORDER BY accepted "
            "LIMIT 100", (key, before))
        over = max(0, int(count or 0) - len(old) - keep + 1)
        if over:
            old += self._tx.all(
                "SELECT sid FROM sig_receipts WHERE thread = ? AND accepted >= ? ORDER BY "
                "accepted LIMIT ?", (key, before, min(over, 100)))
        if old:
            self._tx.many("DELETE FROM sig_receipts WHERE thread = ? AND sid = ?",
                          [(key, r[0]) for r in old])
            self._tx.execute("UPDATE sig_threads SET receipts = receipts - ? WHERE key = ?",
                             (len(old), key))

    def dead(self, key: str, limit: int) -> list[ReceiptRow]:
        return [_receipt(r) for r in self._tx.all(
            f"SELECT {_R} FROM sig_receipts WHERE thread = ? AND status = 'dead_lettered' "
            "AND body IS NOT NULL ORDER BY at LIMIT ?", (key, limit))]

    # -- the pending index ------------------------------------------------------------------

    def due_threads(self, until: float, limit: int) -> list[str]:
        if self.leases is None:
            return [r[0] for r in self._tx.all(
                "SELECT key FROM sig_threads WHERE look IS NOT NULL AND look <= ? AND paused = 0 "
                "ORDER BY look LIMIT ?", (until, limit))]
        return [r[0] for r in self._tx.all(
            "SELECT t.key FROM sig_threads AS t WHERE t.look IS NOT NULL AND t.look <= ? AND "
            "t.paused = 0 AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.key = t.key AND "
            f"{sql_leases.LIVE}) ORDER BY t.look LIMIT ?", (until, self._tx.now_ms, limit))]

    def next_look(self, after: float) -> float | None:
        found = self._tx.value(
            "SELECT look FROM sig_threads WHERE look IS NOT NULL AND look > ? AND paused = 0 "
            "ORDER BY look LIMIT 1", (after,))
        return None if found is None else float(found)

    # -- output -----------------------------------------------------------------------------

    def add_part(self, key: str, part: PartIn) -> str:
        tx = self._tx
        tx.execute(
            "INSERT INTO sig_threads (key, seq, pending, paused, pseq) VALUES (?, 0, 0, 0, 1) "
            "ON CONFLICT (key) DO UPDATE SET pseq = sig_threads.pseq + 1", (key,))
        n = int(tx.value("SELECT pseq FROM sig_threads WHERE key = ?", (key,)))
        tx.execute("INSERT INTO sig_parts (thread, n, kind, run, sid, data, at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (key, n, part.kind, part.run_id or None, part.signal_id, part.data, self.now))
        horizon = self.now - self._retention_s
        gone = tx.value("SELECT MAX(n) FROM sig_parts WHERE thread = ? AND (n <= ? OR at < ?)",
                        (key, n - self._max_parts, horizon))
        if gone is not None:
            tx.execute("DELETE FROM sig_parts WHERE thread = ? AND n <= ?", (key, gone))
            tx.execute("UPDATE sig_threads SET ptrim = ? WHERE key = ? AND ptrim < ?",
                       (gone, key, gone))
        return str(n)


class SQLCore:
    """A :class:`~signals.kit.SignalCore` over a SQL database (see the module docstring).

    ``database``: a :class:`~_signal_leases.sql.Database` (the one of a ``SQLitePubSub`` or
    ``PostgresPubSub``). ``fused``: the database also holds the lease provider's tables
    (``_signal_leases.sql.leases``): the fused calls are offered with ``leases``.
    ``notices``: where notices go (anything with ``notify`` and ``listen``: the runtime's
    derivation over the pub/sub). The rest as :class:`~signals.InMemorySignalStore`.
    """

    def __init__(
        self, database: Database, *, leases: LeaseProvider | None = None,
        notices: Any = None, retention_ms: int = DAY_MS, max_receipts: int = 10_000,
        stream_max_parts: int = 10_000, stream_retention_ms: int = DAY_MS,
        follow_poll_ms: int = 50,
    ) -> None:
        self.database = database
        self.leases = leases
        self.retention_ms = check_int("retention_ms", retention_ms)
        self.max_receipts = check_int("max_receipts", max_receipts)
        self.stream_max_parts = check_int("stream_max_parts", stream_max_parts)
        self.stream_retention_ms = check_int("stream_retention_ms", stream_retention_ms)
        self.follow_poll_ms = check_int("follow_poll_ms", follow_poll_ms)
        self.engine = Engine(retention_ms=retention_ms, max_receipts=max_receipts)
        self._notices = notices if notices is not None else LocalNotices()
        self._ready = False
        self._followers: list[_Follower] = []

    async def _call(self, fn: Callable[[SQLTables], T], *, fused: bool = False,
                    write: bool = True, what: str = "a signal call") -> T:
        if not self._ready:
            await self.database.ensure_schema(COMPONENT, VERSION, ddl(self.database.dialect))
            if self.leases is not None:
                await self.database.ensure_schema(sql_leases.COMPONENT, sql_leases.VERSION,
                                                  sql_leases.ddl(self.database.dialect))
            self._ready = True
        max_parts, retention = self.stream_max_parts, self.stream_retention_ms / 1000
        return await self.database.run(
            lambda tx: fn(SQLTables(tx, fused=fused and self.leases is not None,
                                    stream_max_parts=max_parts, stream_retention_s=retention)),
            write=write, what=what)

    async def _send(self, outbox: Outbox) -> None:
        for runtime_id, notice in outbox.notices:
            await self._notices.notify(runtime_id, notice)

    def _parts_written(self, thread_key: str) -> None:
        for follower in self._followers:
            follower.ring(thread_key)

    # -- the core ---------------------------------------------------------------------------

    async def accept(self, thread_key: str, signal: Signal, mode: EntryMode, *,
                     limits: Limits = NO_LIMITS) -> Accepted:
        e = self.engine
        accepted = await self._call(lambda t: e.accept(t, thread_key, signal, mode, limits)[0],
                                    what=f"send to thread {thread_key!r}")
        self._parts_written(thread_key)
        return accepted

    async def take(self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
                   max_attempts: int, first: bool = False) -> Taken:
        e = self.engine
        taken = await self._call(
            lambda t: e.take(t, thread_key, run, acks, max_attempts, first), fused=True,
            what="inbox take")
        self._parts_written(thread_key)
        return taken

    async def settle(self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
                     failed: Sequence[str] = (), returned: Sequence[str] = (),
                     error: str | None = None) -> bool:
        e = self.engine
        ok = await self._call(
            lambda t: e.settle(t, thread_key, run, acks, failed, returned, error), fused=True,
            what="inbox settle")
        self._parts_written(thread_key)
        return ok

    async def withdraw(self, thread_key: str, signal_ids: Sequence[str] | None, *,
                       held: bool = False) -> list[str]:
        e = self.engine
        return await self._call(lambda t: e.withdraw(t, thread_key, signal_ids, held),
                                what=f"cancel on thread {thread_key!r}")

    async def entries(self, thread_key: str, *, limit: int = 100, offset: int = 0
                      ) -> list[InboxEntry]:
        e = self.engine
        return await self._call(lambda t: e.entries(t, thread_key, limit, offset), write=False,
                                what="inbox read")

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        e = self.engine
        return await self._call(lambda t: e.receipt(t, thread_key, signal_id), write=False,
                                what="receipt read")

    async def due(self, *, limit: int = 100, until: float | None = None) -> Due:
        e = self.engine
        horizon = None if until is None else min(until, 1e300)
        return await self._call(lambda t: e.due(t, limit, horizon), fused=True, write=False,
                                what="pending index read")

    async def look_at(self, thread_key: str, at: float) -> None:
        e = self.engine
        await self._call(lambda t: e.look_at(t, thread_key, at), what="pending index update")

    async def pause(self, thread_key: str, paused: bool) -> bool:
        e = self.engine
        return await self._call(lambda t: e.pause(t, thread_key, paused),
                                what=f"pause of thread {thread_key!r}")

    async def describe(self, thread_keys: Sequence[str]) -> dict[str, ThreadState]:
        e = self.engine
        return await self._call(lambda t: e.describe(t, thread_keys), write=False,
                                what="thread info read")

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        e = self.engine
        return await self._call(lambda t: e.dead_letters(t, thread_key, limit), write=False,
                                what="dead-letter read")

    async def revive(self, thread_key: str, signal_ids: Sequence[str] | None, *,
                     purge: bool = False) -> list[str]:
        e = self.engine
        return await self._call(lambda t: e.revive(t, thread_key, signal_ids, purge),
                                what="dead-letter retry")

    # -- notices (through ``notices``; without it, this process only) ----------------------

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        await self._notices.notify(runtime_id, notice)

    def listen(self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
               ) -> AbstractAsyncContextManager[None]:
        listen: Callable[..., AbstractAsyncContextManager[None]] = self._notices.listen
        return listen(runtime_id, handler, worker=worker)

    # -- fused calls ------------------------------------------------------------------------

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider whose tables live in this database."""
        return self.leases is not None and leases is self.leases

    async def route(self, thread_key: str, signal: Signal, mode: EntryMode, *,
                    claim: Claim | None, sender: str | None, wake_workers: bool,
                    limits: Limits = NO_LIMITS) -> Routed:
        e, outbox = self.engine, Outbox()
        routed = await self._call(
            lambda t: e.route(t, thread_key, signal, mode, claim, sender, wake_workers, limits,
                              outbox), fused=True, what=f"send to thread {thread_key!r}")
        self._parts_written(thread_key)
        await self._send(outbox)
        return routed

    async def claim(self, thread_key: str, claim: Claim) -> Claimed:
        e, outbox = self.engine, Outbox()
        claimed = await self._call(lambda t: e.claim(t, thread_key, claim, outbox), fused=True,
                                   what=f"claim of thread {thread_key!r}")
        await self._send(outbox)
        return claimed

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        e = self.engine
        return await self._call(lambda t: e.release_if_idle(t, thread_key, owner), fused=True,
                                what=f"release of thread {thread_key!r}")

    async def abort(self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
                    ) -> str | None:
        e, outbox = self.engine, Outbox()
        run = await self._call(
            lambda t: e.abort(t, thread_key, run_id, reason, clear, outbox), fused=True,
            what=f"abort on thread {thread_key!r}")
        self._parts_written(thread_key)
        await self._send(outbox)
        return run

    # -- output streams ---------------------------------------------------------------------

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        cursors = await self._call(lambda t: [t.add_part(thread_key, p) for p in parts],
                                   what="stream append")
        self._parts_written(thread_key)
        return cursors

    async def stream_read(self, thread_key: str, *, after: str | None = None,
                          limit: int = 100) -> list[StreamPart]:
        start = int(after) if after is not None else 0

        def read(t: SQLTables) -> tuple[int, list[tuple[Any, ...]]]:
            trimmed = t._tx.value("SELECT ptrim FROM sig_threads WHERE key = ?", (thread_key,))
            rows = t._tx.all("SELECT n, kind, run, sid, data, at FROM sig_parts WHERE thread = ? "
                             "AND n > ? ORDER BY n LIMIT ?", (thread_key, start, limit))
            return int(trimmed or 0), rows

        trimmed, rows = await self._call(read, write=False, what="stream read")
        if after is not None and start < trimmed:
            raise CursorExpiredError(
                f"cursor {after!r} of thread {thread_key!r} is older than the stream retains "
                f"(parts up to {trimmed} were trimmed); read again from after=None")
        return [StreamPart(str(n), thread_key, run, kind, json.loads(data) if data else None,
                           sid, at) for n, kind, run, sid, data, at in rows]

    async def stream_tail(self, thread_key: str) -> str | None:
        n = await self._call(lambda t: t._tx.value(
            "SELECT MAX(n) FROM sig_parts WHERE thread = ?", (thread_key,)), write=False,
            what="stream read")
        return None if n is None else str(n)

    @asynccontextmanager
    async def follower(self) -> AsyncIterator[_Follower]:
        """One watcher for every stream reader of this process (see the module docstring)."""
        follower = _Follower(self)
        self._followers.append(follower)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(follower.run)
                yield follower
                tg.cancel_scope.cancel()
        finally:
            self._followers.remove(follower)


class _Follower:
    """Waiters by thread; one query per poll for every thread someone waits on."""

    def __init__(self, core: SQLCore) -> None:
        self._core = core
        self.waiting: dict[str, list[anyio.Event]] = {}
        self._someone = anyio.Event()

    def ring(self, thread_key: str) -> None:
        for event in self.waiting.get(thread_key, ()):
            event.set()

    async def run(self) -> None:
        core, poll = self._core, self._core.follow_poll_ms / 1000
        seen: dict[str, int] = {}
        while True:
            if not self.waiting:
                self._someone = anyio.Event()
                await self._someone.wait()
            threads = list(self.waiting)[:500]
            query = (f"SELECT key, pseq FROM sig_threads WHERE key IN "
                     f"({', '.join('?' * len(threads))})")
            def read(t: SQLTables, q: str = query, k: list[str] = threads
                     ) -> list[tuple[Any, ...]]:
                return t._tx.all(q, k)

            try:
                rows = await core._call(read, write=False, what="stream follow")
            except Exception:  # an outage: the readers' own reads report it
                rows = []
            for key, pseq in rows:
                if seen.get(key) != pseq:
                    seen[key] = pseq
                    self.ring(key)
            await anyio.sleep(poll)

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Wait until ``thread_key``'s stream has parts after ``after``; return them."""
        while True:
            try:
                parts = await self._core.stream_read(thread_key, after=after)
            except CursorExpiredError:
                return []  # the reader's next stream_read raises it
            if parts:
                return parts
            event = anyio.Event()
            self.waiting.setdefault(thread_key, []).append(event)
            self._someone.set()
            try:
                await event.wait()
            finally:
                waiting = self.waiting[thread_key]
                waiting.remove(event)
                if not waiting:
                    del self.waiting[thread_key]

