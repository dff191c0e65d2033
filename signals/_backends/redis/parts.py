"""Stream parts on Redis, shared by both followers: an entry decoded as a
:class:`~signals.StreamPart`, and who waits on which thread's stream."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio

from _signal_leases.redis_support import text
from signals._model import StreamPart

__all__ = ["Waiter", "Waiters", "decode_part"]


def decode_part(thread_key: str, raw_id: Any, flat: Any) -> StreamPart:
    """A stream entry as a :class:`StreamPart`."""
    pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    fields = {text(k): text(v) for k, v in pairs}
    data = fields.get("d", "")
    return StreamPart(
        cursor=text(raw_id),
        thread_key=thread_key,
        run_id=fields.get("r") or None,
        kind=fields.get("k", "part"),
        data=json.loads(data) if data else None,
        signal_id=fields.get("s") or None,
        at=float(fields["t"]) if fields.get("t") else None,
    )


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
    """Who waits on which thread's stream (both followers keep one)."""

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
