"""Fail early and clearly when ``import pubsub`` finds another distribution's module.

The name ``pubsub`` is also used by PyPubSub (``pip install pypubsub``). If that one shadows
ours, everything would fail later with confusing attribute errors; say so at import instead.
"""

from __future__ import annotations

import pubsub

# Names the package defines itself (its backends are imported on first use: not those).
if not hasattr(pubsub, "PubSubBase") or not hasattr(pubsub, "LeasedPubSub"):
    _where = getattr(pubsub, "__file__", None) or "an unknown location"
    raise ImportError(
        f"`import pubsub` found a module that is not signal-leases' pub/sub layer (at "
        f"{_where}). The name is also used by PyPubSub (the `pypubsub` distribution). "
        f"Uninstall it (`pip uninstall pypubsub`) or make sure signal-leases' `pubsub` package "
        f"comes first on sys.path."
    )
