"""Short-lived "invocations" (think: serverless functions) signal one thread and exit.

    python examples/serverless.py [--redis-url URL] [--invocations N]

Each invocation is its own OS process: it sends one signal to the thread and exits as soon as
``send()`` returns, unless it won the lease (outcome ``wake``): then it runs the agent until the
thread's inbox is empty, and exits. Invocations start one after another while the winner works,
so later ones find the thread owned and leave their signal in the durable inbox.

Part 2 shows the crash case: the winning invocation is killed (SIGKILL, like a platform timeout)
in the middle of its run. Its lease expires after the TTL, and the next invocation finds the
thread idle, wakes it, and processes every pending signal, including the one the killed run was
working on (at-least-once). No signal is lost in either part.

Without ``--redis-url`` it starts a local ``redis-server`` (when one is on ``PATH``).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal as os_signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LEASE_TTL_MS = 1_000


def processed_key(prefix: str, thread: str) -> str:
    return f"{prefix}:example:{thread}:processed"


def gate_key(prefix: str, thread: str) -> str:
    return f"{prefix}:example:{thread}:gate"


async def invocation(
    redis_url: str, prefix: str, thread: str, index: int, work_s: float, gate: bool
) -> None:
    """One invocation: send, then exit (or run the agent if this invocation won)."""
    import redis.asyncio

    from pubsub import RedisStreamsPubSub
    from signals import Run, Signal, SignalRuntime

    recorder = redis.asyncio.Redis.from_url(redis_url)

    async def agent(run: Run) -> None:
        wait_for_gate = gate
        async for sig in run:
            print(json.dumps({"event": "working", "signal_id": sig.id}), flush=True)
            while wait_for_gate and not await recorder.exists(gate_key(prefix, thread)):  # noqa: ASYNC110
                await anyio.sleep(0.02)  # a long first task, until the demo says "done"
            wait_for_gate = False
            await anyio.sleep(work_s)
            record = {"signal_id": sig.id, "by": f"invocation-{index}", "run_id": run.run_id}
            await recorder.rpush(processed_key(prefix, thread), json.dumps(record))

    try:
        async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, lease_ttl_ms=LEASE_TTL_MS, idle_wait_ms=300
        ) as runtime:
            sig = Signal({"n": index}, id=f"{thread}-signal-{index}")
            delivery = await runtime.send(thread, sig)
            print(json.dumps({"event": "sent", "outcome": delivery.outcome}), flush=True)
            # Leaving the block: a loser has nothing running and exits now; the winner's
            # runtime waits for its run chain to drain the inbox.
    finally:
        await recorder.aclose()


def _spawn(
    redis_url: str, prefix: str, thread: str, index: int, work_s: float, gate: bool = False
) -> Any:
    return subprocess.Popen(
        [sys.executable, __file__, "--invocation", str(index), "--redis-url", redis_url,
         "--key-prefix", prefix, "--thread", thread, "--work-s", str(work_s)]
        + (["--gate"] if gate else []),
        stdout=subprocess.PIPE,
        text=True,
    )


def _events(proc: Any) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=60)
    if proc.returncode not in (0, -os_signal.SIGKILL):
        raise RuntimeError(f"invocation exited with {proc.returncode}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _outcome(events: list[dict[str, Any]]) -> str:
    return next((e["outcome"] for e in events if e["event"] == "sent"), "killed before send")


def _processed(redis_url: str, prefix: str, thread: str) -> list[dict[str, Any]]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(r) for r in client.lrange(processed_key(prefix, thread), 0, -1)]
    finally:
        client.close()


def _read_sent_and_working(proc: Any) -> tuple[str, str]:
    """Outcome of the winner's send and the id of the signal its agent works on (any order)."""
    seen: dict[str, dict[str, Any]] = {}
    while len(seen) < 2:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("invocation exited early")
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        seen[event["event"]] = event
    return seen["sent"]["outcome"], seen["working"]["signal_id"]


def part1(redis_url: str, prefix: str, n: int) -> bool:
    thread = "thread-a"
    print(f"== part 1: {n} invocations, one after another, each sends one signal ==")
    winner = _spawn(redis_url, prefix, thread, 0, work_s=0.05, gate=True)
    outcome, working = _read_sent_and_working(winner)
    print(f"invocation-0: send -> {outcome}")
    print(f"invocation-0: working on {working} (a long task)")
    for i in range(1, n):  # one after another: each exits right after its send()
        outcome = _outcome(_events(_spawn(redis_url, prefix, thread, i, work_s=0.05)))
        print(f"invocation-{i}: send -> {outcome} (exited right after send)")
    import redis

    with redis.Redis.from_url(redis_url) as client:
        client.set(gate_key(prefix, thread), 1)  # let the long task finish
    _events(winner)
    print("invocation-0: exited after its run drained the inbox")
    done = _processed(redis_url, prefix, thread)
    for rec in done:
        print(f"  processed {rec['signal_id']} by {rec['by']}")
    ids = [rec["signal_id"] for rec in done]
    ok = sorted(ids) == sorted(f"{thread}-signal-{i}" for i in range(n))
    print(f"sent {n}, processed {len(ids)}, lost {n - len(set(ids))}: {'OK' if ok else 'MISMATCH'}")
    return ok


def part2(redis_url: str, prefix: str, n: int) -> bool:
    thread = "thread-b"
    print(f"\n== part 2: the winner is killed mid-run; {n} invocations in all ==")
    winner = _spawn(redis_url, prefix, thread, 0, work_s=30.0)  # far longer than we wait
    outcome, working = _read_sent_and_working(winner)
    print(f"invocation-0: send -> {outcome}")
    print(f"invocation-0: working on {working} (it will be killed)")
    for i in range(1, n - 1):
        outcome = _outcome(_events(_spawn(redis_url, prefix, thread, i, work_s=0.05)))
        print(f"invocation-{i}: send -> {outcome} (invocation-0 holds the lease)")
    winner.send_signal(os_signal.SIGKILL)
    _events(winner)
    print("invocation-0: SIGKILL (mid-run: its signal was never committed)")
    time.sleep(LEASE_TTL_MS / 1000 + 0.3)
    print(f"(waited {LEASE_TTL_MS} ms + margin: the dead owner's lease expired)")
    last = _spawn(redis_url, prefix, thread, n - 1, work_s=0.05)
    print(f"invocation-{n - 1}: send -> {_outcome(_events(last))}, ran and exited")
    done = _processed(redis_url, prefix, thread)
    for rec in done:
        print(f"  processed {rec['signal_id']} by {rec['by']}")
    ids = {rec["signal_id"] for rec in done}
    expected = {f"{thread}-signal-{i}" for i in range(n)}
    ok = ids == expected
    print(f"sent {n}, processed {len(ids)} distinct, lost {len(expected - ids)}: "
          f"{'OK' if ok else 'MISMATCH'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--invocations", type=int, default=4)
    parser.add_argument("--invocation", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--key-prefix", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--thread", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work-s", type=float, default=0.1, help=argparse.SUPPRESS)
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Applications configure structlog (the library never does): warnings only, on stderr, so
    # the children's stdout carries just their JSON reports.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if args.invocation is not None:
        anyio.run(invocation, args.redis_url, args.key_prefix, args.thread, args.invocation,
                  args.work_s, args.gate)
        return 0
    if args.invocations < 3:
        parser.error("--invocations must be >= 3")

    def run(url: str) -> int:
        prefix = f"example-sls-{uuid.uuid4().hex[:8]}"
        ok = part1(url, prefix, args.invocations) & part2(url, prefix, args.invocations)
        print("\nOK: no signal lost" if ok else "\nMISMATCH")
        return 0 if ok else 1

    from _redis import on_redis

    return on_redis(args.redis_url, run)


if __name__ == "__main__":
    raise SystemExit(main())
