"""The lease contract's shared pieces: structural detection, the no-op provider, validation."""

from __future__ import annotations

from typing import Any

import pytest

import leases
from leases import AcquireResult, NoopLeaseProvider, is_lease_provider, resolve_lease_provider

pytestmark = pytest.mark.anyio


class _Duck:
    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        return AcquireResult(True, owner, 1)

    async def get_lease_owner(self, key: str) -> str | None:
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        return None

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return True


def test_structural_detection_accepts_an_unrelated_class() -> None:
    assert is_lease_provider(_Duck())
    duck = _Duck()
    assert resolve_lease_provider(duck) is duck


@pytest.mark.parametrize("missing", leases._contract.LEASE_METHODS)
def test_detection_requires_all_five_callables(missing: str) -> None:
    duck: Any = _Duck()
    partial = type("Partial", (), {})()
    for name in leases._contract.LEASE_METHODS:
        if name != missing:
            setattr(partial, name, getattr(duck, name))
    assert not is_lease_provider(partial)
    setattr(partial, missing, "not callable")
    assert not is_lease_provider(partial)
    assert isinstance(resolve_lease_provider(partial), NoopLeaseProvider)


def test_resolve_falls_back_to_noop() -> None:
    assert isinstance(resolve_lease_provider(object()), NoopLeaseProvider)
    assert isinstance(resolve_lease_provider(None), NoopLeaseProvider)


def test_resolve_unwraps_get_lease_provider() -> None:
    inner = _Duck()

    class Wrapper:
        def get_lease_provider(self) -> object:
            return inner

    assert resolve_lease_provider(Wrapper()) is inner


async def test_noop_provider_always_wins() -> None:
    p = NoopLeaseProvider()
    assert await p.acquire_lease("k", "a", 1000) == AcquireResult(True, None, None)
    assert await p.acquire_lease("k", "b", 1000) == AcquireResult(True, None, None)
    assert await p.get_lease_owner("k") is None
    assert await p.renew_lease("k", "x", 10) is True
    assert await p.transfer_lease("k", "x", "y", 10) is True
    await p.release_lease("k", "x")


@pytest.mark.parametrize(
    ("key", "owner", "ttl", "exc"),
    [
        ("", "o", 10, ValueError),
        ("k", "", 10, ValueError),
        ("k", "o", 0, ValueError),
        ("k", "o", -5, ValueError),
        ("k", "o", 1.5, TypeError),
        ("k", "o", True, TypeError),
        (None, "o", 10, TypeError),
        ("k", 3, 10, TypeError),
    ],
)
async def test_noop_provider_validates_input(key: Any, owner: Any, ttl: Any, exc: type) -> None:
    with pytest.raises(exc):
        await NoopLeaseProvider().acquire_lease(key, owner, ttl)
