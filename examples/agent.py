"""A long-running agent that receives signals: the main example.

    python examples/agent.py                      # in memory, one process, no setup
    python examples/agent.py --trio               # the same on trio
    python examples/agent.py --redis-url URL      # the same on Redis (RedisStreamsPubSub)

It prints a transcript of one conversation thread:

1. a first signal finds the thread idle and **wakes** it: this process wins the lease, run #1
   starts;
2. follow-ups are **delivered** to that same run while it works;
3. a signal sent again with the same id is **deduplicated** (stored once, processed once);
4. a signal sent with ``if_active="queue"`` waits for the next run, which gets the lease by a
   **handoff** (``transfer_lease``: the thread is never free, the fencing token grows);
5. the summary lists every run, what it processed, and the lease operations in order.

The agent itself does not print: it reports each signal to ``main`` through a memory stream, so
the transcript's order is deterministic.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leases import AcquireResult, InMemoryLeaseProvider, LeaseProvider
from pubsub import InMemoryPubSub, PubSub
from signals import Delivery, InMemorySignalStore, Run, Signal, SignalRuntime

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

THREAD = "conversation-42"


class TracingLeases:
    """A lease provider that records acquire / transfer / release calls and delegates them."""

    def __init__(self, inner: LeaseProvider) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self._holders: set[str] = set()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        result = await self.inner.acquire_lease(key, owner, ttl_ms)
        if result.acquired and owner not in self._holders:  # not the keeper's idempotent re-acquire
            self._holders.add(owner)
            self.calls.append(("acquire", f"{owner} (token {result.token})"))
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        self.calls.append(("release", owner))
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ok = await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)
        if ok:
            self._holders.add(to_owner)
        self.calls.append(("transfer", f"{from_owner} -> {to_owner} ({'ok' if ok else 'failed'})"))
        return ok


@dataclass
class Seen:
    """One signal as the agent saw it."""

    run_id: str
    token: int | None
    signal: Signal


@dataclass
class Names:
    """Short, stable names for random run ids (run#1, run#2, ...)."""

    names: dict[str, str] = field(default_factory=dict)

    def __call__(self, run_id: str | None) -> str:
        if run_id is None:
            return "-"
        if run_id not in self.names:
            self.names[run_id] = f"run#{len(self.names) + 1}"
        return self.names[run_id]

    def rewrite(self, text: str) -> str:
        for run_id, name in self.names.items():
            text = text.replace(run_id, name)
        return text


def make_agent(report: MemoryObjectSendStream[Seen]) -> Any:
    async def agent(run: Run) -> None:
        async for signal in run:
            await report.send(Seen(run.run_id, run.token, signal))
            if signal.type == "task":
                return  # a one-shot task: this run is done once it is handled

    return agent


def text_of(signal: Signal) -> str:
    return json.dumps(signal.payload.get("text") if isinstance(signal.payload, dict) else None)


async def scenario(
    pubsub: PubSub, leases: TracingLeases, inbox: InMemorySignalStore | None, backend: str
) -> None:
    names = Names()
    processed: list[Seen] = []
    send_report, seen = anyio.create_memory_object_stream[Seen](100)
    runtime_kwargs: dict[str, Any] = {"inbox": inbox} if inbox is not None else {}
    print(f"== one agent, one thread ({backend}) ==")
    async with send_report, seen, SignalRuntime(
        pubsub=pubsub,
        agent=make_agent(send_report),
        leases=leases,
        lease_ttl_ms=5_000,
        idle_wait_ms=1_500,
        **runtime_kwargs,
    ) as runtime:

        async def send(label: str, signal: Signal, **policy: Any) -> Delivery:
            delivery = await runtime.send(THREAD, signal, **policy)
            run = names(delivery.run_id or delivery.owner)
            why = {
                "wake": f"this process won the lease: {run} starts",
                "deliver": f"to the active {run}",
                "queued": f"kept for the next run; {run} is active",
                "discarded": "dropped by policy",
                "rejected": "refused by policy",
            }[delivery.outcome]
            print(f"send    {label:<34} -> {delivery.outcome:<9} ({why})")
            return delivery

        async def expect(stream: MemoryObjectReceiveStream[Seen]) -> Seen:
            item = await stream.receive()
            if processed and processed[-1].run_id != item.run_id:
                before = processed[-1]
                print(
                    f"  lease handoff {names(before.run_id)} -> {names(item.run_id)} by "
                    f"transfer_lease: the thread was never free; token {before.token} -> "
                    f"{item.token}"
                )
            processed.append(item)
            token = "-" if item.token is None else item.token
            print(
                f"  agent {names(item.run_id)} (token {token}) got {item.signal.type:<6} "
                f"{text_of(item.signal)}"
            )
            return item

        first = await send("'hello' (thread idle)", Signal({"text": "hello"}))
        assert first.outcome == "wake", first
        await expect(seen)
        follow_up = Signal({"text": "and another thing"}, id="msg-2")
        await send("'and another thing' (run active)", follow_up)
        await expect(seen)
        again = await send("the same message again (same id)", follow_up)
        assert again.duplicate
        print(f"        duplicate id {again.signal_id!r}: nothing stored, processed once")
        await send(
            "'summarise' with if_active='queue'",
            Signal({"text": "summarise the conversation"}, type="task"),
            if_active="queue",
        )
        second = await expect(seen)
        assert second.run_id != first.run_id, "the queued signal must start a new run"
        await runtime.wait_idle(THREAD)
        print(f"  {names(second.run_id)} finished; the thread is idle again")
        ignored = await send(
            "'ping' with if_idle='discard'", Signal({"text": "ping"}), if_idle="discard"
        )
        assert ignored.outcome == "discarded"

    print("\n== summary ==")
    for run_id in names.names:
        texts = [text_of(s.signal) for s in processed if s.run_id == run_id]
        print(f"{names(run_id)} processed {len(texts)} signal(s): {', '.join(texts)}")
    ids = [s.signal.id for s in processed]
    print(f"signals processed: {len(ids)}, distinct ids: {len(set(ids))}")
    print("lease operations, in order:")
    for op, detail in leases.calls:
        print(f"  {op:<9} {names.rewrite(detail)}")
    owner = await leases.get_lease_owner(THREAD)
    print(f"lease owner now: {names(owner) if owner else 'none (released)'}")


def in_memory_parts() -> tuple[PubSub, TracingLeases, InMemorySignalStore]:
    return InMemoryPubSub(), TracingLeases(InMemoryLeaseProvider()), InMemorySignalStore()


async def main_async(redis_url: str | None) -> None:
    if redis_url is None:
        pubsub, leases, inbox = in_memory_parts()
        async with pubsub:
            await scenario(pubsub, leases, inbox, "in memory")
        return
    from pubsub import RedisStreamsPubSub

    prefix = f"example-agent-{uuid.uuid4().hex[:8]}"
    redis_pubsub = RedisStreamsPubSub(url=redis_url, key_prefix=prefix)
    async with redis_pubsub:
        await scenario(
            redis_pubsub, TracingLeases(redis_pubsub.get_lease_provider()), None,
            f"Redis, prefix {prefix}",
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="run on RedisStreamsPubSub at this URL")
    parser.add_argument("--logs", action="store_true", help="also show the library's info logs")
    parser.add_argument(
        "--trio", action="store_true", help="run on trio (in memory only: redis-py is asyncio-only)"
    )
    args = parser.parse_args(argv)
    if args.trio and args.redis_url:
        parser.error("--trio works with the in-memory backends only")
    # An application decides how structlog renders (the library never configures it): here,
    # warnings only unless --logs, so the transcript stays readable.
    level = logging.INFO if args.logs else logging.WARNING
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    anyio.run(main_async, args.redis_url, backend="trio" if args.trio else "asyncio")


if __name__ == "__main__":
    main()
