"""``RedisSignalInbox``: the durable per-thread inbox on Redis.

Key layout, per thread (one hash tag, so one Cluster slot):

* ``<prefix>:{<thread>}:inbox``: a Stream of accepted, unprocessed signals (fields ``signal``
  (JSON) and ``mode``). Processed entries are deleted (XDEL).
* ``<prefix>:{<thread>}:seen``: a sorted set of accepted signal ids scored by acceptance time
  (ms); ids older than the dedup window are trimmed on append.

And one index for recovery: ``<prefix>:pending-threads``, a sorted set of the threads whose
inbox is not empty. The append and remove scripts update it in the same script, which is
atomic on a standalone Redis but crosses slots on a Cluster (not supported there yet).

Both per-thread keys have a sliding idle TTL (default 7 days): an inbox nobody touches for
that long is dropped by Redis. The whole inbox never grows past what was accepted and not yet
processed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import redis.asyncio
import redis.exceptions
import sniffio
import structlog

from leases._errors import BackendUnavailableError, UnsupportedBackendError

from ._inbox import EntryMode, InboxEntry
from ._model import Signal
from ._validation import check_entry_mode, check_limit, check_thread_key

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = ["RedisSignalInbox"]

logger: FilteringBoundLogger = structlog.get_logger("signals")

_APPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[4])
local idle = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('XADD', KEYS[1], '*', 'signal', ARGV[2], 'mode', ARGV[3])
redis.call('PEXPIRE', KEYS[1], idle)
redis.call('PEXPIRE', KEYS[2], math.max(window, idle))
redis.call('ZADD', KEYS[3], 'NX', now, ARGV[6])
return 1
"""

_REMOVE = """
for i = 2, #ARGV do
  redis.call('XDEL', KEYS[1], ARGV[i])
end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
"""

_STREAM_ID = re.compile(r"\d+-\d+")

_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _decode_entry(entry_id: str, fields: Any) -> InboxEntry:
    decoded = {_text(k): _text(v) for k, v in dict(fields).items()}
    obj = json.loads(decoded["signal"])
    if not isinstance(obj, dict):
        raise ValueError("signal JSON must be an object")
    mode: EntryMode = "queue" if decoded.get("mode") == "queue" else "deliver"
    return InboxEntry(entry_id, Signal.from_dict(obj), mode)


def _check_entry_id(entry_id: object) -> str:
    if not isinstance(entry_id, str) or _STREAM_ID.fullmatch(entry_id) is None:
        raise ValueError(f"not an entry id of this inbox (a Stream id like '1-0'): {entry_id!r}")
    return entry_id


@contextmanager
def _redis_errors(operation: str) -> Iterator[None]:
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library != "asyncio":
        raise UnsupportedBackendError(
            f"RedisSignalInbox needs asyncio (redis-py is asyncio-only), running under "
            f"{library or 'no async library'}"
        )
    try:
        yield
    except _UNAVAILABLE as exc:
        raise BackendUnavailableError(f"Redis unavailable during inbox {operation}: {exc}") from exc


class RedisSignalInbox:
    """A durable :class:`SignalInbox` on Redis: accepted signals survive any client's crash.

    Give exactly one of ``url`` or ``client``; only a client built from ``url`` is closed by
    :meth:`aclose`. ``dedup_window_ms`` is how long a signal id is remembered;
    ``idle_ttl_ms`` how long an untouched inbox is kept.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "signals",
        dedup_window_ms: int = 86_400_000,
        idle_ttl_ms: int = 7 * 86_400_000,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("give exactly one of url= or client=")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ValueError("key_prefix must be a non-empty string")
        for name, value in (("dedup_window_ms", dedup_window_ms), ("idle_ttl_ms", idle_ttl_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int")
        self._owns_client = client is None
        self.client: redis.asyncio.Redis = (
            client if client is not None else redis.asyncio.Redis.from_url(url)  # type: ignore[arg-type]
        )
        self.key_prefix = key_prefix
        self.dedup_window_ms = dedup_window_ms
        self.idle_ttl_ms = idle_ttl_ms
        self._append = self.client.register_script(_APPEND)
        self._remove = self.client.register_script(_REMOVE)

    def inbox_key(self, thread_key: str) -> str:
        """The Stream holding ``thread_key``'s pending signals."""
        return f"{self.key_prefix}:{{{thread_key}}}:inbox"

    def seen_key(self, thread_key: str) -> str:
        """The sorted set of ``thread_key``'s recently accepted signal ids."""
        return f"{self.key_prefix}:{{{thread_key}}}:seen"

    @property
    def index_key(self) -> str:
        """The sorted set of threads with pending signals (outside every thread's slot)."""
        return f"{self.key_prefix}:pending-threads"

    async def aclose(self) -> None:
        """Close the client if this inbox created it."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- SignalInbox ------------------------------------------------------------------------

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool:
        """Store ``signal`` unless its id was accepted within the window (then ``False``)."""
        check_thread_key(thread_key)
        check_entry_mode(mode)
        if not isinstance(signal, Signal):
            raise TypeError(f"signal must be a Signal, got {type(signal).__name__}")
        payload = json.dumps(signal.to_dict(), separators=(",", ":"))
        with _redis_errors("append"):
            added = await self._append(
                keys=[self.inbox_key(thread_key), self.seen_key(thread_key), self.index_key],
                args=[signal.id, payload, mode, self.dedup_window_ms, self.idle_ttl_ms, thread_key],
            )
        return int(added) == 1

    async def inbox_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[InboxEntry]:
        check_thread_key(thread_key)
        check_limit(limit)
        start = "-" if after is None else f"({_check_entry_id(after)}"
        with _redis_errors("read"):
            rows: Any = await self.client.xrange(
                self.inbox_key(thread_key), min=start, max="+", count=limit
            )
        entries: list[InboxEntry] = []
        malformed: list[str] = []
        for raw_id, fields in rows:
            entry_id = _text(raw_id)
            try:
                entries.append(_decode_entry(entry_id, fields))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                logger.warning(
                    "signals.inbox_entry_dropped", key=thread_key, entry_id=entry_id,
                    error=repr(exc),
                )
                malformed.append(entry_id)
        if malformed:  # it could never be processed: drop it rather than block the thread
            await self.inbox_remove(thread_key, malformed)
        return entries

    async def inbox_remove(self, thread_key: str, entry_ids: list[str]) -> None:
        """Mark entries processed (XDEL); unknown ids are ignored."""
        check_thread_key(thread_key)
        entry_ids = [_check_entry_id(e) for e in entry_ids]
        if not entry_ids:
            return
        with _redis_errors("remove"):
            await self._remove(
                keys=[self.inbox_key(thread_key), self.index_key], args=[thread_key, *entry_ids]
            )

    async def inbox_pending_count(self, thread_key: str) -> int:
        """How many entries of ``thread_key`` wait to be processed (XLEN)."""
        check_thread_key(thread_key)
        with _redis_errors("count"):
            return int(await self.client.xlen(self.inbox_key(thread_key)))

    async def inbox_pending_threads(self, limit: int = 100) -> list[str]:
        """Threads with pending entries, the longest-waiting first; at most ``limit``.

        Index entries whose inbox turned out empty (idled out, deleted by hand) are dropped.
        """
        check_limit(limit)
        with _redis_errors("index read"):
            raw = await self.client.zrange(self.index_key, 0, limit - 1)
            threads = [_text(t) for t in raw]
            if not threads:
                return []
            async with self.client.pipeline(transaction=False) as pipe:
                for thread in threads:
                    pipe.xlen(self.inbox_key(thread))
                sizes = await pipe.execute()
            empty = [t for t, n in zip(threads, sizes, strict=True) if int(n) == 0]
            for thread in empty:  # idled out or deleted by hand; re-checked atomically
                await self._remove(keys=[self.inbox_key(thread), self.index_key], args=[thread])
        return [t for t, n in zip(threads, sizes, strict=True) if int(n) > 0]
