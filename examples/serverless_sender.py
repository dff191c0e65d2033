"""Fresh processes that only send (think: serverless functions, webhooks) signal the threads
of a worker process, with ``RedisSignalSender``: no runtime, no anyio in the senders.

    python examples/serverless_sender.py [--redis-url URL] [--senders N]

Part 1: two senders run before any worker: their signals are ``queued``, stored in Redis.
Part 2: a worker starts (a ``SignalRuntime`` with an agent) and finds them. Part 3: more
senders run, one fresh process each, while the worker holds the thread (``deliver``) or after
its run ended (``queued``). Every signal is processed once; the worker is then stopped.

Without ``--redis-url`` it starts a local ``redis-server`` (when one is on ``PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

THREAD = "orders"


async def send_one(redis_url: str, prefix: str, index: int) -> None:
    """One sender process: import, send one signal, exit."""
    from signals import RedisSignalSender, Signal

    async with RedisSignalSender(url=redis_url, key_prefix=prefix) as sender:
        delivery = await sender.send(THREAD, Signal({"order": index}, id=f"order-{index}"))
    loaded = sorted(m for m in ("anyio", "leases", "pubsub") if m in sys.modules)
    print(json.dumps({"outcome": delivery.outcome, "loaded": loaded}), flush=True)


async def work(redis_url: str, prefix: str) -> None:
    """The worker process: runs the thread's agent until SIGTERM."""
    import signal as os_signal

    import anyio
    import redis.asyncio

    from pubsub import RedisStreamsPubSub
    from signals import Run, SignalRuntime

    recorder = redis.asyncio.Redis.from_url(redis_url)

    async def agent(run: Run) -> None:
        async for signal in run:
            await recorder.rpush(f"{prefix}:example:processed", signal.id)
            await run.ack(signal)

    async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, idle_wait_ms=300, recover_interval_ms=500,
    ):
        print("ready", flush=True)
        with anyio.open_signal_receiver(os_signal.SIGTERM) as stop:
            async for _ in stop:
                break
    await recorder.aclose()


def _sender(redis_url: str, prefix: str, index: int) -> tuple[str, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--send", str(index), "--redis-url", redis_url,
         "--key-prefix", prefix], capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    report = json.loads(out.splitlines()[-1])
    if report["loaded"]:
        raise SystemExit(f"the sender imported {report['loaded']}")
    return report["outcome"], (time.perf_counter() - started) * 1000


def _processed(redis_url: str, prefix: str) -> list[str]:
    import redis

    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        return list(client.lrange(f"{prefix}:example:processed", 0, -1))


def run(redis_url: str, senders: int) -> bool:
    prefix = f"example-sender-{uuid.uuid4().hex[:8]}"
    print("== part 1: two senders, no worker yet ==")
    for i in range(2):
        outcome, ms = _sender(redis_url, prefix, i)
        print(f"sender-{i}: send -> {outcome} ({ms:.0f} ms for the whole process)")
    print("== part 2: a worker starts ==")
    worker = subprocess.Popen(
        [sys.executable, __file__, "--work", "--redis-url", redis_url, "--key-prefix", prefix],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit("the worker did not start")
        print("worker: ready")
        print(f"== part 3: {senders - 2} more senders, one fresh process each ==")
        for i in range(2, senders):
            outcome, ms = _sender(redis_url, prefix, i)
            print(f"sender-{i}: send -> {outcome} ({ms:.0f} ms for the whole process)")
        deadline = time.monotonic() + 30
        while len(_processed(redis_url, prefix)) < senders and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    done = _processed(redis_url, prefix)
    print("worker: processed " + ", ".join(done))
    expected = {f"order-{i}" for i in range(senders)}
    ok = sorted(done) == sorted(expected)
    print(f"sent {senders}, processed {len(done)}, lost {len(expected - set(done))}: "
          f"{'OK' if ok else 'MISMATCH'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--senders", type=int, default=5)
    parser.add_argument("--send", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--key-prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.send is not None:
        asyncio.run(send_one(args.redis_url, args.key_prefix, args.send))
        return 0
    if args.work:
        import anyio

        anyio.run(work, args.redis_url, args.key_prefix)
        return 0
    if args.senders < 3:
        parser.error("--senders must be >= 3")
    from _redis import on_redis

    return on_redis(args.redis_url, lambda url: 0 if run(url, args.senders) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
