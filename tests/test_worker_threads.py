"""``WorkerThreads``: the SQL databases' own threads (``_signal_leases.sql.threads``). A
call's result and exception come back; a cancelled caller waits for its call; at most
``limit`` threads run; threads exit when idle and at ``close``; context variables reach the
thread."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from _signal_leases.sql import Tx
from _signal_leases.sql.sqlite import SQLiteDatabase
from _signal_leases.sql.threads import WorkerThreads

pytestmark = pytest.mark.anyio

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("worker_threads_test", default="")


def _named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


async def _until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - threads change it
            await anyio.sleep(0.01)


async def test_results_exceptions_and_context() -> None:
    workers = WorkerThreads(2, name="wt-results")
    assert await workers.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await workers.run(lambda: 1 / 0)
    token = _VAR.set("caller's")
    try:
        assert await workers.run(_VAR.get) == "caller's"
    finally:
        _VAR.reset(token)
    workers.close()


async def test_a_cancelled_caller_waits_for_its_call() -> None:
    workers = WorkerThreads(1, name="wt-cancel")
    done = threading.Event()
    returned: list[str] = []

    def slow() -> str:
        time.sleep(0.2)
        done.set()
        return "finished"

    with anyio.move_on_after(0.05) as scope:
        returned.append(await workers.run(slow))  # shielded: cancelled only after it returns
        await anyio.lowlevel.checkpoint()
        raise AssertionError("the cancellation was lost")  # pragma: no cover
    assert scope.cancelled_caught
    assert done.is_set()
    assert returned == ["finished"]
    workers.close()


async def test_at_most_limit_threads_and_they_exit_at_close(anyio_backend: str) -> None:
    name = "wt-limit"
    workers = WorkerThreads(3, name=name)
    running = 0
    most = 0
    lock = threading.Lock()

    def busy() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(30):
            tg.start_soon(workers.run, busy)
    if anyio_backend == "asyncio":  # trio: anyio's worker threads
        assert most == 3
        assert len(_named(name)) == 3 == workers.threads
    workers.close()
    await _until(lambda: not _named(name))
    assert workers.threads == 0
    assert await workers.run(lambda: 7) == 7  # a call after close starts a thread again
    workers.close()
    await _until(lambda: not _named(name))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_idle_threads_exit_and_later_calls_start_new_ones() -> None:
    name = "wt-idle"
    workers = WorkerThreads(2, name=name, idle_s=0.05)
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(workers.run, time.sleep, 0.02)
    assert workers.threads == 2
    await _until(lambda: not _named(name))
    assert workers.threads == 0
    for _ in range(3):  # one at a time: one thread serves them all
        assert await workers.run(lambda: threading.current_thread().name) == name
    assert workers.threads == 1
    workers.close()
    await _until(lambda: not _named(name))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stop_never_strands_a_queued_call() -> None:
    """``close`` while the one thread is busy and a call waits behind it, then a call after
    ``close``: every call finishes."""
    workers = WorkerThreads(1, name="wt-strand")
    results: list[int] = []

    def slow(n: int) -> int:
        time.sleep(0.05)
        return n

    async def call(n: int) -> None:
        results.append(await workers.run(slow, n))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, 1)
        await anyio.sleep(0.01)
        tg.start_soon(call, 2)  # queued behind call 1
        await anyio.sleep(0.01)
        workers.close()
        tg.start_soon(call, 3)  # after the stop: a new thread
        with anyio.fail_after(5):
            while len(results) < 3:  # noqa: ASYNC110 - other tasks append
                await anyio.sleep(0.01)
    assert sorted(results) == [1, 2, 3]
    workers.close()


async def test_at_most_limit_calls_and_a_cancelled_waiter_never_runs() -> None:
    """One thread: a second call waits for the first; cancelled while it waits, it leaves at
    once and its function is never called; a third call still runs after the first."""
    workers = WorkerThreads(1, name="wt-wait")
    release = threading.Event()
    ran: list[str] = []

    def first() -> None:
        release.wait(5)
        ran.append("first")

    async with anyio.create_task_group() as tg:
        tg.start_soon(workers.run, first)
        await anyio.sleep(0.05)
        with anyio.move_on_after(0.05) as scope:
            await workers.run(ran.append, "cancelled")
        assert scope.cancelled_caught
        tg.start_soon(workers.run, ran.append, "third")
        await anyio.sleep(0.05)
        assert ran == []  # the third waits for the first
        release.set()
    assert ran == ["first", "third"]
    workers.close()


async def test_a_database_calls_on_at_most_max_connections_threads(
        tmp_path: Path, anyio_backend: str) -> None:
    """A SQL database's calls run on at most ``max_connections`` threads (its own on
    asyncio), which exit when it closes."""
    db = SQLiteDatabase(tmp_path / "threads.db", max_connections=2)
    threads: set[threading.Thread] = set()

    def call(tx: Tx) -> None:
        threads.add(threading.current_thread())
        tx.value("SELECT 1")
        time.sleep(0.005)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(partial(db.run, call, write=False))
    assert db.connections <= 2
    if anyio_backend == "asyncio":
        assert len(threads) <= 2
        assert {t.name for t in threads} == {"signal-leases sql"}
    await db.aclose()
    if anyio_backend == "asyncio":
        await _until(lambda: not any(t.is_alive() for t in threads))


async def test_stop_iteration_reaches_the_caller_as_a_runtime_error() -> None:
    """asyncio refuses ``StopIteration`` in a future (the caller would wait for ever, holding
    its turn): it comes back as a ``RuntimeError``, as from anyio's threads."""
    workers = WorkerThreads(1, name="wt-stop")
    with anyio.fail_after(5), pytest.raises(RuntimeError):
        await workers.run(next, iter(()))
    assert await workers.run(lambda: "next") == "next"  # the turn came back
    workers.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_thread_that_cannot_start_is_not_counted(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    workers = WorkerThreads(1, name="wt-nostart")
    start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="start new thread"):
        await workers.run(int)
    assert workers.threads == 0
    monkeypatch.setattr(threading.Thread, "start", start)
    with anyio.fail_after(5):
        assert await workers.run(int, "7") == 7  # a thread, not a queue nobody reads
    workers.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_idle_thread_keeps_nothing_of_its_last_call() -> None:
    class Result:
        pass

    workers = WorkerThreads(1, name="wt-keep")
    result = weakref.ref(await workers.run(Result))
    await anyio.sleep(0.05)
    gc.collect()
    assert result() is None
    workers.close()


def test_a_loop_closed_with_callers_waiting_does_not_hold_their_turns() -> None:
    """A loop closed without cancelling its tasks (``run_until_complete`` then ``close``)
    leaves callers that hold or wait for a turn; the next loop's calls still run."""
    workers = WorkerThreads(1, name="wt-loops")
    release = threading.Event()
    loop = asyncio.new_event_loop()
    try:
        held = loop.create_task(workers.run(release.wait, 5))
        waiting = loop.create_task(workers.run(int))
        loop.run_until_complete(asyncio.sleep(0.05))
        assert not held.done() and not waiting.done()
        for task in (held, waiting):  # (left pending on purpose: no warning when collected)
            task._log_destroy_pending = False  # type: ignore[attr-defined]
    finally:
        loop.close()
    release.set()

    async def later() -> int:
        with anyio.fail_after(5):
            return await workers.run(int, "3")

    assert anyio.run(later) == 3
    workers.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_many_callers_cancelled_at_random_leave_the_gate_clean() -> None:
    """600 callers on 2 threads, a third of them cancelled at random moments (waiting for a
    turn, handed one, or while their call runs), by anyio or by asyncio's own
    ``task.cancel()``: at most 2 calls are ever admitted at once, every call that started
    finishes, and afterwards the gate is empty and the threads are idle."""
    import random

    workers = WorkerThreads(2, name="wt-stress", idle_s=0.05)
    rng = random.Random(7)
    lock = threading.Lock()
    admitted = started = finished = 0

    def call() -> None:
        nonlocal admitted, started, finished
        with lock:
            admitted = max(admitted, workers._running)
            started += 1
        time.sleep(0.0005)
        with lock:
            finished += 1

    async def scoped(cancel_after: float) -> None:
        with anyio.move_on_after(cancel_after):
            await workers.run(call)

    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Future[None]] = []
    for n in range(600):
        draw = rng.random()
        if draw < 0.15:
            tasks.append(asyncio.ensure_future(scoped(rng.uniform(0, 0.05))))
        else:
            task = asyncio.ensure_future(workers.run(call))
            if draw < 0.33:
                loop.call_later(rng.uniform(0, 0.05), task.cancel)
            tasks.append(task)
        if n % 50 == 0:
            await asyncio.sleep(0)
    with anyio.fail_after(30):
        await asyncio.gather(*tasks, return_exceptions=True)
        await _until(lambda: started == finished)
    assert admitted <= 2
    assert workers._running == 0 and not workers._waiters
    await _until(lambda: workers.threads == 0)
    workers.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_turn_handed_to_a_caller_cancelled_before_it_resumes_passes_on() -> None:
    """One thread: A runs, B and C wait. A's end hands its turn to B, and B is cancelled
    (asyncio's ``task.cancel()``) before it resumes: the turn goes on to C."""
    workers = WorkerThreads(1, name="wt-handover")
    release = threading.Event()
    a = asyncio.ensure_future(workers.run(release.wait, 5))
    await asyncio.sleep(0.01)
    b = asyncio.ensure_future(workers.run(int, "1"))
    c = asyncio.ensure_future(workers.run(int, "2"))
    await asyncio.sleep(0.01)
    assert len(workers._waiters) == 2
    handed = workers._pass_turn
    once: list[bool] = []

    def hand_then_cancel_b() -> None:
        handed()
        if not once:
            once.append(True)
            b.cancel()  # B's waiter is done already: B resumes into CancelledError

    workers._pass_turn = hand_then_cancel_b  # type: ignore[method-assign]
    release.set()
    with anyio.fail_after(5):
        assert await a is True
        assert await c == 2
    assert b.cancelled()
    assert workers._running == 0 and not workers._waiters
    workers.close()
