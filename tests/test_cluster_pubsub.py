"""RedisStreamsPubSub on a real Redis Cluster (3 masters, 3 replicas, started by the suite):
the conformance suite, and the reader's connections (one per node with subscribed streams)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio

from pubsub import Event, PubSub, RedisStreamsPubSub
from pubsub.testing import PubSubConformance, Recorder

if TYPE_CHECKING:
    from tests._redis_cluster import RedisCluster

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster]


class TestClusterPubSubConformance(PubSubConformance):
    @pytest.fixture
    async def pubsub(self, cluster_url: str, key_prefix: str) -> AsyncIterator[PubSub]:
        backend = RedisStreamsPubSub(
            url=cluster_url,
            cluster=True,
            key_prefix=key_prefix,
            max_delivery_attempts=self.max_delivery_attempts,
            block_ms=100,
        )
        async with backend:
            yield backend


@pytest.fixture
async def raw(cluster_url: str) -> AsyncIterator[redis.asyncio.RedisCluster]:
    client = redis.asyncio.RedisCluster.from_url(cluster_url, decode_responses=True)
    await client.initialize()
    try:
        yield client
    finally:
        await client.aclose()


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - polls Redis, not a local flag
            await anyio.sleep(0.02)


async def _readers(cluster: RedisCluster, prefix: str) -> dict[int, int]:
    """Reader connections (by CLIENT SETNAME) open on each master."""
    counts = {}
    for port in cluster.masters():
        node = redis.asyncio.Redis(port=port, decode_responses=True)
        try:
            clients: Any = await node.client_list()
        finally:
            await node.aclose()
        counts[port] = sum(1 for c in clients if c.get("name", "").startswith(f"{prefix}:reader:"))
    return counts


async def test_one_reader_connection_per_node_serves_every_subscription(
    cluster_url: str, key_prefix: str, redis_cluster: RedisCluster
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(
        url=cluster_url, cluster=True, key_prefix=key_prefix, block_ms=50
    ) as ps:
        topics = [f"topic-{i}" for i in range(30)]
        assert len({redis_cluster.master_of(ps.stream_key(t)) for t in topics}) == 3
        subs = [await ps.subscribe(t, got) for t in topics]
        subs += [await ps.subscribe("shared", got, group=f"g{i}") for i in range(3)]
        for i, topic in enumerate(topics):
            await ps.publish(topic, Event("e", i))
        await ps.publish("shared", Event("e", "shared"))
        await wait_for(_true_when(lambda: len(got.events) == 33), timeout=20)
        assert sorted(map(str, got.data)) == sorted([*map(str, range(30)), *["shared"] * 3])
        one_each = dict.fromkeys(redis_cluster.masters(), 1)
        assert await _readers(redis_cluster, key_prefix) == one_each
        for sub in subs:
            await sub.close()

        async def no_readers() -> bool:
            return set((await _readers(redis_cluster, key_prefix)).values()) == {0}

        await wait_for(no_readers)  # a node with nothing subscribed keeps no reader connection


async def test_a_new_subscription_does_not_wait_out_a_blocked_read(
    cluster_url: str, key_prefix: str, redis_cluster: RedisCluster
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(
        url=cluster_url, cluster=True, key_prefix=key_prefix, block_ms=60_000
    ) as ps:
        await ps.subscribe("quiet", got)
        await anyio.sleep(0.2)  # that node's reader is now blocked for up to a minute
        quiet = redis_cluster.master_of(ps.stream_key("quiet"))
        same = next(
            t for t in (f"s{i}" for i in range(200))
            if redis_cluster.master_of(ps.stream_key(t)) == quiet
        )
        other = next(
            t for t in (f"o{i}" for i in range(200))
            if redis_cluster.master_of(ps.stream_key(t)) != quiet
        )
        for i, topic in enumerate([same, other]):
            await ps.subscribe(topic, got)
            await ps.publish(topic, Event("e", i))
            # far below block_ms: CLIENT UNBLOCK ended the read
            await wait_for(_has_count(got, i + 1), timeout=20)
        await ps.subscribe(same, got, group="g")  # a second read unit on that node
        await ps.publish(same, Event("e", "then"))
        await wait_for(_true_when(lambda: got.data.count("then") == 2), timeout=20)


def _has_count(recorder: Recorder, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(recorder.data) == count

    return check


def _true_when(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check


async def test_a_dead_consumers_pending_entry_is_reclaimed(
    cluster_url: str, key_prefix: str, raw: redis.asyncio.RedisCluster
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(
        url=cluster_url, cluster=True, key_prefix=key_prefix, reclaim_idle_ms=200,
        reclaim_interval_ms=50, block_ms=100,
    ) as ps:
        stream = ps.stream_key("t")
        await raw.xgroup_create(stream, "g", id="0", mkstream=True)
        await raw.xadd(stream, {"event": Event("e", "orphan").to_json()})
        await raw.xreadgroup("g", "g:dead", {stream: ">"})  # handed to a consumer that died
        await ps.subscribe("t", got, group="g")
        await wait_for(_true_when(lambda: got.data == ["orphan"]))
        assert got.events[0].delivery_attempt == 2

        async def acked() -> bool:
            pending: Any = await raw.xpending(stream, "g")
            return bool(pending["pending"] == 0)

        await wait_for(acked)


async def test_dead_processes_fanout_groups_are_swept(
    cluster_url: str, key_prefix: str, raw: redis.asyncio.RedisCluster
) -> None:
    async with RedisStreamsPubSub(
        url=cluster_url, cluster=True, key_prefix=key_prefix, reclaim_idle_ms=100,
        reclaim_interval_ms=50,
    ) as ps:
        stream = ps.stream_key("t")
        await raw.xgroup_create(stream, "fanout:dead", id="$", mkstream=True)
        await raw.xgroup_create(stream, "fanout:alive", id="$")
        await raw.set(f"{key_prefix}:alive:alive", "1", px=60_000)  # another slot, maybe node
        await raw.xgroup_create(stream, "g", id="$")
        await raw.xgroup_createconsumer(stream, "g", "g:dead")
        await ps.subscribe("t", Recorder())
        await ps.subscribe("t", Recorder(), group="g")

        async def swept() -> bool:
            names = {g["name"] for g in await raw.xinfo_groups(stream)}
            consumers = {c["name"] for c in await raw.xinfo_consumers(stream, "g")}
            return "fanout:dead" not in names and "g:dead" not in consumers

        await wait_for(swept)
        names = {g["name"] for g in await raw.xinfo_groups(stream)}
    assert {"fanout:alive", f"fanout:{ps.process_id}", "g"} <= names
    assert await raw.xinfo_groups(stream) == [] or {
        g["name"] for g in await raw.xinfo_groups(stream)
    } == {"fanout:alive", "g"}  # our private group went at exit


async def test_its_lease_provider_works_on_the_cluster(cluster_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(url=cluster_url, cluster=True, key_prefix=key_prefix) as ps:
        provider = ps.get_lease_provider()
        assert provider.client is ps.redis_client
        assert (await provider.acquire_lease("k", "a", 5000)).acquired
        assert await provider.renew_leases([("k", "a")], 5000) == {"k"}
        assert await provider.open_lease_session(5000) is None
