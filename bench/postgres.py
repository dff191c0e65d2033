"""The Postgres backend against a raw psycopg hand-off, side by side in one run.

* **Throughput across two processes**: a sender process sends ``--signals`` signals to one
  thread that a worker process owns (each routed: stored, the owner woken, handed to the agent,
  acknowledged), vs raw psycopg doing the same hand-off on the same server: one process
  INSERTs a row and NOTIFYs in one transaction per signal; the other LISTENs and, on each
  notification, SELECTs the oldest row and DELETEs it in one transaction. Rates are signals
  handed over per second, first send to last hand-off, in interleaved rounds.
* **Latency**: send -> agent across processes, one signal every 20 ms (p50, p99).
* **Idle cost**: one process holding ``--threads`` active threads (each run waiting for its
  next signal), SQL statements per second over a quiet window, counted on every connection of
  that process (client side: each message a worker thread's cursor or the event loop sends),
  and the setup time; for each K in ``--ks``.

    python bench/postgres.py [--dsn DSN] [--rounds 3] [--signals 300] [--ks 1000,10000]

Without ``--dsn`` it starts its own PostgreSQL (Debian's binaries, as the soak does).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import psycopg

import _signal_leases.sql.postgres as pg
from bench._handoff import Cpu, compare_handoffs, serve_worker, spawn, wait_ready
from bench._handoff import routed_round as handoff_round
from bench._server import postgres_dsn
from pubsub import PostgresPubSub
from signals import Run, SignalRuntime

HERE = Path(__file__).resolve()


# -- the child processes ----------------------------------------------------------------------


def raw_consumer(dsn: str, table: str, n: int) -> None:
    """LISTEN; on each notification take rows (SELECT the oldest + DELETE, committed) until
    none is left; stop after ``n`` rows."""
    listen = psycopg.connect(dsn, autocommit=True)
    listen.execute(f"LISTEN {table}")
    work = psycopg.connect(dsn)
    print("ready", flush=True)
    taken = 0
    while taken < n:
        with work.cursor() as cur:
            cur.execute(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} ORDER BY id "
                        f"LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING body")
            row = cur.fetchone()
        work.commit()
        if row is not None:
            taken += 1
            continue
        for _ in listen.notifies(timeout=0.05, stop_after=1):
            pass
    print(f"done {time.time()}", flush=True)


async def worker(dsn: str, schema: str, n: int, mode: str) -> None:
    """Own thread ``bench`` and hand its signals to an agent (bench/_handoff.py)."""
    await serve_worker(PostgresPubSub(dsn, schema=schema), n, mode)


# -- the parent -------------------------------------------------------------------------------


def raw_round(dsn: str, n: int, server: Callable[[], float] | None) -> dict[str, Any]:
    table = f"q_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(dsn)
    conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, body TEXT)")
    conn.commit()
    child = spawn(HERE, "raw-consumer", dsn, table, str(n))
    wait_ready(child)
    cpu = Cpu(child, server)
    cpu.start()
    start = time.time()
    for i in range(n):
        conn.execute(f"INSERT INTO {table} (body) VALUES (%s)", (json.dumps({"i": i}),))
        conn.execute(f"NOTIFY {table}")
        conn.commit()
    assert child.stdout is not None
    line = child.stdout.readline().split()
    cpu.stop()
    child.wait()
    conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()
    return {"rate": n / (float(line[1]) - start), "cpu": cpu.spent}


async def routed_round(dsn: str, n: int, server: Callable[[], float] | None, gap: float = 0.0,
                       mode: str = "rate") -> dict[str, Any]:
    schema = f"b_{uuid.uuid4().hex[:8]}"
    child = spawn(HERE, "worker", dsn, schema, str(n), mode)
    return await handoff_round(child, lambda: PostgresPubSub(dsn, schema=schema), n, gap,
                               server)


async def idle_cost(dsn: str, threads: int, window_s: float) -> dict[str, Any]:
    """Statements per second of one process holding ``threads`` active threads."""
    count = [0]
    execute = psycopg.Cursor.execute
    exchange = pg._exchange

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return execute(self, *args, **kwargs)

    async def exchanging(*args: Any) -> Any:  # a message from the event loop (the hot path)
        count[0] += 1
        return await exchange(*args)

    psycopg.Cursor.execute = counting  # type: ignore[method-assign]
    pg._exchange = exchanging  # type: ignore[assignment]
    release = anyio.Event()
    started = 0

    async def agent(run: Run) -> None:
        nonlocal started
        started += 1
        async for signal in run:
            await run.ack(signal)
            await release.wait()

    try:
        async with PostgresPubSub(dsn, schema=f"i_{uuid.uuid4().hex[:8]}",
                                  max_connections=8) as ps, \
                SignalRuntime(pubsub=ps, agent=agent, idle_wait_ms=600_000) as rt:
            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for part in range(8):  # eight senders: setup is bounded by round trips
                    async def send_some(part: int = part) -> None:
                        for n in range(part, threads, 8):
                            await rt.send(f"t{n}", n)
                    tg.start_soon(send_some)
            while started < threads:  # noqa: ASYNC110 (a counter)
                await anyio.sleep(0.05)
            setup = time.monotonic() - t0
            await anyio.sleep(2.0)
            before = count[0]
            await anyio.sleep(window_s)
            rate = (count[0] - before) / window_s
            release.set()
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        pg._exchange = exchange
    return {"threads": threads, "setup_s": setup, "statements_per_s": rate}


async def main(args: argparse.Namespace, dsn: str,
               server: Callable[[], float] | None = None) -> None:
    """``server``: the CPU seconds of the database server so far (a server this run started)."""
    logging.disable(logging.CRITICAL)
    await compare_handoffs(
        lambda n: raw_round(dsn, n, server),
        lambda n, **kw: routed_round(dsn, n, server, **kw),
        rounds=args.rounds, signals=args.signals, latency_signals=args.latency_signals,
        raw_label="raw psycopg INSERT + NOTIFY -> LISTEN -> SELECT + DELETE",
        ours_label="routed signals (PostgresPubSub)",
    )
    for k in (int(x) for x in args.ks.split(",")):
        idle = await idle_cost(dsn, k, args.window)
        print(f"idle cost: {k} active threads in one process: "
              f"{idle['statements_per_s']:.1f} statements/s (goal <= ~20 at 1,000); setup "
              f"{idle['setup_s']:.1f} s")


async def run(args: argparse.Namespace) -> None:
    async with postgres_dsn(args.dsn) as (dsn, server):
        await main(args, dsn, server)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "raw-consumer":
        raw_consumer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "worker":
        anyio.run(worker, sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--dsn", default=None)
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--signals", type=int, default=300)
        parser.add_argument("--latency-signals", type=int, default=200)
        parser.add_argument("--ks", default="1000,10000")
        parser.add_argument("--window", type=float, default=10.0)
        anyio.run(run, parser.parse_args())
