"""The signal runtime in one process (asyncio and trio): routing, policies, handoff, loss."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from leases import AcquireResult, InMemoryLeaseProvider, NoopLeaseProvider
from pubsub import InMemoryPubSub
from signals import (
    ConfigurationError,
    InMemorySignalInbox,
    Run,
    RuntimeClosedError,
    Signal,
    SignalRuntime,
)

pytestmark = pytest.mark.anyio


class RecordingLeases:
    """An in-memory provider that records every call (a real provider underneath)."""

    def __init__(self) -> None:
        self.inner = InMemoryLeaseProvider()
        self.calls: list[tuple[str, ...]] = []

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        self.calls.append(("acquire", owner))
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        self.calls.append(("release", owner))
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.calls.append(("transfer", from_owner, to_owner))
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)


def recording_agent(log: list[tuple[str, Any]], work_s: float = 0.0) -> Any:
    async def agent(run: Run) -> None:
        async for signal in run:
            log.append((run.run_id, signal.payload))
            if work_s:
                await anyio.sleep(work_s)

    return agent


async def test_wake_then_follow_ups_reach_the_same_run() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), idle_wait_ms=200,
        leases=InMemoryLeaseProvider(),
    ) as runtime:
        first = await runtime.send("t", "a")
        assert first.outcome == "wake"
        assert first.run_id is not None and first.owner == first.run_id
        second = await runtime.send("t", "b")
        assert second.outcome == "deliver"
        assert second.run_id == first.run_id
        await runtime.wait_idle()
    assert seen == [(first.run_id, "a"), (first.run_id, "b")]


async def test_policies_when_active_and_idle() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.05), idle_wait_ms=100,
        leases=InMemoryLeaseProvider(),
    ) as runtime:
        assert (await runtime.send("idle", "x", if_idle="discard")).outcome == "discarded"
        await runtime.send("t", "a")
        assert (await runtime.send("t", "d", if_active="discard")).outcome == "discarded"
        assert (await runtime.send("t", "r", if_active="reject")).outcome == "rejected"
        assert (await runtime.send("t", "q", if_active="queue")).outcome == "queued"
        await runtime.wait_idle()
    payloads = [p for _, p in seen]
    assert payloads == ["a", "q"]
    assert seen[0][0] != seen[1][0], "a queued signal starts a run of its own"


async def test_queued_runs_are_handed_over_with_transfer_never_release() -> None:
    leases = RecordingLeases()
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), leases=leases,
        inbox=InMemorySignalInbox(),
    ) as runtime:
        await runtime.send("t", 0)
        for i in range(1, 4):
            await runtime.send("t", i, if_active="queue")
        await runtime.wait_idle()
    assert [p for _, p in seen] == [0, 1, 2, 3]
    assert leases.calls[0][0] == "acquire"
    # (The keeper of each run re-acquires as the same owner: an idempotent refresh.)
    handoffs = [c[0] for c in leases.calls if c[0] != "acquire"]
    assert handoffs == ["transfer", "transfer", "transfer", "release"], leases.calls
    holders = [c[1] for c in leases.calls if c[0] == "acquire"]
    assert len(set(holders)) == 4  # each acquire is by the current holder (no new election)
    run_ids = [r for r, _ in seen]
    assert [c[2] for c in leases.calls if c[0] == "transfer"] == run_ids[1:]
    assert await leases.get_lease_owner("t") is None


async def test_same_signal_id_is_processed_once() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), idle_wait_ms=100
    ) as runtime:
        await runtime.send("t", Signal("one", id="dup"))
        await runtime.send("t", Signal("one", id="dup"))
        await runtime.send("t", Signal("two", id="other"))
        await runtime.wait_idle()
        await runtime.send("t", Signal("one", id="dup"))  # after the run: still deduplicated
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["one", "two"]


async def test_a_failing_agent_does_not_stop_the_chain() -> None:
    calls: list[Any] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            calls.append(signal.payload)
            if signal.payload == "boom":
                raise RuntimeError("agent bug")

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent
        ) as runtime:
            await runtime.send("t", "boom")
            await runtime.send("t", "next", if_active="queue")
            await runtime.wait_idle()
    assert calls == ["boom", "next"]
    assert any(e["event"] == "run.failed" for e in logs)


async def test_lost_lease_cancels_the_run() -> None:
    leases = InMemoryLeaseProvider()
    started, cancelled = anyio.Event(), anyio.Event()

    async def agent(run: Run) -> None:
        async for _ in run:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, leases=leases, lease_ttl_ms=300
        ) as runtime:
            delivery = await runtime.send("t", "x")
            with anyio.fail_after(5):
                await started.wait()
            assert delivery.owner is not None
            await leases.release_lease("t", delivery.owner)  # someone takes it away
            assert (await leases.acquire_lease("t", "intruder", 10_000)).acquired
            with anyio.fail_after(5):
                await cancelled.wait()
                await runtime.wait_idle()
            assert await leases.get_lease_owner("t") == "intruder"
            # The in-flight signal is kept for the next owner.
            assert await runtime.inbox.inbox_pending_count("t") == 1
    events = [e["event"] for e in logs]
    assert "lease.lost" in events and "run.cancelled" in events


async def test_noop_fallback_runs_one_chain_per_thread_in_process() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.02), idle_wait_ms=200
    ) as runtime:
        assert isinstance(runtime.leases, NoopLeaseProvider)
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(runtime.send, "t", i)
        await runtime.wait_idle()
    assert sorted(p for _, p in seen) == list(range(10))
    assert len({r for r, _ in seen}) == 1


async def test_runs_on_different_threads_are_independent() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), leases=InMemoryLeaseProvider()
    ) as runtime:
        a = await runtime.send("a", 1)
        b = await runtime.send("b", 2)
        assert a.outcome == b.outcome == "wake"
        await runtime.wait_idle()
    assert sorted(p for _, p in seen) == [1, 2]


async def test_recover_runs_orphaned_signals() -> None:
    inbox = InMemorySignalInbox()
    await inbox.inbox_append("t", Signal("left behind"), "deliver")
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), inbox=inbox,
        leases=InMemoryLeaseProvider(),
    ) as runtime:
        assert await runtime.recover() == ["t"]
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["left behind"]


async def test_bad_input_is_refused_clearly() -> None:
    async def agent(run: Run) -> None:
        return None

    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as rt:
        with pytest.raises(ValueError, match="thread key"):
            await rt.send("", "x")
        with pytest.raises(TypeError, match="thread key"):
            await rt.send(3, "x")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="JSON"):
            await rt.send("t", object())
        with pytest.raises(ValueError, match="if_active"):
            await rt.send("t", "x", if_active="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SignalRuntime(pubsub=pubsub, agent=agent, lease_ttl_ms=0)
    with pytest.raises(TypeError):
        SignalRuntime(pubsub=pubsub, agent="not callable")  # type: ignore[arg-type]
    with pytest.raises(RuntimeClosedError):
        await SignalRuntime(pubsub=pubsub, agent=agent).send("t", "x")


async def test_shared_leases_without_shared_inbox_is_a_configuration_error() -> None:
    class ForeignLeases(RecordingLeases):
        pass

    async def agent(run: Run) -> None:
        return None

    with pytest.raises(ConfigurationError, match="inbox"):
        SignalRuntime(pubsub=InMemoryPubSub(), agent=agent, leases=ForeignLeases())
