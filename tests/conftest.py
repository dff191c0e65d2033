"""Shared fixtures: a real redis-server for the session, per-test key prefixes.

Tests that talk to Redis are marked ``redis`` and pin ``anyio_backend`` to asyncio (redis-py is
asyncio-only). Without ``redis-server`` they skip locally; with ``CI=true`` they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from tests._redis_server import RedisServer, redis_server_binary

if TYPE_CHECKING:
    import redis.asyncio


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _require_binary() -> str:
    binary = redis_server_binary()
    if binary is None:
        msg = "redis-server is not installed (apt-get install -y redis-server)"
        if _in_ci():
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the whole session, on a free loopback port."""
    with RedisServer(_require_binary()) as server:
        yield server


@pytest.fixture
def private_redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, for tests that stop or restart it."""
    with RedisServer(_require_binary()) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def key_prefix() -> str:
    """A prefix unique to this test, so tests share the server without FLUSHDB."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A fresh redis-py asyncio client on the session server (asyncio tests only)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()
