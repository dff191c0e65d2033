"""The ``PubSub`` contract: events, subscriptions, and the abstract base every backend extends."""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Self, TypeAlias

__all__ = [
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "Event",
    "EventHandler",
    "JSONValue",
    "PubSub",
    "StartFrom",
    "Subscription",
    "check_json",
    "check_subscribe_args",
    "check_topic",
]

JSONValue: TypeAlias = Any
"""A value ``json.dumps`` accepts without a ``default=`` hook (dict, list, str, int, ...)."""

StartFrom: TypeAlias = Literal["latest", "earliest"]

DEFAULT_MAX_DELIVERY_ATTEMPTS = 5


def check_topic(topic: object) -> str:
    """Return ``topic`` if it is a non-empty ``str``, else raise ``TypeError``/``ValueError``."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise ValueError("topic must be a non-empty string")
    return topic


def check_subscribe_args(topic: object, handler: object, group: object, start_from: object) -> None:
    """Validate the arguments of :meth:`PubSub.subscribe` (shared by every backend)."""
    check_topic(topic)
    if not callable(handler):
        raise TypeError("handler must be an async callable taking an Event")
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError("group must be a non-empty string or None")
    if start_from not in ("latest", "earliest"):
        raise ValueError(f"start_from must be 'latest' or 'earliest', got {start_from!r}")


def check_json(data: object, what: str = "event data") -> str:
    """Serialise ``data`` to JSON or raise ``TypeError`` naming what could not be encoded."""
    try:
        return json.dumps(data, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None


@dataclass(frozen=True, slots=True)
class Event:
    """One event: an envelope around JSON ``data``.

    ``id`` is unique per published event; ``created_at`` is Unix time in seconds;
    ``delivery_attempt`` starts at 1 and grows on each redelivery.
    """

    type: str
    data: JSONValue = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    delivery_attempt: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ValueError("event type must be a non-empty string")
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("event id must be a non-empty string")
        check_json(self.data)

    def to_json(self) -> str:
        """The wire form: one JSON object."""
        return json.dumps(
            {
                "id": self.id,
                "type": self.type,
                "data": self.data,
                "created_at": self.created_at,
                "delivery_attempt": self.delivery_attempt,
            },
            allow_nan=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Event:
        """Parse the wire form; raises ``ValueError`` on malformed input."""
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("event JSON must be an object")
        return cls(
            type=obj["type"],
            data=obj.get("data"),
            id=obj["id"],
            created_at=float(obj["created_at"]),
            delivery_attempt=int(obj.get("delivery_attempt", 1)),
        )

    def redelivered(self) -> Event:
        """A copy with ``delivery_attempt`` increased by one."""
        return replace(self, delivery_attempt=self.delivery_attempt + 1)


EventHandler: TypeAlias = Callable[[Event], Awaitable[None]]
"""``async def handler(event) -> None``. Returning acknowledges; raising asks for redelivery."""


class Subscription(ABC):
    """A live subscription returned by :meth:`PubSub.subscribe`. Close it to stop delivery."""

    topic: str
    group: str | None

    @abstractmethod
    async def close(self) -> None:
        """Stop delivery to this subscription (idempotent). In-flight handling finishes first."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class PubSub(ABC):
    """Event delivery by topic, at least once.

    * ``publish`` returns once the backend accepted the event (durably, for durable backends).
      Non-JSON data raises ``TypeError`` at publish time; nothing is pickled.
    * Without a ``group`` every subscription gets every event (fan-out). Subscriptions that share
      a ``group`` compete: each event goes to one member.
    * A handler that returns acknowledges the event. A handler that raises gets it again, with
      ``delivery_attempt`` increased, up to ``max_delivery_attempts``; then the event is dropped
      with a ``pubsub.event_dropped`` warning.
    * One subscription sees the events of its topic one at a time, in publish order.
    * ``start_from="earliest"`` replays what the backend retains; ``"latest"`` sees only events
      published after ``subscribe`` returned. An existing group keeps its position.

    Backends are used as ``async with backend:``; the context owns their background tasks.
    """

    @abstractmethod
    async def publish(self, topic: str, event: Event) -> str:
        """Publish ``event`` on ``topic``; returns the event id."""

    @abstractmethod
    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        """Deliver the events of ``topic`` to ``handler`` until the subscription is closed."""

    async def unsubscribe(self, subscription: Subscription) -> None:
        """Close ``subscription`` (same as ``await subscription.close()``)."""
        await subscription.close()

    @abstractmethod
    async def close(self) -> None:
        """Close every subscription and release the backend's resources (idempotent)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
