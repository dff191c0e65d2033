"""The in-memory store's quick paths (``signals._backends.memory.quick``) leave the state the
engine leaves: random calls on one thread of two stores, one with the paths and one
without, each fused with its own lease provider on one clock the test moves; every answer is
compared, and after every step so are the stores' rows, receipts (in their order), output
parts and the notices they sent."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from leases import InMemoryLeaseProvider
from signals import Signal
from signals._backends.memory import quick
from signals._backends.memory.store import InMemorySignalStore
from signals.kit import Limits, Notice
from tests._two_cores import TwoCoresMachine

NOW = 1_800_000_000.0


def _notice(runtime_id: str | None, n: Notice) -> Any:
    e = n.entry
    entry = None if e is None else (e.entry_id, e.signal.id, e.signal.attempt, e.signal.mode,
                                    e.mode, e.attempts, e.size, e.state, e.holder, e.due_at)
    return runtime_id, n.kind, n.thread_key, n.run_id, n.reason, entry


def _state(store: InMemorySignalStore) -> Any:
    state: Any = store._state
    out: dict[str, Any] = {"threads": {k: dataclasses.asdict(t) for k, t in state.threads.items()}}
    for key, box in state.inboxes.items():
        out[key] = (
            {seq: {f: getattr(e, f) for f in e.__slots__ if f != "signal"}
             for seq, e in box.rows.items()},
            box.by_sid, sorted(box.carried), box.lanes,
            [dataclasses.asdict(r) for r in box.receipts.values()],
        )
    out["parts"] = {key: [(p.n, p.now, p.kind, p.run_id, p.signal_id, p.data) for p in o.parts]
                    for key, o in store._outputs.items()}
    return out


class QuickMachine(TwoCoresMachine):
    def __init__(self) -> None:
        super().__init__()
        self.notices: list[list[Any]] = []
        self.clock = NOW  # one clock for both stores and their leases (the tick rule moves it)
        for fast in (True, False):
            store = InMemorySignalStore(
                leases=InMemoryLeaseProvider(clock=lambda: self.clock - NOW),
                clock=lambda: self.clock, max_receipts=5, retention_ms=20_000,
                stream_max_parts=6, stream_retention_ms=20_000)
            store.quick_paths = fast
            sent: list[Any] = []

            def notify(runtime_id: str | None, notice: Notice, sent: list[Any] = sent) -> None:
                sent.append(_notice(runtime_id, notice))
            store._notify = notify  # type: ignore[method-assign]
            self.cores.append(store)
            self.notices.append(sent)

    def now(self) -> float:
        return self.clock

    @rule(seconds=st.sampled_from([0.5, 2, 25]))
    def tick(self, seconds: float) -> None:
        """Time passes: receipts, parts and leases (60 s) grow old."""
        self.clock += seconds

    @invariant()
    def same_state(self) -> None:
        fast, slow = (_state(store) for store in self.cores)
        assert fast == slow
        assert self.notices[0] == self.notices[1]


def test_the_quick_paths_leave_the_state_the_engine_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from signals._backends.memory import store as memory_store
    used = {"carry": 0, "settle_acks": 0}

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            done = fn(*args, **kwargs)
            used[name] += done is not None
            return done
        return wrapper
    monkeypatch.setattr(memory_store, "carry", counting("carry", quick.carry))
    monkeypatch.setattr(memory_store, "settle_acks", counting("settle_acks", quick.settle_acks))
    run_state_machine_as_test(QuickMachine, settings=settings(
        max_examples=200, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    assert min(used.values()) >= 50, f"the quick paths ran {used}: the test proves nothing"


@pytest.mark.anyio
async def test_a_carry_is_whole_before_its_notice_is_sent() -> None:
    """The quick path indexes the thread (for recovery, should the owner die) before it tells
    the owner's runtime, as the engine sends its notices after the whole step: a listener
    that raises leaves both stores alike."""
    found = []
    first, signal = Signal({}, id="first"), Signal({}, id="s")
    for quick_paths in (True, False):
        store = InMemorySignalStore(leases=InMemoryLeaseProvider(clock=lambda: 0.0),
                                    clock=lambda: NOW)
        store.quick_paths = quick_paths
        await store.accept("th", first, "deliver")  # the thread and its inbox
        await store.look_at("th", NOW)
        await store.withdraw("th", None)  # drained: not indexed
        leases: Any = store.leases
        await leases.acquire_lease("th", "rt/1", 60_000)

        def fails(notice: Notice) -> None:
            raise RuntimeError("the listener failed")
        store._listeners["rt"] = fails
        with pytest.raises(RuntimeError, match="listener failed"):
            await store.route("th", signal, "deliver", claim=None, sender="other",
                              wake_workers=True, limits=Limits())
        found.append(_state(store))
    assert found[0] == found[1]
    assert found[0]["threads"]["th"]["look"] == NOW
