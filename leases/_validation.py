"""Argument checks of the lease layer, in the wording of ``_signal_leases.validation``."""

from __future__ import annotations

from _signal_leases.validation import check_identifier, check_int

__all__ = ["check_acquire", "check_key", "check_owner", "check_ttl_ms"]


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid lease key (a non-empty identifier), else raise."""
    return check_identifier("lease key", key)


def check_owner(owner: object, name: str = "owner") -> str:
    """Return ``owner`` if it is a valid lease owner (a non-empty identifier), else raise."""
    return check_identifier(f"lease {name}", owner)


def check_ttl_ms(ttl_ms: object, name: str = "ttl_ms") -> int:
    """Return ``ttl_ms`` if it is a positive ``int`` of milliseconds (not ``bool``), else raise."""
    return check_int(name, ttl_ms)


def check_acquire(key: object, owner: object, ttl_ms: object, session: object) -> None:
    """Check the arguments of ``acquire_lease`` (``session`` may be ``None``)."""
    check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
    if session is not None:
        check_owner(session, "session")
