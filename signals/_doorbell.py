"""The doorbell of a run: how a run waiting for input is woken (one event object, no task)."""

from __future__ import annotations

import asyncio

import anyio

from _signal_leases.aio import asyncio_task_loop

__all__ = ["Doorbell"]


class Doorbell:
    """Wakes a run that waits for input: rung by local senders and by store notices.

    A ring is remembered until the next :meth:`wait` (so a ring between a take and the wait
    is never lost). No task: a waiting run costs an event and, on asyncio, a timer (its
    timeout; anyio's cancel scope elsewhere).
    """

    __slots__ = ("_event", "_rung")

    def __init__(self) -> None:
        self._event: anyio.Event | asyncio.Event | None = None
        self._rung = False

    def ring(self) -> None:
        """New input the run must take."""
        self._rung = True
        self.wake()

    def wake(self) -> None:
        """Wake a waiting run without asking it to take (it was handed input directly)."""
        if self._event is not None:
            self._event.set()

    def take(self) -> bool:
        """Consume a pending ring; ``True`` if there was one."""
        rung, self._rung = self._rung, False
        return rung

    @property
    def rung(self) -> bool:
        """A ring is pending (a take is due)."""
        return self._rung

    async def wait(self, timeout: float) -> None:
        """Return at the next ring or wake (at once if a ring is pending), or after ``timeout``
        seconds."""
        if self._rung:
            return
        loop = asyncio_task_loop()
        try:
            if loop is not None:  # asyncio's own event and a timer: a wake-up is a hot path
                self._event = ready = asyncio.Event()
                timer = loop.call_later(timeout, ready.set)
                try:
                    await ready.wait()
                finally:
                    timer.cancel()
            else:
                self._event = event = anyio.Event()
                with anyio.move_on_after(timeout):
                    await event.wait()
        finally:
            self._event = None
