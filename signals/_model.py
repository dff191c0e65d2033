"""Value types of the signal runtime: ``Signal``, ``Delivery``, ``Receipt`` and the policies."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from _signal_leases.errors import SignalTooLargeError
from _signal_leases.validation import check_identifier, check_int, check_str

__all__ = [
    "DEFAULT_MAX_SIGNAL_BYTES",
    "Delivery",
    "EntryMode",
    "IfActive",
    "IfIdle",
    "Outcome",
    "Receipt",
    "ReceiptStatus",
    "Signal",
    "StreamPart",
    "ThreadInfo",
    "encode_json",
]

#: The default limit on one encoded signal (and on one result or stream part): 1 MiB.
DEFAULT_MAX_SIGNAL_BYTES = 1 << 20

Outcome: TypeAlias = Literal["wake", "deliver", "queued", "discarded", "rejected"]
"""What ``send`` did: ``wake`` (this process won the lease and runs the agent), ``deliver``
(handed to the active run, here or in the owner process), ``queued`` (kept for the next run:
behind the active run, or for a worker to pick up), ``discarded`` (dropped by policy, or a
duplicate of a signal already accepted), ``rejected`` (refused by policy: the thread is busy)."""

IfActive: TypeAlias = Literal["deliver", "queue", "interrupt", "discard", "reject"]
IfIdle: TypeAlias = Literal["wake", "enqueue", "discard"]
EntryMode: TypeAlias = Literal["deliver", "queue"]
"""``deliver``: give it to the active run. ``queue``: it starts a run of its own."""

ReceiptStatus: TypeAlias = Literal["pending", "processed", "dead_lettered", "cancelled"]


def encode_json(value: Any, what: str, limit: int | None = None) -> str:
    """``value`` as compact ASCII JSON; ``TypeError`` if it is not JSON,
    :class:`SignalTooLargeError` if the encoding is longer than ``limit`` bytes."""
    try:
        # ASCII output: any str (lone surrogates included) round-trips through Redis and back.
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
    if limit is not None and len(encoded) > limit:
        raise SignalTooLargeError(what, len(encoded), limit)
    return encoded


@dataclass(frozen=True, slots=True)
class Signal:
    """One input for a thread.

    ``id`` is the deduplication key (generated when absent): the runtime accepts each id once
    per thread (within the receipt retention). ``type`` is free-form (``user``, ``system``,
    ``notification``, ...). ``payload`` must be JSON-serialisable; a ``TypeError`` says so at
    construction. ``created_at`` is Unix time in seconds.

    Set by the runtime on the signals a run hands out (ignored on ``send``): ``attempt`` (1 on
    the first delivery, +1 each time a run that had it failed, was cancelled or died before
    acknowledging it) and ``mode`` (``deliver`` or ``queue``, from the sender's ``if_active``).
    """

    payload: Any = None
    type: str = "user"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    attempt: int = field(default=1, compare=False)
    mode: EntryMode = field(default="deliver", compare=False)
    _encoded: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_str("signal type", self.type)
        check_identifier("signal id", self.id)
        if self._encoded is None:
            encode_json(self.payload, "signal payload")  # a TypeError now, not at send

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what is stored; ``attempt`` and ``mode`` are not part of it)."""
        return {
            "id": self.id,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at,
        }

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

    def evolve(self, *, attempt: int | None = None, mode: EntryMode | None = None) -> Signal:
        """A copy with the delivery fields changed (no re-validation: the rest is the same)."""
        copy = object.__new__(Signal)
        for name in ("payload", "type", "id", "created_at", "_encoded"):
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "attempt", self.attempt if attempt is None else attempt)
        object.__setattr__(copy, "mode", self.mode if mode is None else mode)
        return copy

    @classmethod
    def from_dict(
        cls, obj: dict[str, Any], *, attempt: int = 1, mode: EntryMode = "deliver",
        encoded: str | None = None,
    ) -> Signal:
        """Inverse of :meth:`to_dict` (``encoded``: the JSON it was decoded from, if known)."""
        return cls(
            payload=obj.get("payload"),
            type=obj["type"],
            id=obj["id"],
            created_at=float(obj["created_at"]),
            attempt=attempt,
            mode=mode,
            _encoded=encoded,
        )


@dataclass(frozen=True, slots=True)
class Receipt:
    """What became of one accepted signal (see ``SignalRuntime.receipt`` and ``wait_for``).

    ``status``: ``pending`` (accepted, not yet acknowledged), ``processed`` (a run acknowledged
    it; ``result`` is what it passed to ``ack``), ``dead_lettered`` (it failed
    ``max_attempts`` deliveries; ``error`` says what the last run raised, when known) or
    ``cancelled`` (withdrawn before a run took it). ``run_id`` is the run that processed or
    last had it. ``at`` is the Unix time of the last change.
    """

    signal_id: str
    status: ReceiptStatus
    run_id: str | None = None
    result: Any = None
    error: str | None = None
    at: float | None = None

    @property
    def done(self) -> bool:
        """True once the status can no longer change (anything but ``pending``)."""
        return self.status != "pending"

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON form (without the signal id, which is its key)."""
        out: dict[str, Any] = {"status": self.status}
        if self.run_id is not None:
            out["run_id"] = self.run_id
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        if self.at is not None:
            out["at"] = self.at
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
        )


@dataclass(frozen=True, slots=True)
class StreamPart:
    """One part of a thread's output stream (see ``Run.emit`` and ``SignalRuntime.stream``).

    ``cursor`` orders parts and resumes a stream exactly after this one. ``kind`` is what the
    agent passed to ``emit`` (``"part"`` by default) or a lifecycle kind the runtime writes:
    ``run.started``, ``signal.received``, ``signal.acked``, ``signal.dead_lettered``,
    ``signal.cancelled``, ``run.finished``, ``run.failed``, ``run.cancelled``. ``run_id`` is the
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


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread as the whole deployment sees it (``SignalRuntime.threads``).

    ``owner``: the run holding the thread's lease (``None``: idle). ``runtime_id``, ``host``,
    ``pid``: the runtime (process) that owns it, when known. ``since``: Unix time that runtime
    took the thread. ``pending``: signals accepted and not yet acknowledged. ``last_activity``:
    Unix time of the last accepted signal.
    """

    thread_key: str
    owner: str | None
    runtime_id: str | None
    host: str | None
    pid: int | None
    since: float | None
    pending: int
    last_activity: float | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """The result of :meth:`SignalRuntime.send`.

    ``owner`` is the run that has (or will get) the signal when known: the thread's lease
    holder. ``duplicate`` is ``True`` when the signal id was already accepted for this thread;
    nothing was stored or started, and ``receipt`` is the original's receipt. ``backpressure``
    is ``True`` when this process was full (``max_concurrent_runs``) and left the signal
    queued for another worker or for recovery instead of starting a run.
    """

    outcome: Outcome
    signal_id: str
    thread_key: str
    owner: str | None = None
    duplicate: bool = False
    receipt: Receipt | None = None
    backpressure: bool = False

    @property
    def run_id(self) -> str | None:
        """The run that has or will get the signal (the same as ``owner``)."""
        return self.owner


def check_max_bytes(value: object) -> int:
    """Validate a ``max_signal_bytes`` setting (at least 1 KiB)."""
    return check_int("max_signal_bytes", value, minimum=1024)
