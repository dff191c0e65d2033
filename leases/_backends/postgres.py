"""``PostgresLeaseProvider``: leases in a PostgreSQL database, for processes on any hosts."""

from __future__ import annotations

from _signal_leases.sql.postgres import PostgresDatabase
from leases._backends.sql import SQLLeaseProvider

__all__ = ["PostgresLeaseProvider"]


class PostgresLeaseProvider(SQLLeaseProvider):
    """A ``LeaseProvider`` in PostgreSQL, with sessions, batched renewal and ``lease_info``.

    ``dsn``, ``schema`` (``signal_leases``), ``max_connections`` (4) and ``timeout_s`` (10) as
    ``pubsub.PostgresPubSub``; the provider closes its connections in :meth:`aclose`. Leases
    expire by the database's clock; fencing tokens come from the sequence ``lease_tokens``.
    Needs the ``postgres`` extra (psycopg 3).
    """

    def __init__(self, dsn: str, *, schema: str = "signal_leases", max_connections: int = 4,
                 timeout_s: float = 10.0) -> None:
        database = PostgresDatabase(dsn, schema=schema, max_connections=max_connections,
                                    timeout_s=timeout_s)
        super().__init__(database, owns_database=True)
        self.dsn = dsn
