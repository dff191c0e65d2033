"""The Redis key layout of every layer, in one place.

Every key that belongs to one lease key or one thread carries that key as its Redis Cluster
*hash tag* (``{...}``), so all of a thread's keys live in one slot and one Lua script may touch
them all. :func:`tag` escapes ``{``, ``}`` and ``%`` inside the tag, so any identifier gives a
valid, non-empty tag (an unescaped ``}`` would end the tag early and split a thread's keys
over several slots).

Lease layer (prefix ``L``, e.g. ``pubsub:lease``):
    ``L:{k}``            hash ``owner``, ``token`` (+ ``session``); ``PX`` expiry when per-key
    ``L:{k}:fence``      the fencing counter (no expiry: tokens only grow)
    ``L:session:{s}``    a lease session's liveness key (``PX`` expiry)

Pub/sub layer (prefix ``P``): ``P:topic:<topic>`` streams, ``P:alive:<process>`` liveness.

Signals layer (prefix ``S``, e.g. ``pubsub:signals``), per thread ``t``:
    ``S:{t}:inbox``      stream of accepted, unacknowledged signals
    ``S:{t}:seen``       sorted set: accepted signal id -> acceptance time (dedup, retention)
    ``S:{t}:receipts``   hash: signal id -> receipt JSON
    ``S:{t}:attempts``   hash: inbox entry id -> deliveries so far
    ``S:{t}:dead``       hash: signal id -> dead letter JSON
    ``S:{t}:stream``     stream of output parts (the thread's output)
    ``S:{t}:meta``       hash: ``since``, ``last``, ``abort``, ``tmax`` (newest trimmed part)
and across threads (each sharded or per runtime, so no slot is hot):
    ``S:pending:{n}``    sorted set shard ``n``: ownerless threads with pending work
    ``S:runtimes``       sorted set: runtime id -> start time (Unix seconds)
    ``S:runtime:{r}``    hash: a runtime's host, pid, start time, session
    ``S:runtime:{r}:threads``  set: threads runtime ``r`` owns (for recovery after it dies)
"""

from __future__ import annotations

import zlib

__all__ = ["LeaseKeys", "SignalKeys", "pubsub_layout", "shard_of", "tag"]


def tag(key: str) -> str:
    """``key`` as a hash tag: ``{key}`` with ``%``, ``{`` and ``}`` percent-escaped."""
    escaped = key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return "{" + escaped + "}"


def shard_of(key: str, shards: int) -> int:
    """A stable shard number in ``range(shards)`` for ``key`` (CRC32, same in every process)."""
    return zlib.crc32(key.encode("utf-8")) % shards


def pubsub_layout(key_prefix: str) -> tuple[str, str]:
    """The key prefixes of the signal store and of the leases that go with a Redis pub/sub
    under ``key_prefix`` (``RedisStreamsPubSub``): one place, for the runtime's store, the
    pub/sub's lease provider and a sender with no runtime."""
    return f"{key_prefix}:signals", f"{key_prefix}:lease"


class LeaseKeys:
    """Key names of the lease layer under ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def lease(self, key: str) -> str:
        """The lease hash of ``key``."""
        return f"{self.prefix}:{tag(key)}"

    def fence(self, key: str) -> str:
        """The fencing counter of ``key``."""
        return f"{self.prefix}:{tag(key)}:fence"

    def session(self, session_id: str) -> str:
        """The liveness key of a lease session."""
        return f"{self.prefix}:session:{tag(session_id)}"


class SignalKeys:
    """Key and channel names of the signals layer under ``prefix`` (see the module docstring).

    ``shards`` is how many sorted sets the pending index is spread over.
    """

    def __init__(self, prefix: str, shards: int = 8) -> None:
        self.prefix = prefix
        self.shards = shards

    def thread(self, thread_key: str, part: str) -> str:
        """A per-thread key: ``part`` is ``inbox``, ``seen``, ``receipts``, ``attempts``,
        ``dead`` or ``stream``."""
        return f"{self.prefix}:{tag(thread_key)}:{part}"

    def pending_shard(self, thread_key: str) -> str:
        """The pending-index shard ``thread_key`` belongs to."""
        return self.shard(shard_of(thread_key, self.shards))

    def shard(self, number: int) -> str:
        """Pending-index shard ``number``."""
        return f"{self.prefix}:pending:{{{number}}}"

    @property
    def registry(self) -> str:
        """The sorted set of registered runtimes."""
        return f"{self.prefix}:runtimes"

    def runtime(self, runtime_id: str) -> str:
        """A runtime's presence hash (expires unless refreshed)."""
        return f"{self.prefix}:runtime:{tag(runtime_id)}"

    def runtime_threads(self, runtime_id: str) -> str:
        """The set of threads a runtime owns."""
        return f"{self.prefix}:runtime:{tag(runtime_id)}:threads"

    @property
    def notice_prefix(self) -> str:
        """Notice channels are this prefix plus a runtime id."""
        return f"{self.prefix}:notice:"

    @property
    def work_channel(self) -> str:
        """The channel every worker runtime listens on."""
        return f"{self.prefix}:work"
