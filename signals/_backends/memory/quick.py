"""The in-memory store's quick path: the two steps every routed signal takes, written
directly over the store's dicts (no :class:`~signals._backends.memory.tables.MemoryTables`,
no engine call).

* :func:`carry`: a plain signal (no lane, no ``not_before``, no ``expires_at``, ``deliver``,
  no ``interrupt``) for a thread whose run holds a live lease and is under its pending cap:
  stored already carried to that run, its receipt ``pending``, a ``signal.received`` part,
  and the owner's runtime told with the entry.
* :func:`settle_acks`: a run that still holds its thread acknowledges what it was handed.

Each returns ``None`` when its case does not hold; the store then runs the engine, whose
rules (:mod:`signals.kit._rules`) these follow step for step. ``tests/test_memory_quick.py``
runs the same random calls through both and compares everything a caller can see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from signals._backends.memory.tables import insert_row, remove_row, trim_receipts
from signals._model import EntryMode, Receipt, Signal
from signals.kit._capabilities import CARRY_LIMIT, Notice, Routed, acked_data, received_data
from signals.kit._core import Accepted, Ack, Limits, RunRef, run_runtime
from signals.kit._rules import emptied, entry_of
from signals.kit._tables import EntryRow, ReceiptRow

if TYPE_CHECKING:
    from signals._backends.memory.store import InMemorySignalStore

__all__ = ["carry", "settle_acks"]

_FIRST_ATTEMPT = received_data(1)  # (the text of every carry's signal.received part)


def carry(store: InMemorySignalStore, key: str, signal: Signal, mode: EntryMode,
          limits: Limits, interrupt: bool, sender: str | None) -> Routed | None:
    """The fused route's carry (see the module docstring), or ``None``."""
    if (mode != "deliver" or interrupt or signal.lane is not None
            or signal.not_before is not None or signal.expires_at is not None):
        return None
    state = store._state
    th = state.threads.get(key)
    box = state.inboxes.get(key)
    leases = store.leases
    if th is None or box is None or th.paused or leases is None:
        return None
    cap = limits.max_pending
    if cap is not None and th.pending >= cap:
        return None
    held = leases.table.holder(key, leases.clock())
    body = signal.encode()
    if held is None or len(body) > CARRY_LIMIT:
        return None
    now = store._clock()
    sid = signal.id
    receipts = box.receipts
    engine = store.engine
    trim_receipts(receipts, now - engine.retention_s, engine.max_receipts)
    if sid in receipts or sid in box.by_sid:
        return None  # a duplicate: the engine answers it
    owner = held[0]
    seq = th.seq = th.seq + 1
    e = EntryRow(key, seq, sid, body, "deliver", signal.priority, None, signal.merge, "carried",
                 holder=owner, attempts=1, signal=signal)
    insert_row(box, e)
    th.pending += 1
    th.last = now
    receipts[sid] = ReceiptRow(key, sid, "pending", now, at=now)
    store._append(key, "signal.received", owner, sid, _FIRST_ATTEMPT, now)
    look = th.look
    th.look = now if look is None or now < look else look  # (the step is whole: then notify)
    if run_runtime(owner) != sender:
        store._notify(run_runtime(owner), Notice("signal", key, owner, entry=entry_of(e)))
    accepted = Accepted("fresh", str(seq), Receipt(sid, "pending", at=now))
    return Routed(accepted, owner, carried=True)


def settle_acks(store: InMemorySignalStore, key: str, run: RunRef, acks: Sequence[Ack]
                ) -> bool | None:
    """The settle of a run that holds ``key`` and only acknowledges (see the module
    docstring): ``False`` when the run is stale, or ``None``."""
    state = store._state
    th = state.threads.get(key)
    box = state.inboxes.get(key)
    leases = store.leases
    if th is None or box is None or leases is None or th.run != run.run_id:
        return None
    if run.token is not None and th.token is not None and run.token < th.token:
        return False
    held = leases.table.holder(key, leases.clock())
    if held is not None and held[0] != run.run_id:
        return False
    now = store._clock()
    by_sid, receipts = box.by_sid, box.receipts
    for a in acks:
        seq = by_sid.get(a.signal_id)
        if seq is None or str(seq) != a.entry_id:
            continue  # acknowledged before, withdrawn or dead-lettered: keep that receipt
        e = remove_row(box, seq)
        assert e is not None
        th.pending -= 1
        old = receipts.get(e.sid)
        receipts[e.sid] = ReceiptRow(key, e.sid, "processed", old.accepted if old else now,
                                     at=now, run=run.run_id, result=a.result)
        store._append(key, "signal.acked", run.run_id, e.sid, acked_data(a.result), now)
    emptied(th)
    return True
