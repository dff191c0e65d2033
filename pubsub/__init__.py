"""Pub/sub: at-least-once event delivery by topic, with consumer groups.

The contract is the :class:`PubSub` protocol (structural; :func:`is_pubsub` checks an object).
:class:`PubSubBase` implements its entry points once (validation, lifecycle, extensions) for
the backends: :class:`InMemoryPubSub` (one process, asyncio and trio),
:class:`RedisStreamsPubSub` (Redis Streams), :class:`SQLitePubSub` (one SQLite file, the
processes of one host) and :class:`SQLPubSub` (any SQL database of the backend kit, with a
:class:`Doorbell`). Each is its own lease provider (:class:`LeasedPubSub`: the five methods go
to ``get_lease_provider()``). ``pubsub.testing`` holds a conformance suite for your own backend.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the backends, imported on first use (see __getattr__ below)
    from pubsub._backends.memory import InMemoryPubSub
    from pubsub._backends.postgres import PostgresPubSub
    from pubsub._backends.redis.streams import RedisStreamsPubSub
    from pubsub._backends.sql.pubsub import Doorbell, SQLPubSub
    from pubsub._backends.sqlite import SQLitePubSub

from _signal_leases.errors import (
    BackendError,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    PubSubError,
    SignalsError,
    UnsupportedBackendError,
)
from _signal_leases.lazy import lazy_exports
from pubsub._base import PubSubBase
from pubsub._contract import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    Event,
    EventHandler,
    JSONValue,
    PubSub,
    StartFrom,
    Subscription,
    is_pubsub,
)
from pubsub._leased import LeasedPubSub

# The backends are imported on first use (docs/performance.md: a sender's start-up).
__getattr__, __dir__ = lazy_exports(__name__, {
    "InMemoryPubSub": "pubsub._backends.memory",
    "PostgresPubSub": "pubsub._backends.postgres",
    "RedisStreamsPubSub": "pubsub._backends.redis.streams",
    "Doorbell": "pubsub._backends.sql.pubsub",
    "SQLPubSub": "pubsub._backends.sql.pubsub",
    "SQLitePubSub": "pubsub._backends.sqlite",
})

__all__ = [
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "ClosedError",
    "Doorbell",
    "Event",
    "EventHandler",
    "InMemoryPubSub",
    "JSONValue",
    "LeasedPubSub",
    "PostgresPubSub",
    "PubSub",
    "PubSubBase",
    "PubSubError",
    "RedisStreamsPubSub",
    "SQLPubSub",
    "SQLitePubSub",
    "SignalsError",
    "StartFrom",
    "Subscription",
    "UnsupportedBackendError",
    "is_pubsub",
]
