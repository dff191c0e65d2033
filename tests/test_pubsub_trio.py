"""Async-library support: ``RedisStreamsPubSub`` refuses trio clearly (redis-py is
asyncio-only) instead of failing deep inside redis-py. No Redis server is needed."""

from __future__ import annotations

import pytest

from pubsub import Event, RedisStreamsPubSub, UnsupportedBackendError

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]


async def test_trio_is_refused_clearly() -> None:
    ps = RedisStreamsPubSub(url="redis://127.0.0.1:1/0")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await ps.publish("t", Event("e"))
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        async with ps:
            pass
