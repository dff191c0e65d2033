"""A worker process for the multi-process signal tests (run as ``python -m tests.signals_worker``).

``send``: start a runtime on Redis, wait for the shared start time, send signals to one thread,
print each ``Delivery`` as a JSON line, then wait until this process runs nothing.
``serve``: start a runtime that only recovers and runs threads, until killed or ``--seconds``.

The agent records each processed signal as ``<signal id> <run id> <pid>`` with RPUSH on
``<prefix>:processed`` after handling it (so a run killed mid-signal records nothing for it).
A signal whose payload has ``"block": true`` makes the agent record ``<id>`` on
``<prefix>:started`` and, the first time, hang (to be killed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import anyio
import redis.asyncio

from pubsub import RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["send", "serve"])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--thread", default="thread-1")
    parser.add_argument("--ids", default="", help="comma-separated signal ids to send")
    parser.add_argument("--start-at", type=float, default=0.0, help="Unix time to start sending")
    parser.add_argument("--block-on", default="", help="signal id whose payload blocks")
    parser.add_argument("--work-ms", type=int, default=100)
    parser.add_argument("--ttl-ms", type=int, default=15_000)
    parser.add_argument("--idle-wait-ms", type=int, default=0)
    parser.add_argument("--recover-ms", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--exit-after-send", action="store_true")
    args = parser.parse_args()
    anyio.run(_run, args)


async def _run(args: argparse.Namespace) -> None:
    record = redis.asyncio.Redis.from_url(args.redis_url)
    pid = os.getpid()

    async def agent(run: Run) -> None:
        async for signal in run:
            # Blocks the first time only (the process is killed there); a re-delivery goes on.
            blocks = isinstance(signal.payload, dict) and signal.payload.get("block")
            if blocks and await record.rpush(f"{args.prefix}:started", signal.id) == 1:
                await anyio.sleep_forever()
            await anyio.sleep(args.work_ms / 1000)
            await record.rpush(f"{args.prefix}:processed", f"{signal.id} {run.run_id} {pid}")
            await run.ack(signal)

    pubsub = RedisStreamsPubSub(url=args.redis_url, key_prefix=args.prefix, block_ms=200)
    async with pubsub, SignalRuntime(
        pubsub=pubsub,
        agent=agent,
        lease_ttl_ms=args.ttl_ms,
        idle_wait_ms=args.idle_wait_ms,
        recover_interval_ms=args.recover_ms,
    ) as runtime:
        print(json.dumps({"event": "ready", "pid": pid}), flush=True)
        if args.mode == "send":
            delay = args.start_at - time.time()
            if delay > 0:
                await anyio.sleep(delay)
            woke = False
            for signal_id in filter(None, args.ids.split(",")):
                payload = {"block": True} if signal_id == args.block_on else {"n": signal_id}
                delivery = await runtime.send(args.thread, Signal(payload, id=signal_id))
                print(json.dumps({"event": "sent", "pid": pid, "id": signal_id,
                                  "outcome": delivery.outcome, "owner": delivery.owner}),
                      flush=True)
                woke = woke or delivery.outcome == "wake"
            if args.exit_after_send and not woke:
                # A serverless invocation that lost the election: leave as soon as send returned.
                await record.aclose()
                sys.stdout.flush()
                os._exit(0)
            with anyio.move_on_after(args.seconds):
                await runtime.wait_idle()
        else:
            await anyio.sleep(args.seconds)
    await record.aclose()
    print(json.dumps({"event": "done", "pid": pid}), flush=True)


if __name__ == "__main__":
    main()
