"""Reading a thread's output from any process: ``stream`` and ``wait_for``.

A mixin of :class:`~signals.SignalRuntime`. Every reader of this process shares the store's
one follower (on Redis: one blocking connection for any number of readers), started in the
runtime's task group on first use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio

from _signal_leases.errors import UnknownSignalError
from _signal_leases.validation import check_identifier, check_seconds
from signals._model import Receipt, StreamPart

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

    from signals.kit._capabilities import Follower
    from signals.kit._core import SignalCore
    from signals.kit._store import KitStore

__all__ = ["StreamsMixin"]

_PAGE = 100
#: Stream kinds after which a signal's receipt is final.
_FINAL_KINDS = frozenset({"signal.acked", "signal.dead_lettered", "signal.cancelled",
                          "signal.superseded", "signal.expired", "signal.dropped"})


class StreamsMixin:
    """``stream`` and ``wait_for`` (see :class:`~signals.SignalRuntime`)."""

    store: SignalCore
    _follower_ready: anyio.Event | None = None
    _follower_obj: Follower | None = None

    def _require_open(self) -> TaskGroup:
        raise NotImplementedError

    def _kit_open(self) -> KitStore:
        raise NotImplementedError

    async def _follower(self) -> Follower:
        if self._follower_ready is None:
            self._follower_ready = anyio.Event()
            await self._require_open().start(self._serve_follower, name="signals follower")
        await self._follower_ready.wait()
        follower = self._follower_obj
        assert follower is not None
        return follower

    async def _serve_follower(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with self._kit_open().follower() as follower:
            self._follower_obj = follower
            assert self._follower_ready is not None
            self._follower_ready.set()
            task_status.started()
            await anyio.sleep_forever()

    def stream(
        self, thread_key: str, *, after: str | None = None, follow: bool = True
    ) -> AsyncIterator[StreamPart]:
        """The parts of ``thread_key``'s output stream, in order, from any process.

        ``after=None`` starts at the oldest part retained; a cursor resumes exactly after that
        part (no gap, no repeat). ``follow=False`` stops at the current end; otherwise new
        parts arrive as they are written. A cursor older than the retention raises
        :class:`~signals.CursorExpiredError`. Leaving the ``async for`` early is fine: the
        iterator holds nothing that needs closing.
        """
        check_identifier("thread key", thread_key)
        if after is not None:
            check_identifier("after", after)
        self._require_open()
        return _PartIterator(self, thread_key, after, follow)

    async def wait_for(
        self, thread_key: str, signal_id: str, timeout: float | None = None
    ) -> Receipt:
        """Wait until ``signal_id``'s receipt is final (anything but ``pending`` and
        ``scheduled``) and return it; after ``timeout`` seconds return it as it is (possibly
        ``pending``). :class:`~signals.UnknownSignalError` when no such signal was accepted
        (or its receipt is past retention). Works from any process."""
        check_identifier("thread key", thread_key)
        check_identifier("signal id", signal_id)
        limit = None if timeout is None else check_seconds("timeout", timeout)
        self._require_open()
        # The stream's end *before* the receipt is read: a final part written after that read
        # is then seen by the follower below.
        mark = await self.stream_end(thread_key)
        receipt = await self.store.receipt(thread_key, signal_id)
        if receipt is None:
            raise UnknownSignalError(f"no signal {signal_id!r} was accepted for {thread_key!r}")
        if receipt.done:
            return receipt
        with anyio.move_on_after(float("inf") if limit is None else limit):
            if self._kit_open().native_streams:
                async for part in self.stream(thread_key, after=mark):
                    if part.signal_id == signal_id and part.kind in _FINAL_KINDS:
                        break
            else:  # no stream to follow: look at the receipt now and then
                pause = 0.05
                latest: Receipt | None = receipt
                while latest is not None and not latest.done:
                    await anyio.sleep(pause)
                    pause = min(1.0, pause * 2)
                    latest = await self.store.receipt(thread_key, signal_id)
        final = await self.store.receipt(thread_key, signal_id)
        return final if final is not None else receipt

    async def stream_end(self, thread_key: str) -> str | None:
        """The cursor of the newest part of ``thread_key``'s stream (``None``: empty). Pass it
        as ``stream(after=...)`` to follow only what is written from now on."""
        check_identifier("thread key", thread_key)
        tail: str | None = await self._kit_open().streams.stream_tail(thread_key)
        return tail


class _PartIterator:
    """The iterator ``stream`` returns (a class, not an async generator: an early ``break``
    leaves nothing to finalise, on asyncio and trio alike)."""

    def __init__(
        self, runtime: StreamsMixin, thread_key: str, after: str | None, follow: bool
    ) -> None:
        self._runtime = runtime
        self._thread_key = thread_key
        self._cursor = after
        self._follow = follow
        self._buffer: deque[StreamPart] = deque()
        self._read_next = True  # read the store (not the follower) before waiting

    def __aiter__(self) -> _PartIterator:
        return self

    async def __anext__(self) -> StreamPart:
        while not self._buffer:
            if self._read_next or not self._follow:
                parts = await self._runtime._kit_open().streams.stream_read(
                    self._thread_key, after=self._cursor, limit=_PAGE
                )
                self._read_next = len(parts) == _PAGE
                if not parts and not self._follow:
                    raise StopAsyncIteration
            else:
                follower = await self._runtime._follower()
                parts = await follower.wait(self._thread_key, self._cursor)
                # Nothing (the cursor may have expired) or a full page: read the store next.
                self._read_next = not parts or len(parts) >= _PAGE
            self._buffer.extend(parts)
        part = self._buffer.popleft()
        self._cursor = part.cursor
        return part
