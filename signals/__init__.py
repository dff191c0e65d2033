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
from signals.kit._core import DeadLetter, Overflow, SignalCore, is_signal_core

if TYPE_CHECKING:  # imported on first use (see __getattr__ below)
    from signals._backends.memory.store import InMemorySignalStore
    from signals._backends.redis.sender import RedisSignalSender
    from signals._backends.redis.store import RedisSignalStore
    from signals._run import Reducer, Run
    from signals._runtime import Agent, SignalRuntime
    from signals._schedules import CatchUp, Schedule

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
    "RedisSignalSender",
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


# The runtime and the backends are imported on first use (docs/performance.md: a sender's
# start-up): ``import signals`` loads the records and the errors; ``RedisSignalSender`` adds
# redis-py and the Redis core's script calls, without anyio.
__getattr__, __dir__ = lazy_exports(__name__, {
    "InMemorySignalStore": "signals._backends.memory.store",
    "RedisSignalSender": "signals._backends.redis.sender",
    "RedisSignalStore": "signals._backends.redis.store",
    "Reducer": "signals._run",
    "Run": "signals._run",
    "Agent": "signals._runtime",
    "SignalRuntime": "signals._runtime",
    "CatchUp": "signals._schedules",
    "Schedule": "signals._schedules",
})
