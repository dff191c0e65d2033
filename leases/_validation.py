"""Argument checks shared by every lease backend (one place, one wording)."""

from __future__ import annotations

__all__ = ["check_key", "check_owner", "check_ttl_ms"]


def check_key(key: object) -> str:
    """Return ``key`` if it is a non-empty ``str``, else raise ``TypeError``/``ValueError``."""
    if not isinstance(key, str):
        raise TypeError(f"lease key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("lease key must be a non-empty string")
    return key


def check_owner(owner: object, name: str = "owner") -> str:
    """Return ``owner`` if it is a non-empty ``str``, else raise ``TypeError``/``ValueError``."""
    if not isinstance(owner, str):
        raise TypeError(f"lease {name} must be a str, got {type(owner).__name__}")
    if not owner:
        raise ValueError(f"lease {name} must be a non-empty string")
    return owner


def check_ttl_ms(ttl_ms: object) -> int:
    """Return ``ttl_ms`` if it is a positive ``int`` (not ``bool``), else raise."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise TypeError(f"ttl_ms must be an int of milliseconds, got {type(ttl_ms).__name__}")
    if ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
    return ttl_ms
