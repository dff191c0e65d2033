"""SQL plumbing for every layer: a database reached through blocking DB-API connections.

Every operation of a SQL backend is one short function over a :class:`Tx` (a transaction),
run whole in a worker thread (on asyncio one of at most ``max_connections`` threads of the
database's own, on trio :func:`anyio.to_thread.run_sync`; see
:class:`~_signal_leases.sql.threads.WorkerThreads`) on a connection of a small pool: the
event loop never blocks, a transaction never spans an ``await``, and the same code runs on
asyncio and trio. A worker-thread call is not abandoned when its caller is cancelled: a
transaction that started always commits or rolls back whole.

The backends (:mod:`_signal_leases.sql.sqlite`, :mod:`_signal_leases.sql.postgres`) give the
connection, the dialect (placeholders, the database's clock) and the mapping of the driver's
errors onto :class:`~_signal_leases.errors.BackendUnavailableError` (retry later) and
:class:`~_signal_leases.errors.BackendPermanentError` (fix the configuration).

Schemas are versioned per component (``leases``, ``pubsub``, ``signals``) in one table,
``schema_versions``; :meth:`Database.ensure_schema` creates a component's tables inside a
transaction on first use and refuses a database written by another version, naming both.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import anyio

from _signal_leases.errors import BackendError, BackendPermanentError, ClosedError
from _signal_leases.sql.threads import WorkerThreads

__all__ = ["Batch", "Database", "Tx", "placeholders"]

T = TypeVar("T")


class Batch(Protocol):
    """Statements of one transaction sent together (see :meth:`Database.batch`): writes wait
    in the batch and go out with the next read, or with COMMIT."""

    def write(self, sql: str, params: Sequence[Any]) -> None:
        """Queue a statement whose result nobody reads."""

    def run(self, queries: Sequence[tuple[str, Sequence[Any]]], *, commit: bool = False
            ) -> list[tuple[list[tuple[Any, ...]], int]]:
        """Send what is queued and ``queries``; each query's rows and row count. ``commit``:
        COMMIT goes out in the same message, after them (the transaction ends there)."""

    def clock(self) -> tuple[int, float]:
        """The transaction's clock, as :meth:`Database.begin` returns it (read with the
        first :meth:`run`, or alone when asked first)."""

    def commit(self) -> None:
        """Send what is queued and COMMIT (nothing at all when nothing was sent)."""


@functools.lru_cache(maxsize=1024)
def placeholders(sql: str, param: str) -> str:
    """``sql`` with its ``?`` placeholders written as ``param`` (the driver's style), once per
    statement text (the last 1,024 texts; most are the library's constants): the longest, a
    routed signal's (3.6 KB), took 3.7 µs to rewrite on every call."""
    return sql if param == "?" else sql.replace("?", param)


class Tx:
    """One transaction on one connection (used inside a worker thread only).

    SQL is written with ``?`` placeholders; the database's dialect rewrites them. ``now_ms``
    is the database's clock for this transaction, in milliseconds: every lease and due-time
    comparison of one operation uses this one value.
    """

    __slots__ = ("_batch", "_clock", "_cursor", "_now", "_param", "dialect")

    def __init__(self, cursor: Any, param: str, dialect: str,
                 clock: tuple[int, float] | Callable[[], tuple[int, float]],
                 batch: Batch | None = None) -> None:
        self._cursor = cursor
        self._param = param
        self._batch = batch  # (Postgres) statements sent together: see Database.batch
        self.dialect = dialect  # "sqlite" or "postgres": for the few statements that differ
        # (ms, Unix time), or what reads it when first asked (its answer may come with the
        # transaction's first reads: see Database.batch)
        self._now = clock if isinstance(clock, tuple) else None
        self._clock = None if isinstance(clock, tuple) else clock

    def _read_clock(self) -> tuple[int, float]:
        if self._now is None:
            assert self._clock is not None
            self._now = self._clock()
        return self._now

    @property
    def now_ms(self) -> int:
        """The database's clock for this transaction, in ms."""
        return (self._now or self._read_clock())[0]

    @property
    def wall(self) -> float:
        """Unix time of this transaction in seconds (receipts, due times, output parts)."""
        return (self._now or self._read_clock())[1]

    @property
    def pipelined(self) -> bool:
        """Whether writes go out without waiting (and :meth:`read_many` is one round trip)."""
        return self._batch is not None

    def _sql(self, sql: str) -> str:
        return placeholders(sql, self._param)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns the number of rows it changed."""
        if self._batch is not None:
            return self._batch.run([(self._sql(sql), params)])[0][1]
        self._cursor.execute(self._sql(sql), tuple(params))
        return int(self._cursor.rowcount)

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement whose result nobody reads. With a batch it waits there and goes
        out with the next read or the commit: it runs before any later statement of the
        transaction, and an error in it fails the transaction at that read or the commit."""
        if self._batch is not None:
            self._batch.write(self._sql(sql), params)
            return
        self._cursor.execute(self._sql(sql), tuple(params))

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for each row of parameters (without waiting, as :meth:`write`)."""
        if self._batch is not None:
            text = self._sql(sql)
            for r in rows:
                self._batch.write(text, r)
            return
        self._cursor.executemany(self._sql(sql), [tuple(r) for r in rows])

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row of a query, or ``None``."""
        if self._batch is not None:
            rows = self.all(sql, params)
            return rows[0] if rows else None
        self._cursor.execute(self._sql(sql), tuple(params))
        row = self._cursor.fetchone()
        return tuple(row) if row is not None else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of a query."""
        if self._batch is not None:
            return self._batch.run([(self._sql(sql), params)])[0][0]
        self._cursor.execute(self._sql(sql), tuple(params))
        return [tuple(r) for r in self._cursor.fetchall()]

    def read_many(self, queries: Sequence[tuple[str, Sequence[Any]]]
                  ) -> list[list[tuple[Any, ...]]]:
        """Every row of each query, in order. With a batch they all go out together: one
        round trip for all of them."""
        if self._batch is None:
            return [self.all(sql, params) for sql, params in queries]
        return [rows for rows, _ in self._batch.run(
            [(self._sql(sql), params) for sql, params in queries])]

    def last(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of the transaction's last statement. With a batch it goes out with what
        is queued and COMMIT, as one message: a call that is one statement is one round
        trip. No statement may follow it."""
        if self._batch is None:
            return self.all(sql, params)
        return self._batch.run([(self._sql(sql), params)], commit=True)[0][0]

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row (``None`` when there is no row)."""
        row = self.one(sql, params)
        return row[0] if row is not None else None


class Database(ABC):
    """A SQL database shared by the parts of one backend (leases, pub/sub, signal core).

    ``await db.run(fn)`` calls ``fn(tx)`` in a worker thread inside one transaction and
    returns its result; ``write=True`` takes the write lock up front (SQLite ``BEGIN
    IMMEDIATE``). At most ``max_connections`` connections are open at once, and so at most
    that many operations run at a time; the others wait for a connection.

    A database for another DB-API driver is a subclass with :attr:`name` and three hooks,
    each called in a worker thread: :meth:`connect` (a new connection), :meth:`begin` (start
    a transaction on a cursor; return the clock every lease comparison of that transaction
    uses, and Unix time) and :meth:`map_error` (the driver's errors onto
    ``BackendUnavailableError`` / ``BackendPermanentError``); optionally :meth:`healthy`,
    :meth:`batch` (statements sent together) and the class attributes :attr:`param` and
    :attr:`dialect`.
    """

    #: Placeholder of the driver (``?`` for sqlite3, ``%s`` for psycopg).
    param = "?"
    #: ``"sqlite"`` or ``"postgres"`` (see :attr:`Tx.dialect`).
    dialect = "sqlite"

    def __init__(self, *, max_connections: int) -> None:
        self.max_connections = max_connections
        self._idle: list[Any] = []
        self._open = 0
        self._lock = threading.Lock()
        self._schemas: dict[str, int] = {}
        self._schema_lock = anyio.Lock()
        self._closed = False
        self._workers = WorkerThreads(max_connections, name="signal-leases sql")

    @property
    @abstractmethod
    def name(self) -> str:
        """What to call this database in messages (a path, a DSN without its password)."""

    # -- the driver -------------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> Any:
        """A new connection (in a worker thread)."""

    @abstractmethod
    def begin(self, cursor: Any, write: bool) -> tuple[int, float]:
        """Start a transaction (``write``: take the write lock now, where the database has
        one); return the clock (ms) that lease expiries of this transaction are compared
        with, and Unix time (s). The clock must be one that every process using the
        database shares and that never goes back (the server's clock, or one host's)."""

    @abstractmethod
    def map_error(self, exc: Exception, what: str) -> BackendError | None:
        """The library's error for a driver error, or ``None`` to let it through."""

    def healthy(self, conn: Any) -> bool:
        """Whether a connection that raised may go back to the pool."""
        return True

    #: Run read-only calls without a transaction, each statement on its own: no BEGIN or
    #: COMMIT to wait for (where a transaction gives a call's reads no common snapshot anyway,
    #: as under Postgres's READ COMMITTED). Then :meth:`read_clock` gives the clock.
    reads_autocommit = False

    def read_clock(self, cursor: Any) -> tuple[int, float]:
        """The clock (as :meth:`begin` returns it) outside a transaction."""
        raise NotImplementedError

    def batch(self, conn: Any, write: bool) -> Batch | None:
        """A :class:`Batch` for one transaction on ``conn`` (``None``, the default: each
        statement goes out on its own, after :meth:`begin`). A batch begins the transaction
        itself, with the first statements it sends."""
        return None

    def lock_schemas(self, tx: Tx) -> None:  # noqa: B027 (a hook: most databases need none)
        """Make schema creations of concurrent processes wait for each other (a database
        whose write transactions are not already serial: Postgres takes a lock here)."""

    # -- running ----------------------------------------------------------------------------

    async def run(self, fn: Callable[[Tx], T], *, write: bool = True, what: str = "a call"
                  ) -> T:
        """``fn(tx)`` in one transaction, in a worker thread (see the class docstring)."""
        if self._closed:
            raise ClosedError(f"the database {self.name} is closed")
        return await self._workers.run(self._call, fn, write, what)

    async def run_statements(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                             write: bool = True, what: str = "a call"
                             ) -> list[tuple[Any, ...]]:
        """``statements`` (SQL with ``?`` placeholders, and their parameters) in one
        transaction (``write``; for a read, one statement alone): the rows of the last one.
        As :meth:`run` (a worker thread) unless the database has a shorter way: Postgres on
        asyncio sends them as one message from the event loop's own thread."""
        *writes, (last, params) = statements

        def call(tx: Tx) -> list[tuple[Any, ...]]:
            for sql, values in writes:
                tx.write(sql, values)
            return tx.last(last, params) if write else tx.all(last, params)

        return await self.run(call, write=write, what=what)

    def run_sync(self, fn: Callable[[Tx], T], *, write: bool = True, what: str = "a call") -> T:
        """The same as :meth:`run`, from a worker thread the caller already runs in."""
        return self._call(fn, write, what)

    def _call(self, fn: Callable[[Tx], T], write: bool, what: str) -> T:
        try:
            conn = self._take()
        except Exception as exc:
            raise self._mapped(exc, what) from exc
        healthy = True
        try:
            cursor = conn.cursor()
            try:
                if not write and self.reads_autocommit:
                    return fn(Tx(cursor, self.param, self.dialect,
                                 lambda: self.read_clock(cursor)))
                batch = self.batch(conn, write)
                if batch is None:
                    result = fn(Tx(cursor, self.param, self.dialect, self.begin(cursor, write)))
                    conn.commit()
                    return result
                # BEGIN and the clock go out with the first reads, the last writes with COMMIT.
                result = fn(Tx(cursor, self.param, self.dialect, batch.clock, batch))
                batch.commit()
                return result
            except BaseException:
                try:
                    conn.rollback()
                except Exception:
                    healthy = False
                raise
            finally:
                cursor.close()
        except Exception as exc:
            healthy = healthy and self.healthy(conn)
            mapped = self.map_error(exc, what)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            self._give(conn, healthy)

    def _mapped(self, exc: Exception, what: str) -> Exception:
        mapped = self.map_error(exc, what)
        return mapped if mapped is not None else exc

    def _take(self, connect: bool = True) -> Any:
        """An idle connection, else a new one (``None`` instead when not ``connect``)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if not connect:
                return None
            self._open += 1
        try:
            return self.connect()
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def _give(self, conn: Any, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(conn)
                return
            self._open -= 1
        _close_quietly(conn)

    @property
    def connections(self) -> int:
        """Connections open right now (idle and busy)."""
        return self._open

    async def aclose(self) -> None:
        """Close every connection (idempotent); later calls raise :class:`ClosedError`."""
        self._closed = True
        self._workers.close()
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            _close_quietly(conn)

    # -- schemas ----------------------------------------------------------------------------

    async def ensure_schema(self, component: str, version: int, ddl: Sequence[str]) -> None:
        """Create ``component``'s tables (``ddl``) in one transaction on first use; refuse a
        database whose tables a different version of ``component`` wrote."""
        if self._schemas.get(component) == version:
            return
        async with self._schema_lock:  # one creation per process; the others wait for it
            if self._schemas.get(component) != version:
                await self._create(component, version, ddl)

    async def _create(self, component: str, version: int, ddl: Sequence[str]) -> None:
        def create(tx: Tx) -> None:
            self.lock_schemas(tx)
            tx.execute("CREATE TABLE IF NOT EXISTS schema_versions "
                       "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)")
            found = tx.value("SELECT version FROM schema_versions WHERE component = ?",
                             (component,))
            if found is None:
                for statement in ddl:
                    tx.execute(statement)
                tx.execute("INSERT INTO schema_versions (component, version) VALUES (?, ?)",
                           (component, version))
            elif int(found) != version:
                raise BackendPermanentError(
                    f"the database {self.name} holds {component} tables of schema version "
                    f"{found}; this version of signal-leases needs schema version {version} "
                    f"(use another database, or migrate it)"
                )

        await self.run(create, what=f"the {component} schema")
        self._schemas[component] = version


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection: nothing left to do
        conn.close()
