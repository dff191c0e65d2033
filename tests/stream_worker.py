"""A worker process for the multi-process stream tests (``python -m tests.stream_worker``).

Runs a worker ``SignalRuntime`` on Redis whose agent, for each signal, emits ``--parts`` parts
``{"i": n}`` ``--gap-ms`` apart, then acknowledges it with the result ``{"parts": n, "pid": pid}``.
Prints ``{"event": "ready", "pid": ..., "runtime_id": ...}`` once up, then runs until killed or
``--seconds`` pass.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import anyio
import structlog

from pubsub import RedisStreamsPubSub
from signals import Run, SignalRuntime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cluster", action="store_true", help="--redis-url is a Redis Cluster")
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--gap-ms", type=int, default=50)
    parser.add_argument("--ttl-ms", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    anyio.run(_run, args)


async def _run(args: argparse.Namespace) -> None:
    pid = os.getpid()

    async def agent(run: Run) -> None:
        async for signal in run:
            for i in range(args.parts):
                await run.emit({"i": i, "pid": pid}, signal=signal)
                await anyio.sleep(args.gap_ms / 1000)
            await run.ack(signal, result={"parts": args.parts, "pid": pid})

    pubsub = RedisStreamsPubSub(url=args.redis_url, key_prefix=args.prefix, cluster=args.cluster)
    async with pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, lease_ttl_ms=args.ttl_ms, recover_interval_ms=args.ttl_ms
    ) as runtime:
        print(json.dumps({"event": "ready", "pid": pid, "runtime_id": runtime.runtime_id}),
              flush=True)
        await anyio.sleep(args.seconds)


if __name__ == "__main__":
    main()
