"""The rows the reference engine keeps, and the driver it keeps them with (:class:`Tables`).

A driver is used inside one transaction (one engine call); its methods are synchronous and
each is one simple statement in SQL (:mod:`signals.kit._sql`) or a dict operation in memory
(``signals._backends.memory``). The engine (:mod:`signals.kit._rules`) holds every rule; a
driver only stores and finds rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from signals.kit._capabilities import PartIn
from signals.kit._core import EntryState

if TYPE_CHECKING:
    from signals._model import Signal

__all__ = ["EntryRow", "LeaseAccess", "ReceiptRow", "Tables", "ThreadRow"]


@dataclass(slots=True)
class ThreadRow:
    """One thread: entry counter, pause, fencing, activity, index, lanes."""

    key: str
    seq: int = 0  # the last entry number given out
    pending: int = 0  # entries in the inbox
    paused: bool = False
    token: int | None = None  # the newest fencing token seen (the current run's)
    run: str | None = None  # the current run
    since: float | None = None  # when the current run's runtime took the thread
    last: float | None = None  # the last accepted signal
    look: float | None = None  # next look (the pending index); None: not indexed
    abort: str | None = None  # the last run asked to abort
    lanes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # lane -> {"c": last cache key, "f": first pending (s), "g": gate (s) of a debounced lane}

    def lanes_json(self) -> str:
        return json.dumps(self.lanes, separators=(",", ":")) if self.lanes else ""


@dataclass(slots=True)
class EntryRow:
    """One accepted signal in a thread's inbox."""

    thread: str
    seq: int
    sid: str
    body: str  # the signal's JSON
    mode: str
    prio: int = 0
    lane: str | None = None
    merge: str = "append"
    state: EntryState = "ready"
    due: float | None = None  # state "later": when it becomes ready
    nb: float | None = None  # its own not_before
    expires: float | None = None
    holder: str | None = None
    attempts: int = 0
    error: str | None = None
    # The accepted signal itself, when the engine has it (not stored: a row read back from a
    # database has None, and its body is decoded): spares the decode of what was just encoded.
    signal: Signal | None = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class ReceiptRow:
    """The receipt of one accepted signal; a dead letter keeps the signal (``body``)."""

    thread: str
    sid: str
    status: str
    accepted: float  # Unix time it was accepted (retention)
    at: float | None = None
    run: str | None = None
    result: str | None = None  # JSON
    error: str | None = None
    by: str | None = None  # superseded by
    body: str | None = None  # dead letters: the signal JSON
    mode: str | None = None
    attempts: int = 0


class LeaseAccess(Protocol):
    """The leases a fused engine reads and grants in its own transaction."""

    def live(self, key: str) -> tuple[str, int | None, str | None] | None:
        """(owner, token, session) of the live lease on ``key``, or ``None``."""
        ...

    def grant(self, key: str, owner: str, ttl_ms: int, session: str | None) -> int | None:
        """Take the free lease for ``owner``; its token (``None``: the session is gone)."""
        ...

    def release(self, key: str, owner: str) -> None: ...

    def left_ms(self, key: str) -> int | None:
        """How long the live lease on ``key`` has left (its session's, for a session lease)."""
        ...


class Tables(Protocol):
    """The engine's driver, inside one transaction (see the module docstring)."""

    @property
    def now(self) -> float:
        """Unix time of this transaction, in seconds."""
    streams: bool  # whether add_part stores lifecycle parts
    leases: LeaseAccess | None  # the fused leases, when the engine fuses

    def preload(self, key: str, sids: Sequence[str], receipts_window: float | None) -> None:
        """A hint before a call's first read of ``key``: what it will read first (the
        thread, its lease, the receipts and entries of ``sids``, its receipts older than
        ``receipts_window`` seconds) may be read at once. Any driver may ignore it."""

    def thread(self, key: str) -> ThreadRow | None: ...
    def save_thread(self, row: ThreadRow) -> None: ...

    def insert(self, e: EntryRow) -> None: ...
    def update(self, e: EntryRow) -> None: ...
    def delete(self, key: str, seqs: Sequence[int]) -> None: ...
    def by_signal(self, key: str, sid: str) -> EntryRow | None: ...
    def best(self, key: str, run: str | None) -> EntryRow | None:
        """The next entry to hand out: ``ready`` or ``carried`` to ``run``; highest priority,
        then lowest seq."""
        ...

    def lane(self, key: str, lane: str) -> list[EntryRow]:
        """Every entry of ``lane``, by seq."""
        ...

    def lane_open(self, key: str, lane: str) -> bool:
        """Whether ``lane`` has an entry ``ready`` or ``later`` (without reading them all)."""
        ...

    def ripe(self, key: str, until: float) -> list[EntryRow]:
        """Entries ``later`` with ``due <= until``."""
        ...

    def expired(self, key: str, now: float) -> list[EntryRow]:
        """Entries not ``held`` with ``expires <= now``."""
        ...

    def held_by_others(self, key: str, run: str) -> list[EntryRow]:
        """Entries ``held`` or ``carried`` by another run than ``run``."""
        ...

    def rows(self, key: str, limit: int, offset: int) -> list[EntryRow]:
        """Entries in hand-out order (priority, then seq)."""
        ...

    def droppable(self, key: str) -> EntryRow | None:
        """The entry no run holds of the lowest priority, oldest first."""
        ...

    def next_due(self, key: str) -> float | None:
        """The earliest ``due`` of an entry ``later``."""
        ...

    def receipt(self, key: str, sid: str) -> ReceiptRow | None: ...
    def put_receipt(self, r: ReceiptRow) -> None: ...
    def trim_receipts(self, key: str, before: float, keep: int) -> None:
        """Delete receipts accepted before ``before``, and the oldest past ``keep``."""
        ...

    def dead(self, key: str, limit: int) -> list[ReceiptRow]:
        """Receipts ``dead_lettered`` that still keep their signal, oldest first."""
        ...

    def due_threads(self, until: float, limit: int) -> list[str]:
        """Threads indexed with ``look <= until`` and not paused, by ``look``; with
        ``leases``, only those without a live lease (an owned thread is its owner's to run:
        it shows up here once the lease is gone)."""
        ...

    def next_look(self, after: float) -> float | None:
        """The earliest ``look`` after ``after`` of a thread not paused."""
        ...

    def add_part(self, key: str, part: PartIn) -> str: ...
