"""``PubSubClosedError``: the pub/sub layer's name from earlier releases for ``ClosedError``.

It is the same class, so ``except PubSubClosedError`` and ``except ClosedError`` catch the same
errors. The rest of the error tree is defined once, in ``_signal_leases.errors``.
"""

from __future__ import annotations

from _signal_leases.errors import ClosedError

__all__ = ["PubSubClosedError"]

PubSubClosedError = ClosedError
