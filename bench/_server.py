"""The servers of a benchmark run: the one given (``--redis-url``, ``--dsn``), or one started
here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from tests._redis_server import RedisServer, redis_server_binary

__all__ = ["postgres_dsn", "redis_url"]


@contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    """``given``, or the URL of a ``redis-server`` started on a free loopback port and stopped
    on exit (``SystemExit`` with a message when none is installed)."""
    if given is not None:
        yield given
        return
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server is not installed; pass --redis-url")
    with RedisServer(binary) as server:
        yield server.url


@asynccontextmanager
async def postgres_dsn(given: str | None
                       ) -> AsyncIterator[tuple[str, Callable[[], float] | None]]:
    """``given``, or the DSN of a PostgreSQL started here (Debian's binaries, as the soak
    does) and stopped on exit; with what reads the CPU seconds its processes spent so far
    (``None`` for a server given: its processes are not ours to read)."""
    if given is not None:
        yield given, None
        return
    from bench._handoff import tree_cpu_s
    from signals.soak.postgres_server import OwnPostgres, postgres_bin_dir

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install -y postgresql); or --dsn")
    server = OwnPostgres(bin_dir)
    await server.start()
    try:
        pid_file = server.directory / "data" / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        yield server.url, lambda: tree_cpu_s(postmaster)
    finally:
        await server.stop()
