"""The rules of the reference engine: every call of :class:`~signals.kit.SignalCore`, written
once (the fused calls over them are in :mod:`signals.kit._engine`).

Each method runs inside one transaction over a :class:`~signals.kit._tables.Tables` driver
and is synchronous: the memory store calls it inline (atomic: no ``await`` inside), the SQL
cores call it whole in a worker thread. Notices a call wants sent are returned with its
result and sent by the caller once the transaction committed.

Over 400 lines on purpose: the whole semantics of the inbox (dispositions, time, attempts,
fencing, the pending index) in one place, so that every backend built on it agrees.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from _signal_leases.encoding import compact_json
from signals._model import EntryMode, Receipt, Signal
from signals.kit._capabilities import Notice, PartIn, acked_data, received_data
from signals.kit._core import (
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    Due,
    InboxEntry,
    Limits,
    RunRef,
    Taken,
    ThreadState,
    decode_entry,
    run_runtime,
)
from signals.kit._tables import EntryRow, ReceiptRow, Tables, ThreadRow

__all__ = ["Outbox", "Rules", "emptied", "entry_of"]

_OPEN = ("ready", "later")  # not handed out, not carried: what supersede, cancel, drop may take


@dataclass(slots=True)
class Outbox:
    """Notices to send once the transaction committed: ``(runtime id or None, notice)``."""

    notices: list[tuple[str | None, Notice]] = field(default_factory=list)

    def add(self, runtime_id: str | None, notice: Notice) -> None:
        self.notices.append((runtime_id, notice))


def entry_of(e: EntryRow) -> InboxEntry:
    return decode_entry(str(e.seq), e.body, e.mode, e.attempts, state=e.state, holder=e.holder,
                        due_at=e.due if e.state == "later" else None, signal=e.signal)


def emptied(th: ThreadRow) -> None:
    """Keep the index and the lanes right after entries left: a thread with none pending
    leaves the index, and its lanes' windows close."""
    if th.pending <= 0:
        th.pending, th.look = 0, None
        for state in th.lanes.values():
            state.pop("f", None)
            state.pop("g", None)


def _receipt(r: ReceiptRow) -> Receipt:
    result = json.loads(r.result) if r.result is not None else None
    return Receipt(r.sid, r.status, r.run, result, r.error, r.at, r.by)  # type: ignore[arg-type]


class Rules:
    """See the module docstring. ``retention_ms`` / ``max_receipts``: receipts (the dedup
    window) per thread."""

    def __init__(self, *, retention_ms: int, max_receipts: int) -> None:
        self.retention_s = retention_ms / 1000
        self.max_receipts = max_receipts

    # -- small steps ------------------------------------------------------------------------

    @staticmethod
    def _thread(t: Tables, key: str) -> ThreadRow:
        return t.thread(key) or ThreadRow(key)

    @staticmethod
    def _part(t: Tables, key: str, kind: str, run: str | None, sid: str | None,
              data: object = None, *, text: str | None = None) -> None:
        """Append a lifecycle part: ``data`` encoded, or ``text`` (its JSON already)."""
        if t.streams:
            if data is not None:
                text = compact_json(data)
            t.add_part(key, PartIn(kind, run or "", sid, text))

    @staticmethod
    def _received(t: Tables, key: str, run: str, sid: str, attempt: int) -> None:
        """The ``signal.received`` part (once per hand-out: its JSON written directly)."""
        Rules._part(t, key, "signal.received", run, sid, text=received_data(attempt))

    def _set_receipt(self, t: Tables, key: str, sid: str, status: str, **fields: object) -> None:
        old = t.receipt(key, sid)
        row = ReceiptRow(key, sid, status, old.accepted if old else t.now, at=t.now)
        for name, value in fields.items():
            setattr(row, name, value)
        t.put_receipt(row)

    def _remove(self, t: Tables, th: ThreadRow, gone: Sequence[EntryRow], status: str, *,
                run: str | None = None, by: str | None = None) -> list[str]:
        """Entries leave the inbox without being processed (receipt ``status`` and a part)."""
        if not gone:
            return []
        t.delete(th.key, [e.seq for e in gone])
        th.pending -= len(gone)
        for e in gone:
            self._set_receipt(t, th.key, e.sid, status, run=run, by=by, error=e.error)
            self._part(t, th.key, f"signal.{status}", run, e.sid,
                       {"superseded_by": by} if by else None)
        return [e.sid for e in gone]

    @staticmethod
    def _stale(t: Tables, th: ThreadRow, run: RunRef) -> bool:
        """True when ``run`` is stale: a newer token, or (fused) another live lease holder."""
        if run.token is not None and th.token is not None and run.token < th.token:
            return True
        if t.leases is not None:
            live = t.leases.live(th.key)
            if live is not None and live[0] != run.run_id:
                return True
        return False

    @staticmethod
    def _adopt(t: Tables, th: ThreadRow, run: RunRef) -> None:
        """The first call of a newer run takes the thread over: what other runs hold or were
        carried is ready again (their attempts stay counted)."""
        if th.run == run.run_id:
            return
        for e in t.held_by_others(th.key, run.run_id):
            e.state, e.holder = "ready", None
            t.update(e)
        if th.run is None or run_runtime(th.run) != run_runtime(run.run_id):
            th.since = t.now
        th.run = run.run_id
        if run.token is not None:
            th.token = run.token

    def _fenced(self, t: Tables, th: ThreadRow, run: RunRef) -> bool:
        if self._stale(t, th, run):
            return True
        self._adopt(t, th, run)
        return False

    def _ripen(self, t: Tables, th: ThreadRow) -> None:
        """Entries due by now become ready; expired ones leave (receipt ``expired``)."""
        for e in t.ripe(th.key, t.now):
            e.state, e.due = "ready", None
            t.update(e)
        self._remove(t, th, t.expired(th.key, t.now), "expired")

    def _ack(self, t: Tables, th: ThreadRow, run: RunRef, acks: Sequence[Ack]) -> None:
        for a in acks:
            e = t.by_signal(th.key, a.signal_id)
            if e is None or str(e.seq) != a.entry_id:
                continue  # acknowledged before, withdrawn or dead-lettered: keep that receipt
            t.delete(th.key, [e.seq])
            th.pending -= 1
            self._set_receipt(t, th.key, e.sid, "processed", run=run.run_id, result=a.result)
            self._part(t, th.key, "signal.acked", run.run_id, e.sid,  # (result: its JSON)
                       text=acked_data(a.result))
        if acks:
            emptied(th)

    def _dead(self, t: Tables, th: ThreadRow, e: EntryRow, run: str) -> None:
        t.delete(th.key, [e.seq])
        th.pending -= 1
        attempts = e.attempts - 1
        self._set_receipt(t, th.key, e.sid, "dead_lettered", run=run, error=e.error,
                          body=e.body, mode=e.mode, attempts=attempts)
        self._part(t, th.key, "signal.dead_lettered", run, e.sid,
                   {"attempts": attempts, "error": e.error})

    @staticmethod
    def _index(th: ThreadRow, at: float) -> None:
        th.look = at if th.look is None else min(th.look, at)

    @staticmethod
    def _has_work(t: Tables, th: ThreadRow) -> bool:
        """Entries that are not waiting for their due time (ready, carried, held)."""
        return th.pending > 0 and (t.best(th.key, None) is not None
                                   or bool(t.held_by_others(th.key, "")))

    # -- the core ---------------------------------------------------------------------------

    def accept(self, t: Tables, key: str, signal: Signal, mode: EntryMode,
               limits: Limits = NO_LIMITS, *, index: bool = True, save: bool = True
               ) -> tuple[Accepted, ThreadRow, EntryRow | None]:
        """Accept ``signal``: its outcome, the thread's row and the entry stored (``None``
        unless fresh). ``save=False``: the caller inserts the entry and saves the row (when
        fresh), so that it may change them first (one write each)."""
        t.preload(key, (signal.id,), self.retention_s)
        now = t.now
        th = self._thread(t, key)
        t.trim_receipts(key, now - self.retention_s, self.max_receipts)
        known = t.receipt(key, signal.id)
        if known is not None:
            return Accepted("duplicate", receipt=_receipt(known)), th, None
        waiting = t.by_signal(key, signal.id)
        if waiting is not None:  # still pending, its receipt trimmed (past max_receipts)
            status = "scheduled" if waiting.state == "later" else "pending"
            return Accepted("duplicate", receipt=Receipt(signal.id, status)), th, None  # type: ignore[arg-type]
        lane = signal.lane
        state = th.lanes.get(lane, {}) if lane else {}
        if lane and signal.cache_key is not None and state.get("c") == signal.cache_key:
            return Accepted("unchanged"), th, None
        victims = ([e for e in t.lane(key, lane) if e.state in _OPEN]
                   if lane and signal.merge == "supersede" else [])
        cap = limits.max_pending
        dropped: list[str] = []
        if cap is not None and th.pending - len(victims) >= cap:
            drop = t.droppable(key) if limits.overflow == "drop_oldest" else None
            if drop is None or drop in victims:
                reason = (f"thread {key!r} has {th.pending} pending signals, the most "
                          f"max_pending_per_thread={cap} allows")
                return Accepted("rejected", reason=reason), th, None
            dropped = self._remove(t, th, [drop], "dropped")
        superseded = self._remove(t, th, victims, "superseded", by=signal.id)
        due = signal.not_before
        if lane is not None:
            state = th.lanes.setdefault(lane, {})
            if signal.cache_key is not None:
                state["c"] = signal.cache_key
            else:
                state.pop("c", None)
            if signal.debounce_ms is not None:
                first = state.get("f") or now
                gate = now + signal.debounce_ms / 1000
                if signal.max_wait_ms is not None:
                    gate = min(gate, first + signal.max_wait_ms / 1000)
                state["f"], state["g"] = first, gate
                for other in t.lane(key, lane):
                    if other.state in _OPEN:  # a new signal re-arms the lane's window
                        other.due = max(gate, other.nb or 0)
                        other.state = "later" if other.due > now else "ready"
                        t.update(other)
                due = max(gate, due or 0)
            elif "f" not in state:
                state["f"] = now
        later = due is not None and due > now
        th.seq += 1
        e = EntryRow(key, th.seq, signal.id, signal.encode(), mode, signal.priority, lane,
                     signal.merge, "later" if later else "ready", due if later else None,
                     signal.not_before, signal.expires_at, signal=signal)
        if save:
            t.insert(e)
        th.pending += 1
        th.last = now
        scheduled = signal.not_before is not None and signal.not_before > now
        status = "scheduled" if scheduled else "pending"
        t.put_receipt(ReceiptRow(key, signal.id, status, now, at=now))
        if index or later:
            self._index(th, due if later and due is not None else now)
        if save:
            t.save_thread(th)
        receipt = Receipt(signal.id, status, at=now)  # type: ignore[arg-type]
        return Accepted("fresh", str(e.seq), receipt, None, tuple(superseded), tuple(dropped),
                        due if later else None), th, e

    def take(self, t: Tables, key: str, run: RunRef, acks: Sequence[Ack], max_attempts: int,
             first: bool) -> Taken:
        t.preload(key, [a.signal_id for a in acks], None)
        th = t.thread(key)
        if th is None:
            return Taken()
        if self._fenced(t, th, run):
            return Taken(fenced=True)
        self._ack(t, th, run, acks)
        if th.paused:
            t.save_thread(th)
            return Taken(paused=True, pending=th.pending)
        self._ripen(t, th)
        dead: list[str] = []
        out: list[EntryRow] = []
        while not out:
            best = t.best(key, run.run_id)
            if best is None:
                emptied(th)
                t.save_thread(th)
                return Taken(next_due=t.next_due(key), dead=tuple(dead), pending=th.pending)
            if not first and best.mode == "queue" and best.state == "ready":
                t.save_thread(th)
                return Taken(stopped=True, more=True, dead=tuple(dead), pending=th.pending)
            group = [best]
            if best.lane is not None and best.merge == "coalesce":
                group = [x for x in t.lane(key, best.lane) if x.state == "ready"
                         or (x.state == "carried" and x.holder == run.run_id)]
            for e in group:
                if not (e.state == "carried" and e.holder == run.run_id):
                    e.attempts += 1
                if e.attempts > max_attempts:
                    self._dead(t, th, e, run.run_id)
                    dead.append(e.sid)
                    continue
                if e.state != "carried":
                    self._received(t, key, run.run_id, e.sid, e.attempts)
                e.state, e.holder = "held", run.run_id
                t.update(e)
                out.append(e)
        for lane in {e.lane for e in out if e.lane is not None}:
            if not t.lane_open(key, lane):
                state = th.lanes.get(lane, {})
                state.pop("f", None)  # the lane's next window starts with its next signal
                state.pop("g", None)
        emptied(th)
        t.save_thread(th)
        more = t.best(key, run.run_id) is not None
        return Taken(tuple(entry_of(e) for e in out), more=more, dead=tuple(dead),
                     next_due=None if more else t.next_due(key), pending=th.pending)

    def settle(self, t: Tables, key: str, run: RunRef, acks: Sequence[Ack],
               failed: Sequence[str], returned: Sequence[str], error: str | None) -> bool:
        t.preload(key, [*returned, *(a.signal_id for a in acks), *failed], None)
        th = t.thread(key)
        if th is None:
            return True
        if self._stale(t, th, run):
            return False
        back: list[EntryRow] = []
        for sid in returned:  # before the takeover: a carried entry still shows its run
            e = t.by_signal(key, sid)
            if e is not None and (e.state == "carried" or (
                    e.state == "held" and e.holder == run.run_id)):
                e.state, e.holder, e.attempts = "ready", None, max(0, e.attempts - 1)
                t.update(e)
                back.append(e)
        self._adopt(t, th, run)
        self._ack(t, th, run, acks)
        for sid in failed:
            e = t.by_signal(key, sid)
            if e is not None and e.holder == run.run_id:
                e.state, e.holder, e.error = "ready", None, error
                t.update(e)
                back.append(e)
        self._give_way(t, th, back)
        emptied(th)
        t.save_thread(th)
        return True

    def _give_way(self, t: Tables, th: ThreadRow, back: list[EntryRow]) -> None:
        """Entries ready again (all of them first, so the order of the lists does not
        matter): one with a newer pending ``supersede`` signal in its lane (accepted while a
        run held it) is replaced by it now, as it would have been then."""
        for e in sorted(back, key=lambda x: x.seq):
            if e.lane is None:
                continue
            for newer in t.lane(th.key, e.lane):
                if newer.seq > e.seq and newer.state in _OPEN and newer.merge == "supersede":
                    self._remove(t, th, [e], "superseded", by=newer.sid)
                    break

    def withdraw(self, t: Tables, key: str, signal_ids: Sequence[str] | None,
                 held: bool) -> list[str]:
        th = t.thread(key)
        if th is None:
            return []
        rows = (t.rows(key, th.pending, 0) if signal_ids is None
                else [e for e in (t.by_signal(key, s) for s in signal_ids) if e is not None])
        gone = [e for e in rows if held or e.state in _OPEN]
        removed = self._remove(t, th, gone, "cancelled")
        emptied(th)
        t.save_thread(th)
        return [s for s in (signal_ids or removed) if s in removed]

    def entries(self, t: Tables, key: str, limit: int, offset: int) -> list[InboxEntry]:
        return [entry_of(e) for e in t.rows(key, limit, offset)]

    def receipt(self, t: Tables, key: str, signal_id: str) -> Receipt | None:
        r = t.receipt(key, signal_id)
        if r is None or r.accepted < t.now - self.retention_s:
            return None
        return _receipt(r)

    def due(self, t: Tables, limit: int, until: float | None) -> Due:
        horizon = t.now if until is None else until
        threads = t.due_threads(horizon, limit)
        return Due(threads, t.next_look(max(horizon, t.now)))

    def look_at(self, t: Tables, key: str, at: float) -> None:
        th = t.thread(key)
        if th is not None:
            th.look = at if th.pending > 0 and not th.paused else None
            t.save_thread(th)

    def pause(self, t: Tables, key: str, paused: bool) -> bool:
        th = self._thread(t, key)
        before = th.paused
        th.paused = paused
        th.look = None if paused or th.pending == 0 else t.now
        t.save_thread(th)
        return before

    def describe(self, t: Tables, keys: Sequence[str]) -> dict[str, ThreadState]:
        out: dict[str, ThreadState] = {}
        for key in keys:
            th = t.thread(key)
            if th is None:
                out[key] = ThreadState()
                continue
            due = t.next_due(key)
            ready = self._has_work(t, th) or (due is not None and due <= t.now)
            out[key] = ThreadState(th.pending, ready, th.paused, th.last, th.since, th.run, due,
                                   th.abort)
        return out

    def dead_letters(self, t: Tables, key: str, limit: int) -> list[DeadLetter]:
        out = []
        for r in t.dead(key, limit):
            entry = decode_entry(r.sid, r.body or "{}", r.mode or "deliver", r.attempts)
            out.append(DeadLetter(entry.signal, r.attempts, r.error, r.at or r.accepted))
        return out

    def revive(self, t: Tables, key: str, signal_ids: Sequence[str] | None,
               purge: bool) -> list[str]:
        th = self._thread(t, key)
        rows = t.dead(key, 1 << 30)
        if signal_ids is not None:
            wanted = set(signal_ids)
            rows = [r for r in rows if r.sid in wanted]
        for r in rows:
            if purge:
                r.body = None
                t.put_receipt(r)
                continue
            signal = decode_entry(r.sid, r.body or "{}", r.mode or "deliver", 0).signal
            th.seq += 1
            t.insert(EntryRow(key, th.seq, r.sid, r.body or "{}", r.mode or "deliver",
                              signal.priority, signal.lane, signal.merge))
            th.pending += 1
            t.put_receipt(ReceiptRow(key, r.sid, "pending", r.accepted, at=t.now))
            self._index(th, t.now)
        t.save_thread(th)
        return [r.sid for r in rows]
