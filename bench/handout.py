"""Hand-out rate of the core with few and with many pending signals on one thread.

A thread's inbox is ordered by priority, then accept order (see docs/dispositions.md). This
bench checks that the order costs no scan of the pending signals: it preloads one thread with
``pending`` signals of mixed priorities (and a few lanes), then times ``--takes`` hand-outs,
each a ``take`` that acknowledges the previous one (what a run does). The rate with 10 pending
and with 10,000 pending, side by side in one run, on Redis and SQLite (and memory):

    python bench/handout.py [--pending 10,10000] [--takes 500] [--rounds 3]
        [--backends memory,redis,sqlite] [--redis-url redis://...]

The ratio ``10,000 / 10`` near 1.0 says a hand-out does not grow with the pending count.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from bench._server import redis_url
from pubsub import SQLitePubSub
from signals import InMemorySignalStore, RedisSignalStore, Signal
from signals.kit import Ack, RunRef, SignalCore, SQLCore


@contextlib.asynccontextmanager
async def open_core(backend: str, url: str | None, workdir: str) -> AsyncIterator[SignalCore]:
    if backend == "memory":
        yield InMemorySignalStore()
    elif backend == "redis":
        assert url is not None
        store = RedisSignalStore(url=url, key_prefix=f"bh{uuid.uuid4().hex[:8]}")
        try:
            yield store
        finally:
            await store.aclose()
    else:
        ps = SQLitePubSub(str(Path(workdir) / f"{uuid.uuid4().hex[:8]}.db"))
        async with ps:
            yield SQLCore(ps.sql_database, leases=ps, pubsub=ps)


LANES = True  # every fifth signal in one of four lanes


async def preload(core: SignalCore, thread: str, n: int) -> None:
    for i in range(n):
        lane = f"l{i % 4}" if LANES and i % 5 == 0 else None
        await core.accept(thread, Signal({"i": i}, id=f"s{i}", priority=i % 3, lane=lane),
                          "deliver")


async def rate(core: SignalCore, pending: int, takes: int) -> float:
    thread = f"t{uuid.uuid4().hex[:8]}"
    await preload(core, thread, pending + takes)
    run = RunRef(f"bench/{uuid.uuid4().hex[:6]}", 1)
    acks: tuple[Ack, ...] = ()
    start = time.perf_counter()
    for n in range(takes):
        taken = await core.take(thread, run, acks=acks, max_attempts=5, first=n == 0)
        assert taken.entries, "the preloaded thread ran dry"
        acks = tuple(Ack(e.entry_id, e.signal.id) for e in taken.entries)
    elapsed = time.perf_counter() - start
    await core.withdraw(thread, None, held=True)  # leave nothing behind
    return takes / elapsed


async def main(args: argparse.Namespace, url: str | None) -> None:
    pendings = [int(p) for p in args.pending.split(",")]
    print(f"hand-outs per second, {args.takes} takes (median of {args.rounds} rounds)")
    print(f"{'backend':8} " + " ".join(f"{p:>14,} pending" for p in pendings)
          + f"  {'ratio':>8}")
    with tempfile.TemporaryDirectory(prefix="bench-handout-") as workdir:
        for backend in args.backends.split(","):
            rates: dict[int, list[float]] = {p: [] for p in pendings}
            async with open_core(backend, url, workdir) as core:
                for _ in range(args.rounds):
                    for p in pendings:  # interleaved, so noise hits both alike
                        rates[p].append(await rate(core, p, args.takes))
            med = {p: statistics.median(r) for p, r in rates.items()}
            ratio = med[pendings[-1]] / med[pendings[0]]
            print(f"{backend:8} " + " ".join(f"{med[p]:>22,.0f}" for p in pendings)
                  + f"  x{ratio:>7.2f}", flush=True)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", default="10,10000")
    parser.add_argument("--takes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="memory,redis,sqlite")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    if "redis" in args.backends.split(","):
        with redis_url(args.redis_url) as url:
            anyio.run(main, args, url)
    else:
        anyio.run(main, args, None)


if __name__ == "__main__":
    cli()
