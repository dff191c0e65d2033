"""The Server-Sent Events response of :mod:`signals.http` (``GET /threads/{key}/stream``).

One event per :class:`~signals.StreamPart`::

    id: <cursor>
    event: <kind>
    data: <the part as JSON, one line>

plus a ``: keep-alive`` comment every ``heartbeat`` seconds, and a ``stream.error`` event
(``data: {"error": code, "message": ...}``, no ``id``) when the stream fails after it started.

Each response pulls from its own ``runtime.stream`` iterator, at the pace its client reads:
the store keeps the parts, so nothing is buffered per client and a slow client only delays
itself. Three tasks share one task group: the pump (iterator to socket), the heartbeat, and a
watcher of ``receive()``; a disconnect cancels the group, which drops the iterator. A
:class:`StreamRegistry` ends every open stream of an app at once, for a server shutting down.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress

import anyio
from starlette.types import Receive, Scope, Send

from signals._model import StreamPart
from signals.http._common import classify, part_json

__all__ = ["EventStream", "StreamRegistry", "format_error", "format_part"]

#: Milliseconds a browser's EventSource waits before it reconnects (sent once, first).
RETRY_MS = 2000

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
]


def _event_name(kind: str) -> str:
    """The ``event:`` field for ``kind`` (a kind that would break the framing is ``part``)."""
    return kind if kind and not any(c in kind for c in "\r\n\0") else "part"


def format_part(part: StreamPart) -> str:
    """One SSE event for ``part``."""
    data = json.dumps(part_json(part), separators=(",", ":"))  # one line: JSON escapes newlines
    return f"id: {part.cursor}\nevent: {_event_name(part.kind)}\ndata: {data}\n\n"


def format_error(code: str, message: str) -> str:
    """The ``stream.error`` event (named so, because ``error`` is EventSource's own event)."""
    data = json.dumps({"error": code, "message": message}, separators=(",", ":"))
    return f"event: stream.error\ndata: {data}\n\n"


class StreamRegistry:
    """The open event streams of one app, so that a server shutting down can end them."""

    def __init__(self) -> None:
        self.closing = False
        self._open: set[anyio.CancelScope] = set()

    def close(self) -> None:
        """End every open stream now (each completes its response normally) and refuse new
        ones; clients reconnect and resume from their ``Last-Event-ID``."""
        self.closing = True
        for scope in self._open:
            scope.cancel()

    @contextmanager
    def track(self, scope: anyio.CancelScope) -> Iterator[None]:
        self._open.add(scope)
        try:
            if self.closing:
                scope.cancel()
            yield
        finally:
            self._open.discard(scope)


class EventStream:
    """An ASGI response streaming ``parts`` as Server-Sent Events (see the module docstring)."""

    def __init__(
        self, parts: AsyncIterator[StreamPart], *, heartbeat: float, registry: StreamRegistry
    ) -> None:
        self._parts = parts
        self._heartbeat = heartbeat
        self._registry = registry
        self.headers: dict[str, str] = {}  # extra response headers (a traceparent), as Starlette's

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                 for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS + extra})
        lock = anyio.Lock()  # the pump and the heartbeat never interleave their writes
        gone = False

        # ``stop`` ends the stream: a disconnect, the end of the parts, or the registry.
        with anyio.CancelScope() as stop, self._registry.track(stop):

            async def write(text: str) -> None:
                nonlocal gone
                async with lock:
                    try:
                        await send({"type": "http.response.body", "body": text.encode(),
                                    "more_body": True})
                    except OSError:  # ASGI 2.4 servers raise on a closed connection
                        gone = True
                        stop.cancel()

            async def watch() -> None:
                nonlocal gone
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone = True
                stop.cancel()

            async def beat() -> None:
                while True:
                    await anyio.sleep(self._heartbeat)
                    await write(": keep-alive\n\n")

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, name="sse disconnect watcher")
                tg.start_soon(beat, name="sse heartbeat")
                await write(f"retry: {RETRY_MS}\n\n")
                await self._pump(write)
                stop.cancel()  # the parts ended (follow=false, or an error)
        if not gone:
            with suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, write: Callable[[str], Awaitable[None]]) -> None:
        try:
            async for part in self._parts:
                await write(format_part(part))
        except Exception as exc:
            mapped = classify(exc)
            if mapped is None:
                await write(format_error("internal_error", "the stream failed"))
                raise
            await write(format_error(mapped.code, mapped.message))
