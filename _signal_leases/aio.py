"""Small async helpers shared by the layers: the running-library check and a wakeable queue."""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from _signal_leases.errors import BackendUnavailableError
from _signal_leases.running import (
    _get_running_loop,
    current_async_library,
    loop_time,
    require_asyncio,
    unix_now,
)

__all__ = [
    "WakeQueue",
    "asyncio_task_loop",
    "checkpoint",
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


_current_task = asyncio.current_task


@types.coroutine
def checkpoint() -> Generator[Any, Any, None]:
    """:func:`anyio.lowlevel.checkpoint` (``await checkpoint()``): a cancellation point that
    lets other tasks run. In an asyncio task it is what anyio's is (``asyncio.sleep(0)``: a
    bare ``yield`` reschedules the task at once), without anyio's lookup of the running
    library first and without a coroutine of its own: the in-memory backends take one on
    every call. Elsewhere (trio, or trio run as asyncio's guest) it is anyio's."""
    if asyncio_task_loop() is not None:
        yield
    else:
        yield from anyio.lowlevel.checkpoint().__await__()


def asyncio_task_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop when the caller runs in one of its tasks; ``None`` outside a
    loop, under trio, and in trio's tasks when trio runs as asyncio's guest (where the loop
    runs but a bare ``yield`` or a loop callback does not reach the trio task)."""
    loop = _get_running_loop()
    if loop is not None and _current_task(loop) is not None:
        return loop
    return None


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
