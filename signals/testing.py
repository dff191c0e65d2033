"""A conformance suite for ``SignalInbox`` implementations, run by pytest.

Subclass :class:`SignalInboxConformance` in a test module (the class name must start with
``Test``) and override the ``inbox`` fixture; pytest then runs every check against your
backend. The checks are async and marked ``anyio``, so they run on the backends your
``anyio_backend`` fixture selects (pin it to ``"asyncio"`` for an asyncio-only client)::

    import pytest
    from collections.abc import AsyncIterator
    from signals.testing import SignalInboxConformance

    class TestMyInbox(SignalInboxConformance):
        @pytest.fixture
        async def inbox(self) -> AsyncIterator[MyInbox]:
            async with MyInbox(...) as inbox:
                yield inbox

Every check uses fresh thread keys, so one inbox may be shared by all checks. The check of
the dedup window's end runs only when you override :meth:`SignalInboxConformance.
expire_dedup_window` (to move a fake clock, say); it is skipped otherwise.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from ._inbox import InboxEntry, SignalInbox, is_signal_inbox
from ._model import Signal

__all__ = ["SignalInboxConformance"]

#: ``limit`` used by checks that look for a thread among all pending threads.
ALL_THREADS = 100_000


def _ids(entries: list[InboxEntry]) -> list[str]:
    return [e.signal.id for e in entries]


@pytest.mark.anyio
class SignalInboxConformance:
    """Mix-in test class: every semantic of the ``SignalInbox`` contract, one check each."""

    #: Concurrent appends of one signal id in the dedup race check.
    racers: int = 20

    @pytest.fixture
    def inbox(self) -> Any:
        """Override: yield (or return) the inbox under test."""
        raise NotImplementedError("override the `inbox` fixture in your conformance class")

    async def expire_dedup_window(self, inbox: SignalInbox) -> None:
        """Override: let the inbox's dedup window pass. Default: skip the check that needs it."""
        pytest.skip("expire_dedup_window is not overridden for this inbox")

    @staticmethod
    def thread() -> str:
        """A thread key no other check uses."""
        return f"conformance-{uuid.uuid4().hex}"

    async def _append_many(self, inbox: SignalInbox, thread: str, n: int) -> list[Signal]:
        signals = [Signal({"n": i}, id=f"s{i}") for i in range(n)]
        for signal in signals:
            assert await inbox.inbox_append(thread, signal, "deliver")
        return signals

    # -- detection, append, read ------------------------------------------------------------

    async def test_is_a_signal_inbox(self, inbox: SignalInbox) -> None:
        assert is_signal_inbox(inbox)

    async def test_empty_thread_reads_nothing(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        assert await inbox.inbox_read(thread) == []
        assert await inbox.inbox_pending_count(thread) == 0
        assert thread not in await inbox.inbox_pending_threads(ALL_THREADS)

    async def test_signal_and_mode_survive_the_trip(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        payload = {"text": "héllo ✓", "nested": [1, 2.5, None, True, {"k": "v"}]}
        one = Signal(payload, type="system", id="one", created_at=1_700_000_000.25)
        two = Signal("plain", id="two")
        assert await inbox.inbox_append(thread, one, "deliver") is True
        assert await inbox.inbox_append(thread, two, "queue") is True
        entries = await inbox.inbox_read(thread)
        assert [(e.signal, e.mode) for e in entries] == [(one, "deliver"), (two, "queue")]
        assert all(isinstance(e.entry_id, str) and e.entry_id for e in entries)

    async def test_entries_come_back_in_append_order(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        signals = await self._append_many(inbox, thread, 25)
        entries = await inbox.inbox_read(thread)
        assert _ids(entries) == [s.id for s in signals]
        assert len({e.entry_id for e in entries}) == 25

    async def test_read_after_is_exclusive_and_limit_caps(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        await self._append_many(inbox, thread, 6)
        first_two = await inbox.inbox_read(thread, limit=2)
        assert _ids(first_two) == ["s0", "s1"]
        rest = await inbox.inbox_read(thread, after=first_two[-1].entry_id)
        assert _ids(rest) == ["s2", "s3", "s4", "s5"]
        assert await inbox.inbox_read(thread, after=rest[-1].entry_id) == []

    async def test_paging_with_after_sees_every_entry_once(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        signals = await self._append_many(inbox, thread, 11)
        seen: list[str] = []
        after: str | None = None
        while page := await inbox.inbox_read(thread, after=after, limit=3):
            seen.extend(_ids(page))
            after = page[-1].entry_id
        assert seen == [s.id for s in signals]

    async def test_threads_are_separate(self, inbox: SignalInbox) -> None:
        a, b = self.thread(), self.thread()
        assert await inbox.inbox_append(a, Signal("a", id="same"), "deliver")
        assert await inbox.inbox_append(b, Signal("b", id="same"), "deliver")  # per thread
        assert [e.signal.payload for e in await inbox.inbox_read(a)] == ["a"]
        assert [e.signal.payload for e in await inbox.inbox_read(b)] == ["b"]

    # -- dedup ------------------------------------------------------------------------------

    async def test_duplicate_id_is_refused_and_not_stored(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        assert await inbox.inbox_append(thread, Signal("first", id="dup"), "deliver")
        assert await inbox.inbox_append(thread, Signal("second", id="dup"), "queue") is False
        entries = await inbox.inbox_read(thread)
        assert [(e.signal.payload, e.mode) for e in entries] == [("first", "deliver")]
        assert await inbox.inbox_pending_count(thread) == 1

    async def test_removed_ids_stay_deduplicated(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        assert await inbox.inbox_append(thread, Signal("x", id="done"), "deliver")
        [entry] = await inbox.inbox_read(thread)
        await inbox.inbox_remove(thread, [entry.entry_id])
        assert await inbox.inbox_append(thread, Signal("x", id="done"), "deliver") is False
        assert await inbox.inbox_read(thread) == []

    async def test_concurrent_appends_of_one_id_store_it_once(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        results: list[bool] = []

        async def append(i: int) -> None:
            results.append(await inbox.inbox_append(thread, Signal(i, id="race"), "deliver"))

        async with anyio.create_task_group() as tg:
            for i in range(self.racers):
                tg.start_soon(append, i)
        assert sorted(results) == [False] * (self.racers - 1) + [True]
        assert await inbox.inbox_pending_count(thread) == 1

    async def test_an_id_is_accepted_again_after_the_window(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        assert await inbox.inbox_append(thread, Signal("x", id="old"), "deliver")
        [entry] = await inbox.inbox_read(thread)
        await inbox.inbox_remove(thread, [entry.entry_id])
        await self.expire_dedup_window(inbox)
        assert await inbox.inbox_append(thread, Signal("y", id="old"), "deliver") is True
        assert [e.signal.payload for e in await inbox.inbox_read(thread)] == ["y"]

    # -- remove, count, pending threads -----------------------------------------------------

    async def test_removed_entries_are_never_read_again(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        await self._append_many(inbox, thread, 5)
        entries = await inbox.inbox_read(thread)
        await inbox.inbox_remove(thread, [entries[0].entry_id, entries[2].entry_id])
        assert _ids(await inbox.inbox_read(thread)) == ["s1", "s3", "s4"]
        assert await inbox.inbox_pending_count(thread) == 3
        # Reading after a removed entry still works.
        assert _ids(await inbox.inbox_read(thread, after=entries[2].entry_id)) == ["s3", "s4"]

    async def test_remove_is_idempotent_and_ignores_unknown_ids(
        self, inbox: SignalInbox
    ) -> None:
        thread = self.thread()
        await self._append_many(inbox, thread, 2)
        first = (await inbox.inbox_read(thread))[0]
        await inbox.inbox_remove(thread, [first.entry_id])
        await inbox.inbox_remove(thread, [first.entry_id])
        await inbox.inbox_remove(thread, [])
        await inbox.inbox_remove(self.thread(), [first.entry_id])  # another thread: no effect
        assert _ids(await inbox.inbox_read(thread)) == ["s1"]

    async def test_entry_ids_keep_growing_after_removal(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        assert await inbox.inbox_append(thread, Signal(1, id="a"), "deliver")
        [a] = await inbox.inbox_read(thread)
        await inbox.inbox_remove(thread, [a.entry_id])
        assert await inbox.inbox_append(thread, Signal(2, id="b"), "deliver")
        # An id handed out earlier still orders before everything appended since.
        assert _ids(await inbox.inbox_read(thread, after=a.entry_id)) == ["b"]

    async def test_pending_threads_lists_exactly_the_non_empty(self, inbox: SignalInbox) -> None:
        busy, done = self.thread(), self.thread()
        assert await inbox.inbox_append(busy, Signal(1), "deliver")
        assert await inbox.inbox_append(done, Signal(2), "deliver")
        pending = await inbox.inbox_pending_threads(ALL_THREADS)
        assert busy in pending and done in pending
        await inbox.inbox_remove(done, [e.entry_id for e in await inbox.inbox_read(done)])
        pending = await inbox.inbox_pending_threads(ALL_THREADS)
        assert busy in pending and done not in pending
        assert await inbox.inbox_pending_count(done) == 0

    async def test_pending_threads_respects_limit(self, inbox: SignalInbox) -> None:
        for _ in range(3):
            assert await inbox.inbox_append(self.thread(), Signal(0), "deliver")
        assert len(await inbox.inbox_pending_threads(2)) == 2

    # -- bad input --------------------------------------------------------------------------

    async def test_bad_thread_key_is_refused(self, inbox: SignalInbox) -> None:
        with pytest.raises(ValueError, match="thread key"):
            await inbox.inbox_append("", Signal(1), "deliver")
        with pytest.raises(TypeError, match="thread key"):
            await inbox.inbox_append(7, Signal(1), "deliver")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="thread key"):
            await inbox.inbox_read("")
        with pytest.raises(ValueError, match="thread key"):
            await inbox.inbox_pending_count("")

    async def test_bad_mode_is_refused(self, inbox: SignalInbox) -> None:
        thread = self.thread()
        with pytest.raises(ValueError, match="mode"):
            await inbox.inbox_append(thread, Signal(1), "later")  # type: ignore[arg-type]
        assert await inbox.inbox_pending_count(thread) == 0
