"""The signal runtime on a real Redis Cluster: live streams followed from another runtime (the
sharded pub/sub follower), abort from another runtime, and the follower's connections (per
node, never per thread)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio

from pubsub import RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime
from tests._cli import cli

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster]

THREADS = 12
PARTS = 5


@asynccontextmanager
async def _runtimes(
    url: str, prefix: str, agent: Any
) -> AsyncIterator[tuple[SignalRuntime, SignalRuntime]]:
    """A worker runtime and a sender-only runtime, each with its own cluster client."""
    async with AsyncExitStack() as stack:
        pair = []
        for role in (agent, None):
            pubsub = await stack.enter_async_context(
                RedisStreamsPubSub(url=url, cluster=True, key_prefix=prefix)
            )
            pair.append(await stack.enter_async_context(
                SignalRuntime(pubsub=pubsub, agent=role, lease_ttl_ms=2000)
            ))
        yield pair[0], pair[1]


async def _follower_connections(url: str, prefix: str) -> int:
    """How many connections named ``<prefix>...:follower`` the cluster's nodes serve."""
    cluster = redis.asyncio.RedisCluster.from_url(url)
    try:
        replies: Any = await cluster.client_list(target_nodes=cluster.ALL_NODES)
        rows = [row for per_node in replies.values() for row in per_node]  # node -> rows
        return sum(1 for row in rows
                   if str(row.get("name", "")).startswith(prefix)
                   and str(row.get("name", "")).endswith(":follower"))
    finally:
        await cluster.aclose()


async def test_streams_are_followed_live_from_another_runtime(
    cluster_url: str, key_prefix: str
) -> None:
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            await gate.wait()
            for i in range(PARTS):
                await run.emit({"i": i}, signal=signal)
                await anyio.sleep(0.01)
            await run.ack(signal, result={"n": PARTS})

    threads = [f"live-{n}" for n in range(THREADS)]
    seen: dict[str, list[Any]] = {}
    async with _runtimes(cluster_url, key_prefix, agent) as (_, client):

        async def follow(key: str, ready: anyio.Event) -> None:
            parts = seen.setdefault(key, [])
            stream = client.stream(key)
            ready.set()
            async for part in stream:
                parts.append(part)
                if part.kind == "run.finished":
                    return

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for key in threads:
                    ready = anyio.Event()
                    tg.start_soon(follow, key, ready)
                    await ready.wait()
                    await client.send(key, Signal({"q": key}, id=f"q-{key}"),
                                      if_idle="enqueue")
                await anyio.sleep(0.2)  # every reader now waits on the follower
                connections = await _follower_connections(cluster_url, key_prefix)
                gate.set()
        for key in threads:
            receipt = await client.wait_for(key, f"q-{key}", timeout=10)
            assert receipt.status == "processed" and receipt.result == {"n": PARTS}
    for key, parts in seen.items():
        assert [p.data["i"] for p in parts if p.kind == "part"] == list(range(PARTS)), key
        cursors = [tuple(map(int, p.cursor.split("-"))) for p in parts]
        assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    # One follower connection per master node (3), whatever the number of readers.
    assert connections == 3, connections


async def test_abort_from_another_runtime_reaches_the_run(
    cluster_url: str, key_prefix: str
) -> None:
    started = anyio.Event()
    attempts: list[int] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            attempts.append(signal.attempt)
            started.set()
            await anyio.sleep_forever()

    async with _runtimes(cluster_url, key_prefix, agent) as (worker, client):
        await client.send("stop-me", Signal(1, id="s1"), if_idle="enqueue")
        with anyio.fail_after(10):
            await started.wait()
        assert await client.abort("stop-me", reason="user pressed stop", clear_pending=True)
        with anyio.fail_after(10):
            await worker.wait_idle()
        kinds = [(p.kind, p.data) async for p in client.stream("stop-me", follow=False)]
        assert ("run.cancelled", {"reason": "abort: user pressed stop"}) in kinds
        receipt = await client.receipt("stop-me", "s1")
        assert receipt is not None and receipt.status == "cancelled"
        assert attempts == [1]


async def test_the_cli_reads_a_cluster(cluster_url: str, key_prefix: str) -> None:
    """``python -m signals ... --cluster``: the CLI's pending and receipt on a Cluster."""
    pubsub = RedisStreamsPubSub(url=cluster_url, cluster=True, key_prefix=key_prefix)
    async with pubsub, SignalRuntime(pubsub=pubsub, agent=None) as sender:
        for i in range(3):
            await sender.send(f"cli-{i}", Signal("hi", id=f"s{i}"), if_idle="enqueue")

    where = ("--redis-url", cluster_url, "--cluster", "--key-prefix", key_prefix, "--json")
    for i in range(3):
        done = await anyio.to_thread.run_sync(cli, "pending", f"cli-{i}", *where)
        assert done.returncode == 0, done.stderr
        assert [s["id"] for s in json.loads(done.stdout)["pending"]] == [f"s{i}"]
    done = await anyio.to_thread.run_sync(cli, "receipt", "cli-1", "s1", *where)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "pending"
