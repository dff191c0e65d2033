"""Value types of the signal runtime: ``Signal``, ``Delivery`` and the routing policies."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = ["Delivery", "IfActive", "IfIdle", "Outcome", "Signal"]

Outcome: TypeAlias = Literal["wake", "deliver", "queued", "discarded", "rejected"]
"""What ``send`` did: ``wake`` (this process won the lease and runs the agent), ``deliver``
(handed to the active run, here or in the owner process), ``queued`` (kept for the next run),
``discarded`` (dropped by policy), ``rejected`` (refused by policy: the thread is busy)."""

IfActive: TypeAlias = Literal["deliver", "queue", "discard", "reject"]
IfIdle: TypeAlias = Literal["wake", "discard"]


@dataclass(frozen=True, slots=True)
class Signal:
    """One input for a thread.

    ``id`` is the deduplication key (generated when absent): the runtime processes each id once
    per thread. ``type`` is free-form (``user``, ``system``, ``notification``, ...). ``payload``
    must be JSON-serialisable; a ``TypeError`` says so at construction. ``created_at`` is Unix
    time in seconds.
    """

    payload: Any = None
    type: str = "user"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ValueError("signal type must be a non-empty string")
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("signal id must be a non-empty string")
        try:
            json.dumps(self.payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"signal payload must be JSON-serialisable: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "id": self.id,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Signal:
        """Inverse of :meth:`to_dict`."""
        return cls(
            payload=obj.get("payload"),
            type=obj["type"],
            id=obj["id"],
            created_at=float(obj["created_at"]),
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """The result of :meth:`SignalRuntime.send`.

    ``run_id`` is the run that has (or will get) the signal when known; ``owner`` is the lease
    holder of the thread when known (a run id).
    """

    outcome: Outcome
    signal_id: str
    thread_key: str
    run_id: str | None = None
    owner: str | None = None
