"""One process, many threads: what the per-process machinery costs, on a real Redis.

Parts (each prints its figures; all against the same redis-server, started here unless
``--redis-url``):

* ``threads``: for each K in ``--ks`` (default 100, 1,000, 10,000): K threads become active in
  one ``SignalRuntime`` (TTL ``--ttl-ms``, default 3 s) and stay active for ``--hold-s``
  seconds. Reports setup time (and per thread, to show it is linear), leases lost, runs
  cancelled, idle Redis commands/s (INFO commandstats: every command, those run inside Lua
  scripts included), Redis connections, and RSS per active thread above the baseline.
* ``leases``: ``--leases`` (default 20,000) leases held by one ``LeaseHeartbeat`` for
  ``--hold-s`` seconds, with a session (one command per renewal) and in batch mode (one
  script per 1,000 leases): leases lost, Redis commands/s and Redis CPU.
* ``timers``: 10,000 delayed signals (due in an hour, over 1,000 threads) and 100 schedules
  (every hour) held by one worker runtime: idle Redis commands/s over ``--hold-s`` (the goal
  of docs/time.md: no timer per signal, thread or schedule; at most ~10 commands/s).
* ``latency``: send -> the agent sees the signal, from a sender-only runtime to a worker that
  owns the thread, with K = 10 and K = 10,000 active threads in the worker; side by side with
  a raw XADD -> XREAD BLOCK on the same server.

    python bench/scale.py [--redis-url URL] [--ks 100,1000,10000] [--hold-s 60] [--parts all]
"""

from __future__ import annotations

import argparse
import functools
import logging
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import anyio.lowlevel
import redis.asyncio
import structlog

from bench._raw import read_arrivals, until
from bench._server import redis_url
from leases import LeaseHeartbeat, RedisLeaseProvider
from pubsub import RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime


def rss_kib() -> int:
    """This process's resident set size, in KiB (current, from /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class RedisStats:
    """Deltas of Redis' own counters: commands (all, Lua inner calls included), CPU."""

    def __init__(self, url: str) -> None:
        self.client = redis.asyncio.Redis.from_url(url)

    async def commands(self) -> int:
        stats: Any = await self.client.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    async def cpu(self) -> float:
        info: Any = await self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    async def clients(self) -> int:
        info: Any = await self.client.info("clients")
        return int(info["connected_clients"])

    async def window(self, seconds: float) -> tuple[float, float]:
        """(commands/s, Redis CPU %) over ``seconds`` (our own two INFO calls excluded)."""
        c0, cpu0, t0 = await self.commands(), await self.cpu(), time.monotonic()
        await anyio.sleep(seconds)
        c1, cpu1, t1 = await self.commands(), await self.cpu(), time.monotonic()
        return (c1 - c0 - 2) / (t1 - t0), 100 * (cpu1 - cpu0) / (t1 - t0)


async def threads_part(url: str, k: int, ttl_ms: int, hold_s: float) -> dict[str, Any]:
    stats = RedisStats(url)
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

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    base_rss = rss_kib()
    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, lease_ttl_ms=ttl_ms
    ) as runtime:
        t0 = time.monotonic()
        for n in range(k):
            await runtime.send(f"t{n}", n)
        while started < k:  # noqa: ASYNC110 (a counter, polled)
            await anyio.sleep(0.01)
        setup_s = time.monotonic() - t0
        await anyio.sleep(1.0)
        rss = rss_kib()
        connections = await stats.clients() - 1
        rate, cpu = await stats.window(hold_s)
        active = len(runtime.active_threads())
        heartbeat = runtime._kit.heartbeat if runtime._kit else None
        mode = heartbeat.mode if heartbeat else "-"
        release.set()
    await stats.client.aclose()
    return {
        "k": k, "setup_s": setup_s, "setup_us_per_thread": 1e6 * setup_s / k,
        "active": active, "cancelled": cancelled, "lost": k - active,
        "idle_cmds_per_s": rate, "redis_cpu_pct": cpu, "connections": connections,
        "rss_kib_per_thread": (rss - base_rss) / k, "renewal": mode,
    }


async def leases_part(
    url: str, n: int, ttl_ms: int, hold_s: float, sessions: bool
) -> dict[str, Any]:
    stats = RedisStats(url)
    lost: list[str] = []
    prefix = f"bench-leases-{uuid.uuid4().hex[:8]}"
    async with RedisLeaseProvider(url=url, key_prefix=prefix) as provider, LeaseHeartbeat(
        provider, ttl_ms, sessions=sessions, on_lost=lambda lease: lost.append(lease.key)
    ) as heartbeat:
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for chunk in range(0, n, 1000):

                async def take(start: int) -> None:
                    for i in range(start, min(n, start + 1000)):
                        await heartbeat.acquire(f"k{i}", f"o{i}")

                tg.start_soon(take, chunk)
        setup_s = time.monotonic() - t0
        rate, cpu = await stats.window(hold_s)
        held = len(heartbeat)
        mode = heartbeat.mode
    await stats.client.aclose()
    return {"n": n, "mode": mode, "setup_s": setup_s, "held": held, "lost": len(lost),
            "cmds_per_s": rate, "redis_cpu_pct": cpu}


async def latency_part(url: str, k: int, samples: int) -> dict[str, Any]:
    """Signals: sender-only runtime -> the worker's agent. Raw: XADD -> a task blocked in XREAD
    on the same server, one at a time, interleaved."""
    prefix = f"bench-lat-{uuid.uuid4().hex[:8]}"
    arrived: dict[str, int] = {}
    raw_arrived: dict[str, int] = {}
    release = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            if run.thread_key != "probe":
                await release.wait()
                return
            if signal.payload == "stop":
                return
            arrived[signal.id] = time.monotonic_ns()
            await run.ack(signal)

    stream = f"{prefix}:raw"

    lat: list[float] = []
    raw: list[float] = []
    client = redis.asyncio.Redis.from_url(url)
    reader = redis.asyncio.Redis.from_url(url)
    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, lease_ttl_ms=3000, idle_wait_ms=600_000,
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None) as sender:
        for n in range(k):
            await worker.send(f"busy-{n}", n)
        await worker.send("probe", "hello")
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(read_arrivals, reader, stream, raw_arrived,
                                            clock=time.monotonic_ns))
            await anyio.sleep(0.2)
            for i in range(samples):
                await anyio.sleep(0.002)
                sid = f"s{i}"
                t0 = time.monotonic_ns()
                await sender.send("probe", Signal(i, id=sid))
                lat.append((await until(arrived, sid) - t0) / 1e6)
                await anyio.sleep(0.002)
                t0 = time.monotonic_ns()
                await client.xadd(stream, {"i": sid})
                raw.append((await until(raw_arrived, sid) - t0) / 1e6)
            tg.cancel_scope.cancel()
        release.set()
        await sender.send("probe", Signal("stop", id="stop"))
        await worker.wait_idle()
    await client.aclose()
    await reader.aclose()

    def pct(v: list[float], q: float) -> float:
        return sorted(v)[min(len(v) - 1, int(q * len(v)))]

    return {"k": k, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "raw_p50": pct(raw, 0.5),
            "raw_p99": pct(raw, 0.99), "n": len(lat)}


async def timers_part(url: str, hold_s: float, delayed: int = 10_000,
                      schedules: int = 100) -> dict[str, Any]:
    stats = RedisStats(url)

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)

    async with RedisStreamsPubSub(url=url, key_prefix=f"bench-{uuid.uuid4().hex[:8]}") as ps, \
            SignalRuntime(pubsub=ps, agent=agent) as runtime:
        t0 = time.monotonic()
        for n in range(delayed):
            await runtime.send(f"t{n % 1000}", n, delay_ms=3_600_000)
        for n in range(schedules):
            await runtime.schedule(f"s{n}", f"t{n}", n, every_ms=3_600_000)
        setup_s = time.monotonic() - t0
        await anyio.sleep(2.0)
        rate, cpu = await stats.window(hold_s)
    await stats.client.aclose()
    return {"setup_s": setup_s, "cmds_per_s": rate, "redis_cpu_pct": cpu}


async def main(args: argparse.Namespace, url: str) -> None:
    parts = set(args.parts.split(","))
    if parts & {"all", "threads"}:
        print(f"threads: K active in one process, TTL {args.ttl_ms} ms, held {args.hold_s} s")
        print(f"{'K':>7} {'setup s':>8} {'us/thread':>9} {'lost':>5} {'cancel':>6} "
              f"{'idle cmd/s':>10} {'redis cpu%':>10} {'conns':>5} {'KiB/thread':>10} renewal")
        for k in (int(x) for x in args.ks.split(",")):
            r = await threads_part(url, k, args.ttl_ms, args.hold_s)
            print(f"{r['k']:>7} {r['setup_s']:>8.2f} {r['setup_us_per_thread']:>9.0f} "
                  f"{r['lost']:>5} {r['cancelled']:>6} {r['idle_cmds_per_s']:>10.1f} "
                  f"{r['redis_cpu_pct']:>10.1f} {r['connections']:>5} "
                  f"{r['rss_kib_per_thread']:>10.2f} {r['renewal']}")
    if parts & {"all", "leases"}:
        print(f"\nleases: {args.leases} held by one heartbeat, TTL {args.ttl_ms} ms, "
              f"{args.hold_s} s")
        for sessions in (True, False):
            r = await leases_part(url, args.leases, args.ttl_ms, args.hold_s, sessions)
            print(f"  {r['mode']:>8}: held {r['held']}, lost {r['lost']}, "
                  f"setup {r['setup_s']:.1f} s, {r['cmds_per_s']:.1f} Redis cmds/s, "
                  f"Redis CPU {r['redis_cpu_pct']:.1f}%")
    if parts & {"all", "timers"}:
        r = await timers_part(url, args.hold_s)
        print(f"\ntimers: 10,000 delayed signals and 100 schedules in one worker: setup "
              f"{r['setup_s']:.1f} s, idle {r['cmds_per_s']:.1f} Redis cmds/s, Redis CPU "
              f"{r['redis_cpu_pct']:.1f}%")
    if parts & {"all", "latency"}:
        print("\nlatency: sender-only runtime -> worker's agent, vs raw XADD -> XREAD BLOCK")
        for k in (10, 10_000):
            r = await latency_part(url, k, args.samples)
            print(f"  K={k:>6}: p50 {r['p50']:.3f} ms (raw {r['raw_p50']:.3f}, "
                  f"x{r['p50'] / r['raw_p50']:.2f}), p99 {r['p99']:.3f} ms "
                  f"(raw {r['raw_p99']:.3f}), n={r['n']}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--ks", default="100,1000,10000")
    parser.add_argument("--ttl-ms", type=int, default=3000)
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--leases", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--parts", default="all",
                        help="all, or any of threads,leases,timers,latency")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with redis_url(args.redis_url) as url:
        print(f"redis: {url}")
        anyio.run(main, args, url, backend="asyncio")


if __name__ == "__main__":
    cli()
