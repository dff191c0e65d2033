"""Two worker processes and a sender on one SQLite file; the owner of a thread is SIGKILLed.

    python examples/sqlite_workers.py [--db PATH]

No server: every process opens the same file with ``SQLitePubSub(path)``. The sender (this
process, ``agent=None``) sends ten signals to each of three threads; each thread runs in one
worker at a time. Mid-way the example kills the owner of ``thread-a`` with SIGKILL: its lease
runs out after a TTL, the other worker takes the thread over, and every signal is processed,
the one the killed run was working on included (at least once: its receipt names the worker
that acknowledged it).
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _workers import run_example, worker_processes

from pubsub import SQLitePubSub
from signals import Run, Signal, SignalRuntime

THREADS = ("thread-a", "thread-b", "thread-c")
PER_THREAD = 10


async def agent(run: Run) -> None:
    async for sig in run:
        await anyio.sleep(0.1)  # the work of one step
        await run.ack(sig, result={"pid": os.getpid()})


async def worker(db: str) -> None:
    async with SQLitePubSub(db) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, lease_ttl_ms=1000, recover_interval_ms=250
    ):
        print("ready", flush=True)
        await anyio.sleep_forever()


async def main(db: str) -> None:
    async with worker_processes(__file__, db, 2) as workers, SQLitePubSub(db) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=None) as sender:
        print(f"two workers (pids {[w.pid for w in workers]}) on {db}")
        for n in range(PER_THREAD):
            for key in THREADS:
                await sender.send(key, Signal({"n": n}, id=f"{key}-{n}"))
        await sender.wait_for("thread-a", "thread-a-2", timeout=30)  # a few steps done
        info = await sender.thread("thread-a")
        assert info.pid is not None, info
        print(f"thread-a runs in pid {info.pid}; SIGKILL it")
        os.kill(info.pid, signal.SIGKILL)
        by: Counter[int] = Counter()
        for n in range(PER_THREAD):
            for key in THREADS:
                receipt = await sender.wait_for(key, f"{key}-{n}", timeout=30)
                assert receipt.status == "processed", receipt
                by[receipt.result["pid"]] += 1
        print(f"all {sum(by.values())} signals processed; by worker pid: {dict(by)}")


if __name__ == "__main__":
    run_example(__doc__, main, worker, "agents.db")
