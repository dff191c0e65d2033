"""The steps of a send that the runtime (:meth:`SignalRuntime.send`) and the sender with no
runtime (:class:`~signals.RedisSignalSender`) share: the arguments, the refusals, and the
outcome of a routed signal. Light on purpose: no anyio, so a sender imports little.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from _signal_leases.running import unix_now
from _signal_leases.validation import check_choice, check_identifier, check_optional_int
from signals._model import Delivery, EntryMode, IfActive, IfIdle, Outcome, Signal
from signals._telemetry import Telemetry
from signals.kit._core import Limits, Overflow

if TYPE_CHECKING:
    from _signal_leases.logs import Logger
    from signals.kit._capabilities import Routed

__all__ = ["check_limits", "delivered", "prepare", "refused_after", "refused_before", "timed"]

_IF_ACTIVE = ("deliver", "queue", "interrupt", "discard", "reject")
_IF_IDLE = ("wake", "enqueue", "discard")
_OVERFLOW: tuple[Overflow, ...] = ("reject", "drop_oldest")


def check_limits(max_pending_per_thread: int | None, overflow: Overflow) -> Limits:
    """The pending cap of a runtime's or a sender's sends, checked."""
    return Limits(check_optional_int("max_pending_per_thread", max_pending_per_thread),
                  check_choice("overflow", overflow, _OVERFLOW))


def timed(signal: Signal, delay_ms: int | None, expires_in_ms: int | None) -> Signal:
    """``signal`` with the ``send`` shorthands for ``not_before`` and ``expires_at``."""
    if delay_ms is None and expires_in_ms is None:
        return signal
    changes: dict[str, float] = {}
    now = unix_now()
    if check_optional_int("delay_ms", delay_ms, minimum=0) is not None:
        changes["not_before"] = now + delay_ms / 1000  # type: ignore[operator]
    if check_optional_int("expires_in_ms", expires_in_ms) is not None:
        changes["expires_at"] = now + expires_in_ms / 1000  # type: ignore[operator]
    return signal.replace(**changes) if changes else signal


def prepare(thread_key: str, signal: Signal | Any, if_active: IfActive, if_idle: IfIdle,
            delay_ms: int | None, expires_in_ms: int | None) -> Signal:
    """The arguments of ``send`` checked (each error names its argument), and the signal to
    store: a value that is not a :class:`Signal` becomes the payload of a ``user`` signal."""
    check_identifier("thread key", thread_key)
    if not isinstance(signal, Signal):
        signal = Signal(payload=signal)
    check_choice("if_active", if_active, _IF_ACTIVE)
    check_choice("if_idle", if_idle, _IF_IDLE)
    return timed(signal, delay_ms, expires_in_ms)


def refused_before(owner: str | None, thread_key: str, signal: Signal, if_active: IfActive,
                   if_idle: IfIdle, log: Logger) -> Delivery | None:
    """The refusal of ``if_active="discard"/"reject"`` (an owner) or ``if_idle="discard"``
    (none), decided before anything is stored; ``None`` to go on."""
    if owner is not None and if_active in ("discard", "reject"):
        outcome: Outcome = "discarded" if if_active == "discard" else "rejected"
        log.info("signal.refused", outcome=outcome, owner=owner)
        return Delivery(outcome, signal.id, thread_key, owner,
                        reason=f"the thread is active (if_active={if_active!r})")
    if owner is None and if_idle == "discard":
        log.info("signal.refused", outcome="discarded", reason="idle")
        return Delivery("discarded", signal.id, thread_key,
                        reason="the thread is idle (if_idle='discard')")
    return None


def refused_after(routed: Routed, thread_key: str, signal: Signal,
                  log: Logger) -> Delivery | None:
    """The delivery of a signal the core did not store (a duplicate, counted in the
    ``signals.duplicates`` metric; ``unchanged``; ``rejected``); ``None`` for a stored
    one."""
    accepted = routed.accepted
    if accepted.outcome == "duplicate":
        Telemetry.count("duplicates")
        log.info("signal.duplicate", owner=routed.owner,
                 status=accepted.receipt.status if accepted.receipt else None)
        return Delivery("discarded", signal.id, thread_key, routed.owner, duplicate=True,
                        receipt=accepted.receipt)
    if accepted.outcome in ("unchanged", "rejected"):
        log.info("signal.refused", outcome=accepted.outcome, reason=accepted.reason)
        return Delivery(accepted.outcome, signal.id, thread_key, routed.owner,
                        reason=accepted.reason)
    return None


def delivered(routed: Routed, thread_key: str, signal: Signal, mode: EntryMode, log: Logger,
              *, backpressure: bool = False) -> Delivery:
    """The delivery of a stored signal that started no run here: ``scheduled`` (not due
    yet), ``queued`` (no owner, or ``if_active="queue"``) or ``deliver`` (to the owner).
    A warning ``signal.unheard`` when the core tells that no worker heard of it."""
    accepted, owner = routed.accepted, routed.owner
    if accepted.due_at is not None:
        log.info("signal.accepted", outcome="scheduled", run_id=owner)
        return Delivery("scheduled", signal.id, thread_key, owner,
                        superseded=accepted.superseded, dropped=accepted.dropped)
    outcome: Outcome = "queued" if mode == "queue" or owner is None else "deliver"
    log.info("signal.accepted", outcome=outcome, run_id=owner, backpressure=backpressure)
    if routed.workers == 0:  # (a core that can tell: Redis, not a Cluster)
        log.warning("signal.unheard", reason="no worker listens under this key prefix: the "
                    "signal waits in the inbox until one starts (is the key prefix the "
                    "workers'?)")
    return Delivery(outcome, signal.id, thread_key, owner, backpressure=backpressure,
                    superseded=accepted.superseded, dropped=accepted.dropped)
