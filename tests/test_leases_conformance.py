"""The public conformance suite run against the no-op and in-memory providers (asyncio, trio),
and against the first-party pub/subs, each of which is its own lease provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leases import InMemoryLeaseProvider, LeaseProvider, NoopLeaseProvider
from leases.testing import LeaseProviderConformance, ManualClock
from pubsub import InMemoryPubSub, RedisStreamsPubSub, SQLitePubSub

pytestmark = pytest.mark.anyio


class TestNoopConformance(LeaseProviderConformance):
    exclusive = False

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return NoopLeaseProvider()


class TestInMemoryConformance(LeaseProviderConformance):
    """Real time (``anyio.current_time``), real sleeps."""

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return InMemoryLeaseProvider()


class TestInMemoryManualClockConformance(LeaseProviderConformance):
    """A manual clock: expiry is exact and the suite takes no real time."""

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return InMemoryLeaseProvider(clock=ManualClock())

    async def advance(self, provider: LeaseProvider, ms: int) -> None:
        assert isinstance(provider, InMemoryLeaseProvider)
        clock = provider.clock
        assert isinstance(clock, ManualClock)
        clock.advance(ms / 1000)


class TestInMemoryPubSubIsALeaseProvider(LeaseProviderConformance):
    """A first-party pub/sub is its own lease provider (the design card's shape): the suite
    runs against the pub/sub object itself."""

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return InMemoryPubSub()


class TestSQLitePubSubIsALeaseProvider(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[LeaseProvider]:
        async with SQLitePubSub(tmp_path / "leases.db") as pubsub:
            yield pubsub


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
class TestRedisStreamsPubSubIsALeaseProvider(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, redis_url: str, key_prefix: str) -> AsyncIterator[LeaseProvider]:
        async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub:
            yield pubsub
