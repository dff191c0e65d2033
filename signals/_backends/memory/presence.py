"""The cross-thread half of :class:`~signals.InMemorySignalStore`: pending index, runtime
registry and notices, in this process's memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio.lowlevel

from signals._store import Notice, RuntimeInfo

__all__ = ["MemoryPresence"]


class MemoryPresence:
    """Pending index, registry and notices in memory (a base of ``InMemorySignalStore``)."""

    _clock: Callable[[], float]
    _threads: dict[str, Any]

    def __init__(self) -> None:
        self._index: dict[str, float] = {}  # thread -> since (insertion order: oldest first)
        self._runtimes: dict[str, tuple[RuntimeInfo, float]] = {}  # id -> (info, expires_at)
        self._owned: dict[str, set[str]] = {}  # runtime id -> threads
        self._listeners: dict[str, Callable[[Notice], None]] = {}
        self._workers: set[str] = set()

    # -- pending index and runtime registry --------------------------------------------------

    async def pending_threads(self, *, limit: int = 100, min_age_ms: int = 0) -> list[str]:
        await anyio.lowlevel.checkpoint()
        horizon = self._clock() - min_age_ms / 1000
        return [t for t, since in self._index.items() if since <= horizon][:limit]

    async def index(self, thread_key: str) -> None:
        """Put ``thread_key`` in the pending index (its owner is gone; recovery looks)."""
        await anyio.lowlevel.checkpoint()
        self._index.setdefault(thread_key, self._clock())

    async def unindex(self, thread_key: str) -> None:
        await anyio.lowlevel.checkpoint()
        self._index.pop(thread_key, None)

    async def defer(self, thread_key: str, delay_ms: int) -> None:
        """Keep ``thread_key`` in the pending index but out of ``pending_threads`` for
        ``delay_ms`` (its owner looked alive: look again once its lease would expire)."""
        await anyio.lowlevel.checkpoint()
        self._defer(thread_key, delay_ms)

    def _defer(self, thread_key: str, delay_ms: int) -> None:
        self._index.pop(thread_key, None)  # (to the end: the index is oldest first)
        self._index[thread_key] = self._clock() + delay_ms / 1000

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None:
        await anyio.lowlevel.checkpoint()
        self._runtimes[info.runtime_id] = (info, self._clock() + ttl_ms / 1000)

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool:
        await anyio.lowlevel.checkpoint()
        known = self._runtimes.get(runtime_id)
        if known is None or known[1] <= self._clock():
            return False
        self._runtimes[runtime_id] = (known[0], self._clock() + ttl_ms / 1000)
        return True

    async def unregister_runtime(self, runtime_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        self._runtimes.pop(runtime_id, None)
        self._orphan(runtime_id)

    def _orphan(self, runtime_id: str) -> None:
        now = self._clock()
        for thread_key in self._owned.pop(runtime_id, set()):
            thread = self._threads.get(thread_key)
            if thread is not None and thread.entries:
                self._index.setdefault(thread_key, now)

    async def track_threads(
        self, runtime_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> None:
        await anyio.lowlevel.checkpoint()
        self._track(runtime_id, add, remove)

    def _track(self, runtime_id: str, add: Sequence[str], remove: Sequence[str]) -> None:
        owned = self._owned.setdefault(runtime_id, set())
        owned.update(add)
        owned.difference_update(remove)

    async def runtime_threads(self, runtime_id: str) -> list[str]:
        """The threads ``runtime_id`` owns (as far as the registry knows)."""
        await anyio.lowlevel.checkpoint()
        return sorted(self._owned.get(runtime_id, ()))

    async def orphan_dead_runtimes(self) -> list[str]:
        await anyio.lowlevel.checkpoint()
        now = self._clock()
        dead = [rid for rid, (_, expires_at) in self._runtimes.items() if expires_at <= now]
        for rid in dead:
            del self._runtimes[rid]
            self._orphan(rid)
        return dead

    async def runtimes(self) -> list[RuntimeInfo]:
        await anyio.lowlevel.checkpoint()
        now = self._clock()
        return [replace(info, alive=exp > now) for info, exp in self._runtimes.values()]

    # -- notices ---------------------------------------------------------------------------

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        await anyio.lowlevel.checkpoint()
        self._notify(runtime_id, notice)

    def _notify(self, runtime_id: str | None, notice: Notice) -> None:
        targets = self._workers if runtime_id is None else {runtime_id}
        for rid in list(targets):
            handler = self._listeners.get(rid)
            if handler is not None:
                handler(notice)

    @asynccontextmanager
    async def listen(
        self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
    ) -> AsyncIterator[None]:
        """Deliver notices for ``runtime_id`` (and, if ``worker``, work notices) to ``handler``."""
        self._listeners[runtime_id] = handler
        if worker:
            self._workers.add(runtime_id)
        try:
            handler(Notice("resync"))
            yield
        finally:
            self._listeners.pop(runtime_id, None)
            self._workers.discard(runtime_id)

