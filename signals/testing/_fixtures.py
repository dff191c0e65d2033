"""The knobs, fixtures and helpers every conformance kit of ``signals.testing`` shares."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from signals._model import Signal
from signals.kit._capabilities import has
from signals.kit._core import Ack, InboxEntry, RunRef, SignalCore, Taken

__all__ = ["ALL", "Fixtures", "ids", "new_name"]

ALL = 100_000  # a limit that lists everything


def ids(entries: list[InboxEntry] | tuple[InboxEntry, ...]) -> list[str]:
    return [e.signal.id for e in entries]


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.mark.anyio
class Fixtures:
    """Override ``core`` (and, for the fused checks, ``leases``) in your subclass.

    Every check uses fresh thread keys (:meth:`thread`) and withdraws what it left behind when
    it ends, so one core may be shared and a key prefix is left clean. Time passes with
    :meth:`advance` (a real sleep unless you move a fake clock); the receipt-retention check
    runs only when :meth:`expire_receipts` is overridden.
    """

    #: Concurrent accepts of one signal id in the dedup race check.
    racers: int = 20
    #: Presence TTL of the registry checks, in ms (raise it for slow remote stores).
    presence_ttl_ms: int = 150
    #: The time unit of the time checks (delays, expiry, debounce), in ms.
    tick_ms: int = 150

    @pytest.fixture
    def core(self) -> Any:
        """Override: yield (or return) the core under test."""
        raise NotImplementedError("override the `core` fixture in your conformance class")

    @pytest.fixture
    def small_core(self) -> Any:
        """Override: a core whose streams keep at most 5 parts (the stream-retention check)."""
        pytest.skip("small_core is not overridden for this core")

    @pytest.fixture
    def leases(self) -> Any:
        """Override with the lease provider the core fuses with (enables the fused checks)."""
        return None

    @pytest.fixture(autouse=True)
    async def _clean(self, core: Any) -> AsyncIterator[None]:
        self._threads: list[str] = []
        yield
        with anyio.move_on_after(10, shield=True):
            for thread in self._threads:
                await core.pause(thread, False)
                await core.withdraw(thread, None, held=True)

    def thread(self, prefix: str = "t") -> str:
        """A fresh thread key, withdrawn from when the check ends."""
        name = new_name(prefix)
        self._threads.append(name)
        return name

    async def advance(self, core: SignalCore, ms: int) -> None:
        """Let ``ms`` milliseconds pass for ``core`` (default: sleep)."""
        await anyio.sleep(ms / 1000)

    def now(self, core: SignalCore) -> float:
        """The core's Unix time (default: ``time.time()``; override with a fake clock)."""
        return time.time()

    async def expire_receipts(self, core: SignalCore) -> None:
        """Override: let the receipt retention pass. Default: skip the check that needs it."""
        pytest.skip("expire_receipts is not overridden for this core")

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def need(core: Any, *names: str) -> None:
        """Skip unless ``core`` has the capability's methods."""
        if not has(core, *names):
            pytest.skip(f"this core has no {', '.join(names)}")

    @staticmethod
    async def accept_all(core: SignalCore, thread: str, signals: list[Signal]) -> None:
        for signal in signals:
            assert (await core.accept(thread, signal, "deliver")).fresh

    @staticmethod
    async def take(core: SignalCore, thread: str, run: RunRef, *, acks: list[Ack] | None = None,
                   max_attempts: int = 5, first: bool = True) -> Taken:
        return await core.take(thread, run, acks=acks or [], max_attempts=max_attempts,
                               first=first)

    async def drain(self, core: SignalCore, thread: str, run: RunRef) -> list[str]:
        """Take and acknowledge everything ready, in hand-out order; the ids."""
        out: list[str] = []
        acks: list[Ack] = []
        while True:
            taken = await self.take(core, thread, run, acks=acks)
            if not taken.entries:
                return out
            out += ids(taken.entries)
            acks = [Ack(e.entry_id, e.signal.id) for e in taken.entries]
