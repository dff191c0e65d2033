"""RedisStreamsPubSub on a real Redis: crash reclaim, restart, bounds, one reader connection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import redis.asyncio

import leases
from pubsub import Event, PubSubClosedError, RedisStreamsPubSub, UnsupportedBackendError
from tests._redis_server import RedisServer, redis_server_binary

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _wait_for(predicate: object, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():  # type: ignore[operator]
            await anyio.sleep(0.02)


@pytest.mark.slow
async def test_sigkilled_consumer_pending_events_are_reclaimed(
    redis_url: str, key_prefix: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.pubsub_kill_worker", redis_url, key_prefix],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
        async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as publisher:
            ids = [await publisher.publish("t", Event("e", "ok" if i else "block"))
                   for i in range(5)]

        async def started() -> bool:
            return bool(await client.llen(f"{key_prefix}:started"))

        await _wait_for(started)
        os.kill(worker.pid, signal.SIGKILL)
        worker.communicate(timeout=10)

        got: dict[str, int] = {}

        async def handler(event: Event) -> None:
            got[event.id] = event.delivery_attempt

        async with RedisStreamsPubSub(
            url=redis_url, key_prefix=key_prefix, reclaim_idle_ms=300, reclaim_interval_ms=100,
            block_ms=100,
        ) as survivor:
            await survivor.subscribe("t", handler, group="g")

            async def all_done() -> bool:
                handled = set(await client.lrange(f"{key_prefix}:handled", 0, -1))
                return handled | set(got) >= set(ids)

            await _wait_for(all_done)
            pending = await client.xpending(survivor.stream_key("t"), "g")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=10)
        await client.aclose()
    assert ids[0] in got, "the event the dead consumer was handling is delivered again"
    assert got[ids[0]] >= 2
    assert pending["pending"] == 0


async def test_reconnects_after_restart_without_losing_events(key_prefix: str) -> None:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server missing")
    with RedisServer(binary, appendonly=True) as server:
        got: list[str] = []

        async def handler(event: Event) -> None:
            got.append(event.data)

        async with RedisStreamsPubSub(url=server.url, key_prefix=key_prefix, block_ms=100) as ps:
            sub = await ps.subscribe("t", handler, group="g")
            await ps.publish("t", Event("e", "before"))
            await _wait_for(_has(got, "before"))
            await sub.close()
            await ps.publish("t", Event("e", "while-away"))  # accepted, not yet consumed
            server.restart()
            await ps.subscribe("t", handler, group="g")
            await ps.publish("t", Event("e", "after"))
            await _wait_for(_has(got, "after"), timeout=20)
            await _wait_for(_has(got, "while-away"))
    assert sorted(got) == ["after", "before", "while-away"]


def _has(items: list[str], value: str) -> object:
    async def check() -> bool:
        return value in items

    return check


async def test_streams_are_bounded(redis_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, max_stream_length=100, stream_idle_ttl_ms=60_000
    ) as ps:
        for i in range(1500):
            await ps.publish("t", Event("e", i))
        length = await ps.redis_client.xlen(ps.stream_key("t"))
        ttl = await ps.redis_client.pttl(ps.stream_key("t"))
    assert length <= 300  # approximate trimming keeps a little more than the bound
    assert 0 < ttl <= 60_000


async def test_one_reader_connection_serves_every_subscription(
    redis_url: str, key_prefix: str
) -> None:
    async def handler(event: Event) -> None:
        return None

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=50) as ps:
        for i in range(20):
            await ps.subscribe(f"topic-{i}", handler)
        for i in range(3):
            await ps.subscribe("shared", handler, group=f"g{i}")
        await anyio.sleep(0.3)
        clients = await ps.redis_client.client_list()
        readers = [c for c in clients if c.get("name", "").startswith(f"{key_prefix}:reader:")]
    assert len(readers) == 1


async def test_fanout_groups_are_destroyed_on_close(redis_url: str, key_prefix: str) -> None:
    async def handler(event: Event) -> None:
        return None

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        sub = await ps.subscribe("t", handler)
        assert len(await ps.redis_client.xinfo_groups(ps.stream_key("t"))) == 1
        await sub.close()
        assert await ps.redis_client.xinfo_groups(ps.stream_key("t")) == []


async def test_is_a_lease_provider_on_the_same_connection(redis_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        assert leases.is_lease_provider(ps)
        assert leases.resolve_lease_provider(ps) is ps
        first = await ps.acquire_lease("k", "a", 5000)
        assert first.acquired and first.token is not None
        assert await ps.get_lease_owner("k") == "a"
        info = await ps.lease_info("k")
        assert info is not None and info.owner == "a"


async def test_errors_are_clear(redis_url: str, key_prefix: str) -> None:
    with pytest.raises(TypeError):
        RedisStreamsPubSub()
    with pytest.raises(ValueError):
        RedisStreamsPubSub(url=redis_url, max_delivery_attempts=0)
    ps = RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix)

    async def handler(event: Event) -> None:
        return None

    with pytest.raises(PubSubClosedError):
        await ps.subscribe("t", handler)
    with pytest.raises(leases.BackendUnavailableError):
        async with RedisStreamsPubSub(url="redis://127.0.0.1:1/0"):
            pass
    await ps.redis_client.aclose()


def test_trio_is_refused_clearly() -> None:
    async def main() -> None:
        ps = RedisStreamsPubSub(url="redis://127.0.0.1:1/0")
        with pytest.raises(UnsupportedBackendError):
            await ps.publish("t", Event("e"))

    anyio.run(main, backend="trio")
