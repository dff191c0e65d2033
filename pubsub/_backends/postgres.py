"""``PostgresPubSub``: the pub/sub, the lease provider and (for the signal runtime) the durable
core, in one PostgreSQL database shared by processes on any number of hosts.

The parts are the backend kit's (``pubsub._backends.sql``, ``leases.SQLLeaseProvider``,
``signals.kit.SQLCore``); what is Postgres's own is the database
(``_signal_leases.sql.postgres``) and the doorbell: a publishing transaction sends ``NOTIFY``
on one channel per schema with the topic (an id, never the event: ``NOTIFY`` payloads are
limited to 8,000 bytes), delivered when it commits; each process that subscribes ``LISTEN``s
on one connection of its own, in a worker thread, and wakes its reader for that topic (a
process that only publishes, such as a sender, opens no listening connection and hears no
notification). After a
(re)connection the process looks at every topic (a notification sent while it was away is
not lost: the events are rows). The reader also polls every ``poll_ms``.

``LISTEN`` needs a session of its own: through a transaction-pooling proxy (PgBouncer with
``pool_mode = transaction``) it silently stops working, and ``search_path`` set at connect is
lost. Point ``dsn`` at Postgres itself or at a session-pooling proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from _signal_leases.aio import fail_future, owned_task_group, running_asyncio_loop
from _signal_leases.logs import get_logger
from _signal_leases.sql import Tx
from _signal_leases.sql.postgres import NOTIFY_MAX_BYTES, PostgresDatabase
from leases import SQLLeaseProvider
from pubsub._backends.sql.pubsub import SQLPubSub
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS

__all__ = ["PostgresPubSub"]

logger = get_logger("pubsub")


class _Gone(Exception):
    """The reading end of the listener's socket pair is closed."""


class _Handover:
    """The writing end of the socket pair: the listener thread claims it and closes it when
    done; if the thread never started, the pub/sub closes it on the way out."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()

    def claim(self) -> socket.socket | None:
        with self._lock:
            sock, self._sock = self._sock, None
            return sock

    def close_if_unclaimed(self) -> None:
        sock = self.claim()
        if sock is not None:
            sock.close()


class _Topics:
    """The topics the listener writes to its socket (each ended by a NUL), woken in turn."""

    def __init__(self, sock: socket.socket, wake: Callable[[str | None], None]) -> None:
        self._sock, self._wake, self._pending = sock, wake, b""

    def read(self) -> bool:
        """Wake the topics that arrived; ``False`` when the listener is gone."""
        try:
            data = self._sock.recv(65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        *topics, self._pending = (self._pending + data).split(b"\0")
        for topic in topics:
            self._wake(topic.decode() or None)
        return True


class _NotifyDoorbell:
    """NOTIFY in the publishing transaction, LISTEN on one connection per process."""

    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database
        self.channel = f"signal_leases.{database.schema}"
        self._limiter = anyio.CapacityLimiter(1)  # the listener's thread, not the pool's
        #: The topics this process reads (set by the pub/sub; called in the listener's
        #: thread): a ring for another topic is dropped there, waking nothing.
        self.wanted: Callable[[str], bool] | None = None

    def ring_in(self, tx: Tx, topics: Collection[str]) -> None:
        for topic in topics:
            payload = topic if len(topic.encode()) <= NOTIFY_MAX_BYTES else ""  # "": every topic
            tx.write("SELECT pg_notify(?, ?)", (self.channel, payload))  # nothing waits

    async def ring(self, topics: Collection[str]) -> None:
        """Nothing: :meth:`ring_in` rang in the transaction."""

    @asynccontextmanager
    async def serve(self, wake: Callable[[str | None], None]) -> AsyncIterator[None]:
        """LISTEN in a worker thread that never calls into the event loop (a call into a loop
        that is closing would block the thread, and the interpreter's exit, for ever): it
        writes each topic to a socket pair that this task reads."""
        stop = threading.Event()
        ours, theirs = socket.socketpair()  # the thread, once started, closes ``theirs``
        ours.setblocking(False)
        theirs.settimeout(1.0)
        handed = _Handover(theirs)
        try:
            async with owned_task_group() as tg:
                tg.start_soon(partial(anyio.to_thread.run_sync, self._listen, handed, stop,
                                      abandon_on_cancel=True, limiter=self._limiter),
                              name="postgres listener")
                tg.start_soon(self._wake_on_topics, ours, wake, name="postgres notices")
                try:
                    yield
                finally:
                    stop.set()
        finally:
            ours.close()
            handed.close_if_unclaimed()

    @staticmethod
    async def _wake_on_topics(ours: socket.socket, wake: Callable[[str | None], None]) -> None:
        topics = _Topics(ours, wake)
        loop = running_asyncio_loop()
        if loop is not None:
            # asyncio: one reader for the socket's life, not an epoll registration per wake-up
            fd = ours.fileno()
            gone: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                try:
                    alive = topics.read()
                except BaseException as exc:  # raised in this task, as under trio
                    loop.remove_reader(fd)
                    fail_future(gone, exc)
                    return
                if not alive:
                    loop.remove_reader(fd)
                    if not gone.done():
                        gone.set_result(None)

            try:
                loop.add_reader(fd, readable)
            except NotImplementedError:  # (Windows' proactor loop) anyio's way, below
                pass
            else:
                try:
                    await gone
                finally:
                    loop.remove_reader(fd)
                return
        while True:
            await anyio.wait_readable(ours)
            if not topics.read():
                return  # the listener is gone

    def _listen(self, handed: _Handover, stop: threading.Event) -> None:
        """Keep one LISTEN connection until ``stop``; an empty topic means "look at every
        topic" (after each (re)connection, and after topics were lost to a full socket)."""
        theirs = handed.claim()
        if theirs is None:
            return
        delay, missed = 0.1, False

        wanted = self.wanted

        def tell(topic: str) -> None:
            nonlocal missed
            if topic and wanted is not None and not missed and not wanted(topic):
                return  # another process's topic
            try:
                theirs.sendall((("" if missed else topic) + "\0").encode())
                missed = False
            except TimeoutError:
                missed = True  # the reader is far behind: it looks at everything later
            except OSError as exc:
                raise _Gone from exc  # our socket pair is closed: the pub/sub left

        try:
            while not stop.is_set():
                conn: Any = None
                try:
                    conn = self._db.connect()
                    conn.execute(f'LISTEN "{self.channel}"')
                    tell("")  # (re)connected: look at every topic
                    delay = 0.1
                    while not stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            tell(note.payload)
                            if stop.is_set():
                                break
                except _Gone:
                    return
                except Exception as exc:  # lost or refused: try again
                    if stop.is_set():
                        return  # leaving anyway
                    mapped = self._db.map_error(exc, "LISTEN") or exc
                    logger.warning("pubsub.listen_failed", error=repr(mapped), retry_in_s=delay)
                    stop.wait(delay)
                    delay = min(5.0, delay * 2)
                finally:
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.close()
        finally:
            theirs.close()


class PostgresPubSub(SQLPubSub):
    """A :class:`~pubsub.PubSub` in a PostgreSQL database, and its own lease provider; the
    signal runtime keeps its durable core in the same database. Any number of processes on
    any number of hosts share it.

    ``dsn``: a libpq connection string or URL (``postgresql://user:password@host:5432/db``).
    ``schema`` (``signal_leases``): where the tables live, created when missing.
    ``max_connections`` (4): this process's pool, opened on demand; the listener holds one
    more. ``timeout_s`` (10): bounds connecting, every statement and an unanswered connection.
    ``poll_ms`` (1 s): the reader's safety poll. The rest as
    :class:`~pubsub._backends.sql.pubsub.SQLPubSub`. A wrong password or an unknown database
    raises ``BackendPermanentError``, an unreachable server ``BackendUnavailableError``, from
    ``async with``. Needs the ``postgres`` extra (psycopg 3).
    """

    def __init__(
        self, dsn: str, *, schema: str = "signal_leases", max_connections: int = 4,
        timeout_s: float = 10.0, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        poll_ms: int = 1000, retention_ms: int = 7 * 86_400_000, visibility_ms: int = 30_000,
    ) -> None:
        database = PostgresDatabase(dsn, schema=schema, max_connections=max_connections,
                                    timeout_s=timeout_s)
        super().__init__(database, SQLLeaseProvider(database), _NotifyDoorbell(database),
                         max_delivery_attempts=max_delivery_attempts, poll_ms=poll_ms,
                         retention_ms=retention_ms, visibility_ms=visibility_ms)

    database: PostgresDatabase

    @asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[None]:
        try:
            async with super()._lifespan():
                yield
        finally:
            await self.database.aclose()
