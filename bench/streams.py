"""Output streams: emit -> a reader in another runtime, vs raw XADD -> XREAD BLOCK; fan-out.

Measured side by side in one run, in interleaved rounds (A, B, B, A, ...), on the same server:

* **Latency**: a worker's ``run.emit(...)`` until a reader sees the part through
  ``SignalRuntime.stream(key, follow=True)`` in a sender-only runtime on its own
  ``RedisStreamsPubSub`` (its own connections), vs raw redis-py: one client ``XADD``s, another
  is blocked in ``XREAD BLOCK`` on the same stream. Ping-pong: the next part is emitted once the
  reader has the previous one, so each figure is one part's trip, not a queue.
* **Fan-out**: ``--followers`` readers in one process, each following its own thread (all
  waiting at once), then one part appended to each thread: the Redis connections the process
  holds (before and while following; the design claim is O(1), not one per reader) and the
  time until every reader has its part.
* **Re-homing**: then, with every reader waiting for its next part, the follower's pub/sub
  connection is killed (``CLIENT KILL TYPE pubsub``) and one more part is appended to each
  thread (their announcements are lost with the connection): the time from the kill until
  every reader has that part.

Starts its own ``redis-server`` unless ``--redis-url``.

    python bench/streams.py [--redis-url URL] [--rounds 4] [--parts 300] [--followers 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import redis.asyncio
import structlog

from bench._server import redis_url
from pubsub import RedisStreamsPubSub
from signals import RedisSignalStore, Run, Signal, SignalRuntime
from signals.kit import PartIn

Bench = Callable[[int], Awaitable[list[float]]]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ours(url: str, prefix: str, n: int) -> list[float]:
    """Seconds from ``run.emit`` to a remote ``stream()`` reader seeing the part, per part."""
    seen = anyio.Event()
    latencies: list[float] = []
    thread = f"bench-{uuid.uuid4().hex[:8]}"
    go = anyio.Event()

    async def agent(run: Run) -> None:
        nonlocal seen
        async for signal in run:
            await go.wait()
            for i in range(n):
                seen = anyio.Event()
                await run.emit({"i": i, "t": time.perf_counter()}, signal=signal)
                await seen.wait()
            await run.ack(signal)

    async def read(reader: SignalRuntime) -> None:
        async for part in reader.stream(thread):
            if part.kind == "part":
                latencies.append(time.perf_counter() - part.data["t"])
                seen.set()
                if len(latencies) == n:
                    return

    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as wps, \
            RedisStreamsPubSub(url=url, key_prefix=prefix) as rps, \
            SignalRuntime(pubsub=wps, agent=agent, shutdown_timeout_ms=0) as worker, \
            SignalRuntime(pubsub=rps, agent=None) as reader, \
            anyio.create_task_group() as tg:
        tg.start_soon(read, reader)
        await worker.send(thread, Signal("go"))
        await anyio.sleep(0.1)  # the reader is blocked on the stream
        go.set()
    return latencies


async def raw(url: str, n: int) -> list[float]:
    """Seconds from XADD to a reader blocked in XREAD BLOCK seeing the entry, per entry."""
    writer = redis.asyncio.Redis.from_url(url)
    blocked = redis.asyncio.Redis.from_url(url)
    stream = f"bench-raw-{uuid.uuid4().hex[:8]}"
    latencies: list[float] = []
    seen = anyio.Event()

    async def read() -> None:
        last = "0"
        while len(latencies) < n:
            reply: Any = await blocked.xread({stream: last}, block=1000)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    latencies.append(time.perf_counter() - float(fields[b"t"]))
                    last = entry_id
                    seen.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.sleep(0.1)
        for i in range(n):
            seen = anyio.Event()
            await writer.xadd(stream, {"i": i, "t": repr(time.perf_counter())})
            await seen.wait()
    await writer.delete(stream)
    await writer.aclose()
    await blocked.aclose()
    return latencies


async def latency(url: str, rounds: int, n: int) -> None:
    prefix = f"bench-streams-{uuid.uuid4().hex[:8]}"
    benches: list[tuple[list[float], Bench]] = [
        ([], lambda k: ours(url, prefix, k)), ([], lambda k: raw(url, k)),
    ]
    for _, bench in benches:
        await bench(min(n, 50))  # warm up
    p50s: dict[int, list[float]] = {0: [], 1: []}
    for r in range(rounds):
        order = [0, 1] if r % 2 == 0 else [1, 0]
        for which in order:
            got = await benches[which][1](n)
            benches[which][0].extend(got)
            p50s[which].append(statistics.median(got))
    a, b = benches[0][0], benches[1][0]
    ratios = [x / y for x, y in zip(p50s[0], p50s[1], strict=True)]
    print(f"latency, emit -> remote stream reader vs XADD -> XREAD BLOCK ({len(a)} parts each):")
    print(f"  ours p50 {pct(a, .5) * 1e3:6.2f} ms  p99 {pct(a, .99) * 1e3:6.2f} ms")
    print(f"  raw  p50 {pct(b, .5) * 1e3:6.2f} ms  p99 {pct(b, .99) * 1e3:6.2f} ms")
    print(f"  p50 ratio x{statistics.median(ratios):.2f} per round "
          f"[min {min(ratios):.2f}, max {max(ratios):.2f}]; "
          f"p99 ratio x{pct(a, .99) / pct(b, .99):.2f}")


async def connections(url: str) -> tuple[int, int]:
    """(connections, of which subscribed to pub/sub channels), not counting this one."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        me = await client.client_id()
        rows: Any = await client.client_list()
        others = [row for row in rows if int(row["id"]) != me]
        return len(others), sum("P" in str(row.get("flags", "")) for row in others)
    finally:
        await client.aclose()


async def fanout(url: str, followers: int, pad: int) -> None:
    prefix = f"bench-fanout-{uuid.uuid4().hex[:8]}"
    threads = [f"f-{i}" for i in range(followers)]
    got: dict[str, float] = {}
    again: dict[str, float] = {}
    everyone, everyone_again = anyio.Event(), anyio.Event()
    base, _ = await connections(url)
    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=None) as reader:
        idle = (await connections(url))[0] - base

        async def follow(thread: str) -> None:
            async for part in reader.stream(thread):
                n = part.data["n"]
                into = got if n == 1 else again
                into[thread] = time.perf_counter()
                if len(into) == followers:
                    (everyone if n == 1 else everyone_again).set()
                if n == 2:
                    return

        writer = RedisSignalStore(url=url, key_prefix=f"{prefix}:signals")
        try:
            async with anyio.create_task_group() as tg:
                for thread in threads:
                    tg.start_soon(follow, thread)
                await anyio.sleep(2.0)  # every follower waits
                following, subscribed = await connections(url)
                following -= base  # the writer has not connected yet

                async def write_each(value: int, done: anyio.Event,
                                     seen: dict[str, float], start: float) -> tuple[float, float]:
                    """One part to each thread; (written, the last follower had it) from
                    ``start``."""
                    data = json.dumps({"n": value, "pad": "x" * pad})
                    for thread in threads:
                        await writer.emit(thread, [PartIn("part", "bench/1", None, data)])
                    wrote = time.perf_counter() - start
                    with anyio.fail_after(120):
                        await done.wait()
                    return wrote, max(seen.values()) - start

                wrote, last = await write_each(1, everyone, got, time.perf_counter())
                await anyio.sleep(1.0)  # every follower waits for its second part
                admin = redis.asyncio.Redis.from_url(url)
                kill = time.perf_counter()
                await admin.client_kill_filter(_type="pubsub")
                await admin.aclose()
                rewrote, rehomed = await write_each(2, everyone_again, again, kill)
        finally:
            await writer.aclose()
    print(f"fan-out, {followers} followers on {followers} threads in one process, parts of "
          f"{pad + 20} bytes:")
    print(f"  connections: {idle} with the runtime idle, {following} with every follower "
          f"waiting, of which {subscribed} on pub/sub (the follower's; the pool holds at most "
          f"max_connections=32 besides)")
    print(f"  one part to each thread: written in {wrote * 1e3:.0f} ms, the last follower "
          f"had its part {last * 1e3:.0f} ms after the first write")
    print(f"  the follower's pub/sub connection killed, then one more part to each thread "
          f"(written in {rewrote * 1e3:.0f} ms from the kill): the last follower had it "
          f"{rehomed * 1e3:.0f} ms after the kill, {(rehomed - rewrote) * 1e3:.0f} ms after "
          f"the last write")


async def main(url: str, rounds: int, parts: int, followers: int, pad: int) -> None:
    if rounds > 0:
        await latency(url, rounds, parts)
    await fanout(url, followers, pad)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--rounds", type=int, default=4, help="latency rounds (0: none)")
    parser.add_argument("--parts", type=int, default=300, help="parts per round")
    parser.add_argument("--followers", type=int, default=1000)
    parser.add_argument("--pad", type=int, default=0,
                        help="fan-out parts padded to this many bytes (over 4096: announced "
                             "by their id and read)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with redis_url(args.redis_url) as url:
        print(f"redis: {url}; {args.rounds} interleaved rounds of {args.parts} parts")
        anyio.run(main, url, args.rounds, args.parts, args.followers, args.pad,
                  backend="asyncio")


if __name__ == "__main__":
    cli()
