"""``Run``: what the agent receives. It takes signals from the thread's inbox, one hand-out at
a time, and acknowledges explicitly."""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from _signal_leases.aio import loop_time, retry_unavailable, unix_now
from _signal_leases.errors import BackendUnavailableError
from _signal_leases.validation import check_str
from signals._doorbell import Doorbell
from signals._model import Signal, encode_json, fold
from signals._schedules import TICK_PREFIX
from signals._telemetry import HandOutSpans
from signals.kit._capabilities import PartIn
from signals.kit._core import Ack, RunRef

if TYPE_CHECKING:
    from signals._telemetry import Telemetry
    from signals.kit._core import InboxEntry, Taken
    from signals.kit._store import KitStore

__all__ = ["Doorbell", "Reducer", "Run"]  # Doorbell: re-exported

Reducer = Callable[[list[Signal]], Any]
"""``fn(signals) -> payload``: folds the pending signals of a ``coalesce`` lane into one."""

_ORDER = itertools.count()
#: Signal ids a run remembers as acknowledged (a second ack of one is a no-op; a notice that
#: carries one late is dropped); older ones are forgotten, so a long run's memory is bounded.
_KEEP_ACKED = 10_000
FIRST_IDS = 3  # signal ids a run keeps of what it handed out (Run.first_ids)


def _key(entry: InboxEntry) -> tuple[int, int, int]:
    """Hand-out order inside a run's buffer: priority, then the entry's number."""
    try:
        number = int(entry.entry_id)
    except ValueError:
        number = 1 << 62
    return -entry.signal.priority, number, next(_ORDER)


@dataclass(slots=True)
class _Unit:
    """What the agent was handed as one signal: one entry, or a folded lane."""

    signal: Signal
    entries: tuple[InboxEntry, ...]
    span: Any = None  # the telemetry's process span of this hand-out (None: tracing off)


class Run:
    """One run of the agent on a thread, holding the thread's lease.

    ``run_id`` is the lease owner; ``token`` the fencing token of the grant (``None`` with the
    no-op provider): pass it to the storage you write to, so a stale owner's writes are refused.

    Iterate the run (``async for signal in run``) or call :meth:`next_signal` to get the
    thread's pending signals: the one that woke it, then follow-ups delivered while it runs,
    higher priority first, in accept order within a priority. The iteration ends when nothing
    arrives within the runtime's ``idle_wait_ms``, or at a signal sent with
    ``if_active="queue"`` (that one starts the next run). The pending signals of a
    ``coalesce`` lane come as one signal, folded by the runtime's reducer for the lane; its
    ``folded`` lists the ids it stands for.

    Commit is explicit: a signal handed out stays pending until :meth:`ack`, or until the
    agent returns normally (then every signal handed out is acknowledged). Asking for the next
    signal, or peeking with ``next_signal(timeout=0)``, commits nothing. If the agent raises,
    is cancelled (lease lost, abort, timeout, shutdown) or its process dies, the next run gets
    the unacknowledged signals again, with ``Signal.attempt`` increased.

    While the backend is unreachable, takes and acknowledgements are retried (with backoff)
    for as long as the run holds its lease; they never fail the agent on a transient outage.
    """

    def __init__(
        self,
        *,
        run_id: str,
        thread_key: str,
        token: int | None,
        store: KitStore,
        doorbell: Doorbell,
        idle_wait_s: float,
        max_attempts: int,
        max_bytes: int,
        reducers: Mapping[str, Reducer] | None = None,
        on_dead_letter: Callable[[str], None] | None = None,
        on_fenced: Callable[[], None] | None = None,
        on_tick: Callable[[str, Signal], Awaitable[bool]] | None = None,
        telemetry: Telemetry | None = None,
        taken_over: bool = False,
    ) -> None:
        self.run_id = run_id
        self._taken_over = taken_over
        self._spans = HandOutSpans(telemetry) if telemetry is not None else None
        self.thread_key = thread_key
        self.token = token
        self.interrupted = False
        self.ended = False  # set by the chain once the agent returned or failed
        self._ref = RunRef(run_id, token)
        self._store = store
        self._doorbell = doorbell
        self._idle_wait_s = idle_wait_s
        self._max_attempts = max_attempts
        self._max_bytes = max_bytes
        self._reducers = reducers or {}
        self._on_dead_letter = on_dead_letter
        self._on_fenced = on_fenced
        self._on_tick = on_tick
        self._primed: Signal | None = None
        self._buffer: list[tuple[tuple[int, int, int], InboxEntry]] = []  # taken, not handed
        self._grouped: list[tuple[InboxEntry, ...]] = []  # a coalesced lane taken, not handed
        self._queued: set[str] = set()  # the signal ids in _buffer and _grouped
        self._unacked: dict[str, _Unit] = {}  # signal id -> unit, in hand-out order
        # the last _KEEP_ACKED signal ids acknowledged (a second ack, a late notice)
        self._acked: OrderedDict[str, None] = OrderedDict()
        self._stopped = False
        self._more = True  # the inbox may hold ready entries this run has not taken yet
        self._taking = False
        self._next_due: float | None = None
        self._inbox_pending = 0  # the thread's unacknowledged entries, as of the last take
        self._paused = False  # the thread was paused: hand out nothing more
        self._winding_down = False  # the runtime is leaving: wait for nothing new
        self._carried: set[str] = set()  # carried to this run by a notice, left in the core
        self._consumed = 0  # signals handed to the agent
        self._first_ids: list[str] = []  # the first few of them (a run's end line names them)

    @property
    def consumed(self) -> int:
        """How many signals this run has handed to the agent."""
        return self._consumed

    @property
    def first_ids(self) -> Sequence[str]:
        """The ids of the first signals handed out, at most three (what a run's end line
        names): a run may live for ever, and keeps no more of what it handed out."""
        return self._first_ids

    @property
    def pending(self) -> int:
        """The thread's signals not yet acknowledged, as of the run's last take (less what it
        acknowledged since), or those it holds, whichever is more (the ``signals.pending``
        gauge)."""
        return max(len(self._buffer) + len(self._unacked), self._inbox_pending)

    @property
    def unacked(self) -> list[Signal]:
        """Signals handed out and not yet acknowledged, in order."""
        return [u.signal for u in self._unacked.values()]

    @property
    def more(self) -> bool:
        """Ready work may be left for a next run (the chain's handoff uses it)."""
        if self._paused:
            return False
        return self._more or self._stopped or bool(self._buffer) or bool(self._grouped)

    def wind_down(self) -> None:
        """The runtime is leaving: stop waiting for new signals (what was taken is still
        handed out; the iteration then ends)."""
        self._winding_down = True
        self._doorbell.wake()

    def pause(self) -> None:
        """The thread was paused: hand out nothing more (what was taken goes back)."""
        self._paused = True
        self._doorbell.wake()

    def __aiter__(self) -> Run:
        return self

    async def __anext__(self) -> Signal:
        signal = await self.next_signal()
        if signal is None:
            raise StopAsyncIteration
        return signal

    async def next_signal(self, timeout: float | None = None) -> Signal | None:
        """The next signal for this run, or ``None`` when there is none within ``timeout``
        seconds (default: the runtime's ``idle_wait_ms``; ``0`` only looks), or when the run
        reached a signal queued for a run of its own. Commits nothing."""
        while True:
            signal = await self._next_signal(timeout)
            if signal is None or self._on_tick is None or not signal.id.startswith(TICK_PREFIX):
                return signal
            if await self._on_tick(self.thread_key, signal):  # a schedule's tick: chain it
                return signal
            await self.ack(signal, result={"skipped": "a missed tick (catch_up='none')"})

    async def _next_signal(self, timeout: float | None) -> Signal | None:
        if self._primed is not None:
            signal, self._primed = self._primed, None
            return signal
        deadline: float | None = None  # read once a signal is not at hand (most often it is)
        while True:
            if self._paused:
                return None
            handed = self._hand_out()
            if handed is not None:
                return handed
            if deadline is None:
                deadline = loop_time() + (
                    self._idle_wait_s if timeout is None else max(0.0, timeout))
            if self._stopped:
                return None
            if self._more or self._doorbell.take():
                await self._take()
                continue
            remaining = deadline - loop_time()
            if remaining <= 0 or self._winding_down:
                return None
            due = self._next_due
            await self._doorbell.wait(remaining if due is None
                                      else min(remaining, max(0.0, due - unix_now())))
            if due is not None and unix_now() >= due:
                self._more = True  # a signal came due: take it

    @property
    def next_due(self) -> float | None:
        """Unix time the thread's earliest signal not due yet comes due (by the last take)."""
        return self._next_due

    def _hand_out(self) -> Signal | None:
        """The best unit taken or carried, now handed to the agent (no store call)."""
        if self._grouped:
            group = self._grouped.pop(0)
            self._queued.difference_update(e.signal.id for e in group)
            return self._give(group)
        while self._buffer:
            _, entry = heapq.heappop(self._buffer)
            self._queued.discard(entry.signal.id)
            expires = entry.signal.expires_at
            if expires is not None and expires <= unix_now() and entry.state == "carried":
                self._more = True  # the core withdraws it on the next take
                continue
            return self._give((entry,))
        return None

    def _give(self, entries: tuple[InboxEntry, ...]) -> Signal:
        last = entries[-1]
        if len(entries) == 1 and not (last.signal.lane is not None
                                      and last.signal.merge == "coalesce"):
            signal = last.signal.evolve(attempt=max(1, last.attempts))
        else:
            signal = fold([e.signal for e in entries], self._reducers.get(last.signal.lane or ""),
                          attempt=max(max(1, e.attempts) for e in entries), mode=last.mode)
        unit = self._unacked[signal.id] = _Unit(signal, entries)
        if self._spans is not None:
            unit.span = self._spans.start(self.thread_key, self.run_id, signal, entries,
                                          taken_over=self._taken_over)
        self._consumed += 1
        if len(self._first_ids) < FIRST_IDS:
            self._first_ids.append(signal.id)
        return signal

    def end_spans(self, error: str | None) -> None:
        """The run ended: end the spans of what it never acknowledged (``error``: why)."""
        if self._spans is not None:
            self._spans.end_all([u.span for u in self._unacked.values()], error)
            for unit in self._unacked.values():
                unit.span = None

    def offer(self, entry: InboxEntry) -> bool:
        """Take an entry a notice carried (already carried to this run): it goes straight
        into the buffer when the run has taken everything ready (so nothing better is left
        in the inbox); otherwise a take is due, which returns it in its place."""
        if self._holds(entry.signal.id):
            return True  # a take returned it before the notice came: nothing to do
        if self._taking or self._more or self._stopped or self._doorbell.rung or self.ended:
            self._carried.add(entry.signal.id)  # a take returns it; else it is given back
            self._doorbell.ring()
            return False
        heapq.heappush(self._buffer, (_key(entry), entry))
        self._queued.add(entry.signal.id)
        self._doorbell.wake()
        return True

    def note_carried(self, signal_id: str) -> None:
        """A notice carried ``signal_id`` to this run before it started: a take returns it,
        or the run gives it back at its end."""
        self._carried.add(signal_id)

    async def prime(self) -> Signal | None:
        """Hand out the first pending signal before the agent starts (the one that woke the
        run): an agent that never reads still takes it (and commits it by returning)."""
        self._primed = await self.next_signal(timeout=0)
        return self._primed

    async def _fenced(self) -> None:
        """Another run holds the thread now: this one is cancelled (never returns normally)."""
        if self._on_fenced is not None:
            self._on_fenced()
        await anyio.lowlevel.checkpoint()  # the cancellation lands here
        raise RuntimeError(f"run {self.run_id} no longer holds thread {self.thread_key!r}")

    async def _take(self, acks: list[Ack] | None = None) -> Taken:
        """Take the next hand-out (acknowledging ``acks`` in the same call)."""
        self._doorbell.take()
        self._taking = True
        try:
            taken = await retry_unavailable(
                lambda: self._store.take(self.thread_key, self._ref, acks=acks or (),
                                         max_attempts=self._max_attempts,
                                         first=not self._consumed)
            )
        finally:
            self._taking = False
        if taken.fenced:
            await self._fenced()
        for sid in taken.dead:
            if self._on_dead_letter is not None:
                self._on_dead_letter(sid)
        self._stopped = taken.stopped
        self._more = taken.more
        self._paused = taken.paused
        self._next_due = taken.next_due
        if taken.pending is not None:
            self._inbox_pending = taken.pending
        entries = taken.entries
        if len(entries) > 1 or (entries and entries[0].signal.merge == "coalesce"
                                and entries[0].signal.lane is not None):
            ids = {e.signal.id for e in entries}
            if not ids.isdisjoint(self._queued):  # a notice carried one of them
                self._buffer = [item for item in self._buffer if item[1].signal.id not in ids]
                heapq.heapify(self._buffer)
            self._grouped.append(entries)
            self._queued.update(ids)
        elif entries and not self._holds(entries[0].signal.id):
            heapq.heappush(self._buffer, (_key(entries[0]), entries[0]))
            self._queued.add(entries[0].signal.id)
        return taken

    def _holds(self, signal_id: str) -> bool:
        """This run has ``signal_id`` already (taken, carried or handed out): a notice and
        a take can both bring one entry carried to this run, in either order."""
        return signal_id in self._unacked or signal_id in self._acked or signal_id in self._queued

    async def emit(
        self, data: Any, kind: str = "part", *, signal: Signal | str | None = None
    ) -> str:
        """Append ``data`` (JSON, at most the runtime's ``max_signal_bytes``) to the thread's
        output stream as a part of ``kind``; returns its cursor. Readers anywhere see it
        through ``SignalRuntime.stream``. ``signal`` links the part to a signal (or its id)."""
        check_str("kind", kind)
        encoded = encode_json(data, f"{kind} part of thread {self.thread_key!r}", self._max_bytes)
        signal_id = signal.id if isinstance(signal, Signal) else signal
        part = PartIn(kind, self.run_id, signal_id, encoded)
        [cursor] = await retry_unavailable(lambda: self._store.emit(self.thread_key, [part]))
        return cursor

    def _acks(self, unit: _Unit, result: str | None) -> list[Ack]:
        return [Ack(e.entry_id, e.signal.id, result) for e in unit.entries]

    async def ack(self, signal: Signal | str, result: Any = None) -> None:
        """Acknowledge ``signal`` (or its id): it leaves the inbox for good and its receipt
        becomes ``processed`` with ``result`` (JSON, at most the runtime's
        ``max_signal_bytes``); a folded signal acknowledges every signal it stands for, with
        the same result. Acknowledging twice is a no-op (within the run's last 10,000
        acknowledgements)."""
        signal_id = signal.id if isinstance(signal, Signal) else signal
        unit = self._unacked.get(signal_id)
        if unit is None:
            if signal_id in self._acked:
                return  # acknowledged before
            raise ValueError(f"signal {signal_id!r} was not handed to this run")
        encoded = None if result is None else encode_json(
            result, f"result of signal {signal_id!r}", self._max_bytes
        )
        acks = self._acks(unit, encoded)
        if self._more and not self._buffer and not self._grouped and not self._stopped:
            await self._take(acks)  # the next hand-out in the same call
        else:
            await self._settle(acks)
        self._unacked.pop(signal_id, None)
        entries = unit.entries
        self._done((signal_id,) if len(entries) == 1 and entries[0].signal.id == signal_id
                   else [signal_id, *(e.signal.id for e in entries)])
        self._span_done(unit)

    async def _settle(self, acks: list[Ack]) -> None:
        """Acknowledge ``acks`` in the store, retried while it is unavailable (the first try
        made here, not through the retry helper's coroutine: it is every ack's)."""
        try:
            settled = await self._store.settle(self.thread_key, self._ref, acks=acks)
        except BackendUnavailableError:
            settled = await retry_unavailable(
                lambda: self._store.settle(self.thread_key, self._ref, acks=acks))
        if not settled:
            await self._fenced()
        self._inbox_pending = max(0, self._inbox_pending - len(acks))

    def _done(self, signal_ids: Iterable[str]) -> None:
        """``signal_ids`` were acknowledged: remembered (the last ``_KEEP_ACKED``, so that a
        long run's memory stays bounded) and no longer carried."""
        acked = self._acked
        for sid in signal_ids:
            acked[sid] = None
            acked.move_to_end(sid)
            self._carried.discard(sid)
        while len(acked) > _KEEP_ACKED:
            acked.popitem(last=False)

    def _span_done(self, unit: _Unit) -> None:
        if self._spans is not None:
            self._spans.end(unit.span)
            unit.span = None

    async def ack_all(self) -> None:
        """Acknowledge every signal handed out and not yet acknowledged (the runtime calls
        this when the agent returns normally)."""
        if self._unacked:
            acks = [a for u in self._unacked.values() for a in self._acks(u, None)]
            await self._settle(acks)
            self._done([*self._unacked, *(a.signal_id for a in acks)])
            for unit in self._unacked.values():
                self._span_done(unit)
            self._unacked.clear()

    def unhanded(self) -> list[str]:
        """Signal ids this run took (or was carried) and never handed to its agent."""
        ids = [e.signal.id for _, e in self._buffer]
        ids += [e.signal.id for group in self._grouped for e in group]
        handed = {e.signal.id for u in self._unacked.values() for e in u.entries}
        ids += [sid for sid in self._carried if sid not in handed and sid not in self._acked
                and sid not in ids]
        return ids

    def failed_ids(self) -> list[str]:
        """The ids of the signals handed out and not acknowledged (folded ones included)."""
        return [e.signal.id for u in self._unacked.values() for e in u.entries]

    def forget(self) -> None:
        """What the run took is settled (by the chain): drop it."""
        self._buffer.clear()
        self._grouped.clear()
        self._queued.clear()

