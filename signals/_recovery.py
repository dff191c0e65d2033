"""Recovery: take over threads whose owner died, and ownerless threads with pending work.

A mixin of :class:`~signals.SignalRuntime`. One task per runtime serves it: it keeps the
runtime's presence fresh (every TTL/3), claims threads named by work notices as they come,
and every ``recover_interval_ms`` indexes the threads of dead runtimes and claims what the
pending index holds. The work done per pass is O(threads needing an owner), never O(all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from _signal_leases.aio import WakeQueue
    from _signal_leases.logs import Logger
    from signals._chain import Chain
    from signals._routing import Backend
    from signals._store import RuntimeInfo, SignalStore

__all__ = ["RECOVER_BATCH", "RecoveryMixin"]

#: How many pending threads one recovery pass looks at (the longest-waiting first).
RECOVER_BATCH = 1000


class RecoveryMixin:
    """The recovery task and ``recover()`` (see :class:`~signals.SignalRuntime`)."""

    agent: Any
    inbox: SignalStore
    runtime_id: str
    lease_ttl_ms: int
    recover_interval_ms: int
    _chains: dict[str, Chain]
    _starting: set[str]
    _lost: set[str]
    _work: WakeQueue[str | None]
    _backend: Backend | None
    _closed: bool
    _log: Logger

    def _full(self) -> bool:
        raise NotImplementedError

    def _start_chain(self, lease: Any) -> None:
        raise NotImplementedError

    def _require_open(self) -> Any:
        raise NotImplementedError

    def _info(self) -> RuntimeInfo:
        raise NotImplementedError

    async def _recovery_loop(self) -> None:
        presence_s = self.lease_ttl_ms / 3000
        recover_s = self.recover_interval_ms / 1000
        now = anyio.current_time()
        next_presence, next_recover = now + presence_s, now + recover_s
        while True:
            item: str | bool | None = False
            with anyio.move_on_at(min(next_presence, next_recover)):
                item = await self._work.get()
            if self._closed:
                return  # leaving: the runtime's exit takes care of what is left
            try:
                for thread_key in list(self._lost):
                    await self.inbox.index(thread_key)
                    self._lost.discard(thread_key)
                if isinstance(item, str):
                    await self._try_claim(item)
                now = anyio.current_time()
                if now >= next_presence:
                    next_presence = now + presence_s
                    await self._keep_presence()
                if item is None:
                    await self._check_aborts()  # notices may have been lost before a resync
                if item is None or now >= next_recover:
                    next_recover = now + recover_s
                    await self.recover()
            except Exception as exc:
                self._log.warning("signals.recovery_failed", error=repr(exc))

    async def _check_aborts(self) -> None:
        chains = dict(self._chains)
        if not chains:
            return
        for thread_key, meta in (await self.inbox.thread_meta(list(chains))).items():
            chain = chains[thread_key]
            if meta["abort"] is not None and meta["abort"] == chain.run_id:
                chain.cancel_run("abort", meta["abort"])

    async def _keep_presence(self) -> None:
        if not await self.inbox.refresh_runtime(self.runtime_id, self.lease_ttl_ms):
            # We were taken for dead (too slow to refresh): register again, re-track our threads.
            await self.inbox.register_runtime(self._info(), self.lease_ttl_ms)
            await self.inbox.track_threads(self.runtime_id, add=list(self._chains))

    async def _try_claim(self, thread_key: str) -> bool:
        if thread_key in self._chains or thread_key in self._starting or self._full():
            return False
        if self._closed:
            return False
        backend = self._backend
        assert backend is not None
        self._starting.add(thread_key)
        try:
            lease = await backend.claim(thread_key)
            if lease is None:
                return False
            self._log.info("signals.recovered", key=thread_key, run_id=lease.owner,
                           owner=lease.owner, token=lease.token)
            self._start_chain(lease)
            return True
        finally:
            self._starting.discard(thread_key)

    async def recover(self) -> list[str]:
        """Take over threads whose owner died and ownerless threads with pending signals;
        returns the threads woken. The runtime calls this every ``recover_interval_ms`` (and
        on work notices); call it yourself to recover at once."""
        self._require_open()
        if self.agent is None:
            return []
        for runtime_id in await self.inbox.orphan_dead_runtimes():
            self._log.info("signals.runtime_dead", dead_runtime_id=runtime_id)
        woken: list[str] = []
        for thread_key in await self.inbox.pending_threads(limit=RECOVER_BATCH):
            if self._full():
                break
            if await self._try_claim(thread_key):
                woken.append(thread_key)
        return woken
