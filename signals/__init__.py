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

from . import _pubsub_guard  # noqa: F401  (a clear ImportError if `pubsub` is not ours)
from ._memory_store import InMemorySignalStore
from ._model import (
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
from ._redis_store import RedisSignalStore
from ._resolve import resolve_signal_store
from ._run import Run, RunInfo
from ._runtime import Agent, SignalRuntime
from ._store import (
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

#: The earlier names of the store, kept for code written against them.
SignalInbox = SignalStore
InMemorySignalInbox = InMemorySignalStore
RedisSignalInbox = RedisSignalStore
RuntimeClosedError = ClosedError
is_signal_inbox = is_signal_store
resolve_signal_inbox = resolve_signal_store

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
    "InMemorySignalInbox",
    "InMemorySignalStore",
    "InboxEntry",
    "InboxPage",
    "Notice",
    "Outcome",
    "PartIn",
    "Receipt",
    "ReceiptStatus",
    "RedisSignalInbox",
    "RedisSignalStore",
    "Routed",
    "Run",
    "RunInfo",
    "RuntimeClosedError",
    "RuntimeInfo",
    "Signal",
    "SignalError",
    "SignalInbox",
    "SignalRuntime",
    "SignalStore",
    "SignalTooLargeError",
    "SignalsError",
    "StreamPart",
    "ThreadInfo",
    "UnknownSignalError",
    "UnsupportedBackendError",
    "is_signal_inbox",
    "is_signal_store",
    "resolve_signal_inbox",
    "resolve_signal_store",
]
