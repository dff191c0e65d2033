"""One thread's throughput: routed signals vs raw Redis Streams, in memory vs a memory stream.

Measured side by side in one run, in interleaved rounds (A, B, B, A, ...), on the same server:

* **Redis**: a sender-only ``SignalRuntime`` sends ``--signals`` signals to one thread owned by
  a worker runtime (separate connections; each signal is routed: stored, the owner notified,
  read, handed to the agent, acknowledged), vs raw redis-py: one task XADDs the same number of
  entries while another XREADGROUPs and XACKs each (the same three operations, no library).
* **Memory**: the same through ``InMemoryPubSub`` vs an anyio memory object stream doing the
  same hand-off (a sender task, a receiver task).

Rates are entries handed to the consumer per second, first send to last receipt. Starts its own
``redis-server`` unless ``--redis-url``.

    python bench/signals.py [--redis-url URL] [--rounds 4] [--signals 2000]
"""

from __future__ import annotations

import argparse
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
from pubsub import InMemoryPubSub, PubSub, RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime

Bench = Callable[[int], Awaitable[float]]


async def routed(pubsub: PubSub, n: int, **options: Any) -> float:
    """Signals per second through the runtime: sender-only runtime -> worker's run
    (``options``: more arguments of both runtimes)."""
    done = anyio.Event()
    seen = 0

    async def agent(run: Run) -> None:
        nonlocal seen
        async for signal in run:
            await run.ack(signal)
            if signal.type == "bench":
                seen += 1
                if seen == n:
                    done.set()

    thread = f"bench-{uuid.uuid4().hex[:8]}"
    async with SignalRuntime(pubsub=pubsub, agent=agent, idle_wait_ms=600_000,
                             shutdown_timeout_ms=0, **options) as worker, \
            SignalRuntime(pubsub=pubsub, agent=None, **options) as sender:
        await worker.send(thread, "hello")  # the worker owns the thread from here on
        await anyio.sleep(0.05)
        start = time.perf_counter()
        for i in range(n):
            await sender.send(thread, Signal(i, type="bench"))
        await done.wait()
        return n / (time.perf_counter() - start)


async def raw_streams(url: str, n: int) -> float:
    """Entries per second: one task XADDs, another XREADGROUPs and XACKs each entry."""
    producer = redis.asyncio.Redis.from_url(url)
    consumer = redis.asyncio.Redis.from_url(url)
    stream, group = f"bench-raw-{uuid.uuid4().hex[:8]}", "g"
    await producer.xgroup_create(stream, group, id="$", mkstream=True)
    got = 0

    async def consume() -> None:
        nonlocal got
        while got < n:
            reply: Any = await consumer.xreadgroup(group, "c", {stream: ">"}, count=1, block=1000)
            for _, entries in reply or []:
                for entry_id, _fields in entries:
                    await consumer.xack(stream, group, entry_id)
                    got += 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        for i in range(n):
            await producer.xadd(stream, {"i": i})
    rate = n / (time.perf_counter() - start)
    await producer.delete(stream)
    await producer.aclose()
    await consumer.aclose()
    return rate


async def memory_stream(n: int) -> float:
    """Items per second through an anyio memory object stream (a sender and a receiver)."""
    send, receive = anyio.create_memory_object_stream[int](0)
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:

        async def drain() -> None:
            async with receive:
                async for _ in receive:
                    pass

        tg.start_soon(drain)
        async with send:
            for i in range(n):
                await send.send(i)
    return n / (time.perf_counter() - start)


async def compare(name: str, ours: Bench, raw: Bench, rounds: int, n: int) -> None:
    await ours(min(n, 200))  # warm up
    await raw(min(n, 200))
    a: list[float] = []
    b: list[float] = []
    for r in range(rounds):
        pair = [(a, ours), (b, raw)]
        for into, bench in pair if r % 2 == 0 else reversed(pair):
            into.append(await bench(n))
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    print(f"{name}: ours {statistics.median(a):8.0f}/s  raw {statistics.median(b):8.0f}/s  "
          f"ratio x{statistics.median(ratios):.2f} [min {min(ratios):.2f}, max {max(ratios):.2f}]")


async def main(url: str, rounds: int, n: int) -> None:
    prefix = f"bench-signals-{uuid.uuid4().hex[:8]}"
    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as redis_pubsub:
        await compare(
            "Redis, one thread (routed signal vs XADD+XREADGROUP+XACK)",
            lambda k: routed(redis_pubsub, k), lambda k: raw_streams(url, k), rounds, n,
        )
    async with InMemoryPubSub() as memory_pubsub:
        await compare(
            "memory, one thread (routed signal vs anyio memory stream) ",
            lambda k: routed(memory_pubsub, k), memory_stream, rounds, n,
        )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--signals", type=int, default=2000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with redis_url(args.redis_url) as url:
        print(f"redis: {url}; {args.rounds} interleaved rounds of {args.signals} signals")
        anyio.run(main, url, args.rounds, args.signals, backend="asyncio")


if __name__ == "__main__":
    cli()
