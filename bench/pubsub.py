"""Publish->handler latency and events/s: RedisStreamsPubSub vs raw redis-py XADD/XREADGROUP.

Both run against the same redis-server in one process, in interleaved rounds (ours, raw, raw,
ours, ...) so machine noise hits both alike; results are printed as ratios. Starts its own
``redis-server`` unless ``--redis-url`` is given.

    python bench/pubsub.py [--redis-url URL] [--rounds 4] [--events 500]

Latency: one event in flight at a time (publish, wait for the handler). Throughput: publish
``--events`` events back to back, time until the handler saw the last one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._server import redis_url
from pubsub import Event, RedisStreamsPubSub


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ours(url: str, events: int) -> tuple[list[float], float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    send, received = anyio.create_memory_object_stream[float](max_buffer_size=events)

    async def handler(event: Event) -> None:
        send.send_nowait(time.perf_counter())

    async with RedisStreamsPubSub(url=url, key_prefix=prefix, block_ms=1000) as ps:
        sub = await ps.subscribe("t", handler, group="g")
        latencies = []
        for i in range(events):
            sent = time.perf_counter()
            await ps.publish("t", Event("e", i))
            latencies.append(await received.receive() - sent)
        start = time.perf_counter()
        for i in range(events):
            await ps.publish("t", Event("e", i))
        for _ in range(events):
            last = await received.receive()
        await sub.close()
        await ps.redis_client.delete(ps.stream_key("t"))
        return latencies, events / (last - start)


async def raw(url: str, events: int) -> tuple[list[float], float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    stream = f"{prefix}:raw"
    writer = redis.asyncio.Redis.from_url(url)
    reader = redis.asyncio.Redis.from_url(url)
    await writer.xgroup_create(stream, "g", id="$", mkstream=True)
    send, received = anyio.create_memory_object_stream[float](max_buffer_size=events)

    async def read() -> None:
        while True:
            reply: Any = await reader.xreadgroup("g", "c", {stream: ">"}, count=64, block=1000)
            for _name, entries in reply or []:
                for entry_id, _fields in entries:
                    await reader.xack(stream, "g", entry_id)
                    send.send_nowait(time.perf_counter())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            latencies = []
            for i in range(events):
                sent = time.perf_counter()
                await writer.xadd(stream, {"event": str(i)}, maxlen=10_000, approximate=True)
                latencies.append(await received.receive() - sent)
            start = time.perf_counter()
            for i in range(events):
                await writer.xadd(stream, {"event": str(i)}, maxlen=10_000, approximate=True)
            for _ in range(events):
                last = await received.receive()
            tg.cancel_scope.cancel()
        return latencies, events / (last - start)
    finally:
        await writer.delete(stream)
        await writer.aclose()
        await reader.aclose()


async def run(url: str, rounds: int, events: int) -> None:
    results: dict[str, list[tuple[list[float], float]]] = {"ours": [], "raw": []}
    order = ["ours", "raw", "raw", "ours"] * ((rounds + 1) // 2)
    for name in order[: rounds * 2]:
        results[name].append(await (ours if name == "ours" else raw)(url, events))
    summary = {}
    for name, runs in results.items():
        lat = [x for latencies, _ in runs for x in latencies]
        summary[name] = (
            _pct(lat, 0.5) * 1e6, _pct(lat, 0.99) * 1e6, statistics.median(r for _, r in runs)
        )
        p50, p99, eps = summary[name]
        print(f"{name:>5}: p50 {p50:7.0f} us  p99 {p99:7.0f} us  {eps:8.0f} events/s")
    o, r = summary["ours"], summary["raw"]
    print(
        f"ratio ours/raw: p50 latency x{o[0] / r[0]:.2f}, p99 latency x{o[1] / r[1]:.2f}, "
        f"throughput x{o[2] / r[2]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=500)
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        anyio.run(run, url, args.rounds, args.events)


if __name__ == "__main__":
    main()
