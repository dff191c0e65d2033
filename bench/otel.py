"""The cost of tracing and metrics, side by side in one run.

Routed signals in memory or on Redis (a worker runtime owns one thread; another runtime in the
same process sends to it; each signal stored, routed, handed to the agent, acknowledged), in
three configurations, each in a fresh process (OpenTelemetry's providers are process-global),
in interleaved rounds:

* ``disabled``: the library's telemetry switched off, as without the ``otel`` extra;
* ``api``: ``opentelemetry-api`` installed, no SDK configured (the default for most users);
* ``sdk``: the SDK with an in-memory span exporter and an in-memory metric reader.

    python bench/otel.py [--rounds 5] [--signals 2000] [--backend memory|redis]

Goals (docs/operations.md): ``sdk`` >= 0.8x of ``disabled``, ``api`` >= 0.98x.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve()
sys.path[0] = str(HERE.parent.parent)  # the checkout, not bench/ (bench/signals.py)
CONFIGS = ("disabled", "api", "sdk")

from bench._server import redis_url  # noqa: E402  (after the checkout is on the path)


def child(config: str, n: int, url: str) -> None:
    if config == "disabled":
        import signals._telemetry

        signals._telemetry.HAVE_OTEL = False
    elif config == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        if url == "floor":
            print(sdk_floor(n))
            return

    from pubsub import InMemoryPubSub, PubSub, RedisStreamsPubSub
    from signals import Run, SignalRuntime

    async def main() -> float:
        done = anyio.Event()
        seen = 0

        async def agent(run: Run) -> None:
            nonlocal seen
            async for signal in run:
                await run.ack(signal)
                seen += 1
                if seen > n:
                    done.set()

        ps: PubSub = (RedisStreamsPubSub(url=url, key_prefix=f"otel-bench-{os.getpid()}:")
                      if url else InMemoryPubSub())
        async with ps, SignalRuntime(
            pubsub=ps, agent=agent, idle_wait_ms=600_000, shutdown_timeout_ms=0
        ) as worker, SignalRuntime(pubsub=ps, agent=None) as sender:
            await worker.send("t", 0)  # the thread is active from here on
            start = time.perf_counter()
            for i in range(n):
                await sender.send("t", i)
            await done.wait()
            return n / (time.perf_counter() - start)

    print(anyio.run(main))


def sdk_floor(n: int) -> float:
    """Seconds per signal of the SDK calls alone that one routed signal makes through the
    library (two spans with their attributes, the trace context injected and extracted, five
    metric records), without the library: what tracing costs at the least."""
    from opentelemetry import context, metrics, propagate, trace

    tracer = trace.get_tracer("floor")
    meter = metrics.get_meter("floor")
    sent, consumed = meter.create_counter("a"), meter.create_counter("b")
    op, routing, process = (meter.create_histogram(x) for x in "cde")
    attrs = {"messaging.system": "signals", "messaging.operation.name": "send",
             "messaging.destination.name": "signals.thread"}
    span_attrs = {**attrs, "messaging.operation.type": "send", "messaging.message.id": "x" * 32,
                  "messaging.message.conversation_id": "t", "gen_ai.conversation.id": "t"}
    start = time.perf_counter()
    for _ in range(n):
        span = tracer.start_span("send", kind=trace.SpanKind.PRODUCER, attributes=span_attrs)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        span.end()
        op.record(0.001, attrs)
        sent.add(1, attrs)
        consumed.add(1, attrs)
        routing.record(0.001)
        parent = propagate.extract(carrier)
        span = tracer.start_span("process", context=parent, kind=trace.SpanKind.CONSUMER,
                                 attributes={**span_attrs, "signals.run_id": "r",
                                             "signals.attempt": 1})
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        process.record(0.001, attrs)
        span.end()
    return (time.perf_counter() - start) / n


def measure(config: str, n: int, url: str) -> float:
    out = subprocess.run([sys.executable, str(HERE), "child", config, str(n), url],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)})
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--signals", type=int, default=2000)
    parser.add_argument("--backend", choices=("memory", "redis"), default="memory")
    parser.add_argument("--redis-url", default=None, help="default: a redis-server started here")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with contextlib.ExitStack() as stack:
        url = (stack.enter_context(redis_url(args.redis_url)) if args.backend == "redis"
               else "")
        for r in range(args.rounds):
            order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
            for config in order:
                rates[config].append(measure(config, args.signals, url))
        floor = statistics.median(measure("sdk", args.signals, "floor")
                                  for _ in range(args.rounds))
    med = {c: statistics.median(v) for c, v in rates.items()}
    print(f"routed signals ({args.backend}), {args.signals} per round, "
          f"median of {args.rounds}:")
    for c in CONFIGS:
        print(f"  {c:9} {med[c]:8.0f}/s  (rounds {[round(x) for x in rates[c]]})  "
              f"x{med[c] / med['disabled']:.2f} of disabled")
    per_signal = 1 / med["disabled"]
    print(f"the SDK's own calls for one signal, without the library: {floor * 1e6:.0f} us "
          f"(a signal takes {per_signal * 1e6:.0f} us disabled): sdk can reach at most "
          f"x{per_signal / (per_signal + floor):.2f}")
    print("goals: api >= 0.98x, sdk >= 0.8x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        main()
