"""``SQLCore``: the reference engine over a SQL database (SQLite, Postgres, or yours).

Every core call is one transaction run whole in a worker thread
(:class:`~_signal_leases.sql.Database`); the engine's rules (``_engine``) run inside it over
:class:`~signals.kit._sql.tables.SQLTables` (one indexed statement per method).

Built with a pub/sub (``pubsub=``) it is a notice channel over it; when that pub/sub keeps its
events in the same database (``SQLPubSub``), a notice is written in the transaction of the
change it announces. With the lease provider whose tables share the database (``leases=``) and
a notice channel, it also offers the fused calls, reading and granting the thread's lease in
the same transaction as the inbox change. Without a pub/sub it offers neither: the runtime
then sends notices over its own pub/sub and takes leases around the core's calls.
Output streams are a table of parts; one follower per process watches the threads someone
waits on, waking local readers at once and polling for other processes' parts every
``follow_poll_ms`` while anyone waits (nothing when nobody does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import _signal_leases.sql.leases as sql_leases
from _signal_leases.aio import owned_task_group
from _signal_leases.errors import BackendError, CursorExpiredError
from _signal_leases.logs import get_logger
from _signal_leases.sql import Database, Tx
from _signal_leases.validation import check_int
from signals._model import EntryMode, Receipt, Signal, StreamPart
from signals.kit._capabilities import CARRY_LIMIT, Claim, Claimed, Notice, PartIn, Routed
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
from signals.kit._derived import TOPIC_PREFIX, PubSubNotices
from signals.kit._engine import Engine, Outbox
from signals.kit._sql.fast import Statements, notice_pieces, route_one, settle_one

if TYPE_CHECKING:
    from leases import LeaseProvider
    from pubsub import PubSub

from signals.kit._sql.follower import SQLFollower
from signals.kit._sql.tables import COMPONENT, DAY_MS, VERSION, SQLTables, ddl

__all__ = ["SQLCore"]

logger = get_logger("signals")

T = TypeVar("T")


class SQLCore:
    """A :class:`~signals.kit.SignalCore` over a SQL database (see the module docstring).

    ``database``: a :class:`~signals.kit.Database` (the one of a ``SQLitePubSub``, or yours).
    ``pubsub``: a pub/sub to send notices over (then the core is a
    :class:`~signals.kit.NoticeChannel`); ``notices`` instead: anything with ``notify`` and
    ``listen``. ``leases``: the lease provider whose tables live in ``database`` (with a
    notice channel: the fused calls). The rest as :class:`~signals.InMemorySignalStore`.
    """

    #: Present (instance attributes) only with a notice channel: see ``__init__``.
    notify: Callable[[str | None, Notice], Any]
    listen: Callable[..., AbstractAsyncContextManager[None]]

    def __init__(
        self, database: Database, *, leases: LeaseProvider | None = None,
        pubsub: PubSub | None = None, notices: Any = None, retention_ms: int = DAY_MS,
        max_receipts: int = 10_000, stream_max_parts: int = 10_000,
        stream_retention_ms: int = DAY_MS, follow_poll_ms: int = 50,
    ) -> None:
        if pubsub is not None and notices is not None:
            raise TypeError("pass pubsub= or notices=, not both")
        if leases is not None and pubsub is None and notices is None:
            raise TypeError("leases= needs pubsub= too: the fused calls send notices (to a "
                            "thread's owner, to the workers) over it")
        if pubsub is not None:
            notices = PubSubNotices(pubsub, TOPIC_PREFIX)
        self.database = database
        self.retention_ms = check_int("retention_ms", retention_ms)
        self.max_receipts = check_int("max_receipts", max_receipts)
        self.stream_max_parts = check_int("stream_max_parts", stream_max_parts)
        self.stream_retention_ms = check_int("stream_retention_ms", stream_retention_ms)
        self.follow_poll_ms = check_int("follow_poll_ms", follow_poll_ms)
        self.engine = Engine(retention_ms=retention_ms, max_receipts=max_receipts)
        self._notices: Any = notices
        self.leases = leases
        if notices is not None:  # a NoticeChannel only then (capabilities are structural)
            self.notify = notices.notify
            self.listen = notices.listen
        self._ready = False
        self._writes = 0
        self._followers: list[SQLFollower] = []

    #: Use the one-statement paths of ``_sql.fast`` where the database batches (Postgres);
    #: False: the engine does every call (the tests compare the two).
    fast_paths = True

    async def _schema(self) -> None:
        if not self._ready:
            await self.database.ensure_schema(COMPONENT, VERSION, ddl(self.database.dialect))
            if self.leases is not None:
                await self.database.ensure_schema(sql_leases.COMPONENT, sql_leases.VERSION,
                                                  sql_leases.ddl(self.database.dialect))
            self._ready = True

    async def _wrote(self) -> None:
        self._writes += 1
        if self._writes in self.analyze_after and self.database.dialect == "postgres":
            await self._analyze()

    def _statements(self, what: str) -> Statements:
        """A write call as statements (``Database.run_statements``; see ``_sql.fast``)."""
        async def run(statements: list[tuple[str, Sequence[Any]]]) -> list[tuple[Any, ...]]:
            await self._schema()
            rows = await self.database.run_statements(statements, what=what)
            await self._wrote()
            return rows
        return run

    async def _call(self, fn: Callable[[SQLTables], T], *, fused: bool = False,
                    write: bool = True, what: str = "a signal call") -> T:
        await self._schema()
        max_parts, retention = self.stream_max_parts, self.stream_retention_ms / 1000
        fused = fused and self.leases is not None

        def call(tx: Tx) -> T:
            tables = SQLTables(tx, fused=fused, stream_max_parts=max_parts,
                               stream_retention_s=retention)
            result = fn(tables)
            tables.finish()
            return result

        result = await self.database.run(call, write=write, what=what)
        if write:
            await self._wrote()
        return result

    #: After these numbers of write calls in this process, Postgres's statistics of the signal
    #: tables are refreshed (``ANALYZE``): a plan prepared while they were empty can read a
    #: thread's receipts in full per signal (docs/postgres.md, "Statistics on new tables").
    analyze_after: tuple[int, ...] = (100, 1_000, 10_000)

    async def _analyze(self) -> None:
        try:
            await self.database.run(
                lambda tx: tx.execute("ANALYZE sig_threads, sig_entries, sig_receipts, "
                                      "sig_parts"), what="table statistics")
        except BackendError as exc:  # best effort: autovacuum analyzes them as well
            logger.debug("signals.analyze_failed", error=repr(exc))

    async def _send(self, outbox: Outbox) -> None:
        for runtime_id, notice in outbox.notices:
            await self._notices.notify(runtime_id, notice)

    async def _call_out(self, fn: Callable[[SQLTables, Outbox], T], *, what: str) -> T:
        """A fused call that may send notices. When the notices' pub/sub lives in this
        database they are written in the call's own transaction (one commit for the inbox
        change and its notices; nothing to lose in between); otherwise they are published
        after the commit."""
        outbox = Outbox()
        stager = getattr(self._notices, "stager", None)
        stage = stager(self.database) if stager is not None else None
        if stage is None:
            result = await self._call(lambda t: fn(t, outbox), fused=True, what=what)
            await self._send(outbox)
            return result

        def call(t: SQLTables) -> tuple[T, set[str]]:
            out = fn(t, outbox)
            return out, {stage(t.tx, rid, notice) for rid, notice in outbox.notices}

        result, topics = await self._call(call, fused=True, what=what)
        if topics:
            await self._notices.announce(topics)
        return result

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
        if (self.fast_paths and len(acks) == 1 and not failed and not returned
                and self.database.dialect == "postgres"):
            fused, cap = self.leases is not None, self.stream_max_parts
            age, ack = self.stream_retention_ms / 1000, acks[0]
            if await settle_one(self._statements("inbox settle"), thread_key, run, ack,
                                fused=fused, max_parts=cap, retention_s=age):
                self._parts_written(thread_key)
                return True
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

    # -- fused calls ------------------------------------------------------------------------

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider whose tables live in this database."""
        return self.leases is not None and leases is self.leases

    async def route(self, thread_key: str, signal: Signal, mode: EntryMode, *,
                    claim: Claim | None, sender: str | None, wake_workers: bool,
                    limits: Limits = NO_LIMITS, interrupt: bool = False) -> Routed:
        e = self.engine
        fast = None if interrupt else await self._route_fast(thread_key, signal, mode, sender,
                                                             limits)
        if fast is not None:
            self._parts_written(thread_key)
            return fast
        routed = await self._call_out(
            lambda t, out: e.route(t, thread_key, signal, mode, claim, sender, wake_workers,
                                   limits, out, interrupt), what=f"send to thread {thread_key!r}")
        self._parts_written(thread_key)
        return routed

    async def _route_fast(self, key: str, signal: Signal, mode: EntryMode, sender: str | None,
                          limits: Limits) -> Routed | None:
        """A plain signal (no lane, no ``not_before``) to a live owner in one statement
        (``_sql.fast.route_one``), where the database is Postgres and the notices' pub/sub
        keeps its events in it; ``None``: the engine's path."""
        sql_notices = getattr(self._notices, "sql_notices", None)
        if (not self.fast_paths or self.database.dialect != "postgres" or sql_notices is None
                or self.leases is None or signal.lane is not None
                or signal.not_before is not None):
            return None
        found = sql_notices(self.database)
        carry = mode == "deliver" and len(signal.encode()) <= CARRY_LIMIT
        pieces = notice_pieces(key, signal, mode, carry)
        if found is None or pieces is None:
            return None
        prefix, channel = found
        keep, window = self.max_receipts, self.engine.retention_s
        cap, age = self.stream_max_parts, self.stream_retention_ms / 1000
        done = await route_one(
            self._statements(f"send to thread {key!r}"), key, signal, mode, carry=carry,
            limits=limits, keep=keep, window_s=window, max_parts=cap, retention_s=age,
            sender=sender, prefix=prefix, channel=channel, pieces=pieces)
        if done is None:
            return None
        seq, now, owner, topic = done
        if topic is not None:
            await self._notices.announce((topic,))
        receipt = Receipt(signal.id, "pending", at=now)
        return Routed(Accepted("fresh", str(seq), receipt), owner, carried=carry)

    async def claim(self, thread_key: str, claim: Claim) -> Claimed:
        e = self.engine
        return await self._call_out(lambda t, out: e.claim(t, thread_key, claim, out),
                                    what=f"claim of thread {thread_key!r}")

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        e = self.engine
        return await self._call(lambda t: e.release_if_idle(t, thread_key, owner), fused=True,
                                what=f"release of thread {thread_key!r}")

    async def abort(self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
                    ) -> str | None:
        e = self.engine
        run = await self._call_out(
            lambda t, out: e.abort(t, thread_key, run_id, reason, clear, out),
            what=f"abort on thread {thread_key!r}")
        self._parts_written(thread_key)
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
            # The parts first, then the trim point: where each statement sees the latest
            # commit (Postgres), a trim in between shows, and no gap goes unnoticed.
            rows = t._tx.all("SELECT n, kind, run, sid, data, at FROM sig_parts WHERE thread = ? "
                             "AND n > ? ORDER BY n LIMIT ?", (thread_key, start, limit))
            trimmed = t._tx.value("SELECT ptrim FROM sig_threads WHERE key = ?", (thread_key,))
            return int(trimmed or 0), rows

        trimmed, rows = await self._call(read, write=False, what="stream read")
        if after is not None and start < trimmed and not (rows and int(rows[0][0]) == start + 1):
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
    async def follower(self) -> AsyncIterator[SQLFollower]:
        """One watcher for every stream reader of this process (see the module docstring)."""
        follower = SQLFollower(self)
        self._followers.append(follower)
        try:
            async with owned_task_group() as tg:
                tg.start_soon(follower.run)
                yield follower
        finally:
            self._followers.remove(follower)
