"""The pub/sub's tables in a SQL database, and its statements as functions over a ``Tx``.

* ``ps_events(id, topic, body, at_ms)``: every published event, ``id`` growing; kept
  ``retention_ms`` (pruned by age, by the reader of any process, once a minute).
* ``ps_groups(topic, name, cursor)``: a consumer group's position: it has been handed every
  event of its topic up to ``cursor``.
* ``ps_claims(topic, name, event_id, consumer, attempt, until_ms)``: events a group handed to a
  member and not yet acknowledged. A claim whose ``until_ms`` passed (its consumer died, or
  stopped refreshing it) is handed to another member, with the attempt counted.
* ``ps_listeners(id, address, seen_ms)``: the processes listening, for a doorbell that needs
  their addresses (SQLite: a Unix datagram socket per process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _signal_leases.sql import Tx
from _signal_leases.sql.postgres import NOW_MS

__all__ = [
    "COMPONENT", "EVENTS_AFTER", "TOPIC_LOCK", "VERSION", "ack", "claim", "ddl", "events_after",
    "extend", "fail", "join_group", "latest_id", "prune", "publish",
]

COMPONENT, VERSION = "pubsub", 1
#: The advisory lock (first key; the second is ``hashtext(topic)``) that publishers of one
#: topic take in turn, to the commit (see :func:`publish`).
TOPIC_LOCK = 1347634003


def ddl(dialect: str) -> list[str]:
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    serial = "BIGSERIAL PRIMARY KEY" if dialect == "postgres" else \
        "INTEGER PRIMARY KEY AUTOINCREMENT"
    return [
        f"CREATE TABLE ps_events (id {serial}, topic TEXT NOT NULL, body TEXT NOT NULL, "
        f"at_ms {big} NOT NULL)",
        "CREATE INDEX ps_events_topic ON ps_events (topic, id)",
        "CREATE INDEX ps_events_age ON ps_events (at_ms)",
        f"CREATE TABLE ps_groups (topic TEXT NOT NULL, name TEXT NOT NULL, cursor {big} NOT "
        f"NULL, PRIMARY KEY (topic, name))",
        f"CREATE TABLE ps_claims (topic TEXT NOT NULL, name TEXT NOT NULL, event_id {big} NOT "
        f"NULL, consumer TEXT NOT NULL, attempt INTEGER NOT NULL, until_ms {big} NOT NULL, "
        f"PRIMARY KEY (topic, name, event_id))",
        "CREATE INDEX ps_claims_until ON ps_claims (topic, name, until_ms)",
        "CREATE INDEX ps_claims_consumer ON ps_claims (consumer)",
        f"CREATE TABLE ps_listeners (id TEXT PRIMARY KEY, address TEXT NOT NULL, seen_ms {big} "
        f"NOT NULL)",
    ]


def publish(tx: Tx, topic: str, body: str) -> None:
    """Insert the event; its id orders it within its topic. Readers keep a cursor per topic,
    so ids must be visible in the order they were handed out: on SQLite the write lock makes
    it so; on Postgres the publishers of one topic take turns (a transaction-scoped advisory
    lock on the topic, held to the commit), so an id is never handed out while a smaller one
    of its topic may still commit."""
    if tx.dialect == "postgres":  # (a write nothing waits for: the id is not needed)
        tx.write(f"WITH turn AS (SELECT pg_advisory_xact_lock({TOPIC_LOCK}, hashtext(?))) "
                 f"INSERT INTO ps_events (topic, body, at_ms) SELECT ?, ?, {NOW_MS} FROM turn",
                 (topic, topic, body))
        return
    tx.write("INSERT INTO ps_events (topic, body, at_ms) VALUES (?, ?, ?)",
             (topic, body, tx.now_ms))


def latest_id(tx: Tx) -> int:
    return int(tx.value("SELECT COALESCE(MAX(id), 0) FROM ps_events"))


#: The events of a topic after an id, oldest first (parameters: topic, id, limit).
EVENTS_AFTER = "SELECT id, body FROM ps_events WHERE topic = ? AND id > ? ORDER BY id LIMIT ?"


def events_after(tx: Tx, topic: str, after: int, limit: int) -> list[tuple[int, str]]:
    return [(int(i), b) for i, b in tx.all(EVENTS_AFTER, (topic, after, limit))]


def join_group(tx: Tx, topic: str, name: str, earliest: bool) -> None:
    """Create the group if new, at the start (``earliest``) or at the end of the topic."""
    start = 0 if earliest else latest_id(tx)
    tx.execute("INSERT INTO ps_groups (topic, name, cursor) VALUES (?, ?, ?) "
               "ON CONFLICT (topic, name) DO NOTHING", (topic, name, start))


def claim(tx: Tx, topic: str, name: str, consumer: str, limit: int, visibility_ms: int
          ) -> list[tuple[int, str, int]]:
    """Hand ``consumer`` the claims that timed out, then the group's next events:
    ``(event id, body, attempt)``, oldest first."""
    until = tx.now_ms + visibility_ms
    out: list[tuple[int, str, int]] = []
    for event_id, body, attempt in tx.all(
        "SELECT c.event_id, e.body, c.attempt FROM ps_claims AS c JOIN ps_events AS e ON "
        "e.id = c.event_id WHERE c.topic = ? AND c.name = ? AND c.until_ms < ? "
        "ORDER BY c.event_id LIMIT ?", (topic, name, tx.now_ms, limit)):
        tx.execute("UPDATE ps_claims SET consumer = ?, attempt = ?, until_ms = ? WHERE topic = ? "
                   "AND name = ? AND event_id = ?",
                   (consumer, int(attempt) + 1, until, topic, name, event_id))
        out.append((int(event_id), body, int(attempt) + 1))
    cursor = tx.value("SELECT cursor FROM ps_groups WHERE topic = ? AND name = ?", (topic, name))
    fresh = events_after(tx, topic, int(cursor or 0), max(0, limit - len(out)))
    if fresh:
        tx.many("INSERT INTO ps_claims (topic, name, event_id, consumer, attempt, until_ms) "
                "VALUES (?, ?, ?, ?, 1, ?)",
                [(topic, name, i, consumer, until) for i, _ in fresh])
        tx.execute("UPDATE ps_groups SET cursor = ? WHERE topic = ? AND name = ?",
                   (fresh[-1][0], topic, name))
    return out + [(i, b, 1) for i, b in fresh]


def ack(tx: Tx, topic: str, name: str, event_ids: Sequence[int]) -> None:
    tx.many("DELETE FROM ps_claims WHERE topic = ? AND name = ? AND event_id = ?",
            [(topic, name, i) for i in event_ids])


def fail(tx: Tx, topic: str, name: str, event_id: int, attempt: int) -> None:
    """Record a failed delivery attempt of a claim (another member takes the count on)."""
    tx.execute("UPDATE ps_claims SET attempt = ? WHERE topic = ? AND name = ? AND event_id = ?",
               (attempt, topic, name, event_id))


def extend(tx: Tx, consumer: str, visibility_ms: int) -> None:
    """Keep every claim of ``consumer`` (its handlers are alive) for ``visibility_ms`` more."""
    tx.execute("UPDATE ps_claims SET until_ms = ? WHERE consumer = ?",
               (tx.now_ms + visibility_ms, consumer))


def prune(tx: Tx, retention_ms: int) -> None:
    """Delete events past the retention, and claims on events that are gone."""
    tx.execute("DELETE FROM ps_events WHERE at_ms < ?", (tx.now_ms - retention_ms,))
    tx.execute("DELETE FROM ps_claims WHERE NOT EXISTS "
               "(SELECT 1 FROM ps_events AS e WHERE e.id = ps_claims.event_id)")


def listeners(tx: Tx, stale_ms: int) -> list[tuple[Any, Any]]:
    return tx.all("SELECT id, address FROM ps_listeners WHERE seen_ms > ?",
                  (tx.now_ms - stale_ms,))
