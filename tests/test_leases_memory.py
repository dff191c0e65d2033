"""InMemoryLeaseProvider and its sync core: details beyond the conformance suite."""

from __future__ import annotations

import anyio
import pytest

from leases import InMemoryLeaseProvider, LeaseInfo, is_lease_provider
from leases._backends.memory import LeaseTable
from leases.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.mock_clock]



def test_core_grants_refreshes_and_expires_exactly() -> None:
    t = LeaseTable()
    assert t.acquire("k", "a", 1000, now=0.0).token == 1
    assert t.acquire("k", "a", 1000, now=0.5).token == 1  # refresh: expires at 1.5
    assert t.owner("k", now=1.499) == "a"
    assert t.owner("k", now=1.5) is None  # expiry is exclusive: live while now < expires_at
    assert t.acquire("k", "b", 1000, now=1.5).token == 2
    assert t.last_token("k") == 2 and t.last_token("never") == 0


def test_core_release_reports_whether_it_released() -> None:
    t = LeaseTable()
    t.acquire("k", "a", 100, now=0.0)
    assert not t.release("k", "b", now=0.0)
    assert t.release("k", "a", now=0.0)
    assert not t.release("k", "a", now=0.0)
    assert t.keys(now=0.0) == []


def test_core_transfer_replay_rule() -> None:
    t = LeaseTable()
    t.acquire("k", "a", 100, now=0.0)
    assert t.transfer("k", "a", "b", 100, now=0.01)
    assert t.transfer("k", "a", "b", 500, now=0.02)  # replayed: b holds it -> True, TTL refreshed
    info = t.info("k", now=0.02)
    assert info == LeaseInfo("k", "b", 500, 2)  # ...and no second token
    assert t.transfer("k", "b", "b", 100, now=0.03)  # a self-transfer is a renew
    assert t.info("k", now=0.03) == LeaseInfo("k", "b", 100, 2)
    assert not t.transfer("k", "a", "c", 100, now=0.03)


def test_core_keys_lists_live_leases_only() -> None:
    t = LeaseTable()
    t.acquire("x", "a", 10, now=0.0)
    t.acquire("y", "a", 1000, now=0.0)
    assert t.keys(now=0.005) == ["x", "y"]
    assert t.keys(now=0.5) == ["y"]


async def test_lease_info_and_context_manager() -> None:
    clock = ManualClock()
    async with InMemoryLeaseProvider(clock=clock) as p:
        assert is_lease_provider(p)
        assert await p.lease_info("k") is None
        await p.acquire_lease("k", "a", 1000)
        clock.advance(0.25)
        assert await p.lease_info("k") == LeaseInfo("k", "a", 750, 1)
        clock.advance(0.75)
        assert await p.lease_info("k") is None
    with pytest.raises(ValueError):
        await p.lease_info("")


async def test_default_clock_is_the_event_loop_clock() -> None:
    p = InMemoryLeaseProvider()
    assert abs(p.clock() - anyio.current_time()) < 0.05  # the event loop's clock
    await p.acquire_lease("k", "a", 50)
    await anyio.sleep(0.06)  # virtual under MockClock, real otherwise
    assert await p.get_lease_owner("k") is None


async def test_a_thousand_tasks_race_for_one_key() -> None:
    p = InMemoryLeaseProvider()
    won: list[str] = []

    async def race(i: int) -> None:
        if (await p.acquire_lease("k", f"o{i}", 10_000)).acquired:
            won.append(f"o{i}")

    async with anyio.create_task_group() as tg:
        for i in range(1000):
            tg.start_soon(race, i)
    assert len(won) == 1 and await p.get_lease_owner("k") == won[0]


def test_manual_clock_refuses_to_go_back() -> None:
    clock = ManualClock(5.0)
    clock.advance(1.0)
    assert clock() == 6.0
    with pytest.raises(ValueError):
        clock.advance(-1)
