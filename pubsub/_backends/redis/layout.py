"""What every part of the Redis Streams backend shares: key and group names, the settings,
and the context object (client, names, settings, logger) handed to each part.

Layout under the prefix ``P``:

* ``P:topic:<topic>``: the stream of a topic (the event JSON in the field ``event``);
* ``P:alive:<process id>``: a process's liveness key. Its TTL is the bound after which the
  others reap the process's private groups, and its value is that bound in ms;
* group ``fanout:<process id>``: a process's private fan-out group on a stream;
* consumer ``<group>:<process id>``: a process's consumer in a named group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _signal_leases.logs import Logger

__all__ = ["FANOUT", "StreamsContext", "StreamsLayout", "StreamsSettings"]

FANOUT = "fanout"  # the group-name prefix of private fan-out groups (reserved)


class StreamsLayout:
    """Key, group and consumer names under ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def stream(self, topic: str) -> str:
        """The stream of ``topic``."""
        return f"{self.prefix}:topic:{topic}"

    def alive(self, process_id: str) -> str:
        """The liveness key of ``process_id``."""
        return f"{self.prefix}:alive:{process_id}"

    def reader_name(self, process_id: str) -> str:
        """The ``CLIENT SETNAME`` of ``process_id``'s reader connection."""
        return f"{self.prefix}:reader:{process_id}"

    @staticmethod
    def fanout_group(process_id: str) -> str:
        """The private fan-out group of ``process_id``."""
        return f"{FANOUT}:{process_id}"

    @staticmethod
    def fanout_owner(group: str) -> str | None:
        """The process id in a private fan-out group's name, or ``None`` for other groups."""
        if not group.startswith(FANOUT + ":"):
            return None
        return group[len(FANOUT) + 1 :] or None  # the whole rest: a process id may contain ":"

    @staticmethod
    def consumer(group: str, process_id: str) -> str:
        """The consumer of ``process_id`` in the named ``group``."""
        return f"{group}:{process_id}"


@dataclass(frozen=True, slots=True)
class StreamsSettings:
    """The validated tuning of one ``RedisStreamsPubSub`` (see its docstring)."""

    max_stream_length: int
    stream_idle_ttl_ms: int
    block_ms: int
    reclaim_idle_ms: int
    reclaim_interval_ms: int
    max_delivery_attempts: int

    @property
    def alive_ttl_ms(self) -> int:
        """The TTL of the liveness key: the bound after which a dead process's private
        groups are reaped (refreshed at least every ``reclaim_idle_ms / 3``)."""
        return 10 * self.reclaim_idle_ms


@dataclass(frozen=True, slots=True)
class StreamsContext:
    """The client, names, settings and logger of one ``RedisStreamsPubSub``."""

    client: Any  # redis.asyncio.Redis or RedisCluster (Any: loosely typed command methods)
    layout: StreamsLayout
    settings: StreamsSettings
    process_id: str
    log: Logger

    def queue_idle_ttl(self, pipe: Any, stream: str) -> None:
        """Queue the sliding idle TTL of ``stream`` on ``pipe`` (when it is on)."""
        if self.settings.stream_idle_ttl_ms:
            pipe.pexpire(stream, self.settings.stream_idle_ttl_ms)
