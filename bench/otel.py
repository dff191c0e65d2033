"""The cost of tracing and metrics, side by side in one run.

Routed signals in memory (a worker runtime owns one thread; another runtime in the same
process sends to it; each signal stored, routed, handed to the agent, acknowledged), in three
configurations, each in a fresh process (OpenTelemetry's providers are process-global), in
interleaved rounds:

* ``disabled``: the library's telemetry switched off, as without the ``otel`` extra;
* ``api``: ``opentelemetry-api`` installed, no SDK configured (the default for most users);
* ``sdk``: the SDK with an in-memory span exporter and an in-memory metric reader.

    python bench/otel.py [--rounds 5] [--signals 2000]

Goals (docs/operations.md): ``sdk`` >= 0.8x of ``disabled``, ``api`` >= 0.98x.
"""

from __future__ import annotations

import argparse
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


def child(config: str, n: int) -> None:
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

    from pubsub import InMemoryPubSub
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

        async with InMemoryPubSub() as ps, SignalRuntime(
            pubsub=ps, agent=agent, idle_wait_ms=600_000, shutdown_timeout_ms=0
        ) as worker, SignalRuntime(pubsub=ps, agent=None) as sender:
            await worker.send("t", 0)  # the thread is active from here on
            start = time.perf_counter()
            for i in range(n):
                await sender.send("t", i)
            await done.wait()
            return n / (time.perf_counter() - start)

    print(anyio.run(main))


def measure(config: str, n: int) -> float:
    out = subprocess.run([sys.executable, str(HERE), "child", config, str(n)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)})
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--signals", type=int, default=2000)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            rates[config].append(measure(config, args.signals))
    med = {c: statistics.median(v) for c, v in rates.items()}
    print(f"routed signals in memory, {args.signals} per round, median of {args.rounds}:")
    for c in CONFIGS:
        print(f"  {c:9} {med[c]:8.0f}/s  (rounds {[round(x) for x in rates[c]]})  "
              f"x{med[c] / med['disabled']:.2f} of disabled")
    print("goals: api >= 0.98x, sdk >= 0.8x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
