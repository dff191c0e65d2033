"""A conformance suite for ``LeaseProvider`` implementations, run by pytest.

Subclass :class:`LeaseProviderConformance` in a test module (the class name must start with
``Test``) and override the ``provider`` fixture; pytest then runs every check against your
backend. The checks are async and marked ``anyio``, so they run on the backends your
``anyio_backend`` fixture selects (pin it to ``"asyncio"`` for an asyncio-only client)::

    import pytest
    from collections.abc import AsyncIterator
    from leases import LeaseProvider
    from leases.testing import LeaseProviderConformance

    class TestMyProvider(LeaseProviderConformance):
        @pytest.fixture
        async def provider(self) -> AsyncIterator[LeaseProvider]:
            backend = MyProvider(...)
            yield backend
            await backend.aclose()

Time: expiry checks use short real TTLs (:attr:`~LeaseProviderConformance.short_ttl_ms`,
:attr:`~LeaseProviderConformance.refresh_ttl_ms`) and wait with
:meth:`~LeaseProviderConformance.advance`, which sleeps by default. Override it to move a fake
clock instead (it gets the provider, so a clock can hang off it); :class:`ManualClock` is one.

Set ``exclusive = False`` for a backend that coordinates nothing (such as
:class:`~leases.NoopLeaseProvider`): the checks that need exclusivity, owners and tokens are
then skipped and only the always-true ones (grants, validation) run.

Each check uses fresh keys, so one provider may be shared; the fixture may still be per test.

Over 400 lines on purpose: one conformance check per rule of the contract, kept in one
class so a backend author reads every rule in one file.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import pytest

from leases._contract import (
    AcquireResult,
    is_lease_provider,
    supports_batch_renewal,
    supports_lease_sessions,
)

if TYPE_CHECKING:
    from leases._contract import LeaseProvider

from leases.testing._doubles import ManualClock, RecordingLeaseProvider

__all__ = ["LeaseProviderConformance", "ManualClock", "RecordingLeaseProvider"]

LONG_TTL_MS = 60_000
PAST_MS = 15  # how far past an expiry the refresh checks look


@pytest.mark.anyio
class LeaseProviderConformance:
    """Mix-in test class: every semantic of the ``LeaseProvider`` contract, one check each."""

    #: ``False`` for providers that do not coordinate (skips exclusivity and token checks).
    exclusive: ClassVar[bool] = True
    #: The TTL used by expiry checks, in ms. Raise it for slow or remote backends.
    short_ttl_ms: ClassVar[int] = 80
    #: The TTL of checks that refresh a lease and look just past the first expiry, in ms.
    refresh_ttl_ms: ClassVar[int] = 300
    #: Tasks racing in the concurrent-acquire check.
    racers: ClassVar[int] = 50

    @pytest.fixture
    def provider(self) -> Any:
        """Override: yield (or return) the provider under test."""
        raise NotImplementedError("override the `provider` fixture in your conformance class")

    async def advance(self, provider: LeaseProvider, ms: int) -> None:
        """Let ``ms`` milliseconds of lease time pass. Default: a real ``anyio.sleep``."""
        await anyio.sleep(ms / 1000)

    async def expire(self, provider: LeaseProvider) -> None:
        """Wait until every lease granted with :attr:`short_ttl_ms` has expired."""
        await self.advance(provider, self.short_ttl_ms * 2 + 20)

    def _exclusive_only(self) -> None:
        if not self.exclusive:
            pytest.skip("this provider does not coordinate (exclusive = False)")

    @staticmethod
    def key() -> str:
        """A key no other check uses."""
        return f"conformance-{uuid.uuid4().hex}"

    # -- detection and grants ---------------------------------------------------------------

    async def test_is_a_lease_provider(self, provider: LeaseProvider) -> None:
        assert is_lease_provider(provider)

    async def test_acquire_grants_a_free_key(self, provider: LeaseProvider) -> None:
        result = await provider.acquire_lease(self.key(), "a", LONG_TTL_MS)
        assert isinstance(result, AcquireResult)
        assert result.acquired
        if self.exclusive:
            assert result.owner == "a"
            assert isinstance(result.token, int)

    async def test_acquire_is_denied_with_the_owner_reported(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        assert (await provider.acquire_lease(key, "a", LONG_TTL_MS)).acquired
        denied = await provider.acquire_lease(key, "b", LONG_TTL_MS)
        assert denied == AcquireResult(False, "a", None)
        assert await provider.get_lease_owner(key) == "a"

    async def test_reacquire_by_the_owner_is_idempotent(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        ttl = self.refresh_ttl_ms
        first = await provider.acquire_lease(key, "a", ttl)
        await self.advance(provider, ttl // 2)
        again = await provider.acquire_lease(key, "a", ttl)
        assert again == first
        await self.advance(provider, ttl // 2 + PAST_MS)
        # The re-acquire refreshed the TTL: past the first grant's expiry, still held.
        assert await provider.get_lease_owner(key) == "a"

    async def test_get_owner_of_a_free_key_is_none(self, provider: LeaseProvider) -> None:
        assert await provider.get_lease_owner(self.key()) is None

    # -- expiry -----------------------------------------------------------------------------

    async def test_expired_lease_goes_to_a_new_owner(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        first = await provider.acquire_lease(key, "a", self.short_ttl_ms)
        await self.expire(provider)
        assert await provider.get_lease_owner(key) is None
        second = await provider.acquire_lease(key, "b", LONG_TTL_MS)
        assert second.acquired and second.owner == "b"
        assert first.token is not None and second.token is not None
        assert second.token > first.token

    # -- release ----------------------------------------------------------------------------

    async def test_release_frees_the_key(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        await provider.release_lease(key, "a")
        assert await provider.get_lease_owner(key) is None
        assert (await provider.acquire_lease(key, "b", LONG_TTL_MS)).acquired

    async def test_release_by_a_non_owner_does_nothing(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        await provider.release_lease(key, "b")
        assert await provider.get_lease_owner(key) == "a"
        await provider.release_lease(self.key(), "b")  # a free key: also a no-op

    # -- renew ------------------------------------------------------------------------------

    async def test_renew_extends_past_the_original_expiry(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        ttl = self.refresh_ttl_ms
        await provider.acquire_lease(key, "a", ttl)
        await self.advance(provider, ttl // 2)
        assert await provider.renew_lease(key, "a", ttl)
        await self.advance(provider, ttl // 2 + PAST_MS)  # past the first grant's expiry
        assert await provider.get_lease_owner(key) == "a"
        assert not (await provider.acquire_lease(key, "b", ttl)).acquired

    async def test_renew_by_a_non_owner_fails(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        assert not await provider.renew_lease(key, "b", LONG_TTL_MS)
        assert not await provider.renew_lease(self.key(), "b", LONG_TTL_MS)
        assert await provider.get_lease_owner(key) == "a"

    async def test_renew_after_expiry_fails_and_never_resurrects(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", self.short_ttl_ms)
        await self.expire(provider)
        assert not await provider.renew_lease(key, "a", LONG_TTL_MS)
        assert await provider.get_lease_owner(key) is None
        result = await provider.acquire_lease(key, "b", LONG_TTL_MS)
        assert result.acquired and result.owner == "b"

    async def test_renew_after_release_fails(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        await provider.release_lease(key, "a")
        assert not await provider.renew_lease(key, "a", LONG_TTL_MS)
        assert await provider.get_lease_owner(key) is None

    # -- transfer ---------------------------------------------------------------------------

    async def test_transfer_swaps_owner_refreshes_ttl_and_bumps_token(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        key = self.key()
        ttl = self.refresh_ttl_ms
        first = await provider.acquire_lease(key, "a", ttl)
        await self.advance(provider, ttl // 2)
        assert await provider.transfer_lease(key, "a", "b", ttl)
        assert await provider.get_lease_owner(key) == "b"
        await self.advance(provider, ttl // 2 + PAST_MS)  # past a's original expiry
        assert await provider.get_lease_owner(key) == "b"
        assert not await provider.renew_lease(key, "a", ttl)
        held = await provider.acquire_lease(key, "b", ttl)  # idempotent: reports b's token
        assert held.acquired and held.owner == "b"
        assert first.token is not None and held.token is not None
        assert held.token > first.token

    async def test_transfer_by_a_non_owner_fails(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        assert not await provider.transfer_lease(key, "b", "c", LONG_TTL_MS)
        assert await provider.get_lease_owner(key) == "a"
        assert not await provider.transfer_lease(self.key(), "b", "c", LONG_TTL_MS)

    async def test_transfer_after_expiry_fails(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", self.short_ttl_ms)
        await self.expire(provider)
        assert not await provider.transfer_lease(key, "a", "b", LONG_TTL_MS)
        assert await provider.get_lease_owner(key) is None

    async def test_old_owner_is_powerless_after_transfer(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        key = self.key()
        await provider.acquire_lease(key, "a", LONG_TTL_MS)
        assert await provider.transfer_lease(key, "a", "b", LONG_TTL_MS)
        await provider.release_lease(key, "a")
        assert not await provider.renew_lease(key, "a", LONG_TTL_MS)
        assert not await provider.transfer_lease(key, "a", "c", LONG_TTL_MS)
        assert not (await provider.acquire_lease(key, "a", LONG_TTL_MS)).acquired
        assert await provider.get_lease_owner(key) == "b"

    # -- fencing tokens ---------------------------------------------------------------------

    async def test_tokens_strictly_increase_across_expiry_release_and_transfer(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        key = self.key()
        tokens: list[int | None] = []
        tokens.append((await provider.acquire_lease(key, "a", LONG_TTL_MS)).token)
        await provider.release_lease(key, "a")
        tokens.append((await provider.acquire_lease(key, "a", self.short_ttl_ms)).token)
        await self.expire(provider)
        tokens.append((await provider.acquire_lease(key, "b", LONG_TTL_MS)).token)
        assert await provider.transfer_lease(key, "b", "c", LONG_TTL_MS)
        tokens.append((await provider.acquire_lease(key, "c", LONG_TTL_MS)).token)
        assert all(isinstance(t, int) for t in tokens), tokens
        ints = [t for t in tokens if t is not None]
        assert ints == sorted(set(ints)), f"tokens must strictly increase: {tokens}"

    async def test_tokens_are_per_key(self, provider: LeaseProvider) -> None:
        self._exclusive_only()
        k1, k2 = self.key(), self.key()
        t1 = (await provider.acquire_lease(k1, "a", LONG_TTL_MS)).token
        t2 = (await provider.acquire_lease(k2, "a", LONG_TTL_MS)).token
        assert t1 is not None and t2 is not None
        # Every new grant of a key gets a greater token than that key's earlier grants.
        await provider.release_lease(k1, "a")
        t1_next = (await provider.acquire_lease(k1, "b", LONG_TTL_MS)).token
        assert t1_next is not None and t1_next > t1
        await provider.release_lease(k2, "a")
        t2_next = (await provider.acquire_lease(k2, "b", LONG_TTL_MS)).token
        assert t2_next is not None and t2_next > t2
        assert await provider.get_lease_owner(k1) == "b"
        assert await provider.get_lease_owner(k2) == "b"

    # -- optional capabilities: batched renewal, sessions -----------------------------------

    async def test_batched_renewal_keeps_only_what_the_owner_holds(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        if not supports_batch_renewal(provider):
            pytest.skip("no renew_leases on this provider")
        mine, theirs, free = self.key(), self.key(), self.key()
        await provider.acquire_lease(mine, "a", self.short_ttl_ms)
        await provider.acquire_lease(theirs, "b", LONG_TTL_MS)
        kept = await provider.renew_leases(  # type: ignore[attr-defined]
            [(mine, "a"), (theirs, "a"), (free, "a")], self.refresh_ttl_ms
        )
        assert kept == {mine}
        await self.advance(provider, self.short_ttl_ms + PAST_MS)
        assert await provider.get_lease_owner(mine) == "a", "renewed past its first expiry"
        assert await provider.get_lease_owner(free) is None, "never created by a renewal"

    async def test_session_leases_live_and_die_with_their_session(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        if not supports_lease_sessions(provider):
            pytest.skip("no lease sessions on this provider")
        sessions: Any = provider
        session = await sessions.open_lease_session(self.short_ttl_ms)
        if session is None:
            pytest.skip("sessions are not available in this configuration")
        k1, k2 = self.key(), self.key()
        first = await sessions.acquire_lease(k1, "a", 1, session=session)
        assert first.acquired and first.token is not None
        assert (await sessions.acquire_lease(k2, "b", 1, session=session)).acquired
        assert not (await provider.acquire_lease(k1, "c", LONG_TTL_MS)).acquired
        for _ in range(3):  # renewing the session alone keeps both, past their first expiry
            await self.advance(provider, self.short_ttl_ms // 2)
            assert await sessions.renew_lease_session(session, self.short_ttl_ms)
        assert await provider.get_lease_owner(k1) == "a"
        assert await provider.transfer_lease(k1, "a", "a2", LONG_TTL_MS)
        await self.advance(provider, self.short_ttl_ms * 2 + PAST_MS)
        assert await provider.get_lease_owner(k1) is None, "it stays in the session"
        assert await provider.get_lease_owner(k2) is None
        assert not await sessions.renew_lease_session(session, self.short_ttl_ms)
        gone = await sessions.acquire_lease(self.key(), "d", 1, session=session)
        assert not gone.acquired and gone.owner is None
        taken = await provider.acquire_lease(k1, "c", LONG_TTL_MS)
        assert taken.acquired and taken.token is not None and taken.token > first.token
        assert await provider.get_lease_owner(k1) == "c", "a lease of its own, not the session's"

    async def test_closing_a_session_frees_its_leases_at_once(
        self, provider: LeaseProvider
    ) -> None:
        self._exclusive_only()
        if not supports_lease_sessions(provider):
            pytest.skip("no lease sessions on this provider")
        sessions: Any = provider
        session = await sessions.open_lease_session(LONG_TTL_MS)
        if session is None:
            pytest.skip("sessions are not available in this configuration")
        key = self.key()
        assert (await sessions.acquire_lease(key, "a", 1, session=session)).acquired
        await sessions.close_lease_session(session)
        assert await provider.get_lease_owner(key) is None
        assert (await provider.acquire_lease(key, "b", LONG_TTL_MS)).acquired
        assert await provider.get_lease_owner(key) == "b", "a lease of its own, not the session's"

    # -- concurrency ------------------------------------------------------------------------

    async def test_concurrent_acquire_has_exactly_one_winner(self, provider: LeaseProvider) -> None:
        key = self.key()
        results: dict[str, AcquireResult] = {}

        async def race(owner: str) -> None:
            results[owner] = await provider.acquire_lease(key, owner, LONG_TTL_MS)

        async with anyio.create_task_group() as tg:
            for i in range(self.racers):
                tg.start_soon(race, f"racer-{i}")
        winners = [owner for owner, r in results.items() if r.acquired]
        if not self.exclusive:
            assert len(winners) == self.racers
            return
        assert len(winners) == 1, winners
        (winner,) = winners
        assert all(r.owner == winner for r in results.values())
        assert await provider.get_lease_owner(key) == winner

    # -- input validation -------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("key", "owner", "ttl_ms", "error"),
        [
            ("", "o", 1000, ValueError),
            ("k", "", 1000, ValueError),
            ("k", "o", 0, ValueError),
            ("k", "o", -5, ValueError),
            ("k", "o", 1.5, TypeError),
            ("k", "o", True, TypeError),
            (None, "o", 1000, TypeError),
            ("k", None, 1000, TypeError),
        ],
    )
    async def test_bad_input_is_rejected(
        self,
        provider: LeaseProvider,
        key: Any,
        owner: Any,
        ttl_ms: Any,
        error: type[Exception],
    ) -> None:
        bad_key = not isinstance(key, str) or not key
        bad_owner = not isinstance(owner, str) or not owner
        with pytest.raises(error):
            await provider.acquire_lease(key, owner, ttl_ms)
        with pytest.raises(error):
            await provider.renew_lease(key, owner, ttl_ms)
        with pytest.raises(error):
            await provider.transfer_lease(key, owner, "to", ttl_ms)
        with pytest.raises(error):
            await provider.transfer_lease(key, "from", owner, ttl_ms)
        if bad_key or bad_owner:
            with pytest.raises(error):
                await provider.release_lease(key, owner)
        if bad_key:
            with pytest.raises(error):
                await provider.get_lease_owner(key)
