"""Signal routing vs raw pub/sub on a real Redis, measured side by side in one run.

An *owner* process (a child) runs a ``SignalRuntime`` whose agent holds the lease of one thread
and keeps its run open; it also subscribes to a raw ``RedisStreamsPubSub`` topic. This process is
the *non-owner* sender. Interleaved rounds measure, on the same server:

* latency, non-owner ``send()`` -> the owner's agent receives the signal (inbox append + doorbell
  + the owner's inbox read), p50/p99;
* latency, raw ``publish()`` -> the owner's handler, p50/p99;
* throughput on one thread: signals/s and raw events/s, ``--concurrency`` senders in a burst.

Latencies use ``time.monotonic_ns()``, which is one system-wide clock on Linux, so the two
processes' readings are comparable. Starts its own ``redis-server`` unless ``--redis-url``.

    python bench/signals.py [--redis-url URL] [--rounds 3] [--samples 200] [--burst 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import structlog

from pubsub import Event, RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime
from tests._redis_server import RedisServer, redis_server_binary

THREAD = "bench-thread"
RAW_TOPIC = "bench.raw"
REPORT_TIMEOUT_S = 60.0


# --- the owner process -----------------------------------------------------------------------


async def owner(redis_url: str, prefix: str) -> None:
    """Hold the thread, record arrival latencies, answer ``report`` control signals."""
    samples: dict[str, list[int]] = {"raw": [], "signal": []}
    last_ns: dict[str, int] = {"raw": 0, "signal": 0}

    async def on_raw(event: Event) -> None:
        now = time.monotonic_ns()
        samples["raw"].append(now - int(event.data["t"]))
        last_ns["raw"] = now

    async def agent(run: Run) -> None:
        async for signal in run:
            now = time.monotonic_ns()
            if signal.type == "bench":
                samples["signal"].append(now - int(signal.payload["t"]))
                last_ns["signal"] = now
                continue
            cmd = signal.payload["cmd"]
            if cmd == "stop":
                return
            if cmd == "report":
                kind, expect = signal.payload["kind"], int(signal.payload["expect"])
                with anyio.move_on_after(REPORT_TIMEOUT_S):
                    while len(samples[kind]) < expect:  # noqa: ASYNC110 (polls a counter)
                        await anyio.sleep(0.005)
                out = {"kind": kind, "samples": samples[kind], "last_ns": last_ns[kind]}
                samples[kind] = []
            else:  # "hello": the run is up and holds the lease
                out = {"ready": run.run_id, "token": run.token}
            print(json.dumps(out), flush=True)

    async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, idle_wait_ms=600_000
    ) as runtime:
        await pubsub.subscribe(RAW_TOPIC, on_raw)
        delivery = await runtime.send(THREAD, Signal({"cmd": "hello"}, type="control"))
        if delivery.outcome != "wake":
            raise SystemExit(f"owner did not win the thread: {delivery}")
        await runtime.wait_idle(THREAD)


# --- the sender (this process) ---------------------------------------------------------------


def _read_json(stream: IO[str]) -> dict[str, Any]:
    while True:
        line = stream.readline()
        if not line:
            raise RuntimeError("the owner process exited")
        if line.startswith("{"):
            return dict(json.loads(line))


class Bench:
    def __init__(self, pubsub: RedisStreamsPubSub, runtime: SignalRuntime, out: IO[str]) -> None:
        self.pubsub, self.runtime, self.out = pubsub, runtime, out

    async def _report(self, kind: str, expect: int) -> dict[str, Any]:
        await self.runtime.send(
            THREAD, Signal({"cmd": "report", "kind": kind, "expect": expect}, type="control")
        )
        report = await anyio.to_thread.run_sync(_read_json, self.out)
        if len(report["samples"]) < expect:
            raise RuntimeError(f"{kind}: {len(report['samples'])} of {expect} arrived")
        return report

    async def _one(self, kind: str) -> None:
        data = {"t": time.monotonic_ns()}
        if kind == "raw":
            await self.pubsub.publish(RAW_TOPIC, Event("bench", data))
        else:
            delivery = await self.runtime.send(THREAD, Signal(data, type="bench"))
            assert delivery.outcome == "deliver", delivery

    async def latency(self, kind: str, n: int, gap_s: float) -> list[int]:
        for _ in range(n):
            await self._one(kind)
            await anyio.sleep(gap_s)
        return list((await self._report(kind, n))["samples"])

    async def burst(self, kind: str, n: int, concurrency: int) -> tuple[float, float]:
        """(accepted/s at the senders, handled/s at the owner) for ``n`` messages."""
        per_task = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
        start = time.monotonic_ns()

        async def worker(count: int) -> None:
            for _ in range(count):
                await self._one(kind)

        async with anyio.create_task_group() as tg:
            for count in per_task:
                tg.start_soon(worker, count)
        sent = time.monotonic_ns()
        report = await self._report(kind, n)
        return n / ((sent - start) / 1e9), n / ((int(report["last_ns"]) - start) / 1e9)


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


async def _never(run: Run) -> None:  # the sender never owns the thread
    raise AssertionError(f"the sender won the thread: {run.run_id}")


async def sender(
    redis_url: str, prefix: str, owner_proc: subprocess.Popen[str], args: argparse.Namespace
) -> None:
    assert owner_proc.stdout is not None
    try:
        ready = await anyio.to_thread.run_sync(_read_json, owner_proc.stdout)
        print(f"owner process pid {owner_proc.pid} holds {THREAD!r} (token {ready['token']})")
        async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
            pubsub=pubsub, agent=_never
        ) as runtime:
            bench = Bench(pubsub, runtime, owner_proc.stdout)
            lat: dict[str, list[int]] = {"raw": [], "signal": []}
            rate: dict[str, list[float]] = {"raw": [], "signal": []}
            accepted: dict[str, list[float]] = {"raw": [], "signal": []}
            await bench.latency("raw", 20, 0.001)  # warm-up: connections, scripts
            await bench.latency("signal", 20, 0.001)
            for r in range(args.rounds):
                order = ("raw", "signal") if r % 2 == 0 else ("signal", "raw")
                for kind in order:
                    lat[kind] += await bench.latency(kind, args.samples, args.gap_ms / 1000)
                for kind in reversed(order):
                    sent_rate, handled_rate = await bench.burst(kind, args.burst, args.concurrency)
                    accepted[kind].append(sent_rate)
                    rate[kind].append(handled_rate)
                print(f"round {r + 1}/{args.rounds}: signals handled/s {rate['signal'][-1]:,.0f}"
                      f", raw events handled/s {rate['raw'][-1]:,.0f}")
            await runtime.send(THREAD, Signal({"cmd": "stop"}, type="control"))
    finally:
        try:
            owner_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            owner_proc.kill()
            owner_proc.wait()
    _print_results(lat, rate, accepted, args)


def _print_results(
    lat: dict[str, list[int]],
    rate: dict[str, list[float]],
    accepted: dict[str, list[float]],
    args: argparse.Namespace,
) -> None:
    p = {k: (_pct(v, 0.50), _pct(v, 0.99)) for k, v in lat.items()}
    r = {k: statistics.median(v) for k, v in rate.items()}
    a = {k: statistics.median(v) for k, v in accepted.items()}
    print(f"\n{args.rounds} interleaved rounds; latency n={len(lat['signal'])} per path "
          f"(one at a time, {args.gap_ms} ms apart); bursts of {args.burst} with "
          f"{args.concurrency} concurrent senders (median of rounds)")
    print(f"{'':28}{'p50 ms':>9}{'p99 ms':>9}{'handled/s':>11}{'accepted/s':>12}")
    for kind, label in (("raw", "raw publish -> handler"), ("signal", "signal send -> owner run")):
        print(f"{label:28}{p[kind][0]:>9.3f}{p[kind][1]:>9.3f}{r[kind]:>11,.0f}{a[kind]:>12,.0f}")
    print("(accepted/s: publish()/send() calls returned per second at the senders; handled/s:"
          " received by the owner's handler/run, first send to last arrival)")
    print(f"ratio signal/raw: p50 latency x{p['signal'][0] / p['raw'][0]:.2f}, "
          f"p99 latency x{p['signal'][1] / p['raw'][1]:.2f}, "
          f"throughput x{r['signal'] / r['raw']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200, help="latency samples per round")
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--burst", type=int, default=1000, help="messages per throughput round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--owner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--key-prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    structlog.configure(  # warnings only, on stderr: the owner's stdout carries its reports
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if args.owner:
        anyio.run(owner, args.redis_url, args.key_prefix, backend="asyncio")
        return
    prefix = f"bench-signals-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        url = args.redis_url
        if url is None:
            binary = redis_server_binary()
            if binary is None:
                raise SystemExit("redis-server is not installed; pass --redis-url")
            url = stack.enter_context(RedisServer(binary)).url
        print(f"redis: {url}")
        owner_proc = subprocess.Popen(
            [sys.executable, __file__, "--owner", "--redis-url", url, "--key-prefix", prefix],
            stdout=subprocess.PIPE,
            text=True,
        )
        anyio.run(sender, url, prefix, owner_proc, args, backend="asyncio")


if __name__ == "__main__":
    main()
