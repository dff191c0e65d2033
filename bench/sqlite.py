"""The SQLite backend against a raw sqlite3 hand-off, side by side in one run.

* **Throughput across two processes**: a sender process sends ``--signals`` signals to one
  thread that a worker process owns (each routed: stored, the owner woken, handed to the agent,
  acknowledged), vs raw ``sqlite3`` doing the same hand-off on the same kind of file (WAL,
  ``synchronous=FULL``): one process INSERTs a row per signal, committed, and rings the other
  process through a Unix datagram socket; the other SELECTs the oldest row and DELETEs it,
  committed. Rates are signals handed over per second, first send to last hand-off, in
  interleaved rounds.
* **Latency**: send -> agent across processes, one signal every 20 ms (p50, p99).
* **Idle cost**: one process holding ``--threads`` active threads (each run waiting for its
  next signal), SQLite statements per second over a quiet window, counted on every connection
  of that process.

    python bench/sqlite.py [--rounds 3] [--signals 500] [--threads 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from bench._handoff import Cpu, compare_handoffs, serve_worker, spawn, wait_ready
from bench._handoff import routed_round as handoff_round
from pubsub import SQLitePubSub
from signals import Run, SignalRuntime

HERE = Path(__file__).resolve()


# -- the child processes ----------------------------------------------------------------------


def raw_consumer(db: str, sock_path: str, n: int) -> None:
    """SELECT the oldest row and DELETE it, committed, until ``n`` rows were taken."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    bell.bind(sock_path)
    bell.settimeout(0.05)
    print("ready", flush=True)
    taken = 0
    while taken < n:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT id, body FROM q ORDER BY id LIMIT 1").fetchone()
        if row is not None:
            conn.execute("DELETE FROM q WHERE id = ?", (row[0],))
        conn.execute("COMMIT")
        if row is not None:
            taken += 1
            continue
        with contextlib.suppress(TimeoutError):
            bell.recv(64)
    print(f"done {time.time()}", flush=True)


async def worker(db: str, n: int, mode: str) -> None:
    """Own thread ``bench`` and hand its signals to an agent (bench/_handoff.py)."""
    await serve_worker(SQLitePubSub(db, poll_ms=1000), n, mode)


# -- the parent -------------------------------------------------------------------------------


def raw_round(workdir: str, n: int) -> dict[str, Any]:
    db = os.path.join(workdir, f"raw-{time.monotonic_ns()}.db")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE q (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)")
    sock_path = db + ".sock"
    child = spawn(HERE, "raw-consumer", db, sock_path, str(n))
    wait_ready(child)
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    cpu = Cpu(child, None)
    cpu.start()
    start = time.time()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO q (body) VALUES (?)", (json.dumps({"i": i}),))
        conn.execute("COMMIT")
        with contextlib.suppress(OSError):
            bell.sendto(b"q", sock_path)
    assert child.stdout is not None
    line = child.stdout.readline().split()
    cpu.stop()
    child.wait()
    return {"rate": n / (float(line[1]) - start), "cpu": cpu.spent}


async def routed_round(workdir: str, n: int, gap: float = 0.0, mode: str = "rate"
                       ) -> dict[str, Any]:
    db = os.path.join(workdir, f"routed-{time.monotonic_ns()}.db")
    child = spawn(HERE, "worker", db, str(n), mode)
    return await handoff_round(child, lambda: SQLitePubSub(db), n, gap)


async def idle_cost(workdir: str, threads: int, window_s: float) -> dict[str, Any]:
    """Statements per second of one process holding ``threads`` active threads."""
    from _signal_leases.sql.sqlite import SQLiteDatabase

    count = [0]
    connect = SQLiteDatabase.connect

    def counting(self: SQLiteDatabase) -> Any:
        conn = connect(self)
        conn.set_trace_callback(lambda _: count.__setitem__(0, count[0] + 1))
        return conn

    SQLiteDatabase.connect = counting  # type: ignore[method-assign]
    release = anyio.Event()
    started = 0

    async def agent(run: Run) -> None:
        nonlocal started
        started += 1
        async for signal in run:
            await run.ack(signal)
            await release.wait()

    db = os.path.join(workdir, "idle.db")
    try:
        async with SQLitePubSub(db) as ps, SignalRuntime(pubsub=ps, agent=agent,
                                                         idle_wait_ms=600_000) as rt:
            t0 = time.monotonic()
            for n in range(threads):
                await rt.send(f"t{n}", n)
            while started < threads:  # noqa: ASYNC110 (a counter)
                await anyio.sleep(0.05)
            setup = time.monotonic() - t0
            await anyio.sleep(2.0)
            before = count[0]
            await anyio.sleep(window_s)
            rate = (count[0] - before) / window_s
            release.set()
    finally:
        SQLiteDatabase.connect = connect  # type: ignore[method-assign]
    return {"threads": threads, "setup_s": setup, "statements_per_s": rate}


async def main(args: argparse.Namespace) -> None:
    logging.disable(logging.CRITICAL)
    workdir = tempfile.mkdtemp(prefix="bench-sqlite-")
    await compare_handoffs(
        lambda n: raw_round(workdir, n),
        lambda n, **kw: routed_round(workdir, n, **kw),
        rounds=args.rounds, signals=args.signals, latency_signals=args.latency_signals,
        raw_label="raw sqlite3 insert + select + delete",
        ours_label="routed signals (SQLitePubSub)",
    )
    idle = await idle_cost(workdir, args.threads, args.window)
    print(f"idle cost: {idle['threads']} active threads in one process: "
          f"{idle['statements_per_s']:.1f} statements/s (goal <= ~20); setup "
          f"{idle['setup_s']:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-consumer":
        raw_consumer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "worker":
        anyio.run(worker, sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--signals", type=int, default=500)
        parser.add_argument("--latency-signals", type=int, default=200)
        parser.add_argument("--threads", type=int, default=1000)
        parser.add_argument("--window", type=float, default=10.0)
        anyio.run(main, parser.parse_args())
