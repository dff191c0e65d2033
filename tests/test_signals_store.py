"""The built-in cores run every ``signals.testing`` kit, plus backend-specific checks."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
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
from signals.testing import SignalBackendConformance

pytestmark = pytest.mark.anyio


async def assert_no_pending_work(core: Any) -> None:
    """Every check of the kit withdraws what it left: no thread of its prefix is indexed."""
    left = await core.due(limit=1000, until=math.inf)
    assert left.threads == [], f"the check left pending work on {left.threads}"


class TestInMemoryCore(SignalBackendConformance):
    """asyncio and trio, a manual clock, fused with an in-memory lease provider."""

    @pytest.fixture
    def manual_clock(self) -> ManualClock:
        return ManualClock(start=time.time())

    @pytest.fixture
    def leases(self, manual_clock: ManualClock) -> InMemoryLeaseProvider:
        return InMemoryLeaseProvider(clock=manual_clock)

    @pytest.fixture
    def core(self, manual_clock: ManualClock, leases: InMemoryLeaseProvider
             ) -> InMemorySignalStore:
        self.clock = manual_clock
        return InMemorySignalStore(leases=leases, retention_ms=60_000, clock=manual_clock)

    @pytest.fixture
    def small_core(self) -> InMemorySignalStore:
        return InMemorySignalStore(stream_max_parts=5)

    def now(self, core: Any) -> float:
        return self.clock()

    async def advance(self, core: Any, ms: int) -> None:
        self.clock.advance(ms / 1000)

    async def expire_receipts(self, core: Any) -> None:
        self.clock.advance(61)


class TestInMemoryCoreGeneric(SignalBackendConformance):
    """Without a lease provider: no fused calls (those checks skip), real time."""

    @pytest.fixture
    async def core(self) -> AsyncIterator[InMemorySignalStore]:
        core = InMemorySignalStore()
        yield core
        await assert_no_pending_work(core)  # after the kit's own clean-up


@pytest.mark.redis
class TestRedisCore(SignalBackendConformance):
    @pytest.fixture
    async def leases(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisLeaseProvider]:
        async with RedisLeaseProvider(url=redis_url, key_prefix=f"{key_prefix}:lease") as leases:
            yield leases

    @pytest.fixture
    async def core(self, leases: RedisLeaseProvider, key_prefix: str
                   ) -> AsyncIterator[RedisSignalStore]:
        core = RedisSignalStore(client=leases.client, key_prefix=f"{key_prefix}:signals",
                                leases=leases)
        yield core
        await assert_no_pending_work(core)  # after the kit's own clean-up

    @pytest.fixture
    def small_core(self, leases: RedisLeaseProvider, key_prefix: str) -> RedisSignalStore:
        return RedisSignalStore(client=leases.client, key_prefix=f"{key_prefix}:small",
                                stream_max_parts=5)


@pytest.mark.redis
class TestRedisCoreDecodedClient(SignalBackendConformance):
    """A client built with ``decode_responses=True`` (str replies) works the same."""

    @pytest.fixture
    async def core(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisSignalStore]:
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
            await store.due()
    finally:
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_redis_store_under_trio_is_unsupported(anyio_backend: str) -> None:
    store = RedisSignalStore(url="redis://127.0.0.1:1/0")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await store.accept("t", Signal(1), "deliver")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await store.entries("t")


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_thread_outlives_its_output_stream_retention(
    anyio_backend: str, redis_url: str, key_prefix: str
) -> None:
    """An acknowledgement appends a part to the output stream, whose retention (24 h by
    default) is shorter than the thread's idle TTL (7 days). The part must not shorten the
    life of the thread's own record (entry counter, pause, fencing token): once it had
    expired, the next signals took entry numbers still in use and overwrote a pending one."""
    from signals.kit import Ack, RunRef

    client = redis.asyncio.Redis.from_url(redis_url)
    store = RedisSignalStore(client=client, key_prefix=f"{key_prefix}:s",
                             stream_retention_ms=200, idle_ttl_ms=60_000)
    try:
        for n in (1, 2):
            await store.accept("t", Signal(n, id=f"s{n}"), "deliver")
        run = RunRef("rt-a/run-1", 1)
        taken = await store.take("t", run, max_attempts=3, first=True)
        assert [e.signal.id for e in taken.entries] == ["s1"]
        acked = Ack(taken.entries[0].entry_id, "s1")
        assert await store.settle("t", run, acks=[acked])  # the last write: a part
        meta = f"{key_prefix}:s:{{t}}:meta"
        assert await client.pttl(meta) > 10_000, "the part cut the thread record's TTL"
        await anyio.sleep(0.5)  # past the stream's retention
        for n in (3, 4):
            await store.accept("t", Signal(n, id=f"s{n}"), "deliver")
        pending = await store.entries("t")
        assert [(e.signal.id, e.signal.payload) for e in pending] == [
            ("s2", 2), ("s3", 3), ("s4", 4)
        ]
    finally:
        await store.withdraw("t", None, held=True)
        await client.aclose()
