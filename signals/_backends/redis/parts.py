"""Stream parts on Redis: an entry or an announcement decoded as a
:class:`~signals.StreamPart`, and who waits on which thread's stream."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio

from _signal_leases.redis.support import text
from signals._model import StreamPart

__all__ = ["Waiter", "Waiters", "decode_announcement", "decode_part"]


def _part(thread_key: str, cursor: str, kind: str, run: str, sid: str, at: str,
          data: str) -> StreamPart:
    return StreamPart(
        cursor=cursor,
        thread_key=thread_key,
        run_id=run or None,
        kind=kind,
        data=json.loads(data) if data else None,
        signal_id=sid or None,
        at=float(at) if at else None,
    )


def decode_part(thread_key: str, raw_id: Any, flat: Any) -> StreamPart:
    """A stream entry as a :class:`StreamPart`."""
    pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    fields = {text(k): text(v) for k, v in pairs}
    return _part(thread_key, text(raw_id), fields.get("k", "part"), fields.get("r", ""),
                 fields.get("s", ""), fields.get("t", ""), fields.get("d", ""))


def decode_announcement(thread_key: str, note: Any) -> tuple[str, StreamPart | None]:
    """A part's announcement (see ``add_part`` in ``lua``): its cursor, and the part when the
    announcement carries it (``None``: announced by its id only, or by an older writer)."""
    note = text(note)
    if not note.startswith("["):
        return note, None
    cursor, kind, run, sid, at, data = json.loads(note)
    return cursor, _part(thread_key, cursor, kind, run, sid, at, data)


@dataclass(eq=False)
class Waiter:
    """One ``wait`` call of a follower: woken with the parts after ``after``."""

    thread_key: str
    after: str  # "0-0": from the start
    event: anyio.Event = field(default_factory=anyio.Event)
    parts: list[StreamPart] = field(default_factory=list)

    @property
    def resume_at(self) -> str:
        """Where a read for this waiter goes on: after its last part once woken (its reader
        asks again from there), else after ``after``."""
        return self.parts[-1].cursor if self.parts and self.event.is_set() else self.after


class Waiters(dict[str, list[Waiter]]):
    """Who waits on which thread's stream."""

    def add(self, thread_key: str, after: str | None) -> Waiter:
        waiter = Waiter(thread_key, after or "0-0")
        self.setdefault(thread_key, []).append(waiter)
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        """Forget ``waiter``; ``True`` when nobody waits on its thread any more."""
        waiters = self.get(waiter.thread_key, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if waiters:
            return False
        self.pop(waiter.thread_key, None)
        return True
