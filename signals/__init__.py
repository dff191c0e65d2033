"""Signals: deliver input to long-running agents; exactly one process runs each thread.

:class:`SignalRuntime` routes each :class:`Signal` for a thread key: it wakes an idle thread
(this process wins the thread's lease and runs your agent) or delivers it to the active
:class:`Run`, here or in the owner process. Accepted signals wait in a core
(:class:`SignalCore`: :class:`InMemorySignalStore`, the durable :class:`RedisSignalStore`,
SQLite, Postgres, or your own through :mod:`signals.kit`) until a run acknowledges them; each
has a :class:`Receipt`.
"""

from typing import TYPE_CHECKING

from _signal_leases.errors import (
    BackendError,
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    CursorExpiredError,
    SignalError,
    SignalsError,
    SignalTooLargeError,
    UnknownSignalError,
    UnsupportedBackendError,
)
from _signal_leases.lazy import lazy_exports
from signals import _pubsub_guard  # noqa: F401  (a clear ImportError if `pubsub` is not ours)
from signals._model import (
    DEFAULT_MAX_SIGNAL_BYTES,
    MAX_PRIORITY,
    Delivery,
    EntryMode,
    IfActive,
    IfIdle,
    Merge,
    Outcome,
    Receipt,
    ReceiptStatus,
    RunInfo,
    Signal,
    StreamPart,
    ThreadInfo,
)
from signals._run import Reducer, Run
from signals._runtime import Agent, SignalRuntime
from signals._schedules import CatchUp, Schedule
from signals.kit._core import DeadLetter, Overflow, SignalCore, is_signal_core

if TYPE_CHECKING:
    from signals._backends.memory.store import InMemorySignalStore
    from signals._backends.redis.store import RedisSignalStore

__all__ = [
    "DEFAULT_MAX_SIGNAL_BYTES",
    "MAX_PRIORITY",
    "Agent",
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "CatchUp",
    "ClosedError",
    "ConfigurationError",
    "CursorExpiredError",
    "DeadLetter",
    "Delivery",
    "EntryMode",
    "IfActive",
    "IfIdle",
    "InMemorySignalStore",
    "Merge",
    "Outcome",
    "Overflow",
    "Receipt",
    "ReceiptStatus",
    "RedisSignalStore",
    "Reducer",
    "Run",
    "RunInfo",
    "Schedule",
    "Signal",
    "SignalCore",
    "SignalError",
    "SignalRuntime",
    "SignalTooLargeError",
    "SignalsError",
    "StreamPart",
    "ThreadInfo",
    "UnknownSignalError",
    "UnsupportedBackendError",
    "is_signal_core",
]


# The backends are imported on first use (docs/performance.md: a sender's start-up).
__getattr__, __dir__ = lazy_exports(__name__, {
    "InMemorySignalStore": "signals._backends.memory.store",
    "RedisSignalStore": "signals._backends.redis.store",
})
