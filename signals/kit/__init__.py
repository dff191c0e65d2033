"""The backend kit: what a backend author implements, and what the runtime derives from it.

* :class:`SignalCore`: the durable core, twelve methods (``accept``, ``take``, ``settle``,
  ``withdraw``, ``entries``, ``receipt``, ``due``, ``look_at``, ``pause``, ``describe``,
  ``dead_letters``, ``revive``); :func:`is_signal_core` checks an object structurally.
* Optional capabilities, each a set of extra methods with a derived fallback:
  :class:`NoticeChannel`, :class:`OutputStreams`, :class:`RuntimeRegistry`,
  :class:`FusedRouting`.
* :class:`KitStore`: the runtime's view of a backend, derived from a core, the lease provider
  and the pub/sub (notices over the pub/sub, presence over leases, and so on).
* :class:`SQLCore`: the twelve methods (and streams, and the fused calls with the same
  database's leases) over any SQL database: a :class:`Database` (subclass it for your DB-API
  driver: a name and three hooks) whose operations run as functions of a :class:`Tx`. The
  SQLite backend is built on it; ``leases.SQLLeaseProvider`` and ``pubsub.SQLPubSub`` are
  the leases and the pub/sub over the same database.

See docs/custom-backend.md for the exact member lists, what each capability buys and what is
lost without it, and a complete small backend; ``signals.testing`` has a conformance kit per
part.
"""

from typing import TYPE_CHECKING

from _signal_leases.lazy import lazy_exports
from signals._model import Receipt, Signal, StreamPart
from signals.kit._capabilities import (
    CARRY_LIMIT,
    Claim,
    Claimed,
    Follower,
    FusedRouting,
    Notice,
    NoticeChannel,
    NoticeKind,
    OutputStreams,
    PartIn,
    Routed,
    RuntimeInfo,
    RuntimeRegistry,
)
from signals.kit._core import (
    CORE_METHODS,
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    Due,
    EntryState,
    InboxEntry,
    Limits,
    Overflow,
    RunRef,
    SignalCore,
    Taken,
    ThreadState,
    decode_entry,
    is_signal_core,
    run_runtime,
)

if TYPE_CHECKING:
    from _signal_leases.sql import Database, Tx
    from signals.kit._sql import SQLCore
    from signals.kit._store import KitStore

# The SQL kit and the runtime's view are imported on first use (docs/performance.md: a
# sender's start-up).
__getattr__, __dir__ = lazy_exports(__name__, {
    "Database": "_signal_leases.sql", "Tx": "_signal_leases.sql", "SQLCore": "signals.kit._sql",
    "KitStore": "signals.kit._store",
})

__all__ = [
    "CARRY_LIMIT",
    "CORE_METHODS",
    "NO_LIMITS",
    "Accepted",
    "Ack",
    "Claim",
    "Claimed",
    "Database",
    "DeadLetter",
    "Due",
    "EntryState",
    "Follower",
    "FusedRouting",
    "InboxEntry",
    "KitStore",
    "Limits",
    "Notice",
    "NoticeChannel",
    "NoticeKind",
    "OutputStreams",
    "Overflow",
    "PartIn",
    "Receipt",
    "Routed",
    "RunRef",
    "SQLCore",
    "RuntimeInfo",
    "RuntimeRegistry",
    "Signal",
    "SignalCore",
    "StreamPart",
    "Taken",
    "Tx",
    "ThreadState",
    "decode_entry",
    "is_signal_core",
    "run_runtime",
]
