"""Signals: deliver input to long-running agents; exactly one process runs each thread.

:class:`SignalRuntime` routes each :class:`Signal` for a thread key: it wakes an idle thread
(this process wins the thread's lease and runs your agent) or delivers it to the active
:class:`Run`, here or in the owner process. Accepted signals wait in a :class:`SignalStore`
(:class:`InMemorySignalStore`, or the durable :class:`RedisSignalStore`) until a run
acknowledges them; each has a :class:`Receipt`.
"""

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
from signals import _pubsub_guard  # noqa: F401  (a clear ImportError if `pubsub` is not ours)
from signals._backends.memory.store import InMemorySignalStore
from signals._backends.redis.store import RedisSignalStore
from signals._model import (
    DEFAULT_MAX_SIGNAL_BYTES,
    Delivery,
    EntryMode,
    IfActive,
    IfIdle,
    Outcome,
    Receipt,
    ReceiptStatus,
    Signal,
    StreamPart,
    ThreadInfo,
)
from signals._resolve import resolve_signal_store
from signals._run import Run, RunInfo
from signals._runtime import Agent, SignalRuntime
from signals._store import (
    Accepted,
    Ack,
    Claim,
    DeadLetter,
    Follower,
    FusedSignalStore,
    InboxEntry,
    InboxPage,
    Notice,
    PartIn,
    Routed,
    RuntimeInfo,
    SignalStore,
    is_signal_store,
)

__all__ = [
    "DEFAULT_MAX_SIGNAL_BYTES",
    "Accepted",
    "Ack",
    "Agent",
    "BackendError",
    "BackendPermanentError",
    "BackendUnavailableError",
    "Claim",
    "ClosedError",
    "ConfigurationError",
    "CursorExpiredError",
    "DeadLetter",
    "Delivery",
    "EntryMode",
    "Follower",
    "FusedSignalStore",
    "IfActive",
    "IfIdle",
    "InMemorySignalStore",
    "InboxEntry",
    "InboxPage",
    "Notice",
    "Outcome",
    "PartIn",
    "Receipt",
    "ReceiptStatus",
    "RedisSignalStore",
    "Routed",
    "Run",
    "RunInfo",
    "RuntimeInfo",
    "Signal",
    "SignalError",
    "SignalRuntime",
    "SignalStore",
    "SignalTooLargeError",
    "SignalsError",
    "StreamPart",
    "ThreadInfo",
    "UnknownSignalError",
    "UnsupportedBackendError",
    "is_signal_store",
    "resolve_signal_store",
]
