"""The two processes of a cross-process hand-off benchmark (bench/sqlite.py, bench/postgres.py).

A worker process owns thread ``bench`` and hands its signals to an agent (:func:`serve_worker`);
the parent sends from a sender-only runtime and reads when the worker saw them all
(:func:`routed_round`). The child protocol: it prints ``ready``, then one JSON line
``{"done": <time>, "lat": [...]}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from pubsub import PubSub
from signals import Run, Signal, SignalRuntime

__all__ = ["routed_round", "serve_worker", "spawn", "wait_ready"]

ROOT = Path(__file__).resolve().parent.parent


async def serve_worker(pubsub: PubSub, n: int, mode: str) -> None:
    """Own thread ``bench`` on ``pubsub`` and hand its signals to an agent; print when ``n``
    were acknowledged (with each one's send -> agent latency in ``latency`` mode)."""
    seen = 0
    lat: list[float] = []
    done = anyio.Event()

    async def agent(run: Run) -> None:
        nonlocal seen
        async for signal in run:
            if signal.type == "bench":
                lat.append(time.time() - float(signal.payload))
                seen += 1
            await run.ack(signal)
            if seen >= n:
                done.set()

    async with pubsub, SignalRuntime(pubsub=pubsub, agent=agent, idle_wait_ms=600_000,
                                     shutdown_timeout_ms=0) as rt:
        await rt.send("bench", Signal("0", type="warm"))
        print("ready", flush=True)
        await done.wait()
        print(json.dumps({"done": time.time(), "lat": lat if mode == "latency" else []}),
              flush=True)


def spawn(script: Path, *args: str) -> subprocess.Popen[str]:
    """``python script *args`` with the checkout importable, its stdout piped."""
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise SystemExit(f"child failed to start: {line!r}")


async def routed_round(child: subprocess.Popen[str], make_pubsub: Callable[[], Any], n: int,
                       gap: float = 0.0) -> dict[str, Any]:
    """Send ``n`` signals to the worker ``child`` (``gap`` seconds apart) from a sender-only
    runtime on ``make_pubsub()``; the rate (first send to the worker's last hand-off) and the
    worker's latencies."""
    await anyio.to_thread.run_sync(wait_ready, child)
    async with make_pubsub() as ps, SignalRuntime(pubsub=ps, agent=None) as sender:
        start = time.time()
        for _ in range(n):
            await sender.send("bench", Signal(repr(time.time()), type="bench"))
            if gap:
                await anyio.sleep(gap)
    assert child.stdout is not None
    result = json.loads(await anyio.to_thread.run_sync(child.stdout.readline))
    child.wait()
    return {"rate": n / (result["done"] - start), "lat": result["lat"]}
