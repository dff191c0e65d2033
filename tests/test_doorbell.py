"""A run's doorbell (``signals._doorbell.Doorbell``): a wait ends at a ring or wake, or at
its timeout, and leaves nothing behind (on asyncio a wait is a loop timer, not a cancel
scope; elsewhere anyio's cancel scope)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import trio
import trio.testing

from signals._doorbell import Doorbell

pytestmark = pytest.mark.anyio


def _live_timers() -> int:
    """The asyncio loop's timers not cancelled (0 elsewhere)."""
    try:
        loop: Any = asyncio.get_running_loop()
    except RuntimeError:
        return 0
    return sum(1 for handle in loop._scheduled if not handle.cancelled())


async def test_a_wait_ends_at_its_timeout() -> None:
    bell = Doorbell()
    before = _live_timers()
    start = anyio.current_time()
    with anyio.fail_after(5):
        await bell.wait(0.05)
    assert anyio.current_time() - start >= 0.04
    assert _live_timers() == before


async def test_a_wake_ends_a_wait_at_once_and_its_timer_with_it() -> None:
    bell = Doorbell()
    before = _live_timers()
    async with anyio.create_task_group() as tg:
        tg.start_soon(bell.wait, 60.0)
        await anyio.wait_all_tasks_blocked()
        assert _live_timers() <= before + 1
        bell.wake()  # (the task group's exit waits for the waiter: at once, or never)
    assert not bell.take()  # a wake asks for no take
    assert _live_timers() == before


async def test_a_ring_before_the_wait_is_kept() -> None:
    bell = Doorbell()
    bell.ring()
    with anyio.fail_after(5):
        await bell.wait(60.0)
    assert bell.take() and not bell.take()


async def test_a_cancelled_wait_leaves_no_timer() -> None:
    bell = Doorbell()
    before = _live_timers()
    with anyio.move_on_after(0.05):
        await bell.wait(60.0)
    assert _live_timers() == before
    bell.wake()  # nothing waits: nothing to do


def test_a_wait_under_trio_as_asyncio_s_guest_ends_at_its_timeout_and_a_wake() -> None:
    """Under trio run as asyncio's guest, asyncio's loop runs but the waiter is a trio task:
    its timeout and its wake-up are trio's."""

    async def waits() -> str:
        bell = Doorbell()
        with trio.fail_after(5):
            await bell.wait(0.02)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bell.wait, 60.0)
                await trio.testing.wait_all_tasks_blocked()
                bell.wake()
        return "ok"

    async def host() -> str:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(waits, run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                                      done_callback=done.set_result)
        result: str = (await done).unwrap()
        return result

    assert asyncio.run(host()) == "ok"
