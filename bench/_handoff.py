"""The two processes of a cross-process hand-off benchmark (bench/sqlite.py, bench/postgres.py).

A worker process owns thread ``bench`` and hands its signals to an agent (:func:`serve_worker`);
the parent sends from a sender-only runtime and reads when the worker saw them all
(:func:`routed_round`). The child protocol: it prints ``ready``, then one JSON line
``{"done": <time>, "lat": [...]}``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from pubsub import PubSub
from signals import Run, Signal, SignalRuntime

__all__ = ["Cpu", "compare_handoffs", "routed_round", "serve_worker", "spawn", "tree_cpu_s",
           "wait_ready"]

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


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux; ``None`` elsewhere
    or once the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_of(fields: list[str] | None) -> float:
    """User + system CPU seconds in ``fields`` (:func:`_stat`); 0 without them."""
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; 0 elsewhere)."""
    return _cpu_of(_stat(pid))


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and its children (a database server's processes)."""
    total = _cpu_s(pid)
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            fields = _stat(entry)  # read once: the parent's pid and the CPU seconds
            if fields is not None and fields[1] == str(pid):
                total += _cpu_of(fields)
    return total


class Cpu:
    """CPU seconds spent by the sender (this process), the worker (``child``) and the
    database server (``server()``, if any) from :meth:`start` to :meth:`stop`: on a machine
    whose cores are all busy, what a signal costs in CPU bounds the rate."""

    def __init__(self, child: subprocess.Popen[str], server: Callable[[], float] | None) -> None:
        self._child, self._server = child, server
        self.spent = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        me = resource.getrusage(resource.RUSAGE_SELF)
        return (me.ru_utime + me.ru_stime, _cpu_s(self._child.pid),
                self._server() if self._server is not None else 0.0)

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> None:
        self.spent = tuple(b - a for a, b in zip(self._start, self._now(), strict=True))  # type: ignore[assignment]


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise SystemExit(f"child failed to start: {line!r}")


async def routed_round(child: subprocess.Popen[str], make_pubsub: Callable[[], Any], n: int,
                       gap: float = 0.0, server: Callable[[], float] | None = None
                       ) -> dict[str, Any]:
    """Send ``n`` signals to the worker ``child`` (``gap`` seconds apart) from a sender-only
    runtime on ``make_pubsub()``; the rate (first send to the worker's last hand-off), the
    worker's latencies and the CPU seconds spent (:class:`Cpu`; ``server``: the database
    server's CPU seconds so far)."""
    await anyio.to_thread.run_sync(wait_ready, child)
    cpu = Cpu(child, server)
    async with make_pubsub() as ps, SignalRuntime(pubsub=ps, agent=None) as sender:
        await sender.receipt("bench", "none")  # a connection and the schema, before timing
        cpu.start()
        start = time.time()
        for _ in range(n):
            await sender.send("bench", Signal(repr(time.time()), type="bench"))
            if gap:
                await anyio.sleep(gap)
    assert child.stdout is not None
    result = json.loads(await anyio.to_thread.run_sync(child.stdout.readline))
    cpu.stop()
    child.wait()
    return {"rate": n / (result["done"] - start), "lat": result["lat"], "cpu": cpu.spent}


async def compare_handoffs(
    raw_round: Callable[[int], dict[str, Any]], routed: Callable[..., Awaitable[dict[str, Any]]],
    *, rounds: int, signals: int, latency_signals: int, raw_label: str, ours_label: str,
) -> None:
    """Interleaved rounds of ``raw_round(n)`` (in a worker thread) and ``routed(n)``, each
    giving its ``rate`` and ``cpu`` (:class:`Cpu`), then ``routed(n, gap=0.02,
    mode="latency")``; prints the rates, their ratio, the CPU per signal and the latency."""
    raw: list[float] = []
    ours: list[float] = []
    cpu: dict[str, list[tuple[float, float, float]]] = {"raw": [], "ours": []}
    for r in range(rounds):
        order = ("raw", "ours") if r % 2 == 0 else ("ours", "raw")
        for which in order:
            if which == "raw":
                got = await anyio.to_thread.run_sync(raw_round, signals)
                raw.append(got["rate"])
            else:
                got = await routed(signals)
                ours.append(got["rate"])
            cpu[which].append(got["cpu"])
    lat = (await routed(latency_signals, gap=0.02, mode="latency"))["lat"]
    lat_ms = sorted(x * 1000 for x in lat)
    r_raw, r_ours = statistics.median(raw), statistics.median(ours)
    width = max(len(raw_label), len(ours_label)) + 1
    print(f"throughput, one thread across two processes ({signals} signals, "
          f"{rounds} rounds, medians):")
    print(f"  {raw_label + ':':{width}} {r_raw:8.0f}/s  (rounds {[round(x) for x in raw]})")
    print(f"  {ours_label + ':':{width}} {r_ours:8.0f}/s  (rounds {[round(x) for x in ours]})")
    print(f"  ratio ours/raw: x{r_ours / r_raw:.2f}  (goal >= 0.5)")
    print(f"CPU per signal, ms (medians; the machine has {os.cpu_count()} cores):")
    for which, label in (("raw", raw_label), ("ours", ours_label)):
        parts = [statistics.median(c[i] for c in cpu[which]) * 1000 / signals for i in range(3)]
        print(f"  {label + ':':{width}} sender {parts[0]:.2f}, worker {parts[1]:.2f}, server "
              f"{parts[2]:.2f}: {sum(parts):.2f} in all")
    print(f"latency send -> agent across processes ({len(lat_ms)} signals, 20 ms apart): "
          f"p50 {statistics.median(lat_ms):.2f} ms, p99 {lat_ms[int(len(lat_ms) * 0.99) - 1]:.2f} "
          f"ms (goal p50 <= 5 ms)")
