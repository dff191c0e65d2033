"""Conformance kits for signal backends, one per part, and a recording core.

* :class:`SignalCoreConformance`: every rule of the twelve methods of
  :class:`~signals.kit.SignalCore` (dispositions and time included).
* :class:`OutputStreamsConformance`, :class:`NoticeChannelConformance`,
  :class:`RuntimeRegistryConformance`, :class:`FusedRoutingConformance`: one per optional
  capability; each check skips when the core lacks the capability, whatever fixtures you
  override.
* :class:`SignalBackendConformance`: all of them at once.

Subclass one in a test module under a name that starts with ``Test`` and override its
``core`` fixture (for the fused checks also ``leases``, the provider the core fuses with)::

    class TestMyCore(SignalBackendConformance):
        @pytest.fixture
        async def core(self):
            async with MyCore(...) as core:
                yield core

The checks are marked ``anyio``: your ``anyio_backend`` fixture picks the event loops (pin it
to ``"asyncio"`` for an asyncio-only client). Every check uses fresh thread keys and withdraws
what it left when it ends. Time passes with ``advance(core, ms)`` (a real sleep unless you
move a fake clock, with ``now(core)`` to match); the receipt-retention check runs only when
you override ``expire_receipts(core)``; the stream-retention check only with a ``small_core``
fixture (a core whose streams keep at most 5 parts).

:class:`RecordingCore` wraps a core and records each call, to count round trips. The
pub/sub and lease kits are ``pubsub.testing`` and ``leases.testing``.
"""

from __future__ import annotations

from typing import Any

import pytest

from signals.testing._capability_checks import (
    FusedRoutingConformance,
    NoticeChannelConformance,
    OutputStreamsConformance,
    RuntimeRegistryConformance,
)
from signals.testing._core_checks import SignalCoreConformance

__all__ = [
    "FusedRoutingConformance",
    "NoticeChannelConformance",
    "OutputStreamsConformance",
    "RecordingCore",
    "RuntimeRegistryConformance",
    "SignalBackendConformance",
    "SignalCoreConformance",
]


@pytest.mark.anyio
class SignalBackendConformance(
    SignalCoreConformance, OutputStreamsConformance, NoticeChannelConformance,
    RuntimeRegistryConformance, FusedRoutingConformance,
):
    """Every kit of ``signals.testing`` in one class (see the module docstring)."""


class RecordingCore:
    """A core that records every call and forwards it to ``inner``.

    ``calls`` lists ``(method, thread key or "")`` tuples in order: count backend calls per
    signal in your tests (on the built-in cores, one call is one round trip). Capabilities are
    offered exactly when ``inner`` offers them; ``fuses_with``, ``listen`` and ``follower`` are
    passed through unrecorded.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name in ("fuses_with", "listen", "follower") or not callable(method):
            return method

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            key = args[0] if args and isinstance(args[0], str) else ""
            self.calls.append((name, key))
            return await method(*args, **kwargs)

        return recorded
