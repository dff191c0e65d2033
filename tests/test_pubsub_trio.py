"""Async-library support: ``RedisStreamsPubSub`` refuses trio clearly (redis-py is
asyncio-only) instead of failing deep inside redis-py. No Redis server is needed."""

from __future__ import annotations

from typing import Any

import pytest

from pubsub import Event, InMemoryPubSub, RedisStreamsPubSub, UnsupportedBackendError

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]


async def test_trio_is_refused_clearly() -> None:
    ps = RedisStreamsPubSub(url="redis://127.0.0.1:1/0")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await ps.publish("t", Event("e"))
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        async with ps:
            pass


def _in_memory_calls_as_asyncio_s_guest() -> list[str]:
    """Under trio run as a guest of asyncio (``trio.lowlevel.start_guest_run``), asyncio's
    loop is running while trio's tasks run: the in-memory backends' checkpoint must still be
    trio's."""
    import asyncio

    import trio

    from leases import InMemoryLeaseProvider
    from signals import InMemorySignalStore, Signal

    async def calls() -> list[str]:
        leases = InMemoryLeaseProvider()
        store = InMemorySignalStore(leases=leases)
        accepted = await store.accept("t", Signal(1, id="s1"), "deliver")
        acquired = await leases.acquire_lease("t", "rt/1", 60_000)
        async with InMemoryPubSub() as pubsub:
            await pubsub.publish("t", Event("e"))
        return [accepted.outcome, str(acquired.acquired)]

    async def host() -> list[str]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(calls, run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                                      done_callback=done.set_result)
        result: list[str] = (await done).unwrap()  # (trio's outcome: raises what calls raised)
        return result

    return asyncio.run(host())


def test_in_memory_backends_work_under_trio_as_asyncio_s_guest(anyio_backend: str) -> None:
    """(A plain test: it runs asyncio itself, and trio inside it.)"""
    assert _in_memory_calls_as_asyncio_s_guest() == ["fresh", "True"]
