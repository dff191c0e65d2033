"""Small helpers of the Redis Streams backend: validation, errors, replies, the reader client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import redis.asyncio
import redis.exceptions
import sniffio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._errors import BackendUnavailableError, UnsupportedBackendError

__all__ = [
    "UNAVAILABLE",
    "backend_errors",
    "once_more_on_reconnect",
    "positive_int",
    "reader_client",
    "require_asyncio",
    "stream_id",
    "text",
]

UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def text(value: object) -> str:
    """A reply value as ``str`` (clients with and without ``decode_responses``)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def stream_id(value: object) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``, for ordering entry ids."""
    ms, _, seq = text(value).partition("-")
    return int(ms), int(seq or 0)


def positive_int(name: str, value: object, *, zero_ok: bool = False) -> int:
    """Return ``value`` if it is a positive (or, with ``zero_ok``, non-negative) ``int``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not zero_ok):
        bound = "non-negative" if zero_ok else "positive"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def require_asyncio(what: str = "RedisStreamsPubSub") -> None:
    """Raise ``UnsupportedBackendError`` unless running under asyncio (redis-py needs it)."""
    try:
        library: str | None = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library != "asyncio":
        raise UnsupportedBackendError(
            f"{what} needs asyncio (redis-py is asyncio-only), running under "
            f"{library or 'no async library'}; use InMemoryPubSub or run on asyncio"
        )


@contextmanager
def backend_errors(operation: str) -> Iterator[None]:
    """Turn connection and timeout errors into ``BackendUnavailableError``."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise BackendUnavailableError(f"Redis unavailable during {operation}: {exc}") from exc


async def once_more_on_reconnect(operation: Callable[[], Awaitable[None]]) -> None:
    """Run ``operation``; after a restart of Redis the first use of a pooled connection can fail
    with ``ConnectionError`` (when the client has no retries), so try once more on a fresh one.
    A replayed XADD can duplicate an entry: delivery is at least once, the event id is kept."""
    try:
        await operation()
    except redis.exceptions.ConnectionError:
        await operation()


def reader_client(client: redis.asyncio.Redis, *, block_ms: int, name: str) -> redis.asyncio.Redis:
    """A client for blocking reads on its own connection, with ``client``'s connection settings
    but a socket timeout above ``block_ms`` and no retries (a retried blocking XREADGROUP can
    hand entries to a connection that is then dropped)."""
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = block_ms / 1000 + 5
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("retry_on_error", None)
    kwargs["client_name"] = name
    reader_pool = redis.asyncio.ConnectionPool(
        connection_class=pool.connection_class, max_connections=2, **kwargs
    )
    return redis.asyncio.Redis.from_pool(reader_pool)
