"""The worker threads of a SQL database (see :class:`WorkerThreads`): imported with the SQL
plumbing only, not by a Redis sender's cold start."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from _signal_leases.aio import fail_future
from _signal_leases.aio import running_asyncio_loop as _running_loop

__all__ = ["WorkerThreads"]

T = TypeVar("T")


class WorkerThreads:
    """Up to ``limit`` threads that run one owner's blocking calls (a SQL database's pool).

    On asyncio a call goes to an idle thread through a :class:`queue.SimpleQueue` and its
    result comes back with ``loop.call_soon_threadsafe``: about half the CPU of
    :func:`anyio.to_thread.run_sync` behind an :class:`anyio.CapacityLimiter` (anyio's workers
    hand over through ``queue.Queue`` and a ``Condition``, and the limiter yields to the loop
    twice; measured 130 vs 250 µs per call on a 2-core machine), which a SQL backend pays
    several times per signal. Elsewhere (trio) a call is :func:`anyio.to_thread.run_sync`
    behind a limiter of ``limit``.

    At most ``limit`` calls run at a time; the others wait for one of them to finish, and a
    caller cancelled while it waits leaves without running its call. A call that started is
    never abandoned: the caller waits for it to finish, shielded from anyio's cancellation,
    and is cancelled after it (anyio's default; asyncio's own ``task.cancel()`` passes any
    shield, here as with anyio: the caller leaves and the call goes on in its thread). The
    function runs in the caller's context variables, in a thread that is not anyio's (no
    :mod:`anyio.from_thread` there on asyncio). An exception it raises is the caller's;
    ``StopIteration`` becomes a ``RuntimeError``, as with anyio (asyncio refuses it).

    Threads start on demand and exit after ``idle_s`` without work, and at :meth:`close`;
    nothing is shared between owners or global.
    """

    def __init__(self, limit: int, *, name: str, idle_s: float = 10.0) -> None:
        self._limit = limit
        self._name = name
        self._idle_s = idle_s
        self._limiter = anyio.CapacityLimiter(limit)  # trio's calls
        # asyncio's calls, on the event loop's thread: how many run, and who waits to (of
        # the loop of the last call: a closed loop's are dropped with it)
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        # the threads' side, under the lock
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        #: Threads that are (or are about to be) waiting for a job, less the jobs queued:
        #: > 0 means a job put now is taken at once; <= 0 that every waiting thread has one.
        self._free = 0

    @property
    def threads(self) -> int:
        """Threads running or waiting for work, less those told to stop by :meth:`close`."""
        return self._threads

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in one of the threads; its result, or its exception."""
        loop = _running_loop()
        if loop is None:
            async with self._limiter:
                return await anyio.to_thread.run_sync(fn, *args)
        return await self.run_here(partial(self._in_thread, loop, fn, args))

    async def _in_thread(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T],
                         args: tuple[object, ...]) -> T:
        future: asyncio.Future[T] = loop.create_future()
        self._submit(_Job(loop, future, contextvars.copy_context(), fn, args))
        return await future

    async def run_here(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` on the event loop's own thread (asyncio only), counted as one of
        the ``limit`` calls (it waits for a turn while all are taken) and, once started,
        shielded from anyio's cancellation (:meth:`run` is this around a thread's call)."""
        loop = _running_loop()
        if loop is None:
            raise RuntimeError("run_here needs asyncio")
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._loop is None or self._loop() is not loop:
            self._new_loop(loop)
        if self._running < self._limit and not self._waiters:
            self._running += 1
        else:
            await self._wait_for_turn(loop)
        try:
            with anyio.CancelScope(shield=True):
                result = await fn()
        finally:
            self._pass_turn()
        return result

    def _new_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        last = self._loop() if self._loop is not None else None
        if last is None or last.is_closed():  # its callers are gone: their turns with them
            self._running, self._waiters = 0, deque()
        self._loop = weakref.ref(loop)

    async def _wait_for_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # a turn handed over by _pass_turn
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._pass_turn()  # handed over as this caller was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def _pass_turn(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn goes to it: as many run as before
                return
        self._running -= 1

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._free > 0 or self._threads >= self._limit:
                self._free -= 1
                start = False
            else:
                self._threads += 1
                start = True
        if start:  # (the job goes through the queue too: a thread's arguments live with it)
            try:
                threading.Thread(target=self._work, name=self._name, daemon=True).start()
            except BaseException:  # (no thread: "can't start new thread") not counted
                with self._lock:
                    self._threads -= 1
                raise
        self._jobs.put(job)

    def close(self) -> None:
        """Let every thread exit once the jobs already queued are done (a later call starts
        a new thread)."""
        with self._lock:  # the stopping threads count as gone, each stop as a queued job
            count = self._threads
            self._threads, self._free = 0, self._free - count
        for _ in range(count):
            self._jobs.put(None)

    def _work(self) -> None:
        job = self._next()
        while job is not None:
            self._one(job)
            job = None  # nothing of the call is kept while idle
            job = self._next()

    def _one(self, job: _Job) -> None:
        settle, value = job.run()
        with self._lock:  # free before the caller hears back, and may call again
            self._free += 1
        job.post(settle, value)

    def _next(self) -> _Job | None:
        """The next job, or ``None``: exit (a stop from :meth:`close`, or idle too long)."""
        while True:
            try:
                return self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._free > 0:  # more threads wait than jobs are queued: go
                        self._free -= 1
                        self._threads -= 1
                        return None
                # else a job is on its way to this queue


class _Job:
    __slots__ = ("args", "context", "fn", "future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
                 context: contextvars.Context, fn: Callable[..., Any],
                 args: tuple[object, ...]) -> None:
        self.loop, self.future, self.context, self.fn, self.args = (
            loop, future, context, fn, args)

    def run(self) -> tuple[Callable[[Any], None], Any]:
        """Call the function: how to settle the caller's future, and with what."""
        try:
            return self._succeed, self.context.run(self.fn, *self.args)
        except BaseException as exc:  # handed to the caller, who re-raises it
            return self._fail, exc

    def post(self, settle: Callable[[Any], None], value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(settle, value)

    def _succeed(self, result: Any) -> None:
        if not self.future.done():  # cancelled natively (asyncio): nobody waits
            self.future.set_result(result)

    def _fail(self, exc: BaseException) -> None:
        fail_future(self.future, exc)
