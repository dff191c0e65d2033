"""Small async helpers shared by the layers: the running-library check and a wakeable queue."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.lowlevel import RunVar

from _signal_leases.errors import BackendUnavailableError, UnsupportedBackendError

__all__ = [
    "WakeQueue",
    "WorkerThreads",
    "current_async_library",
    "loop_time",
    "owned_task_group",
    "require_asyncio",
    "retry_unavailable",
    "running_asyncio_loop",
    "unix_now",
]

T = TypeVar("T")


_UNIX_BASE: RunVar[float] = RunVar("signals_unix_base")
_get_running_loop = asyncio._get_running_loop  # None outside a loop, where get_ raises


class _LoopBase:
    """The last asyncio loop's Unix-time base, by the loop's id (one entry, no reference that
    keeps a closed loop alive: another loop recomputes it)."""

    loop = 0
    base = 0.0


_LAST = _LoopBase()


def loop_time() -> float:
    """:func:`anyio.current_time` (the event loop's clock), without anyio's per-call lookup of
    the running library on asyncio (a hot path: several calls per signal)."""
    loop = _get_running_loop()
    if loop is not None:
        return loop.time()
    return anyio.current_time()


def unix_now() -> float:
    """Unix time in seconds that moves with the event loop's clock: ``time.time()`` on a real
    clock (but monotonic), virtual time under a mock clock (trio's ``MockClock``), so time-based
    rules can be tested without waiting. Inside a running event loop only."""
    loop = _get_running_loop()
    if loop is not None:  # asyncio: no mock clock in anyio; the loop's own clock
        last = _LAST
        if last.loop != id(loop):
            last.base, last.loop = time.time() - loop.time(), id(loop)
        return last.base + loop.time()
    try:
        base = _UNIX_BASE.get()
    except LookupError:
        base = time.time() - anyio.current_time()
        _UNIX_BASE.set(base)
    return base + anyio.current_time()


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop, or ``None`` (outside a loop, or under trio)."""
    return _get_running_loop()


def current_async_library() -> str | None:
    """``"asyncio"``, ``"trio"``, or ``None`` outside any event loop (no sniffio needed)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    return None


def require_asyncio(what: str) -> None:
    """Raise :class:`UnsupportedBackendError` unless running under asyncio (redis-py needs it)."""
    library = current_async_library()
    if library != "asyncio":
        raise UnsupportedBackendError(
            f"{what} needs asyncio (redis-py is asyncio-only), running under "
            f"{library or 'no async library'}; use the in-memory backend or run on asyncio"
        )


class WakeQueue(Generic[T]):
    """A FIFO with an awaitable ``get``; cancelling a waiter never loses an item."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._ready: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        self._items.append(item)
        if self._ready is not None:
            self._ready.set()
            self._ready = None

    def drain(self) -> list[T]:
        """Remove and return every queued item."""
        items = list(self._items)
        self._items.clear()
        return items

    async def get(self) -> T:
        while not self._items:
            if self._ready is None:
                self._ready = anyio.Event()
            await self._ready.wait()
        return self._items.popleft()


async def retry_unavailable(
    operation: Callable[[], Awaitable[T]], *, first_delay: float = 0.01, max_delay: float = 1.0
) -> T:
    """Await ``operation()`` until it does not raise :class:`BackendUnavailableError`, backing
    off exponentially. Bound it from outside (a cancel scope: a lease guard, a timeout)."""
    delay = first_delay
    while True:
        try:
            return await operation()
        except BackendUnavailableError:
            await anyio.sleep(delay)
            delay = min(delay * 2, max_delay)


@asynccontextmanager
async def owned_task_group() -> AsyncIterator[TaskGroup]:
    """A task group for the lifetime of a context manager's body.

    The children are cancelled when the body ends; an exception of the body propagates as it
    is (anyio would wrap it in an ``ExceptionGroup`` if it left the group's block), so a user's
    ``except ValueError`` around ``async with SignalRuntime(...)`` still works.
    """
    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        try:
            yield tg
        except Exception as exc:  # re-raised below, once the children are gone
            error = exc
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        raise error


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
    never abandoned: the caller waits for it to finish, shielded from cancellation, and is
    cancelled after it (anyio's default).

    Threads start on demand and exit after ``idle_s`` without work, and at :meth:`close`;
    nothing is shared between owners or global.
    """

    def __init__(self, limit: int, *, name: str, idle_s: float = 10.0) -> None:
        self._limit = limit
        self._name = name
        self._idle_s = idle_s
        self._limiter = anyio.CapacityLimiter(limit)  # trio's calls
        # asyncio's calls, on the event loop's thread: how many run, and who waits to
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
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
        loop = _get_running_loop()
        if loop is None:
            async with self._limiter:
                return await anyio.to_thread.run_sync(fn, *args)
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._running < self._limit and not self._waiters:
            self._running += 1
        else:
            await self._wait_for_turn(loop)
        try:
            future: asyncio.Future[T] = loop.create_future()
            self._submit(_Job(loop, future, contextvars.copy_context(), fn, args))
            with anyio.CancelScope(shield=True):
                result = await future
        finally:
            self._pass_turn()
        return result

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
        if start:
            threading.Thread(target=self._work, args=(job,), name=self._name,
                             daemon=True).start()
        else:
            self._jobs.put(job)

    def close(self) -> None:
        """Let every thread exit once the jobs already queued are done (a later call starts
        a new thread)."""
        with self._lock:  # the stopping threads count as gone, each stop as a queued job
            count = self._threads
            self._threads, self._free = 0, self._free - count
        for _ in range(count):
            self._jobs.put(None)

    def _work(self, job: _Job | None) -> None:
        while job is not None:
            settle, value = job.run()
            with self._lock:  # free before the caller hears back, and may call again
                self._free += 1
            job.post(settle, value)
            job = self._next()

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
        if not self.future.done():
            self.future.set_exception(exc)
