"""The library's loggers: one structlog logger per layer, named ``leases``, ``pubsub`` and
``signals``. The library binds context (``key``, ``owner``, ``run_id``, ``token``,
``signal_id``) on them and never configures logging: that is the application's choice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import structlog

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = ["Layer", "get_logger"]

Layer = Literal["leases", "pubsub", "signals"]


def get_logger(layer: Layer) -> FilteringBoundLogger:
    """The logger of ``layer`` (structlog's, lazily bound to the application's configuration)."""
    logger: FilteringBoundLogger = structlog.get_logger(layer)
    return logger
