"""RedisLeaseProvider on a real Redis Cluster (3 masters, 3 replicas, started by the suite):
the conformance suite, batched renewal grouped by slot with one round trip per node, and a
heartbeat holding 2,000 leases."""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions as rex
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot

from _signal_leases.redis.support import map_errors
from leases import (
    BackendPermanentError,
    BackendUnavailableError,
    HeldLease,
    LeaseHeartbeat,
    LeaseProvider,
    RedisLeaseProvider,
)
from leases.testing import LeaseProviderConformance

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests._redis_cluster import RedisCluster

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster]


class TestClusterConformance(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, cluster_url: str, key_prefix: str) -> AsyncIterator[LeaseProvider]:
        async with RedisLeaseProvider(url=cluster_url, cluster=True, key_prefix=key_prefix) as p:
            yield p


def _evalsha_calls(cluster: RedisCluster, port: int) -> int:
    """How many EVALSHA the node on ``port`` has run (INFO commandstats)."""
    for line in cluster.info(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


@pytest.fixture
async def provider(cluster_url: str, key_prefix: str) -> AsyncIterator[RedisLeaseProvider]:
    async with RedisLeaseProvider(url=cluster_url, cluster=True, key_prefix=key_prefix) as p:
        yield p


async def test_keys_of_one_lease_share_a_slot(provider: RedisLeaseProvider) -> None:
    for key in ["a", "thread-7", "x{y}z", "{", "}", "%7B"]:
        assert key_slot(provider.lease_key(key).encode()) == key_slot(
            provider.fence_key(key).encode()
        )


async def test_sessions_are_refused_on_a_cluster(provider: RedisLeaseProvider) -> None:
    assert await provider.open_lease_session(1000) is None


async def test_batched_renewal_is_one_round_trip_per_node(
    provider: RedisLeaseProvider, redis_cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"k{i}" for i in range(2000)]
    owners = {k: "a" if i % 10 else "b" for i, k in enumerate(keys)}
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            limit = anyio.Semaphore(32)

            async def acquire(key: str) -> None:
                async with limit:
                    assert (await provider.acquire_lease(key, "a", 60_000)).acquired

            for key in keys:
                tg.start_soon(acquire, key)
    assert await provider.renew_leases([(k, "a") for k in keys[:10]], 60_000)  # loads the script

    slots_of: dict[int, set[int]] = {}  # master port -> slots of our leases it serves
    for key in keys:
        port = redis_cluster.master_of(provider.lease_key(key))
        slots_of.setdefault(port, set()).add(key_slot(provider.lease_key(key).encode()))
    assert len(slots_of) == 3  # the keys are spread over every master

    pipelines: Counter[str] = Counter()
    singles: Counter[str] = Counter()
    real_pipeline, real_command = ClusterNode.execute_pipeline, ClusterNode.execute_command

    async def count_pipeline(node: ClusterNode, commands: Any) -> Any:
        pipelines[node.name] += 1
        return await real_pipeline(node, commands)

    async def count_command(node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        singles[node.name] += 1
        return await real_command(node, *args, **kwargs)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", count_pipeline)
    monkeypatch.setattr(ClusterNode, "execute_command", count_command)
    before = {port: _evalsha_calls(redis_cluster, port) for port in slots_of}
    kept = await provider.renew_leases([(k, owners[k]) for k in keys], 60_000)
    after = {port: _evalsha_calls(redis_cluster, port) for port in slots_of}
    monkeypatch.undo()

    assert kept == {k for k in keys if owners[k] == "a"}
    assert pipelines == Counter({f"127.0.0.1:{port}": 1 for port in slots_of})  # 1 per node
    assert not singles
    for port, slots in slots_of.items():  # one RENEW_MANY per slot, all in that pipeline
        assert after[port] - before[port] == len(slots)
    total = sum(len(s) for s in slots_of.values())
    print(f"2,000 leases: {total} slots, EVALSHA per node "
          f"{sorted(after[p] - before[p] for p in slots_of)}, 1 round trip per node")


async def test_a_heartbeat_holds_2000_leases_for_three_ttls(provider: RedisLeaseProvider) -> None:
    ttl_ms = 2000
    lost: list[HeldLease] = []
    keys = [f"held-{i}" for i in range(2000)]
    async with LeaseHeartbeat(provider, ttl_ms, on_lost=lost.append) as heartbeat:
        assert heartbeat.mode == "batch"  # no sessions on a Cluster
        limit = anyio.Semaphore(32)

        async def acquire(key: str) -> None:
            async with limit:
                held, _ = await heartbeat.acquire(key, "owner")
                assert held is not None

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(acquire, key)
        await anyio.sleep(3 * ttl_ms / 1000)
        assert not lost
        assert len(heartbeat) == len(keys)
        assert all(not heartbeat.get(k).lost for k in keys)  # type: ignore[union-attr]
        # the server agrees: every lease is still held by its owner
        assert await provider.renew_leases([(k, "owner") for k in keys], ttl_ms) == set(keys)
    for key in keys[:50]:  # released at exit
        assert await provider.get_lease_owner(key) is None


class TestClusterWaitReplicasConformance(LeaseProviderConformance):
    """Every mutating call followed by WAIT 1 (each master has one replica)."""

    @pytest.fixture
    async def provider(self, cluster_url: str, key_prefix: str) -> AsyncIterator[LeaseProvider]:
        async with RedisLeaseProvider(
            url=cluster_url, cluster=True, key_prefix=key_prefix, wait_replicas=1
        ) as p:
            yield p


async def test_wait_replicas_puts_the_fence_on_the_replica_before_answering(
    cluster_url: str, key_prefix: str, redis_cluster: RedisCluster
) -> None:
    async with RedisLeaseProvider(
        url=cluster_url, cluster=True, key_prefix=key_prefix, wait_replicas=1
    ) as provider:
        for i in range(20):
            key = f"w{i}"
            result = await provider.acquire_lease(key, "a", 10_000)
            replica = redis_cluster.replica_of(redis_cluster.master_of(provider.fence_key(key)))
            # Read the replica right away: WAIT returned, so it has the increment already.
            assert redis_cluster.get_on_replica(replica, provider.fence_key(key)) == str(
                result.token
            )
        kept = await provider.renew_leases([(f"w{i}", "a") for i in range(20)], 10_000)
        assert kept == {f"w{i}" for i in range(20)}
        assert await provider.transfer_lease("w0", "a", "b", 10_000)
        await provider.release_lease("w0", "b")
        assert await provider.renew_lease("w1", "a", 10_000)


async def test_too_few_replicas_raise_backend_unavailable(
    cluster_url: str, key_prefix: str
) -> None:
    async with RedisLeaseProvider(
        url=cluster_url, cluster=True, key_prefix=key_prefix, wait_replicas=2, wait_timeout_ms=50
    ) as provider:
        with pytest.raises(BackendUnavailableError, match="replica"):
            await provider.acquire_lease("k", "a", 10_000)
        with pytest.raises(BackendUnavailableError, match="replica"):
            await provider.renew_leases([(f"k{i}", "a") for i in range(100)], 10_000)
        assert await provider.get_lease_owner("k") == "a"  # reads do not wait
        # the write happened: the same owner's acquire is idempotent once it can be confirmed
    async with RedisLeaseProvider(
        url=cluster_url, cluster=True, key_prefix=key_prefix, wait_replicas=1
    ) as provider:
        again = await provider.acquire_lease("k", "a", 10_000)
        assert again.acquired and again.token == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_standalone_wait_replicas_without_a_replica_fails_closed(
    redis_url: str, key_prefix: str
) -> None:
    async with RedisLeaseProvider(
        url=redis_url, key_prefix=key_prefix, wait_replicas=1, wait_timeout_ms=20
    ) as provider:
        with pytest.raises(BackendUnavailableError, match="replica"):
            await provider.acquire_lease("k", "a", 10_000)
        with pytest.raises(BackendUnavailableError, match="replica"):
            await provider.renew_leases([("k", "a")], 10_000)
        with pytest.raises(BackendUnavailableError, match="replica"):
            await provider.open_lease_session(10_000)


def test_cluster_errors_map_to_the_error_tree() -> None:
    unavailable = [
        rex.RedisClusterException("Redis Cluster cannot be connected. Please provide ..."),
        rex.SlotNotCoveredError("Slot 42 is not covered by the cluster."),
        rex.MovedError("3999 127.0.0.1:6381"),
        rex.ClusterDownError("CLUSTERDOWN The cluster is down"),
    ]
    for exc in unavailable:
        with pytest.raises(BackendUnavailableError), map_errors("x"):
            raise exc
    with pytest.raises(BackendPermanentError), map_errors("x"):
        raise rex.RedisClusterException("EVALSHA - all keys must map to the same key slot")


async def test_a_connection_closed_under_redis_py_is_unavailable() -> None:
    """redis-py raises AttributeError when another task closed the connection it writes to (a
    Cluster client rebuilding its topology in a failover): that maps to unavailable."""
    connection = redis.asyncio.Connection()  # never connected: its writer is None
    # redis-py 8.1 raised AttributeError here, 8.2 a ConnectionError: unavailable either way.
    with pytest.raises(BackendUnavailableError, match="unavailable during a write"), \
            map_errors("a write"):
        await connection._send_packed_command([b"PING"])
    # An AttributeError raised in redis-py's own frames (as 8.1 did) is an outage too ...
    in_redis_py = compile("None.writelines", f"{os.path.dirname(redis.__file__)}/x.py", "exec")
    with pytest.raises(BackendUnavailableError, match="closed while in use"), \
            map_errors("a write"):
        exec(in_redis_py)
    # ... and one raised in the caller's own code is its bug, passed on unchanged.
    with pytest.raises(AttributeError), map_errors("our own bug"):
        None.missing  # type: ignore[attr-defined]  # noqa: B018 - not raised inside redis-py


def test_a_node_answering_as_a_replica_is_unavailable() -> None:
    """Mid-failover, a WAIT (or a write) can reach the demoted master before the client sees
    the new topology: retrying reaches the new master, so it is unavailable, not permanent."""
    for message in ("WAIT cannot be used with replica instances. Please also note ...",
                    "READONLY You can't write against a read only replica."):
        with pytest.raises(BackendUnavailableError), map_errors("x"):
            raise rex.ResponseError(message)
