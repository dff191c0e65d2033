"""RedisStreamsPubSub on a real Redis: crash reclaim, restart, bounds, one reader connection,
no hoarding, the attempt count in Redis, and the sweep of dead processes' leftovers."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
import structlog.testing
from anyio.abc import Process

import leases
from pubsub import (
    BackendPermanentError,
    BackendUnavailableError,
    ClosedError,
    Event,
    PubSub,
    RedisStreamsPubSub,
    is_pubsub,
)
from pubsub.testing import Recorder
from tests._redis_server import RedisServer, free_port, redis_server_binary

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.redis,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),  # redis-py is asyncio-only
]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - polls Redis, not a local flag
            await anyio.sleep(0.02)


def _has(items: list[Any], value: Any) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return value in items

    return check


# -- crash, restart -------------------------------------------------------------------------


@asynccontextmanager
async def kill_worker(
    redis_url: str, key_prefix: str, mode: str = "group"
) -> AsyncIterator[tuple[Process, str]]:
    """Run ``tests.pubsub_kill_worker`` in ``mode``; yield it and its ready line once it is
    ready; at exit kill it if it still runs, and reap it."""
    worker = await anyio.open_process(
        [sys.executable, "-m", "tests.pubsub_kill_worker", redis_url, key_prefix, mode],
        cwd=ROOT, stderr=None, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert worker.stdout is not None
        with anyio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await worker.stdout.receive(1)
        yield worker, line.decode().strip()
    finally:
        if worker.returncode is None:
            worker.kill()
            with anyio.move_on_after(10):
                await worker.wait()
        await worker.aclose()


async def sigkill(worker: Process) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    with anyio.fail_after(10):
        await worker.wait()


@pytest.mark.slow
async def test_sigkilled_consumer_pending_events_are_reclaimed(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    async with kill_worker(redis_url, key_prefix) as (worker, ready):
        assert ready == "ready"
        async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as publisher:
            ids = [
                await publisher.publish("t", Event("e", "ok" if i else "block")) for i in range(5)
            ]

        async def started() -> bool:
            return bool(await raw.llen(f"{key_prefix}:started"))

        await wait_for(started)
        await sigkill(worker)

        got: dict[str, int] = {}

        async def handler(event: Event) -> None:
            got[event.id] = event.delivery_attempt

        async with RedisStreamsPubSub(
            url=redis_url, key_prefix=key_prefix, reclaim_idle_ms=300, reclaim_interval_ms=100,
            block_ms=100,
        ) as survivor:
            await survivor.subscribe("t", handler, group="g")

            async def all_done() -> bool:
                handled = set(await raw.lrange(f"{key_prefix}:handled", 0, -1))
                return handled | set(got) >= set(ids)

            await wait_for(all_done)
            pending: Any = {}

            async def acked() -> bool:  # the XACK follows the handler's return
                nonlocal pending
                pending = await raw.xpending(survivor.stream_key("t"), "g")
                return bool(pending["pending"] == 0)

            with anyio.move_on_after(5):
                await wait_for(acked)
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
            await wait_for(_has(got, "before"))
            await sub.close()
            await ps.publish("t", Event("e", "while-away"))  # accepted, not yet consumed
            server.restart()
            await ps.subscribe("t", handler, group="g")
            await ps.publish("t", Event("e", "after"))
            await wait_for(_has(got, "after"), timeout=20)
            await wait_for(_has(got, "while-away"))
    assert sorted(got) == ["after", "before", "while-away"]


async def test_a_deleted_stream_is_recreated_with_its_groups(
    redis_url: str, key_prefix: str
) -> None:
    fan, grouped = Recorder(), Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=100) as ps:
        await ps.subscribe("t", fan)
        await ps.subscribe("t", grouped, group="g")
        await ps.publish("t", Event("e", 1))
        await wait_for(lambda: _true(len(fan.events) == 1 and len(grouped.events) == 1))
        await ps.redis_client.delete(ps.stream_key("t"))  # as if the idle TTL expired
        await ps.publish("t", Event("e", 2))
        await wait_for(lambda: _true(2 in fan.data and 2 in grouped.data))
    assert fan.data == [1, 2]
    assert grouped.data == [1, 2]


async def _true(value: bool) -> bool:
    return value


# -- bounds and connections -----------------------------------------------------------------


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


async def test_a_stream_in_use_never_expires_and_its_ttl_slides_sparingly(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish slides the stream's idle TTL at most every tenth of it (the others are a
    plain XADD), and a stream published to keeps living however long that goes on."""
    from pubsub._backends.redis.layout import StreamsContext

    slides = 0
    original = StreamsContext.queue_idle_ttl

    def counting(self: Any, pipe: Any, stream: str) -> None:
        nonlocal slides
        slides += 1
        original(self, pipe, stream)

    monkeypatch.setattr(StreamsContext, "queue_idle_ttl", counting)
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix,
                                  stream_idle_ttl_ms=1000) as ps:
        start = time.monotonic()
        for i in range(200):  # back to back
            await ps.publish("t", Event("e", i))
        burst = slides
        assert burst <= (time.monotonic() - start) / 0.1 + 1, burst  # not one per publish
        for i in range(200, 240):  # 2.4 s: more than twice the TTL
            await anyio.sleep(0.06)
            await ps.publish("t", Event("e", i))
        length = await ps.redis_client.xlen(ps.stream_key("t"))
        ttl = await ps.redis_client.pttl(ps.stream_key("t"))
    assert length == 240  # never expired (it would have started again, shorter)
    assert 0 < ttl <= 1000
    assert slides < 240 / 2, slides


async def test_one_reader_connection_serves_every_subscription(
    redis_url: str, key_prefix: str
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=50) as ps:
        for i in range(20):
            await ps.subscribe(f"topic-{i}", got)
        for i in range(3):
            await ps.subscribe("shared", got, group=f"g{i}")
        for i in range(20):
            await ps.publish(f"topic-{i}", Event("e", i))
        await ps.publish("shared", Event("e", "shared"))
        await wait_for(lambda: _true(len(got.events) == 23))
        clients: Any = await ps.redis_client.client_list()
        readers = [c for c in clients if c.get("name", "").startswith(f"{key_prefix}:reader:")]
    assert len(readers) == 1


async def test_a_new_subscription_does_not_wait_out_a_blocked_read(
    redis_url: str, key_prefix: str
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=60_000) as ps:
        await ps.subscribe("quiet", got)
        await anyio.sleep(0.2)  # the reader is now blocked for up to a minute
        await ps.subscribe("busy", got)  # same fan-out group, a stream the read does not cover
        await ps.publish("busy", Event("e", "now"))
        with anyio.fail_after(20):  # far below block_ms: CLIENT UNBLOCK ended the read
            await wait_for(lambda: _true(got.data == ["now"]))
        await ps.subscribe("other", got, group="g")  # a second group name: short blocks
        await ps.publish("other", Event("e", "then"))
        with anyio.fail_after(20):
            await wait_for(lambda: _true(got.data == ["now", "then"]))


async def test_subscriptions_made_back_to_back_are_read_at_once(
    redis_url: str, key_prefix: str
) -> None:
    """A subscription that arrives while the reader is about to block (its read set already
    built, its XREADGROUP not yet blocked on the server) is not left out for ``block_ms``."""
    got = Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=60_000) as ps:
        await ps.subscribe("first", got)
        await ps.subscribe("second", got)  # while the reader starts its first read
        await ps.publish("second", Event("e", "now"))
        with anyio.fail_after(5):  # far below block_ms
            await wait_for(lambda: _true(got.data == ["now"]))


async def test_a_handled_event_is_acked_with_the_next_read(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    """A group's member that drains its slot leaves the XACK to the reader, which sends it in
    one pipeline with its next XREADGROUP: no round trip of its own, and nothing left pending
    while the subscription idles (the read blocks only after the XACK) or after it closes.
    (A fan-out slot is not held back by one entry, so the reader is already blocked again
    when its member is done: that member sends its XACK itself.)"""
    got = Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=60_000) as ps:
        own_xacks = 0
        execute: Any = ps.redis_client.execute_command

        async def counting(*args: Any, **options: Any) -> Any:
            nonlocal own_xacks
            own_xacks += str(args[0]).upper() == "XACK"
            return await execute(*args, **options)

        ps.redis_client.execute_command = counting  # type: ignore[method-assign]
        sub = await ps.subscribe("t", got, group="g")
        stream = ps.stream_key("t")
        (info,) = await raw.xinfo_groups(stream)
        for i in range(10):  # one at a time: each is read, handled, and its slot drained
            await ps.publish("t", Event("e", i))
            await wait_for(lambda n=i + 1: _true(len(got.events) == n))  # type: ignore[misc]

        async def nothing_pending() -> bool:
            return int((await raw.xpending(stream, info["name"]))["pending"]) == 0

        with anyio.fail_after(5):  # far below block_ms: the XACK went before the read blocked
            await wait_for(nothing_pending)
        assert own_xacks == 0  # every XACK rode with a read
        for i in range(10, 40):  # back to back, then the subscription leaves at once
            await ps.publish("t", Event("e", i))
        await wait_for(lambda: _true(len(got.events) == 40))
        await sub.close()
        assert await nothing_pending()
    assert got.data == list(range(40))


async def test_a_slow_handler_does_not_hold_up_the_acks_before_it(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    """Entries read in one batch: each one handled before a slow one is acknowledged at once,
    not left for the reader's next read (which waits for the slow one)."""
    seen, release = [], anyio.Event()

    async def handler(event: Event) -> None:
        seen.append(event.data)
        if event.data == "slow":
            await release.wait()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        for data in ("a", "b", "slow", "c"):
            await ps.publish("t", Event("e", data))
        await ps.subscribe("t", handler, group="g", start_from="earliest")  # one read: all 4
        await wait_for(lambda: _true("slow" in seen))

        async def a_and_b_acked() -> bool:  # "slow" is being handled, "c" waits behind it
            pending: Any = await raw.xpending(ps.stream_key("t"), "g")
            return bool(pending["pending"] == 2)

        with anyio.fail_after(5):
            await wait_for(a_and_b_acked)
        release.set()
        await wait_for(lambda: _true(seen == ["a", "b", "slow", "c"]))


async def test_acks_left_for_the_reader_are_sent_when_the_member_leaves(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    handled = anyio.Event()

    async def handler(event: Event) -> None:
        handled.set()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=60_000) as ps:
        sub = await ps.subscribe("t", handler, group="g")
        await ps.publish("t", Event("e", 1))
        await handled.wait()
        await sub.close()  # before the reader, woken by the member, could send the XACK
        pending: Any = await raw.xpending(ps.stream_key("t"), "g")
        assert pending["pending"] == 0


async def test_fanout_groups_are_destroyed_on_close(redis_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        sub = await ps.subscribe("t", Recorder())
        assert len(await ps.redis_client.xinfo_groups(ps.stream_key("t"))) == 1
        await sub.close()
        assert await ps.redis_client.xinfo_groups(ps.stream_key("t")) == []


# -- competing consumers across processes ----------------------------------------------------


async def test_a_busy_process_does_not_hoard_a_groups_entries(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    gate = anyio.Event()
    slow_got, fast_got = Recorder(), Recorder()

    async def slow(event: Event) -> None:
        await slow_got(event)
        await gate.wait()

    async with (
        RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, consumer_name="slow") as a,
        RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, consumer_name="fast") as b,
    ):
        await a.subscribe("t", slow, group="g")
        await b.subscribe("t", fast_got, group="g")
        ids = [await a.publish("t", Event("e", i)) for i in range(200)]
        pending: Any = {}

        async def refreshed() -> bool:
            nonlocal pending
            pending = await raw.xpending(a.stream_key("t"), "g")
            return len(fast_got.events) + _held(pending, "g:slow") >= 200

        await wait_for(refreshed)
        held = _held(pending, "g:slow")
        gate.set()
        await wait_for(lambda: _true(len(slow_got.events) + len(fast_got.events) >= 200))
    assert held <= 33, f"the blocked process holds {held} entries"
    assert sorted(e.id for e in slow_got.events + fast_got.events) == sorted(ids)


def _held(pending: Any, consumer: str) -> int:
    for row in pending.get("consumers") or []:
        if row["name"] == consumer:
            return int(row["pending"])
    return 0


async def test_a_live_slow_handler_keeps_its_entry(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    release, started = anyio.Event(), anyio.Event()
    other = Recorder()

    async def slow(event: Event) -> None:
        started.set()
        await release.wait()

    settings: dict[str, Any] = {"reclaim_idle_ms": 200, "reclaim_interval_ms": 50}
    async with (
        RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, **settings) as a,
        RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, **settings) as b,
    ):
        await a.subscribe("t", slow, group="g")
        await a.publish("t", Event("e", "long"))
        with anyio.fail_after(10):
            await started.wait()
        await b.subscribe("t", other, group="g")
        await anyio.sleep(1.2)  # six times reclaim_idle_ms: b reclaims every 50 ms
        release.set()
    assert other.events == [], "another consumer took an entry a live handler was working on"


# -- delivery count across processes ---------------------------------------------------------


async def _orphan(raw: redis.asyncio.Redis, stream: str, count: int) -> str:
    """An entry in group ``g`` pending on a dead consumer, delivered ``count`` times."""
    await raw.xgroup_create(stream, "g", id="0", mkstream=True)
    entry_id = await raw.xadd(stream, {"event": Event("e", "orphan").to_json()})
    await raw.xreadgroup("g", "g:dead", {stream: ">"})
    await raw.xclaim(stream, "g", "g:dead", 0, [entry_id], retrycount=count, justid=True)
    return str(entry_id)


@pytest.mark.parametrize("count", [2, 3])
async def test_the_redis_delivery_count_carries_the_cap(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis, count: int
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, max_delivery_attempts=3,
        reclaim_idle_ms=100, reclaim_interval_ms=50,
    ) as ps:
        stream = ps.stream_key("t")
        await _orphan(raw, stream, count)
        with structlog.testing.capture_logs() as logs:
            await ps.subscribe("t", got, group="g")

            async def settled() -> bool:
                info: Any = await raw.xpending(stream, "g")
                return bool(info["pending"] == 0)

            await wait_for(settled)
    dropped = [e for e in logs if e["event"] == "pubsub.event_dropped"]
    if count < 3:
        assert [e.delivery_attempt for e in got.events] == [count + 1]
        assert dropped == []
    else:  # the dead consumer had the last allowed attempt
        assert got.events == []
        assert len(dropped) == 1 and dropped[0]["attempts"] == 3


async def test_local_retries_are_counted_in_redis(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    third, release = anyio.Event(), anyio.Event()

    async def handler(event: Event) -> None:
        if event.delivery_attempt < 3:
            raise RuntimeError("not yet")
        third.set()
        await release.wait()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        await ps.subscribe("t", handler, group="g")
        await ps.publish("t", Event("e"))
        with anyio.fail_after(10):
            await third.wait()
        rows: Any = await raw.xpending_range(ps.stream_key("t"), "g", "-", "+", 10)
        release.set()
    assert [r["times_delivered"] for r in rows] == [3]


async def test_malformed_entries_are_skipped_and_acked(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    got = Recorder()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        await ps.subscribe("t", got, group="g")
        await raw.xadd(ps.stream_key("t"), {"event": "{not json"})
        await raw.xadd(ps.stream_key("t"), {"other": "field"})
        for body in ('{"type":"e","id":"x","created_at":1,"data":NaN}',  # not JSON
                     '{"type":"","id":"x","created_at":1}', '{"type":"e","id":7,"created_at":1}',
                     '["e"]', b"\xff"):
            await raw.xadd(ps.stream_key("t"), {"event": body})
        await ps.publish("t", Event("e", "fine"))
        await wait_for(lambda: _true(got.data == ["fine"]))

        async def settled() -> bool:
            info: Any = await raw.xpending(ps.stream_key("t"), "g")
            return bool(info["pending"] == 0)

        await wait_for(settled)
    assert got.data == ["fine"]


# -- leftovers of dead processes -------------------------------------------------------------


async def test_dead_processes_fanout_groups_and_consumers_are_swept(
    redis_url: str, key_prefix: str, raw: redis.asyncio.Redis
) -> None:
    async with RedisStreamsPubSub(
        url=redis_url, key_prefix=key_prefix, reclaim_idle_ms=100, reclaim_interval_ms=50
    ) as ps:
        stream = ps.stream_key("t")
        await raw.xgroup_create(stream, "fanout:dead", id="$", mkstream=True)
        await raw.xgroup_create(stream, "fanout:alive", id="$")
        await raw.set(f"{key_prefix}:alive:alive", "1", px=60_000)
        # A process id with ":" in it (consumer_name="host:1") is alive as a whole, not as "host".
        await raw.xgroup_create(stream, "fanout:host:1", id="$")
        await raw.set(f"{key_prefix}:alive:host:1", "1", px=60_000)
        await raw.xgroup_create(stream, "g", id="$")
        await raw.xgroup_createconsumer(stream, "g", "g:dead")
        await raw.xgroup_createconsumer(stream, "g", "g:host:1")
        await raw.xgroup_createconsumer(stream, "g", "someone-else")  # not ours: left alone
        await ps.subscribe("t", Recorder())
        await ps.subscribe("t", Recorder(), group="g")

        async def swept() -> bool:
            names = {g["name"] for g in await raw.xinfo_groups(stream)}
            consumers = {c["name"] for c in await raw.xinfo_consumers(stream, "g")}
            return "fanout:dead" not in names and "g:dead" not in consumers

        await wait_for(swept)
        names = {g["name"] for g in await raw.xinfo_groups(stream)}
        consumers = {c["name"] for c in await raw.xinfo_consumers(stream, "g")}
    assert {"fanout:alive", "fanout:host:1", f"fanout:{ps.process_id}", "g"} <= names
    assert {"g:host:1", "someone-else"} <= consumers


# -- the lease provider, errors ---------------------------------------------------------------


async def test_its_lease_provider_shares_the_connection(redis_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps:
        provider = ps.get_lease_provider()
        assert provider is ps.get_lease_provider(), "one provider per pub/sub"
        assert leases.is_lease_provider(ps), "the pub/sub is its own lease provider"
        assert leases.is_lease_provider(provider)
        assert leases.resolve_lease_provider(ps) is provider
        assert provider.client is ps.redis_client
        assert provider.key_prefix == f"{ps.key_prefix}:lease"
        first = await provider.acquire_lease("k", "a", 5000)
        assert first.acquired and first.token is not None
        assert await provider.get_lease_owner("k") == "a"
        info = await provider.lease_info("k")
        assert info is not None and info.owner == "a"
        assert await ps.redis_client.exists(provider.keys.lease("k")) == 1
        assert await provider.renew_lease("k", "a", 5000)
        assert await provider.transfer_lease("k", "a", "b", 5000)
        assert await ps.get_lease_owner("k") == "b"  # the same leases, through the pub/sub
        await provider.release_lease("k", "b")
        assert await provider.get_lease_owner("k") is None
        assert await ps.redis_client.exists(provider.keys.lease("k")) == 0


async def test_publish_works_without_entering(redis_url: str, key_prefix: str) -> None:
    ps = RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix)
    try:
        event = Event("e")
        assert await ps.publish("t", event) == event.id
        assert await ps.redis_client.xlen(ps.stream_key("t")) == 1
    finally:
        await ps.redis_client.aclose()


async def test_a_given_client_is_not_closed(redis_url: str, key_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        async with RedisStreamsPubSub(client=client, key_prefix=key_prefix) as ps:
            typed: PubSub = ps  # mypy checks the class against the protocol
            assert is_pubsub(typed)
            assert ps.redis_client is client
            assert ps.get_lease_provider().client is client
        assert await client.ping()
    finally:
        await client.aclose()


async def test_errors_are_clear(redis_url: str, key_prefix: str) -> None:
    with pytest.raises(TypeError):
        RedisStreamsPubSub()
    with pytest.raises(ValueError):
        RedisStreamsPubSub(url=redis_url, max_delivery_attempts=0)
    with pytest.raises(ValueError):
        RedisStreamsPubSub(url=redis_url, block_ms=0)
    with pytest.raises(ValueError, match="consumer_name"):
        RedisStreamsPubSub(url=redis_url, consumer_name="a:b")
    # A misspelt client option, or one this backend does not have, is named as the caller's.
    with pytest.raises(TypeError, match=r"RedisStreamsPubSub\(\) got .* 'clustr'"):
        RedisStreamsPubSub(url=redis_url, clustr=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"RedisStreamsPubSub\(\) got .* 'wait_replicas'"):
        RedisStreamsPubSub(url=redis_url, wait_replicas=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"RedisLeaseProvider\(\) got .* 'max_conections'"):
        leases.RedisLeaseProvider(url=redis_url, max_conections=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="cluster must be a bool"):
        leases.RedisLeaseProvider(url=redis_url, cluster="yes")  # type: ignore[arg-type]
    assert leases.RedisLeaseProvider(url=redis_url, wait_replicas=1).wait_replicas == 1
    ps = RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix)
    with pytest.raises(ClosedError, match="async with"):
        await ps.subscribe("t", Recorder())
    async with ps:
        with pytest.raises(ValueError, match="reserved"):
            await ps.subscribe("t", Recorder(), group="fanout:x")
    with pytest.raises(leases.BackendUnavailableError):
        async with RedisStreamsPubSub(url="redis://127.0.0.1:1/0"):
            pass
    with pytest.raises(leases.BackendUnavailableError):
        await RedisStreamsPubSub(url="redis://127.0.0.1:1/0").publish("t", Event("e"))


async def test_configuration_errors_are_permanent_and_outages_unavailable(
    private_redis_server: RedisServer, key_prefix: str
) -> None:
    """A wrong password, a missing password, a missing ACL permission or a wrong database is
    ``BackendPermanentError`` (retrying won't help); an unreachable server is
    ``BackendUnavailableError``, and never the other way round."""
    port = private_redis_server.port
    async with redis.asyncio.Redis.from_url(private_redis_server.url) as unauthenticated:
        await unauthenticated.config_set("requirepass", "secret")
    admin = redis.asyncio.Redis.from_url(f"redis://:secret@127.0.0.1:{port}/0")
    await admin.acl_setuser(
        "limited", enabled=True, passwords=["+pw"], keys=["*"],
        commands=["+@all", "-xadd"],
    )
    try:
        refused = {
            "wrong password": f"redis://:wrong@127.0.0.1:{port}/0",
            "no password": f"redis://127.0.0.1:{port}/0",
            "no ACL permission": f"redis://limited:pw@127.0.0.1:{port}/0",
            "wrong database": f"redis://:secret@127.0.0.1:{port}/99",
        }
        for what, url in refused.items():
            ps = RedisStreamsPubSub(url=url, key_prefix=key_prefix)
            try:
                with pytest.raises(BackendPermanentError, match="Redis refused") as caught:
                    await ps.publish("t", Event("e"))
            finally:
                await ps.redis_client.aclose()
            assert not isinstance(caught.value, BackendUnavailableError), what
            if what != "no ACL permission":  # entering writes the liveness key with SET
                with pytest.raises(BackendPermanentError):
                    async with RedisStreamsPubSub(url=url, key_prefix=key_prefix):
                        pass
        good = RedisStreamsPubSub(url=f"redis://:secret@127.0.0.1:{port}/0", key_prefix=key_prefix)
        async with good:
            await good.publish("t", Event("e"))
        unreachable = f"redis://127.0.0.1:{free_port()}/0"
        down = RedisStreamsPubSub(url=unreachable)
        try:
            with pytest.raises(BackendUnavailableError) as unavailable:
                await down.publish("t", Event("e"))
        finally:
            await down.redis_client.aclose()
        assert not isinstance(unavailable.value, BackendPermanentError)
        with pytest.raises(BackendUnavailableError):
            async with RedisStreamsPubSub(url=unreachable):
                pass
    finally:
        await admin.acl_deluser("limited")
        await admin.config_set("requirepass", "")
        await admin.aclose()
