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
from signals._backends.memory import quick
from signals._backends.memory.store import InMemorySignalStore
from signals.kit import Notice
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
