"""Redis lease backend: every operation is one round trip (a Lua script or one command).

Key layout (see :mod:`leases._lua`): the lease is the hash ``<prefix>:{<key>}`` (fields
``owner``, ``token``; ``PX`` expiry) and the fencing counter is ``<prefix>:{<key>}:fence``
(no expiry; one small key per lease key ever used). redis-py is asyncio-only, so every call
checks the running async library first and raises :class:`UnsupportedBackendError` elsewhere.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis.asyncio
import redis.exceptions
import sniffio

from ._contract import AcquireResult
from ._errors import BackendUnavailableError, UnsupportedBackendError
from ._info import LeaseInfo
from ._lua import ACQUIRE, INFO, RELEASE, RENEW, TRANSFER
from ._validation import check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

    from redis.commands.core import AsyncScript

__all__ = ["RedisLeaseProvider"]

_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def _text(value: object) -> str | None:
    """A reply decoded to ``str`` (the client may or may not use ``decode_responses``)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bytes | str):
        return int(value)
    if isinstance(value, int):
        return value
    raise TypeError(f"unexpected integer reply from Redis: {value!r}")


def _require_asyncio() -> None:
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library != "asyncio":
        raise UnsupportedBackendError(
            f"RedisLeaseProvider needs asyncio (redis-py is asyncio-only), running under "
            f"{library or 'no async library'}; use InMemoryLeaseProvider or run on asyncio"
        )


@contextmanager
def _backend_errors(operation: str, key: str) -> Iterator[None]:
    try:
        yield
    except _UNAVAILABLE as error:
        if isinstance(error, BackendUnavailableError):
            raise
        raise BackendUnavailableError(
            f"Redis unavailable during {operation} of lease {key!r}: {error}"
        ) from error


class RedisLeaseProvider:
    """A ``LeaseProvider`` on Redis (standalone, or Cluster through hash-tagged keys).

    Pass exactly one of ``url`` (the provider creates and owns the client, closed by
    :meth:`aclose`) or ``client`` (a ``redis.asyncio.Redis`` the caller keeps owning).
    ``key_prefix`` namespaces the keys. Unreachable Redis raises
    :class:`BackendUnavailableError`; never read that as "the lease is free".

    ``transfer_lease`` returns ``True`` without a new token when ``to_owner`` already holds
    the lease, so a transfer that redis-py re-sends after a timeout still reports success.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "leases",
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("RedisLeaseProvider needs exactly one of url= or client=")
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a str, got {type(key_prefix).__name__}")
        if not key_prefix:
            raise ValueError("key_prefix must be a non-empty string")
        if url is not None:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, got {type(url).__name__}")
            if not url:
                raise ValueError("url must be a non-empty redis:// URL")
            client = redis.asyncio.Redis.from_url(url)
            self._owns_client = True
        else:
            self._owns_client = False
        assert client is not None
        self.client: redis.asyncio.Redis = client
        self.key_prefix = key_prefix
        self._acquire: AsyncScript = client.register_script(ACQUIRE)
        self._release: AsyncScript = client.register_script(RELEASE)
        self._renew: AsyncScript = client.register_script(RENEW)
        self._transfer: AsyncScript = client.register_script(TRANSFER)
        self._info: AsyncScript = client.register_script(INFO)

    def lease_key(self, key: str) -> str:
        """The Redis key of the lease hash for ``key``."""
        return f"{self.key_prefix}:{{{key}}}"

    def fence_key(self, key: str) -> str:
        """The Redis key of the fencing counter for ``key``."""
        return f"{self.key_prefix}:{{{key}}}:fence"

    def _keys(self, key: str) -> list[str]:
        return [self.lease_key(key), self.fence_key(key)]

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        _require_asyncio()
        with _backend_errors("acquire", key):
            reply: Any = await self._acquire(keys=self._keys(key), args=[owner, ttl_ms])
        acquired, holder, token = reply
        if int(acquired):
            return AcquireResult(True, _text(holder), _int(token))
        return AcquireResult(False, _text(holder) if holder else None, None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_key(key)
        _require_asyncio()
        with _backend_errors("get_lease_owner", key):
            reply: Any = await self.client.hget(self.lease_key(key), "owner")
        return _text(reply)

    async def release_lease(self, key: str, owner: str) -> None:
        check_key(key), check_owner(owner)
        _require_asyncio()
        with _backend_errors("release", key):
            await self._release(keys=[self.lease_key(key)], args=[owner])

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        _require_asyncio()
        with _backend_errors("renew", key):
            reply: Any = await self._renew(keys=[self.lease_key(key)], args=[owner, ttl_ms])
        return bool(int(reply))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(from_owner, "from_owner")
        check_owner(to_owner, "to_owner"), check_ttl_ms(ttl_ms)
        _require_asyncio()
        with _backend_errors("transfer", key):
            reply: Any = await self._transfer(
                keys=self._keys(key), args=[from_owner, to_owner, ttl_ms]
            )
        return bool(int(reply))

    async def lease_info(self, key: str) -> LeaseInfo | None:
        """Owner, remaining TTL (``None`` if the key has no expiry) and token, or ``None``."""
        check_key(key)
        _require_asyncio()
        with _backend_errors("lease_info", key):
            reply: Any = await self._info(keys=[self.lease_key(key)])
        if not reply:
            return None
        owner, token, pttl = reply
        remaining = _int(pttl)
        return LeaseInfo(
            key=key,
            owner=_text(owner) or "",
            ttl_ms_remaining=remaining if remaining is not None and remaining >= 0 else None,
            token=_int(token),
        )

    async def aclose(self) -> None:
        """Close the client if this provider created it (from ``url``)."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> RedisLeaseProvider:
        _require_asyncio()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
