"""The signal store's conformance suite on a real Redis Cluster (3 masters, 3 replicas), with
the store built from ``url=..., cluster=True`` and the lease provider on the same client.

Every check runs here: notices (over one node), the stream follower (sharded pub/sub) and the
pending index (updated beside the scripts, in a crash-safe order) included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from leases import RedisLeaseProvider
from signals import RedisSignalStore
from signals.testing import SignalStoreConformance

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


class TestClusterSignalStore(SignalStoreConformance):
    @pytest.fixture
    async def store(self, cluster_url: str, key_prefix: str) -> AsyncIterator[RedisSignalStore]:
        store = RedisSignalStore(url=cluster_url, cluster=True, key_prefix=f"{key_prefix}:s")
        store.leases = RedisLeaseProvider(client=store.client, key_prefix=f"{key_prefix}:lease")
        try:
            yield store
        finally:
            await store.aclose()

    @pytest.fixture
    def leases(self, store: RedisSignalStore) -> Any:
        return store.leases

    @pytest.fixture
    def small_store(self, store: RedisSignalStore, key_prefix: str) -> RedisSignalStore:
        return RedisSignalStore(client=store.client, key_prefix=f"{key_prefix}:small",
                                stream_max_parts=5)
