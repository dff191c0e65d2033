"""Leases (and pub/sub) across a Redis Cluster failover: SIGKILL a master while leases are
being granted, wait for its replica to take over, and check that fencing tokens never repeat
and that the provider recovers by itself (BackendUnavailableError meanwhile, never a wrong
answer).

Each test starts a private 6-node cluster (it kills one node)."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

import anyio
import pytest

from leases import BackendUnavailableError, RedisLeaseProvider
from pubsub import Event, RedisStreamsPubSub
from pubsub.testing import Recorder
from tests._redis_cluster import FAILOVER_MARKS

if TYPE_CHECKING:
    from tests._redis_cluster import RedisCluster

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow,
              *FAILOVER_MARKS]

TTL_MS = 50  # each round's lease expires before the next round: every grant is a new token
RECOVERY_S = 20.0  # node timeout 1 s, election, slot-map refresh; generous for a busy machine


class Workload:
    """One task per key: acquire with a new owner, sleep past the TTL, again. Records every
    token granted (per key, in grant order), the errors, and the times of the last success
    and the first success after :attr:`mark`."""

    def __init__(self, provider: RedisLeaseProvider, keys: list[str]) -> None:
        self.provider = provider
        self.keys = keys
        self.tokens: dict[str, list[int]] = {k: [] for k in keys}
        self.errors: Counter[str] = Counter()
        self.ok_after: dict[str, float] = {}  # key -> first success after `mark`
        self.mark = float("inf")
        self.stop = False

    async def run_key(self, key: str) -> None:
        round_ = 0
        while not self.stop:
            round_ += 1
            try:
                result = await self.provider.acquire_lease(key, f"owner-{round_}", TTL_MS)
            except BackendUnavailableError as exc:  # the only error allowed
                self.errors[type(exc.__cause__).__name__ if exc.__cause__ else "wait"] += 1
                await anyio.sleep(0.05)
                continue
            now = time.monotonic()
            if result.acquired:
                assert result.owner == f"owner-{round_}"
                assert isinstance(result.token, int)
                self.tokens[key].append(result.token)
                if now >= self.mark:
                    self.ok_after.setdefault(key, now)
            else:  # held: only by the previous round's owner, whose lease has not expired yet
                assert result.owner == f"owner-{round_ - 1}", result
            await anyio.sleep(TTL_MS * 1.5 / 1000)

    def assert_tokens_never_repeat(self) -> None:
        self.assert_never_repeat(self.tokens)

    @staticmethod
    def assert_never_repeat(tokens_by_key: dict[str, list[int]]) -> None:
        for key, tokens in tokens_by_key.items():
            assert tokens == sorted(set(tokens)), f"{key}: token issued twice or went back"


async def _failover(
    cluster: RedisCluster, workload: Workload, victim: int, *, rejoin: bool
) -> tuple[float, float]:
    """Kill ``victim``, wait for the promotion (and the rejoin); returns the seconds until
    ``cluster_state:ok`` and until every key succeeded again."""
    killed_at = time.monotonic()
    workload.mark = killed_at
    cluster.kill(victim)
    await anyio.to_thread.run_sync(cluster.wait_ok, RECOVERY_S)
    promoted = time.monotonic() - killed_at
    assert victim not in cluster.masters()
    if rejoin:  # now a replica of its successor (no persistence: never restart it earlier)
        await anyio.to_thread.run_sync(cluster.restart, victim)
        await anyio.to_thread.run_sync(cluster.wait_ok, RECOVERY_S)
    with anyio.fail_after(RECOVERY_S):
        while len(workload.ok_after) < len(workload.keys):  # noqa: ASYNC110 - other tasks
            await anyio.sleep(0.05)
    recovered = max(workload.ok_after.values()) - killed_at
    return promoted, recovered


def _keys_over_every_master(cluster: RedisCluster, provider: RedisLeaseProvider) -> list[str]:
    keys = [f"fenced-{i}" for i in range(24)]
    masters = {cluster.master_of(provider.lease_key(k)) for k in keys}
    assert len(masters) == 3
    return keys


@pytest.mark.parametrize("wait_replicas", [1, 0])
async def test_fencing_tokens_never_repeat_across_a_failover(
    private_redis_cluster: RedisCluster, wait_replicas: int
) -> None:
    cluster = private_redis_cluster
    async with RedisLeaseProvider(
        url=cluster.url, cluster=True, wait_replicas=wait_replicas, wait_timeout_ms=200
    ) as provider:
        keys = _keys_over_every_master(cluster, provider)
        victim = cluster.master_of(provider.lease_key(keys[0]))
        on_victim = [k for k in keys if cluster.master_of(provider.lease_key(k)) == victim]
        workload = Workload(provider, keys)
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(workload.run_key, key)
            await anyio.sleep(1.0)
            before = {k: len(t) for k, t in workload.tokens.items()}
            assert all(before.values()), dict(workload.errors)
            promoted, recovered = await _failover(
                cluster, workload, victim, rejoin=wait_replicas > 0
            )
            await anyio.sleep(1.0)  # keep going on the new master
            workload.stop = True
        if wait_replicas:
            workload.assert_tokens_never_repeat()
        else:  # guaranteed on the other masters only (see the next test for the victim's)
            Workload.assert_never_repeat({
                k: t for k, t in workload.tokens.items() if k not in on_victim
            })
            regressions = sum(t != sorted(set(t)) for k, t in workload.tokens.items())
            print(f"wait_replicas=0: {regressions} key(s) of the victim saw a token again")
        grew = [k for k in on_victim if len(workload.tokens[k]) > before[k]]
        assert grew == on_victim  # the victim's keys got new grants on its successor
        print(
            f"wait_replicas={wait_replicas}: promoted after {promoted:.1f}s, every key "
            f"served again after {recovered:.1f}s; errors meanwhile: {dict(workload.errors)}"
        )


async def test_an_unreplicated_fence_increment_is_lost_unless_wait_replicas_refuses(
    private_redis_cluster: RedisCluster,
) -> None:
    """Asynchronous replication, shown: the master acknowledges a grant (and its fence
    increment) that its replica never got; the replica takes over and issues that token
    again. With ``wait_replicas=1`` the same grant raised BackendUnavailableError instead."""
    cluster = private_redis_cluster
    async with (
        RedisLeaseProvider(url=cluster.url, cluster=True) as plain,
        RedisLeaseProvider(
            url=cluster.url, cluster=True, wait_replicas=1, wait_timeout_ms=200
        ) as waiting,
    ):
        key = "fenced"
        master = cluster.master_of(plain.fence_key(key))
        replica = cluster.replica_of(master)
        first = await waiting.acquire_lease(key, "a", TTL_MS)
        assert first.token == 1  # on the replica too (WAIT said so)
        await anyio.sleep(TTL_MS * 2 / 1000)

        cluster.pause(replica)  # it cannot reconnect...
        cluster.drop_replicas(master)  # ...once the master has dropped its link
        try:
            with pytest.raises(BackendUnavailableError, match="replica"):
                await waiting.acquire_lease(key, "b", TTL_MS)  # applied, not confirmed
            await anyio.sleep(TTL_MS * 2 / 1000)
            lost = await plain.acquire_lease(key, "c", TTL_MS)  # acknowledged at once
            assert lost.acquired and lost.token == 3
            cluster.kill(master)
        finally:
            cluster.resume(replica)
        await anyio.to_thread.run_sync(cluster.wait_ok, RECOVERY_S)
        assert cluster.master_of(plain.fence_key(key)) == replica

        again = None
        with anyio.fail_after(RECOVERY_S):
            while again is None:
                try:
                    again = await plain.acquire_lease(key, "d", TTL_MS)
                except BackendUnavailableError:
                    await anyio.sleep(0.05)
        # The promoted replica's counter stopped at 1: tokens 2 and 3 are issued again.
        assert again.acquired and again.token == 2
        await anyio.sleep(TTL_MS * 2 / 1000)
        repeat = await plain.acquire_lease(key, "e", TTL_MS)
        assert repeat.token == lost.token  # the same fencing token, for two owners


async def test_pubsub_follows_a_failover(private_redis_cluster: RedisCluster) -> None:
    """The reader's per-node connections move to the promoted replica; publish raises
    BackendUnavailableError until the slot is served again, and nothing is lost."""
    cluster = private_redis_cluster
    got = Recorder()
    async with RedisStreamsPubSub(
        url=cluster.url, cluster=True, block_ms=200, reclaim_idle_ms=1000
    ) as ps:
        topics = [f"t{i}" for i in range(12)]
        assert len({cluster.master_of(ps.stream_key(t)) for t in topics}) == 3
        for topic in topics:
            await ps.subscribe(topic, got)
            await ps.subscribe(topic, got, group="g")
        for topic in topics:
            await ps.publish(topic, Event("e", f"before-{topic}"))
        with anyio.fail_after(RECOVERY_S):
            while len(got.data) < 2 * len(topics):  # noqa: ASYNC110 - handlers append
                await anyio.sleep(0.05)

        victim = cluster.master_of(ps.stream_key(topics[0]))
        cluster.kill(victim)
        with anyio.fail_after(RECOVERY_S):
            for topic in topics:
                while True:
                    try:
                        await ps.publish(topic, Event("e", f"after-{topic}"))
                        break
                    except BackendUnavailableError:
                        await anyio.sleep(0.1)
            while sum(str(d).startswith("after-") for d in got.data) < 2 * len(topics):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert sorted(map(str, got.data)) == sorted(
            f"{when}-{t}" for t in topics for when in ("before", "after") for _ in range(2)
        )
