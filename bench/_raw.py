"""The raw baseline of the latency benches (bench/scale.py, bench/latency_floor.py): one
``XADD`` of an entry with field ``i`` until a task blocked in ``XREAD BLOCK`` has it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import redis.asyncio

__all__ = ["read_arrivals", "until"]


async def read_arrivals(reader: redis.asyncio.Redis, stream: str, arrived: dict[str, int], *,
                        clock: Callable[[], int] = time.perf_counter_ns) -> None:
    """Read ``stream`` from its end for ever; ``arrived[i] = clock()`` for each entry."""
    last = "$"
    while True:
        reply: Any = await reader.xread({stream: last}, block=1000, count=10)
        now = clock()
        for _, entries in reply or []:
            for entry_id, fields in entries:
                arrived[fields[b"i"].decode()] = now
                last = entry_id


async def until(done: dict[str, int], key: str) -> int:
    """``done[key]`` once another task set it (at most 10 s)."""
    with anyio.fail_after(10):
        while key not in done:  # (filled by another task)
            await anyio.lowlevel.checkpoint()
    return done[key]
