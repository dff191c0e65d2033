"""The library's loggers: one per layer, named ``leases``, ``pubsub`` and ``signals``.

The library is silent until the application asks for its logs, and never configures logging
itself:

* When the application has configured structlog (``structlog.configure``), every event goes
  through the application's structlog pipeline, under the layer's name, with the bound keys
  (``key``, ``owner``, ``run_id``, ``token``, ``signal_id``, ...).
* Otherwise every event goes to the standard :mod:`logging` module, to the logger named after
  the layer (``logging.getLogger("signals")``). Unconfigured, Python prints nothing below
  ``WARNING`` and nothing at all on stdout (its last-resort handler writes warnings and errors
  to stderr); ``logging.basicConfig(level=logging.INFO)`` shows every event. The message is
  ``<event> key=value ...``, and the record carries the whole event as ``record.event_dict``.

A disabled level costs one ``isEnabledFor`` check: nothing is formatted (under structlog, the
bound logger's ``is_enabled_for`` when it has one, as structlog's filtering and stdlib loggers
do: the event is not built). Under structlog, each
layer's structlog logger is built once per configuration (structlog's own global one; a new
``structlog.configure`` is followed at the next event), not once per event. structlog is never
imported here: an application that configured it has imported it (a serverless sender that did
not pays nothing for it at start-up).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

__all__ = ["Layer", "Logger", "get_logger"]

Layer = Literal["leases", "pubsub", "signals"]


class Logger:
    """A bound logger of one layer (see the module docstring): ``bind(**keys)`` returns a new
    logger with more context; ``debug``/``info``/``warning``/``error`` log one event."""

    __slots__ = ("_context", "_name", "_stdlib")

    def __init__(self, name: str, context: dict[str, Any] | None = None,
                 stdlib: logging.Logger | None = None) -> None:
        self._name = name
        self._context: dict[str, Any] = context or {}
        # (``logging.getLogger`` takes the logging module's lock at every call: 0.3 us an
        # event; the logger of a name, once made, is the same object for good)
        self._stdlib = logging.getLogger(name) if stdlib is None else stdlib

    def bind(self, **keys: Any) -> Logger:
        """A logger with ``keys`` added to the context of every event."""
        return Logger(self._name, {**self._context, **keys}, self._stdlib)

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        structlog = sys.modules.get("structlog")  # configured only if the application did
        if structlog is not None and structlog.is_configured():
            bound = _structlog_logger(structlog, self._name)
            enabled = getattr(bound, "is_enabled_for", None)  # (filtering and stdlib loggers)
            if enabled is None or enabled(level):
                getattr(bound, method)(event, **self._context, **fields)
            return
        stdlib = self._stdlib
        if not stdlib.isEnabledFor(level):
            return
        data = {**self._context, **fields}
        text = " ".join([event, *(f"{k}={v!r}" for k, v in data.items())])
        stdlib.log(level, "%s", text, extra={"event_dict": {"event": event, **data}},
                   stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, "error", event, fields)


_BOUND: dict[str, tuple[tuple[Any, ...], Any]] = {}


def _structlog_logger(structlog: Any, name: str) -> Any:
    """structlog's logger for ``name``, built once per configuration: a lazy proxy would build
    a new bound logger (wrapper, context, processors) for every event, 5-9 µs here. A new
    ``structlog.configure`` builds it again, so the application's latest configuration
    always applies."""
    config = structlog.get_config()
    key = (config["processors"], config["wrapper_class"], config["logger_factory"],
           config["context_class"])
    cached = _BOUND.get(name)
    if cached is not None:
        old = cached[0]
        if old[0] is key[0] and old[1] is key[1] and old[2] is key[2] and old[3] is key[3]:
            return cached[1]
    bound = structlog.get_logger(name).bind()
    _BOUND[name] = (key, bound)
    return bound


def get_logger(layer: Layer) -> Logger:
    """The logger of ``layer`` (silent until the application configures logging)."""
    return Logger(layer)
