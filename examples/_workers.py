"""Worker processes for the examples that run several (``sqlite_workers.py``,
``sql_backend.py``): the example's own script again, with ``--worker``, on one database file.

Examples must not import from ``tests/``; this is the few lines they share.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio

__all__ = ["run_example", "worker_processes"]


def _spawn(script: str, db: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, script, "--db", db, "--worker"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":  # the worker prints it once it serves
        proc.kill()
        raise SystemExit("a worker did not start")
    return proc


@asynccontextmanager
async def worker_processes(script: str, db: str, count: int
                           ) -> AsyncIterator[list[subprocess.Popen[str]]]:
    """``count`` workers, each ready when this yields; stopped (SIGTERM) at the end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(await anyio.to_thread.run_sync(_spawn, script, db))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()


def run_example(doc: str, main: Callable[[str], Awaitable[None]],
                worker: Callable[[str], Awaitable[None]], filename: str) -> None:
    """The command line: ``[--db PATH]`` (default: a temporary file), ``--worker`` inside."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--db", help="the database file (default: a new temporary one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(worker, args.db)
    elif args.db:
        anyio.run(main, args.db)
    else:
        with tempfile.TemporaryDirectory(prefix="signals-example-") as tmp:
            anyio.run(main, os.path.join(tmp, filename))
