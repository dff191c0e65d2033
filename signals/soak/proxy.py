"""A loopback TCP proxy whose routes can be black-holed: the soak's network faults.

Each worker slot gets a :class:`Route` (a port on 127.0.0.1 in front of the Redis server);
the worker's pub/sub connects there. :meth:`Route.hold` black-holes the route: connections
are still accepted, but nothing is forwarded in either direction, and new connections are
not connected upstream, until :meth:`Route.resume`. Bytes sent meanwhile stay in the socket
buffers and are delivered at the resume, as TCP delivers its retransmissions once a
partition heals: a command a client gave up on (its socket timed out) may still run on the
server afterwards. A connection closed by either end is closed on the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute, SocketListener

if TYPE_CHECKING:
    from anyio.abc import SocketStream, TaskStatus

__all__ = ["Route"]

_CHUNK = 65536
_CLOSED = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class Route:
    """One listening port forwarding to ``upstream`` (see the module)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.held = False
        self.connections = 0
        self._resumed = anyio.Event()
        self._resumed.set()

    def hold(self) -> None:
        """Black-hole the route until :meth:`resume`."""
        if not self.held:
            self.held = True
            self._resumed = anyio.Event()

    def resume(self) -> None:
        """Forward again (what was held back first)."""
        self.held = False
        self._resumed.set()

    async def _gate(self) -> None:
        while self.held:
            await self._resumed.wait()

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen on a free loopback port (reported through ``task_status``) until cancelled."""
        multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        listener = multi.listeners[0]
        assert isinstance(listener, SocketListener)
        self.port = int(listener.extra(SocketAttribute.local_port))
        async with multi, anyio.create_task_group() as tg:
            task_status.started(self.port)
            while True:
                client = await listener.accept()
                self.connections += 1
                tg.start_soon(self._handle, client)

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            try:
                await self._gate()
                upstream = await anyio.connect_tcp(*self.upstream)
            except OSError:
                return  # the server is down (a restart): the client sees its connection close
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, upstream, tg.cancel_scope)
                tg.start_soon(self._pump, upstream, client, tg.cancel_scope)

    async def _pump(
        self, source: SocketStream, sink: SocketStream, scope: anyio.CancelScope
    ) -> None:
        try:
            while True:
                await self._gate()
                data = await source.receive(_CHUNK)
                await self._gate()
                await sink.send(data)
        except _CLOSED:
            pass
        finally:
            scope.cancel()  # one side closed: close both
