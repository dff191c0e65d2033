"""A process of the multi-process tests on the SQL backends (``python -m tests.sql_worker``).

``serve SECONDS``: a worker runtime that runs threads until killed or ``SECONDS`` passed.
``send FIRST N GAP``: a sender-only runtime that sends signals ``s<FIRST>``..``s<FIRST+N-1>`` to
threads ``th<i % 10>``, ``GAP`` seconds apart, retrying a send with the same id while the
backend is unavailable.
``receipts N TIMEOUT``: print how many of ``s0``..``s<N-1>`` are ``processed`` (waiting up to
``TIMEOUT`` seconds for all of them).

The backend is ``--sqlite PATH`` or ``--postgres DSN`` (with ``--schema``). A worker records
each signal its agent handled as a JSON line ``{"t", "id", "tok"}`` in
``<--out>/seen-<pid>.jsonl`` before acknowledging it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio

from signals import BackendUnavailableError, Run, Signal, SignalRuntime


def _pubsub(args: argparse.Namespace) -> Any:
    if args.sqlite:
        from pubsub import SQLitePubSub

        return SQLitePubSub(args.sqlite, poll_ms=500)
    from pubsub import PostgresPubSub

    return PostgresPubSub(dsn=args.postgres, schema=args.schema, timeout_s=3)


async def _serve(args: argparse.Namespace) -> None:
    out = open(os.path.join(args.out, f"seen-{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115, ASYNC230 (a test worker)

    async def agent(run: Run) -> None:
        async for s in run:
            out.write(json.dumps({"t": run.thread_key, "id": s.id, "tok": run.token}) + "\n")
            await anyio.sleep(args.work_ms / 1000)
            await run.ack(s)

    async with _pubsub(args) as ps, SignalRuntime(pubsub=ps, agent=agent,
                                                  lease_ttl_ms=args.ttl_ms) as rt:
        print(json.dumps({"event": "ready", "pid": os.getpid(), "runtime": rt.runtime_id}),
              flush=True)
        await anyio.sleep(float(args.rest[0]))


async def _send(args: argparse.Namespace) -> None:
    first, n, gap = int(args.rest[0]), int(args.rest[1]), float(args.rest[2])
    async with _pubsub(args) as ps, SignalRuntime(pubsub=ps, agent=None) as rt:
        for i in range(first, first + n):
            for _ in range(200):
                try:
                    await rt.send(f"th{i % 10}", Signal({"i": i}, id=f"s{i}"))
                    break
                except BackendUnavailableError:
                    await anyio.sleep(0.1)
            await anyio.sleep(gap)


async def _receipts(args: argparse.Namespace) -> None:
    n, deadline = int(args.rest[0]), time.monotonic() + float(args.rest[1])
    async with _pubsub(args) as ps, SignalRuntime(pubsub=ps, agent=None) as rt:
        done: set[int] = set()  # processed is final: each pass asks only for the others
        while True:
            try:
                for i in range(n):
                    if i not in done:
                        receipt = await rt.receipt(f"th{i % 10}", f"s{i}")
                        if receipt is not None and receipt.status == "processed":
                            done.add(i)
            except BackendUnavailableError:  # the database restarts: ask again
                pass
            if len(done) == n or time.monotonic() > deadline:
                print(len(done), flush=True)
                return
            await anyio.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "send", "receipts"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--sqlite", default=None)
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--schema", default="signal_leases")
    parser.add_argument("--out", default=".")
    parser.add_argument("--ttl-ms", type=int, default=1500)
    parser.add_argument("--work-ms", type=int, default=10)
    args = parser.parse_args()
    anyio.run({"serve": _serve, "send": _send, "receipts": _receipts}[args.mode], args)


if __name__ == "__main__":
    main()
