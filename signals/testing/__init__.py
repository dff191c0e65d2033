"""Test helpers for ``SignalStore`` backends: the conformance suite and a recording store.

:class:`SignalStoreConformance` checks every rule of the store contract with pytest. To run
it against your backend, subclass it in a test module under a name that starts with ``Test``
and override its ``store`` fixture::

    class TestMyStore(SignalStoreConformance):
        @pytest.fixture
        async def store(self):
            async with MyStore(...) as store:
                yield store

The checks are marked ``anyio``: your ``anyio_backend`` fixture picks the event loops (pin it
to ``"asyncio"`` for an asyncio-only client). A store with the fused calls (``route``,
``release_if_idle``, ``claim_pending``) also overrides the ``leases`` fixture with the lease
provider it fuses with; without it the fused checks are skipped. Every check uses fresh thread
keys and runtime ids, so one store may be shared. Presence checks wait with
:meth:`~SignalStoreConformance.advance` (a real sleep unless you override it to move a fake
clock); the receipt-retention check runs only when you override
:meth:`~SignalStoreConformance.expire_receipts`.

:class:`RecordingSignalStore` wraps a store and records each call, to count round trips.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from _signal_leases.errors import CursorExpiredError
from signals._model import Signal
from signals._store import (
    Ack,
    Notice,
    PartIn,
    RuntimeInfo,
    SignalStore,
    is_signal_store,
)
from signals.testing._checks import ALL, ControlChecks, ids, new_name

__all__ = ["RecordingSignalStore", "SignalStoreConformance"]


@pytest.mark.anyio
class SignalStoreConformance(ControlChecks):
    """Mix-in test class: every rule of the ``SignalStore`` contract, one check each."""

    # -- accept, read -------------------------------------------------------------------------

    async def test_is_a_signal_store(self, store: SignalStore) -> None:
        assert is_signal_store(store)

    async def test_empty_thread_reads_nothing(self, store: SignalStore) -> None:
        thread = new_name("t")
        assert await store.read(thread) == []
        assert await store.pending_count(thread) == 0
        assert await store.receipt(thread, "nope") is None

    async def test_signal_and_mode_survive_the_trip(self, store: SignalStore) -> None:
        thread = new_name("t")
        payload = {"text": "héllo ✓ \ud800", "nested": [1, 2.5, None, True, {"k": "v"}]}
        one = Signal(payload, type="system", id="one", created_at=1_700_000_000.25)
        two = Signal("plain", id="two")
        assert (await store.accept(thread, one, "deliver")).fresh
        assert (await store.accept(thread, two, "queue")).fresh
        entries = await store.read(thread)
        assert [(e.signal, e.mode, e.attempts) for e in entries] == [
            (one, "deliver", 0), (two, "queue", 0)
        ]
        assert entries[0].signal.payload == payload

    async def test_entries_come_back_in_accept_order(self, store: SignalStore) -> None:
        thread = new_name("t")
        signals = await self._accept_many(store, thread, 25)
        entries = await store.read(thread)
        assert ids(entries) == [s.id for s in signals]
        assert len({e.entry_id for e in entries}) == 25

    async def test_read_after_is_exclusive_and_limit_caps(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 6)
        first_two = await store.read(thread, limit=2)
        assert ids(first_two) == ["s0", "s1"]
        rest = await store.read(thread, after=first_two[-1].entry_id)
        assert ids(rest) == ["s2", "s3", "s4", "s5"]
        assert await store.read(thread, after=rest[-1].entry_id) == []

    async def test_read_is_bounded_by_bytes_but_returns_at_least_one(
        self, store: SignalStore
    ) -> None:
        thread = new_name("t")
        for i in range(4):
            assert (await store.accept(thread, Signal("x" * 4000, id=f"b{i}"), "deliver")).fresh
        assert ids(await store.read(thread, max_bytes=9000)) == ["b0", "b1"]
        assert ids(await store.read(thread, max_bytes=10)) == ["b0"]

    async def test_threads_are_separate(self, store: SignalStore) -> None:
        a, b = new_name("t"), new_name("t")
        assert (await store.accept(a, Signal("a", id="same"), "deliver")).fresh
        assert (await store.accept(b, Signal("b", id="same"), "deliver")).fresh
        assert [e.signal.payload for e in await store.read(a)] == ["a"]
        assert [e.signal.payload for e in await store.read(b)] == ["b"]

    # -- dedup and receipts -------------------------------------------------------------------

    async def test_accept_writes_a_pending_receipt(self, store: SignalStore) -> None:
        thread = new_name("t")
        await store.accept(thread, Signal(1, id="r"), "deliver")
        receipt = await store.receipt(thread, "r")
        assert receipt is not None and receipt.status == "pending" and not receipt.done

    async def test_duplicate_is_refused_with_the_original_receipt(self, store: SignalStore) -> None:
        thread = new_name("t")
        assert (await store.accept(thread, Signal("first", id="dup"), "deliver")).fresh
        again = await store.accept(thread, Signal("second", id="dup"), "queue")
        assert not again.fresh and again.receipt is not None
        assert again.receipt.status == "pending"
        assert [(e.signal.payload, e.mode) for e in await store.read(thread)] == [
            ("first", "deliver")
        ]

    async def test_acked_ids_stay_deduplicated(self, store: SignalStore) -> None:
        thread = new_name("t")
        await store.accept(thread, Signal("x", id="done"), "deliver")
        [entry] = await store.read(thread)
        await store.ack(thread, [Ack(entry.entry_id, "done", "run-1")])
        again = await store.accept(thread, Signal("x", id="done"), "deliver")
        assert not again.fresh and again.receipt is not None
        assert again.receipt.status == "processed"
        assert await store.read(thread) == []

    async def test_concurrent_accepts_of_one_id_store_it_once(self, store: SignalStore) -> None:
        thread = new_name("t")
        fresh: list[bool] = []

        async def accept(i: int) -> None:
            fresh.append((await store.accept(thread, Signal(i, id="race"), "deliver")).fresh)

        async with anyio.create_task_group() as tg:
            for i in range(self.racers):
                tg.start_soon(accept, i)
        assert sorted(fresh) == [False] * (self.racers - 1) + [True]
        assert await store.pending_count(thread) == 1

    async def test_an_id_is_accepted_again_after_retention(self, store: SignalStore) -> None:
        thread = new_name("t")
        await store.accept(thread, Signal("x", id="old"), "deliver")
        [entry] = await store.read(thread)
        await store.ack(thread, [Ack(entry.entry_id, "old", "run-1")])
        await self.expire_receipts(store)
        assert await store.receipt(thread, "old") is None
        assert (await store.accept(thread, Signal("y", id="old"), "deliver")).fresh

    # -- deliver, ack, dead letters -----------------------------------------------------------

    async def test_ack_removes_and_records_the_result(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 3)
        entries = await store.read(thread)
        await store.ack(thread, [Ack(entries[1].entry_id, "s1", "run-1", json.dumps({"ok": 1}))])
        assert ids(await store.read(thread)) == ["s0", "s2"]
        assert await store.pending_count(thread) == 2
        receipt = await store.receipt(thread, "s1")
        assert receipt is not None
        assert (receipt.status, receipt.run_id, receipt.result) == ("processed", "run-1", {"ok": 1})
        # Acknowledging again, or an unknown entry, changes nothing.
        await store.ack(thread, [Ack(entries[1].entry_id, "s1", "run-2")])
        again = await store.receipt(thread, "s1")
        assert again is not None and again.run_id == "run-1"
        assert ids(await store.read(thread, after=entries[1].entry_id)) == ["s2"]

    async def test_deliver_counts_once_per_run(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 1)
        [entry] = await store.read(thread)
        assert await store.deliver(thread, entry.entry_id, "s0", "run-1", max_attempts=5) == 1
        assert await store.deliver(thread, entry.entry_id, "s0", "run-1", max_attempts=5) == 1
        assert await store.deliver(thread, entry.entry_id, "s0", "run-2", max_attempts=5) == 2
        [again] = await store.read(thread)
        assert again.attempts == 2 and again.signal.attempt == 2

    async def test_deliver_of_a_gone_entry_is_zero(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 1)
        [entry] = await store.read(thread)
        await store.ack(thread, [Ack(entry.entry_id, "s0", "run-1")])
        assert await store.deliver(thread, entry.entry_id, "s0", "run-2", max_attempts=5) == 0

    async def test_too_many_attempts_dead_letter_the_signal(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 2)
        [poison, other] = await store.read(thread)
        for attempt in (1, 2):
            assert await store.deliver(
                thread, poison.entry_id, "s0", f"run-{attempt}", max_attempts=2
            ) == attempt
        await store.note_failure(thread, ["s0"], "ValueError: bad input")
        assert await store.deliver(thread, poison.entry_id, "s0", "run-3", max_attempts=2) == -1
        assert ids(await store.read(thread)) == ["s1"]
        receipt = await store.receipt(thread, "s0")
        assert receipt is not None and receipt.status == "dead_lettered"
        assert receipt.error == "ValueError: bad input"
        [dead] = await store.dead_letters(thread)
        assert (dead.signal.id, dead.attempts, dead.error) == ("s0", 2, "ValueError: bad input")
        assert await store.deliver(thread, other.entry_id, "s1", "run-3", max_attempts=2) == 1

    async def test_dead_letters_can_be_retried_and_purged(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 2)
        for entry in await store.read(thread):
            await store.deliver(thread, entry.entry_id, entry.signal.id, "r1", max_attempts=0)
        assert sorted(d.signal.id for d in await store.dead_letters(thread)) == ["s0", "s1"]
        assert await store.retry_dead(thread, ["s0", "missing"]) == ["s0"]
        [entry] = await store.read(thread)
        assert (entry.signal.id, entry.attempts) == ("s0", 0)
        receipt = await store.receipt(thread, "s0")
        assert receipt is not None and receipt.status == "pending"
        assert await store.purge_dead(thread) == 1
        assert await store.dead_letters(thread) == []

    # -- pending index and registry -----------------------------------------------------------

    async def test_accept_indexes_and_the_last_ack_unindexes(self, store: SignalStore) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 2)
        assert thread in await store.pending_threads(limit=ALL)
        entries = await store.read(thread)
        await store.ack(thread, [Ack(entries[0].entry_id, "s0", "r")])
        assert thread in await store.pending_threads(limit=ALL)
        await store.ack(thread, [Ack(entries[1].entry_id, "s1", "r")])
        assert thread not in await store.pending_threads(limit=ALL)
        await store.accept(thread, Signal(1), "deliver")
        await store.unindex(thread)
        assert thread not in await store.pending_threads(limit=ALL)

    async def test_a_dead_runtime_s_threads_are_indexed(self, store: SignalStore) -> None:
        alive, dead = new_name("rt"), new_name("rt")
        busy, idle = new_name("t"), new_name("t")
        await store.accept(busy, Signal(1), "deliver")
        await store.unindex(busy)  # as if a runtime had claimed it
        for rid in (alive, dead):
            await store.register_runtime(RuntimeInfo(rid, "h", 1, 0.0, True), self.presence_ttl_ms)
        await store.track_threads(dead, add=[busy, idle])
        assert {r.runtime_id for r in await store.runtimes()} >= {alive, dead}
        await self.advance(store, self.presence_ttl_ms // 2)
        assert await store.refresh_runtime(alive, self.presence_ttl_ms)
        await self.advance(store, self.presence_ttl_ms // 2 + 50)
        assert dead in await store.orphan_dead_runtimes()
        assert not await store.refresh_runtime(dead, self.presence_ttl_ms)
        assert busy in await store.pending_threads(limit=ALL)
        assert alive in {r.runtime_id for r in await store.runtimes()}
        assert dead not in await store.orphan_dead_runtimes()
        await store.unregister_runtime(alive)

    # -- notices ------------------------------------------------------------------------------

    async def test_notices_reach_their_runtime_and_workers(self, store: SignalStore) -> None:
        me, other = new_name("rt"), new_name("rt")
        got: list[Notice] = []
        async with store.listen(me, got.append, worker=True):
            assert got[0].kind == "resync"
            await store.notify(me, Notice("abort", "t1", "run-1", "why"))
            await store.notify(other, Notice("signal", "t2"))
            await store.notify(None, Notice("work", "t3"))
            with anyio.fail_after(5):
                while len(got) < 3:  # noqa: ASYNC110 (notices arrive over the network)
                    await anyio.sleep(0.01)
        assert got[1:] == [Notice("abort", "t1", "run-1", "why"), Notice("work", "t3")]

    # -- output streams -------------------------------------------------------------------------

    async def test_parts_come_back_in_order_and_resume_from_every_cursor(
        self, store: SignalStore
    ) -> None:
        thread = new_name("t")
        cursors = await store.emit(thread, [PartIn("part", "r/1", None, json.dumps(i))
                                            for i in range(7)])
        assert len(cursors) == len(set(cursors)) == 7
        assert await store.stream_tail(thread) == cursors[-1]
        parts = await store.stream_read(thread)
        assert [p.data for p in parts] == list(range(7))
        assert [p.cursor for p in parts] == cursors
        assert all(p.kind == "part" and p.run_id == "r/1" and p.thread_key == thread
                   for p in parts)
        for i, cursor in enumerate(cursors):  # no gap, no repeat, from every cursor
            assert [p.data for p in await store.stream_read(thread, after=cursor)] == list(
                range(i + 1, 7)
            )
        assert [p.data for p in await store.stream_read(thread, limit=3)] == [0, 1, 2]
        assert await store.stream_read(new_name("t")) == []
        assert await store.stream_tail(new_name("t")) is None

    async def test_deliver_ack_and_dead_letters_write_lifecycle_parts(
        self, store: SignalStore
    ) -> None:
        thread = new_name("t")
        await self._accept_many(store, thread, 2)
        a, b = await store.read(thread)
        await store.deliver(thread, a.entry_id, "s0", "r/1", max_attempts=5)
        await store.ack(thread, [Ack(a.entry_id, "s0", "r/1", json.dumps({"answer": 42}))])
        await store.deliver(thread, b.entry_id, "s1", "r/1", max_attempts=0)
        kinds = [(p.kind, p.signal_id, p.data) for p in await store.stream_read(thread)]
        assert kinds == [
            ("signal.received", "s0", {"attempt": 1}),
            ("signal.acked", "s0", {"result": {"answer": 42}}),
            ("signal.dead_lettered", "s1", {"attempts": 0, "error": None}),
        ]

    async def test_a_trimmed_cursor_is_refused_not_skipped(self, small_store: Any) -> None:
        from signals._model import StreamPart  # noqa: F401  (the type the store returns)

        thread = new_name("t")
        cursors = await small_store.emit(thread, [PartIn("part", "r/1", None, str(i))
                                                  for i in range(8)])
        kept = await small_store.stream_read(thread)
        assert [p.data for p in kept] == [3, 4, 5, 6, 7], "the newest five are kept"
        assert [p.data for p in await small_store.stream_read(thread, after=cursors[2])] == [
            3, 4, 5, 6, 7]
        with pytest.raises(CursorExpiredError):
            await small_store.stream_read(thread, after=cursors[1])

    async def test_the_follower_hands_new_parts_to_waiters(self, store: SignalStore) -> None:
        thread = new_name("t")
        [first] = await store.emit(thread, [PartIn("part", "r/1", None, "1")])
        got: list[list[Any]] = []
        async with store.follower() as follower:

            async def wait(after: str | None) -> None:
                got.append([p.data for p in await follower.wait(thread, after)])

            assert [p.data for p in await follower.wait(thread, None)] == [1]
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(wait, first)
                await anyio.sleep(0.05)
                await store.emit(thread, [PartIn("part", "r/1", None, "2")])
        assert got == [[2], [2], [2]]



class RecordingSignalStore:
    """A store that records every call and forwards it to ``inner``.

    ``calls`` lists ``(method, thread key or "")`` tuples in order: count backend calls per
    signal in your tests (on the in-memory or Redis store, one store call is one round trip).
    Fused calls are offered exactly when ``inner`` offers them.
    """

    def __init__(self, inner: SignalStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    @property
    def retention_ms(self) -> int:
        return self.inner.retention_ms

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name in ("fuses_with", "listen", "follower") or not callable(method):
            return method

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            key = args[0] if args and isinstance(args[0], str) else ""
            self.calls.append((name, key))
            return await method(*args, **kwargs)

        return recorded
