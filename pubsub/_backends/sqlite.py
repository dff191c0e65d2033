"""``SQLitePubSub``: the pub/sub, the lease provider and (for the signal runtime) the durable
core, in one SQLite file shared by the processes of one host; no server.

The parts are the backend kit's (``pubsub._backends.sql``, ``leases.SQLLeaseProvider``,
``signals.kit.SQLCore``); what is SQLite's own is the database (``_signal_leases.sql.sqlite``)
and the doorbell: each process that subscribes binds a Unix datagram socket in a directory
next to the file's name (under the system's temporary directory) and registers its address in
the file (``ps_listeners``); a publish sends one datagram with the topic to every registered
process (a process that only publishes registers nothing).
A process that died leaves an address nobody answers: it is forgotten at the first failed
send, and addresses not refreshed for a minute are ignored. Where Unix sockets are missing,
only the reader's poll (``poll_ms``) wakes the other processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager

import anyio

import pubsub._backends.sql.tables as ps
from _signal_leases.aio import owned_task_group
from _signal_leases.sql.sqlite import SQLiteDatabase
from leases import SQLiteLeaseProvider
from pubsub._backends.sql.pubsub import SQLPubSub
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS

__all__ = ["SQLitePubSub"]

_STALE_MS = 60_000
_REFRESH_S = 10.0


class _UnixDoorbell:
    """One datagram socket per process (see the module docstring)."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database
        digest = hashlib.sha1(database.path.encode()).hexdigest()[:16]
        self._dir = os.path.join(tempfile.gettempdir(), f"signal-leases-{digest}")
        self._id = uuid.uuid4().hex[:16]
        self._path = os.path.join(self._dir, f"{self._id}.sock")
        self._peers: list[tuple[str, str]] = []
        self._peers_at = 0.0
        self._out: socket.socket | None = None

    async def ring(self, topics: Collection[str]) -> None:
        if not hasattr(socket, "AF_UNIX"):
            return  # no doorbell here: the poll does the work
        if self._out is None:  # (whether this process listens or not: see serve)
            self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._out.setblocking(False)
        if time.monotonic() - self._peers_at > 1.0:
            self._peers_at = time.monotonic()
            self._peers = await self._db.run(lambda tx: ps.listeners(tx, _STALE_MS),
                                             write=False, what="listener list")
        gone: list[str] = []
        for topic in topics:
            message = topic.encode("utf-8", "replace")[:4096]
            for peer_id, address in list(self._peers):
                if peer_id == self._id:
                    continue
                try:
                    self._out.sendto(message, address)
                except BlockingIOError:
                    pass  # its buffer is full: its poll reads the event anyway
                except OSError as exc:  # gone: forget it
                    self._peers.remove((peer_id, address))
                    gone.append(peer_id)
                    if isinstance(exc, ConnectionRefusedError):  # nobody bound: a dead socket
                        with contextlib.suppress(OSError):
                            os.unlink(address)
        if gone:
            with contextlib.suppress(Exception):
                await self._db.run(lambda tx: tx.many("DELETE FROM ps_listeners WHERE id = ?",
                                                      [(i,) for i in gone]), what="listener")

    async def _register(self) -> None:
        await self._db.run(lambda tx: tx.execute(
            "INSERT INTO ps_listeners (id, address, seen_ms) VALUES (?, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET seen_ms = excluded.seen_ms", (self._id, self._path, tx.now_ms)),
            what="listener registration")

    @asynccontextmanager
    async def serve(self, wake: Callable[[str | None], None]) -> AsyncIterator[None]:
        if not hasattr(socket, "AF_UNIX"):
            yield  # no doorbell here: the poll does the work
            return
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        try:
            async with await anyio.create_unix_datagram_socket(local_path=self._path) as sock, \
                    owned_task_group() as tg:
                await self._register()

                async def receive() -> None:
                    async for data, _ in sock:
                        wake(data.decode("utf-8", "replace") or None)

                async def refresh() -> None:
                    while True:
                        await anyio.sleep(_REFRESH_S)
                        with contextlib.suppress(Exception):
                            await self._register()

                tg.start_soon(receive)
                tg.start_soon(refresh)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._db.run(lambda tx: tx.execute(
                    "DELETE FROM ps_listeners WHERE id = ?", (self._id,)), what="listener")
            with contextlib.suppress(OSError):
                os.unlink(self._path)

    def close(self) -> None:
        """Close the socket :meth:`ring` sends from (the pub/sub is leaving)."""
        out, self._out = self._out, None
        if out is not None:
            out.close()


class SQLitePubSub(SQLPubSub):
    """A :class:`~pubsub.PubSub` in a SQLite file, and its own lease provider; the signal
    runtime keeps its durable core in the same file. Any number of processes of **one host**
    share the file (never over a network file system).

    ``path``: the database file (created when missing); a missing directory, a read-only place
    or a file that is not a SQLite database raises ``BackendPermanentError`` naming the path.
    ``poll_ms`` (1 s): the reader's safety poll; ``busy_timeout_ms`` (10 s): how long a write
    waits for the write lock before ``BackendUnavailableError``; ``max_connections`` (4). The
    rest as :class:`~pubsub._backends.sql.pubsub.SQLPubSub`. Use as ``async with
    SQLitePubSub(path)``; the file stays open until :meth:`aclose` (or the end of the
    ``async with`` block of the pub/sub).
    """

    def __init__(
        self, path: str | os.PathLike[str], *,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS, poll_ms: int = 1000,
        retention_ms: int = 7 * 86_400_000, visibility_ms: int = 30_000,
        busy_timeout_ms: int = 10_000, max_connections: int = 4,
    ) -> None:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise TypeError(f"path must be a file path, got {path!r}")
        database = SQLiteDatabase(path, busy_timeout_ms=busy_timeout_ms,
                                  max_connections=max_connections)
        self._bell = _UnixDoorbell(database)
        super().__init__(database, SQLiteLeaseProvider(database=database), self._bell,
                         max_delivery_attempts=max_delivery_attempts, poll_ms=poll_ms,
                         retention_ms=retention_ms, visibility_ms=visibility_ms)
        self.path = database.path

    database: SQLiteDatabase

    @asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[None]:
        self.database.check_path()  # a clear error naming the path, before anything else
        try:
            async with super()._lifespan():
                yield
        finally:
            self._bell.close()
            await self.database.aclose()
