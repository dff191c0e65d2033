"""``InMemorySignalStore``: the core in one process's memory (lost when the process dies).

The twelve core methods are the reference engine (``signals.kit._engine``) over dicts and heaps
(``tables``), called inline: each call does its whole change after one checkpoint with no
``await`` inside, so it is atomic; pure anyio (asyncio and trio). It also has every optional
capability: notices and the registry (``presence``), output streams (``output``), and, with
its own :class:`~leases.InMemoryLeaseProvider`, the fused calls. The two calls of every routed
signal skip the engine when they can (``quick``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from _signal_leases.aio import checkpoint, unix_now
from _signal_leases.validation import check_int
from leases import InMemoryLeaseProvider, LeaseProvider
from signals._backends.memory.output import MemoryOutput
from signals._backends.memory.presence import MemoryPresence
from signals._backends.memory.quick import carry, settle_acks
from signals._backends.memory.tables import MemoryState, MemoryTables
from signals._model import EntryMode, Receipt, Signal
from signals.kit._capabilities import Claim, Claimed, Routed
from signals.kit._core import (
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    Due,
    InboxEntry,
    Limits,
    RunRef,
    Taken,
    ThreadState,
)
from signals.kit._engine import Engine, Outbox

__all__ = ["InMemorySignalStore"]

DAY_MS = 86_400_000


class InMemorySignalStore(MemoryOutput, MemoryPresence):
    """A :class:`~signals.kit.SignalCore` (with every capability) in this process's memory.

    ``leases``: the in-memory lease provider the fused calls read and grant (the runtime passes
    the one of the ``InMemoryPubSub`` it runs on). ``retention_ms`` / ``max_receipts``: how
    long and how many receipts per thread are kept (the dedup window). ``stream_max_parts`` /
    ``stream_retention_ms``: what each thread's output stream keeps. ``clock``: Unix time in
    seconds (default: the event loop's clock, anchored to Unix time, so a mock clock moves it).

    ``quick_paths``: route a plain signal to a live run, and settle a run's acknowledgements,
    over the dicts directly (:mod:`signals._backends.memory.quick`) rather than through the
    engine; the same effect, a third less work per routed signal. Off only to compare.
    """

    quick_paths = True

    def __init__(
        self,
        *,
        leases: InMemoryLeaseProvider | None = None,
        retention_ms: int = DAY_MS,
        max_receipts: int = 10_000,
        stream_max_parts: int = 10_000,
        stream_retention_ms: int = DAY_MS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.leases = leases
        self.retention_ms = check_int("retention_ms", retention_ms)
        self.max_receipts = check_int("max_receipts", max_receipts)
        self.stream_max_parts = check_int("stream_max_parts", stream_max_parts)
        self.stream_retention_ms = check_int("stream_retention_ms", stream_retention_ms)
        self._clock: Callable[[], float] = clock if clock is not None else unix_now
        self.engine = Engine(retention_ms=retention_ms, max_receipts=max_receipts)
        self._state = MemoryState()
        MemoryPresence.__init__(self)
        MemoryOutput.__init__(self)

    def _t(self, *, fused: bool = False) -> MemoryTables:
        return MemoryTables(self._state, self._clock(), self, self.leases if fused else None)

    def _send(self, outbox: Outbox) -> None:
        for runtime_id, notice in outbox.notices:
            self._notify(runtime_id, notice)

    # -- the core ---------------------------------------------------------------------------

    async def accept(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, limits: Limits = NO_LIMITS
    ) -> Accepted:
        await checkpoint()
        return self.engine.accept(self._t(), thread_key, signal, mode, limits)[0]

    async def take(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (), max_attempts: int,
        first: bool = False,
    ) -> Taken:
        await checkpoint()
        return self.engine.take(self._t(fused=True), thread_key, run, acks, max_attempts, first)

    async def settle(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
        failed: Sequence[str] = (), returned: Sequence[str] = (), error: str | None = None,
    ) -> bool:
        await checkpoint()
        if self.quick_paths and not failed and not returned:
            done = settle_acks(self, thread_key, run, acks)
            if done is not None:
                return done
        return self.engine.settle(self._t(fused=True), thread_key, run, acks, failed, returned,
                                  error)

    async def withdraw(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, held: bool = False
    ) -> list[str]:
        await checkpoint()
        return self.engine.withdraw(self._t(), thread_key, signal_ids, held)

    async def entries(
        self, thread_key: str, *, limit: int = 100, offset: int = 0
    ) -> list[InboxEntry]:
        await checkpoint()
        return self.engine.entries(self._t(), thread_key, limit, offset)

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        await checkpoint()
        return self.engine.receipt(self._t(), thread_key, signal_id)

    async def due(self, *, limit: int = 100, until: float | None = None) -> Due:
        await checkpoint()
        return self.engine.due(self._t(), limit, until)

    async def look_at(self, thread_key: str, at: float) -> None:
        await checkpoint()
        self.engine.look_at(self._t(), thread_key, at)

    async def pause(self, thread_key: str, paused: bool) -> bool:
        await checkpoint()
        return self.engine.pause(self._t(), thread_key, paused)

    async def describe(self, thread_keys: Sequence[str]) -> dict[str, ThreadState]:
        await checkpoint()
        return self.engine.describe(self._t(), thread_keys)

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        await checkpoint()
        return self.engine.dead_letters(self._t(), thread_key, limit)

    async def revive(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, purge: bool = False
    ) -> list[str]:
        await checkpoint()
        return self.engine.revive(self._t(), thread_key, signal_ids, purge)

    # -- fused calls (with this store's own lease provider) ---------------------------------

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider this store was built with."""
        return self.leases is not None and leases is self.leases

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool, limits: Limits = NO_LIMITS,
        interrupt: bool = False,
    ) -> Routed:
        await checkpoint()
        if self.quick_paths:
            quick = carry(self, thread_key, signal, mode, limits, interrupt, sender)
            if quick is not None:
                return quick
        outbox = Outbox()
        routed = self.engine.route(self._t(fused=True), thread_key, signal, mode, claim, sender,
                                   wake_workers, limits, outbox, interrupt)
        self._send(outbox)
        return routed

    async def claim(self, thread_key: str, claim: Claim) -> Claimed:
        await checkpoint()
        outbox = Outbox()
        claimed = self.engine.claim(self._t(fused=True), thread_key, claim, outbox)
        self._send(outbox)
        return claimed

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        await checkpoint()
        return self.engine.release_if_idle(self._t(fused=True), thread_key, owner)

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        await checkpoint()
        outbox = Outbox()
        run = self.engine.abort(self._t(fused=True), thread_key, run_id, reason, clear, outbox)
        self._send(outbox)
        return run
