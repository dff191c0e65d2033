"""One-statement paths of :class:`~signals.kit.SQLCore` on Postgres for its two most common
calls: a run acknowledging the one signal it was handed (``settle`` with one ack), and a
plain signal (no lane, no ``not_before``) routed to its thread's live owner (``route``).

The engine (``_engine``, ``_rules``) reads a thread's rows, decides in Python and writes: two
round trips on Postgres (the reads, then the writes with COMMIT). For these calls the
decision fits in SQL: one statement (data-modifying common table expressions) checks that the
common case holds and then writes what the engine would (see :func:`settle_one` and
:func:`route_one`). It goes out with the thread's lock and COMMIT as one message: one round
trip. When the case does not hold, the statement changes nothing and the engine does the
call (its transaction is then a second one: nothing was written in between that the engine
would not see). The statements go out through ``Database.run_statements``: on asyncio from
the event loop's own thread, with no worker-thread hop.

Held to the engine by ``tests/test_sql_fast.py``: the same random calls on two cores, one
with these paths and one without, leave the same rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from _signal_leases.sql.leases import LIVE
from _signal_leases.sql.postgres import NOTIFY_MAX_BYTES, NOW_MS
from _signal_leases.validation import MAX_IDENTIFIER_LENGTH
from pubsub import Event
from pubsub._backends.sql.tables import TOPIC_LOCK
from signals._model import EntryMode, Signal
from signals.kit._capabilities import Notice
from signals.kit._core import Ack, InboxEntry, Limits, RunRef
from signals.kit._derived import notice_data
from signals.kit._sql.tables import THREAD_LOCK

__all__ = ["ack_data", "notice_pieces", "route_one", "settle_one"]

_NOW = f"({NOW_MS} / 1000.0)::float8"


def _trim_parts(n: str, when: str = "TRUE") -> str:
    """CTEs ``old``, ``cut`` and ``trim``: a new part numbered ``n`` (SQL over the CTE
    ``ok``, which has ``key`` and ``now``; added only ``when``) trims the stream past the
    cap (``%(cap)s`` parts) or the age (``%(age)s`` seconds) as ``SQLTables.add_part`` does:
    when the oldest part is past either, everything up to the newest part past either goes
    and the thread's trim point (``ptrim``) moves to it (``(SELECT cut.n FROM cut)``)."""
    return (
        "old AS (SELECT p.n, p.at FROM sig_parts AS p WHERE p.thread = %(key)s ORDER BY p.n "
        "LIMIT 1), "
        f"cut AS (SELECT (SELECT MAX(p.n) FROM sig_parts AS p WHERE p.thread = ok.key AND "
        f"(p.n <= {n} - %(cap)s OR p.at < ok.now - %(age)s::float8)) AS n FROM ok, old "
        f"WHERE {when} AND (old.n <= {n} - %(cap)s OR old.at < ok.now - %(age)s::float8)), "
        "trim AS (DELETE FROM sig_parts AS p USING cut WHERE p.thread = %(key)s AND "
        "p.n <= cut.n), "
    )


def _settle_sql(fused: bool) -> str:
    """Parameters: key, run id, token, entry seq, signal id, result, part data, the stream's
    part cap, its retention (s)."""
    lease = (f"AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.key = t.key AND l.owner <> "
             f"%(run)s AND {LIVE.replace('?', NOW_MS)}) " if fused else "")
    sql = (
        # the common case: the run is the thread's current one, not fenced; the entry and its
        # receipt are there; no lane state to tidy when the inbox empties
        "WITH ok AS (SELECT t.key, t.pending, t.pseq + 1 AS n, " + _NOW + " AS now "
        "FROM sig_threads AS t WHERE t.key = %(key)s AND t.run = %(run)s AND NOT "
        "(%(token)s::bigint IS NOT NULL AND t.token IS NOT NULL AND %(token)s::bigint < t.token) "
        + lease +
        # (a lane's first-pending time and gate, "f" and "g", go when the inbox empties;
        # a lane named "f" or "g" merely takes the engine's path)
        "AND (t.pending > 1 OR t.lanes IS NULL OR (t.lanes NOT LIKE '%%\"f\":%%' AND "
        "t.lanes NOT LIKE '%%\"g\":%%')) "
        "AND EXISTS (SELECT 1 FROM sig_entries AS e WHERE e.thread = t.key AND e.sid = %(sid)s "
        "AND e.seq = %(seq)s) "
        "AND EXISTS (SELECT 1 FROM sig_receipts AS r WHERE r.thread = t.key AND r.sid = %(sid)s)"
        "), "
        + _trim_parts("ok.n") +
        "gone AS (DELETE FROM sig_entries AS e USING ok WHERE e.thread = ok.key AND "
        "e.seq = %(seq)s), "
        "receipt AS (UPDATE sig_receipts AS r SET status = 'processed', at = ok.now, run = "
        "%(run)s::text, result = %(result)s::text, error = NULL, by_sid = NULL, body = NULL, "
        "mode = NULL, attempts = 0 FROM ok WHERE r.thread = ok.key AND r.sid = %(sid)s), "
        "part AS (INSERT INTO sig_parts (thread, n, kind, run, sid, data, at) SELECT ok.key, "
        "ok.n, 'signal.acked', %(run)s::text, %(sid)s::text, %(data)s::text, ok.now FROM ok), "

        "thread AS (UPDATE sig_threads AS t SET pending = GREATEST(ok.pending - 1, 0), "
        "look = CASE WHEN ok.pending > 1 THEN t.look END, pseq = t.pseq + 1, "
        "ptrim = GREATEST(t.ptrim, COALESCE((SELECT cut.n FROM cut), 0)) "
        "FROM ok WHERE t.key = ok.key) "
        "SELECT count(*) FROM ok"
    )
    return sql


def _positional(sql: str, names: Sequence[str]) -> tuple[str, list[int]]:
    """``sql`` with ``%(name)s`` turned into ``?``, and the index in ``names`` of each."""
    order: list[int] = []
    out = sql
    while "%(" in out:
        start = out.index("%(")
        end = out.index(")s", start)
        order.append(names.index(out[start + 2:end]))
        out = out[:start] + "?" + out[end + 2:]
    return out, order


_SETTLE_NAMES = ("key", "run", "token", "seq", "sid", "result", "data", "cap", "age")
_COMPILED = {fused: _positional(_settle_sql(fused), _SETTLE_NAMES) for fused in (False, True)}


def ack_data(result: str | None) -> str | None:
    """The data of an ack's ``signal.acked`` part (as ``Rules._ack`` writes it)."""
    if result is None:
        return None
    return json.dumps({"result": json.loads(result)}, separators=(",", ":"))


#: Runs statements in one transaction and returns the last one's rows (``SQLCore`` passes
#: its database's ``run_statements``, with the schema made and the write counted).
Statements = Callable[[list[tuple[str, Sequence[Any]]]], Awaitable[list[tuple[Any, ...]]]]


async def settle_one(run_statements: Statements, key: str, run: RunRef, ack: Ack, *,
                     fused: bool, max_parts: int, retention_s: float) -> bool:
    """Acknowledge ``ack`` for ``run`` in one statement when the common case holds (see the
    module docstring): True when done, False when nothing changed and the engine must do
    it."""
    entry = ack.entry_id  # the engine matches it as str(seq): only that text here
    if not (entry.isascii() and entry.isdigit() and len(entry) <= 18
            and str(int(entry)) == entry):
        return False
    try:
        data = ack_data(ack.result)
    except ValueError:  # (the engine reads the result only for an entry it acknowledges)
        return False
    sql, order = _COMPILED[fused]
    values: Sequence[Any] = (key, run.run_id, run.token, int(entry), ack.signal_id,
                             ack.result, data, max_parts, retention_s)
    rows = await run_statements([(THREAD_LOCK, (key,)), (sql, [values[i] for i in order])])
    return bool(rows and rows[0][0])


def _route_sql() -> str:
    """A plain signal routed to its thread's live owner. Parameters: see ``_ROUTE_NAMES``."""
    return (
        # the common case: the thread is known and not paused, under its pending cap, a live
        # lease holds it (the owner), the id is new
        "WITH th AS (SELECT t.key, t.seq + 1 AS seq, t.pending, t.receipts, t.pseq, "
        + _NOW + " AS now, " + NOW_MS + " AS now_ms FROM sig_threads AS t WHERE "
        "t.key = %(key)s AND t.paused = 0 AND (%(limit)s::bigint IS NULL OR "
        "t.pending < %(limit)s::bigint)), "
        "ok AS (SELECT th.*, l.owner, CASE WHEN strpos(l.owner, '/') = 0 THEN '' ELSE "
        "left(l.owner, length(l.owner) - strpos(reverse(l.owner), '/')) END AS rt "
        f"FROM th JOIN leases AS l ON l.key = th.key AND {LIVE.replace('?', 'th.now_ms')} "
        "WHERE NOT EXISTS (SELECT 1 FROM sig_receipts AS r WHERE r.thread = th.key AND "
        "r.sid = %(sid)s) AND NOT EXISTS (SELECT 1 FROM sig_entries AS e WHERE "
        "e.thread = th.key AND e.sid = %(sid)s) "
        # (a notice topic the pub/sub would refuse as too long: the engine's path says so)
        f"AND char_length(%(prefix)s::text) + char_length(l.owner) <= {MAX_IDENTIFIER_LENGTH}), "
        # receipts past the dedup window, or past the count, as SQLTables.trim_receipts
        # (the window's start in exact numeric, rounded once, as the engine's preload has it)
        "dead AS (SELECT r.sid FROM sig_receipts AS r, ok WHERE r.thread = ok.key AND "
        "r.accepted < ok.now_ms / 1000.0 - %(window)s::numeric ORDER BY r.accepted LIMIT 100), "
        "over AS (SELECT LEAST(100, GREATEST(0, ok.receipts - (SELECT count(*) FROM dead) - "
        "%(keep)s::bigint + 1)) AS n FROM ok), "
        # (read only when over the count: a plan that scans the thread's receipts to take
        # none of them was O(receipts) per signal)
        "extra AS (SELECT r.sid FROM sig_receipts AS r, ok WHERE r.thread = ok.key AND "
        "r.accepted >= ok.now_ms / 1000.0 - %(window)s::numeric AND (SELECT n FROM over) > 0 "
        "ORDER BY r.accepted LIMIT (SELECT n FROM over)), "
        # (by key, and only when there is any: a plan that reads every receipt of the
        # thread to find none was O(receipts) per signal)
        "forgot AS (DELETE FROM sig_receipts AS r USING (SELECT sid FROM dead UNION ALL "
        "SELECT sid FROM extra) AS x WHERE r.thread = %(key)s AND r.sid = x.sid AND EXISTS "
        "(SELECT 1 FROM dead UNION ALL SELECT 1 FROM extra) RETURNING 1), "
        + _trim_parts("(ok.pseq + 1)", "%(carry)s::boolean") +
        "entry AS (INSERT INTO sig_entries (thread, seq, sid, body, mode, prio, lane, merge, "
        "state, due, nb, expires, holder, attempts, error) SELECT ok.key, ok.seq, "
        "%(sid)s::text, %(body)s::text, %(mode)s::text, %(prio)s::integer, NULL, "
        "%(merge)s::text, CASE WHEN %(carry)s::boolean THEN 'carried' ELSE 'ready' END, NULL, "
        "NULL, %(expires)s::float8, CASE WHEN %(carry)s::boolean THEN ok.owner END, "
        "CASE WHEN %(carry)s::boolean THEN 1 ELSE 0 END, NULL FROM ok), "
        "receipt AS (INSERT INTO sig_receipts (thread, sid, status, accepted, at, attempts) "
        "SELECT ok.key, %(sid)s::text, 'pending', ok.now, ok.now, 0 FROM ok), "
        "part AS (INSERT INTO sig_parts (thread, n, kind, run, sid, data, at) SELECT ok.key, "
        "ok.pseq + 1, 'signal.received', ok.owner, %(sid)s::text, '{\"attempt\":1}', ok.now "
        "FROM ok WHERE %(carry)s::boolean), "
        "thread AS (UPDATE sig_threads AS t SET seq = ok.seq, pending = ok.pending + 1, "
        "last = ok.now, look = LEAST(t.look, ok.now), pseq = t.pseq + CASE WHEN "
        "%(carry)s::boolean THEN 1 ELSE 0 END, receipts = t.receipts + 1 - "
        "(SELECT count(*) FROM forgot), ptrim = GREATEST(t.ptrim, COALESCE((SELECT cut.n "
        "FROM cut), 0)) FROM ok WHERE t.key = ok.key), "
        # the notice to the owner's runtime (unless the sender is it), as the pub/sub
        # publishes: the topic's publishers take turns, the event is a row, NOTIFY the topic
        f"turn AS (SELECT %(prefix)s::text || ok.rt AS topic, pg_advisory_xact_lock({TOPIC_LOCK}, "
        "hashtext(%(prefix)s::text || ok.rt)) AS locked FROM ok WHERE ok.rt IS DISTINCT FROM "
        "%(sender)s::text), "
        "event AS (INSERT INTO ps_events (topic, body, at_ms) SELECT turn.topic, "
        "%(ev1)s::text || to_json(ok.owner)::text || %(ev2)s::text || COALESCE(ok.seq::text || "
        "%(ev3)s::text, ''), ok.now_ms FROM turn, ok), "
        "ring AS (SELECT pg_notify(%(channel)s::text, CASE WHEN octet_length(turn.topic) <= "
        f"{NOTIFY_MAX_BYTES} THEN turn.topic ELSE '' END) FROM turn) "
        "SELECT ok.seq, ok.now, ok.owner, (SELECT turn.topic FROM turn), "
        "(SELECT count(*) FROM ring) FROM ok"
    )


_ROUTE_NAMES = ("key", "sid", "body", "mode", "prio", "merge", "expires", "carry", "limit",
                "keep", "window", "cap", "age", "sender", "prefix", "channel", "ev1", "ev2",
                "ev3")
_ROUTE = _positional(_route_sql(), _ROUTE_NAMES)


def notice_pieces(key: str, signal: Signal, mode: EntryMode, carry: bool
                  ) -> tuple[str, str, str | None] | None:
    """The JSON of the notice event to a thread's owner, in pieces around the owner's run id
    (a JSON string) and, when it carries the entry, its number: ``ev1 + owner + ev2 + seq +
    ev3`` (SQL fills them in). ``None`` when the markers cannot be placed (never in
    practice: they are random)."""
    mark = uuid.uuid4().hex
    owner, seq = f"@o{mark}@", f"@s{mark}@"
    entry = InboxEntry(seq, signal, mode, 1) if carry else None
    text = Event("signals.notice", notice_data(Notice("signal", key, owner, entry=entry))
                 ).to_json()
    head, quoted, rest = text.partition(f'"{owner}"')
    if not quoted or owner in rest or owner in head:
        return None
    if not carry:
        return head, rest, None
    middle, found, tail = rest.partition(seq)
    if not found or seq in tail:
        return None
    return head, middle, tail


async def route_one(run_statements: Statements, key: str, signal: Signal, mode: EntryMode, *,
                    carry: bool, limits: Limits, keep: int, window_s: float, max_parts: int,
                    retention_s: float, sender: str | None, prefix: str, channel: str,
                    pieces: tuple[str, str, str | None]
                    ) -> tuple[int, float, str, str | None] | None:
    """Route ``signal`` (no lane, no ``not_before``) to the live owner of ``key`` in one
    statement when the common case holds: ``(entry seq, now, owner, notice topic or None)``,
    or ``None`` when nothing changed and the engine must do it."""
    values: Sequence[Any] = (
        key, signal.id, signal.encode(), mode, signal.priority, signal.merge, signal.expires_at,
        carry, limits.max_pending, keep, window_s, max_parts, retention_s, sender, prefix,
        channel, *pieces)
    sql, order = _ROUTE
    rows = await run_statements([(THREAD_LOCK, (key,)), (sql, [values[i] for i in order])])
    if not rows:
        return None
    seq, now, owner, topic, _ = rows[0]
    return int(seq), float(now), str(owner), topic
