"""``InMemorySignalInbox``: the process-local inbox (no durability across a crash)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio.lowlevel

from ._inbox import EntryMode, InboxEntry
from ._model import Signal
from ._validation import check_thread_key

__all__ = ["InMemorySignalInbox"]


@dataclass
class _Thread:
    entries: dict[int, InboxEntry] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)


class InMemorySignalInbox:
    """Accepted signals per thread, in this process's memory.

    Entry ids are increasing integers (as strings). Signal ids are remembered for
    ``dedup_window_s`` seconds after acceptance. Pure anyio: asyncio and trio.
    """

    def __init__(
        self, *, dedup_window_s: float = 86_400.0, clock: Callable[[], float] | None = None
    ) -> None:
        if dedup_window_s <= 0:
            raise ValueError("dedup_window_s must be positive")
        self._window = dedup_window_s
        self._clock = clock or anyio.current_time
        self._threads: dict[str, _Thread] = {}
        self._next_id = 0

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool:
        check_thread_key(thread_key)
        if mode not in ("deliver", "queue"):
            raise ValueError(f"mode must be 'deliver' or 'queue', got {mode!r}")
        await anyio.lowlevel.checkpoint()
        now = self._clock()
        thread = self._threads.setdefault(thread_key, _Thread())
        for sid, at in list(thread.seen.items()):
            if now - at > self._window:
                del thread.seen[sid]
        if signal.id in thread.seen:
            return False
        thread.seen[signal.id] = now
        self._next_id += 1
        thread.entries[self._next_id] = InboxEntry(str(self._next_id), signal, mode)
        return True

    async def inbox_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[InboxEntry]:
        check_thread_key(thread_key)
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return []
        start = int(after) if after is not None else 0
        out = [e for n, e in sorted(thread.entries.items()) if n > start]
        return out[:limit]

    async def inbox_remove(self, thread_key: str, entry_ids: list[str]) -> None:
        check_thread_key(thread_key)
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return
        for entry_id in entry_ids:
            thread.entries.pop(int(entry_id), None)

    async def inbox_pending_count(self, thread_key: str) -> int:
        check_thread_key(thread_key)
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        return len(thread.entries) if thread else 0

    async def inbox_pending_threads(self, limit: int = 100) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return [k for k, t in self._threads.items() if t.entries][:limit]
