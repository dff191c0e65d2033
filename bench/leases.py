"""Acquire+release cycles per second: RedisLeaseProvider vs redis-py's asyncio ``Lock``.

Both run against the same redis-server in one process, in interleaved rounds (A, B, B, A, ...)
so drift in machine load hits both alike; the result is printed as a ratio. Also prints the
in-memory provider's rate for scale. Starts its own ``redis-server`` unless ``--redis-url``.

    python bench/leases.py [--redis-url URL] [--rounds 6] [--cycles 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

import redis.asyncio
from redis.asyncio.lock import Lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases import InMemoryLeaseProvider, RedisLeaseProvider
from tests._redis_server import RedisServer, redis_server_binary

TTL_MS = 10_000
Cycle = Callable[[int], Awaitable[None]]


async def rate(cycle: Cycle, cycles: int) -> float:
    """Cycles per second of ``cycles`` sequential calls to ``cycle``."""
    start = time.perf_counter()
    for i in range(cycles):
        await cycle(i)
    return cycles / (time.perf_counter() - start)


async def run(url: str, rounds: int, cycles: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    provider = RedisLeaseProvider(client=client, key_prefix=prefix)
    memory = InMemoryLeaseProvider()

    async def ours(i: int) -> None:
        result = await provider.acquire_lease("k", "owner", TTL_MS)
        assert result.acquired
        await provider.release_lease("k", "owner")

    async def redis_lock(i: int) -> None:
        lock = Lock(client, f"{prefix}:lock", timeout=TTL_MS / 1000)
        assert await lock.acquire(blocking=False)
        await lock.release()

    async def in_memory(i: int) -> None:
        assert (await memory.acquire_lease("k", "owner", TTL_MS)).acquired
        await memory.release_lease("k", "owner")

    try:
        await client.ping()
        await rate(ours, 200)  # warm up: connection, script load
        await rate(redis_lock, 200)
        ours_rates: list[float] = []
        lock_rates: list[float] = []
        for r in range(rounds):
            pair: list[tuple[list[float], Cycle]] = [(ours_rates, ours), (lock_rates, redis_lock)]
            for into, cycle in pair if r % 2 == 0 else reversed(pair):
                into.append(await rate(cycle, cycles))
            a, b = ours_rates[-1], lock_rates[-1]
            print(
                f"round {r + 1}: RedisLeaseProvider {a:8.0f}/s   "
                f"redis-py Lock {b:8.0f}/s   ratio {a / b:.2f}"
            )
        ratios = [a / b for a, b in zip(ours_rates, lock_rates, strict=True)]
        mem = await rate(in_memory, cycles * 10)
        print(
            f"median: RedisLeaseProvider {statistics.median(ours_rates):.0f} cycles/s, "
            f"redis-py Lock {statistics.median(lock_rates):.0f} cycles/s, "
            f"ratio (ours / Lock) {statistics.median(ratios):.2f} "
            f"[min {min(ratios):.2f}, max {max(ratios):.2f}]"
        )
        print(f"InMemoryLeaseProvider: {mem:.0f} cycles/s (asyncio, same process)")
        print("(one cycle = acquire + release = 2 round trips for both Redis implementations)")
    finally:
        await client.delete(f"{prefix}:{{k}}", f"{prefix}:{{k}}:fence", f"{prefix}:lock")
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this server instead of starting one")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per round and side")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        url: str | None = args.redis_url
        if url is None:
            binary = redis_server_binary()
            if binary is None:
                print("redis-server not found; pass --redis-url", file=sys.stderr)
                return 2
            url = stack.enter_context(RedisServer(binary)).url
        print(f"redis: {url}, {args.rounds} rounds x {args.cycles} cycles per side")
        asyncio.run(run(url, args.rounds, args.cycles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
