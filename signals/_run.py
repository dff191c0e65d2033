"""``Run``: what the agent receives. It reads the thread's inbox and acknowledges explicitly."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from _signal_leases.aio import retry_unavailable
from _signal_leases.validation import check_str
from signals._model import Signal, encode_json
from signals._store import Ack, PartIn

if TYPE_CHECKING:
    from signals._store import InboxEntry, SignalStore

__all__ = ["Doorbell", "Run", "RunInfo"]

#: How many inbox entries a run reads ahead at once, and how many bytes at most.
READ_BATCH = 64
READ_BYTES = 1 << 20
_GONE = -3  # a buffered entry found gone when it was delivered ahead


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A snapshot of the run this process has on a thread (see ``SignalRuntime.active_run``).

    ``token`` is the fencing token of the run's lease (``None`` with the no-op provider);
    ``started_at`` is Unix time in seconds; ``runs`` counts the runs of the chain so far (1 for
    the run that woke the thread, +1 per handoff).
    """

    run_id: str
    thread_key: str
    token: int | None
    started_at: float
    runs: int


class Doorbell:
    """Wakes a run that waits for input: rung by local senders and by store notices.

    A ring is remembered until the next :meth:`wait` (so a ring between a read and the wait
    is never lost). No task and no timer: an idle run costs an event object.
    """

    __slots__ = ("_event", "_rung")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self._rung = False

    def ring(self) -> None:
        """New input the run must read."""
        self._rung = True
        self.wake()

    def wake(self) -> None:
        """Wake a waiting run without asking it to read (it was handed input directly)."""
        if self._event is not None:
            self._event.set()

    def take(self) -> bool:
        """Consume a pending ring; ``True`` if there was one."""
        rung, self._rung = self._rung, False
        return rung

    @property
    def rung(self) -> bool:
        """A ring is pending (a read is due)."""
        return self._rung

    async def wait(self, timeout: float) -> None:
        """Return at the next ring or wake (at once if a ring is pending), or after ``timeout``
        seconds."""
        if self._rung:
            return
        self._event = anyio.Event()
        try:
            with anyio.move_on_after(timeout):
                await self._event.wait()
        finally:
            self._event = None


class Run:
    """One run of the agent on a thread, holding the thread's lease.

    ``run_id`` is the lease owner; ``token`` the fencing token of the grant (``None`` with the
    no-op provider): pass it to the storage you write to, so a stale owner's writes are refused.

    Iterate the run (``async for signal in run``) or call :meth:`next_signal` to get the
    thread's pending signals in order: the one that woke it, then follow-ups delivered while
    it runs. The iteration ends when nothing arrives within the runtime's ``idle_wait_ms``, or
    at a signal sent with ``if_active="queue"`` (that one starts the next run).

    Commit is explicit: a signal handed out stays pending until :meth:`ack`, or until the
    agent returns normally (then every signal handed out is acknowledged). Asking for the next
    signal, or peeking with ``next_signal(timeout=0)``, commits nothing. If the agent raises,
    is cancelled (lease lost, abort, timeout, shutdown) or its process dies, the next run gets
    the unacknowledged signals again, with ``Signal.attempt`` increased.

    While the backend is unreachable, reads and acknowledgements are retried (with backoff)
    for as long as the run holds its lease; they never fail the agent on a transient outage.
    """

    def __init__(
        self,
        *,
        run_id: str,
        thread_key: str,
        token: int | None,
        store: SignalStore,
        doorbell: Doorbell,
        idle_wait_s: float,
        max_attempts: int,
        max_bytes: int,
        on_dead_letter: Callable[[InboxEntry], None] | None = None,
        on_fenced: Callable[[], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.thread_key = thread_key
        self.token = token
        self.interrupted = False
        self.ended = False  # set by the chain once the agent returned or failed
        self._store = store
        self._doorbell = doorbell
        self._idle_wait_s = idle_wait_s
        self._max_attempts = max_attempts
        self._max_bytes = max_bytes
        self._on_dead_letter = on_dead_letter
        self._on_fenced = on_fenced
        self._primed: Signal | None = None
        self._cursor: str | None = None
        self._buffer: deque[InboxEntry] = deque()
        self._unacked: dict[str, InboxEntry] = {}  # signal id -> entry, in hand-out order
        self._stopped = False
        self._more = True  # the inbox may hold entries this run has not read yet
        self._reading = False
        self.handed: list[Signal] = []
        self._charged: dict[str, None] = {}  # entries the store counted a hand-out to us for
        self._handed_entries: set[str] = set()

    @property
    def consumed(self) -> int:
        """How many signals this run has handed to the agent."""
        return len(self.handed)

    @property
    def unacked(self) -> list[Signal]:
        """Signals handed out and not yet acknowledged, in order."""
        return [e.signal for e in self._unacked.values()]

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
        if self._primed is not None:
            signal, self._primed = self._primed, None
            return signal
        if self._stopped:
            return None
        wait_s = self._idle_wait_s if timeout is None else max(0.0, timeout)
        deadline = anyio.current_time() + wait_s
        while True:
            if not self._buffer and (self._more or self._doorbell.take()):
                await self._read_ahead()
            while self._buffer:
                entry = self._buffer[0]
                if entry.mode == "queue" and self.handed:
                    self._stopped = True  # it starts the next run; leave it in the inbox
                    return None
                self._buffer.popleft()
                self._cursor = entry.entry_id
                attempt = entry.delivered or await retry_unavailable(
                    lambda e=entry: self._store.deliver(  # type: ignore[misc]
                        self.thread_key, e.entry_id, e.signal.id, self.run_id,
                        max_attempts=self._max_attempts,
                    )
                )
                if attempt == -2:
                    await self._fenced()
                if attempt in (0, _GONE):
                    continue  # acknowledged, cancelled or dead-lettered meanwhile
                if attempt < 0:
                    if self._on_dead_letter is not None:
                        self._on_dead_letter(entry)
                    continue
                signal = entry.signal.evolve(attempt=attempt)
                self._handed_entries.add(entry.entry_id)
                self._unacked[signal.id] = replace(entry, signal=signal, attempts=attempt)
                self.handed.append(signal)
                return signal
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return None
            await self._doorbell.wait(remaining)

    def offer(self, entry: InboxEntry) -> bool:
        """Take an entry a notice carried (already delivered to this run): it goes straight
        into the buffer when it is surely the next one (the run has read the whole inbox, no
        read is due or under way, and it is newer than everything seen); otherwise a read is
        due. Notices of one thread arrive in inbox order, so this never reorders signals."""
        if entry.delivered > 0:
            self._charged[entry.entry_id] = None
        last = self._buffer[-1].entry_id if self._buffer else self._cursor
        if (
            self._reading or self._more or self._stopped or self._doorbell.rung
            or entry.delivered != 1
            or (last is not None and _order(entry.entry_id) <= _order(last))
        ):
            self._doorbell.ring()
            return False
        self._buffer.append(entry)
        self._doorbell.wake()
        return True

    def note_charged(self, entry_ids: Iterable[str]) -> None:
        """The store counted a hand-out of these entries to this run (see :meth:`give_back`)."""
        self._charged.update(dict.fromkeys(entry_ids))

    async def give_back(self) -> None:
        """At the end of the run: take back the hand-outs the store counted for entries this
        run received (read ahead, or carried by a notice) but never handed to its agent, so a
        signal's attempts count only the runs that gave it to the agent."""
        ids = [e for e in self._charged if e not in self._handed_entries]
        undeliver = getattr(self._store, "undeliver", None)
        if ids and callable(undeliver):
            await undeliver(self.thread_key, self.run_id, ids)

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

    async def _read_ahead(self) -> None:
        """Read the next entries; the first is delivered to this run in the same call. Once a
        read reached the end of the inbox, the next one waits for a ring (every signal
        accepted for this thread rings the run's doorbell; a reconnect rings them all)."""
        self._doorbell.take()
        self._reading = True
        try:
            page = await retry_unavailable(
                lambda: self._store.read(
                    self.thread_key, after=self._cursor, limit=READ_BATCH, max_bytes=READ_BYTES,
                    deliver_to=self.run_id, max_attempts=self._max_attempts,
                    skip_queued=bool(self.handed),
                )
            )
        finally:
            self._reading = False
        self._more = bool(getattr(page, "more", True))
        self.note_charged(e.entry_id for e in page if e.delivered > 0)
        self._buffer.extend(page)

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

    async def ack(self, signal: Signal | str, result: Any = None) -> None:
        """Acknowledge ``signal`` (or its id): it leaves the inbox for good and its receipt
        becomes ``processed`` with ``result`` (JSON, at most the runtime's
        ``max_signal_bytes``). Acknowledging twice is a no-op."""
        signal_id = signal.id if isinstance(signal, Signal) else signal
        entry = self._unacked.get(signal_id)
        if entry is None:
            if any(s.id == signal_id for s in self.handed):
                return  # acknowledged before
            raise ValueError(f"signal {signal_id!r} was not handed to this run")
        encoded = None if result is None else encode_json(
            result, f"result of signal {signal_id!r}", self._max_bytes
        )
        acks = [Ack(entry.entry_id, signal_id, self.run_id, encoded)]
        ok = await retry_unavailable(lambda: self._acknowledge(acks))
        if not ok:
            await self._fenced()
        self._unacked.pop(signal_id, None)

    async def _acknowledge(self, acks: list[Ack]) -> bool:
        """Acknowledge; when the next buffered entry will be handed out next, deliver it in
        the same call (one round trip per signal while a backlog is worked through)."""
        fused = getattr(self._store, "ack_and_deliver", None)
        nxt = self._buffer[0] if self._buffer else None
        if fused is None or nxt is None or nxt.delivered or (
            nxt.mode == "queue" and self.handed
        ):
            return await self._store.ack(self.thread_key, acks)
        ok, delivered = await fused(
            self.thread_key, acks, nxt.entry_id, max_attempts=self._max_attempts
        )
        if ok and self._buffer and self._buffer[0] is nxt:
            self._buffer[0] = replace(nxt, delivered=delivered if delivered else _GONE)
            if delivered > 0:
                self._charged[nxt.entry_id] = None
        return bool(ok)

    async def ack_all(self) -> None:
        """Acknowledge every signal handed out and not yet acknowledged (the runtime calls
        this when the agent returns normally)."""
        if self._unacked:
            acks = [Ack(e.entry_id, sid, self.run_id) for sid, e in self._unacked.items()]
            if not await retry_unavailable(lambda: self._store.ack(self.thread_key, acks)):
                await self._fenced()
            self._unacked.clear()


def _order(entry_id: str) -> tuple[int, int]:
    """Entry ids in inbox order: Redis stream ids (``ms-seq``) or decimal counters."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
