"""The soak's sender: signals with known ids, sent from a sender-only runtime, and the drain.

An id counts as *accepted* when ``send`` returned a fresh ``Delivery`` (not a duplicate). A
send that raised may have stored the signal all the same (the reply was lost); it is retried
with the same id for up to ``SEND_RETRY_S``: a duplicate then proves the first attempt stored
it, and the id is accepted too (``after_retry``). An id never confirmed is checked only if a
receipt shows up for it. A few sends repeat an accepted id, which must come back duplicate.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from _signal_leases.errors import BackendError
from signals._model import Receipt, Signal

if TYPE_CHECKING:
    from collections.abc import Callable

    from signals._runtime import SignalRuntime

__all__ = ["SendStats", "SignalSender"]

SEND_RETRY_S = 30.0  # how long one signal's send is retried through an outage
RESEND_SHARE = 0.02  # share of sends that repeat an accepted id (must come back duplicate)
CONVERSATION_SHARE = 0.08  # share of sends that start a new short-lived thread
DRAIN_CONCURRENCY = 16


@dataclass
class SendStats:
    sent: int = 0
    accepted: dict[str, str] = field(default_factory=dict)  # signal id -> thread
    accepted_at: dict[str, float] = field(default_factory=dict)  # signal id -> send returned
    conversations: int = 0
    after_retry: set[str] = field(default_factory=set)  # accepted by a send that then failed
    unconfirmed: dict[str, str] = field(default_factory=dict)  # sends that never returned
    resends: int = 0
    resends_refused: int = 0
    dedup_failures: int = 0
    unexpected_duplicates: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unexpected_errors: Counter[str] = field(default_factory=Counter)

    def count_error(self, exc: Exception) -> None:
        (self.errors if isinstance(exc, BackendError) else self.unexpected_errors)[
            type(exc).__name__] += 1


class SignalSender:
    """Sends through ``runtime`` (sender-only) to ``threads`` at ``rate`` until ``stop``."""

    def __init__(
        self, runtime: SignalRuntime, threads: list[str], *, rate: float, seed: int,
        stop: anyio.Event, stats: SendStats, say: Callable[[str], None],
    ) -> None:
        self.runtime = runtime
        self.threads = threads
        self.rate = rate
        self.seed = seed
        self.stop = stop
        self.stats = stats
        self.say = say

    async def run(self) -> None:
        """Send at ``rate``: mostly to the long-lived threads, sometimes the 1-3 signals of a
        new conversation (a thread that never hears again: nothing but recovery can finish
        it if its owner dies), sometimes an accepted id again (must be a duplicate)."""
        rng = random.Random(self.seed)
        interval = 1 / self.rate
        accepted: list[tuple[str, str]] = []
        conversation: list[str] = []  # the thread key, once per signal still to send to it
        n = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            roll = rng.random()
            if accepted and roll < RESEND_SHARE:
                await self._resend(*rng.choice(accepted))
            else:
                if not conversation and roll < RESEND_SHARE + CONVERSATION_SHARE:
                    self.stats.conversations += 1
                    conversation = [f"c{self.stats.conversations:05d}"] * rng.randint(1, 3)
                thread = conversation.pop() if conversation else rng.choice(self.threads)
                n += 1
                sid = f"s{n:07d}"
                if await self._send(thread, sid):
                    accepted.append((thread, sid))
            next_at += interval
            now = time.monotonic()
            if next_at > now:
                with anyio.move_on_after(next_at - now):
                    await self.stop.wait()
            else:
                next_at = now  # behind (a slow send): no burst to catch up

    async def _send(self, thread: str, sid: str) -> bool:
        """Send one new signal, retrying through outages; ``True`` once it is accepted."""
        s = self.stats
        s.sent += 1
        failed = False
        deadline = time.monotonic() + SEND_RETRY_S
        delay = 0.05
        while True:
            try:
                delivery = await self.runtime.send(thread, Signal({"n": sid}, id=sid))
                break
            except Exception as exc:
                s.count_error(exc)
                failed = True  # the signal may be stored all the same: a retry will tell
                if time.monotonic() > deadline:
                    s.unconfirmed[sid] = thread
                    return False
                await anyio.sleep(delay)
                delay = min(1.0, delay * 2)
        if delivery.duplicate and not failed:
            s.unexpected_duplicates += 1  # a new id reported as already accepted
            return False
        s.accepted[sid] = thread
        s.accepted_at[sid] = time.monotonic()
        if delivery.duplicate:
            s.after_retry.add(sid)
        return True

    async def _resend(self, thread: str, sid: str) -> None:
        """Send an accepted id again: it must come back as a duplicate."""
        s = self.stats
        try:
            delivery = await self.runtime.send(thread, Signal({"n": sid}, id=sid))
        except Exception as exc:
            s.count_error(exc)
            return
        s.resends += 1
        if delivery.duplicate:
            s.resends_refused += 1
        else:
            s.dedup_failures += 1

    async def drain(self, receipts: dict[str, Receipt | None], seconds: float) -> float:
        """Wait until every accepted signal's receipt is final, at most ``seconds``; fills
        ``receipts`` (the last one read per id) and returns how long it took."""
        s = self.stats
        pending: dict[str, str] = {**s.unconfirmed, **s.accepted}
        t0 = time.monotonic()
        said = t0
        limiter = anyio.Semaphore(DRAIN_CONCURRENCY)

        async def look(sid: str, thread: str) -> None:
            async with limiter:
                try:
                    receipt = await self.runtime.receipt(thread, sid)
                except BackendError:
                    return
            if receipt is None and sid in s.unconfirmed:
                pending.pop(sid, None)  # never stored: nothing to check
                return
            receipts[sid] = receipt
            if receipt is not None and receipt.done:
                pending.pop(sid, None)

        while pending:
            async with anyio.create_task_group() as tg:
                for sid, thread in list(pending.items()):
                    tg.start_soon(look, sid, thread)
            now = time.monotonic()
            if not pending or now > t0 + seconds:
                break
            if now - said > 5:
                said = now
                self.say(f"soak: draining, {len(pending)} receipts not final yet")
            await anyio.sleep(0.5)
        return time.monotonic() - t0
