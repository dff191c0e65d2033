"""Argument checks of the signal runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._inbox import EntryMode

__all__ = ["check_entry_mode", "check_limit", "check_thread_key"]


def check_thread_key(thread_key: object) -> str:
    """Return ``thread_key`` if it is a non-empty ``str``; else ``TypeError``/``ValueError``."""
    if not isinstance(thread_key, str):
        raise TypeError(f"thread key must be a str, got {type(thread_key).__name__}")
    if not thread_key:
        raise ValueError("thread key must be a non-empty string")
    return thread_key


def check_entry_mode(mode: object) -> EntryMode:
    """Return ``mode`` if it is ``"deliver"`` or ``"queue"``; else ``ValueError``."""
    if mode == "deliver" or mode == "queue":
        return mode
    raise ValueError(f"mode must be 'deliver' or 'queue', got {mode!r}")


def check_limit(limit: object) -> int:
    """Return ``limit`` if it is a positive ``int``; else ``TypeError``/``ValueError``."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    return limit
