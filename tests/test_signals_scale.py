"""Per-process machinery under load: recovery among many busy threads, loop lag, call counts,
and thousands of active threads held through several TTLs."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import redis.asyncio

from leases import InMemoryLeaseProvider
from pubsub import InMemoryPubSub, RedisStreamsPubSub
from signals import (
    InMemorySignalStore,
    RedisSignalStore,
    Run,
    Signal,
    SignalRuntime,
)
from signals.kit import RuntimeInfo
from signals.testing import RecordingCore

pytestmark = pytest.mark.anyio


class LagProbe:
    """Measures how late a task that sleeps ``period`` seconds wakes: the loop's lag."""

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            before = anyio.current_time()
            await anyio.sleep(self.period)
            self.worst = max(self.worst, anyio.current_time() - before - self.period)


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_recovery_finds_a_dead_thread_among_a_thousand_busy_ones(
    anyio_backend: str, redis_url: str, key_prefix: str
) -> None:
    busy_threads, interval_ms = 1000, 400
    release = anyio.Event()
    recovered = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            if run.thread_key == "orphan":
                recovered.set()
            else:
                await release.wait()  # busy: holds an unacknowledged signal
            await run.ack(signal)

    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix
    ) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, lease_ttl_ms=3000, recover_interval_ms=interval_ms
    ) as runtime:
            for n in range(busy_threads):
                assert (await runtime.send(f"busy-{n}", n)).outcome == "wake"
            # A runtime that died owning "orphan" (which has a pending signal): its presence
            # lapses and its lease is gone, nothing but the registry points at the thread.
            store = runtime.store
            assert isinstance(store, RedisSignalStore)
            ghost = "rt-ghost"
            await store.register_runtime(RuntimeInfo(ghost, "h", 1, time.time(), True), 200)
            await store.track_threads(ghost, add=["orphan"])
            await store.accept("orphan", Signal("left behind"), "deliver")
            await store.client.zrem(store.keys.pending_shard("orphan"), "orphan")
            started = anyio.current_time()
            with anyio.fail_after(20):
                await recovered.wait()
            took = anyio.current_time() - started
            release.set()
    assert took <= 0.2 + 2 * interval_ms / 1000 + 0.3, f"found after {took:.2f}s"


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_large_signals_never_stall_the_loop(
    anyio_backend: str, redis_url: str, key_prefix: str
) -> None:
    """48 signals of 4 MB each: a run takes one at a time, so decoding never blocks the event
    loop for long."""
    probe = LagProbe()
    big = "x" * (4 << 20)
    done = anyio.Event()
    count = 0

    async def agent(run: Run) -> None:
        nonlocal count
        async for signal in run:
            count += 1
            await run.ack(signal)
            if count == 48:
                done.set()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub:
        store = RedisSignalStore(client=pubsub.redis_client, key_prefix=f"{key_prefix}:signals")
        for n in range(48):
            await store.accept("big", Signal(big, id=f"b{n}"), "deliver")
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe.run)
            async with SignalRuntime(
                pubsub=pubsub, agent=agent, inbox=store, lease_ttl_ms=6000,
                max_signal_bytes=8 << 20, recover_interval_ms=100,
            ):
                with anyio.fail_after(60):
                    await done.wait()
            tg.cancel_scope.cancel()
    assert count == 48
    assert probe.worst < 0.5, f"the loop stalled for {probe.worst * 1000:.0f} ms (TTL/3 is 2 s)"


async def test_a_routed_signal_costs_two_backend_calls() -> None:
    """Steady state, the owner waiting: the sender's route (which also carries the signal to
    the owner's run in the notice) and the owner's ack (a ``settle``). No take, no lease
    call."""
    leases = InMemoryLeaseProvider()
    store = RecordingCore(InMemorySignalStore(leases=leases))
    first_done = anyio.Event()
    acked = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)
            if signal.payload == "first":
                first_done.set()
            else:
                acked.set()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, leases=leases, inbox=store, idle_wait_ms=60_000,
        recover_interval_ms=60_000, shutdown_timeout_ms=0,
    ) as owner, SignalRuntime(
        pubsub=pubsub, agent=None, leases=leases, inbox=store
    ) as sender:
        await owner.send("t", "first")
        with anyio.fail_after(5):
            await first_done.wait()
            await anyio.sleep(0.05)  # the run is now waiting for its next signal
        store.calls.clear()
        assert (await sender.send("t", "routed")).outcome == "deliver"
        with anyio.fail_after(5):
            await acked.wait()
        calls = [c[0] for c in store.calls]
        assert owner.active_run("t") is not None  # the same run got it: no handoff, no claim
    assert calls == ["route", "settle"], calls


def _payloads(signals: list[Signal]) -> list[Any]:
    return [s.payload for s in signals]


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("lane", [None, "supersede", "coalesce"])
async def test_a_routed_signal_costs_two_redis_round_trips(
    anyio_backend: str, private_redis_server: Any, lane: str | None
) -> None:
    """On Redis, seen by the server itself (MONITOR): the sender's route is one script (which
    also publishes the notice that carries the signal to the owner's run) and the owner's ack
    one more. No other client command runs for it; a lane (supersede, or coalesce: the
    owner's run takes the lane as one hand-out) costs nothing more. Without a lane, the two
    scripts run at most 56 commands between them (65 before the carried entry was filed
    once and an entry left only the sets it is in; 54 before each of the two stream parts
    was announced for the stream followers)."""
    first_done, acked = anyio.Event(), anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)
            (first_done if signal.payload == "first" else acked).set()

    url = private_redis_server.url
    client = redis.asyncio.Redis.from_url(url)
    seen: list[str] = []
    inside: list[str] = []  # the scripts' own commands: the server's work per signal

    async def watch(task_status: Any) -> None:
        async with client.monitor() as monitor:
            task_status.started()
            async for command in monitor.listen():
                if command["client_type"] != "lua":  # a script's own commands are not trips
                    seen.append(command["command"])
                else:
                    inside.append(command["command"].split()[0].upper())

    try:
        async with anyio.create_task_group() as tg, RedisStreamsPubSub(
            url=url, key_prefix="rt"
        ) as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, idle_wait_ms=60_000, recover_interval_ms=60_000,
            lease_ttl_ms=60_000, shutdown_timeout_ms=0,
            reducers={"l": _payloads},
        ) as owner, SignalRuntime(pubsub=pubsub, agent=None, reducers={"l": _payloads}
                                  ) as sender:
            await owner.send("t", "first")
            with anyio.fail_after(5):
                await first_done.wait()
                await anyio.sleep(0.1)  # the run now waits for its next signal
            await tg.start(watch)
            await anyio.sleep(0.1)
            seen.clear()
            inside.clear()
            routed = (Signal("routed") if lane is None else
                      Signal("routed", lane="l", merge=lane))  # type: ignore[arg-type]
            assert (await sender.send("t", routed)).outcome == "deliver"
            with anyio.fail_after(5):
                await acked.wait()
            await anyio.sleep(0.1)
            trips, work = list(seen), list(inside)
            assert owner.active_run("t") is not None  # the same run: no handoff, no claim
            tg.cancel_scope.cancel()
    finally:
        await client.aclose()
    assert [c.split()[0].upper() for c in trips] == ["EVALSHA", "EVALSHA"], trips
    if lane is None:  # each command inside a script costs 2-5 µs of the server's time here
        assert len(work) <= 56, f"{len(work)} commands inside the two scripts: {work}"


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_thousand_active_threads_hold_through_three_ttls(
    anyio_backend: str, redis_url: str, key_prefix: str
) -> None:
    """A regression guard that counts, not times: 2,000 active threads, TTL 1.5 s, held for
    three TTLs. No lease lost, no run cancelled, and the idle Redis command rate stays O(1)."""
    k, ttl_ms = 2000, 1500
    release = anyio.Event()
    started = cancelled = 0

    async def agent(run: Run) -> None:
        nonlocal started, cancelled
        started += 1
        try:
            async for _ in run:
                await release.wait()
        except anyio.get_cancelled_exc_class():
            cancelled += 1
            raise

    client = redis.asyncio.Redis.from_url(redis_url)

    async def commands() -> int:
        stats: Any = await client.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    try:
        async with RedisStreamsPubSub(
            url=redis_url, key_prefix=key_prefix
        ) as pubsub, SignalRuntime(pubsub=pubsub, agent=agent, lease_ttl_ms=ttl_ms) as rt:
                for n in range(k):
                    await rt.send(f"t{n}", n)
                with anyio.fail_after(30):
                    while started < k:  # noqa: ASYNC110 (a counter the agents bump)
                        await anyio.sleep(0.05)
                before = await commands()
                await anyio.sleep(3 * ttl_ms / 1000)
                idle = await commands() - before - 1
                active = len(rt.active_threads())
                release.set()
    finally:
        await client.aclose()
    assert (started, active, cancelled) == (k, k, 0)
    # Per TTL: 3 session renewals, 3 presence refreshes, ~10 recovery reads. Not per thread.
    assert idle <= 3 * 30, f"{idle} Redis commands while {k} threads idled for three TTLs"

