"""``Run``: what the agent receives. It reads the thread's inbox and commits what it consumed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ._inbox import InboxEntry, SignalInbox
    from ._model import Signal

__all__ = ["Doorbell", "Run", "RunInfo"]

#: How long a run waiting for follow-ups sleeps between inbox reads when no doorbell rings.
POLL_INTERVAL_S = 0.25

#: How many inbox entries a run reads ahead at once.
READ_BATCH = 64


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A snapshot of the run this process has on a thread (see ``SignalRuntime.active_run``).

    ``token`` is ``None`` until the run's lease keeper has entered (and always with the no-op
    provider); ``started_at`` is Unix time in seconds; ``runs`` counts the runs of the chain
    so far (1 for the run that woke the thread, +1 per handoff).
    """

    run_id: str
    thread_key: str
    token: int | None
    started_at: float
    runs: int


class Doorbell:
    """Wakes a run that waits for follow-ups. Rung by local senders and by pub/sub events."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def ring(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Return when rung (since the last wait) or after ``timeout`` seconds."""
        event = self._event
        with anyio.move_on_after(timeout):
            await event.wait()
        if event.is_set():
            self._event = anyio.Event()


class Run:
    """One run of the agent on a thread, holding the thread's lease.

    ``run_id`` is the lease owner; ``token`` the fencing token of the grant (``None`` with the
    no-op provider): pass it to the storage you write to so a stale owner's writes are refused.

    Iterate the run (``async for signal in run``) to get the signal that woke it, then every
    follow-up delivered while it runs. The iteration ends when no follow-up arrives within the
    runtime's ``idle_wait_ms``, or at a signal sent with ``if_active="queue"`` (that one starts
    the next run). A signal counts as processed when the agent asks for the next one or returns;
    if the run is cancelled (lease lost) or the process dies first, the next owner gets it again.
    """

    def __init__(
        self,
        *,
        run_id: str,
        thread_key: str,
        token: int | None,
        inbox: SignalInbox,
        first: InboxEntry,
        doorbell: Doorbell,
        idle_wait_s: float,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.run_id = run_id
        self.thread_key = thread_key
        self.token = token
        self._inbox = inbox
        self._doorbell = doorbell
        self._idle_wait_s = idle_wait_s
        self._poll_s = poll_interval_s
        self._first: InboxEntry | None = first
        self._cursor: str = first.entry_id
        self._inflight: str | None = first.entry_id
        self._seen: set[str] = {first.signal.id}
        self._stopped = False
        self._buffer: deque[InboxEntry] = deque()
        self.consumed = 0

    @property
    def wake_signal(self) -> Signal | None:
        """The signal that started this run, until the iteration has yielded it."""
        return self._first.signal if self._first is not None else None

    def __aiter__(self) -> Run:
        return self

    async def __anext__(self) -> Signal:
        signal = await self.next_signal()
        if signal is None:
            raise StopAsyncIteration
        return signal

    async def next_signal(self, timeout: float | None = None) -> Signal | None:
        """The next signal for this run, or ``None`` when there is none within ``timeout``
        seconds (default: the runtime's ``idle_wait_ms``) or the run reached a queued signal."""
        if self._first is not None:
            first, self._first = self._first, None
            self.consumed += 1
            return first.signal
        await self.commit()
        if self._stopped:
            return None
        wait_s = self._idle_wait_s if timeout is None else max(0.0, timeout)
        deadline = anyio.current_time() + wait_s
        while True:
            if not self._buffer:  # read ahead in batches; only this run consumes the inbox
                self._buffer.extend(
                    await self._inbox.inbox_read(
                        self.thread_key, after=self._cursor, limit=READ_BATCH
                    )
                )
            while self._buffer:
                entry = self._buffer.popleft()
                if entry.signal.id in self._seen:
                    self._cursor = entry.entry_id
                    await self._inbox.inbox_remove(self.thread_key, [entry.entry_id])
                    continue
                if entry.mode == "queue":
                    self._stopped = True
                    return None
                self._cursor = entry.entry_id
                self._inflight = entry.entry_id
                self._seen.add(entry.signal.id)
                self.consumed += 1
                return entry.signal
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return None
            await self._doorbell.wait(min(remaining, self._poll_s))

    async def commit(self) -> None:
        """Mark the signal last handed out as processed (the runtime calls this on return)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None and self._first is None:
            await self._inbox.inbox_remove(self.thread_key, [inflight])
        elif inflight is not None:
            self._inflight = inflight  # the wake signal was never handed out: keep it

    async def commit_all(self) -> None:
        """Commit at the end of a run: the wake signal counts as consumed even if never read."""
        self._first = None
        await self.commit()
