"""``SQLiteLeaseProvider``: leases in one SQLite file, shared by the processes of one host."""

from __future__ import annotations

import os

from _signal_leases.sql.sqlite import SQLiteDatabase
from _signal_leases.validation import check_int, check_str
from leases._backends.sql import SQLLeaseProvider

__all__ = ["SQLiteLeaseProvider"]


class SQLiteLeaseProvider(SQLLeaseProvider):
    """A ``LeaseProvider`` in a SQLite file, with sessions, batched renewal and ``lease_info``.

    Pass exactly one of ``path`` (the provider opens the file, created when missing, with at
    most ``max_connections`` connections, default 4, and a wait of ``busy_timeout_ms``, default
    10 s, for the write lock; it closes it in :meth:`aclose`) or ``database`` (a
    ``SQLiteDatabase`` shared with other parts, which keeps its own options and stays open).
    Any number of processes of **one host** may share the file (not over a network file
    system): leases expire by the host's monotonic clock. A path in a missing directory, in a
    read-only place, or a file that is not a SQLite database raises ``BackendPermanentError``
    naming the path, from ``async with`` or the first call.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        database: SQLiteDatabase | None = None,
        busy_timeout_ms: int | None = None,
        max_connections: int | None = None,
    ) -> None:
        if (path is None) == (database is None):
            raise TypeError("SQLiteLeaseProvider takes exactly one of path or database")
        if database is not None:
            if not isinstance(database, SQLiteDatabase):
                raise TypeError(f"database must be a SQLiteDatabase, got {type(database).__name__}")
            if busy_timeout_ms is not None or max_connections is not None:
                raise TypeError("busy_timeout_ms and max_connections go with path, not database")
            super().__init__(database)
        else:
            name = check_str("path", os.fspath(path) if isinstance(path, os.PathLike) else path)
            timeout = 10_000 if busy_timeout_ms is None else busy_timeout_ms
            connections = 4 if max_connections is None else max_connections
            database = SQLiteDatabase(
                name,
                busy_timeout_ms=check_int("busy_timeout_ms", timeout, minimum=0),
                max_connections=check_int("max_connections", connections),
            )
            super().__init__(database, owns_database=True)
        self.path = database.path
