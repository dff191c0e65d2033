"""LeaseKeeper: renewal keeps the body alive, loss cancels it, exit releases.

Runs on asyncio and trio with real (short) time, and on trio with a ``MockClock`` so the
same scenarios also play out in virtual time.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import structlog.testing

from leases import (
    BackendUnavailableError,
    InMemoryLeaseProvider,
    LeaseKeeper,
    LeaseNotAcquiredError,
)
from leases._keeper import safety_margin_ms

pytestmark = [pytest.mark.anyio, pytest.mark.mock_clock]

TTL = 150  # ms: renewals have ~100 ms of slack before the deadline



@pytest.fixture
def virtual_time(anyio_backend: Any) -> bool:
    return isinstance(anyio_backend, tuple)


RenewHook = Callable[[str, str, int], Awaitable[bool]]


class ScriptedProvider(InMemoryLeaseProvider):
    """The in-memory provider with a replaceable ``renew_lease`` and call bookkeeping."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.renew_hook: RenewHook | None = None
        self.renew_calls: list[float] = []
        self.release_calls = 0

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.renew_calls.append(anyio.current_time())
        if self.renew_hook is not None:
            return await self.renew_hook(key, owner, ttl_ms)
        return await super().renew_lease(key, owner, ttl_ms)

    async def release_lease(self, key: str, owner: str) -> None:
        self.release_calls += 1
        await super().release_lease(key, owner)


async def test_renewal_keeps_the_body_alive_past_the_ttl() -> None:
    provider = ScriptedProvider()
    async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
        assert keeper.token == 1
        await anyio.sleep(TTL * 3.5 / 1000)
        assert await provider.get_lease_owner("k") == "a"
    assert not keeper.lost and keeper.lost_reason is None
    assert len(provider.renew_calls) >= 3
    assert await provider.get_lease_owner("k") is None  # released on exit


async def test_enter_with_a_lease_already_held_keeps_its_token() -> None:
    provider = InMemoryLeaseProvider()
    first = await provider.acquire_lease("k", "a", 10_000)
    async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
        assert keeper.token == first.token
    assert await provider.get_lease_owner("k") is None


async def test_enter_raises_when_someone_else_holds_it() -> None:
    provider = InMemoryLeaseProvider()
    await provider.acquire_lease("k", "b", 10_000)
    keeper = LeaseKeeper(provider, "k", "a", TTL)
    with pytest.raises(LeaseNotAcquiredError) as info:
        async with keeper:
            pytest.fail("the body must not run")
    assert info.value.owner == "b" and info.value.key == "k"
    assert await provider.get_lease_owner("k") == "b"


async def test_provider_side_loss_cancels_the_body_and_logs() -> None:
    offset = 0.0
    provider = ScriptedProvider(clock=lambda: anyio.current_time() + offset)
    reached_end = False
    with structlog.testing.capture_logs() as logs:
        async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
            offset += 10.0  # the lease expired on the provider's clock...
            assert (await provider.acquire_lease("k", "b", 60_000)).acquired  # ...and b took it
            await anyio.sleep(10)
            reached_end = True
    assert not reached_end
    assert keeper.lost and keeper.lost_reason == "renew rejected"
    assert await provider.get_lease_owner("k") == "b"
    assert provider.release_calls == 0  # a lost lease is not released
    lost = [e for e in logs if e["event"] == "lease.lost"]
    assert lost == [
        {
            "event": "lease.lost",
            "log_level": "warning",
            "key": "k",
            "owner": "a",
            "token": 1,
            "reason": "renew rejected",
        }
    ]


async def test_renew_returning_false_cancels_the_body() -> None:
    provider = ScriptedProvider()

    async def reject(key: str, owner: str, ttl_ms: int) -> bool:
        return False

    provider.renew_hook = reject
    async with LeaseKeeper(provider, "k", "a", TTL, renew_interval_ms=10) as keeper:
        await anyio.sleep_forever()
    assert keeper.lost and keeper.lost_reason == "renew rejected"
    assert len(provider.renew_calls) == 1


async def test_renew_errors_cancel_at_the_deadline_not_before() -> None:
    provider = ScriptedProvider()

    async def fail(key: str, owner: str, ttl_ms: int) -> bool:
        raise BackendUnavailableError("redis is down")

    provider.renew_hook = fail
    with structlog.testing.capture_logs() as logs:
        before = anyio.current_time()
        async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
            first_deadline = keeper.deadline
            await anyio.sleep_forever()
        cancelled_at = anyio.current_time()
    assert first_deadline is not None
    assert first_deadline >= before + (TTL - safety_margin_ms(TTL)) / 1000
    assert cancelled_at >= first_deadline
    assert keeper.lost and keeper.lost_reason == "renew deadline passed"
    failed = [e for e in logs if e["event"] == "lease.renew_failed"]
    assert len(failed) >= 2 and len(failed) == len(provider.renew_calls)
    # Each renew starts before the deadline; the provider reads the clock a moment later (a
    # retry due just before the deadline reached it just after, in about 1 run in 20).
    assert all(t < first_deadline + 0.001 for t in provider.renew_calls)
    assert "redis is down" in failed[0]["error"]
    assert [e["reason"] for e in logs if e["event"] == "lease.lost"] == ["renew deadline passed"]


async def test_a_hanging_renew_is_bounded_by_the_deadline() -> None:
    provider = ScriptedProvider()

    async def hang(key: str, owner: str, ttl_ms: int) -> bool:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    provider.renew_hook = hang
    async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
        deadline = keeper.deadline
        await anyio.sleep_forever()
    assert deadline is not None and anyio.current_time() >= deadline
    assert keeper.lost and keeper.lost_reason == "renew deadline passed"
    assert len(provider.renew_calls) == 1


async def test_a_transient_error_is_retried_and_never_read_as_loss() -> None:
    provider = ScriptedProvider()
    failures = 2

    async def flaky(key: str, owner: str, ttl_ms: int) -> bool:
        nonlocal failures
        if failures:
            failures -= 1
            raise BackendUnavailableError("blip")
        return await InMemoryLeaseProvider.renew_lease(provider, key, owner, ttl_ms)

    provider.renew_hook = flaky
    async with LeaseKeeper(provider, "k", "a", TTL) as keeper:
        await anyio.sleep(TTL * 3 / 1000)
    assert not keeper.lost
    assert failures == 0 and len(provider.renew_calls) >= 4


async def test_release_on_exit_false_keeps_the_lease() -> None:
    provider = InMemoryLeaseProvider()
    async with LeaseKeeper(provider, "k", "a", 10_000, release_on_exit=False) as keeper:
        pass
    assert not keeper.lost
    info = await provider.lease_info("k")
    assert info is not None and info.owner == "a" and info.token == keeper.token


async def test_body_exceptions_propagate_unwrapped_and_the_lease_is_released() -> None:
    provider = InMemoryLeaseProvider()
    with pytest.raises(ValueError, match="boom"):
        async with LeaseKeeper(provider, "k", "a", TTL):
            raise ValueError("boom")
    assert await provider.get_lease_owner("k") is None


async def test_outer_cancellation_is_not_loss_and_still_releases() -> None:
    provider = ScriptedProvider()
    with anyio.move_on_after(TTL / 1000) as outer:
        async with LeaseKeeper(provider, "k", "a", 10 * TTL) as keeper:
            await anyio.sleep_forever()
    assert outer.cancelled_caught
    assert not keeper.lost
    assert provider.release_calls == 1
    assert await provider.get_lease_owner("k") is None


async def test_release_errors_are_logged_not_raised() -> None:
    class BrokenRelease(InMemoryLeaseProvider):
        async def release_lease(self, key: str, owner: str) -> None:
            raise BackendUnavailableError("gone")

    with structlog.testing.capture_logs() as logs:
        async with LeaseKeeper(BrokenRelease(), "k", "a", TTL):
            pass
    assert [e["event"] for e in logs if e["event"].startswith("lease.release")] == [
        "lease.release_failed"
    ]


async def test_a_body_that_never_checkpoints_past_the_deadline_is_lost(virtual_time: bool) -> None:
    if virtual_time:
        pytest.skip("a blocking sleep does not move a MockClock")
    provider = ScriptedProvider()
    async with LeaseKeeper(provider, "k", "a", 20) as keeper:
        time.sleep(0.05)  # noqa: ASYNC251 - starving the loop is the point
    assert keeper.lost and keeper.lost_reason == "renew deadline passed"
    assert provider.release_calls == 0


async def test_the_body_runs_in_the_entering_task_with_renewals_in_between() -> None:
    provider = ScriptedProvider()
    async with LeaseKeeper(provider, "k", "a", TTL, renew_interval_ms=10) as keeper:
        d0 = keeper.deadline
        await anyio.sleep(0.05)
        d1 = keeper.deadline
    assert d0 is not None and d1 is not None and d1 > d0
    assert not keeper.lost


async def test_a_keeper_is_single_use() -> None:
    keeper = LeaseKeeper(InMemoryLeaseProvider(), "k", "a", TTL)
    async with keeper:
        pass
    with pytest.raises(RuntimeError, match="once"):
        async with keeper:
            pass


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"key": ""}, ValueError),
        ({"owner": ""}, ValueError),
        ({"ttl_ms": 0}, ValueError),
        ({"ttl_ms": 1.5}, TypeError),
        ({"renew_interval_ms": 0}, ValueError),
        ({"renew_interval_ms": TTL}, ValueError),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"key": "k", "owner": "a", "ttl_ms": TTL} | kwargs
    with pytest.raises(exc):
        LeaseKeeper(InMemoryLeaseProvider(), **args)


def test_safety_margin_is_small_and_below_the_ttl() -> None:
    assert safety_margin_ms(10_000) == pytest.approx(102.0)
    assert safety_margin_ms(100) == pytest.approx(3.0)
    assert safety_margin_ms(2) == pytest.approx(1.0)
