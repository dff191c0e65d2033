"""The signal runtime in one process (asyncio and trio): routing, policies, handoff, loss."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from leases import AcquireResult, InMemoryLeaseProvider, NoopLeaseProvider
from leases.testing import ManualClock
from pubsub import InMemoryPubSub, Subscription
from signals import (
    ConfigurationError,
    EntryMode,
    InMemorySignalInbox,
    Run,
    RunInfo,
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


# -- races at the end of a run, lease loss by expiry, run API, shutdown --------------------------


class HookedInbox(InMemorySignalInbox):
    """An in-memory inbox that runs a hook after each append (to interleave a race by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.after_append: Callable[[], Awaitable[None]] | None = None

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool:
        added = await super().inbox_append(thread_key, signal, mode)
        if self.after_append is not None:
            await self.after_append()
        return added


async def test_owner_that_finishes_during_the_append_does_not_strand_the_signal() -> None:
    leases = InMemoryLeaseProvider()
    inbox = HookedInbox()
    seen: list[tuple[str, Any]] = []
    assert (await leases.acquire_lease("t", "remote-run", 60_000)).acquired

    async def remote_owner_finishes() -> None:
        # The remote owner checked its (empty) inbox a moment ago and now releases.
        await leases.release_lease("t", "remote-run")

    inbox.after_append = remote_owner_finishes
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), leases=leases, inbox=inbox
    ) as runtime:
        delivery = await runtime.send("t", "late")
        assert delivery.outcome == "wake"  # nobody else would have read it
        inbox.after_append = None
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["late"]


class SlowClosePubSub(InMemoryPubSub):
    """Subscriptions whose ``close`` waits for ``release`` (a slow network, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = anyio.Event()
        self.release = anyio.Event()

    async def subscribe(self, topic: str, handler: Any, **kwargs: Any) -> Subscription:
        inner = await super().subscribe(topic, handler, **kwargs)
        outer = self

        class Slow(Subscription):
            async def close(self) -> None:
                outer.closing.set()
                await outer.release.wait()
                await inner.close()

        return Slow()


async def test_a_send_while_the_chain_winds_down_starts_a_new_run() -> None:
    seen: list[tuple[str, Any]] = []
    leases = InMemoryLeaseProvider()
    async with SlowClosePubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), leases=leases
    ) as runtime:
        first = await runtime.send("t", "a")
        with anyio.fail_after(5):
            await pubsub.closing.wait()  # the chain released the lease and is closing down
        second = await runtime.send("t", "b")
        assert second.outcome == "wake", "the winding-down chain must not take the signal"
        assert second.run_id != first.run_id
        pubsub.release.set()
        await runtime.wait_idle()
        assert await runtime.inbox.inbox_pending_count("t") == 0
    assert [p for _, p in seen] == ["a", "b"]


class CountHookInbox(InMemorySignalInbox):
    """Runs ``before_count`` once, at the chain's first end-of-run ``inbox_pending_count``."""

    def __init__(self) -> None:
        super().__init__()
        self.before_count: Callable[[], Awaitable[None]] | None = None
        self.appended = anyio.Event()

    async def inbox_append(self, thread_key: str, signal: Signal, mode: EntryMode) -> bool:
        added = await super().inbox_append(thread_key, signal, mode)
        self.appended.set()
        return added

    async def inbox_pending_count(self, thread_key: str) -> int:
        hook, self.before_count = self.before_count, None
        if hook is not None:
            await hook()
        return await super().inbox_pending_count(thread_key)


async def test_follow_up_during_end_of_run_check_is_handed_over() -> None:
    """A local send that appends while the chain decides release-or-handoff: handoff."""
    leases = RecordingLeases()
    inbox = CountHookInbox()
    seen: list[tuple[str, Any]] = []
    deliveries: list[Any] = []

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), leases=leases, inbox=inbox
    ) as runtime, anyio.create_task_group() as tg:

        async def send_follow_up() -> None:
            deliveries.append(await runtime.send("t", "b"))

        async def concurrent_send() -> None:
            inbox.appended = anyio.Event()
            tg.start_soon(send_follow_up)
            await inbox.appended.wait()  # appended; the send now waits for the chain's lock

        await runtime.send("t", "a")
        inbox.before_count = concurrent_send
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["a", "b"]
    [delivery] = deliveries
    assert delivery.outcome == "deliver"
    assert seen[0][0] != seen[1][0]
    ends = [c for c in leases.calls if c[0] != "acquire"]
    assert ends == [("transfer", seen[0][0], seen[1][0]), ("release", seen[1][0])]


async def test_lease_expiring_on_the_provider_clock_cancels_the_run() -> None:
    clock = ManualClock()
    leases = InMemoryLeaseProvider(clock=clock)
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
            pubsub=pubsub, agent=agent, leases=leases, lease_ttl_ms=300,
            recover_interval_ms=60_000,
        ) as runtime:
            await runtime.send("t", "x")
            with anyio.fail_after(5):
                await started.wait()
            clock.advance(10)  # the server-side lease expired (a stalled process, say)
            with anyio.fail_after(5):
                await cancelled.wait()
                await runtime.wait_idle()
            assert await runtime.inbox.inbox_pending_count("t") == 1
    lost = [e for e in logs if e["event"] == "lease.lost"]
    assert lost and lost[0]["reason"] == "renew rejected"
    assert any(e["event"] == "run.cancelled" for e in logs)


async def test_run_info_and_next_signal_timeout() -> None:
    got: list[Any] = []
    waiting = anyio.Event()
    infos: list[Any] = []

    async def agent(run: Run) -> None:
        first = await run.next_signal()
        got.append(first.payload if first else None)
        infos.append(runtime.active_run(run.thread_key))
        waiting.set()
        follow_up = await run.next_signal(timeout=10)  # woken by the doorbell, not the timeout
        got.append(follow_up.payload if follow_up else None)
        got.append(await run.next_signal(timeout=0.01))

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, leases=InMemoryLeaseProvider()
    ) as runtime:
        assert runtime.active_run("t") is None
        wake = await runtime.send("t", "first")
        with anyio.fail_after(5):
            await waiting.wait()
        assert runtime.active_threads() == ["t"]
        assert (await runtime.send("t", "second")).outcome == "deliver"
        await runtime.wait_idle("t")
        assert runtime.active_run("t") is None
    assert got == ["first", "second", None]
    [info] = infos
    assert isinstance(info, RunInfo)
    assert info.run_id == wake.run_id and info.thread_key == "t" and info.runs == 1
    assert isinstance(info.token, int)


async def test_agent_that_never_reads_still_consumes_the_wake_signal() -> None:
    runs: list[str] = []

    async def agent(run: Run) -> None:
        runs.append(run.run_id)

    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as runtime:
        await runtime.send("t", "ignored")
        await runtime.wait_idle()
        assert await runtime.inbox.inbox_pending_count("t") == 0
    assert len(runs) == 1


async def test_queue_is_a_barrier_for_later_deliveries() -> None:
    seen: list[tuple[str, Any]] = []
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append((run.run_id, signal.payload))
            await gate.wait()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, leases=InMemoryLeaseProvider()
    ) as runtime:
        await runtime.send("t", "a")
        assert (await runtime.send("t", "q", if_active="queue")).outcome == "queued"
        assert (await runtime.send("t", "b")).outcome == "deliver"
        gate.set()
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["a", "q", "b"]
    assert seen[0][0] != seen[1][0] == seen[2][0]  # "q" opened a run, "b" joined it


async def test_leaving_the_runtime_waits_for_active_runs() -> None:
    done: list[Any] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            await anyio.sleep(0.05)
            done.append(signal.payload)

    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as runtime:
        await runtime.send("t", "x")
    assert done == ["x"]
    with pytest.raises(RuntimeClosedError):
        await runtime.send("t", "y")


async def test_cancelling_the_runtime_keeps_the_in_flight_signal() -> None:
    inbox = InMemorySignalInbox()
    started = anyio.Event()

    async def agent(run: Run) -> None:
        async for _ in run:
            started.set()
            await anyio.sleep_forever()

    async with InMemoryPubSub() as pubsub:
        with anyio.move_on_after(5) as scope:
            async with SignalRuntime(pubsub=pubsub, agent=agent, inbox=inbox) as runtime:
                await runtime.send("t", "x")
                await started.wait()
                scope.cancel()
        assert not scope.cancelled_caught or scope.cancel_called
    assert await inbox.inbox_pending_count("t") == 1


async def test_recovery_loop_runs_orphaned_signals_by_itself() -> None:
    inbox = InMemorySignalInbox()
    await inbox.inbox_append("orphan", Signal("left behind"), "deliver")
    seen: list[Any] = []
    ran = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append(signal.payload)
        ran.set()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, inbox=inbox,
        leases=InMemoryLeaseProvider(), recover_interval_ms=20,
    ) as runtime:
        with anyio.fail_after(5):
            await ran.wait()  # nobody called recover(): the loop did
        await runtime.wait_idle()
    assert seen == ["left behind"]


class InboxPubSub(InMemoryPubSub):
    """A pub/sub that is also the inbox (the five ``inbox_*`` methods)."""

    def __init__(self) -> None:
        super().__init__()
        self._inbox = InMemorySignalInbox()
        self.inbox_append = self._inbox.inbox_append
        self.inbox_read = self._inbox.inbox_read
        self.inbox_remove = self._inbox.inbox_remove
        self.inbox_pending_count = self._inbox.inbox_pending_count
        self.inbox_pending_threads = self._inbox.inbox_pending_threads


async def test_inbox_resolution() -> None:
    async def agent(run: Run) -> None:
        return None

    both = InboxPubSub()
    assert SignalRuntime(pubsub=both, agent=agent).inbox is both
    plain = SignalRuntime(pubsub=InMemoryPubSub(), agent=agent)
    assert isinstance(plain.inbox, InMemorySignalInbox)
    assert isinstance(plain.leases, NoopLeaseProvider)
    explicit = InMemorySignalInbox()
    assert SignalRuntime(
        pubsub=InMemoryPubSub(), agent=agent, leases=RecordingLeases(), inbox=explicit
    ).inbox is explicit


async def test_a_sender_only_runtime_keeps_no_per_thread_state() -> None:
    """Routing to threads another runtime owns leaves no lock behind (no leak per thread)."""
    leases, inbox = InMemoryLeaseProvider(), InMemorySignalInbox()
    seen: list[tuple[str, Any]] = []

    async def idle_agent(run: Run) -> None:
        return None

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), leases=leases, inbox=inbox,
        idle_wait_ms=300,
    ) as owner, SignalRuntime(
        pubsub=pubsub, agent=idle_agent, leases=leases, inbox=inbox
    ) as sender:
        for n in range(5):
            assert (await owner.send(f"t{n}", "wake")).outcome == "wake"
        for n in range(5):
            delivery = await sender.send(f"t{n}", "follow-up")
            assert delivery.outcome == "deliver"
            assert delivery.owner == owner.active_run(f"t{n}").run_id  # type: ignore[union-attr]
        assert sender._locks == {} and sender.active_threads() == []
        await owner.wait_idle()
        assert await sender.recover() == []
        assert sender._locks == {}
    assert owner._locks == {}  # each chain dropped its lock on the way out
    assert sorted(p for _, p in seen) == ["follow-up"] * 5 + ["wake"] * 5
