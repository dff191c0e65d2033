"""The durable core of the signal runtime: :class:`SignalCore`, twelve methods, and its types.

A backend that spans processes implements these twelve methods (or gets them from
:class:`~signals.kit.SQLCore` over a SQL database). Everything else the runtime uses (notices,
the runtime registry, control, output streams, the fused calls) is derived from the core, the
lease provider and the pub/sub by :class:`~signals.kit.KitStore`, or is an optional
capability of the core (:mod:`signals.kit._capabilities`) that replaces a derivation with a
faster or more atomic native path.

The rules of each method are in its docstring; :class:`signals.testing.SignalCoreConformance`
checks every one of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from _signal_leases.frozen import quick_init
from signals._model import EntryMode, Receipt, Signal

__all__ = [
    "CORE_METHODS",
    "Accepted",
    "Ack",
    "DeadLetter",
    "Due",
    "EntryState",
    "InboxEntry",
    "Limits",
    "Overflow",
    "RunRef",
    "SignalCore",
    "Taken",
    "ThreadState",
    "decode_entry",
    "is_signal_core",
    "run_runtime",
]

Overflow: TypeAlias = Literal["reject", "drop_oldest"]
EntryState: TypeAlias = Literal["ready", "later", "carried", "held"]
"""Where an entry is: ``ready`` (can be handed out), ``later`` (not due yet: ``not_before``
or its lane's debounce window), ``carried`` (a notice carried it to ``holder``'s run, whose
agent may or may not have it yet) or ``held`` (handed to ``holder``'s agent)."""


def run_runtime(run_id: str) -> str:
    """The runtime id inside a run id (run ids are ``<runtime id>/<run>``)."""
    return run_id.rpartition("/")[0]


@quick_init
@dataclass(frozen=True, slots=True)
class RunRef:
    """The run calling the core: its id and the fencing token of its lease (``None`` when
    the lease provider does not fence). A call with a token lower than the thread's newest
    is refused (the run is stale); the first call with a newer token makes its run the
    thread's current run."""

    run_id: str
    token: int | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class Limits:
    """Per-thread limits of an accept: at most ``max_pending`` signals accepted and not yet
    acknowledged (``None``: no limit); past it ``overflow`` decides: ``reject`` the new one,
    or ``drop_oldest``, the oldest pending one of the lowest priority that no run holds."""

    max_pending: int | None = None
    overflow: Overflow = "reject"


NO_LIMITS = Limits()


@quick_init
@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An accepted signal waiting in a thread's inbox.

    ``entry_id`` is the core's name for it (a string; only the core compares entry ids).
    ``signal`` carries ``attempt`` (``max(1, attempts)``) and ``mode``. ``attempts`` counts
    the runs that were handed it. ``state`` and ``holder``: see :data:`EntryState`.
    ``due_at``: Unix time it becomes ready (state ``later``).
    """

    entry_id: str
    signal: Signal
    mode: EntryMode
    attempts: int = 0
    size: int = 0
    state: EntryState = "ready"
    holder: str | None = None
    due_at: float | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class Accepted:
    """What :meth:`SignalCore.accept` did.

    ``outcome``: ``fresh`` (stored: ``receipt`` is its new receipt, ``pending`` or
    ``scheduled``), ``duplicate`` (the id was accepted before: nothing stored, ``receipt`` is
    the original's), ``unchanged`` (its lane's last accepted signal had the same
    ``cache_key``: nothing stored) or ``rejected`` (the pending cap: nothing stored,
    ``reason`` says so). ``superseded`` and ``dropped``: the ids this one replaced in its lane
    or pushed out of the cap. ``due_at``: when it becomes ready (``None``: now).
    """

    outcome: Literal["fresh", "duplicate", "unchanged", "rejected"]
    entry_id: str | None = None
    receipt: Receipt | None = None
    reason: str | None = None
    superseded: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    due_at: float | None = None

    @property
    def fresh(self) -> bool:
        return self.outcome == "fresh"


@quick_init
@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledgement: the entry leaves the inbox, the receipt becomes ``processed``."""

    entry_id: str
    signal_id: str
    result: str | None = None  # JSON, already size-checked


@quick_init
@dataclass(frozen=True, slots=True)
class Taken:
    """What :meth:`SignalCore.take` handed out.

    ``entries``: the next hand-out, now ``held`` by the run: one entry, or every ready entry
    of a ``coalesce`` lane (oldest first), which the runtime folds into one signal; empty when
    nothing is ready. ``fenced``: a newer run holds the thread (nothing was done).
    ``paused``: the thread is paused (nothing handed out). ``stopped``: the next ready entry is
    queued for a run of its own and the run has handed something out already. ``more``: other
    entries are ready now. ``next_due``: the earliest entry not due yet (Unix time).
    ``dead``: signal ids dead-lettered on the way (attempts past ``max_attempts``).
    ``pending``: optional, the thread's entries not yet acknowledged after this take (held
    ones included), for the ``signals.pending`` gauge; ``None`` when the core does not say.
    """

    entries: tuple[InboxEntry, ...] = ()
    fenced: bool = False
    paused: bool = False
    stopped: bool = False
    more: bool = False
    next_due: float | None = None
    dead: tuple[str, ...] = ()
    pending: int | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A signal that used up ``max_attempts`` and left the inbox."""

    signal: Signal
    attempts: int
    error: str | None
    at: float


@quick_init
@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread as the core knows it (:meth:`SignalCore.describe`): ``pending`` signals,
    ``ready`` (some of them are due now: ready, or held or carried by a run), ``paused``,
    ``last`` (Unix time of the last accepted signal), ``since`` (when the current run's
    runtime took it), ``run`` (the current run, by the core's fencing), ``next_due`` (the
    earliest entry not due yet) and ``abort`` (the last run asked to abort, for cores that
    record it)."""

    pending: int = 0
    ready: bool = False
    paused: bool = False
    last: float | None = None
    since: float | None = None
    run: str | None = None
    next_due: float | None = None
    abort: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class Due:
    """What :meth:`SignalCore.due` found: threads to look at now, and when the next one is
    due (Unix time; ``None``: nothing indexed for later)."""

    threads: list[str]
    next_at: float | None = None


class SignalCore(Protocol):
    """The durable core: per-thread inboxes, receipts, dead letters and the pending index.

    Each method is atomic (one transaction, one script). Entries of a thread are handed out
    by priority (higher first), then in accept order; a thread is *indexed* (found by
    :meth:`due`) from its first accepted signal until its inbox is empty.
    """

    async def accept(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, limits: Limits = NO_LIMITS
    ) -> Accepted:
        """Store ``signal`` once per id, atomically. In this order: a known id (within the
        receipt retention) is a ``duplicate``; a ``cache_key`` equal to its lane's last
        accepted one is ``unchanged``; ``merge="supersede"`` withdraws the lane's ``ready``
        and ``later`` entries (receipts ``superseded``, naming this id); past
        ``limits.max_pending`` the signal is ``rejected`` or the oldest entry of the lowest
        priority no run holds is ``dropped``. The entry is ``later`` until ``not_before`` or
        the lane's debounce window (``debounce_ms`` since the lane's newest signal, at most
        ``max_wait_ms`` since its first pending one; a new signal re-arms the window of the
        lane's entries not handed out), else ``ready``; its receipt is ``scheduled`` or
        ``pending``. The thread is indexed: at once when the entry is ready and the thread was
        not indexed, else no later than the entry's due time."""
        ...

    async def take(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (), max_attempts: int,
        first: bool = False,
    ) -> Taken:
        """Acknowledge ``acks`` (as :meth:`settle` does), then hand out the next ready entry
        to ``run``, atomically. A stale run (older token) is ``fenced``; the first call of a
        newer run first returns every entry other runs hold or were carried to ``ready``
        (their attempts stay counted). Entries due by now become ready; entries whose
        ``expires_at`` passed are withdrawn (receipt ``expired``). Nothing is handed out while
        the thread is ``paused``, nor (unless ``first``) when the best entry is of mode
        ``queue`` (``stopped``). The best entry is the ready one (or one carried to this run)
        of the highest priority, oldest first; for a ``coalesce`` lane, every ready entry of
        that lane goes with it. Each is ``held`` by ``run`` and its attempts grow by one (not
        for an entry carried to this run: that was counted then); one past ``max_attempts``
        goes to the dead letters instead (receipt ``dead_lettered``)."""
        ...

    async def settle(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
        failed: Sequence[str] = (), returned: Sequence[str] = (), error: str | None = None,
    ) -> bool:
        """What a run reports, atomically: ``acks`` leave the inbox for good (receipts
        ``processed``, with their result; acknowledging twice is a no-op); ``failed`` (signal
        ids it handed to its agent and did not acknowledge) are ``ready`` again with
        ``error`` kept for their dead letter; ``returned`` (signal ids it took, or that were
        carried to it or to an earlier run of the thread, and never handed to an agent) are
        ``ready`` again and their attempt is given back. ``False``
        (nothing changed) when the run is stale. A thread whose inbox empties leaves the
        index."""
        ...

    async def withdraw(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, held: bool = False
    ) -> list[str]:
        """Withdraw pending signals (``None``: every one), atomically with hand-out: an entry
        ``held`` or ``carried`` by a run stays unless ``held``. Receipts become ``cancelled``.
        Returns the ids withdrawn."""
        ...

    async def entries(
        self, thread_key: str, *, limit: int = 100, offset: int = 0
    ) -> list[InboxEntry]:
        """The thread's pending entries in hand-out order (priority, then accept order)."""
        ...

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        """The receipt of ``signal_id`` (``None``: unknown or past retention)."""
        ...

    async def due(self, *, limit: int = 100, until: float | None = None) -> Due:
        """Indexed threads due by ``until`` (Unix time; ``None``: now; ``math.inf``: every
        indexed thread), the longest-due first, and the next due time after ``until``.
        Paused threads are not due."""
        ...

    async def look_at(self, thread_key: str, at: float) -> None:
        """Index ``thread_key`` to be looked at again at ``at`` (Unix time); a thread with
        nothing pending leaves the index instead."""
        ...

    async def pause(self, thread_key: str, paused: bool) -> bool:
        """Pause or resume ``thread_key``; returns whether it was paused. A paused thread
        accepts signals and hands none out. Resuming indexes it at once if it has work."""
        ...

    async def describe(self, thread_keys: Sequence[str]) -> dict[str, ThreadState]:
        """What the core knows of each thread (an unknown thread: ``ThreadState()``)."""
        ...

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        """The thread's dead letters, oldest first."""
        ...

    async def revive(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, purge: bool = False
    ) -> list[str]:
        """Put dead letters back into the inbox as new entries with no attempts (receipts
        ``pending``), or with ``purge`` delete them; ``None``: all of them. Returns the ids
        found."""
        ...


#: The members of :class:`SignalCore`, in the order of the docs.
CORE_METHODS: tuple[str, ...] = (
    "accept", "take", "settle", "withdraw", "entries", "receipt", "due", "look_at", "pause",
    "describe", "dead_letters", "revive",
)


def is_signal_core(obj: object) -> bool:
    """True when ``obj`` is an instance with the twelve methods of :class:`SignalCore`."""
    return not isinstance(obj, type) and all(
        callable(getattr(obj, name, None)) for name in CORE_METHODS
    )


def decode_entry(
    entry_id: str, raw: str | bytes, mode: str, attempts: int, *, state: EntryState = "ready",
    holder: str | None = None, due_at: float | None = None, signal: Signal | None = None,
) -> InboxEntry:
    """An inbox entry from its stored parts (``ValueError`` when malformed). ``signal``: the
    signal ``raw`` encodes, when the caller still has it (it accepted it): copied with the
    delivery fields instead of decoded."""
    entry_mode: EntryMode = "queue" if mode == "queue" else "deliver"
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    if signal is not None:
        handed = signal.evolve(attempt=max(1, attempts), mode=entry_mode, folded=())
    else:
        obj: Any = json.loads(text)
        if not isinstance(obj, dict):
            raise ValueError("signal JSON must be an object")
        handed = Signal.from_dict(obj, attempt=max(1, attempts), mode=entry_mode, encoded=text)
    return InboxEntry(entry_id, handed, entry_mode, attempts, len(text), state, holder, due_at)
