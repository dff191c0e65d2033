"""The SQL core on SQLite runs every ``signals.testing`` kit (asyncio and trio), fused with the
lease tables of the same file; and the same core without the leases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _signal_leases.sql.sqlite import SQLiteDatabase
from leases import SQLiteLeaseProvider
from pubsub import InMemoryPubSub
from signals.kit._derived import PubSubNotices
from signals.kit._sql import SQLCore
from signals.testing import SignalBackendConformance

pytestmark = pytest.mark.anyio


class TestSQLiteCore(SignalBackendConformance):
    @pytest.fixture
    async def database(self, tmp_path: Path) -> AsyncIterator[SQLiteDatabase]:
        db = SQLiteDatabase(tmp_path / "signals.db")
        yield db
        await db.aclose()

    @pytest.fixture
    def leases(self, database: SQLiteDatabase) -> SQLiteLeaseProvider:
        return SQLiteLeaseProvider(database=database)

    @pytest.fixture
    async def core(self, database: SQLiteDatabase, leases: SQLiteLeaseProvider
                   ) -> AsyncIterator[SQLCore]:
        async with InMemoryPubSub() as pubsub:
            yield SQLCore(database, leases=leases, notices=PubSubNotices(pubsub, "t"))

    @pytest.fixture
    def small_core(self, database: SQLiteDatabase) -> SQLCore:
        return SQLCore(database, stream_max_parts=5)


class TestSQLiteCoreUnfused(SignalBackendConformance):
    @pytest.fixture
    async def core(self, tmp_path: Path) -> AsyncIterator[Any]:
        db = SQLiteDatabase(tmp_path / "signals.db")
        yield SQLCore(db)
        await db.aclose()
