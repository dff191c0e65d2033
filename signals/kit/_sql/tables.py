"""The SQL tables of :class:`~signals.kit.SQLCore`: the schema (:func:`ddl`) and
:class:`SQLTables`, the engine's ``Tables`` over one transaction, whose every method is one
indexed statement: no table scan on a hot path (each query names the thread, or reads an index
by its first column). On Postgres every call that changes a thread first takes a
transaction-scoped advisory lock on the thread key, so calls on one thread are serial (calls on
different threads are not); on SQLite the write transaction holds the database.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import _signal_leases.sql.leases as sql_leases
from _signal_leases.sql import Tx
from _signal_leases.sql.postgres import NOW_MS
from signals.kit._capabilities import PartIn
from signals.kit._tables import EntryRow, LeaseAccess, ReceiptRow, ThreadRow

if TYPE_CHECKING:
    pass

__all__ = ["COMPONENT", "DAY_MS", "THREAD_LOCK", "VERSION", "SQLTables", "ddl"]

T = TypeVar("T")
COMPONENT, VERSION = "signals", 1
DAY_MS = 86_400_000

_E = ("thread, seq, sid, body, mode, prio, lane, merge, state, due, nb, expires, holder, "
      "attempts, error")
_R = "thread, sid, status, accepted, at, run, result, error, by_sid, body, mode, attempts"
_T = "key, seq, pending, paused, token, run, since, last, look, abort, lanes"
_RECEIPT = f"SELECT {_R} FROM sig_receipts WHERE thread = ? AND sid = ?"
_ENTRY = f"SELECT {_E} FROM sig_entries WHERE thread = ? AND sid = ?"
#: The advisory lock of a thread's calls (Postgres): SQL, one parameter, the thread's key.
THREAD_LOCK = "SELECT pg_advisory_xact_lock(1397311815, hashtext(?))"
# Counts added to a thread's row (parameters: the thread, parts, receipts).
_COUNT = ("INSERT INTO sig_threads (key, seq, pending, paused, pseq, receipts) VALUES (?, 0, 0, "
          "0, ?, ?) ON CONFLICT (key) DO UPDATE SET pseq = sig_threads.pseq + excluded.pseq, "
          "receipts = sig_threads.receipts + excluded.receipts")
# A column of a thread's oldest part kept (one index seek; parameter: the thread).
_OLDEST_PART = "(SELECT {} FROM sig_parts WHERE thread = ? ORDER BY n LIMIT 1)"


def _trim_query(before: str = "?") -> str:
    """A thread's receipt count and its oldest receipts accepted before ``before`` (a
    parameter, or SQL); parameters: the thread twice, then ``before``'s if any."""
    return ("SELECT CAST(NULL AS TEXT), receipts FROM sig_threads WHERE key = ? UNION ALL "
            "SELECT * FROM (SELECT sid, CAST(NULL AS BIGINT) FROM sig_receipts WHERE thread = ? "
            f"AND accepted < {before} ORDER BY accepted LIMIT 100) AS old")


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
        #: key -> its live lease, read ahead by SQLTables.preload (used once)
        self.ahead: dict[str, sql_leases.Lease | None] = {}

    def live(self, key: str) -> tuple[str, int | None, str | None] | None:
        found = self.ahead.pop(key) if key in self.ahead else sql_leases.live(self._tx, key)
        return None if found is None else (found.owner, found.token, found.session)

    def grant(self, key: str, owner: str, ttl_ms: int, session: str | None) -> int | None:
        self.ahead.pop(key, None)
        sql_leases.lock(self._tx, key)
        if sql_leases.live(self._tx, key) is not None:
            return None
        if session is not None and not sql_leases.session_live(self._tx, session):
            return None
        return sql_leases.grant(self._tx, key, owner, ttl_ms, session)

    def release(self, key: str, owner: str) -> None:
        self.ahead.pop(key, None)
        sql_leases.release(self._tx, key, owner)

    def left_ms(self, key: str) -> int | None:
        found = sql_leases.info(self._tx, key)
        return None if found is None else found[2]


def _first(rows: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    return rows[0] if rows else None


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
        self._tx = self.tx = tx
        self.streams = True
        self._leases = _Leases(tx) if fused else None
        self.leases: LeaseAccess | None = self._leases
        self._max_parts = stream_max_parts
        self._retention_s = stream_retention_s
        self._locked: set[str] = set()
        # (thread, sid) -> whether its receipt row exists, as this transaction saw or made it
        # (an insert or an update is then a write that nothing waits for)
        self._receipts: dict[tuple[str, str], bool] = {}
        # Rows read ahead by preload, each used by the first read that asks for it and
        # dropped by any write that changes it first.
        self._ahead_thread: dict[str, ThreadRow | None] = {}
        self._ahead_part: dict[str, tuple[int, int | None, float | None]] = {}
        self._ahead_trim: dict[str, list[tuple[Any, ...]]] = {}
        self._ahead_receipt: dict[tuple[str, str], ReceiptRow | None] = {}
        self._ahead_entry: dict[tuple[str, str], EntryRow | None] = {}
        # thread -> [parts, receipts] added by this call and not yet counted on its row:
        # counted by its next save (one write for all), or by finish.
        self._counts: dict[str, list[int]] = {}

    @property
    def now(self) -> float:
        """The transaction's Unix time (read when first needed: on Postgres it comes with
        the call's first reads, see ``Database.batch``)."""
        return self._tx.wall

    def _count(self, key: str, parts: int = 0, receipts: int = 0) -> None:
        counts = self._counts.setdefault(key, [0, 0])
        counts[0] += parts
        counts[1] += receipts

    def _counted(self, key: str) -> None:
        """Write the counts of ``key`` held back (before a statement that reads them)."""
        counts = self._counts.pop(key, None)
        if counts is not None:
            self._tx.write(_COUNT, (key, *counts))

    def finish(self) -> None:
        """The end of the call: write every count held back."""
        for key in list(self._counts):
            self._counted(key)

    def _lock(self, key: str) -> None:
        if self._tx.dialect == "postgres" and self._tx.pipelined and key not in self._locked:
            # (a read-only call runs outside a transaction there: nothing to serialize)
            # Sent without waiting: the server runs the next read only once it holds the lock.
            self._tx.write(THREAD_LOCK, (key,))
            self._locked.add(key)

    def preload(self, key: str, sids: Sequence[str], receipts_window: float | None) -> None:
        """On a batching database (Postgres), read at once what a call on ``key`` reads
        first: the thread's row, its live lease, the receipts and entries of ``sids``, its
        receipt count and the receipts older than ``receipts_window`` seconds (the dedup
        window) and where its stream stands. They go out with BEGIN, the clock and the
        thread's lock, and the call's writes with COMMIT: two round trips for the call,
        whatever it reads first and writes. Elsewhere it does nothing: each read is a
        statement either way."""
        tx = self._tx
        if not tx.pipelined or tx.dialect != "postgres" or key in self._ahead_thread:
            return
        self._lock(key)
        self._counted(key)
        queries: list[tuple[str, Sequence[Any]]] = [(
            f"SELECT {_T}, pseq, {_OLDEST_PART.format('n')}, {_OLDEST_PART.format('at')} "
            "FROM sig_threads WHERE key = ?", (key, key, key))]
        if self._leases is not None:  # the clock in SQL: it comes back with these reads
            queries.append((sql_leases.live_query(NOW_MS), (key,)))
        if receipts_window is not None:
            queries.append((_trim_query(f"{NOW_MS} / 1000.0 - ?"), (key, key, receipts_window)))
        for sid in sids:
            queries.append((_RECEIPT, (key, sid)))
            queries.append((_ENTRY, (key, sid)))
        found = iter(tx.read_many(queries))
        row = _first(next(found))
        self._ahead_thread[key] = None if row is None else _thread(row[:11])
        self._ahead_part[key] = (0, None, None) if row is None else (
            int(row[11]), row[12], row[13])
        if self._leases is not None:
            self._leases.ahead[key] = sql_leases.lease_of(_first(next(found)))
        if receipts_window is not None:
            self._ahead_trim[key] = next(found)
        for sid in sids:
            receipt = _first(next(found))
            self._ahead_receipt[(key, sid)] = None if receipt is None else _receipt(receipt)
            entry = _first(next(found))
            self._ahead_entry[(key, sid)] = None if entry is None else _entry(entry)

    # -- threads ----------------------------------------------------------------------------

    def thread(self, key: str) -> ThreadRow | None:
        if key in self._ahead_thread:
            return self._ahead_thread.pop(key)
        self._lock(key)
        self._counted(key)
        row = self._tx.one(f"SELECT {_T} FROM sig_threads WHERE key = ?", (key,))
        return None if row is None else _thread(row)

    def save_thread(self, r: ThreadRow) -> None:
        self._ahead_thread.pop(r.key, None)
        parts, receipts = self._counts.pop(r.key, (0, 0))
        self._tx.write(
            f"INSERT INTO sig_threads ({_T}, pseq, receipts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, pending = "
            "excluded.pending, paused = excluded.paused, token = excluded.token, run = "
            "excluded.run, since = excluded.since, last = excluded.last, look = excluded.look, "
            "abort = excluded.abort, lanes = excluded.lanes, pseq = sig_threads.pseq + "
            "excluded.pseq, receipts = sig_threads.receipts + excluded.receipts",
            (r.key, r.seq, r.pending, int(r.paused), r.token, r.run, r.since, r.last, r.look,
             r.abort, r.lanes_json() or None, parts, receipts),
        )

    # -- entries ----------------------------------------------------------------------------

    def insert(self, e: EntryRow) -> None:
        self._ahead_entry.pop((e.thread, e.sid), None)
        self._tx.write(
            f"INSERT INTO sig_entries ({_E}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (e.thread, e.seq, e.sid, e.body, e.mode, e.prio, e.lane, e.merge, e.state, e.due,
             e.nb, e.expires, e.holder, e.attempts, e.error),
        )

    def update(self, e: EntryRow) -> None:
        self._ahead_entry.pop((e.thread, e.sid), None)
        self._tx.write(
            "UPDATE sig_entries SET state = ?, due = ?, holder = ?, attempts = ?, error = ? "
            "WHERE thread = ? AND seq = ?",
            (e.state, e.due, e.holder, e.attempts, e.error, e.thread, e.seq),
        )

    def delete(self, key: str, seqs: Sequence[int]) -> None:
        gone = set(seqs)
        for ahead, row in list(self._ahead_entry.items()):
            if ahead[0] == key and row is not None and row.seq in gone:
                del self._ahead_entry[ahead]
        self._tx.many("DELETE FROM sig_entries WHERE thread = ? AND seq = ?",
                      [(key, s) for s in seqs])

    def _rows(self, where: str, params: Sequence[Any], tail: str = "") -> list[EntryRow]:
        return [_entry(r) for r in self._tx.all(
            f"SELECT {_E} FROM sig_entries WHERE thread = ? AND {where} {tail}", params)]

    def by_signal(self, key: str, sid: str) -> EntryRow | None:
        if (key, sid) in self._ahead_entry:
            return self._ahead_entry.pop((key, sid))
        row = self._tx.one(_ENTRY, (key, sid))
        return None if row is None else _entry(row)

    def best(self, key: str, run: str | None) -> EntryRow | None:
        rows = self._rows("state = 'ready'", (key,), "ORDER BY prio DESC, seq LIMIT 1")
        if run is not None:
            rows += self._rows("state = 'carried' AND holder = ?", (key, run),
                               "ORDER BY prio DESC, seq LIMIT 1")
        return min(rows, key=lambda e: (-e.prio, e.seq), default=None)

    def lane(self, key: str, lane: str) -> list[EntryRow]:
        return self._rows("lane = ?", (key, lane), "ORDER BY seq")

    def lane_open(self, key: str, lane: str) -> bool:
        return self._tx.value(
            "SELECT 1 FROM sig_entries WHERE thread = ? AND lane = ? AND state IN ('ready', "
            "'later') LIMIT 1", (key, lane)) is not None

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
        if (key, sid) in self._ahead_receipt:
            ahead = self._ahead_receipt.pop((key, sid))
            self._receipts[(key, sid)] = ahead is not None
            return ahead
        row = self._tx.one(_RECEIPT, (key, sid))
        self._receipts[(key, sid)] = row is not None
        return None if row is None else _receipt(row)

    def put_receipt(self, r: ReceiptRow) -> None:
        self._ahead_receipt.pop((r.thread, r.sid), None)
        self._ahead_trim.pop(r.thread, None)  # the count it holds is changing
        if self._ahead_thread.get(r.thread, 0) is None:
            del self._ahead_thread[r.thread]  # the row may be created below
        known = self._receipts.get((r.thread, r.sid))
        self._receipts[(r.thread, r.sid)] = True
        values = (r.thread, r.sid, r.status, r.accepted, r.at, r.run, r.result, r.error, r.by,
                  r.body, r.mode, r.attempts)
        insert = f"INSERT INTO sig_receipts ({_R}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        if known is False:
            self._tx.write(insert, values)
            added = True
        elif known is None:
            added = bool(self._tx.execute(insert + " ON CONFLICT (thread, sid) DO NOTHING",
                                          values))
        else:
            added = False
        if added:  # counted on the thread's row (which the first receipt may come before)
            self._count(r.thread, receipts=1)
            return
        self._tx.write(
            "UPDATE sig_receipts SET status = ?, at = ?, run = ?, result = ?, error = ?, "
            "by_sid = ?, body = ?, mode = ?, attempts = ? WHERE thread = ? AND sid = ?",
            (r.status, r.at, r.run, r.result, r.error, r.by, r.body, r.mode, r.attempts,
             r.thread, r.sid),
        )

    def trim_receipts(self, key: str, before: float, keep: int) -> None:
        # The count and the oldest receipts past the window, in one round trip.
        found = self._ahead_trim.pop(key, None)  # (preload: the same window, by the same clock)
        if found is None:
            self._counted(key)
            found = self._tx.all(_trim_query(), (key, key, before))
        count = next((r[1] for r in found if r[0] is None), 0)
        old = [r for r in found if r[0] is not None]
        over = max(0, int(count or 0) - len(old) - keep + 1)
        if over:
            old += self._tx.all(
                "SELECT sid FROM sig_receipts WHERE thread = ? AND accepted >= ? ORDER BY "
                "accepted LIMIT ?", (key, before, min(over, 100)))
        if old:
            for r in old:
                self._receipts.pop((key, r[0]), None)
                self._ahead_receipt.pop((key, r[0]), None)
            self._tx.many("DELETE FROM sig_receipts WHERE thread = ? AND sid = ?",
                          [(key, r[0]) for r in old])
            self._tx.write("UPDATE sig_threads SET receipts = receipts - ? WHERE key = ?",
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
        self._lock(key)  # numbers parts in turn with calls that read the number ahead
        ahead = self._ahead_part.pop(key, None)
        if ahead is not None:  # read ahead (preload): counted with the row's next write
            n, first_n, first_at = ahead[0] + 1, ahead[1], ahead[2]
            self._count(key, parts=1)
            self._ahead_part[key] = (n, n, self.now) if first_n is None else (
                n, first_n, first_at)
        else:
            # The part's number (with the counts held back), and the oldest part kept, in
            # one round trip.
            parts, receipts = self._counts.pop(key, (0, 0))
            n, first_n, first_at = tx.one(
                f"{_COUNT} RETURNING pseq, {_OLDEST_PART.format('n')}, "
                f"{_OLDEST_PART.format('at')}", (key, parts + 1, receipts, key, key)
            ) or (0, None, None)
            n = int(n)
        tx.write("INSERT INTO sig_parts (thread, n, kind, run, sid, data, at) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (key, n, part.kind, part.run_id or None, part.signal_id, part.data, self.now))
        floor, before = n - self._max_parts, self.now - self._retention_s
        if first_n is None or (int(first_n) > floor and first_at is not None
                                and float(first_at) >= before):
            return str(n)  # nothing past the count or the age limit (parts come in time order)
        # Trim past the count and the age limits with two writes and no read (nothing to wait
        # for on a batching database): the trim point moves up, then what is below it goes.
        self._ahead_part.pop(key, None)
        greatest = "GREATEST" if tx.dialect == "postgres" else "MAX"
        tx.write(
            f"UPDATE sig_threads SET ptrim = {greatest}(ptrim, COALESCE((SELECT MAX(n) FROM "
            "sig_parts WHERE thread = ? AND (n <= ? OR at < ?)), 0)) WHERE key = ?",
            (key, floor, before, key))
        tx.write("DELETE FROM sig_parts WHERE thread = ? AND n <= (SELECT ptrim FROM sig_threads "
                 "WHERE key = ?)", (key, key))
        return str(n)
