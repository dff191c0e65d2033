"""Control and inspection of threads from any process: receipts and dead letters.

A mixin of :class:`~signals.SignalRuntime`; every call works from a sender-only runtime too,
because it goes to the shared store, not to the owner's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from _signal_leases.validation import check_identifier, check_int

from ._store import DeadLetter, Notice

if TYPE_CHECKING:
    from ._chain import Chain
    from ._model import Receipt
    from ._store import SignalStore

__all__ = ["ControlMixin"]


class ControlMixin:
    """Receipts and dead letters (see :class:`~signals.SignalRuntime`)."""

    inbox: SignalStore
    _chains: dict[str, Chain]

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        """What became of ``signal_id`` on ``thread_key`` (``None``: unknown or past
        retention). Works from any process."""
        check_identifier("thread key", thread_key)
        check_identifier("signal id", signal_id)
        return await self.inbox.receipt(thread_key, signal_id)

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        """The signals of ``thread_key`` that failed ``max_attempts`` deliveries, oldest first."""
        check_identifier("thread key", thread_key)
        return await self.inbox.dead_letters(thread_key, limit=check_int("limit", limit))

    async def retry_dead_letters(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]:
        """Put dead-lettered signals back into the inbox (attempts from zero) and wake the
        thread; returns the ids that were dead letters."""
        check_identifier("thread key", thread_key)
        ids = [check_identifier("signal id", s) for s in _as_list("signal_ids", signal_ids)]
        retried = await self.inbox.retry_dead(thread_key, ids)
        if retried:
            await self.inbox.notify(None, Notice("work", thread_key))
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
        return await self.inbox.purge_dead(thread_key, ids)



def _as_list(name: str, values: object) -> list[object]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of signal ids, got {type(values).__name__}")
    return list(values)
