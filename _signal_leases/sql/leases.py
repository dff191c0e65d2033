"""Leases in a SQL database: the table layout and every lease operation, as plain synchronous
functions over a :class:`~_signal_leases.sql.Tx`.

Each function runs inside a transaction its caller opened (``await db.run(lambda tx: ...)``).
The lease provider (``leases._backends.sql``) runs one per operation; the signal store calls
the same functions inside its own transactions, to read or grant a thread's lease together
with an inbox write (what :data:`_signal_leases.lua.LEASE_FUNCTIONS` is for on Redis).
Arguments are trusted: the public entry points validate them. Nothing here does I/O except
through ``tx``, and every time is ``tx.now_ms`` (one clock reading per transaction).

Layout (component :data:`COMPONENT`, schema version :data:`VERSION`; :func:`ddl`):

* ``leases(key, owner, token, expires_ms, session)``: one row per leased key. A *per-key*
  lease (``session`` NULL) is live while ``expires_ms > now``; a *session* lease lives exactly
  as long as its row in ``lease_sessions`` does (its own ``expires_ms`` is never read). A dead
  row stays where it is until the next grant of its key overwrites it (or a release, or the
  close of its session, deletes it): nothing ever scans the table.
* ``lease_sessions(id, expires_ms)``: a session is live while ``expires_ms > now``. Expired
  rows are swept when a session is opened (a small table: one row per holder process).
* Fencing tokens come from one counter for all keys, strictly increasing and never reset by
  expiry or release: on SQLite the one-row table ``lease_counter``, on Postgres the sequence
  ``lease_tokens``. Tokens of one key therefore increase too (with gaps).

Concurrency. On SQLite a write transaction holds the database's write lock from its first
statement (``BEGIN IMMEDIATE``), so each function sees and changes a still state. On Postgres
(READ COMMITTED) :func:`acquire` and :func:`transfer` first take a transaction-scoped
advisory lock on the key, so grants of one key are serial (also when no row exists yet), and
every other write is one statement whose ``WHERE`` checks owner and liveness again on the row
it locks. A caller of :func:`grant` takes :func:`lock` itself, before it reads the key.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from _signal_leases.sql import Tx

__all__ = [
    "COMPONENT",
    "LIVE",
    "VERSION",
    "Acquired",
    "Lease",
    "acquire",
    "close_session",
    "ddl",
    "grant",
    "info",
    "lease_of",
    "live",
    "live_query",
    "lock",
    "open_session",
    "release",
    "renew",
    "renew_many",
    "renew_session",
    "session_live",
    "transfer",
]

COMPONENT = "leases"
VERSION = 1

#: The expiry that decides whether the lease row ``l`` is live (NULL when its session is gone).
_EXPIRY = (
    "CASE WHEN l.session IS NULL THEN l.expires_ms "
    "ELSE (SELECT s.expires_ms FROM lease_sessions AS s WHERE s.id = l.session) END"
)
_LIVE = f"{_EXPIRY} > ?"  # NULL (a session that is gone) is not live
#: The condition "the lease row ``l`` is live", with one parameter: ``tx.now_ms``.
LIVE = _LIVE


def live_query(now_sql: str = "?") -> str:
    """The query of :func:`live` (parameters: the key, then ``tx.now_ms`` unless the clock
    is given as SQL in ``now_sql``); decode its row with :func:`lease_of`."""
    return (f"SELECT l.owner, l.token, l.session FROM leases AS l WHERE l.key = ? AND "
            f"{_EXPIRY} > {now_sql}")


def lease_of(row: Sequence[Any] | None) -> Lease | None:
    """The :class:`Lease` of a row of :func:`live_query` (``None``: no row)."""
    return None if row is None else Lease(row[0], int(row[1]), row[2])

_RENEW = "CASE WHEN l.session IS NULL THEN ? ELSE l.expires_ms END"  # a session lease: as is
_CHUNK = 500  # (key, owner) pairs per renewal statement: 1,000 parameters, well under limits


class Lease(NamedTuple):
    """A live lease: its holder, the token of its grant, its session (``None``: per-key)."""

    owner: str
    token: int
    session: str | None


class Acquired(NamedTuple):
    """What :func:`acquire` did, shaped like ``leases.AcquireResult``."""

    acquired: bool
    owner: str | None
    token: int | None


def ddl(dialect: str) -> list[str]:
    """The statements that create the lease tables in ``dialect`` (``sqlite``/``postgres``)."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    statements = [
        f"CREATE TABLE leases (key TEXT PRIMARY KEY, owner TEXT NOT NULL, token {big} NOT NULL, "
        f"expires_ms {big} NOT NULL, session TEXT)",
        "CREATE INDEX leases_session_idx ON leases (session)",
        f"CREATE TABLE lease_sessions (id TEXT PRIMARY KEY, expires_ms {big} NOT NULL)",
    ]
    if dialect == "postgres":
        return [*statements, "CREATE SEQUENCE lease_tokens"]
    return [
        *statements,
        "CREATE TABLE lease_counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)",
        "INSERT INTO lease_counter (id, n) VALUES (0, 0)",
    ]


def lock(tx: Tx, key: str) -> None:
    """Serialize the grants of ``key`` until the transaction ends (Postgres: an advisory lock;
    SQLite: nothing to do, a write transaction already holds the database)."""
    if tx.dialect == "postgres":
        tx.write("SELECT pg_advisory_xact_lock(1279607123, hashtext(?))", (key,))


def _next_token(tx: Tx) -> int:
    if tx.dialect == "postgres":
        return int(tx.value("SELECT nextval('lease_tokens')"))
    return int(tx.value("UPDATE lease_counter SET n = n + 1 WHERE id = 0 RETURNING n"))


def live(tx: Tx, key: str) -> Lease | None:
    """The live lease on ``key``, or ``None`` (free, expired, or its session is gone)."""
    return lease_of(tx.one(live_query(), (key, tx.now_ms)))


def info(tx: Tx, key: str) -> tuple[str, int, int] | None:
    """``(owner, token, ms left)`` of the live lease on ``key`` (a session lease: the
    session's time left), or ``None``."""
    row = tx.one(
        f"SELECT l.owner, l.token, {_EXPIRY} FROM leases AS l WHERE l.key = ? AND {_LIVE}",
        (key, tx.now_ms),
    )
    return None if row is None else (row[0], int(row[1]), max(1, int(row[2]) - tx.now_ms))


def session_live(tx: Tx, session: str) -> bool:
    """Whether ``session`` exists and has not expired."""
    row = tx.one("SELECT 1 FROM lease_sessions WHERE id = ? AND expires_ms > ?",
                 (session, tx.now_ms))
    return row is not None


def grant(tx: Tx, key: str, owner: str, ttl_ms: int, session: str | None = None) -> int:
    """Give ``key`` to ``owner`` with a new token (returned), replacing any row of the key.

    The caller has found the key free in this transaction (:func:`live` after :func:`lock`)
    and, for a session lease, the session live.
    """
    token = _next_token(tx)
    tx.execute(
        "INSERT INTO leases (key, owner, token, expires_ms, session) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
        "expires_ms = excluded.expires_ms, session = excluded.session",
        (key, owner, token, tx.now_ms + ttl_ms, session),
    )
    return token


def acquire(
    tx: Tx, key: str, owner: str, ttl_ms: int, session: str | None = None
) -> Acquired:
    """Grant ``key`` when free (a new token), refresh it for its holder (same token), else
    report the holder. A new grant under ``session`` lives as long as the session; under a
    session that is gone the answer is ``(False, None, None)``."""
    lock(tx, key)
    current = live(tx, key)
    if current is not None and current.owner != owner:
        return Acquired(False, current.owner, None)
    if current is not None and renew(tx, key, owner, ttl_ms):
        return Acquired(True, owner, current.token)
    if session is not None and not session_live(tx, session):
        return Acquired(False, None, None)
    return Acquired(True, owner, grant(tx, key, owner, ttl_ms, session))


def renew(tx: Tx, key: str, owner: str, ttl_ms: int) -> bool:
    """Whether ``owner`` holds a live lease on ``key``; a per-key lease then lives ``ttl_ms``
    from now (a session lease lives with its session). Never revives a dead lease."""
    changed = tx.execute(
        f"UPDATE leases AS l SET expires_ms = {_RENEW} "
        f"WHERE l.key = ? AND l.owner = ? AND {_LIVE}",
        (tx.now_ms + ttl_ms, key, owner, tx.now_ms),
    )
    return changed > 0


def renew_many(tx: Tx, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]:
    """:func:`renew` for every ``(key, owner)`` pair, one statement per 500 pairs; returns the
    keys still held."""
    kept: set[str] = set()
    for start in range(0, len(items), _CHUNK):
        chunk = items[start : start + _CHUNK]
        values = ", ".join(["(?, ?)"] * len(chunk))
        rows = tx.all(
            f"UPDATE leases AS l SET expires_ms = {_RENEW} FROM (VALUES {values}) AS v "
            f"WHERE l.key = v.column1 AND l.owner = v.column2 AND {_LIVE} RETURNING key",
            (tx.now_ms + ttl_ms, *(part for pair in chunk for part in pair), tx.now_ms),
        )
        kept.update(row[0] for row in rows)
    return kept


def release(tx: Tx, key: str, owner: str) -> bool:
    """Delete the lease on ``key`` if ``owner`` holds it (live); whether it did."""
    deleted = tx.execute(
        f"DELETE FROM leases AS l WHERE l.key = ? AND l.owner = ? AND {_LIVE}",
        (key, owner, tx.now_ms),
    )
    return deleted > 0


def transfer(tx: Tx, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
    """Hand the live lease on ``key`` from ``from_owner`` to ``to_owner``: a new token, a fresh
    TTL, the same session; the key is never free. When ``to_owner`` already holds it (a replay,
    or ``from_owner == to_owner``) this is :func:`renew` (the token is kept)."""
    lock(tx, key)
    current = live(tx, key)
    if current is None:
        return False
    if current.owner == to_owner:
        return renew(tx, key, to_owner, ttl_ms)
    if current.owner != from_owner:
        return False
    changed = tx.execute(
        "UPDATE leases SET owner = ?, token = ?, expires_ms = ? WHERE key = ? AND owner = ?",
        (to_owner, _next_token(tx), tx.now_ms + ttl_ms, key, from_owner),
    )
    return changed > 0


def open_session(tx: Tx, ttl_ms: int) -> str:
    """A new session, live for ``ttl_ms``; sweeps the sessions that have expired."""
    tx.execute("DELETE FROM lease_sessions WHERE expires_ms <= ?", (tx.now_ms,))
    session = uuid.uuid4().hex
    tx.execute("INSERT INTO lease_sessions (id, expires_ms) VALUES (?, ?)",
               (session, tx.now_ms + ttl_ms))
    return session


def renew_session(tx: Tx, session: str, ttl_ms: int) -> bool:
    """Keep a live ``session`` (and all its leases) for ``ttl_ms`` more; ``False`` once it has
    expired or was closed (never revives it)."""
    changed = tx.execute(
        "UPDATE lease_sessions SET expires_ms = ? WHERE id = ? AND expires_ms > ?",
        (tx.now_ms + ttl_ms, session, tx.now_ms),
    )
    return changed > 0


def close_session(tx: Tx, session: str) -> None:
    """End ``session``: every lease in it is free at once (their rows are deleted too)."""
    tx.execute("DELETE FROM lease_sessions WHERE id = ?", (session,))
    tx.execute("DELETE FROM leases WHERE session = ?", (session,))
