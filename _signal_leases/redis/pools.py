"""The waiting clients of the library's Redis backends: a busy pool is latency, never an
error. :class:`WaitingConnectionPool` for a standalone Redis, :class:`WaitingRedisCluster` for
a Cluster. And :func:`quick_writes`: their connections send a command without a timer when the
write cannot wait, and pack it without redis-py's per-argument encoder."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

__all__ = ["DEFAULT_MAX_CONNECTIONS", "WaitingConnectionPool", "WaitingRedisCluster",
           "quick_writes"]

#: Connections in the pool of a client built from a URL (callers wait beyond that).
DEFAULT_MAX_CONNECTIONS = 32


class WaitingRedisCluster(redis.asyncio.RedisCluster):
    """A ``RedisCluster`` whose callers *wait* for a connection instead of failing.

    redis-py's per-node pools raise ``MaxConnectionsError`` as soon as a node has
    ``max_connections`` commands in flight; the standalone clients of this library wait
    instead (a busy pool is latency, never an error). This client lets at most
    ``command_slots`` commands run at once (the others wait their turn) and gives every node
    a pool twice that size, so single commands never exhaust a node and pipelines (which
    take one connection per node besides) have room too.
    """

    def __init__(self, *args: Any, command_slots: int = DEFAULT_MAX_CONNECTIONS,
                 **kwargs: Any) -> None:
        kwargs["max_connections"] = 2 * command_slots
        super().__init__(*args, **kwargs)
        self._command_slots = asyncio.Semaphore(command_slots)
        # The nodes' connections write as the standalone pool's do (see quick_writes):
        # RedisCluster takes no connection class, so it is set on what makes the connections.
        manager: Any = getattr(self, "nodes_manager", None)
        made = getattr(manager, "connection_kwargs", None)
        if isinstance(made, dict) and isinstance(made.get("connection_class"), type):
            made["connection_class"] = quick_writes(made["connection_class"])
            for node in getattr(manager, "startup_nodes", {}).values():
                node.connection_class = quick_writes(node.connection_class)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._command_slots:
            return await super().execute_command(*args, **kwargs)


class WaitingConnectionPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's ``BlockingConnectionPool`` (with ``max_connections`` in use, a caller waits
    up to ``timeout`` for one), with a fast path: while a connection is free, or one more may
    be opened, a command takes it as a plain ``ConnectionPool`` does (one lock), without the
    condition variable and the timer the waiting path sets up for every checkout (10-20 µs
    per command here, a tenth of a command's CPU); and a release notifies the condition only
    while somebody waits on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0  # callers in the waiting path

    def _waiters(self) -> bool:
        # (a method, not the attribute in place: release() reads it again after an await,
        # where it may have changed, which a type checker's narrowing would not allow)
        return self._waiting > 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.can_get_connection():
            try:
                return await _PLAIN.get_connection(self)
            except redis.exceptions.ConnectionError:
                if self.can_get_connection():
                    raise  # a failure to connect (taken and given back), not a full pool
        self._waiting += 1  # before the condition checks for a free connection
        try:
            waiting: Any = super()
            return await waiting.get_connection(*args, **kwargs)
        finally:
            self._waiting -= 1

    async def release(self, connection: AbstractConnection) -> None:
        if self._waiters():
            await super().release(connection)  # and notifies a waiter
            return
        await _PLAIN.release(self, connection)
        if self._waiters():  # one began to wait meanwhile (it had seen no free connection)
            async with self._condition:
                self._condition.notify()


_PLAIN: Any = redis.asyncio.ConnectionPool  # its methods, on a WaitingConnectionPool


class _QuickWrites:
    """A connection class's ``send_packed_command`` without a timer when the write cannot
    wait, and its ``pack_command`` without redis-py's encoder (see there). redis-py bounds
    every write with ``asyncio.wait_for(..., socket_timeout)``: on Python 3.11 that is a new
    task per command (12-15 µs here, 7 % of a pub/sub publish's CPU), on 3.12 a timer. A write
    can only wait in ``drain()``, when the transport holds more than its high-water mark; when
    its buffer is empty and the command is smaller than that mark, the command is handed to
    the transport directly. Anything else (not connected, a health check due, a transport
    with data queued, a large command) takes redis-py's own path, timeout included; a socket
    that fails under a quick write is seen by the read that follows (a ``ConnectionError``, as
    when the write fails)."""

    _reader: Any
    _writer: Any
    encoder: Any
    health_check_interval: float
    next_health_check: float
    disconnect: Any

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        writer = self._writer
        if writer is not None and self._reader is not None and not (
            check_health and self.health_check_interval
            and asyncio.get_running_loop().time() > self.next_health_check
        ):
            transport = writer.transport
            if not transport.is_closing() and transport.get_write_buffer_size() == 0:
                if isinstance(command, str):
                    command = command.encode()
                chunks = [command] if isinstance(command, bytes) else command
                if sum(map(len, chunks)) < transport.get_write_buffer_limits()[1]:
                    try:
                        writer.writelines(chunks)
                    except BaseException as exc:  # (a transport closed under it: gh-136234)
                        await self.disconnect(nowait=True)
                        raise redis.exceptions.ConnectionError(
                            f"Error while writing to socket: {exc!r}") from exc
                    return
                command = chunks
        slow: Any = super()
        await slow.send_packed_command(command, check_health)

    def pack_command(self, *args: Any) -> list[bytes]:
        """The command packed without redis-py's per-argument encoder (a script call of ours
        has about 50 arguments, and the encoder's type checks cost more than the packing).
        Only ``str``, ``bytes``, ``int`` and ``float`` (exactly those types) are packed here:
        by hiredis when it is installed and every ``int`` fits in 64 bits (hiredis crashes
        the process on an ``int`` past Python's digit limit, and reads a non-contiguous
        ``memoryview`` wrongly, which redis-py keeps from it), otherwise by :func:`_pack`.
        Taken only for a one-word command name (redis-py splits ``"CONFIG GET"``) and a
        UTF-8 strict encoder; any other argument goes through redis-py's path, which
        converts it or raises its ``DataError``."""
        name, encoder = args[0], self.encoder
        if (type(name) is str and name.isalnum() and encoder.encoding in _UTF8
                and encoder.encoding_errors == "strict"):
            if _hiredis_pack is not None and _plain(args):
                return [_hiredis_pack(args)]
            packed = _pack(args)
            if packed is not None:
                return [packed]
        slow: Any = super()
        result: list[bytes] = slow.pack_command(*args)
        return result


_INT64 = 1 << 64


def _plain(args: tuple[Any, ...]) -> bool:
    """Every argument a ``str``, ``bytes``, ``float``, or an ``int`` within 64 bits."""
    for arg in args:
        kind = type(arg)
        if not (kind is str or kind is bytes or kind is float
                or (kind is int and -_INT64 < arg < _INT64)):
            return False
    return True


def _pack(args: tuple[Any, ...]) -> bytes | None:
    """``args`` as one RESP command, or ``None`` for an argument that is not ``str``,
    ``bytes``, ``int`` or ``float`` (exactly: a ``bool`` or a subclass is left to redis-py).
    An ``int`` past Python's digit limit raises ``ValueError``, as in redis-py."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is int:
            arg = b"%d" % arg
        elif kind is float:
            arg = repr(arg).encode()
        elif kind is not bytes:
            return None
        out += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(out)


_UTF8 = ("utf-8", "utf8", "UTF-8")
#: hiredis's packer, if redis-py imported hiredis (it does at import when it is installed; no
#: second import attempt here) and it has one (2.1 and later). Tests set it to ``None`` to take
#: the Python packer.
_hiredis_pack: Any = getattr(sys.modules.get("hiredis"), "pack_command", None)


_QUICK: dict[type, type] = {}


def quick_writes(connection_class: type) -> type:
    """``connection_class`` (a redis-py asyncio connection class: TCP, TLS, Unix socket) with
    the quick writes of :class:`_QuickWrites`; one subclass per class."""
    if issubclass(connection_class, _QuickWrites):
        return connection_class
    quick = _QUICK.get(connection_class)
    if quick is None:
        quick = _QUICK[connection_class] = type(
            f"Quick{connection_class.__name__}", (_QuickWrites, connection_class), {}
        )
    return quick
