"""Output streams in memory: ``emit``, ``stream_read`` and the follower (a base of
``InMemorySignalStore``). Cursors are decimal strings of one counter per store; retention is
by count and age, and the newest trimmed cursor is remembered per thread, so an expired
cursor raises :class:`~signals.CursorExpiredError` instead of skipping parts silently."""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from _signal_leases.aio import checkpoint
from _signal_leases.errors import CursorExpiredError
from signals._model import StreamPart
from signals.kit._capabilities import PartIn

__all__ = ["MemoryOutput"]


class _Part:
    """A stored part; its :class:`StreamPart` (the JSON decoded) is built when first read, as
    most lifecycle parts are never read."""

    __slots__ = ("_built", "data", "key", "kind", "n", "now", "run_id", "signal_id")

    def __init__(self, n: int, now: float, key: str, kind: str, run_id: str,
                 signal_id: str | None, data: str | None) -> None:
        self.n, self.now, self.key, self.kind = n, now, key, kind
        self.run_id, self.signal_id, self.data = run_id, signal_id, data
        self._built: StreamPart | None = None

    def get(self) -> StreamPart:
        built = self._built
        if built is None:
            data = self.data
            built = self._built = StreamPart(str(self.n), self.key, self.run_id or None,
                                             self.kind, json.loads(data) if data else None,
                                             self.signal_id, self.now)
        return built


@dataclass(slots=True)
class _Output:
    parts: deque[_Part] = field(default_factory=deque)
    trimmed: int = 0  # the newest cursor number removed by retention
    waiters: list[tuple[int, anyio.Event]] = field(default_factory=list)


class MemoryOutput:
    """See the module docstring."""

    _clock: Callable[[], float]
    stream_max_parts: int
    stream_retention_ms: int

    def __init__(self) -> None:
        self._outputs: dict[str, _Output] = {}
        self._part_seq = 0

    def _output(self, thread_key: str) -> _Output:
        out = self._outputs.get(thread_key)
        if out is None:
            out = self._outputs[thread_key] = _Output()
        return out

    def _trim(self, out: _Output, now: float) -> None:
        horizon = now - self.stream_retention_ms / 1000
        while out.parts and (len(out.parts) > self.stream_max_parts or out.parts[0].now <= horizon):
            out.trimmed = out.parts.popleft().n

    def _append(self, thread_key: str, kind: str, run_id: str, signal_id: str | None,
                data: str | None, now: float | None = None) -> str:
        """Append a part (the fields of a :class:`PartIn`) at ``now`` (the store's clock: the
        caller's step's time, or read here); its cursor."""
        if now is None:
            now = self._clock()
        out = self._output(thread_key)
        n = self._part_seq = self._part_seq + 1
        out.parts.append(_Part(n, now, thread_key, kind, run_id, signal_id, data))
        self._trim(out, now)
        for _, event in out.waiters:
            event.set()
        return str(n)

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        await checkpoint()
        return [self._append(thread_key, p.kind, p.run_id, p.signal_id, p.data) for p in parts]

    def _read(self, thread_key: str, after: str | None, limit: int) -> list[StreamPart]:
        out = self._outputs.get(thread_key)
        if out is None:
            return []
        self._trim(out, self._clock())
        start = int(after) if after is not None else 0
        if after is not None and start < out.trimmed:
            raise CursorExpiredError(
                f"cursor {after!r} of thread {thread_key!r} is older than the stream retains; "
                f"read again from after=None"
            )
        return [p.get() for p in itertools.islice(
            (p for p in out.parts if p.n > start), limit)]

    async def stream_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[StreamPart]:
        await checkpoint()
        return self._read(thread_key, after, limit)

    async def stream_tail(self, thread_key: str) -> str | None:
        await checkpoint()
        out = self._outputs.get(thread_key)
        return str(out.parts[-1].n) if out is not None and out.parts else None

    @asynccontextmanager
    async def follower(self) -> AsyncIterator[MemoryOutput]:
        """In memory the store is its own follower (no connection, no task)."""
        yield self

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Wait until the thread's stream has parts after ``after``; return them."""
        while True:
            try:
                parts = self._read(thread_key, after, 100)
            except CursorExpiredError:
                return []  # the reader's next stream_read raises it
            if parts:
                return parts
            out = self._output(thread_key)
            waiter = (0, anyio.Event())
            out.waiters.append(waiter)
            try:
                await waiter[1].wait()
            finally:
                out.waiters.remove(waiter)
