"""Signals: deliver input to long-running agents; exactly one process runs each thread.

:class:`SignalRuntime` routes each :class:`Signal` for a thread key: it wakes an idle thread
(this process wins the thread's lease and runs your agent) or delivers it to the active
:class:`Run`, here or in the owner process. Accepted signals wait in a :class:`SignalInbox`
(:class:`InMemorySignalInbox`, or the durable :class:`RedisSignalInbox`) until processed.
"""

from ._errors import ConfigurationError, RuntimeClosedError, SignalsError
from ._inbox import EntryMode, InboxEntry, SignalInbox, is_signal_inbox
from ._memory_inbox import InMemorySignalInbox
from ._model import Delivery, IfActive, IfIdle, Outcome, Signal
from ._redis_inbox import RedisSignalInbox
from ._run import Run, RunInfo
from ._runtime import Agent, SignalRuntime, resolve_signal_inbox

__all__ = [
    "Agent",
    "ConfigurationError",
    "Delivery",
    "EntryMode",
    "IfActive",
    "IfIdle",
    "InMemorySignalInbox",
    "InboxEntry",
    "Outcome",
    "RedisSignalInbox",
    "Run",
    "RunInfo",
    "RuntimeClosedError",
    "Signal",
    "SignalInbox",
    "SignalRuntime",
    "SignalsError",
    "is_signal_inbox",
    "resolve_signal_inbox",
]
