"""Which async library runs, and its clock: without importing anyio on asyncio.

A module of its own so that what a sender imports (``signals.RedisSignalSender``, the Redis
store's script calls) stays free of anyio; ``_signal_leases.aio`` re-exports these. Under trio
(or anyio's other backends) anyio is imported on the first call that needs it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from _signal_leases.errors import UnsupportedBackendError

__all__ = ["current_async_library", "loop_time", "require_asyncio", "unix_now"]

_get_running_loop = asyncio._get_running_loop  # None outside a loop, where get_ raises


class _LoopBase:
    """The last asyncio loop's Unix-time base, by the loop's id (one entry, no reference that
    keeps a closed loop alive: another loop recomputes it)."""

    loop = 0
    base = 0.0


_LAST = _LoopBase()


class _TrioBase:
    """The Unix-time base of each run of another library: an anyio ``RunVar``, made on first
    use."""

    var: Any = None


def loop_time() -> float:
    """:func:`anyio.current_time` (the event loop's clock), without anyio's per-call lookup of
    the running library on asyncio (a hot path: several calls per signal)."""
    loop = _get_running_loop()
    if loop is not None:
        return loop.time()
    import anyio

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
    import anyio
    from anyio.lowlevel import RunVar

    if _TrioBase.var is None:
        _TrioBase.var = RunVar("signals_unix_base")
    try:
        base: float = _TrioBase.var.get()
    except LookupError:
        base = time.time() - anyio.current_time()
        _TrioBase.var.set(base)
    return base + anyio.current_time()


def current_async_library() -> str | None:
    """``"asyncio"``, ``"trio"``, or ``None`` outside any event loop (no sniffio needed)."""
    if _get_running_loop() is not None:
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
