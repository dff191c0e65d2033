"""``InMemorySignalStore``: the store in one process's memory (lost when the process dies).

Every call does its whole change after one checkpoint, with no await inside it, so each call
is atomic; pure anyio (asyncio and trio). With its own :class:`~leases.InMemoryLeaseProvider`
it also offers the fused calls (``route``, ``release_if_idle``, ``claim_pending``), reading and
granting leases in the same step.

Over 400 lines on purpose: the whole store contract's reference semantics in one place.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.lowlevel

from _signal_leases.validation import check_int
from leases import InMemoryLeaseProvider
from signals._backends.memory.output import MemoryOutput
from signals._backends.memory.presence import MemoryPresence
from signals._model import EntryMode, Receipt, Signal
from signals._store import (
    CARRY_LIMIT,
    Accepted,
    Ack,
    Claim,
    DeadLetter,
    InboxEntry,
    InboxPage,
    Notice,
    PartIn,
    Routed,
    run_runtime,
)

if TYPE_CHECKING:
    from leases import LeaseProvider

__all__ = ["InMemorySignalStore"]

DAY_MS = 86_400_000


@dataclass(slots=True)
class _Entry:
    number: int
    signal: Signal
    mode: EntryMode
    size: int
    attempts: int = 0
    last_run: str | None = None


@dataclass(slots=True)
class _Thread:
    entries: dict[int, _Entry] = field(default_factory=dict)  # accept order
    since: float | None = None  # Unix time the current owning runtime took the thread
    last: float | None = None  # Unix time of the last accepted signal
    abort: str | None = None  # the last run asked to abort
    receipts: dict[str, tuple[Receipt, float]] = field(default_factory=dict)  # id -> (r, accepted)
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class InMemorySignalStore(MemoryOutput, MemoryPresence):
    """A :class:`~signals.SignalStore` in this process's memory.

    ``leases``: the in-memory lease provider the fused calls use (the runtime passes the one
    of the ``InMemoryPubSub`` it runs on). ``retention_ms`` / ``max_receipts``: how long and
    how many receipts per thread are kept (the dedup window). ``clock`` (monotonic seconds,
    default :func:`anyio.current_time`) measures retention, ages and presence.
    """

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
        self._clock: Callable[[], float] = clock if clock is not None else anyio.current_time
        self._threads: dict[str, _Thread] = {}
        self.stream_max_parts = check_int("stream_max_parts", stream_max_parts)
        self.stream_retention_ms = check_int("stream_retention_ms", stream_retention_ms)
        self._seq = 0
        MemoryPresence.__init__(self)
        MemoryOutput.__init__(self)

    # -- inbox -----------------------------------------------------------------------------

    def _thread(self, thread_key: str) -> _Thread:
        thread = self._threads.get(thread_key)
        if thread is None:
            thread = self._threads[thread_key] = _Thread()
        return thread

    def _trim_receipts(self, thread: _Thread, now: float) -> None:
        receipts = thread.receipts
        horizon = now - self.retention_ms / 1000
        while receipts:
            signal_id, (_, accepted_at) = next(iter(receipts.items()))
            if accepted_at > horizon and len(receipts) <= self.max_receipts:
                return
            del receipts[signal_id]

    def _accept(self, thread_key: str, signal: Signal, mode: EntryMode, index: bool) -> Accepted:
        now = self._clock()
        thread = self._thread(thread_key)
        self._trim_receipts(thread, now)
        known = thread.receipts.get(signal.id)
        if known is not None:
            return Accepted(False, None, known[0])
        self._seq += 1
        size = len(signal.encode())
        stored = signal.evolve(attempt=1, mode=mode)
        thread.entries[self._seq] = _Entry(self._seq, stored, mode, size)
        thread.receipts[signal.id] = (Receipt(signal.id, "pending", at=time.time()), now)
        thread.last = time.time()
        if index:
            self._index.setdefault(thread_key, now)
        return Accepted(True, str(self._seq), None)

    async def accept(self, thread_key: str, signal: Signal, mode: EntryMode) -> Accepted:
        await anyio.lowlevel.checkpoint()
        return self._accept(thread_key, signal, mode, index=True)

    async def read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100,
        max_bytes: int = 1 << 20, deliver_to: str | None = None, max_attempts: int = 5,
        skip_queued: bool = False,
    ) -> InboxPage:
        start = _number(after) if after is not None else 0
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        out: list[InboxEntry] = []
        total = 0
        for number, e in list(thread.entries.items()) if thread else ():
            if number <= start:
                continue
            if out and (len(out) >= limit or total + e.size > max_bytes):
                return InboxPage.of(out, True)
            delivered = 0
            if not out and deliver_to is not None and not (skip_queued and e.mode == "queue"):
                delivered = self._deliver(thread_key, number, deliver_to, max_attempts)
                if delivered == -2:
                    fenced = InboxEntry(str(number), e.signal, e.mode, e.attempts, e.size, -2)
                    return InboxPage.of([fenced], True)
            signal = e.signal.evolve(attempt=max(1, e.attempts))
            out.append(InboxEntry(str(number), signal, e.mode, e.attempts, e.size, delivered))
            total += e.size
        return InboxPage.of(out, False)

    async def deliver(
        self, thread_key: str, entry_id: str, signal_id: str, run_id: str, *, max_attempts: int
    ) -> int:
        number = _number(entry_id)
        await anyio.lowlevel.checkpoint()
        return self._deliver(thread_key, number, run_id, max_attempts)

    def _deliver(self, thread_key: str, number: int, run_id: str, max_attempts: int) -> int:
        thread = self._threads.get(thread_key)
        entry = thread.entries.get(number) if thread else None
        if thread is None or entry is None:
            return 0
        if not self._holds(thread_key, run_id):
            return -2
        if entry.last_run != run_id:
            entry.attempts += 1
            entry.last_run = run_id
            if entry.attempts <= max_attempts:
                data = json.dumps({"attempt": entry.attempts})
                self._append(thread_key, PartIn("signal.received", run_id, entry.signal.id, data))
        if entry.attempts <= max_attempts:
            return entry.attempts
        del thread.entries[number]
        sid = entry.signal.id
        error = thread.errors.pop(sid, None)
        thread.dead[sid] = DeadLetter(entry.signal, entry.attempts - 1, error, time.time())
        dead = Receipt(sid, "dead_lettered", run_id, error=error, at=time.time())
        self._set_receipt(thread, dead)
        info = json.dumps({"attempts": entry.attempts - 1, "error": error})
        self._append(thread_key, PartIn("signal.dead_lettered", run_id, sid, info))
        self._after_removal(thread_key, thread)
        return -1

    def _set_receipt(self, thread: _Thread, receipt: Receipt) -> None:
        accepted_at = thread.receipts.get(receipt.signal_id, (None, self._clock()))[1]
        thread.receipts[receipt.signal_id] = (receipt, accepted_at)

    def _after_removal(self, thread_key: str, thread: _Thread) -> None:
        if not thread.entries:
            self._index.pop(thread_key, None)

    def _holds(self, thread_key: str, run_id: str) -> bool:
        """False only when this store knows the leases and another run holds the thread."""
        if self.leases is None:
            return True
        owner = self.leases.table.owner(thread_key, self.leases.clock())
        return owner is None or owner == run_id

    async def ack_and_deliver(
        self, thread_key: str, acks: Sequence[Ack], next_entry: str | None, *, max_attempts: int
    ) -> tuple[bool, int]:
        """``ack``, then deliver ``next_entry`` to the same run, in one step."""
        ok = await self.ack(thread_key, acks)
        if not ok or next_entry is None:
            return ok, 0
        return True, self._deliver(thread_key, _number(next_entry), acks[0].run_id, max_attempts)

    async def ack(self, thread_key: str, acks: Sequence[Ack]) -> bool:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None or not acks:
            return True
        if not self._holds(thread_key, acks[0].run_id):
            return False
        for a in acks:
            if thread.entries.pop(_number(a.entry_id), None) is None:
                continue  # acknowledged before, cancelled or dead-lettered: keep that receipt
            thread.errors.pop(a.signal_id, None)
            result = json.loads(a.result) if a.result is not None else None
            done = Receipt(a.signal_id, "processed", a.run_id, result, at=time.time())
            self._set_receipt(thread, done)
            data = None if a.result is None else f'{{"result":{a.result}}}'
            self._append(thread_key, PartIn("signal.acked", a.run_id, a.signal_id, data))
        self._after_removal(thread_key, thread)
        return True

    async def note_failure(self, thread_key: str, signal_ids: Sequence[str], error: str) -> None:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is not None:
            thread.errors.update(dict.fromkeys(signal_ids, error))

    async def undeliver(self, thread_key: str, run_id: str, entry_ids: Sequence[str]) -> None:
        """Take back the hand-out counted for each entry last delivered to ``run_id``: the run
        read it ahead but never handed it to its agent (see ``Run.give_back``)."""
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        for entry_id in entry_ids if thread is not None else ():
            entry = thread.entries.get(_number(entry_id))  # type: ignore[union-attr]
            if entry is not None and entry.last_run == run_id and entry.attempts > 0:
                entry.attempts -= 1
                entry.last_run = None

    async def pending_count(self, thread_key: str) -> int:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        return len(thread.entries) if thread else 0

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return None
        self._trim_receipts(thread, self._clock())
        known = thread.receipts.get(signal_id)
        return known[0] if known else None

    # -- dead letters ----------------------------------------------------------------------

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        return list(thread.dead.values())[:limit] if thread else []

    async def retry_dead(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        retried: list[str] = []
        for sid in signal_ids:
            dead = thread.dead.pop(sid, None) if thread else None
            if thread is None or dead is None:
                continue
            self._seq += 1
            thread.entries[self._seq] = _Entry(self._seq, dead.signal, dead.signal.mode,
                                               len(dead.signal.encode()))
            self._set_receipt(thread, Receipt(sid, "pending", at=time.time()))
            self._index.setdefault(thread_key, self._clock())
            retried.append(sid)
        return retried

    async def purge_dead(self, thread_key: str, signal_ids: Sequence[str] | None = None) -> int:
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return 0
        ids = [s for s in (thread.dead if signal_ids is None else signal_ids) if s in thread.dead]
        for sid in ids:
            del thread.dead[sid]
        return len(ids)

    # -- fused calls (with this store's own lease provider) ---------------------------------

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider this store was built with."""
        return self.leases is not None and leases is self.leases

    def _table(self) -> tuple[InMemoryLeaseProvider, float]:
        assert self.leases is not None, "fused calls need leases="
        return self.leases, self.leases.clock()

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool,
    ) -> Routed:
        await anyio.lowlevel.checkpoint()
        leases, now = self._table()
        accepted = self._accept(thread_key, signal, mode, index=False)
        owner = leases.table.owner(thread_key, now)
        if not accepted.fresh:
            return Routed(False, None, accepted.receipt, owner)
        if owner is not None:
            carried = None
            if mode == "deliver":
                carried = self._carry(thread_key, accepted.entry_id, owner)
            if run_runtime(owner) != sender:
                notice = Notice("signal", thread_key, owner, entry=carried)
                self._notify(run_runtime(owner), notice)
            return Routed(True, accepted.entry_id, None, owner, carried=carried is not None)
        if claim is not None:
            got = leases.table.acquire(thread_key, claim.owner, claim.ttl_ms, now, claim.session)
            if got.acquired:
                self._track(claim.runtime_id, (thread_key,), ())
                self._thread(thread_key).since = time.time()
                return Routed(True, accepted.entry_id, None, claim.owner, True, got.token)
        self._index.setdefault(thread_key, self._clock())
        if wake_workers:
            self._notify(None, Notice("work", thread_key))
        return Routed(True, accepted.entry_id, None, None)

    def _carry(self, thread_key: str, entry_id: str | None, owner: str) -> InboxEntry | None:
        """Deliver a fresh small entry to the owner's run now (see ``FusedSignalStore``)."""
        thread = self._threads[thread_key]
        entry = thread.entries.get(_number(entry_id or "0"))
        if entry is None or entry.size > CARRY_LIMIT:
            return None
        entry.attempts, entry.last_run = 1, owner
        self._append(thread_key, PartIn("signal.received", owner, entry.signal.id,
                                        '{"attempt":1}'))
        return InboxEntry(str(entry.number), entry.signal, "deliver", 1, entry.size, delivered=1)

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        await anyio.lowlevel.checkpoint()
        leases, now = self._table()
        thread = self._threads.get(thread_key)
        if thread is not None and thread.entries:
            return False
        leases.table.release(thread_key, owner, now)
        self._track(runtime_id, (), (thread_key,))
        return True

    async def claim_pending(self, thread_key: str, claim: Claim) -> Routed:
        await anyio.lowlevel.checkpoint()
        leases, now = self._table()
        thread = self._threads.get(thread_key)
        if thread is None or not thread.entries:
            self._index.pop(thread_key, None)
            return Routed(empty=True)
        owner = leases.table.owner(thread_key, now)
        if owner is None:
            got = leases.table.acquire(thread_key, claim.owner, claim.ttl_ms, now, claim.session)
            if not got.acquired:
                return Routed()
            self._track(claim.runtime_id, (thread_key,), ())
            self._index.pop(thread_key, None)
            thread.since = time.time()
            return Routed(owner=claim.owner, claimed=True, token=got.token)
        info = leases.table.info(thread_key, now)
        left = info.ttl_ms_remaining if info is not None else None
        self._defer(thread_key, left if left is not None else claim.ttl_ms)
        return Routed(owner=owner)


    # -- control: abort and cancel -----------------------------------------------------------

    def _owner(self, thread_key: str) -> str | None:
        if self.leases is None:
            return None
        return self.leases.table.owner(thread_key, self.leases.clock())

    def _withdraw(self, thread_key: str, thread: _Thread, number: int, run_id: str) -> None:
        entry = thread.entries.pop(number)
        thread.errors.pop(entry.signal.id, None)
        self._set_receipt(thread, Receipt(entry.signal.id, "cancelled", run_id or None,
                                          at=time.time()))
        self._append(thread_key, PartIn("signal.cancelled", run_id, entry.signal.id))

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        """Abort ``run_id`` (default: the live owner) if it holds the thread (checked against
        this store's leases when it has them; else ``run_id`` is trusted)."""
        await anyio.lowlevel.checkpoint()
        run = run_id
        if self.leases is not None:
            owner = self._owner(thread_key)
            if owner is None or (run_id is not None and owner != run_id):
                return None
            run = owner
        if not run:
            return None
        thread = self._thread(thread_key)
        thread.abort = run
        if clear:
            for number in list(thread.entries):
                self._withdraw(thread_key, thread, number, run)
            self._after_removal(thread_key, thread)
        self._notify(run_runtime(run), Notice("abort", thread_key, run, reason))
        return run

    async def cancel(
        self, thread_key: str, signal_ids: Sequence[str], *, in_flight_run: str | None = None
    ) -> list[str]:
        """Withdraw pending signals no live run holds; returns the ids withdrawn."""
        await anyio.lowlevel.checkpoint()
        thread = self._threads.get(thread_key)
        if thread is None:
            return []
        owner = self._owner(thread_key) if self.leases is not None else in_flight_run
        wanted = set(signal_ids)
        removed: list[str] = []
        for number, entry in list(thread.entries.items()):
            if entry.signal.id in wanted and (owner is None or entry.last_run != owner):
                self._withdraw(thread_key, thread, number, "")
                removed.append(entry.signal.id)
        self._after_removal(thread_key, thread)
        return [s for s in signal_ids if s in removed]

    async def thread_meta(self, thread_keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per thread: ``since``, ``last``, ``abort`` and ``pending`` (see the Redis store)."""
        await anyio.lowlevel.checkpoint()
        out: dict[str, dict[str, Any]] = {}
        for key in thread_keys:
            t = self._threads.get(key)
            out[key] = {"since": t.since if t else None, "last": t.last if t else None,
                        "abort": t.abort if t else None, "pending": len(t.entries) if t else 0}
        return out


def _number(entry_id: str) -> int:
    try:
        return int(entry_id)
    except (TypeError, ValueError):
        raise ValueError(f"not an entry id of this inbox: {entry_id!r}") from None
