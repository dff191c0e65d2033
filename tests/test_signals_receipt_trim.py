"""A thread keeps at most ``max_receipts`` receipts; the oldest go first, even of a signal
still waiting in the inbox. Sending that id again is still a duplicate: the entry waiting is
its record (before, the SQL cores failed on their unique index and Redis stored it twice)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from signals import InMemorySignalStore, RedisSignalStore, Signal
from signals.kit import SQLCore

pytestmark = pytest.mark.anyio

CORES = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis),
         pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=CORES)
async def core(request: pytest.FixtureRequest, anyio_backend: str, tmp_path: Path
               ) -> AsyncIterator[Any]:
    kind = request.param
    if kind == "memory":
        yield InMemorySignalStore(max_receipts=2)
    elif kind == "sqlite":
        from _signal_leases.sql.sqlite import SQLiteDatabase

        database = SQLiteDatabase(tmp_path / "r.db")
        yield SQLCore(database, max_receipts=2)
        await database.aclose()
    elif kind == "redis":
        if anyio_backend != "asyncio":
            pytest.skip("redis-py is asyncio-only")
        store = RedisSignalStore(url=request.getfixturevalue("redis_url"),
                                 key_prefix=f"rt{uuid.uuid4().hex[:10]}", max_receipts=2)
        yield store
        await store.aclose()
    else:
        from pubsub import PostgresPubSub

        pubsub = PostgresPubSub(request.getfixturevalue("postgres_dsn"),
                                schema=request.getfixturevalue("pg_schema"))
        async with pubsub:  # fused with its leases: a routed signal may take one statement
            yield SQLCore(pubsub.database, leases=pubsub.get_lease_provider(), pubsub=pubsub,
                          max_receipts=2)
        await pubsub.aclose()


async def test_a_waiting_signal_sent_again_is_a_duplicate_after_its_receipt_was_trimmed(
        core: Any) -> None:
    for n in range(4):
        assert (await core.accept("t", Signal(n, id=f"s{n}"), "deliver")).outcome == "fresh"
    assert await core.receipt("t", "s0") is None  # trimmed: past max_receipts=2
    again = await core.accept("t", Signal(0, id="s0"), "deliver")
    assert again.outcome == "duplicate", again
    assert again.receipt is not None and again.receipt.status == "pending", again
    assert [e.signal.id for e in await core.entries("t")] == ["s0", "s1", "s2", "s3"]
    if isinstance(core, SQLCore) and core.leases is not None:  # routed to a live owner
        assert (await core.leases.acquire_lease("t", "rt/1", 60_000)).acquired
        routed = await core.route("t", Signal(0, id="s0"), "deliver", claim=None,
                                  sender="other", wake_workers=True)
        assert routed.accepted.outcome == "duplicate" and routed.owner == "rt/1", routed
        assert len(await core.entries("t")) == 4
