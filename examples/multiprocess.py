"""The same agent across several OS processes sharing one Redis.

    python examples/multiprocess.py [--redis-url URL] [--processes N]

Each of N processes runs a ``SignalRuntime`` on ``RedisStreamsPubSub`` and, at the same instant,
sends one signal to the same thread. Exactly one process wins the lease and wakes the agent; the
others find the thread owned and route their signals to it (durable inbox + doorbell). The
agent records every signal it processes in a Redis list, and the parent prints who ran what.

Without ``--redis-url`` it starts a local ``redis-server`` (when one is on ``PATH``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

THREAD = "shared-thread"


def processed_key(prefix: str) -> str:
    return f"{prefix}:example:processed"


def start_key(prefix: str) -> str:
    return f"{prefix}:example:start"


async def child(redis_url: str, prefix: str, index: int) -> None:
    """One process: when the parent says go, send one signal; run the agent if this one wins."""
    import redis.asyncio

    from pubsub import RedisStreamsPubSub
    from signals import Run, Signal, SignalRuntime

    recorder = redis.asyncio.Redis.from_url(redis_url)

    async def agent(run: Run) -> None:
        async for signal in run:
            await anyio.sleep(0.05)  # "work"
            record = {"signal_id": signal.id, "sender": signal.payload["sender"],
                      "run_id": run.run_id, "pid": os.getpid(), "token": run.token}
            await recorder.rpush(processed_key(prefix), json.dumps(record))

    try:
        async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, lease_ttl_ms=5_000, idle_wait_ms=2_000
        ) as runtime:
            print(json.dumps({"ready": index}), flush=True)
            while not await recorder.exists(start_key(prefix)):  # noqa: ASYNC110
                await anyio.sleep(0.002)  # every process waits at the same start line
            signal = Signal({"sender": f"process-{index}"}, id=f"signal-from-{index}")
            delivery = await runtime.send(THREAD, signal)
            print(json.dumps({"index": index, "pid": os.getpid(), "outcome": delivery.outcome,
                              "run_id": delivery.run_id, "owner": delivery.owner}), flush=True)
            await runtime.wait_idle()  # the winner keeps running until the thread is idle
    finally:
        await recorder.aclose()


def run_parent(redis_url: str, processes: int) -> int:
    import redis

    prefix = f"example-mp-{uuid.uuid4().hex[:8]}"
    print(f"== {processes} processes send one signal each to thread {THREAD!r} at once ==")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(i), "--redis-url", redis_url,
             "--key-prefix", prefix],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    for p in procs:  # wait until every child is connected and at the start line
        assert p.stdout is not None
        while not (line := p.stdout.readline()).startswith('{"ready"'):
            if not line:
                print("error: a process exited before it was ready", file=sys.stderr)
                return 1
    with redis.Redis.from_url(redis_url) as client:
        client.set(start_key(prefix), 1)
    results: list[dict[str, Any]] = []
    failed = 0
    for p in procs:
        out, _ = p.communicate(timeout=60)
        failed += p.returncode != 0
        results.extend(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    if failed:
        print(f"error: {failed} process(es) failed", file=sys.stderr)
        return 1

    client = redis.Redis.from_url(redis_url)
    try:
        processed = [json.loads(raw) for raw in client.lrange(processed_key(prefix), 0, -1)]
    finally:
        client.close()

    runs: dict[str, str] = {}

    def name(run_id: str | None) -> str:
        if run_id is None:
            return "-"
        return runs.setdefault(run_id, f"run#{len(runs) + 1}")

    pid_of = {r["index"]: r["pid"] for r in results}
    for r in sorted(results, key=lambda r: (r["outcome"] != "wake", r["index"])):
        target = name(r["run_id"] or r["owner"])
        print(f"process-{r['index']} (pid {r['pid']}): send -> {r['outcome']:<8} ({target})")
    print("processed by the agent:")
    for rec in processed:
        print(f"  {rec['signal_id']:<16} from {rec['sender']:<10} by {name(rec['run_id'])} "
              f"in pid {rec['pid']} (token {rec['token']})")
    wakes = [r for r in results if r["outcome"] == "wake"]
    ids = [rec["signal_id"] for rec in processed]
    ran_in = {rec["pid"] for rec in processed}
    print(f"wakes: {len(wakes)}; signals sent: {len(results)}; processed: {len(ids)} "
          f"({len(set(ids))} distinct); processes that ran the agent: {len(ran_in)}")
    ok = (len(wakes) == 1 and sorted(set(ids)) == sorted(f"signal-from-{i}" for i in pid_of)
          and len(ids) == len(set(ids)) and ran_in == {wakes[0]["pid"]})
    print("OK: exactly one process woke and ran every signal exactly once" if ok else "MISMATCH")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--key-prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Applications configure structlog (the library never does): warnings only, on stderr, so
    # the children's stdout carries just their JSON reports.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if args.child is not None:
        anyio.run(child, args.redis_url, args.key_prefix, args.child)
        return 0
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    from _redis import on_redis

    return on_redis(args.redis_url, lambda url: run_parent(url, args.processes))


if __name__ == "__main__":
    raise SystemExit(main())
