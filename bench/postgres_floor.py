"""What the PostgreSQL design can reach at best: senders that do no engine work, side by side.

Three senders hand signals to the raw consumer of ``bench/postgres.py`` (LISTEN, then SELECT +
DELETE), interleaved, on a PostgreSQL this script starts (or ``--dsn``):

* ``raw``: psycopg in a plain loop, INSERT + NOTIFY, committed (the raw baseline);
* ``layer``: the same two statements through ``PostgresDatabase.run`` from an event loop (a
  worker-thread hop, the pipeline, BEGIN and COMMIT): the cost of the database layer;
* ``call shape``: the shape of a signal-core call and nothing else: the thread's advisory lock
  and two reads in one round trip, then six writes and COMMIT, with no engine Python.

Each rate is printed with its ratio to ``raw``. A routed signal costs at least ``call shape``
plus the engine's rules and the owner's acknowledgement (docs/performance.md).

    python bench/postgres_floor.py [--signals 1500] [--rounds 3] [--dsn URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import psycopg

from _signal_leases.sql import Tx
from _signal_leases.sql.postgres import PostgresDatabase
from bench._handoff import spawn, wait_ready
from bench._server import postgres_dsn

CONSUMER = Path(__file__).resolve().parent / "postgres.py"


async def one_round(dsn: str, db: PostgresDatabase, mode: str, n: int) -> float:
    """Signals per second from the first send to the consumer's last take."""
    table = f"q_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(dsn)
    conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, body TEXT)")
    conn.commit()
    child = spawn(CONSUMER, "raw-consumer", dsn, table, str(n))
    await anyio.to_thread.run_sync(wait_ready, child)
    start = time.time()
    for i in range(n):
        body = json.dumps({"i": i})
        if mode == "raw":
            conn.execute(f"INSERT INTO {table} (body) VALUES (%s)", (body,))
            conn.execute(f"NOTIFY {table}")
            conn.commit()
            continue

        def call(tx: Tx, body: str = body) -> None:
            if mode == "call shape":
                tx.read_many([("SELECT pg_advisory_xact_lock(1, hashtext(?))", ("bench",)),
                              ("SELECT 1 WHERE ? = 'x'", ("bench",)),
                              ("SELECT 2 WHERE ? = 'x'", ("bench",))])
                for _ in range(4):
                    tx.write("SELECT 1 WHERE ? = 'y'", ("z",))
            tx.write(f"INSERT INTO {table} (body) VALUES (?)", (body,))
            tx.write(f"NOTIFY {table}")

        await db.run(call)
    assert child.stdout is not None
    line = (await anyio.to_thread.run_sync(child.stdout.readline)).split()
    child.wait()
    conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()
    return n / (float(line[1]) - start)


async def main(args: argparse.Namespace, dsn: str) -> None:
    db = PostgresDatabase(dsn, schema="public")
    modes = ("raw", "layer", "call shape")
    try:
        for r in range(args.rounds):
            rates: dict[str, Any] = {}
            for mode in modes if r % 2 == 0 else modes[::-1]:
                rates[mode] = await one_round(dsn, db, mode, args.signals)
            print(f"round {r + 1}: " + ", ".join(
                f"{m} {rates[m]:.0f}/s (x{rates[m] / rates['raw']:.2f})" for m in modes))
    finally:
        await db.aclose()


async def run(args: argparse.Namespace) -> None:
    async with postgres_dsn(args.dsn) as (dsn, _):
        await main(args, dsn)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--signals", type=int, default=1500)
    anyio.run(run, parser.parse_args())
