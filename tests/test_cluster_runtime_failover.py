"""The signal runtime across a Redis Cluster failover: SIGKILL a master while threads on every
master are active, and check that no signal whose ``send`` returned is lost, that the runs of
one thread never share a fencing token, and that the runtimes carry on without a restart.

``wait_replicas=1`` on the store and the leases: without it, a write the master acknowledged
but never replicated is lost with the master (see docs/cluster.md and
``test_an_unreplicated_fence_increment_is_lost_unless_wait_replicas_refuses``)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio
import pytest

from leases import BackendUnavailableError, RedisLeaseProvider
from pubsub import RedisStreamsPubSub
from signals import RedisSignalStore, Run, Signal, SignalRuntime
from tests._redis_cluster import FAILOVER_MARKS

if TYPE_CHECKING:
    from tests._redis_cluster import RedisCluster

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow,
              *FAILOVER_MARKS]

THREADS = 24
PREFIX = "fo"
RECOVERY_S = 30.0


class Record:
    """What the agents and the sender saw."""

    def __init__(self) -> None:
        self.accepted: set[str] = set()
        self.processed: Counter[str] = Counter()
        self.tokens: defaultdict[str, list[int]] = defaultdict(list)  # thread -> run tokens
        self.send_errors = 0

    async def agent(self, run: Run) -> None:
        assert run.token is not None
        self.tokens[run.thread_key].append(run.token)
        async for signal in run:
            self.processed[signal.id] += 1
            await run.ack(signal)

    async def send(self, runtime: SignalRuntime, thread: str, sid: str, deadline: float) -> None:
        """Send until accepted (the same id again after an error: at most one is kept)."""
        while time.monotonic() < deadline:
            try:
                await runtime.send(thread, Signal({"id": sid}, id=sid))
            except BackendUnavailableError:
                self.send_errors += 1
                await anyio.sleep(0.05)
            else:
                self.accepted.add(sid)
                return


async def _worker(
    stack: AsyncExitStack, url: str, record: Record
) -> tuple[SignalRuntime, RedisLeaseProvider]:
    pubsub = await stack.enter_async_context(
        RedisStreamsPubSub(url=url, cluster=True, key_prefix=PREFIX)
    )
    leases = RedisLeaseProvider(client=pubsub.redis_client, key_prefix=f"{PREFIX}:lease",
                                wait_replicas=1, wait_timeout_ms=200)
    inbox = RedisSignalStore(client=pubsub.redis_client, key_prefix=f"{PREFIX}:signals",
                             leases=leases, wait_replicas=1, wait_timeout_ms=200)
    runtime = await stack.enter_async_context(SignalRuntime(
        pubsub=pubsub, agent=record.agent, leases=leases, inbox=inbox, lease_ttl_ms=2000,
        idle_wait_ms=200,
    ))
    return runtime, leases


async def test_no_accepted_signal_is_lost_across_a_master_failover(
    private_redis_cluster: RedisCluster,
) -> None:
    cluster = private_redis_cluster
    record = Record()
    threads = [f"thread-{i}" for i in range(THREADS)]
    async with AsyncExitStack() as stack:
        first, leases = await _worker(stack, cluster.url, record)
        await _worker(stack, cluster.url, record)
        masters = {t: cluster.master_of(leases.lease_key(t)) for t in threads}
        assert len(set(masters.values())) == 3
        victim = masters[threads[0]]

        n = 0

        async def send_round(deadline: float) -> None:
            nonlocal n
            async with anyio.create_task_group() as tg:
                for thread in threads:
                    tg.start_soon(record.send, first, thread, f"s{n}", deadline)
                    n += 1

        for _ in range(3):  # every thread active before the kill
            await send_round(time.monotonic() + 10)
        killed_at = time.monotonic()
        cluster.kill(victim)
        async with anyio.create_task_group() as tg:  # keep sending through the failover
            async def keep_sending() -> None:
                while time.monotonic() - killed_at < 6:
                    await send_round(time.monotonic() + RECOVERY_S)
                    await anyio.sleep(0.2)

            tg.start_soon(keep_sending)
            await anyio.to_thread.run_sync(cluster.wait_ok, RECOVERY_S)
            promoted = time.monotonic() - killed_at
            # Rejoin as a replica of its successor, so wait_replicas=1 can be met again.
            await anyio.to_thread.run_sync(cluster.restart, victim)
            await anyio.to_thread.run_sync(cluster.wait_ok, RECOVERY_S)
        for _ in range(2):  # and after it, with no restart of any runtime
            await send_round(time.monotonic() + RECOVERY_S)

        with anyio.move_on_after(RECOVERY_S):
            while not record.accepted <= set(record.processed):  # noqa: ASYNC110 - workers
                await anyio.sleep(0.1)
        recovered = time.monotonic() - killed_at
        lost = record.accepted - set(record.processed)  # before the runtimes leave
        assert not lost, f"not processed {recovered:.1f}s after the kill: {sorted(lost)}"
    assert len(record.accepted) == n  # every send was accepted in the end
    for thread, tokens in record.tokens.items():
        assert len(tokens) == len(set(tokens)), f"{thread}: a fencing token was issued twice"
    duplicates = sum(c - 1 for c in record.processed.values())
    print(f"promoted after {promoted:.1f}s, all {n} signals processed {recovered:.1f}s after "
          f"the kill; {record.send_errors} send retries, {duplicates} duplicate deliveries")
