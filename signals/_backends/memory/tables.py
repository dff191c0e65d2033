"""The engine's driver in memory: per-thread dicts and heaps (see ``signals.kit._tables``).

Hand-out is O(log n) in the thread's pending count: a heap of ready entries by (priority,
seq) and one of ``later`` entries by due time, both pruned lazily. The pending index is a
dict scanned by the recovery pass (O(indexed threads) per pass, in memory).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from signals.kit._tables import EntryRow, LeaseAccess, ReceiptRow, ThreadRow

if TYPE_CHECKING:
    from leases import InMemoryLeaseProvider
    from signals._backends.memory.output import MemoryOutput
    from signals.kit._capabilities import PartIn

__all__ = ["MemoryState", "MemoryTables", "insert_row", "remove_row", "trim_receipts"]


@dataclass(slots=True)
class _Inbox:
    rows: dict[int, EntryRow] = field(default_factory=dict)
    by_sid: dict[str, int] = field(default_factory=dict)
    ready: list[tuple[int, int]] = field(default_factory=list)  # (-prio, seq), lazily pruned
    later: list[tuple[float, int]] = field(default_factory=list)  # (due, seq), lazily pruned
    expiring: list[tuple[float, int]] = field(default_factory=list)  # (expires, seq)
    carried: set[int] = field(default_factory=set)  # seqs carried or held
    lanes: dict[str, set[int]] = field(default_factory=dict)
    # In acceptance order; an OrderedDict, as the oldest goes for each new one past the cap (a
    # dict would scan the slots its deletions left, up to thousands, to find its first item).
    receipts: OrderedDict[str, ReceiptRow] = field(default_factory=OrderedDict)


class MemoryState:
    """Everything one in-memory store keeps."""

    def __init__(self) -> None:
        self.threads: dict[str, ThreadRow] = {}
        self.inboxes: dict[str, _Inbox] = {}

    def inbox(self, key: str) -> _Inbox:
        box = self.inboxes.get(key)
        if box is None:
            box = self.inboxes[key] = _Inbox()
        return box


def _file(box: _Inbox, e: EntryRow) -> None:
    if e.state == "ready":
        heapq.heappush(box.ready, (-e.prio, e.seq))
        box.carried.discard(e.seq)
    elif e.state == "later" and e.due is not None:
        heapq.heappush(box.later, (e.due, e.seq))
        box.carried.discard(e.seq)
    else:
        box.carried.add(e.seq)


def insert_row(box: _Inbox, e: EntryRow) -> None:
    """Store a new entry in ``box`` (and file it by its state)."""
    box.rows[e.seq] = e
    box.by_sid[e.sid] = e.seq
    if e.lane is not None:
        box.lanes.setdefault(e.lane, set()).add(e.seq)
    if e.expires is not None:
        heapq.heappush(box.expiring, (e.expires, e.seq))
    _file(box, e)


def remove_row(box: _Inbox, seq: int) -> EntryRow | None:
    """Take entry ``seq`` out of ``box`` (its heap items are pruned lazily); the entry."""
    e = box.rows.pop(seq, None)
    if e is None:
        return None
    box.by_sid.pop(e.sid, None)
    box.carried.discard(seq)
    if e.lane is not None:
        members = box.lanes.get(e.lane)
        if members is not None:
            members.discard(seq)
            if not members:
                del box.lanes[e.lane]
    return e


def trim_receipts(receipts: OrderedDict[str, ReceiptRow], before: float, keep: int) -> None:
    """Forget the oldest receipts: those accepted by ``before``, and any past ``keep``
    (``receipts`` is in acceptance order)."""
    while receipts:
        if receipts[next(iter(receipts))].accepted > before and len(receipts) <= keep:
            return
        receipts.popitem(last=False)


class _Leases:
    """The engine's view of an :class:`~leases.InMemoryLeaseProvider` (same clock)."""

    def __init__(self, provider: InMemoryLeaseProvider) -> None:
        self._table = provider.table
        self._now = provider.clock()

    def live(self, key: str) -> tuple[str, int | None, str | None] | None:
        held = self._table.holder(key, self._now)
        return None if held is None else (*held, None)

    def grant(self, key: str, owner: str, ttl_ms: int, session: str | None) -> int | None:
        got = self._table.acquire(key, owner, ttl_ms, self._now, session)
        return got.token if got.acquired else None

    def release(self, key: str, owner: str) -> None:
        self._table.release(key, owner, self._now)

    def left_ms(self, key: str) -> int | None:
        info = self._table.info(key, self._now)
        return None if info is None else info.ttl_ms_remaining


class MemoryTables:
    """One engine call's view of a :class:`MemoryState` (see the module docstring)."""

    def __init__(self, state: MemoryState, now: float, output: MemoryOutput | None,
                 leases: InMemoryLeaseProvider | None) -> None:
        self._s = state
        self.now = now
        self._output = output
        self.streams = output is not None
        self.leases: LeaseAccess | None = _Leases(leases) if leases is not None else None

    # -- threads ----------------------------------------------------------------------------

    def preload(self, key: str, sids: Sequence[str], receipts_window: float | None) -> None:
        """Nothing to read ahead in memory."""

    def thread(self, key: str) -> ThreadRow | None:
        return self._s.threads.get(key)

    def save_thread(self, row: ThreadRow) -> None:
        self._s.threads[row.key] = row

    # -- entries ----------------------------------------------------------------------------

    def _box(self, key: str) -> _Inbox:
        return self._s.inbox(key)

    def insert(self, e: EntryRow) -> None:
        insert_row(self._box(e.thread), e)

    def update(self, e: EntryRow) -> None:
        _file(self._box(e.thread), e)  # rows are shared objects: only the heaps change

    def delete(self, key: str, seqs: Sequence[int]) -> None:
        box = self._box(key)
        for seq in seqs:
            remove_row(box, seq)

    def by_signal(self, key: str, sid: str) -> EntryRow | None:
        box = self._s.inboxes.get(key)
        if box is None:
            return None
        seq = box.by_sid.get(sid)
        return None if seq is None else box.rows.get(seq)

    def best(self, key: str, run: str | None) -> EntryRow | None:
        box = self._s.inboxes.get(key)
        if box is None:
            return None
        while box.ready:
            prio, seq = box.ready[0]
            e = box.rows.get(seq)
            if e is not None and e.state == "ready" and -e.prio == prio:
                break
            heapq.heappop(box.ready)
        top = box.rows[box.ready[0][1]] if box.ready else None
        if run is not None:
            for seq in box.carried:
                e = box.rows[seq]
                if e.state == "carried" and e.holder == run and (
                    top is None or (-e.prio, e.seq) < (-top.prio, top.seq)
                ):
                    top = e
        return top

    def lane(self, key: str, lane: str) -> list[EntryRow]:
        box = self._s.inboxes.get(key)
        if box is None:
            return []
        return [box.rows[s] for s in sorted(box.lanes.get(lane, ()))]

    def lane_open(self, key: str, lane: str) -> bool:
        box = self._s.inboxes.get(key)
        if box is None:
            return False
        return any(box.rows[s].state in ("ready", "later") for s in box.lanes.get(lane, ()))

    def ripe(self, key: str, until: float) -> list[EntryRow]:
        box = self._s.inboxes.get(key)
        out: list[EntryRow] = []
        while box is not None and box.later and box.later[0][0] <= until:
            due, seq = heapq.heappop(box.later)
            e = box.rows.get(seq)
            if e is not None and e.state == "later" and e.due == due:
                out.append(e)
        return out

    def expired(self, key: str, now: float) -> list[EntryRow]:
        box = self._s.inboxes.get(key)
        out: list[EntryRow] = []
        while box is not None and box.expiring and box.expiring[0][0] <= now:
            _, seq = heapq.heappop(box.expiring)
            e = box.rows.get(seq)
            if e is not None and e.state != "held":
                out.append(e)
        return out

    def held_by_others(self, key: str, run: str) -> list[EntryRow]:
        box = self._s.inboxes.get(key)
        if box is None:
            return []
        return [e for s in list(box.carried) if (e := box.rows[s]).holder != run]

    def rows(self, key: str, limit: int, offset: int) -> list[EntryRow]:
        box = self._s.inboxes.get(key)
        if box is None:
            return []
        ordered = sorted(box.rows.values(), key=lambda e: (-e.prio, e.seq))
        return ordered[offset: offset + limit]

    def droppable(self, key: str) -> EntryRow | None:
        box = self._s.inboxes.get(key)
        open_rows = [e for e in box.rows.values() if e.state in ("ready", "later")] if box else []
        return min(open_rows, key=lambda e: (e.prio, e.seq), default=None)

    def next_due(self, key: str) -> float | None:
        box = self._s.inboxes.get(key)
        while box is not None and box.later:
            due, seq = box.later[0]
            e = box.rows.get(seq)
            if e is not None and e.state == "later" and e.due == due:
                return due
            heapq.heappop(box.later)
        return None

    # -- receipts ---------------------------------------------------------------------------

    def receipt(self, key: str, sid: str) -> ReceiptRow | None:
        box = self._s.inboxes.get(key)
        return None if box is None else box.receipts.get(sid)

    def put_receipt(self, r: ReceiptRow) -> None:
        receipts = self._box(r.thread).receipts
        receipts[r.sid] = r  # an update keeps its place: order stays by acceptance

    def trim_receipts(self, key: str, before: float, keep: int) -> None:
        box = self._s.inboxes.get(key)
        if box is not None:
            trim_receipts(box.receipts, before, keep)

    def dead(self, key: str, limit: int) -> list[ReceiptRow]:
        box = self._s.inboxes.get(key)
        if box is None:
            return []
        found = [r for r in box.receipts.values()
                 if r.status == "dead_lettered" and r.body is not None]
        return sorted(found, key=lambda r: r.at or 0)[:limit]

    # -- the pending index ------------------------------------------------------------------

    def due_threads(self, until: float, limit: int) -> list[str]:
        due = sorted((t.look, t.key) for t in self._s.threads.values()
                     if t.look is not None and t.look <= until and not t.paused)
        leases = self.leases
        return [key for _, key in due if leases is None or leases.live(key) is None][:limit]

    def next_look(self, after: float) -> float | None:
        return min((t.look for t in self._s.threads.values()
                    if t.look is not None and t.look > after and not t.paused), default=None)

    # -- output -----------------------------------------------------------------------------

    def add_part(self, key: str, part: PartIn) -> str:
        assert self._output is not None
        return self._output._append(key, part.kind, part.run_id, part.signal_id, part.data,
                                    self.now)
