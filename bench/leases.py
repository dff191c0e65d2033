"""Acquire+release cycles per second: RedisLeaseProvider vs redis-py's asyncio ``Lock``.

Both run against the same redis-server in one process, in interleaved rounds (A, B, B, A, ...)
so drift in machine load hits both alike; the result is printed as a ratio. Also prints the
in-memory provider's rate for scale. Starts its own ``redis-server`` unless ``--redis-url``.

``--floor`` adds a third contender: our provider whose acquire script only replies with a
grant (no lease read or written; the release is ours, on a lease that is not there). It is
our client path with a script call of no work, so it tells apart what our Python and the
script call cost from what the acquire's own commands on the server cost.

    python bench/leases.py [--redis-url URL] [--rounds 6] [--cycles 2000] [--tasks 1,16]
                           [--floor]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio
from redis.asyncio.lock import Lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _signal_leases.redis.script import Script
from bench._server import redis_url
from leases import InMemoryLeaseProvider, RedisLeaseProvider

TTL_MS = 10_000
#: The floor's acquire: a grant with token 1, as the real script replies, and nothing done.
REPLY_ONLY = "return {1, ARGV[2], 1}"
Cycle = Callable[[int], Awaitable[None]]


async def rate(cycle: Cycle, cycles: int, tasks: int) -> float:
    """Cycles per second of ``tasks`` concurrent tasks, each making ``cycles`` sequential calls
    to ``cycle`` on a key of its own."""
    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for t in range(tasks):

            async def loop(t: int = t) -> None:
                for _ in range(cycles):
                    await cycle(t)

            tg.create_task(loop())
    return cycles * tasks / (time.perf_counter() - start)


async def run(url: str, rounds: int, cycles: int, task_counts: list[int],
              floor: bool = False) -> None:
    client = redis.asyncio.Redis.from_url(url, max_connections=max(task_counts) * 2 + 4)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    provider = RedisLeaseProvider(client=client, key_prefix=prefix)
    replying = RedisLeaseProvider(client=client, key_prefix=f"{prefix}-floor")
    replying._acquire = Script(client, REPLY_ONLY)
    memory = InMemoryLeaseProvider()

    async def ours(t: int) -> None:
        result = await provider.acquire_lease(f"k{t}", "owner", TTL_MS)
        assert result.acquired
        await provider.release_lease(f"k{t}", "owner")

    async def reply_only(t: int) -> None:
        assert (await replying.acquire_lease(f"k{t}", "owner", TTL_MS)).acquired
        await replying.release_lease(f"k{t}", "owner")

    async def redis_lock(t: int) -> None:
        lock = Lock(client, f"{prefix}:lock{t}", timeout=TTL_MS / 1000)
        assert await lock.acquire(blocking=False)
        await lock.release()

    async def in_memory(t: int) -> None:
        assert (await memory.acquire_lease(f"k{t}", "owner", TTL_MS)).acquired
        await memory.release_lease(f"k{t}", "owner")

    try:
        await client.ping()
        for tasks in task_counts:
            contenders: list[tuple[str, Cycle]] = [("ours", ours), ("Lock", redis_lock)]
            if floor:
                contenders.append(("floor", reply_only))
            for _, cycle in contenders:
                await rate(cycle, 100, tasks)  # warm up: connections, script load
            rates: dict[str, list[float]] = {name: [] for name, _ in contenders}
            for r in range(rounds):
                for name, cycle in contenders if r % 2 == 0 else reversed(contenders):
                    rates[name].append(await rate(cycle, cycles // tasks or 1, tasks))
            ratios = [a / b for a, b in zip(rates["ours"], rates["Lock"], strict=True)]
            print(
                f"{tasks:>3} task(s): RedisLeaseProvider {statistics.median(rates['ours']):7.0f}"
                f"/s, redis-py Lock {statistics.median(rates['Lock']):7.0f}/s, ratio (ours/Lock) "
                f"{statistics.median(ratios):.2f} [min {min(ratios):.2f}, max {max(ratios):.2f}]"
            )
            if floor:
                low = [a / b for a, b in zip(rates["floor"], rates["Lock"], strict=True)]
                print(
                    f"{tasks:>3} task(s): floor (an acquire script that only replies) "
                    f"{statistics.median(rates['floor']):7.0f}/s, ratio (floor/Lock) "
                    f"{statistics.median(low):.2f} [min {min(low):.2f}, max {max(low):.2f}]"
                )
        mem = await rate(in_memory, cycles * 10, 1)
        print(f"InMemoryLeaseProvider: {mem:.0f} cycles/s (asyncio, same process, one task)")
        print("(one cycle = acquire + release = 2 round trips for both Redis implementations;"
              " median of interleaved rounds)")
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this server instead of starting one")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per round and side")
    parser.add_argument("--tasks", default="1,16", help="concurrent tasks, comma-separated")
    parser.add_argument("--floor", action="store_true",
                        help="also run the floor: an acquire script that only replies")
    args = parser.parse_args(argv)
    with redis_url(args.redis_url) as url:
        print(f"redis: {url}, {args.rounds} rounds x {args.cycles} cycles per side")
        asyncio.run(run(url, args.rounds, args.cycles, [int(t) for t in args.tasks.split(",")],
                        args.floor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
