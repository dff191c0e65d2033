"""The pub/sub contract: the ``Event`` envelope, and the ``PubSub`` and ``Subscription``
protocols a backend implements (detected structurally, see :func:`is_pubsub`)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeAlias, runtime_checkable

from _signal_leases.encoding import compact_json, random_id
from _signal_leases.frozen import quick_init
from _signal_leases.validation import check_str

__all__ = [
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "START_FROM",
    "Event",
    "EventHandler",
    "JSONValue",
    "PubSub",
    "StartFrom",
    "Subscription",
    "check_json",
    "is_pubsub",
]

JSONValue: TypeAlias = Any
"""A value ``json.dumps`` accepts without a ``default=`` hook (dict, list, str, int, ...)."""

StartFrom: TypeAlias = Literal["latest", "earliest"]
START_FROM: tuple[StartFrom, ...] = ("latest", "earliest")

DEFAULT_MAX_DELIVERY_ATTEMPTS = 5


def check_json(data: object, what: str = "event data") -> str:
    """Serialise ``data`` to JSON or raise ``TypeError`` naming what could not be encoded."""
    try:
        return compact_json(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None


@quick_init
@dataclass(frozen=True, slots=True)
class Event:
    """One event: an envelope around JSON ``data``.

    ``id`` is unique per published event; ``created_at`` is Unix time in seconds;
    ``delivery_attempt`` starts at 1 and grows on each redelivery. ``type`` and ``id`` are
    non-empty strings; ``data`` that is not JSON-serialisable raises ``TypeError`` here.
    """

    type: str
    data: JSONValue = None
    id: str = field(default_factory=random_id)
    created_at: float = field(default_factory=time.time)
    delivery_attempt: int = 1

    def __post_init__(self) -> None:
        check_str("event type", self.type)
        check_str("event id", self.id)
        check_json(self.data)

    def to_json(self) -> str:
        """The wire form: one JSON object (``TypeError`` if ``data`` no longer encodes)."""
        return check_json(
            {
                "id": self.id,
                "type": self.type,
                "data": self.data,
                "created_at": self.created_at,
                "delivery_attempt": self.delivery_attempt,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Event:
        """Parse the wire form; raises ``ValueError`` (or ``TypeError``) on malformed input.

        The data is not encoded again to check it: what ``json.loads`` returns encodes,
        except ``NaN`` and the infinities, which are refused while parsing."""
        obj = _DECODER.decode(raw.decode() if isinstance(raw, bytes) else raw)
        if not isinstance(obj, dict):
            raise ValueError("event JSON must be an object")
        event = object.__new__(cls)
        _set(event, "type", check_str("event type", obj["type"]))
        _set(event, "data", obj.get("data"))
        _set(event, "id", check_str("event id", obj["id"]))
        _set(event, "created_at", float(obj["created_at"]))
        _set(event, "delivery_attempt", int(obj.get("delivery_attempt", 1)))
        return event

    def redelivered(self) -> Event:
        """A copy with ``delivery_attempt`` increased by one."""
        return replace(self, delivery_attempt=self.delivery_attempt + 1)


_set = object.__setattr__  # fills a parsed Event's fields (frozen) without __init__


def _no_constant(name: str) -> Any:
    raise ValueError(f"event JSON must not contain {name} (not JSON)")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


EventHandler: TypeAlias = Callable[[Event], Awaitable[None]]
"""``async def handler(event) -> None``. Returning acknowledges; raising asks for redelivery."""


class Subscription(Protocol):
    """A live subscription returned by :meth:`PubSub.subscribe`. Close it to stop delivery.

    The built-in backends' subscriptions are also async context managers (leaving the block
    closes them).
    """

    @property
    def topic(self) -> str:
        """The topic this subscription receives."""
        ...

    @property
    def group(self) -> str | None:
        """The group it competes in, or ``None`` for fan-out."""
        ...

    async def close(self) -> None:
        """Stop delivery to this subscription (idempotent). In-flight handling finishes first."""
        ...


@runtime_checkable
class PubSub(Protocol):
    """Event delivery by topic, at least once.

    * ``publish`` returns once the backend accepted the event (durably, for durable backends).
      A non-``Event`` or non-JSON data raises ``TypeError``, an empty topic ``ValueError``, at
      publish time; nothing is pickled.
    * Without a ``group`` every subscription gets every event (fan-out). Subscriptions that share
      a ``group`` compete: each event goes to one member.
    * A handler that returns acknowledges the event. A handler that raises gets it again, with
      ``delivery_attempt`` increased, up to ``max_delivery_attempts``; then the event is dropped
      with a ``pubsub.event_dropped`` warning.
    * One subscription sees the events of its topic one at a time, in publish order.
    * ``start_from="earliest"`` replays what the backend retains; ``"latest"`` sees only events
      published after ``subscribe`` returned. An existing group keeps its position.
    * Backends are used as ``async with backend:``; the context owns their background tasks.
      Using one before entering it or after :meth:`close` raises ``ClosedError``.

    Structural: implement these methods (or inherit :class:`~pubsub.PubSubBase`, which
    validates the arguments and runs the lifecycle for you); no registration is needed.
    :func:`is_pubsub` is the check the library itself uses.
    """

    async def publish(self, topic: str, event: Event) -> str:
        """Publish ``event`` on ``topic``; returns the event id."""
        ...

    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        """Deliver the events of ``topic`` to ``handler`` until the subscription is closed."""
        ...

    async def unsubscribe(self, subscription: Subscription) -> None:
        """Close ``subscription`` (same as ``await subscription.close()``)."""
        ...

    async def close(self) -> None:
        """Close every subscription and release the backend's resources (idempotent)."""
        ...

    async def __aenter__(self) -> Self:
        """Start the backend (its background tasks live until the block is left)."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """A clean exit closes gracefully; an exception cancels in-flight handlers."""
        ...


def is_pubsub(obj: object) -> bool:
    """True when ``obj`` is a pub/sub *instance*: not a class, with callable ``publish``,
    ``subscribe`` and ``close`` (the methods a consumer such as the signal runtime needs)."""
    if isinstance(obj, type):
        return False
    return all(callable(getattr(obj, name, None)) for name in ("publish", "subscribe", "close"))
