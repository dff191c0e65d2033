"""``Run`` on its own, over a real in-memory core: orders of events the runtime cannot force."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from leases import InMemoryLeaseProvider
from pubsub import InMemoryPubSub
from signals import BackendUnavailableError, InMemorySignalStore, Signal
from signals._run import Doorbell, Run
from signals.kit import Claim, InboxEntry, KitStore

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def _a_run(first: Signal) -> AsyncIterator[tuple[InMemorySignalStore, KitStore, Run]]:
    """Run ``rt-a/1`` of thread ``t`` over an in-memory core, holding the thread: ``first``
    was routed with its claim (and is carried to it)."""
    leases = InMemoryLeaseProvider()
    core = InMemorySignalStore(leases=leases)
    async with InMemoryPubSub() as pubsub:
        kit = KitStore(core, leases, pubsub, prefix="signals", runtime_id="rt-a",
                       heartbeat=None, new_run_id=lambda: "rt-a/1")
        routed = await core.route("t", first, "deliver",
                                  claim=Claim("rt-a/1", 60_000, None, "rt-a"), sender="rt-x",
                                  wake_workers=False)
        assert routed.claimed
        yield core, kit, Run(run_id="rt-a/1", thread_key="t", token=routed.token, store=kit,
                             doorbell=Doorbell(), idle_wait_s=0, max_attempts=5,
                             max_bytes=1 << 20)


async def test_a_carried_signal_is_handed_out_once_whether_take_or_notice_comes_first() -> None:
    """The core hands a signal carried to a run to that run's next take, and the notice that
    carries it may arrive after that take (Redis delivers notices on another connection): the
    run hands it out once."""
    async with _a_run(Signal("a", id="a")) as (core, _kit, run):
        a = await run.next_signal(timeout=0)
        assert a is not None and a.id == "a"
        await run.ack(a)
        signal = Signal("b", id="b")
        routed = await core.route("t", signal, "deliver", claim=None, sender="rt-x",
                                  wake_workers=False)
        assert routed.carried and routed.owner == "rt-a/1"
        entry = InboxEntry(routed.accepted.entry_id or "", signal.evolve(attempt=1), "deliver",
                           1, len(signal.encode()), "carried", "rt-a/1")
        await run._take()  # the take comes first and returns the carried entry
        run.offer(entry)  # then the notice that carried it
        handed = [await run.next_signal(timeout=0), await run.next_signal(timeout=0)]
        assert [s.id if s else None for s in handed] == ["b", None]


def _signals_held(obj: object, depth: int = 6) -> int:
    """How many signals ``obj`` refers to, through up to ``depth`` containers or objects."""
    seen: set[int] = set()
    found = 0
    level = [obj]
    for _ in range(depth):
        below = []
        for item in level:
            for ref in gc.get_referents(item):
                if id(ref) in seen or isinstance(ref, type | str | int | float):
                    continue
                seen.add(id(ref))
                if isinstance(ref, Signal):
                    found += 1
                else:
                    below.append(ref)
        level = below
    return found


async def test_a_long_run_remembers_a_bounded_number_of_acknowledgements(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that lives for many signals keeps the ids of its last acknowledgements only (a
    second ack of one of them is a no-op), none of what notices carried once acked, and none
    of the signals it handed out: its memory does not grow with the signals it processed."""
    import signals._run as run_module

    monkeypatch.setattr(run_module, "_KEEP_ACKED", 50)
    async with _a_run(Signal(0, id="s0")) as (core, _kit, run):
        for i in range(1, 121):
            signal = await run.next_signal(timeout=0)
            assert signal is not None and signal.id == f"s{i - 1}", i
            run.note_carried(signal.id)
            await run.ack(signal)
            signal = Signal(i, id=f"s{i}")
            routed = await core.route("t", signal, "deliver", claim=None, sender="rt-x",
                                      wake_workers=False)
            assert routed.carried
            run.offer(InboxEntry(routed.accepted.entry_id or "", signal.evolve(attempt=1),
                                 "deliver", 1, len(signal.encode()), "carried", "rt-a/1"))
        assert len(run._acked) == 50 and not run._carried
        assert run.consumed == 120 and list(run.first_ids) == ["s0", "s1", "s2"]
        assert _signals_held(run) == 1  # the last one carried, not yet handed out
        await run.ack("s119")  # remembered: a no-op
        with pytest.raises(ValueError, match="was not handed to this run"):
            await run.ack("s0")  # forgotten long ago


async def test_an_ack_while_the_store_is_unavailable_is_retried() -> None:
    """A settle that raises ``BackendUnavailableError`` is tried again after a back-off, and
    the ack then goes through (the first attempt is made without the retry helper)."""
    async with _a_run(Signal("a", id="a")) as (core, kit, run):
        calls: list[str] = []
        settle = kit.settle

        async def flaky(*args: Any, **kwargs: Any) -> bool:
            calls.append("settle")
            if len(calls) < 3:
                raise BackendUnavailableError("the store is down")
            return await settle(*args, **kwargs)
        kit.settle = flaky
        a = await run.next_signal(timeout=0)
        assert a is not None
        await run.ack(a)
        assert calls == ["settle"] * 3
        receipt = await core.receipt("t", "a")
        assert receipt is not None and receipt.status == "processed"
