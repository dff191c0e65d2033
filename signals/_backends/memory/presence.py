"""The cross-thread half of :class:`~signals.InMemorySignalStore`: the runtime registry and
notices, in this process's memory (the pending index is the engine's, in ``tables``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from _signal_leases.aio import checkpoint
from signals.kit._capabilities import Notice, RuntimeInfo
from signals.kit._core import run_runtime

if TYPE_CHECKING:
    from leases import InMemoryLeaseProvider

__all__ = ["MemoryPresence"]


class MemoryPresence:
    """Registry and notices in memory (a base of ``InMemorySignalStore``)."""

    _clock: Callable[[], float]
    leases: InMemoryLeaseProvider | None

    def __init__(self) -> None:
        self._runtimes: dict[str, tuple[RuntimeInfo, float]] = {}  # id -> (info, expires_at)
        self._listeners: dict[str, Callable[[Notice], None]] = {}
        self._workers: set[str] = set()

    # -- the runtime registry ---------------------------------------------------------------

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None:
        await checkpoint()
        self._runtimes[info.runtime_id] = (info, self._clock() + ttl_ms / 1000)

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool:
        await checkpoint()
        known = self._runtimes.get(runtime_id)
        if known is None or known[1] <= self._clock():
            return False
        self._runtimes[runtime_id] = (known[0], self._clock() + ttl_ms / 1000)
        return True

    async def unregister_runtime(self, runtime_id: str) -> None:
        await checkpoint()
        self._runtimes.pop(runtime_id, None)

    async def track_threads(
        self, runtime_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> None:
        """Nothing to do: ownership is read from the leases (see :meth:`runtime_threads`)."""
        await checkpoint()

    async def runtime_threads(self, runtime_id: str) -> list[str]:
        """The threads whose live lease a run of ``runtime_id`` holds."""
        await checkpoint()
        if self.leases is None:
            return []
        table, now = self.leases.table, self.leases.clock()
        return [k for k in table.keys(now) if run_runtime(table.owner(k, now) or "") == runtime_id]

    async def runtimes(self) -> list[RuntimeInfo]:
        await checkpoint()
        now = self._clock()
        return [replace(info, alive=exp > now) for info, exp in self._runtimes.values()]

    # -- notices ---------------------------------------------------------------------------

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        await checkpoint()
        self._notify(runtime_id, notice)

    def _notify(self, runtime_id: str | None, notice: Notice) -> None:
        if runtime_id is not None:
            handler = self._listeners.get(runtime_id)
            if handler is not None:
                handler(notice)
            return
        for rid in list(self._workers):
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
