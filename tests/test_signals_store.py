"""Both stores run the ``signals.testing`` conformance suite, plus backend-specific checks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from leases import (
    BackendUnavailableError,
    InMemoryLeaseProvider,
    RedisLeaseProvider,
    UnsupportedBackendError,
)
from leases.testing import ManualClock
from signals import InMemorySignalStore, RedisSignalStore, Signal
from signals.testing import SignalStoreConformance

pytestmark = pytest.mark.anyio


class TestInMemoryStore(SignalStoreConformance):
    """asyncio and trio, a manual clock, fused with an in-memory lease provider."""

    @pytest.fixture
    def manual_clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def leases(self, manual_clock: ManualClock) -> InMemoryLeaseProvider:
        return InMemoryLeaseProvider(clock=manual_clock)

    @pytest.fixture
    def store(
        self, manual_clock: ManualClock, leases: InMemoryLeaseProvider
    ) -> InMemorySignalStore:
        self.now = manual_clock
        return InMemorySignalStore(leases=leases, retention_ms=60_000, clock=manual_clock)

    @pytest.fixture
    def small_store(self) -> InMemorySignalStore:
        return InMemorySignalStore(stream_max_parts=5)

    async def advance(self, store: object, ms: int) -> None:
        self.now.advance(ms / 1000)

    async def expire_receipts(self, store: object) -> None:
        self.now.advance(61)


class TestInMemoryStoreGeneric(SignalStoreConformance):
    """Without a lease provider: the generic (non-fused) store."""

    @pytest.fixture
    def store(self) -> InMemorySignalStore:
        return InMemorySignalStore()


@pytest.mark.redis
class TestRedisStore(SignalStoreConformance):
    @pytest.fixture
    async def leases(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisLeaseProvider]:
        async with RedisLeaseProvider(url=redis_url, key_prefix=f"{key_prefix}:lease") as leases:
            yield leases

    @pytest.fixture
    def store(self, leases: RedisLeaseProvider, key_prefix: str) -> RedisSignalStore:
        return RedisSignalStore(client=leases.client, key_prefix=f"{key_prefix}:signals",
                                leases=leases)

    @pytest.fixture
    def small_store(self, leases: RedisLeaseProvider, key_prefix: str) -> RedisSignalStore:
        return RedisSignalStore(client=leases.client, key_prefix=f"{key_prefix}:small",
                                stream_max_parts=5)


@pytest.mark.redis
class TestRedisStoreDecodedClient(SignalStoreConformance):
    """A client built with ``decode_responses=True`` (str replies) works the same."""

    @pytest.fixture
    async def store(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisSignalStore]:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            yield RedisSignalStore(client=client, key_prefix=key_prefix)
        finally:
            await client.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_unreachable_redis_is_backend_unavailable(anyio_backend: str) -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    client = redis.asyncio.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    store = RedisSignalStore(client=client)
    try:
        with pytest.raises(BackendUnavailableError, match="send to thread"):
            await store.accept("t", Signal(1), "deliver")
        with pytest.raises(BackendUnavailableError):
            await store.pending_threads()
    finally:
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_redis_store_under_trio_is_unsupported(anyio_backend: str) -> None:
    store = RedisSignalStore(url="redis://127.0.0.1:1/0")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await store.accept("t", Signal(1), "deliver")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await store.read("t")
