"""A signal's attempts count the runs that handed it to the agent, not the runs that only read
it ahead (or were carried it by a notice): a poison signal uses up only its own attempts.

On memory (asyncio and trio) and on a real Redis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from pubsub import InMemoryPubSub, RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime

pytestmark = pytest.mark.anyio

Backend = Callable[[], Any]


@pytest.fixture
def memory() -> Backend:
    return InMemoryPubSub


@pytest.fixture
def redis(redis_url: str, key_prefix: str) -> Backend:
    return lambda: RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix)


@asynccontextmanager
async def _runtime(make_pubsub: Backend, agent: Any, max_attempts: int
                   ) -> AsyncIterator[SignalRuntime]:
    async with make_pubsub() as ps, SignalRuntime(
        pubsub=ps, agent=agent, max_attempts=max_attempts
    ) as rt:
        yield rt


async def _poison(make_pubsub: Backend) -> None:
    """``max_attempts=1``: the poison signal is dead-lettered; the three behind it, which the
    failing run had received but never handed out, are each processed once."""
    seen: list[str] = []

    async def agent(run: Run) -> None:
        async for s in run:
            seen.append(s.id)
            if s.id == "poison":
                raise RuntimeError("poison")
            await run.ack(s)

    async with _runtime(make_pubsub, agent, max_attempts=1) as rt:
        for sid in ("poison", "good1", "good2", "good3"):
            await rt.send("t", Signal({}, id=sid))
        with anyio.fail_after(10):
            await rt.wait_idle()
        statuses = {sid: (await rt.receipt("t", sid)).status  # type: ignore[union-attr]
                    for sid in ("poison", "good1", "good2", "good3")}
    assert statuses == {"poison": "dead_lettered", "good1": "processed", "good2": "processed",
                        "good3": "processed"}
    assert Counter(seen) == {"poison": 1, "good1": 1, "good2": 1, "good3": 1}


async def _all_attempts(make_pubsub: Backend) -> None:
    """An agent that fails every signal: each one reaches the agent ``max_attempts`` times
    (not fewer because an earlier run had read it ahead), then goes to the dead letters."""
    seen: list[tuple[str, int]] = []

    async def agent(run: Run) -> None:
        async for s in run:
            seen.append((s.id, s.attempt))
            raise RuntimeError(f"fails {s.id}")

    async with _runtime(make_pubsub, agent, max_attempts=5) as rt:
        for i in range(4):
            await rt.send("t", Signal({}, id=f"s{i}"))
        with anyio.fail_after(20):
            await rt.wait_idle()
        dead = {d.signal.id: d.attempts for d in await rt.dead_letters("t")}
    assert Counter(sid for sid, _ in seen) == {f"s{i}": 5 for i in range(4)}
    for i in range(4):
        assert [a for sid, a in seen if sid == f"s{i}"] == [1, 2, 3, 4, 5]
    assert dead == {f"s{i}": 5 for i in range(4)}


async def test_a_poison_signal_takes_only_its_own_attempts(memory: Backend) -> None:
    await _poison(memory)


@pytest.mark.redis
async def test_a_poison_signal_takes_only_its_own_attempts_on_redis(redis: Backend) -> None:
    await _poison(redis)


async def test_every_signal_gets_all_its_attempts(memory: Backend) -> None:
    await _all_attempts(memory)


@pytest.mark.redis
async def test_every_signal_gets_all_its_attempts_on_redis(redis: Backend) -> None:
    await _all_attempts(redis)
