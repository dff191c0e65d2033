"""``InMemorySignalInbox``: the process-local inbox (no durability across a crash)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio.lowlevel

from ._inbox import EntryMode, InboxEntry
from ._model import Signal
from ._validation import check_entry_mode, check_limit, check_thread_key

__all__ = ["InMemorySignalInbox"]


@dataclass
class _Thread:
    # Both dicts are in insertion order: entry numbers and acceptance times only grow.
    entries: dict[int, InboxEntry] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    pending_since: float | None = None  # when the inbox last went from empty to non-empty


def _entry_number(entry_id: str) -> int:
    try:
        return int(entry_id)
    except (TypeError, ValueError):
        raise ValueError(f"not an entry id of this inbox: {entry_id!r}") from None


class InMemorySignalInbox:
    """Accepted signals per thread, in this process's memory (lost if the process dies).

    Entry ids are decimal strings of one counter shared by all threads (``"1"``, ``"2"``, ...);
    the inbox compares them as numbers. Signal ids are remembered per thread for
    ``dedup_window_s`` seconds after acceptance, measured on ``clock`` (default
    :func:`anyio.current_time`). Each call is atomic (one checkpoint, then the change).
    Pure anyio: asyncio and trio; use it from one event loop.
    """

    def __init__(
        self, *, dedup_window_s: float = 86_400.0, clock: Callable[[], float] | None = None
    ) -> None:
        if isinstance(dedup_window_s, bool) or not isinstance(dedup_window_s, int | float):
            raise TypeError("dedup_window_s must be a number of seconds")
        if not dedup_window_s > 0:
            raise ValueError("dedup_window_s must be positive")
        self._window = float(dedup_window_s)
        self._clock: Callable[[], float] = clock if clock is not None else anyio.current_time
        self._threads: dict[str, _Thread] = {}
        # Empty threads kept only for their dedup ids: thread -> latest acceptance time.
        self._idle: dict[str, float] = {}
        self._next_id = 0

    def _forget_old_ids(self, thread: _Thread, now: float) -> None:
        seen = thread.seen
        while seen:
            signal_id, accepted_at = next(iter(seen.items()))
            if now - accepted_at <= self._window:
                return
            del seen[signal_id]

    def _forget_idle_threads(self, now: float) -> None:
        idle = self._idle
        while idle:
            thread_key, last_accepted = next(iter(idle.items()))
            if now - last_accepted <= self._window:
                return
            del idle[thread_key]
            thread = self._threads.get(thread_key)
            if thread is not None and not thread.entries:
                del self._threads[thread_key]

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool:
        check_thread_key(thread_key)
        check_entry_mode(mode)
        if not isinstance(signal, Signal):
            raise TypeError(f"signal must be a Signal, got {type(signal).__name__}")
        await anyio.lowlevel.checkpoint()
        now = self._clock()
        self._forget_idle_threads(now)
        thread = self._threads.setdefault(thread_key, _Thread())
        self._forget_old_ids(thread, now)
        if signal.id in thread.seen:
            return False
        self._idle.pop(thread_key, None)
        thread.seen[signal.id] = now
        if thread.pending_since is None:
            thread.pending_since = now
        self._next_id += 1
        thread.entries[self._next_id] = InboxEntry(str(self._next_id), signal, mode)
        return True

    async def inbox_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[InboxEntry]:
        check_thread_key(thread_key)
        start = _entry_number(after) if after is not None else 0
        check_limit(limit)
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return []
        out: list[InboxEntry] = []
        for number, entry in thread.entries.items():
            if number > start:
                out.append(entry)
                if len(out) == limit:
                    break
        return out

    async def inbox_remove(self, thread_key: str, entry_ids: list[str]) -> None:
        check_thread_key(thread_key)
        numbers = [_entry_number(entry_id) for entry_id in entry_ids]
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return
        for number in numbers:
            thread.entries.pop(number, None)
        if not thread.entries and thread.pending_since is not None:
            thread.pending_since = None
            if thread.seen:
                self._idle[thread_key] = next(reversed(thread.seen.values()))
            else:
                del self._threads[thread_key]

    async def inbox_pending_count(self, thread_key: str) -> int:
        check_thread_key(thread_key)
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        return len(thread.entries) if thread else 0

    async def inbox_pending_threads(self, limit: int = 100) -> list[str]:
        """Threads with pending entries, the longest-waiting first; at most ``limit``."""
        check_limit(limit)
        await anyio.lowlevel.checkpoint()
        pending = [(t.pending_since, key) for key, t in self._threads.items() if t.entries]
        return [key for _, key in sorted(pending, key=lambda p: p[0] or 0.0)][:limit]
