"""Both inboxes run the ``signals.testing`` conformance suite, plus backend-specific checks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio

from leases import BackendUnavailableError, UnsupportedBackendError
from leases.testing import ManualClock
from signals import InMemorySignalInbox, RedisSignalInbox, Signal
from signals.testing import SignalInboxConformance

pytestmark = pytest.mark.anyio


class TestInMemoryInbox(SignalInboxConformance):
    """asyncio and trio."""

    @pytest.fixture
    def inbox(self) -> InMemorySignalInbox:
        self.clock = ManualClock()
        return InMemorySignalInbox(dedup_window_s=60, clock=self.clock)

    async def expire_dedup_window(self, inbox: object) -> None:
        self.clock.advance(61)


@pytest.mark.redis
class TestRedisInbox(SignalInboxConformance):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    async def inbox(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisSignalInbox]:
        async with RedisSignalInbox(url=redis_url, key_prefix=key_prefix) as inbox:
            yield inbox


@pytest.mark.redis
class TestRedisInboxDecodedClient(SignalInboxConformance):
    """A client built with ``decode_responses=True`` (str replies) works the same."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    async def inbox(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisSignalInbox]:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            yield RedisSignalInbox(client=client, key_prefix=key_prefix)
        finally:
            await client.aclose()


# -- in-memory specifics ----------------------------------------------------------------------


def test_memory_inbox_refuses_a_bad_window() -> None:
    with pytest.raises(ValueError, match="dedup_window_s"):
        InMemorySignalInbox(dedup_window_s=0)
    with pytest.raises(TypeError, match="dedup_window_s"):
        InMemorySignalInbox(dedup_window_s="1")  # type: ignore[arg-type]


async def test_memory_inbox_refuses_foreign_entry_ids_and_limits() -> None:
    inbox = InMemorySignalInbox()
    with pytest.raises(ValueError, match="entry id"):
        await inbox.inbox_read("t", after="1-0")
    with pytest.raises(ValueError, match="limit"):
        await inbox.inbox_read("t", limit=0)
    with pytest.raises(ValueError, match="limit"):
        await inbox.inbox_pending_threads(0)
    with pytest.raises(TypeError, match="Signal"):
        await inbox.inbox_append("t", {"not": "a signal"}, "deliver")  # type: ignore[arg-type]


async def test_memory_inbox_forgets_idle_threads_after_the_window() -> None:
    clock = ManualClock()
    inbox = InMemorySignalInbox(dedup_window_s=10, clock=clock)
    assert await inbox.inbox_append("t", Signal(1, id="a"), "deliver")
    [entry] = await inbox.inbox_read("t")
    await inbox.inbox_remove("t", [entry.entry_id])
    clock.advance(11)
    assert await inbox.inbox_append("other", Signal(1), "deliver")  # trims on the way
    assert await inbox.inbox_append("t", Signal(1, id="a"), "deliver")  # window passed
    assert await inbox.inbox_pending_threads() == ["other", "t"]  # longest-waiting first


# -- Redis specifics --------------------------------------------------------------------------


@pytest.mark.redis
class TestRedisInboxSpecifics:
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    async def test_key_layout_is_hash_tagged_with_idle_ttls(
        self, redis_client: redis.asyncio.Redis, key_prefix: str
    ) -> None:
        inbox = RedisSignalInbox(client=redis_client, key_prefix=key_prefix, idle_ttl_ms=60_000)
        assert await inbox.inbox_append("th", Signal("x", id="a"), "queue")
        assert inbox.inbox_key("th") == f"{key_prefix}:{{th}}:inbox"
        assert inbox.seen_key("th") == f"{key_prefix}:{{th}}:seen"
        assert await redis_client.type(inbox.inbox_key("th")) == b"stream"
        assert await redis_client.zscore(inbox.seen_key("th"), "a") is not None
        assert 0 < await redis_client.pttl(inbox.inbox_key("th")) <= 60_000
        assert await redis_client.pttl(inbox.seen_key("th")) > 60_000  # the dedup window (1 d)
        assert await redis_client.zrange(inbox.index_key, 0, -1) == [b"th"]
        [entry] = await inbox.inbox_read("th")
        await inbox.inbox_remove("th", [entry.entry_id])
        assert await redis_client.zrange(inbox.index_key, 0, -1) == []  # emptied: unindexed

    async def test_dedup_window_ends_on_the_server_clock(
        self, redis_client: redis.asyncio.Redis, key_prefix: str
    ) -> None:
        inbox = RedisSignalInbox(client=redis_client, key_prefix=key_prefix, dedup_window_ms=50)
        assert await inbox.inbox_append("t", Signal(1, id="a"), "deliver")
        assert not await inbox.inbox_append("t", Signal(1, id="a"), "deliver")
        await anyio.sleep(0.12)
        assert await inbox.inbox_append("t", Signal(1, id="a"), "deliver")

    async def test_an_inbox_deleted_by_hand_leaves_the_index(
        self, redis_client: redis.asyncio.Redis, key_prefix: str
    ) -> None:
        inbox = RedisSignalInbox(client=redis_client, key_prefix=key_prefix)
        assert await inbox.inbox_append("gone", Signal(1), "deliver")
        assert await inbox.inbox_append("kept", Signal(1), "deliver")
        await redis_client.delete(inbox.inbox_key("gone"))  # as if it idled out
        assert await inbox.inbox_pending_threads() == ["kept"]
        assert await redis_client.zrange(inbox.index_key, 0, -1) == [b"kept"]

    async def test_bad_arguments(self, redis_client: redis.asyncio.Redis) -> None:
        with pytest.raises(TypeError, match="exactly one"):
            RedisSignalInbox()
        with pytest.raises(TypeError, match="exactly one"):
            RedisSignalInbox(url="redis://x", client=redis_client)
        with pytest.raises(ValueError, match="key_prefix"):
            RedisSignalInbox(client=redis_client, key_prefix="")
        with pytest.raises(ValueError, match="dedup_window_ms"):
            RedisSignalInbox(client=redis_client, dedup_window_ms=0)
        inbox = RedisSignalInbox(client=redis_client)
        with pytest.raises(ValueError, match="entry id"):
            await inbox.inbox_read("t", after="7")
        with pytest.raises(ValueError, match="entry id"):
            await inbox.inbox_remove("t", ["nope"])

    async def test_unreachable_redis_is_backend_unavailable(self) -> None:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        client = redis.asyncio.Redis(
            host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        inbox = RedisSignalInbox(client=client)
        try:
            with pytest.raises(BackendUnavailableError, match="inbox append"):
                await inbox.inbox_append("t", Signal(1), "deliver")
            with pytest.raises(BackendUnavailableError):
                await inbox.inbox_pending_threads()
        finally:
            await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_redis_inbox_under_trio_is_unsupported(anyio_backend: str) -> None:
    inbox = RedisSignalInbox(url="redis://127.0.0.1:1/0")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await inbox.inbox_append("t", Signal(1), "deliver")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await inbox.inbox_read("t")
