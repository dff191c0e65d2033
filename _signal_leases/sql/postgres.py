"""PostgreSQL for every layer: one database (and one schema in it) shared by any number of
processes on any number of hosts, through psycopg 3 (the ``postgres`` extra).

Connections are psycopg's synchronous ones, used in worker threads like every
:class:`~_signal_leases.sql.Database` (asyncio and trio alike); each transaction starts with
one round trip that also reads the server's clock, ``clock_timestamp()``: every lease expiry
and due time is compared with the database's clock, never a client's. The tables live in the
schema ``schema`` (created when missing), reached through ``search_path``.

**Timeouts.** ``timeout_s`` bounds connecting (``connect_timeout``), every statement
(``statement_timeout``, which also bounds waits for a lock) and a connection whose packets go
unanswered (``tcp_user_timeout``): an unreachable server is a
:class:`~_signal_leases.errors.BackendUnavailableError` within about that long, never a hang.

**Plans.** Every statement of the library reads by index (a thread's rows, a key's lease);
none needs a table scan. Statements are prepared once per connection, and Postgres keeps a
prepared statement's plan until the tables' statistics change: a plan made while a table was
small (statistics of a new schema, or none) would scan it, at a cost that grows with the table
(measured: a route statement from 0.98 to 2.0 ms as 1,800 signals piled up). So the
statements of the hot path (:meth:`PostgresDatabase.run_statements`: a routed signal, an
acknowledgement, a pub/sub read) run with ``SET LOCAL enable_seqscan = off``, which leaves
Postgres a table scan only where no index serves (flat at 0.94-1.09 ms over the same pile),
and the signal core refreshes the statistics early (``SQLCore.analyze_after``). (Not on
every statement: the sweep of expired lease sessions, which no index serves, took 20-77 ms
with it instead of 1-3.)

**Errors.** A refused or lost connection, a server shutting down or starting, a timeout, a
serialization failure or a deadlock is ``BackendUnavailableError`` (retry later). A wrong
password, an unknown role or database, a missing privilege or a schema of another version is
``BackendPermanentError`` (fix the configuration).
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from _signal_leases.aio import running_asyncio_loop
from _signal_leases.errors import (
    BackendError,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
)
from _signal_leases.sql import Database, Tx, placeholders
from _signal_leases.validation import check_int

__all__ = ["NOTIFY_MAX_BYTES", "NOW_MS", "PostgresDatabase", "import_psycopg"]

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: SQLSTATE classes and codes that no retry will fix.
_PERMANENT_STATES = ("28", "3D", "42", "0A", "22", "23")
#: Server messages of a connection attempt that no retry will fix (psycopg reports them
#: without a SQLSTATE).
_PERMANENT_TEXT = (
    "password authentication failed", "does not exist", "no pg_hba.conf entry",
    "permission denied", "authentication failed", "SSL is not enabled",
    "invalid dsn", "invalid connection option", "missing \"=\"",
)
_SCHEMA_LOCK = 1397311816  # advisory lock key: one schema creation at a time


def import_psycopg() -> Any:
    """psycopg, or an ``ImportError`` that says how to install it."""
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(
            "the Postgres backend needs psycopg 3: pip install 'signal-leases[postgres]'"
        ) from exc
    return psycopg


def _safe_dsn(dsn: str) -> str:
    """``dsn`` without its password (for messages)."""
    text = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", text)


#: The longest ``NOTIFY`` payload sent (bytes; Postgres allows 8,000): a longer topic is sent
#: as "" (look at every topic).
NOTIFY_MAX_BYTES = 7000
#: The transaction's clock in ms, in SQL: what ``Tx.now_ms`` holds in a Postgres transaction.
NOW_MS = "(extract(epoch FROM transaction_timestamp()) * 1000)::bigint"


def _clock(cursor: Any) -> tuple[int, float]:
    """The clock ``cursor`` holds (a row of ``SELECT NOW_MS``), as ``Database.begin``
    returns it."""
    now_ms = int(cursor.fetchone()[0])
    return now_ms, now_ms / 1000


_TUPLES_OK = 2  # libpq's PGRES_TUPLES_OK: a result with rows
_INDEXES_ONLY = "SET LOCAL enable_seqscan = off"  # (see the module docstring: "Plans")
_PARAM = re.compile(r"%s")
_MAX_PREPARED = 500  # statements one connection prepares at most; the rest run unprepared


class _Prepared:
    """What a connection keeps between transactions: the statements it has prepared
    (``PREPARE``, kept by the server until the connection closes, whatever the transaction
    does): text -> name, names never used twice (after an error in a message, the statements
    it prepared get new names); and its parameter binder and row loader."""

    __slots__ = ("bind", "count", "encoding", "load", "names")

    def __init__(self, conn: Any, psycopg: Any) -> None:
        self.names: dict[str, str] = {}
        self.count = 0
        self.bind: Callable[..., str] = psycopg.ClientCursor(conn).mogrify
        self.encoding: str = conn.info.encoding
        self.load: Any = psycopg.adapt.Transformer(conn)  # text results -> Python values


def _literals(values: Sequence[Any]) -> str | None:
    """``values`` as SQL literals separated by commas, for the common types (``None``,
    ``bool``, ``int``, finite ``float``, ``str`` without NUL); ``None`` for anything else,
    which psycopg's own quoting binds (``ClientCursor.mogrify``, several times slower: it
    parses its query and looks up an adapter per value). A string is quoted as
    ``standard_conforming_strings`` has it (the connections set it): only ``'`` is special,
    and doubled."""
    out = []
    for value in values:
        kind = type(value)
        if value is None:
            out.append("NULL")
        elif kind is str:
            if "\0" in value:
                return None  # (psycopg's error: Postgres text cannot hold NUL)
            out.append("'" + value.replace("'", "''") + "'")
        elif kind is bool:
            out.append("true" if value else "false")
        elif kind is int:
            out.append(str(value))
        elif kind is float and math.isfinite(value):
            out.append(repr(value))
        else:
            return None
    return ", ".join(out)


class _Batch:
    """The statements of one transaction, sent as few messages (one round trip each): BEGIN
    and the clock's query go out with the call's first reads, every write with the next read
    or with COMMIT. The statements of a message run in turn, as one simple query; an error
    stops it and fails the transaction. Each statement is prepared once per connection and
    then run as ``EXECUTE name(literals)``, its parameters bound by psycopg's own quoting
    (``ClientCursor.mogrify``): a message of 20 statements costs the client what 2 or 3 cost
    one by one, and the server plans none of them again (see docs/postgres.md)."""

    __slots__ = ("_bind", "_clock", "_conn", "_cursor", "_new", "_prepared", "_queued")

    def __init__(self, conn: Any, prepared: _Prepared) -> None:
        self._conn = conn
        self._cursor: Any = None  # (opened at the first message: see message())
        self._bind = prepared.bind
        self._prepared = prepared
        self._new: dict[str, str] = {}  # prepared by this batch's next message
        self._queued: list[str] = ["BEGIN"]
        self._clock: tuple[int, float] | None = None

    def _text(self, sql: str, params: Sequence[Any]) -> str:
        if not params:
            return sql
        prepared = self._prepared
        name = prepared.names.get(sql) or self._new.get(sql)
        if name is None and len(prepared.names) + len(self._new) >= _MAX_PREPARED:
            text: str = self._bind(sql, tuple(params))
            return text
        # (bound before a new name is taken: a value that cannot be bound registers nothing)
        args = _literals(params)
        if args is None:
            args = self._bind(", ".join(["%s"] * len(params)), tuple(params))
        if name is None:
            name = self._new[sql] = f"sl_{prepared.count}"
            prepared.count += 1
            n = iter(range(1, len(params) + 1))
            self._queued.append(f"PREPARE {name} AS " + _PARAM.sub(lambda _: f"${next(n)}", sql))
        return f"EXECUTE {name}({args})"

    def write(self, sql: str, params: Sequence[Any]) -> None:
        self._queued.append(self._text(sql, params))

    def _send(self, texts: list[str]) -> None:
        new, self._new = self._new, {}
        if self._cursor is None:
            self._cursor = self._conn.cursor()
        self._cursor.execute(";\n".join(texts))
        self._prepared.names.update(new)  # (after an error: names not used again)

    def message(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> tuple[str, int]:
        """The text of one message that runs ``statements`` in a transaction (BEGIN ...
        COMMIT), and the index of the last statement's result among the message's results.
        Call :meth:`prepared` once it ran."""
        for sql, params in statements:
            self.write(sql, params)
        texts, self._queued = self._queued, ["BEGIN"]
        return ";\n".join([*texts, "COMMIT"]), len(texts) - 1

    def prepared(self) -> None:
        """The statements queued since the last message ran: they are prepared on the
        connection."""
        new, self._new = self._new, {}
        self._prepared.names.update(new)

    def run(self, queries: Sequence[tuple[str, Sequence[Any]]], *, commit: bool = False
            ) -> list[tuple[list[tuple[Any, ...]], int]]:
        reads = [self._text(sql, params) for sql, params in queries]  # (PREPAREs queue first)
        texts, self._queued = self._queued, []
        skip = len(texts)
        clock = self._clock is None and not commit
        if clock:
            texts.append(f"SELECT {NOW_MS}")
        self._send(texts + reads + (["COMMIT"] if commit else []))
        if commit:
            self._queued = ["BEGIN"]  # ended: commit() has nothing to send
        cursor = self._cursor
        assert cursor is not None
        for _ in range(skip):
            cursor.nextset()
        if clock:
            self._clock = _clock(cursor)
            cursor.nextset()
        out = []
        for _ in reads:
            rows = ([tuple(r) for r in cursor.fetchall()]
                    if cursor.pgresult.status == _TUPLES_OK else [])
            out.append((rows, int(cursor.rowcount)))
            cursor.nextset()
        return out

    def clock(self) -> tuple[int, float]:
        if self._clock is None:
            self.run(())
        assert self._clock is not None
        return self._clock

    def commit(self) -> None:
        if self._queued == ["BEGIN"]:  # nothing sent, nothing to commit
            return
        self._queued.append("COMMIT")
        texts, self._queued = self._queued, []
        self._send(texts)


async def _exchange(loop: asyncio.AbstractEventLoop, pgconn: Any, query: bytes) -> list[Any]:
    """Send ``query`` (a simple query: statements separated by ``;``) on ``pgconn``
    (non-blocking, as psycopg keeps it) and read every result, waiting on ``loop`` for the
    socket."""
    pgconn.send_query(query)
    fd = pgconn.socket
    while pgconn.flush():  # (1: more to send)
        await _ready(loop, fd, write=True)
    results: list[Any] = []
    while True:
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                return results
            results.append(result)
        await _ready(loop, fd, write=False)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    """Until ``fd`` is readable (writable with ``write``)."""
    ready: asyncio.Future[None] = loop.create_future()

    def done() -> None:
        if not ready.done():
            ready.set_result(None)

    add, remove = (loop.add_writer, loop.remove_writer) if write else (
        loop.add_reader, loop.remove_reader)
    add(fd, done)
    try:
        await ready
    finally:
        remove(fd)


class PostgresDatabase(Database):
    """A PostgreSQL database (see the module docstring).

    ``dsn``: a libpq connection string or URL. ``schema``: where the tables live (default
    ``signal_leases``; lowercase letters, digits and ``_``). ``max_connections``: the pool of
    this process (opened on demand, kept while idle). ``timeout_s``: see the module docstring.
    """

    param = "%s"
    dialect = "postgres"

    def __init__(self, dsn: str, *, schema: str = "signal_leases", max_connections: int = 4,
                 timeout_s: float = 10.0) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise TypeError(f"dsn must be a PostgreSQL connection string, got {dsn!r}")
        if not isinstance(schema, str) or not _SCHEMA.match(schema):
            raise ValueError(f"schema must be lowercase letters, digits and '_' (at most 63, "
                             f"not starting with a digit), got {schema!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or \
                not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        super().__init__(max_connections=check_int("max_connections", max_connections))
        self._psycopg = import_psycopg()
        self.dsn = dsn
        self.schema = schema
        self.timeout_s = float(timeout_s)
        self._namespace_made = False
        self._namespace_lock = threading.Lock()
        #: connection -> the statements it prepared (see _Batch)
        self._prepared: weakref.WeakKeyDictionary[Any, _Prepared] = weakref.WeakKeyDictionary()

    @property
    def name(self) -> str:
        return f"Postgres {_safe_dsn(self.dsn)!r} (schema {self.schema!r})"

    def connection_kwargs(self) -> dict[str, Any]:
        """What :meth:`connect` passes to ``psycopg.connect`` besides the DSN (the listener of
        ``PostgresPubSub`` uses it too)."""
        ms = int(self.timeout_s * 1000)
        return {
            "autocommit": True,  # transactions are begun explicitly (see begin)
            "connect_timeout": max(1, round(self.timeout_s)),
            "tcp_user_timeout": ms,
            "application_name": "signal-leases",
            "keepalives": 1,  # an idle connection (the listener's) notices a dead peer too
            "keepalives_idle": max(1, round(self.timeout_s / 2)),
            "keepalives_interval": max(1, round(self.timeout_s / 6)),
            "keepalives_count": 3,
            # (standard_conforming_strings: the quoting of _literals relies on it)
            "options": f"-c search_path={self.schema} -c statement_timeout={ms} "
                       f"-c standard_conforming_strings=on",
        }

    def connect(self) -> Any:
        conn = self._psycopg.connect(self.dsn, **self.connection_kwargs())
        try:
            if not self._namespace_made:
                with self._namespace_lock:
                    if not self._namespace_made:
                        self._make_schema(conn)
                        self._namespace_made = True
        except BaseException:
            conn.close()
            raise
        return conn

    def _make_schema(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE SCHEMA "{self.schema}"')  # checked identifier
            conn.commit()

    def begin(self, cursor: Any, write: bool) -> tuple[int, float]:
        cursor.execute(f"BEGIN; SELECT {NOW_MS}")
        cursor.nextset()
        return _clock(cursor)

    reads_autocommit = True  # READ COMMITTED: each statement sees the latest commit anyway

    def read_clock(self, cursor: Any) -> tuple[int, float]:
        cursor.execute(f"SELECT {NOW_MS}")
        return _clock(cursor)

    def batch(self, conn: Any, write: bool) -> _Batch:
        """A transaction's statements as few messages (see :class:`_Batch`)."""
        return _Batch(conn, self._kept(conn))

    def _kept(self, conn: Any) -> _Prepared:
        with self._namespace_lock:
            prepared = self._prepared.get(conn)
            if prepared is None:
                prepared = self._prepared[conn] = _Prepared(conn, self._psycopg)
        return prepared

    #: On asyncio, :meth:`run_statements` runs on the event loop's thread (False: in a
    #: worker thread, as every other call).
    loop_calls = True

    async def run_statements(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                             write: bool = True, what: str = "a call"
                             ) -> list[tuple[Any, ...]]:
        """As :meth:`Database.run_statements`; on asyncio the message goes out from the
        event loop's own thread, on a connection of the pool (psycopg's connections do their
        I/O without blocking): no worker-thread hop, which cost more CPU than the statement
        (measured per call: 96 µs against 227-252 µs through a thread). It counts as one of
        the ``max_connections`` calls, and a call that started is never abandoned, as in a
        thread."""
        # (in a transaction even to read: SET LOCAL lasts until its end; see "Plans" above)
        statements = [(_INDEXES_ONLY, ()), *statements]
        loop = running_asyncio_loop()
        if loop is None or not self.loop_calls:
            return await super().run_statements(statements, what=what)
        if self._closed:
            raise ClosedError(f"the database {self.name} is closed")
        return await self._workers.run_here(partial(self._on_loop, loop, statements, what))

    async def _on_loop(self, loop: asyncio.AbstractEventLoop,
                       statements: Sequence[tuple[str, Sequence[Any]]], what: str
                       ) -> list[tuple[Any, ...]]:
        try:
            conn = self._take(connect=False)
            if conn is None:  # (connecting blocks: in a thread)
                conn = await anyio.to_thread.run_sync(self._take)
        except Exception as exc:
            raise self._mapped(exc, what) from exc
        healthy = False  # (an error, or a cancellation mid-message: the connection goes)
        try:
            prepared = self._kept(conn)
            batch = _Batch(conn, prepared)
            text, last = batch.message(
                [(placeholders(sql, self.param), params) for sql, params in statements])
            results = await _exchange(loop, conn.pgconn, text.encode(prepared.encoding))
            pq = self._psycopg.pq
            for result in results:
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    raise self._psycopg.errors.error_from_result(
                        result, encoding=prepared.encoding)
            batch.prepared()
            if len(results) <= last:
                raise self._psycopg.InterfaceError(
                    f"{len(results)} results for a message of {last + 1} statements or more")
            result = results[last]
            load = prepared.load
            load.set_pgresult(result)
            rows: list[tuple[Any, ...]] = load.load_rows(0, result.ntuples, tuple)
            healthy = conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            return rows
        except Exception as exc:
            raise self._mapped(exc, what) from exc
        finally:
            self._give(conn, healthy)

    def lock_schemas(self, tx: Tx) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))

    def healthy(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken

    def map_error(self, exc: Exception, what: str) -> BackendError | None:
        if isinstance(exc, BackendError):
            return exc
        psycopg = self._psycopg
        if not isinstance(exc, psycopg.Error):
            return None
        text = " ".join(str(exc).split())
        state = getattr(exc, "sqlstate", None) or ""
        where = f"{self.name} during {what}"
        errors = psycopg.errors
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected |
                      errors.LockNotAvailable | errors.QueryCanceled |
                      errors.AdminShutdown | errors.CannotConnectNow):
            return BackendUnavailableError(f"{where}: {text}")
        if state.startswith(_PERMANENT_STATES) or (
            isinstance(exc, psycopg.OperationalError) and not state
            and any(t in text for t in _PERMANENT_TEXT)
            and "Connection refused" not in text and "timeout" not in text
        ):
            return BackendPermanentError(f"{where}: {text}")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return BackendUnavailableError(f"{where}: {text}")
        return BackendPermanentError(f"{where}: {text}")
