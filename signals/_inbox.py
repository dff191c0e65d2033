"""The ``SignalInbox`` contract: the per-thread store of accepted, unprocessed signals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias

from ._model import Signal

__all__ = ["INBOX_METHODS", "EntryMode", "InboxEntry", "SignalInbox", "is_signal_inbox"]

EntryMode: TypeAlias = Literal["deliver", "queue"]
"""``deliver``: give it to the active run. ``queue``: it starts a run of its own."""

INBOX_METHODS: tuple[str, ...] = (
    "inbox_append",
    "inbox_read",
    "inbox_remove",
    "inbox_pending_count",
    "inbox_pending_threads",
)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An accepted signal waiting in a thread's inbox. ``entry_id`` orders entries."""

    entry_id: str
    signal: Signal
    mode: EntryMode


class SignalInbox(Protocol):
    """Accepted signals per thread, kept until a run has processed them.

    * ``inbox_append`` is atomic and deduplicates by ``signal.id`` per thread: it returns
      ``False`` (and stores nothing) for an id already accepted within the dedup window.
    * ``inbox_read`` returns unprocessed entries in append order, after ``after`` (exclusive).
    * ``inbox_remove`` marks entries processed; removed entries are never read again, and
      their ids stay in the dedup window.
    * A durable backend keeps entries across the crash of any client process.
    """

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool: ...

    async def inbox_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[InboxEntry]: ...

    async def inbox_remove(self, thread_key: str, entry_ids: list[str]) -> None: ...

    async def inbox_pending_count(self, thread_key: str) -> int: ...

    async def inbox_pending_threads(self, limit: int = 100) -> list[str]: ...


def is_signal_inbox(obj: object) -> bool:
    """True when ``obj`` has all five inbox methods and each is callable."""
    return all(callable(getattr(obj, name, None)) for name in INBOX_METHODS)
