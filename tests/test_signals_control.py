"""Output streams, receipts, and control from any runtime (asyncio and trio, in memory)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from leases import InMemoryLeaseProvider
from pubsub import InMemoryPubSub
from signals import (
    CursorExpiredError,
    InMemorySignalStore,
    Run,
    Signal,
    SignalRuntime,
    SignalTooLargeError,
    UnknownSignalError,
)
from tests._interrupt import RunRecorder, interrupt_a_waiting_run

pytestmark = pytest.mark.anyio


def shared() -> dict[str, Any]:
    leases = InMemoryLeaseProvider()
    return {"leases": leases, "inbox": InMemorySignalStore(leases=leases)}


async def test_emitted_parts_stream_to_another_runtime_and_resume_exactly() -> None:
    kit = shared()
    release = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            for i in range(4):
                await run.emit({"token": i}, signal=signal)
            await release.wait()
            await run.ack(signal, result={"done": True})

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        delivery = await client.send("chat", Signal("hi", id="q"), if_idle="enqueue")
        assert delivery.outcome == "queued"
        seen: list[Any] = []
        async for part in client.stream("chat"):
            seen.append(part)
            if part.kind == "part" and part.data == {"token": 3}:
                break
        kinds = [p.kind for p in seen]
        assert kinds[:2] == ["run.started", "signal.received"]
        assert [p.data["token"] for p in seen if p.kind == "part"] == [0, 1, 2, 3]
        assert {p.signal_id for p in seen if p.kind == "part"} == {"q"}
        middle = next(p for p in seen if p.data == {"token": 1})
        resumed = [p async for p in client.stream("chat", after=middle.cursor, follow=False)]
        assert [p.data for p in resumed if p.kind == "part"] == [{"token": 2}, {"token": 3}]
        assert resumed[0].cursor > middle.cursor or resumed[0].data == {"token": 2}
        release.set()
        receipt = await client.wait_for("chat", "q", timeout=5)
        assert receipt.status == "processed" and receipt.result == {"done": True}
        await worker.wait_idle()
        tail = [p.kind async for p in client.stream("chat", after=seen[-1].cursor, follow=False)]
        assert tail == ["signal.acked", "run.finished"]
        with pytest.raises(UnknownSignalError):
            await client.wait_for("chat", "never-sent", timeout=0.1)


async def test_wait_for_times_out_with_the_pending_receipt() -> None:
    kit = shared()
    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=None, **kit) as rt:
        await rt.send("t", Signal(1, id="s"), if_idle="enqueue")
        with anyio.fail_after(2):
            receipt = await rt.wait_for("t", "s", timeout=0.05)
    assert receipt.status == "pending"


async def test_emit_enforces_the_size_limit_and_json() -> None:
    errors: list[type[Exception]] = []

    async def agent(run: Run) -> None:
        async for _ in run:
            for bad in ("x" * 2000, object()):
                try:
                    await run.emit(bad)
                except (SignalTooLargeError, TypeError) as exc:
                    errors.append(type(exc))

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, max_signal_bytes=1024, **shared()
    ) as rt:
        await rt.send("t", 1)
        await rt.wait_idle()
    assert errors == [SignalTooLargeError, TypeError]


async def test_an_expired_cursor_is_an_error_not_a_gap() -> None:
    leases = InMemoryLeaseProvider()
    store = InMemorySignalStore(leases=leases, stream_max_parts=3)

    async def agent(run: Run) -> None:
        async for signal in run:
            for i in range(6):
                await run.emit(i)
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, leases=leases, inbox=store
    ) as rt:
        await rt.send("t", 1)
        await rt.wait_idle()
        with pytest.raises(CursorExpiredError):
            async for _ in rt.stream("t", after="1", follow=False):
                pass
        assert len([p async for p in rt.stream("t", follow=False)]) == 3


async def test_abort_cancels_the_run_meant_and_never_its_successor() -> None:
    kit = shared()
    runs: list[str] = []
    cancelled: list[str] = []
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        runs.append(run.run_id)
        try:
            async for signal in run:
                await gate.wait()
                await run.ack(signal)
        except anyio.get_cancelled_exc_class():
            cancelled.append(run.run_id)
            raise

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        first = await worker.send("t", "a")
        await worker.send("t", "b", if_active="queue")
        with anyio.fail_after(5):
            while len(runs) < 1:  # noqa: ASYNC110 (a list the agent fills)
                await anyio.sleep(0.01)
        gate.set()
        with anyio.fail_after(5):
            while len(runs) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        # The first run is over: aborting it by id must not touch its successor.
        assert not await client.abort("t", first.run_id)
        assert cancelled == []
        await worker.wait_idle()
    assert cancelled == [] and len(runs) == 2


async def test_abort_from_another_runtime_redelivers_or_clears() -> None:
    kit = shared()
    attempts: list[tuple[str, int]] = []
    started = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            attempts.append((signal.id, signal.attempt))
            if signal.attempt == 1:
                started.set()
                await anyio.sleep_forever()
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        await client.send("t", Signal(1, id="s1"), if_idle="enqueue")
        with anyio.fail_after(5):
            await started.wait()
        assert await client.abort("t", reason="user pressed stop")
        await worker.wait_idle()
        kinds = [(p.kind, p.data) async for p in client.stream("t", follow=False)]
        assert ("run.cancelled", {"reason": "abort: user pressed stop"}) in kinds
        assert attempts == [("s1", 1), ("s1", 2)], "redelivered after the abort"
        started = anyio.Event()
        await client.send("t", Signal(2, id="s2"), if_idle="enqueue")
        with anyio.fail_after(5):
            await started.wait()
        assert await client.abort("t", clear_pending=True)
        await worker.wait_idle()
        receipt = await client.receipt("t", "s2")
        assert receipt is not None and receipt.status == "cancelled"
        assert not await client.abort("t")  # nothing runs now


async def test_pending_and_cancel_from_a_sender_only_runtime() -> None:
    kit = shared()
    gate = anyio.Event()
    processed: list[str] = []

    async def agent(run: Run) -> None:
        async for signal in run:
            await gate.wait()
            processed.append(signal.id)
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        await worker.send("t", Signal(0, id="a"))
        for sid in ("b", "c", "d"):
            await client.send("t", Signal(sid, id=sid), if_active="queue")
        pending = await client.pending("t")
        assert [(s.id, s.mode, s.attempt) for s in pending] == [
            ("a", "deliver", 1), ("b", "queue", 0), ("c", "queue", 0), ("d", "queue", 0)
        ]
        assert await client.cancel("t", ["a", "c", "zzz"]) == ["c"]  # "a" is in flight
        gate.set()
        await worker.wait_idle()
        assert [s.id for s in await client.pending("t")] == []
        cancelled = await client.receipt("t", "c")
        assert cancelled is not None and cancelled.status == "cancelled"
    assert processed == ["a", "b", "d"]


async def test_interrupt_hands_the_unacknowledged_signals_and_the_new_one_to_a_new_run() -> None:
    kit = shared()
    runs: list[tuple[bool, list[str]]] = []
    started = anyio.Event()

    async def agent(run: Run) -> None:
        got: list[str] = []
        runs.append((run.interrupted, got))
        async for signal in run:
            got.append(signal.id)
            if signal.id == "first" and not run.interrupted:
                started.set()
                await anyio.sleep_forever()  # a long step: the interrupt ends it
        # returns normally: everything handed out is acknowledged

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        await worker.send("t", Signal(1, id="first"))
        await worker.send("t", Signal(2, id="follow-up"))
        with anyio.fail_after(5):
            await started.wait()
        delivery = await client.send("t", Signal(3, id="correction"), if_active="interrupt")
        assert delivery.outcome == "deliver"
        await worker.wait_idle()
    assert runs[0] == (False, ["first"])
    assert runs[1][0] is True
    assert runs[1][1] == ["first", "follow-up", "correction"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "generic"])
async def test_an_interrupt_from_another_runtime_never_reaches_the_run_it_stops(
    fused: bool,
) -> None:
    """The run waits for more (idle in its loop) when another runtime interrupts it: it is
    cancelled without seeing the interrupting signal, which a new run gets, with
    ``Run.interrupted`` set. (The signal used to be carried to the old run with its notice,
    before the abort that followed it.) With the core's fused route, and without."""
    leases = InMemoryLeaseProvider()
    kit: dict[str, Any] = {"leases": leases,
                           "inbox": InMemorySignalStore(leases=leases if fused else None)}
    recorder = RunRecorder()
    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=recorder, idle_wait_ms=600_000, shutdown_timeout_ms=0, **kit
    ), SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        await interrupt_a_waiting_run(recorder, client.send, timeout=5)


async def test_threads_lists_owned_and_waiting_threads() -> None:
    kit = shared()
    gate = anyio.Event()

    async def agent(run: Run) -> None:
        async for signal in run:
            await gate.wait()
            await run.ack(signal)

    async with InMemoryPubSub() as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, max_concurrent_runs=1, **kit
    ) as worker, SignalRuntime(pubsub=pubsub, agent=None, **kit) as client:
        await worker.send("busy", 1)
        await worker.send("waiting", 2)  # full: queued, no owner
        infos = {t.thread_key: t for t in await client.threads()}
        assert set(infos) == {"busy", "waiting"}
        busy = infos["busy"]
        assert busy.owner is not None and busy.runtime_id == worker.runtime_id
        assert busy.pid is not None and busy.host and busy.since is not None
        assert busy.pending == 1 and busy.last_activity is not None
        assert infos["waiting"].owner is None and infos["waiting"].pending == 1
        assert [t.thread_key for t in await client.threads(active=True)] == ["busy"]
        assert [t.thread_key for t in await client.threads(active=False)] == ["waiting"]
        gate.set()
        await worker.wait_idle()
