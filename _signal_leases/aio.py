"""Small async helpers shared by the layers: the running-library check and a wakeable queue."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.lowlevel import RunVar

from _signal_leases.errors import BackendUnavailableError, UnsupportedBackendError

__all__ = [
    "WakeQueue",
    "current_async_library",
    "fail_future",
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


def fail_future(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``future`` with ``exc`` unless it is done. asyncio refuses ``StopIteration`` (the
    awaiting task would wait for ever): it becomes a ``RuntimeError`` raised from it."""
    if future.done():
        return
    if isinstance(exc, StopIteration):
        wrapped = RuntimeError(f"the call raised {exc!r}")
        wrapped.__cause__ = exc
        exc = wrapped
    future.set_exception(exc)


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
