"""RedisStreamsPubSub's private fan-out groups: where they start, and that none is left behind.

A ``latest`` subscription never sees an event published before it subscribed, whatever state
the process's private group is in (left over, recreated after ``NOGROUP``). The private group
of a process goes when its last subscription closes and when the pub/sub exits, and the group
of a process that died is reaped by the others within the bound its liveness key records.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.asyncio

from pubsub import Event, RedisStreamsPubSub
from pubsub.testing import Recorder
from tests.test_pubsub_redis import kill_worker, sigkill, wait_for

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.redis,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


async def _groups(redis_client: redis.asyncio.Redis, stream: str) -> list[str]:
    try:
        infos: Any = await redis_client.xinfo_groups(stream)
    except redis.exceptions.ResponseError:  # no such stream: no group either
        return []
    return [info["name"].decode() for info in infos]


async def _received(recorder: Recorder, data: Any) -> None:
    with anyio.fail_after(10):
        while data not in recorder.data:  # noqa: ASYNC110 - a plain list, filled by a handler
            await anyio.sleep(0.005)


# A replayed entry would come before the last one published (one member gets its topic's
# entries in stream order), so once the last one is in, the list is complete.


# -- latest means latest ------------------------------------------------------------------


async def test_latest_after_a_resubscribe_sees_only_later_events(
    redis_url: str, key_prefix: str
) -> None:
    """Closing the last fan-out subscription of a topic while the reader is blocked on it,
    then publishing, then subscribing again at ``latest``: nothing from the gap arrives."""
    first, second = Recorder(), Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=2000) as ps:
        sub = await ps.subscribe("t", first)
        await ps.publish("t", Event("e", "seen"))
        await _received(first, "seen")
        await anyio.sleep(0.05)  # the reader is blocked on the topic again
        await sub.close()
        await anyio.sleep(0.05)  # the reader has met NOGROUP for the group that went
        for i in range(3):
            await ps.publish("t", Event("e", f"gap-{i}"))
        await ps.subscribe("t", second)
        await ps.publish("t", Event("e", "after"))
        await _received(second, "after")
    assert first.data == ["seen"]
    assert second.data == ["after"]


@pytest.mark.parametrize("leftover_at", ["0", "$"])
async def test_latest_ignores_a_leftover_group_of_the_same_name(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis, leftover_at: str
) -> None:
    """A restart with the same ``consumer_name`` finds the private group of its previous run
    (left behind by a crash). A ``latest`` subscription starts at the stream's end anyway,
    and stays there when the group is later lost and recreated (``NOGROUP``)."""
    got = Recorder()
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, block_ms=100, consumer_name="svc"
    ) as ps:
        stream = ps.stream_key("t")
        await redis_client.xgroup_create(stream, "fanout:svc", id="$", mkstream=True)
        for i in range(3):
            await ps.publish("t", Event("e", f"old-{i}"))
        if leftover_at == "$":  # the earlier run had read everything
            await redis_client.xgroup_setid(stream, "fanout:svc", id="$")
        await ps.subscribe("t", got)
        await redis_client.xgroup_destroy(stream, "fanout:svc")  # lost (swept by mistake, say)

        async def recreated() -> bool:  # the reader met NOGROUP and recreated the group
            return "fanout:svc" in await _groups(redis_client, stream)

        await wait_for(recreated)
        await ps.publish("t", Event("e", "new"))
        await _received(got, "new")
    assert got.data == ["new"]


# -- no group left behind -----------------------------------------------------------------


async def test_subscribe_close_cycles_leave_no_groups(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis
) -> None:
    """200 subscribe/close cycles over 20 topics, with the reader blocked on the topics: at
    most one private group per stream while a subscription is open, none after close."""
    topics = [f"t{i}" for i in range(20)]
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=1000) as ps:
        keeper = await ps.subscribe("keep", Recorder())  # the slot the reader blocks on
        most = 0
        for cycle in range(200):
            topic = topics[cycle % len(topics)]
            got = Recorder()
            sub = await ps.subscribe(topic, got)
            await ps.publish(topic, Event("e", cycle))
            await _received(got, cycle)
            if cycle % 10 == 0:
                most = max(most, len(await _groups(redis_client, ps.stream_key(topic))))
            await sub.close()
        await anyio.sleep(0.1)  # the reader has reacted to the last group that went
        left = {t: await _groups(redis_client, ps.stream_key(t)) for t in topics}
        await keeper.close()
        assert await _groups(redis_client, ps.stream_key("keep")) == []
    assert most == 1
    assert left == {t: [] for t in topics}


async def test_exit_destroys_the_private_groups(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis
) -> None:
    ps = RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=100)
    with pytest.raises(RuntimeError, match="boom"):
        async with ps:
            for topic in ("a", "b", "c"):
                await ps.subscribe(topic, Recorder())
            await ps.subscribe("a", Recorder(), group="durable")
            raise RuntimeError("boom")
    durable = await _groups(redis_client, ps.stream_key("a"))
    assert durable == ["durable"], "named groups are durable"
    assert await _groups(redis_client, ps.stream_key("b")) == []
    assert await _groups(redis_client, ps.stream_key("c")) == []
    assert not await redis_client.exists(f"{key_prefix}:alive:{ps.process_id}")


async def test_only_a_subscriber_keeps_a_liveness_key(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis
) -> None:
    """A process that only publishes (a serverless sender) writes no liveness key; the first
    subscription writes it before its group exists, and exit deletes it."""
    ps = RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=100)
    alive = f"{key_prefix}:alive:{ps.process_id}"
    async with ps:
        await ps.publish("t", Event("e"))
        assert not await redis_client.exists(alive)
        await ps.subscribe("t", Recorder())
        assert await redis_client.pttl(alive) > 0
    assert not await redis_client.exists(alive)


# -- groups of dead processes ---------------------------------------------------------------


async def test_an_abandoned_group_is_reaped_once_its_bound_passes(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis
) -> None:
    """A process that stopped without cleaning up: its group stays while its liveness key
    (whose TTL is the bound) lives, and goes soon after the key expires."""
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, reclaim_idle_ms=100, block_ms=100
    ) as ps:
        stream = ps.stream_key("t")
        await redis_client.xgroup_create(stream, "fanout:ghost", id="$", mkstream=True)
        await redis_client.set(f"{key_prefix}:alive:ghost", "400", px=400)
        await ps.subscribe("t", Recorder())
        await anyio.sleep(0.25)  # two sweeps
        assert "fanout:ghost" in await _groups(redis_client, stream), "reaped while still alive"

        async def reaped() -> bool:
            return "fanout:ghost" not in await _groups(redis_client, stream)

        start = anyio.current_time()
        await wait_for(reaped, timeout=5)
        assert anyio.current_time() - start < 0.6  # 0.15 s of TTL left + one sweep period
        assert await _groups(redis_client, stream) == [f"fanout:{ps.process_id}"]


@pytest.mark.slow
async def test_a_sigkilled_process_fanout_group_is_reaped(
    redis_url: str, key_prefix: str, redis_client: redis.asyncio.Redis
) -> None:
    async with kill_worker(redis_url, key_prefix, "fanout") as (worker, ready):
        word, dead_id = ready.split()
        assert word == "ready"
        await sigkill(worker)
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, reclaim_idle_ms=100, block_ms=100
    ) as survivor:
        stream = survivor.stream_key("t")
        assert f"fanout:{dead_id}" in await _groups(redis_client, stream)
        bound_ms = await redis_client.pttl(f"{key_prefix}:alive:{dead_id}")
        assert 0 < bound_ms <= 500, "the dead process's bound: 10 x its reclaim_idle_ms"
        await survivor.subscribe("t", Recorder())

        async def reaped() -> bool:
            return f"fanout:{dead_id}" not in await _groups(redis_client, stream)

        start = anyio.current_time()
        await wait_for(reaped, timeout=10)
        assert anyio.current_time() - start < bound_ms / 1000 + 0.5
