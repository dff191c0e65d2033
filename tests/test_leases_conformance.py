"""The public conformance suite run against the no-op and in-memory providers (asyncio, trio)."""

from __future__ import annotations

import pytest

from leases import InMemoryLeaseProvider, LeaseProvider, NoopLeaseProvider
from leases.testing import LeaseProviderConformance, ManualClock

pytestmark = pytest.mark.anyio


class TestNoopConformance(LeaseProviderConformance):
    exclusive = False

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return NoopLeaseProvider()


class TestInMemoryConformance(LeaseProviderConformance):
    """Real time (``anyio.current_time``), real sleeps."""

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return InMemoryLeaseProvider()


class TestInMemoryManualClockConformance(LeaseProviderConformance):
    """A manual clock: expiry is exact and the suite takes no real time."""

    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return InMemoryLeaseProvider(clock=ManualClock())

    async def advance(self, provider: LeaseProvider, ms: int) -> None:
        assert isinstance(provider, InMemoryLeaseProvider)
        clock = provider.clock
        assert isinstance(clock, ManualClock)
        clock.advance(ms / 1000)
