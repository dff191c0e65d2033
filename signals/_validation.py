"""Argument checks of the signal runtime."""

from __future__ import annotations

__all__ = ["check_thread_key"]


def check_thread_key(thread_key: object) -> str:
    """Return ``thread_key`` if it is a non-empty ``str``; else ``TypeError``/``ValueError``."""
    if not isinstance(thread_key, str):
        raise TypeError(f"thread key must be a str, got {type(thread_key).__name__}")
    if not thread_key:
        raise ValueError("thread key must be a non-empty string")
    return thread_key
