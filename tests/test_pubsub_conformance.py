"""The pub/sub conformance suite against both built-in backends (Redis on asyncio only)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pubsub import InMemoryPubSub, RedisStreamsPubSub
from pubsub.testing import PubSubConformance

pytestmark = pytest.mark.anyio


class TestInMemoryPubSub(PubSubConformance):
    @pytest.fixture
    async def pubsub(self) -> AsyncIterator[InMemoryPubSub]:
        async with InMemoryPubSub(max_delivery_attempts=3) as backend:
            yield backend


@pytest.mark.redis
class TestRedisStreamsPubSub(PubSubConformance):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    async def pubsub(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisStreamsPubSub]:
        async with RedisStreamsPubSub(
            url=redis_url, key_prefix=key_prefix, block_ms=100, max_delivery_attempts=3
        ) as backend:
            yield backend
