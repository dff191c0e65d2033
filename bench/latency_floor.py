"""Routing latency and its floor: send -> agent, against the same route script called bare.

Side by side in one process, interleaved, on the same ``redis-server`` (started here unless
``--redis-url``), a worker runtime owning thread ``probe`` and a sender-only runtime:

* ``ours``: ``sender.send("probe", ...)`` until the worker's agent has the signal;
* ``script``: the route script a ``send`` runs (its arguments captured from a real ``send``,
  a new signal id each time), called with redis-py alone, until its reply;
* ``notice``: the same, until the notice the script publishes to the owner's runtime reaches a
  raw redis-py subscriber: the design's path with none of our Python on either side;
* ``raw``: one ``XADD`` until a task blocked in ``XREAD BLOCK`` has the entry.

The worker's agent takes the signals of ``script`` and ``notice`` too (from the notice), so
each round leaves the same state as ``send``.

    python bench/latency_floor.py [--redis-url URL] [--samples 400]

Goal (issue "Performance"): routing latency p50 <= 2x ``raw``; ``notice`` is its floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import anyio.lowlevel
import redis.asyncio

from bench._raw import read_arrivals, until
from bench._server import redis_url
from pubsub import RedisStreamsPubSub
from signals import RedisSignalStore, Run, Signal, SignalRuntime

_SENDER_ARG = 18  # the sender's runtime id among a route's arguments (see RedisFused.route)


async def measure(url: str, samples: int) -> dict[str, list[float]]:
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}"
    arrived: dict[str, int] = {}
    raw_arrived: dict[str, int] = {}
    noticed: dict[str, int] = {}  # the notices' text -> when each came
    captured: list[tuple[RedisSignalStore, list[Any]]] = []
    run_script = RedisSignalStore._run

    async def capture(self: RedisSignalStore, name: str, thread_key: str, args: Any,
                      what: str, *, runtime_id: str | None = None) -> list[Any]:
        if name == "accept" and "capture" in args and not captured:
            captured.append((self, list(args)))
        return await run_script(self, name, thread_key, args, what, runtime_id=runtime_id)

    async def agent(run: Run) -> None:
        async for signal in run:
            arrived[signal.id] = time.perf_counter_ns()
            await run.ack(signal)

    stream = f"{prefix}:raw"
    client, reader = redis.asyncio.Redis.from_url(url), redis.asyncio.Redis.from_url(url)
    subscriber = redis.asyncio.Redis.from_url(url)
    listener = subscriber.pubsub()

    async def notices() -> None:
        while True:
            message = await listener.get_message(timeout=1)
            if message is not None and message["type"] == "pmessage":
                noticed[message["data"].decode()] = time.perf_counter_ns()

    figures: dict[str, list[float]] = {"ours": [], "script": [], "notice": [], "raw": []}
    RedisSignalStore._run = capture  # type: ignore[method-assign,assignment]
    try:
        async with RedisStreamsPubSub(url=url, key_prefix=prefix) as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, lease_ttl_ms=60_000, idle_wait_ms=600_000,
        ) as worker, SignalRuntime(pubsub=pubsub, agent=None) as sender:
            await worker.send("probe", "hello")
            await anyio.sleep(0.3)
            await sender.send("probe", Signal("x", id="capture"))
            await until(arrived, "capture")
            RedisSignalStore._run = run_script  # type: ignore[method-assign]
            store, args = captured[0]
            if args[_SENDER_ARG] != sender.runtime_id:
                raise SystemExit("the route's arguments changed: see _SENDER_ARG")
            keys = store._keys("probe", None)
            script = store._lua["accept"]
            await listener.psubscribe(store.keys.notice_prefix + "*")

            async def bare(sid: str) -> None:
                signal = Signal(0, id=sid)
                argv = [*store._header("probe"), sid, signal.encode(), *args[2:]]
                await script(keys=keys, args=argv)

            async with anyio.create_task_group() as tg:
                tg.start_soon(read_arrivals, reader, stream, raw_arrived)
                tg.start_soon(notices)
                await anyio.sleep(0.2)
                for i in range(samples):
                    timings: dict[str, float] = {}
                    await anyio.sleep(0.003)
                    t0 = time.perf_counter_ns()
                    await sender.send("probe", Signal(i, id=f"s{i}"))
                    t1 = await until(arrived, f"s{i}")
                    timings["ours"] = (t1 - t0) / 1e6

                    await anyio.sleep(0.003)
                    noticed.clear()
                    t0 = time.perf_counter_ns()
                    await bare(f"b{i}")
                    t1 = time.perf_counter_ns()
                    mine = f'"id":"b{i}"'  # its notice carries the signal
                    with anyio.fail_after(10):
                        while not (came := [t for text, t in noticed.items() if mine in text]):
                            await anyio.lowlevel.checkpoint()
                    timings["script"] = (t1 - t0) / 1e6
                    timings["notice"] = (came[0] - t0) / 1e6
                    await until(arrived, f"b{i}")

                    await anyio.sleep(0.003)
                    t0 = time.perf_counter_ns()
                    await client.xadd(stream, {"i": f"r{i}"})
                    t1 = await until(raw_arrived, f"r{i}")
                    timings["raw"] = (t1 - t0) / 1e6
                    if i >= samples // 8:  # the first rounds warm up
                        for name, ms in timings.items():
                            figures[name].append(ms)
                tg.cancel_scope.cancel()
    finally:
        RedisSignalStore._run = run_script  # type: ignore[method-assign]
        await listener.aclose()
        await subscriber.aclose()
        await client.aclose()
        await reader.aclose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        figures = anyio.run(measure, url, args.samples)
    raw = statistics.median(figures["raw"])
    print(f"routing latency, p50 of {len(figures['raw'])} each, one process:")
    for name, label in (("ours", "send -> agent"), ("script", "the route script, bare"),
                        ("notice", "the script -> its notice, raw subscriber"),
                        ("raw", "XADD -> XREAD BLOCK")):
        p50 = statistics.median(figures[name])
        print(f"  {label:42s} {p50:6.3f} ms  x{p50 / raw:.2f}")
    print("goal: send -> agent <= 2x raw; the notice row is the design's floor")


if __name__ == "__main__":
    main()
