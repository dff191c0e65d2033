"""The signal runtime in one process (asyncio and trio): routing, policies, handoff, loss."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from leases import InMemoryLeaseProvider
from leases.testing import ManualClock, RecordingLeaseProvider
from pubsub import InMemoryPubSub, RedisStreamsPubSub, SQLitePubSub
from signals import (
    ClosedError,
    ConfigurationError,
    InMemorySignalStore,
    Run,
    RunInfo,
    Signal,
    SignalRuntime,
    SignalTooLargeError,
)

pytestmark = pytest.mark.anyio


def recording_agent(log: list[tuple[str, Any]], work_s: float = 0.0) -> Any:
    async def agent(run: Run) -> None:
        async for signal in run:
            log.append((run.run_id, signal.payload))
            if work_s:
                await anyio.sleep(work_s)

    return agent


def parts(leases: InMemoryLeaseProvider | None = None) -> dict[str, Any]:
    """Leases and a store fused with them, for a runtime on an ``InMemoryPubSub``."""
    leases = leases or InMemoryLeaseProvider()
    return {"leases": leases, "inbox": InMemorySignalStore(leases=leases)}


async def test_wake_then_follow_ups_reach_the_same_run() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), idle_wait_ms=200, **parts()
    ) as runtime:
        first = await runtime.send("t", "a")
        assert first.outcome == "wake" and not first.duplicate
        assert first.run_id is not None and first.owner == first.run_id
        second = await runtime.send("t", "b")
        assert second.outcome == "deliver"
        assert second.run_id == first.run_id
        await runtime.wait_idle()
    assert seen == [(first.run_id, "a"), (first.run_id, "b")]


async def test_policies_when_active_and_idle() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.05), idle_wait_ms=100, **parts()
    ) as runtime:
        assert (await runtime.send("idle", "x", if_idle="discard")).outcome == "discarded"
        await runtime.send("t", "a")
        assert (await runtime.send("t", "d", if_active="discard")).outcome == "discarded"
        assert (await runtime.send("t", "r", if_active="reject")).outcome == "rejected"
        assert (await runtime.send("t", "q", if_active="queue")).outcome == "queued"
        await runtime.wait_idle()
        assert len(await runtime.pending("idle")) == 0
    payloads = [p for _, p in seen]
    assert payloads == ["a", "q"]
    assert seen[0][0] != seen[1][0], "a queued signal starts a run of its own"


async def test_queued_runs_are_handed_over_with_transfer_never_release() -> None:
    """The generic path (a store that does not fuse with these leases): each call visible."""
    inner = InMemoryLeaseProvider()
    leases = RecordingLeaseProvider(inner)
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), leases=leases,
        inbox=InMemorySignalStore(),
    ) as runtime:
        await runtime.send("t", 0)
        for i in range(1, 4):
            await runtime.send("t", i, if_active="queue")
        await runtime.wait_idle()
    assert [p for _, p in seen] == [0, 1, 2, 3]
    run_ids = [r for r, _ in seen]
    ends = [c for c in leases.calls if c[0] in ("transfer_lease", "release_lease")]
    assert ends == [
        *(("transfer_lease", "t", a, b) for a, b in itertools.pairwise(run_ids)),
        ("release_lease", "t", run_ids[-1]),
    ], leases.calls
    assert await inner.get_lease_owner("t") is None


async def test_fused_handoffs_keep_the_thread_owned_between_runs() -> None:
    kit = parts()
    seen: list[tuple[str, Any]] = []
    owners: list[str | None] = []

    async def agent(run: Run) -> None:
        owners.append(await kit["leases"].get_lease_owner("t"))
        await recording_agent(seen, 0.01)(run)

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, **kit
        ) as runtime:
            await runtime.send("t", 0)
            for i in range(1, 4):
                await runtime.send("t", i, if_active="queue")
            await runtime.wait_idle()
    run_ids = [r for r, _ in seen]
    assert owners == run_ids, "each run holds the lease under its own run id"
    handoffs = [(e["from_run_id"], e["run_id"]) for e in logs if e["event"] == "lease.handoff"]
    assert handoffs == list(itertools.pairwise(run_ids))
    assert await kit["leases"].get_lease_owner("t") is None


async def test_duplicates_are_flagged_and_never_wake() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), idle_wait_ms=100, **parts()
    ) as runtime:
        first = await runtime.send("t", Signal("one", id="dup"))
        again = await runtime.send("t", Signal("one", id="dup"))
        assert again.duplicate and again.outcome == "discarded"
        assert again.receipt is not None and again.receipt.signal_id == "dup"
        await runtime.send("t", Signal("two", id="other"))
        await runtime.wait_idle()
        late = await runtime.send("t", Signal("one", id="dup"))  # to the idle thread
        assert late.duplicate and late.outcome != "wake"
        assert late.receipt is not None and late.receipt.status == "processed"
        assert runtime.active_threads() == []
        await runtime.wait_idle()
    assert first.outcome == "wake"
    assert [p for _, p in seen] == ["one", "two"]


async def test_commit_is_explicit_and_a_peek_commits_nothing() -> None:
    pending: list[int] = []
    results: list[Any] = []

    async def agent(run: Run) -> None:
        first = await run.next_signal()
        assert first is not None
        assert await run.next_signal(timeout=0) is None  # a peek
        pending.append(len(await runtime.pending(run.thread_key)))
        await run.ack(first, result={"answer": 42})
        pending.append(len(await runtime.pending(run.thread_key)))
        await run.ack(first)  # twice: a no-op
        with pytest.raises(ValueError, match="not handed"):
            await run.ack("never-seen")

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
    ) as runtime:
        await runtime.send("t", Signal("q", id="s1"))
        await runtime.wait_idle()
        receipt = await runtime.receipt("t", "s1")
        results.append(receipt)
    assert pending == [1, 0]
    [receipt] = results
    assert receipt.status == "processed" and receipt.result == {"answer": 42}


async def test_a_failing_run_redelivers_then_dead_letters_without_blocking_the_thread() -> None:
    calls: list[tuple[Any, int]] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            calls.append((signal.payload, signal.attempt))
            if signal.payload == "boom":
                raise RuntimeError("agent bug")
            await run.ack(signal)

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, max_attempts=3, **parts()
        ) as runtime:
            await runtime.send("t", Signal("boom", id="poison"))
            await runtime.send("t", "next", if_active="queue")
            await runtime.wait_idle()
            [dead] = await runtime.dead_letters("t")
            receipt = await runtime.receipt("t", "poison")
            assert dead.signal.id == "poison" and dead.attempts == 3
            assert dead.error is not None and "agent bug" in dead.error
            assert receipt is not None and receipt.status == "dead_lettered"
            assert await runtime.retry_dead_letters("t", ["poison"]) == ["poison"]
            with anyio.fail_after(5):  # the retry wakes the thread; it fails three times more
                while not await runtime.dead_letters("t"):  # noqa: ASYNC110 (store state)
                    await anyio.sleep(0.01)
            await runtime.wait_idle()
            assert await runtime.purge_dead_letters("t") == 1
            assert await runtime.dead_letters("t") == []
    assert calls[:3] == [("boom", 1), ("boom", 2), ("boom", 3)]
    assert calls[3] == ("next", 1)
    assert calls[4:] == [("boom", 1), ("boom", 2), ("boom", 3)]  # retried from zero
    events = [e["event"] for e in logs]
    assert events.count("run.failed") == 6 and "signal.dead_lettered" in events


async def test_a_run_over_its_timeout_is_cancelled_and_its_signal_redelivered() -> None:
    attempts: list[int] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            attempts.append(signal.attempt)
            if signal.attempt == 1:
                await anyio.sleep_forever()  # hangs: the timeout ends it

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, run_timeout_ms=100, **parts()
        ) as runtime:
            await runtime.send("t", "x")
            with anyio.fail_after(5):
                await runtime.wait_idle()
    assert attempts == [1, 2]
    [cancelled] = [e for e in logs if e["event"] == "run.cancelled"]
    assert cancelled["reason"] == "timeout"


async def test_lost_session_cancels_every_run_and_keeps_their_signals() -> None:
    """A lost session cancels every run it guarded; their signals stay in the inbox, and the
    runtime takes the threads back at once and hands the same signals out again."""
    clock = ManualClock()
    leases = InMemoryLeaseProvider(clock=clock)
    started, cancelled, again = [], [], []

    async def agent(run: Run) -> None:
        async for signal in run:
            if signal.attempt > 1:  # handed out again after the loss: finish this time
                again.append((run.thread_key, signal.id, signal.attempt))
                continue
            started.append(run.thread_key)
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.append(run.thread_key)

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, lease_ttl_ms=300, recover_interval_ms=60_000,
            **parts(leases),
        ) as runtime:
            sent = {key: (await runtime.send(key, "x")).signal_id for key in ("a", "b")}
            with anyio.fail_after(5):
                while len(started) < 2:  # noqa: ASYNC110 (a counter the agents bump)
                    await anyio.sleep(0.01)
            clock.advance(10)  # the server-side session expired (a stalled process, say)
            with anyio.fail_after(5):
                while len(again) < 2:  # noqa: ASYNC110 (a counter the agents bump)
                    await anyio.sleep(0.01)
                await runtime.wait_idle()
            assert sorted(cancelled) == ["a", "b"]
            assert sorted(again) == [(key, sent[key], 2) for key in ("a", "b")]
            assert await runtime.pending("a") == []
    lost = [e for e in logs if e["event"] == "lease.lost"]
    assert {e["key"] for e in lost} == {"a", "b"}
    assert {e["reason"] for e in lost} == {"session expired"}
    assert {e["key"] for e in logs if e["event"] == "signals.recovered"} == {"a", "b"}


async def test_a_run_whose_thread_was_taken_over_cannot_ack() -> None:
    leases = InMemoryLeaseProvider()
    started, go_on, outcome = anyio.Event(), anyio.Event(), []

    async def agent(run: Run) -> None:
        signal = await run.next_signal()
        started.set()
        await go_on.wait()
        try:
            await run.ack(signal)  # type: ignore[arg-type]
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, **parts(leases)
        ) as runtime:
            delivery = await runtime.send("t", "x")
            with anyio.fail_after(5):
                await started.wait()
            assert delivery.owner is not None
            await leases.release_lease("t", delivery.owner)  # taken away behind its back
            assert (await leases.acquire_lease("t", "intruder/1", 10_000)).acquired
            go_on.set()
            with anyio.fail_after(5):
                await runtime.wait_idle()
            assert len(await runtime.pending("t")) == 1  # kept for the new owner
    assert outcome == ["cancelled"]
    assert any(e["event"] == "lease.lost" and "taken over" in e["reason"] for e in logs)


async def test_runs_on_different_threads_are_independent() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.01), **parts()
    ) as runtime:
        a = await runtime.send("a", 1)
        b = await runtime.send("b", 2)
        assert a.outcome == b.outcome == "wake"
        await runtime.wait_idle()
    assert sorted(p for _, p in seen) == [1, 2]


async def test_concurrent_local_sends_make_one_chain() -> None:
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen, 0.02), idle_wait_ms=200, **parts()
    ) as runtime:
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(runtime.send, "t", i)
        await runtime.wait_idle()
    assert sorted(p for _, p in seen) == list(range(10))
    assert len({r for r, _ in seen}) == 1


async def test_recover_runs_orphaned_signals() -> None:
    kit = parts()
    await kit["inbox"].accept("t", Signal("left behind"), "deliver")
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), recover_interval_ms=60_000, **kit
    ) as runtime:
        await runtime.wait_idle()  # the start-up resync may already have taken it
        await runtime.recover()
        await runtime.wait_idle()
    assert [p for _, p in seen] == ["left behind"]


async def test_recovery_loop_runs_orphaned_signals_by_itself() -> None:
    kit = parts()
    seen: list[Any] = []
    ran = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append(signal.payload)
        ran.set()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, recover_interval_ms=20, **kit
    ) as runtime:
        await kit["inbox"].accept("orphan", Signal("left behind"), "deliver")  # no notice
        with anyio.fail_after(5):
            await ran.wait()  # nobody called recover(): the loop did
        await runtime.wait_idle()
    assert seen == ["left behind"]


async def test_bad_input_is_refused_clearly() -> None:
    async def agent(run: Run) -> None:
        return None

    def sync_agent(run: Run) -> None:
        return None

    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as rt:
        with pytest.raises(ValueError, match="thread key"):
            await rt.send("", "x")
        with pytest.raises(TypeError, match="thread key"):
            await rt.send(3, "x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="thread key"):
            await rt.send("bad\x00key", "x")
        with pytest.raises(ValueError, match="surrogate"):
            await rt.send("bad\ud800", "x")
        with pytest.raises(TypeError, match="JSON"):
            await rt.send("t", object())
        with pytest.raises(ValueError, match="if_active"):
            await rt.send("t", "x", if_active="later")  # type: ignore[arg-type]
        with pytest.raises(SignalTooLargeError):
            await rt.send("t", "x" * (2 << 20))
        assert len(await rt.pending("t")) == 0  # nothing was written
    for bad in (None, "redis://localhost", InMemoryPubSub):
        with pytest.raises(TypeError, match="pubsub"):
            SignalRuntime(pubsub=bad, agent=agent)  # type: ignore[arg-type]
    for bad_agent in (sync_agent, lambda run: None, "not callable"):
        with pytest.raises(TypeError, match="agent"):
            SignalRuntime(pubsub=pubsub, agent=bad_agent)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="leases"):
        SignalRuntime(pubsub=pubsub, agent=agent, leases=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_ttl_ms"):
        SignalRuntime(pubsub=pubsub, agent=agent, lease_ttl_ms=0)
    with pytest.raises(TypeError, match="max_attempts"):
        SignalRuntime(pubsub=pubsub, agent=agent, max_attempts=True)
    with pytest.raises(ClosedError):
        await SignalRuntime(pubsub=pubsub, agent=agent).send("t", "x")


async def test_shared_leases_without_shared_store_is_a_configuration_error() -> None:
    async def agent(run: Run) -> None:
        return None

    foreign = RecordingLeaseProvider(InMemoryLeaseProvider())
    # The message names the kit (the core and its hook), not one backend's store.
    with pytest.raises(ConfigurationError, match=r"signals\.kit\.SignalCore.*signal_core"):
        SignalRuntime(pubsub=InMemoryPubSub(), agent=agent, leases=foreign)


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
        pubsub=pubsub, agent=agent, **parts()
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

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
    ) as runtime:
        await runtime.send("t", "ignored")
        await runtime.wait_idle()
        assert len(await runtime.pending("t")) == 0
    assert len(runs) == 1


async def test_queue_is_a_barrier_for_later_deliveries() -> None:
    seen: list[tuple[str, Any]] = []
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append((run.run_id, signal.payload))
            await gate.wait()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
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

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
    ) as runtime:
        await runtime.send("t", "x")
    assert done == ["x"]
    with pytest.raises(ClosedError):
        await runtime.send("t", "y")


async def test_shutdown_never_hangs_on_a_stuck_run() -> None:
    kit = parts()

    async def agent(run: Run) -> None:
        async for _ in run:
            await anyio.sleep_forever()

    with anyio.fail_after(5):
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, shutdown_timeout_ms=100, **kit
        ) as runtime:
            await runtime.send("t", "x")
            await anyio.sleep(0.05)
    assert (await kit["inbox"].describe(["t"]))["t"].pending == 1  # kept for the next owner


async def test_cancelling_the_runtime_keeps_the_in_flight_signal() -> None:
    kit = parts()
    started = anyio.Event()

    async def agent(run: Run) -> None:
        async for _ in run:
            started.set()
            await anyio.sleep_forever()

    async with InMemoryPubSub() as pubsub:
        with anyio.move_on_after(5) as scope:
            async with SignalRuntime(pubsub=pubsub, agent=agent, **kit) as runtime:
                await runtime.send("t", "x")
                await started.wait()
                scope.cancel()
        assert scope.cancel_called
    assert (await kit["inbox"].describe(["t"]))["t"].pending == 1


async def test_store_resolution() -> None:
    async def agent(run: Run) -> None:
        return None

    pubsub = InMemoryPubSub()
    one = SignalRuntime(pubsub=pubsub, agent=agent)
    two = SignalRuntime(pubsub=pubsub, agent=None)
    assert isinstance(one.store, InMemorySignalStore)
    assert one.store is two.store, "runtimes on one pub/sub share its store"
    explicit = InMemorySignalStore()
    assert SignalRuntime(
        pubsub=pubsub, agent=agent, leases=InMemoryLeaseProvider(), inbox=explicit
    ).store is explicit


async def test_a_sender_only_runtime_enqueues_for_a_worker() -> None:
    kit = parts()
    seen: list[tuple[str, Any]] = []
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recording_agent(seen), **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as sender:
        for n in range(5):
            delivery = await sender.send(f"t{n}", n, if_idle="enqueue")
            assert delivery.outcome == "queued" and delivery.owner is None
        with anyio.fail_after(5):
            while len(seen) < 5:  # noqa: ASYNC110 (a counter the agents bump)
                await anyio.sleep(0.01)
        await worker.wait_idle()
        assert sender.active_threads() == [] and await sender.recover() == []
        assert await kit["leases"].get_lease_owner("t0") is None
    assert sorted(p for _, p in seen) == list(range(5))


async def test_a_full_process_leaves_signals_queued_for_later() -> None:
    seen: list[tuple[str, Any]] = []
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append((run.thread_key, signal.payload))
            await gate.wait()

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, max_concurrent_runs=2, recover_interval_ms=50, **parts()
    ) as runtime:
        deliveries = [await runtime.send(f"t{n}", n) for n in range(5)]
        assert [d.outcome for d in deliveries] == ["wake", "wake", "queued", "queued", "queued"]
        assert [d.backpressure for d in deliveries] == [False, False, True, True, True]
        await anyio.sleep(0.2)
        assert len(runtime.active_threads()) == 2
        gate.set()
        with anyio.fail_after(5):
            while len(seen) < 5:  # noqa: ASYNC110 (a counter the agents bump)
                await anyio.sleep(0.01)
        await runtime.wait_idle()
    assert sorted(p for _, p in seen) == list(range(5))


async def test_logs_trace_a_signal_to_its_run() -> None:
    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)

    with capture_logs() as logs:
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, **parts()
        ) as runtime:
            await runtime.send("t", Signal("x", id="sig-1"))
            await runtime.wait_idle()
    info = [e for e in logs if e["log_level"] == "info"]
    [accepted] = [e for e in info if e["event"] == "signal.accepted"]
    [started] = [e for e in info if e["event"] == "run.started"]
    [finished] = [e for e in info if e["event"] == "run.finished"]
    assert accepted["key"] == "t" and accepted["signal_id"] == "sig-1"
    assert accepted["run_id"] == started["run_id"] == finished["run_id"]
    assert finished["signal_ids"] == ["sig-1"]
    assert isinstance(started["token"], int) and started["token"] == finished["token"]


async def test_in_memory_signals_are_handed_out_without_a_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The in-memory store keeps the signal it accepted: handing it out (carried to the run,
    or taken) copies it, with the delivery fields of a decoded one, instead of decoding
    the JSON it just encoded."""
    decodes: list[str] = []  # the ids of the signals decoded from their JSON
    decode = Signal.from_dict.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Signal], obj: dict[str, Any], /, **kwargs: Any) -> Signal:
        decodes.append(obj["id"])
        signal: Signal = decode(cls, obj, **kwargs)
        return signal

    monkeypatch.setattr(Signal, "from_dict", classmethod(counting))
    seen: list[Signal] = []
    busy = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            seen.append(signal)
            if signal.payload == 0:
                busy.set()
                await anyio.sleep(0.05)  # the next ones are carried to this run
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
    ) as runtime:
        await runtime.send("t", 0)
        await busy.wait()
        await runtime.send("t", Signal(1, folded=("x",), attempt=3, mode="queue"))
        await runtime.send("t", 2, if_active="queue")
        await runtime.wait_idle()
    assert [s.payload for s in seen] == [0, 1, 2]
    assert [(s.attempt, s.mode, s.folded) for s in seen] == [
        (1, "deliver", ()), (1, "deliver", ()), (1, "queue", ())
    ]
    assert decodes == []


def test_each_structlog_configuration_gets_the_library_s_events() -> None:
    """The library builds structlog's logger once per configuration (not per event): a new
    ``structlog.configure`` is followed at the next event, and without structlog configured
    the events go to the standard library's logging."""
    import logging

    import structlog

    from _signal_leases.logs import get_logger

    log = get_logger("signals").bind(key="t")
    first: list[str] = []
    second: list[str] = []

    def into(events: list[str]) -> Any:
        def processor(_logger: Any, _method: str, event: Any) -> Any:
            events.append(f"{event['event']} {event['key']} {event['n']}")
            raise structlog.DropEvent

        return processor

    try:
        structlog.configure(processors=[into(first)])
        log.info("e", n=1)
        log.info("e", n=2)
        structlog.configure(processors=[into(second)])
        log.info("e", n=3)
    finally:
        structlog.reset_defaults()
    assert first == ["e t 1", "e t 2"] and second == ["e t 3"]
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect()
    stdlib = logging.getLogger("signals")
    stdlib.addHandler(handler)
    stdlib.setLevel(logging.INFO)
    try:
        log.info("e", n=4)
    finally:
        stdlib.removeHandler(handler)
        stdlib.setLevel(logging.NOTSET)
    assert [r.getMessage() for r in records] == ["e key='t' n=4"]
    assert first == ["e t 1", "e t 2"] and second == ["e t 3"]
    # A level check is asked each time: a stdlib logger's level may change between events.
    third: list[str] = []
    try:
        structlog.configure(processors=[into(third)], wrapper_class=structlog.stdlib.BoundLogger,
                            logger_factory=structlog.stdlib.LoggerFactory())
        stdlib.setLevel(logging.WARNING)
        log.info("e", n=5)
        log.warning("e", n=6)
        stdlib.setLevel(logging.INFO)
        log.info("e", n=7)
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        log.warning("e", n=8)
    finally:
        structlog.reset_defaults()
        stdlib.setLevel(logging.NOTSET)
    assert third == ["e t 6", "e t 7"]


async def test_an_error_in_the_runtime_s_body_propagates_as_it_is() -> None:
    async def agent(run: Run) -> None:
        async for _ in run:
            await anyio.sleep_forever()

    with pytest.raises(LookupError, match="mine"):
        async with InMemoryPubSub() as pubsub, SignalRuntime(
            pubsub=pubsub, agent=agent, **parts()
        ) as runtime:
            await runtime.send("t", "x")
            raise LookupError("mine")  # not an ExceptionGroup: the user's except still works


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_an_error_in_the_body_propagates_on_every_backend(
    backend: str, anyio_backend: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """Leaving a worker runtime closes its notice subscription (real I/O on these backends)
    before its tasks are cancelled: the body's exception is neither lost nor wrapped."""
    if backend == "redis" and anyio_backend != "asyncio":
        pytest.skip("redis-py is asyncio-only")

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)

    pubsub: Any = (SQLitePubSub(tmp_path / "s.db") if backend == "sqlite" else
                   RedisStreamsPubSub(url=request.getfixturevalue("redis_url"),
                                      key_prefix=request.getfixturevalue("key_prefix")))
    with pytest.raises(LookupError, match="mine"):
        async with pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as runtime:
            await runtime.send("t", "x")
            await runtime.wait_idle()
            raise LookupError("mine")


async def test_leaving_does_not_wait_for_idle_runs_to_time_out() -> None:
    """Graceful exit lets runs finish what they hold, and a run waiting for its next signal
    (``idle_wait_ms`` of ten minutes) ends at once instead of holding the exit."""
    got: list[str] = []
    ended = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            got.append(signal.payload)
            await run.ack(signal)
        ended.set()

    started = anyio.current_time()
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, idle_wait_ms=600_000, **parts()
    ) as runtime:
        await runtime.send("t", "a")
        await anyio.sleep(0.1)  # the run got "a" and now waits for the next signal
    assert ended.is_set() and got == ["a"]
    assert anyio.current_time() - started < 5


async def test_the_inbox_counts_pending_signals_and_a_peek_commits_nothing() -> None:
    counts: list[int] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.next_signal(timeout=0)  # peek while still working on this one
            counts.append(await runtime.inbox.inbox_pending_count(run.thread_key))
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **parts()
    ) as runtime:
        await runtime.send("t", "first")
        await runtime.wait_idle()
        assert await runtime.inbox.inbox_pending_count("t") == 0
    assert counts == [1]
    with pytest.raises(ClosedError):
        _ = runtime.inbox
