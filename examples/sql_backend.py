"""A complete cross-process backend, built from the backend kit's public parts.

    python examples/sql_backend.py [--db PATH]

What a backend author writes for a SQL database the library has no backend for:

* ``FileDatabase``: a ``signals.kit.Database`` over a DB-API driver: how to connect, how to
  start a transaction and read the clock, and which driver errors mean "retry later"
  (``BackendUnavailableError``) or "fix the configuration" (``BackendPermanentError``). The
  driver here is the standard library's ``sqlite3`` so that the example runs anywhere; put
  yours in its place.
* ``PollingDoorbell``: how one process tells the others it published. This one tells nobody:
  every process's reader looks every ``poll_ms`` (one short query per process, whatever the
  number of threads). A real doorbell (a socket, LISTEN/NOTIFY) makes hand-offs immediate.
* ``MyPubSub``: the parts together. ``pubsub.SQLPubSub`` is the pub/sub,
  ``leases.SQLLeaseProvider`` the lease provider (the pub/sub is one too), and the runtime
  finds the durable signal core, ``signals.kit.SQLCore``, through ``sql_database``: every part
  in one database, each call one transaction.

The demo runs two worker processes and a sender on one file; ``tests/test_custom_backend.py``
runs every conformance kit against this backend.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _workers import run_example, worker_processes

from leases import SQLLeaseProvider
from pubsub import BackendError, BackendPermanentError, BackendUnavailableError, SQLPubSub
from signals import Run, Signal, SignalRuntime
from signals.kit import Database


class FileDatabase(Database):
    """One database file on one host, through a DB-API driver."""

    def __init__(self, path: str) -> None:
        super().__init__(max_connections=4)
        self.path = path

    @property
    def name(self) -> str:
        return repr(self.path)

    def connect(self) -> Any:  # called in a worker thread
        conn = sqlite3.connect(self.path, timeout=10, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # a commit survives a power loss
        return conn

    def begin(self, cursor: Any, write: bool) -> tuple[int, float]:
        cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        # The clock lease expiries are compared with: one that every process shares. On one
        # host, the host's clock; a server database would read its own clock here instead
        # (Postgres: clock_timestamp()).
        now = time.time()
        return int(now * 1000), now

    def map_error(self, exc: Exception, what: str) -> BackendError | None:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return BackendUnavailableError(f"{self.name} busy during {what}: {exc}")
        if isinstance(exc, sqlite3.Error):
            return BackendPermanentError(f"{self.name} refused {what}: {exc}")
        return None  # not the driver's: let it through


class PollingDoorbell:
    """Rings nobody: the readers' poll finds new events (see the module docstring)."""

    async def ring(self, topics: Collection[str]) -> None:
        pass

    @asynccontextmanager
    async def serve(self, wake: Callable[[str | None], None]) -> AsyncIterator[None]:
        yield


class MyPubSub(SQLPubSub):
    """The pub/sub, its own lease provider, and the signal runtime's core, in one file."""

    def __init__(self, path: str, *, max_delivery_attempts: int = 5) -> None:
        database = FileDatabase(path)
        super().__init__(database, SQLLeaseProvider(database), PollingDoorbell(),
                         poll_ms=50, max_delivery_attempts=max_delivery_attempts)


# -- the demo ---------------------------------------------------------------------------------


async def agent(run: Run) -> None:
    async for sig in run:
        await run.ack(sig, result={"pid": os.getpid(), "echo": sig.payload})


async def worker(db: str) -> None:
    async with MyPubSub(db) as pubsub, SignalRuntime(pubsub=pubsub, agent=agent):
        print("ready", flush=True)
        await anyio.sleep_forever()


async def main(db: str) -> None:
    async with worker_processes(__file__, db, 2), MyPubSub(db) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=None
    ) as sender:
        for n in range(4):
            await sender.send(f"thread-{n}", Signal(f"hello {n}", id=f"m{n}"))
        for n in range(4):
            receipt = await sender.wait_for(f"thread-{n}", f"m{n}", timeout=30)
            assert receipt.status == "processed", receipt
            print(f"thread-{n}: {receipt.result}")


if __name__ == "__main__":
    run_example(__doc__, main, worker, "backend.db")
