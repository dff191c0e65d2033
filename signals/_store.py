"""The ``SignalStore`` contract: everything the runtime keeps outside one process's memory.

Per thread: the *inbox* of accepted, unacknowledged signals (with delivery attempts), the
*receipts* of accepted signals (which double as the dedup record), and the *dead letters*.
Across threads: the *pending index* (threads with work and no owner known to be alive), the
*runtime registry* (which runtime owns which threads, so a dead runtime's threads can be found
in O(its threads)), and *notices* (at-most-once wake-up calls to one runtime or to all
workers; the durable state is the inbox, notices only save waiting).

A thread whose lease is live when recovery looks stays in the pending index, only hidden from
``pending_threads`` until that lease would expire: its owner may be dead (a runtime's presence
can lapse before its leases do) and nothing else would look at the thread again. A store may
offer ``defer(thread_key, delay_ms)`` for that (the generic path uses it; without it the thread
is simply left indexed and looked at again on the next pass).

A store works with any ``LeaseProvider``: the runtime then takes leases itself, around the
store calls (the generic path). A store that can do the lease step in the same atomic step as
the inbox step offers the optional :class:`FusedSignalStore` methods and the runtime uses them
when ``fuses_with(leases)`` is true: that is what makes a routed signal one round trip.
Backends: :class:`~signals.InMemorySignalStore`, :class:`~signals.RedisSignalStore`; the
conformance suite is :class:`signals.testing.SignalStoreConformance`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from signals._model import EntryMode, Receipt, Signal, StreamPart

if TYPE_CHECKING:
    from leases import LeaseProvider

__all__ = [
    "CARRY_LIMIT",
    "STORE_METHODS",
    "Accepted",
    "Ack",
    "Claim",
    "DeadLetter",
    "Follower",
    "FusedSignalStore",
    "InboxEntry",
    "InboxPage",
    "Notice",
    "NoticeKind",
    "PartIn",
    "Routed",
    "RuntimeInfo",
    "SignalStore",
    "is_signal_store",
    "run_runtime",
]

#: Fused stores deliver a ``deliver`` signal up to this size (encoded) to the owner's run in
#: the same step as accepting it, and carry it in the notice: no inbox read (see ``route``).
CARRY_LIMIT = 16 * 1024

NoticeKind: TypeAlias = Literal["signal", "work", "abort", "resync"]
"""``signal``: the thread has new input for its run. ``work``: a thread has pending work and no
owner. ``abort``: cancel a run. ``resync``: the listener (re)connected and may have missed
notices: look at everything again."""


def run_runtime(run_id: str) -> str:
    """The runtime id inside a run id (run ids are ``<runtime id>/<run>``)."""
    return run_id.rpartition("/")[0]


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An accepted signal waiting in a thread's inbox; ``entry_id`` orders entries.

    ``attempts`` counts the runs it was handed to so far (0: never delivered). ``delivered``
    is set on the first entry of a ``read(deliver_to=...)``: the result of delivering it
    (see :meth:`SignalStore.deliver`); 0 otherwise.
    """

    entry_id: str
    signal: Signal
    mode: EntryMode
    attempts: int = 0
    size: int = 0
    delivered: int = 0


class InboxPage(list[InboxEntry]):
    """What :meth:`SignalStore.read` returns: a list of entries, plus ``more``: ``True`` when
    the read stopped at ``limit`` or ``max_bytes`` before the end of the inbox (a reader that
    was handed everything can wait for a notice instead of reading again)."""

    more: bool = False

    @classmethod
    def of(cls, entries: list[InboxEntry], more: bool) -> InboxPage:
        page = cls(entries)
        page.more = more
        return page


@dataclass(frozen=True, slots=True)
class Accepted:
    """What :meth:`SignalStore.accept` did: ``fresh`` (stored) or a duplicate (``receipt`` is
    the original's)."""

    fresh: bool
    entry_id: str | None = None
    receipt: Receipt | None = None


@dataclass(frozen=True, slots=True)
class PartIn:
    """A part to append to a thread's output stream (``data``: JSON text or ``None``)."""

    kind: str
    run_id: str
    signal_id: str | None = None
    data: str | None = None


class Follower(Protocol):
    """A process-wide watcher of output streams (see :meth:`SignalStore.follower`)."""

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Wait for parts after ``after`` (``None``: from the start) and return them (an
        empty list is allowed: read again). Many waiters share one blocking connection."""
        ...


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledgement: the entry leaves the inbox, the receipt becomes ``processed``."""

    entry_id: str
    signal_id: str
    run_id: str
    result: str | None = None  # JSON, already size-checked


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A signal that failed ``max_attempts`` deliveries and left the inbox."""

    signal: Signal
    attempts: int
    error: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Notice:
    """A wake-up call delivered to a listening runtime (see :data:`NoticeKind`)."""

    kind: NoticeKind
    thread_key: str = ""
    run_id: str | None = None
    reason: str | None = None
    entry: InboxEntry | None = None  # ``signal``: the entry, already delivered to ``run_id``


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """A runtime in the registry. ``alive`` is false once its presence expired."""

    runtime_id: str
    host: str
    pid: int
    started_at: float
    worker: bool
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Claim:
    """Take the thread's lease for ``owner`` (a run id of ``runtime_id``) if it is free."""

    owner: str
    ttl_ms: int
    session: str | None
    runtime_id: str


@dataclass(frozen=True, slots=True)
class Routed:
    """What a fused route or claim did. ``owner``: the live lease holder after the call
    (``None``: no owner). ``claimed``: the caller's claim won (``token`` is its fencing token).
    ``empty``: (claims) the inbox had nothing pending."""

    fresh: bool = True
    entry_id: str | None = None
    receipt: Receipt | None = None
    owner: str | None = None
    claimed: bool = False
    token: int | None = None
    empty: bool = False
    carried: bool = False  # delivered to the owner's run already (see FusedSignalStore.route)


class SignalStore(Protocol):
    """The storage contract of the signal runtime (see the module docstring).

    Rules every implementation follows (``signals.testing`` checks them):

    * ``accept`` is atomic: it deduplicates by signal id per thread (a duplicate stores
      nothing and returns the original's receipt), appends the entry, writes a ``pending``
      receipt and puts the thread in the pending index.
    * ``read`` returns entries in accept order after ``after`` (exclusive), at most ``limit``
      and, past the first, at most ``max_bytes`` of encoded signals. With ``deliver_to`` it
      also delivers the first entry to that run, in the same step (``InboxEntry.delivered``;
      a dead-lettered first entry is still returned, marked ``-1``), unless ``skip_queued``
      and that entry's mode is ``queue``.
    * ``deliver`` counts a hand-out: the first call per ``run_id`` increments the entry's
      attempts (repeats by the same run are idempotent). Beyond ``max_attempts`` the entry
      moves to the dead letters (receipt ``dead_lettered``) and ``-1`` is returned; ``0``
      when the entry is gone; ``-2`` (fused stores) when another run holds the thread's lease:
      a stale run can neither take nor acknowledge signals once the thread has a new owner.
    * ``ack`` removes entries for good and marks their receipts ``processed``; a thread whose
      inbox empties leaves the pending index. It returns ``False`` (and changes nothing) when
      a fused store finds that another run holds the thread's lease.
    * Receipts are kept ``retention_ms`` after acceptance (and at most ``max_receipts`` per
      thread); within that window an id is a duplicate.
    * Notices are at most once; ``listen`` calls its handler with a ``resync`` notice after
      every (re)connection, since notices may have been missed.
    * Output streams: ``emit`` appends parts in order and returns their cursors;
      ``stream_read`` returns the parts after a cursor (``None``: from the oldest retained);
      a cursor older than what retention removed raises ``CursorExpiredError`` (never a
      silent gap). ``deliver``, ``ack`` and dead-lettering write ``signal.received``,
      ``signal.acked`` and ``signal.dead_lettered`` parts in the same step. ``follower()`` is
      one watcher per process that any number of stream readers wait on.
    * Control: ``abort`` marks a run aborted and sends its runtime an ``abort`` notice; it
      aborts only the run holding the lease (``run_id``, or whichever holds it when ``None``),
      compared atomically by a store that knows the leases (else ``run_id`` is trusted); with
      ``clear`` it withdraws every pending signal. ``cancel`` withdraws pending signals that no
      live run holds (receipt ``cancelled``, part ``signal.cancelled``), atomically with
      respect to delivery: a signal is withdrawn or handed out, never both.
    """

    @property
    def retention_ms(self) -> int:
        """How long receipts (and so the dedup record) are kept, in ms."""
        ...

    async def accept(self, thread_key: str, signal: Signal, mode: EntryMode) -> Accepted: ...

    async def read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100,
        max_bytes: int = 1 << 20, deliver_to: str | None = None, max_attempts: int = 5,
        skip_queued: bool = False,
    ) -> InboxPage: ...

    async def deliver(
        self, thread_key: str, entry_id: str, signal_id: str, run_id: str, *, max_attempts: int
    ) -> int: ...

    async def ack(self, thread_key: str, acks: Sequence[Ack]) -> bool: ...

    async def note_failure(
        self, thread_key: str, signal_ids: Sequence[str], error: str
    ) -> None: ...

    async def pending_count(self, thread_key: str) -> int: ...

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None: ...

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]: ...

    async def retry_dead(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]: ...

    async def purge_dead(self, thread_key: str, signal_ids: Sequence[str] | None = None) -> int: ...

    async def pending_threads(self, *, limit: int = 100, min_age_ms: int = 0) -> list[str]: ...

    async def index(self, thread_key: str) -> None: ...

    async def unindex(self, thread_key: str) -> None: ...

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None: ...

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool: ...

    async def unregister_runtime(self, runtime_id: str) -> None: ...

    async def track_threads(
        self, runtime_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> None: ...

    async def orphan_dead_runtimes(self) -> list[str]: ...

    async def runtime_threads(self, runtime_id: str) -> list[str]: ...

    async def runtimes(self) -> list[RuntimeInfo]: ...

    async def notify(self, runtime_id: str | None, notice: Notice) -> None: ...

    def listen(
        self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
    ) -> AbstractAsyncContextManager[None]: ...

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]: ...

    async def stream_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[StreamPart]: ...

    async def stream_tail(self, thread_key: str) -> str | None: ...

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None: ...

    async def cancel(
        self, thread_key: str, signal_ids: Sequence[str], *, in_flight_run: str | None = None
    ) -> list[str]: ...

    async def thread_meta(self, thread_keys: Sequence[str]) -> dict[str, dict[str, Any]]: ...

    def follower(self) -> AbstractAsyncContextManager[Follower]: ...


class FusedSignalStore(SignalStore, Protocol):
    """Optional capability: the inbox step and the lease step in one atomic call.

    Used when ``fuses_with(leases)`` is true for the runtime's lease provider.

    * ``route``: ``accept``, then, for a fresh signal, in the same step: take the lease for
      ``claim`` if it is free (``claimed``), else notify the owner's runtime (unless it is
      ``sender``); with no owner and no claim, index the thread and (``wake_workers``)
      notify the workers. A duplicate claims nothing. A store may also deliver a small
      ``deliver`` signal to the owner's run in the same step and carry the entry in the
      notice (``Notice.entry``, ``Routed.carried``): the run then hands it out without a read.
    * ``release_if_idle``: release ``owner``'s lease only if the inbox is empty.
    * ``claim_pending``: take the lease for ``claim`` if the thread has pending work and no
      live owner; a thread with no work leaves the pending index, one with a live owner is
      deferred there until that owner's lease would expire (see the module docstring).
    """

    def fuses_with(self, leases: LeaseProvider) -> bool: ...

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool,
    ) -> Routed: ...

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool: ...

    async def claim_pending(self, thread_key: str, claim: Claim) -> Routed: ...


STORE_METHODS: tuple[str, ...] = (
    "accept", "read", "deliver", "ack", "note_failure", "pending_count", "receipt",
    "dead_letters", "retry_dead", "purge_dead", "runtime_threads", "pending_threads",
    "index", "unindex", "register_runtime", "refresh_runtime", "unregister_runtime",
    "track_threads", "orphan_dead_runtimes", "runtimes", "notify", "listen", "emit",
    "stream_read", "stream_tail", "follower", "abort", "cancel", "thread_meta",
)


def is_signal_store(obj: object) -> bool:
    """True when ``obj`` has the store methods the runtime calls (structural)."""
    return not isinstance(obj, type) and all(
        callable(getattr(obj, name, None)) for name in STORE_METHODS
    )


def decode_entry(
    entry_id: str, raw: str | bytes, mode: str, attempts: int, delivered: int = 0
) -> InboxEntry:
    """An inbox entry from its stored parts (``ValueError`` when malformed)."""
    import json

    obj: Any = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("signal JSON must be an object")
    entry_mode: EntryMode = "queue" if mode == "queue" else "deliver"
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    signal = Signal.from_dict(obj, attempt=max(1, attempts), mode=entry_mode, encoded=text)
    return InboxEntry(entry_id, signal, entry_mode, attempts, len(raw), delivered)
