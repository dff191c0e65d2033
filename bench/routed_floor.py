"""The floors of the routed-signal rows: what the guarantees cost with none of our layers.

``bench/signals.py`` compares a routed signal with a raw hand-off that keeps no record. This
bench adds, side by side in interleaved rounds, the same hand-off doing only the work that
docs/guarantees.md requires of every routed signal, written by hand with nothing of ours:

* **memory**: ``ours`` (``bench.signals.routed`` over ``InMemoryPubSub``); ``floor``: the raw
  hand-off (an anyio memory object stream, unbuffered) plus, in plain Python and dicts, the
  bookkeeping a routed signal must leave: a validated thread key, an id and a time, the
  signal's JSON (its size is bounded and it is what is stored), the duplicate check, the
  receipt (``pending``, then ``processed``) in a bounded window, the pending entry (marked
  taken at the hand-out, gone at the ack), the owner's lease read on send and its token
  checked on ack, the ``signal.received`` and ``signal.acked`` parts in a bounded stream, and
  the send's outcome; ``raw``: the hand-off alone. What it leaves out is every feature beyond
  a plain routed signal: priorities, lanes, delays, caps, attempts, logs, telemetry.
  ``api floor``: the same floor with the library's own value types where the API has them:
  the :class:`Signal` a caller passes to ``send`` (its id, time and JSON made by it) and the
  :class:`Delivery` that ``send`` returns. ``no record``: ours, over an in-memory store that
  keeps no record (no entry, receipt, part or duplicate check: a routed signal goes straight
  to the run with its notice, an ack settles nothing): what the runtime's own layers cost
  (``send``, the notice, the run's hand-out and ack), with none of the store's bookkeeping.
* **Redis**: ``ours`` (``bench.signals.routed`` over ``RedisStreamsPubSub``); ``floor``: the
  design's two scripts and its notice through bare redis-py clients (whose connections write
  and pack commands as the library's do): a sender calls the route script
  with the arguments a real ``send`` passed (a new signal id each time), a raw subscriber
  reads the notice that carries the signal, and calls the settle script a real ``ack``
  passed; ``raw``: XADD, XREADGROUP, XACK (``bench.signals.raw_streams``).

A row's goal is out of reach for this design when its ``floor`` is already below it.

    python bench/routed_floor.py [--redis-url URL] [--rounds 4] [--signals 2000]
        [--backends memory,redis]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import redis.asyncio
import structlog

from _signal_leases.aio import checkpoint
from _signal_leases.encoding import random_id
from _signal_leases.redis.pools import quick_writes
from bench._server import redis_url
from bench.signals import memory_stream, raw_streams, routed
from leases import resolve_lease_provider
from pubsub import InMemoryPubSub, RedisStreamsPubSub
from signals import (
    Delivery,
    EntryMode,
    InMemorySignalStore,
    Receipt,
    RedisSignalStore,
    Run,
    Signal,
    SignalRuntime,
)
from signals.kit import (
    NO_LIMITS,
    Accepted,
    Limits,
    Notice,
    Routed,
    RunRef,
    decode_entry,
    run_runtime,
)

Bench = Callable[[int], Awaitable[float]]
_KEY = re.compile(r"[A-Za-z0-9_.:@/-]{1,200}\Z")


@dataclass(frozen=True, slots=True)
class _Signal:
    id: str
    type: str
    payload: Any
    created_at: float


async def memory_floor(n: int, *, api: bool = False) -> float:
    """The raw hand-off plus the least bookkeeping a routed signal must leave (see above);
    with ``api``, the signal is the library's own :class:`Signal` (what a caller passes to
    ``send``: its id, time and JSON made by it) and the outcome its :class:`Delivery` (what
    ``send`` returns)."""
    receipts: dict[str, tuple[str, float]] = {}
    entries: dict[str, tuple[int, str, str]] = {}
    parts: deque[tuple[str, str, str, str | None]] = deque(maxlen=10_000)
    leases = {"bench": ("run-1", 7)}
    send, receive = anyio.create_memory_object_stream[Any](0)
    seq = 0
    outcome: list[Any] = []

    async def agent() -> None:
        async with receive:
            async for signal in receive:  # handed out to the run, then acknowledged
                seq, body, _state = entries[signal.id]
                entries[signal.id] = (seq, body, "taken")
                if leases["bench"] != ("run-1", 7):  # the ack's fencing token
                    raise RuntimeError("lease lost")
                del entries[signal.id]
                receipts[signal.id] = ("processed", time.time())
                parts.append(("signal.acked", "run-1", signal.id, None))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent)
        async with send:
            for i in range(n):
                key = "bench"
                if not _KEY.match(key):
                    raise ValueError("thread_key")
                if api:
                    signal: Any = Signal(i, type="bench")
                    body = signal.encode()
                else:
                    signal = _Signal(os.urandom(16).hex(), "bench", i, time.time())
                    body = json.dumps({"id": signal.id, "type": signal.type,
                                       "payload": signal.payload,
                                       "created_at": signal.created_at}, separators=(",", ":"))
                if len(body) > 1 << 20 or signal.id in receipts:
                    raise ValueError("signal")
                seq += 1
                entries[signal.id] = (seq, body, "ready")
                receipts[signal.id] = ("pending", signal.created_at)
                if len(receipts) > 10_000:  # the dedup window is bounded
                    del receipts[next(iter(receipts))]
                owner, _token = leases[key]
                parts.append(("signal.received", owner, signal.id, '{"attempt":1}'))
                await send.send(signal)
                if api:
                    outcome.append(Delivery("deliver", signal.id, key, owner))
                else:
                    outcome.append(("deliver", signal.id, key, owner))  # what send returns
                outcome.clear()
    return n / (time.perf_counter() - start)


class _RedisFloor:
    """The route and settle scripts of one real ``send`` and ``ack``, replayed bare."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store: RedisSignalStore | None = None
        self.calls: dict[str, list[Any]] = {}
        self.lease: list[Any] = []
        self.held: list[str] = []

    async def capture(self, pubsub: RedisStreamsPubSub) -> None:
        """Record the arguments of one routed signal's two scripts (thread ``floor``)."""
        run_script = RedisSignalStore._run
        done = anyio.Event()

        async def spy(store: RedisSignalStore, name: str, thread_key: str, args: Any,
                      what: str, *, runtime_id: str | None = None) -> list[Any]:
            if thread_key == "floor" and name in ("accept", "settle") and name not in self.calls:
                self.store = store
                self.calls[name] = list(args)
            return await run_script(store, name, thread_key, args, what, runtime_id=runtime_id)

        async def agent(run: Run) -> None:
            async for signal in run:
                await run.ack(signal)
                if signal.id == "floor-capture":
                    done.set()

        RedisSignalStore._run = spy  # type: ignore[method-assign,assignment]
        try:
            async with SignalRuntime(pubsub=pubsub, agent=agent, idle_wait_ms=600_000,
                                     shutdown_timeout_ms=0) as worker, \
                    SignalRuntime(pubsub=pubsub, agent=None) as sender:
                await worker.send("floor", "hello")
                await anyio.sleep(0.2)
                self.calls.clear()
                await sender.send("floor", Signal(0, id="floor-capture", type="bench"))
                with anyio.fail_after(10):
                    await done.wait()
                await anyio.sleep(0.1)
                assert self.store is not None
                client, keys = self.store.client, self.store._keys("floor", None)
                raw: Any = await client.hget(keys[14], "session")
                session = raw.decode() if raw else ""
                self.held = [keys[14], keys[15]]  # the lease, its fence, the owner's session
                if session:
                    self.held.append(f"{self.store._header('floor')[2]}{{{session}}}")
                self.lease = [await client.dump(k) for k in self.held]
        finally:
            RedisSignalStore._run = run_script  # type: ignore[method-assign]
        if set(self.calls) != {"accept", "settle"}:
            raise SystemExit(f"captured {sorted(self.calls)}: the scripts' names changed")
        accept, settle = self.calls["accept"], self.calls["settle"]
        if accept[0] != "floor-capture" or "floor-capture" not in settle:
            raise SystemExit("the scripts' arguments changed: see _RedisFloor.capture")

    async def __call__(self, n: int) -> float:
        """Signals per second: bare route script -> raw notice subscriber -> bare settle."""
        store = self.store
        assert store is not None
        sender, worker, listening = (_client(self.url) for _ in range(3))
        listener = listening.pubsub()
        accept, settle = store._lua["accept"], store._lua["settle"]
        keys, header = store._keys("floor", None), store._header("floor")
        route_args, settle_args = self.calls["accept"], self.calls["settle"]
        sid_at = settle_args.index("floor-capture")
        for k, value in zip(self.held, self.lease, strict=True):  # the captured run owns it
            await sender.restore(k, 600_000, value, replace=True)
        await listener.psubscribe(store.keys.notice_prefix + "*")
        got = 0

        async def consume() -> None:  # a notice: kind, thread, run, reason, "<entry> <body>"
            nonlocal got
            while got < n:
                message = await listener.get_message(timeout=1)
                if message is None or message["type"] != "pmessage":
                    continue
                kind, _key, _run, _reason, carried = message["data"].split(b"\n", 4)
                if kind != b"signal" or not carried:
                    continue
                entry_id, body = carried.split(b" ", 1)
                argv = list(settle_args)
                argv[sid_at - 1], argv[sid_at] = entry_id.decode(), json.loads(body)["id"]
                await settle(keys=keys, args=[*header, *argv], client=worker)
                got += 1

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            for i in range(n):
                sid = f"f{uuid.uuid4().hex[:12]}"
                body = Signal(i, id=sid, type="bench").encode()
                await accept(keys=keys, args=[*header, sid, body, *route_args[2:]],
                             client=sender)
        rate = n / (time.perf_counter() - start)
        await listener.aclose()
        for client in (sender, worker, listening):
            await client.aclose()
        return rate


def _client(url: str) -> redis.asyncio.Redis:
    """A bare redis-py client whose connections write and pack commands as the library's do
    (``_signal_leases.redis.pools.quick_writes``): the floor measures the design, not
    redis-py's per-command costs that the library avoids."""
    client = redis.asyncio.Redis.from_url(url)
    pool = client.connection_pool
    pool.connection_class = quick_writes(pool.connection_class)
    return client


async def compare(name: str, benches: dict[str, Bench], rounds: int, n: int) -> None:
    for bench in benches.values():
        await bench(min(n, 200))  # warm up
    rates: dict[str, list[float]] = {label: [] for label in benches}
    order = list(benches)
    for r in range(rounds):
        for label in order if r % 2 == 0 else reversed(order):
            rates[label].append(await benches[label](n))
    raw = rates["raw"]
    print(f"{name}:")
    for label, values in rates.items():
        ratios = [x / y for x, y in zip(values, raw, strict=True)]
        print(f"  {label:9s} {statistics.median(values):8.0f}/s  x{statistics.median(ratios):.2f}"
              f" of raw [min {min(ratios):.2f}, max {max(ratios):.2f}]")


async def main(url: str, rounds: int, n: int, which: str) -> None:
    if "memory" in which:
        await _memory(rounds, n)
    if "redis" in which:
        await _redis(url, rounds, n)


class _KeepsNothing(InMemorySignalStore):
    """The in-memory store with its records left out (the ``no record`` contender): a signal
    sent to a thread whose run holds it goes to that run with its notice, as the store's own
    carry sends it, and stores nothing; an ack settles nothing. The first signal, which wakes
    the thread, is the store's own."""

    async def route(self, thread_key: str, signal: Signal, mode: EntryMode, *,
                    claim: Any, sender: str | None, wake_workers: bool,
                    limits: Limits = NO_LIMITS, interrupt: bool = False) -> Routed:
        assert self.leases is not None
        held = self.leases.table.holder(thread_key, self.leases.clock())
        if held is None or claim is not None:
            return await super().route(thread_key, signal, mode, claim=claim, sender=sender,
                                       wake_workers=wake_workers, limits=limits,
                                       interrupt=interrupt)
        await checkpoint()
        owner, entry_id = held[0], random_id()
        entry = decode_entry(entry_id, signal.encode(), "deliver", 1, state="carried",
                             holder=owner, signal=signal)
        self._notify(run_runtime(owner), Notice("signal", thread_key, owner, entry=entry))
        return Routed(Accepted("fresh", entry_id, Receipt(signal.id, "pending")), owner,
                      carried=True)

    async def settle(self, thread_key: str, run: RunRef, *, acks: Any = (), failed: Any = (),
                     returned: Any = (), error: str | None = None) -> bool:
        if failed or returned:
            return await super().settle(thread_key, run, acks=acks, failed=failed,
                                        returned=returned, error=error)
        await checkpoint()
        return True


async def _no_record(pubsub: InMemoryPubSub, n: int) -> float:
    leases = resolve_lease_provider(pubsub)
    store = _KeepsNothing(leases=leases)  # type: ignore[arg-type]
    return await routed(pubsub, n, inbox=store, leases=leases)


async def _memory(rounds: int, n: int) -> None:
    async with InMemoryPubSub() as memory_pubsub:
        await compare("memory, one thread", {
            "ours": lambda k: routed(memory_pubsub, k),
            "no record": lambda k: _no_record(memory_pubsub, k), "floor": memory_floor,
            "api floor": lambda k: memory_floor(k, api=True), "raw": memory_stream}, rounds, n)


async def _redis(url: str, rounds: int, n: int) -> None:
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}"
    async with RedisStreamsPubSub(url=url, key_prefix=prefix) as redis_pubsub:
        floor = _RedisFloor(url)
        await floor.capture(redis_pubsub)
        await compare("Redis, one thread", {
            "ours": lambda k: routed(redis_pubsub, k), "floor": floor,
            "raw": lambda k: raw_streams(url, k)}, rounds, n)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--signals", type=int, default=2000)
    parser.add_argument("--backends", default="memory,redis")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with redis_url(args.redis_url) as url:
        print(f"redis: {url}; {args.rounds} interleaved rounds of {args.signals} signals")
        anyio.run(main, url, args.rounds, args.signals, args.backends, backend="asyncio")


if __name__ == "__main__":
    cli()
