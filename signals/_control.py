"""Control and inspection of threads: this process's runs (``active_run``, ``wait_idle``) and,
from any process, pause and resume, abort, pending, cancel, threads, receipts and dead
letters.

A mixin of :class:`~signals.SignalRuntime`; every call works from a sender-only runtime too,
because it goes to the shared store, not to the owner's memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.validation import check_identifier, check_int, check_str
from signals._model import Signal, ThreadInfo
from signals.kit._capabilities import Notice, RuntimeInfo
from signals.kit._core import DeadLetter, run_runtime

if TYPE_CHECKING:
    from _signal_leases.aio import WakeQueue
    from leases import LeaseProvider
    from signals._chain import Chain
    from signals._model import Receipt, RunInfo
    from signals.kit._core import SignalCore
    from signals.kit._store import KitStore

__all__ = ["ControlMixin"]


class ControlMixin:
    """Control and inspection (see :class:`~signals.SignalRuntime`)."""

    store: SignalCore
    leases: LeaseProvider
    runtime_id: str
    agent: Any
    _chains: dict[str, Chain]
    _starting: set[str]
    _taking_back: set[str]
    _changed: anyio.Event | None
    _closed: bool
    _work: WakeQueue[str | None]

    def _full(self) -> bool:
        raise NotImplementedError

    def _require_open(self) -> Any:
        raise NotImplementedError

    def _kit_open(self) -> KitStore:
        raise NotImplementedError

    def active_run(self, thread_key: str) -> RunInfo | None:
        """The run this process has on ``thread_key`` right now, or ``None`` (only this
        process's runs: another process may own the thread)."""
        chain = self._chains.get(thread_key)
        return chain.info() if chain is not None else None

    def active_threads(self) -> list[str]:
        """The threads this process runs right now."""
        return list(self._chains)

    async def wait_idle(self, thread_key: str | None = None) -> None:
        """Wait until this process runs nothing (on ``thread_key``, or on any thread), and is
        not about to: a thread it is claiming, or taking back from a run that ended as a
        signal arrived, counts as running."""
        while self._busy(thread_key):
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def _busy(self, thread_key: str | None) -> bool:
        if thread_key is not None:
            return any(thread_key in s for s in (self._chains, self._starting, self._taking_back))
        return bool(self._chains or self._starting or self._taking_back)

    async def pause(self, thread_key: str) -> bool:
        """Pause ``thread_key``, durably and for every process: it keeps accepting signals,
        no run starts, and an active run is handed no further signal (the one in hand
        finishes). Returns whether it was paused already."""
        check_identifier("thread key", thread_key)
        kit = self._kit_open()
        was = await kit.core.pause(thread_key, True)
        chain = self._chains.get(thread_key)
        if chain is not None:
            chain.pause()
        owner = await self.leases.get_lease_owner(thread_key)
        if owner is not None and run_runtime(owner) != self.runtime_id:
            await kit.notify(run_runtime(owner), Notice("pause", thread_key, owner))
        return was

    async def resume(self, thread_key: str) -> bool:
        """Resume a paused thread: its signals go on in order (a worker takes it at once).
        Returns whether it was paused."""
        check_identifier("thread key", thread_key)
        kit = self._kit_open()
        was = await kit.core.pause(thread_key, False)
        if was:
            chain = self._chains.get(thread_key)
            if chain is not None:
                chain.doorbell.ring()
            elif self.agent is not None and not self._closed and not self._full():
                self._taking_back.add(thread_key)  # claim it here; wait_idle counts it
                self._work.put(thread_key)
            else:
                await kit.notify(None, Notice("work", thread_key))
        return was

    async def _runtime_info(self, kit: KitStore, runtime_id: str) -> RuntimeInfo | None:
        lookup = getattr(kit.registry, "lookup", None)
        if lookup is not None:
            found: RuntimeInfo | None = await lookup(runtime_id)
            return found
        return next((r for r in await kit.registry.runtimes()
                     if r.runtime_id == runtime_id), None)

    async def abort(
        self,
        thread_key: str,
        run_id: str | None = None,
        *,
        clear_pending: bool = False,
        reason: str | None = None,
    ) -> bool:
        """Cancel the active run of ``thread_key`` (``run_id``, or whichever run is active
        now), from any process; ``True`` when a run was aborted.

        The check is atomic with the lease: a run that started after this call is never
        cancelled by it. The aborted run ends at its next checkpoint and writes a
        ``run.cancelled`` part (reason ``abort`` or ``abort: <reason>``). Its unacknowledged
        signals are delivered again to the next run, unless ``clear_pending``: then every
        pending signal of the thread is withdrawn (receipts ``cancelled``).
        """
        check_identifier("thread key", thread_key)
        if run_id is not None:
            check_identifier("run_id", run_id)
        if reason is not None:
            check_str("reason", reason)
        aborted = await self._kit_open().abort(
            thread_key, run_id, reason=reason or "", clear=bool(clear_pending)
        )
        return aborted is not None

    async def pending(self, thread_key: str) -> list[Signal]:
        """The signals of ``thread_key`` accepted and not yet acknowledged, in hand-out order
        (priority, then accept order), with ``mode`` and ``attempt`` (runs it was handed to
        so far: 0 for one no run has taken yet)."""
        check_identifier("thread key", thread_key)
        kit = self._kit_open()
        out: list[Signal] = []
        while True:
            page = await kit.core.entries(thread_key, limit=1000, offset=len(out))
            out += [e.signal.evolve(attempt=e.attempts, mode=e.mode) for e in page]
            if len(page) < 1000:
                return out

    async def cancel(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]:
        """Withdraw queued signals that no run has taken yet; returns the ids withdrawn
        (receipts ``cancelled``). A signal a live run holds is not withdrawn: it is either
        withdrawn or processed, never both."""
        check_identifier("thread key", thread_key)
        ids = [check_identifier("signal id", s) for s in _as_list("signal_ids", signal_ids)]
        return await self._kit_open().withdraw(thread_key, ids) if ids else []

    async def thread(self, thread_key: str) -> ThreadInfo:
        """What is known of one thread (owner, owning runtime, pending count, activity,
        pause), from any process; an unknown thread is simply idle with nothing pending."""
        check_identifier("thread key", thread_key)
        kit = self._kit_open()
        owner = await self.leases.get_lease_owner(thread_key)
        state = (await kit.core.describe([thread_key]))[thread_key]
        runtime = await self._runtime_info(kit, run_runtime(owner)) if owner else None
        return ThreadInfo(
            thread_key=thread_key, owner=owner,
            runtime_id=(run_runtime(owner) or None) if owner else None,
            host=runtime.host if runtime else None, pid=runtime.pid if runtime else None,
            since=state.since if owner else None, pending=state.pending,
            last_activity=state.last, paused=state.paused, next_due=state.next_due,
        )

    async def threads(self, active: bool | None = None) -> list[ThreadInfo]:
        """Every thread the deployment knows, from any process: those with pending signals
        (owned or not), those owned by a live runtime (where the backend's registry lists
        them) and this process's own (``active=True``: owned only; ``False``: not owned
        only). Costs a few calls per thread: a listing, not a hot path."""
        kit = self._kit_open()
        runtimes = {r.runtime_id: r for r in await kit.registry.runtimes() if r.alive}
        keys: set[str] = set((await kit.core.due(limit=100_000, until=math.inf)).threads)
        keys.update(self._chains)
        for runtime_id in runtimes:
            keys.update(await kit.registry.runtime_threads(runtime_id))
        ordered = sorted(keys)
        states = await kit.core.describe(ordered)
        owners: dict[str, str | None] = {}
        limiter = anyio.Semaphore(32)

        async def owner_of(key: str) -> None:
            async with limiter:
                owners[key] = await self.leases.get_lease_owner(key)

        async with anyio.create_task_group() as tg:
            for key in ordered:
                tg.start_soon(owner_of, key)
        out = []
        for key in ordered:
            owner, state = owners[key], states[key]
            if active is not None and (owner is not None) != active:
                continue
            if owner is None and not state.pending:
                continue  # an idle thread with nothing to do: not worth listing
            owner_runtime = (run_runtime(owner) or None) if owner else None
            runtime = runtimes.get(owner_runtime or "")
            if runtime is None and owner_runtime is not None:
                runtime = await self._runtime_info(kit, owner_runtime)
            out.append(ThreadInfo(
                thread_key=key, owner=owner, runtime_id=owner_runtime,
                host=runtime.host if runtime else None, pid=runtime.pid if runtime else None,
                since=state.since if owner else None, pending=state.pending,
                last_activity=state.last, paused=state.paused, next_due=state.next_due,
            ))
        return out

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        """What became of ``signal_id`` on ``thread_key`` (``None``: unknown or past
        retention). Works from any process."""
        check_identifier("thread key", thread_key)
        check_identifier("signal id", signal_id)
        self._require_open()
        return await self.store.receipt(thread_key, signal_id)

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        """The signals of ``thread_key`` that failed ``max_attempts`` deliveries, oldest first."""
        check_identifier("thread key", thread_key)
        return await self._kit_open().core.dead_letters(thread_key,
                                                       limit=check_int("limit", limit))

    async def retry_dead_letters(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]:
        """Put dead-lettered signals back into the inbox (attempts from zero) and wake the
        thread; returns the ids that were dead letters."""
        check_identifier("thread key", thread_key)
        ids = [check_identifier("signal id", s) for s in _as_list("signal_ids", signal_ids)]
        kit = self._kit_open()
        retried = await kit.core.revive(thread_key, ids)
        if retried:
            await kit.notify(None, Notice("work", thread_key))
            chain = self._chains.get(thread_key)
            if chain is not None:
                chain.doorbell.ring()
        return retried

    async def purge_dead_letters(
        self, thread_key: str, signal_ids: Sequence[str] | None = None
    ) -> int:
        """Delete dead letters of ``thread_key`` (all of them by default); returns how many."""
        check_identifier("thread key", thread_key)
        ids = None if signal_ids is None else [
            check_identifier("signal id", s) for s in _as_list("signal_ids", signal_ids)
        ]
        return len(await self._kit_open().core.revive(thread_key, ids, purge=True))



def _as_list(name: str, values: object) -> list[object]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of signal ids, got {type(values).__name__}")
    return list(values)
