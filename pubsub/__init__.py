"""Pub/sub: at-least-once event delivery by topic, with consumer groups.

The contract is the abstract base :class:`PubSub`. Backends: :class:`InMemoryPubSub` (one
process, asyncio and trio) and :class:`RedisStreamsPubSub` (Redis Streams; also a
``LeaseProvider``). ``pubsub.testing`` holds a conformance suite for your own backend.
"""

from ._contract import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    Event,
    EventHandler,
    JSONValue,
    PubSub,
    StartFrom,
    Subscription,
)
from ._errors import (
    BackendUnavailableError,
    PubSubClosedError,
    PubSubError,
    UnsupportedBackendError,
)
from ._memory import InMemoryPubSub
from ._redis_streams import RedisStreamsPubSub

__all__ = [
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "BackendUnavailableError",
    "Event",
    "InMemoryPubSub",
    "EventHandler",
    "JSONValue",
    "PubSub",
    "PubSubClosedError",
    "PubSubError",
    "RedisStreamsPubSub",
    "StartFrom",
    "Subscription",
    "UnsupportedBackendError",
]
