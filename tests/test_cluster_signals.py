"""The signal store's conformance suite on a real Redis Cluster (3 masters, 3 replicas), with
the store built from ``url=..., cluster=True`` and the lease provider on the same client.

Every check runs here: notices (over one node), the stream follower (sharded pub/sub) and the
pending index (updated beside the scripts, in a crash-safe order) included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from leases import RedisLeaseProvider
from signals import RedisSignalStore, Signal
from signals.kit import Ack, PartIn, RunRef
from signals.testing import SignalBackendConformance

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.cluster]


class TestClusterSignalStore(SignalBackendConformance):
    @pytest.fixture
    async def core(self, cluster_url: str, key_prefix: str) -> AsyncIterator[RedisSignalStore]:
        store = RedisSignalStore(url=cluster_url, cluster=True, key_prefix=f"{key_prefix}:s")
        store.leases = RedisLeaseProvider(client=store.client, key_prefix=f"{key_prefix}:lease")
        try:
            yield store
        finally:
            await store.aclose()

    @pytest.fixture
    def leases(self, core: RedisSignalStore) -> Any:
        return core.leases

    @pytest.fixture
    def small_core(self, core: RedisSignalStore, key_prefix: str) -> RedisSignalStore:
        return RedisSignalStore(client=core.client, key_prefix=f"{key_prefix}:small",
                                stream_max_parts=5)


async def _wait_calls(client: Any) -> int:
    stats = await client.info("commandstats", target_nodes=client.PRIMARIES)
    return sum(int(node.get("cmdstat_wait", {}).get("calls", 0)) for node in stats.values())


async def test_wait_replicas_confirms_every_scripted_write(
    cluster_url: str, key_prefix: str
) -> None:
    """``wait_replicas=1``: accept, take and ack (settle) each end with one WAIT on the
    thread's master (and succeed: every master has a replica); an agent's own stream part
    (``emit``) does not wait (docs/cluster.md)."""
    store = RedisSignalStore(url=cluster_url, cluster=True, key_prefix=f"{key_prefix}:w",
                             wait_replicas=1)
    try:
        store.leases = RedisLeaseProvider(client=store.client, key_prefix=f"{key_prefix}:wl")
        waits = []
        for sid in ("s0", "s1"):  # s0 loads the scripts (a first EVALSHA is sent twice)
            before = await _wait_calls(store.client)
            accepted = await store.accept("t", Signal("hello", id=sid), "deliver")
            assert accepted.fresh
            run = RunRef("rt/run-1", None)
            [entry] = (await store.take("t", run, max_attempts=5, first=True)).entries
            assert await store.settle("t", run, acks=[Ack(entry.entry_id, sid)])
            waits.append(await _wait_calls(store.client) - before)
        assert waits[1] == 3, waits
        before = await _wait_calls(store.client)
        await store.emit("t", [PartIn("part", "rt/run-1", None, '{"n":1}')])
        assert await _wait_calls(store.client) == before  # an agent's own part: no WAIT
        receipt = await store.receipt("t", "s1")
        assert receipt is not None and receipt.status == "processed"
    finally:
        await store.aclose()


async def test_a_signal_left_unindexed_by_a_dead_sender_is_indexed_by_its_resend(
    cluster_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Cluster the inbox is written first and the pending index (another slot) after it.
    A sender that dies in between leaves a signal nobody's index points to; sending the same
    id again (the sender's retry) indexes the thread, so recovery finds it."""
    store = RedisSignalStore(url=cluster_url, cluster=True, key_prefix=f"{key_prefix}:i")
    try:
        async def dies(*args: Any) -> None:
            raise RuntimeError("the sender died here")

        with monkeypatch.context() as patch:
            patch.setattr(store, "_apply_index", dies)
            with pytest.raises(RuntimeError, match="died"):
                await store.accept("t", Signal("hello", id="s1"), "queue")
        assert "t" not in (await store.due(limit=1000)).threads
        again = await store.accept("t", Signal("hello", id="s1"), "queue")
        assert not again.fresh
        assert "t" in (await store.due(limit=1000)).threads
    finally:
        await store.aclose()
