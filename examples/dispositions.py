"""Each signal says how it lands: a coding agent's inputs, by priority and lane.

While the user's thread is paused (say, the agent is being reconfigured), inputs pile up:

* CI notifications at low priority (``priority=-1``): they wait behind everything else;
* the browser page the user is on, in a ``browser`` lane with ``merge="supersede"``: only the
  latest page matters, and the same page again (same ``cache_key``) stores nothing;
* keystrokes in a ``typing`` lane with ``merge="coalesce"``: folded into one signal by the
  runtime's reducer for the lane, every keystroke kept;
* a person's message at high priority (``priority=10``): it jumps the queue.

Then the thread is resumed and the agent gets them in that order. The runtime caps each
thread at 10 pending signals (``overflow="drop_oldest"``: CI noise pushes out the oldest CI
notification, the lowest priority, never the person's message).

    python examples/dispositions.py                 # in memory
    python examples/dispositions.py --sqlite FILE   # durable, in a SQLite file
    python examples/dispositions.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from pubsub import InMemoryPubSub, PubSub, RedisStreamsPubSub, SQLitePubSub
from signals import Run, Signal, SignalRuntime

THREAD = "user-7"


def fold_typing(signals: list[Signal]) -> dict[str, Any]:
    """The ``typing`` lane's reducer: every keystroke, in order, as one payload."""
    return {"text": "".join(s.payload["key"] for s in signals)}


async def agent(run: Run) -> None:
    async for signal in run:
        folded = f"  (folds {', '.join(signal.folded)})" if signal.folded else ""
        print(f"  agent got {signal.type:8} priority {signal.priority:>3}  "
              f"{signal.payload}{folded}")
        await run.ack(signal, result={"seen": True})


@contextlib.asynccontextmanager
async def open_pubsub(args: argparse.Namespace) -> AsyncIterator[PubSub]:
    pubsub: Any
    if args.redis_url:
        pubsub = RedisStreamsPubSub(url=args.redis_url, key_prefix=f"dispositions-{id(args)}")
    elif args.sqlite:
        pubsub = SQLitePubSub(args.sqlite)
    else:
        pubsub = InMemoryPubSub()
    async with pubsub:
        yield pubsub


async def main(args: argparse.Namespace) -> None:
    async with open_pubsub(args) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, reducers={"typing": fold_typing},
        max_pending_per_thread=10, overflow="drop_oldest",
    ) as runtime:
        await runtime.pause(THREAD)
        print(f"paused {THREAD!r}: inputs wait")

        async def send(signal: Signal) -> None:
            delivery = await runtime.send(THREAD, signal)
            extra = ""
            if delivery.superseded:
                extra = f", supersedes {', '.join(delivery.superseded)}"
            if delivery.dropped:
                extra += f", drops {', '.join(delivery.dropped)}"
            print(f"  send {signal.id:10} -> {delivery.outcome}{extra}")

        for n in range(6):  # CI noise: low priority
            await send(Signal({"build": n, "status": "failed" if n == 4 else "ok"},
                              type="ci", id=f"ci-{n}", priority=-1))
        for n, page in enumerate(("/docs", "/pricing", "/pricing")):  # the same page twice
            await send(Signal({"url": page}, type="browser", id=f"page-{n}", lane="browser",
                              merge="supersede", cache_key=page))
        for i, key in enumerate("fix"):
            await send(Signal({"key": key}, type="typing", id=f"key-{i}", lane="typing",
                              merge="coalesce"))
        await send(Signal({"text": "why did build 4 fail?"}, type="user", id="msg-1",
                          priority=10))
        pending = await runtime.pending(THREAD)
        print(f"{len(pending)} pending (the cap is 10); resuming {THREAD!r}")
        await runtime.resume(THREAD)
        await runtime.wait_idle()
        for signal_id in ("page-0", "ci-0", "key-1", "msg-1"):
            receipt = await runtime.receipt(THREAD, signal_id)
            assert receipt is not None
            by = f" by {receipt.superseded_by}" if receipt.superseded_by else ""
            print(f"receipt of {signal_id}: {receipt.status}{by}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--redis-url", default=None)
    where.add_argument("--sqlite", default=None, metavar="FILE")
    anyio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
