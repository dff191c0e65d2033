"""The lease provider over any SQL database (:class:`_signal_leases.sql.Database`).

Every operation is one transaction, run whole in a worker thread by the database (so it works
on asyncio and trio and never blocks the event loop); the transitions themselves are the
synchronous functions of :mod:`_signal_leases.sql.leases`, which the signal store shares. The
SQLite provider (:mod:`leases._backends.sqlite`) only builds the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self, TypeVar

from _signal_leases.sql import leases as sql
from leases._contract import AcquireResult
from leases._info import LeaseInfo
from leases._validation import check_acquire, check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from types import TracebackType

    from _signal_leases.sql import Database, Tx

__all__ = ["SQLLeaseProvider"]

T = TypeVar("T")


class SQLLeaseProvider:
    """A ``LeaseProvider`` with lease sessions, batched renewal and ``lease_info``, on
    ``database``; it closes the database in :meth:`aclose` only when ``owns_database``.

    The lease tables are created (or checked) on first use, or by ``async with``. A database
    that cannot be used raises ``BackendPermanentError`` (a bad path, a file of another kind, a
    schema of another version) or ``BackendUnavailableError`` (busy past its timeout): never
    read that as "the lease is free".
    """

    def __init__(self, database: Database, *, owns_database: bool = False) -> None:
        self.database = database
        self._owns = owns_database
        self._ddl = sql.ddl(database.dialect)

    async def _run(self, fn: Callable[[Tx], T], what: str, *, write: bool = True) -> T:
        await self.database.ensure_schema(sql.COMPONENT, sql.VERSION, self._ddl)
        return await self.database.run(fn, write=write, what=what)

    # -- LeaseProvider ---------------------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, session: str | None = None
    ) -> AcquireResult:
        check_acquire(key, owner, ttl_ms, session)
        result = await self._run(
            lambda tx: sql.acquire(tx, key, owner, ttl_ms, session), f"acquire of lease {key!r}"
        )
        return AcquireResult(*result)

    async def get_lease_owner(self, key: str) -> str | None:
        check_key(key)
        lease = await self._run(
            lambda tx: sql.live(tx, key), f"get_lease_owner of {key!r}", write=False
        )
        return None if lease is None else lease.owner

    async def release_lease(self, key: str, owner: str) -> None:
        check_key(key), check_owner(owner)
        await self._run(lambda tx: sql.release(tx, key, owner), f"release of lease {key!r}")

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        return await self._run(
            lambda tx: sql.renew(tx, key, owner, ttl_ms), f"renew of lease {key!r}"
        )

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(from_owner, "from_owner")
        check_owner(to_owner, "to_owner"), check_ttl_ms(ttl_ms)
        return await self._run(
            lambda tx: sql.transfer(tx, key, from_owner, to_owner, ttl_ms),
            f"transfer of lease {key!r}",
        )

    # -- batched renewal and lease sessions ------------------------------------------------

    async def renew_leases(self, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]:
        """Renew many ``(key, owner)`` leases in one transaction (one statement per 500);
        returns the keys still held (see ``BatchRenewer``)."""
        check_ttl_ms(ttl_ms)
        pairs = [(check_key(k), check_owner(o)) for k, o in items]
        if not pairs:
            return set()
        return await self._run(
            lambda tx: sql.renew_many(tx, pairs, ttl_ms), f"renewal of {len(pairs)} leases"
        )

    async def open_lease_session(self, ttl_ms: int) -> str | None:
        """Open a lease session alive for ``ttl_ms`` (see ``LeaseSessionProvider``)."""
        check_ttl_ms(ttl_ms)
        return await self._run(lambda tx: sql.open_session(tx, ttl_ms), "open of a lease session")

    async def renew_lease_session(self, session: str, ttl_ms: int) -> bool:
        """Keep ``session`` and its leases alive for ``ttl_ms`` more; ``False`` once expired."""
        check_owner(session, "session"), check_ttl_ms(ttl_ms)
        return await self._run(
            lambda tx: sql.renew_session(tx, session, ttl_ms), "renewal of a lease session"
        )

    async def close_lease_session(self, session: str) -> None:
        """End ``session``: its leases are free at once."""
        check_owner(session, "session")
        await self._run(lambda tx: sql.close_session(tx, session), "close of a lease session")

    # -- inspection and lifecycle ----------------------------------------------------------

    async def lease_info(self, key: str) -> LeaseInfo | None:
        """Owner, remaining TTL (a session lease: its session's) and token, or ``None``."""
        check_key(key)
        found = await self._run(lambda tx: sql.info(tx, key), f"lease_info of {key!r}",
                                write=False)
        return None if found is None else LeaseInfo(key, found[0], found[2], found[1])

    async def aclose(self) -> None:
        """Close the database if this provider opened it (idempotent)."""
        if self._owns:
            await self.database.aclose()

    async def __aenter__(self) -> Self:
        try:
            await self.database.ensure_schema(sql.COMPONENT, sql.VERSION, self._ddl)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
