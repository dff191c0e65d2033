"""Recovery and the process's timer: take over threads whose owner died, ownerless threads
with work, and threads whose delayed signals came due.

A mixin of :class:`~signals.SignalRuntime`. One task per runtime serves it: it keeps the
runtime's presence fresh (every TTL/3), claims threads named by work notices as they come,
and every ``recover_interval_ms``, or at the next due time the core reported (or a ``due``
notice announced), asks the core which threads are due and claims them. The work done per
pass is O(threads needing an owner), never O(all); there is no timer per thread or signal.

The mixin also takes the notices of the process's one listener (a signal carried to a run,
work, a due time, pause, abort, a resync) and the heartbeat's lost leases.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.aio import loop_time, unix_now

if TYPE_CHECKING:
    from _signal_leases.aio import WakeQueue
    from _signal_leases.logs import Logger
    from signals._chain import Chain
    from signals._telemetry import Telemetry
    from signals.kit._capabilities import Notice, RuntimeInfo
    from signals.kit._store import KitStore

__all__ = ["RECOVER_BATCH", "RecoveryMixin"]

#: How many due threads one recovery pass looks at (the longest-due first).
RECOVER_BATCH = 1000
_TIMER = ""  # a work item that only wakes the timer (no thread key is empty)


class RecoveryMixin:
    """The recovery task and ``recover()`` (see :class:`~signals.SignalRuntime`)."""

    agent: Any
    runtime_id: str
    lease_ttl_ms: int
    recover_interval_ms: int
    _chains: dict[str, Chain]
    _starting: set[str]
    _taking_back: set[str]
    _lost: set[str]
    _work: WakeQueue[str | None]
    _next_due: float | None
    _kit: KitStore | None
    _closed: bool
    _log: Logger
    _telemetry: Telemetry

    def _full(self) -> bool:
        raise NotImplementedError

    def _poke(self) -> None:
        raise NotImplementedError

    def _start_chain(self, lease: Any, *, taken_over: bool = False) -> None:
        raise NotImplementedError

    def _kit_open(self) -> KitStore:
        raise NotImplementedError

    def _info(self) -> RuntimeInfo:
        raise NotImplementedError

    def _due_hint(self, at: float) -> None:
        """A signal comes due at ``at`` (Unix time): make the timer wake by then."""
        if self._next_due is None or at < self._next_due:
            self._next_due = at
            self._work.put(_TIMER)

    def _timer_at(self) -> float:
        """The next due time on the event loop's clock (``inf``: none)."""
        if self._next_due is None:
            return float("inf")
        return loop_time() + max(0.0, self._next_due - unix_now())

    async def _recovery_loop(self) -> None:
        presence_s = self.lease_ttl_ms / 3000
        recover_s = self.recover_interval_ms / 1000
        now = loop_time()
        next_presence, next_recover = now + presence_s, now + recover_s
        backoff = 0.0  # after a failed pass: the wait before the next (the backend is down)
        while True:
            item: str | bool | None = False
            with anyio.move_on_at(min(next_presence, next_recover, self._timer_at())):
                item = await self._work.get()
            if self._closed:
                return  # leaving: the runtime's exit takes care of what is left
            try:
                kit = self._kit_open()
                for thread_key in list(self._lost):
                    await kit.core.look_at(thread_key, unix_now())
                    self._lost.discard(thread_key)
                if isinstance(item, str) and item != _TIMER:
                    await self._try_claim(item)
                now = loop_time()
                if now >= next_presence:
                    next_presence = now + presence_s
                    await self._keep_presence()
                if item is None:
                    await self._check_aborts()  # notices may have been lost before a resync
                due = self._next_due is not None and self._next_due <= unix_now()
                if item is None or now >= next_recover or due:
                    if item is None or now >= next_recover:
                        next_recover = now + recover_s
                    await self.recover()
            except Exception as exc:
                # (a due time or a lost thread stays to do: without the wait, the loop would
                # spin on a backend that is down, a warning per pass)
                backoff = min(max(backoff * 2, 0.05), 2.0)
                self._log.warning("signals.recovery_failed", error=repr(exc),
                                  retry_in_s=backoff)
                await anyio.sleep(backoff)
            else:
                backoff = 0.0

    async def _check_aborts(self) -> None:
        chains = dict(self._chains)
        if not chains:
            return
        states = await self._kit_open().core.describe(list(chains))
        for thread_key, state in states.items():
            chain = chains[thread_key]
            if state.abort is not None and state.abort == chain.run_id:
                chain.cancel_run("abort", state.abort)

    async def _keep_presence(self) -> None:
        registry = self._kit_open().registry
        if not await registry.refresh_runtime(self.runtime_id, self.lease_ttl_ms):
            # We were taken for dead (too slow to refresh): register again, re-track our threads.
            await registry.register_runtime(self._info(), self.lease_ttl_ms)
            await registry.track_threads(self.runtime_id, add=list(self._chains))

    async def _try_claim(self, thread_key: str) -> bool:
        try:
            return await self._claim(thread_key)
        finally:
            self._taking_back.discard(thread_key)
            self._poke()

    async def _claim(self, thread_key: str) -> bool:
        if thread_key in self._chains or thread_key in self._starting or self._full():
            return False
        if self._closed:
            return False
        kit = self._kit_open()
        self._starting.add(thread_key)
        try:
            lease = await kit.claim(thread_key)
            if lease is None:
                return False
            self._log.info("signals.recovered", key=thread_key, run_id=lease.owner,
                           owner=lease.owner, token=lease.token)
            self._start_chain(lease, taken_over=True)
            return True
        finally:
            self._starting.discard(thread_key)

    async def recover(self) -> list[str]:
        """Take over threads whose owner died, ownerless threads with pending signals, and
        threads whose delayed signals came due; returns the threads woken. The runtime calls
        this every ``recover_interval_ms``, at the next due time and on work notices; call it
        yourself to recover at once."""
        kit = self._kit_open()
        if self.agent is None:
            return []
        due = await kit.core.due(limit=RECOVER_BATCH)
        self._next_due = due.next_at
        woken: list[str] = []
        for thread_key in due.threads:
            if self._full():
                break
            if thread_key in self._chains:  # a delayed signal of ours came due
                self._chains[thread_key].doorbell.ring()
                await kit.core.look_at(thread_key, unix_now() + self.lease_ttl_ms / 1000)
                continue
            if await self._try_claim(thread_key):
                woken.append(thread_key)
        return woken

    # -- notices and leases -------------------------------------------------------------

    def _pending_here(self) -> int:
        """Signals this process's runs hold and have not handed out (the ``signals.pending``
        gauge; called from the metric reader's thread, so it copies before it iterates)."""
        return sum(chain.run.pending for chain in list(self._chains.values())
                   if chain.run is not None and not chain.run.ended)

    def _on_lease_lost(self, lease: Any) -> None:
        chain = self._chains.get(lease.key)
        if chain is not None and chain.lease is lease:
            self._telemetry.count("leases_lost")
            self._log.warning("run.lease_lost", key=lease.key, run_id=lease.owner,
                              token=lease.token, reason=lease.lost_reason)

    def _on_notice(self, notice: Notice) -> None:
        if notice.kind == "resync":
            for each in self._chains.values():
                each.doorbell.ring()
            self._work.put(None)
            return
        chain = self._chains.get(notice.thread_key)
        if notice.kind == "signal":
            if chain is not None and notice.entry is not None:
                chain.offer(notice.entry, notice.run_id)
            elif chain is not None:
                chain.doorbell.ring()
            else:
                self._work.put(notice.thread_key)  # not ours (any more): maybe nobody's
        elif notice.kind == "work":
            if chain is None:
                self._work.put(notice.thread_key)
        elif notice.kind == "due":
            with contextlib.suppress(ValueError):
                self._due_hint(float(notice.reason or ""))
        elif notice.kind == "pause" and chain is not None:
            chain.pause()
        elif notice.kind == "abort" and chain is not None:
            chain.cancel_run(_abort_reason(notice.reason), notice.run_id)


def _abort_reason(reason: str | None) -> str:
    """The reason a run cancelled by an abort notice reports (``interrupt`` stays itself)."""
    if reason == "interrupt":
        return "interrupt"
    return f"abort: {reason}" if reason else "abort"
