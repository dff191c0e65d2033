"""One-statement paths of :class:`~signals.kit.SQLCore` on Postgres for its most common call:
a run acknowledging the one signal it was handed (``settle`` with one ack).

The engine (``_engine``, ``_rules``) reads a thread's rows, decides in Python and writes: two
round trips on Postgres (the reads, then the writes with COMMIT). For a plain acknowledgement
the decision fits in SQL: one statement (data-modifying common table expressions) checks that
the common case holds (the thread's current run, not fenced by a newer token or another live
lease holder; the entry and its receipt present; no lane state to tidy when the inbox
empties) and then writes what the engine would: the entry leaves, the receipt is
``processed`` with the result, a ``signal.acked`` part (trimming the stream as ``add_part``
does), the thread's pending count. It goes out with the thread's lock and COMMIT as one
message: one round trip. When the case does not hold, the statement changes nothing and the
engine does the call (its transaction is then a second one: nothing was written in between
that the engine would not see).

Held to the engine by ``tests/test_sql_fast.py``: the same random calls on two cores, one
with these paths and one without, leave the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from _signal_leases.sql import Tx
from _signal_leases.sql.leases import LIVE
from _signal_leases.sql.postgres import NOW_MS
from signals.kit._core import Ack, RunRef

__all__ = ["THREAD_LOCK", "ack_data", "settle_one"]

#: The advisory lock of a thread's calls (``SQLTables._lock``): SQL, one parameter, the key.
THREAD_LOCK = "SELECT pg_advisory_xact_lock(1397311815, hashtext(?))"

_NOW = f"({NOW_MS} / 1000.0)::float8"


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
        # the stream's oldest part, and the trim point when it is past the cap or the age
        "old AS (SELECT p.n, p.at FROM sig_parts AS p WHERE p.thread = %(key)s ORDER BY p.n "
        "LIMIT 1), "
        "cut AS (SELECT (SELECT MAX(p.n) FROM sig_parts AS p WHERE p.thread = ok.key AND "
        "(p.n <= ok.n - %(cap)s OR p.at < ok.now - %(age)s::float8)) AS n FROM ok, old "
        "WHERE old.n <= ok.n - %(cap)s OR old.at < ok.now - %(age)s::float8), "
        "gone AS (DELETE FROM sig_entries AS e USING ok WHERE e.thread = ok.key AND "
        "e.seq = %(seq)s), "
        "receipt AS (UPDATE sig_receipts AS r SET status = 'processed', at = ok.now, run = "
        "%(run)s::text, result = %(result)s::text, error = NULL, by_sid = NULL, body = NULL, "
        "mode = NULL, attempts = 0 FROM ok WHERE r.thread = ok.key AND r.sid = %(sid)s), "
        "part AS (INSERT INTO sig_parts (thread, n, kind, run, sid, data, at) SELECT ok.key, "
        "ok.n, 'signal.acked', %(run)s::text, %(sid)s::text, %(data)s::text, ok.now FROM ok), "
        "trim AS (DELETE FROM sig_parts AS p USING cut WHERE p.thread = %(key)s AND "
        "p.n <= cut.n), "
        "thread AS (UPDATE sig_threads AS t SET pending = GREATEST(ok.pending - 1, 0), "
        "look = CASE WHEN ok.pending > 1 THEN t.look END, pseq = t.pseq + 1, "
        "ptrim = GREATEST(t.ptrim, COALESCE((SELECT cut.n FROM cut), 0)) "
        "FROM ok WHERE t.key = ok.key) "
        "SELECT count(*) FROM ok"
    )
    return sql


_SETTLE = {fused: _settle_sql(fused) for fused in (False, True)}
_NAMES = ("key", "run", "token", "seq", "sid", "result", "data", "cap", "age")


def _positional(sql: str) -> tuple[str, list[int]]:
    """``sql`` with ``%(name)s`` turned into ``?`` and the order of the names used."""
    order: list[int] = []
    out = sql
    while "%(" in out:
        start = out.index("%(")
        end = out.index(")s", start)
        order.append(_NAMES.index(out[start + 2:end]))
        out = out[:start] + "?" + out[end + 2:]
    return out, order


_COMPILED = {fused: _positional(sql) for fused, sql in _SETTLE.items()}


def ack_data(result: str | None) -> str | None:
    """The data of an ack's ``signal.acked`` part (as ``Rules._ack`` writes it)."""
    if result is None:
        return None
    return json.dumps({"result": json.loads(result)}, separators=(",", ":"))


def settle_one(tx: Tx, key: str, run: RunRef, ack: Ack, *, fused: bool, max_parts: int,
               retention_s: float) -> bool:
    """Acknowledge ``ack`` for ``run`` in one statement when the common case holds (see the
    module docstring): True when done (the transaction is then over), False when nothing
    changed and the engine must do it."""
    if not ack.entry_id.isdigit():
        return False
    sql, order = _COMPILED[fused]
    values: Sequence[Any] = (key, run.run_id, run.token, int(ack.entry_id), ack.signal_id,
                             ack.result, ack_data(ack.result), max_parts, retention_s)
    tx.write(THREAD_LOCK, (key,))
    rows = tx.last(sql, [values[i] for i in order])
    return bool(rows and rows[0][0])
