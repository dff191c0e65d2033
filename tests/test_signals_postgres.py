"""PostgreSQL runs every conformance kit: the pub/sub (and its own leases), the lease provider,
and the SQL core fused with the leases of the same database, its notices written in the
transaction of their change. Each test gets a schema of its own on the session's server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from leases import PostgresLeaseProvider
from leases.testing import LeaseProviderConformance
from pubsub import PostgresPubSub
from pubsub.testing import PubSubConformance
from signals.kit import SQLCore
from signals.testing import SignalBackendConformance

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


class TestPostgresPubSub(PubSubConformance):
    max_delivery_attempts = 3

    @pytest.fixture
    async def pubsub(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema,
                                  max_delivery_attempts=self.max_delivery_attempts) as backend:
            yield backend


class TestPostgresLeases(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, postgres_dsn: str, pg_schema: str
                       ) -> AsyncIterator[PostgresLeaseProvider]:
        provider = PostgresLeaseProvider(postgres_dsn, schema=pg_schema)
        yield provider
        await provider.aclose()


class TestPostgresPubSubAsLeases(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema) as backend:
            yield backend


class TestPostgresCore(SignalBackendConformance):
    @pytest.fixture
    async def pubsub(self, postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresPubSub]:
        async with PostgresPubSub(postgres_dsn, schema=pg_schema) as backend:
            yield backend

    @pytest.fixture
    def leases(self, pubsub: PostgresPubSub) -> Any:
        return pubsub.get_lease_provider()

    @pytest.fixture
    async def core(self, pubsub: PostgresPubSub, leases: Any) -> AsyncIterator[SQLCore]:
        core = SQLCore(pubsub.sql_database, leases=leases, pubsub=pubsub)
        yield core
        left = await core.due(limit=1000, until=float("inf"))
        assert left.threads == [], f"the check left pending work on {left.threads}"

    @pytest.fixture
    def small_core(self, pubsub: PostgresPubSub) -> SQLCore:
        return SQLCore(pubsub.sql_database, stream_max_parts=5)
