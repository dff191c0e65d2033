"""Value types of the signal runtime: ``Signal``, ``Delivery``, ``Receipt`` and the policies."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from _signal_leases.encoding import compact_json, json_scalar, random_id
from _signal_leases.errors import SignalTooLargeError
from _signal_leases.frozen import quick_init
from _signal_leases.validation import (
    check_choice,
    check_identifier,
    check_int,
    check_optional_int,
    check_str,
    check_unix_time,
)

__all__ = [
    "DEFAULT_MAX_SIGNAL_BYTES",
    "Delivery",
    "EntryMode",
    "IfActive",
    "IfIdle",
    "MAX_PRIORITY",
    "Merge",
    "Outcome",
    "Receipt",
    "ReceiptStatus",
    "RunInfo",
    "Signal",
    "StreamPart",
    "ThreadInfo",
    "encode_json",
    "fold",
]

#: The default limit on one encoded signal (and on one result or stream part): 1 MiB.
DEFAULT_MAX_SIGNAL_BYTES = 1 << 20

Outcome: TypeAlias = Literal[
    "wake", "deliver", "queued", "scheduled", "discarded", "rejected", "unchanged"
]
"""What ``send`` did: ``wake`` (this process won the lease and runs the agent), ``deliver``
(handed to the active run, here or in the owner process), ``queued`` (kept for the next run:
behind the active run, or for a worker to pick up), ``scheduled`` (stored, not due before its
``not_before``), ``discarded`` (dropped by policy, or a duplicate of a signal already
accepted), ``rejected`` (refused: the thread is busy, or its pending cap is reached;
``Delivery.reason`` says which), ``unchanged`` (its lane's last signal had the same
``cache_key``: nothing stored)."""

IfActive: TypeAlias = Literal["deliver", "queue", "interrupt", "discard", "reject"]
IfIdle: TypeAlias = Literal["wake", "enqueue", "discard"]
Merge: TypeAlias = Literal["append", "supersede", "coalesce"]
"""What a signal does to the pending signals of its lane (see :class:`Signal`)."""
EntryMode: TypeAlias = Literal["deliver", "queue"]
"""``deliver``: give it to the active run. ``queue``: it starts a run of its own."""

ReceiptStatus: TypeAlias = Literal[
    "pending", "scheduled", "processed", "dead_lettered", "cancelled", "superseded",
    "expired", "dropped",
]


def fold(signals: Sequence[Signal], reducer: Callable[[list[Signal]], Any] | None, *,
         attempt: int, mode: EntryMode) -> Signal:
    """The pending signals of a ``coalesce`` lane handed out as one: the last of them with the
    payload ``reducer`` makes of them all (without one, the list of their payloads), its
    ``folded`` their ids."""
    last = signals[-1]
    payload = reducer(list(signals)) if reducer is not None else [s.payload for s in signals]
    try:
        folded = last.replace(payload=payload)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the reducer for lane {last.lane!r} returned a payload that is not "
                        f"JSON-serialisable: {exc}") from exc
    return folded.evolve(attempt=attempt, mode=mode, folded=tuple(s.id for s in signals))


def encode_json(value: Any, what: str, limit: int | None = None) -> str:
    """``value`` as compact ASCII JSON; ``TypeError`` if it is not JSON,
    :class:`SignalTooLargeError` if the encoding is longer than ``limit`` bytes."""
    try:
        # ASCII output: any str (lone surrogates included) round-trips through Redis and back.
        encoded = compact_json(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
    if limit is not None and len(encoded) > limit:
        raise SignalTooLargeError(what, len(encoded), limit)
    return encoded


@quick_init
@dataclass(frozen=True, slots=True)
class Signal:
    """One input for a thread.

    ``id`` is the deduplication key (generated when absent): the runtime accepts each id once
    per thread (within the receipt retention). ``type`` is free-form (``user``, ``system``,
    ``notification``, ...). ``payload`` must be JSON-serialisable; a ``TypeError`` says so at
    construction, where the signal is encoded, once: it is a snapshot of its payload (a later
    change to a mutable payload is not sent). ``created_at`` is Unix time in seconds.

    How it lands (see docs/dispositions.md):

    * ``priority``: a thread hands out higher priority first, FIFO within a priority
      (``-1_000_000`` to ``1_000_000``).
    * ``lane``: a named lane of the thread (thread-key rules); ``merge`` says what a new signal
      does to the lane's pending ones: ``append`` (nothing), ``supersede`` (replaces the
      pending ones: their receipts become ``superseded``) or ``coalesce`` (at hand-out the
      pending ones are folded into one signal by the runtime's reducer for the lane).
      ``cache_key``: a signal whose lane's last accepted signal had the same cache key stores
      nothing (outcome ``unchanged``).
    * Time (see docs/time.md): ``not_before`` (Unix time; not handed out earlier),
      ``expires_at`` (Unix time; never handed out later: receipt ``expired``), and for a lane
      with ``merge`` ``supersede`` or ``coalesce``, ``debounce_ms`` (the lane is handed out
      once that long passed without a new signal in it) and ``max_wait_ms`` (or once that
      long passed since its first pending signal).

    Set by the runtime on the signals a run hands out (ignored on ``send``): ``attempt`` (1 on
    the first run that handed it to an agent, +1 for each later one), ``mode`` (``deliver`` or
    ``queue``, from the sender's ``if_active``) and ``folded`` (the ids a coalesced signal
    stands for; empty otherwise).
    """

    payload: Any = None
    type: str = "user"
    id: str = field(default_factory=random_id)
    created_at: float = field(default_factory=time.time)
    priority: int = 0
    lane: str | None = None
    merge: Merge = "append"
    cache_key: str | None = None
    not_before: float | None = None
    expires_at: float | None = None
    debounce_ms: int | None = None
    max_wait_ms: int | None = None
    attempt: int = field(default=1, compare=False)
    mode: EntryMode = field(default="deliver", compare=False)
    folded: tuple[str, ...] = field(default=(), compare=False)
    trace_context: dict[str, str] | None = field(default=None, compare=False, repr=False)
    _encoded: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        kind, sid = check_str("signal type", self.type), check_identifier("signal id", self.id)
        if self._encoded is not None:
            return  # decoded from the store: checked when it was sent
        plain = self._plain()
        if not plain:
            self._check_options()
        # Encoded once, here: a payload that is not JSON is a TypeError now, not at send, and
        # the send stores this text. A plain signal's four fields are written directly.
        try:
            encoded = (
                f'{{"id":{json_scalar(sid)},"type":{json_scalar(kind)},"payload":'
                f'{json_scalar(self.payload)},"created_at":{json_scalar(self.created_at)}}}'
                if plain else compact_json(self.to_dict()))
        except (TypeError, ValueError):
            encode_json(self.payload, "signal payload")  # names the payload when it is that
            encode_json(self.to_dict(), f"signal {self.id!r}")
            raise
        object.__setattr__(self, "_encoded", encoded)

    def _plain(self) -> bool:
        """Every option at its default (most signals): no option to check or to encode."""
        return (self.priority == 0 and type(self.priority) is int and self.lane is None
                and self.merge == "append" and self.cache_key is None
                and self.not_before is None and self.expires_at is None
                and self.debounce_ms is None and self.max_wait_ms is None
                and self.trace_context is None)

    def _check_options(self) -> None:
        check_int("priority", self.priority, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
        check_choice("merge", self.merge, MERGES)
        if self.lane is not None:
            check_identifier("lane", self.lane)
        elif self.merge != "append" or self.cache_key is not None:
            raise ValueError(f"merge={self.merge!r} and cache_key need a lane (lane=...)")
        if self.cache_key is not None:
            check_str("cache_key", self.cache_key)
        for name in ("not_before", "expires_at"):
            value = getattr(self, name)
            if value is not None:
                check_unix_time(name, value)
        if (self.not_before is not None and self.expires_at is not None
                and self.expires_at <= self.not_before):
            raise ValueError("expires_at must be later than not_before")
        check_optional_int("debounce_ms", self.debounce_ms)
        check_optional_int("max_wait_ms", self.max_wait_ms)
        if self.debounce_ms is not None and self.merge == "append":
            raise ValueError("debounce_ms needs a lane with merge='coalesce' or 'supersede'")
        if self.max_wait_ms is not None and self.debounce_ms is None:
            raise ValueError("max_wait_ms needs debounce_ms")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what is stored; the delivery fields are not part of it)."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at,
        }
        if self._plain():
            return out
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and value != _DEFAULTS.get(name):
                out[name] = value
        return out

    def encode(self, limit: int | None = None) -> str:
        """The stored JSON form; :class:`SignalTooLargeError` beyond ``limit`` bytes. Computed
        once per signal and kept (a signal is immutable)."""
        encoded = self._encoded
        if encoded is None:
            encoded = encode_json(self.to_dict(), f"signal {self.id!r}")
            object.__setattr__(self, "_encoded", encoded)
        if limit is not None and len(encoded) > limit:
            raise SignalTooLargeError(f"signal {self.id!r}", len(encoded), limit)
        return encoded

    def evolve(
        self, *, attempt: int | None = None, mode: EntryMode | None = None,
        folded: tuple[str, ...] | None = None,
    ) -> Signal:
        """A copy with the delivery fields changed (no re-validation: the rest is the same);
        this signal itself when they are already so (a signal is immutable)."""
        if ((attempt is None or attempt == self.attempt) and (mode is None or mode == self.mode)
                and (folded is None or folded == self.folded)):
            return self
        return self._copy(attempt, mode, folded)

    def _copy(self, attempt: int | None = None, mode: EntryMode | None = None,
              folded: tuple[str, ...] | None = None) -> Signal:
        copy = object.__new__(Signal)
        for name in _STORED:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "attempt", self.attempt if attempt is None else attempt)
        object.__setattr__(copy, "mode", self.mode if mode is None else mode)
        object.__setattr__(copy, "folded", self.folded if folded is None else folded)
        return copy

    def with_trace_context(self, carrier: dict[str, str]) -> Signal:
        """A copy carrying ``carrier`` (W3C trace context headers) as ``trace_context``."""
        copy = self._copy()
        object.__setattr__(copy, "trace_context", dict(carrier))
        object.__setattr__(copy, "_encoded", None)
        return copy

    def replace(self, **changes: Any) -> Signal:
        """A copy with stored fields changed (validated like a new signal)."""
        fields = {name: getattr(self, name) for name in _STORED if name != "_encoded"}
        fields.update(changes)
        return Signal(**fields)

    @classmethod
    def from_dict(
        cls, obj: dict[str, Any], *, attempt: int = 1, mode: EntryMode = "deliver",
        encoded: str | None = None,
    ) -> Signal:
        """Inverse of :meth:`to_dict` (``encoded``: the JSON it was decoded from, if known)."""
        get = obj.get  # (positional, in the order of the fields: keywords cost a third more)
        return cls(get("payload"), obj["type"], obj["id"], float(obj["created_at"]),
                   int(get("priority", 0)), get("lane"), get("merge", "append"),
                   get("cache_key"), get("not_before"), get("expires_at"), get("debounce_ms"),
                   get("max_wait_ms"), attempt, mode, (), get("trace_context"), encoded)


#: The largest ``priority`` (and the opposite of the smallest).
MAX_PRIORITY = 1_000_000
MERGES: tuple[Merge, ...] = ("append", "supersede", "coalesce")
_OPTIONAL = ("priority", "lane", "merge", "cache_key", "not_before", "expires_at",
             "debounce_ms", "max_wait_ms", "trace_context")
_DEFAULTS: dict[str, Any] = {"priority": 0, "merge": "append"}
_STORED = ("payload", "type", "id", "created_at", *_OPTIONAL, "_encoded")


@quick_init
@dataclass(frozen=True, slots=True)
class Receipt:
    """What became of one accepted signal (see ``SignalRuntime.receipt`` and ``wait_for``).

    ``status``: ``pending`` (accepted, not yet acknowledged), ``scheduled`` (accepted, not due
    before its ``not_before``), ``processed`` (a run acknowledged it; ``result`` is what it
    passed to ``ack``), ``dead_lettered`` (it failed ``max_attempts`` attempts; ``error`` says
    what the last run raised, when known), ``cancelled`` (withdrawn before a run took it),
    ``superseded`` (replaced in its lane by ``superseded_by`` before a run took it),
    ``expired`` (its ``expires_at`` passed before a run took it) or ``dropped`` (the oldest of
    the lowest priority when the thread's pending cap was reached with
    ``overflow="drop_oldest"``). ``run_id`` is the run that processed or last had it. ``at``
    is the Unix time of the last change.
    """

    signal_id: str
    status: ReceiptStatus
    run_id: str | None = None
    result: Any = None
    error: str | None = None
    at: float | None = None
    superseded_by: str | None = None

    @property
    def done(self) -> bool:
        """True once the status can no longer change (anything but ``pending`` and
        ``scheduled``)."""
        return self.status not in ("pending", "scheduled")

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON form (without the signal id, which is its key)."""
        out: dict[str, Any] = {"status": self.status}
        for name in ("run_id", "result", "error", "at", "superseded_by"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, signal_id: str, obj: dict[str, Any]) -> Receipt:
        """Inverse of :meth:`to_dict`."""
        return cls(
            signal_id=signal_id,
            status=obj["status"],
            run_id=obj.get("run_id"),
            result=obj.get("result"),
            error=obj.get("error"),
            at=obj.get("at"),
            superseded_by=obj.get("superseded_by"),
        )


@quick_init
@dataclass(frozen=True, slots=True)
class StreamPart:
    """One part of a thread's output stream (see ``Run.emit`` and ``SignalRuntime.stream``).

    ``cursor`` orders parts and resumes a stream exactly after this one. ``kind`` is what the
    agent passed to ``emit`` (``"part"`` by default) or a lifecycle kind the runtime writes:
    ``run.started``, ``signal.received``, ``signal.acked``, ``signal.dead_lettered``,
    ``signal.cancelled``, ``signal.superseded``, ``signal.expired``, ``signal.dropped``,
    ``run.finished``, ``run.failed``, ``run.cancelled``. ``run_id`` is the
    run that wrote it, ``signal_id`` the signal it concerns (if any), ``data`` its JSON
    payload, ``at`` the Unix time it was written.
    """

    cursor: str
    thread_key: str
    run_id: str | None
    kind: str
    data: Any
    signal_id: str | None = None
    at: float | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread as the whole deployment sees it (``SignalRuntime.threads``).

    ``owner``: the run holding the thread's lease (``None``: idle). ``runtime_id``, ``host``,
    ``pid``: the runtime (process) that owns it, when known. ``since``: Unix time that runtime
    took the thread. ``pending``: signals accepted and not yet acknowledged. ``last_activity``:
    Unix time of the last accepted signal. ``paused``: the thread is paused
    (``SignalRuntime.pause``): it keeps accepting signals and hands none out. ``next_due``:
    Unix time of its earliest signal not due yet (``None``: none).
    """

    thread_key: str
    owner: str | None
    runtime_id: str | None
    host: str | None
    pid: int | None
    since: float | None
    pending: int
    last_activity: float | None
    paused: bool = False
    next_due: float | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class Delivery:
    """The result of :meth:`SignalRuntime.send`.

    ``owner`` is the run that has (or will get) the signal when known: the thread's lease
    holder. ``duplicate`` is ``True`` when the signal id was already accepted for this thread;
    nothing was stored or started, and ``receipt`` is the original's receipt. ``backpressure``
    is ``True`` when this process was full (``max_concurrent_runs``) and left the signal
    queued for another worker or for recovery instead of starting a run. ``reason`` says why a
    signal was ``rejected`` or ``discarded``. ``superseded`` and ``dropped`` list the pending
    signals this one replaced in its lane or pushed out of the thread's pending cap.
    """

    outcome: Outcome
    signal_id: str
    thread_key: str
    owner: str | None = None
    duplicate: bool = False
    receipt: Receipt | None = None
    backpressure: bool = False
    reason: str | None = None
    superseded: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()

    @property
    def run_id(self) -> str | None:
        """The run that has or will get the signal (the same as ``owner``)."""
        return self.owner


def check_max_bytes(value: object) -> int:
    """Validate a ``max_signal_bytes`` setting (at least 1 KiB)."""
    return check_int("max_signal_bytes", value, minimum=1024)


@quick_init
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
