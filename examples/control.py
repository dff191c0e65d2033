"""Control a thread from another runtime: pending, cancel, interrupt, abort, threads, dead letters.

    python examples/control.py                    # in memory, one process
    python examples/control.py --redis-url URL    # the same calls on Redis

A worker runs an agent that takes a while per signal; a *control* runtime (``agent=None``,
as an admin tool or a web handler would be) lists what is queued, withdraws a queued signal,
interrupts the running step with a correction, aborts a run, lists the threads, and shows what
happened to a poison signal.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pubsub import InMemoryPubSub, PubSub, RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime


async def agent(run: Run) -> None:
    if run.interrupted:
        print(f"  [worker] a new run after an interrupt gets: {[s.id for s in run.unacked]}")
    async for signal in run:
        if signal.payload == "poison":
            raise ValueError("cannot handle this one")
        await run.emit({"working_on": signal.id})
        await anyio.sleep(0.3 if signal.id != "long" else 30)  # a long step
        await run.ack(signal, result={"done": signal.id})


async def scenario(pubsub: PubSub) -> None:
    async with SignalRuntime(pubsub=pubsub, agent=agent, max_attempts=2) as worker, \
            SignalRuntime(pubsub=pubsub, agent=None) as control:
        await worker.send("t", Signal("first step", id="step-1"))
        for n in (2, 3):
            await control.send("t", Signal(f"step {n}", id=f"step-{n}"), if_active="queue")
        pending = await control.pending("t")
        print("pending:", [(s.id, s.mode, s.attempt) for s in pending])
        print("cancel step-3:", await control.cancel("t", ["step-3"]))
        print("interrupt with a correction:", (await control.send(
            "t", Signal("no, do this instead", id="fix"), if_active="interrupt")).outcome)
        await anyio.sleep(0.2)
        info = await control.thread("t")
        print(f"thread t: owner {info.owner}, pid {info.pid}, pending {info.pending}")
        await worker.wait_idle()

        await worker.send("t", Signal("takes forever", id="long"))
        await anyio.sleep(0.1)
        print("threads now:", [(i.thread_key, i.owner is not None)
                               for i in await control.threads()])
        print("abort the long run:", await control.abort("t", reason="taking too long"))
        await anyio.sleep(0.1)
        kinds = [(p.kind, p.data) async for p in control.stream("t", follow=False)
                 if p.kind == "run.cancelled"]
        print("stream says:", kinds[-1])
        print("clear what is left:", await control.abort("t", clear_pending=True) or "no run")

        await worker.send("poisoned", Signal("poison", id="bad"))
        await worker.wait_idle()
        receipt = await control.receipt("poisoned", "bad")
        assert receipt is not None
        print(f"poison signal: {receipt.status} ({receipt.error})")
        print("dead letters:", [(d.signal.id, d.attempts) for d in
                                await control.dead_letters("poisoned")])
        print("purged:", await control.purge_dead_letters("poisoned"))


async def main_async(redis_url: str | None) -> None:
    if redis_url is None:
        async with InMemoryPubSub() as pubsub:
            await scenario(pubsub)
        return
    prefix = f"example-control-{uuid.uuid4().hex[:8]}"
    async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as redis_pubsub:
        await scenario(redis_pubsub)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    anyio.run(main_async, args.redis_url, backend="asyncio")


if __name__ == "__main__":
    main()
