"""The Redis store's notice listener (``RedisSignalStore.listen``): one pub/sub connection per
runtime, read directly; a lost connection is always followed by ``resync``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions

from signals import RedisSignalStore
from signals._backends.redis.presence import _next_message
from signals.kit import Notice

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


class _Heard:
    """A listener's handler: the kinds of the notices it heard, in order."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self._changed = anyio.Event()

    def __call__(self, notice: Notice) -> None:
        self.kinds.append(notice.kind)
        self._changed.set()

    async def until(self, kind: str) -> None:
        with anyio.fail_after(10):
            while kind not in self.kinds:
                self._changed = anyio.Event()
                await self._changed.wait()


async def test_a_killed_notice_connection_is_followed_by_a_resync(
    redis_url: str, key_prefix: str
) -> None:
    """The listener's connection is killed: the notices published while it was gone are lost
    with it, so the listener must say ``resync`` once it is back (a silent reconnect, as
    redis-py's own retry makes, would leave them missed unseen), then hear notices again."""
    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    admin = redis.asyncio.Redis.from_url(redis_url)
    heard = _Heard()
    try:
        async with store.listen("rt-a", heard, worker=False):
            await heard.until("resync")  # (the first, at connect)
            for _round in range(2):
                heard.kinds.clear()
                assert await admin.client_kill_filter(_type="pubsub") >= 1
                await heard.until("resync")
                await store.notify("rt-a", Notice("work", "t"))  # (subscribed before resync)
                await heard.until("work")
    finally:
        await admin.aclose()
        await store.aclose()


async def test_a_read_returns_messages_and_nothing_for_other_replies(redis_url: str) -> None:
    """``_next_message`` returns a message's data; the subscription's confirmation, a health
    check's ``PONG`` and a read that times out give ``None`` (and a later message still
    comes)."""
    client = redis.asyncio.Redis.from_url(redis_url, health_check_interval=30)
    pubsub: Any = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("notices-test")
        assert await _next_message(pubsub) is None  # the SUBSCRIBE's confirmation
        pubsub.connection.next_health_check = -1.0  # a health check is due: PING, then PONG
        await client.publish("notices-test", "one")
        replies = [await _next_message(pubsub), await _next_message(pubsub)]
        assert b"one" in replies and replies.count(None) == 1, replies
        await client.publish("notices-test", "two")
        assert await _next_message(pubsub) == b"two"
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_a_health_check_left_unanswered_is_a_lost_connection(redis_url: str) -> None:
    """A ``PING`` with nothing read for the read's timeout after it (the server paused here,
    as a network black hole would leave it) raises ``ConnectionError``: the listen loop then
    reconnects and resyncs, instead of waiting on a dead connection for ever. Without a
    ``PING`` due, a quiet read is only quiet."""
    client = redis.asyncio.Redis.from_url(redis_url, health_check_interval=30)
    admin = redis.asyncio.Redis.from_url(redis_url)
    pubsub: Any = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("notices-test")
        assert await _next_message(pubsub) is None  # the SUBSCRIBE's confirmation
        assert await _next_message(pubsub, timeout=0.2) is None  # quiet: no PING due
        await admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")  # type: ignore[no-untyped-call]
        pubsub.connection.next_health_check = -1.0  # due: the PING gets no reply in time
        with pytest.raises(redis.exceptions.ConnectionError, match="health check"):
            await _next_message(pubsub, timeout=0.3)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        await pubsub.aclose()
        await client.aclose()
        await admin.aclose()
