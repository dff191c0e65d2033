"""The private half of ``signals.testing``: the suite's fixtures and helpers, and its
control and fused-call checks (``SignalStoreConformance`` in ``signals.testing`` inherits them;
users import only from there)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from signals._model import Signal
from signals._store import (
    Ack,
    Claim,
    InboxEntry,
    Notice,
    SignalStore,
)

__all__ = ["ALL", "ControlChecks", "StoreFixtures", "ids", "new_name"]


ALL = 100_000  # a limit that lists everything


def ids(entries: list[InboxEntry]) -> list[str]:
    return [e.signal.id for e in entries]


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.mark.anyio
class StoreFixtures:
    """The suite's knobs, fixtures and helpers (override them in your subclass)."""


    #: Concurrent accepts of one signal id in the dedup race check.
    racers: int = 20
    #: Presence TTL of the registry checks, in ms (raise it for slow remote stores).
    presence_ttl_ms: int = 150

    @pytest.fixture
    def store(self) -> Any:
        """Override: yield (or return) the store under test."""
        raise NotImplementedError("override the `store` fixture in your conformance class")

    @pytest.fixture
    def small_store(self) -> Any:
        """Override: a store whose streams keep at most 5 parts (for the retention check)."""
        pytest.skip("small_store is not overridden for this store")

    @pytest.fixture
    def leases(self) -> Any:
        """Override with the lease provider the store fuses with (enables the fused checks)."""
        return None

    async def advance(self, store: SignalStore, ms: int) -> None:
        """Let ``ms`` milliseconds pass for ``store`` (default: sleep)."""
        await anyio.sleep(ms / 1000)

    async def expire_receipts(self, store: SignalStore) -> None:
        """Override: let the receipt retention pass. Default: skip the check that needs it."""
        pytest.skip("expire_receipts is not overridden for this store")

    async def _accept_many(self, store: SignalStore, thread: str, n: int) -> list[Signal]:
        signals = [Signal({"n": i}, id=f"s{i}") for i in range(n)]
        for signal in signals:
            assert (await store.accept(thread, signal, "deliver")).fresh
        return signals


@pytest.mark.anyio
class ControlChecks(StoreFixtures):
    """Checks of abort and cancel, and of the fused calls (skipped without them)."""

    # -- control: abort and cancel --------------------------------------------------------------

    async def _hold(self, store: SignalStore, leases: Any, thread: str, run_id: str) -> None:
        """Make ``run_id`` the live owner where the store checks leases itself."""
        fuses = getattr(store, "fuses_with", None)
        if leases is not None and callable(fuses) and fuses(leases):
            assert (await leases.acquire_lease(thread, run_id, 10_000)).acquired

    async def test_cancel_withdraws_what_no_run_holds(
        self, store: SignalStore, leases: Any
    ) -> None:
        thread = new_name("t")
        await self._hold(store, leases, thread, "r/1")
        await self._accept_many(store, thread, 3)
        entries = await store.read(thread)
        await store.deliver(thread, entries[0].entry_id, "s0", "r/1", max_attempts=5)
        removed = await store.cancel(thread, ["s0", "s1", "nope"], in_flight_run="r/1")
        assert removed == ["s1"]
        assert ids(await store.read(thread)) == ["s0", "s2"]
        receipt = await store.receipt(thread, "s1")
        assert receipt is not None and receipt.status == "cancelled"
        assert await store.deliver(thread, entries[1].entry_id, "s1", "r/1", max_attempts=5) == 0
        assert ("signal.cancelled", "s1") in [
            (p.kind, p.signal_id) for p in await store.stream_read(thread)
        ]
        assert await store.cancel(thread, ["s2"], in_flight_run="r/1") == ["s2"]

    async def test_abort_notifies_the_run_s_runtime_and_can_clear(
        self, store: SignalStore, leases: Any
    ) -> None:
        thread, rid = new_name("t"), new_name("rt")
        await self._hold(store, leases, thread, f"{rid}/1")
        await self._accept_many(store, thread, 2)
        got: list[Notice] = []
        async with store.listen(rid, got.append, worker=False):
            run = await store.abort(thread, f"{rid}/1", reason="stop", clear=True)
            with anyio.fail_after(5):
                while len(got) < 2:  # noqa: ASYNC110 (notices arrive over the network)
                    await anyio.sleep(0.01)
        assert run == f"{rid}/1"
        assert got[1] == Notice("abort", thread, f"{rid}/1", "stop")
        assert await store.pending_count(thread) == 0
        receipt = await store.receipt(thread, "s0")
        assert receipt is not None and receipt.status == "cancelled"
        meta = await store.thread_meta([thread])
        assert meta[thread]["abort"] == f"{rid}/1" and meta[thread]["pending"] == 0

    # -- fused calls --------------------------------------------------------------------------

    def _fused(self, store: SignalStore, leases: Any) -> Any:
        if leases is None or not store.fuses_with(leases):  # type: ignore[attr-defined]
            pytest.skip("this store offers no fused calls with these leases")
        return store

    async def test_route_claims_a_free_thread(self, store: SignalStore, leases: Any) -> None:
        fused = self._fused(store, leases)
        thread, rid = new_name("t"), new_name("rt")
        claim = Claim(f"{rid}/1", 10_000, None, rid)
        routed = await fused.route(thread, Signal(1, id="a"), "deliver", claim=claim,
                                   sender=rid, wake_workers=True)
        assert routed.fresh and routed.claimed and routed.owner == f"{rid}/1"
        assert await leases.get_lease_owner(thread) == f"{rid}/1"
        assert thread not in await store.pending_threads(limit=ALL)
        dup = await fused.route(thread, Signal(1, id="a"), "deliver", claim=None, sender=None,
                                wake_workers=True)
        assert not dup.fresh and not dup.claimed and dup.owner == f"{rid}/1"

    async def test_route_notifies_the_owner_or_the_workers(
        self, store: SignalStore, leases: Any
    ) -> None:
        fused = self._fused(store, leases)
        owned, free, owner_rt, worker = new_name("t"), new_name("t"), new_name("rt"), new_name("rt")
        await leases.acquire_lease(owned, f"{owner_rt}/7", 10_000)
        got: list[Notice] = []
        other: list[Notice] = []
        async with store.listen(owner_rt, got.append, worker=False), store.listen(
            worker, other.append, worker=True
        ):
            routed = await fused.route(owned, Signal(1), "deliver", claim=None, sender=None,
                                       wake_workers=True)
            assert routed.owner == f"{owner_rt}/7" and not routed.claimed
            routed = await fused.route(free, Signal(2), "deliver", claim=None, sender=None,
                                       wake_workers=True)
            assert routed.owner is None and free in await store.pending_threads(limit=ALL)
            with anyio.fail_after(5):
                while len(got) < 2 or len(other) < 2:  # noqa: ASYNC110 (as above)
                    await anyio.sleep(0.01)
        notice = got[1]
        assert (notice.kind, notice.thread_key, notice.run_id) == ("signal", owned, f"{owner_rt}/7")
        if notice.entry is not None:  # carried: already delivered to that run
            assert notice.entry.delivered == 1 and notice.entry.signal.payload == 1
            [entry] = await store.read(owned)
            assert entry.attempts == 1 and entry.entry_id == notice.entry.entry_id
        assert other[1] == Notice("work", free)

    async def test_release_if_idle_keeps_a_thread_with_work(
        self, store: SignalStore, leases: Any
    ) -> None:
        fused = self._fused(store, leases)
        thread, rid = new_name("t"), new_name("rt")
        claim = Claim(f"{rid}/1", 10_000, None, rid)
        await fused.route(thread, Signal(1, id="a"), "deliver", claim=claim, sender=rid,
                          wake_workers=False)
        assert not await fused.release_if_idle(thread, f"{rid}/1", rid)
        [entry] = await store.read(thread)
        await store.ack(thread, [Ack(entry.entry_id, "a", f"{rid}/1")])
        assert await fused.release_if_idle(thread, f"{rid}/1", rid)
        assert await leases.get_lease_owner(thread) is None

    async def test_a_stale_run_can_neither_take_nor_ack(
        self, store: SignalStore, leases: Any
    ) -> None:
        fused = self._fused(store, leases)
        thread = new_name("t")
        await store.accept(thread, Signal(1, id="a"), "deliver")
        [entry] = await store.read(thread)
        await leases.acquire_lease(thread, "new/1", 10_000)
        assert await store.deliver(thread, entry.entry_id, "a", "old/1", max_attempts=5) == -2
        assert await store.ack(thread, [Ack(entry.entry_id, "a", "old/1")]) is False
        assert await store.pending_count(thread) == 1
        assert await store.deliver(thread, entry.entry_id, "a", "new/1", max_attempts=5) == 1
        assert await fused.claim_pending(thread, Claim("x/1", 10_000, None, "x")) is not None

    async def test_abort_checks_the_lease_atomically(
        self, store: SignalStore, leases: Any
    ) -> None:
        self._fused(store, leases)
        thread = new_name("t")
        assert await store.abort(thread, None, reason="", clear=False) is None  # nobody runs it
        await leases.acquire_lease(thread, "rt-x/2", 10_000)
        assert await store.abort(thread, "rt-x/1", reason="", clear=False) is None  # a successor
        assert await store.abort(thread, None, reason="", clear=False) == "rt-x/2"

    async def test_claim_pending_takes_only_ownerless_work(
        self, store: SignalStore, leases: Any
    ) -> None:
        fused = self._fused(store, leases)
        rid = new_name("rt")
        empty, owned, free = new_name("t"), new_name("t"), new_name("t")
        await leases.acquire_lease(owned, "someone/1", 10_000)
        for thread in (owned, free):
            await store.accept(thread, Signal(1), "deliver")
        assert (await fused.claim_pending(empty, Claim(f"{rid}/1", 10_000, None, rid))).empty
        got = await fused.claim_pending(owned, Claim(f"{rid}/2", 10_000, None, rid))
        assert not got.claimed and got.owner == "someone/1"
        got = await fused.claim_pending(free, Claim(f"{rid}/3", 10_000, None, rid))
        assert got.claimed and got.token is not None
        pending = await store.pending_threads(limit=ALL)
        assert owned not in pending and free not in pending

    async def test_a_live_owner_only_defers_its_thread_until_the_lease_would_expire(
        self, store: SignalStore, leases: Any
    ) -> None:
        """The holder may be dead (its presence lapsed before its lease): recovery must come
        back to the thread once the lease expires, not forget it."""
        fused = self._fused(store, leases)
        rid, thread = new_name("rt"), new_name("t")
        await leases.acquire_lease(thread, "dead-runtime/1", 300)
        await store.accept(thread, Signal(1), "deliver")
        got = await fused.claim_pending(thread, Claim(f"{rid}/1", 10_000, None, rid))
        assert not got.claimed and got.owner == "dead-runtime/1"
        assert thread not in await store.pending_threads(limit=ALL), "deferred while it is live"
        await self.advance(store, 400)
        assert thread in await store.pending_threads(limit=ALL), "back once the lease expired"
        assert (await fused.claim_pending(thread, Claim(f"{rid}/2", 10_000, None, rid))).claimed
