"""The stream follower of :class:`~signals.kit.SQLCore`: one per process, for every reader.

It wakes the local readers of a thread at once when this process appends a part (``ring``),
and while anyone waits it polls every ``follow_poll_ms`` for the parts of other processes:
one call per poll over every thread waited on (a statement per ``_CHUNK`` keys, padded to one
of a few lengths so that a database that prepares statements keeps few of them).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.errors import CursorExpiredError

if TYPE_CHECKING:
    from signals._model import StreamPart
    from signals.kit._sql import SQLCore
    from signals.kit._sql.tables import SQLTables

__all__ = ["SQLFollower"]

_CHUNK = 500  # thread keys per statement of the follower's poll
_SIZES = (8, 64, _CHUNK)  # the lengths of its IN lists


def _positions(t: SQLTables, *, threads: list[str]) -> list[tuple[Any, ...]]:
    """``(key, pseq)`` of ``threads`` (one statement per ``_CHUNK`` of them)."""
    rows: list[tuple[Any, ...]] = []
    for i in range(0, len(threads), _CHUNK):
        chunk = threads[i:i + _CHUNK]
        size = next(n for n in _SIZES if n >= len(chunk))
        chunk += [chunk[-1]] * (size - len(chunk))  # the same key again matches nothing more
        rows += t._tx.all(
            f"SELECT key, pseq FROM sig_threads WHERE key IN ({', '.join('?' * len(chunk))})",
            chunk)
    return rows


class SQLFollower:
    """Waiters by thread; one query per poll for every thread someone waits on."""

    def __init__(self, core: SQLCore) -> None:
        self._core = core
        self.waiting: dict[str, list[anyio.Event]] = {}
        self._someone = anyio.Event()

    def ring(self, thread_key: str) -> None:
        for event in self.waiting.get(thread_key, ()):
            event.set()

    async def run(self) -> None:
        core, poll = self._core, self._core.follow_poll_ms / 1000
        seen: dict[str, int] = {}
        while True:
            if not self.waiting:
                self._someone = anyio.Event()
                await self._someone.wait()
            threads = list(self.waiting)
            if len(seen) > 2 * len(threads) + 100:  # forget threads nobody waits on any more
                seen = {k: v for k, v in seen.items() if k in self.waiting}
            try:  # every thread waited on, a statement per _CHUNK keys
                rows = await core._call(functools.partial(_positions, threads=threads),
                                        write=False, what="stream follow")
            except Exception:  # an outage: the waiters wait through it, the next poll retries
                rows = []
            for key, pseq in rows:
                if seen.get(key) != pseq:
                    seen[key] = pseq
                    self.ring(key)
            await anyio.sleep(poll)

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Wait until ``thread_key``'s stream has parts after ``after``; return them.

        The waiter is registered before it reads: a part another process writes while the
        read is on its way rings it (the poll that sees it rings only those registered)."""
        while True:
            event = anyio.Event()
            self.waiting.setdefault(thread_key, []).append(event)
            self._someone.set()
            try:
                try:
                    parts = await self._core.stream_read(thread_key, after=after)
                except CursorExpiredError:
                    return []  # the reader's next stream_read raises it
                if parts:
                    return parts
                await event.wait()
            finally:
                waiting = self.waiting[thread_key]
                waiting.remove(event)
                if not waiting:
                    del self.waiting[thread_key]

