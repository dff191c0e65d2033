"""Dispositions through the runtime, on every backend: priority, lanes, caps, pause, and how
they play with steering, interrupts and dedup (docs/dispositions.md).

The core's rules are checked one by one by ``SignalCoreConformance`` on each backend; these
checks drive a whole ``SignalRuntime`` (runs, the steering buffer, reducers, pause notices).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from pubsub import InMemoryPubSub, PostgresPubSub, RedisStreamsPubSub, SQLitePubSub
from signals import Run, Signal, SignalRuntime
from signals.kit import decode_entry

pytestmark = pytest.mark.anyio

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis),
            pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
async def pubsub(request: pytest.FixtureRequest, anyio_backend: str, tmp_path: Path
                 ) -> AsyncIterator[Any]:
    kind = request.param
    made: Any
    if kind == "memory":
        made = InMemoryPubSub()
    elif kind == "sqlite":
        made = SQLitePubSub(tmp_path / "d.db")
    elif kind == "redis":
        if anyio_backend != "asyncio":
            pytest.skip("redis-py is asyncio-only")
        made = RedisStreamsPubSub(url=request.getfixturevalue("redis_url"),
                                  key_prefix=request.getfixturevalue("key_prefix"))
    else:
        made = PostgresPubSub(request.getfixturevalue("postgres_dsn"),
                              schema=request.getfixturevalue("pg_schema"))
    async with made:
        yield made


class Agent:
    """Records what it is handed; the first signal whose payload has ``hold`` waits for
    ``release`` (an interrupt cancels the wait)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, tuple[str, ...]]] = []
        self.release = anyio.Event()
        self.holding = anyio.Event()

    async def __call__(self, run: Run) -> None:
        async for signal in run:
            self.seen.append((signal.id, signal.payload, signal.folded))
            if self._holds(signal) and not self.holding.is_set():  # only the first waits
                self.holding.set()
                await self.release.wait()
            await run.ack(signal, result={"got": signal.id})

    @staticmethod
    def _holds(signal: Signal) -> bool:
        payloads = signal.payload if signal.folded else [signal.payload]
        return any(isinstance(p, dict) and p.get("hold") for p in payloads)

    def ids(self) -> list[str]:
        return [s[0] for s in self.seen]


def fold(signals: list[Signal]) -> list[Any]:
    return [s.payload for s in signals]


async def test_priority_order_after_a_pause(pubsub: Any) -> None:
    agent = Agent()
    async with SignalRuntime(pubsub=pubsub, agent=agent) as rt:
        assert await rt.pause("p") is False
        assert (await rt.thread("p")).paused
        for sid, prio in (("low", -1), ("n1", 0), ("high", 5), ("n2", 0)):
            await rt.send("p", Signal({}, id=sid, priority=prio))
        await anyio.sleep(0.2)
        assert agent.seen == []
        assert await rt.resume("p") is True
        await rt.wait_idle()
        assert agent.ids() == ["high", "n1", "n2", "low"]
        assert not (await rt.thread("p")).paused


async def test_a_steered_signal_takes_its_priority_into_account(pubsub: Any) -> None:
    agent = Agent()
    async with SignalRuntime(pubsub=pubsub, agent=agent) as rt:
        await rt.send("s", Signal({"hold": True}, id="first"))
        await agent.holding.wait()
        for sid, prio in (("low", -1), ("mid", 0), ("high", 3)):
            assert (await rt.send("s", Signal({}, id=sid, priority=prio))).outcome == "deliver"
        await anyio.sleep(0.2)  # the notices reach the run while its agent is busy
        agent.release.set()
        await rt.wait_idle()
        assert agent.ids() == ["first", "high", "mid", "low"]


async def test_pause_lets_the_signal_in_hand_finish_and_hands_out_no_more(pubsub: Any) -> None:
    agent = Agent()
    async with SignalRuntime(pubsub=pubsub, agent=agent) as rt:
        await rt.send("h", Signal({"hold": True}, id="busy"))
        await agent.holding.wait()
        await rt.send("h", Signal({}, id="next"))
        await rt.pause("h")
        agent.release.set()
        await rt.wait_idle()
        assert agent.ids() == ["busy"]
        busy = await rt.receipt("h", "busy")
        assert busy is not None and busy.status == "processed"
        nxt = await rt.receipt("h", "next")
        assert nxt is not None and nxt.status == "pending"
        await rt.resume("h")
        await rt.wait_idle()
        assert agent.ids() == ["busy", "next"]


async def test_lanes_supersede_coalesce_and_skip_unchanged(pubsub: Any) -> None:
    agent = Agent()
    async with SignalRuntime(pubsub=pubsub, agent=agent, reducers={"typing": fold}) as rt:
        await rt.pause("l")
        for n in range(3):
            await rt.send("l", Signal({"url": n}, id=f"b{n}", lane="browser", merge="supersede"))
            await rt.send("l", Signal(f"t{n}", id=f"k{n}", lane="typing", merge="coalesce"))
        first = await rt.send("l", Signal(1, id="u1", lane="state", cache_key="v"))
        same = await rt.send("l", Signal(1, id="u2", lane="state", cache_key="v"))
        assert (first.outcome, same.outcome) == ("queued", "unchanged")
        assert await rt.receipt("l", "u2") is None
        await rt.resume("l")
        await rt.wait_idle()
        # one priority: by accept order of each hand-out's oldest signal (k0 before b2)
        assert agent.seen == [("k2", ["t0", "t1", "t2"], ("k0", "k1", "k2")),
                              ("b2", {"url": 2}, ()), ("u1", 1, ())]
        for sid, status in (("b0", "superseded"), ("b1", "superseded"), ("b2", "processed")):
            receipt = await rt.receipt("l", sid)
            assert receipt is not None and receipt.status == status
        b0 = await rt.receipt("l", "b0")
        assert b0 is not None and b0.superseded_by == "b1"
        folded = [await rt.receipt("l", f"k{n}") for n in range(3)]
        assert all(r is not None and r.status == "processed" and r.result == {"got": "k2"}
                   for r in folded), folded  # one acknowledgement for all, the same result


async def test_the_cap_rejects_or_drops_the_oldest_of_the_lowest_priority(pubsub: Any) -> None:
    async with SignalRuntime(pubsub=pubsub, agent=None, max_pending_per_thread=2) as rt:
        assert (await rt.send("c", Signal({}, id="a"))).outcome == "queued"
        assert (await rt.send("c", Signal({}, id="b"))).outcome == "queued"
        refused = await rt.send("c", Signal({}, id="c"))
        assert refused.outcome == "rejected"
        assert "max_pending_per_thread=2" in (refused.reason or "")
        assert await rt.receipt("c", "c") is None
        again = await rt.send("c", Signal({}, id="a"))  # dedup by id comes first
        assert again.duplicate and again.outcome == "discarded"
    async with SignalRuntime(pubsub=pubsub, agent=None, max_pending_per_thread=2,
                             overflow="drop_oldest") as rt:
        await rt.send("d", Signal({}, id="keep", priority=1))
        await rt.send("d", Signal({}, id="old", priority=-1))
        pushed = await rt.send("d", Signal({}, id="new", priority=-1))
        assert pushed.dropped == ("old",)
        dropped = await rt.receipt("d", "old")
        assert dropped is not None and dropped.status == "dropped"
        assert [s.id for s in await rt.pending("d")] == ["keep", "new"]


@pytest.mark.parametrize("merge", ["append", "supersede", "coalesce"])
async def test_an_interrupt_with_a_lane(pubsub: Any, merge: str) -> None:
    """The interrupted signal goes back to the inbox; then its lane decides: ``append`` hands
    it out again before the new one, ``supersede`` replaces it by the new one (receipt
    ``superseded``), ``coalesce`` folds both into the next hand-out."""
    agent = Agent()
    async with SignalRuntime(pubsub=pubsub, agent=agent, reducers={"l": fold}) as rt:
        await rt.send("i", Signal({"hold": True}, id="a1", lane="l", merge=merge))  # type: ignore[arg-type]
        await agent.holding.wait()
        await rt.send("i", Signal("two", id="a2", lane="l", merge=merge),  # type: ignore[arg-type]
                      if_active="interrupt")
        await rt.wait_idle()
        handed = [(sid, folded) for sid, _, folded in agent.seen[1:]]
        statuses = [(await rt.receipt("i", s)).status for s in ("a1", "a2")]  # type: ignore[union-attr]
        if merge == "append":
            assert handed == [("a1", ()), ("a2", ())] and statuses == ["processed"] * 2
        elif merge == "supersede":
            assert handed == [("a2", ())] and statuses == ["superseded", "processed"]
        else:
            assert handed == [("a2", ("a1", "a2"))] and statuses == ["processed"] * 2


def test_a_signal_is_encoded_once_when_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON a send stores is built with the signal (a payload that is not JSON fails
    there, naming the payload), and only once: the send reuses it."""
    import _signal_leases.encoding

    encode, calls = _signal_leases.encoding._ENCODE, []  # (the JSON encoder every text uses)
    assert encode is not None

    def counting(value: Any, level: int) -> Any:
        calls.append(1)
        return encode(value, level)

    monkeypatch.setattr(_signal_leases.encoding, "_ENCODE", counting)
    signal = Signal({"big": "x" * 1000}, id="s1")
    assert signal.encode() is signal.encode()
    assert len(calls) == 1, "a large payload was encoded more than once"
    monkeypatch.undo()
    assert json.loads(signal.encode())["payload"] == {"big": "x" * 1000}
    with pytest.raises(TypeError, match="signal payload must be JSON"):
        Signal(object())
    with pytest.raises(TypeError, match="signal 's2' must be JSON"):
        Signal(1, id="s2", created_at=math.nan)
    copy = signal.with_trace_context({"traceparent": "00-ab-cd-01"})
    assert json.loads(copy.encode())["trace_context"] == {"traceparent": "00-ab-cd-01"}
    assert signal.trace_context is None and "trace_context" not in signal.encode()


def test_a_hand_out_copies_a_signal_only_when_its_delivery_fields_change() -> None:
    """A routed signal is handed out as the object that was sent when its attempt, mode and
    folded ids are already those of the hand-out (a signal is immutable): no copy per signal."""
    signal = Signal({"n": 1}, id="s1", type="t")
    assert signal.evolve(attempt=1, mode="deliver", folded=()) is signal
    entry = decode_entry("1", signal.encode(), "deliver", 1, signal=signal)
    assert entry.signal is signal
    again = signal.evolve(attempt=2)
    assert (again.attempt, signal.attempt, again.id, again.encode()) == (2, 1, "s1",
                                                                         signal.encode())
    queued = decode_entry("1", signal.encode(), "queue", 3, signal=signal).signal
    assert (queued.mode, queued.attempt, signal.mode) == ("queue", 3, "deliver")


async def test_bad_dispositions_name_the_argument(pubsub: Any) -> None:
    async with SignalRuntime(pubsub=pubsub, agent=None) as rt:
        with pytest.raises(ValueError, match="reducer"):
            await rt.send("x", Signal({}, lane="typing", merge="coalesce"))
    with pytest.raises(ValueError, match="merge"):
        Signal({}, lane="l", merge="replace")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="priority"):
        Signal({}, priority="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lane"):
        Signal({}, lane="")
    with pytest.raises(ValueError, match="lane"):
        Signal({}, merge="supersede")
    with pytest.raises(ValueError, match="max_pending_per_thread"):
        SignalRuntime(pubsub=pubsub, agent=None, max_pending_per_thread=0)
    with pytest.raises(ValueError, match="overflow"):
        SignalRuntime(pubsub=pubsub, agent=None, overflow="drop_newest")  # type: ignore[arg-type]
