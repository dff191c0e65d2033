"""``LeaseInfo``: a read-only snapshot of one lease, for inspection tools and tests."""

from __future__ import annotations

from dataclasses import dataclass

from _signal_leases.frozen import quick_init

__all__ = ["LeaseInfo"]


@quick_init
@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """What a backend knows about a live lease.

    ``ttl_ms_remaining`` is the time left before the lease expires (``None`` when the backend
    reports no expiry). ``token`` is the fencing token of the current grant.
    """

    key: str
    owner: str
    ttl_ms_remaining: int | None
    token: int | None
